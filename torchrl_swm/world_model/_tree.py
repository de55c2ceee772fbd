"""Row operations on model states of any structure.

A state is a tensor, a tuple/list/namedtuple of states, a mapping of states, a
``TensorDict``, or ``None`` (the model keeps its own state). Every operation here is
out of place, so the tensors handed to TorchRL never change afterwards and the ops stay
differentiable (``differentiable=True``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ..errors import describe
from ..masks import row_view

__all__ = [
    "tree_map",
    "leaves",
    "shapes",
    "where_rows",
    "zero_rows",
    "put_rows",
    "broadcast_rows",
    "unflatten_rows",
    "call_on_rows",
    "check_batch",
    "with_batch",
]


def tree_map(fn, x, *others):
    """Apply ``fn`` to each tensor leaf of ``x`` (and the matching leaves of ``others``)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return fn(x, *others)
    if isinstance(x, TensorDictBase):
        # a state may come as nested dicts on one side and a TensorDict on the other
        # (initial_state vs what the model returns): the same leaves, so match them up
        others = [o if isinstance(o, TensorDictBase) else TensorDict(o, batch_size=[]) for o in others]
        return x.apply(fn, *others)
    if isinstance(x, Mapping):
        return {k: tree_map(fn, v, *(o[k] for o in others)) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        items = [tree_map(fn, v, *(o[i] for o in others)) for i, v in enumerate(x)]
        if hasattr(x, "_fields"):  # namedtuple
            return type(x)(*items)
        return type(x)(items)
    raise TypeError(f"model state: expected tensors, tuples, dicts or TensorDicts, found a leaf {describe(x)}")


def leaves(x, prefix: str = "state"):
    """``[(path, tensor), ...]`` for every tensor leaf of ``x``."""
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [(prefix, x)]
    if isinstance(x, TensorDictBase):
        return [(f"{prefix}[{k!r}]", v) for k, v in x.items(include_nested=True, leaves_only=True)]
    if isinstance(x, Mapping):
        out = []
        for k, v in x.items():
            out += leaves(v, f"{prefix}[{k!r}]")
        return out
    if isinstance(x, (tuple, list)):
        out = []
        for i, v in enumerate(x):
            out += leaves(v, f"{prefix}[{i}]")
        return out
    raise TypeError(f"{prefix}: expected tensors, tuples, dicts or TensorDicts, found {describe(x)}")


def shapes(x, prefix: tuple = ()) -> dict:
    """``{path: shape}`` for every tensor leaf of ``x``; a path is a tuple of keys / indices.

    Nested dicts and nested TensorDict keys give the same paths, so the layouts of two states
    compare whatever container holds them.
    """
    if x is None:
        return {}
    if isinstance(x, torch.Tensor):
        return {prefix: x.shape}
    if isinstance(x, TensorDictBase):
        return {
            prefix + ((k,) if isinstance(k, str) else tuple(k)): v.shape
            for k, v in x.items(include_nested=True, leaves_only=True)
        }
    if isinstance(x, Mapping):
        out = {}
        for k, v in x.items():
            out.update(shapes(v, prefix + (k,)))
        return out
    if isinstance(x, (tuple, list)):
        out = {}
        for i, v in enumerate(x):
            out.update(shapes(v, prefix + (i,)))
        return out
    raise TypeError(f"state: expected tensors, tuples, dicts or TensorDicts, found {describe(x)}")


# From this many elements on, a CPU row select copies ``old`` and then the selected rows of ``new``
# (``index_copy_``): ~3x faster than ``torch.where`` at 1024 x 64 floats, whose broadcast row mask
# keeps it off the vectorized path; slower below ~256 x 64 (the index costs a few microseconds).
_INDEX_SELECT_MIN = 16384


def where_rows(mask: torch.Tensor, new, old):
    """Rows of ``new`` where ``mask`` is True, rows of ``old`` elsewhere (a new tensor, as ``torch.where``).

    ``mask`` has the batch shape ``(N,)`` or TorchRL's done shape ``(N, 1)``.
    """
    index = []  # the True rows, found once for every leaf that takes the index path

    def select(a, b):
        if not _index_path(b, a) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return torch.where(row_view(mask, a), a, b)
        if not index:
            index.append(mask.reshape(-1).nonzero().squeeze(-1))
        out = b.clone()
        return out.index_copy_(0, index[0], a.index_select(0, index[0]))

    if type(new) is torch.Tensor:
        return select(new, old)
    return tree_map(select, new, old)


def zero_rows(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A copy of tensor ``t`` with the rows in ``mask`` (``(N,)`` or ``(N, 1)``) zeroed, as ``masked_fill``."""
    if not _index_path(t):
        return t.masked_fill(row_view(mask, t), 0)
    return t.clone().index_fill_(0, mask.reshape(-1).nonzero().squeeze(-1), 0)  # as where_rows: faster when large


def _index_path(t: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether a row select on ``t`` takes the copy-then-index path: a large CPU tensor (one ``where`` kernel on
    an accelerator, where an index would sync), outside any autograd graph (``where`` keeps it simple)."""
    return (
        t.numel() >= _INDEX_SELECT_MIN
        and t.device.type == "cpu"
        and not (torch.is_grad_enabled() and any(x.requires_grad for x in (t, *others)))
    )


def put_rows(x, index: torch.Tensor, src):
    """A copy of ``x`` whose rows ``index`` are ``src`` (``index_copy``, out of place).

    Leaves of two dtypes promote, as :func:`where_rows` (``torch.where``) does: a model stepping in
    mixed precision returns a state of another dtype than its start."""

    def put(t, s):
        if t.dtype != s.dtype:
            dtype = torch.promote_types(t.dtype, s.dtype)
            t, s = t.to(dtype), s.to(dtype)
        return t.index_copy(0, index, s)

    return tree_map(put, x, src)


def unflatten_rows(x, batch_shape: tuple[int, ...]):
    """Leaves with one leading dim of ``prod(batch_shape)`` rows reshaped to ``batch_shape``."""
    if isinstance(x, TensorDictBase) and x.batch_dims:
        return x.reshape(torch.Size((*batch_shape, *x.batch_size[1:])))
    return tree_map(lambda t: t.reshape((*batch_shape, *t.shape[1:])), x)  # a tuple: batch () of 0-d leaves


def call_on_rows(fn, batch_shape: tuple[int, ...], *args, **kwargs):
    """``fn(*args, **kwargs)`` given ``(N, ...)`` rows, whatever the batch, as a model, encoder or adapter takes them.

    A batch-unlocked env runs with any batch shape: ``()`` (one unbatched row, as ``check_env_specs``
    and TorchRL's ``rollout`` use it) or several dims (a planner's candidates). Its batch dims are
    merged into one of ``N = prod(batch_shape)`` rows for the call (views), and the leaves of the
    result that have ``N`` leading rows get ``batch_shape`` back, so the checks that follow see the
    batch they expect. Anything else (scalars, leaves of other shapes) is returned as it came, for
    those checks to report. A one-dim batch is passed through untouched (the hot path).
    """
    if len(batch_shape) == 1:
        return fn(*args, **kwargs)
    nb, n = len(batch_shape), math.prod(batch_shape)
    merged = [_merge_rows(a, nb, n) for a in args]
    return _split_rows(fn(*merged, **kwargs), n, tuple(batch_shape), {})


def _merge_rows(x, nb: int, n: int):
    """Leaves (at any depth, TensorDicts inside dicts too) whose first ``nb`` dims are the batch, as ``(n, ...)``."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x.reshape((n, *x.shape[nb:]))
    if isinstance(x, TensorDictBase):
        if x.batch_dims >= nb:
            return x.reshape(n, *x.batch_size[nb:])
        return x.apply(lambda t: t.reshape((n, *t.shape[nb:])), batch_size=[n] if x.batch_dims else [])
    if isinstance(x, Mapping):
        return {k: _merge_rows(v, nb, n) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        items = [_merge_rows(v, nb, n) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


def _split_rows(x, n: int, batch_shape: tuple, memo: dict):
    """The inverse of :func:`_merge_rows` on whatever a callable returned. ``memo`` keeps an object (or a
    tensor) returned twice one object: a state that is also the observation, in any container."""
    if id(x) in memo:
        return memo[id(x)]

    def leaf(t):
        if id(t) not in memo:
            memo[id(t)] = t.reshape((*batch_shape, *t.shape[1:])) if t.ndim and t.shape[0] == n else t
        return memo[id(t)]

    if isinstance(x, (torch.Tensor, np.ndarray)):
        return leaf(x)
    if isinstance(x, TensorDictBase):
        if not x.batch_dims:
            out = x.apply(leaf)
        elif x.batch_size[0] == n:
            out = x.apply(leaf, batch_size=(*batch_shape, *x.batch_size[1:]))
        else:
            out = x
    elif isinstance(x, Mapping):
        out = {k: _split_rows(v, n, batch_shape, memo) for k, v in x.items()}
    elif isinstance(x, (tuple, list)):
        items = [_split_rows(v, n, batch_shape, memo) for v in x]
        out = type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    else:
        out = x
    memo[id(x)] = out
    return out


def broadcast_rows(x, batch_shape: tuple[int, ...]):
    """An unbatched state repeated over ``batch_shape`` (a fresh, contiguous copy)."""
    if isinstance(x, TensorDictBase):
        return x.expand(torch.Size((*batch_shape, *x.batch_size))).clone()
    # a Size, not unpacked dims: expand() of no dims (batch () over a 0-d state) is a TypeError
    return tree_map(lambda t: t.expand(torch.Size((*batch_shape, *t.shape))).clone(), x)


def check_batch(x, batch_shape: tuple[int, ...], what: str) -> None:
    """Raise when a leaf of ``x`` does not start with ``batch_shape``."""
    nb = len(batch_shape)
    for path, t in leaves(x, what):
        if tuple(t.shape[:nb]) != batch_shape:
            raise ValueError(f"{path}: expected leading batch dims {batch_shape}, got {describe(t)}")


def with_batch(x, batch_shape: tuple[int, ...]):
    """``x`` whose TensorDicts (at any depth) have at least the batch dims ``batch_shape``.

    ``TensorDict(d)`` defaults to ``batch_size=[]``; put under ``state_key`` in the env's
    ``[N]`` outputs such a state would make an invalid tensordict (it cannot be indexed or
    stacked). Its leaves are checked first (:func:`check_batch`); the caller's TensorDict is
    left as it is (a shallow copy gets the batch size).
    """
    if isinstance(x, TensorDictBase):
        if x.batch_dims >= len(batch_shape):
            return x
        x = x.clone(False)
        x.batch_size = batch_shape
        return x
    if isinstance(x, Mapping):
        return {k: with_batch(v, batch_shape) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        items = [with_batch(v, batch_shape) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x
