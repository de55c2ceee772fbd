"""The export's tutorials run as scripts (tiny), CleanRL's PPO learns, and the benchmark section runs."""

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
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
    # 2048 steps = 4 iterations of 4 envs x 128 steps: the loop runs every one of them
    assert re.findall(r"global_step=(\d+) ", out)[-1] == "2048", out[-1500:]


def test_cleanrl_ppo_runs_on_a_world_model():
    """The same client loop on a world-model env export (continuous actions)."""
    out = _run("cleanrl_ppo.py", "--env-id", "world-model", "--total-timesteps", "2048", "--num-envs", "8")
    final = _final_return(out)
    episodes = int(re.search(r"final mean_return_last_20=\S+ episodes=(\d+)", out).group(1))
    assert math.isfinite(final) and episodes > 0, out[-1500:]


def _load_tutorial(script: str):
    """A tutorial as a module: its main code runs under ``if __name__ == "__main__"`` only."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, TUTORIALS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("env_id", ["CartPole-v1", "world-model"])
def test_cleanrl_ppo_envs_reset_in_the_step_that_ends_an_episode(monkeypatch, env_id):
    """CleanRL's loop was written for pre-1.0 vector envs: under gymnasium 1.x's NEXT_STEP autoreset it would store
    the reset step after each episode end as a transition and train on it, so both envs it builds are SAME_STEP."""
    tutorial = _load_tutorial("cleanrl_ppo.py")
    monkeypatch.setattr(sys, "argv", ["cleanrl_ppo.py", "--env-id", env_id, "--num-envs", "4"])
    envs = tutorial.make_envs(tutorial.parse_args())
    try:
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert isinstance(envs, gym.wrappers.vector.RecordEpisodeStatistics)
    finally:
        envs.close()


def test_cleanrl_ppo_clips_the_world_models_actions(monkeypatch):
    """As CleanRL's ppo_continuous_action.py, the envs clip the Gaussian head's samples to the Box: the model only
    sees actions in [-1, 1] (a third of the first samples fall outside, queries off the model's training data)."""
    import numpy as np

    from torchrl_swm.benchmarks import export

    seen, make_model = [], export.make_model

    def recording_model(*args, **kwargs):
        model = make_model(*args, **kwargs)
        forward = model.forward

        def record(state, action):
            seen.append(action.detach().clone())
            return forward(state, action)

        model.forward = record
        return model

    monkeypatch.setattr(export, "make_model", recording_model)
    tutorial = _load_tutorial("cleanrl_ppo.py")
    monkeypatch.setattr(sys, "argv", ["cleanrl_ppo.py", "--env-id", "world-model", "--num-envs", "4"])
    envs = tutorial.make_envs(tutorial.parse_args())
    try:
        envs.reset(seed=0)
        action = np.full((4, envs.single_action_space.shape[0]), 5.0, np.float32)
        action[:, 0] = -7.0
        envs.step(action)
    finally:
        envs.close()
    assert seen and all(a.min() == -1 and a.max() == 1 for a in seen), seen


@pytest.mark.parametrize("flags, message", [
    (["--num-envs", "0"], "--num-envs must be positive, got 0"),
    (["--num-steps", "0"], "--num-steps must be positive, got 0"),
    (["--num-minibatches", "0"], "--num-minibatches must be positive, got 0"),
    (["--total-timesteps", "-1"], "--total-timesteps must be positive, got -1"),
    (["--num-minibatches", "3"], "--num-minibatches 3 must divide the batch, --num-envs x --num-steps = 1024"),
])
def test_cleanrl_ppo_refuses_bad_sizes(monkeypatch, capsys, flags, message):
    """They gave a ZeroDivisionError in parse_args, or (a minibatch of 1) NaN weights and a crash later."""
    tutorial = _load_tutorial("cleanrl_ppo.py")
    monkeypatch.setattr(sys, "argv", ["cleanrl_ppo.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        tutorial.parse_args()
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_cleanrl_ppo_learns_cartpole():
    """CleanRL's PPO through to_gymnasium(EnvPool(...)) clearly beats a random policy (~22).

    50k steps with CleanRL's own hyper-parameters (~20 s of CPU); seeds 1 and 2 reach 121 and 125.
    """
    out = _run("cleanrl_ppo.py", "--total-timesteps", "50000", "--num-envs", "8", "--seed", "1")
    assert _final_return(out) > 80, out[-1500:]


def test_sb3_tutorial_runs_tiny():
    pytest.importorskip("stable_baselines3")
    out = _run("sb3_export.py", "--total-timesteps", "2048")
    # evaluate_policy runs the 16 episodes asked for (return_episode_rewards=True gives one return each)
    assert "evaluation (16 episodes, deterministic): mean return" in out
    # VecEnv.seed(seed) seeds the next reset of env i with seed + i, as SB3's DummyVecEnv does
    assert "seeds of the next reset: [0, 1, 2, 3, 4, 5, 6, 7]" in out
    # SB3's VecMonitor records the training episodes (2048 CartPole steps end dozens of them)
    match = re.search(r"mean training episode return \(last (\d+) episodes\): ([\d.]+)", out)
    assert match and int(match.group(1)) > 0 and float(match.group(2)) > 0, out


def test_benchmark_section_runs_tiny():
    from torchrl_swm.benchmarks.export import run
    from torchrl_swm.benchmarks.harness import Row

    rows = run(ns=(4,), bs=(4,), seconds=0.03)
    assert rows and all(isinstance(r, Row) and r.rate > 0 for r in rows)
    keys = {(r.section, r.key) for r in rows}
    assert {("export/pool", "pool"), ("export/pool", "gym-next_step"), ("export/world_model", "raw"),
            ("export/world_model", "gym-same_step")} <= keys
    assert all(r.ratio is not None for r in rows)
