"""How a gymnasium ``reset(seed=..., options=...)`` reaches the TorchRL env.

* An :class:`~torchrl_swm.pool.EnvPool` at the base takes per-env seeds and
  options through ``env.reset(seed=..., options=...)`` (also through
  ``TransformedEnv``, which forwards reset keyword arguments): an int ``s``
  gives env ``i`` the seed ``s + i``, exactly as gymnasium's vector envs do.
* Any other TorchRL env is seeded with ``env.set_seed(s)`` before the reset;
  a list of seeds is accepted only when it is ``[s, s + 1, ...]`` (TorchRL's own
  convention for batched envs). Reset options have no TorchRL counterpart there
  and raise.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

__all__ = ["reset_kwargs"]


def _as_seed_list(seed, num_envs: int, what: str) -> list[int]:
    if isinstance(seed, torch.Tensor):
        seed = seed.tolist()
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"{what}: expected an int or {num_envs} seeds, got {len(seeds)}")
    if not all(isinstance(s, (numbers.Integral, np.integer)) and not isinstance(s, bool) for s in seeds):
        raise TypeError(f"{what}: seeds must be integers, got {seeds!r}")
    return [int(s) for s in seeds]


def reset_kwargs(env, traits, seed, options: dict | None, num_envs: int, what: str) -> dict:
    """Keyword arguments for ``env.reset`` (and seed the env first when it has no per-env seeds)."""
    if seed is not None and not isinstance(seed, (numbers.Integral, np.integer)):
        if isinstance(seed, (str, bytes, float)):
            raise TypeError(f"{what}: seed must be an int or a list of ints, got {type(seed).__name__}")
        seed = _as_seed_list(seed, num_envs, what)
    if isinstance(seed, bool):
        raise TypeError(f"{what}: seed must be an int or a list of ints, got a bool")
    if traits.pool is not None:
        kwargs = {}
        if seed is not None:
            kwargs["seed"] = seed
        if options:
            kwargs["options"] = options
        return kwargs
    if options:
        raise TypeError(
            f"{what}: reset options {sorted(options)} are passed to the sub-envs of an EnvPool; "
            f"{type(env).__name__} takes none"
        )
    if seed is None:
        return {}
    if isinstance(seed, list):
        first = seed[0]
        if seed != list(range(first, first + num_envs)):
            raise ValueError(
                f"{what}: per-env seeds need an EnvPool at the base; {type(env).__name__} is seeded as a whole "
                f"with env.set_seed(s), which covers seeds [s, s+1, ...] only (got {seed})"
            )
        seed = first
    env.set_seed(int(seed))
    return {}
