"""TorchRL transforms for batched envs with per-row masks: :class:`History` and :class:`FrameSkip`.

:class:`History` keeps the last ``length`` steps of chosen keys, stacked along a
new time dim right after the batch dims: a key of shape ``(N, *shape)`` gets a
history of shape ``(N, length, *shape)``, oldest step first, the current step
last. World-model planners read it as their context window; ``length=1`` is
the ``(num_envs, 1, ...)`` convention of stable-worldmodel's EnvPool.

Semantics, for a batched env with per-env masks:

* a reset fills the history of the **reset rows only** with the reset
  observation (``padding="same"``: repeated ``length`` times; ``"zeros"``:
  zeros, then the observation in the last slot); other rows keep theirs;
* a step shifts the history by one and appends the new observation, for the
  rows that were stepped; rows frozen by a ``"_step"`` mask keep their history
  unchanged (a frozen env adds no duplicate frames).

:class:`FrameSkip` repeats each action ``frame_skip`` times, as TorchRL's
``FrameSkipTransform`` does, but stops each row at the end of its episode.

The history lives in the tensordict (root at step ``t``, ``"next"`` at ``t +
1``), not inside the transform, so it works with ``rollout``, collectors,
``step_and_maybe_reset`` and :class:`~torchrl_swm.World` alike, and a
tensordict can be replayed from any point.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey, unravel_key
from torchrl.data import Binary, Bounded, Composite, MultiOneHot, OneHot, Unbounded
from torchrl.envs.transforms import FrameSkipTransform, Transform, TransformedEnv

__all__ = ["History", "FrameSkip"]


def _admitting_zeros(spec):
    """``spec``, widened where needed so that its zero padding is in it: bounds stretched to 0, a one-hot
    (whose all-zero vector is not one) as the Binary of its shape, anything else unbounded."""
    if isinstance(spec, Composite):  # a group entry (("info",)): each leaf on its own
        return Composite({key: _admitting_zeros(sub) for key, sub in spec.items()}, shape=spec.shape,
                         device=spec.device)
    if spec.is_in(torch.zeros(spec.shape, dtype=spec.dtype, device=spec.device)):
        return spec
    if isinstance(spec, Bounded):
        zero = torch.zeros((), dtype=spec.space.low.dtype, device=spec.device)
        return Bounded(torch.minimum(spec.space.low, zero), torch.maximum(spec.space.high, zero), shape=spec.shape,
                       dtype=spec.dtype, device=spec.device)
    if isinstance(spec, (OneHot, MultiOneHot)):
        return Binary(spec.shape[-1], shape=spec.shape, dtype=spec.dtype, device=spec.device)
    return Unbounded(shape=spec.shape, dtype=spec.dtype, device=spec.device)


class History(Transform):
    """Keep the last ``length`` steps of ``keys`` as ``(*batch, length, ...)``.

    Args:
        keys: the observation keys to keep (e.g. ``["pixels"]`` or
            ``["pixels", ("info", "goal_pixels")]``).
        length: how many steps to keep (>= 1).

    Keyword Args:
        out_keys: where to write the histories; default ``("history", *key)``
            for each key (e.g. ``("history", "pixels")``). An out key equal to
            its in key replaces the observation by its history.
        padding: ``"same"`` (default; after a reset the history is the reset
            observation repeated) or ``"zeros"`` (whose history spec is widened to hold
            the zeros: bounds stretched to 0, a one-hot as a ``Binary``).

    Examples:
        >>> from torchrl.envs import TransformedEnv
        >>> from torchrl_swm import EnvPool, History
        >>> env = TransformedEnv(EnvPool("CartPole-v1", num_envs=4), History(["observation"], 3))
        >>> td = env.reset()
        >>> td["history", "observation"].shape
        torch.Size([4, 3, 4])
    """

    def __init__(
        self,
        keys: Sequence[NestedKey] | NestedKey,
        length: int,
        *,
        out_keys: Sequence[NestedKey] | None = None,
        padding: str = "same",
    ):
        if isinstance(keys, (str, tuple)):
            keys = [keys]
        in_keys = [unravel_key(k) for k in keys]
        if not in_keys:
            raise ValueError("History: expected at least one key")
        if out_keys is None:
            out_keys = [("history", *((k,) if isinstance(k, str) else k)) for k in in_keys]
        else:
            if isinstance(out_keys, (str, tuple)):
                out_keys = [out_keys]
            out_keys = [unravel_key(k) for k in out_keys]
            if len(out_keys) != len(in_keys):
                raise ValueError(f"History: {len(in_keys)} keys but {len(out_keys)} out_keys")
            repeated = sorted({str(k) for k in out_keys if out_keys.count(k) > 1})
            if repeated:  # one history would overwrite the other
                raise ValueError(f"History: out_keys {repeated} appear more than once; give each key its own")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"History: length must be an int >= 1, got {length!r}")
        if padding not in ("same", "zeros"):
            raise ValueError(f"History: padding must be 'same' or 'zeros', got {padding!r}")
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self.length = int(length)
        self.padding = padding

    # -- helpers ---------------------------------------------------------------------------------------------
    def _fresh(self, obs: torch.Tensor | TensorDictBase, batch_dims: int) -> torch.Tensor | TensorDictBase:
        """The history after a reset: the observation repeated, or zeros then the observation (a tensor, or a
        group entry's TensorDict alike)."""
        shape = (*obs.shape[:batch_dims], self.length, *obs.shape[batch_dims:])
        out = obs.unsqueeze(batch_dims).expand(shape).clone()
        if self.padding == "zeros" and self.length > 1:
            out[(slice(None),) * batch_dims + (slice(0, self.length - 1),)].zero_()
        return out

    @staticmethod
    def _rows(mask: torch.Tensor | None, batch_shape: torch.Size) -> torch.Tensor | None:
        """A ``(*batch,)`` bool mask from a ``"_reset"``/``"_step"`` entry (``None``: every row)."""
        if mask is None:
            return None
        mask = mask.reshape(*batch_shape, -1).any(-1) if mask.shape != batch_shape else mask
        return None if bool(mask.all()) else mask

    def _input(self, tensordict: TensorDictBase, key) -> torch.Tensor:
        value = tensordict.get(key, None)
        if value is None:
            parent = self.parent  # the env below this transform: what it observes
            observed = None if parent is None else parent.observation_spec.keys(True, True)
            if observed is not None and key not in observed:
                self._missing(key, observed)
            raise KeyError(f"History: the tensordict has no {key!r} entry to keep a history of (it has "
                           f"{sorted(map(str, tensordict.keys(True, True)))})")
        return value

    @staticmethod
    def _missing(key, observation_keys):
        raise KeyError(
            f"History: {key!r} is not an observation entry of the env (its observation entries: "
            f"{sorted(map(str, observation_keys))}); History keeps observations only (actions, rewards and flags "
            "are in the tensordict already; 'pixels' needs EnvPool(..., pixels=True))"
        )

    @staticmethod
    def _where(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        view = mask.reshape(*mask.shape, *([1] * (new.ndim - mask.ndim)))
        return torch.where(view, new, old)

    # -- TorchRL hooks ---------------------------------------------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        nb = tensordict_reset.batch_dims
        reset = None
        if tensordict is not None:
            reset = self._rows(tensordict.get("_reset", None), tensordict_reset.batch_size)
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            obs = self._input(tensordict_reset, in_key)
            fresh = self._fresh(obs, nb)
            if reset is not None and tensordict is not None:
                # rows that were not reset keep their history (when the caller passed it in): a direct
                # _reset(tensordict, tensordict_reset) call; a TransformedEnv (TorchRL 0.14.1) passes only the
                # reset and state keys and restores the rows that were not reset itself
                old = tensordict.get(out_key, None)
                if old is not None and old.shape == fresh.shape:
                    fresh = self._where(reset, fresh, old)
            tensordict_reset.set(out_key, fresh)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        nb = next_tensordict.batch_dims
        stepped = self._rows(tensordict.get("_step", None), next_tensordict.batch_size)
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            obs = self._input(next_tensordict, in_key)
            old = tensordict.get(out_key, None)
            if old is None or old.shape != (*obs.shape[:nb], self.length, *obs.shape[nb:]):
                # no history in the input (a tensordict built by hand): start one
                new = self._fresh(obs, nb)
            else:
                new = torch.cat([old.narrow(nb, 1, self.length - 1), obs.unsqueeze(nb)], dim=nb)
                if stepped is not None:
                    new = self._where(stepped, new, old)
            next_tensordict.set(out_key, new)
        return next_tensordict

    def transform_observation_spec(self, observation_spec):
        nb = len(observation_spec.shape)
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            if in_key not in observation_spec.keys(True):
                self._missing(in_key, observation_spec.keys(True, True))
            spec = observation_spec[in_key]
            batch, rest = spec.shape[:nb], spec.shape[nb:]
            history = spec.clone().unsqueeze(nb).expand(*batch, self.length, *rest)
            if self.padding == "zeros":
                history = _admitting_zeros(history)
            observation_spec[out_key] = history
        return observation_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise RuntimeError(
            "History runs on environment steps (append it to a TransformedEnv). For stored data, sample "
            "sequences with a SliceSampler (torchrl_swm.load_dataset(path).replay_buffer(slice_len=...))."
        )

    def __repr__(self) -> str:
        return f"History(keys={self.in_keys}, length={self.length}, out_keys={self.out_keys}, padding={self.padding!r})"


class FrameSkip(FrameSkipTransform):
    """TorchRL's ``FrameSkipTransform``, stopping each row at the end of its episode.

    Each step repeats the action ``frame_skip`` times and reports the last
    observation and flags with the rewards summed. TorchRL's transform repeats
    it whatever happens, so a row whose episode ends on an earlier repeat
    would be stepped past its end: gymnasium leaves that undefined, and
    :class:`~torchrl_swm.EnvPool` refuses it (``StepRefusedError``). Here such
    rows are frozen with a ``"_step"`` mask for the repeats left: they keep
    their terminal observation, flags and infos and add reward 0, so a row's
    reward sums the steps of its own episode only, as gymnasium's frame-skip
    wrappers (``MaxAndSkipObservation``, ``AtariPreprocessing``) give it. A
    ``"_step"`` mask of the caller's is kept: its frozen rows stay frozen.

    Each repeat starts from the last one's outputs (so an env whose state is
    read from the tensordict, as a ``WorldModelEnv`` with ``state_key``,
    advances, and transforms before this one see every repeat: a
    ``StepCounter`` there counts frames, while their ``inv``, an action remap,
    applies once per step), and a row frozen here keeps the last repeat's
    outputs whatever the parent reports for it. The parent must be able to freeze rows: an
    ``EnvPool`` of single envs, a :class:`~torchrl_swm.WorldModelEnv`,
    TorchRL's batched envs. A pool over a gymnasium ``VectorEnv`` steps every
    row; frame-skip inside each env there
    (``gymnasium.wrappers.MaxAndSkipObservation``).

    Args:
        frame_skip: how many times each action is applied (``>= 1``).

    Example:
        >>> from torchrl.envs import TransformedEnv
        >>> from torchrl_swm import EnvPool
        >>> from torchrl_swm.transforms import FrameSkip
        >>> env = TransformedEnv(EnvPool("CartPole-v1", num_envs=4, seed=0), FrameSkip(4))
        >>> rollout = env.rollout(50, break_when_any_done=False)   # episodes end mid-skip: no refusal
        >>> float(rollout["next", "reward"].max()) <= 4.0            # at most 4 CartPole steps per step
        True
        >>> env.close()
    """

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        parent = self.parent
        if parent is None:
            raise RuntimeError("FrameSkip needs a parent env: append it to a TransformedEnv")
        reward_key, done_keys = parent.reward_key, parent.done_keys
        reward = next_tensordict.get(reward_key)
        caller_mask = tensordict.get("_step", None)
        rows = next_tensordict.batch_size
        for _ in range(self.frame_skip - 1):
            live = ~functools.reduce(torch.logical_or, (next_tensordict.get(key) for key in done_keys))
            if caller_mask is not None:
                live &= caller_mask.reshape(live.shape)
            if not live.any():
                break
            # the next repeat starts where the last one ended (an env whose state is in the tensordict reads it
            # there), with the same action; the caller's tensordict stays as it came
            repeat = tensordict.clone(False).update(next_tensordict.exclude(reward_key, *done_keys))
            stepped = _step_again(parent, repeat.set("_step", live))
            # rows frozen here keep the last repeat's outputs and add nothing, whatever the parent reports for
            # them (TorchRL's batched envs give a frozen row its input values back)
            reward = reward + torch.where(live, stepped.get(reward_key), torch.zeros((), dtype=reward.dtype))
            stepped = stepped.select(*next_tensordict.keys(True, True), strict=False)  # (an unlocked env adds action)
            next_tensordict = stepped.where(live.reshape(rows), next_tensordict.select(*stepped.keys(True, True)))
        return next_tensordict.set(reward_key, reward)


def _step_again(parent, tensordict: TensorDictBase) -> TensorDictBase:
    """``parent``'s step of a ``tensordict`` its transforms already read backwards (``inv``: the action a
    policy gave, remapped for the env), as ``TransformedEnv._step`` does after its ``inv``: the base env's
    step (its own transforms included), then the transforms' forward ``_step``. ``parent._step`` would apply
    their ``inv`` again (an action remap twice)."""
    if not isinstance(parent, TransformedEnv):
        return parent._step(tensordict)
    base = parent.base_env
    stepped = base._step(tensordict)
    base._complete_done(base.full_done_spec, stepped)
    return parent.transform._step(tensordict, stepped)
