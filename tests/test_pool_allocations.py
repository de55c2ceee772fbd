"""Steady-state steps allocate only the fresh output tensors TorchRL requires."""

import functools

import torch
from envs import counting
from torch.utils._python_dispatch import TorchDispatchMode

from torchrl_swm import EnvPool


class CountOps(TorchDispatchMode):
    """Records every aten op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def fresh_leaves(pool, td) -> int:
    """Check that every tensor leaf of ``td`` has memory of its own, outside the pool's buffers; count them."""
    flat = pool._host.flat
    lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel()
    ptrs = [leaf.data_ptr() for leaf in td.values(True, True)]
    assert all(not lo <= p < hi for p in ptrs), "an output leaf aliases the pool's buffers"
    assert len(set(ptrs)) == len(ptrs), "two output leaves share memory"
    return len(ptrs)


def test_a_step_without_dones_makes_one_fresh_tensor_per_output_leaf_and_nothing_else():
    pool = EnvPool([functools.partial(counting, length=10_000)] * 8, seed=0)
    td = pool.reset()
    actions = torch.ones(8, dtype=torch.int64)
    for _ in range(3):  # warm up
        td.set("action", actions)
        _, td = pool.step_and_maybe_reset(td)
    for _ in range(5):
        td.set("action", actions)
        with CountOps() as counter:
            out, td = pool.step_and_maybe_reset(td)
        # the snapshot of the ("next", ...) leaves that a rollout stacks is one numpy copy per leaf,
        # wrapped by torch.from_numpy (lift_fresh: a fresh tensor, no copy); the next root reuses
        # them: nothing else runs
        assert counter.ops == ["lift_fresh.default"] * len(pool._step_keys), counter.ops
        assert fresh_leaves(pool, out["next"]) == len(pool._step_keys)
        assert all(td[key] is out["next", key] for key in td.keys(True, True) if key != "action")
    pool.close()


def test_a_step_with_dones_adds_one_snapshot_of_the_reset_rows():
    pool = EnvPool([functools.partial(counting, length=2)] * 3 + [functools.partial(counting, length=10_000)], seed=0)
    td = pool.reset()
    td.set("action", torch.ones(4, dtype=torch.int64))
    _, td = pool.step_and_maybe_reset(td)
    td.set("action", torch.ones(4, dtype=torch.int64))
    with CountOps() as counter:
        out, td = pool.step_and_maybe_reset(td)
    assert out["next", "done"].sum() == 3
    # the action of the reset rows is zeroed, as TorchRL's generic reset does; nothing else
    # (the reset mask is a view of the done buffer made once, not a tensor per step)
    wrapped = ["lift_fresh.default"] * (len(pool._step_keys) + len(pool._reset_keys))
    assert sorted(counter.ops) == sorted(wrapped + ["masked_fill.Scalar"]), counter.ops
    assert fresh_leaves(pool, out["next"]) == len(pool._step_keys)
    assert fresh_leaves(pool, td.exclude("action")) == len(pool._reset_keys)
    root_ptrs = {leaf.data_ptr() for leaf in td.values(True, True)}
    assert root_ptrs.isdisjoint(leaf.data_ptr() for leaf in out["next"].values(True, True))
    pool.close()
