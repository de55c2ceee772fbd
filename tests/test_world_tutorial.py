"""The World tutorial runs top to bottom as a script."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("imageio_ffmpeg")

TUTORIAL = Path(__file__).resolve().parents[1] / "tutorials" / "world_evaluate_collect.py"


def _run(out_dir, episodes: int, returncode: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", SDL_VIDEODRIVER="dummy")
    out = subprocess.run([sys.executable, str(TUTORIAL), "--out", str(out_dir), "--episodes", str(episodes)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == returncode, out.stderr[-3000:]
    return out


def test_world_tutorial_runs(tmp_path):
    out = _run(tmp_path, 24)
    assert "24 episodes" in out.stdout and "sequence batch: pixels (16, 8, 64, 64, 3)" in out.stdout
    # TorchRL's episode layout, as the comment above the print describes it: the reset frame is row 0's root
    # (is_init), and the episode's last row holds its end under "next"
    assert "is_init [True, False, False]..., last next.done True" in out.stdout
    # the random policy's run and the expert's auto-mode run (the result printed under the auto comparison is
    # auto's own, not wait's)
    assert out.stdout.count("World.evaluate: 32 episodes on 8 envs (reset_mode=auto, seed=100)") == 2, out.stdout
    # the second run is really in wait mode (the line names the result's own reset_mode), and the line prints
    # the comparison it makes
    assert "wait mode: identical per-episode results (seeds, lengths, returns, successes): True" in out.stdout
    # the evaluation from the dataset runs on 4 envs in wait mode, goals 20 steps ahead
    assert re.search(r"World\.evaluate: \d+ episodes on 4 envs \(reset_mode=wait, seed=0\).*\n"
                     r"  from dataset: goal_offset=20, eval_budget=40\n", out.stdout), out.stdout
    # one history shape at every step, its newest frame the env's current pixels
    assert "the planner saw history of shape (4, 4, 64, 64, 3), its newest frame the current pixels: True" \
        in out.stdout
    videos = re.search(r"(\d+) videos \(agent \| goal\)", out.stdout)
    assert videos and len(list((tmp_path / "videos").glob("*.mp4"))) == int(videos.group(1)) > 0, out.stdout
    assert (tmp_path / "dataset" / "dataset.json").exists()

    # --episodes 1 or 2 crashed in the SliceSampler (no episode of 8 steps) after the dataset summary. Run in the
    # same --out: the rerun replaces the tutorial's own dataset and videos (2 episodes make no video)
    out = _run(tmp_path, 2)
    assert "2 episodes" in out.stdout and "one episode per row: True" in out.stdout
    assert "no episode of the 2 collected has 20 steps: collect more (--episodes)" in out.stdout
    assert "the planner saw history of shape (4, 4, 64, 64, 3)" in out.stdout
    assert json.loads((tmp_path / "dataset" / "dataset.json").read_text())["num_episodes"] == 2
    assert not any((tmp_path / "videos").iterdir())


def test_world_tutorial_never_deletes_files_it_did_not_write(tmp_path):
    """--out used to rmtree OUT/dataset and OUT/videos whatever they held: it refuses a folder holding other files."""
    (tmp_path / "a" / "videos").mkdir(parents=True)
    (tmp_path / "a" / "videos" / "talk.mp4").write_bytes(b"mine")
    out = _run(tmp_path / "a", 2, returncode=2)
    assert "videos holds files this tutorial did not write" in out.stderr and "talk.mp4" in out.stderr
    assert (tmp_path / "a" / "videos" / "talk.mp4").read_bytes() == b"mine"

    (tmp_path / "b" / "dataset").mkdir(parents=True)
    (tmp_path / "b" / "dataset" / "important_notes.txt").write_text("mine")
    out = _run(tmp_path / "b", 2, returncode=2)  # a usage error, as for the videos folder: no traceback
    assert "is not a torchrl_swm dataset" in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert (tmp_path / "b" / "dataset" / "important_notes.txt").read_text() == "mine"
