"""Per-env seed schedules: every episode of every env starts from a known seed.

Env ``i`` keeps a base seed ``b_i`` and an episode counter ``k_i``; its next
reset uses ``b_i + k_i * N`` (``N`` envs), then ``k_i`` grows by one. So:

* ``set_seed(s)`` gives env ``i`` the seed ``s + i`` at its next reset, then
  ``s + i + N``, ``s + i + 2N``...: unique across the pool's envs and episodes. A
  pool seeded ``s`` uses the seeds ``s, s+1, s+2...``, one per episode, so pools
  that run side by side (collector workers) need seeds further apart than the
  episodes they will run (e.g. ``w * 2**32`` for worker ``w``), or they replay
  each other's episodes;
* each env's schedule depends only on its own resets: resetting env ``k``
  never changes the seeds of the others (mask isolation holds for seeds too);
* ``reset(seed=[s_0, ..., s_{N-1}])`` sets ``b_i = s_i`` for the reset rows (a ``None``
  entry leaves that env on its own schedule). Two rows whose bases are equal modulo ``N``
  then share seeds (each steps by ``N``), so one replays the other's episodes, at every
  later reset: :meth:`SeedSchedule.overlap` finds those that meet within 1000 episodes
  from where they are, and the pool warns;
* seeds wrap modulo ``2**63`` (``b_i + k_i * N`` past ``2**63 - 1`` continues from 0), so a
  large base seed never overflows into an invalid (negative) one mid-run.

Without any seed the base is drawn from OS entropy, so runs differ but every
episode's seed is still recorded (``"episode_seed"``) and can be replayed.

With ``every_episode=False`` (gymnasium's own convention), only the first reset
after a seed passes it to the env; later episodes continue the env's random
stream, and ``"episode_seed"`` reports the seed that started the stream.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["SeedSchedule", "broadcast_seeds", "broadcast_options", "NO_SEED"]

_MAX_SEED = 2**63 - 1


#: An env given no seed of its own in a list of seeds (``None``): it keeps its schedule.
NO_SEED = -1


def broadcast_seeds(seed, num_envs: int, allow_none: bool = False) -> np.ndarray | None:
    """``seed`` as ``num_envs`` int64 base seeds: an int ``s`` gives ``s + i``.

    Accepts ``None``, a Python or numpy integer, or a sequence/array/tensor of
    ``num_envs`` integers; with ``allow_none``, ``None`` entries too (each becomes
    :data:`NO_SEED`: that env keeps its schedule; all ``None`` is ``None``).

    Raises:
        ValueError: wrong length, or a negative seed.
        TypeError: a non-integer seed.
    """
    if seed is None:
        return None
    if isinstance(seed, torch.Tensor):
        seed = seed.detach().cpu().numpy()
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed: expected an integer, got {seed!r}")
    if isinstance(seed, (numbers.Integral, np.integer)) or (isinstance(seed, np.ndarray) and seed.ndim == 0):
        if isinstance(seed, np.ndarray) and seed.dtype.kind not in "iu":
            raise TypeError(f"seed: expected an integer, got {seed.dtype} array")
        values = [int(seed) + i for i in range(num_envs)]  # Python ints: checked before any int64 wraps
    elif isinstance(seed, (Sequence, np.ndarray)) and not isinstance(seed, (str, bytes)):
        if len(seed) != num_envs or (isinstance(seed, np.ndarray) and seed.ndim != 1):
            raise ValueError(
                f"seed: expected an int or {num_envs} seeds (one per env), got shape {np.shape(seed)}"
            )
        if isinstance(seed, np.ndarray) and seed.dtype == object and allow_none:
            seed = seed.tolist()  # may hold None entries
        if isinstance(seed, np.ndarray) and seed.dtype.kind not in "iu":
            raise TypeError(f"seed: expected integer seeds, got dtype {seed.dtype}")
        missing = [s is None for s in seed] if allow_none else [False] * num_envs
        if all(missing):
            return None
        bad = [s for s, skip in zip(seed, missing) if not skip and (
            isinstance(s, (bool, np.bool_)) or not isinstance(s, (numbers.Integral, np.integer)))]
        if bad:
            hint = " (a None entry keeps that env's schedule)" if allow_none else ""
            raise TypeError(f"seed: expected integer seeds, got {bad[0]!r} ({type(bad[0]).__name__}){hint}")
        if any(missing):
            given = [int(s) for s, skip in zip(seed, missing) if not skip]
            _check_range(given, seed)
            return np.array([NO_SEED if skip else int(s) for s, skip in zip(seed, missing)], dtype=np.int64)
        values = [int(s) for s in seed]
    else:
        raise TypeError(f"seed: expected an int or a sequence of {num_envs} ints, got {type(seed).__name__}")
    _check_range(values, seed)
    return np.array(values, dtype=np.int64)


def _check_range(values: list[int], seed) -> None:
    if min(values) < 0:
        raise ValueError(f"seed: seeds must be non-negative (gymnasium requires it), got {min(values)}")
    if max(values) > _MAX_SEED:
        one = not isinstance(seed, (Sequence, np.ndarray))  # an int s: env i's seed is s + i
        raise ValueError(
            f"seed: seeds must be below 2**63 (the pool keeps int64 seeds), got {max(values)}"
            + (f" (seed {int(seed)} + env index)" if one else "")
        )


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
    """The base seed and episode counter of each env (see the module docstring).

    Args:
        num_envs: number of envs.
        seed: the first base seed (``seed + i`` for env ``i``); OS entropy when ``None``.
        every_episode: give every reset its own seed (default). With ``False``
            only the first reset after a (re)seed gets one and later episodes
            continue the env's own random stream, gymnasium's vector-env
            convention: cheaper (``env.reset(seed=...)`` rebuilds the env's RNG)
            and still reproducible, but an episode is then identified by the
            stream seed *and* its index, not by a seed of its own.
    """

    def __init__(self, num_envs: int, seed: int | None = None, every_episode: bool = True):
        self.num_envs = num_envs
        self.every_episode = every_episode
        self.base = np.zeros(num_envs, dtype=np.int64)
        self.count = np.zeros(num_envs, dtype=np.int64)
        self.set(seed)

    def set(self, seed: int | None) -> None:
        """Restart every env's schedule at ``seed + i`` (OS entropy when ``None``)."""
        if seed is None:
            # 63 bits of OS entropy (the seed range): pools seeded by chance use consecutive seeds, one per episode,
            # so with 32 bits, many pools running millions of episodes would replay each other's episodes
            entropy = int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0])
            seed = entropy % (_MAX_SEED + 2 - self.num_envs)  # seed + num_envs - 1 stays a valid seed
        self.base[:] = broadcast_seeds(seed, self.num_envs)
        self.count[:] = 0

    def rewind(self, rows: np.ndarray | None, saved: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Undo the last :meth:`next` for ``rows`` (a reset that failed): it advanced each row's
        counter by one, or, with an override, replaced ``base`` and ``count`` (``saved`` holds
        their values from before, taken only then: the common reset copies nothing)."""
        if saved is not None:
            self.base[:], self.count[:] = saved
        else:
            self.count[slice(None) if rows is None else rows] -= 1

    def overlap(self, rows: np.ndarray | None, override: np.ndarray, horizon: int = 1000) -> tuple[int, int] | None:
        """Two rows whose schedules share seeds within ``horizon`` episodes (their current seeds equal modulo
        ``N`` and less than ``horizon * N`` apart, wherever their schedules started), one of them restarted by
        the ``override`` of the last :meth:`next` of ``rows``; ``None`` when there are none. Rows given the same
        seed on purpose are not reported, nor schedules that would meet only after ``horizon`` episodes
        (random seeds in a wide range often do). Only with ``every_episode`` (otherwise a base is one seed,
        not a schedule)."""
        n = self.num_envs
        if not self.every_episode or n < 2:
            return None
        restarted = np.zeros(n, dtype=bool)
        restarted[slice(None) if rows is None else rows] = True
        restarted &= override != NO_SEED
        base = self.base
        at = (base + np.maximum(self.count - 1, 0) * n) & _MAX_SEED  # each row's current episode's seed
        residues = at % n
        order = np.lexsort((at, residues))  # by residue, then by seed: the closest schedules side by side
        a, b = order[:-1], order[1:]
        close = (residues[a] == residues[b]) & (at[b] - at[a] < horizon * n) & (restarted[a] | restarted[b])
        close &= ~(restarted[a] & restarted[b] & (base[a] == base[b]))  # the same seed, given to both on purpose
        found = np.flatnonzero(close)
        return None if not found.size else tuple(sorted((int(a[found[0]]), int(b[found[0]]))))

    def next(self, rows: np.ndarray | None, override: np.ndarray | None = None) -> tuple[list, list[int]]:
        """Seeds for resetting ``rows`` (all when ``None``), advancing their counters.

        Returns ``(reset_seeds, episode_seeds)``: what to pass to ``env.reset``
        (``None`` where the env continues its stream) and what to record as each
        episode's seed. ``override`` (``num_envs`` seeds) restarts those rows'
        schedules first, but for rows given :data:`NO_SEED`.
        """
        if rows is not None and override is None and len(rows) <= 8:
            # the usual partial reset: a few rows, no override; plain Python is cheapest
            base, count, n = self.base, self.count, self.num_envs
            reset_seeds, episode_seeds = [], []
            for j in rows.tolist():
                k = int(count[j])
                count[j] = k + 1
                if self.every_episode:
                    seed = (int(base[j]) + k * n) & _MAX_SEED  # wraps below 2**63, as the int64 path below
                    reset_seeds.append(seed)
                    episode_seeds.append(seed)
                else:
                    reset_seeds.append(None if k else int(base[j]))
                    episode_seeds.append(int(base[j]))
            return reset_seeds, episode_seeds
        index = slice(None) if rows is None else rows
        if override is not None:
            restart = np.arange(self.num_envs)[index]
            restart = restart[override[restart] != NO_SEED]
            self.base[restart] = override[restart]
            self.count[restart] = 0
        count = self.count[index]
        if self.every_episode:
            # int64 arithmetic wraps modulo 2**64; the mask keeps the seed modulo 2**63 (non-negative, as gymnasium
            # requires), the same value the few-rows path computes exactly
            seeds = ((self.base[index] + count * self.num_envs) & _MAX_SEED).tolist()
            self.count[index] += 1
            return seeds, seeds
        episode_seeds = self.base[index].tolist()
        reset_seeds = [None if k else s for k, s in zip(count.tolist(), episode_seeds)]
        self.count[index] += 1
        return reset_seeds, episode_seeds
