"""Stacked info buffers: inference from every env and a step, declared specs, and strict writes."""

import functools

import numpy as np
import pytest
import torch
from envs import InfoEnv, counting
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrl.data import Unbounded

from torchrl_swm import EnvError, EnvPool, SpecError


def info_pool(reset_infos, step_infos, **kwargs):
    fns = [functools.partial(InfoEnv, r, s) for r, s in zip(reset_infos, step_infos)]
    return EnvPool(fns, seed=0, **kwargs)


def step(pool, td=None):
    td = pool.reset() if td is None else td
    td["action"] = torch.zeros(pool.num_envs, dtype=torch.int64)
    return pool.step(td)["next"]


def test_info_layout_time_dim_and_types():
    info = {
        "f": 0.5, "i": 3, "b": True, "np32": np.float32(1.5), "arr": np.arange(6, dtype=np.int16).reshape(2, 3),
        "t": torch.tensor([1.0, 2.0], dtype=torch.float64), "nested": {"deep": {"x": 7}}, "text": "skip me",
        "none": None, "lst": [1, 2],
    }
    pool = info_pool([info] * 3, [[info]] * 3)
    out = step(pool)
    spec = pool.observation_spec["info"]
    assert out["info", "f"].shape == (3, 1) and out["info", "f"].dtype == torch.float32
    assert out["info", "i"].dtype == torch.int64 and out["info", "b"].dtype == torch.bool
    assert out["info", "np32"].dtype == torch.float32
    assert out["info", "arr"].shape == (3, 1, 2, 3) and out["info", "arr"].dtype == torch.int16
    assert out["info", "t"].shape == (3, 1, 2) and out["info", "t"].dtype == torch.float64
    assert out["info", "nested", "deep", "x"].shape == (3, 1)
    assert torch.equal(out["info", "arr"][1, 0], torch.arange(6, dtype=torch.int16).view(2, 3))
    assert set(spec.keys()) == {"f", "i", "b", "np32", "arr", "t", "nested"}  # text/none/list skipped
    assert spec.is_in(out["info"])
    pool.close()


def test_key_seen_only_in_a_later_env_reset_is_recorded():
    pool = info_pool([{}, {}, {"late": 2.0}], [[{}]] * 3)
    out = pool.reset()
    assert out["info", "late"].view(-1).tolist() == [0.0, 0.0, 2.0]  # absent keys read as zero
    pool.close()


def test_key_seen_only_at_step_is_recorded():
    pool = info_pool([{}] * 2, [[{"step_only": 1}]] * 2)
    assert "step_only" in pool.observation_spec["info"].keys()
    out = step(pool)
    assert out["info", "step_only"].view(-1).tolist() == [1, 1]
    pool.close()


def test_key_appearing_after_construction_is_an_error_naming_env_and_key():
    pool = info_pool([{}] * 2, [[{}, {}], [{}, {"episode": 4.0}]])
    td = step(pool)
    with pytest.raises(EnvError, match=r"env 1 \(step\).*'episode'.*info_spec") as err:
        step(pool, td.clone())
    assert err.value.env_index == 1
    pool.close()


def test_declared_info_spec_accepts_the_late_key():
    pool = info_pool([{}] * 2, [[{}, {}], [{}, {"episode": 4.0}]], info_spec={"episode": Unbounded(shape=())})
    td = step(pool)
    out = step(pool, td.clone())
    assert out["info", "episode"].view(-1).tolist() == [0.0, 4.0]
    pool.close()


def test_info_keys_restricts_and_ignores_others():
    pool = info_pool([{"a": 1, "b": 2.0}] * 2, [[{"a": 1, "b": 2.0, "c": 3}]] * 2, info_keys=["a"])
    assert set(pool.observation_spec["info"].keys()) == {"a"}
    assert step(pool)["info", "a"].view(-1).tolist() == [1, 1]
    pool.close()
    with pytest.raises(SpecError, match="'zzz'"):
        info_pool([{"a": 1}] * 2, [[{}]] * 2, info_keys=["zzz"])


def test_int_spec_never_stores_a_float_silently():
    pool = info_pool([{"x": 1}] * 2, [[{"x": 1}, {"x": 0.75}]] * 2)
    td = step(pool)
    with pytest.raises(EnvError, match=r"env 0 \(step\).*'x'.*int64.*float"):
        step(pool, td.clone())
    pool.close()


def test_shape_change_is_an_error():
    pool = info_pool([{"v": np.zeros(3)}] * 2, [[{"v": np.zeros(3)}, {"v": np.zeros(4)}]] * 2)
    td = step(pool)
    with pytest.raises(EnvError, match=r"'v'.*shape"):
        step(pool, td.clone())
    pool.close()


def test_inconsistent_shapes_across_envs_fail_at_construction():
    with pytest.raises(EnvError, match=r"env 1.*'v'.*shape"):
        info_pool([{"v": np.zeros(3)}, {"v": np.zeros(2)}], [[{}]] * 2)


def test_dtypes_are_promoted_across_envs():
    pool = info_pool([{"x": 1}, {"x": 2.5}], [[{}]] * 2)
    assert pool.observation_spec["info", "x"].dtype == torch.float32
    assert pool.reset()["info", "x"].view(-1).tolist() == [1.0, 2.5]
    pool.close()


def test_counting_env_infos_track_steps():
    pool = EnvPool([functools.partial(counting, length=4)] * 2, seed=0)
    rollout = pool.rollout(10, break_when_any_done=False)
    assert rollout["next", "info", "t"].shape == (2, 10, 1)
    assert torch.equal(rollout["next", "info", "t"].float(), rollout["next", "observation"][..., :1])
    pool.close()


_values = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False, width=32),
    st.integers(-1000, 1000),
    st.booleans(),
    st.builds(lambda s, d: np.arange(int(np.prod(s)), dtype=d).reshape(s),
              st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
              st.sampled_from([np.float32, np.float64, np.int32, np.uint8])),
)


@settings(max_examples=25, deadline=None)
@given(info=st.dictionaries(st.text("abcdef", min_size=1, max_size=4), _values, min_size=1, max_size=4),
       n=st.integers(1, 3))
def test_any_numeric_info_round_trips(info, n):
    pool = info_pool([info] * n, [[info]] * n)
    out = step(pool)
    for key, value in info.items():
        expected = torch.as_tensor(np.asarray(value))
        if isinstance(value, float):
            expected = expected.float()
        got = out["info", key]
        assert got.shape == (n, 1, *expected.shape)
        assert torch.equal(got[:, 0], expected.expand(n, *expected.shape).to(got.dtype))
    pool.close()
