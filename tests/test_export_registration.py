"""register_gymnasium_env: gymnasium.make and gymnasium.make_vec for TorchRL env factories."""

import functools
import pickle
import uuid

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from torchrl.envs import GymEnv

from torchrl_swm import EnvPool, register_gymnasium_env
from torchrl_swm.benchmarks.export import LAT, MLPWorldModelEnv
from torchrl_swm.export import TorchRLGymEnv, TorchRLVectorEnv


def _id(name):
    return f"TorchRLSWMTest/{name}{uuid.uuid4().hex[:6]}-v0"


def pool_factory(num_envs, **kwargs):
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
