"""Per-env seed schedules: every episode of every env starts from a known seed.

Env ``i`` keeps a base seed ``b_i`` and an episode counter ``k_i``; its next
reset uses ``b_i + k_i * N`` (``N`` envs), then ``k_i`` grows by one. So:

* ``set_seed(s)`` gives env ``i`` the seed ``s + i`` at its next reset, then
  ``s + i + N``, ``s + i + 2N``...: unique across envs and episodes;
* each env's schedule depends only on its own resets: resetting env ``k``
  never changes the seeds of the others (mask isolation holds for seeds too);
* ``reset(seed=[s_0, ..., s_{N-1}])`` sets ``b_i = s_i`` for the reset rows.

Without any seed the base is drawn from OS entropy, so runs differ but every
episode's seed is still recorded (``"episode_seed"``) and can be replayed.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["SeedSchedule", "broadcast_seeds", "broadcast_options"]


def broadcast_seeds(seed, num_envs: int) -> np.ndarray | None:
    """``seed`` as ``num_envs`` int64 base seeds: an int ``s`` gives ``s + i``.

    Accepts ``None``, a Python or numpy integer, or a sequence/array/tensor of
    ``num_envs`` integers.

    Raises:
        ValueError: wrong length, or a negative seed.
        TypeError: a non-integer seed.
    """
    if seed is None:
        return None
    if isinstance(seed, torch.Tensor):
        seed = seed.detach().cpu().numpy()
    if isinstance(seed, (numbers.Integral, np.integer)) or (isinstance(seed, np.ndarray) and seed.ndim == 0):
        if isinstance(seed, np.ndarray) and seed.dtype.kind not in "iu":
            raise TypeError(f"seed: expected an integer, got {seed.dtype} array")
        seeds = int(seed) + np.arange(num_envs, dtype=np.int64)
    elif isinstance(seed, (Sequence, np.ndarray)) and not isinstance(seed, (str, bytes)):
        array = np.asarray(seed)
        if array.ndim != 1 or len(array) != num_envs:
            raise ValueError(f"seed: expected an int or {num_envs} seeds (one per env), got shape {array.shape}")
        if array.dtype.kind not in "iu":
            raise TypeError(f"seed: expected integer seeds, got dtype {array.dtype}")
        seeds = array.astype(np.int64)
    else:
        raise TypeError(f"seed: expected an int or a sequence of {num_envs} ints, got {type(seed).__name__}")
    if (seeds < 0).any():
        raise ValueError(f"seed: seeds must be non-negative (gymnasium requires it), got {seeds.min()}")
    return seeds


def broadcast_options(options, num_envs: int) -> list:
    """One options dict per env: a dict is deep-copied per env, a list must have ``num_envs`` entries."""
    import copy

    if options is None:
        return [None] * num_envs
    if isinstance(options, dict):
        return [copy.deepcopy(options) for _ in range(num_envs)]
    if isinstance(options, (list, tuple)):
        if len(options) != num_envs:
            raise ValueError(f"options: expected one dict or a list of {num_envs} dicts, got a list of {len(options)}")
        for i, item in enumerate(options):
            if item is not None and not isinstance(item, dict):
                raise TypeError(f"options[{i}]: expected a dict or None, got {type(item).__name__}")
        return list(options)
    raise TypeError(f"options: expected a dict or a list of {num_envs} dicts, got {type(options).__name__}")


class SeedSchedule:
    """The base seed and episode counter of each env (see the module docstring)."""

    def __init__(self, num_envs: int, seed: int | None = None):
        self.num_envs = num_envs
        self.base = np.zeros(num_envs, dtype=np.int64)
        self.count = np.zeros(num_envs, dtype=np.int64)
        self.set(seed)

    def set(self, seed: int | None) -> None:
        """Restart every env's schedule at ``seed + i`` (OS entropy when ``None``)."""
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1, dtype=np.uint32)[0])
        self.base[:] = broadcast_seeds(seed, self.num_envs)
        self.count[:] = 0

    def next(self, rows: np.ndarray | None, override: np.ndarray | None = None) -> list[int]:
        """The seeds for resetting ``rows`` (all when ``None``), advancing their counters.

        ``override`` (``num_envs`` seeds) restarts those rows' schedules first.
        """
        index = slice(None) if rows is None else rows
        if override is not None:
            self.base[index] = override[index]
            self.count[index] = 0
        seeds = self.base[index] + self.count[index] * self.num_envs
        self.count[index] += 1
        return [int(s) for s in seeds]
