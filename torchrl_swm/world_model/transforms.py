"""The world model becomes a TorchRL env through transforms.

:class:`~torchrl_swm.WorldModelEnv` runs the model; everything the seed design folded into
its env is a TorchRL :class:`~torchrl.envs.Transform` here, so users can add, remove, reorder
or swap them like any other transform:

* :class:`ActionAdapter`: the action adapter, on the **inverse** path: the policy acts in the
  outside action space (e.g. ``Discrete``), the model receives ``action_transform_fn(action)``
  (e.g. a one-hot vector).
* :class:`RewardAdapter` / :class:`TerminalAdapter`: ``reward_fn`` / ``terminal_fn`` fill in the
  reward / termination when the model's transition did not return one.
* :class:`ObservationDecoder`: an optional decoder (latent to pixels) writing a new key.
* the time limit is :class:`RowStepCounter`: TorchRL's :class:`~torchrl.envs.StepCounter`, except
  that rows frozen by a ``"_step"`` mask keep their count, as they keep their state.

:func:`make_world_model_env` composes them into a :class:`~torchrl.envs.TransformedEnv`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import Bounded, Composite, TensorSpec, Unbounded
from torchrl.envs import Compose, StepCounter, Transform, TransformedEnv

from ..errors import add_note, check_bool, check_int, describe
from ..masks import row_mask, zero_rewards
from ..specs import as_spec, batch_spec
from . import _tree
from .adapters import MISSING, Bound, ReturnFormError, bind, note_raised_inside
from .env import ActionRange, WorldModelEnv, _refuse_start, step_keeping_frozen_rows

__all__ = [
    "ActionAdapter",
    "RewardAdapter",
    "TerminalAdapter",
    "ObservationDecoder",
    "RowStepCounter",
    "make_world_model_env",
    "WorldModelTransformedEnv",
]


def _grad_context(base: WorldModelEnv | None):
    if base is not None and base.differentiable:
        return contextlib.nullcontext()
    return torch.no_grad()


class _WorldModelTransform(Transform):
    """A transform that reaches the :class:`WorldModelEnv` at the bottom of its TransformedEnv."""

    def __init__(self, *args, model: Any = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.__dict__["_model"] = model  # not a submodule: transforms must not move or capture the model
        self.__dict__["_bound"] = None
        self.__dict__["_bound_for"] = None  # a weak reference to the base env the binding holds the model of

    def __getstate__(self):
        # a binding refers to this process's env (through a weak reference, which cannot be pickled): the copy
        # binds anew where it is used (ParallelEnv workers, deepcopy)
        state = super().__getstate__()
        state["_bound"] = state["_bound_for"] = None
        return state

    def _bound_to(self, base) -> bool:
        """Whether the cached binding was made for ``base`` (a cloned transform in another env binds anew: the
        binding holds the first env's model and generator)."""
        return self._bound is not None and self._bound_for is not None and self._bound_for() is base

    def _base(self) -> WorldModelEnv:
        parent = self.parent
        base = None if parent is None else parent.base_env
        if not isinstance(base, WorldModelEnv):
            raise RuntimeError(
                f"{type(self).__name__} must be used in a TransformedEnv whose base env is a "
                "torchrl_swm.WorldModelEnv, "
                f"got {type(base).__name__ if base is not None else 'no parent env'}"
            )
        return base

    def _check_signature(self, fn, role, args) -> None:
        """Read ``fn``'s signature now, at construction (an :class:`AdapterError` when no calling convention
        fits); the binding itself waits for the base env, whose model and generator it holds."""
        bind(fn, role, args, model=self._model, extras={"generator": None})

    def _adapter(self, fn, role, args) -> Bound:
        base = self._base()
        if not self._bound_to(base):
            model = self._model if self._model is not None else base.model
            self._bound = bind(fn, role, args, model=model, extras={"generator": base.generator})
            self.__dict__["_bound_for"] = weakref.ref(base)
        return self._bound

    def _call_on_step(self, base: WorldModelEnv, bound: Bound, tensordict, next_tensordict):
        """``fn(state, obs, action)`` of a step (reward_fn's, terminal_fn's), on its rows; an error it raises
        is noted with the call."""
        bs = tuple(next_tensordict.batch_size)
        state, obs, action = base.state, self._observation(base, next_tensordict), tensordict.get("action")
        try:
            with _grad_context(base):
                return _tree.call_on_rows(bound.call, bs, state, obs, action)
        except Exception as err:
            note_raised_inside(err, bound, bs, state=state, obs=obs, action=action)
            raise

    @staticmethod
    def _observation(base: WorldModelEnv, next_tensordict: TensorDictBase):
        if base._obs_is_mapping:
            return next_tensordict.select(*(leaf.key for leaf in base._obs_leaves))
        return next_tensordict.get("observation")


class ActionAdapter(_WorldModelTransform):
    """The action adapter on TorchRL's inverse path: outside action -> model action.

    Args:
        action_transform_fn: ``fn([model,] action)`` mapping a batch of outside actions to the
            model's actions (both batched: called once per step). It must return a tensor
            matching the base env's action spec (checked, with a clear error).
        action_space: the outside action space (gymnasium space or TorchRL spec, per env).

    Keyword Args:
        model: passed first to ``fn`` when it takes the model (default: the base env's model).
        action_key: the action entry: ``"action"``, where :class:`WorldModelEnv` reads it
            (another key is refused: the model would never see the adapted action).

    The outside spec replaces the base env's action spec, so ``rand_action``, collectors and
    ``check_env_specs`` see the outside space; the base env receives the model's action.

    Example:
        A model that takes a 2-d force, driven by a policy that picks one of 4 moves:

        >>> import torch
        >>> from gymnasium.spaces import Box, Discrete
        >>> from torchrl_swm.world_model import ActionAdapter, WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-10, 10, (2,)), Box(-1, 1, (2,)), num_envs=3,
        ...                      initial_state=torch.zeros(2), transition_fn=lambda s, a: s + a)
        >>> moves = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> env = WorldModelTransformedEnv(base, ActionAdapter(lambda a: moves[a], Discrete(4)))
        >>> env.action_spec.shape, env.action_spec.space              # what the policy sees
        (torch.Size([3]), CategoricalBox(n=4))
        >>> td = env.reset().set("action", torch.tensor([0, 1, 2]))
        >>> env.step(td)["next", "observation"]                       # the model got moves[action]
        tensor([[ 1.,  0.],
                [-1.,  0.],
                [ 0.,  1.]])
    """

    def __init__(self, action_transform_fn: Callable, action_space, *, model: Any = None, action_key: str = "action"):
        if action_key != "action":
            raise ValueError(
                f"ActionAdapter: action_key={action_key!r}, but WorldModelEnv reads its action from 'action' (the "
                "model's action replaces the outside one there); keep the default"
            )
        super().__init__(in_keys=[], out_keys=[], in_keys_inv=[action_key], out_keys_inv=[action_key], model=model)
        self.__dict__["_fn"] = action_transform_fn
        self._check_signature(action_transform_fn, "action_transform_fn", ("action",))
        _refuse_start(action_space)
        self._outer = as_spec(action_space, name="action_space", action=True)
        if isinstance(self._outer, Composite):
            raise TypeError("ActionAdapter: the outside action space must be a single (non-Dict) space")
        self._outer_check = ActionRange.of(self._outer)  # discrete outside actions: range-checked
        self.action_key = action_key

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        base = self._base()
        bound = self._adapter(self._fn, "action_transform_fn", ("action",))
        action = tensordict.get(self.action_key, None)
        check, shape = self._outer_check, self._outer.shape
        expected = (*tensordict.batch_size, *shape)
        if not isinstance(action, torch.Tensor) or action.shape != expected or action.dtype != self._outer.dtype:
            # the outside action, as the base env checks its own: a policy's mistake is named as such, not
            # blamed on action_transform_fn (or silently range-check-free with the wrong width)
            if action is None:
                raise KeyError(f"ActionAdapter: the input tensordict has no {self.action_key!r} entry "
                               f"(keys: {list(tensordict.keys())})")
            raise ValueError(
                f"ActionAdapter: the outside action: expected dtype {self._outer.dtype} and shape {expected} "
                f"(the action space {self._outer_space_text()}), got {describe(action)}"
            )
        if check is not None:
            # before the fn (table[-1] would pass); frozen rows' actions are ignored, as by the base env
            stepped = _stepped_rows(tensordict, tensordict.batch_size[0]) if base._locked else None
            action = check.refuse(action, "ActionAdapter: the outside action",
                                  None if stepped is None else stepped.view(-1))
        try:
            with _grad_context(base):
                model_action = _tree.call_on_rows(bound.call, tuple(tensordict.batch_size), action)
        except Exception as err:
            note_raised_inside(err, bound, tuple(tensordict.batch_size), action=action)
            raise
        returned = model_action
        if isinstance(model_action, np.ndarray):  # as the transition's numpy is taken
            model_action = torch.as_tensor(model_action, device=base.device)
        leaf = base._action_leaf
        if leaf is None:
            raise TypeError(
                "ActionAdapter: the base env's action spec is a Composite (a Dict model action space with keys "
                f"{sorted(base.full_action_spec.keys(True, True))}); action_transform_fn returns one tensor, so the "
                "model's action space must be a single (non-Dict) space. Return a flat action and split it in "
                "transition_fn."
            )
        bs = tuple(tensordict.batch_size)
        expected = (*bs, *leaf.shape)
        if (
            not isinstance(model_action, torch.Tensor)
            or model_action.shape != expected
            or model_action.dtype != leaf.dtype
        ):
            raise ReturnFormError(
                f"{bound.description} returned {describe(returned)}; expected the model's action: "
                f"dtype {leaf.dtype}, "
                f"shape {expected} (the base env's action spec)"
            )
        tensordict.set(self.action_key, model_action)
        return tensordict

    def _outer_space_text(self) -> str:
        return f"{type(self._outer).__name__}(shape={tuple(self._outer.shape)}, dtype={self._outer.dtype})"

    def transform_input_spec(self, input_spec: TensorSpec) -> TensorSpec:
        input_spec = input_spec.clone()
        actions = input_spec["full_action_spec"]
        outer = batch_spec(self._outer.to(actions.device), tuple(actions.shape))
        actions[self.action_key] = outer
        return input_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict


def _carries_grad(value) -> bool:
    if isinstance(value, TensorDictBase):
        return any(leaf.requires_grad for leaf in value.values(True, True) if isinstance(leaf, torch.Tensor))
    return isinstance(value, torch.Tensor) and value.requires_grad


def _same_rows(value, last, n: int) -> torch.Tensor:
    """``(N,)`` bool: the rows where ``value`` equals ``last`` (tensors or TensorDicts; NaN equals NaN)."""
    if isinstance(value, TensorDictBase):
        same = torch.ones(n, dtype=torch.bool, device=value.device)
        for key, leaf in value.items(True, True):
            other = last.get(key, None)
            if not isinstance(other, torch.Tensor) or other.shape != leaf.shape:
                return torch.zeros_like(same)
            same &= _same_rows(leaf, other, n)
        return same
    equal = torch.isclose(value, last, rtol=0, atol=0, equal_nan=True) if value.is_floating_point() else value == last
    return equal.reshape(n, -1).all(-1)


def _stepped_rows(tensordict: TensorDictBase, n: int) -> torch.Tensor | None:
    """The ``"_step"`` mask as ``(N, 1)`` when some rows are frozen, else ``None``.

    TorchRL passes ``"_step"`` down to a batch-locked env only when it is partial; the base env
    freezes the other rows (state, observation and flags kept, reward 0), and so must an adapter.
    """
    partial = tensordict.get("_step", None)
    if partial is None:
        return None
    return row_mask(partial, n, "_step").view(n, 1)


class RewardAdapter(_WorldModelTransform):
    """``reward_fn([model,] state, obs, action)`` fills in the reward when the transition returned none.

    ``state`` is the model state after the step, ``obs`` the next observation (a TensorDict for
    Dict observations) and ``action`` the model's action. Returns a float tensor of shape
    ``(N,)`` or ``(N, 1)`` (checked). When the transition did return a reward, it is kept (the
    seed design's rule). Rows frozen by a ``"_step"`` mask report reward 0, as in the base env.

    Example:
        A model that predicts the next state only, rewarded by its distance to the origin:

        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl_swm.world_model import RewardAdapter, WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-10, 10, (2,)), Box(-1, 1, (2,)), num_envs=2,
        ...                      initial_state=torch.tensor([3.0, 4.0]), transition_fn=lambda s, a: s + a)
        >>> env = WorldModelTransformedEnv(base, RewardAdapter(lambda state, obs, action: -obs.norm(dim=-1)))
        >>> td = env.reset().set("action", torch.tensor([[0.0, 0.0], [-1.0, -1.0]]))
        >>> env.step(td)["next", "reward"]                            # -|(3, 4)|, -|(2, 3)|
        tensor([[-5.0000],
                [-3.6056]])
    """

    def __init__(self, reward_fn: Callable, *, model: Any = None):
        super().__init__(in_keys=[], out_keys=[], model=model)
        self.__dict__["_fn"] = reward_fn
        self._check_signature(reward_fn, "reward_fn", ("state", "obs", "action"))

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        base = self._base()
        if base.reward_from_model:
            return next_tensordict
        bound = self._adapter(self._fn, "reward_fn", ("state", "obs", "action"))
        bs = tuple(next_tensordict.batch_size)
        reward = self._call_on_step(base, bound, tensordict, next_tensordict)
        reward = base._reward(reward, bs, (*bs, 1), bound.description, "a reward")
        if reward is None:
            raise ReturnFormError(f"{bound.description} returned None; expected a float tensor of shape {(*bs, 1)}")
        rows = _stepped_rows(tensordict, bs[0]) if base._locked else None
        if rows is not None:
            reward = torch.where(rows, reward, torch.zeros((), dtype=reward.dtype, device=reward.device))
        next_tensordict.set("reward", reward)
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict


class TerminalAdapter(_WorldModelTransform):
    """``terminal_fn([model,] state, obs, action)`` fills in ``terminated`` when the transition returned none.

    Returns a bool tensor of shape ``(N,)`` or ``(N, 1)`` (checked); ``done`` becomes
    ``terminated | truncated``. When the transition did return a termination, it is kept. Rows
    frozen by a ``"_step"`` mask keep their previous termination, as in the base env: the
    result is handed back to the base env, which keeps it for frozen rows and clears it on reset.

    Example:
        Episodes end when the point crosses ``x = 1``:

        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl_swm.world_model import TerminalAdapter, WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-10, 10, (2,)), Box(-1, 1, (2,)), num_envs=2,
        ...                      initial_state=torch.zeros(2), transition_fn=lambda s, a: s + a)
        >>> env = WorldModelTransformedEnv(base, TerminalAdapter(lambda state, obs, action: obs[:, 0] >= 1))
        >>> push = lambda td: td.set("action", torch.tensor([[1.0, 0.0], [0.5, 0.0]]))   # fast, slow
        >>> rollout = env.rollout(4, push, break_when_any_done=False)  # done rows restart
        >>> rollout["next", "terminated"][..., 0]
        tensor([[ True,  True,  True,  True],
                [False,  True, False,  True]])
    """

    def __init__(self, terminal_fn: Callable, *, model: Any = None):
        super().__init__(in_keys=[], out_keys=[], model=model)
        self.__dict__["_fn"] = terminal_fn
        self._check_signature(terminal_fn, "terminal_fn", ("state", "obs", "action"))

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        base = self._base()
        if base.terminated_from_model:
            return next_tensordict
        bound = self._adapter(self._fn, "terminal_fn", ("state", "obs", "action"))
        bs = tuple(next_tensordict.batch_size)
        flag = self._call_on_step(base, bound, tensordict, next_tensordict)
        terminated = base._flag(flag, bs, (*bs, 1), "terminated", bound.description, "a termination flag")
        if terminated is None or flag is MISSING:
            raise ReturnFormError(f"{bound.description} returned nothing; expected a bool tensor of shape {(*bs, 1)}")
        if base._locked:
            rows = _stepped_rows(tensordict, bs[0])
            if rows is not None:
                # frozen rows: the base env kept their previous flag (this adapter's, handed back below)
                terminated = torch.where(rows, terminated, next_tensordict.get("terminated"))
            base._rt.term = terminated
        next_tensordict.set("terminated", terminated)
        next_tensordict.set("done", terminated | next_tensordict.get("truncated"))
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict


class RowStepCounter(StepCounter):
    """TorchRL's :class:`~torchrl.envs.StepCounter` for a batch-locked env that freezes rows.

    TorchRL's counter advances every row at every step; here a row frozen by a ``"_step"`` mask (of
    the env's batch, whatever its rank: ``(N,)``, or ``(workers, N)`` for a ``SerialEnv`` of envs)
    (not stepped: state, observation and flags kept) keeps its count and its truncation, so
    ``max_steps`` counts the steps a row really took, as a gymnasium ``TimeLimit`` does.

    Example:
        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl_swm.world_model import RowStepCounter, WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-1, 1, (2,)), Box(-1, 1, (2,)), num_envs=2,
        ...                      initial_state=torch.zeros(2), transition_fn=lambda s, a: s + a)
        >>> env = WorldModelTransformedEnv(base, RowStepCounter(max_steps=2))
        >>> td = env.reset().set("action", torch.zeros(2, 2))
        >>> td["_step"] = torch.tensor([[True], [False]])             # row 1 frozen: not stepped
        >>> td = env.step_mdp(env.step(td))
        >>> td["step_count"].view(-1).tolist()                        # and it keeps its count
        [1, 0]
        >>> td["_step"] = torch.tensor([[True], [True]])
        >>> td = env.step(td)
        >>> td["next", "step_count"].view(-1).tolist(), td["next", "truncated"].view(-1).tolist()
        ([2, 1], [True, False])
    """

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        bs = tensordict.batch_size
        if len(bs) == 1:
            rows = _stepped_rows(tensordict, bs[0])
        else:  # e.g. a SerialEnv of envs, batch (workers, N): TorchRL freezes whole workers with a "_step" mask
            partial = tensordict.get("_step", None)
            if partial is not None and (partial.dtype is not torch.bool or partial.numel() != bs.numel()):
                raise ValueError(f"RowStepCounter: '_step' must be a bool mask of the batch {tuple(bs)}, got "
                                 f"{describe(partial)}")
            rows = None if partial is None else partial.reshape(*bs, 1)
        if rows is None:
            return super()._step(tensordict, next_tensordict)
        # the base env's own flags for frozen rows (kept from their last step), before the limit is applied
        flags = {key: next_tensordict.get(key, None) for key in (*self.truncated_keys, *self.done_keys)}
        next_tensordict = super()._step(tensordict, next_tensordict)
        for count_key, truncated_key, done_key in zip(self.step_count_keys, self.truncated_keys, self.done_keys):
            kept = tensordict.get(count_key)
            next_tensordict.set(count_key, torch.where(rows, next_tensordict.get(count_key), kept))
            if self.max_steps is None:
                continue
            truncated = kept >= self.max_steps
            if flags[truncated_key] is not None:
                truncated = truncated | flags[truncated_key]
            next_tensordict.set(truncated_key, torch.where(rows, next_tensordict.get(truncated_key), truncated))
            if self.update_done:
                done = truncated if flags[done_key] is None else truncated | flags[done_key]
                next_tensordict.set(done_key, torch.where(rows, next_tensordict.get(done_key), done))
        return next_tensordict


class ObservationDecoder(_WorldModelTransform):
    """Decode an observation (e.g. a latent) into a new entry (e.g. ``"pixels"``) at reset and step.

    Args:
        decoder: ``decoder([model,] obs)`` -> a batched tensor (e.g. ``(N, H, W, 3)`` uint8). One that
            samples takes ``generator=``: the env's step stream in steps, its reset stream at resets,
            drawn once for all the rows reset together (as a sampling ``reset_fn``), so a reset row's
            pixels depend on which rows reset before it; decode deterministically where rows must
            not influence each other.
        spec: the decoded entry's unbatched spec or space. Default: probed once by decoding the
            observation spec's zero (uint8 results get ``Bounded(0, 255)``).

    Keyword Args:
        in_key: the entry to decode (default ``"observation"``).
        out_key: where the decoded value goes (default ``"pixels"``).
        model: passed first to ``decoder`` when it takes the model (default: the base env's model).
        differentiable: keep the graph (default: decode under ``torch.no_grad()``).

    Example:
        A toy decoder from a 2-d latent to an 8x8 gray image, at every reset and step:

        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl_swm.world_model import ObservationDecoder, WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-1, 1, (2,)), Box(-1, 1, (2,)), num_envs=3,
        ...                      initial_state=torch.zeros(2), transition_fn=lambda s, a: (s + a).clamp(-1, 1))
        >>> def decode(obs):                                          # (N, 2) -> (N, 8, 8, 3) uint8
        ...     gray = ((obs[:, 0] + 1) * 127.5).to(torch.uint8)
        ...     return gray.view(-1, 1, 1, 1).expand(-1, 8, 8, 3).clone()
        >>> env = WorldModelTransformedEnv(base, ObservationDecoder(decode))     # writes "pixels"
        >>> env.observation_spec["pixels"].shape, env.observation_spec["pixels"].dtype   # probed once
        (torch.Size([3, 8, 8, 3]), torch.uint8)
        >>> td = env.reset().set("action", torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]))
        >>> env.step(td)["next", "pixels"][:, 0, 0, 0]
        tensor([255,   0, 127], dtype=torch.uint8)
    """

    def __init__(
        self,
        decoder: Callable,
        spec=None,
        *,
        in_key="observation",
        out_key="pixels",
        model: Any = None,
        differentiable: bool = False,
    ):
        super().__init__(in_keys=[in_key], out_keys=[out_key], model=model)
        self.__dict__["_fn"] = decoder
        if spec is not None:
            _refuse_start(spec, "ObservationDecoder spec")
        self._spec = None if spec is None else as_spec(spec, name="decoder spec")
        self._differentiable = check_bool(differentiable, "ObservationDecoder: differentiable")

    def _decode(self, value, phase: str):
        """Decode ``value``; a decoder taking ``generator`` draws from the stream of ``phase``, as the env's
        own adapters do: the step stream in steps (which resets never move), the reset stream at resets
        (one draw for every row, as a sampling ``reset_fn``'s: a reset row's pixels depend on which rows
        reset before), a throwaway one for the spec probe (the streams stay as without a decoder)."""
        model = self._model
        base = self.parent.base_env if self.parent is not None else None
        base = base if isinstance(base, WorldModelEnv) else None
        if self._bound is None or (base is not None and not self._bound_to(base)):
            extras = None
            if base is not None:
                model = base.model if model is None else model
                extras = {"generator": None}  # given per call
            self._bound = bind(self._fn, "decoder", ("obs",), model=model, extras=extras)
            self.__dict__["_bound_for"] = None if base is None else weakref.ref(base)
        kwargs = {}
        if "generator" in self._bound.extras and base is not None:
            if phase == "probe":
                generator = torch.Generator(device=base.generator.device)
                generator.manual_seed(0)
            else:
                generator = base.reset_generator if phase == "reset" else base.generator
            kwargs["generator"] = generator
        context = contextlib.nullcontext() if self._differentiable else torch.no_grad()
        try:
            with context:
                out = self._bound.call(value, **kwargs)
        except Exception as err:
            batch = value.batch_size if isinstance(value, TensorDictBase) else getattr(value, "shape", ())[:1]
            note_raised_inside(err, self._bound, tuple(batch), obs=value)
            raise
        if not isinstance(out, (torch.Tensor, np.ndarray)):
            raise ReturnFormError(f"{self._bound.description} returned {describe(out)}; expected a tensor")
        return out

    def _as_tensor(self, out):
        """A decoder's numpy array as a tensor on the env's device, as the transition's numpy is taken."""
        if not isinstance(out, np.ndarray):
            return out
        base = self.parent.base_env if self.parent is not None else None
        return torch.as_tensor(out, device=base.device if isinstance(base, WorldModelEnv) else None)

    def _call(self, next_tensordict: TensorDictBase, phase: str = "step") -> TensorDictBase:
        value = next_tensordict.get(self.in_keys[0], None)
        if value is None:
            self._missing_input(next_tensordict.keys(True, True))
        bs = tuple(next_tensordict.batch_size)
        returned = _tree.call_on_rows(self._decode, bs, value, phase=phase)
        out = self._as_tensor(returned)
        spec = self._spec
        if tuple(out.shape[: len(bs)]) != bs or (
            spec is not None and (tuple(out.shape[len(bs):]) != tuple(spec.shape) or out.dtype != spec.dtype)
        ):
            expected = f"dtype {spec.dtype}, shape {(*bs, *spec.shape)}" if spec is not None else f"leading dims {bs}"
            raise ReturnFormError(
                f"{self._bound.description} returned {describe(returned)}; expected {expected} "
                f"(the {self.out_keys[0]!r} spec, for a batch of {bs})"
            )
        next_tensordict.set(self.out_keys[0], out)
        return next_tensordict

    def _missing_input(self, keys):
        raise KeyError(
            f"ObservationDecoder: no {self.in_keys[0]!r} entry to decode; the env has {sorted(map(str, keys))}. "
            "Pass in_key= (make_world_model_env: decoder_in_key=) naming the entry the decoder reads"
        )

    # A decoder that samples (it takes generator=) would draw new pixels for the rows a "_step" mask
    # froze, whose observation the env keeps: those rows keep the pixels it gave them, as long as their
    # input is still the one those pixels were decoded from. What is kept is this transform's own output
    # (later transforms may have changed the tensordict's entry: normalised, stacked). A deterministic
    # decoder decodes the kept observation again, which gives the same pixels.
    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        tensordict_reset = self._call(tensordict_reset, "reset")
        if self._samples():
            value, out = tensordict_reset.get(self.in_keys[0]), tensordict_reset.get(self.out_keys[0])
            mask = None if tensordict is None else tensordict.get("_reset", None)
            last = None if mask is None or not self._rows_kept_here() else self._last_for(value, out)
            if last is not None:  # a partial reset: the other rows keep what they had
                rows = row_mask(mask, out.shape[0], "_reset")
                value, out = _tree.where_rows(rows, value, last[0]), _tree.where_rows(rows, out, last[1])
            self.__dict__["_last"] = (value, out)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict = self._call(next_tensordict)
        if self._samples():
            value, out = next_tensordict.get(self.in_keys[0]), next_tensordict.get(self.out_keys[0])
            partial = tensordict.get("_step", None)
            last = None if partial is None or not self._rows_kept_here() else self._last_for(value, out)
            if last is not None:
                n = out.shape[0]
                keep = ~row_mask(partial, n, "_step") & _same_rows(value, last[0], n)
                if keep.any():
                    kept = last[1]
                    if kept.requires_grad and not self._caller_keeps_graph(tensordict):
                        kept = kept.detach()  # the caller detached the env's outputs (truncated BPTT)
                    out = _tree.where_rows(~keep, out, kept)
                    next_tensordict.set(self.out_keys[0], out)
            self.__dict__["_last"] = (value, out)
        return next_tensordict

    def _caller_keeps_graph(self, tensordict: TensorDictBase) -> bool:
        """Whether any of the env's outputs the caller passed back carries grad: the graph of the pixels
        kept for frozen rows goes on only then (a policy's fresh outputs, e.g. its action, do not count)."""
        env = self.container
        while env is not None and not isinstance(env, TransformedEnv):
            env = getattr(env, "container", None)
        keys = [self.in_keys[0], self.out_keys[0]]
        if env is not None:
            keys += list(env.observation_spec.keys(True, True))
        return any(_carries_grad(tensordict.get(key, None)) for key in keys)

    def _samples(self) -> bool:
        return self._bound is not None and "generator" in self._bound.extras

    def _rows_kept_here(self) -> bool:
        """Whether this transform keeps the rows a mask leaves alone: below a batch-locked env (one row per
        env); a batch-unlocked one has TorchRL merge the masked rows into the caller's tensordict itself."""
        return self.parent is None or self.parent.batch_locked

    def _last_for(self, value, out) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last ``(input, output)`` when they have this batch's shapes (a batch-locked env; an unlocked
        one sub-selects the rows itself), else None."""
        last = self.__dict__.get("_last")
        if (
            last is None or not isinstance(value, (torch.Tensor, TensorDictBase)) or out.dim() < 1
            or type(last[0]) is not type(value) or last[0].shape != value.shape or last[1].shape != out.shape
        ):
            return None
        return last

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict)

    def transform_observation_spec(self, observation_spec: TensorSpec) -> TensorSpec:
        if self.in_keys[0] not in observation_spec.keys(True):
            self._missing_input(observation_spec.keys(True, True))
        in_spec = observation_spec[self.in_keys[0]]
        bs = tuple(observation_spec.shape)
        if self._spec is None:
            # a decoder takes a batch: a batch-unlocked env's (unbatched) spec is probed as a batch of one
            probe_bs = bs or (1,)
            probe = self._as_tensor(self._decode(in_spec.zero() if bs else in_spec.zero(probe_bs), "probe"))
            shape = tuple(probe.shape[len(probe_bs) :])
            if tuple(probe.shape[: len(probe_bs)]) != probe_bs:
                raise ReturnFormError(
                    f"decoder returned {describe(probe)} for a batch {probe_bs}; expected leading dims {probe_bs}"
                )
            if probe.dtype == torch.uint8:
                self._spec = Bounded(0, 255, shape=shape, dtype=torch.uint8)
            else:
                self._spec = Unbounded(shape=shape, dtype=probe.dtype)
        observation_spec[self.out_keys[0]] = batch_spec(self._spec.to(observation_spec.device), bs)
        return observation_spec


def make_world_model_env(
    model: Any,
    observation_space=None,
    action_space=None,
    *,
    num_envs: int | None = 1,
    initial_state: Any = None,
    initial_observation: Any = None,
    reset_fn: Callable | None = None,
    transition_fn: Callable | None = None,
    reward_fn: Callable | None = None,
    terminal_fn: Callable | None = None,
    action_transform_fn: Callable | None = None,
    model_action_space=None,
    max_episode_steps: int | None = None,
    decoder: Callable | None = None,
    decoder_spec=None,
    decoder_in_key="observation",
    transforms: Sequence[Transform] = (),
    device: torch.device | str | None = None,
    **kwargs,
) -> TransformedEnv:
    """Build a ready world-model env: a :class:`WorldModelEnv` plus the adapter transforms.

    Takes the seed design's arguments (``reset_fn``, ``transition_fn``, ``reward_fn``,
    ``terminal_fn``, ``action_transform_fn``, ``max_episode_steps``, ``device``...) and
    returns ``TransformedEnv(WorldModelEnv(...), Compose(...))`` where the Compose holds, in
    order and only when asked for: :class:`ActionAdapter`, :class:`RewardAdapter`,
    :class:`TerminalAdapter`, :class:`RowStepCounter` ``(max_episode_steps)``, :class:`ObservationDecoder`,
    then ``transforms``.

    Args:
        model: the world model.
        observation_space: per-env observation space or spec.
        action_space: per-env action space or spec **as the policy sees it**. With
            ``action_transform_fn`` the model's own action space is ``model_action_space``
            (default: probed by transforming the outside spec's zero action once).

    Keyword Args:
        num_envs, initial_state, initial_observation, reset_fn, transition_fn, device and every
            other keyword: see :class:`WorldModelEnv`.
        reward_fn / terminal_fn: fill in a missing reward / termination (else 0 / False).
        action_transform_fn: ``fn([model,] action)`` from the outside action to the model's.
        max_episode_steps: time limit; sets ``truncated`` (:class:`RowStepCounter`).
        decoder / decoder_spec: an :class:`ObservationDecoder` writing ``"pixels"``.
        decoder_in_key: the entry the decoder reads (default ``"observation"``; with a Dict
            observation, one of its keys, e.g. ``("image", "latent")``).
        transforms: more TorchRL transforms appended to the Compose.

    Returns:
        a :class:`~torchrl.envs.TransformedEnv` (:class:`WorldModelTransformedEnv`, which keeps the rows a
        ``"_step"`` mask freezes in a batch-unlocked env too); ``env.base_env`` is the :class:`WorldModelEnv`.

    Example:
        A point mass whose model takes a 2-d force, driven through 4 discrete moves, rewarded by
        its distance to the origin, with a time limit of 5 steps:

        >>> import gymnasium as gym, numpy as np, torch
        >>> from torchrl_swm import make_world_model_env
        >>> class PointMass(torch.nn.Module):
        ...     def step(self, state, action):
        ...         return state + 0.1 * action
        >>> moves = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
        >>> env = make_world_model_env(
        ...     PointMass(),
        ...     observation_space=gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        ...     action_space=gym.spaces.Discrete(4),
        ...     action_transform_fn=lambda a: moves[a],
        ...     reward_fn=lambda state, obs, action: -obs.norm(dim=-1),
        ...     initial_state=torch.ones(2),
        ...     num_envs=4,
        ...     max_episode_steps=5,
        ... )
        >>> [type(t).__name__ for t in env.transform]
        ['ActionAdapter', 'RewardAdapter', 'RowStepCounter']
        >>> td = env.rollout(8, break_when_any_done=False)
        >>> td.shape, td["next", "truncated"][0, :, 0].tolist()
        (torch.Size([4, 8]), [False, False, False, False, True, False, False, False])
    """
    if action_space is None:
        raise TypeError("make_world_model_env: action_space= is required (gymnasium space or TorchRL spec)")
    inner_space = action_space
    if action_transform_fn is not None:
        inner_space = (
            model_action_space
            if model_action_space is not None
            else _probe_model_action(
                model, action_transform_fn, action_space, device, kwargs.get("differentiable", False)
            )
        )
        if isinstance(as_spec(inner_space, name="model_action_space"), Composite):
            raise TypeError(
                "make_world_model_env: with action_transform_fn=, the model's action space must be a single "
                f"(non-Dict) space, got {inner_space}; action_transform_fn returns one tensor"
            )
    elif model_action_space is not None:
        raise TypeError("make_world_model_env: model_action_space= only makes sense with action_transform_fn=")
    base = WorldModelEnv(
        model,
        observation_space,
        inner_space,
        num_envs=num_envs,
        initial_state=initial_state,
        initial_observation=initial_observation,
        reset_fn=reset_fn,
        transition_fn=transition_fn,
        device=device,
        **kwargs,
    )
    chain: list[Transform] = []
    if action_transform_fn is not None:
        chain.append(ActionAdapter(action_transform_fn, action_space, model=model))
    if reward_fn is not None:
        chain.append(RewardAdapter(reward_fn, model=model))
    if terminal_fn is not None:
        chain.append(TerminalAdapter(terminal_fn, model=model))
    if max_episode_steps is not None:
        max_episode_steps = check_int(max_episode_steps, "make_world_model_env: max_episode_steps", minimum=1)
        chain.append(RowStepCounter(max_steps=max_episode_steps))
    if decoder is not None:
        differentiable = kwargs.get("differentiable", False)  # as the env: decoded pixels keep the graph too
        chain.append(ObservationDecoder(decoder, decoder_spec, in_key=decoder_in_key, model=model,
                                        differentiable=differentiable))
    elif decoder_spec is not None or decoder_in_key != "observation":
        raise TypeError("make_world_model_env: decoder_spec= and decoder_in_key= only make sense with decoder=")
    if isinstance(transforms, Transform):
        transforms = [transforms]  # one transform, not in a list
    elif isinstance(transforms, (str, bytes)) or not hasattr(transforms, "__iter__"):
        raise TypeError(f"make_world_model_env: transforms: expected a list of TorchRL Transforms, got "
                        f"{describe(transforms)}")
    for transform in transforms:
        if not isinstance(transform, Transform):
            raise TypeError(f"make_world_model_env: transforms must be TorchRL Transforms, got {describe(transform)}")
        chain.append(transform)
    return WorldModelTransformedEnv(base, Compose(*chain))


class WorldModelTransformedEnv(TransformedEnv):
    """The ``TransformedEnv`` :func:`make_world_model_env` returns: TorchRL's, except that a batch-unlocked one
    keeps the rows a ``"_step"`` mask freezes (TorchRL rebuilds them from zeros; see
    :func:`~torchrl_swm.world_model.env.step_keeping_frozen_rows`), as a batch-locked one does.

    Built as TorchRL's: ``WorldModelTransformedEnv(env, transform=None)``, ``transform`` a
    :class:`~torchrl.envs.Transform` or a :class:`~torchrl.envs.Compose` of them (the adapter transforms
    of this module, TorchRL's own).

    Examples:
        >>> import torch
        >>> from gymnasium.spaces import Box
        >>> from torchrl.envs import RewardSum
        >>> from torchrl_swm import WorldModelEnv, WorldModelTransformedEnv
        >>> base = WorldModelEnv(object(), Box(-1, 1, (3,)), Box(-1, 1, (3,)), num_envs=4,
        ...                      initial_state=torch.zeros(3), transition_fn=lambda s, a: (s + a).clamp(-1, 1))
        >>> env = WorldModelTransformedEnv(base, RewardSum())
        >>> env.rollout(5)["next", "episode_reward"].shape
        torch.Size([4, 5, 1])
    """

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.batch_locked or "_step" not in tensordict.keys():
            return super().step(tensordict)
        return step_keeping_frozen_rows(self, tensordict, super().step)

    def _skip_tensordict(self, tensordict: TensorDictBase) -> TensorDictBase:
        # an all-False "_step" freezes every row: reward 0, as the base env reports (TorchRL copies the root's)
        return zero_rewards(self, super()._skip_tensordict(tensordict))

    def to(self, *args, **kwargs) -> WorldModelTransformedEnv:
        dtype = torch._C._nn._parse_to(*args, **kwargs)[1]
        if dtype is not None:  # TorchRL hands a dtype to EnvBase.to (a raw torch TypeError): the base env's
            self.base_env.to(dtype)  # error says where a dtype belongs
        return super().to(*args, **kwargs)


def _probe_model_action(model, fn, action_space, device, differentiable) -> TensorSpec:
    """The model's action spec, from transforming one zero outside action (batch of 1)."""
    outer = as_spec(action_space, name="action_space", action=True)
    if device is None:
        from .env import _model_device

        device = _model_device(model) or torch.device("cpu")
    sample = outer.to(device).zero((1,))
    # bound as ActionAdapter binds it; the probe's generator is a throwaway (only the shape matters)
    bound = bind(fn, "action_transform_fn", ("action",), model=model, extras={"generator": torch.Generator(device)})
    try:
        with contextlib.nullcontext() if differentiable else torch.no_grad():
            out = bound.call(sample)
    except Exception as err:
        note_raised_inside(err, bound, (1,), action=sample)
        add_note(err, "WorldModelEnv: this was the probe that finds the model's action space (one zero outside "
                      "action); pass model_action_space= to skip it")
        raise
    returned = out
    if isinstance(out, np.ndarray):  # as the transition's numpy is taken
        out = torch.as_tensor(out, device=device)
    if not isinstance(out, torch.Tensor) or out.ndim < 1 or out.shape[0] != 1:
        raise ReturnFormError(
            f"{bound.description} returned {describe(returned)} for a batch of 1 action of shape {tuple(sample.shape)}; "
            "expected a batched tensor, one model action per row: action_transform_fn is called once per step "
            "with the whole batch of outside actions, shape (num_envs, *action_shape)"
        )
    return Unbounded(shape=out.shape[1:], dtype=out.dtype, device=device)
