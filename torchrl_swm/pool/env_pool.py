"""EnvPool: N gymnasium environments as one batched TorchRL environment.

The pool is a :class:`torchrl.envs.EnvBase` with ``batch_size == [N]``. It honours
TorchRL's per-env masks (``"_reset"`` resets only the masked rows, ``"_step"``
steps only the masked rows and freezes the others), never auto-resets inside a
step (so ``("next", "observation")`` at a done step is the true terminal
observation), stacks numeric ``info`` values into ``("info", key)`` leaves of
shape ``(N, 1, *value_shape)``, and writes everything into buffers allocated
once.

Data path of one step::

    td["action"] -> ActionCodec.decode -> backend.step (gymnasium env.step, RowWriter
    writes row i of the host buffers) -> HostBuffers.snapshot -> TensorDict
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.envs.registration import EnvSpec, load_env_creator
from tensordict import TensorDict, TensorDictBase, is_non_tensor
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from .._meta import NoAutoResetMeta
from ..errors import (
    EnvError,
    StepRefusedError,
    check_bool,
    check_indices,
    check_int,
    count_fits,
    error_text,
    user_stacklevel,
)
from ..masks import mask_rows, row_mask, row_view, zero_rewards
from ..specs import batch_spec, space_to_spec
from .buffers import BufferLayout, HostBuffers
from .infos import INFO_MASK_KEY, InfoSchema, chosen_info_keys, needs_step_probe
from .actions import ActionCodec
from .rows import observation_leaves
from .seeding import SeedSchedule, broadcast_options, broadcast_seeds
from .process import ProcessBackend
from .serial import FRAME_SIZE_HINT, SerialBackend
from .vector import VectorBackend

__all__ = ["EnvPool"]

# why rows must be reset before they step (EnvPool._unreset)
_BUILT, _STEP_RAISED, _RESET_RAISED, _STEP_LOST, _ENDED = 1, 2, 3, 4, 5
_UNRESET_WHY = {
    _BUILT: "the pool was built (never reset)",
    _ENDED: "their episode ended (terminated or truncated) at their last step: another step would record a "
            "transition past its end, of no episode (gymnasium leaves stepping a finished env undefined; a "
            "VectorEnv resets it itself)",
    _STEP_RAISED: "a step of theirs raised (it may have moved some of them, with no transition returned)",
    _RESET_RAISED: "a reset of theirs raised (it may have started episodes whose first observation was never "
                   "returned)",
    _STEP_LOST: "their last step, which a reset that raised followed at once (as step_and_maybe_reset does, whose "
                "transition is then lost)",
}
_NO_STEP = object()  # _StepState.last_step_rows: no step since the last reset


@dataclasses.dataclass(slots=True)
class _StepState:
    """What the pool's steps and resets note for the next one. A plain object, not attributes of the pool: each
    assignment to an ``nn.Module`` attribute goes through torch's ``__setattr__``, microseconds on the hot path."""

    last_step_rows: object = _NO_STEP  # the rows of the last step when no reset followed it (None: all)
    fresh: bool = False  # every row was reset and none stepped since
    # rows still in the episodes they began before a set_seed that came while fresh (see EnvPool._set_seed)
    unseeded_rows: np.ndarray | None = None

try:  # gym.make's own id lookup, which emits its version warnings (private: a later gymnasium may move it)
    from gymnasium.envs.registration import _find_spec
except ImportError:  # pragma: no cover
    _find_spec = gym.spec

Key = tuple[str, ...]
_DONE_KEYS = (("done",), ("terminated",), ("truncated",))


def _resolve_spec(env_id: str) -> EnvSpec:
    """The ``EnvSpec`` of a gymnasium id, as ``gym.make`` finds it: unknown ids fail here, with gymnasium's
    "did you mean" message, and an unversioned or out-of-date id gets gymnasium's warnings."""
    from ..envs import spec

    env_spec = spec(env_id)  # first: it imports the module of a "module:Env-v0" id, which registers the id
    _find_spec(env_id.partition(":")[2] or env_id)  # gym.make(id)'s version warnings, which gym.make(spec) skips
    return env_spec


def check_renders_rgb_array(env_spec: EnvSpec, make_kwargs: Mapping | None = None) -> None:
    """Refuse, before any env is built, pixels from an id whose env declares render modes without
    ``"rgb_array"``: gymnasium's env checker would fail at its first frame, with an assertion that does
    not say why.

    Raises:
        ValueError: the env's ``metadata["render_modes"]`` lacks ``"rgb_array"`` (the checker on).
    """
    if (make_kwargs or {}).get("disable_env_checker", env_spec.disable_env_checker):
        return  # no checker: the env's frames tell
    try:
        creator = env_spec.entry_point if callable(env_spec.entry_point) else load_env_creator(env_spec.entry_point)
    except Exception:  # gym.make reports it, where the env is made
        return
    metadata = getattr(creator, "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, Mapping) else None
    if modes is not None and "rgb_array" not in modes:
        raise ValueError(
            f"EnvPool({env_spec.id!r}, pixels=True): pixels are the frames the env renders with "
            f"render_mode='rgb_array', but {env_spec.id} declares render_modes={list(modes)}; leave pixels "
            "(and image_shape=, videos) out for this env"
        )


def _factories(env_fns, num_envs, pixels, make_kwargs) -> list[Callable[[], gym.Env]]:
    if isinstance(env_fns, (str, EnvSpec)):
        name = env_fns if isinstance(env_fns, str) else env_fns.id
        if num_envs is None:
            raise ValueError(f"EnvPool({name!r}) needs num_envs= (the number of parallel envs), got None")
        num_envs = check_int(num_envs, f"EnvPool({name!r}): num_envs", minimum=1)
        from ..envs import make  # gym.make that also knows this package's ids, in any process

        # the factories carry the resolved spec, not the id: a worker process can then make an id registered
        # only in the user's main process (under `if __name__ == "__main__":`, in a notebook), as gymnasium's
        # AsyncVectorEnv can
        env_spec = _resolve_spec(env_fns) if isinstance(env_fns, str) else env_fns
        if pixels:
            make_kwargs = {"render_mode": "rgb_array", **make_kwargs}
            if make_kwargs["render_mode"] == "rgb_array":
                check_renders_rgb_array(env_spec, make_kwargs)
        with count_fits(f"EnvPool({name!r}): num_envs", num_envs):
            return [functools.partial(make, env_spec, **make_kwargs)] * num_envs
    if make_kwargs:
        raise TypeError(
            f"EnvPool: keyword arguments {sorted(make_kwargs)} are only accepted with a gymnasium id "
            "(they are passed to gym.make); with factories, bind them in the factory"
        )
    if callable(env_fns) and not isinstance(env_fns, (gym.Env, Sequence)):
        # one factory and a count, as TorchRL's SerialEnv(num_workers, create_env_fn)
        if num_envs is None:
            raise ValueError(
                f"EnvPool: one factory ({getattr(env_fns, '__name__', type(env_fns).__name__)}) needs num_envs >= 1, "
                "got None; pass num_envs=, or a sequence of factories (one per env)"
            )
        num_envs = check_int(num_envs, "EnvPool: num_envs", minimum=1)
        with count_fits("EnvPool: num_envs", num_envs):
            return [env_fns] * num_envs
    if isinstance(env_fns, gym.Env) or not isinstance(env_fns, Sequence):
        raise TypeError(
            "EnvPool: expected a sequence of zero-argument factories returning gymnasium.Env, one such factory "
            f"with num_envs, or a registered gymnasium id, got {type(env_fns).__name__}"
        )
    env_fns = list(env_fns)
    if not env_fns:
        raise ValueError("EnvPool: expected at least one env factory, got an empty sequence")
    if num_envs is not None and check_int(num_envs, "EnvPool: num_envs") != len(env_fns):
        raise ValueError(f"EnvPool: num_envs={num_envs} but {len(env_fns)} factories were given")
    return env_fns


def _data_device(device) -> torch.device:
    """``device`` as a ``torch.device`` a pool can be built on: TorchRL's env setup reads values back from
    tensors on it, which "meta" tensors do not hold (it failed inside torch after every env was built)."""
    device = torch.device(device)
    if device.type == "meta":
        raise ValueError("EnvPool: device='meta' holds no data to build the pool's specs on; expected 'cpu', a CUDA "
                         "device or None (pool.to('meta') moves a built pool's outputs there, for shape-only work)")
    return device


def _nested_composite(leaves: Mapping[Key, object], shape, device) -> Composite:
    root = Composite(shape=shape, device=device)
    for key, spec in leaves.items():
        node = root
        for part in key[:-1]:
            if part not in node.keys():
                node[part] = Composite(shape=shape, device=device)
            node = node[part]
        node[key[-1]] = spec
    return root


class _ClosedBackend:
    """Stands in for the backend once the pool is closed: any use says so (no check on the hot path)."""

    def __init__(self):
        self._unfinished = None  # a backend whose close() a Ctrl-C cut short: the next close() finishes it

    def __getattr__(self, name):
        raise self.error()

    @staticmethod
    def error() -> RuntimeError:
        return RuntimeError(
            "EnvPool is closed (close() was called: its own, a Collector's shutdown(), which closes its env, or "
            "an export's, to_gymnasium(pool).close() or SB3's VecEnv.close(), which close the pool they wrap); its "
            "envs are gone. Build a new EnvPool, or pass the Collector a factory of pools instead of a pool."
        )

    def close(self) -> None:  # closing twice is fine
        if self._unfinished is not None:
            self._unfinished.close()
            self._unfinished = None


class EnvPool(EnvBase, metaclass=NoAutoResetMeta):
    """N gymnasium environments as one TorchRL env with batch size ``[N]``.

    Args:
        env_fns: a sequence of zero-argument factories returning ``gymnasium.Env``,
            one such factory (called ``num_envs`` times, as TorchRL's ``SerialEnv``),
            a registered gymnasium id or its ``EnvSpec`` (then ``num_envs`` is required and extra
            keyword arguments go to ``gym.make``), or a ``gymnasium.vector.VectorEnv``
            (e.g. ``gym.make_vec(id, n, vectorization_mode="vector_entry_point")``),
            in any autoreset mode: see :mod:`torchrl_swm.pool.vector`.
        num_envs: number of envs when ``env_fns`` is an id or one factory.

    Keyword Args:
        backend: ``"serial"`` (default: every env in this process, the fastest for
            cheap envs) or ``"process"`` (``num_workers`` processes, several envs
            each, writing into shared memory: for expensive envs).
        num_workers: worker processes of the process backend (default: one per core,
            at most one per env). Given without ``backend=``, it is an error (TorchRL's
            ``GymEnv(id, num_workers=k)`` starts processes; the pool never runs serially
            without a word); an explicit ``backend="serial"`` ignores it, so that one
            configuration can switch backends.
        mp_start_method: how the process backend starts its workers (as TorchRL's
            ``ParallelEnv(mp_start_method=...)``): ``"spawn"`` (default: safe with
            threads and CUDA, but each worker imports your script's modules again),
            ``"forkserver"`` or ``"fork"`` (POSIX: imports nothing again, so it starts
            several times faster; unsafe once this process runs threads, e.g. CUDA or
            Ray). Given without ``backend=``, it is an error, as ``num_workers``.
        device: where the output tensordicts live. ``None`` (default): on the CPU,
            with no device of its own, as TorchRL's ``GymEnv``; a ``Collector``
            then skips the device cast of its carrier it makes every step for an
            env on an explicit device. On CUDA each step makes one host-to-device
            copy from a pinned staging buffer.
        categorical_action_encoding: ``Discrete`` actions as ``Categorical``
            indices (default) or as ``OneHot`` vectors (``False``).
        pixels: add a ``"pixels"`` uint8 ``(N, H, W, 3)`` observation rendered with
            ``env.render()`` (``render_mode="rgb_array"``). Every frame must keep the
            size of env 0's first one (another size is an ``EnvError`` naming the env),
            unless ``image_shape`` is given.
        image_shape: ``(H, W)`` to resize every frame to, whatever its own size
            (bilinear, antialiased, with torch; frames of env 0's first size in one
            batch, any other one by one). Implies ``pixels=True``.
        info_keys: record only these info keys: one key (a string, or a tuple for a nested key, as
            TorchRL reads keys) or a list of them.
        info_spec: declared info specs ``{key: spec or example value}`` (value
            shape, no batch or time dim; a ``Composite`` declares the keys nested
            under it); they override inferred ones, a declared spec is kept as
            declared (a ``Bounded`` keeps its bounds), and declared keys get an
            ``("info_mask", key)`` presence mask.

            Info keys are otherwise inferred at construction: every env is reset
            and stepped once with a random action (a legal one when a ``Discrete``
            env reports an ``"action_mask"`` at reset). Naming only declared keys in
            ``info_keys`` (or ``info_keys=[]``) skips that step: the envs are only reset.
        seed: the initial seed schedule (as :meth:`set_seed`); OS entropy when ``None``.
        seed_every_episode: reset env ``i``'s ``k``-th episode with seed
            ``s + i + k * N``, so each episode is reproducible from its
            ``"episode_seed"`` alone. ``False`` follows gymnasium's vector
            convention: only the first reset after a seed gets one and later
            episodes continue the env's random stream (still deterministic, and
            faster: ``env.reset(seed=...)`` rebuilds the env's RNG, ~7 µs for
            CartPole alone, ~13 µs inside a pool's loop). ``None`` (default):
            ``True``, except over a natively batched ``VectorEnv`` (one RNG for the
            whole batch, as ``CartPoleVectorEnv``), whose episodes no seed of their
            own could replay: reseeding it at every partial reset would only cost
            time, so it follows gymnasium's convention; and over a ``SAME_STEP``
            ``VectorEnv``, which resets finished envs itself, unseeded: a seed of
            their own would reset every episode twice.
        masked_reset: for a ``VectorEnv`` only: ``True`` declares that it honours
            ``options["reset_mask"]``, or a function ``fn(venv, mask, seed, options)``
            (see :func:`torchrl_swm.pool.vector.register_masked_reset`).

    Output keys (batch ``[N]``): the observation (``"observation"``, or one key per
    Dict entry), ``"pixels"``, ``("info", k)`` of shape ``(N, 1, ...)``,
    ``("info_mask", k)`` (bool ``(N, 1)``: whether the env reported ``k`` at this
    step, for keys some env omits; see :mod:`torchrl_swm.pool.infos`),
    ``"episode_seed"`` (int64 ``(N, 1)``: the seed of the env's current episode),
    ``"reward"`` (float32 ``(N, 1)``) and ``"done"``/``"terminated"``/``"truncated"``.

    Examples:
        >>> from torchrl_swm import EnvPool
        >>> pool = EnvPool("CartPole-v1", num_envs=4, seed=0)
        >>> rollout = pool.rollout(100, break_when_any_done=False)
        >>> rollout.batch_size
        torch.Size([4, 100])
        >>> pool.close()
        >>> with EnvPool("CartPole-v1", num_envs=4) as pool:  # closed on leaving the block
        ...     td = pool.reset()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]] | Callable[[], gym.Env] | str | gym.vector.VectorEnv,
        num_envs: int | None = None,
        *,
        backend: str | None = None,
        num_workers: int | None = None,
        mp_start_method: str | None = None,
        device: torch.device | str | None = None,
        categorical_action_encoding: bool = True,
        pixels: bool = False,
        image_shape: tuple[int, int] | None = None,
        info_keys: Sequence | None = None,
        info_spec: Mapping | Composite | None = None,
        seed: int | None = None,
        seed_every_episode: bool | None = None,
        masked_reset=None,
        **make_kwargs,
    ):
        categorical_action_encoding = check_bool(categorical_action_encoding, "EnvPool: categorical_action_encoding")
        pixels = check_bool(pixels, "EnvPool: pixels") or image_shape is not None
        seed_every_episode = check_bool(seed_every_episode, "EnvPool: seed_every_episode", allow_none=True)
        if masked_reset is not None and not isinstance(env_fns, gym.vector.VectorEnv):
            raise ValueError(
                f"EnvPool: masked_reset= adapts a gymnasium VectorEnv's partial reset; got {type(env_fns).__name__} "
                "env_fns, whose envs the pool resets one by one. Drop masked_reset, or pass the VectorEnv"
            )
        device = None if device is None else _data_device(device)  # before any env is built
        process_options = {k: v for k, v in (("num_workers", num_workers), ("mp_start_method", mp_start_method))
                           if v is not None}
        if isinstance(env_fns, gym.vector.VectorEnv) and (backend not in (None, "serial") or process_options):
            given = "".join(f" and {k}={v!r}" for k, v in process_options.items())
            raise ValueError(
                f"EnvPool(VectorEnv): backend={backend!r}{given} do not apply: a vector env "
                "runs as it is (its own processes, if any: gymnasium's AsyncVectorEnv). Drop them, or pass env "
                "factories or an id with backend='process'"
            )
        if process_options and backend is None:
            # TorchRL's GymEnv(id, num_workers=k) starts processes: never run serially without a word
            given = ", ".join(f"{k}={v!r}" for k, v in process_options.items())
            raise ValueError(
                f"EnvPool: {given} is for backend='process'; the default serial backend runs every "
                "env in this process. Pass backend='process' to run the envs in worker processes, or drop "
                + " and ".join(process_options)
            )
        backend = "serial" if backend is None else backend
        if isinstance(env_fns, gym.vector.VectorEnv):
            if make_kwargs or (num_envs is not None and check_int(num_envs, "EnvPool: num_envs") != env_fns.num_envs):
                raise TypeError(
                    f"EnvPool(VectorEnv): num_envs comes from the vector env ({env_fns.num_envs}); "
                    f"got num_envs={num_envs} and keyword arguments {sorted(make_kwargs)}"
                )
            backend = VectorBackend(env_fns, pixels=pixels, masked_reset=masked_reset, seed_every_episode=seed_every_episode)
            seed_every_episode = backend.seed_every_episode  # resolved for the vector env's kind of RNG
        elif backend == "serial":
            backend = SerialBackend(_factories(env_fns, num_envs, pixels, make_kwargs), pixels=pixels)
        elif backend == "process":
            backend = ProcessBackend(_factories(env_fns, num_envs, pixels, make_kwargs), num_workers, pixels=pixels,
                                     start_method="spawn" if mp_start_method is None else mp_start_method)
        else:
            raise ValueError(f"EnvPool: backend must be 'serial' or 'process', got {backend!r}")
        if seed_every_episode is None:
            seed_every_episode = True  # single envs: one RNG each, so every episode can have a seed of its own
        try:
            n = len(backend)
            super().__init__(batch_size=torch.Size([n]), device=device)
            self.num_envs = n
            # a list of seeds that put two envs on one schedule warns once; World, which gives every episode its
            # own seed (the schedules never pick one), turns the check off around its resets
            self._seed_overlap_warned = self._seeds_given_per_episode = False
            self._backend = backend
            # the fast step_and_maybe_reset reads the buffers directly: a subclass's own _step or
            # _reset (shaping, its own done flags, reset options) takes TorchRL's generic path
            self._own_step_and_reset = type(self)._step is EnvPool._step and type(self)._reset is EnvPool._reset
            self._build(categorical_action_encoding, pixels, image_shape, info_keys, info_spec, seed, seed_every_episode)
        except BaseException:
            backend.close()
            raise
        # TorchRL's EnvBase starts with is_closed=True (only its wrappers reset it): an open pool says
        # so, which is what lets owners (exports, World) and TorchRL's __del__ close it
        self.is_closed = False

    def _build(self, categorical, pixels, image_shape, info_keys, info_spec, seed, seed_every_episode):
        n, device, backend = self.num_envs, self.device, self._backend
        self.single_observation_space: gym.Space = backend.observation_space
        self.single_action_space: gym.Space = backend.action_space
        self._codec = ActionCodec(self.single_action_space, categorical, n)
        obs_spaces = observation_leaves(self.single_observation_space)

        self._seeds = SeedSchedule(n, seed, every_episode=seed_every_episode)
        # rows to reset before they step, as why (a key of _UNRESET_WHY): the probe left them mid-way, or a step or
        # reset that raised may have moved them without a transition; None once none is left
        self._unreset: np.ndarray | None = np.full(n, _BUILT, dtype=np.int8)
        self._step_state = _StepState()
        info_keys = chosen_info_keys(info_keys)  # once: an iterator would be used up by the first reader
        probe = backend.probe(self._seeds.next(None)[1], step=needs_step_probe(info_keys, info_spec))
        self._seeds.count[:] = 0  # the probe does not use up the first seeds
        self._info_schema = InfoSchema.infer(probe["infos"], info_keys, info_spec, probe.get("batch_wide"))

        obs_specs = {
            key: batch_spec(
                # observations are always indices: the option is about actions only
                space_to_spec(space, categorical=True, device=device, name=f"observation_space{list(key)}"), (n,)
            )
            for key, space in obs_spaces.items()
        }
        leaves = {key: (spec.shape, spec.dtype) for key, spec in obs_specs.items()}
        self._frame_key = self._resize_to = self._image_hw = None
        if pixels:
            frame_shape = probe["frame_shape"]
            if image_shape is None and probe["other_frame"] is not None:
                i, shape = probe["other_frame"]
                raise EnvError(
                    i, "render", f"frame shape {shape} differs from env 0's {frame_shape}; {FRAME_SIZE_HINT}"
                )
            target = frame_shape if image_shape is None else (*_image_hw(image_shape), 3)
            obs_specs[("pixels",)] = Bounded(0, 255, shape=(n, *target), dtype=torch.uint8, device=device)
            leaves[("pixels",)] = ((n, *target), torch.uint8)
            self._frame_key = ("pixels",)
            if image_shape is not None:  # frames of env 0's first size are resized in one batch, others one by one
                self._image_hw = tuple(target[:2])
            if tuple(target) != tuple(frame_shape):
                leaves[("_frames",)] = ((n, *frame_shape), torch.uint8)
                self._frame_key, self._resize_to = ("_frames",), tuple(target[:2])
        info_leaves = self._info_schema.buffer_leaves(n)
        leaves.update(info_leaves)
        leaves[("episode_seed",)] = ((n, 1), torch.int64)
        leaves[("reward",)] = ((n, 1), torch.float32)
        for key in _DONE_KEYS:
            leaves[key] = ((n, 1), torch.bool)
        if getattr(backend, "needs_action_buffer", False):
            leaves[("_action",)] = self._codec.env_action_layout()
        layout = BufferLayout(leaves)
        self._host = HostBuffers(layout, device, flat=backend.allocate(layout))
        self._done_flags = self._host.arrays[("done",)][:, 0]  # a view: the backends write it in place
        self._done_views = self._cpu_done_views()
        backend.attach(layout, self._host.arrays, self._info_schema, self._frame_key, self._image_hw is not None)

        # Output keys: what a reset returns, and what a step adds (the reward);
        # keys starting with "_" are the backends' own scratch buffers.
        self._reset_keys = [key for key in leaves if key != ("reward",) and not key[0].startswith("_")]
        self._step_keys = [*self._reset_keys, ("reward",)]
        # Root keys TorchRL's step_mdp does not carry to the next step, or that
        # the next step's outputs replace.
        self._not_carried = {"next", "reward", "_reset", *(key[0] for key in self._reset_keys)}
        # Output subtrees ("info", Dict observations...): {root key: the leaves the pool writes under it}
        self._subtrees: dict[str, frozenset] = {}
        for key in self._reset_keys:
            if len(key) > 1:
                self._subtrees.setdefault(key[0], set()).add(key[1:] if len(key) > 2 else key[1])
        self._subtrees = {k: frozenset(v) for k, v in self._subtrees.items()}

        if len(self._info_schema):
            obs_specs[("info",)] = self._info_schema.spec(n, device)
        if self._info_schema.masked:
            obs_specs[(INFO_MASK_KEY,)] = self._info_schema.mask_spec(n, device)
        obs_specs[("episode_seed",)] = Unbounded(shape=(n, 1), dtype=torch.int64, device=device)
        self.observation_spec = _nested_composite(obs_specs, (n,), device)
        self.action_spec = batch_spec(self._codec.spec.to(device), (n,))
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32, device=device)
        self.done_spec = Composite(
            {key[0]: Categorical(2, shape=(n, 1), dtype=torch.bool, device=device) for key in _DONE_KEYS},
            shape=(n,),
            device=device,
        )

    # -- TorchRL's contract ---------------------------------------------------------
    def _reset(self, tensordict: TensorDictBase | None = None, *, seed=None, options=None, **kwargs) -> TensorDictBase:
        if kwargs:
            raise TypeError(f"EnvPool.reset: unexpected keyword arguments {sorted(kwargs)}; expected seed= and options=")
        mask = None if tensordict is None else tensordict._get_str("_reset", None)
        rows = mask_rows(mask, self.num_envs, "_reset")
        if rows is None and mask is not None:
            # a mask resets rows, even all of them (TorchRL's maybe_reset when every env is done): a
            # SAME_STEP vector env has reset them already; a full reset would reset them twice
            rows = np.arange(self.num_envs)
        unseeded = self._step_state.unseeded_rows
        if unseeded is not None:  # the envs reset now start episodes with the new seeds
            if rows is not None:
                unseeded[rows] = False
            if rows is None or not unseeded.any():
                self._step_state.unseeded_rows = None
        override = broadcast_seeds(seed, self.num_envs, allow_none=True)
        options = broadcast_options(options, self.num_envs)
        if rows is None or rows.size:
            if rows is not None:
                options = [options[j] for j in rows]
            self._reset_rows(rows, override, options)
            # every row reset now (no mask, or an all-True one) or, with a partial mask, still none stepped
            self._step_state.fresh = rows is None or rows.size == self.num_envs or self._step_state.fresh
        else:
            self._backend.settle()  # nothing to reset, but the snapshot must not race an interrupted step
        return self._host.snapshot(self._reset_keys, self.batch_size)

    def _reset_rows(self, rows: np.ndarray | None, seed_override=None, options=None) -> None:
        """Reset ``rows`` (all when ``None``) in the backend, writing the buffers.

        A reset that raises leaves the seed schedule as it was (a retry draws the same seeds).
        """
        self._host.wait_for_copy()
        seeds = self._seeds
        saved = None if seed_override is None else (seeds.base.copy(), seeds.count.copy())
        reset_seeds, episode_seeds = seeds.next(rows, seed_override)
        try:
            odd_frames = self._backend.reset(rows, reset_seeds, options, episode_seeds)
        except BaseException:
            seeds.rewind(rows, saved)
            if self._step_state.last_step_rows is not _NO_STEP:
                # a reset right after a step may be TorchRL's step_and_maybe_reset (a transform's too), whose
                # step's transition is lost with it: the rows that step moved must be reset as well
                self._must_reset(self._step_state.last_step_rows, _STEP_LOST)
            self._must_reset(rows, _RESET_RAISED)  # some may have started an episode the caller never got
            raise
        self._step_state.last_step_rows = _NO_STEP
        if self._unreset is not None:
            self._unreset[slice(None) if rows is None else rows] = 0
            if not self._unreset.any():
                self._unreset = None
        self._resize_frames(rows, odd_frames)
        if seed_override is not None:
            self._warn_overlapping_seeds(rows, seed_override)

    def _warn_overlapping_seeds(self, rows: np.ndarray | None, override: np.ndarray) -> None:
        # each row's seeds step by N: a list of seeds can put two rows in one residue class, where one replays the
        # other's episodes at every later reset, silently duplicating data (an int seed s never does: s + i)
        if self._seed_overlap_warned or self._seeds_given_per_episode:
            return  # once per pool; never for a caller (World) that gives every episode its seed
        pair = self._seeds.overlap(rows, override)
        if pair is None:
            return
        self._seed_overlap_warned = True
        n, base, count = self.num_envs, self._seeds.base, self._seeds.count
        at = {i: int(base[i] + max(int(count[i]) - 1, 0) * n) for i in pair}  # the seed of each one's episode now
        behind, ahead = sorted(pair, key=lambda i: (at[i], i))
        lag = (at[ahead] - at[behind]) // n
        warnings.warn(
            f"EnvPool.reset: the seeds given put env {behind} (at seed {at[behind]}) and env {ahead} (at seed "
            f"{at[ahead]}) on one schedule: each env's seeds step by num_envs={n} and theirs are both "
            f"{at[ahead] % n} modulo {n}, so env {behind} replays env {ahead}'s episodes, "
            + (f"{lag} episode{'s' * (lag != 1)} behind it," if lag else "in step with it,")
            + f" at every later reset. Give seeds that differ modulo {n} (an int seed s gives env i the seed "
            "s + i), or the same seed to both on purpose (said once per pool)",
            UserWarning,
            stacklevel=user_stacklevel(),  # the caller of reset(), through TorchRL, a transform or an export
        )

    def _must_reset(self, rows: np.ndarray | None, why: int) -> None:
        """Refuse to step ``rows`` (all when ``None``) until they are reset: a step or reset that raised may have
        moved some of them (the envs before the one that raised, a worker that finished) with no transition
        returned, so their next step would report a transition from a state the caller never saw."""
        if self._unreset is None:
            self._unreset = np.zeros(self.num_envs, dtype=np.int8)
        self._unreset[slice(None) if rows is None else rows] = why

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        next_td = self._step_rows(tensordict, tensordict._get_str("_step", None))
        ended = self._done_flags.nonzero()[0]
        if ended.size:  # step_and_maybe_reset resets them at once; a plain step leaves them to the caller
            if self._unreset is not None:
                ended = ended[self._unreset[ended] == 0]  # a frozen row refused for another reason keeps it
            self._must_reset(ended, _ENDED)
        return next_td

    def _step_rows(self, tensordict: TensorDictBase, step_mask: torch.Tensor | None) -> TensorDictBase:
        rows = mask_rows(step_mask, self.num_envs, "_step")
        if self._unreset is not None:
            self._refuse_unreset(rows)
        # _get_str: ~0.6 µs cheaper than get(); a missing action is None, which decode refuses by name
        actions = self._codec.decode(tensordict._get_str("action", None), rows, self._backend.batched_actions)
        self._host.wait_for_copy()
        if self._step_state.unseeded_rows is not None:
            self._warn_unseeded_start()
        self._step_state.fresh = False
        if rows is not None:
            self._backend.settle()  # an interrupted step's late rewards must not land on the zeros
            self._host.arrays[("reward",)].fill(0.0)  # frozen rows report reward 0
        try:
            odd_frames = self._backend.step(actions, rows)
        except StepRefusedError:
            raise  # no env moved: none has to be reset for it
        except BaseException:
            self._must_reset(rows, _STEP_RAISED)
            # its rows are refused already, and no earlier step's transition is lost
            self._step_state.last_step_rows = _NO_STEP
            raise
        self._step_state.last_step_rows = rows
        self._resize_frames(rows, odd_frames)
        return self._host.snapshot(self._step_keys, self.batch_size)

    def _refuse_unreset(self, rows: np.ndarray | None) -> None:
        """Stepping an env never reset would continue the construction probe's step: a transition of no episode;
        one whose last step or reset raised, a transition from a state the caller never saw."""
        self._raise_if_closed()  # before blaming envs that are gone
        unreset = self._unreset if rows is None else self._unreset[rows]
        if unreset.any():
            self._backend.check_ready("step")  # a dead worker, an env error owed by an interrupted step: first
            first = int(np.flatnonzero(unreset)[0]) if rows is None else int(rows[np.flatnonzero(unreset)[0]])
            since = "; ".join(
                f"envs {np.flatnonzero(self._unreset == why).tolist()} since {text}"
                for why, text in _UNRESET_WHY.items() if (self._unreset == why).any()
            )
            raise StepRefusedError(
                first, "step",
                f"these envs must be reset before they step: {since}. Call reset() first (rollout, collectors and "
                "World do), reset those rows with a '_reset' mask, or freeze them with a '_step' mask",
            )

    def _skip_tensordict(self, tensordict: TensorDictBase) -> TensorDictBase:
        # an all-False "_step" freezes every row: reward 0, as for any frozen row
        return zero_rewards(self, super()._skip_tensordict(tensordict))

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """TorchRL's ``step`` → ``step_mdp`` → ``maybe_reset``, with the reset folded in.

        Exactly what the generic path returns, without its round trip: the done
        rows are reset in the backend right after the step, and the root of the
        next step is a snapshot of the buffers, which then hold the reset
        observation on reset rows and the step's observation elsewhere. A
        ``"_step"`` mask freezes rows as in :meth:`_step`, and done rows are reset
        whether or not they were stepped, as TorchRL does. Inputs the fast path
        does not cover (an all-False ``"_step"``, a preset ``"next"``, type
        checks, step-MDP hooks, a subclass's own ``_step`` or ``_reset``) take
        TorchRL's generic path.
        """
        if self.device is not None and tensordict.device != self.device:
            tensordict = tensordict.to(self.device)  # as TorchRL's generic path does first
        step_mask = tensordict._get_str("_step", None)
        if (
            not self._own_step_and_reset
            or "next" in tensordict.keys()
            or (step_mask is not None and not step_mask.any())  # TorchRL then skips the step entirely
            or self._run_type_checks
            or self._post_step_mdp_hooks is not None
            or tensordict.batch_size != self.batch_size
            or (self._subtrees and self._foreign_leaves(tensordict))
        ):
            return super()._step_and_maybe_reset(tensordict)
        next_td = self._step_rows(tensordict, step_mask)
        device = tensordict.device
        if device is not None and next_td.device != device:
            next_td = next_td.to(device)  # a device-less pool stepped with a tensordict on a device: as TorchRL
        tensordict._set_str("next", next_td, validated=True, inplace=False, non_blocking=False)
        done_rows = self._done_flags.nonzero()[0]  # cheaper than any() + flatnonzero()
        if not done_rows.size:
            return tensordict, self._next_root(self._carried(tensordict, None), next_td, device, tensordict)
        # TorchRL zeroes the other root keys on reset rows, but only for a partial reset;
        # they are zeroed now, while the done buffer still marks the rows the reset clears
        partial = done_rows.size < self.num_envs
        carried = self._carried(tensordict, self._done_mask() if partial else None)
        self._reset_rows(done_rows)
        self._step_state.fresh = not partial  # every env restarted, as by an all-True "_reset" on the generic path
        return tensordict, self._next_root(carried, self._host.snapshot(self._reset_keys, self.batch_size), device,
                                           tensordict)

    def _foreign_leaves(self, tensordict: TensorDictBase) -> bool:
        """Whether the caller put leaves of its own under one of the pool's output subtrees
        (a policy writing ``("info", "value")``): TorchRL's step_mdp merges them into the next
        root, which only the generic path does."""
        for key, ours in self._subtrees.items():
            value = tensordict._get_str(key, None)
            if value is not None and (not isinstance(value, TensorDictBase) or not ours.issuperset(value.keys(True, True))):
                return True
        return False

    def _done_mask(self) -> _RankViews:
        """The done rows as a bool mask on the pool's device, viewed for each leaf rank (``{ndim: view}``)."""
        if self._done_views is not None:
            return self._done_views  # CPU: views of the live done buffer, read before the reset clears it
        return _RankViews(torch.from_numpy(self._done_flags.copy()).to(self.device, non_blocking=True))

    def _carried(self, tensordict: TensorDictBase, reset_views) -> dict:
        # The root keys of the step that TorchRL's step_mdp carries to the next step
        # (the action, policy outputs), zeroed on the rows of a partial reset as
        # TorchRL's _update_during_reset does. Sub-tensordicts are shallow-copied, as
        # step_mdp does, so the new root never shares a node with the stored step.
        source = {}
        for key, value in tensordict.items():
            if key in self._not_carried:
                continue
            if reset_views is not None:
                value = _zero_rows(value, reset_views)
            elif isinstance(value, TensorDictBase):
                value = value.copy()
            source[key] = value
        return source

    def _next_root(self, source: dict, leaves: TensorDictBase, device, caller: TensorDictBase) -> TensorDictBase:
        # The root of the next step: the carried keys, plus every output leaf but the
        # reward from ``leaves`` (the step's "next", or a snapshot after resetting the
        # done rows, equal to "next" on the other rows). Its device is the caller's
        # tensordict's, as step_mdp keeps it (the pool's, which it was moved to, if any),
        # and so are its dim names.
        if device is not None and leaves.device != device:
            leaves = leaves.to(device)  # a device-less pool's snapshot, for a caller's tensordict on a device
        for key, value in leaves.items():
            if key != "reward":
                source[key] = value.copy() if isinstance(value, TensorDictBase) else value
        names = caller.names if caller._has_names() else None
        return TensorDict._new_unsafe(source, batch_size=self.batch_size, device=device, names=names)

    def _reset_proc_data(self, tensordict, tensordict_reset):
        """Merge a reset into the caller's tensordict: TorchRL's ``_update_during_reset``, leaf by leaf.

        The same result as TorchRL's generic merge (``TensorDict.where`` with
        ``pad=0``) at a fraction of its cost: reset rows take the reset values,
        other rows keep the caller's, keys on one side only are zero-padded.
        The pool's reset output is always complete and never done on reset rows,
        so TorchRL's completion and done checks have nothing to do.
        """
        if tensordict is None:
            return tensordict_reset
        if not all(isinstance(v, torch.Tensor) for v in tensordict.values(True, True)):
            return super()._reset_proc_data(tensordict, tensordict_reset)  # non-tensor entries: TorchRL's merge
        mask = tensordict.pop("_reset", None)
        if mask is None or mask.all():
            return tensordict.update(tensordict_reset)
        rows = row_mask(mask, self.num_envs, "_reset")
        old_keys = set(tensordict.keys(True, True))
        new_keys = set(tensordict_reset.keys(True, True))
        for key in old_keys | new_keys:
            if key in new_keys and key in old_keys:
                new = tensordict_reset.get(key)
                value = torch.where(row_view(rows, new), new, tensordict.get(key))
            elif key in ("done", "terminated", "truncated"):
                # as TorchRL's _reset_check_done: a done flag the caller left out is taken from the
                # env (rows not reset may still be done), never zero-padded, with TorchRL's warning
                value = tensordict_reset.get(key)
                if value[~row_view(rows, value).expand_as(value)].any():
                    warnings.warn(
                        f"A partial `'_reset'` key has been passed to `reset` (_reset), but the corresponding "
                        f"done_key ({key}) wasn't present in the input tensordict. This is discouraged, since "
                        "the input tensordict should contain all the data not being reset.",
                        stacklevel=3,
                    )
            elif key in new_keys:
                new = tensordict_reset.get(key)
                value = new.masked_fill(~row_view(rows, new), 0)
            else:
                old = tensordict.get(key)
                value = old.masked_fill(row_view(rows, old), 0)
            tensordict.set(key, value)
        return tensordict

    def _raise_if_closed(self) -> None:
        """For the calls that would not reach the backend: a closed pool says so."""
        if isinstance(self.__dict__.get("_backend"), _ClosedBackend):
            raise _ClosedBackend.error()

    def _set_seed(self, seed: int | None) -> None:
        """Env ``i``'s next reset gets ``seed + i``; the episodes in progress go on as they started."""
        self._raise_if_closed()
        self._seeds.set(seed)
        # stepped before the next reset: warned (_warn_unseeded_start)
        self._step_state.unseeded_rows = np.ones(self.num_envs, np.bool_) if self._step_state.fresh else None

    def _warn_unseeded_start(self) -> None:
        # Restarting the episodes in set_seed, as TorchRL's GymWrapper does, would make the caller's root (a
        # Collector's, from its reset at construction) an observation of another episode than its "next"
        rows = np.flatnonzero(self._step_state.unseeded_rows).tolist()
        self._step_state.unseeded_rows = None
        which = "every env" if len(rows) == self.num_envs else f"envs {rows}" if len(rows) <= 8 else f"{len(rows)} envs"
        warnings.warn(
            f"EnvPool: set_seed() came after the last reset of {which} and before this step, so their episodes in "
            "progress keep the seeds they started with; the new seeds apply from each env's next reset. For a "
            "reproducible run from the first step, seed the pool before its reset: EnvPool(..., seed=s), or "
            "EnvPool.factory(..., seed=s) for a Collector (which resets its env when it is built, before "
            "Collector.set_seed), or call reset() after set_seed()",
            UserWarning,
            stacklevel=3,
        )

    def _resize_frames(self, rows: np.ndarray | None, odd_frames: dict | None = None) -> None:
        """``image_shape=``: resize the frames of ``rows`` (all when ``None``) into ``"pixels"``; those of another
        size than the frame buffer's (``odd_frames``, by row, from the backend) one by one."""
        tensors = self._host.tensors
        if self._resize_to is not None:
            frames = tensors[("_frames",)] if rows is None else tensors[("_frames",)][torch.from_numpy(rows)]
            if frames.shape[0]:
                resized = _resized(frames, self._resize_to)
                if rows is None:
                    tensors[("pixels",)].copy_(resized)
                else:
                    tensors[("pixels",)][torch.from_numpy(rows)] = resized
        if odd_frames:  # after the batch: their rows of the frame buffer hold an older frame
            pixels = tensors[("pixels",)]
            for i, frame in odd_frames.items():
                pixels[i] = _resized(torch.from_numpy(frame)[None], self._image_hw)[0]

    def __reduce_ex__(self, protocol):
        # its envs, buffers and worker processes live here: a copy in another process could not share them
        raise TypeError(  # "cannot pickle": the words TorchRL's multi-process collectors pass an error on for
            f"cannot pickle or copy an {type(self).__name__}: it owns live envs (and worker processes). To build "
            f"one in another process (a multi-process or Ray collector, a ParallelEnv), pass "
            f"{type(self).__name__}.factory(...) with the same arguments instead of the pool"
        )

    @classmethod
    def factory(cls, *args, **kwargs) -> PoolFactory:
        """A picklable factory of ``EnvPool(*args, **kwargs)``, for collectors.

        TorchRL's multi-process and Ray collectors build their envs in other
        processes from a factory. This one checks at once that its arguments
        pickle (with cloudpickle, as the collectors do) and says what to change
        when they do not, instead of failing later inside a worker; it resolves a
        gymnasium id at once too, so workers can build an id registered only in
        this process (see :class:`PoolFactory`). Called with keyword arguments, it
        builds the pool with those in place of its own: TorchRL's
        ``create_env_kwargs=[{"seed": 0}, {"seed": 2**32}]`` gives each worker its seed.

        Examples:
            >>> from torchrl.collectors import MultiSyncCollector
            >>> from torchrl_swm import EnvPool
            >>> # one factory per worker, seeds far apart (a pool uses one seed per episode: s, s+1, ...)
            >>> make = [EnvPool.factory("CartPole-v1", num_envs=8, seed=w * 2**32) for w in range(2)]
            >>> collector = MultiSyncCollector(make, None, frames_per_batch=256, total_frames=1024)
            >>> sum(batch.numel() for batch in collector)
            1024
            >>> collector.shutdown()
        """
        return PoolFactory(cls, args, kwargs)

    # -- gymnasium-style access to the sub-envs ----------------------------------------
    @property
    def freezes_rows(self) -> bool:
        """Whether a ``"_step"`` mask can leave rows unstepped (frozen): True for pools of single
        envs, False over a gymnasium ``VectorEnv``, whose every step advances all its rows."""
        return not isinstance(self._backend, VectorBackend)

    @property
    def per_env_seeds(self) -> bool:
        """Whether each env takes a seed of its own: True for pools of single envs and over gymnasium's
        ``SyncVectorEnv``/``AsyncVectorEnv``; False over a natively batched ``VectorEnv``, whose one RNG serves
        the batch (a seed given to some rows reseeds every row's stream)."""
        return getattr(self._backend, "per_env_seeds", True)

    @property
    def seed_every_episode(self) -> bool:
        """Whether every episode gets a seed of its own (see the ``seed_every_episode`` argument)."""
        return self._seeds.every_episode

    @property
    def env_spec(self):
        """The sub-envs' gymnasium ``EnvSpec`` (env 0's; a ``SyncVectorEnv``'s env 0's), or ``None``. Over another
        ``VectorEnv`` (an ``AsyncVectorEnv``, whose envs are in other processes, or a natively batched one), the
        vector env's own spec, whose ``max_episode_steps`` is the limit its rows run under (``gym.make_vec``'s
        ``max_episode_steps=`` argument, which gymnasium keeps in the spec's ``kwargs``)."""
        return self._first_env_attr("spec")

    @property
    def env_metadata(self) -> dict:
        """The sub-envs' gymnasium ``metadata`` (env 0's; the ``VectorEnv``'s own for a vector pool)."""
        return self._first_env_attr("metadata") or {}

    @property
    def render_mode(self) -> str | None:
        """The sub-envs' ``render_mode`` (env 0's; the ``VectorEnv``'s own for a vector pool)."""
        return self._first_env_attr("render_mode")

    def _first_env_attr(self, name: str):
        # read once: on a process pool each lookup is a round trip to a worker
        cache = self.__dict__.setdefault("_env_attrs", {})
        if name not in cache:
            if isinstance(self._backend, VectorBackend):
                cache[name] = self._backend.env_spec() if name == "spec" else getattr(self._backend.venv, name, None)
            else:
                cache[name] = self.get_attr(name, indices=[0])[0]
        return cache[name]

    @property
    def envs(self) -> list[gym.Env]:
        """The sub-envs (serial backend only): ``pool.envs[i].unwrapped`` reaches env i."""
        envs = getattr(self._backend, "envs", None)
        if envs is None:
            raise AttributeError(self._no_envs_here())
        return envs

    def _no_envs_here(self) -> str:
        return (
            f"EnvPool.envs: the {type(self._backend).__name__} keeps no list of the envs (a process pool's live in "
            "its workers, a vector env's inside the vector env); use pool.call / pool.get_attr / pool.set_attr"
        )

    def __getattr__(self, name):
        # a property raising AttributeError lands here; TorchRL's __getattr__ would replace its message
        if name == "envs" and "_backend" in self.__dict__:
            raise AttributeError(self._no_envs_here())
        return super().__getattr__(name)

    def _indices(self, indices) -> list[int]:
        return check_indices(indices, self.num_envs)

    def call(self, name: str, /, *args, indices=None, **kwargs) -> list:
        """Call method ``name`` of each sub-env (or read it, if it is not callable); ``args`` and ``kwargs`` (a
        ``name=`` among them) go to the method."""
        return self._backend.call(self._indices(indices), name, args, kwargs)

    def _query_first(self, name: str, *args):
        """Env 0's answer to a read-only ``call`` (``has_wrapper_attr``, ``get_wrapper_attr``): asked of env 0
        alone, or of every env where the vector env's ``call`` cannot pick rows (an ``AsyncVectorEnv``)."""
        one = getattr(self._backend, "calls_rows", True)
        return self.call(name, *args, indices=[0] if one else None)[0]

    def get_attr(self, name: str, indices=None) -> list:
        """Attribute ``name`` of each sub-env (gymnasium's ``VectorEnv.get_attr``)."""
        return self._backend.get_attr(self._indices(indices), name)

    def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
        """Whether each sub-env is wrapped, at any depth, in ``wrapper_class`` (SB3's ``VecEnv.env_is_wrapped``);
        the check runs where the envs live, in the workers of the process backend."""
        return list(self._backend.is_wrapped(self._indices(indices), wrapper_class))

    def set_attr(self, name: str, values, indices=None, *, outermost: bool = False) -> None:
        """Set attribute ``name`` on each sub-env; ``values`` is one value or one per env.

        By default where gymnasium's ``set_wrapper_attr`` finds it (``SyncVectorEnv.set_attr``);
        ``outermost=True`` sets it on the sub-env itself, its outermost wrapper, as Stable-Baselines3's
        ``DummyVecEnv.set_attr`` does (an inner wrapper's attribute of that name is left alone).
        """
        indices = self._indices(indices)
        if not isinstance(values, (list, tuple)):
            values = [values] * len(indices)
        if len(values) != len(indices):
            raise ValueError(f"set_attr: expected {len(indices)} values, got {len(values)}")
        self._backend.set_attr(indices, name, values, outermost)

    def to(self, device) -> EnvPool:
        """Move the pool's outputs and specs to ``device`` (TorchRL's ``Collector(..., env_device=)`` does).

        The host staging buffer stays as it was allocated: a pool built with ``device="cuda"``
        stages in pinned memory (asynchronous copies); one moved there later copies synchronously.
        """
        super().to(device)
        if self._host.device != self.device:
            self._host = HostBuffers(self._host.layout, self.device, flat=self._host.flat)
            self._done_views = self._cpu_done_views()
        return self

    def _cpu_done_views(self):
        # on CPU the done mask of a reset step is a view of the done buffer itself
        return _RankViews(self._host.tensors[("done",)][:, 0]) if self._host.on_host else None

    def __enter__(self) -> EnvPool:
        """``with EnvPool(...) as pool:`` closes the pool on leaving the block, as gymnasium's envs do."""
        return self

    def __exit__(self, *exc_info) -> None:
        self.close(raise_if_closed=False)

    def close(self, *, raise_if_closed: bool = True) -> None:
        backend = self.__dict__.get("_backend")
        super().close(raise_if_closed=raise_if_closed)
        if isinstance(backend, _ClosedBackend):
            backend.close()  # finishes a close() a Ctrl-C cut short
        elif backend is not None:
            closed = self.__dict__["_backend"] = _ClosedBackend()
            try:
                backend.close()
            except KeyboardInterrupt:
                closed._unfinished = backend
                raise

    def __repr__(self) -> str:
        return (
            f"EnvPool(num_envs={self.num_envs}, device={self.device}, "
            f"single_observation_space={self.single_observation_space}, "
            f"single_action_space={self.single_action_space}, "
            f"info_keys={sorted(self._info_schema.leaves)})"
        )


class PoolFactory:
    """``EnvPool(*args, **kwargs)`` as a picklable callable (see :meth:`EnvPool.factory`).

    A gymnasium id among the arguments is resolved here to its ``EnvSpec``, which the pool is then built
    from: a worker process or a Ray actor can build an id registered only in this process (under
    ``if __name__ == "__main__":``, in a notebook), as the pool's own process backend can. It pickles with
    ``pickle`` too (the arguments travel as cloudpickle bytes, as in gymnasium's ``CloudpickleWrapper``):
    lambdas and closures reach ``multiprocessing`` and ``concurrent.futures`` workers as well.
    """

    def __init__(self, cls, args: tuple, kwargs: dict):
        import cloudpickle

        # not .args/.kwargs: TorchRL reads those as extra constructor keyword arguments
        self.pool_cls, self.pool_args, self.pool_kwargs = cls, args, kwargs
        self._build_args, self._build_kwargs = _resolve_env_id(args, kwargs)
        try:
            cloudpickle.dumps((self._build_args, self._build_kwargs))
        except Exception as err:
            raise TypeError(
                f"EnvPool.factory: the pool's arguments cannot be pickled ({error_text(err)}), so worker "
                "processes and Ray actors could not rebuild the pool. Pass a gymnasium id, or env factories that "
                "are module-level functions or functools.partial of them, with picklable arguments (no locks, "
                "open files, live envs or CUDA tensors captured in closures)."
            ) from err

    def __call__(self, **overrides) -> EnvPool:
        """The pool; keyword arguments replace the factory's, given by name or by position (TorchRL's
        ``create_env_kwargs``: a worker's ``seed=``, or ``env_fns=``: an id given here is resolved in the process
        that calls the factory, so it must be registered there)."""
        if not overrides:
            return self.pool_cls(*self._build_args, **self._build_kwargs)
        import inspect

        _, overrides = _resolve_env_id((), overrides)
        # the factory's arguments by name (EnvBase's metaclass hides __init__'s signature from the class's own), so
        # an override of one given by position replaces it
        params = list(inspect.signature(self.pool_cls.__init__).parameters.values())
        given = dict(inspect.Signature(params[1:]).bind_partial(*self._build_args, **self._build_kwargs).arguments)
        for param in params[1:]:
            if param.kind is param.VAR_KEYWORD:  # **make_kwargs: gym.make's keywords, spread among the pool's own
                given.update(given.pop(param.name, {}))
        return self.pool_cls(**{**given, **overrides})

    def __reduce__(self):
        import cloudpickle

        return _rebuild_pool_factory, (cloudpickle.dumps(self.__dict__),)

    def __repr__(self) -> str:
        return f"EnvPool.factory(*{self.pool_args!r}, **{self.pool_kwargs!r})"


def _rebuild_pool_factory(payload: bytes) -> PoolFactory:
    import cloudpickle

    factory = PoolFactory.__new__(PoolFactory)
    factory.__dict__.update(cloudpickle.loads(payload))
    return factory


def _resolve_env_id(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of an ``EnvPool`` call with a gymnasium id (``env_fns``) replaced by its ``EnvSpec``."""
    if args and isinstance(args[0], str):
        return (_resolve_spec(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("env_fns"), str):
        return args, {**kwargs, "env_fns": _resolve_spec(kwargs["env_fns"])}
    return args, kwargs


class _RankViews(dict):
    """``{ndim: a row mask (N,) viewed as (N, 1, ..., 1)}``, made on first use: ready to broadcast
    against leaves of each rank (a view per leaf and step measured ~7 µs per reset step here)."""

    def __init__(self, mask: torch.Tensor):
        super().__init__({1: mask})

    def __missing__(self, ndim: int) -> torch.Tensor:
        view = self[ndim] = self[1].view(-1, *[1] * (ndim - 1))
        return view


def _zero_rows(value, views: _RankViews):
    """``value`` (a tensor or a tensordict) with the masked rows zeroed, out of place. Non-tensor data
    (``NonTensorData``, a per-env ``NonTensorStack``) is kept as it is, as TorchRL's generic reset keeps it."""
    if is_non_tensor(value):
        return value
    if isinstance(value, TensorDictBase):
        leaves = {key: _zero_rows(leaf, views) for key, leaf in value.items()}
        return TensorDict._new_unsafe(leaves, batch_size=value.batch_size, device=value.device)
    return value.masked_fill(views[value.ndim], 0)


def _resized(frames: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """uint8 ``(B, H, W, 3)`` frames resized to ``hw`` (bilinear, antialiased, rounded)."""
    resized = F.interpolate(
        frames.permute(0, 3, 1, 2).float(), size=hw, mode="bilinear", antialias=True, align_corners=False
    )
    return resized.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def _image_hw(image_shape) -> tuple[int, int]:
    """``image_shape`` as ``(H, W)``: two positive integers (no float or bool that ``int()`` would truncate)."""
    message = f"image_shape: expected (height, width): two positive integers, got {image_shape!r}"
    # arrays and 0-d tensors become Python numbers; floats and bools among them are refused below
    if isinstance(image_shape, (np.ndarray, torch.Tensor)):
        shape = image_shape.tolist()
    elif isinstance(image_shape, Sequence) and not isinstance(image_shape, str):
        shape = [s.item() if isinstance(s, torch.Tensor) and s.ndim == 0 else s for s in image_shape]
    else:
        raise TypeError(message)
    integers = all(isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)) for s in shape)
    if len(shape) != 2 or not integers:
        raise TypeError(message)
    if min(shape) < 1:
        raise ValueError(message)
    return int(shape[0]), int(shape[1])
