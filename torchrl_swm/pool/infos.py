"""Stacked info buffers: which gymnasium ``info`` values the pool records, and how.

The rule, applied to every ``info`` dict a sub-env returns from ``reset`` and ``step``:

* **Recorded**: bools, Python and numpy integer/float scalars, numpy arrays and
  torch tensors of bool/integer/float dtype (bfloat16 and float8 tensors as
  float32, which holds them exactly). A nested dict becomes a nested key:
  ``info["a"]["b"]`` is stored under ``("info", "a", "b")``.
* **Skipped**: every other value (strings, ``None``, lists, tuples, objects,
  complex numbers). A key skipped in every env is never an error; a key must
  be numeric in every env that reports it or in none (a mix, such as a number
  in one env and ``None`` in another, is an error at construction naming both
  envs: the pool cannot tell "absent" from a value).
* Each recorded key has a spec with shape ``(N, 1, *value_shape)``: the seed's
  ``(batch, time, ...)`` convention with a time dim of 1.
* The spec is inferred at construction from the reset info **and** the info of
  one step of **every** env; a user can declare keys (``info_spec=``) or
  restrict them (``info_keys=``). Dtypes follow numpy, as gymnasium's vector
  infos do, in every backend and process: Python floats are float64 (stored
  exactly), ints int64, bools bool; numpy and torch values keep their dtype;
  differing dtypes across envs are promoted as numpy does (``np.promote_types``:
  int64 with float32 is float64, which holds both values exactly).
* At run time a value must have the spec's shape and a dtype that casts to the
  spec's within its kind (int into float is fine when the float holds it exactly,
  0.75 into int is an error); integers of another width or sign are range-checked
  (300 into a uint8 key is an error, never a wrapped 44), see :func:`cast_problem`.
  A numeric key that is not in the spec is an error (it would otherwise be
  dropped), unless ``info_keys=`` restricted the recorded keys.
* A key may not be a value in one info and a dict in another (an error at
  construction naming both envs).
* Vector envs: gymnasium's ``"_k"`` entries are presence masks only when ``"k"``
  is in the same dict (``"_raw"`` alone is a key of its own); the object arrays
  it builds for ``np.bool_`` values and tensors are recorded like the serial
  backend records those values (see :func:`vector_values`).
* **Presence masks**: a key that some env's reset or first-step info lacked,
  or that is declared with ``info_spec=``, also gets a bool ``(N, 1)`` leaf
  ``("info_mask", *key)``: True where the env reported the key at this step.
  Where it did not, the value reads as zero (the spec's default) and the mask
  is False, as gymnasium's vector infos do with their ``"_key"`` masks.
* A key every env reported in every probe has no mask; an env that later
  omits it is an error (its zero would otherwise read as a value), unless the
  key is declared with ``info_spec=``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EnvError, SpecError, describe, user_stacklevel

# torch and torchrl are imported where needed: worker processes write infos
# with this module and start faster without them.

__all__ = ["InfoSchema", "InfoWriter", "SkippedValue", "numeric_value", "numeric_info_value", "vector_values",
           "cast_problem", "first_cast_problem",
           "flatten_vector_info", "check_vector_mask", "batch_wide_error", "INFO_MASK_KEY",
           "needs_step_probe", "chosen_info_keys", "EPISODE_END"]

Key = tuple[str, ...]

#: Root key of the presence masks of optional info keys.
INFO_MASK_KEY = "info_mask"

#: The phase of the probes that stand in for an episode-statistics wrapper's info at an episode's end (which the
#: construction probe's one step rarely reaches): their keys get a mask, and they do not count as probes an
#: always-reported key must appear in.
EPISODE_END = "episode end"


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: the largest integer magnitude up to which every integer is exact, by float itemsize (float16/32/64)
_EXACT_INT = {2: 2**11, 4: 2**24, 8: 2**53}
#: the largest finite value of a float16/32 key: a Python float up to it cannot overflow when stored
_FINITE_MAX = {2: float(np.finfo(np.float16).max), 4: float(np.finfo(np.float32).max)}


class SkippedValue:
    """Stands for an info value the rule skips, in the picklable probe infos (see ``numeric_only``)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __reduce__(self):
        return SkippedValue, (self.text,)


def tensor_numpy(tensor) -> np.ndarray:
    """A CPU tensor with no grad as numpy; bfloat16 and float8, which numpy has no dtype for, through float32,
    which holds their values exactly."""
    try:
        return tensor.numpy()
    except TypeError:
        if tensor.dtype.is_floating_point:
            return tensor.float().numpy()
        raise


def numeric_value(value) -> np.ndarray | None:
    """``value`` as a numpy array when the info rule records it, else ``None``.

    Python scalars get numpy's dtypes (float64, int64, bool), whatever the process
    (a worker without torch, a main process with another torch default dtype).
    """
    kind = type(value)
    if kind is bool:
        return np.asarray(value, dtype=np.bool_)
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(
                f"the Python int {value} is outside int64's range, the widest integer a TensorDict holds exactly; "
                "report it as a float (if its precision may be lost) or a string (skipped), or leave it out"
            )
        return np.asarray(value, dtype=np.int64)
    if kind is float:
        return np.asarray(value, dtype=np.float64)
    torch = sys.modules.get("torch")  # a tensor implies torch is imported
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value) if value.dtype.kind in "biuf" else None
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype.is_complex:
            return None
        return tensor_numpy(value.detach().cpu())
    if isinstance(value, (int, float)):  # a subclass (IntEnum, IntFlag): its plain number, as int/float above
        return numeric_value(int(value) if isinstance(value, int) else float(value))
    return None


def numeric_info_value(value, key: Key, env_index: int | None, phase: str) -> np.ndarray | None:
    """:func:`numeric_value`, with a value no dtype holds (a Python int past int64) an error naming env and key."""
    try:
        return numeric_value(value)
    except OverflowError as err:
        raise EnvError(env_index, phase, f"info key {_key_str(key)}: {err}") from None


def _string_key(key, mapping: Mapping, prefix: Key, env_index: int | None, phase: str) -> str:
    """``key`` as the string a TensorDict key must be; refuses two keys of ``mapping`` that
    would become the same string (``1`` and ``"1"``), which would silently drop one value."""
    text = str(key)
    clash = [k for k in mapping if k is not key and str(k) == text]
    if clash:
        raise EnvError(
            env_index, phase,
            f"info keys {key!r} and {clash[0]!r} (at {_key_str((*prefix, text))}) both become the TensorDict key "
            f"{text!r}, so one value would be lost; rename one of them in the env (e.g. a gymnasium wrapper)",
        )
    return text


def _flatten(info: Mapping, prefix: Key = (), env_index: int | None = None, phase: str = "info"):
    for key, value in info.items():
        if key.__class__ is not str:  # rare: only non-string keys can collide
            key = _string_key(key, info, prefix, env_index, phase)
        path = (*prefix, key)
        if isinstance(value, Mapping):
            yield from _flatten(value, path, env_index, phase)
        else:
            yield path, value


def cast_problem(source: np.ndarray, dtype: np.dtype) -> str | None:
    """Why storing the numeric array ``source`` as ``dtype`` would change its values, or ``None`` if it would not.

    The pool's rule: any safe cast; integers into a narrower or differently
    signed integer dtype when every value is in its range (checked here);
    int into float and float into a narrower float (``same_kind``) when no finite
    value overflows to inf. Float into int, and anything into bool, are refused.
    Call it only when the dtypes differ: the common case (same dtype) needs no check.
    """
    src = source.dtype
    if src.kind not in "biuf":
        return f"dtype {src} is not a bool, integer or float dtype"
    if src.kind in "iu" and dtype.kind == "f" and source.size:  # numpy calls int64 -> float64 safe; 2**53 + 1 is not
        inexact = _inexact_int(source, dtype)
        if inexact is not None:
            return inexact
    if np.can_cast(src, dtype, "safe"):
        return None
    if src.kind in "iu" and dtype.kind in "iu":
        if source.size:
            limits = np.iinfo(dtype)
            low, high = source.min(), source.max()
            if low < limits.min or high > limits.max:
                bad = low if low < limits.min else high
                return f"value {bad} is out of the range of {dtype} [{limits.min}, {limits.max}]"
        return None
    if np.can_cast(src, dtype, "same_kind"):
        if dtype.kind == "f" and source.size:  # a finite value must not overflow to inf
            values = source.astype(np.float64)
            values = values[np.isfinite(values)]
            top = float(np.finfo(dtype).max)
            if values.size and np.abs(values).max() > top:
                bad = values[np.argmax(np.abs(values))]
                return f"value {bad} overflows {dtype} (largest {top:g})"
        return None
    return f"dtype {src} does not cast to {dtype} without changing the values"


def _inexact_int(source: np.ndarray, dtype: np.dtype) -> str | None:
    """The first integer of ``source`` that float ``dtype`` does not hold exactly (``2**24 + 1`` in float32)."""
    # >=: rounding may bring 2**53 + 1 down to 2**53
    wide = source[np.abs(source.astype(np.float64)) >= _EXACT_INT[np.dtype(dtype).itemsize]]
    for value in wide.tolist():
        with np.errstate(over="ignore"):
            stored = float(np.asarray(value).astype(dtype))
        if math.isinf(stored):
            return f"value {value} overflows {dtype} (largest {float(np.finfo(dtype).max):g})"
        if int(stored) != value:
            return f"integer {value} is not exactly representable in {dtype} (it would read {int(stored)})"
    return None


def first_cast_problem(array: np.ndarray, dtype: np.dtype, rows=None) -> tuple[int, str] | None:
    """The first row of ``array`` (among ``rows``: a bool mask or indices; all rows when ``None``)
    whose values cannot be stored as ``dtype`` unchanged, with :func:`cast_problem`'s reason, or
    ``None`` when every one can. The selected rows are checked at once; the row-by-row search
    that names the env runs only after a failure."""
    if cast_problem(array if rows is None else array[rows], dtype) is None:
        return None
    if rows is None:
        order = range(len(array))
    else:
        rows = np.asarray(rows)
        order = (np.flatnonzero(rows) if rows.dtype == np.bool_ else rows).tolist()
    for j in order:
        problem = cast_problem(array[j], dtype)
        if problem is not None:
            return j, problem
    return None


#: Keys of vector-env infos that are not per-env values (SAME_STEP's terminal data).
_VECTOR_SPECIAL = frozenset({"final_obs", "final_info", "final_observation"})


def is_vector_mask(key, info: Mapping) -> bool:
    """Whether ``key`` is gymnasium's presence mask ``"_k"`` of a key ``k`` of the same vector info dict:
    ``k`` itself, or a non-string key written as ``k`` (an int key ``1`` is masked by the string ``"_1"``).
    An info key of the env's own that starts with ``"_"`` is not one (its own mask is ``"__k"``)."""
    if key.__class__ is not str or key[:1] != "_":
        return False
    base = key[1:]
    return base in info or any(k.__class__ is not str and str(k) == base for k in info)


def flatten_vector_info(info: Mapping, prefix: Key = (), present=None, phase: str = "info"):
    """Yield ``(key, value, present)`` for a gymnasium vector info dict.

    ``value`` has a leading ``num_envs`` dim; ``present`` is the ``"_key"``
    mask (inherited by nested dicts), ``None`` when every env reported it.
    A ``"_key"`` entry is a mask only when ``"key"`` is in the same dict;
    otherwise it is a value of its own. Object arrays (where gymnasium puts
    ``np.bool_`` values and tensors) come as numeric arrays when the envs
    that reported the key gave numbers (see :func:`vector_values`).
    """
    for key, value in info.items():
        if key.__class__ is not str:
            key = _string_key(key, info, prefix, None, phase)
        if is_vector_mask(key, info) or (not prefix and key in _VECTOR_SPECIAL):
            continue
        mask = info.get("_" + key, present)
        path = (*prefix, key)
        if isinstance(value, Mapping):
            yield from flatten_vector_info(value, path, mask, phase)
        else:
            if value.__class__ is np.ndarray and value.dtype.kind == "O":
                value = vector_values(value, mask, path, phase)
            yield path, value, mask


def check_vector_mask(key: Key, present, num_envs: int, phase: str) -> None:
    """A vector info's ``"_key"`` mask must hold one flag per env (numpy would broadcast one)."""
    if present is not None and np.shape(present) != (num_envs,):
        raise EnvError(
            None, phase, f"vector info key {_key_str(key)}: its '_{key[-1]}' mask is {describe(present)}; expected "
            f"shape ({num_envs},), one flag per env",
        )


def vector_values(value: np.ndarray, present=None, key: Key = ("?",), phase: str = "info"):
    """A vector info's object array as a numeric ``(num_envs, *shape)`` array.

    gymnasium's ``VectorEnv`` stacks Python and numpy number scalars into
    typed arrays, but puts anything else (``np.bool_``, torch tensors, ...) in
    an object array. When every env that reported the key (``present``; all
    rows when ``None``) gave a numeric value of one shape, they are converted
    with :func:`numeric_value` and stacked (rows that did not report it read
    zero; dtypes are promoted as across envs). When none did (strings,
    ``None``, objects), ``value`` comes back unchanged, to be skipped by the
    info rule. A mix, or numbers of different shapes, is an :class:`EnvError`.
    """
    if value.ndim != 1:
        return value
    rows = range(len(value)) if present is None else np.flatnonzero(np.asarray(present, dtype=bool)).tolist()
    converted = [(j, numeric_info_value(value[j], key, j, phase)) for j in rows]
    numeric = [(j, a) for j, a in converted if a is not None]
    if not numeric:
        return value
    first, array0 = numeric[0]
    if len(numeric) < len(converted):
        j = next(j for j, a in converted if a is None)
        raise EnvError(
            j, phase,
            f"vector info key {_key_str(key)}: env {first} reported a numeric value ({describe(value[first])}), "
            f"this env {describe(value[j])}. An info key must be numeric in every env that reports it; "
            "leave it out with info_keys= or convert it in a wrapper.",
        )
    dtype = array0.dtype
    for j, array in numeric[1:]:
        if array.shape != array0.shape:
            raise EnvError(
                j, phase,
                f"vector info key {_key_str(key)} has shape {array.shape} ({describe(value[j])}), but env {first} "
                f"gave shape {array0.shape}. Every env must report the same shape.",
            )
        if array.dtype != dtype:
            dtype = _promote(dtype, array.dtype)
    out = np.zeros((len(value), *array0.shape), dtype)
    for j, array in numeric:
        out[j] = array
    return out


def batch_wide_error(key: Key, value, num_envs: int, phase: str) -> EnvError:
    """The error for a vector info value that is not one entry per env (a scalar for the whole batch)."""
    return EnvError(
        None, phase,
        f"vector info key {_key_str(key)} is {describe(value)}: one value for the whole batch, not one per env. A "
        f"VectorEnv's info values have a leading dim of num_envs={num_envs} (gymnasium's convention), so the pool "
        "cannot record it per env. Report it per env in the vector env (e.g. np.full(num_envs, value)), or leave "
        "it out with info_keys=[...].",
    )


def _key_str(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


def _out_of_range(i: int, key: Key, array: np.ndarray, value: int, phase: str) -> EnvError:
    """The error for a Python int that numpy refuses to store in ``array`` (``OverflowError``)."""
    return EnvError(
        i, phase, f"info key {_key_str(key)}: expected dtype {array.dtype}, shape (), got {value!r}, which is out of "
        "its range; storing it would change its value. Declare the key with a wider dtype via info_spec=."
    )


@dataclass(frozen=True)
class InfoLeaf:
    """One recorded info key: the shape and dtype of a single env's value, and the TorchRL spec
    declared for it with ``info_spec=`` (kept as declared, bounds included; ``None`` when inferred)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    declared: object = None


class InfoSchema:
    """The recorded info keys of a pool, with their per-env shapes and dtypes.

    Args:
        leaves: mapping from nested key tuple to :class:`InfoLeaf`.
        selected: ``True`` when the user restricted the keys with ``info_keys=``;
            other numeric keys are then ignored instead of raising.
        masked: the keys that get a presence mask (envs may omit them).
    """

    def __init__(self, leaves: Mapping[Key, InfoLeaf], selected: bool = False, masked=()):
        self.leaves = dict(leaves)
        self.selected = selected
        masked = set(masked)
        self.masked: tuple[Key, ...] = tuple(key for key in self.leaves if key in masked)

    def __len__(self) -> int:
        return len(self.leaves)

    def __repr__(self) -> str:
        items = ", ".join(
            f"{k}: {v.dtype}{v.shape}{' (masked)' if k in self.masked else ''}" for k, v in self.leaves.items()
        )
        return f"InfoSchema({items})"

    @classmethod
    def infer(
        cls,
        probes: Sequence[tuple[int, str, Mapping]],
        info_keys: Sequence | None = None,
        info_spec=None,
        batch_wide: Mapping[Key, EnvError] | None = None,
    ) -> InfoSchema:
        """Infer the schema from ``(env_index, phase, info)`` probes of every env.

        ``info_spec`` entries (TorchRL specs with the value shape, no batch dim,
        or example values) override inferred ones. ``info_keys`` keeps only the
        listed keys; each must be declared or seen in a probe. Keys missing
        from some probe, and declared keys, get a presence mask. ``batch_wide``: a vector env's
        values that are not one per env (``{key: error}``), an error unless ``info_keys`` leaves them out.
        """
        chosen_keys = chosen_info_keys(info_keys)

        def recorded(key: Key) -> bool:  # kept by info_keys= (a chosen key, or under one)
            return chosen_keys is None or any(key[: len(k)] == k for k in chosen_keys)

        leaves: dict[Key, InfoLeaf] = {}
        first_seen: dict[Key, tuple[int, str]] = {}
        reported: dict[Key, int] = {}  # in how many probes (but the EPISODE_END ones)
        at_episode_end: set[Key] = set()  # reported by an EPISODE_END probe
        skipped: dict[Key, tuple[int, str, object]] = {}  # a non-numeric value's first probe
        for env_index, phase, info in probes:
            for key, value in _flatten(info, (), env_index, phase):
                array = numeric_info_value(value, key, env_index, phase)
                if array is None:
                    skipped.setdefault(key, (env_index, phase, value))
                    continue
                if phase == EPISODE_END:
                    at_episode_end.add(key)
                else:
                    reported[key] = reported.get(key, 0) + 1
                seen = leaves.get(key)
                if seen is None:
                    leaves[key] = InfoLeaf(array.shape, array.dtype)
                    first_seen[key] = (env_index, phase)
                    continue
                if array.shape != seen.shape:
                    env0, phase0 = first_seen[key]
                    raise EnvError(
                        env_index,
                        phase,
                        f"info key {_key_str(key)} has shape {array.shape}, but env {env0} gave "
                        f"shape {seen.shape} at {phase0}. Every env must report the same shape; "
                        "declare the key with info_spec= or leave it out with info_keys=.",
                    )
                promoted = seen.dtype if array.dtype == seen.dtype else _promote(seen.dtype, array.dtype)
                if promoted != seen.dtype:
                    leaves[key] = InfoLeaf(seen.shape, promoted)
        declared = _declared(info_spec)
        for key, error in (batch_wide or {}).items():
            if recorded(key) or key in declared:
                raise error
        for key, (env_index, phase, value) in skipped.items():
            if (key not in leaves and key not in declared) or not recorded(key):
                continue
            origin = "its info_spec= declaration" if key in declared else "env {} at {}".format(*first_seen[key])
            text = value.text if isinstance(value, SkippedValue) else describe(value)
            raise EnvError(
                env_index, phase,
                f"info key {_key_str(key)} is {text} here, but a number in {origin}. An info key must "
                "be numeric in every env that reports it (a placeholder such as None is not a value): leave the "
                "key out of the info where there is no value (declare it with info_spec= to record "
                f"({INFO_MASK_KEY!r}, ...) = False there), or skip it with info_keys=[...].",
            )
        leaves.update(declared)
        first_seen.update((key, None) for key in declared)
        real = sum(phase != EPISODE_END for _, phase, _ in probes)  # a key reported in each of these: no mask
        masked = {key for key in leaves if key in declared or reported.get(key, 0) < real or key in at_episode_end}
        if chosen_keys is None:
            _check_nesting(leaves, first_seen)
            _check_key_names(leaves)
            return cls(leaves, masked=masked)
        chosen = {}
        for key in chosen_keys:
            matches = {k: v for k, v in leaves.items() if k[: len(key)] == key}
            if not matches:
                raise SpecError(
                    f"info_keys: {_key_str(key)} did not appear as a numeric value in the reset or "
                    f"first-step info of any env (seen: {sorted(leaves) or 'none'}); declare its "
                    "shape and dtype with info_spec={key: spec}."
                )
            chosen.update(matches)
        _check_nesting(chosen, first_seen)
        _check_key_names(chosen)
        return cls(chosen, selected=True, masked=masked)

    def spec(self, num_envs: int, device=None):
        """The batched ``"info"`` spec (a ``Composite``): each leaf ``(num_envs, 1, *shape)``."""
        from torchrl.data import Composite, Unbounded

        from ..specs import check_storable, torch_dtype

        spec = Composite(shape=(num_envs,), device=device)
        for key, leaf in self.leaves.items():
            check_storable(leaf.dtype, f"info key {_key_str(key)}", info_key=_key_str(key))
            if leaf.declared is not None:  # where the pool's outputs are (CPU without a device), as declared else
                declared = leaf.declared.expand(num_envs, 1, *leaf.shape)
                spec[key] = declared.to(device if device is not None else "cpu")
            else:
                spec[key] = Unbounded(
                    shape=(num_envs, 1, *leaf.shape), dtype=torch_dtype(leaf.dtype), device=device
                )
        return spec

    def mask_spec(self, num_envs: int, device=None):
        """The batched ``"info_mask"`` spec: a bool ``(num_envs, 1)`` leaf per masked key."""
        import torch
        from torchrl.data import Categorical, Composite

        spec = Composite(shape=(num_envs,), device=device)
        for key in self.masked:
            spec[key] = Categorical(2, shape=(num_envs, 1), dtype=torch.bool, device=device)
        return spec

    def buffer_leaves(self, num_envs: int):
        """``{key: (shape, dtype)}`` of the ``"info"`` and ``"info_mask"`` leaves, for the buffer layout."""
        from ..specs import check_storable

        for key, leaf in self.leaves.items():  # before any buffer: torch cannot even wrap a float128 array
            check_storable(leaf.dtype, f"info key {_key_str(key)}", info_key=_key_str(key))
        out = {("info", *key): ((num_envs, 1, *leaf.shape), leaf.dtype) for key, leaf in self.leaves.items()}
        out.update({(INFO_MASK_KEY, *key): ((num_envs, 1), np.dtype(bool)) for key in self.masked})
        return out


def _check_key_names(leaves: Mapping[Key, InfoLeaf]) -> None:
    """An empty key cannot be a TorchRL spec key (refused); a ``"_"``-prefixed one is recorded, but TorchRL's
    collectors drop every key with such a part as private (warned: rollout() keeps it, a Collector would not)."""
    for key in leaves:
        if any(part == "" for part in key):
            raise SpecError(
                f"info key {_key_str(key)} has an empty part '', which a TorchRL Composite spec cannot hold as a "
                "key; rename it in the env (e.g. a gymnasium wrapper) or leave it out with info_keys=[...]"
            )
    private = [key for key in leaves if any(part.startswith("_") for part in key)]
    if private:
        import warnings

        warnings.warn(
            f"info keys {', '.join(_key_str(k) for k in private)} start with '_': the pool records them (rollout() has "
            "them), but TorchRL's collectors drop every key with a '_'-prefixed part as private, so a Collector's "
            "output would lack them. Rename them in the env (a gymnasium wrapper) to keep them there, or leave them "
            "out with info_keys=[...] to silence this.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _origin_text(origin: tuple[int, str] | None) -> str:
    return "the info_spec= declaration" if origin is None else f"the {origin[1]} info of env {origin[0]}"


def _check_nesting(leaves: Mapping[Key, InfoLeaf], origins: Mapping[Key, tuple[int, str] | None]) -> None:
    """No recorded key may also be a prefix of another (a value in one info, a dict in another)."""
    for key in leaves:
        for n in range(1, len(key)):
            if key[:n] not in leaves:
                continue
            value_key, origin = key[:n], origins.get(key[:n])
            nested_origin = origins.get(key)
            message = (
                f"info key {_key_str(value_key)} is a value in {_origin_text(origin)}, but a dict (with key "
                f"{_key_str(key)}) in {_origin_text(nested_origin)}. A key must be a value in every env or a "
                "dict in every env; keep one with info_keys=[...] or rename it in a wrapper."
            )
            if origin is None or nested_origin is None:
                raise SpecError(message)
            later = max(origin, nested_origin, key=lambda o: o[0])
            raise EnvError(later[0], later[1], message)


def _promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """The dtype holding values of both ``a`` and ``b``: numpy's promotion, which keeps integers exact where it
    can (int64 with float32 is float64; torch's rule, float32, would round 2**24 + 1; uint16 with int64 is
    int64). Where that is a dtype a TensorDict cannot hold, or a float for two integer dtypes (uint64 with int64),
    the widest unstorable input comes back instead, so that the spec refuses it naming the key, unless
    ``info_spec=`` declares the key."""
    from ..specs import storable

    promoted = np.promote_types(a, b)
    if storable(promoted) and not (promoted.kind == "f" and a.kind in "biu" and b.kind in "biu"):
        return promoted
    unstorable = [dtype for dtype in (a, b, promoted) if not storable(dtype)]
    return max(unstorable, key=lambda dtype: dtype.itemsize)


def chosen_info_keys(info_keys) -> list[Key] | None:
    """``info_keys=`` as a list of key tuples (``None``: every key)."""
    if isinstance(info_keys, str) or (
        isinstance(info_keys, tuple) and info_keys and all(isinstance(k, str) for k in info_keys)
    ):
        info_keys = [info_keys]  # one key ("a", or ("a", "b") nested), as TorchRL and the exports read it
    if info_keys is None:
        return None
    if isinstance(info_keys, (bytes, bytearray)) or not hasattr(info_keys, "__iter__"):
        raise TypeError(f"info_keys: expected a key or a list of keys, got {describe(info_keys)}")
    info_keys = list(info_keys)  # any iterable, read once
    if not all(
        isinstance(k, str) or (isinstance(k, (tuple, list)) and k and all(isinstance(part, str) for part in k))
        for k in info_keys
    ):
        raise TypeError(
            "info_keys: expected a key or a list of keys (a key is a str, or a tuple of str for a nested info), "
            f"got {describe(info_keys)}"
        )
    return [(k,) if isinstance(k, str) else tuple(k) for k in info_keys]


def needs_step_probe(info_keys, info_spec) -> bool:
    """Whether the info schema needs the construction probe's step (a random action in every env).

    Not when ``info_keys=`` chooses only keys that ``info_spec=`` declares (or none at all, ``[]``):
    the arguments then settle the schema, and the envs are only reset at construction.
    """
    chosen = chosen_info_keys(info_keys)
    if chosen is None:
        return True
    declared = _declared(info_spec)
    return not all(key in declared for key in chosen)


def _declared(info_spec) -> dict[Key, InfoLeaf]:
    if info_spec is None:
        return {}
    from torchrl.data import Composite, NonTensor, TensorSpec

    from ..specs import numpy_dtype

    def composite_items(composite, prefix):  # a Composite, at the root or as an entry, holds per-env leaves
        if composite.shape:
            where = f"info_spec[{_key_str(prefix)}]" if prefix else "info_spec"
            raise SpecError(
                f"{where}: expected per-env value shapes, got a Composite with batch shape {tuple(composite.shape)} "
                "(a pool's observation_spec['info'] has shape (N, 1, *value_shape)). Declare each key without the "
                "batch and time dims, e.g. info_spec={'x': Unbounded((), dtype=torch.float32)}."
            )
        for k, v in composite.items(True, True):
            yield (*prefix, *(k if isinstance(k, tuple) else (k,))), v

    if isinstance(info_spec, Composite):
        items = list(composite_items(info_spec, ()))
    elif isinstance(info_spec, Mapping):
        def flat(mapping, prefix):  # {"episode": {"r": 0.0}} is ("episode", "r"), as the info nests it
            for k, v in mapping.items():
                key = (*prefix, *((k,) if isinstance(k, str) else tuple(k)))
                if isinstance(v, Composite):
                    yield from composite_items(v, key)
                elif isinstance(v, Mapping):
                    yield from flat(v, key)
                else:
                    yield key, v

        items = list(flat(info_spec, ()))
    else:
        raise SpecError(f"info_spec: expected a Composite or a mapping of key -> spec, got {type(info_spec).__name__}")
    out = {}
    for key, spec in items:
        if isinstance(spec, NonTensor):
            raise SpecError(
                f"info_spec[{_key_str(key)}]: a NonTensor spec declares a non-numeric value (a string, an object), "
                "which the pool does not record (its info buffers hold numbers; such values are skipped): leave "
                "the key out of info_spec"
            )
        if isinstance(spec, TensorSpec):
            try:
                dtype = numpy_dtype(spec.dtype)
            except TypeError as err:
                raise SpecError(
                    f"info_spec[{_key_str(key)}]: dtype {spec.dtype} has no numpy equivalent, and the pool's info "
                    "buffers are numpy arrays; declare torch.float32 (which holds bfloat16 and float8 values exactly)"
                ) from err
            out[key] = InfoLeaf(tuple(spec.shape), dtype, spec.clone())
            continue
        array = numeric_value(spec)
        if array is None:
            raise SpecError(
                f"info_spec[{_key_str(key)}]: expected a TorchRL spec with the value's shape (no batch "
                f"dim) or an example numeric value, got {describe(spec)}"
            )
        out[key] = InfoLeaf(array.shape, array.dtype)
    return out


class InfoWriter:
    """Writes one env's info dict into row ``i`` of the ``(N, 1, ...)`` info buffers.

    Args:
        schema: the recorded keys.
        arrays: the pool's buffers; info leaves are read at ``("info", *key)``
            with shape ``(N, 1, *shape)``, presence masks at ``("info_mask", *key)``.
    """

    def __init__(self, schema: InfoSchema, arrays: Mapping[Key, np.ndarray]):
        self.schema = schema
        self.arrays = {key: arrays[("info", *key)] for key in schema.leaves}
        self.masks = {key: arrays[(INFO_MASK_KEY, *key)] for key in schema.masked}
        self.kinds = {key: array.dtype.kind for key, array in self.arrays.items()}
        self.count = len(self.arrays)

    def write(self, i: int, info: Mapping, phase: str) -> None:
        """Record ``info`` for env ``i``; a masked key it lacks reads as zero, masked False."""
        if info.__class__ is not dict and not isinstance(info, Mapping):
            raise EnvError(i, phase, f"expected the env's info to be a dict, got {describe(info)}")
        if not self.count:
            if info and not self.schema.selected:
                self._check_unknown(i, info, phase)
            return
        written = []
        arrays = self.arrays
        for key, value in _flatten(info, (), i, phase):
            array = arrays.get(key)
            if array is None:
                if not self.schema.selected and numeric_info_value(value, key, i, phase) is not None:
                    self._raise_unknown(i, key, value, phase, self._unknown_keys(info, i, phase))
                continue
            self._store(i, key, array, value, phase)
            written.append(key)
        masks = self.masks
        if len(written) < self.count:
            reported = set(written)
            for key in arrays:
                if key not in reported:
                    self._not_reported(key, i, phase)
        if masks:
            for key in written:
                mask = masks.get(key)
                if mask is not None:
                    mask[i] = True

    def write_batch(self, info: Mapping, select: np.ndarray, phase: str) -> None:
        """Record a vector-env info dict for the rows where ``select`` (bool, (N,)) is True.

        Values have a leading ``N`` dim; ``"_key"`` masks say which envs
        reported them. Rows that did not report a masked key read as zero.
        """
        if not isinstance(info, Mapping):
            raise EnvError(None, phase, f"expected the vector env's info to be a dict, got {describe(info)}")
        written = set()
        masks = self.masks
        for key, value, present in flatten_vector_info(info, phase=phase):
            array = self.arrays.get(key)
            if array is None and self.schema.selected:
                continue
            source = numeric_info_value(value, key, None, phase)
            if source is not None and (source.ndim == 0 or len(source) != len(select)):
                raise batch_wide_error(key, value, len(select), phase)
            if array is None:
                if source is not None:
                    rows = np.flatnonzero(select if present is None else select & present)
                    unknown = [k for k, v, _ in flatten_vector_info(info, phase=phase)
                               if k not in self.arrays and numeric_info_value(v, k, None, phase) is not None]
                    self._raise_unknown(int(rows[0]) if rows.size else None, key, value, phase, unknown)
                continue
            if source is None or source.shape[1:] != array.shape[2:]:
                raise EnvError(
                    None, phase, f"vector info key {_key_str(key)}: expected an array of shape "
                    f"({len(array)}, {', '.join(map(str, array.shape[2:]))}) and dtype {array.dtype}, got {describe(value)}"
                )
            check_vector_mask(key, present, len(select), phase)
            rows = select if present is None else select & np.asarray(present, dtype=bool)
            found = None if source.dtype == array.dtype else first_cast_problem(source, array.dtype, rows)
            if found is not None:
                j, problem = found
                raise EnvError(
                    j, phase, f"vector info key {_key_str(key)}: expected dtype {array.dtype}, got {source.dtype} "
                    f"(value {source[j].tolist()!r}): {problem}; storing it would change its value. Declare the key "
                    "with a wider dtype via info_spec=."
                )
            array[rows, 0] = source[rows]
            mask = masks.get(key)
            if mask is not None:
                mask[rows] = True
            if present is not None:
                missing = select & ~rows
                if missing.any():
                    self._not_reported(key, missing, phase)
            written.add(key)
        if len(written) < self.count and select.any():
            for key in self.arrays:
                if key not in written:
                    self._not_reported(key, select, phase)

    def _store(self, i, key, array, value, phase):
        kind = self.kinds[key]
        vtype = type(value)
        if vtype is float and kind == "f" or vtype is bool or vtype is int and kind in "iuf":
            if array.shape[2:] == ():
                if kind != "f" or vtype is bool:
                    try:
                        array[i, 0] = value
                    except OverflowError as err:  # a Python int out of the dtype's range
                        raise _out_of_range(i, key, array, value, phase) from err
                    return
                if vtype is float:
                    if array.itemsize == 8 or not _FINITE_MAX[array.itemsize] < abs(value) < math.inf:  # nan, inf too
                        array[i, 0] = value
                        return
                # an int into a float key is exact up to 2**(mantissa bits + 1), and cannot overflow: checked past that
                elif -2048 <= value <= 2048 or abs(value) <= _EXACT_INT[array.itemsize]:
                    array[i, 0] = value
                    return
                # a number that may overflow to inf, or an int that may be rounded: checked below, so numpy's
                # "overflow encountered in cast" RuntimeWarning would only alarm
                try:
                    with np.errstate(over="ignore"):
                        array[i, 0] = value
                except OverflowError as err:  # a Python int past float's range
                    raise _out_of_range(i, key, array, value, phase) from err
                if vtype is float:
                    if not math.isinf(array[i, 0]) or math.isinf(value):  # nan, inf, or rounded to the largest value
                        return
                else:
                    stored = array[i, 0]
                    if math.isfinite(stored) and int(stored) == value and _INT64_MIN <= value <= _INT64_MAX:
                        return
                # a finite number became inf in a float16/32 key, or an int was rounded: undo it, and let
                # cast_problem below name it
                array[i, 0] = 0
        source = numeric_info_value(value, key, i, phase)
        expected = f"dtype {array.dtype}, shape {array.shape[2:]}"
        if source is None:
            raise EnvError(i, phase, f"info key {_key_str(key)}: expected a numeric value ({expected}), got {describe(value)}")
        if source.shape != array.shape[2:]:
            raise EnvError(i, phase, f"info key {_key_str(key)}: expected {expected}, got shape {source.shape} ({describe(value)})")
        if source.dtype != array.dtype:
            problem = cast_problem(source, array.dtype)
            if problem is not None:
                raise EnvError(
                    i,
                    phase,
                    f"info key {_key_str(key)}: expected {expected}, got dtype {source.dtype} (value {value!r}): "
                    f"{problem}; storing it would change its value. Declare the key with a wider dtype via info_spec=.",
                )
        array[i, 0] = source

    def _check_unknown(self, i, info, phase):
        for key, value in _flatten(info, (), i, phase):
            if numeric_info_value(value, key, i, phase) is not None:
                self._raise_unknown(i, key, value, phase, self._unknown_keys(info, i, phase))

    def _unknown_keys(self, info: Mapping, i: int, phase: str) -> list[Key]:
        """Every numeric key of ``info`` the schema lacks (a wrapper's episode statistics arrive several at once)."""
        return [key for key, value in _flatten(info, (), i, phase)
                if key not in self.arrays and numeric_info_value(value, key, i, phase) is not None]

    def _not_reported(self, key: Key, rows, phase: str) -> None:
        """``rows`` (an env index or a bool row mask) did not report ``key``: its value
        reads zero and its mask False; a key without a mask cannot be left out."""
        mask = self.masks.get(key)
        if mask is None:
            i = int(np.flatnonzero(rows)[0]) if isinstance(rows, np.ndarray) else int(rows)
            raise EnvError(
                i,
                phase,
                f"info key {_key_str(key)} is missing from this info. Every env reported it at reset and at its "
                "first step, so the pool records it without a presence mask, and a zero would read as a value. "
                f"Declare it with info_spec={{{_key_str(key)}: spec}} to record ({INFO_MASK_KEY!r}, ...) = False "
                "where an env omits it.",
            )
        self.arrays[key][rows] = 0
        mask[rows] = False

    def _raise_unknown(self, i, key, value, phase, unknown=()):
        unknown = list(unknown) or [key]
        others = "" if len(unknown) == 1 else f" (with {', '.join(_key_str(k) for k in unknown if k != key)})"
        declared = ", ".join(f"{_key_str(k)}: spec" for k in unknown)
        raise EnvError(
            i,
            phase,
            f"info key {_key_str(key)} ({describe(value)}){others} is not in the pool's info spec, which was "
            f"inferred from the reset and first-step infos of every env (keys: "
            f"{sorted(self.schema.leaves) or 'none'}). Declare {'it' if len(unknown) == 1 else 'them'} with "
            f"info_spec={{{declared}}}, or restrict the recorded keys with info_keys=[...].",
        )
