"""NEXT_STEP export with a render mode: a finished env stays in its terminal state until the next step.

gymnasium's SyncVectorEnv resets a finished env (NEXT_STEP) only at the following step, so
``render()``, a vector ``RecordVideo``, ``call()`` and ``get_attr()`` in between see the terminal
state. With a render mode the export does the same; every output must still equal SyncVectorEnv's.
"""

import functools

import gymnasium as gym
import numpy as np
import pytest
from export_helpers import action_stream, assert_same
from gymnasium.vector import AutoresetMode
from torchrl.envs import StepCounter, TransformedEnv

from envs import CountingEnv
from torchrl_swm import EnvPool, to_gymnasium


def _pair(kind, n=4, max_length=4):
    make = functools.partial(CountingEnv, max_length=max_length, render_mode="rgb_array")
    env = EnvPool([make] * n, seed_every_episode=False)
    limit = None
    if kind == "transformed":  # a TransformedEnv: the frozen rows' outputs are restored by the export
        limit = 3
        env = TransformedEnv(env, StepCounter(limit))
    ours = to_gymnasium(env, autoreset_mode="next_step", observation_keys="observation", info_keys=[])

    def twin():  # seed_every_episode=False is gymnasium's seeding: once, then each env's stream
        inner = make()
        return gym.wrappers.TimeLimit(inner, limit) if limit else inner

    ref = gym.vector.SyncVectorEnv([twin] * n, autoreset_mode=AutoresetMode.NEXT_STEP)
    return ours, ref


def _frames(venv):
    return [int(f[0, 0, 0]) for f in venv.render()]  # t, painted by CountingEnv


def _obs(obs):
    # [t, episode, last_action]: the pool's construction probe resets each env once more than
    # SyncVectorEnv does, so the episode counters differ by one (documented); t and the action must not
    return obs[..., [0, 2]]


@pytest.mark.parametrize("kind", ["pool", "transformed"])
def test_render_and_get_attr_after_a_terminal_step_match_sync_vector_env(kind):
    """Hundreds of steps with episodes ending at different times, random masked (and seeded)
    resets: obs, rewards, flags, rendered frames and the sub-envs' attributes equal SyncVectorEnv's
    (infos are compared by tests/test_export_vector.py)
    after every step and reset, so the terminal frame is rendered before the env is reset."""
    ours, ref = _pair(kind)
    assert ours._defer_resets
    n = ours.num_envs
    rng = np.random.default_rng(0)
    assert_same(_obs(ours.reset(seed=0)[0]), _obs(ref.reset(seed=0)[0]), "reset obs")
    terminal_frames = 0
    for t, action in enumerate(action_stream(ours.action_space, 300)):
        out, out_ref = ours.step(action), ref.step(action)
        for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], out_ref[:4]):
            a, b = (_obs(a), _obs(b)) if name == "obs" else (a, b)
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")
        frames = _frames(ours)
        assert frames == _frames(ref), f"step {t}: frames"
        assert ours.get_attr("t") == ref.get_attr("t"), f"step {t}: get_attr('t')"
        done = out[2] | out[3]
        # the frame of a finished env shows its last step, not a reset (t == 0)
        terminal_frames += sum(frames[i] > 0 for i in np.flatnonzero(done))
        if rng.random() < 0.15:
            mask = rng.random(n) < 0.5
            mask[rng.integers(n)] = True
            seed = int(rng.integers(100)) if rng.random() < 0.3 else None
            options = {"reset_mask": mask} if rng.random() < 0.8 else None
            res, res_ref = ours.reset(seed=seed, options=options), ref.reset(seed=seed, options=options)
            assert_same(_obs(res[0]), _obs(res_ref[0]), f"step {t}: reset obs ({options}, seed {seed})")
            assert _frames(ours) == _frames(ref), f"step {t}: frames after the reset"
    assert terminal_frames > 50
    ours.close()
    ref.close()


def test_without_a_render_mode_the_pool_resets_a_finished_env_when_it_finishes():
    """The fast path (no render mode): the data is the same, the sub-env is already reset."""
    make = functools.partial(CountingEnv, length=2)
    ours = to_gymnasium(EnvPool([make] * 2, seed_every_episode=False), autoreset_mode="next_step")
    assert not ours._defer_resets
    ours.reset(seed=0)
    ours.step(np.array([1, 1]))
    obs, _, terminated, _, _ = ours.step(np.array([1, 1]))
    assert terminated.all() and obs[:, 0].tolist() == [2.0, 2.0]  # the terminal observation is reported
    assert ours.get_attr("t") == (0, 0)  # but the sub-envs were reset already
    obs, rewards, terminated, _, _ = ours.step(np.array([1, 1]))
    assert obs[:, 0].tolist() == [0.0, 0.0] and rewards.tolist() == [0.0, 0.0] and not terminated.any()
    ours.close()


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
@pytest.mark.parametrize("padding", ["constant", "same"])
def test_catframes_stacks_match_frame_stack_observation_across_autoresets(render_mode, padding):
    """A transform keeping per-row state of its own (CatFrames' frames) under NEXT_STEP: the finished rows are
    reset after the others stepped, so the first step of an episode stacks [pad, pad, reset, o1]-style frames
    exactly as gymnasium's FrameStackObservation on a SyncVectorEnv (it used to stack the reset frame twice)."""
    from gymnasium.wrappers import FrameStackObservation
    from torchrl.envs import CatFrames

    n, k = 3, 3
    gym_padding = "zero" if padding == "constant" else "reset"
    ref = gym.vector.SyncVectorEnv(
        [lambda: FrameStackObservation(gym.make("CartPole-v1"), k, padding_type=gym_padding)] * n)
    kwargs = {} if render_mode is None else {"render_mode": render_mode}
    pool = EnvPool("CartPole-v1", num_envs=n, seed_every_episode=False, **kwargs)
    ours = to_gymnasium(TransformedEnv(pool, CatFrames(N=k, dim=-1, in_keys=["observation"], padding=padding)),
                        autoreset_mode="next_step")
    try:
        np.testing.assert_allclose(ours.reset(seed=0)[0], ref.reset(seed=0)[0].reshape(n, -1), atol=1e-6)
        rng, ends = np.random.default_rng(0), 0
        for t in range(150):
            action = rng.integers(0, 2, n)
            out, expected = ours.step(action), ref.step(action)
            np.testing.assert_allclose(out[0], expected[0].reshape(n, -1), atol=1e-6, err_msg=f"step {t}")
            for a, b in zip(out[1:4], expected[1:4]):
                np.testing.assert_array_equal(a, b)
            ends += int((out[2] | out[3]).sum())
        assert ends > 10  # many autoresets, most while other envs keep running
    finally:
        ours.close()
        ref.close()
