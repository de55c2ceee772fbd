"""Preallocated buffers, snapshot independence, pixels, and devices."""

import functools
import re

import numpy as np
import pytest
import torch
from envs import DictObsEnv, counting

from torchrl_swm import EnvPool
from torchrl_swm.pool.buffers import BufferLayout, HostBuffers


def test_buffers_are_allocated_once_and_written_in_place():
    pool = EnvPool([functools.partial(counting, max_length=4)] * 4, seed=0)
    host = pool._host
    flat_ptr = host.flat.data_ptr()
    arrays = {key: (id(a), a.__array_interface__["data"][0]) for key, a in host.arrays.items()}
    rollout = pool.rollout(100, break_when_any_done=False)  # many steps and partial resets
    assert rollout["next", "done"].sum() > 20
    assert host.flat.data_ptr() == flat_ptr
    assert {key: (id(a), a.__array_interface__["data"][0]) for key, a in host.arrays.items()} == arrays
    # every leaf of the output is a view of nothing the pool keeps
    out = pool.reset()
    for value in out.values(True, True):
        start = value.untyped_storage().data_ptr()
        assert not (flat_ptr <= start < flat_ptr + host.layout.nbytes)
    pool.close()


def test_returned_tensordicts_do_not_change_when_later_steps_run():
    pool = EnvPool([functools.partial(counting, length=3)] * 2, seed=0)
    td = pool.reset()
    kept = []
    for _ in range(6):
        td["action"] = torch.ones(2, dtype=torch.int64)
        out, td = pool.step_and_maybe_reset(td)
        kept.append((out, out.clone()))
    for out, copy in kept:
        assert (out == copy).all()
    pool.close()


@pytest.mark.parametrize("with_pixels", [False, True])
def test_single_copy_snapshot_matches_per_leaf_snapshot(with_pixels):
    pool = EnvPool([functools.partial(counting, length=4, render_mode="rgb_array")] * 3, seed=0, pixels=with_pixels)
    pool.reset()
    host = pool._host
    single = HostBuffers(host.layout, "cpu", flat=host.flat, single_copy=True)
    keys = pool._step_keys
    a, b = host.snapshot(keys, pool.batch_size), single.snapshot(keys, pool.batch_size)
    assert (a == b).all()
    assert b["observation"].untyped_storage().data_ptr() != host.flat.data_ptr()
    pool.close()


def test_layout_alignment():
    layout = BufferLayout({("a",): ((3,), np.bool_), ("b",): ((2, 5), np.float64), ("c",): ((7,), np.int64)})
    assert all(slot.offset % 64 == 0 for slot in layout.slots.values())
    views = layout.views(np.zeros(layout.nbytes, np.uint8))
    assert views[("b",)].shape == (2, 5) and views[("b",)].dtype == np.float64


def test_pixels_native_size_and_resized_follow_rows():
    fns = [functools.partial(counting, length=50, render_mode="rgb_array")] * 3
    pool = EnvPool(fns, seed=0, pixels=True)
    td = pool.reset()
    assert td["pixels"].shape == (3, 8, 12, 3) and td["pixels"].dtype == torch.uint8
    pool.close()

    pool = EnvPool(fns, seed=0, image_shape=(4, 6))
    td = pool.reset()
    assert pool.observation_spec["pixels"].shape == (3, 4, 6, 3)
    assert (td["pixels"][..., 0] == 0).all()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td = pool.step(td)["next"].clone()
    assert (td["pixels"][..., 0] == 1).all()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = pool.step(td)["next"]
    assert out["pixels"][:, 0, 0, 0].tolist() == [2, 1, 2]  # the frozen row keeps its frame
    pool.close()


def test_pixels_require_rgb_array_render_mode():
    from torchrl_swm import EnvError

    with pytest.raises(EnvError, match="render_mode='rgb_array'"):
        EnvPool([functools.partial(counting)] * 2, pixels=True)


def test_cartpole_pixels_from_id():
    pytest.importorskip("pygame")
    pool = EnvPool("CartPole-v1", num_envs=2, image_shape=(32, 48), seed=0)
    td = pool.reset()
    assert td["pixels"].shape == (2, 32, 48, 3) and td["pixels"].float().std() > 0
    pool.close()


def test_device_outputs(device):
    pool = EnvPool([DictObsEnv] * 3, seed=0, device=device)
    rollout = pool.rollout(30, break_when_any_done=False)
    for value in rollout.values(True, True):
        assert value.device.type == device.type
    assert rollout["goal", "kind"].dtype == torch.int64
    assert ((rollout["goal", "kind"] >= 0) & (rollout["goal", "kind"] < 4)).all()  # Discrete(4, start=1) -> 0..3
    pool.close()


# -- the batched observation write: same result as writing row by row, or the same error --------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import gymnasium as gym  # noqa: E402

from torchrl_swm import EnvError  # noqa: E402
from torchrl_swm.pool.infos import InfoSchema, InfoWriter  # noqa: E402
from torchrl_swm.pool.rows import RowWriter  # noqa: E402

_FORMS = ["float32", "float64", "int64", "bool", "list", "tensor", "wrong_shape", "text", "scalar", "big_int"]


def _writer(n, dtype, low=-10):
    space = gym.spaces.Box(low, 10, (3,), dtype)
    arrays = {("observation",): np.zeros((n, 3), dtype)}
    for key in ("reward",):
        arrays[(key,)] = np.zeros((n, 1), np.float32)
    for key in ("terminated", "truncated", "done"):
        arrays[(key,)] = np.zeros((n, 1), bool)
    arrays[("episode_seed",)] = np.zeros((n, 1), np.int64)
    return RowWriter(space, arrays, InfoWriter(InfoSchema({}), arrays)), arrays[("observation",)]


def _value(form, row):
    base = np.array([row, row + 1, row + 2], np.float64)
    return {
        "float32": base.astype(np.float32), "float64": base, "int64": base.astype(np.int64),
        "bool": base.astype(bool), "list": base.tolist(), "tensor": torch.from_numpy(base.astype(np.float32)),
        "wrong_shape": base[:2], "text": base.astype(str), "scalar": float(row),
        "big_int": base.astype(np.int64) + 2**53 + 1,  # exact in neither float32 nor float64
    }[form]


@settings(max_examples=150, deadline=None)
@given(forms=st.lists(st.sampled_from(_FORMS), min_size=1, max_size=6),
       dtype=st.sampled_from([np.float32, np.float64, np.int64]), masked=st.booleans())
def test_batched_observation_write_matches_the_row_by_row_rule(forms, dtype, masked):
    n = len(forms) + 2
    rows = np.arange(2, n) if masked else np.arange(len(forms))
    index = rows if masked else slice(0, len(forms))
    values = tuple(_value(form, int(i)) for form, i in zip(forms, rows))
    batch_writer, batched = _writer(n, dtype)
    row_writer, one_by_one = _writer(n, dtype)
    expected_error = None
    try:
        for i, value in zip(rows.tolist(), values):
            row_writer.observation(i, value, "step")
    except EnvError as err:
        expected_error = err
    if expected_error is None:
        batch_writer.observations_of_rows(index, rows.tolist(), values, "step")
        assert np.array_equal(batched, one_by_one)
    else:
        with pytest.raises(EnvError) as got:
            batch_writer.observations_of_rows(index, rows.tolist(), values, "step")
        assert str(got.value) == str(expected_error)  # same env index, same message


# -- integer observations of another width or sign: range-checked, never wrapped ---------------


class IntObsEnv(gym.Env):
    """A Box observation of ``space_dtype``: ``[value]`` as ``value_dtype`` at every step after the
    construction probe's, and at resets with options (``[0]`` otherwise)."""

    def __init__(self, value=0, space_dtype=np.int8, value_dtype=np.int64, dict_obs=False):
        box = gym.spaces.Box(max(-100, np.iinfo(space_dtype).min), 100, (1,), space_dtype)
        self.observation_space = gym.spaces.Dict({"x": box}) if dict_obs else box
        self.action_space = gym.spaces.Discrete(2)
        self.value, self.value_dtype, self.dict_obs = value, value_dtype, dict_obs
        self.steps = 0

    def _obs(self, value):
        obs = np.array([value], dtype=self.value_dtype)
        return {"x": obs} if self.dict_obs else obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(self.value if options else 0), {}

    def step(self, action):
        self.steps += 1
        return self._obs(self.value if self.steps > 1 else 0), 0.0, False, False, {}  # the probe's step: 0


class IntObsVectorEnv(gym.vector.VectorEnv):
    """The batched :class:`IntObsEnv`: int64 observation arrays, as a VectorEnv of its own may return
    (gymnasium's SyncVectorEnv would cast them into the space's dtype itself, wrapping 300 to 44)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}

    def __init__(self, values, space_dtype=np.int8, value_dtype=np.int64, dict_obs=False):
        single = IntObsEnv(0, space_dtype, value_dtype, dict_obs)
        self.num_envs = len(values)
        self.single_observation_space, self.single_action_space = single.observation_space, single.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.values = np.array(values, dtype=value_dtype)
        self.dict_obs, self.steps = dict_obs, 0

    def _obs(self, on):
        obs = (self.values if on else np.zeros_like(self.values))[:, None]
        return {"x": obs} if self.dict_obs else obs

    def reset(self, *, seed=None, options=None):
        return self._obs(bool(options and "obs" in options)), {}

    def step(self, actions):
        self.steps += 1
        n = self.num_envs
        return self._obs(self.steps > 1), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}


def _int_obs_pool(values, vector=False, **kwargs):
    import functools

    if vector:
        return EnvPool(IntObsVectorEnv(values, **kwargs), seed=0)
    return EnvPool([functools.partial(IntObsEnv, v, **kwargs) for v in values], seed=0)


@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("vector", [False, True])
def test_int_observation_out_of_the_box_dtype_range_is_named_not_wrapped(vector, dict_obs):
    pool = _int_obs_pool([5, 300], vector=vector, dict_obs=dict_obs)
    key = "x" if dict_obs else "observation"
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=rf"env 1 \(step\): observation \('{key}',\): expected dtype int8.*"
                                       r"value 300 is out of the range of int8 \[-128, 127\]") as err:
        pool.step(td)  # int64 300 would be stored as 44
    assert err.value.env_index == 1
    with pytest.raises(EnvError, match=r"env 1 \(reset\).*value 300 is out of the range of int8"):
        pool.reset(options={"obs": "value"})  # the per-row (reset) path too
    pool.close()
    # in range: the int64 values are stored exactly
    pool = _int_obs_pool([5, -100], vector=vector, dict_obs=dict_obs)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", key].view(-1).tolist() == [5, -100]
    pool.close()


@pytest.mark.parametrize("vector", [False, True])
def test_int_observation_of_another_sign_is_range_checked(vector):
    pool = _int_obs_pool([7, 100], vector=vector, space_dtype=np.uint8)  # int64 values into a uint8 Box
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", "observation"].view(-1).tolist() == [7, 100]
    pool.close()
    pool = _int_obs_pool([7, -1], vector=vector, space_dtype=np.uint8)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=r"env 1 \(step\).*uint8.*value -1 is out of the range of uint8"):
        pool.step(td)  # -1 would be stored as 255
    pool.close()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
@pytest.mark.parametrize("vector", [False, True])
def test_int_observation_at_the_ends_of_the_box_dtype_range_is_stored_and_one_past_refused(vector, dtype):
    # int64 values into a narrower Box: the dtype's min and max fit (as in numpy), min - 1 and max + 1 do not
    lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    pool = _int_obs_pool([lo, hi], vector=vector, space_dtype=dtype)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", "observation"].view(-1).tolist() == [lo, hi]
    assert pool.reset(options={"obs": "value"})["observation"].view(-1).tolist() == [lo, hi]  # the reset path
    pool.close()
    for values, bad in (([lo, hi + 1], hi + 1), ([lo - 1, hi], lo - 1)):
        pool = _int_obs_pool(values, vector=vector, space_dtype=dtype)
        td = pool.reset()
        td["action"] = torch.zeros(2, dtype=torch.int64)
        with pytest.raises(EnvError, match=rf"env {values.index(bad)} \(step\).*value {bad} is out of the range of "
                                           rf"{np.dtype(dtype)} \[{lo}, {hi}\]"):
            pool.step(td)
        pool.close()


_INT_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64, np.uint64]


@settings(max_examples=120, deadline=None)
@given(data=st.data(), src=st.sampled_from(_INT_DTYPES), dst=st.sampled_from(_INT_DTYPES), n=st.integers(1, 5))
def test_integer_observations_are_stored_exactly_or_refused(data, src, dst, n):
    limits = np.iinfo(src)
    values = [data.draw(st.integers(int(limits.min), int(limits.max))) for _ in range(n)]
    observations = tuple(np.full(3, v, dtype=src) for v in values)
    fits = [np.iinfo(dst).min <= v <= np.iinfo(dst).max for v in values]
    for batched in (True, False):
        writer, buf = _writer(n, dst, low=0)  # (the space's bounds are not checked, the dtype's range is)
        try:
            if batched:
                writer.observations_of_rows(slice(0, n), list(range(n)), observations, "step")
            else:
                for i, obs in enumerate(observations):
                    writer.observation(i, obs, "step")
        except EnvError as err:
            assert not all(fits)
            assert err.env_index == fits.index(False)  # the first env whose value does not fit
            assert f"value {values[err.env_index]} is out of the range of {np.dtype(dst)}" in str(err)
        else:
            assert all(fits)
            assert buf[:, 0].tolist() == values  # never wrapped


class ObsDtypeEnv(gym.Env):
    """A ``Box(-inf, inf, (1,), space_dtype)``: ``[value]`` as ``value_dtype`` at every step, zeros of the
    space's dtype at reset."""

    def __init__(self, value, value_dtype, space_dtype):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), space_dtype)
        self.action_space = gym.spaces.Discrete(2)
        self.value, self.value_dtype = value, value_dtype

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, self.observation_space.dtype), {}

    def step(self, action):
        return np.array([self.value], self.value_dtype), 0.0, False, False, {}


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("space_dtype, big", [(np.float32, 2**24 + 1), (np.float64, 2**53 + 1)])
def test_inexact_int_observation_is_refused_whatever_the_other_envs_send(backend, space_dtype, big):
    # env 1's int64 value is not exactly a float of the Box: stacked with env 0's float row it was promoted
    # (to float64) before the check and read back rounded; each env's row is judged on its own
    for other_dtype in (np.int64, space_dtype):
        fns = [functools.partial(ObsDtypeEnv, 0, other_dtype, space_dtype),
               functools.partial(ObsDtypeEnv, big, np.int64, space_dtype)]
        pool = EnvPool(fns, seed=0, backend=backend, num_workers=1)
        td = pool.reset()
        td["action"] = torch.zeros(2, dtype=torch.int64)
        with pytest.raises(EnvError, match=rf"env 1 \(step\): observation \('observation',\): expected dtype "
                                           rf"{np.dtype(space_dtype)}.*integer {big} is not exactly representable"):
            pool.step(td)
        pool.close()


# -- Discrete / MultiDiscrete observations outside their space: refused, not shifted out of the spec ----


class SpaceObsEnv(gym.Env):
    """Observes ``good`` (of ``space``, in a Dict ``{"x": ...}`` with ``dict_obs``), and ``bad`` at steps after the
    construction probe's and at resets with options."""

    def __init__(self, space, good, bad, dict_obs=False):
        self.observation_space = gym.spaces.Dict({"x": space}) if dict_obs else space
        self.action_space = gym.spaces.Discrete(2)
        self.good, self.bad, self.dict_obs, self.steps = good, bad, dict_obs, 0

    def _obs(self, bad):
        value = self.bad if bad else self.good
        return {"x": value} if self.dict_obs else value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(bool(options)), {}

    def step(self, action):
        self.steps += 1
        return self._obs(self.steps > 1), 0.0, False, False, {}


_OUT_OF_SPACE = [
    (gym.spaces.Discrete(4, start=3), 3, 10, "10"),  # was stored as index 7 of Categorical(4)
    (gym.spaces.Discrete(4, start=3), 3, 0, "0"),  # was -3
    (gym.spaces.Discrete(4), 0, 4, "4"),
    (gym.spaces.MultiDiscrete([3, 4], start=[1, -1]), np.array([1, -1]), np.array([2, 3]), r"\[2, 3\]"),
    (gym.spaces.MultiDiscrete([3, 4], start=[1, -1]), np.array([1, -1]), np.array([0, 0]), r"\[0, 0\]"),
    # numpy computed uint64 - int64 in float64: 2**60 + 100 - 2**60 read 0, an index in the space (and 2**60 + 3
    # was stored as index 0, not 3)
    (gym.spaces.Discrete(5, start=2**60, dtype=np.uint64), np.uint64(2**60), np.uint64(2**60 + 100),
     str(2**60 + 100)),
    (gym.spaces.MultiBinary(3), np.zeros(3, np.int8), np.array([0, 2, 1], np.int8), r"\[0, 2, 1\]"),  # was stored
    (gym.spaces.MultiBinary(3), np.zeros(3, np.int8), np.array([0, -1, 1], np.int8), r"\[0, -1, 1\]"),
]


@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("space, good, bad, shown", _OUT_OF_SPACE)
def test_discrete_observation_outside_its_space_is_an_error_naming_the_env(space, good, bad, shown, dict_obs, backend):
    fns = [functools.partial(SpaceObsEnv, space, good, good, dict_obs),
           functools.partial(SpaceObsEnv, space, good, bad, dict_obs)]
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, seed=0, backend=backend, num_workers=1)
    key = "x" if dict_obs else "observation"
    td = pool.reset()
    assert (td[key] == 0).all()  # the lowest value of the space: index 0
    td["action"] = torch.zeros(2, dtype=torch.int64)
    message = rf"env 1 \(step\): observation \('{key}',\): expected a value of {re.escape(str(space))}, got {shown}$"
    with pytest.raises(EnvError, match=message) as err:
        pool.step(td)
    assert err.value.env_index == 1
    if backend != "vector":  # (a vector env resets every row with one call: no options for env 1 alone)
        with pytest.raises(EnvError, match=message.replace("step", "reset")):
            pool.reset(options=[None, {"bad": True}])
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "vector"])
def test_a_large_uint64_discrete_start_keeps_exact_indices(backend):
    space = gym.spaces.Discrete(5, start=2**60, dtype=np.uint64)
    fns = [functools.partial(SpaceObsEnv, space, np.uint64(2**60 + 3), np.uint64(2**60 + 3))] * 2
    pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0) if backend == "vector" else EnvPool(fns, seed=0)
    assert pool.reset()["observation"].tolist() == [3, 3]  # was [0, 0]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "vector"])
def test_several_bad_discrete_leaves_name_the_first_env_at_step_and_reset_alike(backend):
    """A step named the first bad row of the first bad leaf (env 1's 'a'), a reset the first env (env 0's 'b')."""
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Discrete(3)})
    fns = [functools.partial(SpaceObsEnv, space, {"a": 0, "b": 0}, {"a": 0, "b": 7}),
           functools.partial(SpaceObsEnv, space, {"a": 0, "b": 0}, {"a": 7, "b": 0})]
    pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0) if backend == "vector" else EnvPool(fns, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=r"env 0 \(step\): observation \('b',\): expected a value of Discrete\(3\), got 7"):
        pool.step(td)
    pool.close()


def test_an_n_d_multidiscrete_out_of_space_message_is_one_line():
    space = gym.spaces.MultiDiscrete([[3, 4], [2, 5]])
    good = np.zeros((2, 2), np.int64)
    pool = EnvPool([functools.partial(SpaceObsEnv, space, good, np.array([[0, 0], [2, 0]]))] * 2, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError) as err:
        pool.step(td)
    assert "\n" not in str(err.value) and "got [[0, 0], [2, 0]]" in str(err.value)
    pool.close()


# -- image_shape=(H, W) resizes every frame, whatever its own size ---------------------------------


def _frame_size(i, t, grow_at):
    """Env 1 renders 10x12 frames, the others 6x8; every env's frames grow by a row from step ``grow_at``."""
    h, w = (10, 12) if i == 1 else (6, 8)
    return (h + 1, w) if grow_at is not None and t >= grow_at else (h, w)


def _frame(i, t, grow_at):
    h, w = _frame_size(i, t, grow_at)
    return ((np.arange(h * w * 3).reshape(h, w, 3) * (i + 2) + 7 * t) % 256).astype(np.uint8)


class SizedFrameEnv(gym.Env):
    """``render()`` gives :func:`_frame` of env ``i`` at step ``t`` (a 4-step episode)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, i, grow_at=None, sizes_differ=True):
        self.i, self.grow_at, self.render_mode, self.t = (i if sizes_differ else 0), grow_at, "rgb_array", 0
        self.observation_space, self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32), gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, self.t >= 4, False, {}

    def render(self):
        return _frame(self.i, self.t, self.grow_at)


def _resized(frame, hw):
    """A frame resized alone, as the pool resizes (bilinear, antialiased, rounded)."""
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float()
    x = torch.nn.functional.interpolate(x, size=hw, mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)


@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
@pytest.mark.parametrize("sizes_differ, grow_at, hw", [
    (True, None, (4, 5)),  # env 1's frames are larger from the start
    (True, 2, (4, 5)),  # and every env's grow mid-episode
    (False, 2, (6, 8)),  # image_shape is the first frames' size: they are stored as they are, the larger resized
])
def test_image_shape_resizes_every_frame_whatever_its_size(backend, sizes_differ, grow_at, hw):
    fns = [functools.partial(SizedFrameEnv, i, grow_at, sizes_differ) for i in range(3)]
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0, image_shape=hw)
    else:
        pool = EnvPool(fns, seed=0, image_shape=hw, backend=backend, num_workers=2)
    td = pool.rollout(6, break_when_any_done=False)
    assert td["pixels"].shape == (3, 6, *hw, 3)
    for i in range(3):
        for t in range(6):
            step = t + 1 if t < 4 else t - 3  # episodes of 4 steps: reset after the 4th
            expected = _resized(_frame(i if sizes_differ else 0, step, grow_at), hw)
            assert torch.equal(td["next", "pixels"][i, t], expected), (i, t)
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
def test_frames_of_another_size_without_image_shape_are_an_error_naming_image_shape(backend):
    fns = [functools.partial(SizedFrameEnv, i, 2, False) for i in range(2)]
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0, pixels=True)
    else:
        pool = EnvPool(fns, seed=0, pixels=True, backend=backend, num_workers=1)
    pool.rollout(1)
    with pytest.raises(EnvError, match=r"env 0 \(render\): frame shape \(7, 8, 3\) differs from the pool's "
                                       r"\(6, 8, 3\); .*image_shape=\(H, W\)"):
        pool.rollout(3, break_when_any_done=False)
    pool.close()
    fns = [functools.partial(SizedFrameEnv, i) for i in range(2)]
    with pytest.raises(EnvError, match=r"env 1 \(render\): frame shape \(10, 12, 3\) differs from env 0's "
                                       r"\(6, 8, 3\); .*image_shape=\(H, W\)"):
        if backend == "vector":
            EnvPool(gym.vector.SyncVectorEnv(fns), seed=0, pixels=True)
        else:
            EnvPool(fns, seed=0, pixels=True, backend=backend, num_workers=1)


class FineRewardEnv(gym.Env):
    """Rewards with every float32 digit in use (10000.1 + t / 3): float16 (or any narrower store) rounds them."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 10000.1 + self.t / 3, self.t == 4, False, {}


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_rewards_are_the_envs_own_rounded_to_float32_only(backend):
    # the pool's test envs reward small integers, exact in float16: a narrower reward store passed every test
    pool = EnvPool([FineRewardEnv] * 3, seed=0, backend=backend, **({"num_workers": 2} if backend == "process" else {}))
    rollout = pool.rollout(10, break_when_any_done=False)
    expected = np.float32([10000.1 + (t % 4 + 1) / 3 for t in range(10)])
    assert rollout["next", "reward"].dtype == torch.float32
    for row in range(3):
        np.testing.assert_array_equal(rollout["next", "reward"][row, :, 0].numpy(), expected)
    pool.close()
