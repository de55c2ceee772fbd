"""Writing what the envs return into their rows of the pool's buffers.

:class:`RowWriter` is built once from the observation space and shared by every
backend (the process backend builds one inside each worker). This module and
the ones it imports stay free of torch and torchrl, so worker processes start fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sys

import gymnasium as gym
import numpy as np

from ..errors import EnvError, SpecError, describe
from .infos import InfoWriter, cast_problem, first_cast_problem, tensor_numpy

__all__ = ["RowWriter", "observation_leaves", "action_kind", "env_action_list", "RESERVED_KEYS"]

Key = tuple[str, ...]

#: Root keys the pool itself writes; a Dict observation may not use them.
RESERVED_KEYS = frozenset(
    {"reward", "done", "terminated", "truncated", "action", "info", "info_mask", "pixels", "episode_seed", "next",
     "_reset", "_step"}
)


def observation_leaves(space: gym.Space, prefix: Key = ()) -> dict[Key, gym.Space]:
    """``{key: leaf space}`` of an observation space: ``("observation",)`` for a
    non-Dict space, one key per entry (nested) for a Dict. Dict keys the pool
    writes itself (:data:`RESERVED_KEYS`), and keys starting with ``"_"`` at any
    depth (the pool's scratch buffers, private to TorchRL), are a :class:`SpecError`."""
    if not prefix and not isinstance(space, gym.spaces.Dict):
        return {("observation",): space}
    if isinstance(space, gym.spaces.Dict):
        if not space.spaces:  # nothing to record: it would vanish from every output without a word
            where = f"its entry {prefix}" if prefix else "it"
            raise SpecError(
                f"observation_space: {where} is an empty Dict, which holds no value the pool could record; "
                "remove it in a gymnasium wrapper (or give it an entry)."
            )
        out = {}
        names = [str(key) for key in space.spaces]
        if len(set(names)) < len(names):
            clash = [key for key in space.spaces if names.count(str(key)) > 1]
            raise SpecError(
                f"observation_space: Dict keys {clash} (at {prefix or 'the root'}) become the same TensorDict key "
                f"{str(clash[0])!r}, so one would be lost; rename them in a gymnasium wrapper."
            )
        for key, sub in space.spaces.items():
            if not prefix and key in RESERVED_KEYS:
                raise SpecError(
                    f"observation_space: Dict key {key!r} clashes with a key the pool writes itself "
                    f"({sorted(RESERVED_KEYS)}); rename it in a gymnasium wrapper."
                )
            if str(key) == "":
                raise SpecError(
                    f"observation_space: Dict key {key!r} (at {prefix or 'the root'}) is empty, which a TorchRL "
                    "Composite spec cannot hold as a key; rename it in a gymnasium wrapper."
                )
            if str(key).startswith("_"):
                raise SpecError(
                    f"observation_space: Dict key {key!r} (at {(*prefix, str(key))}) starts with '_': the pool keeps "
                    "such keys for its own scratch buffers and TorchRL treats them as private, so it would be "
                    "missing from every output; rename it in a gymnasium wrapper (e.g. "
                    "gymnasium.wrappers.TransformObservation with a renamed Dict space)."
                )
            out.update(observation_leaves(sub, (*prefix, str(key))))
        return out
    return {prefix: space}


def _start(space: gym.Space) -> np.ndarray | None:
    """A ``Discrete(n, start)``/``MultiDiscrete`` leaf's nonzero ``start`` (stored as indices ``0..n-1``, as
    Categorical specs), else ``None``."""
    if not isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return None
    start = space.start
    return None if start is None or not np.any(start) else np.asarray(start, dtype=np.int64)


def _sizes(space: gym.Space) -> np.ndarray:
    """A Discrete/MultiDiscrete/MultiBinary leaf's number of values (per entry), as uint64 (see
    ``RowWriter._check_indices``)."""
    if isinstance(space, gym.spaces.MultiBinary):
        return np.asarray(2, dtype=np.uint64)
    return np.asarray(space.n if isinstance(space, gym.spaces.Discrete) else space.nvec, dtype=np.uint64)


def _minus_start(value: np.ndarray, start: np.ndarray) -> np.ndarray:
    """A Discrete/MultiDiscrete value's index, ``value - start``, in int64 two's complement arithmetic (numpy computes
    uint64 - int64 in float64, which rounds ``2**60 + 3 - 2**60`` to 0); an index outside ``0..n-1`` is caught by
    :meth:`RowWriter._check_indices`."""
    return np.subtract(value, start, dtype=np.int64, casting="unsafe")


def _leaf_writer(key: Key, space: gym.Space, buf: np.ndarray) -> Callable[[int, object, str], None]:
    shape = buf.shape[1:]
    dtype = buf.dtype
    start = _start(space)

    def write(i: int, value, phase: str) -> None:
        if value.__class__ is not np.ndarray or value.shape != shape:
            value = _coerce(i, key, value, shape, dtype, phase)
        elif value.dtype is not dtype and value.dtype != dtype:  # the common case (same dtype) skips the check
            _check_cast(i, key, value, dtype, phase)
        buf[i] = value if start is None else _minus_start(value, start)

    return write


def _leaf_batch_writer(key: Key, space: gym.Space, buf: np.ndarray):
    """Writes a batched leaf ``(N, *shape)`` (from a VectorEnv) into the rows ``select``."""
    start = _start(space)

    def write(select, values, phase: str) -> None:
        array = np.asarray(values)
        if array.shape != buf.shape or array.dtype.kind not in "biuf":
            raise EnvError(
                None, phase, f"vector observation {key}: expected an array of shape {buf.shape} and dtype {buf.dtype}, "
                f"got {describe(values)}"
            )
        if array.dtype != buf.dtype:
            found = first_cast_problem(array, buf.dtype, select)  # names the first env whose values do not fit
            if found is not None:
                _check_cast(found[0], key, array[found[0]], buf.dtype, phase)
        if start is not None:
            array = _minus_start(array, start)
        if select is None:
            buf[...] = array
        else:
            buf[select] = array[select]

    return write


def dict_paths(space: gym.Space, key: Key = (), path: tuple = ()) -> dict[Key, tuple]:
    """``{pool key: the Dict keys leading to that leaf in the env's observation}`` (keys of any hashable type;
    the pool's keys are their strings, :func:`observation_leaves`)."""
    if not isinstance(space, gym.spaces.Dict):
        return {key or ("observation",): path}
    out = {}
    for name, sub in space.spaces.items():
        out.update(dict_paths(sub, (*key, str(name)), (*path, name)))
    return out


def _dict_leaf(obs, key: tuple):
    """The leaf at the nested ``key`` of a Dict observation (KeyError/TypeError when absent)."""
    for part in key:
        obs = obs[part]
    return obs


def _coerce(i, key, value, shape, dtype, phase):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = tensor_numpy(value.detach().cpu())
    array = np.asarray(value)
    if array.shape != shape:
        raise EnvError(
            i, phase, f"observation {key}: expected shape {shape} and dtype {dtype}, got {describe(value)}"
        )
    if array.dtype != dtype:
        _check_cast(i, key, array, dtype, phase)
    return array


def _check_cast(i, key, value: np.ndarray, dtype: np.dtype, phase: str) -> None:
    """Raise unless ``value`` (of another dtype) can be stored as ``dtype`` without changing it (see
    :func:`~.infos.cast_problem`: integers of another width or sign are range-checked)."""
    problem = cast_problem(value, dtype)
    if problem is not None:
        raise EnvError(
            i, phase, f"observation {key}: expected dtype {dtype} (or one that casts to it), got {describe(value)}: {problem}"
        )


class RowWriter:
    """Writes what the envs returned into their rows of the pool's buffers.

    Backends loop over their envs and call :meth:`observation` (or write
    ``fast_observation`` themselves, for the common single-array case) and the
    info writer per env, then :meth:`step_flags`/:meth:`reset_flags` once for
    all rows: one numpy assignment per buffer instead of one per env.

    Args:
        observation_space: the single-env observation space.
        arrays: numpy views of the buffers (see :class:`~.buffers.BufferLayout`).
        info_writer: writes ``("info", ...)`` leaves.
    """

    def __init__(self, observation_space: gym.Space, arrays: Mapping[Key, np.ndarray], info_writer: InfoWriter):
        leaves = observation_leaves(observation_space)
        paths = dict_paths(observation_space)  # the env's own Dict keys (1, not "1") to read each leaf with
        self.leaves = [(paths[key], _leaf_writer(key, space, arrays[key])) for key, space in leaves.items()]
        self.batch_leaves = [(paths[key], _leaf_batch_writer(key, space, arrays[key])) for key, space in leaves.items()]
        #: ``(Dict path, buffer, start)`` per leaf: what :meth:`first_changed_row` compares
        self.batch_views = [(paths[key], arrays[key], _start(space)) for key, space in leaves.items()]
        #: ``(key, buffer, sizes, start, space)`` per Discrete/MultiDiscrete/MultiBinary leaf: the rows written are
        #: checked to hold indices ``0..n-1`` (a value outside the space, shifted by ``start``, would leave the spec)
        self.index_leaves = [
            (key, arrays[key], _sizes(space), _start(space), space)
            for key, space in leaves.items()
            if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        ]
        self.is_dict = isinstance(observation_space, gym.spaces.Dict)
        self.write_single = self.leaves[0][1] if not self.is_dict else None
        #: ``(buffer, row shape)`` when the observation is one Box array:
        #: :meth:`observations_of_rows` then stacks a batch in one assignment.
        self.fast_observation = None
        if isinstance(observation_space, gym.spaces.Box):
            buf = arrays[("observation",)]
            # int64 rows promote into a float64 stack without a word (2**53 + 1 rounded): for such a
            # dtype even a stack of the Box's own dtype must come from rows of that dtype
            mixed_ints_hide = np.promote_types(np.int64, buf.dtype) == buf.dtype and buf.dtype.kind == "f"
            self.fast_observation = (buf, buf.shape[1:], buf.dtype, mixed_ints_hide)
        self.reward = arrays[("reward",)]
        self.terminated = arrays[("terminated",)]
        self.truncated = arrays[("truncated",)]
        self.done = arrays[("done",)]
        self.seed = arrays[("episode_seed",)]
        self.info = info_writer

    def observation(self, i: int, obs, phase: str) -> None:
        """Write env ``i``'s observation, checking its shape and dtype (and that Discrete values are in their space)."""
        self._write_observation(i, obs, phase)
        if self.index_leaves:
            self._check_indices(slice(i, i + 1), (i,), phase)

    def _write_observation(self, i: int, obs, phase: str) -> None:
        if not self.is_dict:
            self.write_single(i, obs, phase)
            return
        if not isinstance(obs, Mapping):
            raise EnvError(i, phase, f"expected a dict observation (Dict space), got {describe(obs)}")
        for key, write in self.leaves:
            try:
                value = _dict_leaf(obs, key)
            except (KeyError, TypeError):
                raise EnvError(i, phase, f"observation is missing Dict key {list(key)}; got keys {list(obs)}") from None
            write(i, value, phase)

    def observations_of_rows(self, index, rows, observations: tuple, phase: str) -> None:
        """Write one observation per env of ``rows`` (global indices; ``index`` selects them in the buffers).

        A single Box observation is stacked and written in one assignment when
        every value is a number array of the right shape (what the per-row check
        accepts) and the stack's dtype is each row's own (or the Box's, where that
        hides no row's value); anything else goes row by row, which coerces what it
        can and raises an :class:`EnvError` naming the env otherwise.
        """
        if self.fast_observation is not None:
            buf, shape, dtype, mixed_ints_hide = self.fast_observation
            try:
                array = np.asarray(observations)
            except (TypeError, ValueError, RuntimeError):
                # ragged, not array-like, a tensor that requires grad: the per-row path says which env
                array = None
            if array is not None and array.shape[1:] == shape:
                stacked = array.dtype
                # the stack's dtype is the promotion of every row's: one check of it is each row's own check
                # only when every row has that dtype (float32 next to int64 rows stacks as float64, where
                # 2**24 + 1 passes); otherwise the per-row path checks each row whatever the others sent
                if stacked is dtype or stacked == dtype:  # the common case: no check, unless ints could hide
                    if not mixed_ints_hide or _rows_have_dtype(observations, stacked):
                        buf[index] = array
                        return
                elif _rows_have_dtype(observations, stacked) and cast_problem(array, dtype) is None:
                    buf[index] = array
                    return
        write = self._write_observation
        for i, obs in zip(rows, observations):
            write(i, obs, phase)
        if self.index_leaves:
            self._check_indices(index, rows, phase)

    def observations(self, select, obs, phase: str) -> None:
        """Write a batched observation (from a VectorEnv) into the rows ``select`` (bool mask; ``None``: all)."""
        for key, write in self.batch_leaves:
            value = obs
            if self.is_dict:
                try:
                    value = _dict_leaf(obs, key)
                except (KeyError, TypeError):
                    raise EnvError(None, phase, f"vector observation is missing Dict key {list(key)}") from None
            write(select, value, phase)
        if self.index_leaves:
            self._check_indices(slice(None) if select is None else select, None, phase)

    def _check_indices(self, index, rows, phase: str) -> None:
        """Raise for the first of ``rows`` (``index`` selects them in the buffers; ``rows=None``: derived from
        ``index``, a slice of every row or a bool mask, only when one is bad) whose Discrete/MultiDiscrete/
        MultiBinary value was outside its space; one vectorised comparison per leaf."""
        bad = None  # (row, leaf) of the first row with a value outside, whichever leaf holds it
        for key, buf, sizes, start, space in self.index_leaves:
            written = buf[index]
            # as uint64 a negative index is huge: one comparison finds values below start and above the last
            unsigned = written.view(np.dtype(f"u{written.dtype.itemsize}"))  # (a MultiBinary's buffer is int8)
            outside = (unsigned >= sizes).reshape(len(written), -1).any(1)
            if outside.any():
                k = int(np.argmax(outside))
                if bad is None or k < bad[0]:
                    bad = (k, key, written, start, space)
        if bad is not None:
            k, key, written, start, space = bad
            value = written[k] if start is None else written[k] + start
            described = " ".join(str(space).split())  # an n-d MultiDiscrete's repr spans lines
            if rows is None:
                rows = range(len(written)) if isinstance(index, slice) else np.flatnonzero(index)
            raise EnvError(int(rows[k]), phase, f"observation {key}: expected a value of {described}, got "
                                                f"{value.tolist()}")

    def first_changed_row(self, keep: np.ndarray, obs) -> int | None:
        """The first row in ``keep`` (bool mask) whose batched observation ``obs`` differs from what the
        buffers hold (NaN equal to NaN); ``None`` when every kept row is unchanged."""
        for path, buf, start in self.batch_views:
            try:
                value = np.asarray(_dict_leaf(obs, path) if self.is_dict else obs)
            except (KeyError, TypeError, ValueError):
                continue  # a malformed batch: the write that follows names it
            if value.shape != buf.shape or value.dtype.kind not in "biuf":
                continue
            new, old = (value if start is None else _minus_start(value, start))[keep], buf[keep]
            if new.dtype != old.dtype:  # compare what the buffer would hold (float64 from numpy into float32)
                with np.errstate(over="ignore", invalid="ignore"):
                    new = new.astype(old.dtype)
            same = new == old
            if new.dtype.kind == "f":
                same |= np.isnan(new) & np.isnan(old)
            rows = ~same.reshape(len(new), -1).all(1)
            if rows.any():
                return int(np.flatnonzero(keep)[np.argmax(rows)])
        return None

    def step_flags(self, index, rows, rewards: list, terminated: list, truncated: list) -> None:
        """Write reward and done flags of the stepped ``rows`` (global indices).

        ``index`` selects the same rows in the buffers (a slice or an int array).
        """
        try:
            # as arrays first: numpy would store None as NaN and "False" or 0.5 as True without a word
            reward, term, trunc = np.asarray(rewards), np.asarray(terminated), np.asarray(truncated)
            if reward.dtype.kind not in "biuf" or not _is_flag(term) or not _is_flag(trunc):
                raise TypeError("reward or done flags of an unexpected type")
            if reward.ndim != 1 or term.ndim != 1 or trunc.ndim != 1:  # a (1,) array per env would broadcast
                raise ValueError("reward or done flags that are not one scalar per env")
            self.reward[index, 0] = reward
            self.terminated[index, 0] = term
            self.truncated[index, 0] = trunc
        except (TypeError, ValueError) as err:
            for i, r, te, tr in zip(rows, rewards, terminated, truncated):
                for name, value in (("reward", r), ("terminated", te), ("truncated", tr)):
                    array = np.asarray(value)
                    ok = array.dtype.kind in "biuf" if name == "reward" else _is_flag(array)
                    if array.shape != () or not ok:
                        expected = "a scalar float" if name == "reward" else "a scalar bool"
                        raise EnvError(int(i), "step", f"{name}: expected {expected}, got {describe(value)}") from err
            raise
        self.done[index] = self.terminated[index] | self.truncated[index]

    def reset_flags(self, index, seeds: list) -> None:
        """Clear the done flags of reset rows and record their episode seeds.

        ``index`` is a slice or an int array of rows; ``seeds`` has one seed per row.
        """
        if isinstance(index, np.ndarray) and len(index) <= 8:
            # the usual partial reset, a few rows: scalar writes cost a tenth of fancy indexing
            terminated, truncated, done, seed = self.terminated, self.truncated, self.done, self.seed
            for i, s in zip(index.tolist(), seeds, strict=True):
                terminated[i, 0] = truncated[i, 0] = done[i, 0] = False
                seed[i, 0] = s
            return
        self.terminated[index] = False
        self.truncated[index] = False
        self.done[index] = False
        self.seed[index, 0] = seeds


def _rows_have_dtype(observations, dtype: np.dtype) -> bool:
    """Whether every row is an array of ``dtype`` (a Python float counts as float64, as numpy reads it)."""
    for obs in observations:
        cls = obs.__class__
        if cls is np.ndarray:
            if obs.dtype != dtype:
                return False
        elif cls is not float or dtype != np.float64:  # a list, tensor, numpy scalar: the per-row path reads it
            return False
    return True


def _is_flag(array: np.ndarray) -> bool:
    """Bools, or integers that are all 0 or 1 (older envs return ints): what a done flag may be."""
    kind = array.dtype.kind
    return kind == "b" or (kind in "iu" and bool(((array == 0) | (array == 1)).all()))


def action_kind(space: gym.Space) -> str:
    """``"discrete"``, ``"multidiscrete"``, ``"binary"`` or ``"box"``."""
    if isinstance(space, gym.spaces.Discrete):
        return "discrete"
    if isinstance(space, gym.spaces.MultiDiscrete):
        return "multidiscrete"
    if isinstance(space, gym.spaces.MultiBinary):
        return "binary"
    return "box"


def env_action_list(kind: str, array: np.ndarray, copy: bool = True) -> list:
    """Per-env gymnasium actions from a batch: numpy integer scalars for Discrete
    (what ``Discrete.sample()`` and gymnasium's vector envs pass, and what
    ``Discrete.contains`` checks fastest), one array row otherwise: a row of a copy,
    unless ``array`` is already fresh (``copy=False``), so no env sees another's buffer.
    A scalar space's row is a 0-d array, as its ``sample()`` gives (``list()`` would give
    numpy scalars, which ``Box.contains`` warns about and an in-place clip refuses)."""
    if kind == "discrete":
        return list(array)
    if copy:
        array = array.copy()
    if array.ndim == 1:
        return [array[i, ...] for i in range(len(array))]
    return list(array)
