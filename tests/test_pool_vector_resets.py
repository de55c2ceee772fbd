"""Resets of a pool over a natively batched gymnasium ``VectorEnv``: which rows, which options, which env.

Each test pins one reset path of ``torchrl_swm/pool/vector.py`` that a data check elsewhere would miss
(review R1 of the fifteenth round).
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from torchrl_swm import EnvError, EnvPool, SpecError

torch.set_num_threads(1)


class EpisodeCounterVec(gym.vector.VectorEnv):
    """obs = ``[100 * episode + t, episode]`` per row; episodes last ``limit`` steps; honours
    ``options["reset_mask"]``; SAME_STEP or DISABLED; ``raise_on_reset_of`` fails a masked reset of that many rows
    without saying which one failed."""

    def __init__(self, n=2, mode=AutoresetMode.SAME_STEP, limit=2, raise_on_reset_of=None):
        self.num_envs, self.limit, self.raise_on_reset_of = n, limit, raise_on_reset_of
        self.metadata = {"autoreset_mode": mode}
        self.single_observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.t, self.episode = np.zeros(n, np.int64), np.zeros(n, np.int64)

    def obs(self):
        return np.stack([self.episode * 100.0 + self.t, self.episode], 1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        if self.raise_on_reset_of is not None and mask.sum() == self.raise_on_reset_of:
            raise RuntimeError("masked reset failed")
        self.t[mask], self.episode[mask] = 0, self.episode[mask] + 1
        return self.obs(), {}

    def step(self, actions):
        self.t += 1
        done = self.t >= self.limit
        info = {}
        obs = self.obs()
        if self.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP and done.any():
            final = np.empty(self.num_envs, object)
            for i in range(self.num_envs):
                final[i] = obs[i] if done[i] else None
            info = {"final_obs": final, "_final_obs": done}
            self.t[done], self.episode[done] = 0, self.episode[done] + 1
            obs = self.obs()
        return obs, np.ones(self.num_envs), done, np.zeros(self.num_envs, bool), info


def zeros(n):
    return torch.zeros(n, dtype=torch.int64)


def test_a_full_reset_after_rows_the_vector_env_reset_itself_forgets_their_stored_reset_observations():
    # SAME_STEP: the rows the env reset inside a step hold their reset observation for the pool's reset of them;
    # a full reset replaces it, so a later masked reset of such a row must take the env's own again
    venv = EpisodeCounterVec(2, AutoresetMode.SAME_STEP, limit=2)
    pool = EnvPool(venv, seed=0, masked_reset=True)
    td = pool.reset()
    for _ in range(2):
        td = pool.step(td.set("action", zeros(2)))["next"]
    assert td["done"].all()  # both rows ended: the env reset them itself
    td = pool.reset(seed=[5, 5])  # a seeded full reset: the env resets every row again
    td = pool.step(td.set("action", zeros(2)))["next"]
    td["_reset"] = torch.tensor([[True], [False]])
    out = pool.reset(td)
    assert out["observation"][0].tolist() == venv.obs()[0].tolist() == [500.0, 5.0]
    assert out["observation"][1].tolist() == [401.0, 4.0]  # stepped once since its reset, untouched
    pool.close()


def test_a_full_reset_with_options_after_every_row_ended_on_a_vector_env_without_a_masked_reset():
    venv = EpisodeCounterVec(2, AutoresetMode.SAME_STEP, limit=1)
    pool = EnvPool(venv, seed=0)  # no masked_reset: a row can only be reset by the env itself
    pool.step(pool.reset().set("action", zeros(2)))
    before = venv.episode.copy()
    out = pool.reset(options={"x": 1})  # every row ended and was reset by the env: a full reset with options runs
    assert venv.episode.tolist() == (before + 1).tolist()
    assert out["observation"].tolist() == venv.obs().tolist()
    pool.close()


def test_a_masked_reset_that_fails_in_a_vector_env_names_the_rows_it_reset_when_the_env_does_not_say_which():
    pool = EnvPool(EpisodeCounterVec(3, AutoresetMode.DISABLED, raise_on_reset_of=2), seed=0, masked_reset=True)
    td = pool.reset()
    with pytest.raises(EnvError, match=r"pool \(reset\): RuntimeError: masked reset failed while resetting envs "
                                       r"\[1, 2\] \(the vector env does not say which\)"):
        pool.reset(td.set("_reset", torch.tensor([[False], [True], [True]])))
    pool.close()


def test_a_masked_reset_function_gets_the_vector_env_with_its_wrappers():
    got = []

    def masked_reset(venv, mask, seed, options):
        got.append(venv)
        return venv.reset(seed=seed, options={**(options or {}), "reset_mask": mask})

    venv = gym.wrappers.vector.RecordEpisodeStatistics(EpisodeCounterVec(2, AutoresetMode.DISABLED))
    pool = EnvPool(venv, seed=0, masked_reset=masked_reset)
    pool.reset(pool.reset().set("_reset", torch.tensor([[True], [False]])))
    assert got and all(v is venv for v in got)
    pool.close()


def test_cartpoles_masked_reset_adapter_refuses_a_wrapped_cartpole_vector_env():
    venv = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"))
    with pytest.raises(SpecError, match=r"CartPoleVectorEnv is wrapped in RecordEpisodeStatistics; its masked reset "
                                        r"adapter bypasses wrappers"):
        EnvPool(venv, seed=0)
    venv.close()


def cartpole_bounds_after(reset):
    venv = gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")
    pool = EnvPool(venv, seed=0)
    td = pool.reset(options={"low": -0.4, "high": 0.4})
    reset(pool, td)
    bounds = (venv.unwrapped.low, venv.unwrapped.high)
    pool.close()
    return bounds


def test_cartpoles_masked_reset_keeps_or_replaces_the_reset_bounds_as_gymnasiums_reset_does():
    # no options: the bounds of the last reset(options=...) stay, as gymnasium's own autoreset keeps them,
    # also for an all-True mask (TorchRL's maybe_reset when every row ended at once)
    for mask in ([[True], [False]], [[True], [True]]):
        assert cartpole_bounds_after(lambda pool, td: pool.reset(td.set("_reset", torch.tensor(mask)))) == (-0.4, 0.4)
    # options={} are options: gymnasium's reset(options={}) goes back to the default bounds
    masked = torch.tensor([[True], [False]])
    assert cartpole_bounds_after(lambda pool, td: pool.reset(td.set("_reset", masked), options={})) == (-0.05, 0.05)


class _NaNObsEnv(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([np.nan, 0.0], np.float32), {}

    def step(self, action):
        return np.array([np.nan, 1.0], np.float32), 0.0, False, False, {}


class _VerifiedSyncVectorEnv(gym.vector.SyncVectorEnv):
    """A subclass: the pool checks that its masked reset leaves the other rows untouched."""


def test_a_nan_in_a_row_a_masked_reset_left_alone_is_not_taken_for_a_change():
    # NaN != NaN: the check that a masked reset left the other rows as they were must read NaN as unchanged, or a
    # NaN observation makes every partial reset an error (review D M7, round 17)
    pool = EnvPool(_VerifiedSyncVectorEnv([_NaNObsEnv, _NaNObsEnv]), seed=0, masked_reset=True)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td)["next"]
    td["_reset"] = torch.tensor([[True], [False]])
    out = pool.reset(td)
    assert out["observation"][:, 1].tolist() == [0.0, 1.0] and out["observation"][:, 0].isnan().all()
    pool.close()
