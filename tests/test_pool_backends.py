"""The process and vector backends behave exactly like the serial one; faults never hang."""

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import (
    ActionRecordingEnv,
    CountingEnv,
    DictObsEnv,
    FailingEnv,
    MarkerClosingEnv,
    SlowFirstRowEnv,
    StubbornFailingEnv,
    assert_reaped,
    counting,
    sparse_info,
)
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs
from torchrl.testing import rollout_consistency_assertion

from torchrl_swm import EnvError, EnvPool, SpecError, StepRefusedError, World


def drive(pool, steps, seed=0, step_masks=None, reset_at=None):
    """A fixed action/mask script; returns every (step, next-root) pair, cloned."""
    gen = torch.Generator().manual_seed(seed)
    td = pool.reset()
    out = [td.clone()]
    for t in range(steps):
        td["action"] = pool.action_spec.rand() if gen is None else _rand_action(pool, gen)
        if reset_at and t in reset_at:
            td = pool.reset(td.update(TensorDict({"_reset": reset_at[t]}, pool.batch_size)))
            out.append(td.clone())
            td["action"] = _rand_action(pool, gen)
        if step_masks is not None:
            td["_step"] = step_masks[t]
            stepped = pool.step(td)
            out.append(stepped.clone())
            td = stepped["next"].clone()
            td = pool.reset(td.update(TensorDict({"_reset": td["done"] & step_masks[t]}, pool.batch_size))) if td["done"].any() else td
        else:
            stepped, td = pool.step_and_maybe_reset(td)
            out.append(stepped.clone())
            out.append(td.clone())
    return out


def _rand_action(pool, gen):
    spec = pool.action_spec
    if spec.dtype == torch.int64:
        return torch.randint(0, spec.space.n, spec.shape, generator=gen)
    return torch.rand(spec.shape, generator=gen) * 2 - 1


def assert_same(a_list, b_list):
    assert len(a_list) == len(b_list)
    for t, (a, b) in enumerate(zip(a_list, b_list)):
        assert set(a.keys(True, True)) == set(b.keys(True, True)), t
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), (t, key)


# -- the fast step_and_maybe_reset is TorchRL's generic path, exactly -------------------------
class GenericPathPool(EnvPool):
    """The same pool driven through TorchRL's own step -> step_mdp -> maybe_reset."""

    def _step_and_maybe_reset(self, tensordict):
        return super(EnvPool, self)._step_and_maybe_reset(tensordict)


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        (functools.partial(counting, max_length=5), {}),
        (DictObsEnv, {}),  # "is_success" only at step: a presence mask
        (functools.partial(sparse_info, period=2, max_length=5), {"info_spec": {"bonus": 0.0, "success": False}}),
    ],
)
def test_fast_step_and_maybe_reset_equals_generic_path(factory, kwargs):
    fast = EnvPool([factory] * 4, seed=3, **kwargs)
    slow = GenericPathPool([factory] * 4, seed=3, **kwargs)
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    ta, tb = fast.reset(), slow.reset()
    ended = False
    for t in range(120):
        for td, gen, pool in ((ta, gen_a, fast), (tb, gen_b, slow)):
            td["action"] = _rand_action(pool, gen)
            td["policy_logits"] = torch.randn(4, 3, generator=gen)  # a root key the policy adds
            td["collector", "traj_ids"] = torch.arange(4) + t  # a nested root key
            if t % 3 == 1:  # freeze some rows with TorchRL's "_step" mask
                mask = torch.rand(4, 1, generator=gen) > 0.5
                mask[t % 4] = True
                td["_step"] = mask
            elif t % 7 == 5:  # freeze every row: TorchRL skips the step (a mask left in the root gets there alone)
                td["_step"] = torch.zeros(4, 1, dtype=torch.bool)
            else:
                td.pop("_step", None)
            if t % 5 == 2:  # a root reward, as td = env.step(td)["next"] leaves: never carried to the next root
                td["reward"] = torch.full((4, 1), float(t))
            if t % 11 == 4:  # a stale "_reset" in a tensordict built by hand: never carried to the next root either
                td["_reset"] = torch.rand(4, 1, generator=gen) > 0.5
        sa, ta = fast.step_and_maybe_reset(ta)
        sb, tb = slow.step_and_maybe_reset(tb)
        assert_same([sa, ta], [sb, tb])
        ended |= bool(sa["next", "done"].any())
    assert ended, "some episode must end (and be reset) during the comparison"
    fast.close()
    slow.close()


@pytest.mark.parametrize("length", [50, 1])
def test_the_next_root_shares_no_node_with_the_stored_step(length):
    # as TorchRL's step_mdp: sub-tensordicts of the next root are new nodes (leaves are shared), so a collector
    # replacing ("collector", "traj_ids") in its carrier, or a policy setting an ("info", k), never rewrites the
    # transition it stored. length 1: every row ends, the reset path; 50: none does
    pool = EnvPool([functools.partial(counting, length=length)] * 3, seed=0)
    td = pool.reset().set("action", pool.action_spec.zero())
    td["collector", "traj_ids"] = torch.arange(3)
    out, root = pool.step_and_maybe_reset(td)
    assert root["collector"] is not out["collector"] and root["info"] is not out["next", "info"]
    stored = out.clone()
    root["collector"].set("traj_ids", torch.full((3,), 7))
    root["info"].set("t", torch.full((3, 1), 9))
    root.set(("policy", "hidden"), torch.ones(3))
    assert (out == stored).all() and "policy" not in out.keys()
    pool.close()


def test_fast_step_and_maybe_reset_equals_generic_path_when_every_row_ends_at_once():
    # fixed-length episodes (a TimeLimit): every row done at the same step, a reset of all rows, where the
    # policy's root keys are carried as TorchRL carries them (a `<=` for `<` in the partial-reset test zeroed
    # them; review R5 M28)
    factory = functools.partial(counting, length=3)
    fast, slow = EnvPool([factory] * 4, seed=3), GenericPathPool([factory] * 4, seed=3)
    ta, tb = fast.reset(), slow.reset()
    for t in range(9):
        for td in (ta, tb):
            td["action"] = torch.full((4,), t % 3, dtype=torch.int64)
            td["policy_logits"] = torch.full((4, 3), float(t))
        sa, ta = fast.step_and_maybe_reset(ta)
        sb, tb = slow.step_and_maybe_reset(tb)
        assert bool(sa["next", "done"].all()) == (t % 3 == 2)
        assert_same([sa, ta], [sb, tb])
    assert ta["policy_logits"].eq(8.0).all()  # carried through the all-rows reset
    fast.close()
    slow.close()


@pytest.mark.parametrize("factory", [functools.partial(counting, max_length=4), DictObsEnv])
def test_policy_leaves_under_output_subtrees_are_carried_as_torchrl_does(factory):
    # a policy writing under the pool's own "info" subtree or a Dict observation's subtree:
    # TorchRL's step_mdp merges those leaves into the next root (zeroed on reset rows)
    fast = EnvPool([factory] * 3, seed=3)
    slow = GenericPathPool([factory] * 3, seed=3)
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    ta, tb = fast.reset(), slow.reset()
    assert "info" in ta.keys()
    for t in range(40):
        for td, gen, pool in ((ta, gen_a, fast), (tb, gen_b, slow)):
            td["action"] = _rand_action(pool, gen)
            if t % 2:
                td["info", "policy_value"] = torch.full((3, 1), float(t))
                if factory is DictObsEnv:
                    td["goal", "policy_note"] = torch.full((3,), float(t))
        sa, ta = fast.step_and_maybe_reset(ta)
        sb, tb = slow.step_and_maybe_reset(tb)
        assert_same([sa, ta], [sb, tb])
    assert ("info", "policy_value") in ta.keys(True, True)
    fast.close()
    slow.close()


def test_a_policy_setting_a_nested_key_on_the_next_root_leaves_the_returned_step_alone():
    # the fast step_and_maybe_reset copies each sub-tensordict it carries to the next root, as TorchRL's step_mdp
    # does: a recurrent policy setting its new ("policy", "h") on the next root must not rewrite the stored step
    for cls in (EnvPool, GenericPathPool):
        pool = cls([functools.partial(counting, length=50)] * 3, seed=0)
        td = pool.reset()
        td["policy"] = TensorDict({"h": torch.zeros(3, 2)}, [3])
        td["action"] = torch.zeros(3, dtype=torch.int64)
        step, root = pool.step_and_maybe_reset(td)
        root["policy", "h"] = torch.ones(3, 2)
        root["policy", "c"] = torch.ones(3)
        assert torch.equal(step["policy", "h"], torch.zeros(3, 2)), cls.__name__
        assert set(step["policy"].keys()) == {"h"}, cls.__name__
        assert torch.equal(root["policy", "h"], torch.ones(3, 2))
        pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("factory", [functools.partial(counting, length=50), DictObsEnv])
def test_setting_an_info_or_dict_observation_leaf_on_the_next_root_leaves_the_steps_next_alone(backend, factory):
    # the next root's "info" and Dict observation subtrees are copies of the step's "next" ones, never the same
    # nodes: writing root["info", key] (or a nested observation leaf) must not rewrite the stored step
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool([factory] * 3, seed=0, backend=backend, **kwargs)
    td = pool.reset()
    td["action"] = pool.action_spec.zero()
    step, root = pool.step_and_maybe_reset(td)
    assert not step["next", "done"].any()
    nested = [("info", key) for key in step["next", "info"].keys()]
    assert nested
    if factory is DictObsEnv:
        nested.append(("goal", "target"))
    for key in nested:
        stored = step[("next", *key)].clone()
        root[key] = torch.full_like(stored, 99)
        assert torch.equal(step[("next", *key)], stored), key
    # a key added under the root's "info" (a transform's, a policy's) is not added to the step's "next" either
    keys = set(step["next", "info"].keys())
    root["info", "added"] = torch.zeros(3, 1)
    assert set(step["next", "info"].keys()) == keys
    pool.close()


def test_reset_mask_copy_path_of_accelerators_equals_the_cpu_view_path():
    # on an accelerator the done mask is copied to the device instead of viewing the host buffer
    pools = [EnvPool([functools.partial(counting, max_length=3)] * 4, seed=1) for _ in range(2)]
    pools[1]._done_views = None
    gens = [torch.Generator().manual_seed(2) for _ in pools]
    tds = [pool.reset() for pool in pools]
    for t in range(30):
        outs = []
        for k, pool in enumerate(pools):
            tds[k]["action"] = _rand_action(pool, gens[k])
            tds[k]["policy_logits"] = torch.randn(4, 2, generator=gens[k])  # zeroed on reset rows
            step, tds[k] = pool.step_and_maybe_reset(tds[k])
            outs.append([step, tds[k]])
        assert_same(*outs)
    for pool in pools:
        pool.close()


# -- process backend ----------------------------------------------------------------------
def test_process_backend_matches_serial_row_for_row():
    kwargs = dict(seed=5, pixels=True)
    fns = [functools.partial(counting, max_length=6, render_mode="rgb_array")] * 5
    serial = EnvPool(fns, **kwargs)
    proc = EnvPool(fns, backend="process", num_workers=2, **kwargs)
    masks = [torch.rand(5, 1, generator=torch.Generator().manual_seed(t)) > 0.3 for t in range(40)]
    resets = {7: torch.tensor([[False], [True], [False], [True], [False]])}
    assert_same(drive(serial, 60, reset_at=resets), drive(proc, 60, reset_at=resets))
    assert_same(drive(serial, 40, step_masks=masks), drive(proc, 40, step_masks=masks))
    # seeds, options and infos too
    a = serial.reset(seed=[1, 2, 3, 4, 5], options={"length": 3})
    b = proc.reset(seed=[1, 2, 3, 4, 5], options={"length": 3})
    assert_same([a], [b])
    assert proc.get_attr("length") == serial.get_attr("length") == [3] * 5
    proc.set_attr("length", [9, 8, 7, 6, 5])
    assert proc.get_attr("length", indices=[0, 4]) == [9, 5]
    assert proc.call("render", indices=[1])[0].shape == (8, 12, 3)
    check_env_specs(proc)
    serial.close()
    proc.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_call_and_get_attr_answer_in_row_order_when_env_0s_worker_replies_last(backend):
    # env 0's who() sleeps 0.3 s: worker 1 (envs 3, 4) replies first; the results still follow the rows asked for
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(SlowFirstRowEnv, row=i) for i in range(5)], seed=0, backend=backend, **kwargs)
    assert pool.call("who") == [0, 1, 2, 3, 4]
    assert pool.get_attr("slow_row") == [0, 1, 2, 3, 4]
    assert pool.call("who", indices=[4, 0]) == [4, 0]
    assert pool.get_attr("slow_row", indices=[3, 0, 4, 1]) == [3, 0, 4, 1]
    pool.close()


def test_process_backend_matches_serial_info_masks():
    fns = [functools.partial(sparse_info, period=p) for p in (1, 2, 3, 4)]
    kwargs = dict(seed=2, info_spec={"bonus": 0.0, "success": False})
    serial = EnvPool(fns, **kwargs)
    proc = EnvPool(fns, backend="process", num_workers=2, **kwargs)
    masks = [torch.rand(4, 1, generator=torch.Generator().manual_seed(t)) > 0.3 for t in range(40)]
    assert_same(drive(serial, 80), drive(proc, 80))
    assert_same(drive(serial, 40, step_masks=masks), drive(proc, 40, step_masks=masks))
    serial.close()
    proc.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_discrete_actions_reach_envs_as_numpy_integers(backend):
    # what Discrete.sample() and gymnasium's vector envs pass (and Discrete.contains checks fastest)
    pool = EnvPool([ActionRecordingEnv] * 5, backend=backend, num_workers=2, seed=0)
    td = pool.reset()
    for action in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0]):
        td["action"] = torch.tensor(action)
        td = pool.step(td)["next"]
        assert td["observation"].view(-1).tolist() == [a - 2 for a in action]  # Discrete(5, start=-2)
    td["_step"] = torch.tensor([[True], [False], [True], [False], [True]])  # the masked path too
    td["action"] = torch.tensor([1, 1, 1, 1, 1])
    assert pool.step(td)["next", "observation"].view(-1).tolist() == [-1, 1, -1, -1, -1]  # rows 1 and 3 frozen
    assert pool.get_attr("action_types") == [["int64"] * 4, ["int64"] * 3] * 2 + [["int64"] * 4]  # the construction probe steps once
    td["action"] = torch.tensor([0, 5, 0, 0, 0])
    td.pop("_step")
    with pytest.raises(ValueError, match=r"action for env 1: expected an index in \[0, 5\), got 5"):
        pool.step(td)
    pool.close()


@pytest.mark.parametrize("n", [10, 5000])  # 5000: past the 4096 actions whose numpy scalars are made once
@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
def test_discrete_action_indices_reach_the_env_plus_the_space_start(backend, n):
    # a Categorical action is an index: index k reaches a Discrete(n, start=3) env as 3 + k (what
    # Discrete.sample() and contains() use), on the whole batch and on the "_step" rows alike
    from envs import DiscreteEchoEnv

    fns = [functools.partial(DiscreteEchoEnv, n, 3)] * 3
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, seed=0, backend=backend, num_workers=2)
    with pool:
        td = pool.reset()
        td["action"] = torch.tensor([0, n - 1, 1])
        td = pool.step(td)["next"]
        assert td["observation"].view(-1).tolist() == [3, n + 2, 4]
        if backend == "vector":  # (a VectorEnv steps all its rows: no "_step" mask)
            td["action"] = torch.tensor([1, 0, n - 1])
            assert pool.step(td)["next", "observation"].view(-1).tolist() == [4, 3, n + 2]
            return
        td["_step"] = torch.tensor([[False], [True], [True]])
        td["action"] = torch.tensor([n - 1, 0, n - 1])
        assert pool.step(td)["next", "observation"].view(-1).tolist() == [3, 3, n + 2]  # row 0 frozen



@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8])
@pytest.mark.parametrize("backend", ["vector", "process"])
def test_narrow_integer_discrete_actions_through_a_batched_pool_give_the_int64_transitions(backend, dtype):
    # a policy's int32 or uint8 Categorical actions (argmax of a quantised net, a small action table) on a pool
    # that hands its envs one batched array (a VectorEnv, the process backend): what a user sees is the same
    # transitions as int64 actions, never an IndexError/ValueError from the range check; the process backend's
    # "_step" rows too (a VectorEnv refuses "_step" masks); review R4 A8
    def transitions(action_dtype):
        if backend == "vector":
            pool = EnvPool(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3), seed=0)
        else:
            pool = EnvPool([lambda: gym.make("CartPole-v1")] * 3, seed=0, backend=backend, num_workers=2)
        gen = torch.Generator().manual_seed(0)
        out = []
        with pool:
            td = pool.reset()
            for t in range(12):
                td["action"] = torch.randint(0, 2, (3,), generator=gen).to(action_dtype)
                if backend == "process" and t % 3 == 2:  # rows 0 and 2 step, row 1 is frozen
                    td["_step"] = torch.tensor([[True], [False], [True]])
                    stepped = pool.step(td)
                    td = stepped["next"].clone()
                    if td["done"].any():
                        td = pool.reset(td.set("_reset", td["done"].clone()))
                else:
                    td.pop("_step", None)
                    stepped, td = pool.step_and_maybe_reset(td)
                out.append(stepped.exclude("action", "_step").clone())
        return out

    expected, got = transitions(torch.int64), transitions(dtype)
    assert_same(got, expected)


def test_process_backend_dict_observations_and_collector_consistency():
    pool = EnvPool([DictObsEnv] * 4, backend="process", num_workers=2, seed=0)
    rollout = pool.rollout(50, break_when_any_done=False)
    assert rollout["next", "goal", "target"].shape == (4, 50, 2)
    pool.close()


def test_env_raising_inside_a_worker_is_named_with_traceback_and_pool_closes():
    fns = [functools.partial(counting, length=50)] * 3 + [functools.partial(FailingEnv, fail_at=3)]
    pool = EnvPool(fns, backend="process", num_workers=2, seed=0)
    pids = pool._backend.pids
    td = pool.reset()
    td["action"] = torch.zeros(4, dtype=torch.int64)
    pool.step(td)
    with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: boom.*worker 1 traceback.*FailingEnv|boom") as err:
        pool.step(td)
    assert err.value.env_index == 3 and "Traceback" in str(err.value)
    # the env's own exception is chained, as the serial backend chains it
    assert type(err.value.__cause__) is ValueError and str(err.value.__cause__) == "boom at step 3"
    pool.close()
    assert_reaped(pids)


def test_an_exception_a_worker_cannot_send_back_whole_still_names_the_env_with_its_traceback():
    # StubbornError pickles but cannot be rebuilt (its __init__ wants other arguments): nothing is chained,
    # and the error still names the env, the exception and the worker's traceback
    pool = EnvPool([counting, StubbornFailingEnv], backend="process", num_workers=2, seed=0, info_keys=[])
    pids = pool._backend.pids
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=r"(?s)env 1 \(step\): StubbornError: code 7: stuck.*worker 1 traceback") as err:
        pool.step(td)
    assert err.value.__cause__ is None
    pool.close()
    assert_reaped(pids)


def test_killed_worker_is_detected_quickly_and_never_hangs():
    pool = EnvPool([functools.partial(counting, length=50)] * 4, backend="process", num_workers=2, seed=0)
    pids = pool._backend.pids
    td = pool.reset()
    os.kill(pids[1], signal.SIGKILL)
    td["action"] = torch.zeros(4, dtype=torch.int64)
    start = time.monotonic()
    with pytest.raises(EnvError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code -9"):
        pool.step(td)
    assert time.monotonic() - start < 5
    # the surviving worker's envs may have stepped in that command: no step or reset moves them on since,
    # not even one masked to the survivors' rows (their transitions would start from observations never seen)
    t = pool.get_attr("t", indices=[0, 1])
    survivors = td.clone().set("_step", torch.tensor([True, True, False, False]))
    for command in (lambda: pool.step(td), lambda: pool.step(survivors), pool.reset):
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code -9: the pool "
                                           r"cannot step or reset after a worker died"):
            command()
    assert pool.get_attr("t", indices=[0, 1]) == t
    pool.close()
    assert_reaped(pids)


def test_worker_failing_at_construction_is_reported_and_reaped():
    def bad():
        raise RuntimeError("no display")

    with pytest.raises(EnvError, match="no display"):
        EnvPool([CountingEnv, CountingEnv, bad, CountingEnv], backend="process", num_workers=2)


def test_an_id_registered_only_in_this_process_is_made_in_the_workers():
    """An id registered under `if __name__ == "__main__":` or in a notebook is unknown to spawned workers:
    the factories carry the resolved EnvSpec, as gymnasium's AsyncVectorEnv sends it."""
    gym.register("tests/OnlyInTheMainProcess-v0", entry_point=CountingEnv, kwargs={"length": 4})
    try:
        pool = EnvPool("tests/OnlyInTheMainProcess-v0", 3, backend="process", num_workers=2, seed=0, info_keys=[])
        serial = EnvPool("tests/OnlyInTheMainProcess-v0", 3, seed=0, info_keys=[])
    finally:
        gym.registry.pop("tests/OnlyInTheMainProcess-v0")
    try:
        assert pool.env_spec.id == "tests/OnlyInTheMainProcess-v0"
        ones = lambda td: td.set("action", torch.ones(3, dtype=torch.int64))  # noqa: E731
        a, b = (env.rollout(10, ones, break_when_any_done=False) for env in (pool, serial))
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        assert all(torch.equal(a[key], b[key]) for key in a.keys(True, True))
        assert a["next", "terminated"].sum() == 6  # episodes of 4 steps
    finally:
        pool.close()
        serial.close()


def test_num_workers_without_a_backend_is_an_error():
    # TorchRL's GymEnv(id, num_workers=k) starts k processes: the pool never runs serially without a word
    with pytest.raises(ValueError, match=r"num_workers=2 is for backend='process'; the default serial backend"):
        EnvPool("CartPole-v1", 2, num_workers=2)
    # an explicit backend="serial" ignores it: one configuration can switch backends
    pool = EnvPool("CartPole-v1", 2, backend="serial", num_workers=2)
    assert type(pool._backend).__name__ == "SerialBackend"
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_one_factory_and_a_count_is_a_list_of_that_factory(backend):
    # TorchRL's SerialEnv(num_workers, create_env_fn) takes one factory and a count: so does the pool
    fn = functools.partial(counting, max_length=6)
    kwargs = dict(seed=3, backend=backend) | ({"num_workers": 2} if backend == "process" else {})
    one, listed = EnvPool(fn, 3, **kwargs), EnvPool([fn] * 3, **kwargs)
    assert one.batch_size == listed.batch_size == torch.Size([3])
    assert_same(drive(one, 30), drive(listed, 30))
    one.close()
    listed.close()
    with pytest.raises(ValueError, match=r"one factory \(counting\) needs num_envs >= 1, got None"):
        EnvPool(counting, backend=backend)
    with pytest.raises(ValueError, match="num_envs: expected an int >= 1, got 0"):
        EnvPool(counting, 0, backend=backend)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_mp_start_method_chooses_how_the_workers_start(monkeypatch, method):
    # as TorchRL's ParallelEnv(mp_start_method=...): "fork" starts in milliseconds (no import of the user's modules
    # again) and its workers inherit this process's state; a spawned or forkserver worker starts from scratch
    import multiprocessing

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{method} is not available on this platform")
    import envs

    monkeypatch.setattr(envs, "PARENT_MARK", "set in the pool's process")
    pool = EnvPool(functools.partial(envs.marked_counting, length=4), 2, backend="process", num_workers=1, seed=3,
                   mp_start_method=method)
    serial = EnvPool(functools.partial(envs.marked_counting, length=4), 2, seed=3)
    try:
        inherited = "set in the pool's process" if method == "fork" else None
        assert pool.get_attr("inherited_mark") == [inherited] * 2
        assert pool.get_attr("pid") == [pool.get_attr("pid")[0]] * 2 != [os.getpid()] * 2  # both in the worker
        assert_same(drive(pool, 10), drive(serial, 10))
    finally:
        pool.close()
        serial.close()


def test_mp_start_method_needs_the_process_backend_and_a_known_method():
    with pytest.raises(ValueError, match=r"mp_start_method='fork' is for backend='process'.* or drop mp_start_method"):
        EnvPool("CartPole-v1", 2, mp_start_method="fork")
    with pytest.raises(ValueError, match=r"num_workers=1, mp_start_method='fork' is for backend='process'.* or drop "
                                         r"num_workers and mp_start_method"):
        EnvPool("CartPole-v1", 2, num_workers=1, mp_start_method="fork")
    with pytest.raises(ValueError, match=r"mp_start_method must be one of \[.*'spawn'.*\] on this platform, got 'thread'"):
        EnvPool("CartPole-v1", 2, backend="process", mp_start_method="thread")
    vec = gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=3)] * 2)
    with pytest.raises(ValueError, match=r"EnvPool\(VectorEnv\): backend=None and mp_start_method='fork' do not apply"):
        EnvPool(vec, mp_start_method="fork")
    vec.close()
    # an explicit backend="serial" ignores it, as num_workers: one configuration can switch backends
    pool = EnvPool("CartPole-v1", 2, backend="serial", mp_start_method="fork")
    assert type(pool._backend).__name__ == "SerialBackend"
    pool.close()


@pytest.mark.parametrize("kwargs", [{"backend": "process"}, {"num_workers": 2}])
def test_a_vector_env_refuses_backend_and_num_workers(kwargs):
    vec = gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=3)] * 2)
    with pytest.raises(ValueError, match=r"EnvPool\(VectorEnv\): backend=.* do not apply: a vector env runs as it is"):
        EnvPool(vec, **kwargs)
    vec.close()


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    # the commonest spawn mistake: each worker re-runs the script, which builds a pool at import time
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text("from torchrl_swm import EnvPool\n"
                      "pool = EnvPool('CartPole-v1', 2, backend='process', num_workers=2)\n"
                      "pool.close()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "died with exit code 1 before it made its envs" in last and 'if __name__ == "__main__":' in last


class _ProcessPoolInside(gym.Env):
    """An env that builds a process-backend pool: refused where it runs in a daemonic worker."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        try:
            EnvPool([CountingEnv] * 2, backend="process", num_workers=2).close()
            self.error = None
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_a_process_pool_inside_a_daemonic_worker_says_to_use_the_serial_backend():
    # the outer pool's workers are daemonic, as AsyncVectorEnv's and SubprocVecEnv's: multiprocessing
    # refuses their children with a bare AssertionError
    pool = EnvPool([_ProcessPoolInside] * 2, backend="process", num_workers=2)
    errors = pool.get_attr("error")
    pool.close()
    assert all(e.startswith("RuntimeError: EnvPool(backend='process'): this is a daemonic process") for e in errors)
    assert all("use backend='serial' here" in e for e in errors)


def _exiting_factory():
    os._exit(3)


def test_a_worker_dying_while_making_its_envs_is_not_blamed_on_a_main_guard():
    # exit code 3, no traceback: nothing says the script lacks its main guard (this one runs under pytest)
    with pytest.raises(EnvError, match=r"died with exit code 3 before it made its envs$"):
        EnvPool([_exiting_factory] * 2, backend="process", num_workers=2)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_pickling_or_copying_a_pool_says_to_pass_its_factory(backend):
    import copy
    import pickle

    pool = EnvPool("CartPole-v1", 2, backend=backend, **({"num_workers": 1} if backend == "process" else {}))
    try:
        for clone in (pickle.dumps, copy.deepcopy):
            with pytest.raises(TypeError, match=r"cannot pickle or copy an EnvPool.*pass EnvPool.factory\(...\)"):
                clone(pool)
        assert pool.rollout(3).shape == (2, 3)  # still usable
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory listed in /dev/shm")
def test_the_shared_buffer_leaves_no_name_in_dev_shm_once_the_workers_attached():
    # a pool whose close() never runs (a Ray actor ended by ray.kill, a SIGKILL) must not leak the segment
    pool = EnvPool([functools.partial(counting, max_length=4)] * 3, backend="process", num_workers=2, seed=0)
    try:
        name = pool._backend._shm.name.lstrip("/")
        assert not os.path.exists(f"/dev/shm/{name}")
        rollout = pool.rollout(20, break_when_any_done=False)  # the mappings stay valid
        rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    finally:
        pool.close()


def test_unpicklable_factory_says_what_to_change():
    import threading

    lock = threading.Lock()

    def factory():
        with lock:
            return CountingEnv()

    with pytest.raises(TypeError, match="picklable with cloudpickle"):
        EnvPool([factory] * 2, backend="process", num_workers=1)


def test_more_workers_than_cores_still_work():
    n = (os.cpu_count() or 2) * 2
    pool = EnvPool([functools.partial(counting, max_length=4)] * n, backend="process", num_workers=n, seed=0)
    rollout = pool.rollout(30, break_when_any_done=False)
    rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    pool.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_workers_run_under_sched_batch_and_the_pool_process_keeps_its_policy():
    # a worker woken by its command must not preempt the pool's process mid-broadcast (SCHED_BATCH tasks
    # never preempt on wake-up); the pool's own process, which the user runs, is left as it was
    before = os.sched_getscheduler(0)
    pool = EnvPool([functools.partial(counting, max_length=4)] * 4, backend="process", num_workers=2, seed=0)
    try:
        assert [os.sched_getscheduler(pid) for pid in pool._backend.pids] == [os.SCHED_BATCH] * 2
        assert os.sched_getscheduler(0) == before
        rollout = pool.rollout(12, break_when_any_done=False)
        rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    finally:
        pool.close()


def test_more_workers_than_envs_is_a_value_error_naming_both_numbers():
    # a clear error before any worker starts, never an IndexError from splitting 2 envs among 3 workers
    with pytest.raises(ValueError, match=r"num_workers: expected 1 <= num_workers <= num_envs=2, got 3"):
        EnvPool([counting] * 2, backend="process", num_workers=3)


def test_closing_a_process_pool_after_a_worker_died_frees_its_fds_without_a_garbage_collection():
    # a dead worker's error keeps the pool in a reference cycle; close() still releases every worker's pipes then
    # and there, not at the next cyclic collection (a program rebuilding pools after failures piled fds up)
    import gc
    from multiprocessing import resource_tracker

    def open_fds():
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own fd, closed meanwhile
                pass
        return fds

    resource_tracker.ensure_running()  # its pipe stays open for good: opened before the count
    fns = [functools.partial(counting, length=50)] * 4
    gc.collect()
    gc.disable()  # as between two automatic collections
    try:
        before = open_fds()
        pool = EnvPool(fns, backend="process", num_workers=2, seed=0)
        td = pool.reset().set("action", torch.zeros(4, dtype=torch.int64))
        os.kill(pool._backend.pids[1], signal.SIGKILL)
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2..3, pid \d+\) died"):
            pool.step(td)
        pool.close()
        del pool, td
        left = {fd: target for fd, target in open_fds().items() if fd not in before}
        assert not left, f"fds the closed pool left open: {left}"
    finally:
        gc.enable()
        gc.collect()


def test_a_forked_process_pool_closes_without_resource_tracker_warnings(tmp_path):
    # forked workers share the pool's resource tracker: one of their own would report the shared buffers, which
    # the pool unlinks, as a leaked segment when the worker exits
    import subprocess
    import sys

    script = tmp_path / "forked_pool.py"
    script.write_text(
        "import functools\n"
        "from envs import counting\n"
        "from torchrl_swm import EnvPool\n"
        "if __name__ == '__main__':\n"
        "    pool = EnvPool([functools.partial(counting, length=5)] * 2, backend='process', num_workers=2, seed=0,\n"
        "                   mp_start_method='fork')\n"
        "    assert pool._backend._start_method == 'fork'\n"
        "    pool.rollout(3, break_when_any_done=False)\n"
        "    pool.close()\n"
        "    print('closed')\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "closed", out.stderr
    assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr, out.stderr


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "mid-step"])
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_workers_close_their_envs_when_the_pools_process_is_killed(tmp_path, signum, busy):
    # no close() ran in the pool's process: each worker, seeing its pipe end (or, mid-step, finding it broken
    # when it replies), still closes its envs (an env's own processes, a simulator or a renderer, must not
    # outlive the pool), as gymnasium's workers do, and exits without a traceback
    import subprocess
    import sys

    markers = tmp_path / "closed"
    markers.mkdir()
    script = tmp_path / "killed_pool.py"
    script.write_text(
        "import functools, os, signal\n"
        "from envs import MarkerClosingEnv\n"
        "from torchrl_swm import EnvPool\n"
        "if __name__ == '__main__':\n"
        f"    make = functools.partial(MarkerClosingEnv, {str(markers)!r}, step_s={0.5 if busy else 0.0}, length=50)\n"
        "    pool = EnvPool([make] * 4, backend='process', num_workers=2, seed=0)\n"
        "    td = pool.reset()\n"
        f"    if {busy}:  # killed while the workers step (0.5 s per env)\n"
        "        import threading\n"
        f"        threading.Timer(0.2, os.kill, (os.getpid(), {int(signum)})).start()\n"
        "    pool.rand_step(td)\n"
        f"    os.kill(os.getpid(), {int(signum)})\n"
    )
    with open(tmp_path / "err.txt", "w") as err:  # a file, not a pipe: the workers hold it open
        proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=err, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signum
    deadline = time.monotonic() + 15
    while len(list(markers.iterdir())) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    closed = sorted(path.name.split("-")[1] for path in markers.iterdir())
    assert len(closed) == 4 and len(set(closed)) == 2, closed  # every env, closed in its own worker (2 pids)
    assert "Traceback" not in (tmp_path / "err.txt").read_text()


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "mid-step"])
def test_a_worker_sent_sigterm_closes_its_envs_and_the_pool_names_it(tmp_path, busy):
    # SIGTERM (a job scheduler's, or the pool's own _end for a stuck worker before its SIGKILL) ended a worker
    # without running its finally: its envs were never closed, and processes they own outlived the pool (review B)
    import threading

    markers = tmp_path / "closed"
    markers.mkdir()
    make = functools.partial(MarkerClosingEnv, str(markers), step_s=0.5 if busy else 0.0, length=50)
    pool = EnvPool([make] * 4, backend="process", num_workers=2, seed=0)
    try:
        td = pool.reset()
        td["action"] = torch.zeros(4, dtype=torch.int64)
        worker = pool._backend._processes[1]
        if busy:  # sent while the workers step (0.5 s per env)
            threading.Timer(0.3, os.kill, (worker.pid, signal.SIGTERM)).start()
            with pytest.raises(EnvError, match=r"worker 1 \(envs 2\.\.3, pid \d+\) died with exit code 143"):
                pool.step(td)
        else:
            os.kill(worker.pid, signal.SIGTERM)
        worker.join(timeout=15)
        assert worker.exitcode == 128 + signal.SIGTERM
        closed = [path.name.split("-")[1] for path in markers.iterdir()]
        assert closed == [str(worker.pid)] * 2, closed  # both of its envs, closed in the worker
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2\.\.3, pid \d+\) died with exit code 143"):
            pool.step(td)
    finally:
        pool.close()
    assert len(list(markers.iterdir())) == 4  # the other worker's envs at close


def test_a_sigterm_during_close_or_construction_ends_the_worker_with_143_not_an_envs_error(tmp_path):
    # inside an env's close() the SIGTERM was reported as that env's close error "_Terminated: 143"; during the
    # construction it must close the envs made so far and exit 143, not reply an error and exit 0 (review G)
    import threading

    from envs import SlowCloseEnv, slow_marker_factory

    pool = EnvPool([functools.partial(SlowCloseEnv, close_s=3.0)], backend="process", num_workers=1, seed=0)
    pool.reset()
    worker = pool._backend._processes[0]
    threading.Timer(0.5, os.kill, (worker.pid, signal.SIGTERM)).start()
    with pytest.raises(EnvError, match=r"worker 0 \(envs 0\.\.0, pid \d+\) died with exit code 143") as err:
        pool.close()
    assert "_Terminated" not in str(err.value)
    markers, made = tmp_path / "closed", tmp_path / "made"
    markers.mkdir()
    made.mkdir()

    def terminate_the_worker_once_env_0_is_made():
        deadline = time.monotonic() + 120
        while not list(made.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.02)
        for path in made.iterdir():
            os.kill(int(path.name.split("-")[1]), signal.SIGTERM)  # env 1's factory is still sleeping

    killer = threading.Thread(target=terminate_the_worker_once_env_0_is_made)
    killer.start()
    fns = [functools.partial(slow_marker_factory, str(markers), 0.0, str(made)),
           functools.partial(slow_marker_factory, str(markers), 5.0)]
    with pytest.raises(EnvError, match=r"worker 0 \(envs 0\.\.1, pid \d+\) died with exit code 143 before it "
                                       r"made its envs"):
        EnvPool(fns, backend="process", num_workers=1, seed=0)
    killer.join()
    assert len(list(markers.iterdir())) == 1  # env 0, made, is closed


def test_a_second_sigterm_ends_a_worker_whose_envs_take_long_to_close():
    # the first SIGTERM closes the envs; a second one, as a stuck close gets, ends the worker at once (review G K4)
    from envs import SlowCloseEnv

    pool = EnvPool([functools.partial(SlowCloseEnv, close_s=30.0)], backend="process", num_workers=1, seed=0)
    try:
        pool.reset()
        worker = pool._backend._processes[0]
        os.kill(worker.pid, signal.SIGTERM)
        time.sleep(1.0)  # inside the env's 30 s close by now
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(timeout=10)
        assert worker.exitcode == -signal.SIGTERM
    finally:
        pool.close()


def test_forked_workers_close_their_envs_when_the_pools_process_is_killed(tmp_path):
    # a forked worker inherited the pool's ends of its own pipe and the earlier workers': holding them, it never
    # saw an end of file once the pool's process died, and stayed alive with its envs open; review R6 of round 15
    import subprocess
    import sys

    markers = tmp_path / "closed"
    markers.mkdir()
    script = tmp_path / "killed_forked_pool.py"
    script.write_text(
        "import functools, os, signal\n"
        "from envs import MarkerClosingEnv\n"
        "from torchrl_swm import EnvPool\n"
        "if __name__ == '__main__':\n"
        f"    make = functools.partial(MarkerClosingEnv, {str(markers)!r}, step_s=0.0, length=50)\n"
        "    pool = EnvPool([make] * 4, backend='process', num_workers=2, seed=0, mp_start_method='fork')\n"
        "    assert pool._backend._start_method == 'fork'\n"
        "    pool.rand_step(pool.reset())\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    with open(tmp_path / "err.txt", "w") as err:  # a file, not a pipe: the workers hold it open
        proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=err, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 15
    while len(list(markers.iterdir())) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    closed = sorted(path.name.split("-")[1] for path in markers.iterdir())
    assert len(closed) == 4 and len(set(closed)) == 2, closed  # every env, closed in its own worker (2 pids)


def test_idle_workers_exit_when_the_pools_process_is_killed(tmp_path):
    # a SIGKILLed pool process runs no close(): its idle workers see their pipe end and exit by themselves,
    # never left running (or spinning) as orphans
    import subprocess
    import sys

    def running(pid):  # an orphan exited but not yet reaped by its new parent (a zombie) counts as gone
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    script = tmp_path / "killed_pool.py"
    script.write_text(
        "import functools, os, signal\n"
        "from envs import counting\n"
        "from torchrl_swm import EnvPool\n"
        "if __name__ == '__main__':\n"
        "    pool = EnvPool([functools.partial(counting, length=50)] * 4, backend='process', num_workers=2, seed=0)\n"
        "    pool.rand_step(pool.reset())\n"
        "    print(*pool._backend.pids, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    pids = []
    try:
        with open(tmp_path / "out.txt", "w") as out:  # a file, not a pipe: the workers hold their stdout open
            proc = subprocess.run([sys.executable, str(script)], stdout=out, stderr=subprocess.DEVNULL, timeout=120)
        assert proc.returncode == -signal.SIGKILL
        pids = [int(pid) for pid in (tmp_path / "out.txt").read_text().split()]
        assert len(pids) == 2
        deadline = time.monotonic() + 10
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in pids if running(pid)] == []
    finally:
        for pid in pids:  # nothing orphaned by a failure: only our workers (a reused pid runs another program)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    ours = b"multiprocessing" in f.read()
                if ours and running(pid):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass


def test_a_users_own_sigint_handler_stays_installed_through_process_pool_steps_and_close():
    # the pool holds Ctrl-C back while it talks to its workers, then puts back the handler it found (a training
    # script's graceful-stop handler), not Python's default one

    def graceful_stop(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, graceful_stop)
    try:
        pool = EnvPool([functools.partial(counting, length=50)] * 2, backend="process", num_workers=2, seed=0)
        try:
            assert signal.getsignal(signal.SIGINT) is graceful_stop
            td = pool.reset().set("action", torch.zeros(2, dtype=torch.int64))
            assert signal.getsignal(signal.SIGINT) is graceful_stop
            pool.step(td)
            assert signal.getsignal(signal.SIGINT) is graceful_stop
            assert pool.get_attr("fixed_length") == [50, 50]
            assert signal.getsignal(signal.SIGINT) is graceful_stop
        finally:
            pool.close()
        assert signal.getsignal(signal.SIGINT) is graceful_stop
    finally:
        signal.signal(signal.SIGINT, previous)


# -- vector backend ---------------------------------------------------------------------------
def _vector(mode, n=6):
    if mode == "vector_entry_point":
        return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})


@pytest.mark.parametrize("mode", ["vector_entry_point", AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_vector_env_every_autoreset_mode_exact_terminal_obs_no_ghosts(mode):
    pool = EnvPool(_vector(mode), seed=0)
    check_env_specs(pool)
    rollout = pool.rollout(300, break_when_any_done=False)
    rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    done = rollout["next", "done"][..., 0]
    assert done.sum() > 20
    # CartPole pays 1 per step: a ghost transition would pay 0
    assert (rollout["next", "reward"] == 1).all()
    # a terminal observation is past a threshold (or at the 500-step limit): never a fresh reset obs
    terminal = rollout["next", "observation"][rollout["next", "terminated"][..., 0]]
    assert ((terminal[:, 0].abs() > 2.4) | (terminal[:, 2].abs() > 12 * 2 * np.pi / 360)).all()
    # the row after a done starts from a reset obs, inside the reset bounds
    after = rollout["observation"][:, 1:][done[:, :-1]]
    assert (after.abs() <= 0.05).all()
    pool.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_sync_vector_pool_equals_single_env_pool(mode):
    # a SAME_STEP vector env resets finished envs itself, unseeded: by default its episodes continue each
    # env's stream, as a single-env pool's do with seed_every_episode=False
    seeds = dict(seed_every_episode=False) if mode is AutoresetMode.SAME_STEP else {}
    single = EnvPool("CartPole-v1", num_envs=4, seed=11, **seeds)
    vector = EnvPool(_vector(mode, 4), seed=11)
    assert vector.seed_every_episode is (mode is not AutoresetMode.SAME_STEP)
    assert_same(drive(single, 150), drive(vector, 150))
    single.close()
    vector.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_sync_vector_pool_info_masks_equal_single_env_pool(mode):
    # gymnasium's "_key" masks (and SAME_STEP's final_info) become the same ("info_mask", key) leaves
    fns = [functools.partial(sparse_info, period=p) for p in (1, 2, 3)]
    # SAME_STEP: the vector env's own autoreset (unseeded) must be the reset the pool keeps,
    # or the counting env would count two resets per episode
    kwargs = dict(seed=4, info_spec={"bonus": 0.0, "success": False}, seed_every_episode=mode != AutoresetMode.SAME_STEP)
    single = EnvPool(fns, **kwargs)
    vector = EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode), **kwargs)
    assert_same(drive(single, 120), drive(vector, 120))
    single.close()
    vector.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_sync_vector_pool_of_dict_observations_equals_single_env_pool(mode):
    # nested Dict leaves and a Discrete(start=1) leaf; SAME_STEP's final_obs are written row by row
    seeds = dict(seed_every_episode=False) if mode is AutoresetMode.SAME_STEP else {}  # as the vector pool's default
    single = EnvPool([DictObsEnv] * 3, seed=5, **seeds)
    vector = EnvPool(gym.vector.SyncVectorEnv([DictObsEnv] * 3, autoreset_mode=mode), seed=5)
    a, b = drive(single, 45), drive(vector, 45)
    assert sum(int(td["next", "done"].sum()) for td in a[1::2]) >= 6  # episodes of 20 steps ended
    assert_same(a, b)
    single.close()
    vector.close()


def test_same_step_vector_env_bad_final_obs_names_the_env():
    class BadFinal(SameStepCounter):
        def step(self, actions):
            obs, reward, done, trunc, info = super().step(actions)
            if done.any():
                info["final_obs"] = np.array([np.zeros(3, np.float32)] * self.num_envs + [None], dtype=object)[:-1]
            return obs, reward, done, trunc, info

    pool = EnvPool(BadFinal(), seed_every_episode=False)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td)["next"]
    with pytest.raises(EnvError, match=r"env 0 \(step\): observation \('observation',\): expected shape \(1,\)"):
        pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))
    pool.close()


@pytest.mark.parametrize("limit", [None, 3])  # 3: the rows end truncated by the time limit, not terminated
def test_vector_env_refuses_step_masks_and_unreset_done_rows(limit):
    pool = EnvPool(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync", max_episode_steps=limit,
                                vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}), seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td["_step"] = torch.tensor([[True], [False], [True]])
    with pytest.raises(StepRefusedError, match="cannot freeze rows"):
        pool.step(td)
    del td["_step"]
    pool.step(td)  # a refused step moved no env: none has to be reset for it
    td = pool.reset()
    for _ in range(200):
        td["action"] = torch.zeros(3, dtype=torch.int64)
        td = pool.step(td)["next"].clone()
        if td["done"].any():
            break
    assert td["truncated" if limit else "terminated"].any()
    rows = torch.nonzero(td["done"].view(-1)).view(-1).tolist()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(StepRefusedError, match=rf"these envs must be reset before they step: envs \[{', '.join(map(str, rows))}\] "
                                               r"since their episode ended .*a VectorEnv resets it itself"):
        pool.step(td)
    td["_reset"] = td["done"].clone()  # the finished rows only: the others go on from where they were
    td = pool.reset(td).exclude("_reset")
    td["action"] = torch.zeros(3, dtype=torch.int64)
    assert not pool.step(td)["next", "done"].all()
    pool.close()


def test_next_step_vector_env_without_masked_reset_is_refused_clearly():
    class Plain(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

        def __init__(self):
            self.num_envs = 2
            self.single_observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
            self.single_action_space = gym.spaces.Discrete(2)

    with pytest.raises(SpecError, match="masked_reset=True"):
        EnvPool(Plain())


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_async_vector_env_without_shared_memory_is_refused_in_next_step_mode_only(wrapped):
    """gymnasium's AsyncVectorEnv worker clears a pending NEXT_STEP autoreset at a reset only with shared memory:
    without it the step after a masked reset would restart the env again (a ghost transition). Such an env is a
    SpecError naming shared_memory, also under a vector wrapper; in SAME_STEP mode it records plain episodes."""

    def make(**kwargs):
        venv = gym.vector.AsyncVectorEnv([functools.partial(counting, length=3)] * 2, shared_memory=False, **kwargs)
        return gym.wrappers.vector.RecordEpisodeStatistics(venv) if wrapped else venv

    venv = make()
    try:
        with pytest.raises(SpecError, match=r"AsyncVectorEnv\(shared_memory=False\) in NEXT_STEP mode.*ghost "
                                            r"transition. Use shared_memory=True"):
            EnvPool(venv)
    finally:
        venv.close()
    pool = EnvPool(make(autoreset_mode=AutoresetMode.SAME_STEP))
    try:
        rollout = pool.rollout(7, break_when_any_done=False)
        assert rollout["next", "done"][:, :, 0].tolist() == [[False, False, True] * 2 + [False]] * 2
        assert rollout["next", "observation"][:, :, 0].tolist() == [[1.0, 2.0, 3.0] * 2 + [1.0]] * 2
    finally:
        pool.close()


def test_a_vector_env_whose_metadata_has_no_autoreset_mode_is_next_step():
    # gymnasium's default autoreset mode is NEXT_STEP: such an env needs a masked reset, as a declared NEXT_STEP one
    class Undeclared(gym.vector.VectorEnv):
        def __init__(self):
            self.num_envs = 2
            self.single_observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
            self.single_action_space = gym.spaces.Discrete(2)

    assert "autoreset_mode" not in Undeclared.metadata
    with pytest.raises(SpecError, match="autoresets in NEXT_STEP mode"):
        EnvPool(Undeclared())


@pytest.mark.parametrize("declared", ["no", 1, [True]])
def test_masked_reset_takes_a_bool_or_a_function_never_a_truthy_object(declared):
    """masked_reset="no" must not declare a masked reset (bool("no") is True)."""
    venv = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    with pytest.raises(TypeError, match=r"masked_reset: expected True, False, None or a function .* got "):
        EnvPool(venv, masked_reset=declared)
    venv.close()


class SameStepCounter(gym.vector.VectorEnv):
    """A natively batched SAME_STEP env without a masked reset: obs = steps since reset, row i's episodes last 2 + i steps."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, n=2):
        self.num_envs = n
        self.single_observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.t = np.zeros(n, np.float32)
        self.length = 2 + np.arange(n)

    def reset(self, *, seed=None, options=None):
        self.t[:] = 0
        return self.t[:, None].copy(), {}

    def step(self, actions):
        self.t += 1
        done = self.t >= self.length
        info = {}
        if done.any():
            info = {"final_obs": np.array([np.array([t], np.float32) for t in self.t], dtype=object), "_final_obs": done}
            self.t[done] = 0
        return self.t[:, None].copy(), np.ones(self.num_envs), done, np.zeros(self.num_envs, bool), info


@pytest.mark.parametrize("declared", [None, AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED, "NextStep"])
def test_a_same_step_vector_env_declared_otherwise_is_refused_at_its_first_final_obs(declared):
    """Read as NEXT_STEP (or DISABLED), a SAME_STEP env's done rows recorded the reset observation as the terminal
    one, and were reset a second time: its info['final_obs'] says what it is."""
    metadata = {} if declared is None else {"autoreset_mode": declared}
    venv = type("Misdeclared", (SameStepCounter,), {"metadata": metadata})()
    pool = EnvPool(venv, masked_reset=True, seed_every_episode=False)
    td = pool.reset()
    td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]  # no row done yet: no final_obs
    with pytest.raises(SpecError, match=r"returned info\['final_obs'\], so it resets finished rows in the same step "
                                        r"\(AutoresetMode.SAME_STEP\), but its metadata\['autoreset_mode'\] says "
                                        r"AutoresetMode\.(NEXT_STEP|DISABLED)"):
        pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))
    pool.close()


class _OneRowCounter(SameStepCounter):
    """A SameStepCounter whose reset or step returns one observation row for its ``num_envs`` envs, when told."""

    short = None  # "reset" or "step": the call that returns one row

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return (obs[:1] if self.short == "reset" else obs), info

    def step(self, actions):
        obs, *rest = super().step(actions)
        return (obs[:1] if self.short == "step" else obs), *rest


@pytest.mark.parametrize("phase", ["reset", "step"])
def test_a_vector_env_returning_one_observation_row_for_all_its_envs_is_an_error_never_broadcast(phase):
    # numpy would copy a (1, 1) batch into every row of the (3, 1) buffer: what a user sees is an EnvError naming
    # the shape the pool expected and the one it got, never every env reporting env 0's observation; review R4 R14
    venv = _OneRowCounter(3)
    pool = EnvPool(venv, masked_reset=True, seed_every_episode=False)
    td = pool.reset()
    venv.short = phase
    match = (rf"pool \({phase}\): vector observation \('observation',\): expected an array of shape \(3, 1\) and "
             r"dtype float32, got ndarray\(dtype=float32, shape=\(1, 1\)\)")
    with pytest.raises(EnvError, match=match):
        pool.reset() if phase == "reset" else pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))
    venv.short = None  # a good batch again: the pool goes on after a reset
    td = pool.reset()
    assert pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))["next", "observation"].tolist() == [[1]] * 3
    pool.close()


class _OwnMetadata(gym.vector.VectorWrapper):
    """A vector wrapper that sets metadata of its own, without its env's autoreset mode."""

    def __init__(self, env):
        super().__init__(env)
        self.metadata = {"render_modes": []}


def test_a_vector_wrapper_hiding_its_envs_autoreset_mode_is_read_through():
    def make():
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3, autoreset_mode=AutoresetMode.SAME_STEP)

    wrapped = EnvPool(_OwnMetadata(make()), seed=4, seed_every_episode=False)
    plain = EnvPool(make(), seed=4, seed_every_episode=False)
    assert "autoreset_mode" not in wrapped._backend.venv.metadata
    a, b = (torch.manual_seed(0) and pool.rollout(120, break_when_any_done=False) for pool in (wrapped, plain))
    assert a["next", "done"].sum() >= 3
    assert (a == b).all()  # terminal observations included
    for pool in (wrapped, plain):
        pool.close()


@pytest.mark.parametrize("value", ["same_step", "SameStep ", None, 1])
def test_an_unknown_autoreset_mode_in_a_vector_envs_metadata_is_a_clear_error(value):
    venv = type("Odd", (SameStepCounter,), {"metadata": {"autoreset_mode": value}})()
    with pytest.raises(SpecError, match=r"Odd.metadata\['autoreset_mode'\] is .*; expected a gymnasium.vector."
                                        r"AutoresetMode \(AutoresetMode.NEXT_STEP, .*\), its value \('NextStep', "
                                        r"'SameStep', 'Disabled'\) or its name"):
        EnvPool(venv)


@pytest.mark.parametrize("value", ["SameStep", "SAME_STEP"])
def test_an_autoreset_mode_given_by_its_value_or_name_is_read(value):
    venv = type("Named", (SameStepCounter,), {"metadata": {"autoreset_mode": value}})()
    pool = EnvPool(venv, seed_every_episode=False)
    assert pool._backend.mode is AutoresetMode.SAME_STEP
    td = pool.reset()
    for _ in range(2):
        out, td = pool.step_and_maybe_reset(td.set("action", torch.zeros(2, dtype=torch.int64)))
    assert out["next", "done"].view(-1).tolist() == [True, False]
    assert out["next", "observation"].view(-1).tolist() == [2.0, 2.0]  # the terminal observation of row 0
    pool.close()


def test_same_step_vector_env_without_masked_reset_refuses_reset_options_clearly():
    pool = EnvPool(SameStepCounter(), seed_every_episode=False)
    td = pool.reset()
    for _ in range(2):
        td["action"] = torch.zeros(2, dtype=torch.int64)
        td = pool.step(td)["next"]
    assert td["done"].view(-1).tolist() == [True, False] and td["observation"].view(-1).tolist() == [2.0, 2.0]
    # row 0 was reset by the env itself, without options: options would need a masked reset
    with pytest.raises(EnvError, match=r"env 0 \(reset\).*only reset rows it finished itself, without options"):
        pool.reset(td.clone().set("_reset", td["done"].clone()), options={"length": 3})
    assert pool.reset(td.clone().set("_reset", td["done"].clone()))["observation"].view(-1).tolist() == [0.0, 2.0]
    pool.close()


def test_same_step_vector_env_without_masked_reset_refuses_to_reseed_rows_it_reset():
    pool = EnvPool(SameStepCounter(), seed=0, seed_every_episode=False)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]
    td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, False]
    # the env already reset row 0 itself, unseeded: an explicit seed cannot be honoured
    with pytest.raises(EnvError, match=r"env 0 \(reset\).*reset these rows itself, unseeded"):
        pool.reset(td.clone().set("_reset", td["done"].clone()), seed=[7, 8])
    pool.close()


def test_same_step_vector_env_without_masked_reset_takes_a_reset_mask_of_every_row_as_a_full_reset():
    # only row 0 finished, but a mask of every row needs no masked reset: it is the vector env's own reset()
    pool = EnvPool(SameStepCounter(), seed_every_episode=False)
    td = pool.reset()
    for _ in range(2):
        td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, False]
    out = pool.reset(td.clone().set("_reset", torch.ones(2, 1, dtype=torch.bool)))
    assert out["observation"].view(-1).tolist() == [0.0, 0.0]
    pool.close()


class _SeedRecordingSameStepCounter(SameStepCounter):
    """SameStepCounter whose rows all last 2 steps, recording the seed of every reset() call."""

    def __init__(self, n=2):
        super().__init__(n)
        self.length[:] = 2
        self.seeds = []

    def reset(self, *, seed=None, options=None):
        self.seeds.append(seed)
        return super().reset(seed=seed, options=options)


def _finish_every_row(pool, td):
    for _ in range(2):
        td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]
    assert td["done"].all()
    return td


def test_same_step_vector_env_without_masked_reset_reuses_its_own_resets_when_every_row_finished():
    # the env already reset every row itself: a full unseeded reset takes those resets, it does not reset twice
    venv = _SeedRecordingSameStepCounter()
    pool = EnvPool(venv, seed_every_episode=False)
    _finish_every_row(pool, pool.reset())
    resets = len(venv.seeds)
    assert pool.reset()["observation"].view(-1).tolist() == [0.0, 0.0]
    assert len(venv.seeds) == resets
    pool.close()


def test_same_step_vector_env_without_masked_reset_reseeds_every_finished_row_by_a_full_reset():
    # rows the env reset itself, unseeded, are reseeded by its own seeded reset(): no masked reset is needed
    venv = _SeedRecordingSameStepCounter()
    pool = EnvPool(venv, seed_every_episode=False)
    _finish_every_row(pool, pool.reset())
    td = pool.reset(seed=5)
    assert venv.seeds[-1] == 5 and td["episode_seed"].view(-1).tolist() == [5, 5]
    assert td["observation"].view(-1).tolist() == [0.0, 0.0]
    pool.close()


@pytest.mark.parametrize("seed", [None, 7])
def test_same_step_vector_env_without_masked_reset_resets_every_row_by_a_full_reset_when_only_some_finished(seed):
    """A full reset() after the env reset some finished rows itself, the others still mid-episode, needs no masked
    reset: it is the vector env's own reset() of every row, called once (not refused as a reset of rows the env did
    not finish)."""
    venv = _SeedRecordingSameStepCounter(3)
    venv.length[:] = [2, 3, 4]
    pool = EnvPool(venv, seed=seed, seed_every_episode=False)
    td = pool.reset()
    for _ in range(2):
        td = pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, False, False]
    resets = len(venv.seeds)
    out = pool.reset()
    assert out["observation"].view(-1).tolist() == [0.0, 0.0, 0.0]
    assert venv.seeds[resets:] == [None]  # one reset() of the vector env, unseeded (no per-episode seeds)
    for _ in range(2):  # every row restarted: row 0 ends again 2 steps later, the others go on
        out = pool.step(out.set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert out["done"].view(-1).tolist() == [True, False, False]
    pool.close()


@pytest.mark.parametrize("final_key", ["final_observation", None])
def test_same_step_vector_env_finishing_rows_without_final_obs_is_an_error_naming_the_row(final_key):
    """A SAME_STEP env must give the terminal observations of the rows it reset in info['final_obs'] (gymnasium
    0.29's 'final_observation' is not read): without it the reset observations would be recorded as the terminal
    ones, silently."""

    class NoFinalObs(SameStepCounter):
        def step(self, actions):
            obs, reward, done, trunc, info = super().step(actions)
            if "final_obs" in info:
                final, mask = info.pop("final_obs"), info.pop("_final_obs")
                if final_key is not None:
                    info[final_key], info["_" + final_key] = final, mask
            return obs, reward, done, trunc, info

    pool = EnvPool(NoFinalObs(), seed_every_episode=False)
    td = pool.reset()
    td = pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next"]  # no row done yet
    with pytest.raises(EnvError, match=r"env 0 \(step\): SAME_STEP vector env finished rows without "
                                       r"info\['final_obs'\]") as err:
        pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))
    assert err.value.env_index == 0
    pool.close()


def test_same_step_vector_env_refuses_pixels():
    # its step() has already reset finished rows when the pool renders: the terminal frame would be lost
    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", render_mode="rgb_array",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    with pytest.raises(SpecError, match="pixels=True with a SAME_STEP VectorEnv"):
        EnvPool(venv, pixels=True)
    venv.close()


def test_vector_env_options_holding_arrays_reach_the_envs():
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, max_length=9)] * 2)
    pool = EnvPool(venv, seed=0)
    pool.reset(options={"length": 4, "goal": np.zeros(2)})  # one dict, copied per row: arrays compare fine
    assert pool.get_attr("length") == [4, 4]
    with pytest.raises(ValueError, match="different dicts per env"):
        pool.reset(options=[{"goal": np.zeros(2)}, {"goal": np.ones(2)}])
    pool.close()


def test_vector_env_call_reaches_only_the_rows_asked_for():
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, max_length=9)] * 3)
    pool = EnvPool(venv, seed=0)
    pool.reset()
    pool.set_attr("length", 7, indices=[1])
    assert pool.get_attr("length", indices=[1]) == [7]
    resets = pool.get_attr("resets_called")
    pool.call("reset", indices=[2])  # a method with a side effect: env 2 only
    assert [b - a for a, b in zip(resets, pool.get_attr("resets_called"))] == [0, 0, 1]
    pool.close()
    native = EnvPool(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point"), seed=0)
    for access in (lambda: native.get_attr("x"), lambda: native.call("render"), lambda: native.set_attr("x", 1)):
        with pytest.raises(AttributeError, match="CartPoleVectorEnv is natively batched"):
            access()
    native.close()


class GenericResetPool(EnvPool):
    """The same pool with TorchRL's own reset merge."""

    def _reset_proc_data(self, tensordict, tensordict_reset):
        return super(EnvPool, self)._reset_proc_data(tensordict, tensordict_reset)


@pytest.mark.parametrize("extra", [False, True])
def test_fast_reset_merge_equals_torchrl_merge(extra):
    fast = EnvPool([functools.partial(counting, max_length=5)] * 4, seed=3)
    slow = GenericResetPool([functools.partial(counting, max_length=5)] * 4, seed=3)
    gen = torch.Generator().manual_seed(0)
    ta, tb = fast.reset(), slow.reset()
    for t in range(40):
        action = torch.randint(0, 3, (4,), generator=gen)
        for td, pool in ((ta, fast), (tb, slow)):
            td["action"] = action
            if extra:
                td["policy_logits"] = torch.ones(4, 3) * t
                td["collector", "traj_ids"] = torch.arange(4) + t
        ta, tb = fast.step(ta)["next"].clone(), slow.step(tb)["next"].clone()
        mask = torch.rand(4, 1, generator=gen) > 0.5
        mask |= ta["done"]
        ra = fast.reset(ta.clone().set("_reset", mask))
        rb = slow.reset(tb.clone().set("_reset", mask))
        assert_same([ra], [rb])
        ta, tb = ra, rb
    # a td holding only "_reset" (TorchRL's maybe_reset): keys absent from it are zero on other rows
    only = TensorDict({"_reset": torch.tensor([[True], [False], [True], [False]])}, [4])
    assert_same([fast.reset(only.clone())], [slow.reset(only.clone())])
    fast.close()
    slow.close()


def test_fast_reset_merge_keeps_the_callers_values_on_rows_not_reset():
    # the caller edited the root in place (e.g. normalised it): rows not reset keep the caller's values
    fast = EnvPool([functools.partial(counting, length=50)] * 3, seed=0)
    slow = GenericResetPool([functools.partial(counting, length=50)] * 3, seed=0)
    tds = []
    for pool in (fast, slow):
        td = pool.reset()
        td["action"] = torch.ones(3, dtype=torch.int64)
        td = pool.step(td)["next"].clone()
        td["observation"] = td["observation"] * 100
        td["reward"] = torch.full((3, 1), 7.0)
        tds.append(pool.reset(td.set("_reset", torch.tensor([[True], [False], [False]]))))
    assert_same(tds[:1], tds[1:])
    assert tds[0]["observation"][:, 0].tolist() == [0.0, 100.0, 100.0]
    assert tds[0]["observation"][:, 2].tolist() == [0.0, 100.0, 100.0]  # last action 1, scaled
    assert tds[0]["reward"].view(-1).tolist() == [0.0, 7.0, 7.0]
    fast.close()
    slow.close()


@pytest.mark.parametrize("kind", ["serial", "process", "sync_vector", "native_vector"])
def test_env_spec_metadata_and_render_mode_of_every_backend(kind):
    if kind in ("serial", "process"):
        pool = EnvPool("CartPole-v1", num_envs=2, backend=kind, num_workers=2, seed=0, seed_every_episode=False)
    else:
        mode = "sync" if kind == "sync_vector" else "vector_entry_point"
        pool = EnvPool(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode=mode, render_mode="rgb_array"),
                       seed=0, seed_every_episode=False)
    assert pool.env_spec.id == "CartPole-v1"
    assert pool.env_metadata["render_fps"] == 50
    assert pool.render_mode == ("rgb_array" if "vector" in kind else None)
    assert pool.seed_every_episode is False
    assert pool.freezes_rows is (kind in ("serial", "process"))
    pool.close()


@pytest.mark.parametrize("mode", ["sync", "async", "vector_entry_point"])
@pytest.mark.parametrize("limit", [15, 700, None])
def test_env_spec_of_a_make_vec_pool_gives_the_time_limit_its_rows_run_under(mode, limit):
    # gym.make_vec(id, N, max_episode_steps=K) keeps the registry's 500 in spec.max_episode_steps, K in its kwargs
    kwargs = {} if limit is None else {"max_episode_steps": limit}
    pool = EnvPool(gym.make_vec("CartPole-v1", 2, vectorization_mode=mode, **kwargs), seed=0)
    try:
        assert pool.env_spec.id == "CartPole-v1"
        assert pool.env_spec.max_episode_steps == (500 if limit is None else limit)
    finally:
        pool.close()


def test_env_spec_of_an_async_vector_env_whose_spec_does_not_pickle_leaves_the_workers_alone():
    # a lambda entry point (or an env class defined in __main__) does not pickle: fetching the sub-envs' spec
    # through the AsyncVectorEnv's pipes would make gymnasium shut its workers down
    gym.register("tests/LambdaCartPole-v0", entry_point=lambda **kw: CartPoleEnv(**kw), max_episode_steps=30)
    pool = EnvPool(gym.make_vec("tests/LambdaCartPole-v0", 2, vectorization_mode="async"), seed=0)
    try:
        assert pool.env_spec.id == "tests/LambdaCartPole-v0" and pool.env_spec.max_episode_steps == 30
        result = World(pool).evaluate(4, seed=0, progress=False)
        assert result["env_time_limit"] == 30 and (result["episode_lengths"] <= 30).all()
        assert pool.reset()["observation"].shape == (2, 4)  # the workers are alive
    finally:
        pool.close()


def test_a_worker_that_died_while_idle_is_named_before_rows_are_refused():
    fns = [functools.partial(counting, length=50)] * 3 + [functools.partial(FailingEnv, fail_at=2)]
    pool = EnvPool(fns, seed=0, backend="process", num_workers=2)
    try:
        td = pool.reset().set("action", torch.zeros(4, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: boom"):
            pool.step(td)
        os.kill(pool._backend.pids[0], signal.SIGKILL)
        pool._backend._processes[0].join(10)
        with pytest.raises(EnvError, match=r"worker 0 \(envs 0..1, pid \d+\) died with exit code -9: the pool cannot "
                                           r"step or reset"):
            pool.step(td)
    finally:
        pool.close()


def test_a_subclass_step_is_honoured_by_the_fast_path():
    class Shaped(EnvPool):
        calls = 0

        def _step(self, tensordict):
            Shaped.calls += 1
            out = super()._step(tensordict)
            out["reward"] = out["reward"] * 10  # e.g. reward shaping in a subclass
            return out

    pool = Shaped([functools.partial(counting, max_length=3)] * 2, seed=0)
    rollout = pool.rollout(6, break_when_any_done=False)
    assert Shaped.calls == 6
    # CountingEnv's reward is its action: every step went through the override
    assert torch.equal(rollout["next", "reward"][..., 0], 10 * rollout["action"].float())
    pool.close()


class _ScaledObservation(EnvPool):  # a subclass's _step changes what the step returns
    def _step(self, tensordict):
        out = super()._step(tensordict)
        out["observation"] = out["observation"] * 10
        return out


class _TimeLimited(EnvPool):  # ... or its done flags (a time limit of its own)
    def _step(self, tensordict):
        out = super()._step(tensordict)
        out["truncated"] = out["truncated"] | (out["observation"][:, :1] >= 2)
        out["done"] = out["terminated"] | out["truncated"]
        return out


class _Curriculum(EnvPool):  # a subclass's _reset passes reset options
    resets = 0

    def _reset(self, tensordict=None, **kwargs):
        type(self).resets += 1
        return super()._reset(tensordict, **kwargs, options={"length": 2})


@pytest.mark.parametrize("cls", [_ScaledObservation, _TimeLimited, _Curriculum])
def test_a_subclass_step_or_reset_gives_what_torchrls_generic_path_gives(cls):
    """The fast step_and_maybe_reset reads the pool's buffers: with a subclass's own _step or _reset
    it must give exactly TorchRL's generic step -> step_mdp -> maybe_reset."""
    from torchrl.envs import EnvBase

    fns = [functools.partial(counting, length=n) for n in (3, 4, 5)]  # rows finish at different steps
    fast, generic = cls(fns, seed=0), cls(fns, seed=0)
    tf, tg = fast.reset(), generic.reset()
    resets = 0
    for t in range(15):
        action = torch.tensor([t % 3, (t + 1) % 3, 2])
        tf["action"], tg["action"] = action, action.clone()
        of, tf = fast.step_and_maybe_reset(tf)
        og, tg = EnvBase._step_and_maybe_reset(generic, tg)
        resets += int(of["next", "done"].any())
        for a, b in ((of, og), (tf, tg)):
            assert set(a.keys(True, True)) == set(b.keys(True, True))
            for key in a.keys(True, True):
                assert torch.equal(a[key], b[key]), (cls.__name__, t, key)
        assert not tf["done"].any()  # every done row was reset, whoever set its flag
    assert resets >= 3
    if cls is _Curriculum:  # the subclass's _reset ran for every partial reset: episodes of 2 steps
        assert int(of["next", "observation"][:, 0].max()) <= 2
    fast.close()
    generic.close()


class _OneStepRandomStart(gym.Env):
    """Every episode lasts one step; the observation is a number drawn at reset (a second reset shows)."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.start = np.array([self.np_random.random()], np.float32)
        return self.start, {}

    def step(self, action):
        return self.start, 1.0, True, False, {}


@pytest.mark.parametrize("path", ["fast", "generic"])
def test_same_step_vector_pool_where_every_row_ends_resets_each_row_once(path):
    # TorchRL's generic maybe_reset sends an all-True "_reset" mask; the SAME_STEP vector env has
    # already reset every row inside its step: resetting them again would skip episode starts
    from torchrl.envs import EnvBase

    def starts(pool, generic):
        td, out = pool.reset(), []
        for _ in range(5):
            td["action"] = torch.zeros(4, dtype=torch.int64)
            step, td = (EnvBase._step_and_maybe_reset(pool, td) if generic else pool.step_and_maybe_reset(td))
            out.append(td["observation"].clone())
        pool.close()
        return torch.stack(out)

    fns = [_OneStepRandomStart] * 4
    single = starts(EnvPool(fns, seed=3, seed_every_episode=False), False)
    vector = EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP), seed=3,
                     seed_every_episode=False)
    assert torch.equal(starts(vector, path == "generic"), single)


@pytest.mark.parametrize("also_reset_row_1", [False, True])
def test_same_step_vector_pool_reset_mask_mixing_rows_the_env_reset_and_rows_it_did_not(also_reset_row_1):
    # row 0 ends inside the step (the SAME_STEP vector env resets it itself); row 1 keeps going.
    # A "_reset" mask holding both (StepCounter truncating row 1) must not reset row 0 a second time
    venv = gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=1), functools.partial(CountingEnv, length=50)],
                                    autoreset_mode=AutoresetMode.SAME_STEP)
    pool = EnvPool(venv, seed=0, seed_every_episode=False)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td)["next"].clone()
    assert td["done"].view(-1).tolist() == [True, False]
    episodes_before = [env.episode for env in venv.envs]
    out = pool.reset(td.set("_reset", torch.tensor([[True], [also_reset_row_1]])))
    episodes = [env.episode for env in venv.envs]
    assert episodes[0] == episodes_before[0], "row 0 was reset again (its step's own reset thrown away)"
    assert episodes[1] == episodes_before[1] + also_reset_row_1
    assert out["observation"][:, 0].tolist() == [0.0, 0.0 if also_reset_row_1 else 1.0]  # t after the reset
    assert out["observation"][0, 1] == episodes[0]  # row 0 shows the episode the vector env started
    pool.close()


def _same_step_counting(cls=gym.vector.SyncVectorEnv, lengths=(1, 50, 50)):
    return cls([functools.partial(CountingEnv, length=n) for n in lengths], autoreset_mode=AutoresetMode.SAME_STEP)


def test_a_same_step_vector_env_refuses_to_step_a_row_it_finished_that_was_not_reset():
    # it has already restarted the row: the step would go from the terminal obs into the next episode, a ghost
    venv = _same_step_counting(lengths=(1, 1, 50))
    pool = EnvPool(venv, seed=0)
    td = pool.step(pool.reset().set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, True, False]
    with pytest.raises(StepRefusedError, match=r"env 0 \(step\): these envs must be reset before they step: envs \[0, 1\] "
                                               r"since their episode ended .*a VectorEnv resets it itself"):
        pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))
    # resetting row 0 alone leaves row 1 refused, and its later reset is still the env's own (no second reset)
    td = pool.step(pool.reset().set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    td = pool.reset(td.clone().set("_reset", torch.tensor([[True], [False], [False]])))
    with pytest.raises(StepRefusedError, match=r"env 1 \(step\): these envs must be reset before they step: envs \[1\] "
                                               r"since their episode ended"):
        pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))
    resets = venv.envs[1].resets_called
    td = pool.reset(td.set("_reset", torch.tensor([[False], [True], [False]])))
    assert venv.envs[1].resets_called == resets and td["observation"][1, :2].tolist() == [0.0, venv.envs[1].episode]
    pool.close()


@pytest.mark.parametrize("kwargs", [{"seed": 3}, {"options": {"length": 4}}])
def test_a_same_step_full_reset_seeded_or_with_options_leaves_every_row_ready_to_step(kwargs):
    # the full reset is the vector env's own reset(): it also resets the finished rows it had reset itself
    pool = EnvPool(_same_step_counting(), seed=0)
    td = pool.step(pool.reset().set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, False, False]
    td = pool.reset(**kwargs)
    nxt = pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert nxt["observation"][:, 0].tolist() == [1.0] * 3
    pool.close()


class _SyncSubclass(gym.vector.SyncVectorEnv):  # not gymnasium's own class: its masked resets are checked
    pass


def test_a_checked_masked_reset_leaves_alone_the_rows_the_same_step_env_reset_itself():
    # a finished row the vector env reset itself holds its reset obs there and its terminal obs in the pool:
    # that difference is no sign that a masked reset of another row ignored the mask
    venv = _same_step_counting(_SyncSubclass)
    pool = EnvPool(venv, seed=0, seed_every_episode=False)
    assert pool._backend._verify_masked_reset
    td = pool.step(pool.reset().set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    assert td["done"].view(-1).tolist() == [True, False, False]
    terminal = td["observation"][0].clone()
    out = pool.reset(td.clone().set("_reset", torch.tensor([[False], [True], [False]])))
    assert torch.equal(out["observation"][0], terminal) and out["observation"][:, 0].tolist() == [1.0, 0.0, 1.0]
    out = pool.reset(out.set("_reset", torch.tensor([[True], [False], [False]])))  # the env's own reset, reused
    assert out["observation"][0].tolist() == [0.0, venv.envs[0].episode, 0.0]
    pool.close()


@pytest.mark.parametrize("kind", ["discrete", "multidiscrete", "multibinary", "box"])
@pytest.mark.parametrize("backend", ["serial", "serial-one-hot", "process", "vector"])
def test_actions_reach_the_env_in_the_action_space_dtype(kind, backend):
    # the env checks the dtype too: MultiBinary.contains() takes an int64 array for its int8 space
    from envs import NarrowActionEnv

    fns = [functools.partial(NarrowActionEnv, kind)] * 2
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, seed=0, backend="process" if backend == "process" else "serial",
                       categorical_action_encoding=backend != "serial-one-hot")
    try:
        td = pool.reset()
        torch.manual_seed(0)
        for _ in range(5):
            td["action"] = pool.action_spec.rand()
            out, td = pool.step_and_maybe_reset(td)  # the env asserts action_space.contains(action)
            index = out["action"].numpy()
            if backend == "serial-one-hot" and kind in ("discrete", "multidiscrete"):  # (multi-)one-hot -> indices
                parts = [index] if kind == "discrete" else np.split(index, [3], axis=-1)
                index = np.stack([part.argmax(-1) for part in parts], -1)
            start = {"discrete": np.array([-1]), "multidiscrete": np.array([0, -2])}.get(kind, np.zeros(2, int))
            seen = out["next", "observation"].numpy()[:, : len(start)]
            assert np.array_equal(seen, (index.reshape(2, -1) + start).astype(np.float32))
    finally:
        pool.close()


class MaskedCounter(gym.vector.VectorEnv):
    """A natively batched DISABLED env that honours ``options["reset_mask"]``: obs = [steps since reset,
    a start drawn from its one generator]; episodes last 3 steps. ``bad`` returns a malformed field."""

    metadata = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(self, n=3, bad=None):
        self.num_envs, self.bad = n, bad
        self.single_observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.obs = np.zeros((n, 2), np.float32)
        self.seeds = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seeds.append(seed)
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        self.obs[mask, 0] = 0
        self.obs[mask, 1] = self.np_random.random(int(mask.sum()))
        return self.obs.copy(), {}

    def step(self, actions):
        self.obs[:, 0] += 1
        done = self.obs[:, 0] >= 3
        reward, terminated = np.ones(self.num_envs), done
        info = {"t": self.obs[:, 0].copy(), "_t": np.ones(self.num_envs, bool)}
        if self.bad == "reward":
            reward = 1.0  # one value for every row
        elif self.bad == "terminated":
            terminated = np.array([bool(done[0])])
        elif self.bad == "mask":
            info["_t"] = np.ones(1, bool)
        return self.obs.copy(), reward, terminated, np.zeros(self.num_envs, bool), info


def test_batched_vector_env_with_a_masked_reset_gets_one_seed_and_resets_only_masked_rows():
    venv = MaskedCounter()
    pool = EnvPool(venv, seed=10, seed_every_episode=True)  # per-episode seeds: one seed for the batch
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td = pool.step(td)["next"]
    before = td["observation"].clone()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = pool.reset(td)
    assert out["observation"][:, 0].tolist() == [1.0, 0.0, 1.0]
    assert torch.equal(out["observation"][[0, 2]], before[[0, 2]])  # the other rows are untouched
    assert isinstance(venv.seeds[-1], int) and out["episode_seed"].view(-1).tolist()[1] == venv.seeds[-1]
    rollout = pool.rollout(20, break_when_any_done=False)  # every episode end is a masked reset
    assert rollout["next", "observation"][0, :, 0].tolist() == [1, 2, 3] * 6 + [1, 2]
    pool.close()


class MaskIgnoringCounter(MaskedCounter):
    """A DISABLED vector env whose reset ignores ``options["reset_mask"]``: it restarts every row."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=None)


class _DropsResetOptions(gym.vector.VectorWrapper):
    """A user wrapper whose reset forgets to forward ``options`` (and so the mask)."""

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed)


class _SyncIgnoringTheMask(gym.vector.SyncVectorEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)


class _SyncWithARegisteredAdapter(gym.vector.SyncVectorEnv):
    pass


def _reset_every_row(venv, mask, seed, options):  # a masked-reset adapter that ignores the mask
    return gym.vector.SyncVectorEnv.reset(venv, options=options)


@pytest.mark.parametrize("kind", ["wrapper", "subclass", "registered"])
def test_a_wrapped_or_subclassed_sync_vector_env_that_drops_the_mask_is_caught(kind):
    # only gymnasium's own vector envs, used as they are, are trusted to honour options["reset_mask"]; so is
    # no adapter registered with register_masked_reset but the package's own (here: one that resets every row)
    from torchrl_swm.pool import vector

    fns = [functools.partial(CountingEnv, length=3), functools.partial(CountingEnv, length=10)]
    if kind == "wrapper":
        venv = _DropsResetOptions(gym.vector.SyncVectorEnv(fns))
    else:
        venv = (_SyncIgnoringTheMask if kind == "subclass" else _SyncWithARegisteredAdapter)(fns)
    registry = dict(vector._MASKED_RESETS)
    vector.register_masked_reset(_SyncWithARegisteredAdapter, _reset_every_row)
    try:
        pool = EnvPool(venv, seed=0)
        name = type(venv).__name__
        with pytest.raises(EnvError, match=rf"env 1 \(reset\): {name}'s masked reset \(rows \[0\]\) changed the "
                                           r"observation of env 1"):
            pool.rollout(8, break_when_any_done=False)
        pool.close()
    finally:
        vector._MASKED_RESETS.clear()
        vector._MASKED_RESETS.update(registry)


class NanCounter(MaskedCounter):
    """:class:`MaskedCounter` whose second observation entry is NaN: an honoured mask must not look violated."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.obs[:, 1] = np.nan
        return self.obs.copy(), info


def test_a_vector_env_whose_masked_reset_touches_other_rows_is_an_error_never_a_silent_desync():
    venv = MaskIgnoringCounter()
    pool = EnvPool(venv, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td = pool.step(td)["next"]
    before = td["observation"].clone()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    with pytest.raises(EnvError, match=r"env 0.*masked reset \(rows \[1\]\) changed the observation of env 0, which "
                       r"was not being reset: it ignores options\['reset_mask'\]") as info:
        pool.reset(td)
    assert info.value.env_index == 0 and info.value.phase == "reset"
    # nothing was written: the pool's rows are the step's, and a full reset starts again
    td["_reset"] = torch.tensor([[False], [False], [False]])
    assert torch.equal(pool.reset(td)["observation"], before)
    assert pool.reset()["observation"][:, 0].tolist() == [0.0, 0.0, 0.0]
    pool.close()
    # a masked reset that honours the mask passes the check, NaN observations included
    for honest in (MaskedCounter(), NanCounter()):
        pool = EnvPool(honest, seed=0)
        assert pool._backend._verify_masked_reset
        rollout = pool.rollout(12, break_when_any_done=False)  # a masked reset every 3 steps
        assert rollout["next", "observation"][0, :, 0].tolist() == [1, 2, 3] * 4
        pool.close()


def test_a_masked_reset_check_takes_the_nan_observations_of_rows_not_reset_as_unchanged():
    # NaN != NaN: the rows a verified masked reset left alone, NaN entries included, are not "changed"
    pool = EnvPool(NanCounter(), seed=0)
    assert pool._backend._verify_masked_reset
    td = pool.reset()
    td = pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    before = td["observation"].clone()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = pool.reset(td)
    assert out["observation"][:, 0].tolist() == [1.0, 0.0, 1.0]
    assert torch.equal(out["observation"][[0, 2], 0], before[[0, 2], 0]) and out["observation"][:, 1].isnan().all()
    pool.close()


def test_a_natively_batched_or_same_step_vector_env_is_seeded_once_by_default_and_single_envs_every_episode():
    # one RNG for the batch: reseeding it at every partial reset would replay no episode, so by default the
    # pool follows gymnasium's convention (seed once, the stream continues); envs with an RNG each are reseeded
    venv = MaskedCounter()
    pool = EnvPool(venv, seed=10)
    sync = EnvPool(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2), seed=10)
    single = EnvPool("CartPole-v1", 2, seed=10)
    try:
        assert not pool.seed_every_episode and sync.seed_every_episode and single.seed_every_episode
        rollout = pool.rollout(9, break_when_any_done=False)  # three episodes per row
        assert rollout["next", "done"].sum() == 9
        assert venv.seeds == [10, 10, None, None]  # the probe's and the first reset's seed, then unseeded resets
        assert (rollout["episode_seed"] == 10).all()  # every episode continues the stream seeded 10
        explicit = EnvPool(MaskedCounter(), seed=10, seed_every_episode=True)
        assert explicit.seed_every_episode
        explicit.close()
        # a SAME_STEP vector env resets finished envs itself, unseeded: seeded once too (one reset per episode)
        cases = [(gym.vector.SyncVectorEnv, mode) for mode in AutoresetMode]
        for kind, mode in [*cases, (gym.vector.AsyncVectorEnv, AutoresetMode.SAME_STEP)]:
            other = EnvPool(kind([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=mode), seed=10)
            assert other.seed_every_episode is (mode is not AutoresetMode.SAME_STEP), (kind, mode)
            other.close()
    finally:
        for p in (pool, sync, single):
            p.close()


@pytest.mark.parametrize("seed_every_episode, resets_per_episode", [(None, 1), (True, 2)])
def test_a_same_step_vector_env_resets_each_episode_once_by_default(seed_every_episode, resets_per_episode):
    # the vector env resets a finished env inside its step (unseeded); by default that reset is the one the pool
    # keeps. A seed for every episode can only come from a second, seeded, masked reset: twice the resets
    venv = gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=4)] * 3,
                                    autoreset_mode=AutoresetMode.SAME_STEP)
    pool = EnvPool(venv, seed=0, seed_every_episode=seed_every_episode)
    envs = venv.envs
    before = [env.unwrapped.resets_called for env in envs]
    td, steps = pool.reset(), []
    for _ in range(40):  # 10 episodes per env, each reset by maybe_reset
        td["action"] = torch.ones(3, dtype=torch.int64)
        step, td = pool.step_and_maybe_reset(td)
        steps.append(step)
    rollout = torch.stack(steps, 1)
    assert rollout["next", "done"].squeeze(-1).sum(1).tolist() == [10, 10, 10]
    resets = [env.unwrapped.resets_called - b for env, b in zip(envs, before)]
    assert resets == [1 + 10 * resets_per_episode] * 3  # the first reset, then each episode's
    # the kept reset is the real one either way: every episode starts at t = 0 and runs 4 steps
    assert (rollout["observation"][:, ::4, 0] == 0).all() and (rollout["next", "observation"][:, 3::4, 0] == 4).all()
    pool.close()


@pytest.mark.parametrize("bad, match", [
    ("reward", r"MaskedCounter.step returned reward float 1.0; expected shape \(3,\), one per env"),
    ("terminated", r"returned terminated ndarray\(dtype=bool, shape=\(1,\)\); expected shape \(3,\)"),
    ("mask", r"vector info key 't': its '_t' mask is ndarray\(dtype=bool, shape=\(1,\)\); expected shape \(3,\)"),
])
def test_vector_env_fields_of_the_wrong_shape_are_errors_never_broadcast(bad, match):
    venv = MaskedCounter(bad=bad)
    with pytest.raises(EnvError, match=match):  # at the construction probe's step, or the first step
        pool = EnvPool(venv, seed=0)
        td = pool.reset()
        td["action"] = torch.zeros(3, dtype=torch.int64)
        pool.step(td)


def test_vector_pool_refuses_options_for_some_rows_and_none_for_others():
    # a VectorEnv takes one options dict for every row it resets: the dict would reach the rows given None
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    pool = EnvPool(venv, seed=0)
    with pytest.raises(ValueError, match=r"got a dict for some rows and None for others"):
        pool.reset(options=[None, {"low": 0.3, "high": 0.3}, None])
    # the same dict for every row reset is fine, and a '_reset' mask picks the rows
    td = pool.reset()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = pool.reset(td, options={"low": 0.3, "high": 0.3})
    assert torch.allclose(out["observation"][1], torch.full((4,), 0.3))
    assert not torch.allclose(out["observation"][0], torch.full((4,), 0.3))
    pool.close()


@pytest.mark.parametrize("kind", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv])
def test_vector_pool_set_attr_sets_a_new_attribute_as_gymnasium_does(kind):
    venv = kind([lambda: gym.make("CartPole-v1")] * 2)
    pool = EnvPool(venv, seed=0)
    pool.set_attr("foo", [1, 2])  # the envs have no "foo" yet
    assert pool.get_attr("foo") == [1, 2]
    pool.set_attr("foo", [5], indices=[1])
    assert pool.get_attr("foo") == [1, 5]
    assert pool.rollout(3, break_when_any_done=False).batch_size == (2, 3)  # the vector env still works
    pool.close()


class _LateResetInfoEnv(gym.Env):
    """Reports its previous episode's length in its reset info, from its second episode on."""

    observation_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.previous = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), ({} if self.previous is None else {"prev_len": self.previous})

    def step(self, action):
        self.t += 1
        if self.t >= 3:
            self.previous = self.t
        return np.full(1, self.t, np.float32), 0.0, self.t >= 3, False, {}


def test_same_step_reset_info_first_reported_after_the_first_episode_stays_at_the_reset():
    # gymnasium's SAME_STEP puts a finished env's reset info at the top level: a key its first reset lacked is
    # still reset info (recorded at the reset root, as the pool of single envs records it), not the terminal step's
    venv = gym.vector.SyncVectorEnv([_LateResetInfoEnv] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    kwargs = dict(seed=0, seed_every_episode=False, info_spec={"prev_len": 0})
    vector, single = EnvPool(venv, **kwargs), EnvPool([_LateResetInfoEnv] * 2, **kwargs)
    assert_same(drive(single, 9), drive(vector, 9))
    rollout = vector.rollout(9, break_when_any_done=False)
    assert not rollout["next", "info_mask", "prev_len"].any()
    reported = rollout["info_mask", "prev_len"][..., 0]
    assert reported.nonzero()[:, 1].tolist() == [0, 3, 6] * 2  # every reset root (drive() ended episodes)
    assert rollout["info", "prev_len"][reported].tolist() == [[3]] * 6
    vector.close()
    single.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED])
def test_wrapper_stats_are_not_declared_where_gymnasium_reports_them_wrong(mode):
    # these modes reset finished rows with a masked reset, and gymnasium 1.4's vector envs pop the mask before
    # RecordEpisodeStatistics reads it: the statistics restart for every row (upstream), so they are not declared
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    venv = RecordEpisodeStatistics(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=mode))
    pool = EnvPool(venv, seed=0)
    assert "info" not in pool.observation_spec.keys()
    pool.close()


@pytest.mark.parametrize("seed_every_episode", [False, True])
@pytest.mark.parametrize("declared", [True, False])
def test_same_step_wrapper_stats_are_recorded_at_the_terminal_step(seed_every_episode, declared):
    # RecordEpisodeStatistics adds "episode" at the top level for finished envs, where gymnasium's SAME_STEP puts
    # their reset info: the pool records it at the done step (as under NEXT_STEP), never at the next reset or lost
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    def make():
        return gym.make("CartPole-v1", max_episode_steps=15)

    venv = RecordEpisodeStatistics(gym.vector.SyncVectorEnv([make] * 2, autoreset_mode=AutoresetMode.SAME_STEP))
    spec = {"episode": {"r": np.float64(0), "l": np.int64(0), "t": np.float64(0)}}
    # undeclared, the wrapper's statistics are known from it where they hold (SAME_STEP, no per-episode seeds): the
    # probe's one step ends no episode, and a key first reported later was an error at the first episode's end
    pool = EnvPool(venv, seed=0, seed_every_episode=seed_every_episode, info_spec=spec if declared else None)
    if not declared and seed_every_episode:  # masked resets: gymnasium's wrapper reports wrong statistics there
        assert "info" not in pool.observation_spec.keys()
        with pytest.raises(EnvError, match=r"info key \('episode', 'r'\).* is not in the pool's info spec"):
            pool.rollout(60, break_when_any_done=False)
        pool.close()
        return
    assert {key: pool.observation_spec["info", "episode", key].dtype for key in "rlt"} == {
        "r": torch.float64, "l": torch.int64, "t": torch.float64}
    rollout = pool.rollout(60, break_when_any_done=False)
    done = rollout["next", "done"][..., 0]
    assert done.sum() >= 4
    reported = rollout["next", "info_mask", "episode", "r"][..., 0]
    assert torch.equal(reported, done)  # at every done step, and only there
    assert not rollout["info_mask", "episode", "r"].any()  # never on a reset root
    if seed_every_episode:
        # a seeded episode is a masked reset: gymnasium 1.4's SyncVectorEnv pops options["reset_mask"] before
        # RecordEpisodeStatistics reads it, so the wrapper restarts every env's statistics (upstream)
        pool.close()
        return
    for row in range(2):  # lengths and returns (CartPole pays 1 per step) match the episodes the pool saw
        ends = torch.nonzero(done[row]).view(-1).tolist()
        lengths = [b - a for a, b in zip([-1, *ends[:-1]], ends, strict=True)]
        assert rollout["next", "info", "episode", "l"][row, ends, 0].tolist() == lengths
        assert rollout["next", "info", "episode", "r"][row, ends, 0].tolist() == [float(n) for n in lengths]
    pool.close()


class _Float64Walk(gym.vector.VectorEnv):
    """A NEXT_STEP vector env with an exact masked reset whose observations come out float64 (numpy
    arithmetic) for its float32 Box; row i ends after 3 + i steps."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, n=3):
        from gymnasium.vector.utils import batch_space

        self.num_envs = n
        self.single_observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.x, self.t, self.prev_done = np.zeros(n), np.zeros(n, int), np.zeros(n, bool)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        self.x[mask], self.t[mask], self.prev_done[mask] = 0.0, 0, False
        return self.x[:, None].copy(), {}

    def step(self, action):
        self.x += 0.1 * (2 * action - 1)
        self.t += 1
        term = self.t >= 3 + np.arange(self.num_envs)
        self.x[self.prev_done], self.t[self.prev_done], term[self.prev_done] = 0.0, 0, False
        self.prev_done = term.copy()
        return self.x[:, None].copy(), np.ones(self.num_envs), term, np.zeros(self.num_envs, bool), {}


def test_a_masked_reset_check_compares_what_the_buffer_holds():
    # float64 observations for a float32 buffer: the rows not reset are unchanged once stored, not "changed"
    pool = EnvPool(_Float64Walk(), masked_reset=True, seed=0)
    rollout = pool.rollout(12, lambda td: td.set("action", torch.ones(3, dtype=torch.int64)),
                           break_when_any_done=False)
    assert rollout["next", "done"][0].view(-1).tolist()[:4] == [False, False, True, False]
    assert torch.allclose(rollout["next", "observation"][0, :4, 0], torch.tensor([0.1, 0.2, 0.3, 0.1]))
    pool.close()


class _FailingReset(gym.Env):
    """Episodes of 2 steps; with ``fails``, every reset after the construction probe's and the first one raises."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fails: bool):
        self.fails, self.resets = fails, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        if self.fails and self.resets > 2 and type(self) is _FailingReset:
            raise RuntimeError("cannot reset")
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, self.t >= 2, False, {}


def test_a_sub_env_failing_a_masked_reset_of_several_rows_is_not_blamed_on_another():
    from torchrl_swm import EnvError

    fns = [functools.partial(_FailingReset, i == 2) for i in range(3)]
    pool = EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED), seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td = pool.step(td)["next"]
    td = pool.step(td.set("action", torch.zeros(3, dtype=torch.int64)))["next"]
    with pytest.raises(EnvError, match=r"env 2 \(reset\): RuntimeError: cannot reset") as err:
        pool.reset(td.set("_reset", td["done"].clone()))
    assert err.value.env_index == 2  # never env 0, the first one reset: the traceback says which
    pool.close()


def test_cartpole_vector_adapter_keeps_the_bounds_of_the_last_reset_as_its_autoreset_does():
    n = 16
    pool = EnvPool(gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point"), seed=0)
    td = pool.reset(options={"low": -0.2, "high": 0.2})
    out = pool.rollout(300, lambda td: td.set("action", torch.zeros(n, dtype=torch.int64)),
                       break_when_any_done=False, auto_reset=False, tensordict=td)
    starts = out["observation"][:, 1:][out["next", "done"][:, :-1, 0]]
    assert len(starts) > 50 and 0.05 < starts.abs().max() <= 0.2  # not the default +-0.05
    # a masked reset given bounds takes them as the vector env's reset(options=) does: a missing one is the
    # default (0.05), not the last reset's
    td = out[:, -1]["next"].clone()
    td["_reset"] = td["done"].clone()
    td["_reset"][:4] = True
    td = pool.reset(td, options={"low": 0.02})
    assert td["observation"][:4].min() >= 0.02 and td["observation"][:4].max() <= 0.05
    # and later resets keep them, as gymnasium's autoreset keeps those of its last reset(options=)
    out = pool.rollout(300, lambda td: td.set("action", torch.zeros(n, dtype=torch.int64)),
                       break_when_any_done=False, auto_reset=False, tensordict=td)
    starts = out["observation"][:, 1:][out["next", "done"][:, :-1, 0]]
    assert len(starts) > 50 and starts.min() >= 0.02 and starts.max() <= 0.05
    pool.close()
    venv = gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
    venv.reset(seed=0, options={"low": -0.2, "high": 0.2})
    obs, done, starts = venv.reset(options={"low": 0.02})[0], np.zeros(n, bool), []
    for _ in range(100):
        obs, _, terminated, truncated, _ = venv.step(np.zeros(n, np.int64))
        starts.append(obs[done])
        done = terminated | truncated
    starts = np.concatenate(starts)
    assert len(starts) > 10 and starts.min() >= 0.02 and starts.max() <= 0.05
    venv.close()


def test_cartpole_vector_adapter_restarts_the_step_count_of_the_rows_it_resets():
    # the pool resets finished rows of a CartPoleVectorEnv itself (a masked reset): each new episode runs the
    # full max_episode_steps before it is truncated, as after gymnasium's own reset of the row
    n, limit = 4, 12
    pool = EnvPool(gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point", max_episode_steps=limit),
                   seed=0)
    calls = iter(range(10**6))

    def policy(td):  # row 0 pushes left (it falls within ~10 steps), the others alternate (they stay up)
        action = torch.full((n,), next(calls) % 2)
        action[0] = 0
        return td.set("action", action)

    out = pool.rollout(40, policy, break_when_any_done=False)
    terminated, truncated = out["next", "terminated"][..., 0], out["next", "truncated"][..., 0]
    assert terminated[0].sum() >= 3 and not truncated[0].any()  # row 0's masked resets restart its count
    for row in range(1, n):  # rows 1-3 reset together, row 0 not: a masked reset too
        assert torch.nonzero(truncated[row]).view(-1).tolist() == [11, 23, 35] and not terminated[row].any()
    pool.close()


class _ExplodingStep(_FailingReset):
    """With ``fails``, every step raises (resets work)."""

    def step(self, action):
        if self.fails:
            raise ValueError("sub-env exploded")
        return super().step(action)


def test_an_async_vector_env_worker_shut_down_after_an_error_is_named():
    import logging

    from torchrl_swm import EnvError

    fns = [functools.partial(_ExplodingStep, i == 2) for i in range(3)]
    logging.disable(logging.CRITICAL)  # gymnasium logs the worker's error itself
    try:
        pool = EnvPool(gym.vector.AsyncVectorEnv(fns), seed=0, info_keys=[])
        td = pool.reset().set("action", torch.zeros(3, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"env 2 \(step\): ValueError: sub-env exploded \(its AsyncVectorEnv "
                                           r"worker was shut down") as err:
            pool.step(td)
        assert err.value.env_index == 2
        with pytest.raises(EnvError, match=r"shut down the worker of env\(s\) \[2\] after an error .* build a new one"):
            pool.reset()
        for use in (lambda: pool.call("reset"), lambda: pool.get_attr("fails"), lambda: pool.set_attr("fails", False)):
            with pytest.raises(EnvError, match=r"shut down the worker of env\(s\) \[2\]"):
                use()
        pool.close()
    finally:
        logging.disable(logging.NOTSET)


def test_envs_of_a_vector_pool_says_where_the_envs_are():
    pool = EnvPool(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), seed=0)
    with pytest.raises(AttributeError, match=r"EnvPool.envs: the VectorBackend keeps no list of the envs .* use "
                                             r"pool.call"):
        pool.envs
    assert not hasattr(pool, "envs")
    pool.close()


class _InfoShapeChanges(gym.Env):
    """Env ``i`` reports an info ``k`` of shape ``(2 + i,)`` from its second step on: gymnasium's
    AsyncVectorEnv raises inside ``step_wait`` while stacking it, leaving the step pending."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, i=0):
        self.i, self.t = i, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {"k": np.zeros(2)}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, False, {"k": np.zeros(2 if self.t < 2 else 2 + self.i)}


def test_a_pool_closes_an_async_vector_env_that_gymnasium_left_waiting(monkeypatch):
    # gymnasium's graceful close would wait forever for the answers of the step it raised in
    import torchrl_swm.pool.vector as vector

    monkeypatch.setattr(vector, "_PENDING_CLOSE_TIMEOUT", 0.5)
    venv = gym.vector.AsyncVectorEnv([functools.partial(_InfoShapeChanges, i) for i in range(2)],
                                     autoreset_mode=AutoresetMode.SAME_STEP)
    pool = EnvPool(venv, seed=0)
    td = pool.reset().set("action", torch.zeros(2, dtype=torch.int64))
    td = pool.step(td)["next"].set("action", torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvError, match=r"could not be stacked .*a value of shape \(3,\) where the key's array holds "
                                       r"values of shape \(2,\)"):
        pool.step(td)
    start = time.monotonic()
    with pytest.warns(UserWarning, match="pending call to `step`"):
        pool.close()
    assert time.monotonic() - start < 10 and pool.is_closed
    assert not any(process.is_alive() for process in venv.processes)


def test_a_pool_over_a_wrapped_sync_vector_env_reaches_its_envs():
    # gymnasium's vector wrappers have no call/get_attr/set_attr: the innermost SyncVectorEnv's envs answer
    venv = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([functools.partial(counting, length=5)] * 2))
    pool = EnvPool(venv, seed=0)
    try:
        assert pool.get_attr("fixed_length") == [5, 5]
        assert pool.call("get_wrapper_attr", "fixed_length", indices=[1]) == [5]
        pool.set_attr("fixed_length", [7, 8])
        assert pool.get_attr("fixed_length") == [7, 8]
        pool.set_attr("fixed_length", 2, indices=[1])  # the other rows' values are read through the wrapper too
        assert pool.get_attr("fixed_length") == [7, 2]
        assert pool._query_first("has_wrapper_attr", "fixed_length") is True
    finally:
        pool.close()


def test_the_fast_path_carries_per_env_non_tensor_policy_outputs_through_partial_resets():
    # a NonTensorStack is a TensorDictBase with no items: zeroing its rows must not rebuild it as an empty TensorDict
    from tensordict import NonTensorData, NonTensorStack
    from torchrl.envs import EnvBase

    fns = [functools.partial(counting, length=n) for n in (2, 3, 4)]  # partial resets at steps 2, 3 and 4
    pools = [EnvPool(fns, seed=0), EnvPool(fns, seed=0)]
    roots = [pool.reset() for pool in pools]
    for t in range(6):
        outs = []
        for k, (pool, step) in enumerate(zip(pools, (EnvPool.step_and_maybe_reset, EnvBase._step_and_maybe_reset))):
            roots[k]["action"] = torch.ones(3, dtype=torch.int64)
            roots[k]["note"] = NonTensorStack(*[NonTensorData(f"t{t}env{i}") for i in range(3)])
            roots[k]["tag"] = NonTensorData("same for every row", batch_size=[3])
            out, roots[k] = step(pool, roots[k])
            outs.append(out)
        fast, generic = roots
        assert isinstance(fast.get("note"), NonTensorStack)
        assert fast.get("note").tolist() == generic.get("note").tolist() == [f"t{t}env{i}" for i in range(3)]
        assert fast.get("tag").tolist() == generic.get("tag").tolist()
        assert torch.equal(fast["observation"], generic["observation"])
    for pool in pools:
        pool.close()


def test_the_fast_paths_keep_the_callers_dim_names_as_step_mdp_does():
    from torchrl_swm import WorldModelEnv

    space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    envs = [EnvPool("CartPole-v1", num_envs=3, seed=0),
            WorldModelEnv(object(), space, space, num_envs=3, initial_state=torch.zeros(2),
                          transition_fn=lambda s, a: {"state": s + a, "terminated": (s + a)[:, 0] > 1})]
    for env in envs:
        td = env.reset().refine_names("env")
        td["action"] = env.full_action_spec.rand()["action"]
        _, root = env.step_and_maybe_reset(td)
        assert root.names == ["env"]
        rollout = env.rollout(4, tensordict=env.reset().refine_names("env"), auto_reset=False,
                              break_when_any_done=False)
        assert rollout.names == ["env", "time"]
        assert env.step_and_maybe_reset(env.rand_action(env.reset()))[1].names == [None]  # none asked: none given
        env.close()


class _OneStepScore(gym.Env):
    """Every episode lasts one step (a bandit); the step info has a key the reset info lacks."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.ones(1, np.float32), 1.0, True, False, {"score": 5.0 + int(action)}


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_info_keys_of_a_probe_step_where_every_env_ends_are_inferred_in_every_autoreset_mode(mode):
    # SAME_STEP puts a finished env's step info under final_info: the probe read only the top level (its reset
    # info), so the key was missed and the first step raised "not in the pool's info spec"
    single = EnvPool([_OneStepScore] * 2, seed=0)
    pool = EnvPool(gym.vector.SyncVectorEnv([_OneStepScore] * 2, autoreset_mode=mode), seed=0)
    assert list(pool.observation_spec["info"].keys()) == list(single.observation_spec["info"].keys()) == ["score"]
    for p in (single, pool):
        td = p.reset()
        for t in range(3):
            td["action"] = torch.tensor([t % 2, 1])
            out, td = p.step_and_maybe_reset(td)
            assert out["next", "info", "score"].view(-1).tolist() == [5.0 + t % 2, 6.0]
            assert out["next", "done"].all() and (td["info", "score"] == 0).all()  # the reset reports none
        p.close()


def test_info_keys_of_a_same_step_probe_step_where_only_some_envs_end_are_inferred():
    # the probe reads final_info whenever a row ended, not only when all did: "success" is reported at an end only
    from envs import SparseInfoEnv

    fns = [functools.partial(SparseInfoEnv, period=100, length=n) for n in (1, 5)]
    pool = EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP), seed=0)
    assert sorted(pool.observation_spec["info"].keys()) == ["success", "t"]
    rollout = pool.rollout(12, break_when_any_done=False)
    done = rollout["next", "done"][..., 0]
    assert done[1].any() and rollout["next", "info", "success"][..., 0][done].all()
    pool.close()


class _FinalInfoMasksEveryRow(gym.vector.VectorWrapper):
    """A SAME_STEP vector env whose ``final_info`` masks also mark every row that did not finish (it holds zeros
    there), as a hand-written vector env may build them."""

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        final_info = info.get("final_info")
        if final_info:
            unfinished = ~(terminated | truncated)
            for key in [k for k in final_info if not k.startswith("_")]:
                final_info["_" + key] = final_info["_" + key] | unfinished
        return obs, reward, terminated, truncated, info


def test_a_same_step_final_info_masks_marking_unfinished_rows_leave_their_step_infos_alone():
    # the terminal infos are written to the finished rows only: a row that did not finish keeps its own step
    # info (and mask), whatever final_info's "_key" mask says about it
    fns = [functools.partial(sparse_info, period=p, max_length=4) for p in (1, 2, 3)]
    kwargs = dict(seed=4, info_spec={"bonus": 0.0, "success": False})
    plain = EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP), **kwargs)
    marked = EnvPool(_FinalInfoMasksEveryRow(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)),
                     **kwargs)
    a, b = drive(plain, 40), drive(marked, 40)
    dones = torch.stack([td["next", "done"].view(-1) for td in a[1::2]])
    assert (dones.any(1) & ~dones.all(1)).any(), "some step must end some rows but not all"
    assert_same(a, b)
    plain.close()
    marked.close()


def test_a_same_step_full_reset_seeding_some_rows_resets_each_unseeded_finished_row_once():
    # a row the SAME_STEP vector env already reset, given no seed, starts the episode that reset began (as a
    # pool of single envs does); seeding another row in the same call reset it a second time
    class Draw(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, i):
            self.i = i

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t, self.u = 0, self.np_random.random()
            return np.array([0.0, self.u]), {}

        def step(self, action):
            self.t += 1
            return np.array([self.t, self.u]), 0.0, self.t >= 1 + 4 * self.i, False, {}

    fns = [functools.partial(Draw, i) for i in range(3)]
    starts = {}
    for name, make in (("single", lambda: EnvPool(fns, seed=0, seed_every_episode=False)),
                       ("vector", lambda: EnvPool(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP),
                                                  seed=0))):
        pool = make()
        td = pool.reset()
        td["action"] = torch.zeros(3, dtype=torch.int64)
        assert pool.step(td)["next", "done"].view(-1).tolist() == [True, False, False]
        td = pool.reset(seed=[None, 5, None])
        starts[name] = (td["observation"].clone(), td["episode_seed"].view(-1).tolist())
        pool.close()
    assert torch.equal(starts["vector"][0], starts["single"][0]) and starts["vector"][1] == starts["single"][1]


def test_a_disabled_vector_env_refuses_to_step_rows_that_finished_and_were_not_reset():
    # it was gymnasium's raw AssertionError; the other modes name the rows
    pool = EnvPool(gym.vector.SyncVectorEnv([_OneStepScore] * 2, autoreset_mode=AutoresetMode.DISABLED), seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td)["next"]
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(StepRefusedError, match=r"env 0 \(step\): these envs must be reset before they step: envs \[0, 1\] "
                                               r"since their episode ended .*Call reset\(\) first"):
        pool.step(td)
    td = pool.reset(td.set("_reset", torch.tensor([[True], [False]])))
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=r"env 1 \(step\):.* reset"):  # row 0 was reset, row 1 was not
        pool.step(td)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", "done"].all()  # reset rows step again
    pool.close()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads CPU times from /proc")
def test_idle_process_workers_block_and_never_spin():
    # workers wait for the next command in a blocking read: an idle pool costs no CPU (a worker polling its
    # pipe would burn its core, and the main process's with it, on a machine with fewer cores than workers)
    pool = EnvPool("CartPole-v1", num_envs=4, backend="process", num_workers=2, seed=0)
    try:
        pool.reset()
        pids = list(pool._backend._pids)
        before = [_cpu_seconds(pid) for pid in pids]
        time.sleep(2.0)
        used = [round(_cpu_seconds(pid) - start, 2) for pid, start in zip(pids, before)]
        assert max(used) < 0.2, f"idle workers used {used} s of CPU in 2 s"
    finally:
        pool.close()
