"""A batched TorchRL env (``batch_size == [N]``) as a ``gymnasium.vector.VectorEnv``.

Data path of one step::

    actions (numpy or torch) -> Layout.encode_action -> root TensorDict["action"]
    -> env.step_and_maybe_reset (env.step + env.step_mdp in DISABLED mode)
    -> Layout.observations/infos/flags (decoded on the env's device)
    -> to_host: one transfer -> (obs, rewards, terminations, truncations, infos)

Autoreset modes (gymnasium's exact semantics, https://farama.org/Vector-Autoreset-Mode):

* ``SAME_STEP``: one ``env.step_and_maybe_reset`` per step. A finished env is
  reset in the same step; ``obs`` holds its reset observation, and the terminal
  observation and info are in ``infos["final_obs"]`` / ``infos["final_info"]``
  (with the ``_final_obs`` / ``_final_info`` masks). This is TorchRL's own
  mapping: ``td["next", ...]`` is the terminal transition, the new root the reset one.
* ``NEXT_STEP`` (gymnasium's default): ``obs`` holds the terminal observation; on
  the next step that env's action is ignored and it returns its reset
  observation with reward 0, not terminated, not truncated, and its reset info.
  For an ``EnvPool`` or another env of this package (and their subclasses
  without a ``_step`` or ``_reset`` of their own) without a render mode (a
  ``WorldModelEnv`` only with a fixed start, see its ``fixed_start``), the
  finished rows are reset by ``step_and_maybe_reset`` when they finish and
  frozen by ``"_step"`` on the next step. It saves a reset round trip per step;
  only ``call()``, ``get_attr()`` and ``set_attr()`` in between can tell: they
  see the new episode, and an attribute set then reaches the episode after it
  (on ``SyncVectorEnv`` it reaches the new one, as in SAME_STEP mode).
  With a render mode (a pool of envs made with ``render_mode=...``), and for
  other envs that honour TorchRL's ``"_step"`` mask (a ``TransformedEnv`` of
  those, batch-unlocked envs), the finished rows stay in their terminal state
  until the next step: ``render()`` (and vector ``RecordVideo``), ``call()`` and
  ``get_attr()`` see it, as on ``SyncVectorEnv``. That step freezes them with
  ``"_step"`` while the others step, then resets them and reports the reset, so
  a transform's own per-row state (``CatFrames``' frames) is rebuilt by its
  reset (an untransformed ``WorldModelEnv`` makes that step and reset one fused
  call, with the same data). Other envs (a ``SerialEnv``/``ParallelEnv`` under
  a transform that reshapes one of their own observation keys, which TorchRL's
  partial step cannot take) are stepped without a reset (``env.step``); on the next
  step the finished rows are stepped once more (the action is discarded), then
  reset once and report that reset, so they must tolerate a step past the end
  of an episode. TorchRL's ``GymWrapper`` of a gymnasium ``VectorEnv`` steps and
  auto-resets every row itself: it is refused in this mode.
* ``DISABLED``: no reset inside ``step``. Stepping an env that finished raises;
  reset finished envs with ``reset(options={"reset_mask": mask})``.

``reset(options={"reset_mask": mask})`` resets only the masked envs in every
mode, as gymnasium's own vector envs do (over TorchRL's ``GymWrapper`` of a
vector env, the mask must be every row or exactly those that finished: all that
TorchRL can reset there; others are refused); infos then report only those envs,
and the others show their last observation (the final one for an env waiting
for its NEXT_STEP autoreset). An env waiting for its NEXT_STEP autoreset is not
reset a second time by a gymnasium reset without seed or options (it starts the
episode ``SyncVectorEnv`` would); with a seed or options it is reset again: an
env that counts its resets sees one more than on ``SyncVectorEnv``, and with
options but no seed its random stream has moved on by that extra reset, so its
episode differs from ``SyncVectorEnv``'s (pass a seed for the same episode).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from ..errors import check_bool
from ..introspect import transforms_of
from ._core import (
    Layout,
    attribute_errors,
    base_env,
    nest,
    set_leaf,
    step_after_close_error,
    to_host,
    torch_copies,
    traits,
)
from ._core import autoreset_mode as _autoreset_mode
from .seeding import check_options, normalize_seed, reset_kwargs, seed_groups

__all__ = ["TorchRLVectorEnv"]

AutoresetMode = gym.vector.AutoresetMode


class TorchRLVectorEnv(gym.vector.VectorEnv):
    """A TorchRL env with ``batch_size == [N]`` as a gymnasium ``VectorEnv`` of ``N`` envs.

    Prefer :func:`torchrl_swm.to_gymnasium`, which picks this class for batched envs.

    Args:
        env: the TorchRL env (an ``EnvPool``, a world-model env, a ``TransformedEnv``
            of either, or any TorchRL env with one batch dim). The export owns it:
            :meth:`close` closes it.

    Keyword Args:
        autoreset_mode: ``"next_step"`` (default), ``"same_step"`` or ``"disabled"``
            (or a :class:`gymnasium.vector.AutoresetMode`).
        numpy: return numpy arrays (default). With ``False``, observations,
            rewards, flags and info values are torch tensors on the env's device
            and actions may be torch tensors; only the done flags (which the
            info masks need) leave the device.
        observation_keys, info_keys: see :func:`torchrl_swm.to_gymnasium`.
        index_spaces: expose ``Discrete``/``MultiDiscrete`` spaces that start at 0, and shift
            actions and observations by ``start`` on the way (for clients that ignore ``start``, as
            Stable-Baselines3 does; :func:`torchrl_swm.to_sb3_vec_env` sets it).

    Attributes:
        env: the wrapped TorchRL env.
        layout: the key and space mapping (observation and info keys, and their spaces).

    Example:
        The SAME_STEP autoreset that CleanRL's loops are written for:

        >>> import numpy as np
        >>> from torchrl_swm import EnvPool, to_gymnasium
        >>> envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=4), autoreset_mode="same_step")
        >>> envs
        TorchRLVectorEnv(EnvPool, num_envs=4, autoreset_mode=SameStep)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, infos["episode_seed"]                          # env i gets seed 0 + i
        ((4, 4), array([0, 1, 2, 3]))
        >>> for step in range(1, 100):                                # push right until an env falls
        ...     obs, rewards, terminations, truncations, infos = envs.step(np.ones(4, dtype=np.int64))
        ...     if terminations.any():
        ...         break
        >>> step, terminations, infos["_final_obs"]    # env 0 ended: obs holds its reset observation,
        (8, array([ True, False, False, False]), array([ True, False, False, False]))
        >>> infos["final_obs"][0].shape                               # and final_obs its terminal one
        (4,)
        >>> envs.close()
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, env: EnvBase, *, autoreset_mode="next_step", numpy=True, observation_keys=None,
                 info_keys=None, index_spaces: bool = False):
        if not isinstance(env, EnvBase):
            raise TypeError(f"to_gymnasium: expected a TorchRL EnvBase, got {type(env).__name__}")
        if len(env.batch_size) != 1:
            raise ValueError(
                f"TorchRLVectorEnv: expected an env with batch_size [N], got {list(env.batch_size)}; "
                "use to_gymnasium(env), which returns a gymnasium.Env for batch_size []"
            )
        reset_keys = env.reset_keys
        if len(reset_keys) != 1:
            raise ValueError(f"TorchRLVectorEnv: expected one reset key, the env has {reset_keys}")
        self.env = env
        # the calls its errors name (the SB3 export names its own)
        self._step_call = "TorchRLVectorEnv.step()"
        self._masked_reset_call = "TorchRLVectorEnv.reset(options={'reset_mask': ...})"
        self._reopen_advice = "reset every env to reopen the env it wraps"
        # index_spaces: Discrete/MultiDiscrete spaces start at 0 (for Stable-Baselines3, which ignores start)
        self.layout = Layout(env, observation_keys=observation_keys, info_keys=info_keys, index_spaces=index_spaces)
        self.traits = traits(env)
        self.num_envs = int(env.batch_size[0])
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        pool = self.traits.pool
        inner_mode = _vec_gym_autoreset_mode(env)
        if inner_mode is not None and inner_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "to_gymnasium: this env is TorchRL's GymEnv(id, num_envs=N) or GymWrapper over a gymnasium VectorEnv "
                f"in {inner_mode.name} autoreset mode; TorchRL's VecGymEnvTransform rewrites that autoreset, and the "
                "finished rows would be reported with the wrong observations in every mode. Export "
                "EnvPool(gym.make_vec(id, N, ...)) instead, or use the gymnasium VectorEnv itself (it needs no export)."
            )
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self.traits.batched_wrapper:
            raise ValueError(
                f"to_gymnasium(autoreset_mode='next_step'): {type(base_env(env)).__name__} wraps an already-batched "
                "env, which steps and auto-resets every row at once, so the step after an episode ends could not "
                "leave that env unstepped (NEXT_STEP) nor reset it alone. Use autoreset_mode='same_step' or "
                "'disabled', or the wrapped vector env itself (a gymnasium VectorEnv needs no export)."
            )
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and pool is not None and not pool.freezes_rows:
            raise ValueError(
                "to_gymnasium(autoreset_mode='next_step'): the EnvPool runs a gymnasium VectorEnv, which steps every "
                "row at once, so the step after an episode ends could not leave that env unstepped (NEXT_STEP) "
                "without a step past the end or an env one step ahead of what it reported. Use "
                "autoreset_mode='same_step' or 'disabled', or the VectorEnv itself: it is a gymnasium VectorEnv already."
            )
        self.numpy = check_bool(numpy, "TorchRLVectorEnv: numpy")
        self.single_observation_space = self.layout.single_observation_space
        self.single_action_space = self.layout.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None
        metadata = {"render_modes": []}
        pool = self.traits.pool
        if pool is not None:
            sub = pool.env_metadata
            metadata = {k: v for k, v in dict(sub).items() if k in ("render_modes", "render_fps")}
            self.render_mode = pool.render_mode
        self.metadata = {**metadata, "autoreset_mode": self.autoreset_mode}
        # NEXT_STEP: finished envs are reset at the next step, not when they finish, with a render mode (so
        # frames, call() and get_attr() in between show the terminal state, as on SyncVectorEnv), for
        # transformed envs (a transform's own per-row state, CatFrames' frames, is rebuilt at that reset) and
        # for a world model whose reset depends on when it runs (a reset_fn or an encoder reading a model
        # trained between steps)
        base = base_env(env)
        self._defer_resets = (
            self.autoreset_mode is AutoresetMode.NEXT_STEP
            and self.traits.partial_steps
            and (
                self.render_mode is not None
                or not self.traits.frozen_rows_exact
                or (self.traits.world_model and not base.fixed_start)
            )
        )
        # an untransformed WorldModelEnv steps the others and restarts the waiting rows in one fused call, the
        # data of the generic step + reset below without TorchRL's reset round trip
        self._step_then_reset = base._step_then_reset if self._defer_resets and self.traits.world_model \
            and env is base else None
        self._device = self.layout.device
        #: one packed device-to-host transfer per step (accelerators); settable so tests run it on CPU
        self.packed_transfer = self._device.type != "cpu"
        self._batch = (self.num_envs,)
        self._reset_key = reset_keys[0]
        self._root: TensorDictBase | None = None
        self._pending: torch.Tensor | None = None  # NEXT_STEP: rows that finished on the last step (device)
        self._last_next: TensorDictBase | None = None  # NEXT_STEP: the last step's "next" (its observations)
        self._done = np.zeros(self.num_envs, dtype=np.bool_)  # host copy of the last step's done flags
        self._unreset_since_close = False  # closed, and no reset has succeeded since: step() is refused

    # -- gymnasium API --------------------------------------------------------------
    def reset(self, *, seed=None, options=None):
        """Reset every env (or those in ``options["reset_mask"]``) and return ``(obs, infos)``.

        Args:
            seed: ``None``, an int ``s`` (env ``i`` gets ``s + i``, as gymnasium
                does) or a list of ``N`` entries, each an int or ``None`` (that env
                is reset without a new seed: it continues its seed schedule, as on
                ``SyncVectorEnv``). Per-env seeds need an ``EnvPool`` at the base;
                a TorchRL ``GymEnv`` takes an int as ``reset(seed=s)`` (gymnasium's own per-env
                seeds), other envs are seeded as a whole with an int (``env.set_seed(s)``).
            options: passed to each sub-env's ``reset`` (``EnvPool`` only). The key
                ``"reset_mask"`` (numpy bool ``(N,)``) resets only those envs; the
                others keep their state and report their last observation (for an
                env waiting for its NEXT_STEP autoreset: its final one), as on
                ``SyncVectorEnv``.

        In NEXT_STEP mode an env whose episode ended on the last step was already
        reset when it finished (envs that honour ``"_step"``); resetting it again with
        no seed and no options keeps that reset rather than making a second one, so it
        starts the same episode as on ``SyncVectorEnv``. With a seed or options it is
        reset again (see the module docstring: with options and no seed its episode
        differs from ``SyncVectorEnv``'s).
        """
        options = check_options(options, "reset")
        mask = options.pop("reset_mask", None)
        if self._unreset_since_close and mask is not None:  # the other rows' state went with the close
            call = self._masked_reset_call
            if self.traits.pool is not None:
                raise step_after_close_error(call, self.env)  # a closed pool never reopens: the same advice
            raise RuntimeError(f"{call} after close(): {self._reopen_advice}")
        # a closed env this reset reopens (a WorldModelEnv; TorchRL's batched envs, whose set_seed restarts them
        # too): open from here, so that close() closes what the reset restarts even if it fails (VectorEnv.close
        # does nothing once `closed` is set); step() stays refused until a reset succeeds
        self.closed = False
        if mask is not None:
            mask = self._check_reset_mask(mask)
        n = self.num_envs
        seed = normalize_seed(seed, n, "reset")
        if isinstance(seed, int):
            super().reset(seed=seed)
        rows = np.ones(n, np.bool_) if mask is None else mask
        # NEXT_STEP envs that honour "_step" reset a finished env when it finishes: not again here
        already = None
        if self._pending is not None and self.traits.partial_steps and not self._defer_resets and not options:
            unseeded = np.ones(n, np.bool_) if seed is None else np.array(
                [False] * n if isinstance(seed, int) else [s is None for s in seed], np.bool_)
            already = rows & self._done & unseeded
            if not already.any():
                already = None
        groups = seed_groups(seed, n) if self.traits.pool is not None else None
        if groups is None:
            calls = [(rows, reset_kwargs(self.env, self.traits, seed, options, n, "reset"))]
        else:
            seeded, seeds, unseeded = groups
            calls = [(rows & seeded, reset_kwargs(self.env, self.traits, seeds, options, n, "reset")),
                     (rows & unseeded, reset_kwargs(self.env, self.traits, None, options, n, "reset"))]
        if already is not None:
            calls = [(part & ~already, kwargs) for part, kwargs in calls]
        calls = [(part, kwargs) for part, kwargs in calls if part.any()]
        layout = self.layout
        with torch.no_grad():
            if mask is None and already is None and len(calls) == 1:
                root = self.env.reset(**calls[0][1])
            else:
                if mask is None and already is None:
                    # a full reset in parts: start from nothing but the done flags, all False (every row
                    # is reset; without them TorchRL warns that a partial reset misses the done keys)
                    root = self.env.full_done_spec.zero()
                else:
                    root = self._root.exclude("next")
                for part, kwargs in calls:
                    root.set(self._reset_key, torch.as_tensor(part, device=self._device).unsqueeze(-1))
                    root = self.env.reset(root, select_reset_only=True, **kwargs)
            root.pop(self._reset_key, None)
            values = [*layout.observations(root), *layout.infos(root)]
            # envs not reset that wait for their NEXT_STEP autoreset show their final observation, as on
            # SyncVectorEnv (envs that honour "_step" hold their reset state already)
            final = self._done & ~rows
            if self.traits.partial_steps and self._last_next is not None and final.any():
                where = torch.as_tensor(final, device=self._device)
                values[: len(layout.obs_leaves)] = [
                    torch.where(where.view(n, *([1] * (cur.ndim - 1))), last, cur)
                    for cur, last in zip(layout.observations(root), layout.observations(self._last_next))
                ]
            self._root = root
            self._done[rows] = False
            if mask is None or not self._done.any():
                self._pending = None
            elif self._pending is not None:
                # on the CPU _pending shares _done's memory, cleared above; on an accelerator it is a copy
                self._pending = self._pending & ~torch.as_tensor(rows, device=self._device)
            values = to_host(values, self._packed()) if self.numpy else torch_copies(values)
        n_obs = len(layout.obs_leaves)
        self._unreset_since_close = False
        return self._observation(values[:n_obs]), self._infos(values[n_obs:], rows.copy())

    def step(self, actions):
        """Step every env with ``actions`` of shape ``(N, *single_action_space.shape)``.

        Returns ``(obs, rewards (N,), terminations (N,) bool, truncations (N,) bool, infos)``.

        Raises:
            RuntimeError: before the first ``reset()``, or (DISABLED mode) when an
                env that finished was not reset.
            ValueError, TypeError: an action of the wrong shape or dtype, or out
                of a discrete space.
        """
        if self._unreset_since_close:
            raise step_after_close_error(self._step_call, self.env)
        if self._root is None:
            raise RuntimeError(f"{self._step_call} was called before reset(); call reset() first")
        mode = self.autoreset_mode
        if mode is AutoresetMode.DISABLED and self._done.any():
            rows = np.flatnonzero(self._done).tolist()
            raise RuntimeError(
                f"autoreset_mode='disabled': envs {rows} finished on the previous step and were not reset; call "
                "reset(options={'reset_mask': mask}) for them before stepping again"
            )
        with torch.no_grad():
            action = self.layout.encode_action(actions, self._batch)
            root = self._root
            set_leaf(root, self.layout.action_key, action)
            if mode is AutoresetMode.SAME_STEP:
                return self._step_same(root)
            if mode is AutoresetMode.NEXT_STEP:
                try:
                    return self._step_next(root)
                except BaseException:
                    # the rows it froze must not stay frozen: the next reset() reuses this root for the envs
                    # it leaves alone, and a stale "_step" would make the step after it do nothing
                    root.pop("_step", None)
                    raise
            return self._step_disabled(root)

    # -- the three modes -----------------------------------------------------------------
    def _step_same(self, root):
        layout = self.layout
        td, root_ = self.env.step_and_maybe_reset(root)
        nxt = td.get("next")
        self._root = root_
        return self._emit(
            layout.observations(root_), layout.raw_flags(nxt), layout.infos(root_),
            final=(layout.observations(nxt), layout.infos(nxt)),
        )

    def _step_next(self, root):
        layout, pending, env = self.layout, self._pending, self.env
        if not self.traits.partial_steps or self._defer_resets:
            # The finished rows were left in their terminal state (render(), vector RecordVideo, call() and
            # get_attr() see it in between, as on SyncVectorEnv). Now the others step while they are frozen
            # by "_step" (an env that cannot freeze rows steps them past the end, their actions discarded),
            # then they are reset once and report that reset. Resetting them after the step, not before,
            # lets a transform that keeps per-row state of its own (CatFrames' frames) rebuild it at the
            # reset instead of seeing the reset observation stepped once more.
            if pending is not None and self.traits.partial_steps:
                set_leaf(root, "_step", (~pending).unsqueeze(-1))
            fused = None if pending is None or self._step_then_reset is None else self._step_then_reset(root, pending)
            if fused is not None:
                td, root_ = fused
                td.pop("_step", None)
                root_.pop("_step", None)
                nxt = self._restore_rows(pending, root_, td.get("next"))
            else:
                td = env.step(root)
                td.pop("_step", None)
                nxt = td.get("next")
                root_ = env.step_mdp(td)
                if pending is not None:
                    root_.set(self._reset_key, pending.unsqueeze(-1))
                    root_ = env.reset(root_, select_reset_only=True)
                    root_.pop(self._reset_key, None)
                    nxt = self._restore_rows(pending, root_, nxt)
        elif pending is None:
            td, root_ = env.step_and_maybe_reset(root)
            nxt = td.get("next")
        else:
            # `pending` rows were reset when they finished (step_and_maybe_reset): freeze them now. Only a
            # package env takes this path (others defer their resets), and it reports its frozen rows exactly.
            set_leaf(root, "_step", (~pending).unsqueeze(-1))
            td, root_ = env.step_and_maybe_reset(root)
            root.pop("_step", None)
            root_.pop("_step", None)
            nxt = td.get("next")
        self._root = root_
        self._last_next = nxt  # what this step reports (reset() shows it for envs left waiting)
        frozen = None if pending is None or self.traits.frozen_rows_exact else self._done
        return self._emit(layout.observations(nxt), layout.raw_flags(nxt), layout.infos(nxt), frozen=frozen,
                          next_step=True)

    def _step_disabled(self, root):
        layout = self.layout
        td = self.env.step(root)
        nxt = td.get("next")
        self._root = self.env.step_mdp(td)
        return self._emit(layout.observations(nxt), layout.raw_flags(nxt), layout.infos(nxt))

    def _restore_rows(self, rows: torch.Tensor, source, nxt):
        """Copy ``source``'s values (the reset values) into ``rows`` of ``nxt`` (what the step reports).

        Covers every leaf the export reports (:attr:`Layout.reported_keys`: observations, flags,
        infos and their masks) that ``source`` shares with ``nxt``, so state carried in the
        tensordict and reported (a transform's step count as an info, a latent as an
        observation) is reported from the reset too. Nothing else of ``nxt`` is read.
        """
        n = self.num_envs
        views = {}  # the row mask viewed for each rank met
        for key in self.layout.reported_keys:
            value, old = source.get(key, None), nxt.get(key, None)
            if not isinstance(value, torch.Tensor) or not isinstance(old, torch.Tensor) or old.shape != value.shape:
                continue
            view = views.get(value.ndim)
            if view is None:
                view = views[value.ndim] = rows.view(n, *([1] * (value.ndim - 1)))
            set_leaf(nxt, key, torch.where(view, value, old))
        return nxt

    # -- output ---------------------------------------------------------------------------
    def _emit(self, obs, flags, info, final=None, frozen=None, next_step=False):
        """Move the step's leaves to the host in one transfer and assemble gymnasium's tuple.

        ``flags`` are :meth:`Layout.raw_flags`; ``final`` the terminal observation and
        info leaves (SAME_STEP); ``frozen`` (NEXT_STEP, envs whose frozen rows are not
        exact) the rows whose reward and flags read as a reset: 0 and False.
        """
        n_obs, n_flags, n_info = len(obs), len(flags), len(info)
        layout, batch = self.layout, self._batch
        final_obs = final_info = None
        if self.numpy:
            packed = self._packed()
            extra = [*final[0], *final[1]] if final is not None and packed else []
            host = to_host([*obs, *flags, *info, *extra], packed)
            obs, info = host[:n_obs], host[n_obs + n_flags : n_obs + n_flags + n_info]
            reward, term, trunc = layout.host_flags(host[n_obs : n_obs + n_flags], batch)
        else:
            flags = [f.reshape(batch) for f in flags]
            copies = torch_copies([*obs, *flags, *info])
            obs, info = copies[:n_obs], copies[n_obs + n_flags :]
            reward, term = copies[n_obs], copies[n_obs + 1]
            trunc = copies[n_obs + 2] if n_flags > 2 else torch.zeros_like(term)
            if reward.dtype not in (torch.float32, torch.float64):
                reward = reward.float()
        if frozen is not None:
            rows_frozen = frozen if self.numpy else torch.from_numpy(frozen).to(self._device)
            reward[rows_frozen], term[rows_frozen], trunc[rows_frozen] = 0, False, False
        done = term | trunc
        if not self.numpy:
            done = done.cpu().numpy()
        rows = np.flatnonzero(done)
        if final is not None and rows.size:
            if not self.numpy:
                index = torch.from_numpy(rows).to(self._device)
                final_obs = [t[index] for t in final[0]]
                final_info = [t[index] for t in final[1]]
            elif packed:
                extra = host[n_obs + n_flags + n_info :]
                final_obs = [a[rows] for a in extra[:n_obs]]
                final_info = [a[rows] for a in extra[n_obs:]]
            else:  # on the CPU: copy only the finished rows
                final_obs = [t.numpy()[rows] for t in final[0]]
                final_info = [t.numpy()[rows] for t in final[1]]
        self._done = done
        if next_step:
            self._pending = torch.from_numpy(done).to(self._device, non_blocking=True) if rows.size else None
        infos = self._infos(info, None)
        if final_obs is not None:
            finals = np.full(self.num_envs, None, dtype=object)
            boxes = layout.obs_is_box  # a Box leaf's row stays an array (a[j, ...]), 0-d for shape ()
            if layout.single_leaf:
                terminal, box = final_obs[0], boxes[0]
                for j, i in enumerate(rows.tolist()):
                    finals[i] = terminal[j, ...] if box else terminal[j]
            else:
                for j, i in enumerate(rows.tolist()):
                    values = [a[j, ...] if box else a[j] for a, box in zip(final_obs, boxes)]
                    finals[i] = nest(layout.obs_leaves, values)
            infos["final_obs"], infos["_final_obs"] = finals, done.copy()
            final_infos: dict = {}
            for (leaf, full, _), (_, finished, mask) in zip(
                layout.info_entries(info), layout.info_entries(final_info), strict=True
            ):
                if self.numpy:
                    value = np.zeros_like(full)
                    value[rows] = finished
                else:
                    value = torch.zeros_like(full)
                    value[torch.from_numpy(rows).to(full.device)] = finished
                reported = done
                if mask is not None:
                    reported = done.copy()
                    reported[rows] = mask.cpu().numpy() if isinstance(mask, torch.Tensor) else mask
                _put(final_infos, leaf.path, value, reported)
            infos["final_info"], infos["_final_info"] = final_infos, done.copy()
        return self._observation(obs), reward, term, trunc, infos

    def _packed(self) -> bool:
        return self.packed_transfer or self._device.type != "cpu"

    def _observation(self, values):
        return values[0] if self.layout.single_leaf else nest(self.layout.obs_leaves, values)

    def _infos(self, values, reported: np.ndarray | None) -> dict:
        """Vector infos with gymnasium's ``_key`` masks; rows not ``reported`` read zero.

        A leaf with a presence mask (``("info_mask", ...)``) is reported only where
        the env reported it; the env already wrote zero elsewhere.
        """
        infos: dict = {}
        if not values:
            return infos
        partial = reported is not None and not reported.all()
        if reported is None:
            reported = np.ones(self.num_envs, np.bool_)
        for leaf, value, mask in self.layout.info_entries(values):
            if partial:
                keep = reported.reshape(-1, *([1] * (value.ndim - 1)))
                if self.numpy:
                    value = np.where(keep, value, np.zeros((), value.dtype))
                else:
                    # a select, not a product: an inf or NaN in a row not reported must read 0, as with numpy
                    keep = torch.from_numpy(keep).to(value.device)
                    value = torch.where(keep, value, torch.zeros((), dtype=value.dtype, device=value.device))
            if mask is not None:
                mask = mask.cpu().numpy() if isinstance(mask, torch.Tensor) else mask
                _put(infos, leaf.path, value, reported & mask)
            else:
                _put(infos, leaf.path, value, reported, anyone=not partial or None)
        return infos

    def _check_reset_mask(self, mask) -> np.ndarray:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"options['reset_mask'] must be a numpy array, got {type(mask).__name__}")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"options['reset_mask'] must have dtype bool, got {mask.dtype}")
        if not mask.any():
            raise ValueError("options['reset_mask'] must select at least one env")
        if self._root is None:
            raise RuntimeError("options['reset_mask'] needs a previous full reset(); call reset() first")
        if self.traits.batched_wrapper and not mask.all() and not np.array_equal(mask, self._done):
            # TorchRL's GymWrapper of a vector env resets all its rows, or exactly those that finished
            raise ValueError(
                f"options['reset_mask']: {type(base_env(self.env)).__name__} wraps an already-batched env, which "
                "TorchRL resets as a whole or exactly in the rows that finished on the last step "
                f"({np.flatnonzero(self._done).tolist()}); got a mask of rows {np.flatnonzero(mask).tolist()}. "
                "Export EnvPool(vector_env) instead to reset any rows."
            )
        return mask

    # -- sub-env access (EnvPool) --------------------------------------------------------------
    def _pool(self, what: str):
        if self.traits.pool is None:
            raise AttributeError(
                f"{what} reaches the sub-environments of an EnvPool; this export wraps "
                f"{type(self.env).__name__}, which has none"
            )
        return self.traits.pool

    def call(self, name: str | None = None, /, *args, **kwargs) -> tuple:
        """Call method ``name`` of every sub-env with ``args`` and ``kwargs``, all of them the method's (as
        ``SyncVectorEnv.call``: an ``indices=`` goes to the method, not to the pool) (``EnvPool`` only).
        ``call(name="m")`` names the method, as on ``SyncVectorEnv``; after a positional name, ``name=`` is
        the method's own argument."""
        if name is None:
            if "name" not in kwargs:
                raise TypeError("call() missing the method's name: call(name, *args, **kwargs)")
            name = kwargs.pop("name")
        pool = self._pool(f"call({name!r})")
        with attribute_errors():
            return tuple(pool._backend.call(list(range(pool.num_envs)), name, args, kwargs))

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every sub-env, looked up through gymnasium wrappers (``EnvPool`` only)."""
        with attribute_errors():
            return tuple(self._pool(f"get_attr({name!r})").call("get_wrapper_attr", name))

    def set_attr(self, name: str, values) -> None:
        """Set ``name`` on every sub-env: one value for all, or a list/tuple of ``N`` (``EnvPool`` only)."""
        self._pool(f"set_attr({name!r})").set_attr(name, values)

    @property
    def np_random_seed(self):
        """Each sub-env's ``np_random_seed`` (a tuple, as ``SyncVectorEnv``'s) over a pool of gymnasium envs; the
        vector env's own over a pool of one; else gymnasium's ``VectorEnv`` value (the int last passed to reset)."""
        if self.traits.pool is None:
            return super().np_random_seed
        return self._sub_envs_attr("np_random_seed")

    @property
    def np_random(self):
        """Each sub-env's ``np_random`` (a tuple, as ``SyncVectorEnv``'s) over a pool of gymnasium envs (copies,
        from a process backend's workers); the vector env's own over a pool of one; else gymnasium's ``VectorEnv``
        generator."""
        if self.traits.pool is None:
            return super().np_random
        return self._sub_envs_attr("np_random")

    def _sub_envs_attr(self, name: str):
        """The pool's sub-envs' attribute ``name``, as ``SyncVectorEnv`` shows it: a tuple of each env's over a
        pool of single envs (asked where they live), the vector env's own over a pool of one."""
        pool = self.traits.pool
        if pool.freezes_rows:
            return tuple(pool.get_attr(name))
        return getattr(pool._backend.venv, name)

    @np_random.setter
    def np_random(self, value) -> None:
        if self.traits.pool is not None:
            raise AttributeError(
                "TorchRLVectorEnv.np_random: the generators are the sub-envs' own (as SyncVectorEnv's, which has no "
                "setter); seed them with reset(seed=...)"
            )
        gym.vector.VectorEnv.np_random.fset(self, value)

    def render(self):
        """The sub-envs' frames (``EnvPool`` only; else ``NotImplementedError``, as gymnasium's ``VectorEnv.render``
        and the single-env export raise)."""
        if self.traits.pool is None:
            raise NotImplementedError(
                f"render() reaches the sub-environments of an EnvPool; this export wraps {type(self.env).__name__}, "
                "which has none"
            )
        return tuple(self.traits.pool.call("render"))

    def close_extras(self, **kwargs) -> None:
        # called once (VectorEnv.close checks self.closed); the wrapped env's is_closed cannot be
        # trusted: a plain EnvBase starts "closed"
        self._unreset_since_close = True
        # the rows' autoreset bookkeeping goes with them: the reset that reopens the env resets every row
        # (NEXT_STEP's "already reset when it finished" shortcut would make it a partial reset, refused)
        self._pending, self._last_next = None, None
        self._done[:] = False
        self.env.close(raise_if_closed=False)

    def __repr__(self) -> str:
        name = self.spec.id if self.spec is not None else type(self.env).__name__
        return f"TorchRLVectorEnv({name}, num_envs={self.num_envs}, autoreset_mode={self.autoreset_mode.value})"


def _put(infos: dict, path, value, mask: np.ndarray, anyone: bool | None = None) -> None:
    """Add ``value`` at ``path`` with gymnasium's ``_key`` masks at every level (as ``VectorEnv._add_info``).

    A value no env reported is left out, as gymnasium leaves out keys no sub-env returned
    (``anyone``: whether ``mask`` has a True, when the caller knows).
    """
    if not (mask.any() if anyone is None else anyone):
        return
    node = infos
    for part in path[:-1]:
        # a dict is reported by an env that reported any of its leaves
        node["_" + part] = node["_" + part] | mask if "_" + part in node else mask.copy()
        node = node.setdefault(part, {})
    node[path[-1]] = value
    node["_" + path[-1]] = mask.copy()


def _vec_gym_autoreset_mode(env):
    """The autoreset mode of the gymnasium VectorEnv under a TorchRL ``VecGymEnvTransform`` (what ``GymEnv(id,
    num_envs=N)`` and ``GymWrapper(vector_env)`` add) among ``env``'s transforms; ``None`` without one."""
    from torchrl.envs import VecGymEnvTransform

    from ..pool.vector import declared_autoreset_mode  # read as the pool reads a VectorEnv's mode

    if not any(isinstance(t, VecGymEnvTransform) for t in transforms_of(env)):
        return None
    return declared_autoreset_mode(getattr(base_env(env), "_env", None))
