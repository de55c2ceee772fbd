"""Actions out: a batched TorchRL action turned into what each gymnasium env expects.

:class:`ActionCodec` validates the action (shape; dtype; the range of discrete and
binary actions, and for integer Box actions that each value fits the space's dtype:
an error names the env; Box actions are not clipped to the Box's bounds, as TorchRL's
``GymWrapper`` does not) and converts it once per step, for all envs, to the action
space's dtype.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from ..errors import SpecError, describe
from ..specs import space_to_spec
from .infos import first_cast_problem, tensor_numpy
from .rows import action_kind, env_action_list

__all__ = ["ActionCodec"]


class ActionCodec:
    """Converts a batched TorchRL action to one gymnasium action per env, with checks.

    Args:
        action_space: the single-env action space.
        categorical: whether ``Discrete`` actions come as indices (``Categorical``)
            rather than one-hot vectors.
        num_envs: the batch size.
    """

    def __init__(self, action_space: gym.Space, categorical: bool, num_envs: int):
        spaces = gym.spaces
        if not isinstance(action_space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
            raise SpecError(
                f"action_space: {type(action_space).__name__} action spaces ({action_space}) are not supported by "
                "EnvPool; expected Box, Discrete, MultiDiscrete or MultiBinary. Flatten the action in a gymnasium "
                "ActionWrapper."
            )
        self.space = action_space
        self.spec = space_to_spec(action_space, categorical=categorical, name="action_space", action=True)
        self.categorical = categorical
        self.num_envs = num_envs
        self.shape = torch.Size((num_envs, *self.spec.shape))
        self.kind = action_kind(action_space)
        if self.kind == "discrete":
            self.start, self.high = int(action_space.start), int(action_space.n)
            # gymnasium's Discrete.contains checks a numpy integer faster than a Python int
            # (which goes through np.iinfo), and Discrete.sample() returns one: hand envs
            # shared, immutable numpy scalars
            dtype = np.dtype(action_space.dtype).type
            self._scalars = [dtype(self.start + k) for k in range(self.high)] if self.high <= 4096 else None
        elif self.kind == "multidiscrete":
            self.start, self.high = action_space.start, action_space.nvec
        elif self.kind == "box":
            self.np_dtype = action_space.dtype

    def env_action_layout(self) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of a batch of env actions (what ``decode(..., batched=True)`` returns)."""
        # the space's own dtype: gymnasium's contains() refuses an int64 action for an int32/int8 space
        if self.kind == "discrete":
            return (self.num_envs,), np.dtype(self.space.dtype)
        if self.kind == "multidiscrete":
            return (self.num_envs, *self.high.shape), np.dtype(self.space.dtype)  # an n-d nvec too
        return (self.num_envs, *self.space.shape), np.dtype(self.space.dtype)

    def decode(self, action: torch.Tensor, rows: np.ndarray | None, batched: bool = False):
        """The env actions of ``rows`` (all when ``None``); frozen rows are never read.

        Returns one object per row (numpy integer scalars for discrete spaces,
        as ``Discrete.sample()`` gives), or with ``batched=True`` one numpy array
        with a leading row dim, for a ``VectorEnv``.
        """
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"action: expected a torch.Tensor of shape {tuple(self.shape)}, got {describe(action)}")
        if action.shape != self.shape:
            raise ValueError(f"action: expected shape {tuple(self.shape)} ({self.spec.__class__.__name__}), got {tuple(action.shape)}")
        if action.device.type != "cpu" or action.requires_grad:
            action = action.detach().cpu()
        if rows is None and self.kind == "discrete" and self.categorical and not batched:
            # the hot path of Discrete pools: no numpy call (each costs microseconds in the loop)
            return self._categorical_list(action, action.dtype, rows)
        array = tensor_numpy(action)
        if rows is not None:
            array = array[rows]
        if self.kind == "discrete" and self.categorical and not batched:
            return self._categorical_list(array, action.dtype, rows)
        values = getattr(self, "_" + self.kind)(array, action.dtype, rows)  # a fresh array
        return values if batched else env_action_list(self.kind, values, copy=False)

    def _bad(self, what, rows, bad_rows):
        index = int(bad_rows[0]) if rows is None else int(rows[bad_rows[0]])
        raise ValueError(f"action for env {index}: {what}")

    def _check_categorical(self, array, dtype):
        if array.dtype.kind not in "iu":
            raise TypeError(f"action: expected an integer dtype (torch.int64) for a Categorical action, got {dtype}")

    def _categorical_list(self, array, dtype, rows):
        # one numpy scalar per env, range-checked in Python; ``array`` is a numpy array or a CPU tensor
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            raise TypeError(f"action: expected an integer dtype (torch.int64) for a Categorical action, got {dtype}")
        values = array.tolist()
        if values and (min(values) < 0 or max(values) >= self.high):
            array = np.asarray(values)
            bad = np.flatnonzero((array < 0) | (array >= self.high))
            self._bad(f"expected an index in [0, {self.high}), got {array[bad[0]]}", rows, bad)
        scalars = self._scalars
        if scalars is None:
            return list(np.asarray(values, dtype=self.space.dtype) + self.start)
        return [scalars[v] for v in values]

    def _discrete(self, array, dtype, rows):
        if self.categorical:
            self._check_categorical(array, dtype)
            values = array.astype(np.int64)  # a fresh array: no env sees the caller's buffer
            # one reduction for both bounds: a negative index reads as a huge unsigned one
            if values.size and values.view(np.uint64).max() >= self.high:
                bad = np.flatnonzero((array < 0) | (array >= self.high))
                self._bad(f"expected an index in [0, {self.high}), got {array[bad[0]]}", rows, bad)
        else:
            values = self._one_hot_to_index(array, dtype, rows)
        values = values + self.start if self.start else values
        return values.astype(self.space.dtype, copy=False)  # in range: the cast is exact

    def _one_hot_to_index(self, array, dtype, rows):
        # floats too, when exactly 0 or 1: a OneHotCategorical sample is a float one-hot, as TorchRL's GymEnv takes it
        if array.dtype.kind not in "biuf":
            raise TypeError(f"action: expected an integer, bool or 0/1 float one-hot action, got {dtype}")
        not_one_hot = (array.sum(-1) != 1) | (array.max(-1) != 1) | (array.min(-1) < 0)
        if array.dtype.kind == "f":  # [1.0, 1e-8] sums to 1.0 in float32: only exact 0s and 1s are one-hot
            not_one_hot |= ((array != 0) & (array != 1)).any(-1)
        bad = np.flatnonzero(not_one_hot)
        if bad.size:
            self._bad(f"expected a one-hot vector, got {array[bad[0]].tolist()}", rows, bad)
        return array.argmax(-1)

    def _multidiscrete(self, array, dtype, rows):
        if self.categorical:
            if array.dtype.kind not in "iu":
                raise TypeError(f"action: expected an integer dtype for a MultiCategorical action, got {dtype}")
            values = array
        else:
            if array.dtype.kind not in "biuf":
                raise TypeError(f"action: expected an integer, bool or 0/1 float multi-one-hot action, got {dtype}")
            parts = np.split(array, np.cumsum(self.high)[:-1], axis=-1)
            values = np.stack([self._one_hot_to_index(p, dtype, rows) for p in parts], -1)
        bad = np.flatnonzero(((values < 0) | (values >= self.high)).reshape(len(values), -1).any(-1))
        if bad.size:
            self._bad(f"expected indices below nvec={self.high.tolist()}, got {values[bad[0]].tolist()}", rows, bad)
        return (values.astype(np.int64) + self.start).astype(self.space.dtype, copy=False)  # in range: exact

    def _binary(self, array, dtype, rows):
        # floats too, when exactly 0 or 1: a Bernoulli sample is a float
        if array.dtype.kind not in "biuf":
            raise TypeError(f"action: expected bools or 0/1 numbers for a MultiBinary action, got {dtype}")
        bad = np.flatnonzero(((array != 0) & (array != 1)).reshape(len(array), -1).any(-1))
        if bad.size:
            self._bad(f"expected 0/1 values, got {array[bad[0]].tolist()}", rows, bad)
        return array.astype(self.space.dtype)

    def _box(self, array, dtype, rows):
        target = np.dtype(self.np_dtype)
        if target.kind == "f":
            if array.dtype.kind != "f":
                raise TypeError(f"action: expected a floating dtype for a Box action (space dtype {self.np_dtype}), got {dtype}")
            if array.dtype.itemsize > target.itemsize:  # float64 1e300 would reach a float32 Box as inf
                found = first_cast_problem(array, target)
                if found is not None:
                    j, problem = found
                    self._bad(f"expected values that fit the Box's dtype {self.np_dtype}, got {dtype}: {problem}",
                              rows, [j])
        elif target.kind == "b":
            # a bool Box takes bools, or numbers that are exactly 0 or 1 (as the export does): a cast would make
            # 0.5, 2 or NaN True
            if array.dtype.kind != "b":
                if array.dtype.kind not in "iuf":
                    raise TypeError(
                        f"action: expected bools or 0/1 numbers for a Box action of dtype bool, got {dtype}"
                    )
                bad = np.flatnonzero(((array != 0) & (array != 1)).reshape(len(array), -1).any(-1))
                if bad.size:
                    self._bad(f"expected bools or 0/1 values for a Box action of dtype bool, got "
                              f"{array[bad[0]].tolist()}", rows, bad)
        elif array.dtype != target:
            # an integer Box: a float action would be truncated, and an integer one of
            # another width or sign wrap, without an error
            if array.dtype.kind not in "biu":
                raise TypeError(
                    f"action: expected an integer dtype ({self.spec.dtype}) for a Box action of space dtype "
                    f"{self.np_dtype}, got {dtype}; casting it would truncate the values. Round or cast the "
                    "action first."
                )
            found = first_cast_problem(array, target)
            if found is not None:
                j, problem = found
                self._bad(f"expected values that fit the Box's dtype {self.np_dtype}, got {dtype}: {problem}",
                          rows, [j])
        return array.astype(self.np_dtype, copy=True)
