"""``gymnasium.make`` / ``gymnasium.make_vec`` for TorchRL env factories.

:func:`register_gymnasium_env` registers an id with two entry points:

* ``entry_point`` (``gymnasium.make(id)``, and ``make_vec`` in ``"sync"``/``"async"``
  mode): one :class:`~.gymnasium_env.TorchRLGymEnv`. A batched factory is built
  with ``num_envs=1`` and its batch dim is dropped.
* ``vector_entry_point`` (batched factories only; ``gymnasium.make_vec(id,
  num_envs=N)`` picks it by default): **one** batched TorchRL env of ``N``
  exported as a :class:`~.vector_env.TorchRLVectorEnv`, not ``N`` copies.
  ``max_episode_steps`` becomes TorchRL's ``StepCounter`` truncation there,
  since gymnasium's ``TimeLimit`` wraps single envs only.

Seeding follows gymnasium's convention in both: ``reset(seed=s)`` seeds once and
later episodes continue the env's random stream. A batched factory that takes a
``seed_every_episode`` parameter (``EnvPool`` itself, a ``functools.partial`` of
it, or a function naming the parameter) gets ``seed_every_episode=False`` unless
the registration's or ``make``'s keyword arguments set it. Without that, an
``EnvPool`` of one env (``gymnasium.make``) would reseed its ``k``-th episode with
``s + k``, and ``make_vec(..., vectorization_mode="sync")`` over such envs would
replay the episodes of one env in the next one. A factory that builds an
``EnvPool`` reseeding every episode without taking the parameter gets a warning.

Both entry points are picklable objects (``make_vec(..., vectorization_mode="async")``
sends them to worker processes) when the factory is.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable

import gymnasium as gym

from ..errors import check_bool

__all__ = ["register_gymnasium_env"]


def _takes_num_envs(factory) -> bool:
    """Whether ``factory`` (a function, a class, or a ``functools.partial`` of either) has ``num_envs``."""
    while isinstance(factory, functools.partial):
        if "num_envs" in factory.keywords:
            return False  # already bound: the factory builds a fixed batch
        factory = factory.func
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return "num_envs" in params


def _parameter(factory, name: str) -> str:
    """How ``factory`` takes keyword ``name``: ``"bound"`` (a ``functools.partial`` sets it),
    ``"named"`` (a parameter of that name) or ``"absent"`` (``**kwargs`` does not count)."""
    while isinstance(factory, functools.partial):
        if name in factory.keywords:
            return "bound"
        factory = factory.func
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        param = inspect.signature(target).parameters.get(name)
    except (TypeError, ValueError):
        return "absent"
    if param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
        return "named"
    return "absent"


def _build_batched(factory, num_envs: int, kwargs: dict):
    """``factory(num_envs=..., **kwargs)`` with gymnasium's seeding convention (see the module docstring)."""
    how = _parameter(factory, "seed_every_episode")
    explicit = "seed_every_episode" in kwargs or how == "bound"
    if not explicit and how == "named":
        kwargs = {**kwargs, "seed_every_episode": False}
    env = factory(num_envs=num_envs, **kwargs)
    if not explicit and how != "named":
        from ._core import traits

        pool = traits(env).pool
        if pool is not None and getattr(pool, "seed_every_episode", False):
            warnings.warn(
                f"register_gymnasium_env: the factory {factory!r} built an EnvPool that reseeds every episode "
                "(seed_every_episode=True) and takes no seed_every_episode parameter, so gymnasium.make/make_vec "
                "cannot give it gymnasium's seeding (seed once, then continue the stream): with "
                "vectorization_mode='sync'/'async' one env's episodes repeat in the next. Give the factory a "
                "seed_every_episode parameter, or pass seed_every_episode=False to EnvPool yourself.",
                stacklevel=3,
            )
    return env


def _check_render_mode(export, requested, factory):
    """Warn, as ``gymnasium.make`` does for a render mode the env does not list, when the export cannot render
    in the mode the factory was given (``render()`` reaches only an ``EnvPool``'s sub-envs); returns ``export``."""
    if requested is not None and export.render_mode != requested:
        if export.traits.pool is None:
            why = (f"the env it built ({type(export.env).__name__}) is not an EnvPool, and render() reaches only "
                   "an EnvPool's sub-envs")
            fix = ("build an EnvPool in the factory (EnvPool(..., render_mode=render_mode)), or read the frames "
                   "from the observations (e.g. TorchRL's from_pixels=True)")
        else:
            why = f"the EnvPool it built has render_mode={export.render_mode!r}"
            fix = "pass the factory's render_mode on to EnvPool(..., render_mode=render_mode)"
        warnings.warn(
            f"register_gymnasium_env: gymnasium passed render_mode={requested!r} to the factory {factory!r}, but "
            f"{why}, so the exported env has render_mode={export.render_mode!r}: {fix}",
            stacklevel=3,
        )
    return export


class _SingleEntryPoint:
    def __init__(self, factory, batched, export_kwargs):
        self.factory, self.batched, self.export_kwargs = factory, batched, export_kwargs

    def __call__(self, **kwargs):
        from .gymnasium_env import TorchRLGymEnv

        num_envs = kwargs.pop("num_envs", 1)  # gymnasium.make builds one env
        if num_envs != 1:
            raise TypeError(
                f"gymnasium.make builds one env, got num_envs={num_envs!r}; use gymnasium.make_vec(id, "
                f"num_envs={num_envs!r}) for a vector env"
            )
        if self.batched:
            env = _build_batched(self.factory, 1, kwargs)
            export = TorchRLGymEnv(env, squeeze_batch=True, **_single_kwargs(self.export_kwargs))
            return _check_render_mode(export, kwargs.get("render_mode"), self.factory)
        env = self.factory(**kwargs)
        batch = tuple(getattr(env, "batch_size", ()))
        if batch:
            env.close()
            raise TypeError(
                f"gymnasium.make: the registered factory {self.factory!r} built an env with batch_size {list(batch)} "
                "and takes no num_envs= (a num_envs bound in a functools.partial?), so it cannot build the one "
                "env gymnasium.make asks for: register a factory that takes num_envs= (e.g. "
                "functools.partial(EnvPool, 'CartPole-v1')), or one that builds an unbatched env"
            )
        export = TorchRLGymEnv(env, **_single_kwargs(self.export_kwargs))
        return _check_render_mode(export, kwargs.get("render_mode"), self.factory)


class _VectorEntryPoint:
    def __init__(self, factory, export_kwargs):
        self.factory, self.export_kwargs = factory, export_kwargs

    def __call__(self, num_envs: int, max_episode_steps: int | None = None, autoreset_mode=None, **kwargs):
        from ._core import autoreset_mode as _mode
        from .vector_env import TorchRLVectorEnv

        export_kwargs = dict(self.export_kwargs)
        if autoreset_mode is not None:  # make_vec(id, N, autoreset_mode=...): the export's mode, not the factory's
            export_kwargs["autoreset_mode"] = _mode(autoreset_mode)  # a bad mode fails before envs are built
        env = _build_batched(self.factory, num_envs, kwargs)
        if max_episode_steps is not None:  # the export leaves its "step_count" out of the observation
            from torchrl.envs import StepCounter, TransformedEnv

            env = TransformedEnv(env, StepCounter(max_steps=int(max_episode_steps)))
        return _check_render_mode(TorchRLVectorEnv(env, **export_kwargs), kwargs.get("render_mode"), self.factory)


def _single_kwargs(export_kwargs: dict) -> dict:
    return {k: v for k, v in export_kwargs.items() if k != "autoreset_mode"}


def register_gymnasium_env(
    id: str,
    env_factory: Callable,
    *,
    batched: bool | None = None,
    autoreset_mode="next_step",
    numpy: bool = True,
    observation_keys=None,
    info_keys=None,
    max_episode_steps: int | None = None,
    reward_threshold: float | None = None,
    nondeterministic: bool = False,
    kwargs: dict | None = None,
    **register_kwargs,
) -> gym.envs.registration.EnvSpec:
    """Register a TorchRL env factory with gymnasium.

    Args:
        id: the gymnasium id, e.g. ``"TorchRLSWM/CartPolePool-v0"``.
        env_factory: a callable returning a TorchRL env. Unbatched factories
            return ``batch_size == []``; batched ones take ``num_envs`` and return
            ``batch_size == [num_envs]``. Extra ``gymnasium.make`` keyword
            arguments (and ``kwargs``) are passed to it. A batched factory with a
            ``seed_every_episode`` parameter gets ``seed_every_episode=False``
            (gymnasium's seeding) unless those arguments set it.

    Keyword Args:
        batched: whether the factory is batched; by default, whether it has a
            ``num_envs`` parameter.
        autoreset_mode: the vector env's mode (``make_vec`` with a batched factory);
            ``gym.make_vec(id, N, autoreset_mode=...)`` picks another for that vector env
            (gymnasium passes a vector entry point's arguments as keyword arguments, not
            ``vector_kwargs``).
        numpy, observation_keys, info_keys: as :func:`torchrl_swm.to_gymnasium`.
        max_episode_steps, reward_threshold, nondeterministic: gymnasium's spec fields.
        kwargs: default keyword arguments for the factory.
        **register_kwargs: other arguments of ``gymnasium.register``
            (``order_enforce``, ``disable_env_checker``...).

    Returns:
        the registered ``EnvSpec``.

    Examples:
        >>> import functools, gymnasium as gym
        >>> from torchrl_swm import EnvPool, register_gymnasium_env
        >>> register_gymnasium_env("TorchRLSWM/CartPolePool-v0", functools.partial(EnvPool, "CartPole-v1"))
        EnvSpec(...)
        >>> envs = gym.make_vec("TorchRLSWM/CartPolePool-v0", num_envs=16)  # one EnvPool of 16
        >>> env = gym.make("TorchRLSWM/CartPolePool-v0")  # one env
    """
    if not callable(env_factory):
        raise TypeError(f"register_gymnasium_env: env_factory must be callable, got {type(env_factory).__name__}")
    check_bool(numpy, "register_gymnasium_env: numpy")  # here, not at the first make
    if batched is None:
        batched = _takes_num_envs(env_factory)
    batched = check_bool(batched, "register_gymnasium_env: batched")
    export_kwargs = {"numpy": numpy, "observation_keys": observation_keys, "info_keys": info_keys,
                     "autoreset_mode": autoreset_mode}
    from ._core import autoreset_mode as _mode

    _mode(autoreset_mode)  # fail now on a bad mode, not at make_vec time
    gym.register(
        id,
        entry_point=_SingleEntryPoint(env_factory, batched, export_kwargs),
        vector_entry_point=_VectorEntryPoint(env_factory, export_kwargs) if batched else None,
        max_episode_steps=max_episode_steps,
        reward_threshold=reward_threshold,
        nondeterministic=nondeterministic,
        kwargs=dict(kwargs or {}),
        **register_kwargs,
    )
    return gym.spec(id)
