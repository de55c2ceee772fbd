"""The vector backend: a gymnasium ``VectorEnv`` (already batched) as the pool's engine.

One ``VectorEnv.step`` call advances every sub-env; the pool writes the batched
arrays into its buffers with one assignment per leaf. The three gymnasium
autoreset modes are turned into TorchRL's contract (no auto-reset inside a
step, exact terminal observations, no ghost transitions):

* ``DISABLED``: done rows stay done until TorchRL resets them through the
  vector env's masked reset (``reset(options={"reset_mask": mask})``).
* ``NEXT_STEP`` (gymnasium's default): the vector env would reset done rows
  at the *next* step, ignoring their actions (a ghost transition). The pool
  resets them as soon as TorchRL asks, with the masked reset, which also
  cancels the pending autoreset; stepping a done row that was not reset is a
  clear error instead of a silent ghost.
* ``SAME_STEP``: the vector env resets done rows inside the step and reports
  the terminal observation in ``info["final_obs"]``. The pool writes the
  terminal observation (and ``final_info``) into ``"next"`` and keeps the
  reset observation until TorchRL's reset of those rows asks for it. The
  end-of-episode statistics of gymnasium's vector ``RecordEpisodeStatistics``
  (``"episode"``), which it adds at the top level where gymnasium puts the reset
  info, are recorded at the terminal step too; any other top-level entry of a
  finished row is its reset info, as gymnasium defines it.

A vector env that has no masked reset needs an adapter
(:func:`register_masked_reset`); gymnasium's numpy ``CartPoleVectorEnv`` has
one here. A masked reset that changes the observation of a row it was not
asked to reset (a vector env that ignores the mask) is an error naming that
row, not a silent desync: checked for every vector env but gymnasium's own
``SyncVectorEnv``/``AsyncVectorEnv`` used as they are (not wrapped, not subclassed).
Each step advances every row, so ``"_step"`` masks are refused: use a pool of
single envs to freeze rows.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import utils as classic_control_utils
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from ..errors import (
    EnvAttributeError,
    EnvError,
    SpecError,
    StepRefusedError,
    add_as_notes,
    add_note,
    describe,
    error_text,
)
from .infos import EPISODE_END, batch_wide_error, check_vector_mask, flatten_vector_info, numeric_info_value
from .rows import RowWriter
from .serial import (
    PROBE_HINT,
    InProcessBackend,
    action_mask,
    call_envs,
    check_frame,
    close_envs,
    env_is_wrapped,
    episode_stat_probes,
    first_other_frame,
    probe_action,
    set_envs_attr,
)

__all__ = ["VectorBackend", "register_masked_reset"]

#: ``{VectorEnv class: fn(venv, mask, seed, options) -> (obs, info)}`` for vector
#: envs that cannot reset a subset of their rows through ``options["reset_mask"]``.
_MASKED_RESETS: dict[type, Callable] = {}


def register_masked_reset(cls: type, fn: Callable) -> None:
    """Teach the pool how to reset only some rows of a ``VectorEnv`` class.

    ``fn(venv, mask, seed, options)`` resets the rows where the bool array
    ``mask`` is True, leaves the others untouched, cancels any pending
    autoreset of the reset rows, and returns the batched ``(obs, info)``.
    """
    _MASKED_RESETS[cls] = fn


def _cartpole_masked_reset(venv, mask, seed, options):
    # CartPoleVectorEnv keeps one state array and one RNG for the batch: its own
    # reset() redraws every row. This redraws the masked rows only, from the
    # same distribution, and clears their pending NEXT_STEP autoreset.
    if seed is not None:
        venv._np_random, venv._np_random_seed = gym.utils.seeding.np_random(int(seed))
    if options is None:  # as the vector env's own autoreset: the bounds its last reset() set
        low, high = getattr(venv, "low", -0.05), getattr(venv, "high", 0.05)
    else:  # as its reset(options=...): missing bounds take the defaults, and later resets keep them
        low, high = classic_control_utils.maybe_parse_reset_bounds(options, -0.05, 0.05)
        venv.low, venv.high = low, high
    venv.state[:, mask] = venv.np_random.uniform(low=low, high=high, size=(4, int(mask.sum())))
    venv.steps[mask] = 0
    venv.prev_done[mask] = False
    return venv.state.T.astype(np.float32), {}


register_masked_reset(CartPoleVectorEnv, _cartpole_masked_reset)
_OWN_MASKED_RESETS = frozenset({_cartpole_masked_reset})  # tested here: their resets are not re-checked at run time
_PENDING_CLOSE_TIMEOUT = 5.0  # seconds a close waits for the answers of a call an error left pending


def _episode_stat_wrappers(venv) -> list:
    """The vector ``RecordEpisodeStatistics`` wrappers in ``venv``'s chain."""
    found = []
    while isinstance(venv, gym.vector.VectorWrapper):
        if isinstance(venv, RecordEpisodeStatistics):
            found.append(venv)
        venv = venv.env
    return found


def _stats_key(wrapper) -> str:
    return getattr(wrapper, "_stats_key", "episode")  # its stats_key= argument, kept privately


def _episode_stat_keys(venv) -> frozenset:
    """The info keys of the vector ``RecordEpisodeStatistics`` wrappers in ``venv``'s chain (``"episode"``)."""
    return frozenset(_stats_key(wrapper) for wrapper in _episode_stat_wrappers(venv))


def _episode_stat_probes(venv, num_envs: int) -> list:
    """Probe infos for the episode statistics of ``venv``'s vector ``RecordEpisodeStatistics`` wrappers: they
    report them only at an episode's end, which the construction probe's one step rarely reaches, and their
    leaves and dtypes are known (``r`` the return, ``l`` the length, ``t`` the time)."""
    probes = []
    for wrapper in _episode_stat_wrappers(venv):
        stats = {
            "r": np.zeros((), getattr(wrapper, "episode_returns", np.zeros(0)).dtype),
            "l": np.zeros((), getattr(wrapper, "episode_lengths", np.zeros(0, np.int64)).dtype),
            "t": np.zeros((), np.float64),
        }
        probes.extend((i, EPISODE_END, {_stats_key(wrapper): dict(stats)}) for i in range(num_envs))
    return probes


def declared_autoreset_mode(venv) -> AutoresetMode:
    """``venv.metadata["autoreset_mode"]``, or the first one declared under it (a ``VectorWrapper`` that sets
    metadata of its own hides its env's); gymnasium's default, NEXT_STEP, when none is declared. The
    enum, its value or its name (``"SameStep"``, ``"SAME_STEP"``); anything else is a :class:`SpecError`."""
    env = venv
    while "autoreset_mode" not in (getattr(env, "metadata", None) or {}):
        if not isinstance(env, gym.vector.VectorWrapper):
            return AutoresetMode.NEXT_STEP
        env = env.env
    value = env.metadata["autoreset_mode"]
    if isinstance(value, AutoresetMode):
        return value
    if isinstance(value, str):
        for mode in AutoresetMode:
            if value in (mode.value, mode.name):
                return mode
    raise SpecError(
        f"{type(env).__name__}.metadata['autoreset_mode'] is {value!r}; expected a gymnasium.vector.AutoresetMode "
        f"({', '.join(f'AutoresetMode.{mode.name}' for mode in AutoresetMode)}), its value "
        f"({', '.join(repr(mode.value) for mode in AutoresetMode)}) or its name"
    )


def _plain_sync(venv) -> bool:
    """A gymnasium ``SyncVectorEnv`` whose ``close`` and ``close_extras`` are gymnasium's own (a subclass that
    cleans up in them is closed through them)."""
    cls = type(venv)
    return (isinstance(venv, gym.vector.SyncVectorEnv) and cls.close_extras is gym.vector.SyncVectorEnv.close_extras
            and cls.close is gym.vector.VectorEnv.close)


def _innermost(venv):
    while isinstance(venv, gym.vector.VectorWrapper):
        venv = venv.env
    return venv


_INT64_MAX = np.iinfo(np.int64).max


def _stack_infos_as_numpy_promotes(venv) -> None:
    """Make gymnasium's ``VectorEnv._add_info``, on ``venv`` only, stack info values as the pool's other backends
    do. It types each key's array by the first value it meets and casts the other envs' values into it without a
    word (env 1's 1.5 read 1 beside env 0's int, its 3 read True beside a bool, a ``None`` NaN beside floats),
    and broadcasts a value of another shape into its row. Here the array is first promoted as numpy promotes the
    values' dtypes (integers of either sign in int64, which the serial backend also uses), and a ``None``
    beside numbers, a value of another shape or a dict beside a value raises, from a frame
    :func:`_info_stacking_failure` reads as gymnasium's own. For vector envs that use gymnasium's ``_add_info``
    unchanged (``SyncVectorEnv``, ``AsyncVectorEnv``: both stack in this process); undone at the pool's close."""
    if type(venv)._add_info is not gym.vector.VectorEnv._add_info:
        return
    # a weak reference: the env holding a method bound to itself would live until the cycle collector ran
    venv._add_info = functools.partial(_promoting_add_info, weakref.proxy(venv))


def _promoting_add_info(venv, vector_infos, env_info, env_num):
    if env_info:  # most steps of most envs report nothing: no cost beyond the call
        _add_info(vector_infos, env_info, env_num)
        vector_infos = gym.vector.VectorEnv._add_info(venv, vector_infos, env_info, env_num)  # nested: through here
    return vector_infos


def _add_info(vector_infos, env_info, env_num):
    """Promote the arrays of ``vector_infos`` that ``env_info``'s values would not fit. The name and locals (key,
    value, env_num, array) are those :func:`_info_stacking_failure` reads an error's env and key from."""
    for key, value in env_info.items():
        array = vector_infos.get(key)
        if key == "final_obs" or array is None:
            continue  # a key's first value lays its array out
        if isinstance(value, dict) or isinstance(array, dict):
            if isinstance(value, dict) != isinstance(array, dict):
                raise ValueError("a dict in one env and a value in another")
            continue
        if array.dtype.kind not in "biuf":
            continue  # object arrays keep what they are given
        if value is None:
            raise ValueError("None beside numbers (gymnasium would store a NaN, a False or raise)")
        given = np.asarray(value)
        if given.dtype.kind not in "biuf":
            continue  # a string beside numbers: gymnasium raises, named as its own error
        if given.shape != array.shape[1:]:
            raise ValueError(f"a value of shape {given.shape} where the key's array holds values of shape "
                             f"{array.shape[1:]}")  # gymnasium broadcast some: a scalar into a (1,) row
        wider = np.result_type(array.dtype, given.dtype)
        if wider.kind == "f" and array.dtype.kind in "iu" and given.dtype.kind in "iu":
            # int64 beside uint64: numpy's float64 would round both; int64 holds them where they fit
            if any(part.dtype == np.uint64 and part.size and part.max() > _INT64_MAX for part in (array, given)):
                raise ValueError("an integer outside int64's range beside other integers (report it as a float "
                                 "or a string)")
            wider = np.dtype(np.int64)
        if wider != array.dtype:
            vector_infos[key] = array.astype(wider)


class VectorBackend(InProcessBackend):
    """Drives a gymnasium ``VectorEnv`` (see the module docstring).

    Args:
        venv: the vector env.
        pixels: render frames with ``venv.render()`` after every reset and step.
        masked_reset: ``True`` to declare that ``venv.reset`` honours
            ``options["reset_mask"]`` (gymnasium's Sync/AsyncVectorEnv do, and
            every DISABLED-mode env must), or a function as in
            :func:`register_masked_reset`. ``None`` or ``False``: decide from the class.
    """

    batched_actions = True

    def __init__(self, venv: gym.vector.VectorEnv, pixels: bool = False, masked_reset=None, seed_every_episode=None):
        if not isinstance(venv, gym.vector.VectorEnv):
            raise TypeError(f"expected a gymnasium.vector.VectorEnv, got {describe(venv)}")
        self.venv = venv
        self.num_envs = int(venv.num_envs)
        self.pixels = pixels
        self.mode = declared_autoreset_mode(venv)
        self.observation_space = venv.single_observation_space
        self.action_space = venv.single_action_space
        #: Whether each row can get its own seed (gymnasium's Sync/AsyncVectorEnv), or one seeds the batch.
        self.per_env_seeds = isinstance(_innermost(venv), (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))
        #: ``None`` resolves to ``per_env_seeds``, except in SAME_STEP mode: a batch RNG reseeded at every partial
        #: reset replays no episode, and a SAME_STEP env has already reset its finished rows (unseeded), so a
        #: seed of their own would cost every episode a second reset.
        if seed_every_episode is None:
            seed_every_episode = self.per_env_seeds and self.mode is not AutoresetMode.SAME_STEP
        self.seed_every_episode = bool(seed_every_episode)
        self._everyone = np.ones(self.num_envs, dtype=bool)
        self._everyone.flags.writeable = False
        inner = _innermost(venv)
        _stack_infos_as_numpy_promotes(inner)
        if (isinstance(inner, gym.vector.AsyncVectorEnv) and not getattr(inner, "shared_memory", True)
                and self.mode is AutoresetMode.NEXT_STEP):
            # gymnasium 1.4's worker clears its pending NEXT_STEP autoreset at a reset only with shared memory: the
            # step after a reset would reset that env again, a ghost transition (reward 0, obs from reset to reset)
            raise SpecError(
                "AsyncVectorEnv(shared_memory=False) in NEXT_STEP mode: its workers keep a finished env's pending "
                "autoreset across a reset (gymnasium clears it only with shared memory), so the step after a reset "
                "would restart that env again and record a ghost transition. Use shared_memory=True (gymnasium's "
                "default), or autoreset_mode SAME_STEP or DISABLED."
            )
        self._masked_reset = self._find_masked_reset(masked_reset)
        if pixels and getattr(venv, "render_mode", None) != "rgb_array":
            raise EnvError(None, "make", f"pixels=True needs render_mode='rgb_array', got {getattr(venv, 'render_mode', None)!r}")
        if pixels and self.mode is AutoresetMode.SAME_STEP:
            raise SpecError(
                "pixels=True with a SAME_STEP VectorEnv: it resets finished rows inside step(), so a frame rendered "
                "after the step would show the reset state, not the terminal one. Build the vector env with "
                "autoreset_mode NEXT_STEP or DISABLED (gym.make_vec(..., vector_kwargs={'autoreset_mode': ...})), "
                "or put the frames in the observation."
            )
        self.writer: RowWriter | None = None
        self.frames: np.ndarray | None = None
        self.stashed = np.zeros(self.num_envs, dtype=bool)  # SAME_STEP: reset obs kept for TorchRL's reset
        self._stash_obs = None
        self._stash_info: list = []
        self._stream_seed: int | None = None  # batch-RNG envs: the seed the vector env was last seeded with
        self._episode_stat_keys = _episode_stat_keys(venv)  # SAME_STEP: top-level entries of the terminal step

    def _find_masked_reset(self, declared):
        inner = _innermost(self.venv)
        native = (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)
        #: whether each masked reset is checked to leave the other rows' observations as they were: any but
        #: gymnasium's own vector envs, unwrapped and not subclassed (a wrapper or a subclass may drop the
        #: mask), and this package's adapters (a reset that ignores the mask would otherwise desync those
        #: rows from the pool's buffers without a word)
        self._verify_masked_reset = type(self.venv) not in native
        if callable(declared):
            return lambda mask, seed, options: declared(self.venv, mask, seed, options)
        if declared is not None and not isinstance(declared, (bool, np.bool_)):  # "no" would read as True
            raise TypeError(
                f"masked_reset: expected True, False, None or a function fn(venv, mask, seed, options), "
                f"got {describe(declared)}"
            )
        for cls, fn in _MASKED_RESETS.items():
            if isinstance(inner, cls):
                if inner is not self.venv:
                    raise SpecError(
                        f"{type(inner).__name__} is wrapped in {type(self.venv).__name__}; its masked reset adapter "
                        "bypasses wrappers. Pass the unwrapped vector env, or wrappers that reset rows themselves."
                    )
                self._verify_masked_reset = fn not in _OWN_MASKED_RESETS
                return lambda mask, seed, options: fn(inner, mask, seed, options)
        if declared or isinstance(inner, native) or self.mode is AutoresetMode.DISABLED:
            return self._native_masked_reset
        if self.mode is AutoresetMode.NEXT_STEP:
            raise SpecError(
                f"{type(inner).__name__} autoresets in NEXT_STEP mode and is not known to support masked resets "
                "(options['reset_mask']); without one, its done rows could only be reset by a ghost step. "
                "Pass masked_reset=True if it honours options['reset_mask'], register an adapter with "
                "torchrl_swm.pool.vector.register_masked_reset, or build it with autoreset_mode SAME_STEP or DISABLED."
            )
        if self.seed_every_episode:
            raise SpecError(
                f"{type(inner).__name__} resets finished rows itself (SAME_STEP) without a seed and has no masked "
                "reset to reseed them, so it cannot give each episode its own seed: pass seed_every_episode=False "
                "(its episodes then continue each row's random stream), or masked_reset=True if it honours "
                "options['reset_mask']."
            )
        return None  # SAME_STEP without masked reset: only done rows can be reset

    def _native_masked_reset(self, mask, seed, options):
        seeds = seed if seed is None or isinstance(seed, int) else list(seed)  # one int for a batched env
        return self.venv.reset(seed=seeds, options={**(options or {}), "reset_mask": mask})

    def __len__(self) -> int:
        return self.num_envs

    # -- construction-time probe ----------------------------------------------------
    def probe(self, seeds: Sequence[int], step: bool = True) -> dict:
        """Reset (seeded) and, unless ``step=False``, step once with a sampled action, for the info spec
        and frame shape."""
        phase = "reset"
        step_info, done = None, None
        try:
            reset_obs, reset_info = self.venv.reset(seed=self._seed_arg(seeds))
            frames = self._render() if self.pixels else ()
            frame_shapes = [frame.shape for frame in frames]
            if step:
                phase = "sample a probe action"  # the pool's own sampling, not the env, if this fails
                action = self._probe_actions(int(seeds[0]), reset_obs, reset_info)
                phase = "step"
                _, _, terminated, truncated, step_info = self.venv.step(action)
                done = np.logical_or(terminated, truncated)
        except EnvError:
            raise
        except Exception as err:
            stacking = self._info_stacking_error(err, phase, " while probing the vector env at construction")
            if stacking is not None:
                raise stacking from err
            hint = f"; {PROBE_HINT}" if phase == "step" else ""
            raise EnvError(
                None, phase, f"{error_text(err)} (while probing the vector env at construction{hint})"
            ) from err
        phases = [("reset", reset_info, None), ("step", step_info, None)]
        if step_info is not None and self.mode is AutoresetMode.SAME_STEP and np.shape(done) == (self.num_envs,) \
                and done.any():
            # as step() reads them: a finished row's top-level info is its next episode's reset info, and its
            # last step's is in final_info (with the episode statistics of the wrappers in the vector env)
            final_info = step_info.get("final_info", {})
            terminal = self._terminal_extras(step_info)
            next_reset = {k: v for k, v in step_info.items() if k not in terminal}
            phases = [("reset", reset_info, None), ("step", step_info, ~done), ("reset", next_reset, done),
                      ("step", {**terminal, **final_info}, done)]
        infos, batch_wide = [], {}
        for phase, info, rows in phases:
            if info is None:
                continue
            per_env = _split_vector_info(info, self.num_envs, phase, batch_wide)
            infos.extend((i, phase, env_info) for i, env_info in enumerate(per_env) if rows is None or rows[i])
        # a SyncVectorEnv's sub-envs' own statistics wrappers (make_vec(..., wrappers=[RecordEpisodeStatistics])),
        # which reset with their env: found as in a pool of single envs (an AsyncVectorEnv's live in its workers)
        for i, env in enumerate(getattr(_innermost(self.venv), "envs", None) or ()):
            infos.extend((i, EPISODE_END, stats) for stats in episode_stat_probes(env))
        if step_info is not None and self.mode is AutoresetMode.SAME_STEP and not self.seed_every_episode:
            # only where the wrapper's statistics hold: every other mode resets finished rows with a masked reset,
            # and gymnasium 1.4's vector envs pop options["reset_mask"] before the wrapper reads it (it then
            # restarts every row's statistics): there the key stays an error unless declared (info_spec=)
            infos.extend(_episode_stat_probes(self.venv, self.num_envs))
        return {"infos": infos, "frame_shape": frame_shapes[0] if frame_shapes else None,
                "other_frame": first_other_frame(frame_shapes), "batch_wide": batch_wide}

    def _probe_actions(self, seed: int, obs, info):
        """The probe's batched action: a legal one per row when ``Discrete`` rows report an ``"action_mask"``
        (``(N, n)``, in the observation or the reset info), as :func:`probe_action` picks for single envs."""
        single = self.venv.single_action_space
        masks = action_mask(single, obs, info, (self.num_envs,))
        if masks is None:
            return probe_action(self.venv.action_space, seed)
        rows = [probe_action(single, seed + i, mask) for i, mask in enumerate(masks)]
        return np.asarray(rows, dtype=self.venv.action_space.dtype)

    def attach(self, layout, arrays, info_schema, frame_key, any_frame_size: bool = False) -> None:
        super().attach(layout, arrays, info_schema, frame_key, any_frame_size)
        self._stash_obs = None

    def _shut_down_workers(self) -> list[int]:
        """The envs whose AsyncVectorEnv worker gymnasium shut down after an error (it drops their pipes)."""
        pipes = getattr(_innermost(self.venv), "parent_pipes", None)
        return [] if pipes is None else [i for i, pipe in enumerate(pipes) if pipe is None]

    def _exited_workers(self) -> list[tuple[int, int]]:
        """``(env, exit code)`` of the AsyncVectorEnv worker processes that have ended (given a moment to be
        reaped: the pipe closes as the process exits)."""
        processes = getattr(_innermost(self.venv), "processes", None) or []

        def exited() -> list[tuple[int, int]]:
            return [(i, p.exitcode) for i, p in enumerate(processes) if p.exitcode is not None]

        if not exited():
            time.sleep(0.2)
        return exited()

    def _env_failure(self, err: Exception, phase: str, rows) -> EnvError:
        """The vector env raised: name the env when it can be known (the AsyncVectorEnv worker gymnasium shut
        down, the SyncVectorEnv sub-env the traceback enters, or the only row being reset); otherwise list the
        rows the call reached."""
        dead = self._shut_down_workers()
        text = error_text(err)
        if len(dead) == 1:
            return EnvError(dead[0], phase, f"{text} (its AsyncVectorEnv worker was shut down: build a new pool)")
        if isinstance(err, (EOFError, ConnectionError)):  # a worker's pipe closed: which process ended?
            exited = self._exited_workers()
            if exited:
                i, code = exited[0]
                others = f" (and envs {[j for j, _ in exited[1:]]})" if len(exited) > 1 else ""
                return EnvError(i, phase, f"its AsyncVectorEnv worker process ended with exit code {code}{others} "
                                          f"({text}); close this pool and build a new one")
        stacking = self._info_stacking_error(err, phase)
        if stacking is not None:
            return stacking
        raised = self._sub_env_that_raised(err)
        if raised is not None:
            return EnvError(raised, phase, text)
        if rows is not None and len(rows) == 1:
            return EnvError(int(rows[0]), phase, text)
        where = "" if rows is None else (
            f" while resetting envs {[int(r) for r in rows]} (the vector env does not say which)"
        )
        return EnvError(None, phase, f"{text}{where}")

    def _info_stacking_error(self, err: Exception, phase: str, during: str = "") -> EnvError | None:
        """The :class:`EnvError` for an info value gymnasium's ``VectorEnv._add_info`` could not stack (see
        :func:`_info_stacking_failure`), naming the env and the key; ``None`` for any other error."""
        stacking = _info_stacking_failure(err)
        if stacking is None:
            return None
        i, key, value, layout = stacking
        # an AsyncVectorEnv raised while reading its workers' answers, the rest still in their pipes: a pool over it
        # cannot go on (at construction there is no pool yet)
        rebuild = not during and isinstance(_innermost(self.venv), gym.vector.AsyncVectorEnv)
        return EnvError(
            i, phase,
            f"its info key {key!r} ({describe(value)}) could not be stacked with the other envs' values of that "
            f"key by gymnasium's VectorEnv._add_info ({error_text(err)}){during}: it batches each key into one "
            f"array, typed and shaped by the first value it meets{layout}, so every env must report a key with one "
            "type and shape (a string or a shape change breaks it). Report it with one type and shape, or under "
            f"another key{'; close this pool and build a new one' if rebuild else ''}.",
        )

    def _sub_env_that_raised(self, err: Exception) -> int | None:
        """The index of the sub-env whose call raised ``err``, for a vector env running its envs in this process
        (``SyncVectorEnv``): the first of its ``envs`` whose method the traceback enters. ``None`` when the error
        came from no sub-env (the vector env's own code, or envs in other processes)."""
        envs = getattr(_innermost(self.venv), "envs", None)
        if not isinstance(envs, (list, tuple)):
            return None
        index = {id(env): i for i, env in enumerate(envs)}
        tb = err.__traceback__
        while tb is not None:
            i = index.get(id(tb.tb_frame.f_locals.get("self")))
            if i is not None:
                return i
            tb = tb.tb_next
        return None

    def _attribute_errors(self, fn, phase: str, *args, **kwargs):
        """``fn(*args, **kwargs)`` (the vector env's own call/get_attr), a missing attribute raised as the
        backends' :class:`~torchrl_swm.errors.EnvAttributeError`, naming the env where the traceback says which."""
        try:
            return fn(*args, **kwargs)
        except AttributeError as err:
            raise EnvAttributeError(self._sub_env_that_raised(err), phase, error_text(err)) from err

    def check_ready(self, command: str) -> None:
        self._check_workers(command)
        inner = _innermost(self.venv)
        if isinstance(inner, gym.vector.AsyncVectorEnv) and inner._state is not AsyncState.DEFAULT:
            raise EnvError(
                None, command,
                f"the AsyncVectorEnv still waits for the answers of a call that failed or was interrupted "
                f"({inner._state.value}); it cannot step, reset or call again: close this pool and build a new one",
            )

    def _check_workers(self, phase: str) -> None:
        dead = self._shut_down_workers()
        if dead:
            raise EnvError(
                dead[0], phase,
                f"the {type(_innermost(self.venv)).__name__} shut down the worker of env(s) {dead} after an error "
                "(raised earlier): it cannot reach them again; close this pool and build a new one",
            )

    def _seed_arg(self, seeds):
        if seeds is None:
            return None
        if self.per_env_seeds:
            return list(seeds)
        first = next((s for s in seeds if s is not None), None)
        return None if first is None else int(first)  # natively batched envs take one seed for the batch

    def _render(self) -> np.ndarray | list[np.ndarray]:
        """One frame per row: stacked, or a list of checked frames when their sizes differ."""
        try:
            frames = self.venv.render()
        except Exception as err:
            raise self._env_failure(err, "render", None) from err
        try:
            stacked = np.stack(frames)
        except Exception as err:
            if isinstance(frames, (list, tuple)) and len(frames) == self.num_envs:
                return [check_frame(i, frame) for i, frame in enumerate(frames)]  # sizes differ: each is checked
            raise EnvError(None, "render", f"expected {self.num_envs} (H, W, 3) uint8 frames, got {describe(frames)}") from err
        if (stacked.ndim != 4 or stacked.shape[0] != self.num_envs or stacked.shape[-1] != 3
                or stacked.dtype != np.uint8):
            raise EnvError(None, "render", f"expected {self.num_envs} (H, W, 3) uint8 frames, got {describe(frames)}")
        return stacked

    def _store_frames(self, select) -> dict | None:
        """Write the rows' frames (``select``: a bool mask, ``None``: all); returns those of another size than the
        buffer's, by row, for the pool to resize (see ``InProcessBackend.store_frame``), or ``None``."""
        frames = self._render()
        if isinstance(frames, np.ndarray) and frames.shape[1:] == self.frames.shape[1:]:  # the common case
            if select is None:
                self.frames[...] = frames
            else:
                self.frames[select] = frames[select]
            return None
        odd: dict = {}
        for i in range(self.num_envs) if select is None else np.flatnonzero(select).tolist():
            self.store_frame(i, frames[i], odd)
        return odd or None

    # -- reset and step ----------------------------------------------------------------
    def reset(self, rows, seeds, options=None, episode_seeds=None) -> dict | None:
        """Reset ``rows`` (all when ``None``); see the module docstring for each mode. Returns the frames of
        another size, as ``SerialBackend.reset``."""
        option = _single_options(options)
        writer = self.writer
        if rows is not None and len(rows) == self.num_envs and self._masked_reset is None and not (
            option is None and self.stashed.all() and all(s is None for s in seeds)
        ):
            rows = None  # every row, not all reset by the vector env itself: a full reset needs no masked reset
        elif rows is None and option is None and self.stashed.any():
            # a full reset after a SAME_STEP vector env reset finished rows itself: the new episodes of those given
            # no seed have begun, and resetting them again would draw from their streams twice (SyncVectorEnv's
            # own reset() resets each env once); they take that reset, the others a masked one (seeded or not)
            reusable = self.stashed if not seeds else self.stashed & np.array([s is None for s in seeds], dtype=bool)
            if reusable.any() and (self._masked_reset is not None or reusable.all()):
                rows = np.arange(self.num_envs)
        self.check_ready("reset")
        if rows is None:
            try:
                obs, info = self.venv.reset(seed=self._seed_arg(seeds), options=option)
            except Exception as err:
                raise self._env_failure(err, "reset", None) from err
            select = None
            writer.observations(None, obs, "reset")
            writer.info.write_batch(info, self._everyone, "reset")
            self.stashed[:] = False
            index = slice(0, self.num_envs)
        else:
            select = np.zeros(self.num_envs, dtype=bool)
            select[rows] = True
            # SAME_STEP: rows the vector env already reset during the step, unseeded (their stream
            # continues), take that reset; the others (and a seeded episode) get a masked reset
            stashed = self.stashed[rows]
            if option is None:
                reuse = stashed & np.array([s is None for s in seeds], dtype=bool)
            else:
                reuse = np.zeros(len(rows), dtype=bool)
            if self._masked_reset is None and not reuse.all():
                if option is None and (stashed & ~reuse).any():
                    raise EnvError(
                        int(rows[stashed & ~reuse][0]), "reset",
                        f"{type(_innermost(self.venv)).__name__} (SAME_STEP) reset these rows itself, unseeded, and has "
                        "no masked reset (options['reset_mask']) to reseed them; reset every row to seed it, or pass "
                        "masked_reset=True if it has one.",
                    )
                raise EnvError(
                    int(rows[~reuse][0]), "reset",
                    f"{type(_innermost(self.venv)).__name__} (SAME_STEP) can only reset rows it finished itself, "
                    "without options; it has no masked reset (options['reset_mask']) for the others. Pass "
                    "masked_reset=True if it has one.",
                )
            if reuse.any():  # first: a masked reset may reuse the vector env's output buffers
                reused = np.zeros(self.num_envs, dtype=bool)
                reused[rows[reuse]] = True
                writer.observations(reused, self._stash_obs, "reset")
                writer.info.write_batch(self._stash_info, reused, "reset")
            if not reuse.all():
                fresh = np.zeros(self.num_envs, dtype=bool)
                fresh[rows[~reuse]] = True
                fresh_seeds = [s for s, r in zip(seeds, reuse) if not r]
                if self.per_env_seeds:
                    seed_arg = [None] * self.num_envs
                    for j, seed in zip(rows[~reuse].tolist(), fresh_seeds):
                        seed_arg[j] = seed
                else:
                    seed_arg = self._seed_arg(fresh_seeds)  # one seed for the batch: the first row's
                try:
                    obs, info = self._masked_reset(fresh, seed_arg, option)
                except Exception as err:
                    raise self._env_failure(err, "reset", rows[~reuse]) from err
                if self._verify_masked_reset:
                    self._check_untouched(fresh, obs)
                writer.observations(fresh, obs, "reset")
                writer.info.write_batch(info, fresh, "reset")
            self.stashed[select] = False
            index = rows
        odd = None if self.frames is None else self._store_frames(select)
        episode_seeds = list(seeds if episode_seeds is None else episode_seeds)
        if not self.per_env_seeds and episode_seeds:
            # one RNG for the batch: every row's episode continues the stream of the seed the
            # vector env was last seeded with (this call's first seed, if it passed one)
            seeded = self._seed_arg(seeds)
            if seeded is not None or self._stream_seed is None:
                self._stream_seed = seeded if seeded is not None else int(episode_seeds[0])
            episode_seeds = [self._stream_seed] * len(episode_seeds)
        writer.reset_flags(index, episode_seeds)
        return odd

    def _check_untouched(self, reset: np.ndarray, obs) -> None:
        """A masked reset of the rows ``reset`` must leave the others as they were: one that changed their
        observation ignored ``options["reset_mask"]`` (or reset other rows too), and the pool's rows no longer
        match the vector env's. Said before anything is written: the buffers still hold the rows as they were.
        Rows the vector env reset itself (SAME_STEP, not yet reset here) hold their reset observation there
        and their terminal one here: not compared."""
        keep = ~reset & ~self.stashed
        if not keep.any():
            return
        changed = self.writer.first_changed_row(keep, obs)
        if changed is not None:
            raise EnvError(
                changed, "reset",
                f"{type(self.venv).__name__}'s masked reset (rows {np.flatnonzero(reset).tolist()}) "
                f"changed the observation of env {changed}, which was not being reset: it ignores "
                "options['reset_mask'] or resets other rows too, so its envs no longer match the pool's rows. "
                "Reset every row (pool.reset()) to start again; give the pool a vector env whose reset honours "
                "the mask, or an adapter (masked_reset=fn, or torchrl_swm.pool.vector.register_masked_reset).",
            )

    def step(self, actions: np.ndarray, rows) -> dict | None:
        """Step every row with the batched ``actions``; returns the frames of another size (``SerialBackend.step``)."""
        if rows is not None:
            raise StepRefusedError(
                None, "step",
                "a VectorEnv steps all its sub-envs at once, so a '_step' mask cannot freeze rows "
                f"(frozen: {np.setdiff1d(np.arange(self.num_envs), rows).tolist()}). Use EnvPool over single-env "
                "factories for partial steps (rollout(break_when_all_done=True), World's wait mode, FrameSkip; "
                "or skip frames inside each env: gymnasium.wrappers.MaxAndSkipObservation).",
            )
        # rows that finished and were not reset never get here: EnvPool refuses them (StepRefusedError)
        self._check_workers("step")
        try:
            obs, reward, terminated, truncated, info = self.venv.step(actions)
        except Exception as err:
            raise self._env_failure(err, "step", None) from err
        for name, value in (("reward", reward), ("terminated", terminated), ("truncated", truncated)):
            if np.shape(value) != (self.num_envs,):  # numpy would broadcast one value to every row
                raise EnvError(
                    None, "step", f"{type(self.venv).__name__}.step returned {name} {describe(value)}; expected "
                    f"shape ({self.num_envs},), one per env",
                )
        done = np.logical_or(terminated, truncated)
        writer = self.writer
        everyone = self._everyone
        if self.mode is AutoresetMode.SAME_STEP and done.any():
            # the vector env has already reset the done rows: keep their reset observation and
            # info for TorchRL's reset of those rows, and write their terminal ones
            final_info = info.get("final_info", {})
            terminal = self._terminal_extras(info)
            self._stash_obs = obs
            self._stash_info = {k: v for k, v in info.items() if k not in terminal} if terminal else info
            self.stashed |= done
            writer.observations(None, obs, "step")
            self._write_final_obs(info, done)
            writer.info.write_batch(info, ~done, "step")
            writer.info.write_batch({**terminal, **final_info} if terminal else final_info, done, "step")
        else:
            if "final_obs" in info:  # a SAME_STEP env: its observations of done rows are already reset ones
                raise self._undeclared_same_step()
            writer.observations(None, obs, "step")
            writer.info.write_batch(info, everyone, "step")
        writer.step_flags(slice(0, self.num_envs), range(self.num_envs), reward, terminated, truncated)
        return None if self.frames is None else self._store_frames(None)

    def _undeclared_same_step(self) -> SpecError:
        return SpecError(
            f"{type(self.venv).__name__}.step returned info['final_obs'], so it resets finished rows in the same "
            f"step (AutoresetMode.SAME_STEP), but its metadata['autoreset_mode'] says {self.mode} (NEXT_STEP when "
            "absent): its terminal observations would be lost. Declare metadata['autoreset_mode'] = "
            "AutoresetMode.SAME_STEP (a VectorWrapper that sets metadata of its own must keep its env's)."
        )

    def _terminal_extras(self, info: Mapping) -> dict:
        """SAME_STEP: top-level info entries that belong to the terminal step, not to the reset.

        Gymnasium puts a finished env's reset info at the top level and its last step's in
        ``final_info``; but its vector ``RecordEpisodeStatistics`` adds its end-of-episode entry
        (``"episode"``) at the top level too. Those entries of the wrappers in the vector env's chain are
        recorded at the terminal step, as under NEXT_STEP, not at the reset that follows (nor lost to a
        seeded reset's own info). Every other top-level entry is reset info, even one the env's first
        reset did not report (a reset may report a key from its second episode on). Such an entry is taken
        out of the reset info even when ``final_info`` has it too (sub-envs wrapped in
        ``RecordEpisodeStatistics`` as well): left there, it would be recorded again at the reset."""
        names = [k for k in self._episode_stat_keys if k in info]
        extras = {k: info[k] for k in names}
        extras.update((f"_{k}", info[f"_{k}"]) for k in names if f"_{k}" in info)
        return extras

    def _write_final_obs(self, info, done) -> None:
        """SAME_STEP: write ``info["final_obs"]`` (the terminal observations) into the done rows."""
        if "final_obs" not in info:
            raise EnvError(int(np.flatnonzero(done)[0]), "step", "SAME_STEP vector env finished rows without info['final_obs']")
        final, write = info["final_obs"], self.writer.observation
        for j in np.flatnonzero(done).tolist():
            value = final[j]
            if isinstance(value, np.ndarray) and value.dtype == object:
                value = np.array(value.tolist())  # a row of a 2-D object array of numbers
            write(j, value, "step")  # checked row by row: an error names the env

    # -- direct access ------------------------------------------------------------------
    def _per_env(self, what: str) -> Callable:
        """The vector env's own per-env access (``call``/``get_attr``/``set_attr``), with a clear error without it."""
        # gymnasium's vector wrappers (RecordEpisodeStatistics...) have no call/get_attr/set_attr of their own:
        # the sub-envs are the innermost vector env's, whatever wraps it
        fn = getattr(self.venv, what, None) or getattr(_innermost(self.venv), what, None)
        if fn is None:
            raise AttributeError(
                f"EnvPool.{what}: {type(_innermost(self.venv)).__name__} is natively batched: its rows are not "
                f"separate envs and it has no {what}(). Use the vector env itself."
            )
        return fn

    def env_spec(self):
        """The sub-envs' ``EnvSpec`` (env 0's) where they are at hand (a ``SyncVectorEnv``); else the vector env's
        own, with the time limit its rows run under: ``gym.make_vec(id, N, max_episode_steps=K)`` leaves the
        registry's limit in ``spec.max_episode_steps`` and ``K`` in ``spec.kwargs``, which is what its rows get.
        (An ``AsyncVectorEnv``'s would come through a pipe: a spec that does not pickle, an entry point defined
        in ``__main__``, would make gymnasium shut its workers down.)"""
        inner = _innermost(self.venv)
        if isinstance(inner, gym.vector.SyncVectorEnv):
            return inner.envs[0].spec
        spec = getattr(self.venv, "spec", None)
        limit = None if spec is None else spec.kwargs.get("max_episode_steps")
        if limit is not None and limit != spec.max_episode_steps:
            spec = dataclasses.replace(spec, max_episode_steps=limit)
        return spec

    @property
    def per_env_access(self) -> bool:
        """Whether the vector env has separate envs to call (a natively batched one, as ``CartPoleVectorEnv``, has
        none)."""
        return getattr(_innermost(self.venv), "call", None) is not None

    @property
    def calls_rows(self) -> bool:
        """Whether ``call`` can reach some rows only (a ``SyncVectorEnv``'s envs are at hand; other vector envs'
        ``call`` runs on every env)."""
        return isinstance(_innermost(self.venv), gym.vector.SyncVectorEnv)

    def call(self, rows, name, args, kwargs) -> list:
        self.check_ready("call")
        call = self._per_env("call")
        if sorted(rows) != list(range(self.num_envs)):
            # a vector env's call runs the method on every env: reach only the rows asked for
            inner = _innermost(self.venv)
            if not self.calls_rows:
                raise ValueError(
                    f"EnvPool.call({name!r}, indices={list(rows)}): {type(inner).__name__}.call runs it on every env; "
                    "call it without indices"
                )
            return call_envs(inner.envs, rows, name, args, kwargs)
        values = self._attribute_errors(call, f"call {name}", name, *args, **kwargs)
        return [values[j] for j in rows]

    def is_wrapped(self, rows, wrapper_class) -> list[bool]:
        inner = _innermost(self.venv)
        if isinstance(inner, gym.vector.SyncVectorEnv):
            return [env_is_wrapped(inner.envs[j], wrapper_class) for j in rows]
        if isinstance(inner, gym.vector.AsyncVectorEnv):
            raise NotImplementedError(
                "EnvPool.env_is_wrapped: an AsyncVectorEnv's sub-envs live in its own worker processes, out of "
                "reach; use EnvPool(env_fns, backend='process') or a SyncVectorEnv"
            )
        return [False] * len(rows)  # natively batched: its rows are not separate, wrappable envs

    def get_attr(self, rows, name) -> list:
        self.check_ready("get_attr")
        values = self._attribute_errors(self._per_env("get_attr"), "get_attr", name)
        return [values[j] for j in rows]

    def set_attr(self, rows, name, values, outermost: bool = False) -> None:
        self.check_ready("set_attr")
        set_attr = self._per_env("set_attr")
        if outermost:
            inner = _innermost(self.venv)
            if isinstance(inner, gym.vector.SyncVectorEnv):
                return set_envs_attr(inner.envs, rows, name, values, outermost=True)
            if sorted(rows) != list(range(self.num_envs)) or any(v is not values[0] for v in values[1:]):
                raise ValueError(
                    f"EnvPool.set_attr({name!r}, outermost=True): {type(inner).__name__} sets an attribute on its "
                    "sub-envs themselves only through call(), which runs on every env with one value; set one "
                    "value on every env, or use a SyncVectorEnv (or EnvPool(env_fns, backend='process'))"
                )
            self._per_env("call")("__setattr__", name, values[0])
            return None
        inner = _innermost(self.venv)
        if isinstance(inner, gym.vector.SyncVectorEnv) and inner is self.venv:
            return set_envs_attr(inner.envs, rows, name, values, outermost=False)  # as its own set_attr, row by row
        if sorted(rows) == list(range(self.num_envs)):
            current = [None] * self.num_envs  # every row is set: nothing to read (the attribute may be new)
        else:
            # the vector env sets one value per env: the rows not set keep theirs (an attribute they lack is an
            # EnvAttributeError; gymnasium's AsyncVectorEnv then shuts its workers down)
            current = list(self._attribute_errors(self._per_env("get_attr"), "set_attr", name))
        for j, value in zip(rows, values):
            current[j] = value
        set_attr(name, current)

    def close(self) -> None:
        kwargs = {}
        inner = _innermost(self.venv)
        inner.__dict__.pop("_add_info", None)  # the info stacking as it was (see _stack_infos_as_numpy_promotes)
        if _plain_sync(inner) and not inner.closed:
            self._close_sync(inner)
            return
        if isinstance(inner, gym.vector.AsyncVectorEnv) and inner._state is not AsyncState.DEFAULT:
            # a call an error left pending (gymnasium raised inside step_wait, after reading its workers'
            # answers): its graceful close would wait for them forever; with a timeout it terminates them
            kwargs["timeout"] = _PENDING_CLOSE_TIMEOUT
        processes = getattr(inner, "processes", None) or []
        alive = [i for i, p in enumerate(processes) if p.exitcode is None]
        try:
            self.venv.close(**kwargs)
        except Exception as err:
            # an AsyncVectorEnv whose worker died fails its graceful close and leaves the other workers
            # running: terminate them (the pool is closed for good after this, so no later close could)
            try:
                self.venv.close(terminate=True)
            except Exception as second:
                add_note(err, f"close(terminate=True) failed too: {error_text(second)}")
            raise EnvError(None, "close", error_text(err)) from err
        # an AsyncVectorEnv worker closes its env after it acknowledged the close: an error there only shows in
        # its exit code (and its traceback on stderr), which gymnasium does not read
        failed = [(i, processes[i].exitcode) for i in alive if processes[i].exitcode not in (0, None)]
        if failed and kwargs.get("timeout") is None:
            i, code = failed[0]
            others = f"; so did the workers of envs {[j for j, _ in failed[1:]]}" if len(failed) > 1 else ""
            raise EnvError(i, "close", f"its AsyncVectorEnv worker exited with code {code} while closing its env "
                                       f"(its traceback is on the worker's stderr){others}")

    def _close_sync(self, inner: gym.vector.SyncVectorEnv) -> None:
        """Close a gymnasium ``SyncVectorEnv``'s sub-envs here, as the serial backend closes its own: every one,
        whatever one of them raises (its ``close_extras`` stops at the first, and a retry would close the first
        ones again); then the vector wrappers' own close (RecordVideo's last file...) with the vector env marked
        closed. An interrupt comes first, then an env's error; the other is a note on it."""
        inner.closed = True
        env_error = None
        try:
            close_envs(getattr(inner, "envs", ()))
        except BaseException as err:
            env_error = err
        if self.venv is not inner:
            try:
                self.venv.close()
            except BaseException as err:
                if env_error is None:
                    if isinstance(err, Exception):
                        raise EnvError(None, "close", error_text(err)) from err
                    raise
                if isinstance(err, Exception) or not isinstance(env_error, Exception):
                    add_note(env_error, f"also: the vector env's wrappers' close raised {error_text(err)}")
                else:  # the wrapper's interrupt first, the env's error a note on it
                    add_as_notes(err, [env_error])
                    raise
        if env_error is not None:
            raise env_error


def _info_stacking_failure(err: Exception) -> tuple[int, str, object, str] | None:
    """``(env index, key, value, layout)`` when ``err`` was raised by gymnasium's ``VectorEnv._add_info`` stacking
    one sub-env's info value into the batched array (SyncVectorEnv and AsyncVectorEnv both stack there); a nested
    key is joined with ``/``; ``layout`` says which env's value typed and shaped the array (``""`` if unknown).
    ``None`` for any other error."""
    found = None
    keys = []
    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "_add_info" and (module.startswith("gymnasium.") or module == __name__):
            local = frame.f_locals
            if "key" in local and isinstance(local.get("env_num"), (int, np.integer)):
                keys.append(str(local["key"]))
                found = int(local["env_num"]), local.get("value"), local
        tb = tb.tb_next
    if found is None:
        return None
    i, value, local = found
    layout = ""
    infos = local.get("vector_infos")  # an array, not a dict, where a value met a dict of the key before it
    array, reported = local.get("array"), infos.get(f"_{local['key']}") if isinstance(infos, dict) else None
    if isinstance(array, np.ndarray) and isinstance(reported, np.ndarray) and reported.any():
        first = int(np.flatnonzero(reported)[0])  # the env whose value the array was made for
        layout = f" (env {first}'s: dtype {array.dtype}, shape {tuple(array.shape[1:])})"
    return i, "/".join(keys), value, layout


def _single_options(options):
    """A VectorEnv takes one options dict for all rows: per-row options must agree."""
    if options is None:
        return None
    given = [o for o in options if o is not None]
    if not given:
        return None
    if len(given) < len(options):  # the dict would reach the rows given none too
        raise ValueError(
            "options: a VectorEnv takes one options dict for every row it resets; got a dict for some rows and None "
            "for others. Reset those rows in separate calls (a '_reset' mask), or use EnvPool over single-env "
            "factories for per-env options."
        )
    if any(not data_equivalence(o, given[0], exact=True) for o in given[1:]):  # values may be arrays
        raise ValueError(
            "options: a VectorEnv takes one options dict for every row it resets; got different dicts per env. "
            "Use EnvPool over single-env factories for per-env options."
        )
    return dict(given[0])


def _split_vector_info(info, num_envs, phase: str = "reset", batch_wide: dict | None = None) -> list[dict]:
    """Per-env numeric infos of a vector info dict (for spec inference).

    Numeric values that are not one entry per env go to ``batch_wide`` (``{key: error}``):
    they are an error unless ``info_keys=`` leaves them out.
    """
    if not isinstance(info, Mapping):
        raise EnvError(None, phase, f"expected the vector env's info to be a dict, got {describe(info)}")
    out = [dict() for _ in range(num_envs)]
    for key, value, present in flatten_vector_info(info, phase=phase):
        check_vector_mask(key, present, num_envs, phase)
        array = numeric_info_value(value, key, None, phase)
        if array is None:
            continue
        if array.ndim == 0 or len(array) != num_envs:
            if batch_wide is not None:
                batch_wide.setdefault(key, batch_wide_error(key, value, num_envs, phase))
            continue
        for i in range(num_envs):
            if present is None or present[i]:
                node = out[i]
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = array[i]
    return out
