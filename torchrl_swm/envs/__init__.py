"""Environments shipped with torchrl_swm, registered with gymnasium on import.

Importing this module registers:

* ``torchrl_swm/PointMaze-v0``: the ``"u"`` maze, 100 steps per episode;
* ``torchrl_swm/PointMaze-Open-v0``: an open 3x3 room, 60 steps;
* ``torchrl_swm/PointMaze-Medium-v0``: a 5x5 maze with two rooms, 150 steps.

All take :class:`~torchrl_swm.envs.point_maze.PointMazeEnv` keyword arguments
through ``gym.make`` (``render_size=``, ``reward_type=``...). The
``torchrl-swm`` command and :class:`torchrl_swm.World` import this module, so
the ids resolve there without an explicit import; elsewhere, ``import
torchrl_swm.envs`` first, or use the picklable factory
``functools.partial(torchrl_swm.envs.make, ID, **kwargs)`` (worker processes
of a process backend do not import this module by themselves).
"""

from __future__ import annotations

import importlib

import gymnasium as gym
from gymnasium.envs.registration import find_highest_version, get_env_id, parse_env_id

from .point_maze import LAYOUTS, PointMazeEnv, PointMazeExpert, expert_actions, expert_policy

__all__ = [
    "PointMazeEnv", "PointMazeExpert", "LAYOUTS", "expert_actions", "expert_policy", "ENV_IDS", "register_envs", "make",
    "spec",
]

ENV_IDS = {
    "torchrl_swm/PointMaze-v0": ({"layout": "u"}, 100),
    "torchrl_swm/PointMaze-Open-v0": ({"layout": "open"}, 60),
    "torchrl_swm/PointMaze-Medium-v0": ({"layout": "medium"}, 150),
}


def register_envs() -> None:
    """Register the ids in :data:`ENV_IDS` with gymnasium (idempotent)."""
    for env_id, (kwargs, max_steps) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="torchrl_swm.envs.point_maze:PointMazeEnv",
                kwargs=dict(kwargs),
                max_episode_steps=max_steps,
            )


def make(env_id: str | gym.envs.registration.EnvSpec, **kwargs) -> gym.Env:
    """``gym.make`` that registers the torchrl_swm ids first.

    Module-level and picklable: ``functools.partial(make, id, ...)`` is a factory
    that also works in spawned worker processes, where ``torchrl_swm.envs`` has
    not been imported yet (and with an ``EnvSpec``, where the id is not registered).

    Example:
        >>> import functools
        >>> from torchrl_swm import EnvPool
        >>> from torchrl_swm.envs import make
        >>> make("torchrl_swm/PointMaze-Open-v0").spec.max_episode_steps
        60
        >>> factory = functools.partial(make, "torchrl_swm/PointMaze-Open-v0", reward_type="sparse")
        >>> pool = EnvPool(factory, 4, seed=0)      # backend="process" too: its workers need no import
        >>> pool.batch_size, pool.observation_spec["state"].shape
        (torch.Size([4]), torch.Size([4, 4]))
        >>> pool.close()
    """
    register_envs()
    return gym.make(env_id, **kwargs)


def spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """``gym.spec`` for every id ``gym.make`` takes, ``"module:Env-v0"`` included.

    As ``gym.make`` does, the module before the colon is imported first (it registers the
    id). Unknown ids raise gymnasium's error, with its "did you mean" message.
    """
    register_envs()
    module, colon, name = env_id.partition(":")
    if not colon:
        name = env_id
    else:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            raise ModuleNotFoundError(
                f"gymnasium id {env_id!r}: cannot import {module!r}, the module that should register {name!r} ({err})"
            ) from err
    namespace, env_name, version = parse_env_id(name)
    if version is None:  # "CartPole": gym.make takes the latest version, with a warning
        latest = find_highest_version(namespace, env_name)
        if latest is not None:
            name = get_env_id(namespace, env_name, latest)
    return gym.spec(name)


register_envs()
