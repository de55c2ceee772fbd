"""WorldModelEnv: a learned world model as a batched TorchRL environment.

Data path of one step::

    td["action"] -> transition adapter (model called ONCE for the whole batch)
      -> return-form normaliser (adapters.split_transition + checks) -> new state kept on the env
      -> TensorDict(observation, reward, terminated, truncated, done)

The model's latent state for all ``num_envs`` rows lives on the env (``env.state``), on the
model's device. Every update is out of place (``torch.where``/``index_copy``), so tensors
handed to TorchRL are never overwritten by later steps and need no copy, and the same code
is differentiable with ``differentiable=True``.

Resets honour TorchRL's ``"_reset"`` mask: only masked rows restart, from ``reset_fn``, from
``start_states`` (real observations, sampled with the env's ``torch.Generator`` and encoded),
or from ``initial_state``/``initial_observation`` broadcast over the rows.

:meth:`WorldModelEnv._step_and_maybe_reset` is a fast path equivalent to TorchRL's generic
``step`` -> ``step_mdp`` -> ``maybe_reset`` (tests check that both give the same data). It
falls back to the generic path whenever the input is outside what it handles.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Categorical, Composite, TensorSpec, Unbounded
from torchrl.envs import EnvBase

from .._meta import NoAutoResetMeta
from ..errors import SpecError, _real, add_note, check_bool, check_int, describe
from ..masks import row_mask, zero_rewards
from ..pool.buffers import nest
from ..specs import as_spec, batch_spec
from . import _tree
from .adapters import (
    MISSING,
    RESET_METHODS,
    AdapterError,
    Bound,
    ReturnFormError,
    bind,
    discover_method,
    discover_transition,
    note_raised_inside,
    split_reset,
    split_transition,
)

__all__ = ["WorldModelEnv"]

_DONE_KEYS = ("done", "terminated", "truncated")
#: Root keys TorchRL or this env write themselves: no observation entry or state_key may take them.
_RESERVED_KEYS = frozenset(("reward", *_DONE_KEYS, "info", "action", "next", "_reset", "_step"))

# Seed-design keyword arguments that are transforms here: explain instead of a bare TypeError.
_TRANSFORM_KWARGS = {
    "max_episode_steps": "the time limit is a transform: make_world_model_env(max_episode_steps=...) (RowStepCounter)",
    "reward_fn": "reward_fn is the RewardAdapter transform",
    "terminal_fn": "terminal_fn is the TerminalAdapter transform",
    "action_transform_fn": "action_transform_fn is the ActionAdapter (inverse) transform",
    "decoder": "the observation decoder is the ObservationDecoder transform",
}
_UNSUPPORTED_KWARGS = {
    "render_fn": "render through a decoder transform (ObservationDecoder) that writes 'pixels'",
    "render_mode": "render through a decoder transform (ObservationDecoder) that writes 'pixels'",
    "torch_actions": "actions are always tensors, with the dtype of the action spec",
}


#: added to the model generator's seed, then hashed (see :func:`_generator_seed`), for the reset generator's
_RESET_STREAM = 0x9E3779B97F4A7C15


def _check_seed(seed) -> int:
    """A seed as an int in ``[0, 2**64)`` (torch generators' range; gymnasium refuses negative seeds)."""
    seed = check_int(seed, "WorldModelEnv: seed", minimum=0)
    if seed >= 2**64:
        raise ValueError(f"WorldModelEnv: seed: expected an int below 2**64 (a torch generator seed), got {seed}")
    return seed


def _as_buffer_returns(buffer, rows):
    """``rows`` read from ``buffer``'s storage as ``buffer[index]`` returns them: collated, then transformed."""
    from tensordict import is_tensor_collection

    collate = getattr(buffer, "_collate_fn", None)
    if collate is not None:
        rows = collate(rows)
    transform = getattr(buffer, "_transform", None)
    if transform is not None and len(transform):
        with rows.unlock_() if is_tensor_collection(rows) else contextlib.nullcontext():
            rows = transform(rows)
    return rows


def _generator_seed(seed: int) -> int:
    """The seed handed to the torch generators: ``seed`` itself below 2**32, else a 32-bit hash of all its bits.

    A CPU ``torch.Generator`` keeps only the low 32 bits of its seed, so seeds ``s`` and ``s + w * 2**32``
    (the pool's advice for collector workers) would give identical streams.
    """
    if seed < 2**32:
        return seed
    mask = 2**64 - 1
    x = (seed + 0x9E3779B97F4A7C15) & mask  # splitmix64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return (x ^ (x >> 31)) >> 32


def _int64(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


# splitmix64's constants as int64 (torch has no uint64 arithmetic): per-row start_states draws
_ROW_STRIDE, _COUNT_STRIDE = _int64(0x9E3779B97F4A7C15), _int64(0xD1B54A32D192ED03)
_MIX1, _MIX2 = _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def _model_device(model) -> torch.device | None:
    if isinstance(model, torch.nn.Module):
        for tensor in model.parameters():
            return tensor.device
        for tensor in model.buffers():
            return tensor.device
    return None


def _note_dtype_mismatch(err: Exception, model, state, action, inputs_name: str = "state and action") -> None:
    """When the model raised an error about dtypes, say so if its floating parameters and its floating inputs
    differ in dtype (a float64 model fed the float32 the spaces declare fails deep inside it, naming neither).
    Any other error gets no note: a model may cast its inputs itself."""
    if not isinstance(model, torch.nn.Module) or not _DTYPE_ERROR.search(str(err)):
        return
    params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    try:
        inputs = {t.dtype for _, t in [*_tree.leaves(state), *_tree.leaves(action, "action")] if t.is_floating_point()}
    except TypeError:  # a state of the model's own form: nothing to compare
        return
    if params and inputs and not params & inputs:
        add_note(err, f"WorldModelEnv: the model's floating parameters are {_dtype_names(params)}, but its "
                      f"{inputs_name} {'are' if ' and ' in inputs_name else 'is'} {_dtype_names(inputs)} (the "
                      "spaces' dtypes): cast the model (model.float()) or declare the spaces in the model's dtype")


# torch's dtype errors name a dtype ("expected scalar type Double", "same dtype, but got Float and Double")
_DTYPE_ERROR = re.compile(r"dtype|scalar type|\b(Float|Double|Half|BFloat16)\b")


def _dtype_names(dtypes) -> str:
    return "/".join(sorted(str(d) for d in dtypes))


def _resolve_device(device) -> torch.device:
    """The device tensors made there report: ``cuda`` gets the current index, ``cpu:0`` is ``cpu``."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {str(device)!r}: CUDA is not available here (torch {torch.__version__})")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.type == "cpu":
        return torch.device("cpu")
    return device


def _exact(value, shape, dtype, device) -> bool:
    """Whether ``value`` is already a tensor of exactly this shape, dtype and device (the fast path)."""
    return type(value) is torch.Tensor and value.shape == shape and value.dtype is dtype and value.device == device


def _leaf_key(key) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _get_nested(mapping, key: tuple[str, ...]):
    node = mapping
    for part in key:
        if not isinstance(node, (Mapping, TensorDictBase)):
            return None
        node = node.get(part, None)
        if node is None:
            return None
    return node


def _mapping_leaf_keys(mapping, prefix=()) -> set[tuple[str, ...]]:
    if isinstance(mapping, TensorDictBase):
        return {prefix + _leaf_key(k) for k in mapping.keys(include_nested=True, leaves_only=True)}
    out = set()
    for k, v in mapping.items():
        if isinstance(v, (Mapping, TensorDictBase)):
            out |= _mapping_leaf_keys(v, prefix + (k,))
        else:
            out.add(prefix + (k,))
    return out


def _spec_of_state(state, device, what: str) -> TensorSpec:
    """An unbatched Unbounded spec (Composite for mappings) describing an unbatched state."""
    if isinstance(state, torch.Tensor):
        return Unbounded(shape=state.shape, dtype=state.dtype, device=device)
    if isinstance(state, (Mapping, TensorDictBase)):
        return Composite({k: _spec_of_state(v, device, f"{what}[{k!r}]") for k, v in state.items()}, device=device)
    raise SpecError(f"{what}: {_STATE_UNDER_KEY}, got {describe(state)}; {_STATE_UNDER_KEY_FIX}")


# a state exposed under state_key lives in the tensordict, whose entries are tensors and (nested) tensordicts
_STATE_UNDER_KEY = "a state exposed under state_key must be a tensor, a dict or a TensorDict"
_STATE_UNDER_KEY_FIX = (
    "a tuple or namedtuple state cannot be an entry of a tensordict: return it as a dict (or TensorDict) of "
    "tensors, or leave state_key=None (the state then stays on the env only, in any form)"
)


def step_keeping_frozen_rows(env: EnvBase, tensordict: TensorDictBase, step: Callable) -> TensorDictBase:
    """``env.step(tensordict)`` for a batch-unlocked ``env`` under a ``"_step"`` mask, frozen rows kept.

    TorchRL (0.14.1) steps an unlocked env's selected rows alone, then rebuilds the whole batch from
    zeros: a frozen row came back with a zero observation, action and flags, and a state read back from
    the tensordict (``state_key``) would restart from zeros at its next step. Here the selected rows
    step alone too (``step``: TorchRL's ``EnvBase.step`` on them), and every frozen row keeps the
    caller's values: its ``"next"`` repeats its observation, state, flags and info, with reward 0, as a
    batch-locked ``WorldModelEnv`` gives. Returns ``tensordict``, with ``"next"`` set, as TorchRL does.
    """
    bs = tensordict.batch_size
    mask = tensordict.get("_step")
    if not isinstance(mask, torch.Tensor) or mask.dtype is not torch.bool or mask.shape not in (bs, (*bs, 1)):
        raise ValueError(
            f"'_step' mask: expected a bool tensor of the tensordict's batch shape {tuple(bs)} (or "
            f"{(*bs, 1)}), one flag per row, got {describe(mask)}"
        )
    rows = mask.reshape(bs)
    if bool(rows.all()):
        return step(tensordict)
    root = tensordict.exclude("_step")
    if bool(rows.any()):
        stepped = step(root[rows]).get("next")
        keys = list(stepped.keys(True, True))
    else:
        stepped = None
        keys = [*env.full_observation_spec.keys(True, True), *env.full_done_spec.keys(True, True),
                *env.reward_keys]
    reward_keys = [key for key in env.reward_keys if key in keys]
    kept = [key for key in keys if key not in reward_keys]
    missing = [key for key in kept if key not in root.keys(True, True)]
    if missing:
        raise KeyError(
            f"{type(env).__name__}.step: the '_step' mask freezes rows, which keep their values from the input "
            f"tensordict, but it has no {missing}: pass the tensordict the last step returned (after step_mdp, "
            "as rollout and collectors do), or step every row"
        )
    next_td = root.select(*kept).clone()
    for key in reward_keys:
        spec = env.full_reward_spec[key]
        device = root.device if root.device is not None else env.device
        next_td.set(key, torch.zeros((*bs, *spec.shape[env.batch_dims:]), dtype=spec.dtype, device=device))
    if stepped is not None:
        next_td[rows] = stepped
    tensordict.set("next", next_td)
    return tensordict


class _Runtime:
    """Per-step values of a WorldModelEnv: the state, last observation and flags of every row."""

    __slots__ = (
        "state",
        "obs",
        "term",
        "trunc",
        "info",
        "has_state",
        "reward_from_model",
        "terminated_from_model",
        "done_after_reset",
        "state_guess",
    )

    def __init__(self):
        self.state = self.obs = self.term = self.trunc = self.info = self.done_after_reset = None
        self.state_guess = None  # how the last reset read a state of ambiguous layout (see _reset_state_batched)
        self.has_state = False
        self.reward_from_model = self.terminated_from_model = True


class _ClosedRuntime:
    """Stands in for the :class:`_Runtime` once the env is closed: any use says so (no check on the hot path),
    until a reset of every row reopens the env."""

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("__"):  # copy/pickle probes (__deepcopy__...): absent, as Python expects
            raise AttributeError(name)
        raise _closed_error()

    def __setattr__(self, name, value):
        raise _closed_error()


def _float64_start_hint(err: Exception, *starts) -> str:
    """What to do when a float64 start (numpy's default dtype) was refused for a float32 spec; else ``""``."""
    try:
        leaves = [t for start in starts for _, t in _tree.leaves(start)]
    except TypeError:  # a start that is not tensors: its own error says so
        return ""
    text = str(err)
    refused_for_its_dtype = "got Tensor(dtype=torch.float64" in text and "expected dtype torch.float64" not in text
    if refused_for_its_dtype and any(t.dtype == torch.float64 for t in leaves):
        return ("; numpy arrays are float64 by default: pass the start as np.zeros(..., np.float32) or "
                "torch.zeros(...) (float32 by default), or declare float64 in the spec")
    return ""


def _closed_error() -> RuntimeError:
    return RuntimeError(
        "WorldModelEnv is closed (close() was called: its own, a Collector's shutdown(), which TorchRL's Collector "
        "also runs once it reaches total_frames, or an export's, to_gymnasium(env).close() or SB3's "
        "VecEnv.close()): its rows' state was released. reset() every row to reopen it "
        "(rollout() and a new Collector do), as TorchRL's batched envs restart at their next reset."
    )


class _Shapes:
    """Expected full shapes for one batch shape (cached: no tuple building per step)."""

    __slots__ = ("bs", "bs1", "nb", "rows", "obs", "action", "false", "zero_reward", "state")

    def __init__(self, env, bs):
        self.bs = torch.Size(bs)
        self.nb = len(self.bs)
        self.rows = self.bs if self.nb == 1 else torch.Size((self.bs.numel(),))  # the model's (N,)
        self.bs1 = torch.Size((*bs, 1))
        self.false = _Zeros(self.bs1, torch.bool, env._dev)
        self.zero_reward = _Zeros(self.bs1, env._reward_dtype, env._dev)
        self.obs = None if env._obs_leaf is None else torch.Size((*bs, *env._obs_leaf.shape))
        self.action = None if env._action_leaf is None else torch.Size((*bs, *env._action_leaf.shape))
        # the state exposed under state_key: [(leaf key, full shape, dtype)] (key () for a tensor state)
        self.state = _state_layout(env._state_spec_unbatched, bs)


def _state_layout(spec, bs) -> list | None:
    """``[(leaf key, (*bs, *shape), dtype)]`` of an unbatched state spec (``None`` without one)."""
    if spec is None:
        return None
    if not isinstance(spec, Composite):
        return [((), torch.Size((*bs, *spec.shape)), spec.dtype)]
    return [
        (_leaf_key(k), torch.Size((*bs, *leaf.shape)), leaf.dtype)
        for k, leaf in spec.items(include_nested=True, leaves_only=True)
    ]


class _Zeros:
    """Fresh all-zero tensors of one shape and dtype, allocated ``count`` at a time.

    Each tensor handed out is a separate slice of a block that is never reused, so callers may
    write into what they received without touching any other output, and a step pays one
    allocation every ``count`` steps instead of one per step.
    """

    __slots__ = ("shape", "dtype", "device", "count", "_free")

    def __init__(self, shape, dtype, device, count=64):
        self.shape, self.dtype, self.device, self.count = tuple(shape), dtype, device, count
        self._free: list = []

    def __call__(self) -> torch.Tensor:
        free = self._free
        if not free:
            free.extend(torch.zeros((self.count, *self.shape), dtype=self.dtype, device=self.device).unbind(0))
            free.reverse()
        return free.pop()


class ActionRange:
    """The rows of a batch of discrete actions that lie outside their (unbatched) spec.

    ``ActionRange.of(spec)`` is ``None`` for a continuous spec: Box actions are not
    range-checked, as in EnvPool and TorchRL's GymWrapper. For a discrete one, calling
    it on a batch gives a bool mask of the batch shape marking the rows with an index out
    of range, a binary entry other than 0/1, or a vector that is not one-hot. Such an
    action would reach the model, which at best fails with an unrelated IndexError (on
    CUDA, a device-side assert). A plain class, not a closure: envs holding it pickle.
    """

    __slots__ = ("kind", "ndim", "bound", "expected")

    def __init__(self, kind: str, ndim: int, bound, expected: str):
        self.kind, self.ndim, self.bound, self.expected = kind, ndim, bound, expected

    @classmethod
    def of(cls, spec: TensorSpec) -> ActionRange | None:
        from torchrl.data import Binary, MultiCategorical, MultiOneHot, OneHot

        ndim = len(spec.shape)
        if isinstance(spec, MultiOneHot):
            sizes = [int(n) for n in spec.nvec]
            expected = f"one one-hot block (exactly one 1, the rest 0) per size in {sizes}"
            return cls("multi_one_hot", ndim, sizes, expected)
        if isinstance(spec, OneHot):
            n = int(spec.space.n)
            return cls("one_hot", ndim, n, f"a one-hot vector of size {n} (exactly one 1, the rest 0)")
        if isinstance(spec, MultiCategorical):
            nvec = spec.nvec.to(spec.device)
            return cls("index", ndim, nvec, f"indices in [0, nvec) with nvec {nvec.tolist()}")
        if isinstance(spec, Binary):
            return None if spec.dtype is torch.bool else cls("binary", ndim, None, "entries 0 or 1")
        if isinstance(spec, Categorical):
            n = int(spec.space.n)
            return cls("index", ndim, n, f"an index in [0, {n})")
        return None

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        kind, event_dims = self.kind, self.ndim
        v = v.detach()
        if v.is_floating_point():
            # float one-hot / binary actions from a straight-through estimator (out + probs - probs.detach())
            # are 0/1 up to rounding (half an ulp near 1: 5e-4 in float16, 4e-3 in bfloat16): check the nearest
            # integers, and that they are that near; a float index must be a whole number
            near = v.round()
            tolerance = 0.0 if kind == "index" else max(1e-4, 2 * torch.finfo(v.dtype).eps)
            off = ~torch.isfinite(v) | ((v - near).abs() > tolerance)  # NaN compares False with everything
            v = near
        else:
            off = None
        if kind == "index":
            bound = self.bound
            if isinstance(bound, torch.Tensor) and bound.device != v.device:
                self.bound = bound = bound.to(v.device)  # a spec built on the CPU checking a CUDA batch
            bad = (v < 0) | (v >= bound)
            if off is not None:
                bad = bad | off
        elif kind == "binary":
            bad = (v != 0) & (v != 1)
            if off is not None:
                bad = bad | off
        else:  # one-hot: each block sums to 1 (and holds only 0/1 unless bool); one flag per block
            blocks = [v] if kind == "one_hot" else v.split(self.bound, -1)
            bad = torch.stack([block.sum(-1) != 1 for block in blocks], -1)
            if v.dtype is not torch.bool:
                entries = (v != 0) & (v != 1)
                if off is not None:
                    entries = entries | off
                bad = bad | entries.any(-1, keepdim=True)
        return bad.flatten(-event_dims).any(-1) if event_dims else bad

    def placeholder(self, value: torch.Tensor) -> torch.Tensor:
        """A valid action shaped like ``value``: index 0, entries 0, or the first entry of each one-hot block."""
        out = torch.zeros_like(value)
        if self.kind in ("one_hot", "multi_one_hot"):
            sizes = [value.shape[-1]] if self.kind == "one_hot" else self.bound
            start = 0
            for size in sizes:
                out[..., start] = 1
                start += size
        return out

    def refuse(self, value: torch.Tensor, what: str, stepped: torch.Tensor | None = None) -> torch.Tensor:
        """Raise ``ValueError`` naming the first row outside the spec (one host sync).

        With ``stepped`` (bool, the batch shape: a ``"_step"`` mask), only those rows must be valid;
        the actions of frozen rows are ignored, and returned replaced by :meth:`placeholder` where
        invalid, so the model (which receives the whole batch) never sees them. Returns the action.
        """
        bad = self(value)
        if not bool(bad.any()):  # the usual case: the one host sync of a step's check
            return value
        outside = bad if stepped is None else bad & stepped
        if bool(outside.any()):
            row = tuple(outside.nonzero()[0].tolist())
            where = f"env {row[0]}" if len(row) == 1 else f"row {row}"
            raise ValueError(f"{what} of {where}: expected {self.expected}, got {value[row].tolist()}")
        view = bad.view(*bad.shape, *([1] * (value.ndim - bad.ndim)))  # only frozen rows are invalid
        return torch.where(view, self.placeholder(value), value)


class _Leaf:
    """One observation (or info) leaf: key, unbatched shape and dtype."""

    __slots__ = ("key", "shape", "dtype", "name")

    def __init__(self, key, shape, dtype, name):
        self.key, self.shape, self.dtype, self.name = key, tuple(shape), dtype, name


class WorldModelEnv(EnvBase, metaclass=NoAutoResetMeta):
    """A learned world model as a batched TorchRL env: ``batch_size=[num_envs]``, one model call per step.

    Args:
        model: the world model: any object. Its transition is ``transition_fn`` if given, else the
            first callable among ``env_step``, ``step``, ``predict_step``, ``predict``,
            ``imagine_step``, ``transition``, then ``model.__call__``.
        observation_space: what the env emits, per env: a gymnasium space or a TorchRL spec
            (unbatched). A ``Dict`` space / ``Composite`` spec gives one key per entry; anything
            else is the ``"observation"`` key.
        action_space: what the model consumes, per env (gymnasium space or TorchRL spec).
            ``Discrete`` is an int64 index; to expose another action space outside, use the
            action adapter transform (:func:`~torchrl_swm.make_world_model_env` does it).

    Keyword Args:
        num_envs: the batch size ``N`` (rows the model steps at once). ``None`` makes the env
            batch-unlocked (``batch_size=[]``, any input batch size, as TorchRL's planners
            require); the state then comes from the tensordict, so ``state_key`` is required.
        initial_state: unbatched start state (tensor, tuple, dict, TensorDict), broadcast to the
            rows being reset.
        initial_observation: unbatched start observation, broadcast. Without ``initial_state``,
            the start state is ``encode(initial_observation)`` (``encode_fn`` or ``model.encode``),
            encoded at every reset (so it follows the model as it trains, and a sampling encoder
            draws from the reset generator), or the observation itself when there is no encoder
            (a Dict observation in its nested form, as steps give it).
        reset_fn: ``reset_fn([model,] seed, options)`` (prefixes such as ``reset_fn(model)`` are
            accepted). ``seed`` is ``reset(seed=)``'s, else the env's seed (``seed=``, ``set_seed``)
            at the first reset after it, as a gymnasium env's ``reset`` gets it, else ``None``: a
            reset_fn that draws at every reset takes ``generator=``. Keyword extras ``num_envs``
            (rows being reset), ``mask`` (bool ``(N,)``; in a batch-unlocked env every row is
            started, so it is all True) and ``generator`` (the
            env's :attr:`reset_generator`) are passed when declared. Returns one of the seed's
            reset forms (``obs``, ``(obs, info)``, ``(state, obs)``, ``(state, obs, info)``, a
            mapping), either unbatched (broadcast to the reset rows, info values included) or batched with exactly the
            rows being reset (``num_envs`` of them: not the whole batch on a partial reset). The
            state may be batched when the observation is not (or the reverse) if the env knows one
            row's state layout (``initial_state``, ``state_spec`` or, on partial resets, the other
            rows); otherwise they must agree. (One exception: next to an unbatched observation, a state
            whose leaves all lead with the rows being reset is per row when the reset_fn declares
            ``num_envs`` or ``mask``, else one row; the next step's error says so if that was wrong.)
        transition_fn: ``transition_fn([model,] state, action)`` (+ ``generator=``, the env's
            :attr:`generator`, and ``mask=``, a bool tensor of the batch shape, True for the rows
            stepped (all but those a ``"_step"`` mask freezes), when declared), called once per
            step for the whole batch. Returns one of the seed's transition forms; in those without
            a state (the 4-/5-tuples, a bare value) the observation is the next state, unless
            ``info["model_state"]`` holds it (a latent apart from the observation must come back
            there, or in the 6-tuple ``(state, obs, reward, terminated, truncated, info)``). The env puts
            back the frozen rows' outputs; a model that keeps a state of its own (a discovered
            ``model.step(action)``) needs ``mask=`` to leave those rows' state as it was.
        start_states: real data to start episodes from: a TensorDict ``[M]`` (or ``[B, T]``, every
            entry a start) holding the observation keys, a TorchRL replay buffer of them, or a dataset of
            :meth:`~torchrl_swm.World.collect` (:func:`~torchrl_swm.load_dataset`; its rows'
            observations). Each reset row samples one entry (row ``r``'s ``c``-th start: a hash of the seed, ``r`` and ``c``, so resetting
            some rows never changes the others' starts); its observation is the reset observation
            and its state is ``encode(observation)``. An encoder (or ``reset_fn``) that samples
            with ``generator=`` draws from :attr:`reset_generator` for all the rows reset together,
            so its draws, unlike the choice of start, depend on which rows reset when: encode
            deterministically (e.g. the posterior mean) where rows must not influence each other.
            Not with ``reset_fn``, ``initial_state`` or ``initial_observation``, which it replaces.
        encode_fn: ``encode_fn([model,] obs)`` -> state for real observations (``start_states``,
            ``initial_observation``). Default: ``model.encode`` when it exists, else identity.
            ``False`` forces identity.
        state_key: also expose the state in the tensordict under this key, and read it back
            from the input tensordict at each step (so rollouts can start from states held in a
            tensordict: planners, imagination from replayed latents), checked against its spec
            before the model runs. An observation key means "the observation is the state": a
            transform that rewrites it (``ObservationNorm``, ``CatFrames``) then changes the next
            step's state, so give such transforms ``out_keys`` of their own.
        state_spec: unbatched spec of the state under ``state_key``: a spec, a space, or a
            ``{key: spec}`` mapping for dict states (default: inferred from ``initial_state``).
            The shapes and dtypes of the state's tensor leaves are checked against it at every
            step and reset.
        reward_spec: unbatched reward spec, shape ``(1,)`` (default float32 Unbounded).
        info_spec: ``{key: spec, space or example tensor}`` (unbatched) for info entries to
            record under ``("info", key)`` with shape ``(N, 1, *shape)``, each with a presence mask
            ``("info_mask", key)`` (bool ``(N, 1)``, False where the model's return omitted the key,
            whose value then reads 0), as an ``EnvPool``'s declared keys. Other info keys
            trigger a one-time warning (never silently dropped).
        device: the model's device (default: where its parameters are; else CPU).
        differentiable: keep the autograd graph through steps and resets (Dreamer-style
            imagination); by default steps and resets run under ``torch.no_grad()``.
        seed: seed of the env's two ``torch.Generator``s, the model's and the resets' (OS entropy
            when ``None``).

    Attributes:
        state: the current model state of every row.
        generator: the model's ``torch.Generator``; transitions that take ``generator=`` receive it.
        reset_generator: the resets' ``torch.Generator`` (start sampling, ``reset_fn``, encoders):
            a reset of some rows never moves the model's stream.
        reward_from_model / terminated_from_model: whether the last transition returned a
            reward / a termination (the reward and terminal adapter transforms fill them in
            otherwise).

    Contract:
        * The model is called once per step on the whole batch (``(N, ...)`` tensors); with
          ``"_step"`` masks it still runs on every row and the frozen rows are put back. A
          batch-unlocked env's batch ``()`` or ``(B, C)`` reaches it (and its encoder and
          adapters) as ``N = 1`` or ``B * C`` rows.
        * The env never copies the state: step ``t``'s output *is* step ``t+1``'s input. The
          transition must return new tensors and must not modify its input state in place (an
          in-place update would also change tensors already handed to TorchRL).
        * Random actions (``rollout(policy=None)``, ``rand_action``) come from torch's global RNG,
          as everywhere in TorchRL; the env's generators drive the model and the resets.

    Examples:
        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl_swm import WorldModelEnv
        >>> class Model(torch.nn.Module):  # a toy latent dynamics: (state, action) -> (state, obs, reward)
        ...     def step(self, state, action):
        ...         state = torch.tanh(state + 0.1 * action.sum(-1, keepdim=True))
        ...         return state, state, state[:, 0]
        >>> env = WorldModelEnv(Model(), observation_space=Box(-1, 1, (8,)), action_space=Box(-1, 1, (2,)),
        ...                     num_envs=64, initial_state=torch.zeros(8), seed=0)
        >>> rollout = env.rollout(100, break_when_any_done=False)
        >>> rollout.batch_size, rollout["next", "observation"].shape
        (torch.Size([64, 100]), torch.Size([64, 100, 8]))
    """

    def __init__(
        self,
        model: Any,
        observation_space=None,
        action_space=None,
        *,
        num_envs: int | None = 1,
        initial_state: Any = None,
        initial_observation: Any = None,
        reset_fn: Callable | None = None,
        transition_fn: Callable | None = None,
        start_states: Any = None,
        encode_fn: Callable | bool | None = None,
        state_key: str | None = None,
        state_spec=None,
        reward_spec=None,
        info_spec: Mapping | None = None,
        device: torch.device | str | None = None,
        differentiable: bool = False,
        seed: int | None = None,
        **kwargs,
    ):
        if kwargs:
            _explain_kwargs(kwargs)
        model_device = _model_device(model)
        if device is None:
            device = model_device or torch.device("cpu")
        device = _resolve_device(device)
        if model_device is not None and model_device != device:
            raise ValueError(
                f"WorldModelEnv: device={device} but the model's parameters are on {model_device}; "
                "move the model (model.to(device)) or pass its device"
            )
        locked = num_envs is not None
        if locked:
            num_envs = check_int(num_envs, "WorldModelEnv: num_envs (or None, batch-unlocked)", minimum=1)
            batch_size = torch.Size([num_envs])
        else:
            batch_size = torch.Size([])
        super().__init__(batch_size=batch_size, device=device)
        if not locked:
            self._batch_locked = False  # instance attribute: EnvBase.__new__ sets it on the class
        self._locked = locked
        # not registered as a submodule: env.to()/state_dict() must not move or capture a model the caller owns
        self.__dict__["_model"] = model
        self._differentiable = check_bool(differentiable, "WorldModelEnv: differentiable")
        bad = _bad_state_leaf(initial_state, "initial_state")
        if bad is not None:
            path, value, in_sequence = bad
            hint = ""
            if isinstance(value, (bool, int, float, complex, np.generic)):  # a number (numpy's scalars too)
                hint = ("; a list or tuple is a state of several tensors: pass one tensor as torch.tensor([...])"
                        if in_sequence else "; pass it as a tensor, e.g. torch.tensor(value)")
            raise TypeError(f"{path}: expected tensors or arrays (a state's leaves), got {describe(value)}{hint}")
        # two streams: a partial reset never moves the model's, so rows that are not reset get the same noise
        self._generator = torch.Generator(device=device)  # the model's (steps)
        self._reset_generator = torch.Generator(device=device)  # the resets' (start sampling, reset_fn, encoders)
        self._set_seed(seed)

        # -- specs -------------------------------------------------------------------------
        if observation_space is None or action_space is None:
            raise TypeError(
                "WorldModelEnv: observation_space= and action_space= are required (gymnasium spaces or TorchRL specs)"
            )
        _refuse_start(observation_space, "observation_space")
        obs_spec = self._unbatched(observation_space, "observation_space")
        _refuse_start(action_space)
        act_spec = self._unbatched(action_space, "action_space", action=True)
        self._obs_is_mapping = isinstance(obs_spec, Composite)
        if self._obs_is_mapping:
            obs_leaves = [
                _Leaf(_leaf_key(k), s.shape, s.dtype, f"observation[{k!r}]")
                for k, s in obs_spec.items(include_nested=True, leaves_only=True)
            ]
            if not obs_leaves:
                raise SpecError("observation_space: an empty Dict/Composite has no observation to emit")
            obs_root = obs_spec
        else:
            obs_leaves = [_Leaf(("observation",), obs_spec.shape, obs_spec.dtype, "observation")]
            obs_root = Composite(observation=obs_spec, device=device)
        self._obs_leaves = obs_leaves
        self._obs_leaf = obs_leaves[0] if not self._obs_is_mapping else None
        self._obs_top_keys = frozenset(obs_root.keys())
        clash = sorted(str(k) for k in self._obs_top_keys if k in _RESERVED_KEYS or str(k).startswith("_"))
        if self._obs_is_mapping and clash:
            raise SpecError(
                f"observation_space: Dict keys {clash} clash with keys TorchRL or this env write themselves "
                f"({sorted(_RESERVED_KEYS)}, and keys starting with '_'); the entry would be lost or overwritten. "
                "Rename them (e.g. 'obs_info' for 'info')."
            )
        # a mapping with exactly these keys is the observation, even with reserved names (adapters.split_*)
        self._obs_keys = self._obs_top_keys if self._obs_is_mapping else None
        if isinstance(act_spec, Composite):
            # a Dict action space: one entry per key under "action"; the model receives td["action"] (a TensorDict)
            self._action_leaves = [
                _Leaf(("action", *_leaf_key(k)), s.shape, s.dtype, f"action[{k!r}]")
                for k, s in act_spec.items(include_nested=True, leaves_only=True)
            ]
        else:
            self._action_leaves = [_Leaf(("action",), act_spec.shape, act_spec.dtype, "action")]
        act_root = Composite(action=act_spec, device=device)
        self._action_leaf = self._action_leaves[0] if not isinstance(act_spec, Composite) else None
        # discrete leaves: (leaf, ActionRange), range-checked every step
        leaf_specs = [act_spec] if self._action_leaf is not None else [
            act_spec[leaf.key[1:]] for leaf in self._action_leaves
        ]
        self._action_checks = [
            (leaf, check) for leaf, spec in zip(self._action_leaves, leaf_specs, strict=True)
            if (check := ActionRange.of(spec)) is not None
        ]
        if reward_spec is None:
            reward_spec = Unbounded(shape=(1,), dtype=torch.float32, device=device)
        else:
            reward_spec = self._unbatched(reward_spec, "reward_spec")
            if isinstance(reward_spec, Composite) or tuple(reward_spec.shape) != (1,):
                raise SpecError(f"reward_spec: expected a leaf spec of shape (1,), got {reward_spec}")
        self._reward_dtype = reward_spec.dtype

        # state exposed in the tensordict
        if state_key is not None and (not isinstance(state_key, str) or not state_key):
            raise TypeError(f"state_key: expected a (top-level) key name, got {state_key!r}")
        if not locked and state_key is None:
            raise TypeError(
                "WorldModelEnv(num_envs=None) is batch-unlocked: its state must come from the input tensordict, "
                "so pass "
                "state_key= (an observation key when the observation is the state, e.g. state_key='observation')"
            )
        self._state_key = state_key
        self._obs_is_state = False
        state_entry = None
        if self._state_key is not None:
            skey = _leaf_key(self._state_key)
            obs_keys = {leaf.key for leaf in obs_leaves}
            if skey in obs_keys or (len(skey) == 1 and skey[0] in self._obs_top_keys):
                if state_spec is not None:
                    raise SpecError(
                        f"state_key={state_key!r} is an observation key: its spec is the observation's; "
                        "drop state_spec="
                    )
                self._obs_is_state = True
                if self._obs_is_mapping:
                    raise SpecError(
                        f"state_key={state_key!r} names one entry of a Dict observation; the state must then be "
                        "exposed under its own key (with state_spec=)"
                    )
            else:
                if skey[0] in _RESERVED_KEYS:
                    raise SpecError(f"state_key={state_key!r} collides with a reserved TorchRL key")
                if state_spec is None:
                    if initial_state is None or start_states is not None:  # start_states: no initial_state (below)
                        raise SpecError(
                            f"state_key={state_key!r}: pass state_spec= (the unbatched spec of the state)"
                            + ("" if start_states is not None else " or initial_state= (to infer it)")
                        )
                    state_spec = _spec_of_state(_to_device(initial_state, device), device, "initial_state")
                elif isinstance(state_spec, Mapping):
                    state_spec = self._unbatched(_composite(state_spec, device), "state_spec")
                else:
                    state_spec = self._unbatched(state_spec, "state_spec")
                state_entry = state_spec
        self._state_spec_unbatched = state_entry

        # info entries
        self._info_leaves = self._info_layout(info_spec, device)
        self._warned_info: set = set()

        bs = tuple(batch_size)
        observation_spec = Composite(shape=batch_size, device=device)
        for key, spec in obs_root.items():
            observation_spec[key] = batch_spec(spec, bs)
        if state_entry is not None:
            observation_spec[self._state_key] = batch_spec(state_entry, bs)
        if self._info_leaves:
            # each declared key gets a presence mask, as an EnvPool's declared keys: a model may omit a key
            info = Composite(shape=batch_size, device=device)
            info_mask = Composite(shape=batch_size, device=device)
            for leaf in self._info_leaves:
                info[leaf.key[1:]] = Unbounded(shape=(*bs, 1, *leaf.shape), dtype=leaf.dtype, device=device)
                info_mask[leaf.key[1:]] = Categorical(2, shape=(*bs, 1), dtype=torch.bool, device=device)
            observation_spec["info"] = info
            observation_spec["info_mask"] = info_mask
        self.observation_spec = observation_spec
        if self._state_key is not None:
            # read back from the input at each step: an input of the env, as in TorchRL's Pendulum, so that
            # ParallelEnv and other input-spec-driven wrappers hand the caller's state to the env
            self.state_spec = Composite(
                {self._state_key: observation_spec[self._state_key].clone()}, shape=batch_size, device=device
            )
        full_action = Composite(shape=batch_size, device=device)
        for key, spec in act_root.items():
            full_action[key] = batch_spec(spec, bs)
        self.full_action_spec = full_action
        self.reward_spec = batch_spec(reward_spec, bs)
        self.done_spec = Composite(
            {key: Categorical(2, shape=(*bs, 1), dtype=torch.bool, device=device) for key in _DONE_KEYS},
            shape=batch_size,
            device=device,
        )
        self._flat_mdp = all(isinstance(k, str) for k in self.observation_spec.keys(True, True))
        self._mdp_excluded = frozenset(("next", "_reset", "reward", *_DONE_KEYS))
        # the fused step_and_maybe_reset runs the env's own step and reset: a subclass's _step or _reset
        # (shaping, extra keys) takes TorchRL's generic path, which calls them
        self._own_step_and_reset = (type(self)._step is WorldModelEnv._step
                                    and type(self)._reset is WorldModelEnv._reset)

        # -- adapters (bound once) ------------------------------------------------------------
        gen_extra = {"generator": self._generator, "mask": None}
        if transition_fn is not None:
            self._transition: Bound = bind(
                transition_fn, "transition_fn", ("state", "action"), model=model, extras=gen_extra
            )
        else:
            self._transition = discover_transition(model, extras=gen_extra)
        self._encode = self._bind_encode(model, encode_fn)
        if self._obs_is_state and initial_state is not None and initial_observation is not None:
            raise SpecError(
                f"state_key={state_key!r} declares that the observation is the state: pass initial_state= or "
                "initial_observation=, not both (the first step would read the observation back and lose the state), "
                "or a state_key of its own (e.g. state_key='latent', with state_spec=) to keep a separate state"
            )
        if isinstance(initial_state, TensorDictBase) and initial_state.batch_dims:
            # a batch size would be broadcast again, to (num_envs, *batch_size): say so now, not at the first step
            raise ValueError(
                f"initial_state: one env's state, broadcast to every env; got a TensorDict with batch_size "
                f"{list(initial_state.batch_size)}. Pass it with batch_size=[] (e.g. initial_state[0]), or give each "
                "env its own start with reset_fn= or start_states="
            )
        self._initial_state = None if initial_state is None else _to_device(initial_state, device)
        self._initial_obs = None
        if initial_observation is not None:
            initial_observation = _to_device(initial_observation, device)
            try:
                self._initial_obs = self._read_obs(initial_observation, (), "initial_observation", None)
            except ReturnFormError as err:
                hint = _float64_start_hint(err, initial_observation)
                if not hint:
                    raise
                raise ReturnFormError(f"{err}{hint}") from err
        reset_extras = {"num_envs": None, "mask": None, "generator": self._reset_generator}
        self._start_data = None
        self._reset_bound: Bound | None = None
        if start_states is not None:
            if reset_fn is not None:
                raise TypeError("WorldModelEnv: pass reset_fn= or start_states=, not both")
            given = " and ".join(f"{name}=" for name, value in (("initial_state", initial_state),
                                 ("initial_observation", initial_observation)) if value is not None)
            if given:  # each start is a sampled observation, encoded: a constant start would never be used
                raise TypeError(
                    f"WorldModelEnv: pass {given} or start_states=, not both: with start_states= every "
                    "episode starts from a sampled observation, encoded by model.encode / encode_fn (or taken as the "
                    "state), so the constant start would be ignored"
                )
            self._start_kind = "data"
            self._start_data = self._check_start_data(start_states)
            if self._obs_is_state and self._encode is not None:
                self._refuse_encoded_start("start_states")  # said now, not at the first reset
        elif reset_fn is not None:
            self._start_kind = "fn"
            self._reset_bound = bind(
                reset_fn, "reset_fn", ("seed", "options"), model=model, extras=reset_extras, prefix_forms=True
            )
        elif initial_state is not None or initial_observation is not None:
            self._start_kind = "constant"
        else:
            name, method = discover_method(model, RESET_METHODS)
            if method is None:
                raise TypeError(
                    "WorldModelEnv needs a way to start episodes: pass initial_state=, initial_observation=, reset_fn= "
                    f"or start_states=, or give the model one of the methods {', '.join(RESET_METHODS)}"
                )
            self._start_kind = "fn"
            self._reset_bound = bind(
                method, f"model.{name}", ("seed", "options"), with_model=False, extras=reset_extras, prefix_forms=True
            )

        # -- runtime state (a plain object: nn.Module.__setattr__ is too slow for per-step updates) --
        self._rt = _Runtime()
        self._dev = device
        self._where = self._transition.description
        self._transition_takes_mask = "mask" in self._transition.extras
        self._shape_cache: dict = {}
        self._locked_shapes = self._shapes(batch_size) if locked else None
        self._simple_source = (
            not self._obs_is_mapping and (self._state_key is None or self._obs_is_state) and not self._info_leaves
        )
        # top-level keys a reset writes (observation entries, state, info, flags)
        self._reset_produced = frozenset(
            (
                *self._obs_top_keys,
                *(() if self._state_key is None else (self._state_key,)),
                *(("info", "info_mask") if self._info_leaves else ()),
                *_DONE_KEYS,
            )
        )
        self._constant_full = None
        if self._start_kind == "constant" and locked:
            # Validated now (without grad and without using up the generator's stream). The broadcast start
            # is cached only when it cannot change: an encoded start depends on the model (trained later,
            # maybe stochastic: it is encoded at each reset, with the env's generator) and a start that
            # requires grad (a learned initial state) is rebuilt so that resets see its current value.
            cacheable = (self._initial_state is not None or self._encode is None) and not any(
                t.requires_grad for _, t in (*_tree.leaves(self._initial_state), *_tree.leaves(self._initial_obs))
            )
            rng = self._reset_generator.get_state()
            with torch.no_grad():
                start = self._constant_start(bs)
            self._reset_generator.set_state(rng)
            if cacheable:
                self._constant_full = start  # never handed out: resets clone it or torch.where from it
        self.is_closed = False  # TorchRL's EnvBase starts closed; only its wrappers say otherwise

    # -- construction helpers ------------------------------------------------------------------
    def _unbatched(self, space, name, action: bool = False) -> TensorSpec:
        spec = as_spec(space, device=self.device, name=name, action=action)
        if isinstance(spec, Composite) and tuple(spec.shape) != ():
            raise SpecError(
                f"{name}: expected an unbatched (per-env) spec, got a Composite of shape {tuple(spec.shape)}"
            )
        return spec

    def _info_layout(self, info_spec, device) -> list[_Leaf]:
        if not info_spec:
            return []
        if not isinstance(info_spec, Mapping):
            raise SpecError(
                f"info_spec: expected a mapping {{key: spec, space or example tensor}}, got {describe(info_spec)}"
            )
        out = []
        for key, value in info_spec.items():
            if isinstance(value, torch.Tensor):
                shape, dtype = tuple(value.shape), value.dtype
            else:
                spec = as_spec(value, device=device, name=f"info_spec[{key!r}]")
                if isinstance(spec, Composite):
                    raise SpecError(f"info_spec[{key!r}]: nested info is not supported; declare its leaves")
                shape, dtype = tuple(spec.shape), spec.dtype
            out.append(_Leaf(("info", key), shape, dtype, f"info[{key!r}]"))
        return out

    def _bind_encode(self, model, encode_fn) -> Bound | None:
        if encode_fn is False:
            return None
        if encode_fn is not None and encode_fn is not True:
            return bind(encode_fn, "encode_fn", ("obs",), model=model, extras={"generator": self._reset_generator})
        method = getattr(model, "encode", None)
        if callable(method):
            try:
                return bind(method, "model.encode", ("obs",), with_model=False,
                            extras={"generator": self._reset_generator})
            except AdapterError as err:
                if encode_fn is True:
                    raise
                # the env still builds: a start given as a state never encodes; the error comes when one must
                return Bound(_RaiseWhenCalled(err), ("obs",), (), "model.encode (not callable as encode(obs))", method)
        if encode_fn is True:
            raise TypeError("encode_fn=True but the model has no encode method")
        return None

    def _check_start_data(self, data):
        from ..data import WorldDataset

        if isinstance(data, WorldDataset):  # a dataset of World.collect: its transitions' observations
            if data.td is None:
                raise ValueError(f"start_states: the dataset at {str(data.path)!r} holds no episodes")
            data = data.td
        if isinstance(data, TensorDictBase):
            if data.batch_dims < 1 or data.batch_size.numel() < 1:  # [B, 0] too: no entry to start from
                raise ValueError(
                    "start_states: expected a TensorDict with a leading batch dim of entries (at least one), "
                    f"got batch {data.batch_size}"
                )
            if data.batch_dims > 1:  # a collector batch [num_envs, T]: every (env, t) entry is a start
                valid = self._padding_mask(data)
                data = data[valid] if valid is not None else data.reshape(-1)
                if data.batch_size[0] < 1:
                    raise ValueError(
                        "start_states: its padding mask (split_trajs / split_trajectories) selects no entry"
                    )
            missing = [leaf.key for leaf in self._obs_leaves if _get_nested(data, leaf.key) is None]
            if missing:
                raise KeyError(
                    f"start_states: missing observation keys {missing}; it has {sorted(data.keys(True, True), key=str)}"
                )
            return data
        if hasattr(data, "storage") and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
            return data  # a TorchRL replay buffer
        raise TypeError(
            "start_states: expected a TensorDict, a TorchRL replay buffer or a dataset of World.collect "
            f"(load_dataset), got {describe(data)}"
        )

    def _padding_mask(self, data: TensorDictBase) -> torch.Tensor | None:
        """The real entries of a ``[B, T]`` batch that ``split_trajs=True`` / ``split_trajectories()`` padded.

        Their mask is ``("collector", "mask")`` (a collector's ``split_trajs=True``), or sits next to
        trajectory ids under any prefix (``split_trajectories(td, trajectory_key=...)``); a ``"mask"``
        that is one of the observation keys is data, not padding.
        """
        obs_keys = {leaf.key for leaf in self._obs_leaves}
        keys = [(key,) if isinstance(key, str) else tuple(key) for key in data.keys(True, True)]
        candidates = [("collector", "mask")] + [(*key[:-1], "mask") for key in keys if key[-1] == "traj_ids"]
        for mask_key in candidates:
            mask = data.get(mask_key, None)
            if mask_key not in obs_keys and isinstance(mask, torch.Tensor) and mask.dtype is torch.bool \
                    and mask.shape == data.shape:
                return mask
        return None

    # -- public read-only views -----------------------------------------------------------------
    @property
    def model(self):
        """The world model."""
        return self._model

    @property
    def state(self):
        """The current model state of every row (``None`` before the first reset)."""
        return self._rt.state

    @property
    def reward_from_model(self) -> bool:
        """Whether the last transition returned a reward (else the reward is 0 or the RewardAdapter's)."""
        return self._rt.reward_from_model

    @property
    def terminated_from_model(self) -> bool:
        """Whether the last transition returned a termination (else False or the TerminalAdapter's)."""
        return self._rt.terminated_from_model

    @property
    def generator(self) -> torch.Generator:
        """The model's ``torch.Generator``, passed to a transition that takes ``generator=``.

        Seeded by ``set_seed`` / ``seed=``, as :attr:`reset_generator`.
        """
        return self._generator

    @property
    def reset_generator(self) -> torch.Generator:
        """The resets' ``torch.Generator``: start sampling, ``reset_fn``/encoders that take ``generator=``.

        Separate from :attr:`generator`, so that resetting some rows never changes the noise the
        model draws for the others (two same-seed envs, one partially reset, agree on every other row).
        """
        return self._reset_generator

    @property
    def differentiable(self) -> bool:
        return self._differentiable

    @property
    def fixed_start(self) -> bool:
        """Whether every reset starts from the same cached start (``initial_state``/``initial_observation``,
        not encoded): a reset then gives the same values whenever it runs. Otherwise (``reset_fn``, an
        encoded start, ``start_states``) it depends on the model, the generator or the caller's state at
        the time, and the gymnasium export resets finished rows at the step gymnasium would."""
        return self._constant_full is not None

    def detach_state(self) -> None:
        """Cut the autograd graph of what the env keeps between steps (the state, the last observation
        and info), for truncated backpropagation through time with ``differentiable=True``.

        ``td.detach()`` detaches the caller's tensordict, but the env keeps its own state (unless it
        reads it from the tensordict, ``state_key=``): after a ``backward()``, the next steps would
        otherwise reach the freed graph. In place; returns ``None``, so ``env = env.detach_state()``
        fails loudly instead of swapping a ``TransformedEnv`` (which forwards the call here) for this
        bare env without its transforms.
        """
        rt = self._rt
        rt.state, rt.obs, rt.info = (_tree.tree_map(torch.Tensor.detach, x) for x in (rt.state, rt.obs, rt.info))

    @property
    def num_envs(self) -> int | None:
        return self.batch_size[0] if self._locked else None

    @property
    def transition(self) -> Bound:
        """The bound transition adapter (``.description`` tells how it is called)."""
        return self._transition

    # -- validation of adapter outputs -----------------------------------------------------------
    def _tensor(self, value, shape, dtype, name, where, form):
        head = f"{where} returned {form}" if form else where
        if not isinstance(value, torch.Tensor):
            if isinstance(value, np.ndarray):
                value = torch.as_tensor(value, device=self.device)
            else:
                raise ReturnFormError(
                    f"{head}: {name}: expected a tensor of dtype {dtype} and shape {tuple(shape)}, "
                    f"got {describe(value)}"
                )
        if value.shape != shape or value.dtype != dtype:
            raise ReturnFormError(
                f"{head}: {name}: expected dtype {dtype} and shape {tuple(shape)}, got {describe(value)}"
            )
        if value.device != self.device:
            raise ReturnFormError(f"{head}: {name}: expected device {self.device}, got {value.device}")
        return value

    def _read_obs(self, obs, bs: tuple, where: str, form: str | None):
        """Validated observation: a tensor (single key) or ``{leaf key: tensor}``."""
        if not self._obs_is_mapping:
            leaf = self._obs_leaf
            return self._tensor(obs, (*bs, *leaf.shape), leaf.dtype, "observation", where, form)
        head = f"{where} returned {form}" if form else where
        want = {leaf.key for leaf in self._obs_leaves}
        if not isinstance(obs, (Mapping, TensorDictBase)):
            raise ReturnFormError(
                f"{head}: observation: expected a mapping with keys {sorted(want)}, got {describe(obs)}"
            )
        got = _mapping_leaf_keys(obs)
        if got != want:
            raise ReturnFormError(
                f"{head}: observation keys {sorted(got)} do not match the observation space {sorted(want)} "
                f"(missing {sorted(want - got)}, unexpected {sorted(got - want)})"
            )
        return {
            leaf.key: self._tensor(_get_nested(obs, leaf.key), (*bs, *leaf.shape), leaf.dtype, leaf.name, where, form)
            for leaf in self._obs_leaves
        }

    def _obs_batched(self, obs) -> bool | None:
        """For reset returns: True if ``obs`` has a leading batch dim, False if unbatched."""
        if self._obs_is_mapping:
            if not isinstance(obs, (Mapping, TensorDictBase)):
                return None
            leaf = self._obs_leaves[0]
            value = _get_nested(obs, leaf.key)
        else:
            leaf, value = self._obs_leaf, obs
        ndim = getattr(value, "ndim", None)
        if ndim is None:
            return None
        return ndim == len(leaf.shape) + 1

    @staticmethod
    def _one_per_env(value, bs, bs1, name, per, where, form, returned=None):
        """``value`` viewed as ``bs1`` (``(N, 1)``); it may come as ``bs1`` or ``bs`` (``(N,)``). ``returned``: what
        the model returned, when ``value`` is its conversion (numpy), for the error message."""
        if value.shape == bs1:
            return value
        if value.shape != bs:
            # a 0-d array is one value for the whole batch (a reduction, a squeeze of (1, 1)): never broadcast
            kind = ("numpy scalar" if isinstance(returned, np.generic)
                    else "0-d array" if isinstance(returned, np.ndarray) else "0-d tensor")
            hint = "" if value.ndim else (
                f"; a {kind} is one value for the whole batch (a reduction over the envs, or a squeeze of a (1, 1) "
                f"one?): return one {per} per env, or a Python {'bool' if per == 'flag' else 'number'} to give "
                "every env the same"
            )
            raise ReturnFormError(
                f"{where} returned {form}: {name}: expected shape {tuple(bs1)} or {tuple(bs)} "
                f"(one {per} per env), got {describe(value if returned is None else returned)}{hint}"
            )
        return value.view(bs1)

    def _check_device(self, value, name, where, form):
        if value.device != self.device:
            raise ReturnFormError(f"{where} returned {form}: {name}: expected device {self.device}, got {value.device}")

    def _flag(self, value, bs, bs1, name, where, form, returned=None):
        """``returned``: what the model returned, when ``value`` is its conversion (numpy), for error messages."""
        if value is MISSING or value is None:  # as a None reward: no head for it (terminal_fn= or False)
            return None
        if isinstance(value, torch.Tensor):
            if value.dtype is not torch.bool:
                raise ReturnFormError(
                    f"{where} returned {form}: {name}: expected a bool tensor of shape {tuple(bs1)} or {tuple(bs)}, "
                    f"got {describe(value if returned is None else returned)} "
                    "(threshold it, e.g. `logits > 0`)"
                )
            value = self._one_per_env(value, bs, bs1, name, "flag", where, form, returned)
            self._check_device(value, name, where, form)
            return value
        if isinstance(value, np.ndarray) or _batched_numpy_scalar(value, bs):  # numpy converts, then the same checks
            return self._flag(torch.as_tensor(np.asarray(value), device=self.device), bs, bs1, name, where, form,
                              value)
        if isinstance(value, (bool, np.bool_)):
            return torch.full(bs1, bool(value), dtype=torch.bool, device=self.device)
        raise ReturnFormError(
            f"{where} returned {form}: {name}: expected a bool tensor of shape {tuple(bs1)} or a bool, "
            f"got {describe(value)}"
        )

    def _reward(self, value, bs, bs1, where, form):
        if value is MISSING or value is None:
            return None
        if isinstance(value, (torch.Tensor, np.ndarray)) or _batched_numpy_scalar(value, bs):  # numpy converts
            returned = value  # named in errors as the model returned it
            if not isinstance(value, torch.Tensor):
                value = torch.as_tensor(np.asarray(value), device=self.device)
            value = self._one_per_env(value, bs, bs1, "reward", "reward", where, form, returned)
            if value.dtype != self._reward_dtype:
                raise ReturnFormError(
                    f"{where} returned {form}: reward: expected dtype {self._reward_dtype} (the reward spec), "
                    f"got {describe(returned)}; cast it in the model, or declare that dtype with "
                    f"reward_spec=Unbounded(shape=(1,), dtype={value.dtype})"
                )
            self._check_device(value, "reward", where, form)
            return value
        if _real(value):
            return torch.full(bs1, float(value), dtype=self._reward_dtype, device=self.device)
        raise ReturnFormError(
            f"{where} returned {form}: reward: expected a float tensor of shape {tuple(bs1)}, got {describe(value)}"
        )

    def _read_info(self, info, bs, where, form, broadcast: bool = False) -> dict | None:
        """The declared info leaves, ``(*bs, 1, *shape)``, and their presence masks, ``(*bs, 1)``, as
        ``{("info", key): value, ("info_mask", key): mask}`` (a key the model omitted reads 0, its mask
        False); ``broadcast``: a reset's unbatched return, whose one-row values (shaped like the leaf)
        are repeated over the rows, as its observation is."""
        if not info and not self._info_leaves:
            return None
        keys = set(info.keys()) if info else set()
        out = {}
        for leaf in self._info_leaves:
            name = leaf.key[1]
            full = (*bs, 1, *leaf.shape)
            if name in keys:
                value = info.get(name)
                if broadcast and isinstance(value, (torch.Tensor, np.ndarray, np.generic, int, float)):
                    one = torch.as_tensor(value, device=self.device)
                    if one.shape == leaf.shape:
                        value = one.expand(torch.Size((*bs, *leaf.shape))).clone()
                if isinstance(value, torch.Tensor) and value.shape == (*bs, *leaf.shape):
                    value = value.unsqueeze(len(bs))
                out[leaf.key] = self._tensor(value, full, leaf.dtype, f"info[{name!r}]", where, form)
            else:
                out[leaf.key] = torch.zeros(full, dtype=leaf.dtype, device=self.device)
            out["info_mask", name] = torch.full((*bs, 1), name in keys, dtype=torch.bool, device=self.device)
        undeclared = keys - {leaf.key[1] for leaf in self._info_leaves} - {"model_state"}
        if undeclared and not undeclared <= self._warned_info:
            self._warned_info |= undeclared
            warnings.warn(
                f"WorldModelEnv: {where} returned info keys {sorted(undeclared)} that are not recorded; declare them "
                "with info_spec={key: spec} to get them under ('info', key)",
                stacklevel=4,
            )
        return out if self._info_leaves else None

    # -- the step ----------------------------------------------------------------------------------
    def _shapes(self, bs) -> _Shapes:
        shapes = self._shape_cache.get(bs)
        if shapes is None:
            if len(self._shape_cache) > 64:
                self._shape_cache.clear()
            shapes = self._shape_cache[torch.Size(bs)] = _Shapes(self, bs)
        return shapes

    def _read_action(self, td, shapes: _Shapes):
        """A Dict action space's leaves, checked (a single action leaf is read inline in :meth:`_advance`)."""
        bs = tuple(shapes.bs)
        for leaf in self._action_leaves:
            value = td.get(leaf.key, None)
            if value is None:
                raise KeyError(f"WorldModelEnv.step: the input tensordict has no {leaf.key!r} action entry")
            if value.shape != (*bs, *leaf.shape) or value.dtype != leaf.dtype:
                raise ValueError(
                    f"WorldModelEnv.step: {leaf.name}: expected dtype {leaf.dtype} and shape {(*bs, *leaf.shape)}, "
                    f"got {describe(value)}"
                )
        return td.get("action")

    def _current_state(self, td, shapes: _Shapes):
        if self._state_key is not None:
            value = td.get(self._state_key, None)
            if value is not None:
                self._check_input_state(value, shapes)
                return value
            if not self._locked:
                raise KeyError(
                    f"WorldModelEnv (batch-unlocked): the input tensordict has no state under {self._state_key!r}; "
                    "seed the rollout with a tensordict holding it (or reset() first)"
                )
        rt = self._rt
        if not rt.has_state:
            raise RuntimeError("WorldModelEnv: call reset() before step()")
        return rt.state

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """TorchRL's ``step``; a batch-unlocked env keeps the rows a ``"_step"`` mask freezes (see
        :func:`step_keeping_frozen_rows`), as a batch-locked one does."""
        if self._locked or "_step" not in tensordict.keys():
            return super().step(tensordict)
        return step_keeping_frozen_rows(self, tensordict, super().step)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._locked:
            partial = tensordict.get("_step", None)
            return self._advance(tensordict, self._locked_shapes, partial)
        return self._advance(tensordict, self._shapes(tensordict.batch_size), None)

    def _step_mask(self, step_rows, bs) -> dict:
        """The transition's ``mask=`` extra: the rows stepped (all True without a partial ``"_step"``)."""
        if step_rows is None:
            return {"mask": torch.ones(bs, dtype=torch.bool, device=self._dev)}
        return {"mask": step_rows.clone()}

    def _advance(self, td, shapes: _Shapes, partial) -> TensorDict:
        """One step for the whole batch: the model is called once; returns the ``"next"`` TensorDict."""
        rt = self._rt
        if rt.state_guess is not None:
            return self._advance_after_guess(td, shapes, partial)
        # the "_step" mask is checked before the model runs (a stochastic model would draw for nothing)
        step_rows = None if partial is None else row_mask(partial, shapes.bs[0], "_step")
        # action
        if self._action_leaf is not None:
            action = td._get_str("action", None) if type(td) is TensorDict else td.get("action", None)
            if action is None or action.shape != shapes.action or action.dtype is not self._action_leaf.dtype:
                self._bad_action(td, action, shapes)
        else:
            action = self._read_action(td, shapes)
        if self._action_checks:
            action = self._check_action_values(td, action, step_rows, shapes.bs)
        # state
        if self._state_key is None and rt.has_state:
            state = rt.state
        else:
            state = self._current_state(td, shapes)
        state_in = state  # a row frozen by "_step" keeps it (with state_key: the caller's, maybe edited)
        # the model, once for the batch
        kwargs = self._step_mask(step_rows, shapes.rows) if self._transition_takes_mask else {}
        if shapes.nb == 1:
            call = self._transition.call
        else:  # a batch-unlocked env's batch () or (B, C): the model still gets (N, ...) rows
            call = functools.partial(_tree.call_on_rows, self._transition.call, shapes.bs)
        try:
            if self._differentiable or not torch.is_grad_enabled():
                result = call(state, action, **kwargs)
            else:
                torch._C._set_grad_enabled(False)
                try:
                    result = call(state, action, **kwargs)
                finally:
                    torch._C._set_grad_enabled(True)
        except Exception as err:
            _note_dtype_mismatch(err, self.model, state, action)
            note_raised_inside(err, self._transition, shapes.bs, state=state, action=action)
            raise
        where = self._where
        form, state, obs, reward, terminated, truncated, info = split_transition(result, where, self._obs_keys)
        if self._obs_is_state and state is not obs:
            self._separate_state(form, where)
        # a form without a state of its own makes the observation the next state (the seed's rule): a state
        # kept apart from the observation (initial_state=, an encoder, a reset's (state, obs)) would be lost
        state_from_obs = state is obs and not self._obs_is_state and state_in is not rt.obs
        dev = self._dev
        bs = shapes.bs
        bs1 = shapes.bs1
        # fast checks for the common case; the slow paths convert (numpy, (N,) -> (N, 1)) or raise
        if self._obs_leaf is None or not _exact(obs, shapes.obs, self._obs_leaf.dtype, dev):
            raw = obs
            obs = self._read_obs(obs, bs, where, form)
            if state is raw:
                # the observation converted (numpy leaves) is also the state; a Dict one in its nested form
                if not self._obs_is_mapping:
                    state = obs
                elif not isinstance(raw, TensorDictBase):
                    state = nest(obs)
        if state is not obs and state is not None:
            if type(state) is not torch.Tensor or state.shape[: shapes.nb] != bs:
                state = _to_device(state, dev, numpy_only=True)  # numpy leaves, as every other output may be
                try:
                    _tree.check_batch(state, tuple(bs), "next state")
                except (ValueError, TypeError) as err:
                    raise ReturnFormError(f"{where} returned {form}: {err}") from None
                state = _tree.with_batch(state, tuple(bs))
        if state_from_obs and not self._same_layout(state, state_in):
            if self._transition.form != ("action",):
                self._refuse_lost_state(state, state_in, form, where)
            # a model that keeps its own state (step(action)) never reads the env's: the one the reset gave stays
            state = state_in
        if shapes.state is not None:  # only with state_key (and its own spec): the state is an output
            self._check_state_spec(state, shapes.state, f"{where} returned {form}")
        rt.reward_from_model = rt.terminated_from_model = True
        if not _exact(reward, bs1, self._reward_dtype, dev):
            reward = self._reward(reward, bs, bs1, where, form)
            if reward is None:
                rt.reward_from_model = False
                reward = shapes.zero_reward()
        if not _exact(terminated, bs1, torch.bool, dev):
            terminated = self._flag(terminated, bs, bs1, "terminated", where, form)
            if terminated is None:
                rt.terminated_from_model = False
                terminated = shapes.false()
        if truncated is not MISSING and not _exact(truncated, bs1, torch.bool, dev):
            truncated = self._flag(truncated, bs, bs1, "truncated", where, form)
        if truncated is MISSING or truncated is None:
            truncated = shapes.false()
            done = terminated.clone()  # separate memory: an in-place write to done must not end an episode
        else:
            done = terminated | truncated
        if info or self._info_leaves:
            info = self._read_info(info, bs, where, form)
        else:
            info = None
        if step_rows is not None:
            rows = step_rows
            if not bool(rows.all()):
                if rt.term is None:
                    raise RuntimeError(
                        "WorldModelEnv.step: a '_step' mask freezes rows, which keep their last observation and "
                        "flags, but this env has not been reset yet (its state came from the tensordict): reset() "
                        "first, or step every row"
                    )
                # frozen rows keep their state, observation, flags and info, and report reward 0; the selects
                # build no graph unless the env is differentiable (a caller's state may require grad)
                with contextlib.nullcontext() if self._differentiable else torch.no_grad():
                    shared = obs is state and rt.obs is rt.state  # obs = state: one select serves both
                    self._check_mergeable(state, state_in, frozen=True)
                    state = _tree.where_rows(rows, state, state_in)
                    obs = state if shared else _tree.where_rows(rows, obs, rt.obs)
                    view = rows.view(-1, 1)
                    reward = torch.where(view, reward, torch.zeros((), dtype=reward.dtype, device=reward.device))
                    terminated = torch.where(view, terminated, rt.term)
                    truncated = torch.where(view, truncated, rt.trunc)
                    done = terminated | truncated
                    if info is not None:
                        last = rt.info or {}
                        info = {k: _tree.where_rows(rows, v, last[k] if k in last else torch.zeros_like(v))
                                for k, v in info.items()}
        rt.state = state
        rt.obs = obs
        rt.term = terminated
        rt.trunc = truncated
        rt.info = info
        rt.has_state = True
        if self._simple_source:
            source = {
                "observation": obs,
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "done": done,
            }
        else:
            source = self._source(obs, state, info)
            source["reward"] = reward
            source["terminated"] = terminated
            source["truncated"] = truncated
            source["done"] = done
        return TensorDict._new_unsafe(source, batch_size=bs, device=dev)

    def _separate_state(self, form, where):
        raise ReturnFormError(
            f"{where} returned {form} with a state apart from the observation, but state_key={self._state_key!r} "
            "declares that the observation is the state (the next step would read the observation back and lose "
            "the returned state). Return the state as the observation (one tensor for both), or pass a "
            "state_key of its own (e.g. state_key='latent', with state_spec=) to keep the state in the tensordict."
        )

    def _advance_after_guess(self, td, shapes: _Shapes, partial) -> TensorDict:
        """The first step after a reset that guessed its state's layout (see :meth:`_reset_state_batched`): an
        error says how the state was read, and a next state laid out as the other reading of the reset's state
        would have it (a model that took it the other way) is refused."""
        rt = self._rt
        guess, rt.state_guess = rt.state_guess, None
        before = (rt.state, rt.obs, rt.term, rt.trunc, rt.info)
        try:
            out = self._advance(td, shapes, partial)
            if rt.state is not None:
                got = _row_shapes(rt.state)
                _, _, reset_shapes, bs, per_row, _ = guess
                # one row's layout under the other reading: the whole reset state (read per row), or its
                # leaves past the reset rows (read as one row); never the state given, read the guessed way
                other = dict(reset_shapes) if per_row else _past_rows(reset_shapes, bs)
                if got == other:
                    given = _row_shapes(before[0])
                    rt.state, rt.obs, rt.term, rt.trunc, rt.info = before  # nothing moved
                    raise ReturnFormError(
                        f"{self._where} returned a next state laid out as {_shape_text(got)} (one row's leaves), "
                        f"not as the state it was given, {_shape_text(given)}: the layout of the reset's state "
                        "read the other way"
                    )
        except Exception as err:
            add_note(err, _state_guess_note(*guess))
            raise
        return out

    @staticmethod
    def _same_layout(state, state_in) -> bool:
        """Whether ``state`` has the row layout (keys, one row's shapes) of ``state_in`` (``None``: any)."""
        if type(state) is torch.Tensor and type(state_in) is torch.Tensor:
            return state.shape[1:] == state_in.shape[1:]  # the common case, decided without walking a tree
        return state_in is None or _row_shapes(state) == _row_shapes(state_in)

    @staticmethod
    def _refuse_lost_state(state, state_in, form, where) -> None:
        """Refuse a form whose next state is its observation (no state of its own) when the state the step
        was given is laid out differently: a latent kept apart from the observation, which would be lost."""
        got, ref = _row_shapes(state), _row_shapes(state_in)
        raise ReturnFormError(
            f"{where} returned {form}, whose next state is its observation, laid out as {_shape_text(got)} "
            f"(one row's leaves), but the state it was given is laid out as {_shape_text(ref)}: a state kept "
            "apart from the observation (initial_state=, an encoder, a reset's state) would be replaced by the "
            "observation. Return the next state with the observation: (state, obs, reward, terminated, "
            "truncated, info), a mapping with 'state', or info['model_state'] in the 4-/5-tuple forms"
        )

    def _check_action_values(self, td, action, step_rows, bs):
        """Refuse discrete actions outside their spec in the stepped rows (``step_rows``, bool ``(N,)``, or
        ``None``: all); returns the action the model gets (frozen rows' invalid actions, ignored, replaced by
        a valid placeholder: the model sees every row)."""
        stepped = None if step_rows is None else step_rows.reshape(bs)
        for leaf, check in self._action_checks:
            if self._action_leaf is not None:
                action = check.refuse(action, f"WorldModelEnv.step: {leaf.name}", stepped)
            else:
                value = td.get(leaf.key)
                checked = check.refuse(value, f"WorldModelEnv.step: {leaf.name}", stepped)
                if checked is not value:
                    action = action.clone(False)  # the caller's tensordict keeps its own values
                    action.set(leaf.key[1:], checked)
        return action

    def _bad_action(self, td, action, shapes):
        if action is None:
            raise KeyError(f"WorldModelEnv.step: the input tensordict has no 'action' entry (keys: {list(td.keys())})")
        raise ValueError(
            f"WorldModelEnv.step: action: expected dtype {self._action_leaf.dtype} and shape "
            f"{tuple(shapes.action)}, got {describe(action)}"
        )

    def _source(self, obs, state, info) -> dict:
        if self._obs_is_mapping:
            source = nest(obs)
        else:
            source = {"observation": obs}
        if self._state_key is not None and not self._obs_is_state:
            source[self._state_key] = state
        if info is not None:  # {("info", key): value, ("info_mask", key): mask}
            source["info"] = {key[1]: value for key, value in info.items() if key[0] == "info"}
            source["info_mask"] = {key[1]: value for key, value in info.items() if key[0] == "info_mask"}
        return source

    # -- resets ------------------------------------------------------------------------------------
    def _constant_start(self, bs: tuple):
        """(state, obs) for ``bs`` rows from initial_state / initial_observation (fresh tensors).

        Called at every reset unless the start is cached (see ``_constant_full``): an encoded
        start follows the current model and draws from the reset generator.
        """
        obs = None
        try:
            if self._initial_obs is not None:
                obs = _tree.broadcast_rows(self._initial_obs, bs)
            if self._initial_state is not None:
                state = _tree.broadcast_rows(self._initial_state, bs)
                state = self._check_state(state, bs, "initial_state")
            else:
                state = self._encode_obs(obs, bs, "initial_observation")  # checked there
            if obs is None:
                obs = self._read_obs(
                    state, bs, "initial_state (the observation too, since no initial_observation is given)", None
                )
        except (ReturnFormError, SpecError) as err:  # our checks' errors; a user encoder's own pass through
            if type(err) not in (ReturnFormError, SpecError):
                raise
            hint = _float64_start_hint(err, self._initial_state, self._initial_obs)
            if not self._start_looks_batched(bs):
                if hint:
                    raise type(err)(f"{err}{hint}") from err
                raise
            given = ", ".join(
                f"{name} of shape {_shape_text(_tree.shapes(value))}"
                for name, value in (("initial_state", self._initial_state), ("initial_observation", self._initial_obs))
                if value is not None
            )
            raise type(err)(
                f"{err}{hint}. Note: initial_state / initial_observation are one unbatched start (one row), broadcast to "
                f"the batch {tuple(bs)}; given: {given}. For a start per row, pass reset_fn= or start_states="
            ) from err
        return state, obs

    def _refuse_encoded_start(self, what: str):
        raise SpecError(
            f"state_key={self._state_key!r} declares that the observation is the state, but {what} would be encoded "
            f"into a start state apart from it ({self._encode.description}): the first step would read the "
            "observation back and lose the encoded state. Pass encode_fn=False (the observation is the state), "
            "or a state_key of its own (e.g. state_key='latent', with state_spec=) to keep the state."
        )

    def _start_looks_batched(self, bs) -> bool:
        """Whether initial_observation (or initial_state read as the observation) has a leading batch dim."""
        leaf = self._obs_leaf
        if leaf is None:
            return False
        value = self._initial_obs if self._initial_obs is not None else self._initial_state  # read as the obs
        return isinstance(value, torch.Tensor) and value.ndim == len(leaf.shape) + len(bs) \
            and tuple(value.shape[len(bs):]) == leaf.shape

    def _encode_obs(self, obs, bs, what):
        """The state for validated observations ``obs`` (rows ``bs``): ``encode(obs)``, or ``obs`` itself.

        Without an encoder a Dict observation is the state in its nested form, as a step returns it
        (``state["goal"]["xy"]``, never the flat ``state[("goal", "xy")]``).
        """
        if self._encode is None:
            return nest(obs) if self._obs_is_mapping else obs
        if self._obs_is_state:
            self._refuse_encoded_start(what)
        inputs = nest(obs) if self._obs_is_mapping else obs
        try:
            state = _tree.call_on_rows(self._encode.call, bs, inputs)  # grad: reset's
        except Exception as err:
            _note_dtype_mismatch(err, self.model, inputs, None, "observation")
            note_raised_inside(err, self._encode, bs, obs=inputs)
            raise
        if state is None:
            raise ReturnFormError(f"{self._encode.description} returned None for {what}; expected the encoded state")
        state = _to_device(state, self._dev, numpy_only=True)
        state = self._check_state(state, bs, f"{self._encode.description} (encoding {what})")
        return state

    def _check_state(self, state, bs, where):
        """``state`` checked against the batch ``bs`` (and the state spec), its TensorDicts given that batch."""
        try:
            _tree.check_batch(state, bs, "state")
        except (ValueError, TypeError) as err:
            raise ReturnFormError(f"{where}: {err}") from None
        state = _tree.with_batch(state, tuple(bs))
        if self._state_spec_unbatched is not None:
            self._check_state_spec(state, _state_layout(self._state_spec_unbatched, bs), where)
        return state

    def _check_input_state(self, value, shapes: _Shapes) -> None:
        """A state read back from the caller's tensordict (``state_key``) is checked before the model gets it,
        as actions are: a caller's mistake is named as such, not blamed on the model (or broadcast by it)."""
        where = "WorldModelEnv.step: the input tensordict's state"
        if self._obs_is_state:
            leaf = self._obs_leaf
            if not (  # any tensor: a caller's state may be a Parameter (a learned start) or a MemoryMappedTensor
                isinstance(value, torch.Tensor)
                and value.shape == shapes.obs
                and value.dtype is leaf.dtype
                and value.device == self._dev
            ):
                raise ValueError(
                    f"{where} {self._state_key!r} (the observation, state_key={self._state_key!r}): expected dtype "
                    f"{leaf.dtype}, shape {tuple(shapes.obs)} and device {self._dev} (the observation spec), "
                    f"got {describe(value)}"
                )
        elif shapes.state is not None:
            self._check_state_spec(value, shapes.state, where, error=ValueError)

    def _check_state_spec(self, state, layout, where, error: type[Exception] = ReturnFormError):
        """Raise ``error`` unless the state's tensor leaves have the shapes and dtypes of the state spec
        (state_key)."""
        dev = self._dev
        for key, shape, dtype in layout:
            value = _get_nested(state, key) if key else state
            if not (
                isinstance(value, torch.Tensor)
                and value.shape == shape
                and value.dtype is dtype
                and value.device == dev
            ):
                if not isinstance(state, (torch.Tensor, Mapping, TensorDictBase)):  # a tuple has no leaf to name
                    raise error(f"{where}: {_STATE_UNDER_KEY} (state_key={self._state_key!r}), got "
                                f"{describe(state)}; {_STATE_UNDER_KEY_FIX}")
                name = f"state[{key[0] if len(key) == 1 else key!r}]" if key else "state"
                if isinstance(value, torch.Tensor) and value.shape == shape and value.dtype is dtype:
                    got = f"device {value.device}"
                else:
                    got = describe(value)
                raise error(
                    f"{where}: {name} (exposed under state_key={self._state_key!r}): expected dtype {dtype}, shape "
                    f"{tuple(shape)} and device {dev} (the state spec), got {got}"
                )

    def _start_indices(self, mask: torch.Tensor, n: int) -> torch.Tensor:
        """Entries of ``start_states`` (``n`` of them) for the rows in ``mask`` (bool ``(N,)``), one each.

        Row ``r``'s ``c``-th start is a hash of (seed, ``r``, ``c``), never a draw from a shared
        stream: resetting some rows leaves every other row's later starts unchanged (mask isolation),
        and the same seed gives the same starts whatever the reset order.
        """
        rows = mask.reshape(-1).nonzero().squeeze(-1)
        count = self._start_counts[rows]
        self._start_counts[rows] = count + 1
        x = self._start_key + rows * _ROW_STRIDE + count * _COUNT_STRIDE  # int64, wraps
        for shift, mult in ((30, _MIX1), (27, _MIX2)):  # splitmix64's finalizer, in int64 arithmetic
            x = (x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))) * mult
        x = x ^ ((x >> 31) & ((1 << 33) - 1))
        return (x & (2**63 - 1)) % n

    def _sampled_start(self, k: int, bs: tuple, mask, seed, options):
        """(state, obs, info) for ``bs`` (= ``(k,)`` when locked) rows from reset_fn / model reset / start data.

        Also the start from initial_state / initial_observation when it is not cached (it is encoded).
        """
        if self._start_kind == "constant":
            state, obs = self._constant_start(bs)
            return state, obs, None
        if self._start_kind == "data":
            n = len(self._start_data)
            if n < 1:
                raise ValueError("start_states: the replay buffer is empty; extend it before resetting")
            if self._locked:
                index = self._start_indices(mask, n)
            else:  # any batch shape: no row identity, so the reset generator
                gen = self._reset_generator
                index = torch.randint(n, (k,), generator=gen, device=gen.device)
            data = self._start_data
            storage = getattr(data, "storage", None)
            if not isinstance(data, TensorDictBase) and getattr(storage, "ndim", 1) > 1:
                # a (num_envs, T) buffer (LazyTensorStorage(..., ndim=2)): len() counts every entry but the
                # buffer's indexing walks the first dim only; index the storage in its own coordinates
                shape = tuple(storage.shape)
                if int(np.prod(shape)) != n:
                    raise ValueError(
                        f"start_states: a replay buffer with a {len(shape)}-d storage of shape {shape} holds {n} "
                        "entries; its layout is not one this env can sample: pass start_states=rb[:].reshape(-1)"
                    )
                rows = storage[torch.unravel_index(index.cpu(), shape)]
                rows = _as_buffer_returns(data, rows)
            else:
                rows = data[
                    index.to(data.device) if isinstance(data, TensorDictBase) and data.device is not None
                    else index.cpu()
                ]
            if isinstance(rows, TensorDictBase):
                rows = rows.to(self.device) if rows.device != self.device else rows
                if self._obs_is_mapping:
                    obs = {leaf.key: _get_nested(rows, leaf.key) for leaf in self._obs_leaves}
                else:
                    obs = rows.get("observation", None)
                    if obs is None:
                        raise KeyError(
                            f"start_states: sampled entries have no 'observation' key (keys: {list(rows.keys())})"
                        )
            elif isinstance(rows, torch.Tensor) and not self._obs_is_mapping:
                obs = rows.to(self.device)
            else:
                raise TypeError(
                    f"start_states: sampled entries are {describe(rows)}; expected a TensorDict or a tensor"
                )
            obs = self._read_obs(
                nest(obs) if self._obs_is_mapping else obs, bs, "start_states (sampled entries)", None
            )
            state = self._encode_obs(obs, bs, "start_states")
            return state, obs, None  # real data carries no model info: declared info keys start at zero
        bound = self._reset_bound
        kwargs = {}
        if "num_envs" in bound.extras:
            kwargs["num_envs"] = k
        if "mask" in bound.extras:
            kwargs["mask"] = mask.clone()  # the fn's own: a view of "_reset" or of done, read again after it
        # seed: reset(seed=)'s, else the env's seed (seed= / set_seed) once, at the first reset after it, as a
        # gymnasium env gets it; options: {} when none were given, as the seed design's reset (a fresh one: a
        # reset_fn may write to it); grad mode: the reset's (see _graph_free)
        if self._reset_fn_seed is not None:  # (nn.Module's __setattr__ is slow: only when set)
            if seed is None:
                seed = self._reset_fn_seed
            self._reset_fn_seed = None
        options = {} if options is None else options
        try:
            result = bound.call(seed, options, **kwargs)
        except Exception as err:
            note_raised_inside(err, bound, bs, seed=seed, options=options, **kwargs)
            raise
        where = bound.description
        form, state, obs, info = split_reset(result, where, self._obs_keys)
        if self._obs_is_state and state is not MISSING and obs is not MISSING and state is not obs:
            self._separate_state(form, where)  # the next step would read the observation back as the state
        if state is not MISSING:  # numpy leaves as tensors, as a step's state (and every other output) may be
            converted = _to_device(state, self._dev, numpy_only=True)
            obs, state = (converted if obs is state else obs), converted
        # what tells whether the state is batched: the returned observation, the state itself (obs = state),
        # or nothing (the observation is initial_observation's broadcast)
        obs_hint = "obs"
        if obs is MISSING:
            if self._initial_obs is not None:
                obs = _tree.broadcast_rows(self._initial_obs, bs)
                obs = nest(obs) if self._obs_is_mapping else obs
                obs_hint = None
            elif state is not MISSING:
                obs = state
                obs_hint = "same"
            else:
                raise ReturnFormError(f"{where} returned {form}: no observation, no state and no initial_observation")
        batched = self._obs_batched(obs)
        if batched is None:
            raise ReturnFormError(
                f"{where} returned {form}: observation: expected {self._expect_obs()}, got {describe(obs)}"
            )
        if not batched:
            obs = self._read_obs(obs, (), where, form)
            obs = _tree.broadcast_rows(obs, bs)
        else:
            self._check_reset_rows(obs, bs, bound, where, form)
            obs = self._read_obs(obs, bs, where, form)
        if state is MISSING:
            if self._obs_is_state and self._initial_state is not None and obs_hint is not None:
                self._separate_state(form, f"{where} (with initial_state=)")
            state = (
                _tree.broadcast_rows(self._initial_state, bs)
                if self._initial_state is not None
                else self._encode_obs(obs, bs, where)
            )
        else:
            if obs_hint == "same":
                state_batched = batched
            else:
                hint = batched if obs_hint == "obs" else None
                knows_rows = "num_envs" in bound.extras or "mask" in bound.extras
                state_batched = self._reset_state_batched(state, bs, hint, where, form, knows_rows)
            if not state_batched:
                state = _tree.broadcast_rows(state, bs)
            state = self._check_state(state, bs, f"{where} returned {form}")
        info = self._read_info(info, bs, where, form, broadcast=not batched) if info or self._info_leaves else None
        return state, obs, info

    def _check_reset_rows(self, obs, bs, bound, where, form):
        """A batched reset return must hold one row per reset row: say so clearly (e.g. N rows for k)."""
        leaf = self._obs_leaves[0]
        value = _get_nested(obs, leaf.key) if self._obs_is_mapping else obs
        rows = tuple(value.shape[: len(bs)])
        if rows == tuple(bs):
            return
        hint = ""
        if "num_envs" not in bound.extras and "mask" not in bound.extras:
            hint = (
                "; declare a num_envs parameter to receive the number of rows to return, or mask to receive the "
                "bool (num_envs,) mask of the rows being reset"
            )
        full = " (the whole batch)" if self._locked and rows == tuple(self.batch_size) else ""
        raise ReturnFormError(
            f"{where} returned {form}: observation: expected {bs[0] if len(bs) == 1 else tuple(bs)} row(s), one per "
            f"row being reset (leading dims {tuple(bs)}), or an unbatched observation (broadcast to them); got "
            f"{describe(value)}{full}{hint}"
        )

    def _state_reference(self, partial: bool) -> dict | None:
        """``{path: shape}`` of one row of the state, when known: the state spec, initial_state, or the live state."""
        if self._state_spec_unbatched is not None:
            return {key: shape for key, shape, _ in _state_layout(self._state_spec_unbatched, ())}
        if self._initial_state is not None:
            return _tree.shapes(self._initial_state)
        rt = self._rt
        if partial and rt.has_state and rt.state is not None:
            # a partial reset: the other rows' state shows one row's layout
            return {path: shape[1:] for path, shape in _tree.shapes(rt.state).items()}
        return None

    def _reset_state_batched(self, state, bs, obs_batched, where, form, knows_rows: bool = False) -> bool:
        """Whether a reset's state already has the reset rows ``bs``, decided for the state itself.

        With a known layout of one row (:meth:`_state_reference`) the shapes decide. Otherwise the
        state follows the observation (``obs_batched``), except next to an unbatched observation from a
        reset_fn told the number of rows it resets (``knows_rows``: it declares ``num_envs`` or ``mask``):
        its state is per row when every leaf leads with those rows (never broadcast again into
        ``(k, k, ...)``). With no observation of the reset's own (``obs_batched`` ``None``:
        initial_observation's), a reset_fn told its rows returns them; otherwise a state whose leaves all
        lead with the rows is per row (a guess) and any other is one row.
        """
        try:
            got = _tree.shapes(state)
        except TypeError as err:
            raise ReturnFormError(f"{where} returned {form}: {err}") from None
        if not got:
            return True  # no tensors (e.g. None: the model keeps its own state): nothing to broadcast
        partial = self._locked and bs[0] < self.batch_size[0]
        ref = self._state_reference(partial)
        bs = torch.Size(bs)
        rows = bs[0] if len(bs) == 1 else tuple(bs)
        if ref is not None:
            if got.keys() == ref.keys():
                if all(got[p] == ref[p] for p in ref):
                    return False
                if all(got[p] == bs + ref[p] for p in ref):
                    return True
            if partial and self._state_spec_unbatched is None and self._initial_state is None:
                # the layout is the other rows' state, which the transition returned: either may be the one wrong
                raise ReturnFormError(
                    f"{where} returned {form}: state leaves {_shape_text(got)} are neither one row of the other "
                    f"rows' state, which {self._where} returned, {_shape_text(ref)} (unbatched, broadcast), nor "
                    f"{rows} rows of it (batched, leading dims {tuple(bs)}). {_PARTIAL_MERGE[0].upper()}"
                    f"{_PARTIAL_MERGE[1:]}: a transition must return its next state with the layout of the state "
                    "it was given, and a reset must start it with that layout"
                )
            raise ReturnFormError(
                f"{where} returned {form}: state leaves {_shape_text(got)} are neither one row {_shape_text(ref)} "
                f"(unbatched, broadcast) nor {rows} rows of it (batched, leading dims {tuple(bs)})"
            )
        if obs_batched is False and all(shape[: len(bs)] == bs for shape in got.values()):
            # no known layout, an unbatched observation, and every leaf leads with the reset rows: a reset_fn
            # told how many rows it resets (num_envs=, mask=) returns a per-row state, one that is not returns one
            # row. A guess either way (an unbatched (4,) state for 4 rows): the next step says so if it fails.
            if self._locked:  # (a batch-unlocked env's steps take their state from the tensordict)
                # said by the next step if it fails
                self._rt.state_guess = (where, form, got, bs, knows_rows, "returned")
            return knows_rows
        if obs_batched is None:
            # the observation is initial_observation's broadcast, so it says nothing. A reset_fn told the rows it
            # resets returns them (checked next); otherwise a state whose leaves do not all lead with the reset rows
            # is one row (the seed design's one-env state: broadcast), and one whose leaves do is read per row, a
            # guess (a (4,) state for 4 rows) the next step names if it fails
            if knows_rows:
                return True
            if not all(shape[: len(bs)] == bs for shape in got.values()):
                return False
            if self._locked:
                self._rt.state_guess = (where, form, got, bs, True, "initial")
            return True
        return obs_batched  # the state follows the observation (unbatched: broadcast)

    def _expect_obs(self) -> str:
        if self._obs_is_mapping:
            return f"a mapping with keys {sorted(leaf.key for leaf in self._obs_leaves)}"
        leaf = self._obs_leaf
        return f"a {leaf.dtype} tensor of shape {leaf.shape} (unbatched) or (num_envs, *{leaf.shape})"

    def _zero_info(self, bs):
        if not self._info_leaves:
            return None
        zeros = {leaf.key: torch.zeros((*bs, 1, *leaf.shape), dtype=leaf.dtype, device=self.device)
                 for leaf in self._info_leaves}
        absent = {("info_mask", leaf.key[1]): torch.zeros((*bs, 1), dtype=torch.bool, device=self.device)
                  for leaf in self._info_leaves}
        return {**zeros, **absent}

    def _false_flags(self, shape):
        """Three all-False flag tensors (separate memory: in-place writes to one never reach another)."""
        false = self._shapes(shape[:-1]).false
        return false(), false(), false()

    def _reset_state(self, rows, seed=None, options=None, *, flags_cleared=False):
        """Restart ``rows`` (bool ``(N,)`` or ``(N, 1)``, or ``None`` for all) of a locked env: updates its state.

        Returns ``(obs, state, info)`` for every row (restarted rows new, the others unchanged).
        ``flags_cleared``: the caller resets every done row, so no flag stays True (fast path).
        Runs without grad unless the env is differentiable (as steps do), so a start state that
        requires grad (a learned ``initial_state``) reaches the outputs detached.
        """
        return self._graph_free(self._restart, rows, seed, options, flags_cleared)

    def _graph_free(self, fn, *args):
        """``fn(*args)`` without grad unless the env is differentiable: how every reset runs (steps
        do the same inline). Encoders and reset functions called inside need no mode of their own."""
        if self._differentiable or not torch.is_grad_enabled():
            return fn(*args)
        torch._C._set_grad_enabled(False)
        try:
            return fn(*args)
        finally:
            torch._C._set_grad_enabled(True)

    def _check_mergeable(self, returned, other, frozen: bool = False) -> None:
        """Refuse to merge rows of the state the model ``returned`` with rows of ``other`` laid out differently:
        the start state of a partial reset, or (``frozen``) the state the step was given, which a '_step' mask
        keeps for the frozen rows.

        A row merge walks one state's leaves, so a key only the other state has would be dropped from
        every row (the rows not reset included), and a row shape that changed would fail deep in torch.
        Dtypes may differ (a model stepping in mixed precision): the merge promotes them, as ``torch.where``.
        """
        if returned is None or other is None:
            return  # the model keeps its own state: nothing merged here
        if type(returned) is torch.Tensor and type(other) is torch.Tensor:
            if returned.shape[1:] == other.shape[1:]:
                return  # the common case, decided without walking a tree
        got, ref = _row_shapes(returned), _row_shapes(other)
        # a frozen row keeps the leaves the step returned; a state it was given from the tensordict (an exposed
        # state_key's) may hold more, a caller's leaves: TorchRL's, not the model's (whose drops its spec refuses)
        if frozen and self._state_key is not None:
            mismatch = any(ref.get(p) != shape for p, shape in got.items())
        else:
            mismatch = got != ref
        if mismatch:
            why, other_name = (
                (_FROZEN_MERGE, "the state it was given") if frozen
                else (_PARTIAL_MERGE, f"the start state from {self._start_source()}")
            )
            raise ReturnFormError(
                f"WorldModelEnv: {why}, but {self._where} returned a state laid out as {_shape_text(got)} and "
                f"{other_name} is laid out as {_shape_text(ref)} (one row's leaves). A transition must return its "
                "next state with the layout of the state it was given: the same keys and shapes"
            )

    def _start_source(self) -> str:
        """What starts an episode, for messages."""
        if self._start_kind == "data":
            return "start_states"
        if self._start_kind == "fn":
            encoded = "" if self._encode is None else f" (or {self._encode.description}, on its observation)"
            return self._reset_bound.description + encoded
        if self._initial_state is not None:
            return "initial_state"
        if self._encode is not None:
            return f"{self._encode.description}, on initial_observation"
        return "initial_observation"

    def _restart(self, rows, seed, options, flags_cleared):
        """:meth:`_reset_state`'s body (run by :meth:`_graph_free`)."""
        rt = self._rt
        bs = self._locked_shapes.bs
        if rows is None:
            rt.state_guess = None  # (a guess of an earlier full reset no step has checked is moot)
            if self._constant_full is not None:
                c_state, c_obs = self._constant_full
                state = _tree.tree_map(torch.clone, c_state)  # fresh: outputs may be written in place by callers
                obs = state if c_obs is c_state else _tree.tree_map(torch.clone, c_obs)
                info = self._zero_info(bs)
            else:
                n = bs[0]
                state, obs, info = self._sampled_start(
                    n, bs, torch.ones(n, dtype=torch.bool, device=self._dev), seed, options
                )
                if info is None:
                    info = self._zero_info(bs)
            rt.term, rt.trunc, rt.done_after_reset = self._false_flags(self._locked_shapes.bs1)
            rt.state, rt.obs, rt.info, rt.has_state = state, obs, info, True
            return obs, state, info
        last_info = rt.info if rt.info is not None else self._zero_info(bs)
        shared = rt.obs is rt.state
        if self._constant_full is not None:
            c_state, c_obs = self._constant_full
            self._check_mergeable(rt.state, c_state)
            state = _tree.where_rows(rows, c_state, rt.state)
            obs = state if shared and c_obs is c_state else _tree.where_rows(rows, c_obs, rt.obs)
            info = None
            if last_info is not None:
                info = {k: _tree.zero_rows(rows, v) for k, v in last_info.items()}
        else:
            mask = rows.reshape(-1)
            index = mask.nonzero().squeeze(-1)
            k = int(index.numel())
            s_state, s_obs, s_info = self._sampled_start(k, (k,), mask, seed, options)
            self._check_mergeable(rt.state, s_state)
            state = s_state if rt.state is None else _tree.put_rows(rt.state, index, s_state)
            obs = state if shared and s_obs is s_state else _tree.put_rows(rt.obs, index, s_obs)
            info = None
            if last_info is not None:
                if s_info is None:
                    s_info = self._zero_info((k,))
                info = _tree.put_rows(last_info, index, s_info)
        if flags_cleared:
            rt.term, rt.trunc, rt.done_after_reset = self._false_flags(self._locked_shapes.bs1)
        else:
            keep = ~rows.view(-1, 1)  # (N, 1) like the flags
            rt.term = rt.term & keep
            rt.trunc = rt.trunc & keep
        rt.state, rt.obs, rt.info = state, obs, info
        return obs, state, info

    def _reset(self, tensordict: TensorDictBase | None = None, *, seed=None, options=None, **kwargs) -> TensorDictBase:
        if kwargs:
            raise TypeError(
                f"WorldModelEnv.reset: unexpected keyword arguments {sorted(kwargs)}; expected seed= and options="
            )
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if type(self.__dict__.get("_rt")) is _ClosedRuntime:
            if self._locked and mask is not None and not bool(row_mask(mask, self.batch_size[0], "_reset").all()):
                raise _closed_error()  # a partial reset would keep rows whose state is gone
            self.__dict__["_rt"] = _Runtime()  # reopened, as TorchRL's batched envs restart at their next reset
            self.is_closed = False
        if seed is not None:
            self._set_seed(seed)
        if not self._locked:
            bs = tuple(tensordict.batch_size) if tensordict is not None else tuple(self.batch_size)
            return self._graph_free(self._reset_unlocked, bs, seed, options)
        n = self.batch_size[0]
        rows = None if mask is None else row_mask(mask, n, "_reset")
        if rows is not None and not self._rt.has_state and not bool(rows.all()):
            # a first reset restarts every row; TorchRL's reset() then merges this output into the caller's
            # tensordict on the rows its "_reset" names (it pops it next), so every row must be named
            tensordict.set("_reset", torch.ones_like(mask))
            rows = None
        elif rows is not None and bool(rows.all()):
            rows = None
        if rows is None or bool(rows.any()):
            obs, state, info = self._reset_state(rows, seed, options)
        else:
            obs, state, info = self._rt.obs, self._rt.state, self._rt.info
        return self._reset_output(obs, state, info, self._rt.term, self._rt.trunc, tuple(self.batch_size))

    def _reset_unlocked(self, bs, seed, options) -> TensorDictBase:
        """A batch-unlocked reset: any batch shape ``bs``, every row started (TorchRL merges only the masked ones
        into the caller's tensordict), so a reset_fn's ``mask`` is all True (one flag per row, flattened)."""
        if self._start_kind == "constant":
            state, obs = self._constant_start(bs)
            info = self._zero_info(bs)
        else:
            k = int(np.prod(bs)) if bs else 1
            mask = torch.ones(k, dtype=torch.bool, device=self._dev)
            state, obs, info = self._sampled_start(k, (k,), mask, seed, options)
            same = obs is state
            state = _tree.unflatten_rows(state, bs)
            obs = state if same else _tree.unflatten_rows(obs, bs)
            info = self._zero_info(bs) if info is None else _tree.unflatten_rows(info, bs)
        self._rt.state, self._rt.obs, self._rt.has_state = state, obs, True
        term, trunc, _ = self._false_flags((*bs, 1))
        return self._reset_output(obs, state, info, term, trunc, bs)

    def _reset_output(self, obs, state, info, term, trunc, bs) -> TensorDictBase:
        source = self._source(obs, state, info)
        source["terminated"] = term
        source["truncated"] = trunc
        source["done"] = term | trunc
        return TensorDict._new_unsafe(source, batch_size=torch.Size(bs), device=self.device)

    def _set_seed(self, seed: int | None) -> None:
        self._reset_fn_seed = None if seed is None else _check_seed(seed)  # handed to reset_fn's next call
        if seed is None:
            self._generator.seed()
            self._reset_generator.seed()
        else:
            seed = _generator_seed(self._reset_fn_seed)  # checked before any generator changes
            self._generator.manual_seed(seed)
            # a stream of its own, hashed (seed + _RESET_STREAM >= 2**32): a CPU generator keeps 32 bits of its seed, so
            # a plain offset would make seed s's reset stream the model stream of seed s + 0x7F4A7C15
            self._reset_generator.manual_seed(_generator_seed(seed + _RESET_STREAM))
        # start_states entries: per-row counters from a key drawn from the reset stream (see _start_indices)
        device = self._reset_generator.device
        self._start_key = torch.randint(-(2**63), 2**63 - 1, (), generator=self._reset_generator, device=device)
        self._start_counts = torch.zeros(self.batch_size.numel() if self._locked else 0, dtype=torch.int64,
                                         device=device)

    # -- fast path: step -> step_mdp -> maybe_reset ---------------------------------------------------
    def _skip_tensordict(self, tensordict: TensorDictBase) -> TensorDictBase:
        # an all-False "_step" freezes every row: reward 0, as for any frozen row
        return zero_rewards(self, super()._skip_tensordict(tensordict))

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Equivalent to TorchRL's generic ``step`` -> ``step_mdp`` -> ``maybe_reset``, without its overhead.

        Used for plain ``TensorDict`` inputs of the env's batch size and device with no
        ``"next"`` entry, no all-False ``"_step"`` and only tensor or TensorDict entries;
        anything else, and a subclass with a ``_step`` or ``_reset`` of its own, takes
        TorchRL's generic path. A ``"_step"`` mask freezes rows as in
        :meth:`_step`; done rows are reset whether or not they were stepped, as TorchRL does.
        Differences from the generic path: none in the data (tests compare both); the reset
        runs :meth:`_reset_state` directly instead of ``reset(select_reset_only=True)`` +
        ``_update_during_reset``.
        """
        fused = self._fused_step(tensordict, None)
        return super()._step_and_maybe_reset(tensordict) if fused is None else fused

    def _step_then_reset(self, tensordict: TensorDictBase, rows: torch.Tensor):
        """``env.step(td)``, ``env.step_mdp(td)``, then ``env.reset`` of ``rows`` (bool ``(N,)``, passed as
        ``"_reset"`` with ``select_reset_only=True``), fused as :meth:`_step_and_maybe_reset` is: the same data
        without TorchRL's generic reset round trip. Returns ``(td, root)``, or ``None`` where only the generic
        calls apply (the same inputs as :meth:`_step_and_maybe_reset`'s generic path). The gymnasium export's
        NEXT_STEP path uses it: ``rows`` are frozen by ``"_step"`` and restarted after the others step."""
        return self._fused_step(tensordict, rows)

    def _fused_step(self, tensordict: TensorDictBase, reset_rows: torch.Tensor | None):
        """step -> step_mdp -> reset of the rows that finished (``reset_rows=None``: TorchRL's maybe_reset) or
        of ``reset_rows``; ``None`` when the input needs TorchRL's generic path."""
        if (
            type(tensordict) is not TensorDict
            or not self._locked
            or not self._own_step_and_reset
            or tensordict.device != self._dev
            or tensordict.batch_size != self._locked_shapes.bs
            or self._post_step_mdp_hooks is not None
            or self._run_type_checks
            or self.__dict__.get("_torchrl_native_autoreset", False)
        ):
            return None
        items = tensordict._tensordict
        partial = items.get("_step")
        if "next" in items or (partial is not None and (not isinstance(partial, torch.Tensor) or not partial.any())):
            return None  # an all-False "_step" skips the step in TorchRL
        excluded = self._mdp_excluded
        root = {}
        for key, value in items.items():
            if key in excluded:
                continue
            if isinstance(value, torch.Tensor):
                root[key] = value
            elif type(value) is TensorDict:
                root[key] = value.copy()  # step_mdp copies sub-tensordicts (shallow)
            else:
                return None
        # step
        next_td = self._advance(tensordict, self._locked_shapes, partial)
        tensordict._set_str("next", next_td, validated=True, inplace=False, non_blocking=False)
        next_items = next_td._tensordict
        # the rows to reset: those that finished (TorchRL's maybe_reset; every done flag is then cleared) or the
        # caller's (the flags of rows that finished now stay set). One host sync, as TorchRL's any_done
        rows = next_items["done"] if reset_rows is None else reset_rows.view(-1, 1)
        # half the cost of sum() at every batch size measured; one row: item() is a fifth of count_nonzero()
        n_rows = int(rows.item()) if rows.numel() == 1 else int(rows.count_nonzero())
        flags_cleared = reset_rows is None
        if self._flat_mdp:
            # step_mdp: root entries (action, policy outputs...) + next's observations and flags
            for key, value in next_items.items():
                if key != "reward":
                    root[key] = value
            if n_rows:
                self._reset_rows_into(root, rows, n_rows, flags_cleared)
            names = tensordict.names if tensordict._has_names() else None  # kept, as step_mdp keeps them
            return tensordict, TensorDict._new_unsafe(root, batch_size=self._locked_shapes.bs, device=self._dev,
                                                      names=names)
        out = self._step_mdp(tensordict)
        if n_rows:
            values = dict(out.items())
            self._reset_rows_into(values, rows, n_rows, flags_cleared)
            out.update(values)  # nested entries (Dict observations, TensorDict states) arrive as dicts
        return tensordict, out

    def _reset_rows_into(self, root: dict, rows: torch.Tensor, n_rows: int, flags_cleared: bool = True) -> None:
        """The fast path's reset: restart ``rows`` (bool ``(N, 1)``: broadcasts against ``(N, d)`` entries
        without a view) and write the result into ``root`` (in the dict). ``flags_cleared``: ``rows`` are
        every done row, so no done flag stays set."""
        everything = n_rows == self._locked_shapes.bs[0]
        obs, state, info = self._reset_state(None if everything else rows, flags_cleared=flags_cleared)
        rt = self._rt
        if self._simple_source:
            root["observation"] = obs
        else:
            source = self._source(obs, state, info)
            if not everything:
                for key, value in source.items():
                    old = root.get(key)
                    if isinstance(old, TensorDictBase) and isinstance(value, (Mapping, TensorDictBase)):
                        source[key] = _merge_reset_group(old, value, rows)
            root.update(source)
        if not everything:
            # as TorchRL's _update_during_reset: entries the reset does not produce are zeroed on reset rows
            produced = self._reset_produced
            for key, value in root.items():
                if key not in produced:
                    root[key] = _zeroed(value, rows)
        root["terminated"] = rt.term
        root["truncated"] = rt.trunc
        root["done"] = rt.done_after_reset if flags_cleared or everything else rt.term | rt.trunc

    def to(self, *args, **kwargs) -> WorldModelEnv:
        """The env lives on its model's device; moving it is an error (build it on the new device instead)."""
        device, dtype = torch._C._nn._parse_to(*args, **kwargs)[:2]
        if dtype is not None:  # EnvBase.to takes a device only; a dtype belongs to the model
            raise TypeError(
                f"WorldModelEnv.to({dtype}): expected a device; the env's dtypes are its model's and its specs': "
                f"build it from a model of that dtype (e.g. model.to({dtype})) with spaces of that dtype"
            )
        if device is None:
            return self
        device = _resolve_device(device)
        if device == self._dev:
            return self
        raise RuntimeError(
            f"WorldModelEnv is on {self._dev} (its model's device) and cannot be moved to {device}: build it there, "
            f"e.g. WorldModelEnv(model.to({str(device)!r}), ..., device={str(device)!r})"
        )

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the env: the rows' state is released (device memory included), and a step or a partial reset
        is an error until a reset of every row reopens the env (``rollout()`` and a new ``Collector`` reset it
        first), as TorchRL's batched envs restart at their next reset. Closing twice is fine."""
        super().close(raise_if_closed=raise_if_closed)
        self.__dict__["_rt"] = _ClosedRuntime()

    def __repr__(self) -> str:
        return (
            f"WorldModelEnv(num_envs={self.num_envs}, device={self.device}, "
            f"transition={self._transition.description!r}, "
            f"start={self._start_kind!r}, state_key={self._state_key!r}, differentiable={self._differentiable})"
        )


class _RaiseWhenCalled:
    """A discovered ``model.encode`` that cannot be called as ``encode(obs)`` (an RSSM posterior taking the
    previous state and action), bound so that it raises when an observation must be encoded (a start given as
    a state, ``initial_state`` or a ``reset_fn`` returning one, never encodes). A class, not a closure: envs
    holding it pickle."""

    def __init__(self, err: AdapterError):
        self.err = err

    def __call__(self, *args, **kwargs):
        raise AdapterError(
            f"{self.err}; it is needed to encode an observation into a start state here. Pass "
            "encode_fn=fn([model,] obs) that encodes it, a start as a state (initial_state=, or a reset_fn returning "
            "the state), or encode_fn=False to use the observation itself as the state"
        ) from self.err


def _merge_reset_group(old: TensorDictBase, new, rows: torch.Tensor) -> dict:
    """A group the reset produces (a Dict observation's sub-dict, a TensorDict state, ``"info"``) merged
    for a partial reset: the reset's leaves, plus the caller's other leaves in ``old`` (a policy's
    ``("goal", "embedding")``) zeroed on the reset ``rows``, as TorchRL's ``_update_during_reset`` does."""
    merged = {}
    for key, value in old.items():
        if key in new.keys():
            sub = new[key]
            if isinstance(value, TensorDictBase) and isinstance(sub, (Mapping, TensorDictBase)):
                sub = _merge_reset_group(value, sub, rows)
            merged[key] = sub
        else:
            merged[key] = _zeroed(value, rows)
    for key in new.keys():
        if key not in merged:
            merged[key] = new[key]
    return merged


def _batched_numpy_scalar(value, bs) -> bool:
    """A numeric numpy scalar (what numpy's reductions return) in a batched env: checked as the 0-d array it is,
    never broadcast; an unbatched env (``bs == ()``) takes it as a Python number."""
    return isinstance(value, np.generic) and value.dtype.kind in "biufc" and bool(bs)


def _zeroed(value, rows: torch.Tensor):
    """``value`` (a caller's tensor or TensorDict that the reset does not write) zeroed on the reset
    ``rows`` (``(N, 1)`` bool), as TorchRL's ``_update_during_reset`` pads it."""
    if isinstance(value, torch.Tensor):
        return _tree.zero_rows(rows, value)
    return value.where(~rows.view(-1), other=value.empty(), pad=0)


def _refuse_start(space, name: str = "action_space") -> None:
    """Refuse a Discrete/MultiDiscrete ``start``: TorchRL's specs are 0-based, and unlike the pool
    (which adds ``start`` back for the gymnasium env) nothing would add it for a model: its actions
    would arrive as 0..n-1, and its observations would leave the (0-based) spec and the exported space."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _refuse_start(sub, f"{name}[{key!r}]")
    elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(space.start != 0):
        if name.startswith("action_space"):
            fix = ("the model would get indices 0..n-1. Declare it without start and shift in transition_fn "
                   "(or use an ActionAdapter)")
        else:
            fix = ("the env's values are indices 0..n-1 (its spec, and the gymnasium space it exports). Declare it "
                   "without start and return 0-based values")
        raise SpecError(f"WorldModelEnv: {name} {space} has a nonzero start, which TorchRL's 0-based specs cannot "
                        f"carry: {fix}")


_PARTIAL_MERGE = "a partial reset puts the reset rows' start state into the other rows' state"
_FROZEN_MERGE = "a '_step' mask keeps the frozen rows' state"


def _state_guess_note(where, form, got, bs, knows_rows, observation) -> str:
    """How a reset read a state of ambiguous layout (see ``WorldModelEnv._reset_state_batched``); ``observation``:
    ``"returned"`` (an unbatched one, returned by the reset) or ``"initial"`` (none: initial_observation's)."""
    rows = bs[0] if len(bs) == 1 else tuple(bs)
    if observation == "initial":
        return (
            f"WorldModelEnv: the last reset's {where} returned {form} with state leaves {_shape_text(got)} and no "
            f"observation (initial_observation= gave it). They lead with the {rows} rows being reset, and no "
            f"initial_state=/state_spec= gives one row's layout, so the state was read as {rows} rows of "
            f"{_shape_text(_past_rows(got, bs))}. If it is one row's state, return the observation too, or pass "
            "state_key=/state_spec= to give one row's layout"
        )
    if knows_rows:
        read = f"as {rows} rows of {_shape_text(_past_rows(got, bs))}"
        told = "declares num_envs or mask: it knows"
    else:
        read, told = f"as one row, broadcast to the {rows} rows", "declares neither num_envs nor mask: it does not know"
    return (
        f"WorldModelEnv: the last reset's {where} returned {form} with state leaves {_shape_text(got)} next to an "
        f"unbatched observation. They lead with the {rows} rows being reset, and no initial_state=/state_spec= gives "
        f"one row's layout, so the state was read {read} (the reset_fn {told} how many rows it resets). If that is "
        "wrong, return the observation batched too (one per row being reset), or pass initial_state= or "
        "state_key=/state_spec= to give one row's layout"
    )


def _past_rows(shapes: dict, bs) -> dict:
    """``{path: shape}`` with the leading batch dims ``bs`` dropped: one row's layout of a per-row state."""
    return {path: shape[len(bs):] for path, shape in shapes.items()}


def _row_shapes(state) -> dict:
    """``{path: shape of one row}`` for every tensor leaf of ``state``, whose leaves lead with their rows."""
    return {path: shape[1:] for path, shape in _tree.shapes(state).items()}


def _shape_text(shapes: dict) -> str:
    """``{path: shape}`` for messages: ``(3, 5)`` for a tensor state, ``{'deter': (3,), ...}`` otherwise."""
    if list(shapes) == [()]:
        return str(tuple(shapes[()]))
    parts = ", ".join(f"{p[0] if len(p) == 1 else p!r}: {tuple(s)}" for p, s in shapes.items())
    return "{" + parts + "}"


def _composite(mapping: Mapping, device) -> Composite:
    """A ``{key: space, spec or nested mapping}`` as an unbatched Composite."""
    return Composite(
        {
            k: _composite(v, device) if isinstance(v, Mapping) else as_spec(v, device=device, name=f"state_spec[{k!r}]")
            for k, v in mapping.items()
        },
        device=device,
    )


def _bad_state_leaf(value, path: str, in_sequence: bool = False):
    """``(path, leaf, in_sequence)`` of the first leaf of a given state (``initial_state``) that is neither a
    tensor nor a numpy array (converted), e.g. ``[0.0, 0.0]`` meant as one tensor (``in_sequence``: inside a
    list or tuple); ``None`` when every leaf is one."""
    if value is None or isinstance(value, (torch.Tensor, np.ndarray, TensorDictBase)):
        return None
    if isinstance(value, Mapping):
        items, sequence = value.items(), False
    elif isinstance(value, (tuple, list)):
        items, sequence = enumerate(value), True
    else:
        return path, value, in_sequence
    for key, item in items:
        found = _bad_state_leaf(item, f"{path}[{key!r}]", sequence)
        if found is not None:
            return found
    return None


def _to_device(value, device, numpy_only: bool = False):
    """``value``'s numpy leaves as tensors on ``device``, and (unless ``numpy_only``) its tensors moved there."""
    if isinstance(value, np.ndarray):
        return torch.as_tensor(value, device=device)
    if isinstance(value, torch.Tensor):
        return value.to(device) if value.device != device and not numpy_only else value
    if isinstance(value, TensorDictBase):
        return value if numpy_only else value.to(device)
    if isinstance(value, Mapping):
        return {k: _to_device(v, device, numpy_only) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_to_device(v, device, numpy_only) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _explain_kwargs(kwargs):
    for key in kwargs:
        if key in _TRANSFORM_KWARGS:
            raise TypeError(
                f"WorldModelEnv got {key}=: {_TRANSFORM_KWARGS[key]}. Use torchrl_swm.make_world_model_env(...), which "
                "builds the env with these transforms, or add the transform to a TransformedEnv yourself."
            )
        if key in _UNSUPPORTED_KWARGS:
            raise TypeError(f"WorldModelEnv got {key}=, which this package does not take: {_UNSUPPORTED_KWARGS[key]}")
    raise TypeError(f"WorldModelEnv got unexpected keyword arguments {sorted(kwargs)}")
