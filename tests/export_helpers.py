"""Helpers shared by the export tests: gymnasium-side twins of EnvPool's seeding, comparisons."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import data_equivalence


class PoolSeedSchedule(gym.Wrapper):
    """Reset seeds as ``EnvPool`` schedules them: env ``i`` of ``N`` resets its ``k``-th
    episode with ``base + k * N``, where ``base`` is the last seed passed to ``reset``
    (``s + i`` for a vector ``reset(seed=s)``). Wrapping the sub-envs of a gymnasium
    ``SyncVectorEnv`` with it makes their autoresets draw the same initial states as
    the pool's."""

    def __init__(self, env: gym.Env, num_envs: int):
        super().__init__(env)
        self.num_envs, self.base, self.k = num_envs, None, 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.base, self.k = int(seed), 0
        if self.base is None:
            return self.env.reset(seed=None, options=options)
        seed = self.base + self.k * self.num_envs
        self.k += 1
        return self.env.reset(seed=seed, options=options)


def probed(env: gym.Env) -> gym.Env:
    """``env`` after the one reset EnvPool's construction probe gives each sub-env (for envs that count resets)."""
    env.reset()
    return env


def sync_twin(env_id: str, num_envs: int, mode, **make_kwargs) -> gym.vector.SyncVectorEnv:
    """gymnasium's own SyncVectorEnv over ``env_id`` with EnvPool's seed schedule."""
    return gym.vector.SyncVectorEnv(
        [lambda: PoolSeedSchedule(gym.make(env_id, **make_kwargs), num_envs) for _ in range(num_envs)],
        autoreset_mode=mode,
    )


def assert_same(a, b, what: str, exact: bool = True):
    assert data_equivalence(a, b, exact=exact), f"{what} differ:\n{a!r}\n!=\n{b!r}"


def without(infos: dict, *keys) -> dict:
    """``infos`` without ``keys`` and their ``_key`` masks, recursively (final_info too)."""
    out = {}
    drop = set(keys) | {"_" + k for k in keys}
    for key, value in infos.items():
        if key in drop:
            continue
        out[key] = without(value, *keys) if isinstance(value, dict) else value
    return out


def action_stream(space: gym.Space, steps: int, seed: int = 0) -> list[np.ndarray]:
    """``steps`` samples of ``space``, reproducible from ``seed`` (``space`` itself is not reseeded)."""
    space = copy.deepcopy(space)
    space.seed(seed)
    return [space.sample() for _ in range(steps)]
