"""to_gymnasium on unbatched TorchRL envs: a gymnasium.Env that passes gymnasium's check_env."""

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from torchrl.envs import GymEnv, StepCounter, TransformedEnv

from torchrl_swm import EnvPool, register_gymnasium_env, to_gymnasium
from torchrl_swm.export import TorchRLGymEnv


def _check_env_without_warnings(env: gym.Env, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, **kwargs)
    messages = [str(w.message) for w in caught]
    assert messages == [], messages


@pytest.mark.parametrize("env_id", ["MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1"])
def test_check_env_passes_without_warnings(env_id):
    """A real TorchRL env (GymEnv: batch_size [], OneHot or Box actions) through the export."""
    env = to_gymnasium(GymEnv(env_id))
    assert isinstance(env, TorchRLGymEnv) and isinstance(env, gym.Env)
    # without a registered spec gymnasium cannot build the env in other render modes, and says so
    _check_env_without_warnings(env, skip_render_check=True)


def test_check_env_passes_on_the_registered_env():
    """Through gymnasium.make (a spec: the render-mode and determinism checks run too)."""
    register_gymnasium_env("TorchRLSWMTest/GymEnvMountainCar-v0", functools.partial(GymEnv, "MountainCar-v0"))
    env = gym.make("TorchRLSWMTest/GymEnvMountainCar-v0")
    _check_env_without_warnings(env.unwrapped)
    env.close()


def test_check_env_on_a_one_env_pool():
    """A batched factory made single: EnvPool(num_envs=1) with its batch dim dropped."""
    env = TorchRLGymEnv(EnvPool("Acrobot-v1", num_envs=1), squeeze_batch=True)
    _check_env_without_warnings(env, skip_render_check=True)
    obs, info = env.reset(seed=3)
    assert obs.shape == (6,) and info == {"episode_seed": 3}
    # the sub-env's render modes and fps, which RecordVideo and SB3's VecVideoRecorder read
    assert env.metadata == {"render_modes": ["human", "rgb_array"], "render_fps": 15}


def test_single_env_infos_that_come_and_go():
    """Unbatched export: a key is in the info dict exactly when the env reported it."""
    from envs import SparseInfoEnv

    pool = EnvPool([functools.partial(SparseInfoEnv, period=2, length=5)], info_spec={"bonus": 0.0, "success": False})
    env = TorchRLGymEnv(pool, squeeze_batch=True, info_keys=["info"])
    ref = SparseInfoEnv(period=2, length=5)
    ref.reset()  # the pool's construction probe resets its env once (the counting env counts resets)
    obs, info = env.reset(seed=0)
    assert info == ref.reset(seed=0)[1] == {"t": 0}
    for _ in range(12):
        obs, reward, terminated, truncated, info = env.step(1)
        ref_step = ref.step(1)
        assert info == ref_step[4]
        assert type(info["t"]) is int and ("bonus" not in info or type(info["bonus"]) is float)
        if terminated or truncated:
            env.reset()
            ref.reset()
    env.close()


@pytest.mark.parametrize("route", ["TorchRLGymEnv", "gymnasium.make"])
def test_a_one_key_dict_observation_stays_a_dict(route):
    """An env whose observation space is a Dict with a single key gives dict observations (not the bare array of
    its one leaf), so that they lie in the Dict space and gymnasium's check_env passes."""
    from envs import OneKeyDictObsEnv

    if route == "TorchRLGymEnv":
        env = TorchRLGymEnv(EnvPool([OneKeyDictObsEnv]), squeeze_batch=True)
    else:
        env_id = "TorchRLSWMTest/OneKeyDict-v0"
        register_gymnasium_env(env_id, lambda num_envs, seed_every_episode=True: EnvPool(
            [OneKeyDictObsEnv] * num_envs, seed_every_episode=seed_every_episode))
        env = gym.make(env_id).unwrapped
    assert env.observation_space == OneKeyDictObsEnv.observation_space
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, dict) and list(obs) == ["a"] and env.observation_space.contains(obs)
    obs = env.step(1)[0]
    assert isinstance(obs, dict) and np.allclose(obs["a"], 0.1) and env.observation_space.contains(obs)
    _check_env_without_warnings(env, skip_render_check=True)
    env.close()


def test_an_env_without_a_truncated_key_never_reports_truncation():
    """A TorchRL env whose done spec has only done/terminated: each termination is terminated=True,
    truncated=False (a missing truncated key reads as never truncated, not as a copy of terminated)."""
    from tensordict import TensorDict
    from torchrl.data import Bounded, Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class ThreeSteps(EnvBase):
        def __init__(self):
            super().__init__(batch_size=())
            self.observation_spec = Composite(observation=Unbounded((1,), dtype=torch.float32))
            self.action_spec = Bounded(-1.0, 1.0, (1,))
            self.reward_spec = Unbounded((1,))
            self.done_spec = Composite(done=Categorical(2, (1,), dtype=torch.bool),
                                       terminated=Categorical(2, (1,), dtype=torch.bool))

        def _reset(self, td):
            self.t = 0
            return TensorDict(observation=torch.zeros(1), done=torch.zeros(1, dtype=torch.bool),
                              terminated=torch.zeros(1, dtype=torch.bool))

        def _step(self, td):
            self.t += 1
            end = torch.tensor([self.t >= 3])
            return TensorDict(observation=torch.full((1,), float(self.t)), reward=torch.zeros(1), done=end,
                              terminated=end.clone())

        def _set_seed(self, seed):
            pass

    env = to_gymnasium(ThreeSteps())
    for _ in range(2):
        env.reset(seed=0)
        flags = [env.step(np.zeros(1, np.float32))[2:4] for _ in range(3)]
        assert flags == [(False, False), (False, False), (True, False)]
    env.close()


def test_python_scalars_and_fresh_arrays():
    env = to_gymnasium(GymEnv("MountainCar-v0"))
    obs, info = env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.dtype == np.float32 and info == {}
    obs2, reward, terminated, truncated, info = env.step(1)
    assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
    assert not np.shares_memory(obs, obs2)


def test_seeding_through_super_reset():
    env = to_gymnasium(GymEnv("Acrobot-v1"))
    a, _ = env.reset(seed=5)
    rng = env.np_random.bit_generator.state
    b, _ = env.reset(seed=5)
    assert np.array_equal(a, b) and env.np_random.bit_generator.state == rng
    c, _ = env.reset(seed=6)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("wrap", [False, True], ids=["GymEnv", "TransformedEnv"])
def test_reset_options_reach_a_torchrl_gym_envs_gymnasium_env(wrap):
    """TorchRL's GymEnv passes reset(options=) to gymnasium's reset; the export refused them, saying it took none."""
    torchrl_env = GymEnv("CartPole-v1")
    env = to_gymnasium(TransformedEnv(torchrl_env, StepCounter()) if wrap else torchrl_env)
    reference = gym.make("CartPole-v1")
    for seed, options in [(3, {"low": 0.2, "high": 0.2}), (4, {"low": -0.01, "high": 0.03}), (None, {"low": 0.1, "high": 0.1})]:
        obs, _ = env.reset(seed=seed, options=options)
        expected, _ = reference.reset(seed=seed, options=options)
        assert np.array_equal(obs, expected)
    obs, _ = env.reset(options={"low": 0.1, "high": 0.1})
    assert np.allclose(obs, 0.1)
    env.close()


def test_reset_options_for_a_torchrl_env_that_takes_none_are_a_clear_error():
    from torchrl.envs import PendulumEnv

    env = to_gymnasium(PendulumEnv())
    env.reset(seed=0)
    with pytest.raises(TypeError, match=r"reset options \['low'\] reach the sub-envs of an EnvPool, a WorldModelEnv's "
                                        r"reset_fn and the gymnasium env of a TorchRL GymEnv/GymWrapper; .* takes none"):
        env.reset(options={"low": 0.0})
    env.close()


def test_episode_runs_to_truncation():
    env = to_gymnasium(GymEnv("MountainCar-v0"))
    env.reset(seed=0)
    for t in range(1, 201):
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert reward == -1.0
        if terminated or truncated:
            break
    assert truncated and t == 200


def test_numpy_false_gives_torch_observations():
    env = to_gymnasium(GymEnv("MountainCarContinuous-v0"), numpy=False)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.shape == (2,)
    obs, reward, terminated, truncated, _ = env.step(torch.zeros(1))
    assert isinstance(obs, torch.Tensor) and type(reward) is float and type(terminated) is bool


def test_one_hot_actions_take_indices():
    env = to_gymnasium(GymEnv("MountainCar-v0"))  # TorchRL's GymEnv uses OneHot actions
    assert env.action_space == gym.spaces.Discrete(3)
    env.reset(seed=0)
    for a in (0, 1, 2, np.int64(2), np.array(1)):
        env.step(a)


def test_step_before_reset_raises():
    env = to_gymnasium(GymEnv("MountainCar-v0"))
    with pytest.raises(RuntimeError, match=r"before reset\(\)"):
        env.step(0)


def test_registered_pool_with_discrete_start_matches_the_env():
    """gymnasium.make of a registered pool over an env with Discrete(4, start=1) in a nested Dict: the env's
    own space, its values, check_env passes, and each step equals the gymnasium env's on the same seed."""
    from envs import DictObsEnv

    env_id = "TorchRLSWMTest/DictObsPool-v0"
    register_gymnasium_env(env_id, functools.partial(EnvPool, [DictObsEnv]), batched=True, info_keys=[])
    env, ref = gym.make(env_id), DictObsEnv()
    assert env.observation_space == ref.observation_space
    _check_env_without_warnings(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=2)
    obs_ref, _ = ref.reset(seed=2)
    assert obs["goal"]["kind"] == obs_ref["goal"]["kind"]
    assert obs["goal"]["kind"] in ref.observation_space["goal"]["kind"]
    for _ in range(5):
        action = ref.action_space.sample()
        obs, *_ = env.step(action)
        obs_ref, *_ = ref.step(action)
        assert obs in ref.observation_space
        assert obs["goal"]["kind"] == obs_ref["goal"]["kind"]
        np.testing.assert_array_equal(obs["position"], obs_ref["position"])


@pytest.mark.parametrize("transformed", [False, True])
def test_seeded_reset_of_a_gym_env_starts_gymnasiums_episode_for_that_seed(transformed):
    """reset(seed=s) on an exported TorchRL GymEnv is gymnasium's reset(seed=s), not the episode after it
    (GymEnv.set_seed(s) resets with s itself); the unseeded resets that follow continue the same stream."""
    env = GymEnv("CartPole-v1")
    env = TransformedEnv(env, StepCounter()) if transformed else env
    exported, reference = to_gymnasium(env), gym.make("CartPole-v1")
    for seed in (4, None, None, 11, None):
        obs, _ = exported.reset(seed=seed)
        expected, _ = reference.reset(seed=seed)
        np.testing.assert_array_equal(obs, expected)
    for _ in range(30):  # and the dynamics from there on
        out = exported.step(1)
        expected = reference.step(1)
        np.testing.assert_array_equal(out[0], expected[0])
        assert out[1:4] == expected[1:4]
        if out[2] or out[3]:
            break
    exported.close()


@pytest.mark.parametrize("kind", ["registered pool", "GymEnv"])
def test_step_after_close_is_refused_with_the_exports_own_message(kind):
    """step() after close() is refused by the export itself, in words that name TorchRLGymEnv.step() and what
    to do (not left to the closed env, which a step would restart or fail in): a pool is never reopened, a
    TorchRL GymEnv is by reset()."""
    if kind == "registered pool":
        env_id = "TorchRLSWMTest/CartPolePoolClosed-v0"
        register_gymnasium_env(env_id, functools.partial(EnvPool, "CartPole-v1"))
        env = gym.make(env_id, disable_env_checker=True).unwrapped
        gym.registry.pop(env_id)
        advice = r"the EnvPool it wraps is closed, and a closed pool cannot be reopened; export a new pool$"
    else:
        env = to_gymnasium(GymEnv("CartPole-v1"))
        advice = r"GymEnv is closed; reset\(\) reopens it"
    assert isinstance(env, TorchRLGymEnv)
    env.reset(seed=0)
    env.step(0)
    env.close()
    with pytest.raises(RuntimeError, match=r"^TorchRLGymEnv\.step\(\) after close\(\): " + advice):
        env.step(0)
    if kind == "GymEnv":  # reopened by a reset: steps again, and closes again
        env.reset(seed=0)
        assert env.step(0)[0].shape == (4,)
        env.close()
        with pytest.raises(RuntimeError, match=r"^TorchRLGymEnv\.step\(\) after close\(\)"):
            env.step(0)


@pytest.mark.parametrize("kind", ["pool", "GymEnv"])
def test_close_closes_the_env_the_export_owns(kind):
    from envs import CLOSED_ENVS, ClosingEnv

    CLOSED_ENVS.clear()
    inner = EnvPool([ClosingEnv]) if kind == "pool" else GymEnv("CartPole-v1")
    env = TorchRLGymEnv(inner, squeeze_batch=True) if kind == "pool" else to_gymnasium(inner)
    env.reset(seed=0)
    env.step(0)
    env.close()
    assert inner.is_closed
    if kind == "pool":
        assert len(CLOSED_ENVS) == 1  # the pool closed its env


class _CountUpModel(torch.nn.Module):
    """State = observation, + 1 per step; infos: a vector and a scalar view of it."""

    def step(self, state, action):
        s = state + 1
        no = torch.zeros(s.shape[:-1], dtype=torch.bool)
        return s, s, s.sum(-1), no, no, {"vec": s.repeat_interleave(3, -1), "sc": s[..., 0]}


def test_an_unbatched_world_model_env_exports_its_infos_with_their_own_shapes():
    from torchrl_swm import WorldModelEnv

    env = WorldModelEnv(_CountUpModel(), gym.spaces.Box(-100, 100, (1,), np.float32),
                        gym.spaces.Box(-1, 1, (1,), np.float32), num_envs=None, initial_state=torch.zeros(1),
                        state_key="observation", info_spec={"vec": torch.zeros(3), "sc": torch.zeros(())})
    single = to_gymnasium(env)
    single.reset(seed=0)
    for t in (1, 2):
        obs, reward, terminated, truncated, info = single.step(np.zeros(1, np.float32))
        assert obs.tolist() == [t] and reward == t
        assert np.shape(info["vec"]) == (3,) and info["vec"].tolist() == [t] * 3
        assert np.shape(info["sc"]) == () and info["sc"] == t
    single.close()


def test_a_transform_that_changes_the_action_spec_under_the_same_key_is_exported_as_the_transform_declares():
    from torchrl.envs import ActionDiscretizer

    envs = to_gymnasium(TransformedEnv(EnvPool("Pendulum-v1", num_envs=2, seed=0), ActionDiscretizer(5)))
    assert envs.single_action_space == gym.spaces.MultiDiscrete([5])  # not the pool's Box(-2, 2, (1,))
    envs.reset(seed=0)
    # index 0 of 5 is the median of the lowest of 5 bins over [-2, 2], a torque of -1.6: Pendulum's own step
    reference = gym.make("Pendulum-v1")
    reference.reset(seed=0)
    expected = reference.step(np.array([-1.6], np.float32))[0]
    obs = envs.step(np.array([[0], [0]]))[0]
    np.testing.assert_allclose(obs[0], expected, rtol=1e-6)
    envs.close()
