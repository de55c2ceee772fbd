"""Space <-> spec conversion (torchrl_swm.specs)."""

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import index_space, to_index, wide_spaces
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, OneHot, Unbounded

from torchrl_swm import SpecError
from torchrl_swm.specs import batch_spec, space_to_spec, spec_to_space, unbatch_spec


def test_box_bounded_and_unbounded():
    spec = space_to_spec(gym.spaces.Box(-1.0, 2.0, shape=(3,), dtype=np.float32))
    assert isinstance(spec, Bounded) and spec.shape == (3,) and spec.dtype == torch.float32
    assert torch.equal(spec.space.low, torch.full((3,), -1.0)) and torch.equal(spec.space.high, torch.full((3,), 2.0))
    spec = space_to_spec(gym.spaces.Box(-np.inf, np.inf, shape=(2, 2), dtype=np.float64))
    assert isinstance(spec, Unbounded) and spec.shape == (2, 2) and spec.dtype == torch.float64


def test_a_float_box_at_or_just_inside_its_dtype_extremes_is_unbounded():
    # gymnasium writes "no bounds" as the dtype's finite extremes too; a Bounded spec there would sample the extremes
    top = np.finfo(np.float32).max
    for high in (top, np.nextafter(top, np.float32(0)), np.float32(top * (1 - 1e-7))):
        spec = space_to_spec(gym.spaces.Box(-high, high, (2,), np.float32))
        assert isinstance(spec, Unbounded), high
    assert isinstance(space_to_spec(gym.spaces.Box(-3.4e37, 3.4e37, (2,), np.float32)), Bounded)


def test_discrete_categorical_and_one_hot():
    spec = space_to_spec(gym.spaces.Discrete(5))
    assert isinstance(spec, Categorical) and spec.shape == () and spec.dtype == torch.int64 and spec.space.n == 5
    spec = space_to_spec(gym.spaces.Discrete(5), categorical=False)
    assert isinstance(spec, OneHot) and spec.shape == (5,) and spec.dtype == torch.int64


def test_multi_spaces():
    spec = space_to_spec(gym.spaces.MultiDiscrete([2, 3]))
    assert isinstance(spec, MultiCategorical) and spec.shape == (2,)
    assert isinstance(space_to_spec(gym.spaces.MultiDiscrete([2, 3]), categorical=False), MultiOneHot)
    spec = space_to_spec(gym.spaces.MultiBinary(4))
    assert isinstance(spec, Binary) and spec.shape == (4,) and spec.dtype == torch.int8


def test_nested_dict():
    space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,)), "b": gym.spaces.Dict({"c": gym.spaces.Discrete(3)})})
    spec = space_to_spec(space)
    assert isinstance(spec, Composite)
    assert spec["a"].shape == (2,) and isinstance(spec["b", "c"], Categorical)
    batched = batch_spec(spec, (4,))
    assert batched.shape == (4,) and batched["a"].shape == (4, 2) and batched["b", "c"].shape == (4,)


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Tuple((gym.spaces.Discrete(2),)), gym.spaces.Text(5), gym.spaces.Sequence(gym.spaces.Discrete(2))],
)
def test_unsupported_space_names_the_type(space):
    with pytest.raises(SpecError, match=type(space).__name__) as info:
        space_to_spec(space, name="observation_space")
    assert "expected one of Box, Discrete" in str(info.value)


@pytest.mark.parametrize("key", [1, 0.5, ""])
def test_a_dict_key_that_is_not_a_non_empty_string_is_a_spec_error_naming_it(key):
    # TorchRL would raise its own bare TypeError; EnvPool renames a single env's int keys itself
    with pytest.raises(SpecError, match=rf"obs\['outer'\]: Dict key {re.escape(repr(key))} \({type(key).__name__}\): "
                                        r"expected a non-empty string"):
        space_to_spec(gym.spaces.Dict({"outer": gym.spaces.Dict({key: gym.spaces.Discrete(2)})}), name="obs")


def test_unsupported_leaf_inside_dict_names_the_key():
    with pytest.raises(SpecError, match=r"\['bad'\].*Tuple"):
        space_to_spec(gym.spaces.Dict({"bad": gym.spaces.Tuple((gym.spaces.Discrete(2),))}), name="obs")


@pytest.mark.parametrize("backend", ["serial", "vector"])
def test_an_empty_dict_observation_entry_is_refused_by_the_pool_naming_it(backend):
    from torchrl_swm import EnvPool

    class EmptyEntry(gym.Env):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "e": gym.spaces.Dict({})})
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return {"a": np.zeros(2, np.float32), "e": {}}, {}

        def step(self, action):
            return {"a": np.zeros(2, np.float32), "e": {}}, 0.0, False, False, {}

    fns = [EmptyEntry] * 2
    with pytest.raises(SpecError, match=r"its entry \('e',\) is an empty Dict, which holds no value"):
        EnvPool(gym.vector.SyncVectorEnv(fns) if backend == "vector" else fns)


_dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.uint8])
_shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=40, deadline=None)
@given(shape=_shapes, dtype=_dtypes, bounded=st.booleans())
def test_box_round_trip(shape, dtype, bounded):
    if np.dtype(dtype).kind == "f" and not bounded:
        space = gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=dtype)
    else:
        space = gym.spaces.Box(0, 9, shape=shape, dtype=dtype)
    spec = space_to_spec(space)
    assert spec.shape == shape and spec.dtype == torch.from_numpy(np.zeros(0, dtype)).dtype
    back = spec_to_space(spec)
    assert back == space
    sample = torch.as_tensor(space.sample())
    assert spec.is_in(sample)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), nvec=st.lists(st.integers(2, 6), min_size=1, max_size=4), m=st.integers(1, 6))
def test_discrete_round_trips(n, nvec, m):
    for space in (gym.spaces.Discrete(n), gym.spaces.MultiDiscrete(nvec), gym.spaces.MultiBinary(m),
                  gym.spaces.Box(0, 1, (m,), np.bool_), gym.spaces.Box(0, 1, (), np.bool_)):
        assert spec_to_space(space_to_spec(space)) == space


class _DtypeEnv(gym.Env):
    """A Box observation (or an info value) of the given dtype."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, obs_dtype=np.float32, info_dtype=None):
        self.observation_space = gym.spaces.Box(0, 100, (2,), obs_dtype)
        self.info_dtype = info_dtype

    def _info(self):
        return {} if self.info_dtype is None else {"x": self.info_dtype(7)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(2, self.observation_space.dtype), self._info()

    def step(self, action):
        return np.ones(2, self.observation_space.dtype), 0.0, False, False, self._info()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_unsigned_dtypes_torch_cannot_clone_are_refused_with_a_way_out(dtype):
    import functools

    from torchrl_swm import EnvPool

    with pytest.raises(SpecError, match=rf"observation_space.*dtype {np.dtype(dtype)} is not supported.*cast it to"):
        EnvPool([functools.partial(_DtypeEnv, dtype)])
    with pytest.raises(SpecError, match=rf"info key .*x.*dtype {np.dtype(dtype)} is not supported"):
        EnvPool([functools.partial(_DtypeEnv, np.float32, dtype)])
    # the way out the message gives: an exact cast to a wider signed dtype, then everything works
    if dtype is not np.uint64:
        wider = np.int32 if dtype is np.uint16 else np.int64
        pool = EnvPool([lambda: gym.wrappers.DtypeObservation(_DtypeEnv(dtype), wider)] * 2)
        from torchrl.envs.utils import check_env_specs

        check_env_specs(pool)
        pool.close()


class _UnstorableActionEnv(gym.Env):
    """Actions of a dtype TorchRL's tensordicts cannot hold: the observation echoes the action."""

    observation_space = gym.spaces.Box(0, 9, (2,), np.float32)

    def __init__(self, dtype):
        self.action_space = gym.spaces.Box(0, 9, (2,), dtype)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert action in self.action_space and action.dtype == self.action_space.dtype
        return action.astype(np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("dtype, wider", [
    (np.uint16, np.int32),
    pytest.param(np.longdouble, np.float64, marks=pytest.mark.skipif(
        np.dtype(np.longdouble).itemsize <= 8, reason="longdouble is float64 on this platform")),
])
def test_an_unstorable_action_dtype_is_refused_with_an_action_wrapper_as_the_way_out(dtype, wider):
    from torchrl_swm import EnvPool

    # the way out is an action wrapper (TransformAction), never DtypeObservation, which an observation needs
    name, wider_name = np.dtype(dtype).name, np.dtype(wider).name
    with pytest.raises(SpecError, match=rf"action_space: dtype {name} is not supported.*{wider_name}.*TransformAction"):
        EnvPool([functools.partial(_UnstorableActionEnv, dtype)])

    def wrapped():  # the message's way out
        return gym.wrappers.TransformAction(_UnstorableActionEnv(dtype), lambda a: a.astype(dtype),
                                            gym.spaces.Box(0, 9, (2,), wider))

    pool = EnvPool([wrapped] * 2)
    td = pool.reset()
    td["action"] = torch.tensor([[3, 4], [5, 6]], dtype=getattr(torch, wider_name))
    assert pool.step(td)["next", "observation"].tolist() == [[3, 4], [5, 6]]
    pool.close()


_HALF_OPEN = [
    gym.spaces.Box(np.array([-np.inf, 0.0]), np.array([1.0, np.inf]), dtype=np.float32),
    gym.spaces.Box(np.array([-np.inf, -1.0]), np.array([np.inf, 1.0]), dtype=np.float64),
    gym.spaces.Box(-3e38, 3e38, shape=(4,), dtype=np.float32),  # finite, but high - low overflows float32
    gym.spaces.Box(-6e4, 6e4, shape=(3,), dtype=np.float16),
    gym.spaces.Box(-1e308, 1e308, shape=(3,), dtype=np.float64),  # high - low overflows float64 itself
]


@pytest.mark.parametrize("space", _HALF_OPEN, ids=str)
def test_box_rand_samples_inside_half_open_and_overwide_boxes(space):
    """Bounded.rand computes low + (high - low) * u in the spec's dtype: NaN/inf where a bound is infinite, the
    upper bound every time where the span overflows. These Boxes sample as gymnasium's Box.sample does."""
    from torchrl_swm.specs import BoxBounded

    spec = space_to_spec(space, action=True)
    assert type(spec) is BoxBounded and isinstance(spec, Bounded)
    assert type(space_to_spec(space)) is not BoxBounded  # observations keep TorchRL's own spec
    draws = spec.rand((2000,)).numpy()
    assert draws.dtype == space.dtype and np.isfinite(draws).all()
    assert all(space.contains(d) for d in draws)
    # varied draws, never one value (a bound) repeated: counted, as std() of draws near 1e308 overflows to inf
    for column in draws.reshape(len(draws), -1).T:
        assert np.unique(column, return_counts=True)[1].max() < len(column) // 10, column[:5]
    # the batched spec of a pool, a copy, a moved or recast spec keep this rand
    for derived in (spec.expand(5, *spec.shape), spec.clone(), spec.expand(3, *spec.shape)[1], spec.to(torch.float64)):
        assert type(derived) is BoxBounded
        assert torch.isfinite(derived.rand()).all()
    assert torch.equal(spec.space.low, torch.as_tensor(space.low))
    assert torch.equal(spec.space.high, torch.as_tensor(space.high))
    assert spec_to_space(spec) == space


def test_box_bounded_specs_equal_and_stack_with_torchrl_bounded_specs():
    """TorchRL compares specs by exact type and stacks them only when each is an instance of the first one's
    class: a BoxBounded action spec must still equal, and stack with, the Bounded spec of the same Box."""
    from torchrl.envs import SerialEnv

    from torchrl_swm import EnvPool
    from torchrl_swm.specs import BoxBounded

    space = _HALF_OPEN[0]
    ours, plain = space_to_spec(space, action=True), space_to_spec(space)
    assert type(ours) is BoxBounded and type(plain) is not BoxBounded
    assert ours == plain and plain == ours and not (ours != plain)
    assert ours != space_to_spec(_HALF_OPEN[1], action=True)
    for pair in ([ours, plain], [plain, ours]):
        stacked = torch.stack([s.expand(2, 2) for s in pair], 0)
        assert stacked.shape == (2, 2, 2) and torch.isfinite(stacked.rand()).all() == (stacked.__class__ is BoxBounded)
    finite = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def env_with(action_space):
        class Env(gym.Env):
            observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.zeros(1, np.float32), {}

            def step(self, action):
                return np.zeros(1, np.float32), 0.0, False, False, {}

        Env.action_space = action_space
        return lambda: EnvPool([Env] * 2, seed=0, info_keys=[])

    for order in ((space, finite), (finite, space)):  # pools with different action specs, either first
        serial = SerialEnv(2, [env_with(order[0]), env_with(order[1])])
        assert serial.action_spec.shape == (2, 2, 2)
        assert serial.rollout(3)["action"].shape == (2, 2, 3, 2)  # (workers, envs, time, action)
        serial.close()


def test_a_box_bounded_spec_never_equals_one_of_another_dtype_with_the_same_bounds():
    # check_env_specs and a SerialEnv of pools compare specs: what a user sees is a float32 action spec unequal to
    # a float64 one, even where the bounds match (TorchRL's ToTensorImage and DTypeCastTransform set spec.dtype
    # on a clone, which leaves its bounds' dtype as they were); review R4 S9
    from torchrl_swm.specs import BoxBounded

    low, high = np.array([-np.inf, 0.0]), np.array([1.0, np.inf])
    box32 = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
    box64 = gym.spaces.Box(low, high, dtype=np.float64)
    ours32, ours64 = space_to_spec(box32, action=True), space_to_spec(box64, action=True)
    assert type(ours32) is BoxBounded and type(ours64) is BoxBounded
    assert ours32 != ours64 and ours64 != ours32
    assert ours32 != space_to_spec(box64) and ours64 != space_to_spec(box32)  # TorchRL's own Bounded of the Box
    recast = ours32.clone()
    recast.dtype = torch.float64  # the same bound tensors (float32), another dtype: its rand() gives float64
    assert type(recast) is BoxBounded and recast.dtype == torch.float64 and recast.rand().dtype == torch.float64
    assert ours32 != recast and recast != ours32
    assert ours32 == ours32.clone()  # the same dtype and bounds are still equal


def test_pool_observation_specs_equal_torchrl_gym_env_specs():
    from torchrl.envs import GymEnv

    from torchrl_swm import EnvPool

    pool, ref = EnvPool("CartPole-v1", num_envs=2, seed=0), GymEnv("CartPole-v1")
    assert pool.observation_spec["observation"][0] == ref.observation_spec["observation"]  # infinite velocity bounds
    pool.close()
    ref.close()


def test_a_collector_without_policy_sends_half_open_box_actions_inside_the_space():
    from torchrl.collectors import Collector

    from torchrl_swm import EnvPool

    space = _HALF_OPEN[0]
    received = []

    class HalfOpen(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {}

        def step(self, action):
            received.append(np.array(action))
            return np.zeros(1, np.float32), 0.0, False, False, {}

    pool = EnvPool([HalfOpen] * 2, seed=0, info_keys=[])
    collector = Collector(pool, None, frames_per_batch=20, total_frames=40)
    for _ in collector:
        pass
    collector.shutdown()
    assert len(received) >= 40 and all(space.contains(a) for a in received)


def test_half_open_box_leaves_of_a_nested_dict_action_sample_inside_their_space():
    # the action treatment reaches Dict leaves at any depth: TorchRL's Bounded.rand would draw NaN there
    from torchrl_swm.specs import BoxBounded

    space = gym.spaces.Dict({"a": _HALF_OPEN[0], "b": gym.spaces.Dict({"c": _HALF_OPEN[1]})})
    spec = space_to_spec(space, action=True)
    draws = spec.rand((100,))
    assert all(space.contains({"a": d["a"].numpy(), "b": {"c": d["b", "c"].numpy()}}) for d in draws)
    assert type(spec["a"]) is BoxBounded and type(spec["b", "c"]) is BoxBounded


def test_a_half_open_action_box_samples_low_plus_an_exponential_as_gymnasium_does():
    # Box(5, inf).sample() is 5 + Exp(1) (mean 6, std 1): never a draw clamped onto the bound
    spec = space_to_spec(gym.spaces.Box(5.0, np.inf, (10000,), np.float32), action=True)
    torch.manual_seed(0)
    draws = spec.rand()
    assert (draws >= 5).all() and 5.8 < draws.mean() < 6.2 and 0.8 < draws.std() < 1.2
    assert (draws == 5).float().mean() < 0.01


def test_a_float64_action_box_with_constant_dims_samples_exactly_the_constant():
    # low * (1 - u) + high * u is not always 2.9 in float64 for low == high == 2.9: the draw is clamped into the Box
    box = gym.spaces.Box(np.array([2.9, 0.0]), np.array([2.9, np.inf]), dtype=np.float64)
    spec = space_to_spec(box, action=True)
    torch.manual_seed(0)
    draws = spec.rand((100,))
    assert draws[:, 0].eq(2.9).all() and spec.is_in(draws) and all(box.contains(d) for d in draws.numpy())


def test_an_n_d_multi_binary_keeps_its_shape_in_the_spec_and_the_pool():
    from torchrl.envs.utils import check_env_specs

    from torchrl_swm import EnvPool

    space, value = gym.spaces.MultiBinary([2, 3]), np.array([[0, 1, 0], [1, 1, 0]], np.int8)
    assert space_to_spec(space).shape == (2, 3) and spec_to_space(space_to_spec(space)) == space

    class Grid(gym.Env):
        observation_space, action_space = space, gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return value, {}

        def step(self, action):
            return value, 0.0, False, False, {}

    pool = EnvPool([Grid] * 2, seed=0)
    assert pool.observation_spec["observation"].shape == (2, 2, 3)
    assert pool.reset()["observation"][1].tolist() == value.tolist()
    check_env_specs(pool)
    pool.close()


@pytest.mark.parametrize("device", ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else []))
def test_as_spec_puts_a_space_and_a_torchrl_spec_alike_on_the_device(device):
    # "meta" is the CPU stand-in for an accelerator: a spec built on the CPU must move there as a space's spec does
    from torchrl_swm.specs import as_spec

    spec = Bounded(0.0, 1.0, shape=(2,), device="cpu")
    assert as_spec(spec, device=device).device == torch.device(device)
    assert as_spec(gym.spaces.Box(0, 1, (2,)), device=device).device == torch.device(device)
    assert as_spec(spec) is spec  # no device: the spec as given


def test_a_float_box_a_little_inside_its_dtype_extremes_keeps_its_bounds():
    # only bounds within 1e-6 of finfo.max read as "unbounded": 0.9995 * max is a real (if huge) bound
    m = np.float32(np.finfo(np.float32).max * 0.9995)
    spec = space_to_spec(gym.spaces.Box(-m, m, (2,), np.float32))
    assert isinstance(spec, Bounded) and spec.space.high.tolist() == [m, m] and spec.space.low.tolist() == [-m, -m]


def test_the_spec_of_a_dict_space_keeps_the_space_key_order():
    # not sorted, not reversed: the space's own order, at every depth (a Dict from pairs keeps their order)
    inner = gym.spaces.Dict([("y", gym.spaces.Discrete(2)), ("x", gym.spaces.Discrete(3))])
    space = gym.spaces.Dict([("z", gym.spaces.Box(0, 1, (2,))), ("a", inner), ("m", gym.spaces.MultiBinary(3))])
    spec = space_to_spec(space)
    assert list(spec.keys()) == ["z", "a", "m"] and list(spec["a"].keys()) == ["y", "x"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=wide_spaces, n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_any_supported_space_round_trips_and_its_samples_lie_in_its_spec(space, n, seed):
    """space -> spec -> space gives the space back (discrete values as indices from 0), unbatched and through a
    batch of ``n``, keeping every Box dtype (float16 included), shape (``()`` included), per-element and half-open
    bounds, and a 2-d MultiBinary's shape; and every sample of the space, as indices, lies in the spec."""
    spec = space_to_spec(space)
    assert spec_to_space(spec) == index_space(space)
    assert spec_to_space(unbatch_spec(batch_spec(spec, (n,)), 1)) == index_space(space)
    space.seed(seed)
    for _ in range(5):
        for path, value in to_index(space, space.sample()).items():
            leaf = spec[path] if path else spec
            assert leaf.is_in(torch.as_tensor(value).to(leaf.dtype)), (space, path, value, leaf)
