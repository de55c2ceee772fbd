"""What a TorchRL env's transforms add: their time limit, and the keys that are bookkeeping.

World reads the episode step limit of an env's ``StepCounter(max_steps=...)`` (as it reads a
gymnasium ``TimeLimit``), and the exports leave the leaves of bookkeeping transforms
(``StepCounter``'s ``"step_count"``, ``RewardSum``'s ``"episode_reward"``, ``InitTracker``'s
``"is_init"``) out of the default observation, as gymnasium's ``TimeLimit`` and
``RecordEpisodeStatistics`` never change the observation.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchrl.envs import Compose, EnvBase, InitTracker, RewardSum, StepCounter, Transform, TransformedEnv

__all__ = ["transforms_of", "step_counter_limit", "bookkeeping_keys"]


def _key(key) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def transforms_of(env: EnvBase) -> Iterator[Transform]:
    """Every transform of ``env``'s ``TransformedEnv`` layers (inside ``Compose`` too), outermost layer first."""

    def flat(transform):
        if isinstance(transform, Compose):
            for inner in transform:
                yield from flat(inner)
        else:
            yield transform

    while isinstance(env, TransformedEnv):
        yield from flat(env.transform)
        env = env.base_env


def step_limits(env: EnvBase) -> list[tuple[StepCounter, bool]]:
    """``env``'s ``StepCounter`` transforms with a ``max_steps``, each with whether it ends episodes
    (``update_done``; one that only flags ``truncated`` lets them run on)."""
    return [(t, bool(getattr(t, "update_done", True))) for t in transforms_of(env)
            if isinstance(t, StepCounter) and t.max_steps is not None]


def step_counter_limit(env: EnvBase) -> int | None:
    """The smallest ``max_steps`` of ``env``'s ``StepCounter`` transforms that end episodes, or ``None``
    without one."""
    limits = [int(t.max_steps) for t, ends in step_limits(env) if ends]
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
