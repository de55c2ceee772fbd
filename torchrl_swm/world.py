"""World: evaluate policies and collect datasets on a batched TorchRL env.

:class:`World` runs a TorchRL policy over a batched env (an :class:`EnvPool`,
or any TorchRL env with batch ``[N]``) with TorchRL's own primitives:
``env.reset`` with a ``"_reset"`` mask, ``env.step`` with a ``"_step"`` mask,
and TorchRL's step layout (root = step t, ``"next"`` = step t + 1). Frozen
envs are not stepped (an env that honours ``"_step"``, like :class:`EnvPool`,
never calls ``gymnasium.Env.step`` on them).

Evaluation protocol (both reset modes):

* Episode ``j`` of ``episodes`` is assigned **up front** to env ``j % N`` and
  is that env's ``j // N``-th episode, started with seed ``seed + j``. The set
  of episodes, and so the metrics, do not depend on which episodes happen to
  finish first: short episodes are not favoured (the bias of counting the
  first ``episodes`` completions). Results are reported per episode in this
  fixed order ``j = 0 .. episodes - 1``. Per-episode seeds need an
  :class:`~torchrl_swm.EnvPool` at the base: another TorchRL env is seeded
  once (``set_seed(seed)``), its episodes follow its own random streams.
* ``reset_mode="auto"``: an env that finishes an episode is reset at once for
  its next assigned episode; an env with no episode left is frozen.
* ``reset_mode="wait"``: envs run in rounds of ``N`` episodes; an env that
  finishes is frozen (``"_step"`` False) until every env of the round has
  finished, then the next round starts.

Both modes run the same episodes with the same seeds: with a policy that
depends only on the observation they give identical per-episode results.

An env that cannot freeze rows (an :class:`EnvPool` over a gymnasium
``VectorEnv``, see :attr:`World.can_freeze_rows`) gets no ``"_step"`` mask:
every row is stepped, the rows with no episode running (idle rows) are left
out of every metric, dataset and video, and an idle row that finishes is reset
(with a seed of its own, outside the plan) without counting as an episode.
Wait mode is emulated this way: a finished env's extra steps are discarded and
it restarts from its planned seed at the next round, so with per-env seeds
(``SyncVectorEnv``/``AsyncVectorEnv``) both modes give the results of a pool
of single envs.

Success comes from the env's ``("info", "is_success")`` or ``("info",
"success")`` (or a root ``is_success``/``success``), or from ``success_fn``; an
episode succeeds if the signal is True at any of its steps. ``terminated`` is
never read as success. Without any signal ``success_rate`` is ``None``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import unravel_key
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from ._interrupts import through_interrupts
from .data import unstorable_entry
from .errors import EnvError, _integral, add_note, check_bool, check_int, count_fits, counted, describe, error_text
from .introspect import bookkeeping_keys, frames_per_step, step_counter_limit

__all__ = ["World", "EvalResult", "RandomPolicy", "EpisodePlan", "RESET_MODES", "SUCCESS_KEYS"]

RESET_MODES = ("auto", "wait")
#: Where World looks for a per-step success flag, in order (under ``"next"`` after a step).
SUCCESS_KEYS = (("info", "is_success"), ("info", "success"), ("is_success",), ("success",))
_EXPLORATION = {
    "deterministic": ExplorationType.DETERMINISTIC,
    "random": ExplorationType.RANDOM,
    "mode": ExplorationType.MODE,
    "mean": ExplorationType.MEAN,
}


class RandomPolicy:
    """Uniform random actions from an action spec: a TorchRL policy (``td -> td``).

    It draws from torch's global generator, so :class:`World` runs (which fork
    and seed it) are reproducible.

    Example:
        >>> import torch
        >>> from torchrl_swm import EnvPool
        >>> from torchrl_swm.world import RandomPolicy
        >>> pool = EnvPool("CartPole-v1", num_envs=4, seed=0)
        >>> policy = RandomPolicy(pool.action_spec, batch_dims=1)    # World's default policy
        >>> policy
        RandomPolicy(Discrete(2), batch=(4,))
        >>> _ = torch.manual_seed(0)
        >>> pool.rollout(10, policy, break_when_any_done=False)["action"].shape
        torch.Size([4, 10])
        >>> pool.close()
    """

    def __init__(self, action_spec, action_key="action", *, batch_dims: int = 0):
        self.action_spec = action_spec
        self.action_key = action_key
        self.batch_dims = batch_dims  # leading dims of the spec that are the env's batch (World's: 1), for repr

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        td.set(self.action_key, self.action_spec.rand())
        return td

    def __repr__(self) -> str:
        # the action space as gymnasium names it (counts, bounds, dtype), apart from the batch of envs
        spec, batch = self.action_spec, tuple(self.action_spec.shape[: self.batch_dims])
        try:
            from .specs import spec_to_space

            one = spec[(0,) * len(batch)] if batch else spec
            return f"RandomPolicy({spec_to_space(one)}{f', batch={batch}' if batch else ''})"
        except Exception:  # a spec with no gymnasium counterpart: its TorchRL class and shape
            return f"RandomPolicy({type(spec).__name__}(shape={tuple(spec.shape)}))"


@dataclass
class EpisodePlan:
    """One episode to run: which env runs it, its seed, reset options and goal."""

    index: int
    env: int
    seed: int | None = None
    options: dict | None = None
    goal: TensorDictBase | None = None
    start: TensorDictBase | None = None
    extra: dict = field(default_factory=dict)


_UNRECORDABLE = object()  # _recordable's answer for a value with no JSON form


def _recordable(value):
    """``value`` as JSON data (numpy values as Python numbers and lists, tuples as lists, mappings with string
    keys as objects), or ``_UNRECORDABLE``."""
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()  # a 0-d array too: its number
    if isinstance(value, float) and not math.isfinite(value):
        return _UNRECORDABLE  # JSON has no NaN or inf (json.dump would write tokens other readers refuse)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_recordable(v) for v in value]
        return _UNRECORDABLE if any(v is _UNRECORDABLE for v in items) else items
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        record = {k: _recordable(v) for k, v in value.items()}
        return _UNRECORDABLE if any(v is _UNRECORDABLE for v in record.values()) else record
    return _UNRECORDABLE


def _recordable_kwargs(kwargs: Mapping) -> tuple[dict, dict]:
    """A dataset's record of the pool's keyword arguments: ``({name: JSON data}, {name: type name})``, the
    second for those with no JSON form (a function, an object), so the record never hides that they were given."""
    record, unrecorded = {}, {}
    for key, value in kwargs.items():
        data = _recordable(value)
        if data is _UNRECORDABLE:
            unrecorded[key] = type(value).__name__
        else:
            record[key] = data
    return record, unrecorded


def _warn_if_dataset_env_differs(metadata: Mapping, env_id: str | None, env_kwargs: dict) -> None:
    """Warn when a dataset's env is not this World's: another id, or the same id built with other ``gym.make``
    keyword arguments (another maze's walls, another task). Starts and goals of one env give the other
    meaningless metrics.

    A record holding ``num_envs`` in its ``env_kwargs`` comes from a World built from an id, as does this one
    when ``env_kwargs`` holds it: then the ids are compared as they are and the ``gym.make`` keyword arguments
    (those that are not the pool's own: ``num_envs``, ``seed``, ... may differ freely) with the id's registered
    defaults filled in. Otherwise only ids that look like gymnasium ids (``-v``) are compared: a World over a
    built pool records its spec's id, or its class name."""
    recorded_id = metadata.get("env")
    recorded = metadata.get("env_kwargs")
    from_ids = isinstance(recorded, Mapping) and "num_envs" in recorded and "num_envs" in env_kwargs
    if not isinstance(recorded_id, str) or env_id is None:
        return
    if (from_ids or "-v" in recorded_id) and _bare_id(recorded_id) != _bare_id(env_id):
        warnings.warn(
            f"evaluate(dataset=...): the dataset was collected on {recorded_id!r}, but this World runs "
            f"{env_id!r}; its starts and goals may not fit this env",
            UserWarning,
            stacklevel=4,
        )
        return
    if not from_ids:
        return
    import gymnasium as gym

    pool_params = _pool_options()
    registered, _ = _recordable_kwargs(getattr(gym.registry.get(_bare_id(env_id)), "kwargs", None) or {})
    mine, mine_unrecorded = _recordable_kwargs(env_kwargs)
    theirs_unrecorded = metadata.get("env_kwargs_unrecorded")
    if not isinstance(theirs_unrecorded, Mapping):
        # a record from before unrecordable arguments were named kept only some values: compare what both give
        theirs_unrecorded, mine = {}, {k: v for k, v in mine.items() if k in recorded}
        mine_unrecorded = {}
    mine, theirs = {**registered, **mine}, {**registered, **recorded}
    missing = object()
    shown = []
    for k in sorted((set(theirs) | set(mine) | set(theirs_unrecorded) | set(mine_unrecorded)) - pool_params):
        there = f"a {theirs_unrecorded[k]} (no JSON form)" if k in theirs_unrecorded else repr(theirs.get(k, missing))
        here = f"a {mine_unrecorded[k]} (no JSON form)" if k in mine_unrecorded else repr(mine.get(k, missing))
        if k in theirs_unrecorded or k in mine_unrecorded:
            same = theirs_unrecorded.get(k) == mine_unrecorded.get(k)  # unrecordable on both sides: not compared
        else:
            same = theirs.get(k, missing) == mine.get(k, missing)
        if same:
            continue
        if k not in theirs and k not in theirs_unrecorded:
            shown.append(f"{k}: given here only")
        elif k not in mine and k not in mine_unrecorded:
            shown.append(f"{k}: given there only")
        else:
            shown.append(f"{k}: {there} there, {here} here")
    if shown:
        warnings.warn(
            f"evaluate(dataset=...): the dataset's env was built with other keyword arguments than this World's "
            f"({', '.join(shown)}); its starts and goals may not fit this env. Build the World with the dataset's "
            "env_kwargs (its dataset.json records them).",
            UserWarning,
            stacklevel=4,
        )


def _bare_id(env_id: str) -> str:
    """A gymnasium id without gym.make's ``module:`` prefix (``"mod:Env-v0"`` and ``"Env-v0"`` are one env)."""
    return env_id.split(":")[-1]


def _pool_options() -> set[str]:
    """The names of ``EnvPool``'s own keyword arguments (``num_envs``, ``seed``, ``backend``...): any other keyword
    given with a gymnasium id goes to ``gym.make``."""
    import inspect

    from .pool import EnvPool

    return set(inspect.signature(EnvPool.__init__).parameters) - {"self", "env_fns", "make_kwargs"}


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exactly 0 at 0 successes and 1 at n, as the interval is: rounding gave -2.8e-17 and 0.9999999999999999
    return (0.0 if k == 0 else max(0.0, center - half), 1.0 if k == n else min(1.0, center + half))


def _as_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


class EvalResult(Mapping):
    """The result of :meth:`World.evaluate`: a read-only mapping with a printable summary.

    Keys (per-episode arrays are in the fixed episode order ``0 .. E-1``):

    * ``success_rate``: fraction in [0, 1], or ``None`` without a success signal;
      ``success_ci``: its 95% Wilson interval (or ``None``).
    * ``episode_successes`` (bool; ``None`` without a signal), ``steps_to_success`` (float, the step at
      which success was first reported, NaN when never; ``None`` without a
      signal), ``start_successes`` (bool: the signal was already True at reset,
      ``None`` when the reset info has no signal).
    * ``episode_returns`` (float64), ``episode_lengths`` (int64),
      ``episode_terminated``/``episode_truncated`` (bool; truncated includes
      World's step limit), ``seeds`` (int64 seed that started each episode, or
      ``None`` when the env does not report it; over a natively batched
      ``VectorEnv``, one RNG for the batch, it is the seed the batch was last
      seeded with, which does not replay the episode alone), ``env_indices`` (int64).
    * run info: ``num_episodes``, ``num_envs``, ``reset_mode``, ``seed``,
      ``max_steps`` (the effective per-episode step limit: World's, or the env's
      when smaller), ``env_time_limit`` (the env's ``TimeLimit`` or ``StepCounter``
      limit, or ``None`` when unknown), ``env_steps`` (the env steps World took, one per row
      stepped: TorchRL steps of the env it was given, so a :class:`~torchrl_swm.transforms.FrameSkip` ``(k)`` makes
      about ``k`` gymnasium steps of each, and a world model none; on an env that cannot
      freeze rows, this includes the idle rows' steps),
      ``wall_time`` (s), ``success_source``.
    * dataset evaluation adds ``episodes_idx``, ``start_steps``,
      ``goal_offset``, ``eval_budget``.

    Example:
        >>> import json
        >>> from torchrl_swm import World
        >>> with World("CartPole-v1", num_envs=4) as world:
        ...     result = world.evaluate(8, seed=0, progress=False)
        >>> result.num_episodes, result["num_envs"], result.seeds.tolist()   # keys read as attributes too
        (8, 4, [0, 1, 2, 3, 4, 5, 6, 7])
        >>> result.episode_returns.shape, result.episode_lengths.dtype      # per episode, in episode order
        ((8,), dtype('int64'))
        >>> result.success_rate is None     # CartPole reports no success signal (terminated is not one)
        True
        >>> record = result.to_dict()                       # for JSON: arrays as lists, NaN and inf as None
        >>> type(record["episode_returns"]).__name__, json.loads(json.dumps(record)) == record
        ('list', True)
    """

    def __init__(self, data: dict):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, name):
        try:
            return self.__dict__["_data"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict:
        """A JSON-serialisable copy: arrays as lists, NaN and +-inf (e.g. a return of -inf) as ``None``, since
        JSON has neither (``json.dump`` would write tokens that other readers refuse)."""

        def conv(v):
            if isinstance(v, np.ndarray):
                return [conv(x) for x in v.tolist()]
            if isinstance(v, (list, tuple)):
                return [conv(x) for x in v]
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, np.generic):
                return conv(v.item())
            return v

        return {k: conv(v) for k, v in self._data.items()}

    def summary(self) -> str:
        d = self._data
        n = d["num_episodes"]
        rate = d["wall_time"] and d["env_steps"] / d["wall_time"]
        head = (
            f"World.evaluate: {counted(n, 'episode')} on {counted(d['num_envs'], 'env')} (reset_mode="
            f"{d['reset_mode']}, seed={d['seed']}), {counted(d['env_steps'], 'env-step')} in {d['wall_time']:.2f} s "
            f"({rate:,.0f}/s)"
        )
        if "episodes_idx" in d:
            head += f"\n  from dataset: goal_offset={d['goal_offset']}, eval_budget={d['eval_budget']}"
        lines = [head]
        if n == 0:
            return head
        if d["success_rate"] is None:
            lines.append("  success rate  n/a: the env reports no is_success/success info (pass success_fn=)")
        else:
            k = int(np.sum(d["episode_successes"]))
            lo, hi = d["success_ci"]
            lines.append(f"  success rate  {d['success_rate']:.3f}  ({k}/{n}; 95% CI [{lo:.3f}, {hi:.3f}])")
            if k:
                sts = d["steps_to_success"][d["episode_successes"]]
                lines.append(
                    f"  steps to succ mean {np.mean(sts):.1f}, median {np.median(sts):.1f} (successful episodes)"
                )
            if d.get("start_successes") is not None and np.any(d["start_successes"]):
                solved = int(np.sum(d["start_successes"]))
                lines.append(f"  WARNING       {solved} episodes were already successful at reset")
        r, L = d["episode_returns"], d["episode_lengths"]
        with np.errstate(invalid="ignore"):  # a return of +-inf: its mean is inf, its std nan, with no warning
            lines.append(
                f"  return        mean {r.mean():.3f} ± {r.std():.3f} (std), min {r.min():.3f}, max {r.max():.3f}"
            )
        lines.append(f"  length        mean {L.mean():.1f} ± {L.std():.1f}, min {L.min()}, max {L.max()}")
        term, trunc = np.asarray(d["episode_terminated"], bool), np.asarray(d["episode_truncated"], bool)
        both = int((term & trunc).sum())  # terminated on the step limit's step: gymnasium sets both flags
        lines.append(
            f"  ended by      terminated {int((term & ~trunc).sum())}, truncated {int((trunc & ~term).sum())}"
            + (f", both {both}" if both else "")
            + (f" (step limit {d['max_steps']})" if d.get("max_steps") else "")
        )
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return (
            f"EvalResult(num_episodes={self._data['num_episodes']}, success_rate={self._data['success_rate']}, "
            f"mean_return={float(np.mean(self._data['episode_returns'])) if self._data['num_episodes'] else None})"
        )


def _pool_source(env_id: str, kwargs: dict) -> tuple:
    """EnvPool's first arguments for a gymnasium id; ``kwargs`` keeps only the pool's own arguments.

    Ids of this package (``torchrl_swm/...``) are built from a picklable factory
    that registers them first, so that worker processes (a process backend) find
    them too. Other ids go to EnvPool as they are.
    """
    import functools

    from .envs import make, spec

    if not env_id.startswith("torchrl_swm/"):
        return (env_id,)
    spec(env_id)  # unknown ids fail here, with gymnasium's "did you mean" message
    pool_params = _pool_options()
    make_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k not in pool_params}
    if kwargs.get("pixels") or kwargs.get("image_shape") is not None:
        make_kwargs.setdefault("render_mode", "rgb_array")
    num_envs = check_int(kwargs.pop("num_envs"), f"World({env_id!r}): num_envs", minimum=1)
    return ([functools.partial(make, env_id, **make_kwargs)] * num_envs,)


def _find_pool(env):
    """The EnvPool under ``env`` (through ``TransformedEnv.base_env``), or None."""
    from torchrl.envs import TransformedEnv

    from .pool import EnvPool

    while isinstance(env, TransformedEnv):
        env = env.base_env
    return env if isinstance(env, EnvPool) else None


def _time_limit_wrapper_steps(pool) -> int | None:
    """The largest ``max_episode_steps`` of the pool's envs' gymnasium ``TimeLimit`` wrappers, read from the
    wrappers themselves: an env wrapped by hand, not made by ``gym.make``, has no spec to say it. ``None`` when
    an env has none, or when the pool cannot tell: a natively batched vector env has no sub-envs, and an
    ``AsyncVectorEnv``'s are out of reach (an attribute they lack would shut their worker down for good)."""
    import gymnasium as gym

    try:
        wrapped = pool.env_is_wrapped(gym.wrappers.TimeLimit)  # asked first: get_attr of a missing one raises
    except NotImplementedError:  # an AsyncVectorEnv
        return None
    if not wrapped or not all(wrapped):
        return None
    try:
        limits = pool.get_attr("_max_episode_steps")  # gymnasium's TimeLimit, found through get_wrapper_attr
    except AttributeError:
        return None
    if not limits or any(not _integral(limit) for limit in limits):
        return None
    return max(int(limit) for limit in limits)


def _torchrl_wrapped_vector_env(env):
    """The gymnasium ``VectorEnv`` a TorchRL ``GymWrapper``/``GymEnv`` under ``env`` wraps, or None."""
    import gymnasium as gym
    from torchrl.envs import TransformedEnv
    from torchrl.envs.libs.gym import GymLikeEnv

    while isinstance(env, TransformedEnv):
        env = env.base_env
    inner = getattr(env, "_env", None) if isinstance(env, GymLikeEnv) else None  # where TorchRL's gym wrappers keep it
    return inner if isinstance(inner, gym.vector.VectorEnv) else None


def goals_outside_episodes(ds, episodes_idx, start_steps, goal_offset: int) -> list[tuple[int, int, int]]:
    """``(episode, start step, length)`` of each dataset episode whose start step is negative or whose
    goal, ``goal_offset`` steps later, is past its end (dataset-driven evaluation cannot run those)."""
    lengths = ds.episode_lengths
    return [(k, s, int(lengths[k])) for k, s in zip(episodes_idx, start_steps) if s < 0 or s + goal_offset > lengths[k]]


def _freezes_rows(env) -> bool:
    """Whether ``env`` honours a ``"_step"`` mask, i.e. can leave some rows unstepped.

    An :class:`EnvPool` over a gymnasium ``VectorEnv`` cannot (one vector step
    advances every row: :attr:`EnvPool.freezes_rows`); a pool of single envs can,
    and so can TorchRL's batched envs. Other TorchRL envs are trusted to handle
    ``"_step"``, as TorchRL does.
    """
    pool = _find_pool(env)
    return pool is None or pool.freezes_rows


#: seeds are below this: episode j uses seed + j, an int64 (room left for 2**62 episodes)
SEED_LIMIT = 2**62


def _callable_name(obj) -> str:
    """``module.qualname`` of a function, or the class name of a policy object (a TensorDictModule...)."""
    try:  # called while the policy's own error propagates: a proxy's __getattr__ must not replace it
        name, module = getattr(obj, "__qualname__", None), getattr(obj, "__module__", None)
    except Exception:
        name = module = None
    if not isinstance(name, str):
        return f"{type(obj).__name__} object"
    return f"{module}.{name}" if isinstance(module, str) else name


def _check_policy(policy, where: str):
    if not callable(policy):
        raise TypeError(f"{where}: expected a TensorDictModule or a callable td -> td, got {type(policy).__name__}")
    return policy


#: what the dataset format is built on: episode ids (the sampler's ``traj_key``) and the episode ends
_REQUIRED_KEYS = {("episode",), ("done",), ("terminated",), ("truncated",)}


def _excluded_keys(keys) -> list[tuple[str, ...]]:
    """``collect(exclude_keys=...)`` as nested-key tuples; a bare string is one key."""
    if isinstance(keys, str):
        keys = [keys]
    elif isinstance(keys, tuple) and keys and all(isinstance(k, str) for k in keys):
        raise TypeError(
            f"exclude_keys={keys!r} is ambiguous: pass a list of keys, e.g. [{keys!r}] for one nested key or "
            f"{list(keys)!r} for several"
        )
    out = []
    for key in keys:
        nested = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, (tuple, list)) else None
        if not nested or not all(isinstance(part, str) for part in nested):
            raise TypeError(f"exclude_keys: expected str or tuple-of-str keys, got {key!r}")
        if nested[0] == "next":
            nested = nested[1:]  # a key is excluded at the root and under "next" alike
        if nested in _REQUIRED_KEYS:
            raise ValueError(
                f"exclude_keys: {key!r} cannot be excluded: the dataset format needs it "
                f"(required: {sorted(k[0] for k in _REQUIRED_KEYS)})"
            )
        out.append(nested)
    return out


def _sequence(value, what: str, scalar: str = "") -> list:
    """``value`` (a list, tuple, array or tensor) as a list; anything else is a TypeError naming ``what``."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(value, Iterable):
        raise TypeError(f"{what}: expected {scalar}a list of values, got {describe(value)}")
    return list(value)


def _world_keys(env: EnvBase) -> set[str]:
    """Root keys World or TorchRL write in the tensordict a step passes around (besides the observations)."""
    keys = {"next", "is_init", "episode", "step_count"}
    for group in (env.done_keys, env.reward_keys, env.action_keys):
        keys.update(k if isinstance(k, str) else k[0] for k in group)
    return keys


def _env_is_init(env: EnvBase) -> str | None:
    """What the env's own root ``"is_init"`` observation is: ``None`` (none, or an InitTracker's in its transforms:
    World's flag agrees), ``"flag"`` (one bool per env, perhaps an InitTracker inside a SerialEnv's envs: checked
    against World's at every step) or ``"other"`` (refused: World would overwrite it)."""
    spec = env.full_observation_spec
    if "is_init" not in spec.keys() or ("is_init",) in bookkeeping_keys(env):
        return None
    leaf = spec["is_init"]
    flag = getattr(leaf, "dtype", None) == torch.bool and leaf.shape[1:].numel() == 1
    return "flag" if flag else "other"


def _as_mask(flags: np.ndarray, device) -> torch.Tensor:
    mask = torch.from_numpy(np.array(flags, dtype=bool)).view(-1, 1)
    return mask if device is None or device.type == "cpu" else mask.to(device)


def _has_numpy_view(leaf) -> bool:
    """A plain CPU tensor that numpy can view without a copy (not bfloat16 or another torch-only dtype)."""
    return (
        type(leaf) is torch.Tensor and leaf.device.type == "cpu" and leaf.dtype in _NUMPY_DTYPES
        and not leaf.is_conj() and not leaf.is_neg()
    )


_NUMPY_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
    torch.float64, torch.complex64, torch.complex128,
}


def _refuse_unstorable(td: TensorDictBase) -> None:
    """An entry the dataset cannot hold (``NonTensorData``: a string, an object; a dtype its memory map cannot
    write) is refused at the step that brings it, before anything is written."""
    unstorable = unstorable_entry(td)
    if unstorable is not None:
        key, what, stored = unstorable
        raise TypeError(
            f"World.collect: {key!r} {what}, written by the env, a transform or the policy; a dataset stores "
            f"{stored}: leave it out with exclude_keys=[{key!r}], or convert it"
        )


class _EpisodeBuffer:
    """Per-env episode rows (``[N, rows]``) until an episode is complete; ``rows`` doubles as episodes
    grow, up to ``max_len`` (a bound far above the episodes' lengths costs no memory)."""

    _FIRST_ROWS = 256

    def __init__(self, num_envs: int, max_len: int):
        self.num_envs, self.max_len = num_envs, max_len
        self.buf: TensorDictBase | None = None
        self._rows = 0
        self._views: dict = {}
        self._dtypes: dict = {}

    def _allocate(self, like: TensorDictBase, rows: int) -> None:
        n, old = self.num_envs, self.buf
        # torch.empty: pages are only committed as rows get written
        self.buf = like.apply(
            lambda x: torch.empty((n, rows) + x.shape[like.batch_dims:], dtype=x.dtype), batch_size=[n, rows],
            device="cpu",
        )
        if old is not None:
            self.buf[:, : self._rows] = old
        self._rows = rows
        self._views = {key: leaf.numpy() for key, leaf in self.buf.items(True, True) if _has_numpy_view(leaf)}
        self._dtypes = {key: leaf.dtype for key, leaf in self.buf.items(True, True)}

    def write(self, td: TensorDictBase, rows: np.ndarray, t: np.ndarray) -> None:
        if td.device is not None and td.device.type != "cpu":
            td = td.to("cpu")
        _refuse_unstorable(td)
        if self.buf is None:
            self._allocate(td, min(self.max_len, self._FIRST_ROWS))
        if len(t) and int(t.max()) >= self._rows:
            if int(t.max()) >= self.max_len:
                raise RuntimeError(f"an episode exceeded the recording bound of {self.max_len} steps")
            self._allocate(self.buf, min(self.max_len, max(2 * self._rows, int(t.max()) + 1)))
        leaves = list(td.items(True, True))
        views = self._views
        # the first step's keys, all viewed by numpy (a bfloat16 leaf has no view: then _dtypes holds more keys)
        fast = len(leaves) == len(views) == len(self._dtypes)
        for key, leaf in leaves:
            dtype = self._dtypes.get(key)
            if dtype is not None and isinstance(leaf, torch.Tensor) and leaf.dtype != dtype:
                raise TypeError(
                    f"World.collect: {key!r} changed dtype between steps, from {dtype} to {leaf.dtype} (as the env "
                    "or the policy wrote it); a dataset entry has one dtype: cast it to one"
                )
            fast = fast and key in views and _has_numpy_view(leaf)
        if fast:
            # numpy's fancy indexing: torch's index_put_ runs on its thread pool, and on a busy machine
            # (other processes on the cores) one such write of an image batch took ~5 ms instead of ~5 µs
            for key, leaf in leaves:
                views[key][rows, t] = leaf.detach().numpy()[rows]
            return
        if len(leaves) != len(self._dtypes) or any(key not in self._dtypes for key, _ in leaves):
            # the buffer is torch.empty: a key some step leaves out would store whatever memory held
            keys = {key for key, _ in leaves}
            missing = [key for key in self._dtypes if key not in keys]
            new = [key for key in keys if key not in self._dtypes]
            what = f"{missing[0]!r} was written at the first step but not at this one" if missing else (
                f"{new[0]!r} was not written at the first step but is at this one")
            raise ValueError(
                f"World.collect: {what} (by the env, a transform or the policy); a dataset entry holds a value for "
                "every step: write it at every step (zeros where it has no value), or leave it out with exclude_keys="
            )
        r = torch.as_tensor(rows)
        self.buf[r, torch.as_tensor(t)] = td[r]

    def episode(self, i: int, length: int) -> TensorDictBase:
        return self.buf[i, :length]


def _check_keys(env: EnvBase) -> None:
    """World reads TorchRL's default keys: the action at ``"action"``, the reward at ``"reward"``, the done flag at
    ``"done"``."""
    reward_keys = [k if isinstance(k, str) else tuple(k) for k in env.reward_keys]
    done_keys = [k if isinstance(k, str) else tuple(k) for k in env.done_keys]
    action_keys = [k if isinstance(k, str) else tuple(k) for k in env.action_keys]
    if action_keys != ["action"]:
        raise ValueError(
            "World: expected the env's action at 'action' (TorchRL's default key, which World's policies and its "
            f"datasets use); this env has action keys {action_keys}. Rename it back (e.g. drop the RenameTransform "
            "of the action) before wrapping it in World."
        )
    if "reward" not in reward_keys or "done" not in done_keys:
        raise ValueError(
            "World: expected the env's reward at 'reward' and its done flag at 'done' (TorchRL's default keys, "
            f"which its metrics and datasets use); this env has reward keys {reward_keys} and done keys "
            f"{done_keys}. Rename them back (e.g. drop the RenameTransform for them) before wrapping it in World."
        )


class World:
    """Evaluate policies and collect datasets on a batched TorchRL env.

    Episodes run under ``torch.no_grad()``, as in TorchRL's collectors (a ``differentiable=True``
    world model or a transform with parameters builds no graph); an env or a policy that needs
    autograd itself (a gradient-based planner) wraps that part in ``torch.enable_grad()``.

    Args:
        env: an :class:`~torchrl_swm.EnvPool`, any TorchRL env with batch size
            ``[N]`` (e.g. a ``TransformedEnv`` over a pool), or a gymnasium id;
            with an id, the keyword arguments build the pool
            (``num_envs=`` is required; ``image_shape=``, ``pixels=``, ``seed=``,
            ``device=``... and ``gym.make`` arguments).
        policy: a TorchRL policy: a ``TensorDictModule`` or any callable taking
            the batch ``[N]`` tensordict and writing ``"action"`` (returning the
            tensordict, or ``None``). Default: :class:`RandomPolicy` on the
            env's action spec.

    Keyword Args:
        max_episode_steps: the default per-episode step limit of
            :meth:`evaluate` and :meth:`collect`. With a gymnasium id it is
            also passed to ``gym.make`` (a ``TimeLimit``); otherwise World cuts
            episodes at this many steps and records them as truncated.

    What a policy sees (batch ``[N]``): the env's root keys (observations,
    ``"pixels"``, ``("info", k)`` and its ``("info_mask", k)``, ``"episode_seed"``, done flags), plus
    ``"is_init"`` (``(N, 1)`` bool, True on an episode's first step, as
    TorchRL's ``InitTracker``) and, in dataset evaluation, the goal under
    ``goal_key`` (``("goal", k)`` for each observation key ``k``). Rows of
    frozen envs are present but their actions are ignored. Between steps the
    tensordict moves on as in TorchRL's ``rollout`` and collectors (the env's
    ``step_mdp``): the root's own entries carry over, and a recurrent policy's
    ``("next", state)`` reaches the next step only when the env declares it, as
    there (add its primer: ``env.append_transform(lstm.make_tensordict_primer())``).

    Examples:
        >>> import torchrl_swm
        >>> world = torchrl_swm.World("torchrl_swm/PointMaze-v0", num_envs=8, image_shape=(64, 64))
        >>> result = world.evaluate(episodes=32, seed=0)
        >>> print(result)                       # summary table
        World.evaluate: 32 episodes on 8 envs (reset_mode=auto, seed=0), 3046 env-steps in ...
          success rate  0.094  (3/32; 95% CI [0.032, 0.242])
          steps to succ mean 48.7, median 47.0 (successful episodes)
          return        mean -158.369 ± 64.655 (std), min -271.058, max -12.563
          length        mean 95.2 ± 15.7, min 30, max 100
          ended by      terminated 3, truncated 29 (step limit 100)
        >>> result["episode_returns"].shape     # episode j started with seed 0 + j
        (32,)
        >>> ds = world.collect("data/maze", episodes=8, seed=1)
        >>> ds.num_episodes, ds.td["pixels"].shape[1:]
        (8, torch.Size([64, 64, 3]))
        >>> world.close()
    """

    def __init__(self, env, policy=None, *, max_episode_steps: int | None = None, **pool_kwargs):
        if max_episode_steps is not None and check_int(max_episode_steps, "World: max_episode_steps") < 1:
            raise ValueError(f"World: max_episode_steps must be >= 1, got {max_episode_steps}")
        self.max_episode_steps = None if max_episode_steps is None else int(max_episode_steps)
        self.env_id: str | None = None
        self.env_kwargs: dict = {}
        self._owns_env = False
        if isinstance(env, str):
            from . import envs as _register  # noqa: F401  (registers torchrl_swm/* ids)
            from .pool import EnvPool

            if "num_envs" not in pool_kwargs:
                raise TypeError(f"World({env!r}): a gymnasium id needs num_envs= (the number of parallel envs)")
            kwargs = dict(pool_kwargs)
            if self.max_episode_steps is not None:
                kwargs["max_episode_steps"] = self.max_episode_steps
            self.env_id, self.env_kwargs = env, {k: v for k, v in pool_kwargs.items()}
            env = EnvPool(*_pool_source(env, kwargs), **kwargs)
            self._owns_env = True
        elif pool_kwargs:
            raise TypeError(
                f"World: keyword arguments {sorted(pool_kwargs)} build a pool from a gymnasium id; "
                f"got an already built {type(env).__name__}"
            )
        try:
            if not isinstance(env, EnvBase):
                import gymnasium as gym

                is_gym = isinstance(env, (gym.Env, gym.vector.VectorEnv))
                hint = " (wrap gymnasium envs in torchrl_swm.EnvPool)" if is_gym else ""
                raise TypeError(
                    f"World: expected a TorchRL env, an EnvPool or a gymnasium id, got {type(env).__name__}{hint}"
                )
            if len(env.batch_size) != 1:
                raise ValueError(
                    f"World: expected a batched env with batch_size [N], got {list(env.batch_size)}; "
                    "use torchrl_swm.EnvPool, or a SerialEnv/ParallelEnv of single envs"
                )
            _check_keys(env)
            venv = _torchrl_wrapped_vector_env(env)
            if venv is not None:
                raise TypeError(
                    f"World: this TorchRL env wraps a gymnasium {type(venv).__name__} (TorchRL's GymWrapper over a "
                    "vector env, or GymEnv(..., num_envs=N)). It steps every row at once, so World's '_step' masks "
                    "cannot freeze finished envs, and under NEXT_STEP autoreset TorchRL 0.14.1 records a ghost "
                    "transition per episode: World's episodes and metrics would be wrong. Wrap the vector env in an "
                    "EnvPool instead, World(EnvPool(gym.make_vec(...))), which is exact in every autoreset mode."
                )
            self.env = env
            self.num_envs = int(env.batch_size[0])
            self.device = env.device
            self.pool = _find_pool(env)
            self._freezes_rows = _freezes_rows(env)
            self._env_spec = None if self.pool is None else self.pool.env_spec
            self._env_metadata = {} if self.pool is None else self.pool.env_metadata
            # gymnasium's TimeLimit: read from every env's wrapper where the pool reaches them (env_spec is env 0's,
            # and envs made with other max_episode_steps each end at their own: World cuts at the largest)
            self._time_limit = None if self.pool is None else _time_limit_wrapper_steps(self.pool)
            if self._time_limit is None:
                self._time_limit = getattr(self._env_spec, "max_episode_steps", None)
            if self.env_id is None:
                self.env_id = getattr(self._env_spec, "id", None)
            self.policy = None
            self.set_policy(policy)
        except BaseException as err:
            if self._owns_env:  # a pool World built from an id: its workers must not outlive the error
                try:
                    env.close()
                except Exception as close_err:  # the refusal is the error to report
                    add_note(err, f"closing the pool World built then failed too: {error_text(close_err)}")
            raise

    # -- policy -------------------------------------------------------------------------------------
    def set_policy(self, policy) -> None:
        """Use ``policy`` (a TorchRL policy; ``None``: random actions from the action spec)."""
        if policy is None:
            policy = RandomPolicy(self.env.action_spec, batch_dims=1)
        self.policy = _check_policy(policy, "World.set_policy")

    @property
    def can_freeze_rows(self) -> bool:
        """Whether the env can leave rows unstepped with a ``"_step"`` mask.

        ``False`` for an :class:`EnvPool` over a gymnasium ``VectorEnv``, which
        steps every row at once. World then steps every row, keeps the rows with
        no episode running (idle rows) out of every metric, dataset and video,
        and resets idle rows that finish without counting them as episodes;
        ``env_steps`` then counts the idle rows' steps too (they were taken).
        """
        return self._freezes_rows

    # -- small helpers --------------------------------------------------------------------------------
    def __repr__(self) -> str:
        name = self.env_id or type(self.env).__name__
        return (
            f"World(env={name!r}, num_envs={self.num_envs}, policy={self.policy!r}, "
            f"max_episode_steps={self.max_episode_steps})"
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Close the env if World built it from a gymnasium id."""
        if self._owns_env:
            self._owns_env = False  # once: a second close() does nothing
            self.env.close(raise_if_closed=False)

    def reset(self, seed=None, options=None) -> TensorDictBase:
        """Reset every env (``seed``/``options`` as :meth:`EnvPool.reset`); returns the tensordict."""
        kwargs = {}
        if seed is not None or options is not None:
            if self.pool is None:
                raise TypeError("World.reset: seed=/options= need an EnvPool; use env.set_seed() for other envs")
            kwargs = {"seed": seed, "options": options}
        return self.env.reset(**kwargs)

    def _step_limit(self) -> int | None:
        if self.max_episode_steps is not None:
            return self.max_episode_steps
        return self._env_time_limit()

    def _env_time_limit(self) -> int | None:
        """The env's own limit: its gymnasium ``TimeLimit``'s (its spec's ``max_episode_steps``, or the wrapper's
        own) or a TorchRL ``StepCounter(max_steps=...)`` transform's, the smaller; None when neither is known.
        In World's steps: a ``FrameSkip`` makes the limits of what it repeats frames (see ``step_counter_limit``)."""
        time_limit = None if self._time_limit is None else math.ceil(int(self._time_limit) / frames_per_step(self.env))
        limits = [time_limit, step_counter_limit(self.env)]
        limits = [int(limit) for limit in limits if limit is not None]
        return min(limits) if limits else None

    def _effective_limit(self, max_steps: int | None) -> int | None:
        """The most steps an episode can run: World's limit, or the env's own when smaller."""
        env_limit = self._env_time_limit()
        if env_limit is None or max_steps is None:
            return max_steps if env_limit is None else env_limit
        return min(max_steps, env_limit)

    def _render_fps(self) -> int | None:
        return self._env_metadata.get("render_fps")

    def _success_key(self):
        keys = set(self.env.full_observation_spec.keys(True, True))
        for key in SUCCESS_KEYS:
            if key in keys or (len(key) == 1 and key[0] in keys):
                return key
        return None

    @staticmethod
    def _seed(seed) -> int:
        if seed is None:
            return int(np.random.SeedSequence().generate_state(1, dtype=np.uint32)[0] >> 1)
        seed = check_int(seed, "seed", minimum=0)  # TypeError for 1.5, "3", True (as EnvPool's seeds)
        if seed >= SEED_LIMIT:
            raise ValueError(
                f"seed: expected an int below 2**62 (episode j uses the seed seed + j, an int64), got {seed}"
            )
        return seed

    def _plans(self, episodes: int, seed: int, options) -> list[EpisodePlan]:
        listed = isinstance(options, Sequence) and not isinstance(options, (str, bytes))
        if listed:
            if len(options) != episodes:
                raise ValueError(f"options: expected one dict or a list of {episodes} dicts, got {len(options)}")
            per_episode = list(options)
        else:
            with count_fits("episodes", episodes):
                per_episode = [options] * episodes
        for j, o in enumerate(per_episode):
            if o is not None and not isinstance(o, Mapping):
                what = f"options[{j}]" if listed else "options"
                raise TypeError(f"{what}: expected a dict (or None) of reset options, got {describe(o)}")
        n = self.num_envs
        return [
            EpisodePlan(index=j, env=j % n, seed=seed + j, options=None if o is None else dict(o))
            for j, o in enumerate(per_episode)
        ]

    # -- evaluation -----------------------------------------------------------------------------------------
    def evaluate(
        self,
        episodes: int | None = None,
        *,
        seed: int | None = None,
        reset_mode: str = "auto",
        max_steps: int | None = None,
        success_fn: Callable[[TensorDictBase], torch.Tensor] | None = None,
        video=None,
        progress: bool | None = None,
        options: dict | Sequence[dict] | None = None,
        exploration: str | None = "deterministic",
        dataset=None,
        episodes_idx: Sequence[int] | None = None,
        start_steps: int | Sequence[int] | None = None,
        goal_offset: int | None = None,
        eval_budget: int | None = None,
        goal_key: str = "goal",
        reset_options_fn: Callable[[Mapping, Mapping], dict] | None = None,
        check_start: bool | Sequence | None = None,
    ) -> EvalResult:
        """Run ``episodes`` episodes of the policy and report per-episode metrics.

        Args:
            episodes: number of episodes (default: one per env). Episode ``j``
                runs on env ``j % N`` with seed ``seed + j`` (an ``EnvPool``; another env is
                seeded once with ``seed``). With ``dataset=``:
                the first ``episodes`` dataset episodes (default: all of them),
                or, with ``episodes_idx=``, its length.

        Keyword Args:
            seed: base seed (default: drawn from OS entropy and reported in the result).
                With ``dataset=``, episodes reset with the dataset episodes' own seeds instead,
                and ``seed`` only seeds torch's generator (below), unless the dataset recorded no
                seeds (collected with ``exclude_keys="episode_seed"``): then episode ``j`` of the
                evaluation resets with ``seed + j``. The same seed gives the same results.
                Torch's global generator is forked and seeded with it during the run, so random and
                stochastic TorchRL policies are reproducible too.
            reset_mode: ``"auto"`` or ``"wait"`` (see the module docstring).
            max_steps: per-episode step limit (default: ``max_episode_steps``,
                else the env's ``TimeLimit``); an episode reaching it ends as
                truncated. The result's ``max_steps`` is the effective limit: the
                env's own ``TimeLimit`` (``env_time_limit``) when that is smaller.
            success_fn: ``success_fn(td) -> bool tensor (N,) or (N, 1)``, called
                after every step with the step tensordict (root = step t,
                ``"next"`` = step t + 1); replaces the env's success info.
            video: a directory (one MP4 per episode) or a
                :class:`~torchrl_swm.video.VideoRecorder`; needs ``"pixels"``.
            progress: show a progress bar (tqdm, on stderr). ``None`` (the default): only where someone
                watches, a terminal or a Jupyter notebook, as the CLI; none in logs and pipes.
            options: reset options for every episode (a dict) or per episode (a list).
            exploration: TorchRL exploration type for the policy
                (``"deterministic"``, ``"random"``, ``"mode"``, ``"mean"`` or ``None``).

        Dataset-driven evaluation (keyword arguments):
            dataset: a :class:`~torchrl_swm.data.WorldDataset` or its path.
            episodes_idx: dataset episodes (storage positions, ``0 <= k < dataset.num_episodes``:
                no negative ones, whose results would name another position) to start from;
                default: the first ``episodes`` (all when ``episodes`` is not given). More
                episodes than envs run in chunks.
            start_steps: the step of each episode to start from (int or one per episode; default 0).
            goal_offset: the goal is the dataset step ``start + goal_offset`` (required).
            eval_budget: steps allowed to reach the goal (required); success is judged within it.
            goal_key: where the goal goes in the policy's tensordict:
                ``(goal_key, k)`` for each observation key ``k`` of the env found in
                the dataset (e.g. ``("goal", "pixels")``, ``("goal", "state")``).
            reset_options_fn: ``fn(start, goal) -> reset options``, with
                ``start``/``goal`` dicts of numpy arrays (one dataset step each);
                default: the env's ``reset_options_from_dataset`` method (found
                through gymnasium wrappers on env 0 and called in this process,
                so it must only map data to options).
            check_start: keys whose reset value must equal the dataset's start
                value (True: the env's ``dataset_state_keys``, or every non-pixel
                observation key); a mismatch raises. Default: the env's
                ``dataset_state_keys`` when it declares them, else no check.

        Returns:
            an :class:`EvalResult`.
        """
        if reset_mode not in RESET_MODES:
            raise ValueError(f"reset_mode: expected one of {RESET_MODES}, got {reset_mode!r}")
        for name, fn in (("success_fn", success_fn), ("reset_options_fn", reset_options_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"evaluate: {name}= expected a callable (or None), got {describe(fn)}")
        seed = self._seed(seed)
        max_steps = self._check_limit(max_steps, "max_steps")
        extra = {}
        if dataset is not None:
            if options is not None:
                raise ValueError(
                    "evaluate: options= cannot be combined with dataset= (the dataset sets the reset options)"
                )
            if max_steps is not None:
                raise ValueError(
                    f"evaluate: max_steps={max_steps} cannot be combined with dataset= (eval_budget= is the step "
                    "limit of a dataset episode)"
                )
            plans, extra, check_keys = self._dataset_plans(
                dataset, episodes, episodes_idx, start_steps, goal_offset, eval_budget, seed, goal_key,
                reset_options_fn, check_start,
            )
            max_steps = extra["eval_budget"]
        else:
            for name, value in (("episodes_idx", episodes_idx), ("start_steps", start_steps),
                                ("goal_offset", goal_offset), ("eval_budget", eval_budget)):
                if value is not None:
                    raise ValueError(f"evaluate: {name}= is only used with dataset=")
            episodes = self.num_envs if episodes is None else check_int(episodes, "episodes")
            if episodes < 0:
                raise ValueError(f"episodes: expected a non-negative int, got {episodes}")
            plans = self._plans(episodes, seed, options)
            check_keys = ()
        if max_steps is None:
            max_steps = self._step_limit()
        extra = {**extra, "env_time_limit": self._env_time_limit()}
        _Run.check_arguments(self, plans, exploration, None, progress, "evaluate")
        recorder = self._video(video)
        try:
            run = _Run(
                self, plans, reset_mode=reset_mode, max_steps=max_steps, success_fn=success_fn, video=recorder,
                progress=progress, exploration=exploration, goal_key=goal_key, check_keys=check_keys,
                desc="evaluate", seed=seed,
            )
            with _forked_rng(seed):
                run.run()
        except BaseException as err:
            if recorder is not None:
                try:
                    through_interrupts(recorder.close)  # a second Ctrl-C must not leave cut files unmarked
                except Exception as close_err:  # the run's own error is the one to report
                    add_note(err, f"closing the videos then failed too: {error_text(close_err)}")
            raise
        if recorder is not None:
            through_interrupts(recorder.close)
        return run.result(seed=seed, extra=extra)

    def _check_limit(self, value, name):
        if value is None:
            return None
        if check_int(value, name) < 1:
            raise ValueError(f"{name}: expected a positive number of steps, got {value}")
        return int(value)

    def _video(self, video):
        if video is None or video is False:
            return None
        from .video import VideoRecorder

        if not isinstance(video, (str, os.PathLike, VideoRecorder)):
            raise TypeError(
                f"video: expected a directory (str or path) for one MP4 per episode, or a VideoRecorder, got {video!r}"
            )

        if "pixels" not in self.env.full_observation_spec.keys():
            raise ValueError(
                "video: the env has no 'pixels' key; build the pool with pixels=True or image_shape=(H, W)"
            )
        recorder = video if isinstance(video, VideoRecorder) else VideoRecorder(video)
        recorder.bind(self.num_envs, self._render_fps())
        return recorder

    # -- dataset-driven evaluation ----------------------------------------------------------------------
    def _env_attr(self, name: str):
        """Attribute ``name`` of env 0, looked up through its gymnasium wrappers (any backend), or None."""
        if not self.pool.freezes_rows and not self.pool._backend.per_env_access:
            return None  # a natively batched vector env (CartPoleVectorEnv): no per-env attributes to look up
        if not self.pool._query_first("has_wrapper_attr", name):
            return None
        try:
            return self.pool._query_first("get_wrapper_attr", name)
        except EnvError as err:  # e.g. a process backend's worker that cannot pickle it (a hook pickles its env)
            raise EnvError(
                0, "call",
                f"evaluate(dataset=...): env 0 has {name!r}, but it could not be fetched ({err.message or err}); "
                "from a process backend's worker it comes pickled (a method with its env), so make that "
                "picklable, or pass reset_options_fn=",
            ) from err

    def _state_hook(self, reset_options_fn):
        """The function mapping (start step, goal step) to reset options, and env 0's declared state keys."""
        if self.pool is None:
            raise TypeError(
                "evaluate(dataset=...): starting envs from dataset states needs per-env reset options, "
                f"which {type(self.env).__name__} does not take; use an EnvPool"
            )
        state_keys = self._env_attr("dataset_state_keys")
        if reset_options_fn is not None:
            return reset_options_fn, state_keys
        hook = self._env_attr("reset_options_from_dataset")
        if not callable(hook):
            name = f"env {self.env_id!r}" if self.env_id else "the env"
            raise TypeError(
                f"evaluate(dataset=...): {name} has no state hook, so it cannot start from dataset states. "
                "Implement `reset_options_from_dataset(self, start, goal) -> dict` on the env (returning reset "
                "options that its reset() honours, e.g. {'state': ...}), or pass reset_options_fn=."
            )
        return hook, state_keys

    def _check_dataset_keys(self) -> bool:
        """Refuse env keys that the dataset's own ``"episode"`` / ``"step_count"`` entries would overwrite.

        A ``"step_count"`` leaf may be a ``StepCounter``'s (also one inside a ``SerialEnv``'s envs), which counts
        the steps World counts: returns whether the env has one, which is then checked against World's count at
        every step, where any difference is an error (a ``StepCounter`` that a ``FrameSkip`` repeats counts
        frames)."""
        spec = self.env.full_observation_spec.clone()
        spec.update(self.env.full_state_spec)
        allowed = bookkeeping_keys(self.env)
        keys = [(k,) if isinstance(k, str) else tuple(k) for k in spec.keys(True, True)]
        has_count = ("step_count",) in keys
        # an env's own "step_count" may be a hidden StepCounter's only if it holds one count per env
        counter_like = has_count and spec["step_count"].shape[1:].numel() == 1
        clashes = sorted({k[0] for k in keys if k not in allowed and (
            k[0] == "episode" or (k[0] == "step_count" and not counter_like))})
        if clashes:
            raise ValueError(
                f"World.collect: the env has an entry {clashes[0]!r}, which World writes in every dataset row "
                "(\"episode\": the episode id, \"step_count\": the step in the episode) and would overwrite; "
                "rename it (e.g. torchrl.envs.RenameTransform) before collecting"
            )
        return has_count

    def _dataset_plans(self, dataset, episodes, episodes_idx, start_steps, goal_offset, eval_budget, seed, goal_key,
                       reset_options_fn, check_start):
        from .data import WorldDataset, load_dataset

        if not isinstance(dataset, (WorldDataset, str, os.PathLike)):
            raise TypeError(
                f"evaluate: dataset= expected a path to a dataset or a WorldDataset (load_dataset), got "
                f"{describe(dataset)}"
            )
        ds = dataset if isinstance(dataset, WorldDataset) else load_dataset(dataset)
        _warn_if_dataset_env_differs(ds.metadata, self.env_id, self.env_kwargs)
        if goal_offset is None or eval_budget is None:
            raise ValueError("evaluate(dataset=...): goal_offset= and eval_budget= are required")
        goal_offset, eval_budget = check_int(goal_offset, "goal_offset"), check_int(eval_budget, "eval_budget")
        if goal_offset < 0:
            raise ValueError(f"goal_offset: expected >= 0, got {goal_offset}")
        if eval_budget < 1:
            raise ValueError(f"eval_budget: expected >= 1, got {eval_budget}")
        if ds.num_episodes == 0:
            raise ValueError(f"evaluate(dataset=...): {ds.path} holds no episodes")
        if episodes_idx is None:  # the first `episodes` dataset episodes (default: all of them)
            count = ds.num_episodes if episodes is None else check_int(episodes, "episodes")
            if count < 0:
                raise ValueError(f"episodes: expected a non-negative int, got {episodes}")
            if count > ds.num_episodes:
                raise ValueError(
                    f"evaluate(dataset=...): episodes={count} but the dataset holds {ds.num_episodes} episodes; "
                    f"pass episodes <= {ds.num_episodes}, or episodes_idx= to choose (or repeat) dataset episodes"
                )
            idx = list(range(count))
        else:
            idx = [check_int(i, "episodes_idx") for i in _sequence(episodes_idx, "episodes_idx")]
            if episodes is not None and check_int(episodes, "episodes") != len(idx):
                raise ValueError(
                    f"evaluate(dataset=...): episodes={episodes} but episodes_idx has {len(idx)} entries; "
                    "pass only one of them (episodes= alone takes the first dataset episodes)"
                )
        if start_steps is None:
            starts = [0] * len(idx)
        elif _integral(start_steps):  # an int, numpy integer or 0-d integer array/tensor
            starts = [check_int(start_steps, "start_steps")] * len(idx)
        else:
            starts = [check_int(s, "start_steps") for s in _sequence(start_steps, "start_steps", scalar="an int or ")]
            if len(starts) != len(idx):
                raise ValueError(f"start_steps: expected {len(idx)} values (one per episode), got {len(starts)}")
        for m, k in enumerate(idx):
            if not 0 <= k < ds.num_episodes:
                raise IndexError(f"episodes_idx[{m}] = {k} is out of range: the dataset has {ds.num_episodes} episodes")
        bad = [f"episode {k} (length {n}) from step {s}" for k, s, n in goals_outside_episodes(ds, idx, starts, goal_offset)]
        if bad:
            raise ValueError(
                f"evaluate(dataset=...): start_step + goal_offset ({goal_offset}) must be within the episode for: "
                + "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
            )
        hook, declared = self._state_hook(reset_options_fn)
        env_keys = {k if isinstance(k, tuple) else (k,) for k in self.env.full_observation_spec.keys(True, True)}
        if not isinstance(goal_key, str) or not goal_key:
            raise TypeError(f"goal_key: expected a non-empty str, got {describe(goal_key)}")
        if (goal_key,) in env_keys or any(k[0] == goal_key for k in env_keys):
            raise ValueError(
                f"goal_key={goal_key!r} clashes with an observation key of the env; pass another goal_key="
            )
        own = _world_keys(self.env)
        if goal_key in own or goal_key.startswith("_"):
            raise ValueError(
                f"goal_key={goal_key!r} is a key World or TorchRL writes in the policy's tensordict (reserved: "
                f"{sorted(own)} and '_'-prefixed masks); pass another goal_key="
            )
        # the goal holds the env's own observations: not infos, seeds, nor what StepCounter / RewardSum /
        # InitTracker write (a collecting run's partial return is no goal)
        bookkeeping = bookkeeping_keys(self.env)
        goal_keys = [
            k for k in ds.observation_keys
            if (k if isinstance(k, tuple) else (k,)) in env_keys
            and (k if isinstance(k, tuple) else (k,))[0] not in ("info", "info_mask", "episode_seed")
            and (k if isinstance(k, tuple) else (k,)) not in bookkeeping
        ]
        obs_spec = self.env.full_observation_spec
        for key in goal_keys:
            want, have = tuple(obs_spec[key].shape[1:]), tuple(ds.td.get(key).shape[1:])
            if want != have:
                hint = " (build the World with image_shape= matching the dataset)" if key == "pixels" else ""
                raise ValueError(
                    f"evaluate(dataset=...): dataset key {key!r} has shape {have} per step but the env's "
                    f"is {want}{hint}"
                )
        if check_start is None or check_start is True:
            if declared is not None:
                check_keys = [k if isinstance(k, tuple) else (k,) for k in declared]
            elif check_start is True:
                check_keys = [k if isinstance(k, tuple) else (k,) for k in goal_keys if k != "pixels"]
            else:
                check_keys = []
        elif check_start is False:
            check_keys = []
        else:  # a str is one key (as exclude_keys=); otherwise a list of keys, each a str or a tuple of str
            if isinstance(check_start, tuple) and check_start and all(isinstance(k, str) for k in check_start):
                raise TypeError(  # as exclude_keys=: one nested key, or several?
                    f"check_start={check_start!r} is ambiguous: pass a list of keys, e.g. [{check_start!r}] for one "
                    f"nested key or {list(check_start)!r} for several"
                )
            keys = [check_start] if isinstance(check_start, str) else _sequence(check_start, "check_start", "True, ")
            check_keys = [k if isinstance(k, tuple) else (k,) for k in keys]
        seeds = ds.episode_seeds
        n = self.num_envs
        plans = []
        for m, (k, s) in enumerate(zip(idx, starts)):
            start = ds.step(k, s).to_tensordict()
            goal = ds.step(k, s + goal_offset).to_tensordict()
            options = hook(start.numpy(), goal.numpy())
            if not isinstance(options, Mapping):
                raise TypeError(f"the state hook returned {type(options).__name__}, expected a dict of reset options")
            episode_seed = int(seeds[k]) if seeds is not None else seed + m
            plans.append(
                EpisodePlan(index=m, env=m % n, seed=episode_seed, options=dict(options),
                            goal=goal.select(*goal_keys), start=start)
            )
        extra = {
            "episodes_idx": np.asarray(idx, dtype=np.int64),
            "start_steps": np.asarray(starts, dtype=np.int64),
            "goal_offset": goal_offset,
            "eval_budget": eval_budget,
            "goal_keys": [k if isinstance(k, str) else ".".join(k) for k in goal_keys],
        }
        return plans, extra, check_keys

    # -- data collection --------------------------------------------------------------------------------
    def collect(
        self,
        path: str | os.PathLike,
        episodes: int,
        *,
        seed: int | None = None,
        policy=None,
        progress: bool | None = None,
        reset_mode: str = "auto",
        max_steps: int | None = None,
        options: dict | Sequence[dict] | None = None,
        exploration: str | None = "random",
        overwrite: bool = False,
        compact: bool = True,
        exclude_keys: Sequence = (),
    ):
        """Run ``episodes`` episodes and write them to a dataset at ``path``.

        The dataset is a TorchRL replay-buffer storage on disk, memory-mapped,
        in TorchRL's episode layout (see :mod:`torchrl_swm.data`): every row is
        a transition (root = step t, ``"next"`` = step t + 1), episodes are
        contiguous, the reset frame is the root of an episode's first row and
        each action sits on the row of the step it was taken at. Rows carry
        ``"episode"`` (id), ``"step_count"``, ``"episode_seed"``, ``"is_init"``,
        pixels when the env renders them, and the infos.

        Episodes are assigned to envs up front, as in :meth:`evaluate`
        (episode ``j``: env ``j % N``, seed ``seed + j``). An interruption (an
        exception, Ctrl-C) leaves a loadable dataset with every completed
        episode and no partial one (``metadata["complete"]`` is False). Nothing
        is created or replaced until the first episode is complete: a run stopped
        before it writes nothing, and a dataset already at ``path`` is kept,
        even with ``overwrite=True``.

        Keyword Args:
            max_steps: per-episode step limit (default ``max_episode_steps``,
                else the env's ``TimeLimit``); required to size the storage.
            policy: a policy for this collection only (default: the World's).
            progress: a progress bar, as in :meth:`evaluate` (default: on a terminal or in a notebook).
            exploration: TorchRL exploration type (default ``"random"``).
            overwrite: replace an existing dataset at ``path``.
            compact: rewrite the storage at its exact size at the end, in episode order (an interrupted
                collection's in completion order); skipped, with a warning, where the disk lacks room.
            exclude_keys: keys not to store, at the root and under ``"next"``
                (e.g. ``[("info", "goal_pixels")]`` to halve a PointMaze dataset).

        Returns:
            the dataset, opened with :func:`~torchrl_swm.load_dataset`.
        """
        from .data import DatasetWriter, load_dataset

        if reset_mode not in RESET_MODES:
            raise ValueError(f"reset_mode: expected one of {RESET_MODES}, got {reset_mode!r}")
        episodes = check_int(episodes, "collect: episodes")
        overwrite = check_bool(overwrite, "collect: overwrite")  # before anything runs: "no" would replace a dataset
        compact = check_bool(compact, "collect: compact")
        if episodes < 1:
            raise ValueError(f"collect: episodes must be >= 1, got {episodes}")
        seed = self._seed(seed)
        max_steps = self._check_limit(max_steps, "max_steps") or self._step_limit()
        if max_steps is None:
            raise ValueError(
                "collect: the per-episode step limit is unknown; pass max_steps= (or World(max_episode_steps=...)) "
                "so that the storage can be sized"
            )
        max_steps = self._effective_limit(max_steps)  # the env's own, when smaller: the storage's size, the cut
        plans = self._plans(episodes, seed, options)
        used_policy = self.policy if policy is None else policy
        exclude_keys = _excluded_keys(exclude_keys)
        verify_step_count = self._check_dataset_keys()
        env_kwargs, unrecorded = _recordable_kwargs(self.env_kwargs)
        metadata = {
            "env": self.env_id or type(self.env).__name__,
            "env_kwargs": env_kwargs,
            "env_kwargs_unrecorded": unrecorded,
            "num_envs": self.num_envs,
            "seed": seed,
            "reset_mode": reset_mode,
            "max_steps": max_steps,
            "episodes_requested": episodes,
            "policy": repr(used_policy)[:300],
            "excluded_keys": [list(k) if len(k) > 1 else k[0] for k in exclude_keys],
        }
        _Run.check_arguments(self, plans, exploration, used_policy, progress, "collect")
        # lazy: nothing is created or replaced until the first episode is complete (a bad exclude_keys, a policy
        # or env failing at the start leave the path as it was)
        writer = DatasetWriter(path, capacity=episodes * max_steps, metadata=metadata, overwrite=overwrite, lazy=True)
        try:
            run = _Run(
                self, plans, reset_mode=reset_mode, max_steps=max_steps, success_fn=None, video=None,
                progress=progress, exploration=exploration, goal_key="goal", check_keys=(), writer=writer,
                policy=used_policy, desc="collect", seed=seed, exclude_keys=exclude_keys,
                verify_step_count=verify_step_count,
            )
            with _forked_rng(seed):
                run.run()
        except BaseException as err:
            writer.close(complete=False, interrupted=error_text(err)[:500], compact=compact)
            raise
        writer.close(complete=True, compact=compact)
        return load_dataset(path)


class _forked_rng:
    """Fork torch's global RNG (CPU, and CUDA when in use) and seed it; restored on exit."""

    def __init__(self, seed: int):
        self.seed = seed

    def __enter__(self):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        devices = list(range(torch.cuda.device_count())) if cuda else []
        self._ctx = torch.random.fork_rng(devices=devices)
        self._ctx.__enter__()
        torch.manual_seed(self.seed)
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def _watched() -> bool:
    """Whether someone watches stderr: a terminal, or a Jupyter kernel (whose stderr is no terminal, where tqdm
    draws a widget). Logs and pipes get no progress bar: tqdm would fill them with carriage returns."""
    isatty = getattr(sys.stderr, "isatty", None)  # None under pythonw
    return bool(isatty is not None and isatty()) or "ipykernel" in sys.modules


class _Run:
    """One evaluate/collect run: the episode schedule, the step loop and the per-episode bookkeeping."""

    def __init__(self, world: World, plans: list[EpisodePlan], *, reset_mode, max_steps, success_fn, video, progress,
                 exploration, goal_key, check_keys, writer=None, policy=None, desc="evaluate", seed=None,
                 exclude_keys=(), verify_step_count=False):
        self.world, self.env = world, world.env
        self.seed = seed
        self.policy = world.policy if policy is None else policy
        self.n = n = world.num_envs
        self.device = world.device
        self.plans = plans
        self.mode, self.max_steps = reset_mode, max_steps
        self.success_fn, self.video, self.writer = success_fn, video, writer
        self.goal_key, self.check_keys = goal_key, list(check_keys)
        self.pool = world.pool
        # False for a VectorEnv pool: every row is stepped, idle rows' outputs are ignored (see World.can_freeze_rows)
        self.freeze = world.can_freeze_rows
        self.last_frames: np.ndarray | None = None  # grid video of a VectorEnv pool: idle rows keep their last frame
        self.exploration = None if exploration is None else _EXPLORATION[exploration]
        self.queues = [deque() for _ in range(n)]
        for plan in plans:
            self.queues[plan.env].append(plan)
        self.current: list[EpisodePlan | None] = [None] * n
        self.active = np.zeros(n, dtype=bool)
        self.is_init = np.zeros(n, dtype=bool)
        self.t = np.zeros(n, dtype=np.int64)
        self.ret = np.zeros(n, dtype=np.float64)
        self.first_success = np.full(n, -1, dtype=np.int64)
        e = len(plans)
        self.success_key = None if success_fn is not None else world._success_key()
        self.has_success = success_fn is not None or self.success_key is not None
        self.r_return = np.zeros(e)
        self.r_length = np.zeros(e, dtype=np.int64)
        self.r_success = np.zeros(e, dtype=bool)
        self.r_steps_to_success = np.full(e, np.nan)
        self.r_terminated = np.zeros(e, dtype=bool)
        self.r_truncated = np.zeros(e, dtype=bool)
        self.r_seed = np.full(e, -1, dtype=np.int64)
        self.r_env = np.asarray([p.env for p in plans], dtype=np.int64)
        self.r_start_success = np.zeros(e, dtype=bool)
        self.start_success_known = False
        self.seed_known = True
        self.env_steps = 0
        self.done_episodes = 0
        self.goals: TensorDictBase | None = None
        self.recorder = None
        self.verify_step_count = verify_step_count  # the env's own "step_count", which World's replaces
        self.verify_is_init = _env_is_init(world.env) == "flag"  # the env's own "is_init", which World's replaces
        if writer is not None:
            self.recorder = _EpisodeBuffer(n, max_steps)
            self.episode_ids = torch.zeros(n, dtype=torch.int64)
        self.progress = _watched() if progress is None else progress
        self.desc = desc
        self.exclude_keys = [*exclude_keys, *[("next", *k) for k in exclude_keys]]
        self._exclude_unchecked = list(exclude_keys)  # checked against the first recorded step
        self.wall_time = 0.0

    def _check_excluded(self, td: TensorDictBase) -> None:
        """An excluded key must be one the steps have (a typo would silently store everything)."""
        keys = {(k,) if isinstance(k, str) else tuple(k) for k in td.keys(True)}
        missing = [k for k in self._exclude_unchecked if k not in keys and ("next", *k) not in keys]
        self._exclude_unchecked = []
        if missing:
            shown = sorted(".".join(k) for k in keys if k[0] != "next" and not k[-1].startswith("_"))
            raise ValueError(
                f"collect: exclude_keys {[k[0] if len(k) == 1 else k for k in missing]} are not keys of the "
                f"recorded steps (keys: {shown}); nothing was collected"
            )

    @staticmethod
    def check_arguments(world: World, plans, exploration, policy, progress, desc: str) -> None:
        """Raise on a run's bad arguments. Callers run it before creating anything (a dataset
        directory, videos) and before building the run."""
        check_bool(progress, f"{desc}: progress", allow_none=True)  # "no" would draw the bar
        if exploration is not None and exploration not in _EXPLORATION:
            raise ValueError(f"exploration: expected one of {sorted(_EXPLORATION)} or None, got {exploration!r}")
        if any(p.options for p in plans) and world.pool is None:
            raise TypeError("reset options need an EnvPool (other TorchRL envs take no per-env options)")
        if policy is not None:
            _check_policy(policy, "policy")
        if _env_is_init(world.env) == "other":
            raise ValueError(
                "World: the env has an observation 'is_init', which World sets at every step (True on an "
                "episode's first step) for the policy and the dataset, and would overwrite; rename it (e.g. "
                "torchrl.envs.RenameTransform) before evaluating or collecting"
            )

    # -- policy and env calls -------------------------------------------------------------------------
    def _act(self, td: TensorDictBase) -> TensorDictBase:
        ctx = set_exploration_type(self.exploration) if self.exploration is not None else nullcontext()
        with ctx, torch.no_grad():
            try:
                out = self.policy(td)
            except Exception as err:  # say whose error it is: the traceback's last frames are the policy's own
                note = (f"raised by the policy {_callable_name(self.policy)}, called with the step's tensordict "
                        "(a TorchRL policy reads its observation keys and writes 'action')")
                if note not in getattr(err, "__notes__", ()):  # a policy may raise one error object again
                    add_note(err, note)
                raise
        if out is not None and out is not td:
            if not isinstance(out, TensorDictBase):
                raise TypeError(
                    f"policy returned {type(out).__name__}; a TorchRL policy writes 'action' into the tensordict "
                    "and returns it (or None)"
                )
            td.update(out)
        if "action" not in td.keys():
            raise KeyError("the policy did not write an 'action' entry into the tensordict")
        return td

    def _start(self, rows: list[int], td: TensorDictBase | None, fill: Sequence[int] = ()) -> TensorDictBase:
        """Start the next planned episode of each env in ``rows`` (a masked reset).

        ``fill``: idle rows reset in the same call without an episode (an env
        that cannot freeze rows steps them all the same, so they need a state).
        """
        plans = [self.queues[i].popleft() for i in rows]
        seeds = {i: plan.seed for i, plan in zip(rows, plans)}
        options = {i: plan.options for i, plan in zip(rows, plans) if plan.options}
        for i in fill:
            seeds[i] = self._fill_seed(i)
            if options:  # a VectorEnv takes one options dict for every row it resets; idle rows run no episode
                options[i] = next(iter(options.values()))
        td = self._reset_rows(seeds, options, td)
        self._begin(rows, plans, td)
        self.is_init[list(fill)] = True
        return td

    def _fill_seed(self, i: int) -> int:
        # deterministic, and past the generated plan's seeds (seed .. seed + E - 1)
        return (self.seed or 0) + len(self.plans) + i

    def _refill(self, rows: list[int], td: TensorDictBase) -> TensorDictBase:
        """Reset idle rows that finished, outside any episode: never counted, recorded or shown."""
        td = self._reset_rows({i: self._fill_seed(i) for i in rows}, {}, td)
        self.is_init[rows] = True
        return td

    def _reset_rows(self, seeds: dict, options: dict, td: TensorDictBase | None) -> TensorDictBase:
        """Reset the rows in ``seeds`` (``{row: seed}``, with ``{row: reset options}``); the others keep their state."""
        n = self.n
        kwargs = {}
        flags = np.zeros(n, dtype=bool)
        flags[list(seeds)] = True
        # one RNG for the batch (a natively batched env): seeding some rows would reseed every row's stream, with
        # an idle row's same seed again and again; it is seeded only when every row restarts (the run's first reset,
        # a wait-mode round with an episode for every row: the vector pool passes the first row's seed) and the other
        # resets continue the stream, as the pool's rollout does (their episodes' seeds are then the stream's, as it
        # reports them), and a SAME_STEP one without a masked reset keeps the resets it made itself
        seeded = self.pool is not None and (self.pool.per_env_seeds or flags.all() or td is None)
        if seeded:
            seed_array = np.zeros(n, dtype=np.int64)
            for i, seed in seeds.items():
                seed_array[i] = seed
            kwargs["seed"] = seed_array
        if self.pool is not None and options:
            per_env = [None] * n
            for i, option in options.items():
                per_env[i] = option
            kwargs["options"] = per_env
        # every episode here gets its own seed: the pool's schedules, which a list of seeds can make overlap, never
        # pick one, so its warning about that does not apply (a filter would re-show the env's own warnings)
        quiet = self.pool is not None and seeded
        if quiet:
            self.pool._seeds_given_per_episode = True
        try:
            if flags.all() and td is None:
                td = self.env.reset(**kwargs)
            else:  # with the carried root: a full reset keeps its entries, as TorchRL's maybe_reset does
                if td is None:  # first reset: only the rows that have an episode
                    td = self.env.full_done_spec.zero()
                td.set("_reset", _as_mask(flags, self.device))
                td = self.env.reset(td, **kwargs)
        finally:
            if quiet:
                self.pool._seeds_given_per_episode = False
        td.pop("_reset", None)
        return td

    def _begin(self, rows, plans, td):
        episode_seed = td.get("episode_seed", None)
        start_flag = start_known = None
        if self.success_key is not None and td.get(self.success_key, None) is not None:
            start_flag = td.get(self.success_key).reshape(self.n, -1).any(-1).cpu().numpy()
            # a reset info without the key (its presence mask False) is no signal: 0 there is a fill value
            key = self.success_key
            present = td.get(("info_mask", *key[1:]), None) if key[0] == "info" else None
            start_known = (np.ones(self.n, dtype=bool) if present is None
                           else present.reshape(self.n, -1).any(-1).cpu().numpy())
        pixels = td.get("pixels", None) if self.video is not None else None
        pixels = pixels.cpu().numpy() if pixels is not None else None
        for i, plan in zip(rows, plans):
            self.current[i] = plan
            self.active[i] = True
            self.is_init[i] = True
            self.t[i] = 0
            self.ret[i] = 0.0
            self.first_success[i] = -1
            if episode_seed is not None:
                self.r_seed[plan.index] = int(episode_seed[i].reshape(-1)[0])
            elif plan.seed is not None and self.pool is not None:
                self.r_seed[plan.index] = plan.seed
            else:
                self.seed_known = False
            if start_flag is not None and start_known[i]:
                self.r_start_success[plan.index] = bool(start_flag[i])
                self.start_success_known = True
            if plan.goal is not None:
                goal = plan.goal.to(self.device) if self.device is not None else plan.goal
                if self.goals is None:
                    self.goals = goal.expand(self.n).clone().zero_()
                self.goals[i] = goal
            if plan.start is not None and self.check_keys:
                self._check_start(i, plan, td)
            if self.recorder is not None:
                self.episode_ids[i] = plan.index
            if pixels is not None:
                goal_px = None
                if plan.goal is not None and "pixels" in plan.goal.keys():
                    goal_px = plan.goal.get("pixels").cpu().numpy()
                self.video.start_episode(i, plan.index, pixels[i], goal_px)

    def _check_start(self, i, plan, td):
        for check_key in self.check_keys:
            want = plan.start.get(check_key, None)
            got = td.get(check_key, None)
            if want is None or got is None:
                raise KeyError(f"check_start: key {check_key} is missing from the dataset or the env's reset output")
            got = got[i].cpu()
            if isinstance(want, TensorDictBase) and isinstance(got, TensorDictBase):  # a nested Dict observation
                prefix = _as_tuple(unravel_key(check_key))
                for key in want.keys(True, True):
                    path, leaf = (*prefix, *_as_tuple(key)), got.get(key, None)
                    if leaf is None or isinstance(leaf, TensorDictBase):
                        raise KeyError(f"check_start: {path} is missing from the env's reset output "
                                       f"(its leaves: {list(got.keys(True, True))})")
                    self._check_start_leaf(i, plan, path, leaf, want.get(key))
            elif isinstance(want, TensorDictBase) or isinstance(got, TensorDictBase):
                raise TypeError(
                    f"check_start: {check_key} is a nested entry in the "
                    f"{'dataset' if isinstance(want, TensorDictBase) else 'env'} only; name leaves to compare"
                )
            else:
                self._check_start_leaf(i, plan, check_key, got, want)

    @staticmethod
    def _check_start_leaf(i, plan, key, got, want):
        if got.shape != want.shape or not torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-5):
            diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
            raise RuntimeError(
                f"env {i} did not start from the dataset state for episode {plan.index}: {key} is "
                f"{got.tolist()} after reset, the dataset has {want.tolist()} (max diff {diff}). The env's "
                "state hook (reset_options_from_dataset / reset(options=...)) does not restore this key."
            )

    # -- the loop --------------------------------------------------------------------------------------------
    @torch.no_grad()  # as TorchRL's collectors: no graph from a differentiable model or a learned transform
    def run(self) -> None:
        from tqdm.auto import tqdm

        total = len(self.plans)
        bar = tqdm(total=total, desc=self.desc, unit="ep", disable=not self.progress or total == 0,
                   dynamic_ncols=True, leave=False)
        self.bar = bar
        start = time.perf_counter()
        try:
            td = None
            if self.pool is None and self.seed is not None and self.plans:
                self.env.set_seed(self.seed)  # no per-episode seeds without a pool: seed the env once
            rows = [i for i in range(self.n) if self.queues[i]]
            if rows:
                # an env that cannot freeze rows steps the idle ones too: give them a state first
                fill = [] if self.freeze else [i for i in range(self.n) if not self.queues[i]]
                td = self._start(rows, None, fill)
                self._grid(td, self.active)
            while True:
                if not self.active.any():
                    rows = [i for i in range(self.n) if self.queues[i]]
                    if not rows:
                        break
                    td = self._start(rows, td)  # wait mode: the next round
                    self._grid(td, self.active)
                    continue
                td = self._step(td)
        finally:
            self.wall_time = time.perf_counter() - start
            bar.close()

    def _grid(self, td, active):
        if self.video is not None and self.video.layout == "grid":
            self._grid_frame(td.get("pixels").cpu().numpy(), active)

    def _grid_frame(self, pixels: np.ndarray, active: np.ndarray) -> None:
        if not self.freeze:  # idle rows of a VectorEnv pool were stepped too: show their last frame
            if self.last_frames is None:
                self.last_frames = pixels.copy()
            else:
                self.last_frames[active] = pixels[active]
            pixels = self.last_frames
        self.video.grid_frame(pixels, active)

    def _step(self, td: TensorDictBase) -> TensorDictBase:
        n, active = self.n, self.active
        if self.verify_is_init:
            self._check_is_init(td, np.flatnonzero(active), self.is_init, self.t)
        td.set("is_init", _as_mask(self.is_init, self.device))
        if self.goals is not None:
            # a copy per step: a policy that edits the goal in place must not change later steps' goals
            td.set(self.goal_key, self.goals.clone())
        td = self._act(td)
        stepped = active.copy()  # the rows whose episode advances (all rows are stepped without self.freeze)
        if self.freeze and not stepped.all():
            td.set("_step", _as_mask(stepped, self.device))
        else:
            td.pop("_step", None)
        td = self.env.step(td)
        td.pop("_step", None)
        nxt = td.get("next")
        rows = np.flatnonzero(stepped)
        self.env_steps += len(rows) if self.freeze else n
        if self.verify_is_init:  # an observation after a step is no episode's first: the flag is False there
            self._check_is_init(nxt, rows, np.zeros(n, dtype=bool), self.t + 1)

        reward = nxt.get("reward").reshape(n, -1).sum(-1).double().cpu().numpy()
        done = nxt.get("done").reshape(n, -1).any(-1).cpu().numpy()
        terminated = nxt.get("terminated", None)
        terminated = done if terminated is None else terminated.reshape(n, -1).any(-1).cpu().numpy()
        truncated = nxt.get("truncated", None)  # an env may report both flags (terminated at its time limit)
        truncated = done & ~terminated if truncated is None else truncated.reshape(n, -1).any(-1).cpu().numpy()
        success = self._success(td)
        t_before = self.t.copy()
        self.t[rows] += 1
        self.ret[rows] += reward[rows]
        if success is not None:
            newly = stepped & success & (self.first_success < 0)
            self.first_success[newly] = self.t[newly]
        limit = np.zeros(n, dtype=bool) if self.max_steps is None else self.t >= self.max_steps
        finished = stepped & (done | limit)
        cut = stepped & limit  # World's step limit: truncated, as gymnasium's TimeLimit, even on a terminal step
        if cut.any():
            mask = _as_mask(cut, self.device)
            for key in ("truncated", "done"):  # an env without a "truncated" flag records the cut as done
                flag = nxt.get(key, None)
                if flag is not None:
                    nxt.set(key, flag | mask.view_as(flag))

        # TorchRL's step_mdp, then its post-step_mdp hooks (which may drop transient keys from the step's data before
        # it is recorded, as rollout and the collectors record it): "next" becomes the root (observations, done
        # flags, transform and primed recurrent states) and the root's own entries carry over (the action, a
        # policy's state at the root: an OU noise process's)
        root = self.env._step_mdp(td)
        if self.env._post_step_mdp_hooks is not None:
            td, root = self.env._post_step_mdp_hooks(td, root)
            nxt = td.get("next")
        if self.recorder is not None:
            # a dataset holds the whole done triplet: an env without "terminated" or "truncated" gets them here
            # (its done is its termination; World's cut is the truncation), False at the root as every root flag
            # (without the keys: terminated is the env's done, truncated World's cut or a done that is no termination)
            for key, flags in (("terminated", terminated), ("truncated", cut | truncated)):
                if nxt.get(key, None) is None:
                    nxt.set(key, _as_mask(flags & stepped, self.device))
                    td.set(key, _as_mask(np.zeros(n, dtype=bool), self.device))
            if self.verify_step_count:
                self._check_step_count(nxt, rows)
            td.set("episode", self.episode_ids.to(self.device))
            td.set("step_count", torch.as_tensor(t_before).view(n, 1).to(self.device))
            nxt.set("step_count", torch.as_tensor(self.t).view(n, 1).to(self.device))
            if self._exclude_unchecked:
                self._check_excluded(td)
            # the goals this run injected are not the env's: an env's own "goal" observation is recorded
            injected = () if self.goals is None else (self.goal_key,)
            record = td.exclude(*[k for k in td.keys() if k.startswith("_")], *injected, *self.exclude_keys)
            self.recorder.write(record, rows, t_before[rows])
        if self.video is not None:
            pixels = nxt.get("pixels").cpu().numpy()
            if self.video.layout == "grid":
                self._grid_frame(pixels, stepped)
            else:
                for i in rows:
                    self.video.add_frame(int(i), pixels[i])

        self.is_init[:] = False
        for i in np.flatnonzero(finished):
            self._finish(int(i), bool(terminated[i]), bool(cut[i] or truncated[i]))
        restart = [int(i) for i in np.flatnonzero(finished) if self.queues[i]] if self.mode == "auto" else []
        if not self.freeze:
            # every row is stepped again: the env's done rows that start no episode now need a reset
            # (an idle row that finished, a row whose last episode ended, wait mode's finished rows);
            # a separate reset, so that a natively batched env seeds the restarted rows with their own seeds
            fill = [int(i) for i in np.flatnonzero(done) if int(i) not in restart]
            if fill and not self.active.any() and not restart:
                fill = [i for i in fill if not self.queues[i]]  # wait mode: the next round resets the others
            if fill and (self.active.any() or restart or any(self.queues)):
                root = self._refill(fill, root)
        if restart:
            root = self._start(restart, root)
        return root

    def _check_step_count(self, nxt, rows: np.ndarray) -> None:
        """The env's own ``"step_count"`` (a StepCounter's, also one inside a SerialEnv's envs) must be World's
        count on the rows recorded: World writes its count there, which must not change the data.
        The step's ``"next"`` is checked (the root one is the previous step's, and a SerialEnv may have
        updated the caller's root in place)."""
        found = self._first_difference(nxt, "step_count", rows, self.t)
        if found is not None:
            j, got, expected = found
            raise ValueError(
                f"World.collect: the env's own 'step_count' of env {j} reads {got.item()!r} after "
                f"step {int(expected)} of its episode; World writes its count in every dataset row under "
                "'step_count', so it would replace a value that is not a step count of the env's steps (a "
                "StepCounter that a FrameSkip repeats counts frames: place it after the FrameSkip). Rename it (e.g. "
                "torchrl.envs.RenameTransform) before collecting"
            )

    def _first_difference(self, td, key: str, rows: np.ndarray, expected: np.ndarray):
        """``(env, value, expected)`` of the first of ``rows`` whose env's own ``td[key]`` (one value per env)
        differs from ``expected``; ``None`` when none does, or the env has no such key."""
        value = td.get(key, None)
        if value is None:
            return None
        got = value.reshape(self.n, -1)[:, 0].cpu().numpy()[rows]
        differs = np.flatnonzero(got != expected[rows])
        if not differs.size:
            return None
        j = int(rows[differs[0]])
        return j, got[differs[0]], expected[j]

    def _check_is_init(self, td, rows: np.ndarray, flags: np.ndarray, steps: np.ndarray) -> None:
        """The env's own bool ``"is_init"`` (an InitTracker World cannot see, inside a SerialEnv's envs) must be
        World's flag (``flags``, at ``steps``) on ``rows``: at the root World writes its flag over it, which must
        not change what the policy and the dataset see, and under ``"next"`` it is recorded as it is."""
        found = self._first_difference(td, "is_init", rows, flags)
        if found is not None:
            j, got, _ = found
            raise ValueError(
                f"World: the env's own 'is_init' of env {j} reads {bool(got)} at step {int(steps[j])} of its "
                "episode; World sets 'is_init' at every step (True on an episode's first step) for the policy and "
                "the dataset, so it would replace a value that is not that flag. "
                "Rename it (e.g. torchrl.envs.RenameTransform) before evaluating or collecting"
            )

    def _success(self, td) -> np.ndarray | None:
        if self.success_fn is not None:
            returned = self.success_fn(td)
            try:
                flag = torch.as_tensor(returned)
            except (TypeError, RuntimeError, ValueError):  # None, a string, a ragged list...
                flag = None
            if flag is None or flag.dtype is not torch.bool:
                raise TypeError(
                    f"success_fn must return a bool tensor of shape ({self.n},) or ({self.n}, 1), got "
                    f"{describe(returned) if flag is None else flag.dtype}"
                )
            if flag.numel() != self.n:
                raise ValueError(
                    f"success_fn must return {self.n} flags (shape ({self.n},) or ({self.n}, 1)), "
                    f"got {tuple(flag.shape)}"
                )
            return flag.reshape(self.n).cpu().numpy()
        if self.success_key is None:
            return None
        return td.get(("next", *self.success_key)).reshape(self.n, -1).any(-1).cpu().numpy()

    def _finish(self, i: int, terminated: bool, truncated: bool) -> None:
        plan = self.current[i]
        j = plan.index
        self.r_return[j] = self.ret[i]
        self.r_length[j] = self.t[i]
        self.r_terminated[j] = terminated
        self.r_truncated[j] = truncated
        if self.first_success[i] >= 0:
            self.r_success[j] = True
            self.r_steps_to_success[j] = float(self.first_success[i])
        if self.recorder is not None:
            self.writer.add(self.recorder.episode(i, int(self.t[i])))
        if self.video is not None:
            self.video.end_episode(i)
        self.current[i] = None
        self.active[i] = False
        self.done_episodes += 1
        if self.has_success and (self.done_episodes % 8 == 0 or self.done_episodes == len(self.plans)):
            self.bar.set_postfix(success=f"{self.r_success.sum()}/{self.done_episodes}", refresh=False)
        self.bar.update(1)  # after the postfix: the bar's last frame shows the final count

    # -- results ------------------------------------------------------------------------------------------------
    def result(self, seed: int, extra: dict) -> EvalResult:
        e = len(self.plans)
        successes = self.r_success if self.has_success else None
        k = int(self.r_success.sum())
        data = {
            "success_rate": (k / e if e else float("nan")) if self.has_success else None,
            "success_ci": _wilson(k, e) if self.has_success else None,
            "episode_successes": successes,
            "episode_returns": self.r_return,
            "episode_lengths": self.r_length,
            "steps_to_success": self.r_steps_to_success if self.has_success else None,
            "seeds": self.r_seed if self.seed_known else None,
            "episode_terminated": self.r_terminated,
            "episode_truncated": self.r_truncated,
            "env_indices": self.r_env,
            "start_successes": self.r_start_success if self.start_success_known else None,
            "num_episodes": e,
            "num_envs": self.n,
            "reset_mode": self.mode,
            "seed": seed,
            "max_steps": self.world._effective_limit(self.max_steps),
            "env_steps": self.env_steps,
            "wall_time": self.wall_time,
            "success_source": (
                "success_fn" if self.success_fn is not None
                else None if self.success_key is None else "/".join(self.success_key)
            ),
            **extra,
        }
        return EvalResult(data)
