"""Adapters between an arbitrary world model and the batched env: calling conventions and return forms.

Two jobs, both done so that the hot path stays short:

* **Binding** (:func:`bind`): an adapter such as ``transition_fn`` may take the model as its
  first argument or not (``transition_fn(model, state, action)`` or ``transition_fn(state,
  action)``). The signature is read **once**, at construction, and turned into a plain callable
  that the env calls with the role's arguments; no ``inspect`` runs per step. Arguments are
  never cut from the front (the seed design's bug): either the full argument list is passed,
  with or without the model, or construction fails with the signature in the message (also
  when a parameter named like the model is not the first one: ``fn(state, action, model)``).
  Parameters named ``generator``, ``num_envs`` or ``mask`` are *keyword extras*: the env
  passes them by name when the adapter declares them (``generator`` is the env's seeded
  ``torch.Generator``).

* **Return forms** (:func:`split_transition`, :func:`split_reset`): every form of the seed
  design is accepted (5-, 4-, 3- and 6-tuples, mappings; a ``list`` is read like a ``tuple``)
  and anything else is an error that names the form received and lists the expected ones.
  A mapping is the *mapping return form* only when it has one of the reserved keys
  (:data:`RESERVED_KEYS`); any other mapping, a ``TensorDict`` without reserved keys, or a
  ``namedtuple`` is a *state* (so an RSSM-style ``{"deter", "stoch"}`` state advances).
  A mapping whose keys are exactly the keys of a Dict observation is that observation, even
  when they are reserved names (GoalEnv's ``{"observation", "desired_goal", ...}``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from ..errors import add_note, describe, error_text

__all__ = [
    "MISSING",
    "OBS_KEYS",
    "RESERVED_KEYS",
    "TRANSITION_METHODS",
    "RESET_METHODS",
    "Bound",
    "AdapterError",
    "ReturnFormError",
    "bind",
    "note_raised_inside",
    "discover_transition",
    "discover_method",
    "split_transition",
    "split_reset",
    "TRANSITION_FORMS",
    "RESET_FORMS",
]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()
"""Marks a value the adapter did not return (reward, termination, state...)."""

OBS_KEYS = ("observation", "obs", "image", "pixels", "next_observation", "next_obs")
STATE_KEYS = ("state", "next_state")
RESERVED_KEYS = frozenset((*STATE_KEYS, *OBS_KEYS, "reward", "terminated", "done", "truncated", "info"))
"""Keys that make a mapping the mapping return form rather than a state."""

TRANSITION_METHODS = ("env_step", "step", "predict_step", "predict", "imagine_step", "transition")
"""Model methods tried, in order, when no ``transition_fn`` is given (then ``__call__``)."""

RESET_METHODS = ("reset_env", "reset_state", "reset")
"""Model methods tried, in order, when no ``reset_fn`` is given (as in the seed design)."""

MODEL_NAMES = frozenset(("model", "world_model", "wm", "worldmodel", "module", "net", "self"))
"""A first parameter with one of these names is the model."""

EXTRAS = ("generator", "num_envs", "mask")
"""Keyword extras passed by name to adapters that declare them."""

TRANSITION_FORMS = (
    "(obs, reward, terminated, truncated, info)",
    "(obs, reward, done, info)",
    "(state, obs, reward)",
    "(state, obs, reward, terminated, truncated, info)",
    "a mapping with state/next_state, observation/obs/image/pixels/next_observation/next_obs, "
    "reward, terminated/done, truncated, info",
    "a bare state (tensor, dict/TensorDict without reserved keys or with exactly the Dict observation's keys, "
    "namedtuple): obs = state",
)
RESET_FORMS = (
    "obs",
    "(obs, info)",
    "(state, obs)",
    "(state, obs, info)",
    "a mapping with state, observation/obs/image/pixels/next_observation/next_obs, info",
)


class AdapterError(TypeError):
    """An adapter's signature cannot be bound to any accepted calling convention."""


class ReturnFormError(TypeError):
    """An adapter returned a value that matches no accepted return form, or holds bad values."""


# ---------------------------------------------------------------------------------------------
# Binding
# ---------------------------------------------------------------------------------------------


def _name(fn) -> str:
    if isinstance(fn, functools.partial):
        return f"partial({_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        name = type(fn).__qualname__
    return name


def _signature(fn) -> inspect.Signature | None:
    target = fn
    if isinstance(fn, functools.partial) and isinstance(fn.func, (torch.jit.ScriptFunction, torch.nn.Module)):
        sig = _signature(fn.func)  # inspect cannot read these through a partial: bind the partial's arguments
        if sig is None:
            return None
        try:
            return inspect.signature(functools.partial(_stand_in(sig), *fn.args, **fn.keywords))
        except (TypeError, ValueError):
            return None
    if isinstance(fn, torch.jit.ScriptFunction):
        return _schema_signature(fn.schema.arguments)
    if isinstance(fn, torch.jit.ScriptModule):
        return _schema_signature(fn.forward.schema.arguments[1:])  # without self
    if isinstance(fn, torch.nn.Module):
        # nn.Module.__call__ is (*args, **kwargs): read forward's signature, call the module (torch.compile's
        # OptimizedModule: the compiled module's forward)
        target = getattr(fn, "_orig_mod", fn).forward
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _schema_signature(arguments) -> inspect.Signature:
    """A TorchScript schema's arguments as an ``inspect.Signature`` (names and which have defaults)."""
    kinds = inspect.Parameter
    return inspect.Signature([
        kinds(a.name, kinds.KEYWORD_ONLY if a.kwarg_only else kinds.POSITIONAL_OR_KEYWORD,
              default=None if a.has_default_value() else kinds.empty)
        for a in arguments
    ])


def _stand_in(sig: inspect.Signature):
    """A plain function with signature ``sig``, for ``inspect`` to apply a partial's arguments to."""

    def stand_in(*args, **kwargs):
        pass

    stand_in.__signature__ = sig
    return stand_in


class Bound:
    """An adapter bound once: ``bound(*role_args)`` calls it with the right arguments.

    Attributes:
        call: the callable that takes exactly the role's arguments, positionally.
        form: the argument names the adapter receives, e.g. ``("model", "state", "action")``.
        extras: the keyword extras it receives (e.g. ``("generator",)``).
        description: ``"transition_fn step(model, state, action)"``, used in error messages.
    """

    __slots__ = ("call", "form", "extras", "description", "fn")

    def __init__(self, call, form, extras, description, fn):
        self.call = call
        self.form = form
        self.extras = extras
        self.description = description
        self.fn = fn

    def __call__(self, *args):
        return self.call(*args)

    def __repr__(self) -> str:
        return f"Bound({self.description})"


def note_raised_inside(err: Exception, bound: Bound, batch: tuple, **inputs) -> None:
    """Say, on an exception a user's adapter raised, which adapter it was, how it was called and with what:
    its traceback shows where, not that the call covers the whole batch (an adapter written for one env at
    a time fails on the batch). The package's own return-form errors already say all that."""
    if isinstance(err, (AdapterError, ReturnFormError)):
        return
    given = ", ".join(f"{name}={_given(value)}" for name, value in inputs.items())
    add_note(err, f"WorldModelEnv: raised inside {bound.description}, called once for the whole batch "
                  f"{tuple(batch)}, given {given}")


def _given(value, depth: int = 0) -> str:
    """A short description of an adapter's input: leaves by type, dtype and shape; containers by their first
    few entries."""
    if isinstance(value, TensorDictBase):
        return f"TensorDict(batch_size={tuple(value.batch_size)}, keys={sorted(map(str, value.keys()))[:4]})"
    if isinstance(value, (Mapping, tuple, list)) and depth < 2:
        items = list(value.items()) if isinstance(value, Mapping) else list(enumerate(value))
        inner = ", ".join(f"{k!r}: {_given(v, depth + 1)}" for k, v in items[:4]) + (", ..." if len(items) > 4 else "")
        return f"{type(value).__name__}({inner})"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return describe(value)


def bind(
    fn: Callable,
    role: str,
    args: Sequence[str],
    *,
    model: Any = None,
    with_model: bool = True,
    extras: Mapping[str, Any] | None = None,
    prefix_forms: bool = False,
) -> Bound:
    """Bind adapter ``fn`` for ``role`` to a calling convention, once.

    Args:
        fn: the adapter (function, method, ``functools.partial``, ``nn.Module``, callable object).
        role: its name in messages, e.g. ``"transition_fn"``.
        args: the names of the role's arguments, e.g. ``("state", "action")``.
        model: the world model, passed first when the adapter takes it.
        with_model: whether the model-first form is allowed (``False`` for the model's own
            bound methods).
        extras: keyword extras the env can supply (``{"generator": gen}``); each is passed
            only if ``fn`` declares a parameter of that name. Extras whose value is only
            known per call (``num_envs``, ``mask``) are given as ``None`` here and the env
            passes them itself (see :attr:`Bound.extras`).
        prefix_forms: also accept leading prefixes of ``args`` (``reset_fn(model, seed)``,
            ``reset_fn(model)``, ``reset_fn()``), as the seed design allows for ``reset_fn``.

    Returns:
        a :class:`Bound`.

    Raises:
        AdapterError: when no accepted form fits the signature; the message shows the
            signature and the accepted forms.
    """
    if not callable(fn):
        raise AdapterError(f"{role}: expected a callable, got {describe(fn)}")
    args = tuple(args)
    extras_known = extras is not None  # None: the caller does not say which extras the role receives
    extras = dict(extras or {})
    # Longest forms first; at equal length the model-first form wins (the seed's convention),
    # e.g. for reset_fn: (model, seed, options), (model, seed), (seed, options), (model), (seed), ().
    forms: list[tuple[str, ...]] = []
    if prefix_forms:
        for total in range(len(args) + 1, -1, -1):
            if with_model and total >= 1:
                forms.append(("model", *args[: total - 1]))
            if total <= len(args):
                forms.append(args[:total])
    else:
        if with_model:
            forms.append(("model", *args))
        forms.append(args)
    sig = _signature(fn)
    name = _name(fn)
    accepted = "; ".join(f"{role}({', '.join(f)})" for f in forms)
    if sig is None:
        # No signature to read (a C builtin such as torch.tanh): it cannot know the model, so it gets the role's
        # arguments alone; a call that then fails names the adapter and the convention chosen
        form = args
        bound = _make(fn, role, name, "(...)", form, args, model, {})
        bound.call = _Unread(bound.call, bound.description, accepted, args)
        return bound
    params = list(sig.parameters.values())
    kinds = inspect.Parameter
    extra_names = [
        p.name for p in params if p.name in extras and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
    ]
    positional = [
        p
        for p in params
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) and p.name not in extra_names
    ]
    var_positional = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    missing_kw = [
        p.name for p in params if p.kind is kinds.KEYWORD_ONLY and p.default is p.empty and p.name not in extra_names
    ]
    text = f"{name}{sig}"
    if missing_kw:
        raise AdapterError(
            f"{role} {text}: required keyword-only parameters {missing_kw} cannot be supplied; "
            f"accepted calling conventions: {accepted} (keyword extras: {', '.join(extras) or 'none'})"
        )

    def fits(form):
        n = len(form)
        return len(required) <= n and (var_positional or n <= len(positional))

    candidates = [f for f in forms if fits(f)]
    if not candidates:
        raise AdapterError(
            f"{role} {text} takes {len(required)} required positional argument(s)"
            f"{'' if var_positional else f' and at most {len(positional)}'}, which fits none of the accepted "
            f"calling conventions: {accepted}"
        )
    # A parameter named like one argument (the model, or one of ``args``) must not receive another:
    # ``transition_fn(model, action)`` fits ``(state, action)`` by count, with the state in ``model``. The model's
    # own methods never get the model, so only the role's argument names count there (``step(action, state)``).
    consistent = [f for f in candidates if _misnamed(positional, f, args, with_model) is None]
    if not consistent:
        late = [p.name for p in positional[1:] if p.name in MODEL_NAMES] if with_model else []
        if late:  # the model goes first or not at all
            raise AdapterError(
                f"{role} {text}: parameter {late[0]!r} looks like the model but is not the first parameter; the model "
                f"is passed first or not at all: accepted calling conventions: {accepted}"
            )
        form = _preferred(candidates, positional, args, with_model, var_positional, required)
        param, given = _misnamed(positional, form, args, with_model)
        if param in EXTRAS:
            raise AdapterError(_stray_extra(role, text, next(p for p in positional if p.name == param), extras,
                                            accepted))
        raise AdapterError(
            f"{role} {text}: parameter {param!r} would receive the {given}, which no accepted calling convention "
            f"fits by name: {accepted}"
        )
    # an extra declared before *args would take a value meant for *args: prefer a convention that fills only the
    # named parameters (those then go by name, below)
    early = [p.name for p in params if p.name in extra_names and p.kind is not kinds.KEYWORD_ONLY]
    if early and var_positional:
        consistent = [f for f in consistent if len(f) <= len(positional)] or consistent
    form = _preferred(consistent, positional, args, with_model, var_positional, required)
    used = positional[: len(form)]
    # a parameter named like an extra that is not passed as one must not take another argument
    stray = [p for p in used if p.name in EXTRAS]
    if stray:
        raise AdapterError(_stray_extra(role, text, stray[0], extras, accepted))
    # an adapter function's parameter named for an extra its role never receives (reward_fn(..., mask=None)) would
    # stay at its default: the adapter could not tell which rows were frozen. Methods and modules (an encoder's
    # attention mask=None) may name parameters as they like, and a keyword a partial binds has its value
    plain, bound_kw = _plain_function(fn)
    never = [p.name for p in params if plain and extras_known and p.name in EXTRAS and p.name not in extras
             and p.name not in bound_kw and p not in used
             and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    if never:
        raise AdapterError(
            f"{role} {text}: parameter {never[0]!r} is named for a keyword extra that {role} never receives (it "
            f"receives {', '.join(map(repr, extras)) or 'none'}), so it would always stay at its default; remove it "
            f"or rename it"
        )
    # a parameter named for one of the role's arguments that the chosen convention never passes it
    # (reset_fn(model, options=None) or a model's reset(options=None, seed=None): called without it, lost)
    lost = [p.name for p in params if p.name in args and p not in used
            and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
    if lost:
        raise AdapterError(
            f"{role} {text}: parameter {lost[0]!r} would never receive the {lost[0]}: the role's arguments are "
            f"passed by position, in the order of one of the accepted calling conventions: {accepted}"
        )
    # an extra declared before a parameter that takes an argument by position (reset_fn(num_envs, seed)) would
    # take that argument itself: the arguments then go by name (positional-only ones, which come first, by
    # position). Before *args, which takes them by position only, it cannot be helped: an error
    if early and len(form) > len(positional):
        raise AdapterError(
            f"{role} {text}: the keyword extra {early[0]!r} is declared before *args, which takes the role's "
            f"arguments by position, so {early[0]!r} would take the first of them; declare it after *args "
            f"(keyword-only), e.g. {role}(*args, {early[0]}=None)"
        )
    by_name = None
    if used and any(params.index(p) < params.index(used[-1]) for p in params if p.name in extra_names):
        by_name = (sum(p.kind is kinds.POSITIONAL_ONLY for p in used), tuple(p.name for p in used))
    return _make(fn, role, name, str(sig), form, args, model, {k: extras[k] for k in extra_names}, by_name)


def _plain_function(fn) -> tuple[bool, set]:
    """Whether ``fn`` is a plain function (a ``def`` or a lambda, maybe in ``functools.partial``), and the keywords
    its partials bind."""
    bound = set()
    while isinstance(fn, functools.partial):
        bound.update(fn.keywords)
        fn = fn.func
    return inspect.isfunction(fn), bound


def _stray_extra(role, text, param, extras, accepted) -> str:
    """The error for a parameter named like a keyword extra that would take one of the role's arguments."""
    why = (f"extras are passed by keyword and {param.name!r} is positional-only"
           if param.kind is inspect.Parameter.POSITIONAL_ONLY
           else f"{role} receives only the keyword extras {list(extras) or 'none'}")
    return (f"{role} {text}: parameter {param.name!r} is named for a keyword extra, but {why}, so it would take one "
            f"of the role's arguments; accepted calling conventions: {accepted}")


def _misnamed(positional, form, args, model_names: bool = True) -> tuple[str, str] | None:
    """The first ``(parameter, argument)`` where a parameter named like the model (when ``model_names``) or one
    of ``args`` would receive another argument under ``form``; ``None`` when the names agree (or say nothing)."""
    for param, given in zip(positional, form):
        name = "model" if model_names and param.name in MODEL_NAMES else param.name
        if (name == "model" or name in args or name in EXTRAS) and name != given:
            return param.name, given
    return None


def _preferred(candidates, positional, args, with_model, var_positional, required):
    """The form to bind among ``candidates`` (all fit the signature): the one the first parameter's name
    picks (the model, or a role argument), else the one taking exactly the required arguments, else the
    longest, model first (the seed design's convention)."""
    first = positional[0].name if positional else None
    if len(candidates) > 1 and first is not None:
        if first in MODEL_NAMES and with_model:
            named = [f for f in candidates if f and f[0] == "model"]
        elif first in args:
            named = [f for f in candidates if f and f[0] == first]
        else:
            named = []
        if named:
            candidates = named
        else:
            exact = [f for f in candidates if len(f) == len(required)]
            if exact and not var_positional:
                candidates = exact
    return candidates[0]


def _make(fn, role, name, sig_text, form, args, model, extras, by_name=None) -> Bound:
    call_extras = {k: v for k, v in extras.items() if v is not None}
    per_call = tuple(k for k, v in extras.items() if v is None)
    target = functools.partial(fn, **call_extras) if call_extras else fn
    takes_model = bool(form) and form[0] == "model"
    used = form[1:] if takes_model else form
    if by_name is not None:
        positional_only, names = by_name
        call = _ByName(target, model, positional_only, names, takes_model)
    elif used == args:
        call = functools.partial(target, model) if takes_model else target
    else:
        call = _Prefix(target, model, len(used), takes_model)  # a prefix of the arguments (reset_fn only)
    shown = (*(form if by_name is None else (f"{p}={a}" for p, a in zip(names, form))),
             *(f"{k}=..." for k in (*call_extras, *per_call)))
    description = f"{role} {name}{sig_text} called as {role}({', '.join(shown)})"
    return Bound(call, form, tuple(per_call), description, fn)


class _Unread:
    """An adapter whose signature could not be read, called as chosen; a TypeError (the wrong number or kind of
    arguments, most likely) is re-raised naming the adapter and the calling conventions. Picklable."""

    def __init__(self, fn, description: str, accepted: str, args: Sequence[str]):
        self.fn, self.description, self.accepted, self.args = fn, description, accepted, tuple(args)

    def __call__(self, *args, **kwargs):
        try:
            return self.fn(*args, **kwargs)
        except TypeError as err:
            raise AdapterError(
                f"{self.description} (its signature cannot be read, so it gets the arguments without the model) "
                f"raised {error_text(err)}. Accepted calling conventions: {self.accepted}; wrap it in a "
                f"function with named parameters, e.g. lambda {', '.join(self.args)}: ..."
            ) from err


class _Prefix:
    """``fn([model,] *args[:n], **kwargs)``: an adapter taking a prefix of its role's arguments. A class, not a
    closure, so that envs holding it pickle."""

    def __init__(self, fn, model, n: int, takes_model: bool):
        self.fn, self.model, self.n, self.takes_model = fn, model, n, takes_model

    def __call__(self, *args, **kwargs):
        if self.takes_model:
            return self.fn(self.model, *args[: self.n], **kwargs)
        return self.fn(*args[: self.n], **kwargs)


class _ByName:
    """``fn(*values[:k], **{names[i]: values[i] for i >= k}, **kwargs)`` with ``values = ([model,] *args)``: an
    adapter whose keyword extras come before parameters that take the role's arguments, called with those
    arguments by name (the first ``k``, positional-only, by position). Picklable."""

    def __init__(self, fn, model, positional_only: int, names: tuple[str, ...], takes_model: bool):
        self.fn, self.model, self.k, self.names, self.takes_model = fn, model, positional_only, names, takes_model

    def __call__(self, *args, **kwargs):
        values = (self.model, *args) if self.takes_model else args
        k = self.k
        return self.fn(*values[:k], **dict(zip(self.names[k:], values[k:])), **kwargs)


class _ActionOnly:
    """A model method that keeps its own state, called as ``method(action)`` for ``(state, action)`` (picklable)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, state, action, **kwargs):
        return self.fn(action, **kwargs)


def discover_method(model, names: Sequence[str]):
    """The first callable attribute of ``model`` among ``names``: ``(name, method)`` or ``(None, None)``."""
    for name in names:
        method = getattr(model, name, None)
        if callable(method):
            return name, method
    return None, None


def discover_transition(model, extras: Mapping[str, Any] | None = None) -> Bound:
    """The model's transition method (the seed's discovery order), bound once.

    Tries :data:`TRANSITION_METHODS` in order, then ``model.__call__``. A method with one
    positional parameter is called as ``method(action)`` (the model keeps its own state);
    otherwise as ``method(state, action)`` (see :func:`_accepts_two`).

    Raises:
        AdapterError: when the model has none of them.
    """
    name, method = discover_method(model, TRANSITION_METHODS)
    if method is None:
        if not callable(model):
            raise AdapterError(
                f"world model {type(model).__name__} has no transition: pass transition_fn=, or give the model "
                f"one of the methods {', '.join(TRANSITION_METHODS)} or make it callable"
            )
        name, method = "__call__", model
    bound = (
        bind(method, f"model.{name}", ("state", "action"), with_model=False, extras=extras, prefix_forms=False)
        if _accepts_two(method, extras or ())
        else None
    )
    if bound is None:
        single = bind(method, f"model.{name}", ("action",), with_model=False, extras=extras)
        bound = Bound(_ActionOnly(single.call), ("action",), single.extras, single.description, method)
    return bound


def _accepts_two(fn, extras=()) -> bool:
    """The seed design's rule for model methods: ``(state, action)`` unless it takes at most one
    positional argument (then ``(action)``: the model keeps its own state).

    Parameters with defaults count, as in the seed, so code written for it moves over unchanged:
    ``imagine_step(prev_state, prev_action, nonterm=1.0)`` and ``forward(s, a=None)`` get
    ``(state, action)``. A first parameter named ``action`` says the model keeps its own state:
    ``step(action, deterministic=False)`` is ``(action)`` (by position it would take the state).
    Keyword extras (``generator``, ``mask``) do not count: ``step(action, mask=None)`` is ``(action)``.
    """
    sig = _signature(fn)
    if sig is None:
        return True
    params = list(sig.parameters.values())
    kinds = inspect.Parameter
    if any(p.kind is kinds.VAR_POSITIONAL for p in params):
        return True
    positional = [
        p for p in params
        if p.kind is kinds.POSITIONAL_ONLY or (p.kind is kinds.POSITIONAL_OR_KEYWORD and p.name not in extras)
    ]
    if positional and positional[0].name == "action" and all(p.default is not p.empty for p in positional[1:]):
        return False
    return len(positional) >= 2


# ---------------------------------------------------------------------------------------------
# Return forms
# ---------------------------------------------------------------------------------------------


def _is_form_tuple(value) -> bool:
    # A namedtuple is a state (e.g. an RSSM state), never a return form.
    t = type(value)
    return t is tuple or t is list or (isinstance(value, (tuple, list)) and not hasattr(value, "_fields"))


def _is_mapping(value) -> bool:
    return type(value) is dict or isinstance(value, (Mapping, TensorDictBase))


def _info(value, form: str, where: str):
    if value is None:
        return {}
    if not _is_mapping(value):
        raise ReturnFormError(f"{where} returned {form}: expected info to be a dict (or None), got {describe(value)}")
    if isinstance(value, TensorDictBase):
        return dict(value.items())  # a plain dict: a TensorDict has no truth value
    return value


def _scalar_like(value) -> bool:
    return value is None or isinstance(value, (str, bytes, bool, int, float, complex))


def _form_list(forms) -> str:
    return "; ".join(forms)


_STEP_TUPLE_FORMS = {
    5: "read as (obs, reward, terminated, truncated, info)",
    4: "read as (obs, reward, done, info)",
    6: "read as (state, obs, reward, terminated, truncated, info)",
    3: "read as (state, obs, reward)",
}
_FORM_TEXT = {(kind, n): f"a {n}-{kind} {text}" for kind in ("tuple", "list") for n, text in _STEP_TUPLE_FORMS.items()}
_STATE_FORM = "a mapping without reserved keys, read as the next state (obs = state)"
_OBS_STATE_FORM = "a mapping with exactly the Dict observation's keys, read as the next state (obs = state)"
_BARE_FORM = "a bare value, read as the next state (obs = state)"
_STEP_ALLOWED = RESERVED_KEYS
_RESET_ALLOWED = RESERVED_KEYS - {"reward", "terminated", "done", "truncated"}


def mapping_form(keys) -> str:
    """The text naming a mapping return form in messages."""
    return f"a mapping with keys {sorted(map(str, keys))}"


def split_transition(result, where: str, obs_keys: frozenset | None = None):
    """Split a transition's return into ``(form, state, obs, reward, terminated, truncated, info)``.

    Values the form does not carry are :data:`MISSING`. The state of the 4-/5-tuple forms is
    ``info["model_state"]`` when present, else the observation; a mapping without a state
    takes ``info["model_state"]``, else its observation; a bare state is also the observation.
    ``form`` is a short text naming the form, for error messages.

    ``obs_keys``: the observation's keys when it is a mapping (Dict space / Composite spec),
    else ``None``. A mapping with exactly these keys is a bare state (the observation), even
    when they are reserved names.

    Raises:
        ReturnFormError: the value matches no form (the message names what was received).
    """
    if _is_mapping(result):
        keys = result.keys()
        if RESERVED_KEYS.isdisjoint(keys):
            return _STATE_FORM, result, result, MISSING, MISSING, MISSING, {}
        if obs_keys is not None and set(keys) == obs_keys:
            return _OBS_STATE_FORM, result, result, MISSING, MISSING, MISSING, {}
        return _split_mapping(result, keys, where, step=True)
    if _is_form_tuple(result):
        n = len(result)
        if n == 5:
            form = _FORM_TEXT["list" if type(result) is list else "tuple", 5]
            obs, reward, terminated, truncated, info = result
            info = _info(info, form, where)
            state = info.get("model_state") if "model_state" in info.keys() else obs
            return form, state, obs, reward, terminated, truncated, info
        if n == 4:
            form = _FORM_TEXT["list" if type(result) is list else "tuple", 4]
            obs, reward, done, info = result
            info = _info(info, form, where)
            state = info.get("model_state") if "model_state" in info.keys() else obs
            return form, state, obs, reward, done, MISSING, info
        if n == 6:
            form = _FORM_TEXT["list" if type(result) is list else "tuple", 6]
            state, obs, reward, terminated, truncated, info = result
            return form, state, obs, reward, terminated, truncated, _info(info, form, where)
        if n == 3:
            form = _FORM_TEXT["list" if type(result) is list else "tuple", 3]
            state, obs, reward = result
            return form, state, obs, reward, MISSING, MISSING, {}
        kind = "list" if isinstance(result, list) else "tuple"
        raise ReturnFormError(
            f"{where} returned a {n}-{kind}, which matches no transition return form; expected one of: "
            f"{_form_list(TRANSITION_FORMS)}. (A tuple state must be returned inside a form, e.g. "
            "{'state': (h, c), ...}, or as a namedtuple.)"
        )
    if _scalar_like(result):
        raise ReturnFormError(
            f"{where} returned {describe(result)}, which matches no transition return form; expected one of: "
            f"{_form_list(TRANSITION_FORMS)}"
        )
    return _BARE_FORM, result, result, MISSING, MISSING, MISSING, {}


def _split_mapping(result, keys, where: str, *, step: bool):
    if not isinstance(keys, (set, frozenset, type({}.keys()))):
        keys = set(keys)
    allowed = _STEP_ALLOWED if step else _RESET_ALLOWED
    if not keys <= allowed:
        unknown = set(keys) - allowed
        extra = "" if step else " (a reset has no reward or termination)"
        raise ReturnFormError(
            f"{where} returned {mapping_form(keys)}: keys {sorted(map(str, unknown))} are not part of the mapping "
            f"return form{extra}; allowed keys: {sorted(allowed)}. (If this mapping is a state, it must not use the "
            "reserved keys; return it under 'state' instead.)"
        )
    get = result.get
    obs = MISSING
    found = None
    for key in OBS_KEYS:
        if key in keys:
            if found is not None:
                raise ReturnFormError(
                    f"{where} returned {mapping_form(keys)}: several observation keys {found!r} and {key!r}; "
                    "expected one"
                )
            found, obs = key, get(key)
    form = "a mapping (the mapping return form)"
    info = _info(get("info"), form, where) if "info" in keys else {}
    if "state" in keys:
        if "next_state" in keys:
            raise ReturnFormError(f"{where} returned {mapping_form(keys)}: both 'state' and 'next_state'; expected one")
        state = get("state")
    elif "next_state" in keys:
        state = get("next_state")
    elif "model_state" in info.keys():
        state = info.get("model_state")
    else:
        state = MISSING
    if not step:
        return form, state, obs, info
    if state is MISSING:
        if obs is MISSING:
            raise ReturnFormError(
                f"{where} returned {mapping_form(keys)}: it has neither a state ('state'/'next_state'/"
                f"info['model_state']) nor an observation ({'/'.join(OBS_KEYS)}), so the next state is unknown"
            )
        state = obs
    elif obs is MISSING:
        obs = state
    # a flag given as None is a missing one (a model without that head), as a None reward
    flags = {key for key in ("terminated", "done", "truncated") if key in keys and get(key) is not None}
    if "terminated" in flags:
        if "done" in flags:
            raise ReturnFormError(
                f"{where} returned {mapping_form(keys)}: both 'terminated' and 'done'; expected one of them"
            )
        terminated = get("terminated")
    elif "done" in flags:
        if "truncated" in flags:
            # done = terminated | truncated: a row that is both done and truncated may or may not have
            # terminated, and bootstrapping depends on it (TorchRL refuses to guess too)
            raise ReturnFormError(
                f"{where} returned {mapping_form(keys)}: 'done' together with 'truncated' leaves 'terminated' "
                "unknown on truncated rows; return 'terminated' and 'truncated' instead ('done' alone is read "
                "as 'terminated')"
            )
        terminated = get("done")
    else:
        terminated = MISSING
    reward = get("reward") if "reward" in keys else MISSING
    truncated = get("truncated") if "truncated" in flags else MISSING
    return form, state, obs, reward, terminated, truncated, info


def split_reset(result, where: str, obs_keys: frozenset | None):
    """Split a reset's return into ``(form, state, obs, info)``; missing values are :data:`MISSING`.

    ``obs_keys``: the observation's keys when the observation is a mapping (Dict space /
    Composite spec), else ``None``. It decides the 2-tuple: ``(obs, info)`` when the second
    item is ``None`` or a mapping that is not an observation, else ``(state, obs)``; and a mapping with
    exactly these keys is a bare observation, even when they are reserved names.

    Raises:
        ReturnFormError: the value matches no form.
    """
    if _is_form_tuple(result):
        kind = "list" if isinstance(result, list) else "tuple"
        n = len(result)
        if n == 3:
            form = f"a 3-{kind} read as (state, obs, info)"
            state, obs, info = result
            return form, state, obs, _info(info, form, where)
        if n == 2:
            first, second = result
            # a None second item is a missing info (as in a transition's return), never an observation
            if second is None or (
                _is_mapping(second) and not (obs_keys is not None and set(second.keys()) == obs_keys)
            ):
                form = f"a 2-{kind} read as (obs, info)"
                info = _info(second, form, where)
                # info["model_state"] is the state, as in the mapping form and a step's 4-/5-tuples
                return form, info.get("model_state", MISSING), first, info
            return f"a 2-{kind} read as (state, obs)", first, second, {}
        raise ReturnFormError(
            f"{where} returned a {n}-{kind}, which matches no reset return form; expected one of: "
            f"{_form_list(RESET_FORMS)}"
        )
    if _is_mapping(result):
        keys = result.keys()
        if not RESERVED_KEYS.isdisjoint(keys) and not (obs_keys is not None and set(keys) == obs_keys):
            return _split_mapping(result, keys, where, step=False)
        return f"a bare {type(result).__name__}, read as the observation", MISSING, result, {}
    if _scalar_like(result):
        raise ReturnFormError(
            f"{where} returned {describe(result)}, which matches no reset return form; expected one of: "
            f"{_form_list(RESET_FORMS)}"
        )
    return f"a bare {type(result).__name__}, read as the observation", MISSING, result, {}
