"""WorldModelEnv adapters: calling conventions, method discovery, return forms, errors, and the seed design's bugs.

Each ``test_bug_*`` is a regression test for one behaviour listed in shared/notes/torchwm.md.
"""

from __future__ import annotations

import functools
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn
from wm_models import ACT1, OBS3, CountingModel, RSSMLike, RSSMState

from torchrl_swm import WorldModelEnv, make_world_model_env
from torchrl_swm.world_model import ObservationDecoder
from torchrl_swm.world_model.adapters import (
    MISSING,
    MODEL_NAMES,
    AdapterError,
    ReturnFormError,
    bind,
    discover_transition,
    split_reset,
    split_transition,
)

BOX2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def step_once(env, action=None):
    td = env.reset()
    if action is None:
        action = env.action_spec.zero()
    td["action"] = action
    return env.step(td)["next"]


# ---------------------------------------------------------------------------------------------
# binding: with or without the model, decided once from the signature
# ---------------------------------------------------------------------------------------------


class Spy:
    def __init__(self):
        self.calls = []


@pytest.mark.parametrize("with_model", [True, False])
def test_transition_fn_both_signatures_receive_the_right_arguments(with_model):
    model, seen = object(), []
    if with_model:

        def transition(model_, state, action):
            seen.append((model_, state, action))
            return {"state": state + action}
    else:

        def transition(state, action):
            seen.append((state, action))
            return {"state": state + action}

    env = WorldModelEnv(model, BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition)
    out = step_once(env, torch.ones(3, 2))
    assert torch.equal(out["observation"], torch.ones(3, 2))
    args = seen[-1]
    if with_model:
        assert args[0] is model
        args = args[1:]
    assert torch.equal(args[0], torch.zeros(3, 2)) and torch.equal(args[1], torch.ones(3, 2))
    assert env.transition.form == (("model", "state", "action") if with_model else ("state", "action"))


def test_bug_argument_truncation_two_argument_transition_fn_gets_state_and_action():
    """Seed bug: transition_fn(state, action) received (world_model, state)."""
    model = {"not": "a tensor"}
    got = []

    def transition(state, action):
        got.append((type(state), type(action)))
        return state + action

    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)
    step_once(env)
    assert got == [(torch.Tensor, torch.Tensor)]


@pytest.mark.parametrize("with_model", [True, False])
def test_action_transform_fn_both_signatures(with_model):
    """Seed bug: a one-argument action_transform_fn received the model, and the model got the model as action."""
    model = CountingModel(length=100)
    seen = []
    if with_model:

        def to_model(model_, action):
            seen.append(model_)
            return action.float().unsqueeze(-1) - 1.0
    else:

        def to_model(action):
            seen.append(action)
            return action.float().unsqueeze(-1) - 1.0

    env = make_world_model_env(
        model, OBS3, gym.spaces.Discrete(3), num_envs=2, initial_state=torch.zeros(3), action_transform_fn=to_model
    )
    td = env.reset()
    td["action"] = torch.tensor([0, 2])
    out = env.step(td)["next"]
    assert out["reward"].view(-1).tolist() == [-1.0, 1.0]
    if with_model:
        assert seen[-1] is model
    else:
        assert torch.equal(seen[-1], torch.tensor([0, 2]))


@pytest.mark.parametrize("with_model", [True, False])
def test_reward_and_terminal_fn_both_signatures(with_model):
    model = object()
    if with_model:

        def reward_fn(model_, state, obs, action):
            assert model_ is model
            return obs[:, 0] * 10

        def terminal_fn(model_, state, obs, action):
            assert model_ is model
            return state[:, 0] >= 2
    else:

        def reward_fn(state, obs, action):
            return obs[:, 0] * 10

        def terminal_fn(state, obs, action):
            return state[:, 0] >= 2

    env = make_world_model_env(
        model,
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=torch.zeros(2),
        transition_fn=lambda s, a: {"state": s + 1},
        reward_fn=reward_fn,
        terminal_fn=terminal_fn,
    )
    rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["next", "reward"][0, :, 0].tolist() == [10.0, 20.0, 10.0]
    assert rollout["next", "terminated"][0, :, 0].tolist() == [False, True, False]
    assert rollout["next", "done"][0, :, 0].tolist() == [False, True, False]


def test_reward_fn_is_used_only_when_the_transition_has_no_reward():
    env = make_world_model_env(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=torch.zeros(2),
        transition_fn=lambda s, a: {"state": s, "reward": torch.full((2,), 7.0)},
        reward_fn=lambda s, o, a: torch.full((2,), -1.0),
    )
    assert step_once(env)["reward"].view(-1).tolist() == [7.0, 7.0]


def test_terminal_fn_is_used_only_when_the_transition_has_no_termination():
    """As for rewards: the model's own termination is kept, and terminal_fn is never called."""
    calls = []

    def terminal_fn(state, obs, action):
        calls.append(state)
        return torch.ones(state.shape[0], dtype=torch.bool)

    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: {"state": s + 1, "terminated": s[:, 0] + 1 >= 2},
                               terminal_fn=terminal_fn)
    rollout = env.rollout(4, break_when_any_done=False)
    assert rollout["next", "terminated"][0, :, 0].tolist() == [False, True, False, True]
    assert calls == []


def test_terminal_fn_done_includes_the_models_own_truncation():
    """TerminalAdapter sets done = terminated | truncated: a model's truncation is done without a time limit."""

    def transition(state, action):  # t += 1; the model truncates at t == 3 and never terminates
        return {"state": state + 1, "truncated": state[:, 0] + 1 >= 3}

    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=transition, terminal_fn=lambda s, o, a: o[:, 0] > 100)
    rollout = env.rollout(5, break_when_any_done=False)
    assert rollout["next", "truncated"][0, :, 0].tolist() == [False, False, True, False, False]
    assert rollout["next", "done"][0, :, 0].tolist() == [False, False, True, False, False]
    assert rollout["next", "observation"][0, :, 0].tolist() == [1.0, 2.0, 3.0, 1.0, 2.0]  # restarted once done


def test_missing_reward_is_zero_and_missing_termination_is_false():
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=lambda s, a: s)
    out = step_once(env)
    assert out["reward"].tolist() == [[0.0], [0.0]] and out["reward"].dtype == torch.float32
    assert not out["terminated"].any() and not out["truncated"].any() and not out["done"].any()
    assert not env.reward_from_model and not env.terminated_from_model


@pytest.mark.parametrize("form", ["5-tuple", "6-tuple", "mapping", "mapping-done"])
def test_none_flags_are_missing_flags_as_a_none_reward_is(form):
    # a model without a done head returns None for its flags: terminal_fn= fills them in (else False)
    def transition(state, action):
        state = state + action
        if form == "5-tuple":
            return state, None, None, None, {"model_state": state}
        if form == "6-tuple":
            return state, state, None, None, None, {}
        if form == "mapping-done":  # a done head and no truncation head: done reads as terminated
            return {"state": state, "obs": state, "reward": None, "done": None, "truncated": None}
        return {"state": state, "obs": state, "reward": None, "terminated": None, "truncated": None}

    def make(**fns):
        return make_world_model_env(None, BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2),
                                    transition_fn=transition, **fns)

    def step(env):
        return env.step(env.reset().set("action", torch.tensor([[0.2, 0.0], [0.7, 0.0], [-0.9, 0.0]])))["next"]

    out = step(make(reward_fn=lambda s, o, a: s[:, 0] * 2, terminal_fn=lambda s, o, a: s[:, 0] > 0.5))
    assert out["reward"].view(-1).tolist() == pytest.approx([0.4, 1.4, -1.8])
    assert out["terminated"].view(-1).tolist() == [False, True, False]
    assert out["done"].view(-1).tolist() == [False, True, False]
    assert not out["truncated"].any()
    plain = step(make())
    assert not plain["done"].any() and plain["reward"].view(-1).tolist() == [0.0, 0.0, 0.0]



def test_done_with_a_none_truncated_is_done_alone_and_a_real_truncated_is_refused():
    def make(truncated):
        def transition(state, action):
            state = state + action
            return {"state": state, "reward": state[:, 0], "done": state[:, 0] > 0.5, "truncated": truncated}

        return make_world_model_env(None, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                                    transition_fn=transition)

    env = make(None)
    out = env.step(env.reset().set("action", torch.tensor([[0.7, 0.0], [0.1, 0.0]])))["next"]
    assert out["terminated"].view(-1).tolist() == [True, False] and not out["truncated"].any()
    env = make(torch.zeros(2, dtype=torch.bool))
    with pytest.raises(ReturnFormError, match="'done' together with 'truncated'"):
        env.step(env.reset().set("action", torch.zeros(2, 2)))


@pytest.mark.parametrize("form", ["model_seed_options", "seed_options", "model", "none", "model_seed"])
def test_reset_fn_signatures(form):
    model = object()
    calls = []
    fns = {
        "model_seed_options": lambda model, seed, options: calls.append((model, seed, options)) or torch.ones(2),
        "seed_options": lambda seed, options: calls.append((seed, options)) or torch.ones(2),
        "model": lambda model: calls.append((model,)) or torch.ones(2),
        "none": lambda: calls.append(()) or torch.ones(2),
        "model_seed": lambda model, seed: calls.append((model, seed)) or torch.ones(2),
    }
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, reset_fn=fns[form], transition_fn=lambda s, a: s)
    td = env.reset(options={"k": 1})
    assert torch.equal(td["observation"], torch.ones(2, 2))
    expected = {
        "model_seed_options": (model, None, {"k": 1}),
        "seed_options": (None, {"k": 1}),
        "model": (model,),
        "none": (),
        "model_seed": (model, None),
    }[form]
    assert calls[-1] == expected


def test_reset_fn_keyword_extras_num_envs_mask_generator():
    got = {}

    def reset_fn(model, seed, options, *, num_envs, mask, generator):
        got.update(num_envs=num_envs, mask=mask, generator=generator)
        return torch.randn(num_envs, 2, generator=generator)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=5, reset_fn=reset_fn, transition_fn=lambda s, a: s, seed=0)
    env.reset()
    assert got["num_envs"] == 5 and got["mask"].all() and got["generator"] is env.reset_generator
    env._reset(TensorDict({"_reset": torch.tensor([[False], [True], [False], [True], [False]])}, [5]))
    assert got["num_envs"] == 2 and got["mask"].tolist() == [False, True, False, True, False]



@pytest.mark.parametrize("form", ["args", "x_args", "num_envs_args", "model_num_envs_args", "mask_args"])
def test_reset_fn_taking_star_args_gets_the_full_convention_and_extras_before_it_by_name(form):
    """reset_fn(x, *args) gets the seed's full convention (model, seed, options), as reset_fn(*args) does; a keyword
    extra declared before *args (README: extras "go by name wherever they are declared") binds by name, with no role
    arguments after it."""
    model = object()
    calls = []
    fns = {
        "args": lambda *args: calls.append(args) or torch.ones(2),
        "x_args": lambda x, *args: calls.append((x, *args)) or torch.ones(2),
        "num_envs_args": lambda num_envs, *args: calls.append((num_envs, *args)) or torch.ones(num_envs, 2),
        "model_num_envs_args": lambda model, num_envs, *args: calls.append((model, num_envs, *args))
        or torch.ones(num_envs, 2),
        "mask_args": lambda mask, *args: calls.append((mask.tolist(), *args)) or torch.ones(int(mask.sum()), 2),
    }
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=3, reset_fn=fns[form], transition_fn=lambda s, a: s)
    td = env.reset(seed=5, options={"k": 1})
    assert torch.equal(td["observation"], torch.ones(3, 2))
    expected = {
        "args": (model, 5, {"k": 1}),
        "x_args": (model, 5, {"k": 1}),
        "num_envs_args": (3,),
        "model_num_envs_args": (model, 3),
        "mask_args": ([True, True, True],),
    }[form]
    assert calls[-1] == expected
    env._reset(TensorDict({"_reset": torch.tensor([[False], [True], [False]])}, [3]))
    expected = {
        "num_envs_args": (1,),
        "model_num_envs_args": (model, 1),
        "mask_args": ([False, True, False],),
    }.get(form, (model, None, {}))
    assert calls[-1] == expected


def _extras_first_reset_fn(num_envs, seed):
    return torch.full((num_envs, 2), -1.0 if seed is None else float(seed))


def _extras_first_with_model(model, generator, seed, options, mask=None):
    return torch.full((int(mask.sum()), 2), float(options.get("start", 0.0)) + (0.0 if seed is None else seed))


def _extras_first_transition(generator, state, action):
    return {"state": state + action, "terminated": (state + action)[:, :1] > 2}


@pytest.mark.parametrize("reset_fn", [_extras_first_reset_fn, _extras_first_with_model])
def test_adapters_declaring_keyword_extras_before_their_arguments_get_each_value_by_name(reset_fn):
    """reset_fn(num_envs, seed): an extra declared before a parameter that takes one of the role's arguments must
    not take that argument by position (it raised 'got multiple values for argument' at the first reset)."""
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=reset_fn, transition_fn=_extras_first_transition)
    assert "seed=seed" in env._reset_bound.description
    assert env.reset(seed=4)["observation"].tolist() == [[4.0, 4.0]] * 3
    if reset_fn is _extras_first_with_model:
        assert env.reset(options={"start": 1.0})["observation"].tolist() == [[1.0, 1.0]] * 3
    td = env.reset()
    td["action"] = torch.ones(3, 2)
    assert env.step(td)["next", "observation"].tolist() == (td["observation"] + 1).tolist()
    ones = torch.ones(3, 2)
    rollout = env.rollout(12, lambda td: td.set("action", ones), break_when_any_done=False)  # resets per call
    assert rollout["next", "done"].any()
    pickle.loads(pickle.dumps(env._reset_bound.call))  # module-level adapters bound by name stay picklable


def _start_zeros(num_envs=2):
    return torch.zeros(num_envs, 2)


def _t_num_envs_first(num_envs, state, action):  # num_envs is no extra of transition_fn
    return state


def _t_generator_positional_only(generator, /, state, action):
    return state


def _t_mask_before_args(mask, *args):
    return args[-2]


def _r_keyword_only(*, num_envs, seed=None, options=None):
    return torch.zeros(num_envs, 2)


def _r_options_skipping_seed(model, options=None):
    return torch.zeros(2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(transition_fn=_t_num_envs_first), "'num_envs' is named for a keyword extra.*receives only"),
    (dict(transition_fn=_t_generator_positional_only), "'generator' is named for a keyword extra.*positional-only"),
    (dict(transition_fn=_t_mask_before_args), "'mask' is declared before \\*args"),
    (dict(reset_fn=_r_keyword_only), "'seed' would never receive the seed"),
    (dict(reset_fn=_r_options_skipping_seed), "'options' would never receive the options"),
    (dict(encode_fn=lambda mask, obs: obs, initial_observation=torch.zeros(2)),
     "'mask' is named for a keyword extra"),
])
def test_adapter_signatures_that_would_misbind_are_refused_at_construction(kwargs, match):
    """Each of these bound once and then gave a parameter another argument (the model, the state, the seed), or
    never gave a named one its value, or failed with a raw TypeError at the first reset or step."""
    kwargs = {"transition_fn": lambda s, a: s, "reset_fn": _start_zeros, **kwargs}
    if "initial_observation" in kwargs:
        kwargs.pop("reset_fn")
    with pytest.raises(AdapterError, match=match):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, **kwargs)


def _t_num_envs_default(state, action, num_envs=None):
    return state


def _t_num_envs_keyword_only(state, action, *, num_envs=None):
    return state


def _reward_with_mask(state, obs, action, mask=None):  # reward_fn gets no "_step" mask
    return obs.sum(-1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(transition_fn=_t_num_envs_default), r"transition_fn .*'num_envs' is named for a keyword extra that "
                                              r"transition_fn never receives \(it receives 'generator', 'mask'\)"),
    (dict(transition_fn=_t_num_envs_keyword_only), "'num_envs' is named for a keyword extra that transition_fn never"),
    (dict(reward_fn=_reward_with_mask), r"reward_fn .*'mask' .* never receives \(it receives 'generator'\)"),
    (dict(encode_fn=lambda obs, num_envs=None: obs, initial_observation=torch.zeros(2)),
     "encode_fn .*'num_envs' is named for a keyword extra that encode_fn never receives"),
])
def test_an_adapters_parameter_named_for_an_extra_its_role_never_receives_is_refused(kwargs, match):
    """README: "a parameter named like an extra its role does not receive ... is an error". With a default (or
    keyword-only) it was accepted and always stayed None: a reward_fn(..., mask=None) could not tell frozen rows."""
    kwargs = {"transition_fn": lambda s, a: s, "initial_state": torch.zeros(2), **kwargs}
    if "initial_observation" in kwargs:
        kwargs.pop("initial_state")
    with pytest.raises(AdapterError, match=match):
        make_world_model_env(object(), BOX2, BOX2, num_envs=2, **kwargs)


def test_a_partials_bound_extra_keyword_and_methods_or_modules_naming_one_still_bind():
    """A keyword a partial binds has its value (it was refused as 'would stay at its default'); a module's or a
    method's mask=None (an attention mask) is its own business, as on the model's discovered methods."""
    class Encoder(nn.Module):
        def forward(self, obs, mask=None):
            return obs + (0 if mask is None else mask)

    class Model:
        def encode(self, obs, mask=None):
            return obs * 2

    reward = functools.partial(_reward_with_mask, mask=torch.tensor([1.0, 0.0]))
    env = make_world_model_env(Model(), BOX2, BOX2, num_envs=2, transition_fn=lambda s, a: s, reward_fn=reward,
                               initial_observation=torch.ones(2), encode_fn=Model().encode)
    td = env.reset()
    td["action"] = torch.zeros(2, 2)
    nxt = env.step(td)["next"]
    assert nxt["observation"].tolist() == [[2.0, 2.0]] * 2  # the state the method, passed explicitly, encoded
    assert nxt["reward"].view(-1).tolist() == [4.0, 4.0]
    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, transition_fn=lambda s, a: s, encode_fn=Encoder(),
                               initial_observation=torch.ones(2))
    assert env.reset()["observation"].tolist() == [[1.0, 1.0]] * 2


def test_positional_only_model_and_later_extras_bind_by_position_then_name():
    got = {}

    def reset_fn(model, /, num_envs, seed=None):
        got.update(model=model, num_envs=num_envs, seed=seed)
        return torch.zeros(num_envs, 2)

    class Model:
        def encode(self, obs, mask=None):  # an unsupplied name with a default, not reached: kept as it is
            got["mask"] = mask
            return obs

    model = Model()
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, reset_fn=reset_fn, transition_fn=lambda s, a: s)
    env.reset(seed=5)
    assert {k: got[k] for k in ("model", "num_envs", "seed")} == {"model": model, "num_envs": 2, "seed": 5}
    encoded = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_observation=torch.ones(2),
                            transition_fn=lambda s, a: s)
    assert encoded.reset()["observation"].tolist() == [[1.0, 1.0]] * 2 and got["mask"] is None


@pytest.mark.parametrize("role", ["reward_fn", "terminal_fn", "action_transform_fn"])
def test_make_world_model_env_reads_every_adapter_signature_at_construction(role):
    with pytest.raises(AdapterError, match=f"{role} .*fits none of the accepted"):
        make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                             transition_fn=lambda s, a: {"state": s}, **{role: lambda a, b, c, d, e: a})


def test_reset_fn_gets_an_empty_options_dict_when_none_were_given():
    # the seed design's reset: options = {} when the caller gives none, so options.get(...) works in every reset
    seen = []

    def reset_fn(model, seed, options):
        seen.append(dict(options))
        options["written"] = True  # a reset_fn may write to its options: each reset gets a fresh dict
        return torch.full((2,), float(options.get("start", 0.0)))

    def transition(state, action):
        return {"state": state + 1, "observation": state + 1, "terminated": state[..., :1] >= 2}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, reset_fn=reset_fn, transition_fn=transition, seed=0)
    assert env.reset(options={"start": 1.0})["observation"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert env.reset()["observation"].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    env.rollout(6, break_when_any_done=False)  # automatic resets: TorchRL's maybe_reset and the fast path
    assert len(seen) > 3 and seen[0] == {"start": 1.0} and all(o == {} for o in seen[1:])


def test_transition_generator_extra_is_the_env_generator():
    got = []

    def transition(state, action, generator):
        got.append(generator)
        return state

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=1, initial_state=torch.zeros(2), transition_fn=transition)
    step_once(env)
    assert got == [env.generator]


@pytest.mark.parametrize("role", ["action_transform_fn", "reward_fn", "terminal_fn"])
def test_adapter_transforms_generator_extra_is_the_step_stream(role):
    """Steps draw from env.generator, resets from env.reset_generator: a partial reset never moves a step's noise."""
    got = []

    def action_transform_fn(action, generator):
        got.append(generator)
        return action

    def reward_fn(state, obs, action, generator):
        got.append(generator)
        return state[:, 0]

    def terminal_fn(state, obs, action, generator):
        got.append(generator)
        return state[:, 0] > 100

    fn = {"action_transform_fn": action_transform_fn, "reward_fn": reward_fn, "terminal_fn": terminal_fn}[role]
    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), seed=0,
                               transition_fn=lambda s, a: s + a, **{role: fn})
    step_once(env)
    assert got[-1] is env.base_env.generator and got[-1] is not env.base_env.reset_generator


def test_name_tie_breaks_and_var_positional():
    model = object()
    # a first parameter called "model" means the model, even with a default on the last one
    b = bind(
        lambda model, state, action=None: (model, state, action), "transition_fn", ("state", "action"), model=model
    )
    assert b.form == ("model", "state", "action") and b("s", "a") == (model, "s", "a")
    # an extra defaulted parameter: the exact required count wins
    b = bind(lambda s, a, extra=3: (s, a, extra), "transition_fn", ("state", "action"), model=model)
    assert b.form == ("state", "action") and b("s", "a") == ("s", "a", 3)
    # *args: the seed's full convention, model first
    b = bind(lambda *args: args, "transition_fn", ("state", "action"), model=model)
    assert b("s", "a") == (model, "s", "a")
    # functools.partial and callable objects
    b = bind(functools.partial(lambda k, s, a: (k, s, a), 9), "transition_fn", ("state", "action"), model=model)
    assert b("s", "a") == (9, "s", "a")

    class Call:
        def __call__(self, state, action):
            return state, action

    assert bind(Call(), "transition_fn", ("state", "action"), model=model)("s", "a") == ("s", "a")


def test_bad_signatures_raise_adapter_error_naming_the_signature():
    with pytest.raises(
        AdapterError, match=r"takes 4 required positional argument.*transition_fn\(model, state, action\)"
    ):
        bind(lambda a, b, c, d: None, "transition_fn", ("state", "action"), model=None)
    with pytest.raises(AdapterError, match="required keyword-only parameters \\['scale'\\]"):
        bind(lambda s, a, *, scale: None, "transition_fn", ("state", "action"), model=None)
    with pytest.raises(AdapterError, match="expected a callable"):
        bind(3, "transition_fn", ("state", "action"))



def test_torchscript_functions_parameters_with_defaults_stay_optional():
    """A TorchScript function's defaulted parameter is optional, as inspect.signature says of the Python function:
    a scripted reward_fn(state, obs, action, scale=2.0) binds as reward_fn(state, obs, action), not with the model."""

    def reward(state: torch.Tensor, obs: torch.Tensor, action: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return obs.sum(-1) * scale

    def transition(state: torch.Tensor, action: torch.Tensor, noise: float = 0.0) -> torch.Tensor:
        return state + action + noise  # a bare state: reward_fn fills the reward in

    reward, transition = torch.jit.script(reward), torch.jit.script(transition)
    assert bind(reward, "reward_fn", ("state", "obs", "action"), model=object()).form == ("state", "obs", "action")
    assert bind(transition, "transition_fn", ("state", "action"), model=object()).form == ("state", "action")
    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.full((2,), 0.5),
                               transition_fn=transition, reward_fn=reward)
    out = step_once(env, torch.full((2, 2), 0.25))
    assert torch.equal(out["observation"], torch.full((2, 2), 0.75))
    assert out["reward"].view(-1).tolist() == [3.0, 3.0]


# ---------------------------------------------------------------------------------------------
# model method discovery
# ---------------------------------------------------------------------------------------------


def test_discovery_order_and_call_conventions():
    class Both:
        def predict(self, state, action):
            return "predict"

        def step(self, state, action):
            return "step"

        def env_step(self, state, action):
            return "env_step"

        def __call__(self, state, action):
            return "call"

    assert discover_transition(Both())(None, None) == "env_step"
    del Both.env_step
    assert discover_transition(Both())(None, None) == "step"
    del Both.step
    assert discover_transition(Both())(None, None) == "predict"
    del Both.predict
    assert discover_transition(Both())(None, None) == "call"

    class ActionOnly:  # keeps its own state: step(action)
        def step(self, action):
            return ("action", action)

    assert discover_transition(ActionOnly())("state", "a") == ("action", "a")

    class Module(nn.Module):
        def forward(self, state, action):
            return state * 2

    assert torch.equal(discover_transition(Module())(torch.ones(1), None), torch.full((1,), 2.0))
    with pytest.raises(AdapterError, match="has no transition"):
        discover_transition(object())


def test_imagine_step_with_defaulted_third_parameter_gets_state_and_action():
    model = RSSMLike()
    bound = discover_transition(model)
    assert bound.form == ("state", "action")


def test_discovered_methods_count_parameters_with_defaults_as_the_seed_does():
    # the seed's rule, so models written for it move over unchanged: one positional parameter is
    # method(action); two or more, defaults included, is method(state, action)
    class Stateful(nn.Module):  # keeps its own latent
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def step(self, action):
            return self.lin(action)

    bound = discover_transition(Stateful())
    assert bound.form == ("action",)
    assert bound(torch.zeros(3, 5), torch.ones(3, 2)).shape == (3, 2)  # the env passes (state, action)

    class OptionalAction(nn.Module):  # forward(s, a=None): worked in the seed as (state, action)
        def forward(self, s, a=None):
            return s + a.sum(-1, keepdim=True)

    bound = discover_transition(OptionalAction())
    assert bound.form == ("state", "action")
    assert torch.equal(bound(torch.zeros(3, 1), torch.ones(3, 2)), torch.full((3, 1), 2.0))
    # imagine_step(prev_state, prev_action, nonterm=1.0) gets (state, action)
    assert discover_transition(RSSMLike()).form == ("state", "action")

    class FlagAfterAction:  # a first parameter named action: the model keeps its own state (by position, the
        def step(self, action, deterministic=False):  # seed would pass it the state)
            return action, deterministic

    bound = discover_transition(FlagAfterAction())
    assert bound.form == ("action",)
    assert bound("s", "a") == ("a", False)



class _StepTakingArgs:
    def __init__(self):
        self.calls = []

    def step(self, *args):  # the seed's full convention: (state, action)
        self.calls.append(args)
        state, action = args if len(args) == 2 else (torch.zeros_like(args[0]), args[0])
        return state + action


class _StepWithoutASignature:
    step = staticmethod(torch.add)  # a C builtin: its signature cannot be read; step(state, action) = state + action


@pytest.mark.parametrize("cls", [_StepTakingArgs, _StepWithoutASignature], ids=["*args", "unreadable"])
def test_a_discovered_method_taking_args_or_without_a_readable_signature_gets_state_and_action(cls):
    """_accepts_two: a method taking *args, or one whose signature cannot be read, is called as method(state, action)
    (the seed's convention); only a readable signature with at most one positional parameter is method(action)."""
    model = cls()
    assert discover_transition(model).form == ("state", "action")
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_state=torch.full((2,), 0.5))
    out = step_once(env, torch.full((2, 2), 0.25))
    assert torch.equal(out["observation"], torch.full((2, 2), 0.75))
    if cls is _StepTakingArgs:
        state, action = model.calls[-1]
        assert torch.equal(state, torch.full((2, 2), 0.5)) and torch.equal(action, torch.full((2, 2), 0.25))


def test_discovered_method_whose_names_contradict_its_arguments_is_an_adapter_error():
    class Reversed:
        def step(self, action, state):
            return state + action

    with pytest.raises(AdapterError, match=r"model.step .*\(action, state\): parameter 'action' would receive the "
                                           r"state"):
        discover_transition(Reversed())

    class ResetOptionsFirst:
        def reset(self, options, seed=None):
            return torch.zeros(3, 2)

    box = gym.spaces.Box(-1, 1, (2,))
    with pytest.raises(AdapterError, match=r"model.reset .*parameter 'options' would receive the seed"):
        WorldModelEnv(ResetOptionsFirst(), box, box, num_envs=3, transition_fn=lambda s, a: s + a)
    # a parameter named for an argument its method would never get: reproducibility lost without a word
    class ResetOptionsDefault:
        def reset(self, options=None, seed=None):  # called as reset(): both lost
            return torch.zeros(3, 2)

    class ResetBatchSizeFirst:
        def reset(self, batch_size=None, seed=None):  # called as reset(): the seed lost
            return torch.zeros(3, 2)

    for model, lost in ((ResetOptionsDefault(), "options"), (ResetBatchSizeFirst(), "seed")):
        with pytest.raises(AdapterError, match=rf"model.reset .*parameter '{lost}' would never receive the {lost}"):
            WorldModelEnv(model, box, box, num_envs=3, transition_fn=lambda s, a: s + a)
    # names that say nothing keep the seed's positional rule; a model-like name is the model's own business
    assert discover_transition(type("M", (), {"step": lambda self, net, a: net})()).form == ("state", "action")


def test_model_keeping_its_own_state_with_a_flag_steps_with_the_actions():
    class Stateful:
        def reset(self, num_envs):
            self.pos = torch.zeros(num_envs, 2)
            return self.pos.clone()

        def step(self, action, deterministic=False):
            self.pos = self.pos + action
            return self.pos.clone()

    box = gym.spaces.Box(-9, 9, (2,))
    env = WorldModelEnv(Stateful(), box, gym.spaces.Box(-1, 1, (2,)), num_envs=3, seed=0)
    td = env.reset()
    for _ in range(3):
        td = env.step(td.set("action", torch.ones(3, 2)))["next"]
    assert torch.equal(td["observation"], torch.full((3, 2), 3.0))


class _OwnStateWithMask:  # keeps its own state: step(action) with a keyword extra
    def __init__(self):
        self.pos, self.extras = torch.zeros(3, 2), []

    def step(self, a, mask=None):
        self.extras.append(mask)
        self.pos = self.pos + a
        return self.pos.clone()


class _OwnStateWithGenerator(_OwnStateWithMask):
    def step(self, a, generator=None):
        self.extras.append(generator)
        self.pos = self.pos + a
        return self.pos.clone()


@pytest.mark.parametrize("cls", [_OwnStateWithMask, _OwnStateWithGenerator], ids=["mask", "generator"])
def test_a_discovered_method_s_keyword_extra_is_not_a_second_positional_parameter(cls):
    """step(a, mask=None) / step(a, generator=None) is step(action) plus an extra by name, not step(state, action)."""
    model = cls()
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2))
    assert env.transition.form == ("action",)
    td = env.reset()
    for _ in range(2):
        td = env.step(td.set("action", torch.ones(3, 2)))["next"]
    assert torch.equal(td["observation"], torch.full((3, 2), 2.0))
    if cls is _OwnStateWithGenerator:
        assert all(isinstance(g, torch.Generator) for g in model.extras)


def test_discovery_skips_a_non_callable_attribute_named_like_a_method():
    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.step = 0  # a training-step counter, not a transition

        def predict(self, state, action):
            return state + action

    env = WorldModelEnv(Counted(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2))
    assert torch.equal(step_once(env, torch.ones(2, 2))["observation"], torch.ones(2, 2))


def test_model_reset_discovery_order_is_reset_env_then_reset_state_then_reset():
    class Resets:
        def reset_env(self, num_envs):
            return torch.full((num_envs, 2), 1.0)

        def reset_state(self, num_envs):
            return torch.full((num_envs, 2), 2.0)

        def reset(self, num_envs):
            return torch.full((num_envs, 2), 3.0)

        def step(self, state, action):
            return state

    for expected, name in ((1.0, "reset_env"), (2.0, "reset_state"), (3.0, "reset")):
        assert torch.equal(WorldModelEnv(Resets(), BOX2, BOX2, num_envs=2).reset()["observation"],
                           torch.full((2, 2), expected)), name
        delattr(Resets, name)


def test_model_parameter_that_is_not_first_is_an_adapter_error():
    with pytest.raises(AdapterError, match=r"parameter 'model' looks like the model but is not the first parameter.*"
                                           r"transition_fn\(model, state, action\); transition_fn\(state, action\)"):
        bind(lambda state, action, model: None, "transition_fn", ("state", "action"), model=object())
    with pytest.raises(AdapterError, match=r"parameter 'world_model' looks like the model"):
        bind(lambda seed, options, world_model: None, "reset_fn", ("seed", "options"), model=object(),
             prefix_forms=True)
    # an optional model parameter that receives nothing is left to its default; model-first is unchanged
    optional = bind(lambda state, action, model=None: None, "transition_fn", ("state", "action"))
    assert optional.form == ("state", "action")
    assert bind(lambda model, state, action: None, "transition_fn", ("state", "action")).form[0] == "model"


@pytest.mark.parametrize("name", sorted(MODEL_NAMES))
def test_a_parameter_named_for_the_model_under_any_alias_never_receives_the_state(name):
    """README: "a parameter named for one argument never receives another": fn(wm, action) bound as (state, action)."""
    transition = eval(f"lambda {name}, action: action")
    with pytest.raises(AdapterError, match=rf"parameter '{name}' would receive the state"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)


@pytest.mark.parametrize("transition, name", [(lambda state, model, action: state, "model"),
                                              (lambda s, wm, a: s, "wm")], ids=["model", "wm"])
def test_a_model_named_second_parameter_is_refused_as_not_first(transition, name):
    with pytest.raises(AdapterError, match=rf"parameter '{name}' looks like the model but is not the first parameter; "
                                           r"the model is passed first or not at all"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)


# ---------------------------------------------------------------------------------------------
# return forms: every form of the seed, lists like tuples, dict states are states
# ---------------------------------------------------------------------------------------------

N = 3


def _values(n=N):
    state = torch.arange(n * 2, dtype=torch.float32).view(n, 2) + 100
    obs = torch.arange(n * 2, dtype=torch.float32).view(n, 2)
    reward = torch.arange(n, dtype=torch.float32) + 0.5
    terminated = torch.tensor([True, False, True][:n] + [False] * max(0, n - 3))
    truncated = torch.tensor([False, True, False][:n] + [False] * max(0, n - 3))
    return state, obs, reward, terminated, truncated


def _form(name, seq=tuple, n=N):
    state, obs, reward, terminated, truncated = _values(n)
    forms = {
        "5": (
            seq([obs, reward, terminated, truncated, {"model_state": state}]),
            dict(state=state, obs=obs, reward=reward, terminated=terminated, truncated=truncated),
        ),
        "5-no-model-state": (
            seq([obs, reward, terminated, truncated, {}]),
            dict(state=obs, obs=obs, reward=reward, terminated=terminated, truncated=truncated),
        ),
        "4": (
            seq([obs, reward, terminated, {"model_state": state}]),
            dict(state=state, obs=obs, reward=reward, terminated=terminated, truncated=None),
        ),
        "3": (seq([state, obs, reward]), dict(state=state, obs=obs, reward=reward, terminated=None, truncated=None)),
        "6": (
            seq([state, obs, reward, terminated, truncated, {}]),
            dict(state=state, obs=obs, reward=reward, terminated=terminated, truncated=truncated),
        ),
        "mapping": (
            {"state": state, "observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated},
            dict(state=state, obs=obs, reward=reward, terminated=terminated, truncated=truncated),
        ),
        "mapping-next_state-obs-done": (
            {"next_state": state, "obs": obs, "reward": reward, "done": terminated},
            dict(state=state, obs=obs, reward=reward, terminated=terminated, truncated=None),
        ),
        "mapping-image": (
            {"state": state, "image": obs},
            dict(state=state, obs=obs, reward=None, terminated=None, truncated=None),
        ),
        "mapping-pixels": (
            {"state": state, "pixels": obs},
            dict(state=state, obs=obs, reward=None, terminated=None, truncated=None),
        ),
        "mapping-next_observation": (
            {"state": state, "next_observation": obs},
            dict(state=state, obs=obs, reward=None, terminated=None, truncated=None),
        ),
        "mapping-next_obs": (
            {"state": state, "next_obs": obs},
            dict(state=state, obs=obs, reward=None, terminated=None, truncated=None),
        ),
        "mapping-obs-only": (
            {"observation": obs, "reward": reward},
            dict(state=obs, obs=obs, reward=reward, terminated=None, truncated=None),
        ),
        "mapping-state-only": (
            {"state": state},
            dict(state=state, obs=state, reward=None, terminated=None, truncated=None),
        ),
        "mapping-info-model-state": (
            {"observation": obs, "info": {"model_state": state}},
            dict(state=state, obs=obs, reward=None, terminated=None, truncated=None),
        ),
        "tensordict": (
            TensorDict({"state": state, "observation": obs, "reward": reward}, [n]),
            dict(state=state, obs=obs, reward=reward, terminated=None, truncated=None),
        ),
        "bare": (state, dict(state=state, obs=state, reward=None, terminated=None, truncated=None)),
    }
    return forms[name]


ALL_FORMS = [
    "5",
    "5-no-model-state",
    "4",
    "3",
    "6",
    "mapping",
    "mapping-next_state-obs-done",
    "mapping-image",
    "mapping-pixels",
    "mapping-next_observation",
    "mapping-next_obs",
    "mapping-obs-only",
    "mapping-state-only",
    "mapping-info-model-state",
    "tensordict",
    "bare",
]


def _env_returning(result, n=N):
    return WorldModelEnv(
        object(), BOX2, BOX2, num_envs=n, initial_state=torch.zeros(2), transition_fn=lambda s, a: result
    )


def _check(out, env, expect, n=N):
    assert torch.equal(out["observation"], expect["obs"])
    assert torch.equal(env.state, expect["state"])
    reward = torch.zeros(n) if expect["reward"] is None else expect["reward"]
    assert torch.equal(out["reward"], reward.view(n, 1))
    term = torch.zeros(n, dtype=torch.bool) if expect["terminated"] is None else expect["terminated"]
    trunc = torch.zeros(n, dtype=torch.bool) if expect["truncated"] is None else expect["truncated"]
    assert torch.equal(out["terminated"], term.view(n, 1))
    assert torch.equal(out["truncated"], trunc.view(n, 1))
    assert torch.equal(out["done"], (term | trunc).view(n, 1))
    assert env.reward_from_model == (expect["reward"] is not None)
    assert env.terminated_from_model == (expect["terminated"] is not None)


@pytest.mark.parametrize("seq", [tuple, list], ids=["tuple", "list"])
@pytest.mark.parametrize("name", ALL_FORMS)
def test_every_transition_return_form(name, seq):
    result, expect = _form(name, seq)
    env = _env_returning(result)
    _check(step_once(env), env, expect)


def test_bug_list_return_is_read_like_a_tuple():
    """Seed bug: [obs, r, term, trunc, info] made the whole list the observation with reward 0."""
    result, expect = _form("5", list)
    env = _env_returning(result)
    out = step_once(env)
    assert out["reward"].view(-1).tolist() == expect["reward"].tolist()


@pytest.mark.parametrize("via", ["discovered imagine_step", "transition_fn"])
def test_bug_rssm_dict_state_advances(via):
    """Seed bug: a {"deter", "stoch"} state returned by imagine_step was read as the mapping form: the latent froze."""
    model = RSSMLike()
    init = {"deter": torch.zeros(3), "stoch": torch.zeros(2)}
    obs_space = gym.spaces.Dict(
        {
            "deter": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
            "stoch": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        }
    )
    kwargs = {} if via.startswith("discovered") else {"transition_fn": lambda m, s, a: m.imagine_step(s, a)}
    env = WorldModelEnv(model, obs_space, ACT1, num_envs=2, initial_state=init, **kwargs)
    rollout = env.rollout(4, break_when_any_done=False)
    deter = rollout["next", "deter"][0, :, 0]
    assert (deter[1:] > deter[:-1]).all(), "the latent must advance every step"
    assert isinstance(env.state, dict) and set(env.state) == {"deter", "stoch"}
    # the model received the state it returned at the previous step
    assert torch.equal(model.seen[2]["deter"], rollout["next", "deter"][:, 1])


def test_namedtuple_and_tensordict_states_are_states():
    init = RSSMState(torch.zeros(2), torch.ones(2))
    env = WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=init,
        initial_observation=torch.zeros(2),
        transition_fn=lambda s, a: (RSSMState(s.deter + 1, s.stoch), s.deter + 1, torch.zeros(2)),
    )
    step_once(env)
    assert isinstance(env.state, RSSMState) and env.state.deter.tolist() == [[1.0, 1.0]] * 2
    # a bare namedtuple is a state, never a 2-tuple form
    form, state, *_ = split_transition(RSSMState(torch.zeros(1), torch.zeros(1)), "t")
    assert isinstance(state, RSSMState)
    td_state = TensorDict({"h": torch.zeros(2, 2)}, [2])
    form, state, obs, reward, *_ = split_transition(td_state, "t")
    assert state is td_state and obs is td_state and reward is MISSING


def test_a_none_entry_of_a_dict_state_reaches_the_model():
    """_tree: a state may hold None; the start copied for the rows kept every key."""
    seen = []

    def transition(state, action):
        seen.append(sorted(state))
        h = state["h"] + action
        return {"h": h, "aux": None}, h, h.sum(-1)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, transition_fn=transition,
                        initial_state={"h": torch.zeros(2), "aux": None}, initial_observation=torch.zeros(2))
    env.rollout(2)
    assert seen == [["aux", "h"], ["aux", "h"]]


def test_a_nested_tensordict_state_without_a_batch_size_is_checked_by_its_leaves():
    def transition(state, action):
        h = state["z", "h"] + action
        return TensorDict({"z": {"h": h}}, batch_size=[]), h, h.sum(-1)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, transition_fn=transition,
                        initial_state=TensorDict({"z": {"h": torch.zeros(2)}}, []), initial_observation=torch.zeros(2))
    td = env.reset()
    for _ in range(2):
        td = env.step(td.set("action", torch.ones(3, 2)))["next"]
    assert torch.equal(td["observation"], torch.full((3, 2), 2.0))


def test_an_unbatched_tensordict_start_is_a_fresh_copy_per_row_for_a_model_stepping_in_place():
    def transition(state, action):
        state["h"].add_(action)  # an RNN-style in-place update
        return state, state["h"].clone(), state["h"].sum(-1)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=4, transition_fn=transition,
                        reset_fn=lambda: (TensorDict({"h": torch.zeros(2)}, []), torch.zeros(2)))
    out = step_once(env, torch.arange(4.0)[:, None].expand(4, 2))
    assert out["observation"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_tuple_initial_state_needs_an_initial_observation():
    with pytest.raises(
        ReturnFormError, match=r"initial_state \(the observation too, since no initial_observation is given\)"
    ):
        WorldModelEnv(
            object(),
            BOX2,
            BOX2,
            num_envs=2,
            initial_state=(torch.zeros(2), torch.zeros(1)),
            transition_fn=lambda s, a: s,
        )


def test_tuple_state_inside_a_mapping_and_its_batch_is_checked():
    env = WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=(torch.zeros(2), torch.zeros(1)),
        initial_observation=torch.zeros(2),
        transition_fn=lambda s, a: {"state": (s[0] + 1, s[1] - 1), "observation": s[0] + 1},
    )
    step_once(env)
    assert env.state[0].tolist() == [[1.0, 1.0]] * 2 and env.state[1].tolist() == [[-1.0]] * 2
    bad = WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=(torch.zeros(2), torch.zeros(1)),
        initial_observation=torch.zeros(2),
        transition_fn=lambda s, a: {"state": (s[0], torch.zeros(3, 1)), "observation": s[0]},
    )
    with pytest.raises(ReturnFormError, match=r"state\[1\]: expected leading batch dims \(2,\)"):
        step_once(bad)


def _counter_state_env(transition, **start):
    """Four rows of a model keeping a step counter ``"h"`` in its state; row ``i`` terminates at step ``i + 1``."""
    box1 = gym.spaces.Box(-50, 50, (1,), np.float32)
    start = start or dict(initial_state={"x": torch.zeros(1)}, initial_observation=torch.zeros(1), encode_fn=False)
    return WorldModelEnv(object(), box1, box1, num_envs=4, seed=0, transition_fn=transition, **start)


def _adds_a_key(state, action):
    h = state["h"] + 1 if "h" in state else torch.ones(state["x"].shape[0], 1)
    return {"state": {"x": state["x"], "h": h}, "obs": h, "terminated": h[:, 0] >= torch.arange(4.0) + 1}


@pytest.mark.parametrize(
    "start",
    [
        dict(initial_state={"x": torch.zeros(1)}, initial_observation=torch.zeros(1), encode_fn=False),
        dict(initial_observation=torch.zeros(1), encode_fn=lambda o: {"x": o}),
    ],
    ids=["initial_state", "encode_fn"],
)
def test_bug_a_partial_reset_refuses_a_stepped_state_laid_out_unlike_the_start(start):
    """A row merge walks the start state's leaves: a key only the model's step added was dropped from every
    row, the rows not reset included (or a raw KeyError); now the layouts are compared first. (A reset_fn's
    start was already checked against the live rows' layout.)"""
    env = _counter_state_env(_adds_a_key, **start)
    td = env.reset()
    for _ in range(3):
        td["action"] = torch.zeros(4, 1)
        td = env.step(td)["next"]
    assert env.state["h"].flatten().tolist() == [3.0] * 4
    td["_reset"] = torch.tensor([[True], [False], [False], [False]])
    with pytest.raises(ReturnFormError, match=(
        r"a partial reset puts the reset rows' start state into the other rows' state, but transition_fn "
        r".* returned a state laid out as \{'x': \(1,\), 'h': \(1,\)\} and the start state from "
        r"(initial_state|encode_fn).* is laid out as \{'x': \(1,\)\}"
    )):
        env.reset(td)
    with pytest.raises(ReturnFormError, match="laid out as"):  # the fast path's maybe_reset merges the same way
        _counter_state_env(_adds_a_key, **start).rollout(3, break_when_any_done=False)
    td = env.reset()  # a full reset replaces every row: nothing merged, nothing refused
    assert "h" not in env.state


@pytest.mark.parametrize(
    "start, transition, got, ref",
    [
        (dict(initial_state={"deter": torch.zeros(8), "stoch": torch.zeros(3)}),
         lambda s, a: {"state": {"deter": s["deter"] + 1}, "obs": s["deter"][:, :1] + 1},
         r"\{'deter': \(8,\)\}", r"\{'deter': \(8,\), 'stoch': \(3,\)\}"),
        (dict(initial_state=torch.zeros(3)),
         lambda s, a: {"state": torch.zeros(s.shape[0], 5) + s[:, :1] + 1, "obs": s[:, :1] + 1},
         r"\(5,\)", r"\(3,\)"),
        (dict(encode_fn=lambda o: torch.zeros(o.shape[0], 3)),
         lambda s, a: {"state": torch.zeros(s.shape[0], 5) + s[:, :1] + 1, "obs": s[:, :1] + 1},
         r"\(5,\)", r"\(3,\)"),
    ],
    ids=["missing-key", "shape", "encoded-shape"],
)
def test_bug_a_state_whose_keys_or_shapes_drift_is_refused_naming_both_layouts(start, transition, got, ref):
    """These failed deep in torch (KeyError 'stoch', index_copy_ slice shapes) at the first episode end."""

    def with_termination(s, a):
        out = transition(s, a)
        return {**out, "terminated": out["obs"][:, 0] >= torch.arange(4.0) + 1}

    env = _counter_state_env(with_termination, initial_observation=torch.zeros(1), **start)
    with pytest.raises(ReturnFormError, match=f"returned a state laid out as {got} and the start state .* is laid "
                                              f"out as {ref}"):
        env.rollout(4, break_when_any_done=False)


def _drops_a_key(state, action):
    return {"state": {"x": state["x"] + 1}, "obs": state["x"] + 1}


@pytest.mark.parametrize("transition, got, given", [
    (_adds_a_key, r"\{'x': \(1,\), 'h': \(1,\)\}", r"\{'x': \(1,\)\}"),
    (_drops_a_key, r"\{'x': \(1,\)\}", r"\{'x': \(1,\), 'h': \(1,\)\}"),  # the frozen rows lost "h"
], ids=["adds", "drops"])
def test_bug_a_step_mask_refuses_a_stepped_state_laid_out_unlike_the_one_given(transition, got, given):
    env = _counter_state_env(transition, initial_state={"x": torch.zeros(1), "h": torch.zeros(1)}
                             if transition is _drops_a_key else {"x": torch.zeros(1)},
                             initial_observation=torch.zeros(1), encode_fn=False)
    td = env.reset()
    td["action"] = torch.zeros(4, 1)
    td["_step"] = torch.tensor([True, False, True, True])
    with pytest.raises(ReturnFormError, match=(
        r"a '_step' mask keeps the frozen rows' state, but transition_fn .* returned a state laid out as "
        rf"{got} and the state it was given is laid out as {given}"
    )):
        env.step(td)


@pytest.mark.parametrize("sampled", [False, True], ids=["initial_state", "reset_fn"])
def test_a_state_stepped_in_another_dtype_merges_promoted_as_torch_where_does(sampled):
    """A mixed-precision model steps a float32 start in bfloat16: rows merge (the sampled start's index_copy
    failed on the dtypes), promoted to float32, and each row restarts from its start."""
    box1 = gym.spaces.Box(-50, 50, (1,), np.float32)

    def transition(s, a):
        nxt = (s + 1).to(torch.bfloat16)
        return {"state": nxt, "obs": nxt.float(), "terminated": nxt[:, 0].float() >= torch.arange(4.0) + 1}

    start = (dict(reset_fn=lambda num_envs: (torch.zeros(num_envs, 1), torch.zeros(num_envs, 1))) if sampled
             else dict(initial_state=torch.zeros(1), initial_observation=torch.zeros(1)))
    env = WorldModelEnv(object(), box1, box1, num_envs=4, seed=0, transition_fn=transition, **start)
    out = env.rollout(5, break_when_any_done=False)
    assert out["next", "observation"][..., 0].tolist() == [
        [1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 1.0, 2.0, 1.0], [1.0, 2.0, 3.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0, 1.0]
    ]


def test_a_large_state_stepped_in_another_dtype_merges_under_a_step_mask():
    """A state of >= 16384 elements merges rows by index_copy_, which needs one dtype: float32 start, float64 step."""
    n, d = 64, 512

    def transition(s, a):
        nxt = s.double() + a[:, :1].double()
        return nxt, nxt[:, :2].float(), nxt[:, 0].float()

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, transition_fn=transition,
                        initial_state=torch.zeros(d), initial_observation=torch.zeros(2))
    td = env.reset()
    stepped = torch.arange(n) % 2 == 0
    out = env.step(td.set("action", torch.ones(n, 2)).set("_step", stepped))["next", "observation"]
    assert env.state.dtype == torch.float64
    assert torch.equal(out, stepped[:, None].float().expand(n, 2))


def test_a_float32_start_merged_into_a_bfloat16_state_keeps_its_exact_value():
    """A partial reset puts a float32 start into the rows of a state a mixed-precision model stepped in bfloat16:
    the merge promotes as torch.where does (a float32 state), never rounds the new rows' start to bfloat16."""
    box2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    start = torch.tensor([1.0 + 2**-12, 3.0])  # 1 + 2**-12 is not a bfloat16 (8 significant bits)
    assert start.to(torch.bfloat16).float()[0] != start[0]

    def transition(s, a):
        return {"state": (s + 1).to(torch.bfloat16), "obs": torch.zeros(4, 2)}

    env = WorldModelEnv(object(), box2, box2, num_envs=4, seed=0, transition_fn=transition,
                        reset_fn=lambda num_envs: (start.expand(num_envs, 2).clone(), torch.zeros(num_envs, 2)))
    td = env.reset()
    td["action"] = torch.zeros(4, 2)
    nxt = env.step(td)["next"]
    assert env.state.dtype == torch.bfloat16
    stepped = env.state.clone()
    env.reset(nxt.set("_reset", torch.tensor([[True], [False], [False], [False]])))
    assert env.state.dtype == torch.float32
    assert torch.equal(env.state[0], start)
    assert torch.equal(env.state[1:], stepped[1:].float())


def test_a_reset_fn_state_unlike_the_stepped_rows_names_both_functions():
    """With no layout declared, a partial reset's start is read against the other rows' state: the message named
    only the reset_fn, and the layout the transition changed as the one expected."""
    env = _counter_state_env(_adds_a_key, reset_fn=lambda num_envs: ({"x": torch.zeros(num_envs, 1)},
                                                                     torch.zeros(num_envs, 1)))
    with pytest.raises(ReturnFormError, match=(
        r"reset_fn .* returned .*: state leaves \{'x': \(1, 1\)\} are neither one row of the other rows' state, "
        r"which transition_fn .* returned, \{'x': \(1,\), 'h': \(1,\)\} .*A partial reset puts the reset rows' "
        r"start state into the other rows' state"
    )):
        env.rollout(3, break_when_any_done=False)


def test_states_in_different_containers_with_the_same_leaves_merge():
    """A TensorDict state stepped from a nested-dict start (and back) has the same layout: rows merge."""
    box1 = gym.spaces.Box(-50, 50, (1,), np.float32)

    def transition(s, a):
        x = s["a", "x"] if isinstance(s, TensorDict) else s["a"]["x"]
        nxt = TensorDict({"a": {"x": x + 1}}, batch_size=[4])
        return {"state": nxt, "obs": x + 1, "terminated": (x + 1)[:, 0] >= torch.arange(4.0) + 1}

    env = WorldModelEnv(object(), box1, box1, num_envs=4, seed=0, transition_fn=transition,
                        initial_state={"a": {"x": torch.zeros(1)}}, initial_observation=torch.zeros(1))
    out = env.rollout(4, break_when_any_done=False)
    # row i counts 1..i+1 then restarts from 0
    assert out["next", "observation"][..., 0].tolist() == [
        [1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 1.0, 2.0], [1.0, 2.0, 3.0, 1.0], [1.0, 2.0, 3.0, 4.0]
    ]


# ---------------------------------------------------------------------------------------------
# garbage and wrong values: clear errors naming the form
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result, match",
    [
        (None, r"returned NoneType None, which matches no transition return form; expected one of: \(obs, reward"),
        ("x", r"returned str 'x', which matches no transition return form"),
        (3, r"returned int 3, which matches no transition return form"),
        ((), r"returned a 0-tuple, which matches no transition return form"),
        ((torch.zeros(2, 2),), r"returned a 1-tuple"),
        ((torch.zeros(2, 2), torch.zeros(2, 2)), r"returned a 2-tuple.*A tuple state must be returned inside a form"),
        (tuple(torch.zeros(2, 2) for _ in range(7)), r"returned a 7-tuple"),
        ([torch.zeros(2, 2)] * 8, r"returned a 8-list"),
    ],
)
def test_bug_garbage_returns_raise(result, match):
    """Seed bug: None, "x", (), a 7-tuple... were accepted without any error (silently truncated to item 0)."""
    env = WorldModelEnv(
        object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=lambda s, a: result
    )
    with pytest.raises(ReturnFormError, match=match):
        step_once(env)


@pytest.mark.parametrize(
    "result, match",
    [
        (
            {"state": torch.zeros(2, 2), "observation": torch.zeros(3, 2)},
            r"mapping.*observation: expected dtype torch.float32 and shape \(2, 2\), "
            r"got Tensor\(dtype=torch.float32, shape=\(3, 2\)\)",
        ),
        (
            {"state": torch.zeros(2, 2), "observation": torch.zeros(2, 2, dtype=torch.float64)},
            r"observation: expected dtype torch.float32 and shape \(2, 2\), got Tensor\(dtype=torch.float64",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(3)),
            r"3-tuple read as \(state, obs, reward\): reward: expected shape \(2, 1\) or \(2,\)",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, dtype=torch.float64)),
            r"reward: expected dtype torch.float32 \(the reward spec\), got Tensor\(dtype=torch.float64",
        ),
        (
            # named as the model returned it: a numpy array of shape (2,), not the tensor it was converted to
            (torch.zeros(2, 2), torch.zeros(2, 2), np.ones(2)),
            r"reward: expected dtype torch.float32 \(the reward spec\), got ndarray\(dtype=float64, shape=\(2,\)\); "
            r"cast it in the model, or declare that dtype with "
            r"reward_spec=Unbounded\(shape=\(1,\), dtype=torch.float64\)",
        ),
        (
            (torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool), {}),
            r"4-tuple read as \(obs, reward, done, info\): observation: "
            r"expected dtype torch.float32 and shape \(2, 2\)",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), torch.zeros(2), False, {}),
            r"5-tuple.*terminated: expected a bool tensor.*got Tensor\(dtype=torch.float32.*threshold it",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 2, dtype=torch.bool), False, {}),
            r"terminated: expected shape \(2, 1\) or \(2,\) \(one flag per env\)",
        ),
        (  # a 0-d tensor is one value for the batch (a reduced loss?): refused with a hint, never broadcast
            (torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(())),
            r"reward: expected shape \(2, 1\) or \(2,\) \(one reward per env\), got Tensor\(dtype=torch.float32, "
            r"shape=\(\)\); a 0-d tensor is one value for the whole batch .* or a Python number to give every env",
        ),
        (  # named as the model returned it: a numpy array
            (torch.zeros(2, 2), torch.zeros(2, 2), np.array(1.5, np.float32)),
            r"reward: expected shape .* got ndarray\(dtype=float32, shape=\(\)\); a 0-d array is one value",
        ),
        (  # what numpy's reductions return (r.sum(), (r > 1).any()): a scalar, refused as a 0-d array
            (torch.zeros(2, 2), torch.zeros(2, 2), np.float32(1.5)),
            r"reward: expected shape .* got float32\(dtype=float32, shape=\(\)\); a numpy scalar is one value",
        ),
        (  # a numpy scalar that is no number: the form error, not torch's conversion TypeError
            (torch.zeros(2, 2), torch.zeros(2, 2), np.str_("x")),
            r"reward: expected a float tensor of shape \(2, 1\), got str_\(dtype=<U1, shape=\(\)\)",
        ),
        (  # numpy makes timedelta64 a signed integer: float() refused it with a bare TypeError
            (torch.zeros(2, 2), torch.zeros(2, 2), np.timedelta64(3, "s")),
            r"reward: expected a float tensor of shape \(2, 1\), got timedelta64",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), np.bool_(True), False, {}),
            r"terminated: expected shape .* got bool\(dtype=bool, shape=\(\)\); a numpy scalar is one value",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), np.array(True), False, {}),
            r"terminated: expected shape .* got ndarray\(dtype=bool, shape=\(\)\); a 0-d array is one value",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), torch.tensor(False), False, {}),
            r"terminated: expected shape .* got Tensor\(dtype=torch.bool, shape=\(\)\); a 0-d tensor .* one flag per "
            r"env, or a Python bool to give",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), False, False, "info"),
            r"5-tuple read as .*: expected info to be a dict \(or None\), got str",
        ),
        # a seed-style Python int flag (done=1, 0, 2) is refused, never read as a bool: only bools broadcast
        (
            (torch.zeros(2, 2), torch.zeros(2), 1, False, {}),
            r"5-tuple.*terminated: expected a bool tensor of shape \(2, 1\) or a bool, got int 1",
        ),
        (
            (torch.zeros(2, 2), torch.zeros(2), False, 0, {}),
            r"5-tuple.*truncated: expected a bool tensor of shape \(2, 1\) or a bool, got int 0",
        ),
        (
            (torch.zeros(2, 2), 1.0, 2, {}),
            r"4-tuple read as \(obs, reward, done, info\): terminated: expected a bool tensor .* got int 2",
        ),
        (
            {"state": torch.zeros(2, 2), "terminated": 1},
            r"mapping.*terminated: expected a bool tensor .* got int 1",
        ),
        (
            {"state": torch.zeros(2, 2), "reward": torch.zeros(2), "latent": torch.zeros(2)},
            r"keys \['latent'\] are not part of the mapping return form",
        ),
        ({"observation": torch.zeros(2, 2), "obs": torch.zeros(2, 2)}, r"several observation keys"),
        (  # either could be the next state: never silently keep one (an echoed 'state' would never advance)
            {"state": torch.zeros(2, 2), "next_state": torch.ones(2, 2), "observation": torch.ones(2, 2)},
            r"mapping with keys \['next_state', 'observation', 'state'\]: both 'state' and 'next_state'",
        ),
        (
            {
                "terminated": torch.zeros(2, dtype=torch.bool),
                "done": torch.zeros(2, dtype=torch.bool),
                "state": torch.zeros(2, 2),
            },
            r"both 'terminated' and 'done'",
        ),
        (  # done = terminated | truncated: never guess terminated on a truncated row
            {"done": torch.ones(2, dtype=torch.bool), "truncated": torch.tensor([True, False]),
             "state": torch.zeros(2, 2)},
            r"'done' together with 'truncated' leaves 'terminated' unknown.*return 'terminated' and 'truncated'",
        ),
        ({"reward": torch.zeros(2)}, r"neither a state .* nor an observation"),
        ({"state": torch.zeros(2, 2), "reward": "high"}, r"reward: expected a float tensor of shape \(2, 1\), got str"),
    ],
)
def test_wrong_batch_dtype_and_bad_values_raise_naming_the_form(result, match):
    env = WorldModelEnv(
        object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=lambda s, a: result
    )
    with pytest.raises(ReturnFormError, match=match):
        step_once(env)


def test_error_names_the_adapter():
    def my_transition(state, action):
        return None

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=1, initial_state=torch.zeros(2), transition_fn=my_transition)
    with pytest.raises(ReturnFormError, match=r"transition_fn .*my_transition\(state, action\)"):
        step_once(env)


def test_bug_batched_reward_is_not_cut_to_its_first_element():
    """Seed bug: a batched reward tensor([1., 2.]) became 1.0."""
    env = _env_returning((torch.zeros(2, 2), torch.zeros(2, 2), torch.tensor([1.0, 2.0])), n=2)
    assert step_once(env)["reward"].view(-1).tolist() == [1.0, 2.0]


def test_python_scalars_broadcast_and_numpy_observations_convert():
    env = _env_returning((np.ones((2, 2), np.float32), 1.5, True, False, {}), n=2)
    out = step_once(env)
    assert out["reward"].view(-1).tolist() == [1.5, 1.5] and out["terminated"].all() and not out["truncated"].any()
    assert torch.equal(out["observation"], torch.ones(2, 2))


def test_an_unbatched_env_takes_numpy_scalars_as_python_numbers():
    # with no batch there is nothing to reduce over: a numpy scalar is the env's one reward or flag
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: (s, np.float64(1.5), np.bool_(True), False, {}))
    td = env.reset()
    out = env.step(td.set("action", torch.zeros(2)))["next"]
    assert out["reward"].tolist() == [1.5] and out["terminated"].tolist() == [True]


def test_numpy_flags_convert_like_numpy_observations_and_rewards():
    flags = np.array([True, False]), np.array([[False], [True]])
    out = step_once(_env_returning((np.ones((2, 2), np.float32), np.array([1.0, 2.0], np.float32), *flags, {}), n=2))
    assert out["terminated"].view(-1).tolist() == [True, False] and out["truncated"].view(-1).tolist() == [False, True]
    assert out["done"].view(-1).tolist() == [True, True]
    # named as the model returned it (a numpy array), as a reward is
    with pytest.raises(ReturnFormError, match=r"terminated: expected a bool tensor .*got ndarray\(dtype=float32, "
                                              r"shape=\(2,\)\) \(threshold it"):
        step_once(_env_returning((np.ones((2, 2), np.float32), 0.0, np.zeros(2, np.float32), False, {}), n=2))


def test_bug_float64_observation_for_float32_space_is_an_error():
    """Seed bug: a float64 obs for a float32 Box was returned as is (contains() False)."""
    env = _env_returning({"state": torch.zeros(2, 2, dtype=torch.float64)}, n=2)
    with pytest.raises(ReturnFormError, match="float64"):
        step_once(env)


def test_unbatched_transition_output_is_an_error_even_with_one_env():
    env = _env_returning((torch.zeros(2), torch.zeros(2), 0.0), n=1)
    with pytest.raises(ReturnFormError, match=r"observation: expected dtype torch.float32 and shape \(1, 2\)"):
        step_once(env)


# ---------------------------------------------------------------------------------------------
# reset forms
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("name", ["obs", "obs_info", "state_obs", "state_obs_info", "mapping", "mapping-state", "list"])
def test_every_reset_return_form(name, batched):
    n = 3
    lead = (n,) if batched else ()
    obs = torch.full((*lead, 2), 2.0)
    state = torch.full((*lead, 2), 5.0)
    results = {
        "obs": obs,
        "obs_info": (obs, {"note": 1}),
        "state_obs": (state, obs),
        "state_obs_info": (state, obs, {}),
        "mapping": {"state": state, "observation": obs, "info": {}},
        "mapping-state": {"state": state},
        "list": [state, obs],
    }

    def reset_fn(num_envs):
        assert num_envs == n
        return results[name]

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, reset_fn=reset_fn, transition_fn=lambda s, a: s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 'note' info key is not declared
        td = env.reset()
    expect_obs = {"mapping-state": 5.0}.get(name, 2.0)
    expect_state = 2.0 if name in ("obs", "obs_info") else 5.0  # obs forms: state = encode(obs) = obs (no encoder)
    assert torch.equal(td["observation"], torch.full((n, 2), expect_obs))
    assert torch.equal(env.state, torch.full((n, 2), expect_state))


def test_reset_obs_form_uses_initial_state_when_given():
    env = WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        reset_fn=lambda: torch.ones(2),
        initial_state=torch.full((2,), 9.0),
        transition_fn=lambda s, a: s,
    )
    env.reset()
    assert env.state.tolist() == [[9.0, 9.0]] * 2


_LATENT_STARTS = {
    # how a state apart from the 2-d observation enters: a constant start, a reset_fn's (state, obs), an encoder
    "initial_state": dict(initial_state=torch.zeros(8), initial_observation=torch.zeros(2)),
    "reset_fn": dict(reset_fn=lambda num_envs: (torch.zeros(num_envs, 8), torch.zeros(num_envs, 2))),
    "encoder": dict(initial_observation=torch.zeros(2), encode_fn=lambda obs: torch.cat([obs, obs, obs, obs], -1)),
    "dict latent": dict(initial_state={"deter": torch.zeros(6), "stoch": torch.zeros(2)},
                        initial_observation=torch.zeros(2)),
    # rows of shape (4, 2): the same last dim as the observation's, a different layout
    "matrix latent": dict(initial_state=torch.zeros(4, 2), initial_observation=torch.zeros(2)),
    # a reset's (obs, info) with the latent in info["model_state"], as a step's 4-/5-tuples carry it
    "reset info model_state": dict(reset_fn=lambda num_envs: (torch.zeros(num_envs, 2),
                                                              {"model_state": torch.zeros(num_envs, 8)})),
}
_STATELESS_FORMS = {
    "5-tuple": lambda obs: (obs, 0.0, False, False, {}),
    "4-tuple": lambda obs: [obs, 0.0, False, {}],
    "bare": lambda obs: obs,
    "mapping": lambda obs: {"observation": obs, "reward": 0.0},
}


def _latent_size(state) -> int:
    """The number of values in one row of ``state``."""
    return sum(v[0].numel() for v in state.values()) if isinstance(state, dict) else state[0].numel()


@pytest.mark.parametrize("start", sorted(_LATENT_STARTS))
@pytest.mark.parametrize("form", sorted(_STATELESS_FORMS))
def test_a_form_without_a_state_cannot_replace_a_separate_latent_with_the_observation(start, form):
    # a latent kept apart from the observation, and a step returning a form with no state of its own: the
    # observation would become the next state (the model then gets a (N, 2) state where it was given (N, 8));
    # refused, naming the forms that carry the state
    seen = []

    def step(state, action):
        seen.append(_latent_size(state))
        return _STATELESS_FORMS[form](torch.ones(3, 2))

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, transition_fn=step, **_LATENT_STARTS[start])
    td = env.reset()
    td["action"] = torch.zeros(3, 2)
    with pytest.raises(ReturnFormError, match=r"whose next state is its observation, laid out as \(2,\).*"
                       r"Return the next state with the observation.*info\['model_state'\]"):
        env.step(td)
    assert seen == [8], "the model got the latent once"


@pytest.mark.parametrize("start", sorted(_LATENT_STARTS))
def test_a_latent_returned_in_info_model_state_is_kept_across_steps(start):
    # the seed's way to keep a latent with the gymnasium 5-tuple: info["model_state"]; every step gets it back
    seen = []

    def step(state, action):
        seen.append(_latent_size(state))
        obs = torch.ones(3, 2)
        return obs, 0.0, False, False, {"model_state": state}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, transition_fn=step, **_LATENT_STARTS[start])
    env.rollout(4)
    assert seen == [8, 8, 8, 8]


class _OwnStateSim:
    """A model that keeps its own latent (discovered as ``step(action)``: the env never passes it a state), whose
    reset returns ``(state, obs)`` with a latent of another layout than the observation, as the seed allows."""

    def __init__(self, form):
        self.form = form

    def reset(self, num_envs):
        self.h = torch.zeros(num_envs, 8)
        return self.h.clone(), torch.zeros(num_envs, 2)

    def step(self, action):
        self.h = self.h + action.sum(-1, keepdim=True)
        obs = self.h[:, :2].clone()
        return _STATELESS_FORMS[self.form](obs)


@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("form", sorted(_STATELESS_FORMS))
def test_a_model_keeping_its_own_state_may_return_a_form_without_one(form, num_envs):
    # it never reads the env's state, so no latent can be lost: the env keeps the reset's (the seed runs such
    # models), and a partial reset merges its new rows into it
    env = WorldModelEnv(_OwnStateSim(form), BOX2, BOX2, num_envs=num_envs)
    td = env.reset()
    for t in range(1, 3):
        td["action"] = torch.full((num_envs, 2), 0.5)
        td = env.step(td)["next"]
        assert td["observation"].tolist() == [[float(t), float(t)]] * num_envs
    assert env.state.shape == (num_envs, 8)
    td["_reset"] = torch.zeros(num_envs, 1, dtype=torch.bool)
    td["_reset"][0] = True
    env.reset(td)
    assert env.state.shape == (num_envs, 8)


def test_an_observation_that_is_the_state_may_come_back_in_any_form():
    # no separate latent (the start is an observation): every form's observation is the next state, as the seed's
    for form in _STATELESS_FORMS.values():
        env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_observation=torch.zeros(2),
                            transition_fn=lambda s, a, form=form: form(s + 1))
        assert env.rollout(3)["next", "observation"][:, -1].tolist() == [[3.0, 3.0]] * 3


@pytest.mark.parametrize(
    "result, match",
    [
        (None, r"returned NoneType None, which matches no reset return form"),
        ((torch.zeros(2),) * 4, r"returned a 4-tuple, which matches no reset return form"),
        ({"state": torch.zeros(2), "reward": 1.0}, r"a reset has no reward or termination"),
        (torch.zeros(5, 2), r"observation: expected 3 row\(s\), one per row being reset .* shape=\(5, 2\)\)"),
        (torch.zeros(3, 2, dtype=torch.float16), r"observation: expected dtype torch.float32"),
    ],
)
def test_bug_bad_reset_returns_raise_instead_of_a_random_observation(result, match):
    """Seed bug: a reset returning None silently started from observation_space.sample()."""
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=lambda: result, transition_fn=lambda s, a: s)
    with pytest.raises(ReturnFormError, match=match):
        env.reset()


def test_a_mapping_with_exactly_the_dict_observation_keys_is_the_observation():
    keys = frozenset({"observation", "desired_goal"})
    goal = {"observation": torch.zeros(2), "desired_goal": torch.ones(2)}
    form, state, obs, info = split_reset(goal, "r", keys)
    assert state is MISSING and obs is goal and "read as the observation" in form
    form, state, obs, *_ = split_transition(goal, "t", keys)
    assert state is goal and obs is goal
    # other mappings with reserved keys are still the mapping return form
    form, state, obs, info = split_reset({"observation": goal, "state": torch.zeros(1)}, "r", keys)
    assert obs is goal and state.shape == (1,)
    with pytest.raises(ReturnFormError, match="not part of the mapping return form"):
        split_reset(goal, "r", None)
    # an RSSM {"deter", "stoch"} state is never the mapping return form, with or without Dict observation keys
    rssm = {"deter": torch.zeros(3), "stoch": torch.zeros(2)}
    for obs_keys in (None, keys, frozenset({"deter", "stoch"})):
        assert split_transition(rssm, "t", obs_keys)[1] is rssm
        assert split_reset(rssm, "r", obs_keys)[2] is rssm


def test_split_reset_two_tuple_with_dict_observation():
    keys = frozenset({"a", "b"})
    obs = {"a": 1, "b": 2}
    form, state, got_obs, info = split_reset(("s", obs), "r", keys)
    assert state == "s" and got_obs is obs and info == {}
    form, state, got_obs, info = split_reset((obs, {"note": 1}), "r", keys)
    assert state is MISSING and got_obs is obs and info == {"note": 1}


@pytest.mark.parametrize("seq", [tuple, list], ids=["tuple", "list"])
@pytest.mark.parametrize("dict_obs", [False, True], ids=["Box", "Dict"])
def test_a_reset_returning_obs_and_a_none_info_starts_the_rows_at_obs(seq, dict_obs):
    """(obs, None) is (obs, info) with no info, as a transition's None info is; it was read as (state, obs) and
    refused for a None observation."""
    n = 3
    if dict_obs:
        space, obs = gym.spaces.Dict({"a": BOX2, "b": BOX2}), {"a": torch.full((n, 2), 2.0), "b": torch.ones(n, 2)}
    else:
        space, obs = BOX2, torch.full((n, 2), 2.0)
    env = WorldModelEnv(object(), space, BOX2, num_envs=n, reset_fn=lambda: seq((obs, None)),
                        transition_fn=lambda s, a: s)
    td = env.reset()
    for key, value in (obs.items() if dict_obs else [("observation", obs)]):
        assert torch.equal(td[key], value)



@pytest.mark.parametrize("info", [{}, {"a": 3.0}, {"note": 1}], ids=["empty", "an-observation-key", "other-key"])
def test_a_reset_returning_obs_and_an_info_mapping_in_a_dict_observation_env_starts_the_rows_at_obs(info):
    """gymnasium's own reset form (obs, {}): the 2-tuple is (state, obs) only when the second item has exactly the
    Dict observation's keys; an empty info or one holding only some observation keys is (obs, info)."""
    n = 3
    keys = frozenset({"a", "b"})
    obs = {"a": torch.full((n, 2), 2.0), "b": torch.ones(n, 2)}
    form, state, got_obs, got_info = split_reset((obs, info), "r", keys)
    assert state is MISSING and got_obs is obs and got_info == info
    space = gym.spaces.Dict({"a": BOX2, "b": BOX2})
    env = WorldModelEnv(object(), space, BOX2, num_envs=n, reset_fn=lambda: (obs, info), transition_fn=lambda s, a: s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the undeclared info keys are not recorded
        td = env.reset()
    assert torch.equal(td["a"], obs["a"]) and torch.equal(td["b"], obs["b"])


def test_a_mapping_return_with_some_of_the_dict_observation_keys_is_the_mapping_form():
    """GoalEnv keys: {"observation": <the whole observation>} is the mapping form (its keys are not the
    observation's keys), not a bare observation missing 'desired_goal'."""
    space = gym.spaces.Dict({"observation": BOX2, "desired_goal": BOX2})

    def transition(state, action):
        return {"observation": {"observation": state["observation"] + action, "desired_goal": state["desired_goal"]}}

    env = WorldModelEnv(object(), space, BOX2, num_envs=3, transition_fn=transition,
                        initial_state={"observation": torch.zeros(2), "desired_goal": torch.ones(2)})
    out = step_once(env, torch.full((3, 2), 0.5))
    assert torch.equal(out["observation"], torch.full((3, 2), 0.5))
    assert torch.equal(out["desired_goal"], torch.ones(3, 2))


# ---------------------------------------------------------------------------------------------
# property tests: any form, any batch size
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(ALL_FORMS), n=st.integers(1, 9), as_list=st.booleans(), seed=st.integers(0, 2**16))
def test_property_any_form_any_batch_size(name, n, as_list, seed):
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(n, 2, generator=gen)
    obs = torch.randn(n, 2, generator=gen)
    reward = torch.randn(n, generator=gen)
    term = torch.rand(n, generator=gen) > 0.5
    trunc = torch.rand(n, generator=gen) > 0.5
    seq = list if as_list else tuple
    results = {
        "5": (seq([obs, reward, term, trunc, {"model_state": state}]), (state, obs, reward, term, trunc)),
        "5-no-model-state": (seq([obs, reward, term, trunc, {}]), (obs, obs, reward, term, trunc)),
        "4": (seq([obs, reward, term, {"model_state": state}]), (state, obs, reward, term, None)),
        "3": (seq([state, obs, reward]), (state, obs, reward, None, None)),
        "6": (seq([state, obs, reward, term, trunc, None]), (state, obs, reward, term, trunc)),
        "mapping": (
            {"state": state, "obs": obs, "reward": reward, "terminated": term, "truncated": trunc},
            (state, obs, reward, term, trunc),
        ),
        "mapping-next_state-obs-done": (
            {"next_state": state, "observation": obs, "done": term},
            (state, obs, None, term, None),
        ),
        "mapping-image": ({"state": state, "image": obs}, (state, obs, None, None, None)),
        "mapping-pixels": (
            {"state": state, "pixels": obs, "reward": reward.view(n, 1)},
            (state, obs, reward, None, None),
        ),
        "mapping-next_observation": ({"next_observation": obs}, (obs, obs, None, None, None)),
        "mapping-next_obs": ({"next_obs": obs, "truncated": trunc}, (obs, obs, None, None, trunc)),
        "mapping-obs-only": ({"observation": obs, "reward": reward}, (obs, obs, reward, None, None)),
        "mapping-state-only": ({"state": state}, (state, state, None, None, None)),
        "mapping-info-model-state": (
            {"observation": obs, "info": {"model_state": state}},
            (state, obs, None, None, None),
        ),
        "tensordict": (
            TensorDict({"state": state, "observation": obs, "reward": reward}, [n]),
            (state, obs, reward, None, None),
        ),
        "bare": (state, (state, state, None, None, None)),
    }
    result, (e_state, e_obs, e_reward, e_term, e_trunc) = results[name]
    env = _env_returning(result, n=n)
    out = step_once(env)
    _check(out, env, dict(state=e_state, obs=e_obs, reward=e_reward, terminated=e_term, truncated=e_trunc), n=n)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), bad=st.sampled_from(["obs_rows", "reward_rows", "term_dtype", "obs_dtype", "arity"]))
def test_property_wrong_values_always_raise(n, bad):
    state = torch.zeros(n, 2)
    result = {
        "obs_rows": (state, torch.zeros(n + 1, 2), torch.zeros(n)),
        "reward_rows": (state, state, torch.zeros(n + 2)),
        "term_dtype": (state, torch.zeros(n), torch.zeros(n, dtype=torch.int64), False, {}),
        "obs_dtype": (state, state.double(), torch.zeros(n)),
        "arity": tuple([state] * 7),
    }[bad]
    env = _env_returning(result, n=n)
    with pytest.raises(ReturnFormError):
        step_once(env)


# ---------------------------------------------------------------------------------------------
# the remaining seed bugs
# ---------------------------------------------------------------------------------------------


def test_bug_discrete_action_reaches_the_model_as_int64_indices():
    """Seed bug: a Discrete action became a 0-d float32 tensor."""
    seen = []

    def transition(state, action):
        seen.append(action)
        return state

    env = WorldModelEnv(
        object(), BOX2, gym.spaces.Discrete(4), num_envs=3, initial_state=torch.zeros(2), transition_fn=transition
    )
    td = env.reset()
    td["action"] = torch.tensor([0, 3, 1])
    env.step(td)
    assert seen[0].dtype == torch.int64 and seen[0].tolist() == [0, 3, 1]


def test_bug_dict_action_space_works():
    """Seed bug: Dict/Tuple action spaces crashed with torch_actions=True."""
    act = gym.spaces.Dict({"move": gym.spaces.Box(-1, 1, (2,), np.float32), "jump": gym.spaces.Discrete(2)})
    seen = []

    def transition(state, action):
        seen.append(action)
        return state + action["move"] * action["jump"].unsqueeze(-1)

    env = WorldModelEnv(object(), BOX2, act, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)
    rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["action", "move"].shape == (2, 3, 2) and rollout["action", "jump"].dtype == torch.int64
    assert isinstance(seen[0], TensorDict)


def test_bug_no_graph_growth_by_default():
    """Seed bug: without no_grad the state kept a grad_fn chain growing one link per step."""
    lin = nn.Linear(4, 2)
    env = WorldModelEnv(
        lin,
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=torch.zeros(2),
        transition_fn=lambda m, s, a: m(torch.cat([s, a], -1)),
    )
    env.rollout(50, break_when_any_done=False)
    assert env.state.grad_fn is None and not env.state.requires_grad


def test_bug_close_does_not_close_a_shared_model():
    """Seed bug: env.close() closed the model, shared by every vector worker."""

    class Model(CountingModel):
        closed = False

        def close(self):
            self.closed = True

    model = Model()
    env = WorldModelEnv(model, OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3))
    env.close()
    assert not model.closed


def test_bug_step_before_reset_raises():
    env = WorldModelEnv(CountingModel(), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3))
    td = env.fake_tensordict()
    with pytest.raises(RuntimeError, match="call reset"):
        env._step(td)


def test_seed_kwargs_that_are_transforms_here_explain_themselves():
    with pytest.raises(TypeError, match="StepCounter"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, initial_state=torch.zeros(3), max_episode_steps=5)
    with pytest.raises(TypeError, match="ObservationDecoder"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, initial_state=torch.zeros(3), render_fn=lambda m, s, o: None)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['bogus'\\]"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, initial_state=torch.zeros(3), bogus=1)


def test_undeclared_info_keys_warn_once_and_declared_ones_are_recorded():
    def transition(state, action):
        return state, state, torch.zeros(2), False, False, {"uncertainty": state[:, 0], "debug": 1}

    env = WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=torch.ones(2),
        transition_fn=transition,
        info_spec={"uncertainty": torch.zeros(())},
    )
    with pytest.warns(UserWarning, match=r"info keys \['debug'\] that are not recorded"):
        rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["next", "info", "uncertainty"].shape == (2, 3, 1)
    assert rollout["next", "info", "uncertainty"].flatten().tolist() == [1.0] * 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.rollout(2, break_when_any_done=False)  # warned once only


# ---------------------------------------------------------------------------------------------
# the seed design's own tests, ported (batched, TorchRL-native)
# ---------------------------------------------------------------------------------------------


def test_seed_port_counting_model_with_reset_method_and_dict_step():
    """Seed test 1: reset() returns (state, obs, info), step(state, action) returns a dict; time limit 3."""

    class CountingWorldModel:
        def reset(self, seed=None, options=None):
            return torch.zeros(1), torch.zeros(2), {"source": "reset"}

        def step(self, state, action):
            count = state + 1
            return {
                "state": count,
                "observation": count.expand(-1, 2).clone(),
                "reward": count[:, 0] + action[:, 0],
                "terminated": count[:, 0] >= 2,
            }

    env = make_world_model_env(
        CountingWorldModel(), BOX2, gym.spaces.Box(-1, 1, (1,), np.float32), num_envs=2, max_episode_steps=3
    )
    with pytest.warns(UserWarning, match=r"info keys \['source'\] that are not recorded"):
        td = env.reset()
    assert td["observation"].tolist() == [[0.0, 0.0]] * 2 and env.base_env.state.tolist() == [[0.0]] * 2
    td["action"] = torch.tensor([[0.5], [-0.5]])
    out = env.step(td)["next"]
    assert out["observation"].tolist() == [[1.0, 1.0]] * 2
    assert out["reward"].view(-1).tolist() == [1.5, 0.5]
    assert not out["terminated"].any() and not out["truncated"].any()
    assert out["step_count"].view(-1).tolist() == [1, 1]
    td = env.step_mdp(env.step(td))
    td["action"] = torch.zeros(2, 1)
    assert env.step(td)["next", "terminated"].all()


def test_seed_port_dict_model_adapters_reward_terminal_fallbacks_and_dict_observation():
    """Seed test 2: reset_fn/transition_fn adapters, reward_fn/terminal_fn fallbacks, Dict obs, max_episode_steps=1."""
    model = {"scale": 2.0}
    obs_space = gym.spaces.Dict({"position": BOX2, "velocity": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)})

    def reset_fn(model, seed, options):
        return {"state": torch.zeros(2), "observation": {"position": torch.zeros(2), "velocity": torch.zeros(1)}}

    def transition_fn(model, state, action):
        nxt = state + model["scale"] * action
        return {"next_state": nxt, "obs": {"position": nxt, "velocity": nxt[:, :1]}}

    env = make_world_model_env(
        model,
        obs_space,
        BOX2,
        num_envs=3,
        reset_fn=reset_fn,
        transition_fn=transition_fn,
        reward_fn=lambda model, state, obs, action: obs["position"].sum(-1),
        terminal_fn=lambda model, state, obs, action: torch.ones(state.shape[0], dtype=torch.bool),
        max_episode_steps=1,
    )
    td = env.reset()
    td["action"] = torch.ones(3, 2)
    out = env.step(td)["next"]
    assert out["position"].tolist() == [[2.0, 2.0]] * 3 and out["velocity"].tolist() == [[2.0]] * 3
    assert out["reward"].view(-1).tolist() == [4.0] * 3
    assert out["terminated"].all() and out["truncated"].all() and out["done"].all()
    check_env_specs_ok = env.rollout(3, break_when_any_done=False)
    assert check_env_specs_ok["next", "done"].all()


def test_seed_port_obs_info_reset_one_argument_action_transform_and_five_tuple():
    """Seed test 3: (obs, info) reset, a one-argument action_transform_fn, a 5-tuple with info['model_state']."""
    seen = []

    def transition(model, state, action):
        seen.append(action)
        nxt = state + action
        return nxt * 10, action[:, 0].float(), action[:, 0] == 2, False, {"model_state": nxt}

    env = make_world_model_env(
        object(),
        BOX2,
        gym.spaces.Discrete(3),
        num_envs=2,
        reset_fn=lambda: (torch.zeros(2), {"note": 1}),
        transition_fn=transition,
        action_transform_fn=lambda action: torch.stack([action, action], -1).float(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reset info key 'note' is not declared
        td = env.reset()
    td["action"] = torch.tensor([1, 2])
    out = env.step(td)["next"]
    assert torch.equal(seen[-1], torch.tensor([[1.0, 1.0], [2.0, 2.0]]))
    assert out["observation"].tolist() == [[10.0, 10.0], [20.0, 20.0]]
    assert env.base_env.state.tolist() == [[1.0, 1.0], [2.0, 2.0]], "the state is info['model_state'], not the obs"
    assert out["reward"].view(-1).tolist() == [1.0, 2.0] and out["terminated"].view(-1).tolist() == [False, True]


def test_the_env_make_world_model_env_returns_is_importable_from_the_package():
    # the README tells planner users to build their own chain as torchrl_swm.WorldModelTransformedEnv(env, t)
    import torchrl_swm

    env = make_world_model_env(CountingModel(), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3),
                               max_episode_steps=4)
    assert type(env) is torchrl_swm.WorldModelTransformedEnv
    assert "WorldModelTransformedEnv" in torchrl_swm.__all__


def test_differentiable_refuses_a_truthy_non_bool():
    """differentiable="no" was True: a graph through the model on every step."""
    with pytest.raises(TypeError, match=r"WorldModelEnv: differentiable: expected True or False, got str 'no'"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, initial_state=torch.zeros(3), differentiable="no")
    with pytest.raises(TypeError, match=r"ObservationDecoder: differentiable: expected True or False, got str 'no'"):
        ObservationDecoder(lambda s: s, differentiable="no")


def test_reward_from_model_follows_the_last_transition_so_reward_fn_fills_only_missing_rewards():
    """The flags describe the last transition: a model that omits its reward once must not have it overwritten later."""
    calls = []

    def transition(state, action):
        calls.append(1)
        out = {"state": state + action}
        if len(calls) > 1:  # the first step omits reward and terminated
            out["reward"], out["terminated"] = state[:, 0] + action[:, 0], state[:, :1] > 100
        return out

    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition,
                               reward_fn=lambda s, o, a: torch.full((2,), -99.0))
    td = env.reset().set("action", torch.ones(2, 2))
    out = env.step(td)
    assert out["next", "reward"].view(-1).tolist() == [-99.0, -99.0] and not env.base_env.reward_from_model
    out = env.step(env.step_mdp(out).set("action", torch.ones(2, 2)))
    assert out["next", "reward"].view(-1).tolist() == [2.0, 2.0]
    assert env.base_env.reward_from_model and env.base_env.terminated_from_model
