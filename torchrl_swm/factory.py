"""One factory for every environment the package builds: ``make_env(target, backend="auto", **kwargs)``.

Built-in backends (names and aliases are case-insensitive, surrounding whitespace is ignored, and
``_``, ``-`` and inner spaces are the same: ``" World_Model "`` is ``world-model``):

===============  ===================  =========================================================
backend          aliases              builds
===============  ===================  =========================================================
``gym``          ``gymnasium``        :class:`~torchrl_swm.EnvPool` ``(target, num_envs=, ...)``
``world-model``  ``model``, ``wm``    :func:`~torchrl_swm.make_world_model_env` ``(target, ...)``
===============  ===================  =========================================================

``backend="auto"`` picks by the target's type: any target given with ``transition_fn=``, a
``torch.nn.Module`` or an object with a transition method (``env_step``, ``step``, ``predict_step``,
``predict``, ``imagine_step``, ``transition``) -> ``world-model``; a string (a gymnasium id), a
sequence of env factories, or a ``gymnasium.vector.VectorEnv`` (pooled as it is) -> ``gym``; any
other callable -> ``world-model`` when given a keyword only ``make_world_model_env`` takes
(``observation_space=``, ``initial_state=``...), else ``gym`` when it takes no argument (one env
factory; a class is never read as one). :func:`register_backend` adds backends that
``make_env`` really uses. Errors list the available backends; the backend's own errors
propagate unchanged (they are never swallowed or re-labelled).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

__all__ = ["make_env", "register_backend", "list_backends", "backend_aliases", "unregister_backend"]

_LOCK = threading.Lock()
_FACTORIES: dict[str, Callable] = {}
_ALIASES: dict[str, str] = {}  # normalized alias or name -> canonical name
_DISPLAY: dict[str, list[str]] = {}  # canonical name -> aliases as registered (for messages)


def _normalize(name: str, what: str = "backend") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what}: expected a string, got {type(name).__name__} {name!r}")
    return "-".join(name.lower().replace("_", " ").replace("-", " ").split())


def register_backend(name: str, factory: Callable, aliases: Iterable[str] = ()) -> None:
    """Register ``factory(target, **kwargs)`` as backend ``name`` (with ``aliases``) for :func:`make_env`.

    Re-registering an existing name replaces its factory and aliases. Names are normalized
    (case, whitespace, ``_`` vs ``-``); an alias that normalizes to the name or to an earlier alias
    adds nothing and is not listed.

    Raises:
        TypeError: ``factory`` is not callable, or the name or an alias is not a string.
        ValueError: the name is ``"auto"`` or empty, or an alias already names another backend.

    Example:
        >>> import gymnasium as gym
        >>> from torchrl_swm import EnvPool, make_env, register_backend, unregister_backend
        >>> from torchrl_swm import backend_aliases, list_backends
        >>> def noisy_cartpole(target, num_envs=1, **kwargs):         # any callable returning a TorchRL env
        ...     make = lambda: gym.wrappers.TransformObservation(gym.make(target), lambda o: o + 0.01, None)
        ...     return EnvPool([make] * num_envs, **kwargs)
        >>> register_backend("noisy", noisy_cartpole, aliases=["Noisy CartPole"])
        >>> list_backends(), backend_aliases()["noisy"]
        (['gym', 'noisy', 'world-model'], ['Noisy CartPole'])
        >>> env = make_env("CartPole-v1", backend="noisy_cartpole", num_envs=3, seed=0)   # alias, normalized
        >>> env.batch_size, env.close(), unregister_backend("noisy")
        (torch.Size([3]), None, None)
    """
    if not callable(factory):
        raise TypeError(f"register_backend({name!r}): factory must be callable, got {type(factory).__name__}")
    canonical = _normalize(name, "register_backend: name")
    if not canonical or canonical == "auto":
        raise ValueError(f"register_backend: {name!r} is not a valid backend name (reserved or empty)")
    if aliases is None:
        aliases = ()
    elif isinstance(aliases, str):
        aliases = (aliases,)
    elif not isinstance(aliases, Iterable):
        raise TypeError(f"register_backend({name!r}): aliases: expected strings (a list or tuple), got "
                        f"{type(aliases).__name__} {aliases!r}")
    normalized, display = [], []
    for alias in aliases:
        key = _normalize(alias, f"register_backend({name!r}): alias")
        if not key or key == "auto":
            raise ValueError(f"register_backend({name!r}): {alias!r} is not a valid alias (reserved or empty)")
        if key != canonical and key not in normalized:  # "M1" beside "m1", or the name itself, adds nothing
            normalized.append(key)
            display.append(alias.strip())
    with _LOCK:
        for key in (canonical, *normalized):
            owner = _ALIASES.get(key)
            if owner is not None and owner != canonical:
                raise ValueError(
                    f"register_backend({name!r}): {key!r} already names backend {owner!r}; "
                    f"available backends: {_describe_locked()}"
                )
        for key, owner in list(_ALIASES.items()):
            if owner == canonical:
                del _ALIASES[key]
        _FACTORIES[canonical] = factory
        _DISPLAY[canonical] = display
        _ALIASES[canonical] = canonical
        for key in normalized:
            _ALIASES[key] = canonical


def unregister_backend(name: str) -> None:
    """Remove a registered backend, named by its name, and its aliases; an alias or an unknown name raises
    ValueError (an alias would otherwise take its whole backend with it)."""
    key = _normalize(name, "unregister_backend: name")
    with _LOCK:
        canonical = _ALIASES.get(key)
        if canonical is None:
            raise ValueError(f"unregister_backend: unknown backend {name!r}; available backends: {_describe_locked()}")
        if canonical != key:
            raise ValueError(
                f"unregister_backend: {name!r} is an alias of backend {canonical!r}; unregister_backend({canonical!r}) "
                f"removes the backend with its aliases, and register_backend({canonical!r}, factory, aliases=...) "
                "replaces its aliases"
            )
        for key, owner in list(_ALIASES.items()):
            if owner == canonical:
                del _ALIASES[key]
        del _FACTORIES[canonical]
        _DISPLAY.pop(canonical, None)


def list_backends() -> list[str]:
    """The canonical names of the registered backends, sorted (aliases: :func:`backend_aliases`)."""
    with _LOCK:
        return sorted(_FACTORIES)


def backend_aliases() -> dict[str, list[str]]:
    """``{backend: [aliases as registered]}`` for every registered backend."""
    with _LOCK:
        return {name: list(_DISPLAY.get(name, ())) for name in sorted(_FACTORIES)}


def _describe_locked() -> str:
    parts = []
    for name in sorted(_FACTORIES):
        aliases = _DISPLAY.get(name, ())
        parts.append(f"{name} (aliases: {', '.join(aliases)})" if aliases else name)
    return "; ".join(parts)


def _describe() -> str:
    with _LOCK:
        return _describe_locked()


def _detect(target, kwargs) -> str:
    """The backend ``auto`` picks for ``target``; raises ValueError (listing the backends) when unsure."""
    import gymnasium as gym
    import torch

    from .world_model.adapters import TRANSITION_METHODS, discover_method

    if "transition_fn" in kwargs:  # whatever the target (a name, None, a model), as the docstring promises
        return "world-model"
    if isinstance(target, (str, gym.envs.registration.EnvSpec)):
        return "gym"
    from torchrl.envs import EnvBase

    # before the world-model test: a VectorEnv is no gym.Env, and its step() matches the transition methods
    if isinstance(target, gym.vector.VectorEnv):
        return "gym"
    if isinstance(target, type) and issubclass(target, gym.Env):  # a factory, as EnvPool takes it; its step()
        return "gym"  # would otherwise read as a world model's transition
    if isinstance(target, (gym.Env, EnvBase)):
        raise ValueError(
            f"make_env: got an environment instance ({type(target).__name__}); the gym backend pools envs from a "
            "gymnasium id, a sequence of zero-argument factories or a gymnasium VectorEnv, so pass one of those "
            f"instead. Available backends: {_describe()}"
        )
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        raise ValueError(
            f"make_env: got the class {target.__name__}, an nn.Module: pass the model, an instance "
            f"({target.__name__}(...)). Available backends: {_describe()}"
        )
    if isinstance(target, torch.nn.Module) or discover_method(target, TRANSITION_METHODS)[0] is not None:
        return "world-model"
    if isinstance(target, Sequence) and target and all(callable(f) for f in target):
        return "gym"
    if _world_model_only_kwargs() & kwargs.keys():  # observation_space=, initial_state=...: a world model's
        return "world-model"
    # an env factory, as EnvPool(factory, n) takes it; not a class (an nn.Module class passed for its instance)
    if not isinstance(target, type) and _zero_argument_callable(target):
        return "gym"
    raise ValueError(
        f"make_env: backend='auto' cannot tell which backend builds a {type(target).__name__}: expected a gymnasium id "
        "(str) or EnvSpec, a sequence of env factories or a gymnasium VectorEnv (gym), or a world model (an "
        "nn.Module, an object with one of the methods "
        f"{', '.join(TRANSITION_METHODS)}, or transition_fn=...); a zero-argument env factory is pooled too. Pass "
        "backend= explicitly (backend='gym' for env factories); available backends: "
        f"{_describe()}"
    )


def _world_model_only_kwargs() -> set[str]:
    """The keyword arguments of ``make_world_model_env`` (and the ``WorldModelEnv`` it builds) that ``EnvPool``
    does not take."""
    import inspect

    import gymnasium as gym

    from .pool import EnvPool
    from .world_model import WorldModelEnv, make_world_model_env

    def named(fn) -> set[str]:
        return {p.name for p in inspect.signature(fn).parameters.values()
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    # gym.make's own (max_episode_steps=) are an env's too: not a sign of a world model
    return ((named(make_world_model_env) | named(WorldModelEnv.__init__)) - named(EnvPool.__init__) - named(gym.make)
            - {"self", "model"})


def _zero_argument_callable(target) -> bool:
    """A callable that can be called with no argument (an env factory); False when its signature is unknown."""
    import inspect

    if not callable(target):
        return False
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in signature.parameters.values())


def make_env(target, backend: str = "auto", **kwargs):
    """Build an environment for ``target`` with ``backend``.

    Args:
        target: a gymnasium id (``"CartPole-v1"``) or its ``EnvSpec``, env factories or a ``VectorEnv`` for
            ``gym``; the world model for ``world-model``; whatever a registered backend takes.
        backend: a backend name or alias (see :func:`list_backends`), or ``"auto"``; ``"serial"`` and
            ``"process"`` (unless registered) are the ``gym`` backend with ``EnvPool(backend=...)``.
        **kwargs: passed to the backend's factory (``num_envs=``, ``seed=``, ``observation_space=``...).

    Raises:
        ValueError: unknown backend, or ``auto`` cannot decide (both list the available backends).
        Any error of the backend's factory, unchanged.

    Examples:
        >>> import gymnasium as gym, torch
        >>> from torchrl_swm import make_env
        >>> pool = make_env("CartPole-v1", num_envs=8, seed=0)              # EnvPool
        >>> pool.batch_size, pool.close()
        (torch.Size([8]), None)
        >>> pool = make_env("CartPole-v1", backend="process", num_envs=8, num_workers=2)
        >>> pool.close()
        >>> def transition(state, action):                                  # a toy world model
        ...     state = torch.tanh(state + action)
        ...     done = state[:, 0] > 0.9
        ...     return state, state, state.sum(-1), done, torch.zeros_like(done), {}
        >>> env = make_env(None, backend="wm", transition_fn=transition, observation_space=gym.spaces.Box(-1, 1, (2,)),
        ...                action_space=gym.spaces.Box(-1, 1, (2,)), initial_state=torch.zeros(2), num_envs=64,
        ...                seed=0)
        >>> rollout = env.rollout(10, break_when_any_done=False)  # done rows restart, the others go on
        >>> rollout.batch_size, bool(rollout["next", "done"].any()), bool(rollout["next", "done"].all())
        (torch.Size([64, 10]), True, False)
    """
    name = _normalize(backend)
    if name == "auto":
        name = _detect(target, kwargs)
    with _LOCK:
        canonical = _ALIASES.get(name)
        if canonical is None and name in ("serial", "process"):  # EnvPool's own backend= choice
            canonical, kwargs = "gym", {**kwargs, "backend": name}
        factory = _FACTORIES.get(canonical) if canonical is not None else None
    if factory is None:
        if _normalize(backend) == "auto":  # the detected backend was unregistered
            raise ValueError(f"make_env: backend='auto' picked {name!r} for {type(target).__name__} target, but no "
                             f"{name!r} backend is registered; available backends: {_describe()}")
        raise ValueError(f"make_env: unknown backend {backend!r}; available backends: {_describe()}")
    return factory(target, **kwargs)


def _gym_backend(target, num_envs: int | None = None, **kwargs):
    import gymnasium as gym

    from .pool import EnvPool

    one_factory = callable(target) and not isinstance(target, (gym.Env, Sequence))
    if num_envs is None and (isinstance(target, (str, gym.envs.registration.EnvSpec)) or one_factory):
        num_envs = 1  # an id or one factory (a class...): one env, as gym.make gives
    return EnvPool(target, num_envs=num_envs, **kwargs)


def _world_model_backend(target, **kwargs):
    from .world_model import make_world_model_env

    return make_world_model_env(target, **kwargs)


register_backend("gym", _gym_backend, aliases=("gymnasium",))
register_backend("world-model", _world_model_backend, aliases=("model", "wm"))
