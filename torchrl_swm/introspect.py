"""What a TorchRL env's transforms add: their time limit, and the keys that are bookkeeping.

World reads the episode step limit of an env's ``StepCounter(max_steps=...)`` (as it reads a
gymnasium ``TimeLimit``), in the env's own steps: a counter that a ``FrameSkip`` after it repeats
counts frames, ``frame_skip`` of them per step. The exports leave the leaves of bookkeeping transforms
(``StepCounter``'s ``"step_count"``, ``RewardSum``'s ``"episode_reward"``, ``InitTracker``'s
``"is_init"``) out of the default observation, as gymnasium's ``TimeLimit`` and
``RecordEpisodeStatistics`` never change the observation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from torchrl.envs import Compose, EnvBase, InitTracker, RewardSum, StepCounter, Transform, TransformedEnv
from torchrl.envs.transforms import FrameSkipTransform

__all__ = ["transforms_of", "step_counter_limit", "frames_per_step", "bookkeeping_keys"]


def _key(key) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _flat(transform: Transform) -> Iterator[Transform]:
    """``transform``, or the transforms of a ``Compose`` (nested ones too) in its order."""
    if isinstance(transform, Compose):
        for inner in transform:
            yield from _flat(inner)
    else:
        yield transform


def transforms_of(env: EnvBase) -> Iterator[Transform]:
    """Every transform of ``env``'s ``TransformedEnv`` layers (inside ``Compose`` too), outermost layer first."""
    while isinstance(env, TransformedEnv):
        yield from _flat(env.transform)
        env = env.base_env


def _applied_in_order(env: EnvBase) -> list[Transform]:
    """``env``'s transforms in the order a step applies them: the innermost layer first, a ``Compose`` in its
    order (a transform's ``parent``, which a ``FrameSkip`` repeats, is the base env and every one before it)."""
    layers = []
    while isinstance(env, TransformedEnv):
        layers.append(env.transform)
        env = env.base_env
    return [t for layer in reversed(layers) for t in _flat(layer)]


def _skips(transforms) -> int:
    return math.prod(int(t.frame_skip) for t in transforms if isinstance(t, FrameSkipTransform))


def frames_per_step(env: EnvBase) -> int:
    """How many base-env steps one step of ``env`` runs at most: the product of its ``FrameSkip``'s
    ``frame_skip`` (1 without one). A gymnasium ``TimeLimit`` of the base env counts those."""
    return _skips(_applied_in_order(env))


def step_limits(env: EnvBase) -> list[tuple[StepCounter, bool]]:
    """``env``'s ``StepCounter`` transforms with a ``max_steps``, each with whether it ends episodes
    (``update_done``; one that only flags ``truncated`` lets them run on)."""
    return [(t, bool(getattr(t, "update_done", True))) for t in transforms_of(env)
            if isinstance(t, StepCounter) and t.max_steps is not None]


def step_counter_limit(env: EnvBase) -> int | None:
    """The most steps of ``env`` an episode can last under its ``StepCounter`` transforms that end episodes
    (the smallest ``max_steps``), or ``None`` without one. A counter that a ``FrameSkip`` after it repeats
    counts frames: its ``max_steps`` frames end the episode at step ``ceil(max_steps / frame_skip)``."""
    order = _applied_in_order(env)
    frames = {id(t): _skips(order[i + 1:]) for i, t in enumerate(order)}  # per step, of each transform
    limits = [math.ceil(int(t.max_steps) / frames[id(t)]) for t, ends in step_limits(env) if ends]
    return min(limits) if limits else None


def bookkeeping_keys(env: EnvBase) -> set[tuple[str, ...]]:
    """The keys ``env``'s ``StepCounter``, ``RewardSum`` and ``InitTracker`` transforms write."""
    keys: set[tuple[str, ...]] = set()
    for transform in transforms_of(env):
        if isinstance(transform, StepCounter):
            keys.update(_key(k) for k in transform.step_count_keys)
        elif isinstance(transform, (RewardSum, InitTracker)):
            keys.update(_key(k) for k in transform.out_keys)
    return keys
