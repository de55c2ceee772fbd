"""Preallocated buffers, snapshot independence, pixels, and devices."""

import functools

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

_FORMS = ["float32", "float64", "int64", "bool", "list", "tensor", "wrong_shape", "text", "scalar"]


def _writer(n, dtype):
    space = gym.spaces.Box(-10, 10, (3,), dtype)
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
    }[form]


@settings(max_examples=150, deadline=None)
@given(forms=st.lists(st.sampled_from(_FORMS), min_size=1, max_size=6),
       dtype=st.sampled_from([np.float32, np.int64]), masked=st.booleans())
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
