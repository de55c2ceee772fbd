"""The collectors + replay buffer tutorial runs top to bottom as a script."""

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "collectors_replay_buffer.py"


def test_collectors_tutorial_runs():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(TUTORIAL)], cwd=TUTORIAL.parents[1], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = proc.stdout
    assert "batch 3: (8, 64) [envs, time]" in out
    assert "sequences (32, 8): observation (32, 8, 4)" in out and "one trajectory per row: True" in out
    assert "(|angle| > 0.2095 or |x| > 2.4: True)" in out
    assert "gives the same observation: True" in out
    assert "memory-mapped buffer: 512 steps" in out
    assert out.count("[workers, envs, time]") == 2 and "ids shared by the workers: 0" in out
    # the step after an episode end starts a new trajectory: the line shows the new id and the old one
    ids = re.search(r"a new trajectory id: (\d+) \(was (\d+)\)", out)
    assert ids and int(ids.group(1)) > int(ids.group(2)), out
    # the workers' pools are seeded 2**32 apart (as in scale_out.py): their episodes never overlap
    seeds = re.findall(r"episode seeds (\d+)\.\. \(worker 0\) and (\d+)\.\. \(worker 1\)", out)
    assert len(seeds) == 2 and all(int(w0) < 2**32 <= int(w1) for w0, w1 in seeds), out
    assert "replay buffer of the multi-process data: 1024 steps, sample (32, 8)" in out
