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


def test_a_step_without_dones_makes_one_clone_per_output_leaf_and_nothing_else():
    pool = EnvPool([functools.partial(counting, length=10_000)] * 8, seed=0)
    td = pool.reset()
    actions = torch.ones(8, dtype=torch.int64)
    for _ in range(3):  # warm up
        td.set("action", actions)
        _, td = pool.step_and_maybe_reset(td)
    for _ in range(5):
        td.set("action", actions)
        with CountOps() as counter:
            _, td = pool.step_and_maybe_reset(td)
        # the new ("next", ...) leaves that a rollout stacks; the next root reuses them
        assert counter.ops == ["clone.default"] * len(pool._step_keys), counter.ops
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
    clones = counter.ops.count("clone.default")
    assert clones == len(pool._step_keys) + len(pool._reset_keys)
    # the action of the reset rows is zeroed, as TorchRL's generic reset does; nothing else
    # (the reset mask is a view of the done buffer made once, not a tensor per step)
    assert counter.ops.count("masked_fill.Scalar") == 1
    assert sorted(set(counter.ops) - {"clone.default"}) == ["masked_fill.Scalar"]
    pool.close()
