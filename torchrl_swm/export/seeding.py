"""How a gymnasium ``reset(seed=..., options=...)`` reaches the TorchRL env.

* An :class:`~torchrl_swm.pool.EnvPool` at the base takes per-env seeds and
  options through ``env.reset(seed=..., options=...)`` (also through
  ``TransformedEnv``, which forwards reset keyword arguments): an int ``s``
  gives env ``i`` the seed ``s + i``, exactly as gymnasium's vector envs do.
  A list may hold ``None`` for an env that is not reseeded (gymnasium's
  ``list[int | None]``): the vector env then resets the seeded and the
  unseeded envs in two masked resets (:func:`seed_groups`).
* A :class:`~torchrl_swm.world_model.WorldModelEnv` at the base takes one int seed
  and the options through ``env.reset(seed=..., options=...)``: it seeds its
  generators and passes both to its ``reset_fn``, as its own ``reset`` does.
* TorchRL's ``GymEnv``/``GymWrapper`` at the base (under any ``TransformedEnv``)
  take the seed and the options as ``env.reset(seed=s, options=o)``, which reach
  gymnasium's ``reset(seed=s, options=o)``: the first episode is gymnasium's own
  for that seed.
* Any other TorchRL env is seeded as a whole with ``env.set_seed(s)`` before the
  reset (a TorchRL ``SerialEnv``/``ParallelEnv`` derives each worker's seed from
  ``s``). Per-env seed lists need an ``EnvPool`` and raise there (all ``None`` is
  no seed). Reset options have no TorchRL counterpart there and raise.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import torch
from torchrl.envs.libs.gym import GymWrapper

from ..errors import describe
from ._core import base_env

__all__ = ["reset_kwargs", "normalize_seed", "seed_groups", "check_options"]


def _is_int(s) -> bool:
    return isinstance(s, (numbers.Integral, np.integer)) and not isinstance(s, (bool, np.bool_))


def normalize_seed(seed, num_envs: int, what: str):
    """``None``, an ``int``, or a list of ``num_envs`` entries, each an ``int`` or ``None``.

    A list of ``None`` only is ``None`` (no env is reseeded), as on gymnasium's ``SyncVectorEnv``.

    Raises:
        TypeError: a seed that is neither an integer nor ``None`` (a bool, a float, a string...).
        ValueError: a list of the wrong length.
    """
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"{what}: seed must be an int or a list of ints (or None), got a bool")
    if _is_int(seed):
        return int(seed)
    if isinstance(seed, np.ndarray) and seed.ndim == 0:
        return normalize_seed(seed[()], num_envs, what)
    if isinstance(seed, torch.Tensor) and seed.ndim == 0:  # a 0-d tensor, as EnvPool.reset(seed=) takes it
        return normalize_seed(seed.item(), num_envs, what)
    if isinstance(seed, (str, bytes, float)) or not hasattr(seed, "__iter__"):
        raise TypeError(f"{what}: seed must be an int or a list of ints (or None), got {type(seed).__name__}")
    if isinstance(seed, torch.Tensor):
        seed = seed.tolist()
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"{what}: expected an int or {num_envs} seeds, got {len(seeds)}")
    if not all(s is None or _is_int(s) for s in seeds):
        raise TypeError(f"{what}: seeds must be integers or None, got {seeds!r}")
    if all(s is None for s in seeds):
        return None
    return [None if s is None else int(s) for s in seeds]


def seed_groups(seed, num_envs: int):
    """Split a normalized per-env seed list holding ``None`` into ``(seeded, seeds, unseeded)``.

    ``seeded``/``unseeded`` are numpy bool masks; ``seeds`` is a full list of ``num_envs`` ints
    (``0`` in place of ``None``: an ``EnvPool`` reseeds only the rows it resets). ``None`` when
    ``seed`` needs no split (``None``, an int, or ints only).
    """
    if not isinstance(seed, list) or all(s is not None for s in seed):
        return None
    unseeded = np.array([s is None for s in seed], dtype=np.bool_)
    return ~unseeded, [0 if s is None else s for s in seed], unseeded


def check_options(options, what: str) -> dict:
    """gymnasium's ``options``: ``None`` or one dict (a copy), else a clear TypeError."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{what}: options must be a dict (one for every env, as gymnasium's reset takes it; 'reset_mask' in it "
            f"selects the envs a vector env resets), got {describe(options)}"
        )
    return dict(options)


def reset_kwargs(env, traits, seed, options: dict | None, num_envs: int, what: str) -> dict:
    """Keyword arguments for ``env.reset`` (and seed the env first when it has no per-env seeds).

    ``seed`` is ``None``, an int or a list of ints (:func:`normalize_seed`, and
    :func:`seed_groups` for lists holding ``None``).
    """
    seed = normalize_seed(seed, num_envs, what)
    options = check_options(options, what)
    if traits.pool is not None:
        kwargs = {}
        if seed is not None:
            if isinstance(seed, list) and any(s is None for s in seed):
                raise ValueError(f"{what}: split a seed list holding None with seed_groups() first, got {seed}")
            kwargs["seed"] = seed
        if options:
            kwargs["options"] = options
        return kwargs
    if traits.world_model:
        if isinstance(seed, list):
            raise ValueError(
                f"{what}: a WorldModelEnv is seeded as a whole (its generators, and its reset_fn's seed): pass "
                f"one int (got {seed})"
            )
        kwargs = {} if seed is None else {"seed": seed}
        if options:
            kwargs["options"] = options
        return kwargs
    if isinstance(seed, list):
        raise ValueError(
            f"{what}: per-env seeds need an EnvPool at the base; {type(env).__name__} is seeded as a whole "
            f"with env.set_seed(s): pass one int s (got {seed})"
        )
    if isinstance(base_env(env), GymWrapper):
        # TorchRL's GymEnv/GymWrapper pass reset(seed=s, options=o) to gymnasium's reset, so the first episode is
        # gymnasium's reset(seed=s) one; its set_seed(s) resets with s itself, and the next reset would
        # start gymnasium's second episode
        kwargs = {} if seed is None else {"seed": int(seed)}
        if options:
            kwargs["options"] = options
        return kwargs
    if options:
        raise TypeError(
            f"{what}: reset options {sorted(options)} reach the sub-envs of an EnvPool, a WorldModelEnv's reset_fn "
            f"and the gymnasium env of a TorchRL GymEnv/GymWrapper; {type(env).__name__} takes none"
        )
    if seed is None:
        return {}
    env.set_seed(int(seed))
    return {}
