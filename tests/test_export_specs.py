"""TorchRL spec -> gymnasium space, as the export uses it: property tests over spaces and batch sizes."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from space_strategies import index_space
from tensordict import TensorDict
from torchrl.data import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
)
from torchrl.envs import EnvBase

from torchrl_swm import EnvPool, SpecError, to_gymnasium
from torchrl_swm.specs import batch_spec, space_to_spec, spec_to_space, unbatch_spec

# -- strategies ------------------------------------------------------------------------------
_shapes = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


@st.composite
def boxes(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.uint8]))
    shape = draw(_shapes)
    if np.dtype(dtype).kind == "f" and draw(st.booleans()):
        low, high = -np.inf, np.inf
    else:
        low = draw(st.integers(0, 3))
        high = low + draw(st.integers(1, 9))
    return gym.spaces.Box(low, high, shape=shape, dtype=dtype)


@st.composite
def multi_discretes(draw, low=2, high=5):
    shape = draw(st.sampled_from([(1,), (2,), (3,), (2, 2), (1, 3)]))  # n-d nvecs too
    size = int(np.prod(shape))
    nvec = np.reshape(draw(st.lists(st.integers(low, high), min_size=size, max_size=size)), shape)
    # a start must neither promote the values to int64 nor need an addition torch lacks (uint16/32/64)
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.uint16, np.uint32, np.uint64]))
    lowest = 0 if np.dtype(dtype).kind == "u" else -2
    start = draw(st.none() | st.lists(st.integers(lowest, 2), min_size=size, max_size=size))
    return gym.spaces.MultiDiscrete(nvec, start=None if start is None else np.reshape(start, shape), dtype=dtype)


leaf_spaces = st.one_of(
    boxes(),
    st.builds(gym.spaces.Discrete, st.integers(1, 6), start=st.integers(-2, 2)),
    multi_discretes(),
    st.integers(1, 4).map(gym.spaces.MultiBinary),
)
spaces = st.recursive(
    leaf_spaces,
    lambda inner: st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, min_size=1, max_size=3).map(
        gym.spaces.Dict
    ),
    max_leaves=5,
)


def _has_discrete(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Dict):
        return any(_has_discrete(s) for s in space.spaces.values())
    return isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))


def _has_nd_nvec(space: gym.Space) -> bool:
    """A MultiDiscrete with an n-d nvec: TorchRL's MultiOneHot has no such spec (categorical encoding only)."""
    if isinstance(space, gym.spaces.Dict):
        return any(_has_nd_nvec(s) for s in space.spaces.values())
    return isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim > 1


# -- spec -> space ------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(space=spaces, n=st.integers(1, 5), categorical=st.booleans())
def test_batched_spec_round_trip(space, n, categorical):
    """space -> spec -> batched [N] -> unbatched -> space gives the space back (as indices)."""
    if not categorical and _has_nd_nvec(space):
        with pytest.raises(SpecError, match=r"MultiDiscrete with a 2-d nvec .* has no one-hot spec"):
            space_to_spec(space, categorical=False)
        return
    spec = batch_spec(space_to_spec(space, categorical=categorical), (n,))
    assert spec.shape[:1] == (n,)
    back = spec_to_space(unbatch_spec(spec, 1))
    assert back == index_space(space)  # what the export exposes: discrete values as indices from 0
    batched = gym.vector.utils.batch_space(back, n)
    assert batched.sample() in batched


class SpaceEnv(gym.Env):
    """An env with arbitrary spaces: observations are seeded samples, actions are checked."""

    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action):
        assert action in self.action_space, (action, self.action_space)
        self.last_action = action
        return self.observation_space.sample(), 1.0, False, False, {}


action_spaces = st.one_of(
    st.builds(gym.spaces.Box, st.just(-1.0), st.just(1.0), shape=_shapes, dtype=st.just(np.float32)),
    st.builds(gym.spaces.Discrete, st.integers(1, 5), start=st.integers(-1, 1)),
    multi_discretes(2, 4),
    st.integers(1, 3).map(gym.spaces.MultiBinary),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obs_space=spaces, act_space=action_spaces, n=st.integers(1, 4), categorical=st.booleans())
def test_pool_export_spaces_and_data(obs_space, act_space, n, categorical):
    """End to end over random spaces and batch sizes, against gymnasium's SyncVectorEnv over the same
    envs: the exported spaces are the env's own (``Discrete``/``MultiDiscrete`` ``start`` included),
    observations are identical, and the same sampled actions reach the envs (which check them)."""
    import copy

    from export_helpers import PoolSeedSchedule, assert_same

    # EnvPool(categorical_action_encoding=False) also one-hot encodes discrete *observations*,
    # which its row writer cannot store yet: leave that combination out.
    assume(categorical or not _has_discrete(obs_space))
    assume(categorical or not _has_nd_nvec(act_space))  # refused: test_batched_spec_round_trip
    def make():  # each env samples from its own copy of the spaces (one RNG per env)
        return SpaceEnv(copy.deepcopy(obs_space), copy.deepcopy(act_space))

    pool = EnvPool([make] * n, seed=0, categorical_action_encoding=categorical)
    envs = to_gymnasium(pool, autoreset_mode="same_step", info_keys=[])
    ref = gym.vector.SyncVectorEnv([lambda: PoolSeedSchedule(make(), n) for _ in range(n)],
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert envs.single_observation_space == obs_space == ref.single_observation_space
    assert envs.single_action_space == act_space == ref.single_action_space
    obs, _ = envs.reset(seed=1)
    obs_ref, _ = ref.reset(seed=1)
    assert obs in envs.observation_space
    assert_same(obs, obs_ref, "reset obs")
    envs.action_space.seed(0)
    for t in range(3):
        action = envs.action_space.sample()
        obs, rewards, term, trunc, _ = envs.step(action)
        obs_ref, rewards_ref, *_ = ref.step(action)
        for i, (got, sent) in enumerate(zip(envs.get_attr("last_action"), ref.get_attr("last_action"), strict=True)):
            assert np.array_equal(got, sent), f"step {t}: env {i} received {got!r}, SyncVectorEnv's {sent!r}"
        assert obs in envs.observation_space and rewards.shape == (n,)
        assert_same(obs, obs_ref, f"step {t}: obs")
        np.testing.assert_array_equal(rewards, rewards_ref)
    envs.close()


@pytest.mark.parametrize(
    "spec, space",
    [
        (OneHot(3), gym.spaces.Discrete(3)),
        (OneHot(3, shape=(2, 3)), gym.spaces.MultiDiscrete([3, 3])),
        (MultiOneHot([2, 3]), gym.spaces.MultiDiscrete([2, 3])),
        (Categorical(5, shape=(2,)), gym.spaces.MultiDiscrete([5, 5])),
        (MultiCategorical(torch.tensor([[2, 3], [4, 5]])), gym.spaces.MultiDiscrete([[2, 3], [4, 5]])),
        (Binary(4), gym.spaces.MultiBinary(4)),
        (Binary(shape=(2, 3)), gym.spaces.MultiBinary([2, 3])),
        (Unbounded((), dtype=torch.bool), gym.spaces.Discrete(2)),
        (Unbounded((2,), dtype=torch.bool), gym.spaces.MultiBinary(2)),
        (Unbounded((2,), dtype=torch.int32), gym.spaces.Box(-(2**31), 2**31 - 1, (2,), np.int32)),
        (Unbounded((2,), dtype=torch.float64), gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)),
        (Bounded(0, 255, (4, 4, 3), dtype=torch.uint8), gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)),
        (Bounded(0, 1, (3,), dtype=torch.bool), gym.spaces.Box(0, 1, (3,), np.bool_)),  # Bounded: a Box, bool too
        (Bounded(0, 1, (), dtype=torch.bool), gym.spaces.Box(0, 1, (), np.bool_)),
    ],
)
def test_spec_types(spec, space):
    assert spec_to_space(spec) == space


@pytest.mark.parametrize(
    "spec, match",
    [
        (NonTensor(shape=()), "NonTensor"),
        (Unbounded((2,), dtype=torch.bfloat16), "bfloat16"),
        (Binary(shape=()), "0-d Binary"),
        (torch.stack([Composite(a=Unbounded(2)), Composite(a=Unbounded(3))], 0), "StackedComposite"),
        (Bounded(-1, 1, (2,), dtype=torch.complex64), r"dtype=torch.complex64.*real"),  # never a gymnasium error
    ],
)
def test_unsupported_spec_types_name_the_type(spec, match):
    with pytest.raises(SpecError, match=match):
        spec_to_space(spec, name="observation_spec['x']")


def test_inverted_bounds_are_a_spec_error_naming_the_leaf():
    # TorchRL's ObservationNorm with a negative scale leaves low > high; gymnasium's Box error names nothing
    from torchrl.envs import ObservationNorm, TransformedEnv

    from torchrl_swm import EnvPool, to_gymnasium

    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2),
                         ObservationNorm(loc=torch.tensor(1.0), scale=torch.tensor(-2.0), in_keys=["observation"]))
    with pytest.raises(SpecError, match=r"observation_spec\[\('observation',\)\]: Bounded spec with low > high .* "
                                        r"negative scale"):
        to_gymnasium(env)
    env.close()


def test_a_constant_leaf_with_low_equal_to_high_is_exported_not_refused_as_inverted():
    # low == high is a valid Box (gymnasium builds Box(0.5, 0.5)); only low > high is inverted
    spec = Bounded(low=torch.tensor([0.0, 1.0]), high=torch.tensor([0.0, 2.0]), shape=(2,), dtype=torch.float32)
    assert spec_to_space(spec) == gym.spaces.Box(np.array([0, 1], np.float32), np.array([0, 2], np.float32))
    constant = gym.spaces.Box(0.5, 0.5, (3,), np.float32)
    assert spec_to_space(space_to_spec(constant)) == constant


def test_one_hot_observations_decode_to_indices():
    """A OneHot observation leaf is exposed as Discrete and decoded on the device."""
    from torchrl_swm.export._core import Layout

    class OneHotObs(torch.nn.Module):
        pass

    from tensordict import TensorDict
    from torchrl.envs import EnvBase

    class Env(EnvBase):
        def __init__(self):
            super().__init__(batch_size=(3,))
            self.observation_spec = Composite(observation=OneHot(4, shape=(3, 4)), shape=(3,))
            self.action_spec = MultiOneHot([2, 3], shape=(3, 5))
            self.reward_spec = Unbounded((3, 1))

        def _reset(self, td=None, **kwargs):
            obs = torch.nn.functional.one_hot(torch.tensor([0, 2, 3]), 4)
            return TensorDict(observation=obs, done=torch.zeros(3, 1, dtype=torch.bool), batch_size=(3,))

        def _step(self, td):
            action = td["action"].long()  # multi-one-hot (3, 5) (bool): decode into the observation
            first = action[:, :2].argmax(-1) + action[:, 2:].argmax(-1)
            obs = torch.nn.functional.one_hot(first, 4)
            return TensorDict(observation=obs, reward=torch.zeros(3, 1), done=torch.zeros(3, 1, dtype=torch.bool),
                              batch_size=(3,))

        def _set_seed(self, seed):
            pass

    envs = to_gymnasium(Env(), autoreset_mode="same_step")
    assert envs.single_observation_space == gym.spaces.Discrete(4)
    assert envs.single_action_space == gym.spaces.MultiDiscrete([2, 3])
    obs, _ = envs.reset()
    assert obs.tolist() == [0, 2, 3] and obs.dtype == np.int64
    obs, *_ = envs.step(np.array([[0, 0], [1, 1], [1, 2]]))
    assert obs.tolist() == [0, 2, 3]
    assert isinstance(Layout(Env()).action_spec, MultiOneHot)


@pytest.mark.parametrize("spec_dtype", [torch.bool, torch.int64, torch.uint8])
def test_one_hot_observations_of_any_dtype_decode_to_indices(spec_dtype):
    """TorchRL's OneHot/MultiOneHot default to bool, which torch's argmax does not take."""
    from tensordict import TensorDict
    from torchrl.envs import EnvBase

    class Env(EnvBase):
        def __init__(self):
            super().__init__(batch_size=(3,))
            self.observation_spec = Composite(
                observation=OneHot(4, shape=(3, 4), dtype=spec_dtype),
                pair=MultiOneHot([2, 3], shape=(3, 5), dtype=spec_dtype),
                shape=(3,),
            )
            self.action_spec = Categorical(2, shape=(3,))
            self.reward_spec = Unbounded((3, 1))

        def _obs(self, index):
            one_hot = torch.nn.functional.one_hot
            pair = torch.cat([one_hot(index % 2, 2), one_hot(index % 3, 3)], -1)
            return {"observation": one_hot(index, 4).to(spec_dtype), "pair": pair.to(spec_dtype)}

        def _reset(self, td=None, **kwargs):
            return TensorDict({**self._obs(torch.tensor([0, 2, 3])), "done": torch.zeros(3, 1, dtype=torch.bool)},
                              batch_size=(3,))

        def _step(self, td):
            return TensorDict({**self._obs(torch.tensor([1, 1, 2])), "reward": torch.zeros(3, 1),
                               "done": torch.zeros(3, 1, dtype=torch.bool)}, batch_size=(3,))

        def _set_seed(self, seed):
            pass

    envs = to_gymnasium(Env(), autoreset_mode="same_step")
    assert envs.single_observation_space["observation"] == gym.spaces.Discrete(4)
    obs, _ = envs.reset()
    assert obs["observation"].tolist() == [0, 2, 3] and obs["pair"].tolist() == [[0, 0], [0, 2], [1, 0]]
    obs, *_ = envs.step(np.zeros(3, dtype=np.int64))
    assert obs["observation"].tolist() == [1, 1, 2] and obs["pair"].tolist() == [[1, 1], [1, 1], [0, 2]]
    assert envs.observation_space.contains(obs)


class _OrderedDictObs(gym.Env):
    """A Dict observation built from an OrderedDict: gymnasium keeps its order (z before a)."""

    def __init__(self):
        from collections import OrderedDict

        self.observation_space = gym.spaces.Dict(OrderedDict(
            [("z", gym.spaces.Box(-1, 1, (2,), np.float32)), ("a", gym.spaces.Discrete(3))]
        ))
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"z": np.full(2, 0.5, np.float32), "a": 1}, {}

    def step(self, action):
        self.t += 1
        return {"z": np.full(2, -0.5, np.float32), "a": 2}, 1.0, self.t >= 3, False, {}


@pytest.mark.parametrize("autoreset_mode", ["next_step", "same_step"])
def test_dict_observation_key_order_and_flattening_match_sync_vector_env(autoreset_mode):
    mode = gym.vector.AutoresetMode[autoreset_mode.upper()]
    ref = gym.vector.SyncVectorEnv([_OrderedDictObs] * 2, autoreset_mode=mode)
    envs = to_gymnasium(EnvPool([_OrderedDictObs] * 2, seed=0), autoreset_mode=autoreset_mode)
    assert list(envs.single_observation_space.keys()) == list(ref.single_observation_space.keys()) == ["z", "a"]
    assert list(envs.observation_space.keys()) == list(ref.observation_space.keys())
    assert envs.single_observation_space.sort_keys == ref.single_observation_space.sort_keys
    (obs, _), (want, _) = envs.reset(seed=0), ref.reset(seed=0)
    assert np.array_equal(gym.spaces.flatten(envs.observation_space, obs),
                          gym.spaces.flatten(ref.observation_space, want))
    obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
    want, *_ = ref.step(np.zeros(2, dtype=np.int64))
    assert np.array_equal(gym.spaces.flatten(envs.observation_space, obs),
                          gym.spaces.flatten(ref.observation_space, want))
    envs.close()
    ref.close()


class _ZetaAlpha(EnvBase):
    """A TorchRL env with no gymnasium space behind it: its observation Composite lists "zeta" before "alpha"."""

    def __init__(self):
        super().__init__(batch_size=torch.Size([2]))
        self.observation_spec = Composite(zeta=Unbounded((2, 1)), alpha=Unbounded((2, 2)), shape=(2,))
        self.action_spec = Categorical(2, shape=(2,))
        self.reward_spec = Unbounded((2, 1))

    def _obs(self):
        return TensorDict(zeta=torch.full((2, 1), 9.0), alpha=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), batch_size=[2])

    def _reset(self, td):
        return self._obs()

    def _step(self, td):
        false = torch.zeros(2, 1, dtype=torch.bool)
        return self._obs().update(reward=torch.zeros(2, 1), done=false, terminated=false.clone())

    def _set_seed(self, seed):
        pass


def test_a_dict_observation_from_torchrl_specs_keeps_the_specs_key_order():
    """With no gymnasium Dict to copy, the Dict spaces keep the Composite's key order (gymnasium would sort a
    plain dict's keys), the single space and the batched one alike: gymnasium.spaces.flatten then lays the
    leaves out in the env's order, zeta's values first."""
    envs = to_gymnasium(_ZetaAlpha())
    assert list(envs.single_observation_space.keys()) == ["zeta", "alpha"]
    assert list(envs.observation_space.keys()) == ["zeta", "alpha"]
    assert envs.observation_space == gym.vector.utils.batch_space(envs.single_observation_space, 2)
    for obs in (envs.reset(seed=0)[0], envs.step(np.zeros(2, np.int64))[0]):
        assert list(obs) == ["zeta", "alpha"] and obs in envs.observation_space
        assert gym.spaces.flatten(envs.observation_space, obs).tolist() == [9, 9, 1, 2, 3, 4]
        row = {key: value[1] for key, value in obs.items()}
        assert gym.spaces.flatten(envs.single_observation_space, row).tolist() == [9, 3, 4]
    envs.close()


def test_an_empty_dict_observation_key_is_refused_by_the_pool():
    class Env(_OrderedDictObs):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Dict({"": gym.spaces.Discrete(3), "x": gym.spaces.Discrete(2)})

    with pytest.raises(SpecError, match=r"observation_space: Dict key '' \(at the root\) is empty"):
        EnvPool([Env] * 2)


def test_a_spec_at_odds_with_its_values_is_refused_not_exported_as_a_wrong_space():
    # TorchRL's CatFrames over a MultiCategorical observation: shape (N, 4) but nvec still (N, 2)
    from torchrl.envs import CatFrames, TransformedEnv

    class Env(gym.Env):
        observation_space = gym.spaces.MultiDiscrete([3, 4])
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.array([1, 2]), {}

        def step(self, action):
            return np.array([2, 3]), 0.0, False, False, {}

    env = TransformedEnv(EnvPool([Env] * 2), CatFrames(2, dim=-1, in_keys=["observation"]))
    with pytest.raises(SpecError, match=r"MultiCategorical of shape \(2, 4\) gives per-env shape \(2,\) without its "
                                        r"batch dims, not \(4,\) \(its nvec has shape \(2, 2\)\)"):
        to_gymnasium(env)
    env.close()


class _Float64Box(gym.Env):
    """A float64 Box(-100, 100, (2,)) observation [t, -t]."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 0.0]), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, -self.t], np.float64), 1.0, False, self.t >= 3, {}


def test_a_transform_that_changes_a_pool_leafs_spec_exports_the_transformed_space_and_data():
    # a leaf a transform changed keeps its key but not the pool's gymnasium space: the export must read the
    # transformed spec (DoubleToFloat: float32 data and space; ObservationNorm: the bounds moved)
    from torchrl.envs import DoubleToFloat, ObservationNorm, TransformedEnv

    env = to_gymnasium(TransformedEnv(EnvPool([_Float64Box] * 2, seed=0), DoubleToFloat(in_keys=["observation"])))
    assert env.single_observation_space.dtype == np.float32
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.zeros(2, np.int64))
    assert obs.dtype == np.float32 and obs.tolist() == [[1.0, -1.0]] * 2 and env.observation_space.contains(obs)
    env.close()
    norm = ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"])
    env = to_gymnasium(TransformedEnv(EnvPool([_Float64Box] * 2, seed=0), norm))
    space = env.single_observation_space
    assert space.low.tolist() == [-199.0, -199.0] and space.high.tolist() == [201.0, 201.0]
    env.reset(seed=0)
    obs, *_ = env.step(np.zeros(2, np.int64))
    assert obs.tolist() == [[3.0, -1.0]] * 2 and env.observation_space.contains(obs)
    env.close()


def test_info_keys_declared_one_hot_are_exported_as_they_are():
    # a one-hot observation is exposed as indices (Discrete); an info declared OneHot keeps its values
    from torchrl_swm import to_sb3_vec_env

    class Env(_OrderedDictObs):
        def step(self, action):
            obs, reward, terminated, truncated, _ = super().step(action)
            return obs, reward, terminated, truncated, {"hot": np.array([0, 1, 0]), "mhot": np.array([0, 1, 1, 0, 0])}

    spec = {"hot": OneHot(3, dtype=torch.int64), "mhot": MultiOneHot([2, 3], dtype=torch.int64)}
    envs = to_gymnasium(EnvPool([Env] * 2, seed=0, info_spec=spec), autoreset_mode="same_step")
    envs.reset(seed=0)
    _, _, _, _, infos = envs.step(np.zeros(2, dtype=np.int64))
    assert infos["hot"].tolist() == [[0, 1, 0]] * 2 and infos["mhot"].tolist() == [[0, 1, 1, 0, 0]] * 2
    envs.close()
    sb3 = to_sb3_vec_env(EnvPool([Env] * 2, seed=0, info_spec=spec))
    sb3.reset()
    sb3.step_async(np.zeros(2, dtype=np.int64))
    *_, sb3_infos = sb3.step_wait()
    assert sb3_infos[0]["hot"].tolist() == [0, 1, 0]
    sb3.close()


class _NdMultiDiscrete(gym.Env):
    """Observes the action it was given (values from ``start``), reports it in the info as it came."""

    observation_space = gym.spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [-2, 5]])
    action_space = gym.spaces.MultiDiscrete([[2, 3], [4, 5]])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.start.copy(), {"a": np.zeros((2, 2), np.int64)}

    def step(self, action):
        assert action in self.action_space, action
        return action + self.observation_space.start, float(action.sum()), False, False, {"a": action.copy()}


@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
def test_an_nd_multidiscrete_round_trips_through_the_pool_and_the_export(backend):
    """It was refused ('expected a 1-d nvec'), though spec_to_space makes one from a 2-d MultiCategorical."""
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv([_NdMultiDiscrete] * 3), seed=0)
    else:
        pool = EnvPool([_NdMultiDiscrete] * 3, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    assert isinstance(pool.action_spec, MultiCategorical) and pool.action_spec.shape == (3, 2, 2)
    td = pool.rollout(4)
    # stored as indices from 0, as a 1-d MultiDiscrete's: the observation is the action the env received
    assert torch.equal(td["next", "observation"], td["action"])
    assert torch.equal(td["next", "info", "a"][:, :, 0], td["action"])
    assert torch.equal(td["next", "reward"][..., 0], td["action"].sum((-1, -2)).float())
    envs = to_gymnasium(pool, autoreset_mode="same_step")
    assert envs.single_observation_space == _NdMultiDiscrete.observation_space
    assert envs.single_action_space == _NdMultiDiscrete.action_space
    envs.reset(seed=0)
    action = np.array([[[1, 2], [3, 4]], [[0, 0], [0, 0]], [[1, 0], [2, 1]]])
    obs, rewards, *_ = envs.step(action)
    np.testing.assert_array_equal(obs, action + _NdMultiDiscrete.observation_space.start)
    np.testing.assert_array_equal(rewards, action.sum((-1, -2)))
    bad = np.array([[[1, 2], [3, 4]], [[0, 0], [0, 0]], [[1, 0], [4, 1]]])  # 4 >= nvec 4 in env 2
    with pytest.raises(ValueError, match=r"action: every value must lie in MultiDiscrete"):
        envs.step(bad)
    td = pool.reset()
    td["action"] = torch.as_tensor(bad)
    with pytest.raises(ValueError, match=r"action for env 2: expected indices below nvec=\[\[2, 3\], \[4, 5\]\], "
                                         r"got \[\[1, 0\], \[4, 1\]\]"):
        pool.step(td)
    envs.close()
    with pytest.raises(SpecError, match=r"has no one-hot spec .* keep categorical encoding"):
        EnvPool([_NdMultiDiscrete], categorical_action_encoding=False)
