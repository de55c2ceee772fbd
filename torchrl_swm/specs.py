"""Gymnasium spaces to TorchRL specs, and back.

One module does the conversion for every part of the package: the pool reads
its specs from the sub-envs' spaces, the world-model env accepts either, and
the gymnasium export needs the reverse direction.

Conventions (TorchRL's ``GymWrapper`` conventions, with categorical actions by
default):

=======================  =======================================================
gymnasium space          TorchRL spec (unbatched)
=======================  =======================================================
``Box``                  ``Bounded`` (``Unbounded`` when every bound is infinite
                         or at the float dtype's extremes; an integer Box over its
                         dtype's whole range stays ``Bounded``, where ``GymWrapper``
                         gives ``UnboundedDiscrete``), the space's shape and dtype;
                         as an action space (``action=True``), a float Box with some
                         infinite bounds, or wider than its dtype can subtract, is a
                         :class:`BoxBounded`, whose ``rand()`` samples as gymnasium's
                         ``Box.sample`` (``Bounded.rand`` gives NaN/inf: random actions).
                         A scalar Box (shape ``()``) keeps shape ``()``, as gymnasium
                         batches it, where ``GymWrapper`` makes it ``(1,)``
``Discrete(n, start)``   ``Categorical(n)`` int64, shape ``()``; or ``OneHot(n)``
                         int64 with ``categorical=False``. Values are indices
                         ``0..n-1``; the pool adds ``start`` for the env.
``MultiDiscrete(nvec)``  ``MultiCategorical(nvec)`` int64 of ``nvec``'s shape (n-d too), or
                         ``MultiOneHot`` (1-d ``nvec`` only), whatever the space's dtype:
                         indices ``0..nvec-1``, the space's ``start`` subtracted (the pool
                         adds it back for the env)
``MultiBinary(n)``       ``Binary(n)`` with the space's dtype (int8)
``Dict``                 ``Composite``, one key per entry, nested for nested Dicts
=======================  =======================================================

Any other space (``Tuple``, ``Text``, ``Graph``, ``Sequence``...) raises a
:class:`~torchrl_swm.errors.SpecError` that names it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
    Unbounded,
)
from torchrl.data.tensor_specs import BoundedContinuous, _BoundedMeta

from .errors import SpecError

__all__ = [
    "space_to_spec",
    "spec_to_space",
    "batch_spec",
    "unbatch_spec",
    "as_spec",
    "numpy_dtype",
    "torch_dtype",
    "SUPPORTED_SPACES",
    "BoxBounded",
]

SUPPORTED_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict")


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (or of a torch dtype, unchanged)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return _torch_of_numpy(np.dtype(dtype))


#: numpy dtypes torch stores but tensordict cannot clone (no arithmetic kernels): TorchRL's checks,
#: collectors and replay buffers fail on them, so they are refused with a way out instead
_UNSTORABLE = {np.dtype(np.uint16): "int32", np.dtype(np.uint32): "int64", np.dtype(np.uint64): None}
if np.dtype(np.longdouble).itemsize > 8:  # x86's float128: torch has no such dtype
    _UNSTORABLE[np.dtype(np.longdouble)] = "float64"


def storable(dtype) -> bool:
    """Whether the pool's tensordicts can hold ``dtype`` (see :func:`check_storable`)."""
    return np.dtype(dtype) not in _UNSTORABLE


def check_storable(dtype, what: str, info_key: str | None = None, action: bool = False) -> None:
    """Raise a :class:`SpecError` for a dtype the pool's tensordicts cannot hold (uint16/32/64).

    ``info_key``: the error is about this info key, which ``info_spec=`` can declare wider.
    ``action``: about an action space (whose fix is an action wrapper, not an observation one).
    """
    dtype = np.dtype(dtype)
    if dtype not in _UNSTORABLE:
        return
    wider = _UNSTORABLE[dtype]
    if dtype.kind == "f":  # float128
        why = "torch has no such dtype"
        if info_key is not None:
            fix = (f"declare it float64 with info_spec={{{info_key}: np.float64(0)}} (values are rounded to "
                   "float64; one that overflows it is an error)")
        elif action:
            fix = (
                "give the env an action space of dtype float64, e.g. gymnasium.wrappers.TransformAction(env, "
                "lambda a: a.astype(np.longdouble), gymnasium.spaces.Box(low, high, shape, np.float64))"
            )
        else:
            fix = "cast it to float64 (rounding), e.g. gymnasium.wrappers.DtypeObservation(env, np.float64)"
    else:
        why = "torch has no arithmetic for it, so TorchRL's tensordicts cannot be cloned, checked or collected"
        if info_key is not None:
            fix = (
                f"declare it {wider or 'int64'} with info_spec={{{info_key}: np.{wider or 'int64'}(0)}} (each value "
                "is range-checked when stored: one that does not fit is an error, never wrapped)"
            )
        elif wider and action:
            fix = (
                f"give the env an action space of dtype {wider} (exact), e.g. gymnasium.wrappers.TransformAction(env, "
                f"lambda a: a.astype(np.{dtype}), gymnasium.spaces.Box(low, high, shape, np.{wider}))"
            )
        elif wider:
            fix = (
                f"cast it to {wider} (exact), e.g. gymnasium.wrappers.DtypeObservation(env, np.{wider}) for an "
                "observation"
            )
        else:
            fix = "cast it to int64 or float64 if its values allow (not exact in general)"
    raise SpecError(
        f"{what}: dtype {dtype} is not supported: {why}. Expected bool, int8/16/32/64, uint8 or "
        f"float16/32/64; {fix}."
    )


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (or of a numpy dtype, unchanged)."""
    if isinstance(dtype, torch.dtype):
        return _numpy_of_torch(dtype)
    return np.dtype(dtype)


# cached: the export calls these per leaf and step, and each lookup builds a tensor
@functools.cache
def _torch_of_numpy(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros((), dtype=dtype)).dtype


@functools.cache
def _numpy_of_torch(dtype: torch.dtype) -> np.dtype:
    return torch.zeros((), dtype=dtype).numpy().dtype


def _unbounded(low: np.ndarray, high: np.ndarray) -> bool:
    """Every bound infinite, or at the float dtype's finite extremes (``Box(finfo.min, finfo.max)``, a
    common spelling of "unbounded", as TorchRL's ``GymWrapper`` reads it): a ``Bounded`` spec over that
    width would draw ``rand()`` values of inf or the extreme itself."""
    if low.dtype.kind != "f":
        return bool(np.all(np.isinf(low)) and np.all(np.isinf(high)))
    top = np.finfo(low.dtype).max
    near = top * (1 - 1e-6)
    return bool(np.all(np.isinf(low) | (low <= -near)) and np.all(np.isinf(high) | (high >= near)))


def _rand_overflows(low: np.ndarray, high: np.ndarray) -> bool:
    """Whether TorchRL's ``Bounded.rand`` (``low + (high - low) * u`` in the spec's dtype) gives NaN, inf or
    the upper bound every time: some bound infinite, or a span the dtype cannot hold (``Box(-3e38, 3e38)``)."""
    if low.dtype.kind != "f":
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(not np.all(np.isfinite(high - low)))


class _KeepClass(_BoundedMeta):
    """``Bounded``'s metaclass turns every instance into a ``BoundedContinuous``/``BoundedDiscrete``;
    a subclass keeps its own class, through the ``self.__class__(...)`` of clone/expand/index/reshape.

    And any continuous ``Bounded`` passes ``isinstance(spec, BoxBounded)``: TorchRL stacks specs (a
    ``SerialEnv`` of pools) only when each is an instance of the first one's class, and a ``BoxBounded``
    is a ``Bounded`` in all but sampling."""

    def __call__(cls, *args, **kwargs):
        return type.__call__(cls, *args, **kwargs)

    def __instancecheck__(cls, instance):
        return super().__instancecheck__(instance) or isinstance(instance, BoundedContinuous)


class BoxBounded(BoundedContinuous, metaclass=_KeepClass):
    """A float ``Bounded`` spec whose :meth:`rand` samples as gymnasium's ``Box.sample``: uniform where both
    bounds are finite (computed in float64, so a span wider than the dtype is fine), ``low`` plus an
    exponential where only ``low`` is, ``high`` minus one where only ``high`` is, a standard normal where
    neither is. :func:`space_to_spec` gives it to the action Boxes ``Bounded.rand`` cannot sample: with
    ``Box([-inf, 0], [1, inf])`` it draws ``[nan, inf]``, which a ``Collector`` with ``policy=None`` would
    send to every env. Everything else (bounds, ``is_in``, ``project``, shape ops) is ``Bounded``'s, and it
    equals a ``Bounded`` of the same bounds (TorchRL compares specs by exact type).
    """

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, BoundedContinuous)
            and self.device == other.device
            and self.shape == other.shape
            and self.space == other.space
            and self.dtype == other.dtype
        )

    __hash__ = BoundedContinuous.__hash__

    def rand(self, shape: torch.Size | Sequence[int] | None = None) -> torch.Tensor:
        size = (*(() if shape is None else tuple(shape)), *self.shape)
        low, high = self.space.low.double(), self.space.high.double()
        low_inf, high_inf = torch.isinf(low), torch.isinf(high)
        f64 = {"dtype": torch.float64, "device": self.device}
        u = torch.rand(size, **f64)
        uniform = low * (1 - u) + high * u  # not low + (high - low) * u: high - low overflows Box(-1e308, 1e308)
        tail = torch.empty(size, **f64).exponential_()
        out = torch.where(low_inf, high - tail, torch.where(high_inf, low + tail, uniform))
        out = torch.where(low_inf & high_inf, torch.randn(size, **f64), out)
        return torch.minimum(torch.maximum(out, low), high).to(self.dtype)

    def to(self, dest) -> BoxBounded:
        out = super().to(dest)  # Bounded.to builds a plain Bounded when the device or dtype changes
        if type(out) is not type(self) and isinstance(out, BoundedContinuous):
            out.__class__ = type(self)
        return out


def space_to_spec(
    space: gym.Space,
    *,
    categorical: bool = True,
    device: torch.device | str | None = None,
    name: str = "space",
    action: bool = False,
) -> TensorSpec:
    """Convert a gymnasium space to an unbatched TorchRL spec.

    Args:
        space: the gymnasium space.
        categorical: map ``Discrete``/``MultiDiscrete`` to ``Categorical`` /
            ``MultiCategorical`` (default) rather than ``OneHot`` / ``MultiOneHot``.
        device: device of the spec.
        name: what the space is, used in error messages (e.g. ``"observation_space"``).
        action: an action space, whose specs' ``rand()`` draws random actions: a float Box that TorchRL's
            ``Bounded.rand`` cannot sample becomes a :class:`BoxBounded`.

    Raises:
        SpecError: for a space type outside :data:`SUPPORTED_SPACES`.

    Examples:
        >>> import gymnasium as gym
        >>> from torchrl_swm.specs import space_to_spec
        >>> space_to_spec(gym.spaces.Discrete(3))
        Categorical(...)
    """
    if isinstance(space, gym.spaces.Box):
        check_storable(space.dtype, name, action=action)
        dtype = torch_dtype(space.dtype)
        low = np.broadcast_to(space.low, space.shape)
        high = np.broadcast_to(space.high, space.shape)
        if _unbounded(low, high):
            return Unbounded(shape=space.shape, dtype=dtype, device=device)
        return (BoxBounded if action and _rand_overflows(low, high) else Bounded)(
            low=torch.as_tensor(np.array(low), dtype=dtype),
            high=torch.as_tensor(np.array(high), dtype=dtype),
            shape=space.shape,
            dtype=dtype,
            device=device,
        )
    if isinstance(space, gym.spaces.Discrete):
        n = int(space.n)
        if categorical:
            return Categorical(n, shape=(), dtype=torch.int64, device=device)
        return OneHot(n, dtype=torch.int64, device=device)
    if isinstance(space, gym.spaces.MultiDiscrete):
        if categorical:  # an n-d nvec too: TorchRL's MultiCategorical takes its shape
            return MultiCategorical(torch.as_tensor(space.nvec, dtype=torch.int64), dtype=torch.int64, device=device)
        if space.nvec.ndim != 1:
            raise SpecError(
                f"{name}: MultiDiscrete with a {space.nvec.ndim}-d nvec {space.nvec.shape} has no one-hot spec "
                "(TorchRL's MultiOneHot takes a 1-d nvec); keep categorical encoding "
                "(categorical_action_encoding=True, the default), or flatten the space to a 1-d nvec"
            )
        return MultiOneHot([int(v) for v in space.nvec], dtype=torch.int64, device=device)
    if isinstance(space, gym.spaces.MultiBinary):
        shape = (space.n,) if isinstance(space.n, (int, np.integer)) else tuple(space.n)
        return Binary(shape=shape, dtype=torch_dtype(space.dtype), device=device)
    if isinstance(space, gym.spaces.Dict):
        odd = [key for key in space.spaces if not isinstance(key, str) or not key]
        if odd:  # TorchRL's Composite takes non-empty string keys (EnvPool renames a single env's int keys itself)
            raise SpecError(
                f"{name}: Dict key {odd[0]!r} ({type(odd[0]).__name__}): expected a non-empty string (TorchRL "
                "specs and tensordicts are keyed by strings); name the entry with a string"
            )
        return Composite(
            {
                key: space_to_spec(sub, categorical=categorical, device=device, name=f"{name}[{key!r}]", action=action)
                for key, sub in space.spaces.items()
            },
            device=device,
        )
    raise SpecError(
        f"{name}: unsupported gymnasium space {type(space).__name__} ({space}); "
        f"expected one of {', '.join(SUPPORTED_SPACES)}."
    )


def batch_spec(spec: TensorSpec, batch_size: Sequence[int]) -> TensorSpec:
    """Expand an unbatched spec with leading batch dims ``batch_size``."""
    batch_size = tuple(batch_size)
    if not batch_size:
        return spec.clone()
    return spec.expand(*batch_size, *spec.shape)


def unbatch_spec(spec: TensorSpec, batch_ndim: int) -> TensorSpec:
    """Drop ``batch_ndim`` leading dims: ``spec[0]`` for each of them."""
    for _ in range(batch_ndim):
        spec = spec[0]
    return spec


def as_spec(
    space_or_spec, *, categorical: bool = True, device=None, name: str = "space", action: bool = False
) -> TensorSpec:
    """Accept either a gymnasium space or a TorchRL spec; return an unbatched spec (``action``: see
    :func:`space_to_spec`).

    Example:
        >>> import gymnasium as gym
        >>> from torchrl.data import Categorical
        >>> from torchrl_swm.specs import as_spec
        >>> spec = as_spec(gym.spaces.Box(-1, 1, (3,)))       # a gymnasium space: converted
        >>> type(spec).__name__, spec.shape, spec.dtype
        ('BoundedContinuous', torch.Size([3]), torch.float32)
        >>> spec = Categorical(4)
        >>> as_spec(spec) is spec                              # a TorchRL spec: passed through
        True
    """
    if isinstance(space_or_spec, TensorSpec):
        return space_or_spec.to(device) if device is not None else space_or_spec
    if isinstance(space_or_spec, gym.Space):
        return space_to_spec(space_or_spec, categorical=categorical, device=device, name=name, action=action)
    raise SpecError(
        f"{name}: expected a gymnasium.Space or a torchrl TensorSpec, got {type(space_or_spec).__name__}"
    )


def _space_dtype(spec: TensorSpec, name: str) -> np.dtype:
    try:
        return numpy_dtype(spec.dtype)
    except (TypeError, RuntimeError) as err:
        raise SpecError(
            f"{name}: TorchRL spec {type(spec).__name__} has dtype {spec.dtype}, which numpy (and so "
            "gymnasium) cannot represent; cast it with a TorchRL transform (e.g. DTypeCastTransform)."
        ) from err


def spec_to_space(spec: TensorSpec, *, name: str = "spec") -> gym.Space:
    """Convert an unbatched TorchRL spec to a gymnasium space (the export's direction).

    =================================  ==========================================================
    TorchRL spec (unbatched)           gymnasium space
    =================================  ==========================================================
    ``Composite``                      ``Dict`` (nested for nested Composites)
    ``Bounded``                        ``Box`` with the spec's bounds, shape and dtype (bool too)
    ``Unbounded`` float / int          ``Box`` (``±inf`` / the dtype's integer limits)
    ``Unbounded`` bool                 ``Discrete(2)`` for shape ``()``, else ``MultiBinary(shape)``
    ``Categorical(n)``                 ``Discrete(n)``; with a shape, ``MultiDiscrete`` of ``n``
    ``OneHot(n)``                      ``Discrete(n)`` (``MultiDiscrete`` with leading dims)
    ``MultiCategorical(nvec)``         ``MultiDiscrete(nvec)`` with the spec's shape
    ``MultiOneHot(nvec)``              ``MultiDiscrete(nvec)``
    ``Binary(shape)``                  ``MultiBinary(shape)``
    =================================  ==========================================================

    One-hot specs become index spaces: gymnasium users expect ``Discrete``; the
    export converts indices to one-hot vectors on the way in (actions) and back on
    the way out (observations). Spaces keep their own dtypes (``Discrete`` is
    int64, ``MultiBinary`` int8): values are cast to them.

    Raises:
        SpecError: for spec types with no gymnasium counterpart (``NonTensor``,
            ``Stacked``...) or dtypes numpy lacks (``bfloat16``), naming the spec.

    Example:
        >>> from torchrl.data import Bounded, Composite, OneHot
        >>> from torchrl_swm.specs import spec_to_space
        >>> spec_to_space(Composite(pos=Bounded(-1.0, 1.0, shape=(2,)), move=OneHot(4)))
        Dict('move': Discrete(4), 'pos': Box(-1.0, 1.0, (2,), float32))
    """
    if isinstance(spec, Composite):
        if type(spec) is not Composite:  # StackedComposite and other lazy variants
            _unsupported(spec, name)
        return gym.spaces.Dict(
            {key: spec_to_space(sub, name=f"{name}[{key!r}]") for key, sub in spec.items()}
        )
    if not isinstance(spec, (Bounded, Unbounded, Categorical, OneHot, MultiCategorical, MultiOneHot, Binary)):
        _unsupported(spec, name)
    np_dtype = _space_dtype(spec, name)
    shape = tuple(spec.shape)
    # Binary and the Multi* specs subclass the single ones: test them first.
    if isinstance(spec, Binary):
        if not shape:
            raise SpecError(f"{name}: a 0-d Binary spec has no MultiBinary counterpart; give it shape (1,)")
        return gym.spaces.MultiBinary(list(shape) if len(shape) > 1 else shape[0])
    if isinstance(spec, MultiCategorical):
        nvec = np.asarray(spec.nvec.cpu() if isinstance(spec.nvec, torch.Tensor) else spec.nvec, dtype=np.int64)
        return gym.spaces.MultiDiscrete(np.broadcast_to(nvec, shape).copy())
    if isinstance(spec, MultiOneHot):
        nvec = np.asarray(spec.nvec, dtype=np.int64).reshape(-1)
        if len(shape) != 1:
            raise SpecError(f"{name}: MultiOneHot with shape {shape} is not supported; expected a 1-d spec")
        return gym.spaces.MultiDiscrete(nvec)
    if isinstance(spec, Categorical):
        n = int(spec.space.n)
        if shape:
            return gym.spaces.MultiDiscrete(np.full(shape, n, dtype=np.int64))
        return gym.spaces.Discrete(n)
    if isinstance(spec, OneHot):
        n = int(spec.space.n)
        if len(shape) > 1:
            return gym.spaces.MultiDiscrete(np.full(shape[:-1], n, dtype=np.int64))
        return gym.spaces.Discrete(n)
    if np_dtype.kind not in "iufb":
        _unsupported(spec, name)
    if isinstance(spec, Bounded):  # a bool one too: a gymnasium Box(0, 1, shape, bool) round-trips as itself
        low = spec.space.low.detach().cpu().numpy().astype(np_dtype)
        high = spec.space.high.detach().cpu().numpy().astype(np_dtype)
        inverted = np.argwhere(np.broadcast_to(low > high, shape))
        if len(inverted):
            at = tuple(int(i) for i in inverted[0])
            first = np.broadcast_to(low, shape)[at], np.broadcast_to(high, shape)[at]
            raise SpecError(
                f"{name}: Bounded spec with low > high at {len(inverted)} of {max(1, int(np.prod(shape)))} entries "
                f"(the first at index {at}: low {first[0]}, high {first[1]}): its bounds are inverted, as TorchRL's "
                "ObservationNorm with a negative scale leaves them. Give the transform a positive scale, or replace "
                "the spec with one whose bounds are in order"
            )
        return gym.spaces.Box(low=np.broadcast_to(low, shape), high=np.broadcast_to(high, shape), dtype=np_dtype)
    if np_dtype == np.bool_:
        if not shape:
            return gym.spaces.Discrete(2)
        return gym.spaces.MultiBinary(list(shape) if len(shape) > 1 else shape[0])
    if np_dtype.kind == "f":
        return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=np_dtype)
    info = np.iinfo(np_dtype)
    return gym.spaces.Box(info.min, info.max, shape=shape, dtype=np_dtype)


def _unsupported(spec, name):
    shape = tuple(getattr(spec, "shape", ()))
    raise SpecError(
        f"{name}: TorchRL spec {type(spec).__name__} (dtype={getattr(spec, 'dtype', None)}, shape={shape}) has no "
        "gymnasium space counterpart; expected Composite, Bounded, Unbounded, Categorical, OneHot, "
        "MultiCategorical, MultiOneHot or Binary with a real (bool/int/float) dtype."
    )
