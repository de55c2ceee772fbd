"""Reading and writing one env's row: observations in, actions out.

:class:`RowWriter` writes what a gymnasium env returned into row ``i`` of the
pool's buffers; :class:`ActionCodec` turns a batched TorchRL action into the
objects each gymnasium env expects. Both are built once from the spaces and are
shared by every backend (the process backend builds them inside each worker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np
import torch

from ..errors import EnvError, SpecError, describe
from ..specs import space_to_spec
from .infos import InfoWriter

__all__ = ["RowWriter", "ActionCodec", "observation_leaves", "RESERVED_KEYS"]

Key = tuple[str, ...]

#: Root keys the pool itself writes; a Dict observation may not use them.
RESERVED_KEYS = frozenset(
    {"reward", "done", "terminated", "truncated", "action", "info", "pixels", "episode_seed", "next", "_reset", "_step"}
)


def observation_leaves(space: gym.Space, prefix: Key = ()) -> dict[Key, gym.Space]:
    """``{key: leaf space}`` of an observation space: ``("observation",)`` for a
    non-Dict space, one key per entry (nested) for a Dict."""
    if not prefix and not isinstance(space, gym.spaces.Dict):
        return {("observation",): space}
    if isinstance(space, gym.spaces.Dict):
        out = {}
        for key, sub in space.spaces.items():
            if not prefix and key in RESERVED_KEYS:
                raise SpecError(
                    f"observation_space: Dict key {key!r} clashes with a key the pool writes itself "
                    f"({sorted(RESERVED_KEYS)}); rename it in a gymnasium wrapper."
                )
            out.update(observation_leaves(sub, (*prefix, str(key))))
        return out
    space_to_spec(space, name=f"observation_space{list(prefix)}")  # raises for unsupported leaves
    return {prefix: space}


def _leaf_writer(key: Key, space: gym.Space, buf: np.ndarray) -> Callable[[int, object, str], None]:
    shape = buf.shape[1:]
    kind = buf.dtype.kind
    # Discrete(n, start) observations are stored as indices 0..n-1, like Categorical specs.
    start = getattr(space, "start", None) if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) else None
    start = None if start is None or not np.any(start) else np.asarray(start, dtype=np.int64)

    def write(i: int, value, phase: str) -> None:
        if value.__class__ is not np.ndarray or value.shape != shape:
            value = _coerce(i, key, value, shape, buf.dtype, phase)
        elif value.dtype.kind != kind and not np.can_cast(value.dtype, buf.dtype, "same_kind"):
            _raise_dtype(i, key, value, buf.dtype, phase)
        buf[i] = value if start is None else value - start

    return write


def _coerce(i, key, value, shape, dtype, phase):
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.shape != shape:
        raise EnvError(
            i, phase, f"observation {key}: expected shape {shape} and dtype {dtype}, got {describe(value)}"
        )
    if array.dtype.kind not in "biuf" or not np.can_cast(array.dtype, dtype, "same_kind"):
        _raise_dtype(i, key, array, dtype, phase)
    return array


def _raise_dtype(i, key, value, dtype, phase):
    raise EnvError(
        i, phase, f"observation {key}: expected dtype {dtype} (or one that casts to it), got {describe(value)}"
    )


class RowWriter:
    """Writes one env's reset/step results into row ``i`` of the pool's buffers.

    Args:
        observation_space: the single-env observation space.
        arrays: numpy views of the buffers (see :class:`~.buffers.BufferLayout`).
        info_writer: writes ``("info", ...)`` leaves.
    """

    def __init__(self, observation_space: gym.Space, arrays: Mapping[Key, np.ndarray], info_writer: InfoWriter):
        self.leaves = [
            (key, _leaf_writer(key, space, arrays[key])) for key, space in observation_leaves(observation_space).items()
        ]
        self.is_dict = isinstance(observation_space, gym.spaces.Dict)
        self.write_single = self.leaves[0][1] if not self.is_dict else None
        self.reward = arrays[("reward",)]
        self.terminated = arrays[("terminated",)]
        self.truncated = arrays[("truncated",)]
        self.done = arrays[("done",)]
        self.seed = arrays[("episode_seed",)]
        self.info = info_writer

    def observation(self, i: int, obs, phase: str) -> None:
        if not self.is_dict:
            self.write_single(i, obs, phase)
            return
        if not isinstance(obs, Mapping):
            raise EnvError(i, phase, f"expected a dict observation (Dict space), got {describe(obs)}")
        for key, write in self.leaves:
            value = obs
            try:
                for part in key:
                    value = value[part]
            except (KeyError, TypeError):
                raise EnvError(i, phase, f"observation is missing Dict key {key}; got keys {list(obs)}") from None
            write(i, value, phase)

    def after_reset(self, i: int, obs, info: Mapping, seed: int) -> None:
        self.observation(i, obs, "reset")
        self.info.write(i, info, "reset")
        self.terminated[i] = self.truncated[i] = self.done[i] = False
        self.seed[i] = seed

    def after_step(self, i: int, obs, reward, terminated, truncated, info: Mapping) -> None:
        self.observation(i, obs, "step")
        self.reward[i] = reward
        self.terminated[i] = terminated
        self.truncated[i] = truncated
        self.done[i] = terminated or truncated
        self.info.write(i, info, "step")


class ActionCodec:
    """Converts a batched TorchRL action to one gymnasium action per env, with checks.

    Args:
        action_space: the single-env action space.
        categorical: whether ``Discrete`` actions come as indices (``Categorical``)
            rather than one-hot vectors.
        num_envs: the batch size.
    """

    def __init__(self, action_space: gym.Space, categorical: bool, num_envs: int):
        if isinstance(action_space, gym.spaces.Dict):
            raise SpecError(
                "action_space: Dict action spaces are not supported by EnvPool; expected Box, Discrete, "
                "MultiDiscrete or MultiBinary. Flatten the action in a gymnasium ActionWrapper."
            )
        self.space = action_space
        self.spec = space_to_spec(action_space, categorical=categorical, name="action_space")
        self.categorical = categorical
        self.num_envs = num_envs
        self.shape = (num_envs, *self.spec.shape)
        if isinstance(action_space, gym.spaces.Discrete):
            self.kind, self.start, self.high = "discrete", int(action_space.start), int(action_space.n)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.kind, self.start, self.high = "multidiscrete", action_space.start, action_space.nvec
        elif isinstance(action_space, gym.spaces.MultiBinary):
            self.kind = "binary"
        else:
            self.kind = "box"
            self.np_dtype = action_space.dtype

    def decode(self, action: torch.Tensor, rows: np.ndarray | None) -> list:
        """One env action per row; frozen rows (not in ``rows``) are never read."""
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"action: expected a torch.Tensor of shape {self.shape}, got {describe(action)}")
        if tuple(action.shape) != self.shape:
            raise ValueError(f"action: expected shape {self.shape} ({self.spec.__class__.__name__}), got {tuple(action.shape)}")
        array = action.detach().cpu().numpy()
        if rows is not None:
            array = array[rows]
        return getattr(self, "_" + self.kind)(array, action.dtype, rows)

    def _bad(self, what, rows, bad_rows):
        index = int(bad_rows[0]) if rows is None else int(rows[bad_rows[0]])
        raise ValueError(f"action for env {index}: {what}")

    def _discrete(self, array, dtype, rows):
        if self.categorical:
            if array.dtype.kind not in "iu":
                raise TypeError(f"action: expected an integer dtype (torch.int64) for a Categorical action, got {dtype}")
            bad = np.flatnonzero((array < 0) | (array >= self.high))
            if bad.size:
                self._bad(f"expected an index in [0, {self.high}), got {array[bad[0]]}", rows, bad)
            values = array
        else:
            values = self._one_hot_to_index(array, dtype, rows)
        if self.start:
            values = values + self.start
        return values.tolist()

    def _one_hot_to_index(self, array, dtype, rows):
        if array.dtype.kind not in "biu":
            raise TypeError(f"action: expected an integer or bool one-hot action, got {dtype}")
        bad = np.flatnonzero((array.sum(-1) != 1) | (array.max(-1) != 1) | (array.min(-1) < 0))
        if bad.size:
            self._bad(f"expected a one-hot vector, got {array[bad[0]].tolist()}", rows, bad)
        return array.argmax(-1)

    def _multidiscrete(self, array, dtype, rows):
        if self.categorical:
            if array.dtype.kind not in "iu":
                raise TypeError(f"action: expected an integer dtype for a MultiCategorical action, got {dtype}")
            values = array
        else:
            if array.dtype.kind not in "biu":
                raise TypeError(f"action: expected an integer or bool multi-one-hot action, got {dtype}")
            parts = np.split(array, np.cumsum(self.high)[:-1], axis=-1)
            values = np.stack([self._one_hot_to_index(p, dtype, rows) for p in parts], -1)
        bad = np.flatnonzero(((values < 0) | (values >= self.high)).any(-1))
        if bad.size:
            self._bad(f"expected indices below nvec={self.high.tolist()}, got {values[bad[0]].tolist()}", rows, bad)
        return list(values.astype(np.int64) + self.start)

    def _binary(self, array, dtype, rows):
        if array.dtype.kind not in "biu":
            raise TypeError(f"action: expected an integer or bool MultiBinary action, got {dtype}")
        bad = np.flatnonzero(((array != 0) & (array != 1)).reshape(len(array), -1).any(-1))
        if bad.size:
            self._bad(f"expected 0/1 values, got {array[bad[0]].tolist()}", rows, bad)
        return list(array.astype(self.space.dtype))

    def _box(self, array, dtype, rows):
        if array.dtype.kind != "f" and np.dtype(self.np_dtype).kind == "f":
            raise TypeError(f"action: expected a floating dtype for a Box action (space dtype {self.np_dtype}), got {dtype}")
        return list(array.astype(self.np_dtype, copy=True))
