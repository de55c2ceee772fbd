"""make_env / register_backend / list_backends."""

from __future__ import annotations

import functools
import os

import gymnasium as gym
import pytest
import torch
from envs import CountingEnv, counting
from torchrl.envs import TransformedEnv
from wm_models import ACT1, OBS3, CountingModel, PointMass

import torchrl_swm
from torchrl_swm import EnvPool, WorldModelEnv, list_backends, make_env, register_backend
from torchrl_swm.factory import backend_aliases, unregister_backend


@pytest.fixture
def restore_registry():
    from torchrl_swm import factory

    saved = (dict(factory._FACTORIES), dict(factory._ALIASES), {k: list(v) for k, v in factory._DISPLAY.items()})
    yield
    factory._FACTORIES.clear(), factory._ALIASES.clear(), factory._DISPLAY.clear()
    factory._FACTORIES.update(saved[0]), factory._ALIASES.update(saved[1]), factory._DISPLAY.update(saved[2])


def test_public_names():
    assert torchrl_swm.make_env is make_env and torchrl_swm.list_backends is list_backends
    assert list_backends() == ["gym", "world-model"]
    assert backend_aliases() == {"gym": ["gymnasium"], "world-model": ["model", "wm"]}


@pytest.mark.parametrize("backend", ["gym", "gymnasium", " GYM ", "Gymnasium", "auto"])
def test_gym_backend_is_an_env_pool(backend):
    pool = make_env("CartPole-v1", backend=backend, num_envs=3, seed=0)
    assert isinstance(pool, EnvPool) and pool.num_envs == 3
    pool.close()


def test_gym_backend_with_factories_and_default_num_envs():
    pool = make_env([functools.partial(counting, length=4)] * 2, seed=0)
    assert isinstance(pool, EnvPool) and pool.num_envs == 2
    pool.close()
    pool = make_env("CartPole-v1")
    assert pool.num_envs == 1
    pool.close()
    pool = make_env(CountingEnv)  # one factory (an env class): one env, as for an id
    assert isinstance(pool, EnvPool) and pool.num_envs == 1
    pool.close()


@pytest.mark.parametrize(
    "backend", ["world-model", "world_model", "model", "wm", "WM", " wm ", "World_Model", "World-Model", "auto"]
)
def test_world_model_backend_and_its_aliases(backend):
    env = make_env(
        CountingModel(),
        backend=backend,
        observation_space=OBS3,
        action_space=ACT1,
        num_envs=2,
        initial_state=torch.zeros(3),
        max_episode_steps=3,
    )
    assert isinstance(env, TransformedEnv) and isinstance(env.base_env, WorldModelEnv)
    assert env.rollout(5, break_when_any_done=False).batch_size == (2, 5)


def test_auto_detects_modules_and_transition_fn_targets():
    env = make_env(
        PointMass(),
        observation_space=gym.spaces.Box(-10, 10, (4,)),
        action_space=gym.spaces.Box(-1, 1, (2,)),
        initial_state=torch.zeros(4),
    )
    assert isinstance(env.base_env, WorldModelEnv)
    env = make_env(
        {"weights": 1},
        observation_space=gym.spaces.Box(-10, 10, (2,)),
        action_space=gym.spaces.Box(-1, 1, (2,)),
        initial_state=torch.zeros(2),
        transition_fn=lambda s, a: s + a,
    )
    assert isinstance(env.base_env, WorldModelEnv)


def _env_recording_its_process():
    env = CountingEnv(length=3)
    env.pid = os.getpid()
    return env


def test_process_backend_is_an_env_pool_with_its_envs_in_worker_processes():
    # make_env(..., backend="process") is the documented shortcut for EnvPool(..., backend="process")
    pool = make_env([_env_recording_its_process] * 2, backend="process", num_workers=1, seed=0)  # one: a start costs
    try:
        assert isinstance(pool, EnvPool) and pool.num_envs == 2
        assert pool.get_attr("pid") == [pool.get_attr("pid")[0]] * 2 != [os.getpid()] * 2  # both in the worker
    finally:
        pool.close()
    serial = make_env([_env_recording_its_process] * 2, backend="serial", seed=0)
    assert serial.get_attr("pid") == [os.getpid()] * 2
    serial.close()


def test_list_backends_is_sorted_whatever_the_registration_order(restore_registry):
    # list_backends() gives the canonical names sorted: a backend registered last may come first
    register_backend("aaa", lambda target, **kwargs: target)
    try:
        assert list_backends() == ["aaa", "gym", "world-model"]
        assert list(backend_aliases()) == ["aaa", "gym", "world-model"]
    finally:
        unregister_backend("aaa")
    assert list_backends() == ["gym", "world-model"]


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown backend 'mujoco'; available backends: gym \(aliases: gymnasium\); "
        r"world-model \(aliases: model, wm\)",
    ):
        make_env("Ant-v4", backend="mujoco")


class _PlainConfig:  # a class whose constructor takes no argument, not an env
    pass


# an empty list is no sequence of env factories (EnvPool's own error would not list the backends), and a plain
# class is never read as one zero-argument env factory
@pytest.mark.parametrize("target", [3, object(), [1, 2], [], _PlainConfig, [lambda: gym.make("CartPole-v1"), "CartPole-v1"]],
                         ids=["int", "object", "list", "empty_list", "plain_class", "factory_and_id"])
def test_failed_auto_detection_lists_the_available_ones(target):
    with pytest.raises(ValueError, match=r"backend='auto' cannot tell.*available backends: gym"):
        make_env(target)


def test_auto_pools_a_gymnasium_vector_env():
    # a VectorEnv is no gym.Env and its step() looks like a transition method: it must not reach the world model
    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    env = make_env(venv, seed=0)
    try:
        assert isinstance(env, EnvPool) and env.batch_size == (2,)
        assert env.rollout(3, break_when_any_done=False).batch_size == (2, 3)
    finally:
        env.close()


def test_auto_pools_a_gymnasium_env_class_as_env_pool_takes_it():
    # a gym.Env subclass is a factory; its step() must not make it a world model
    from gymnasium.envs.classic_control import CartPoleEnv

    env = make_env(CartPoleEnv, num_envs=2, seed=0)
    reference = EnvPool(CartPoleEnv, 2, seed=0)
    try:
        assert isinstance(env, EnvPool) and env.batch_size == (2,)
        assert (env.reset()["observation"] == reference.reset()["observation"]).all()
    finally:
        env.close()
        reference.close()


def test_env_instances_are_refused_with_an_explanation():
    with pytest.raises(ValueError, match="environment instance"):
        make_env(gym.make("CartPole-v1"))
    # a TorchRL env instance too (an EnvPool already built, a GymEnv): its step() must not read as a world model's
    from torchrl.envs import GymEnv

    for env in (EnvPool("CartPole-v1", 1), GymEnv("CartPole-v1")):
        try:
            with pytest.raises(ValueError, match=rf"got an environment instance \({type(env).__name__}\)"):
                make_env(env)
        finally:
            env.close()


def test_bug_underlying_errors_are_not_swallowed():
    """Seed bug: the auto dispatcher swallowed every exception and ended in a confusing TypeError."""
    with pytest.raises(gym.error.NameNotFound, match="CartPol"):
        make_env("CartPol-v1", num_envs=2)
    with pytest.raises(TypeError, match="observation_space= and action_space= are required"):
        make_env(CountingModel(), backend="wm", action_space=ACT1)

    def broken(target, **kwargs):
        raise KeyError("from the factory")

    try:
        register_backend("broken", broken)
        with pytest.raises(KeyError, match="from the factory"):
            make_env("x", backend="broken")
    finally:
        unregister_backend("broken")


def test_bug_registered_backends_are_really_used(restore_registry):
    """Seed bug: register_env_backend() entries never reached make_env or list_env_backends."""
    seen = []

    def factory(target, **kwargs):
        seen.append((target, kwargs))
        return "built"

    register_backend("My Sim", factory, aliases=("ms", "my_sim_v2"))
    assert "my-sim" in list_backends() and backend_aliases()["my-sim"] == ["ms", "my_sim_v2"]
    assert make_env("level-1", backend="MS", difficulty=3) == "built"
    assert make_env("level-2", backend="my sim") == "built"
    assert make_env("level-3", backend="my-sim-v2") == "built"
    assert seen[0] == ("level-1", {"difficulty": 3})
    # re-registering replaces; aliases of other backends are protected
    register_backend("my_sim", lambda target, **kw: "v2")
    assert make_env("x", backend="my-sim") == "v2"
    with pytest.raises(ValueError, match="unknown backend 'ms'"):
        make_env("x", backend="ms")
    with pytest.raises(ValueError, match="'wm' already names backend 'world-model'"):
        register_backend("other", lambda target: None, aliases=("wm",))
    with pytest.raises(ValueError, match="reserved or empty"):
        register_backend("auto", lambda target: None)
    with pytest.raises(TypeError, match="must be callable"):
        register_backend("x", 3)
    unregister_backend("my-sim")
    assert "my-sim" not in list_backends()


def test_an_env_spec_builds_a_pool_as_its_id_does():
    import gymnasium as gym

    spec = gym.spec("CartPole-v1")
    with make_env(spec) as one, make_env(spec, num_envs=3) as three, make_env(spec, backend="gym") as also_one:
        assert (one.batch_size, three.batch_size, also_one.batch_size) == ((1,), (3,), (1,))
        assert isinstance(one, EnvPool) and one.env_spec.id == "CartPole-v1"


def test_auto_naming_a_backend_that_was_unregistered_says_so(restore_registry):
    unregister_backend("gym")
    with pytest.raises(ValueError, match=r"backend='auto' picked 'gym' for str target, but no 'gym' backend is "
                                         r"registered; available backends: world-model"):
        make_env("CartPole-v1")


def test_registered_backend_can_override_a_builtin(restore_registry):
    register_backend("gym", lambda target, **kwargs: ("custom", target), aliases=("gymnasium",))
    assert make_env("CartPole-v1") == ("custom", "CartPole-v1")


def test_transition_fn_picks_the_world_model_backend_whatever_the_target():
    """A string target went to gymnasium (NameNotFound), against the docstring's "any target given with
    transition_fn= -> world-model"."""
    import gymnasium as gym

    def transition(state, action):
        state = torch.tanh(state + action)
        return state, state, state.sum(-1), state[:, 0] > 0.9, torch.zeros(len(state), dtype=torch.bool), {}

    box = gym.spaces.Box(-1, 1, (2,))
    for target in ("pointmass-wm", None):
        env = make_env(target, transition_fn=transition, observation_space=box, action_space=box,
                       initial_state=torch.zeros(2), num_envs=4)
        assert env.batch_size == (4,) and env.rollout(3, break_when_any_done=False).batch_size == (4, 3)
        env.close()


def test_register_backend_aliases_are_checked_and_listed_once(restore_registry):
    def factory(target, **kwargs):
        return ("mine", target)

    register_backend("mine", factory, aliases=None)  # no aliases, as aliases=() (it raised a bare TypeError)
    assert backend_aliases()["mine"] == [] and make_env(1, backend="mine") == ("mine", 1)
    with pytest.raises(TypeError, match=r"register_backend\('mine'\): alias: expected a string, got int 3"):
        register_backend("mine", factory, aliases=("ok", 3))
    with pytest.raises(TypeError, match=r"register_backend\('mine'\): aliases: expected strings .*, got int 3"):
        register_backend("mine", factory, aliases=3)
    # aliases that normalize to the name or to an earlier alias add nothing, and are listed once
    register_backend("mine", factory, aliases=("m1", "M1", "m-1", "m_1", "Mine", " m 1 "))
    assert backend_aliases()["mine"] == ["m1", "m-1"]
    assert make_env(2, backend="M_1") == ("mine", 2)
    # an alias does not unregister its whole backend
    with pytest.raises(ValueError, match=r"'gymnasium' is an alias of backend 'gym'; unregister_backend\('gym'\)"):
        unregister_backend("gymnasium")
    assert "gym" in list_backends() and backend_aliases()["gym"] == ["gymnasium"]
    unregister_backend("mine")
    assert "mine" not in list_backends()


@pytest.mark.parametrize("flag", ["categorical_action_encoding", "pixels", "seed_every_episode"])
def test_pool_flags_refuse_truthy_non_bools(flag):
    """"no" was read as True (categorical encoding, pixels, seeding every episode), without a word."""
    with pytest.raises(TypeError, match=rf"EnvPool: {flag}: expected True.* or .*, got str 'no'"):
        make_env("CartPole-v1", num_envs=2, **{flag: "no"})
    with pytest.raises(TypeError, match=rf"EnvPool: {flag}: expected .*, got int 1"):
        EnvPool("CartPole-v1", 2, **{flag: 1})
    import numpy as np

    with EnvPool("CartPole-v1", 2, **{flag: np.bool_(False)}) as pool:  # numpy's bool is a bool
        assert pool.batch_size == (2,)


def test_none_for_a_true_or_false_argument_is_refused_naming_it(tmp_path):
    # None (an unset config field) reads as False: categorical_action_encoding=None silently gave one-hot
    # actions, DatasetWriter(overwrite=None) kept the old dataset. What a user sees is a TypeError naming the
    # argument; only arguments documented as taking None (seed_every_episode) accept it; review R4 E9
    from torchrl_swm.data import DatasetWriter

    for flag in ("categorical_action_encoding", "pixels"):
        with pytest.raises(TypeError, match=rf"^EnvPool: {flag}: expected True or False, got NoneType None$"):
            EnvPool("CartPole-v1", 2, **{flag: None})
    with EnvPool("CartPole-v1", 2, seed_every_episode=None) as pool:  # None: the documented default choice
        assert pool.batch_size == (2,)
    for flag in ("overwrite", "lazy"):
        with pytest.raises(TypeError, match=rf"^DatasetWriter: {flag}: expected True or False, got NoneType None$"):
            DatasetWriter(tmp_path / "ds", 10, **{flag: None})
    assert not (tmp_path / "ds").exists()


def test_masked_reset_without_a_vector_env_is_refused():
    """It was dropped without a word (the docstring: "for a VectorEnv only")."""
    with pytest.raises(ValueError, match=r"masked_reset= adapts a gymnasium VectorEnv's partial reset; got str"):
        make_env("CartPole-v1", num_envs=2, masked_reset=lambda *a, **k: 1 / 0)
    with pytest.raises(ValueError, match=r"masked_reset= .* got list env_fns"):
        EnvPool([counting(3)] * 2, masked_reset=True)


def test_auto_pools_one_zero_argument_factory_as_envpool_does():
    """EnvPool(factory, 8) is the README's own example; under auto it was 'cannot tell which backend'."""
    import gymnasium as gym

    with make_env(lambda: gym.make("CartPole-v1"), num_envs=3, seed=0) as pool:
        assert isinstance(pool, EnvPool) and pool.batch_size == (3,)
    with make_env(functools.partial(gym.make, "CartPole-v1")) as pool:
        assert pool.batch_size == (1,)
    with pytest.raises(ValueError, match=r"cannot tell which backend builds a function: .* \(backend='gym' for env "
                                         r"factories\)"):
        make_env(lambda state: state)  # takes an argument: neither an env factory nor a model it recognises


def test_auto_sends_callable_models_with_world_model_arguments_to_the_world_model_backend():
    """Callables whose parameters all have defaults were pooled as env factories once zero-argument factories
    were: a model's __call__(state=None, action=None), a decorated model (*args, **kwargs), with an error about
    gym.make kwargs. A world model's own keywords (observation_space=...) decide; a class is never a factory."""
    import gymnasium as gym

    def step(state, action):
        state = torch.tanh(state + action)
        return state, state, state.sum(-1), state[:, 0] > 2, torch.zeros(len(state), dtype=torch.bool), {}

    class Model:
        def __call__(self, state=None, action=None):
            return step(state, action)

    def wrapped(*args, **kwargs):  # a decorator without functools.wraps
        return step(*args, **kwargs)

    class Net(torch.nn.Module):
        def forward(self, state, action):
            return step(state, action)

    box = gym.spaces.Box(-1, 1, (2,))
    kwargs = dict(observation_space=box, action_space=box, num_envs=4, initial_state=torch.zeros(2))
    for model in (Model(), wrapped):
        env = make_env(model, **kwargs)
        assert not isinstance(env, EnvPool) and env.rollout(3, break_when_any_done=False).batch_size == (4, 3)
        env.close()
    with pytest.raises(ValueError,
                       match=r"got the class Net, an nn.Module: pass the model, an instance \(Net\(...\)\)"):
        make_env(Net, **kwargs)  # the class, not an instance
    # gym.make's own keywords are an env factory's too: still the gym backend (which says where they belong)
    with pytest.raises(TypeError, match=r"EnvPool: keyword arguments \['max_episode_steps'\] are only accepted with a "
                                        r"gymnasium id"):
        make_env(lambda: gym.make("CartPole-v1"), num_envs=4, max_episode_steps=100)
    from torchrl_swm import EnvError

    with pytest.raises(EnvError, match=r"env 0 \(make\): the factory raised TypeError"):
        make_env(Model())  # no world-model keyword: one env factory, as EnvPool(Model(), 1) reads it


def test_a_registered_serial_or_process_backend_is_used(restore_registry):
    # "serial" and "process" are EnvPool's backend= choice only while no backend of that name is registered
    for name in ("serial", "process"):
        register_backend(name, lambda target, name=name, **kwargs: (name, target, kwargs))
        assert make_env("CartPole-v1", backend=name.upper(), num_envs=2) == (name, "CartPole-v1", {"num_envs": 2})
        unregister_backend(name)
    with make_env("CartPole-v1", backend="serial", num_envs=2) as pool:  # EnvPool's own choice again
        assert isinstance(pool, EnvPool) and pool.batch_size == (2,)


def test_a_new_backend_name_cannot_take_another_backends_alias(restore_registry):
    # register_backend("gymnasium", f) would silently turn make_env(..., backend="gymnasium") away from gym
    for name, owner in (("gymnasium", "gym"), ("WM", "world-model"), ("Model", "world-model")):
        with pytest.raises(ValueError, match=rf"register_backend\({name!r}\): {name.lower()!r} already names backend "
                                             rf"{owner!r}; available backends: gym"):
            register_backend(name, lambda target, **kwargs: "hijacked")
    assert backend_aliases() == {"gym": ["gymnasium"], "world-model": ["model", "wm"]}
    with make_env("CartPole-v1", backend="gymnasium") as pool:
        assert isinstance(pool, EnvPool)


def test_register_backend_takes_one_alias_as_a_string_lists_aliases_stripped_and_refuses_auto(restore_registry):
    def factory(target, **kwargs):
        return ("mine", target)

    # a string is one alias, not a sequence of one-letter aliases
    register_backend("mine", factory, aliases="mb")
    assert backend_aliases()["mine"] == ["mb"] and make_env(1, backend="MB") == ("mine", 1)
    with pytest.raises(ValueError, match="unknown backend 'm'"):
        make_env(1, backend="m")
    # aliases are listed as registered, without the whitespace that matching ignores
    register_backend("mine", factory, aliases=[" Fast Sim "])
    assert backend_aliases()["mine"] == ["Fast Sim"] and make_env(2, backend="fast-sim") == ("mine", 2)
    with pytest.raises(ValueError, match=r"available backends: gym \(aliases: gymnasium\); mine \(aliases: Fast Sim\); "
                                         r"world-model"):
        make_env(3, backend="nope")
    # "auto" is make_env's detection, never a backend's alias (whatever its case or spacing)
    for alias in ("auto", " Auto "):
        with pytest.raises(ValueError, match=rf"register_backend\('mine'\): {alias!r} is not a valid alias \(reserved"):
            register_backend("mine", factory, aliases=["ok", alias])
    assert backend_aliases()["mine"] == ["Fast Sim"]  # a refused registration changes nothing
