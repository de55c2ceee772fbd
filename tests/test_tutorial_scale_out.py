"""The scale-out tutorial runs unchanged with each collector (tiny sizes)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("collector", ["single", "multisync", "ray"])
def test_scale_out_tutorial(collector):
    if collector == "ray":
        pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchrl-swm[ray]'")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tutorials", "scale_out.py"), "--collector", collector,
         "--workers", "2", "--envs-per-worker", "4", "--frames-per-batch", "512", "--total-frames", "1024"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{collector}: 1024 frames" in proc.stdout
    # 8 envs x 64 steps per batch: episodes end in every batch, and a CartPole episode lasts 8 to 500 steps
    import re

    lengths = [float(m) for m in re.findall(r"mean length of the episodes that ended +([\d.]+)", proc.stdout)]
    assert len(lengths) == 2 and all(8 <= n <= 64 * 2 for n in lengths), proc.stdout
