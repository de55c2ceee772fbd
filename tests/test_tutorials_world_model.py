"""The world-model tutorials run as scripts (subprocesses), as a user would run them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["world_model_env.py", "planner.py"])
def test_tutorial_runs(script):
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tutorials", script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if script == "planner.py":
        assert "both planners reached the goal" in result.stdout
    else:
        assert "same seed, same rollout: True" in result.stdout
