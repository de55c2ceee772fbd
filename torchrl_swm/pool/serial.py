"""The serial backend: the sub-envs stepped one after the other in this process.

It is also the unit of work of the process backend: each worker process runs
one :class:`SerialBackend` over its slice of envs, writing into shared memory.
Rows are global: env ``j`` of a backend whose first env is ``first`` writes row
``first + j``.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from ..errors import EnvAttributeError, EnvError, add_as_notes, add_note, describe, error_text
from .infos import EPISODE_END, InfoWriter, SkippedValue, numeric_info_value
from .rows import RowWriter

__all__ = ["SerialBackend", "InProcessBackend", "call_envs", "make_envs", "numeric_only", "probe_action",
           "action_mask", "set_envs_attr", "check_frame", "first_other_frame", "FRAME_SIZE_HINT"]

#: Why a frame of another size is refused, and the way out.
FRAME_SIZE_HINT = "frames must keep one size, unless image_shape=(H, W) is given (it resizes every frame)"


def check_frame(i: int, frame) -> np.ndarray:
    """Env ``i``'s rendered frame, if it is an ``(H, W, 3)`` uint8 array (any size), else an :class:`EnvError`."""
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
        raise EnvError(i, "render", f"expected an (H, W, 3) uint8 rgb_array frame, got {describe(frame)}")
    return frame


def first_other_frame(shapes: Sequence[tuple], first: int = 0) -> tuple[int, tuple] | None:
    """``(env index, shape)`` of the first frame shape that differs from ``shapes[0]`` (env ``first``'s), or ``None``:
    what the probe reports, for the pool to refuse unless it resizes every frame (``image_shape=``)."""
    for j, shape in enumerate(shapes):
        if shape != shapes[0]:
            return first + j, shape
    return None


def numeric_only(info: Mapping, env_index: int, phase: str, prefix: tuple = ()) -> dict:
    """``info`` of env ``env_index`` at ``phase`` for spec inference, picklable: numeric leaves as arrays,
    nested dicts, and a :class:`SkippedValue` for every other value (inference must see a key that is numeric
    in one env and ``None`` in another)."""
    if not isinstance(info, Mapping):
        raise TypeError(f"expected the env's info to be a dict, got {describe(info)}")
    out = {}
    for key, value in info.items():
        if isinstance(value, Mapping):
            out[key] = numeric_only(value, env_index, phase, (*prefix, key))
            continue
        array = numeric_info_value(value, (*prefix, key), env_index, phase)
        out[key] = SkippedValue(describe(value)) if array is None else array
    return out


PROBE_HINT = (
    "the pool steps every env once with a random action at construction, to infer its info keys; to skip that "
    "step, settle them with info_keys=[...] naming only keys declared in info_spec= (or info_keys=[] for none)"
)


def episode_stat_probes(env: gym.Env) -> list[dict]:
    """Probe infos for the episode statistics of the wrappers in ``env``'s chain that report them at an episode's
    end only, which the construction probe's one step rarely reaches: gymnasium's ``RecordEpisodeStatistics`` and
    Stable-Baselines3's ``Monitor`` (``{"episode": {"r": return, "l": length, "t": time}}``). Declared from the
    probe, the keys get a presence mask, as a vector env's statistics do."""
    monitor = sys.modules.get("stable_baselines3.common.monitor")  # never imported for this
    probes = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.RecordEpisodeStatistics):
            key = getattr(env, "_stats_key", "episode")  # its stats_key= argument, kept privately
        elif monitor is not None and isinstance(env, monitor.Monitor):
            key = "episode"
        else:
            key = None
        if key is not None:
            probes.append({key: {"r": np.zeros((), np.float64), "l": np.zeros((), np.int64),
                                 "t": np.zeros((), np.float64)}})
        env = env.env
    return probes


def probe_action(space: gym.Space, seed: int, mask: np.ndarray | None = None):
    """A seeded sample of ``space`` for the construction probe's step; the zero action (clipped into
    the bounds) for a Box gymnasium cannot sample (float64 bounds at the dtype's extremes overflow; an
    integer ``high`` at the dtype's maximum wraps in ``high + 1``: ``ValueError: high - low < 0``).

    ``mask`` (:func:`action_mask`): a legal action, when it allows any.
    """
    space = copy.deepcopy(space)
    space.seed(seed)
    if mask is not None and mask.any():
        return space.sample(mask=mask)
    try:
        with np.errstate(over="ignore"):  # the overflow is caught below; its RuntimeWarning would only alarm
            action = space.sample()
    except (OverflowError, ValueError):
        if not isinstance(space, gym.spaces.Box):
            raise
        action = np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)
    if isinstance(space, gym.spaces.Box):
        # an integer scalar Box samples a numpy scalar, as np.clip of a 0-d array gives: the 0-d array that
        # Box.contains takes without a warning, as the pool's steps pass
        action = np.asarray(action, space.dtype)
    return action


def action_mask(space: gym.Space, obs, info, batch: tuple = ()) -> np.ndarray | None:
    """The ``"action_mask"`` a ``Discrete`` env reported at reset (in a Dict observation, else in the info:
    the usual convention of masked envs), of shape ``(*batch, n)``, as ``int8``; ``None`` without one."""
    if not isinstance(space, gym.spaces.Discrete):
        return None
    for source in (obs, info):
        mask = source.get("action_mask") if isinstance(source, Mapping) else None
        if mask is not None and np.shape(mask) == (*batch, space.n):
            return np.asarray(mask).astype(np.int8)
    return None


def call_envs(envs: Sequence[gym.Env], rows: Sequence[int], name: str, args: tuple, kwargs: dict, first: int = 0) -> list:
    """``envs[j].name(*args, **kwargs)`` (or the attribute) for each of ``rows``, looking through
    gymnasium wrappers as ``SyncVectorEnv.call`` does; an env that raises is named (``first + j``)."""
    out = []
    for j in rows:
        try:
            attr = envs[j].get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        except Exception as err:
            cls = EnvAttributeError if isinstance(err, AttributeError) else EnvError
            raise cls(first + j, f"call {name}", error_text(err)) from err
    return out


def close_envs(envs: Sequence, first: int = 0, *, interrupts_as_errors: bool = False) -> None:
    """Close every env; if some raise, raise the first as an :class:`EnvError` naming it, the others
    as notes on it, once all are closed.

    An interrupt (a Ctrl-C or ``SystemExit`` in a slow ``close()``) ends that env's close only: the
    others are still closed, as ``contextlib.ExitStack`` does, then the interrupt is raised (the pool
    counts itself closed by then: a second ``close()`` would not close them). ``interrupts_as_errors``
    (a worker process, which ignores Ctrl-C: the interrupt came from the env's own code) raises it as
    that env's ``EnvError`` instead, so the pool's process names it as it names any close error; but for
    the worker's own SIGTERM (``ends_the_worker``), an interrupt still.
    """
    first_error = interrupt = None
    for j, env in enumerate(envs):
        try:
            env.close()
        except BaseException as err:
            if isinstance(err, Exception) or (interrupts_as_errors and not getattr(err, "ends_the_worker", False)):
                if first_error is None:
                    first_error = EnvError(first + j, "close", error_text(err))
                    first_error.__cause__ = err
                else:  # reported too, not lost
                    add_note(first_error, f"env {first + j} (close) also raised {error_text(err)}")
            elif interrupt is None:
                interrupt = err
                add_note(err, f"raised in env {first + j}'s close(); the other envs were closed")
    if interrupt is not None:
        if first_error is not None:
            add_as_notes(interrupt, [first_error])
        raise interrupt
    if first_error is not None:
        raise first_error


def set_envs_attr(envs: Sequence[gym.Env], rows: Sequence[int], name: str, values: Sequence, outermost: bool) -> None:
    """``envs[j].name = value`` for each of ``rows``: on the env itself (``outermost``, SB3's ``setattr``) or where
    gymnasium's ``set_wrapper_attr`` finds it (``SyncVectorEnv.set_attr``)."""
    for j, value in zip(rows, values):
        if outermost:
            setattr(envs[j], name, value)
        else:
            envs[j].set_wrapper_attr(name, value)


def env_is_wrapped(env: gym.Env, wrapper_class: type) -> bool:
    """Whether ``env`` is wrapped, at any depth, in a ``wrapper_class``, as SB3's ``is_wrapped``: only its
    wrappers count, not the env they wrap (``env_is_wrapped(CartPoleEnv)`` is False for a CartPole)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False


#: keywords TorchRL's GymEnv or gymnasium's make_vec take and gym.make does not: EnvPool passes unknown keywords to
#: gym.make, so an env refusing one of these gets the pool's own way to say it
_FOREIGN_KEYWORDS = {
    "from_pixels": "EnvPool renders frames itself: pixels=True, or image_shape=(H, W) to resize them",
    "pixels_only": "EnvPool renders frames itself: pixels=True, or image_shape=(H, W) to resize them",
    "frame_skip": "repeat actions with TransformedEnv(pool, torchrl_swm.FrameSkip(k))",
    "wrappers": "wrap each env in a factory: EnvPool(lambda: Wrapper(gym.make(id)), num_envs)",
    "vectorization_mode": "pass the vector env itself: EnvPool(gym.make_vec(id, n, vectorization_mode=...))",
    "vector_kwargs": "pass the vector env itself: EnvPool(gym.make_vec(id, n, vector_kwargs=...))",
    "context": "the process backend's start method is mp_start_method= (with backend='process')",
    "start_method": "the process backend's start method is mp_start_method= (with backend='process')",
}


def _foreign_keyword_hint(err: Exception) -> str:
    """How to say with EnvPool what a keyword meant for TorchRL or make_vec, when the env refused it."""
    if isinstance(err, TypeError):
        for name, hint in _FOREIGN_KEYWORDS.items():
            if f"unexpected keyword argument '{name}'" in str(err):
                return f". EnvPool passes keywords it does not know to gym.make; for {name}=, {hint}"
    return ""


def make_envs(env_fns: Sequence[Callable[[], gym.Env]], first: int = 0, pixels: bool = False) -> list[gym.Env]:
    """Call each factory, check what it returned, and close everything on failure."""
    envs: list[gym.Env] = []
    made: dict[int, tuple] = {}  # id of each env made, of the envs it wraps, of its unwrapped -> (position, object)
    try:
        for j, fn in enumerate(env_fns):
            i = first + j
            if not callable(fn):
                raise TypeError(f"env_fns[{i}]: expected a zero-argument callable returning a gymnasium.Env, got {describe(fn)}")
            try:
                env = fn()
            except Exception as err:
                raise EnvError(i, "make", f"the factory raised {error_text(err)}{_foreign_keyword_hint(err)}") from err
            except BaseException as err:  # KeyboardInterrupt, SystemExit: raised as they are, tagged with the env
                _tag(err, i, "make")  # (a worker reports it naming the env)
                raise
            if not isinstance(env, gym.Env):
                raise TypeError(
                    f"env_fns[{i}] returned {type(env).__module__}.{type(env).__name__}, expected a gymnasium.Env"
                    + (" (a VectorEnv is passed to EnvPool directly, not through a factory)" if isinstance(env, gym.vector.VectorEnv) else "")
                )
            # the env, each env it wraps and its unwrapped one: wrappers made per call around one shared env would
            # step it too (an unwrapped env made per access, a proxy, is caught through the layers it wraps)
            layers, layer = [env], env
            while isinstance(getattr(layer, "env", None), gym.Env) and layer.env is not layer:
                layer = layer.env
                layers.append(layer)
            layers.append(env.unwrapped)
            k = next((made[id(obj)][0] for obj in layers if id(obj) in made), None)
            if k is not None:  # every row would step that one env
                same = "the same env object" if env is envs[k] else "a wrapper of the same env object"
                raise ValueError(
                    f"env_fns[{i}] returned {same} as env_fns[{first + k}]: each row needs an env of its "
                    "own; build a new one in the factory (e.g. lambda: gym.make(...), not lambda: env or "
                    "lambda: Wrapper(env))"
                )
            for obj in layers:  # kept alive: an object made per access must not free its id for another
                made[id(obj)] = (j, obj)
            envs.append(env)
            if pixels and env.render_mode != "rgb_array":
                raise EnvError(
                    i, "make", f"pixels=True needs render_mode='rgb_array', got render_mode={env.render_mode!r}; "
                    "build the env with gym.make(..., render_mode='rgb_array')"
                )
    except BaseException:
        for env in envs:
            _close_quietly(env)
        raise
    return envs


def _bad_step_result(i: int, result) -> EnvError:
    return EnvError(i, "step", f"expected step() to return (obs, reward, terminated, truncated, info), got {describe(result)}")


def _stepping(first: int, order, results: list) -> int | None:
    """The env a step loop was in when it raised: the one after those that returned a result, or ``None`` when
    every env had (a Ctrl-C that landed as the loop ended: indexing past the order raised an IndexError that
    replaced the interrupt)."""
    return first + order[len(results)] if len(results) < len(order) else None


def _tag(err: BaseException, env_index: int | None, phase: str) -> None:
    """Record which env raised ``err`` on it, unless its class forbids the attributes (the env's own exception
    must reach the caller, never an AttributeError about tagging it)."""
    try:
        err.env_index, err.phase = env_index, phase
    except Exception:
        pass


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # closing after a failure must not hide the failure
        pass


class InProcessBackend:
    """What the serial and vector backends share: buffers that live in this process."""

    observation_space: gym.Space
    any_frame_size = False  # until attached

    def allocate(self, layout) -> None:
        """Nothing to share with other processes: the pool allocates the buffers itself."""
        return None

    def attach(self, layout, arrays, info_schema, frame_key, any_frame_size: bool = False) -> None:
        """Start writing into the pool's buffers ``arrays`` (numpy views of ``layout``); frames go to
        ``arrays[frame_key]``, and one of another size is returned for the pool to resize when
        ``any_frame_size`` (``image_shape=``), else an :class:`EnvError`."""
        self.writer = RowWriter(self.observation_space, arrays, InfoWriter(info_schema, arrays))
        self.frames = None if frame_key is None else arrays[frame_key]
        self.any_frame_size = any_frame_size

    def store_frame(self, i: int, frame: np.ndarray, odd: dict) -> None:
        """Write env ``i``'s (checked) frame into its row; one of another size goes to ``odd`` (by row), which the
        reset or step returns for the pool to resize on its own, or is refused without ``image_shape``."""
        target = self.frames[i]
        if frame.shape == target.shape:  # the common case: the buffer's size
            target[...] = frame
        elif self.any_frame_size:
            odd[i] = frame.copy()  # a copy: the env may render into the same array again
        else:
            raise EnvError(
                i, "render", f"frame shape {frame.shape} differs from the pool's {target.shape}; {FRAME_SIZE_HINT}"
            )

    def settle(self) -> None:
        """Nothing writes the buffers behind the pool's back here (see ``ProcessBackend.settle``)."""

    def check_ready(self, command: str) -> None:
        """Raise what would stop ``command`` before it reaches an env (see ``ProcessBackend.check_ready``)."""


class SerialBackend(InProcessBackend):
    """Steps envs ``first .. first + len(env_fns) - 1`` in this process.

    Args:
        env_fns: zero-argument factories returning ``gymnasium.Env``.
        first: global index of the first env (the row it writes).
        pixels: render an ``rgb_array`` frame after every reset and step.
    """

    batched_actions = False

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], first: int = 0, pixels: bool = False):
        self.first = first
        self.pixels = pixels
        self.envs = make_envs(env_fns, first, pixels)
        self.writer: RowWriter | None = None
        self.frames: np.ndarray | None = None
        try:
            self.observation_space, self.action_space = self._check_spaces()
        except BaseException:
            for env in self.envs:
                _close_quietly(env)
            raise

    def _check_spaces(self):
        env0 = self.envs[0]
        for j, env in enumerate(self.envs[1:], 1):
            for name in ("observation_space", "action_space"):
                if getattr(env, name) != getattr(env0, name):
                    raise EnvError(
                        self.first + j, "make",
                        f"{name} {getattr(env, name)} differs from env {self.first}'s {getattr(env0, name)}; "
                        "all sub-envs of a pool must have the same spaces",
                    )
        return env0.observation_space, env0.action_space

    def __len__(self) -> int:
        return len(self.envs)

    # -- construction-time probe -------------------------------------------------
    def probe(self, seeds: Sequence[int], step: bool = True) -> dict:
        """Reset every env once, and step it once unless ``step=False`` (see :data:`PROBE_HINT`), for the
        info-spec inference and the frame shape.

        Returns ``{"infos": [(index, phase, numeric info)], "frame_shape": the first env's | None,
        "other_frame": (index, shape) of the first env whose frame differs | None}``.
        """
        infos, frame_shapes = [], []
        for j, env in enumerate(self.envs):
            i = self.first + j
            phase = "reset"
            try:
                obs, info = env.reset(seed=int(seeds[j]))
                infos.append((i, "reset", numeric_only(info, i, "reset")))
                if self.pixels:
                    phase = "render"
                    frame_shapes.append(self._frame(j, env).shape)
                if not step:
                    continue
                phase = "sample a probe action"  # the pool's own sampling, not the env, if this fails
                action = probe_action(env.action_space, int(seeds[j]), action_mask(env.action_space, obs, info))
                phase = "step"
                result = env.step(action)
                if not isinstance(result, tuple) or len(result) != 5:
                    raise _bad_step_result(i, result)
                info = result[4]
                infos.append((i, "step", numeric_only(info, i, "step")))
                infos.extend((i, EPISODE_END, stats) for stats in episode_stat_probes(env))
            except EnvError:
                raise
            except Exception as err:
                hint = f"; {PROBE_HINT}" if phase == "step" else ""
                raise EnvError(
                    i, phase, f"{error_text(err)} (while probing the env at construction{hint})"
                ) from err
        return {"infos": infos, "frame_shape": frame_shapes[0] if frame_shapes else None,
                "other_frame": first_other_frame(frame_shapes, self.first)}

    # -- the hot path --------------------------------------------------------------
    def _frame(self, j: int, env: gym.Env) -> np.ndarray:
        return check_frame(self.first + j, env.render())

    def _index(self, rows: np.ndarray | None):
        """Buffer index and global row ids of local ``rows`` (all when ``None``)."""
        if rows is None:
            return slice(self.first, self.first + len(self.envs)), range(self.first, self.first + len(self.envs))
        if self.first:
            rows = rows + self.first
        return rows, rows.tolist()

    def reset(
        self, rows: np.ndarray | None, seeds: Sequence, options: Sequence | None = None, episode_seeds: Sequence[int] | None = None
    ) -> dict | None:
        """Reset ``rows`` (local indices; all when ``None``) with one seed (and options) each.

        ``seeds`` go to ``env.reset`` (``None``: continue the env's stream);
        ``episode_seeds`` are recorded as ``"episode_seed"`` (default: ``seeds``).
        Returns the frames of another size than the buffer's, by global row, for the pool to resize
        (``image_shape=``; see :meth:`store_frame`), or ``None`` when there are none.
        """
        envs, writer, first, frames = self.envs, self.writer, self.first, self.frames
        odd: dict = {}
        order = range(len(envs)) if rows is None else rows.tolist()
        write_obs, write_info = writer.observation, writer.info.write
        j, phase = -1, "reset"
        try:
            for k, j in enumerate(order):
                env = envs[j]
                phase = "reset"
                if options is None or options[k] is None:
                    obs, info = env.reset(seed=seeds[k])
                else:
                    obs, info = env.reset(seed=seeds[k], options=options[k])
                write_obs(first + j, obs, "reset")
                write_info(first + j, info, "reset")
                if frames is not None:
                    phase = "render"  # the reset frame: a render() that raises is named as on a step
                    self.store_frame(first + j, self._frame(j, env), odd)
        except EnvError:
            raise
        except Exception as err:
            raise EnvError(first + j, phase, error_text(err)) from err
        except BaseException as err:  # KeyboardInterrupt, SystemExit: raised as they are, tagged with the env
            _tag(err, first + j, phase)  # (a worker reports it naming the env)
            raise
        writer.reset_flags(self._index(rows)[0], seeds if episode_seeds is None else episode_seeds)
        return odd or None

    def step(self, actions: Sequence, rows: np.ndarray | None) -> dict | None:
        """Step ``rows`` (local indices; all when ``None``) with one action each.

        This is the hot loop: one gymnasium ``step`` per env and nothing else;
        observations, rewards and done flags are then written for all rows at
        once (one numpy assignment per buffer), and infos only where there are any.
        Returns the frames of another size, as :meth:`reset`.
        """
        envs, writer, first = self.envs, self.writer, self.first
        order = range(len(envs)) if rows is None else rows.tolist()
        if len(actions) != len(order):  # the loop below must never pair envs and actions short
            raise ValueError(f"SerialBackend.step: {len(actions)} actions for {len(order)} envs")
        results: list[tuple] = []
        append = results.append
        try:
            if rows is None:
                for env, action in zip(envs, actions):
                    append(env.step(action))
            else:
                for j, action in zip(order, actions):
                    append(envs[j].step(action))
        except Exception as err:
            raise EnvError(_stepping(first, order, results), "step", error_text(err)) from err
        except BaseException as err:  # KeyboardInterrupt, SystemExit: raised as they are, tagged with the env
            _tag(err, _stepping(first, order, results), "step")  # (a worker reports it naming the env)
            raise
        if not results:
            return None
        index, global_rows = self._index(rows)
        try:
            observations, rewards, terminated, truncated, infos = zip(*results, strict=True)  # strict: no silent truncation
        except (TypeError, ValueError):
            for i, result in zip(global_rows, results):
                if not isinstance(result, tuple) or len(result) != 5:
                    raise _bad_step_result(i, result) from None
            raise
        writer.observations_of_rows(index, global_rows, observations, "step")
        info_count = writer.info.count  # recorded keys: an empty info still zero-fills them
        if info_count or (not writer.info.schema.selected and any(infos)):
            write_info = writer.info.write
            for i, info in zip(global_rows, infos):
                write_info(i, info, "step")
        odd = None
        if self.frames is not None:
            j, odd = -1, {}
            try:
                for j in order:
                    self.store_frame(first + j, self._frame(j, envs[j]), odd)
            except EnvError:
                raise
            except Exception as err:
                raise EnvError(first + j, "render", error_text(err)) from err
        writer.step_flags(index, global_rows, rewards, terminated, truncated)
        return odd or None

    # -- direct access to the envs ------------------------------------------------------
    def call(self, rows: Sequence[int], name: str, args: tuple, kwargs: dict) -> list:
        """``env.name(*args, **kwargs)`` (or the attribute) for each local row."""
        return call_envs(self.envs, rows, name, args, kwargs, self.first)

    def get_attr(self, rows: Sequence[int], name: str) -> list:
        """Attribute ``name`` of each local row, looking through gymnasium wrappers; a row without it is an
        :class:`~torchrl_swm.errors.EnvAttributeError` naming the env."""
        out = []
        for j in rows:
            try:
                out.append(self.envs[j].get_wrapper_attr(name))
            except AttributeError as err:
                raise EnvAttributeError(self.first + j, "get_attr", error_text(err)) from err
        return out

    def is_wrapped(self, rows: Sequence[int], wrapper_class: type) -> list[bool]:
        """Whether each local row's env is wrapped, at any depth, in ``wrapper_class``."""
        return [env_is_wrapped(self.envs[j], wrapper_class) for j in rows]

    def set_attr(self, rows: Sequence[int], name: str, values: Sequence, outermost: bool = False) -> None:
        """Set ``name`` where gymnasium's ``set_wrapper_attr`` finds it, or on the env itself (``outermost``)."""
        set_envs_attr(self.envs, rows, name, values, outermost)

    def close(self, *, interrupts_as_errors: bool = False) -> None:
        """Close every env (see :func:`close_envs`)."""
        envs, self.envs = self.envs, []
        close_envs(envs, self.first, interrupts_as_errors=interrupts_as_errors)
