"""Hypothesis strategies for gymnasium spaces, wider than the export tests' own: Box of every dtype the specs
support (float16/32/64, int8..int64, uint8, bool), shape ``()`` up to 3-d, per-element, negative, half-open and
dtype-extreme bounds; Discrete with a large start; MultiDiscrete of any int dtype with a start; 1-d and 2-d
MultiBinary; nested Dicts of those."""

import gymnasium as gym
import numpy as np
from hypothesis import strategies as st

BOX_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_]
_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def wide_boxes(draw):
    dtype = np.dtype(draw(st.sampled_from(BOX_DTYPES)))
    shape = draw(_shapes)
    size = int(np.prod(shape))
    if dtype.kind == "b":
        return gym.spaces.Box(0, 1, shape, dtype)
    if dtype.kind == "f":
        bound = st.one_of(st.integers(-50, 50).map(float), st.just(-np.inf), st.just(np.inf))
        a = np.array(draw(st.lists(bound, min_size=size, max_size=size)), dtype=np.float64)
        b = np.array(draw(st.lists(bound, min_size=size, max_size=size)), dtype=np.float64)
        low, high = np.minimum(a, b), np.maximum(a, b)
        high = np.where((high == low) & np.isfinite(low), low + 1, high)  # a point box only at an infinite bound
        low = np.where(low == np.inf, 0.0, low)  # low +inf or high -inf is no valid box
        high = np.where(high == -np.inf, 0.0, high)
        high = np.where(high < low, low + 1, high)
    else:
        info = np.iinfo(dtype) if dtype != np.int64 else np.iinfo(np.int32)  # gymnasium's own int64 sample overflows
        bound = st.one_of(st.integers(max(info.min, -100), min(info.max, 100)), st.just(int(info.min)),
                          st.just(int(info.max)))
        a = np.array(draw(st.lists(bound, min_size=size, max_size=size)), dtype=np.int64)
        b = np.array(draw(st.lists(bound, min_size=size, max_size=size)), dtype=np.int64)
        low, high = np.minimum(a, b), np.maximum(a, b)
    return gym.spaces.Box(low.astype(dtype).reshape(shape), high.astype(dtype).reshape(shape), shape, dtype)


@st.composite
def wide_multi_discretes(draw):
    shape = draw(st.sampled_from([(1,), (3,), (2, 2)]))
    size = int(np.prod(shape))
    nvec = np.reshape(draw(st.lists(st.integers(1, 6), min_size=size, max_size=size)), shape)
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int16, np.int8, np.uint8]))
    lowest = 0 if np.dtype(dtype).kind == "u" else -5
    start = draw(st.none() | st.lists(st.integers(lowest, 5), min_size=size, max_size=size))
    return gym.spaces.MultiDiscrete(nvec, dtype=dtype, start=None if start is None else np.reshape(start, shape))


wide_discretes = st.builds(gym.spaces.Discrete, st.integers(1, 6), start=st.integers(-10**6, 10**6))
wide_multi_binaries = st.one_of(st.integers(1, 4), st.tuples(st.integers(1, 3), st.integers(1, 3))).map(
    gym.spaces.MultiBinary)
wide_leaves = st.one_of(wide_boxes(), wide_discretes, wide_multi_discretes(), wide_multi_binaries)
wide_spaces = st.recursive(
    wide_leaves,
    lambda inner: st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, min_size=1, max_size=3).map(
        gym.spaces.Dict),
    max_leaves=6,
)


def index_space(space: gym.Space) -> gym.Space:
    """The space a spec gives back: discrete values as indices from 0."""
    if isinstance(space, gym.spaces.Discrete):
        return gym.spaces.Discrete(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return gym.spaces.MultiDiscrete(space.nvec)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: index_space(v) for k, v in space.spaces.items()})
    return space


def to_index(space: gym.Space, value):
    """A sample of ``space`` as the spec holds it (discrete values minus ``start``), as ``{key path: array}``."""
    if isinstance(space, gym.spaces.Dict):
        return {(k, *path): v for k, s in space.spaces.items() for path, v in to_index(s, value[k]).items()}
    if isinstance(space, gym.spaces.Discrete):
        return {(): np.asarray(np.int64(value) - np.int64(space.start))}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {(): np.asarray(value, np.int64) - space.start.astype(np.int64)}
    return {(): np.asarray(value)}
