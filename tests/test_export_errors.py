"""Bad input gets clear errors, never silent reshaping."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import StartActionEnv
from tensordict import TensorDict
from torchrl.data import Composite, NonTensor, Unbounded
from torchrl.envs import EnvBase, GymEnv

from torchrl_swm import EnvError, EnvPool, SpecError, WorldModelEnv, to_gymnasium
from torchrl_swm.benchmarks.export import ACT, MLPWorldModelEnv


@pytest.fixture
def cartpole():
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=3), autoreset_mode="disabled")
    envs.reset(seed=0)
    yield envs
    envs.close()


@pytest.mark.parametrize(
    "action, error, match",
    [
        (np.zeros((3, 1), np.int64), ValueError, r"expected shape \(3,\).*got.*\(3, 1\).*never reshaped"),
        (np.zeros(2, np.int64), ValueError, r"expected shape \(3,\)"),
        (np.int64(0), ValueError, r"expected shape \(3,\)"),
        (np.zeros(3, np.float32), TypeError, "expected integers"),
        (np.array([0, 1, 2]), ValueError, r"must lie in Discrete\(2\)"),
        (np.array([0, -1, 1]), ValueError, r"must lie in Discrete\(2\)"),
        (np.array([0, -1, 1], np.int8), ValueError, r"must lie in Discrete\(2\)"),
        (np.array([0, 1, 200], np.uint8), ValueError, r"must lie in Discrete\(2\)"),
        (torch.tensor([0, -128, 1], dtype=torch.int8), ValueError, r"must lie in Discrete\(2\)"),
        (["a", "b", "c"], TypeError, "expected integers"),
    ],
)
def test_bad_discrete_actions(cartpole, action, error, match):
    with pytest.raises(error, match=match):
        cartpole.step(action)
    cartpole.step(np.zeros(3, np.int64))  # the env is still usable


@pytest.mark.parametrize(
    "action, match",
    [
        (np.zeros((4, ACT + 1), np.float32), r"expected shape \(4, 6\)"),
        (np.zeros((4 * ACT,), np.float32), r"expected shape \(4, 6\)"),
        (np.zeros((1, 4, ACT), np.float32), r"expected shape \(4, 6\)"),
        (torch.zeros(4, ACT + 1), r"expected shape \(4, 6\)"),
    ],
)
def test_bad_box_actions(action, match):
    envs = to_gymnasium(MLPWorldModelEnv(batch_size=4))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        envs.step(action)


def test_unbatched_action_shapes():
    env = to_gymnasium(GymEnv("MountainCar-v0"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected shape \(\)"):
        env.step(np.array([1]))
    with pytest.raises(ValueError, match=r"must lie in Discrete\(3\)"):
        env.step(3)
    env = to_gymnasium(GymEnv("MountainCarContinuous-v0"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected shape \(1,\)"):
        env.step(0.5)


def test_step_before_reset():
    with pytest.raises(RuntimeError, match=r"before reset\(\)"):
        to_gymnasium(EnvPool("CartPole-v1", num_envs=2)).step(np.zeros(2, np.int64))
    with pytest.raises(RuntimeError, match=r"before reset\(\)"):
        to_gymnasium(MLPWorldModelEnv(batch_size=2)).step(np.zeros((2, ACT), np.float32))


def test_disabled_mode_refuses_to_step_a_finished_env():
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=2), autoreset_mode="disabled")
    envs.reset(seed=0)
    done = np.zeros(2, bool)
    while not done.any():
        _, _, term, trunc, _ = envs.step(np.zeros(2, np.int64))
        done = term | trunc
    with pytest.raises(RuntimeError, match=r"envs \[\d.*reset_mask"):
        envs.step(np.zeros(2, np.int64))
    envs.reset(options={"reset_mask": done})
    envs.step(np.zeros(2, np.int64))


@pytest.mark.parametrize(
    "mask, error, match",
    [
        ([True, False], TypeError, "numpy array"),
        (np.array([1, 0]), TypeError, "dtype bool"),
        (np.array([True]), ValueError, r"shape \(2,\)"),
        (np.array([False, False]), ValueError, "at least one"),
    ],
)
def test_bad_reset_masks(mask, error, match):
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=2))
    envs.reset(seed=0)
    with pytest.raises(error, match=match):
        envs.reset(options={"reset_mask": mask})


def test_reset_mask_before_any_reset():
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=2))
    with pytest.raises(RuntimeError, match="previous full reset"):
        envs.reset(options={"reset_mask": np.array([True, False])})


def test_bad_seeds():
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=2))
    for seeds in ([1, 2, 3], [1], [], [None]):  # too long or too short, as gymnasium's SyncVectorEnv refuses them
        with pytest.raises(ValueError, match=rf"expected an int or 2 seeds, got {len(seeds)}$"):
            envs.reset(seed=seeds)
    with pytest.raises(TypeError, match="seed"):
        envs.reset(seed=1.5)
    with pytest.raises(TypeError, match="seed must be an int"):
        envs.reset(seed=torch.tensor(1.5))
    with pytest.raises(TypeError, match="seeds must be integers"):
        envs.reset(seed=[True, 1])  # a bool inside a list is refused as a bare bool is, not read as the seed 1
    b, _ = envs.reset(seed=3)
    for seed in (torch.tensor(3), np.array(3)):  # a 0-d integer tensor or array is the int 3, as for the pool itself
        a, _ = envs.reset(seed=seed)
        assert np.array_equal(a, b)


class _SpecEnv(EnvBase):
    """A minimal env whose observation spec is given: for spec errors raised at export time."""

    def __init__(self, observation_spec: Composite, batch_size=(2,), action_spec=None):
        super().__init__(batch_size=batch_size)
        self.observation_spec = observation_spec
        self.action_spec = action_spec if action_spec is not None else Unbounded((*batch_size, 1))
        self.reward_spec = Unbounded((*batch_size, 1))

    def _reset(self, td=None, **kwargs):
        return self.full_observation_spec.zero().update(self.full_done_spec.zero())

    def _step(self, td):
        return TensorDict(batch_size=self.batch_size)

    def _set_seed(self, seed):
        pass


def test_unsupported_observation_spec_names_type_and_key():
    spec = Composite(observation=Unbounded((2, 3)), text=NonTensor(shape=(2,)), shape=(2,))
    with pytest.raises(SpecError, match=r"observation_spec\[\('text',\)\].*NonTensor"):
        to_gymnasium(_SpecEnv(spec))
    # leaving the key out of the export works
    envs = to_gymnasium(_SpecEnv(spec), observation_keys="observation")
    assert envs.single_observation_space.shape == (3,)


def test_unsupported_dtype_names_it():
    spec = Composite(observation=Unbounded((2, 3), dtype=torch.bfloat16), shape=(2,))
    with pytest.raises(SpecError, match="bfloat16"):
        to_gymnasium(_SpecEnv(spec))


def test_two_batch_dims_are_refused():
    spec = Composite(observation=Unbounded((2, 3, 4)), shape=(2, 3))
    with pytest.raises(SpecError, match=r"batch_size \[2, 3\]"):
        to_gymnasium(_SpecEnv(spec, batch_size=(2, 3)))


def test_several_action_keys_are_refused():
    spec = Composite(observation=Unbounded((2, 3)), shape=(2,))
    env = _SpecEnv(spec)
    env.full_action_spec = Composite(a=Unbounded((2, 1)), b=Unbounded((2, 1)), shape=(2,))
    with pytest.raises(SpecError, match="2 action keys"):
        to_gymnasium(env)


def test_unknown_keys_and_modes():
    pool = EnvPool("CartPole-v1", num_envs=2)
    with pytest.raises(SpecError, match="'pixels' is not in the env's observation_spec"):
        to_gymnasium(pool, observation_keys=["pixels"])
    with pytest.raises(SpecError, match="info_keys"):
        to_gymnasium(pool, info_keys=["nope"])
    with pytest.raises(ValueError, match="autoreset_mode"):
        to_gymnasium(pool, autoreset_mode="eventually")
    with pytest.raises(TypeError, match="TorchRL EnvBase"):
        to_gymnasium(gym.make("CartPole-v1"))


def test_missing_stable_baselines3_is_a_clear_import_error(monkeypatch):
    import sys

    from torchrl_swm.export import sb3

    sb3._sb3_class.cache_clear()
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    monkeypatch.setitem(sys.modules, "stable_baselines3.common.vec_env", None)
    try:
        with pytest.raises(ImportError, match=r"pip install 'torchrl-swm\[sb3\]'"):
            sb3.to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=2))
    finally:
        sb3._sb3_class.cache_clear()


def test_batched_binary_action_without_per_env_dims_is_a_spec_error():
    """A Binary action spec of shape (N,) has no per-env dims (its last dim is its event dim): a
    SpecError that says so, not TorchRL's IndexError from unbatching it."""
    from torchrl.data import Binary

    spec = Composite(observation=Unbounded((2, 3)), shape=(2,))
    with pytest.raises(SpecError, match=r"action_spec: a Binary spec of shape \(2,\) has no per-env dims.*\(2, 1\)"):
        to_gymnasium(_SpecEnv(spec, action_spec=Binary(shape=(2,))))
    envs = to_gymnasium(_SpecEnv(spec, action_spec=Binary(shape=(2, 1))))
    assert envs.single_action_space == gym.spaces.MultiBinary(1)


def test_binary_observation_without_per_env_dims_is_a_spec_error():
    from torchrl.data import Binary

    spec = Composite(observation=Unbounded((2, 3)), flag=Binary(shape=(2,)), shape=(2,))
    with pytest.raises(SpecError, match=r"observation_spec\[\('flag',\)\]: a Binary spec of shape \(2,\)"):
        to_gymnasium(_SpecEnv(spec))


@pytest.mark.parametrize(
    "action",
    [np.array([-2, 0, 1]), np.array([-1, 0, 2]), np.array([0, 0, 250], np.uint8), torch.tensor([-1, 2, 0]),
     torch.tensor([-1, -2, 0], dtype=torch.int8)],
)
@pytest.mark.parametrize("categorical", [True, False])
def test_discrete_actions_with_a_start_are_checked_against_start_and_n(action, categorical):
    envs = to_gymnasium(EnvPool([StartActionEnv] * 3, categorical_action_encoding=categorical),
                        autoreset_mode="disabled", numpy=isinstance(action, np.ndarray))
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"must lie in Discrete\(3, start=-1\)"):
        envs.step(action)
    _, rewards, *_ = envs.step(np.array([-1, 0, 1]) if envs.numpy else torch.tensor([-1, 0, 1]))
    assert list(rewards.tolist()) == [-1.0, 0.0, 1.0]  # the env got the actions in its own range


class _IntBoxAction(gym.Env):
    observation_space = gym.spaces.Box(-1000, 1000, (2,), np.float32)

    def __init__(self, dtype=np.int64):
        self.action_space = gym.spaces.Box(0, 5 if dtype == np.int64 else np.iinfo(dtype).max, (2,), dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.asarray(action, np.float32), 0.0, False, False, {}


def test_integer_box_actions_are_never_truncated_or_wrapped():
    envs = to_gymnasium(EnvPool([_IntBoxAction] * 2, seed=0))
    envs.reset(seed=0)
    with pytest.raises(TypeError, match=r"expected integers for Box\(0, 5, \(2,\), int64\).*truncate"):
        envs.step(np.array([[2.7, 4.9], [0.5, 1.99]]))
    assert envs.step(np.array([[2, 4], [0, 1]]))[0].tolist() == [[2, 4], [0, 1]]
    u8 = to_gymnasium(EnvPool([lambda: _IntBoxAction(np.uint8)] * 2, seed=0))
    u8.reset(seed=0)
    for bad in (np.array([[300, -1], [256, 7]]), torch.tensor([[3, 1], [256, 7]])):
        with pytest.raises(ValueError, match=r"must fit Box\(0, 255, \(2,\), uint8\)'s dtype \(0\.\.255\).*wrap"):
            u8.step(bad)
    assert u8.step(np.array([[3, 255], [0, 7]]))[0].tolist() == [[3, 255], [0, 7]]
    # a same-width cast between signed and unsigned round-trips bit for bit: the values are what is checked
    for bad in (np.array([[3, -1], [0, 7]], np.int8), torch.tensor([[3, -1], [0, 7]], dtype=torch.int8)):
        with pytest.raises(ValueError, match=r"must fit .*uint8\)'s dtype \(0\.\.255\).*min -1 and max 7; casting"):
            u8.step(bad)
    with pytest.raises(ValueError, match=r"must fit Box\(0, 5, \(2,\), int64\)'s dtype .*max 9223372036854775813"):
        envs.step(np.array([[2**63 + 5, 0], [1, 2]], np.uint64))
    assert envs.step(np.array([[2, 4], [0, 1]], np.uint64))[0].tolist() == [[2, 4], [0, 1]]
    i8 = to_gymnasium(EnvPool([lambda: _IntBoxAction(np.int8)] * 2, seed=0))
    i8.reset(seed=0)
    with pytest.raises(ValueError, match=r"must fit .*int8\)'s dtype \(-128\.\.127\).*min 0 and max 200"):
        i8.step(np.array([[200, 0], [1, 2]], np.uint8))
    assert i8.step(np.array([[100, 0], [1, 2]], np.uint8))[0].tolist() == [[100, 0], [1, 2]]
    for env in (envs, u8, i8):
        env.close()


class _EchoBoxAction(gym.Env):
    """Observes the action it was given (a float32 or float16 Box)."""

    def __init__(self, dtype=np.float32):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), dtype)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, self.observation_space.dtype), {}

    def step(self, action):
        return np.asarray(action, self.observation_space.dtype), 0.0, False, False, {}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_wider_float_action_that_overflows_the_box_is_an_error_not_inf(dtype):
    # as the pool's own step refuses it; the export used to cast it to inf before the pool could see it
    envs = to_gymnasium(EnvPool([lambda: _EchoBoxAction(dtype)] * 2, seed=0))
    envs.reset(seed=0)
    big = 1e300 if dtype == np.float32 else 1e5
    bad_actions = [np.array([[big, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, -big]], dtype=torch.float64)]
    if dtype == np.float16:  # integers and a float of the same width overflow it too
        bad_actions += [np.array([[100000, 0], [0, 0]]), torch.tensor([[1e30, 0.0], [0.0, 0.0]], dtype=torch.bfloat16)]
    for bad in bad_actions:
        with pytest.raises(ValueError, match=rf"fit Box\(.*\)'s dtype torch.{np.dtype(dtype).name}.*overflows"):
            envs.step(bad)
    # an integer the Box's float dtype cannot hold exactly would be rounded (the pool refuses it too)
    inexact = 2**24 + 1 if dtype == np.float32 else 2049
    for bad in (np.array([[inexact, 0], [0, 0]]), torch.tensor([[0, 0], [0, inexact]])):
        with pytest.raises(ValueError, match=rf"integer {inexact} is not exactly representable"):
            envs.step(bad)
    assert envs.step(np.array([[3, 0], [0, -2]]))[0].tolist() == [[3, 0], [0, -2]]  # exact integers pass
    # infinities and NaN pass as they are, and values in range are cast
    obs = envs.step(np.array([[np.inf, 0.5], [np.nan, -2.0]]))[0]
    assert obs.dtype == dtype and np.isinf(obs[0, 0]) and np.isnan(obs[1, 0]) and obs[0, 1] == 0.5
    envs.close()


class _BoolBoxAction(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (3,), np.float32)
    action_space = gym.spaces.Box(0, 1, (3,), bool)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert action in self.action_space
        return np.asarray(action, np.float32), 0.0, False, False, {}


def test_bool_box_actions_take_bools_or_exact_zeros_and_ones():
    envs = to_gymnasium(EnvPool([_BoolBoxAction] * 2, seed=0))
    envs.reset(seed=0)
    for bad in (np.array([[0.5, 0, 1], [0, 0, 0]]), np.array([[2, 0, -3], [0, 0, 0]]),
                np.array([[np.nan, 0, 0], [0, 0, 0]], np.float32), torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]])):
        with pytest.raises(ValueError, match=r"every value must be 0 or 1 for Box\(False, True, \(3,\), bool\)"):
            envs.step(bad)
    for good in (np.array([[1, 0, 1], [0, 1, 0]]), np.array([[1.0, 0, 1], [0, 1, 0]]),
                 np.array([[True, False, True], [False, True, False]])):
        assert envs.step(good)[0].tolist() == [[1, 0, 1], [0, 1, 0]]
    envs.close()


def test_a_pool_takes_the_bool_box_actions_its_export_takes():
    pool = EnvPool([_BoolBoxAction] * 2, seed=0)
    td = pool.reset()
    for good in (torch.tensor([[1, 0, 1], [0, 1, 0]]), torch.tensor([[1.0, 0, 1], [0, 1, 0]]),
                 torch.tensor([[True, False, True], [False, True, False]])):
        assert pool.step(td.set("action", good))["next", "observation"].tolist() == [[1, 0, 1], [0, 1, 0]]
    for bad in (torch.tensor([[0, 0, 0], [0.5, 0, 1]]), torch.tensor([[0, 0, 0], [2, 0, -3]]),
                torch.tensor([[0, 0, 0], [float("nan"), 0, 0]])):
        with pytest.raises(ValueError, match=r"env 1: expected bools or 0/1 values for a Box action of dtype bool"):
            pool.step(td.set("action", bad))
    pool.close()
    # a model env declaring a bool Box observation exports that Box, with bool observations in it
    space = gym.spaces.Box(0, 1, (3,), np.bool_)
    env = WorldModelEnv(object(), space, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=2,
                        initial_state=torch.tensor([True, False, True]), transition_fn=lambda s, a: s.clone())
    envs = to_gymnasium(env)
    obs, _ = envs.reset(seed=0)
    assert envs.single_observation_space == space and obs.dtype == np.bool_ and all(o in space for o in obs)
    envs.close()


def test_uint64_actions_past_int64_are_out_of_range_with_a_start():
    envs = to_gymnasium(EnvPool([StartActionEnv] * 2, seed=0))
    envs.reset(seed=0)
    assert envs.single_action_space == gym.spaces.Discrete(3, start=-1)
    # 2**64 - 1 would become int64 -1, the space's start, if cast before the range check
    with pytest.raises(ValueError, match=r"every value must lie in Discrete\(3, start=-1\)"):
        envs.step(np.array([0, 2**64 - 1], dtype=np.uint64))
    envs.close()


def test_shape_free_box_observations_stay_arrays():
    class ScalarObs(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.array(0.5, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.array(-0.5, np.float32), 0.0, self.t >= 2, False, {}

    from gymnasium.utils.env_checker import check_env

    from torchrl_swm.export import TorchRLGymEnv

    single = TorchRLGymEnv(EnvPool([ScalarObs], seed=0), squeeze_batch=True)
    obs, _ = single.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == () and obs in single.observation_space
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")  # no "Casting input x to numpy array"
        check_env(single, skip_render_check=True)
    envs = to_gymnasium(EnvPool([ScalarObs] * 2, seed=0), autoreset_mode="same_step")
    ref = gym.vector.SyncVectorEnv([ScalarObs] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0), ref.reset(seed=0)
    for _ in range(2):
        ours, theirs = envs.step(np.zeros(2, np.int64)), ref.step(np.zeros(2, np.int64))
    final, final_ref = ours[4]["final_obs"][0], theirs[4]["final_obs"][0]
    assert type(final) is type(final_ref) is np.ndarray and final.shape == final_ref.shape == ()
    envs.close()


@pytest.mark.parametrize("bad", [3, 1.5, [2, "observation"]])
def test_observation_and_info_keys_of_the_wrong_type_are_named(bad):
    for name in ("observation_keys", "info_keys"):
        with pytest.raises(TypeError, match=rf"to_gymnasium: {name}: expected (a key|keys)"):
            to_gymnasium(EnvPool("CartPole-v1", num_envs=2), **{name: bad})


def test_make_with_num_envs_is_an_error_pointing_to_make_vec():
    import functools

    from torchrl_swm import register_gymnasium_env

    register_gymnasium_env("TestMakeNumEnvs-v0", functools.partial(EnvPool, "CartPole-v1"))
    try:
        with pytest.raises(TypeError, match=r"builds one env, got num_envs=4; use gymnasium.make_vec"):
            gym.make("TestMakeNumEnvs-v0", num_envs=4)
        assert gym.make("TestMakeNumEnvs-v0", num_envs=1).reset(seed=0)[0].shape == (4,)
    finally:
        gym.registry.pop("TestMakeNumEnvs-v0")


@pytest.mark.parametrize("seed, error, match", [
    (2**63 - 1, ValueError, r"below 2\*\*63 .*got 9223372036854775808 \(seed 9223372036854775807 \+ env index\)"),
    (2**70, ValueError, r"below 2\*\*63"),
    ([0, 2**63], ValueError, r"below 2\*\*63"),
    (True, TypeError, r"expected an integer, got True"),
    ([0, 1.5], TypeError, r"expected integer seeds, got 1.5"),
])
def test_seeds_outside_int64_or_not_integers_are_named(seed, error, match):
    pool = EnvPool("CartPole-v1", num_envs=2)
    with pytest.raises(error, match=match):
        pool.reset(seed=seed)
    assert pool.reset(seed=2**63 - 2)["episode_seed"].view(-1).tolist() == [2**63 - 2, 2**63 - 1]
    pool.close()


def test_a_step_counter_that_flags_truncated_without_ending_episodes_is_refused():
    # TorchRL's episode goes on (done stays False); gymnasium's would end on truncated: no export can be exact
    from torchrl.envs import StepCounter, TransformedEnv

    from torchrl_swm import to_sb3_vec_env

    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter(3, update_done=False))
    import importlib.util

    sb3 = importlib.util.find_spec("stable_baselines3") is not None  # an optional extra
    for export in (to_gymnasium, *([to_sb3_vec_env] if sb3 else [])):
        with pytest.raises(SpecError, match=r"StepCounter\(max_steps=3, update_done=False\) flags truncated without "
                                            r"ending the episode.*Use update_done=True"):
            export(env)
    env.close()
    fine = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter(3))
    envs = to_gymnasium(fine)
    envs.reset(seed=0)
    assert [envs.step(np.zeros(2, np.int64))[3].tolist() for _ in range(3)][-1] == [True, True]
    envs.close()


class _StepFailsOnce(gym.Env):
    """obs ``[t]``; episodes of ``length`` steps; raises at its ``fail_at``-th step call (the pool's probe counts)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=50, fail_at=None):
        self.length, self.fail_at, self.calls, self.t = length, fail_at, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("step failed once")
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_after_a_step_that_raised_reset_then_step_moves_every_env(mode):
    # NEXT_STEP froze env 0 (finished) with "_step" in the step that raised: that mask must not outlive it
    fns = [functools.partial(_StepFailsOnce, length=2), _StepFailsOnce, functools.partial(_StepFailsOnce, fail_at=4)]
    envs = to_gymnasium(EnvPool(fns, seed=0), autoreset_mode=mode)
    envs.reset(seed=0)
    for _ in range(2):
        envs.step(np.zeros(3, np.int64))
    if mode == "disabled":
        envs.reset(options={"reset_mask": np.array([True, False, False])})
    with pytest.raises(EnvError, match=r"env 2 \(step\): ValueError: step failed once"):
        envs.step(np.zeros(3, np.int64))
    obs, _ = envs.reset()
    assert obs[:, 0].tolist() == [0.0, 0.0, 0.0]
    obs, reward, *_ = envs.step(np.ones(3, np.int64))
    assert obs[:, 0].tolist() == [1.0, 1.0, 1.0] and reward.tolist() == [1.0, 1.0, 1.0]
    envs.close()


def test_to_gymnasium_numpy_refuses_a_truthy_non_bool():
    """numpy="no" was truthy: numpy outputs where torch ones were asked for."""
    pool = EnvPool("CartPole-v1", 2)
    with pytest.raises(TypeError, match=r"to_gymnasium: numpy: expected True or False, got str 'no'"):
        to_gymnasium(pool, numpy="no")
    pool.close()
