"""The one place where TorchRL data becomes gymnasium data, and actions go the other way.

Everything the adapters (:mod:`.gymnasium_env`, :mod:`.vector_env`, :mod:`.sb3`)
hand to a client passes through :class:`Layout` and :func:`to_host`:

* :class:`Layout` reads the env's specs once and decides which leaves are the
  observation (a ``Box`` for a single key, a ``Dict`` otherwise), which are
  infos, and how actions are encoded. A leaf (or the action) that an
  :class:`~torchrl_swm.pool.EnvPool` at the base produces, with its spec left
  alone by any transform above, gets the pool's own gymnasium space, exactly
  what gymnasium's ``SyncVectorEnv`` over the same envs shows (``Discrete(n,
  start)`` included). Other spaces come from :func:`torchrl_swm.specs.spec_to_space`.
* :meth:`Layout.encode_action` validates a numpy (or torch) action against that
  space (a discrete one in ``[start, start + n)``) and returns a tensor on the
  env's device in the spec's encoding (indices from 0, one-hot vectors for
  ``OneHot`` specs). Wrong shapes raise; nothing is reshaped.
* :meth:`Leaf.decode` turns a leaf into the space's layout and dtype on the
  env's device (one-hot back to indices, casts, ``+ start``), before any transfer.
* :func:`to_host` copies a list of device tensors to fresh numpy arrays: on an
  accelerator, one packed device-to-host transfer; on the CPU, one copy per
  leaf (so nothing handed out aliases a tensor TorchRL keeps using).

Env traits (:func:`traits`) say what the wrapped env supports: per-env seeds
and options and ``call``/``get_attr``/``set_attr`` (an :class:`~torchrl_swm.pool.EnvPool`
at the base), and TorchRL's ``"_step"`` partial-step mask (envs of this package
and their subclasses, ``SerialEnv``/``ParallelEnv`` of unbatched envs, and
batch-unlocked envs).
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Binary, Composite, MultiOneHot, OneHot, TensorSpec
from torchrl.envs import EnvBase, GymWrapper, TransformedEnv
from torchrl.envs.batched_envs import BatchedEnvBase

from ..errors import SpecError, describe, error_text
from ..introspect import bookkeeping_keys, step_limits
from ..pool.infos import cast_problem
from ..pool.rows import dict_paths, observation_leaves  # the pool's own keys and Dict paths of its leaves
from ..specs import numpy_dtype, spec_to_space, torch_dtype, unbatch_spec

__all__ = ["Layout", "Traits", "traits", "base_env", "to_host", "AUTORESET_MODES"]

Key = tuple[str, ...]

AUTORESET_MODES = {
    "next_step": gym.vector.AutoresetMode.NEXT_STEP,
    "same_step": gym.vector.AutoresetMode.SAME_STEP,
    "disabled": gym.vector.AutoresetMode.DISABLED,
}

#: Root observation keys of this package's envs that are metadata, reported as infos
#: (``"info_mask"`` holds the presence masks of ``"info"`` leaves: gymnasium's ``"_key"``).
_INFO_ROOT_KEYS = ("info", "episode_seed", "info_mask")


def autoreset_mode(mode) -> gym.vector.AutoresetMode:
    """``"next_step"``/``"same_step"``/``"disabled"`` (or the enum) as an :class:`AutoresetMode`."""
    if isinstance(mode, gym.vector.AutoresetMode):
        return mode
    if isinstance(mode, str):
        key = mode.lower().replace("-", "_")
        key = {"nextstep": "next_step", "samestep": "same_step"}.get(key, key)
        if key in AUTORESET_MODES:
            return AUTORESET_MODES[key]
    raise ValueError(
        f"autoreset_mode: expected one of {sorted(AUTORESET_MODES)} or a gymnasium.vector.AutoresetMode, got {mode!r}"
    )


def _key(key) -> Key:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    raise TypeError(f"expected a key (a string or a tuple of strings), got {key!r}")


def base_env(env: EnvBase) -> EnvBase:
    """The env under every ``TransformedEnv`` layer."""
    while isinstance(env, TransformedEnv):
        env = env.base_env
    return env


def step_after_close_error(call: str, env: EnvBase) -> RuntimeError:
    """The error of an export's ``step()`` (``call``, e.g. ``"TorchRLVectorEnv.step()"``) after its ``close()``
    and before a reset reopens it: stepping a batched TorchRL env then would restart its workers on a stale root.
    An EnvPool never reopens: its message says so."""
    from ..pool import EnvPool

    base = base_env(env)
    if isinstance(base, EnvPool):
        return RuntimeError(f"{call} after close(): the {type(base).__name__} it wraps is closed, and a closed pool "
                            "cannot be reopened; export a new pool")
    return RuntimeError(
        f"{call} after close(): {type(base).__name__} is closed; reset() reopens it (as it reopens a "
        "WorldModelEnv or TorchRL's batched envs), or export a new env"
    )


@dataclass(frozen=True)
class Traits:
    """What the wrapped env supports (see the module docstring)."""

    pool: object | None  # the EnvPool at the base, or None
    partial_steps: bool  # honours TorchRL's "_step" mask
    frozen_rows_exact: bool  # a frozen row reports its current (reset) outputs itself: untransformed package env
    package_env: bool  # an env of this package: info leaves follow its (N, 1, *v) convention
    world_model: bool = False  # a WorldModelEnv at the base: reset(seed=, options=) reach its reset_fn
    batched_wrapper: bool = False  # a TorchRL wrapper of an already-batched env (GymWrapper of a VectorEnv)


def is_package_env(env: EnvBase) -> bool:
    """Whether ``env``'s class is, or derives from, an env class of this package.

    A subclass in user code (``class MyPool(EnvPool)``) keeps the contract of
    the class it derives from, so it is a package env too: what counts is the
    class hierarchy (an ``isinstance`` test against every env class of the
    package), never the module the final class happens to live in.
    """
    return any(
        cls.__module__.startswith("torchrl_swm.") and issubclass(cls, EnvBase) and cls is not EnvBase
        for cls in type(env).__mro__
    )


def traits(env: EnvBase) -> Traits:
    from ..pool import EnvPool
    from ..world_model import WorldModelEnv

    base = base_env(env)
    is_pool = isinstance(base, EnvPool)
    package = is_pool or is_package_env(base)
    # SerialEnv/ParallelEnv honour "_step" when it selects whole workers: one row per worker. Under a
    # transform that reshapes one of their own observation keys (CatFrames on "observation"), TorchRL's
    # partial step copies the transformed root into their buffers and fails: such an env steps every row
    workers = isinstance(base, BatchedEnvBase) and len(base.batch_size) == 1 and _keeps_base_shapes(env, base)
    # a pool over a gymnasium VectorEnv steps every row at once: it cannot freeze rows. TorchRL steps a
    # batch-unlocked env's "_step" rows as a sub-batch, which an env with a batch dim cannot take (its
    # reward spec is the whole batch's): such an env steps every row
    partial = base.freezes_rows if is_pool else (package or workers)
    return Traits(
        pool=base if is_pool else None,
        partial_steps=bool(partial),
        # a subclass's own _step or _reset (reward shaping, a reset reading attributes set between steps) may not
        # report a frozen row as its reset: such an env is treated as a transformed one
        frozen_rows_exact=(is_pool or package) and env is base and getattr(base, "_own_step_and_reset", True),
        package_env=package,
        world_model=isinstance(base, WorldModelEnv),
        # TorchRL's GymWrapper of a gymnasium VectorEnv or an SB3 VecEnv: one env.step steps (and auto-resets)
        # every row, and a masked reset must match its done rows
        batched_wrapper=isinstance(base, GymWrapper) and bool(base._is_batched),
    )


def _keeps_base_shapes(env: EnvBase, base: EnvBase) -> bool:
    """Whether every observation key of ``base`` that ``env``'s transforms keep has the same shape in ``env``."""
    if env is base:
        return True
    outer = env.full_observation_spec
    return all(
        outer[key].shape == spec.shape
        for key, spec in base.full_observation_spec.items(True, True)
        if key in outer.keys(True, True)
    )


# ----------------------------------------------------------------------------------------
# leaves
# ----------------------------------------------------------------------------------------


class Leaf:
    """One TorchRL leaf exposed to gymnasium.

    ``path`` is where it goes in the gymnasium structure (the Dict path of an
    observation, the info dict path of an info); ``squeeze`` drops the
    package's time dim of 1 from info leaves. Everything :meth:`decode` needs is
    worked out here, once.
    """

    __slots__ = ("key", "path", "spec", "space", "np_dtype", "squeeze", "get_key", "torch_dtype", "_kind", "_split",
                 "_start")

    def __init__(self, key: Key, path: Key, spec: TensorSpec, space, np_dtype, squeeze: bool = False,
                 device: torch.device | None = None):
        self.key, self.path, self.spec, self.space = key, path, spec, space
        self.np_dtype = np.dtype(np_dtype)
        self.squeeze = squeeze
        self.get_key = key[0] if len(key) == 1 else key  # tensordict's string path is the fast one
        self.torch_dtype = torch_dtype(self.np_dtype)
        self._split = None
        # Discrete(n, start) / MultiDiscrete(nvec, start): the env stores indices from 0
        self._start = _space_start(space, device)
        # an observation's one-hot spec is exposed as indices (Discrete); an info (no space) passes as it is
        if space is not None and isinstance(spec, MultiOneHot):
            self._kind, self._split = "multi_one_hot", [int(n) for n in spec.nvec]
        elif space is not None and isinstance(spec, OneHot):
            self._kind = "one_hot"
        elif squeeze:
            self._kind = "squeeze"
        elif spec.dtype != self.torch_dtype:
            self._kind = "cast"
        elif self._start is not None:
            self._kind = "start"
        else:
            self._kind = None

    def decode(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (batch dims first) in the space's layout and dtype, on its device."""
        kind = self._kind
        if kind is None:
            return value
        if kind == "start":
            return self._add_start(value)
        if kind in ("multi_one_hot", "one_hot") and value.dtype is torch.bool:
            value = value.to(torch.uint8)  # torch has no argmax for bool (TorchRL's default one-hot dtype)
        if kind == "multi_one_hot":
            value = torch.stack([p.argmax(-1) for p in value.split(self._split, dim=-1)], -1)
        elif kind == "one_hot":
            value = value.argmax(-1)
        elif kind == "squeeze":
            value = value.squeeze(-len(self.spec.shape) - 1)
        if self._start is not None:
            return self._add_start(value)
        if value.dtype != self.torch_dtype:
            value = value.to(self.torch_dtype)
        return value

    def _add_start(self, value: torch.Tensor) -> torch.Tensor:
        # in int64, then the space's dtype: an int64 start would promote an int32 value, and torch has no
        # addition for uint16/32/64; the sum is a value of the space, so the cast is exact
        value = value.to(torch.int64) + self._start
        return value if value.dtype == self.torch_dtype else value.to(self.torch_dtype)


def _space_start(space, device) -> int | torch.Tensor | None:
    """The ``start`` of a ``Discrete``/``MultiDiscrete`` space (``None`` when it is 0): an int, or a
    tensor on ``device`` for ``MultiDiscrete``."""
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return start or None
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start, dtype=np.int64)
        return torch.as_tensor(start, device=device) if start.any() else None
    return None


def _unbatch(spec: TensorSpec, ndim: int, what: str) -> TensorSpec:
    """:func:`unbatch_spec` with the failures of odd specs turned into a :class:`SpecError`."""
    try:
        single = unbatch_spec(spec, ndim)
    except (IndexError, RuntimeError, ValueError) as err:
        shape = tuple(spec.shape)
        if isinstance(spec, Binary) and len(shape) <= ndim:
            raise SpecError(
                f"{what}: a Binary spec of shape {shape} has no per-env dims after the batch dims {shape[:ndim]}, "
                "so it has no MultiBinary counterpart (a Binary spec's last dim is its event dim); give it "
                f"shape {(*shape[:ndim], 1)}"
            ) from err
        raise SpecError(
            f"{what}: cannot drop the batch dims {shape[:ndim]} from {type(spec).__name__} of shape {shape}: "
            f"{error_text(err)}"
        ) from err
    if tuple(single.shape) != tuple(spec.shape[ndim:]):
        # a spec at odds with itself (TorchRL's CatFrames over a MultiCategorical keeps the old nvec): its
        # space would not hold the values the env returns
        nvec = getattr(spec, "nvec", None)
        raise SpecError(
            f"{what}: {type(spec).__name__} of shape {tuple(spec.shape)} gives per-env shape {tuple(single.shape)} "
            f"without its batch dims, not {tuple(spec.shape[ndim:])}"
            + ("" if nvec is None else f" (its nvec has shape {tuple(nvec.shape)})")
            + "; the spec does not describe the values (a transform that changed the shape without updating "
            "the spec?): fix the spec, or leave the key out with observation_keys="
        )
    return single


def _info_leaf(key: Key, spec: TensorSpec, squeeze: bool, name: str) -> Leaf:
    path = key[1:] if key[0] == "info" else key
    try:
        dtype = numpy_dtype(spec.dtype)
    except (TypeError, RuntimeError, AttributeError) as err:
        raise SpecError(
            f"{name}: info leaf {key} has dtype {getattr(spec, 'dtype', None)}, which numpy cannot hold"
        ) from err
    if dtype.kind not in "biuf":
        raise SpecError(f"{name}: info leaf {key} has dtype {dtype}; expected bool, integer or float")
    # the package's envs give info leaves a time dim of 1 ((N, 1, *v)) and "episode_seed" the done
    # shape (N, 1): a gymnasium info value is one per env, so that dim goes
    squeeze = squeeze and len(spec.shape) >= 1 and spec.shape[0] == 1
    if squeeze:
        spec = spec[0]
    return Leaf(key, path, spec, None, dtype, squeeze)


def _nest_space(leaves: Sequence[Leaf], template: gym.Space | None = None) -> gym.spaces.Dict:
    """The leaves' spaces as a (nested) Dict in their order. ``template``: the pool's own Dict
    observation space, whose ``sort_keys`` each Dict copies, so that ``batch_space`` orders the
    batched space's keys exactly as on gymnasium's own vector envs."""
    tree: dict = {}
    for leaf in leaves:
        node = tree
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        node[leaf.path[-1]] = leaf.space

    def build(node, like):
        items = OrderedDict(
            (k, build(v, like[k] if isinstance(like, gym.spaces.Dict) and k in like.spaces else None)
             if isinstance(v, dict) else v)
            for k, v in node.items()
        )
        # the env's key order (an OrderedDict: gymnasium would sort a plain dict's keys and change the layout
        # flattening gives), and the env's sort_keys, which batch_space applies to the batched space
        return gym.spaces.Dict(items, sort_keys=like.sort_keys if isinstance(like, gym.spaces.Dict) else False)

    return build(tree, template)


def nest(leaves: Sequence[Leaf], values: Sequence) -> dict:
    """``{path: value}`` as a nested dict following each leaf's path."""
    out: dict = {}
    for leaf, value in zip(leaves, values):
        node = out
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        node[leaf.path[-1]] = value
    return out


# ----------------------------------------------------------------------------------------
# the layout
# ----------------------------------------------------------------------------------------


class Layout:
    """Which leaves of a TorchRL env become the gymnasium observation, infos and action.

    Args:
        env: the TorchRL env, with ``batch_size`` ``[]`` or ``[N]``.
        observation_keys: ``None`` (default: every observation leaf that is not
            an info leaf nor written by a bookkeeping transform, see
            :func:`~torchrl_swm.introspect.bookkeeping_keys`; one leaf gives that leaf's space, a ``Box`` for most
            envs, several a ``Dict``; an ``EnvPool`` with a ``Dict`` observation
            space keeps its ``Dict`` while the leaf is still one of its entries),
            one key (a string, or a tuple for one nested key: the observation is
            that leaf's space), or a list of keys (the observation is a ``Dict``).
        info_keys: ``None`` (default: the leaves under ``"info"`` plus
            ``"episode_seed"``), one key (a string or a tuple, as for
            ``observation_keys``), or a list of keys (``[]`` for none).
        name: used in error messages.

    Spaces: a leaf, or the action, that an ``EnvPool`` at the base produces and
    whose spec no transform changed gets the pool's own gymnasium space (its
    ``Discrete``/``MultiDiscrete`` ``start`` included: observations are decoded
    to ``start + index`` and actions encoded as ``action - start``); any other
    leaf gets :func:`~torchrl_swm.specs.spec_to_space` of its spec.

    Raises:
        SpecError: batch dims beyond one, several action or reward keys, nested
            done keys, an unknown key, or a spec type gymnasium cannot express.
    """

    def __init__(self, env: EnvBase, *, observation_keys=None, info_keys=None, name: str = "to_gymnasium",
                 index_spaces: bool = False):
        self.name = name
        self._index_spaces = index_spaces
        self.batch_size = tuple(env.batch_size)
        if len(self.batch_size) > 1:
            raise SpecError(
                f"{name}: env has batch_size {list(self.batch_size)}; the export supports [] (a gymnasium.Env) or "
                "[N] (a gymnasium VectorEnv). Flatten the batch (e.g. one EnvPool of N*M envs) first."
            )
        self.device = env.device if env.device is not None else torch.device("cpu")
        ndim = len(self.batch_size)
        self._pool = traits(env).pool
        self._action(env, ndim)
        self._reward_and_done(env, ndim)
        self._observations(env, ndim, observation_keys, info_keys)
        #: every key read from a step's output: observations, terminated(, truncated), infos and their masks
        self.reported_keys: list = [
            *(leaf.get_key for leaf in self.obs_leaves),
            *(k for k in (self.terminated_key, self.truncated_key) if k is not None),
            *(leaf.get_key for leaf in (*self.info_leaves, *self.info_mask_leaves)),
        ]

    # -- action -----------------------------------------------------------------
    def _action(self, env, ndim):
        keys = env.action_keys
        if len(keys) != 1:
            raise SpecError(f"{self.name}: the env has {len(keys)} action keys {keys}; the export supports exactly one")
        self.action_key = keys[0]
        batched = env.full_action_spec[self.action_key]
        spec = _unbatch(batched, ndim, f"{self.name}: action_spec")
        self.action_spec = spec
        space = self._pool_space(self.action_key, batched, "action")
        if space is None:
            space = spec_to_space(spec, name=f"{self.name}: action_spec")
        self.single_action_space = space
        self.action_shape = tuple(space.shape)
        self.action_torch_dtype = spec.dtype
        self._action_int = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        # an integer Box takes integers that fit its dtype: a cast would truncate or wrap them
        self._action_int_box = isinstance(space, gym.spaces.Box) and space.dtype.kind in "iu"
        # a bool Box takes bools, or numbers that are exactly 0 or 1: a cast would make 0.5, 2 or NaN True
        self._action_bool_box = isinstance(space, gym.spaces.Box) and space.dtype.kind == "b"
        self._action_high = None
        if isinstance(space, gym.spaces.Discrete):
            self._action_high = int(space.n)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self._action_high = np.asarray(space.nvec)
        elif isinstance(space, gym.spaces.MultiBinary):
            self._action_high = 2
        # the space's start (Discrete/MultiDiscrete): a host value for numpy actions, and on the
        # env's device for torch actions that are not checked on the host
        self._action_start = _space_start(space, None)
        if isinstance(self._action_start, torch.Tensor):
            self._action_start_np = self._action_start.numpy()
            self._action_start_dev = self._action_start.to(self.device)
        else:
            self._action_start_np = self._action_start_dev = self._action_start

    # -- the pool's own spaces ------------------------------------------------------
    def _pool_space(self, key, batched_spec: TensorSpec, what: str) -> gym.Space | None:
        """The ``EnvPool``'s own gymnasium space for an action or observation leaf ``key``, when the
        exported env's spec of that leaf is still the pool's (no transform changed it); else ``None``."""
        pool = self._pool
        if pool is None:
            return None
        key = _key(key)
        if what == "action":
            if key != _key(pool.action_key) or batched_spec != pool.full_action_spec[pool.action_key]:
                return None
            return self._client_space(pool.single_action_space)
        spaces = self._pool_observation_spaces()
        if key not in spaces or key not in pool.observation_spec.keys(True, True):
            return None
        if batched_spec != pool.observation_spec[key]:
            return None
        return self._client_space(spaces[key])

    def _client_space(self, space: gym.Space) -> gym.Space:
        """A copy of the pool's ``space``; with ``index_spaces`` (clients that ignore ``start``, as
        Stable-Baselines3 does) a ``Discrete``/``MultiDiscrete`` one starts at 0: values are the indices."""
        if self._index_spaces and isinstance(space, gym.spaces.Discrete):
            return gym.spaces.Discrete(int(space.n), dtype=space.dtype)
        if self._index_spaces and isinstance(space, gym.spaces.MultiDiscrete):
            return gym.spaces.MultiDiscrete(space.nvec, dtype=space.dtype)
        return copy.deepcopy(space)

    def _pool_dict_paths(self) -> dict[Key, tuple]:
        """``{pool key: the env's own Dict keys to that leaf}`` for a pool with a Dict observation space."""
        if self._pool is None or not isinstance(self._pool.single_observation_space, gym.spaces.Dict):
            return {}
        return {_key(k): v for k, v in dict_paths(self._pool.single_observation_space).items()}

    def _pool_observation_spaces(self) -> dict[Key, gym.Space]:
        spaces = getattr(self, "_pool_obs_spaces", None)
        if spaces is None:
            spaces = {_key(k): v for k, v in observation_leaves(self._pool.single_observation_space).items()}
            self._pool_obs_spaces = spaces
        return spaces

    # -- reward and done --------------------------------------------------------
    def _reward_and_done(self, env, ndim):
        rewards = env.reward_keys
        if len(rewards) != 1:
            raise SpecError(
                f"{self.name}: the env has {len(rewards)} reward keys {rewards}; the export supports exactly one"
            )
        self.reward_key = rewards[0]
        rspec = _unbatch(env.full_reward_spec[self.reward_key], ndim, f"{self.name}: reward_spec")
        if rspec.shape.numel() != 1:
            raise SpecError(
                f"{self.name}: reward spec has per-env shape {tuple(rspec.shape)}; gymnasium rewards are scalars "
                "(expected () or (1,))"
            )
        self.reward_dtype = rspec.dtype if rspec.dtype in (torch.float32, torch.float64) else torch.float32
        done_keys = set(env.done_keys)
        if any(isinstance(k, tuple) and len(k) > 1 for k in done_keys):
            raise SpecError(
                f"{self.name}: nested done keys {sorted(map(str, done_keys))} (multi-agent groups) are not supported"
            )
        done_keys = {k if isinstance(k, str) else k[0] for k in done_keys}
        self.terminated_key = "terminated" if "terminated" in done_keys else "done"
        self.truncated_key = "truncated" if "truncated" in done_keys else None
        self.done_keys = sorted(done_keys)
        for transform, ends_episodes in step_limits(env):
            if not ends_episodes:
                # truncated without done: TorchRL's episode goes on, gymnasium's ends on truncation (and the
                # export would reset a row its env does not)
                raise SpecError(
                    f"{self.name}: StepCounter(max_steps={transform.max_steps}, update_done=False) flags truncated "
                    "without ending the episode, which a gymnasium env cannot express (an episode ends when "
                    "terminated or truncated). Use update_done=True (StepCounter's default) for the export"
                )

    # -- observations and infos ---------------------------------------------------
    def _observations(self, env, ndim, observation_keys, info_keys):
        spec = env.observation_spec
        leaves = [_key(k) for k in spec.keys(True, True)]
        package = traits(env).package_env
        auto_info = [k for k in leaves if k[0] in _INFO_ROOT_KEYS and k[0] != "info_mask"]
        if info_keys is None:
            info = auto_info
        else:
            # one key (a string, or a tuple naming one nested key), or a list of keys: as observation_keys
            wanted = [info_keys] if isinstance(info_keys, (str, tuple)) else info_keys
            info = self._select(spec, leaves, wanted, "info_keys")
            info = [k for k in info if k[0] != "info_mask"]
        self.info_leaves = self._without_clashes([
            _info_leaf(k, _unbatch(spec[k], ndim, f"{self.name}: observation_spec[{k}]"), package, self.name)
            for k in info
        ], chosen=info_keys is not None)
        # presence masks: ("info_mask", *path) says where ("info", *path) was reported
        masks = {k[1:]: k for k in leaves if k[0] == "info_mask"}
        self.info_mask_leaves: list[Leaf] = []
        self.info_mask_index: list[int | None] = []  # per info leaf: its mask's index in info_mask_leaves
        for leaf in self.info_leaves:
            mask_key = masks.get(leaf.key[1:]) if leaf.key[0] == "info" else None
            if mask_key is None:
                self.info_mask_index.append(None)
                continue
            self.info_mask_index.append(len(self.info_mask_leaves))
            mask_spec = _unbatch(spec[mask_key], ndim, f"{self.name}: observation_spec[{mask_key}]")
            self.info_mask_leaves.append(_info_leaf(mask_key, mask_spec, package, self.name))

        # single_leaf: the observation is one leaf's space (a Box for most envs), not a Dict
        self.single_leaf = False
        spaces = {}  # the pool's own spaces of the leaves it produces, as gymnasium's SyncVectorEnv shows them
        for key in leaves:
            space = self._pool_space(key, spec[key], "observation")
            if space is not None:
                spaces[key] = space
        if observation_keys is None:
            # every observation leaf but the infos (those chosen with info_keys too) and the bookkeeping of
            # transforms (a StepCounter's "step_count"...: gymnasium's TimeLimit never changes the observation)
            chosen = set(info) | bookkeeping_keys(env)
            obs = [k for k in leaves if k[0] not in _INFO_ROOT_KEYS and k not in chosen]
            # an EnvPool's Dict observation stays a Dict, as on SyncVectorEnv, while its leaf is one of the
            # pool's Dict entries; a leaf a transform made (CatTensors...) is a Box
            dict_space = (
                self._pool is not None
                and isinstance(self._pool.single_observation_space, gym.spaces.Dict)
                and len(obs) == 1
                and obs[0] in spaces
            )
            self.single_leaf = len(obs) == 1 and not dict_space
        elif isinstance(observation_keys, (str, tuple)):
            obs = self._select(spec, leaves, [observation_keys], "observation_keys")
            if len(obs) != 1:
                raise SpecError(
                    f"{self.name}: observation_keys={observation_keys!r} names a sub-tree of {len(obs)} leaves; pass a "
                    "list of keys for a Dict observation"
                )
            self.single_leaf = True
        else:
            obs = self._select(spec, leaves, observation_keys, "observation_keys")
        if not obs:
            raise SpecError(f"{self.name}: the env has no observation leaf to export (observation_spec keys: {leaves})")
        self.obs_leaves = []
        own_paths = self._pool_dict_paths()
        for key in obs:
            leaf_spec = _unbatch(spec[key], ndim, f"{self.name}: observation_spec[{key}]")
            # an info leaf chosen as an observation loses the package's time dim of 1, as it does as an info
            squeeze = package and key[0] in _INFO_ROOT_KEYS and len(leaf_spec.shape) >= 1 and leaf_spec.shape[0] == 1
            if squeeze:
                leaf_spec = leaf_spec[0]
            space = spaces.get(key)
            path = key
            if space is None:
                space = spec_to_space(leaf_spec, name=f"{self.name}: observation_spec[{key}]")
            else:  # the pool's own leaf: under the env's own Dict keys (1, not the TensorDict key "1")
                path = own_paths.get(key, key)
            dtype = np.dtype(space.dtype)
            self.obs_leaves.append(Leaf(key, path, leaf_spec, space, dtype, squeeze, device=self.device))
        # one env's row of a Box leaf of shape () is a 0-d array, as gymnasium envs return it (a Discrete's a scalar)
        self.obs_is_box = [isinstance(leaf.space, gym.spaces.Box) for leaf in self.obs_leaves]
        if self.single_leaf:
            self.single_observation_space = self.obs_leaves[0].space
        else:
            pool_space = None if self._pool is None else self._pool.single_observation_space
            self.single_observation_space = _nest_space(self.obs_leaves, pool_space)

    def _without_clashes(self, leaves: list[Leaf], chosen: bool) -> list[Leaf]:
        """Info leaves that go to different places of the info dict. An env's own info named like one of the
        pool's root leaves (an ``("info", "episode_seed")`` and the pool's ``"episode_seed"``) would overwrite
        it: by default the env's own wins, as ``SyncVectorEnv`` shows it; leaves chosen with ``info_keys`` that
        clash are an error."""

        def clash(a: Leaf, b: Leaf) -> bool:
            n = min(len(a.path), len(b.path))
            return a.path[:n] == b.path[:n]

        if not chosen:
            own = [leaf for leaf in leaves if leaf.key[0] == "info"]
            leaves = [leaf for leaf in leaves if leaf.key[0] == "info" or not any(clash(leaf, o) for o in own)]
        for i, a in enumerate(leaves):
            for b in leaves[i + 1:]:
                if clash(a, b):
                    raise SpecError(
                        f"{self.name}: info leaves {a.key} and {b.key} would both go to info[{a.path[0]!r}]: choose "
                        f"one of them with info_keys="
                    )
        return leaves

    def _select(self, spec: Composite, leaves: list[Key], wanted, what) -> list[Key]:
        out = []
        if isinstance(wanted, (str, bytes)) or not isinstance(wanted, Iterable):
            raise TypeError(
                f"{self.name}: {what}: expected a key (str or tuple of str) or a list of keys, got {describe(wanted)}"
            )
        wanted = list(wanted)
        for raw in wanted:
            parts = raw if isinstance(raw, tuple) else (raw,)
            if not isinstance(raw, (str, tuple)) or not all(isinstance(p, str) for p in parts):
                raise TypeError(
                    f"{self.name}: {what}: expected keys (str or tuple of str), got {describe(raw)} in {wanted!r}"
                )
            key = _key(raw)
            matches = [k for k in leaves if k[: len(key)] == key]
            if not matches:
                raise SpecError(f"{self.name}: {what}: {raw!r} is not in the env's observation_spec (leaves: {leaves})")
            out.extend(m for m in matches if m not in out)
        return out

    # -- leaves out ------------------------------------------------------------------
    def observations(self, td) -> list[torch.Tensor]:
        """The observation leaves of ``td``, decoded (still on the env's device)."""
        return [leaf.decode(td.get(leaf.get_key)) for leaf in self.obs_leaves]

    def infos(self, td) -> list[torch.Tensor]:
        """The info leaves of ``td`` then their presence masks, decoded (still on the env's device)."""
        return [leaf.decode(td.get(leaf.get_key)) for leaf in (*self.info_leaves, *self.info_mask_leaves)]

    def info_entries(self, values: Sequence):
        """``(leaf, value, mask or None)`` for each info leaf, from :meth:`infos`' values (moved anywhere)."""
        n = len(self.info_leaves)
        masks = values[n:]
        for leaf, value, index in zip(self.info_leaves, values[:n], self.info_mask_index, strict=True):
            yield leaf, value, None if index is None else masks[index]

    def raw_flags(self, td) -> list[torch.Tensor]:
        """``[reward, terminated(, truncated)]`` of a ``"next"`` tensordict, as stored (``(*batch, 1)``)."""
        out = [td.get(self.reward_key), td.get(self.terminated_key)]
        if self.truncated_key is not None:
            out.append(td.get(self.truncated_key))
        return out

    def host_flags(self, values: Sequence[np.ndarray], batch: tuple[int, ...]):
        """:meth:`raw_flags` after the transfer: ``(reward, terminated, truncated)`` of shape ``batch``."""
        reward = values[0].reshape(batch)
        if reward.dtype.kind != "f" or reward.dtype.itemsize < 4:
            reward = reward.astype(np.float32)
        term = values[1].reshape(batch)
        trunc = values[2].reshape(batch) if len(values) > 2 else np.zeros(batch, np.bool_)
        return reward, term, trunc

    def flags(self, td, batch: tuple[int, ...]):
        """``(reward, terminated, truncated)`` of a ``"next"`` tensordict, each of shape ``batch``."""
        reward = td.get(self.reward_key).reshape(batch)
        if reward.dtype != self.reward_dtype:
            reward = reward.to(self.reward_dtype)
        term = td.get(self.terminated_key).reshape(batch)
        if self.truncated_key is not None:
            trunc = td.get(self.truncated_key).reshape(batch)
        else:
            trunc = torch.zeros_like(term)
        return reward, term, trunc

    # -- actions in -------------------------------------------------------------------
    def encode_action(self, action, batch: tuple[int, ...]) -> torch.Tensor:
        """Validate ``action`` (numpy-like or torch) of shape ``(*batch, *single_action_shape)``.

        Returns a tensor on the env's device in the action spec's encoding
        (``action - start`` for a ``Discrete``/``MultiDiscrete`` space with a ``start``).

        The discrete range check (``[start, start + n)``) runs on the host: numpy
        actions and CPU tensors are checked where they are; a torch action on an
        accelerator for an env on the CPU is first moved to the CPU (the transfer
        the step makes anyway, done here with a blocking copy so the host reads
        finished data) and checked there. A torch action already on an env's
        accelerator is not range-checked here: reading a flag back would add a
        device-to-host synchronisation to every step, on top of the one the
        outputs make; the env validates it (an ``EnvPool`` does, on its host copy).

        Raises:
            ValueError: a wrong shape, or a discrete action out of range.
            TypeError: a dtype that does not fit the space (float for a discrete action...).
        """
        expected = (*batch, *self.action_shape)
        if isinstance(action, torch.Tensor):
            tensor = action
            kind = "f" if tensor.is_floating_point() else ("b" if tensor.dtype is torch.bool else "i")
            if tensor.is_complex():
                kind = "c"
            host = tensor.device.type == "cpu"
            array = None
        else:
            array = action if isinstance(action, np.ndarray) else np.asarray(action)
            kind = array.dtype.kind
            tensor = None
            host = True
        shape = tuple(tensor.shape if tensor is not None else array.shape)
        if shape != expected:
            raise ValueError(
                f"action: expected shape {expected} for {self.single_action_space}"
                f"{' with ' + str(batch[0]) + ' envs' if batch else ''}, got {describe(action)}; "
                "actions are never reshaped"
            )
        if self._action_int:
            binary = isinstance(self.single_action_space, gym.spaces.MultiBinary)
            if binary and kind == "f":
                # 0./1. floats, as gymnasium's MultiBinary.contains accepts and SB3's policies send
                tensor, array = _binary_from_float(tensor, array, action, self.single_action_space)
                kind = "i"
            elif kind not in ("biu" if binary else "iu"):
                raise TypeError(f"action: expected integers for {self.single_action_space}, got {describe(action)}")
        elif kind not in "biuf":
            raise TypeError(f"action: expected real numbers for {self.single_action_space}, got {describe(action)}")
        elif self._action_int_box and kind == "f":
            raise TypeError(
                f"action: expected integers for {self.single_action_space} (an integer Box), got {describe(action)}; "
                "casting would truncate the values: round or cast the action first"
            )
        elif self._action_bool_box and kind != "b":
            tensor, array = _binary_from_float(tensor, array, action, self.single_action_space)
        if tensor is None:
            if not array.flags.c_contiguous or not array.dtype.isnative:
                array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
            tensor = torch.from_numpy(array)
        elif not host and self._action_high is not None and self.device.type == "cpu":
            # an accelerator action for a CPU env: make the step's one transfer now, blocking (a
            # non-blocking device-to-host copy may not have landed when the host reads it), and check it
            tensor = tensor.to("cpu")
            host = True
        if self._action_high is not None and tensor.numel():
            start = self._action_start_np
            if host:
                values = array if array is not None else tensor.numpy()
                index = values if start is None else np.asarray(values.astype(np.int64) - start)  # 0-d stays an array
                # with a start, astype(int64) would wrap uint64 values past int64 into range
                wraps = start is not None and values.dtype == np.uint64 and bool((values > 2**63 - 1).any())
                if wraps or _out_of_range(index, self._action_high):
                    raise ValueError(
                        f"action: every value must lie in {self.single_action_space}, got {describe(action)} "
                        f"with min {values.min()} and max {values.max()}"
                    )
                if start is not None:
                    tensor = torch.from_numpy(index)
            elif start is not None:
                tensor = tensor.to(self.device, torch.int64, non_blocking=True) - self._action_start_dev
        spec = self.action_spec
        if isinstance(spec, MultiOneHot):
            tensor = tensor.to(self.device, torch.int64, non_blocking=True)
            tensor = torch.cat([F.one_hot(tensor[..., i], int(n)) for i, n in enumerate(spec.nvec)], -1)
        elif isinstance(spec, OneHot):
            tensor = tensor.to(self.device, torch.int64, non_blocking=True)
            tensor = F.one_hot(tensor, int(spec.space.n))
        if self._action_int_box and tensor.dtype != self.action_torch_dtype and tensor.numel():
            # checked on the values, not by casting back: uint8 200 -> int8 -56 -> uint8 200 round-trips
            low, high = _int_range(tensor)
            info = torch.iinfo(self.action_torch_dtype)
            if low < info.min or high > info.max:
                raise ValueError(
                    f"action: every value must fit {self.single_action_space}'s dtype ({info.min}..{info.max}), got "
                    f"{describe(action)} with min {low} and max {high}; casting would wrap them"
                )
        target = self.action_torch_dtype
        if target.is_floating_point and tensor.dtype != target and tensor.numel():
            # float64 1e300 would reach a float32 Box as inf, int64 2**24 + 1 as 2**24: the pool's own rule
            problem = _float_cast_problem(tensor, target)
            if problem is not None:
                raise ValueError(
                    f"action: expected values that fit {self.single_action_space}'s dtype {target}, got "
                    f"{describe(action)}: {problem}"
                )
        return tensor.to(self.device, target, non_blocking=True)


def _float_cast_problem(tensor: torch.Tensor, target: torch.dtype) -> str | None:
    """Why casting ``tensor`` to the float dtype ``target`` would change its values (an overflow to inf, an
    integer it cannot hold exactly), as the pool's :func:`~torchrl_swm.pool.infos.cast_problem`; a float
    rounded to a narrower float is fine, as there. On an accelerator, overflows only (no host copy)."""
    if tensor.device.type == "cpu":
        values = tensor.float().numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()  # exact widening
        return cast_problem(values, numpy_dtype(target))
    overflow = torch.isinf(tensor.to(target)) & torch.isfinite(tensor)
    if bool(overflow.any()):
        bad = float(tensor[overflow].flatten()[0])
        return f"value {bad:g} overflows {target} (largest {torch.finfo(target).max:g})"
    return None


def _int_range(tensor: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest value of an integer (or bool) tensor, as Python ints: through numpy on the
    host (torch has no comparisons for uint16/32/64)."""
    if tensor.device.type != "cpu" and tensor.dtype in (torch.uint16, torch.uint32, torch.uint64):
        tensor = tensor.cpu()
    if tensor.device.type == "cpu":
        values = tensor.numpy()
        return int(values.min()), int(values.max())
    return int(tensor.min().item()), int(tensor.max().item())


def _binary_from_float(tensor, array, action, space):
    """A float MultiBinary action as int8, after checking that every value is exactly 0 or 1."""
    if tensor is not None:
        ok = bool(((tensor == 0) | (tensor == 1)).all())
    else:
        ok = bool(((array == 0) | (array == 1)).all())
    if not ok:
        raise ValueError(f"action: every value must be 0 or 1 for {space}, got {describe(action)}")
    if tensor is not None:
        return tensor.to(torch.int8), None
    return None, array.astype(np.int8)


@contextlib.contextmanager
def attribute_errors():
    """A sub-env's missing attribute reads as ``AttributeError``, as on gymnasium's and SB3's vector envs
    (``except AttributeError`` probes, SB3's ``has_attr``); the pool's ``EnvError`` naming the env is chained."""
    try:
        yield
    except Exception as err:
        if isinstance(err.__cause__, AttributeError) and not isinstance(err, AttributeError):
            raise AttributeError(str(err)) from err
        raise


def _out_of_range(values: np.ndarray, high) -> bool:
    """Whether some integer index in ``values`` is negative or ``>= high`` (an int, or per-position bounds)."""
    if isinstance(high, int) and values.dtype.kind == "i":
        # read as unsigned, negatives become huge: one reduction checks both ends
        return bool(values.view(f"u{values.dtype.itemsize}").max() >= high)
    return bool(values.min() < 0 or (values >= high).any())


# ----------------------------------------------------------------------------------------
# the one transfer
# ----------------------------------------------------------------------------------------


def set_leaf(td: TensorDictBase, key: Key, value: torch.Tensor) -> None:
    """``td.set(key, value)`` for a value the export built to ``td``'s batch and device (an action, a
    mask, a restored row): a plain ``TensorDict``'s string key skips tensordict's checks, which cost
    more than the rest of a small step and have nothing to find."""
    if type(td) is TensorDict and type(key) is str:
        td._set_str(key, value, validated=True, inplace=False, non_blocking=False)
    else:
        td.set(key, value)


def to_host(tensors: Sequence[torch.Tensor], packed: bool | None = None) -> list[np.ndarray]:
    """Fresh numpy copies of ``tensors`` (same shapes and dtypes).

    On the CPU each leaf is copied once. On an accelerator (or with ``packed=True``)
    the leaves are packed into one byte buffer on their device, largest item size
    first so that every leaf stays aligned, and that buffer makes **one**
    device-to-host transfer; the arrays are views of the host copy.
    """
    if not tensors:
        return []
    if packed is None:
        packed = tensors[0].device.type != "cpu"
    if not packed:
        return [t.numpy().copy() for t in tensors]
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].element_size())
    flat = torch.cat([tensors[i].reshape(-1).view(torch.uint8) for i in order]).cpu().numpy()
    out: list = [None] * len(tensors)
    offset = 0
    for i in order:
        t = tensors[i]
        nbytes = t.numel() * t.element_size()
        out[i] = flat[offset : offset + nbytes].view(numpy_dtype(t.dtype)).reshape(tuple(t.shape))
        offset += nbytes
    return out


def torch_copies(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh tensors on their device (the ``numpy=False`` counterpart of :func:`to_host`)."""
    return [t.clone() for t in tensors]
