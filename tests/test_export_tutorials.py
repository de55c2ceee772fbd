"""The export's tutorials run as scripts (tiny), CleanRL's PPO learns, and the benchmark section runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"


def _run(script: str, *args: str, timeout: int = 240) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(TUTORIALS / script), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _final_return(out: str) -> float:
    match = re.search(r"final mean_return_last_20=([-\d.nan]+)", out)
    assert match, out[-2000:]
    return float(match.group(1))


def test_cleanrl_ppo_runs_tiny():
    out = _run("cleanrl_ppo.py", "--total-timesteps", "2048", "--num-envs", "4")
    assert _final_return(out) > 0


def test_cleanrl_ppo_runs_on_a_world_model():
    """The same client loop on a world-model env export (continuous actions)."""
    out = _run("cleanrl_ppo.py", "--env-id", "world-model", "--total-timesteps", "2048", "--num-envs", "8")
    assert "final mean_return_last_20=" in out


def test_cleanrl_ppo_learns_cartpole():
    """CleanRL's PPO through to_gymnasium(EnvPool(...)) clearly beats a random policy (~22).

    50k steps with CleanRL's own hyper-parameters (~20 s of CPU); seeds 1 and 2 reach 121 and 125.
    """
    out = _run("cleanrl_ppo.py", "--total-timesteps", "50000", "--num-envs", "8", "--seed", "1")
    assert _final_return(out) > 80, out[-1500:]


def test_sb3_tutorial_runs_tiny():
    pytest.importorskip("stable_baselines3")
    out = _run("sb3_export.py", "--total-timesteps", "2048")
    assert "evaluation: mean return" in out


def test_benchmark_section_runs_tiny():
    from torchrl_swm.benchmarks.export import run
    from torchrl_swm.benchmarks.harness import Row

    rows = run(ns=(4,), bs=(4,), seconds=0.03)
    assert rows and all(isinstance(r, Row) and r.rate > 0 for r in rows)
    keys = {(r.section, r.key) for r in rows}
    assert {("export/pool", "pool"), ("export/pool", "gym-next_step"), ("export/world_model", "raw"),
            ("export/world_model", "gym-same_step")} <= keys
    assert all(r.ratio is not None for r in rows)
