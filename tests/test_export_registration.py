"""register_gymnasium_env: gymnasium.make and gymnasium.make_vec for TorchRL env factories."""

import functools
import pickle
import uuid
import warnings

import gymnasium as gym
import numpy as np
import pytest
from envs import StartActionEnv
from gymnasium.vector import AutoresetMode
from torchrl.envs import GymEnv

from torchrl_swm import EnvPool, register_gymnasium_env
from torchrl_swm.benchmarks.export import LAT, MLPWorldModelEnv
from torchrl_swm.export import TorchRLGymEnv, TorchRLVectorEnv


def _id(name):
    return f"TorchRLSWMTest/{name}{uuid.uuid4().hex[:6]}-v0"


def pool_factory(num_envs, seed_every_episode=True, **kwargs):
    """A batched factory that names seed_every_episode: registration sets it to gymnasium's convention."""
    return EnvPool("CartPole-v1", num_envs=num_envs, seed_every_episode=seed_every_episode, **kwargs)


def kwargs_pool_factory(num_envs, **kwargs):
    return EnvPool("CartPole-v1", num_envs=num_envs, **kwargs)


def test_batched_factory_make_vec_builds_one_batched_env():
    env_id = _id("Pool")
    register_gymnasium_env(env_id, pool_factory)
    envs = gym.make_vec(env_id, num_envs=6)
    assert isinstance(envs, TorchRLVectorEnv) and envs.num_envs == 6
    assert isinstance(envs.env, EnvPool) and envs.env.num_envs == 6  # one pool of 6, not 6 envs
    assert envs.spec.id == env_id and envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (6, 4)
    envs.step(envs.action_space.sample())
    envs.close()


def test_make_vec_picks_the_autoreset_mode_of_a_registered_batched_factory():
    # gymnasium passes a vector entry point's arguments as kwargs: autoreset_mode= is the export's, not the pool's
    env_id = _id("Pool")
    register_gymnasium_env(env_id, pool_factory)
    for mode, expected in [(AutoresetMode.SAME_STEP, AutoresetMode.SAME_STEP), ("disabled", AutoresetMode.DISABLED),
                           (None, AutoresetMode.NEXT_STEP)]:
        kwargs = {} if mode is None else {"autoreset_mode": mode}
        envs = gym.make_vec(env_id, num_envs=3, **kwargs)
        assert envs.metadata["autoreset_mode"] is expected and envs.autoreset_mode is expected
        envs.reset(seed=0)
        envs.step(np.zeros(3, np.int64))
        envs.close()
    with pytest.raises(ValueError, match=r"autoreset_mode"):
        gym.make_vec(env_id, num_envs=3, autoreset_mode="sometimes")


def test_batched_factory_make_builds_one_env():
    env_id = _id("Pool")
    register_gymnasium_env(env_id, functools.partial(EnvPool, "CartPole-v1"), max_episode_steps=20)
    env = gym.make(env_id)
    assert isinstance(env.unwrapped, TorchRLGymEnv) and env.unwrapped.env.num_envs == 1
    assert env.observation_space.shape == (4,) and env.action_space == gym.spaces.Discrete(2)
    env.reset(seed=0)
    for t in range(1, 30):
        _, _, terminated, truncated, _ = env.step(0 if t % 2 else 1)
        if terminated or truncated:
            break
    assert truncated and t == 20  # gymnasium's TimeLimit from the spec


@pytest.mark.parametrize("num_envs", [4, 2, 0, -1])
def test_make_with_num_envs_other_than_one_points_to_make_vec(num_envs):
    """Any num_envs but 1 is refused by gymnasium.make (0 and negative ones too, not built as one env)."""
    env_id = _id("Pool")
    register_gymnasium_env(env_id, functools.partial(EnvPool, "CartPole-v1"))
    with pytest.raises(TypeError, match=rf"gymnasium.make builds one env, got num_envs={num_envs}; use "
                                        r"gymnasium.make_vec"):
        gym.make(env_id, num_envs=num_envs)
    env = gym.make(env_id, num_envs=1)  # the one env make builds anyway
    assert env.unwrapped.env.num_envs == 1 and env.reset(seed=0)[0].shape == (4,)
    env.close()


def test_make_vec_applies_max_episode_steps_as_step_counter():
    env_id = _id("WorldModel")
    register_gymnasium_env(env_id, lambda num_envs: MLPWorldModelEnv(batch_size=num_envs), max_episode_steps=5,
                           batched=True, autoreset_mode="same_step")
    envs = gym.make_vec(env_id, num_envs=4)
    assert envs.single_observation_space.shape == (LAT,)  # StepCounter's step_count is not an observation
    envs.reset(seed=0)
    zero = np.zeros((4, 6), np.float32)
    truncated = [envs.step(zero)[3] for _ in range(5)]
    assert truncated[-1].any() and not any(t.any() for t in truncated[:-1])


def test_unbatched_factory_make_and_make_vec():
    env_id = _id("GymEnv")
    register_gymnasium_env(env_id, functools.partial(GymEnv, "MountainCar-v0"))
    env = gym.make(env_id)
    assert isinstance(env.unwrapped, TorchRLGymEnv)
    envs = gym.make_vec(env_id, num_envs=3)  # no vector entry point: gymnasium's SyncVectorEnv of 3
    assert isinstance(envs, gym.vector.SyncVectorEnv) and envs.num_envs == 3
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 2)
    envs.step(envs.action_space.sample())
    envs.close()


def test_kwargs_reach_the_factory():
    env_id = _id("Pool")
    register_gymnasium_env(env_id, pool_factory, kwargs={"seed": 3})
    a, _ = gym.make_vec(env_id, num_envs=2).reset()
    b, _ = gym.make_vec(env_id, num_envs=2, seed=3).reset()
    assert np.array_equal(a, b)
    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=0)
    assert env.render().shape[-1] == 3


def test_a_render_mode_the_export_cannot_honour_warns_at_make():
    # as gymnasium.make warns for a render mode the env does not list: never a silent render_mode=None
    unbatched = _id("Unbatched")
    register_gymnasium_env(unbatched, lambda render_mode=None: GymEnv("CartPole-v1", render_mode=render_mode))
    with pytest.warns(UserWarning, match=r"render_mode='rgb_array'.*\(GymEnv\) is not an EnvPool.*render_mode=None"):
        env = gym.make(unbatched, render_mode="rgb_array")
    assert env.render_mode is None
    env.close()

    def ignoring(num_envs, render_mode=None):  # takes render_mode but does not pass it on
        return EnvPool("CartPole-v1", num_envs=num_envs, seed_every_episode=False)

    batched = _id("Ignoring")
    register_gymnasium_env(batched, ignoring)
    with pytest.warns(UserWarning, match=r"the EnvPool it built has render_mode=None.*EnvPool\(\.\.\., render_mode"):
        gym.make(batched, render_mode="rgb_array").close()
    with pytest.warns(UserWarning, match=r"the EnvPool it built has render_mode=None"):
        gym.make_vec(batched, num_envs=2, render_mode="rgb_array").close()


def test_a_render_mode_the_pool_takes_gives_no_warning():
    env_id = _id("Pool")
    register_gymnasium_env(env_id, pool_factory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = [gym.make(env_id, render_mode="rgb_array"), gym.make_vec(env_id, num_envs=2, render_mode="rgb_array")]
        gym.make(env_id).close()  # no render mode asked, none given
        # no render mode asked of gymnasium, one bound in the factory: the pool's own mode is kept, no warning
        bound = _id("BoundRender")
        register_gymnasium_env(bound, functools.partial(EnvPool, "CartPole-v1", render_mode="rgb_array"))
        envs.append(gym.make(bound))
    assert [str(w.message) for w in caught if "render_mode" in str(w.message)] == []
    for env in envs:
        assert env.render_mode == "rgb_array"
        env.close()


def test_entry_points_pickle():
    env_id = _id("Pool")
    spec = register_gymnasium_env(env_id, pool_factory)
    for entry in (spec.entry_point, spec.vector_entry_point):
        assert callable(pickle.loads(pickle.dumps(entry)))


def test_async_make_vec_of_an_unbatched_factory():
    env_id = _id("GymEnv")
    register_gymnasium_env(env_id, functools.partial(GymEnv, "MountainCar-v0"))
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode="async")
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 2)
    finally:
        envs.close()


def test_bad_registration_arguments():
    with pytest.raises(TypeError, match="callable"):
        register_gymnasium_env(_id("Bad"), "CartPole-v1")
    with pytest.raises(ValueError, match="autoreset_mode"):
        register_gymnasium_env(_id("Bad"), pool_factory, autoreset_mode="sometimes")


def _first_obs_of_episodes(envs, steps=300):
    """The first observation of every episode of every env of a NEXT_STEP vector env: {env: [obs, ...]}."""
    obs, _ = envs.reset(seed=0)
    starts = {i: [obs[i].copy()] for i in range(envs.num_envs)}
    rng = np.random.default_rng(0)
    pending = np.zeros(envs.num_envs, bool)
    for _ in range(steps):
        obs, _, term, trunc, _ = envs.step(rng.integers(0, 2, envs.num_envs))
        for i in np.flatnonzero(pending):
            starts[i].append(obs[i].copy())
        pending = term | trunc
    return starts


@pytest.mark.parametrize("factory", [functools.partial(EnvPool, "CartPole-v1"), pool_factory])
def test_make_follows_gymnasium_seeding(factory):
    """gymnasium.make(id): reset(seed=0) then reset() continues the stream, as gymnasium's own CartPole
    (it is not reset(seed=1)), and make_vec over such envs gives different episodes in every env."""
    env_id = _id("Seeding")
    register_gymnasium_env(env_id, factory)
    env, ref = gym.make(env_id), gym.make("CartPole-v1")
    first, again, other = env.reset(seed=0)[0], env.reset()[0], env.reset(seed=1)[0]
    assert not np.array_equal(again, other)
    np.testing.assert_array_equal(first, ref.reset(seed=0)[0])
    np.testing.assert_array_equal(again, ref.reset()[0])
    np.testing.assert_array_equal(other, ref.reset(seed=1)[0])
    for mode in ("sync", "vector_entry_point"):
        envs = gym.make_vec(env_id, num_envs=3, vectorization_mode=mode)
        ref = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
        starts, starts_ref = _first_obs_of_episodes(envs), _first_obs_of_episodes(ref)
        every = [o.tobytes() for i in starts for o in starts[i]]
        assert len(every) > 30 and len(set(every)) == len(every)  # no episode repeats in another env
        for i in starts:  # and they are gymnasium's own episodes
            np.testing.assert_array_equal(np.stack(starts[i]), np.stack(starts_ref[i]))
        envs.close()


def test_explicit_seed_every_episode_is_kept_and_other_factories_warn():
    env_id = _id("Seeding")
    register_gymnasium_env(env_id, pool_factory, kwargs={"seed_every_episode": True})
    env = gym.make(env_id)  # the pool's own schedule, as asked: episode k of a one-env pool gets seed s + k
    env.reset(seed=0)
    np.testing.assert_array_equal(env.reset()[0], gym.make("CartPole-v1").reset(seed=1)[0])
    env_id = _id("Seeding")
    register_gymnasium_env(env_id, kwargs_pool_factory)  # **kwargs only: it cannot be told, and says so
    with pytest.warns(UserWarning, match="seed_every_episode"):
        gym.make(env_id)
    with pytest.warns(UserWarning, match="seed_every_episode"):
        gym.make_vec(env_id, num_envs=2)


def test_a_partial_that_binds_seed_every_episode_keeps_it_without_a_warning():
    # a functools.partial setting seed_every_episode asked for it: neither overridden nor warned about
    env_id = _id("Seeding")
    register_gymnasium_env(env_id, functools.partial(EnvPool, "CartPole-v1", seed_every_episode=True))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*seed_every_episode")
        env = gym.make(env_id)
    env.reset(seed=0)  # the pool's own schedule: episode k of a one-env pool gets seed s + k
    np.testing.assert_array_equal(env.reset()[0], gym.make("CartPole-v1").reset(seed=1)[0])
    env.close()


def test_info_keys_reach_the_env_of_make_as_well_as_make_vec():
    # info_keys=[] empties the infos of gymnasium.make's single env too, not only those of make_vec's vector env
    env_id = _id("Pool")
    register_gymnasium_env(env_id, functools.partial(EnvPool, "CartPole-v1"), info_keys=[])
    env = gym.make(env_id)
    assert env.reset(seed=0)[1] == {} and env.step(0)[4] == {}
    env.close()
    envs = gym.make_vec(env_id, num_envs=2)
    assert envs.reset(seed=0)[1] == {}
    envs.close()


def test_spec_fields_reach_the_registered_spec():
    # reward_threshold and nondeterministic are gymnasium's EnvSpec fields: registration passes them through
    env_id = _id("Pool")
    spec = register_gymnasium_env(env_id, pool_factory, reward_threshold=475.0, nondeterministic=True)
    assert gym.spec(env_id) is spec
    assert spec.reward_threshold == 475.0 and spec.nondeterministic is True


def test_other_register_arguments_reach_gymnasium_register():
    # **register_kwargs (disable_env_checker, order_enforce) go to gymnasium.register: make() adds neither wrapper
    env_id = _id("Pool")
    spec = register_gymnasium_env(env_id, pool_factory, disable_env_checker=True, order_enforce=False)
    assert spec.disable_env_checker is True and spec.order_enforce is False
    env = gym.make(env_id)
    assert env is env.unwrapped  # no PassiveEnvChecker, no OrderEnforcing
    env.close()


def test_make_of_a_pool_over_discrete_actions_with_a_start():
    env_id = _id("StartActions")
    register_gymnasium_env(env_id, lambda num_envs=1, **kw: EnvPool([StartActionEnv] * num_envs, **kw))
    env = gym.make(env_id)
    env.reset(seed=0)
    for action in (-1, np.int64(1), np.array(0), env.action_space.sample()):  # every form gymnasium users pass
        _, reward, *_ = env.step(action)
        assert reward == float(action)
    with pytest.raises(ValueError, match="must lie in"):
        env.step(2)
    env.close()


def test_a_factory_with_a_fixed_batch_is_named_with_what_to_register_instead():
    """The refusal names what to register instead, and closes the batched env the factory built (its workers are
    not left running)."""
    built = []

    def fixed_batch():
        built.append(EnvPool("CartPole-v1", num_envs=4))
        return built[-1]

    for factory in (functools.partial(EnvPool, "CartPole-v1", num_envs=4), fixed_batch):
        register_gymnasium_env("TorchRLSWMTest/FixedBatch-v0", factory)
        try:
            with pytest.raises(TypeError, match=r"gymnasium.make: the registered factory .* built an env with "
                                                r"batch_size \[4\] and takes no num_envs=.*"
                                                r"functools.partial\(EnvPool, 'CartPole-v1'\)"):
                gym.make("TorchRLSWMTest/FixedBatch-v0")
        finally:
            gym.registry.pop("TorchRLSWMTest/FixedBatch-v0", None)
    assert len(built) == 1 and built[0].is_closed


def test_numpy_and_batched_refuse_truthy_non_bools():
    """numpy="no" was True at make time (to_gymnasium already refused it)."""
    with pytest.raises(TypeError, match=r"register_gymnasium_env: numpy: expected True or False, got str 'no'"):
        register_gymnasium_env(f"Test/{uuid.uuid4().hex}-v0", functools.partial(EnvPool, "CartPole-v1"), numpy="no")
    with pytest.raises(TypeError, match=r"register_gymnasium_env: batched: expected True or False, got int 1"):
        register_gymnasium_env(f"Test/{uuid.uuid4().hex}-v0", functools.partial(EnvPool, "CartPole-v1"), batched=1)
    with pytest.raises(TypeError, match=r"TorchRLVectorEnv: numpy: expected True or False, got str 'no'"):
        TorchRLVectorEnv(EnvPool("CartPole-v1", 2), numpy="no")
    with pytest.raises(TypeError, match=r"TorchRLGymEnv: numpy: expected True or False, got str 'no'"):
        TorchRLGymEnv(GymEnv("CartPole-v1"), numpy="no")
