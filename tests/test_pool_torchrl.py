"""EnvPool composed with TorchRL: spec checks, rollouts, collectors, transforms, replay buffers."""

import functools

import pytest
import torch
from envs import DictObsEnv, counting, sparse_info
from tensordict import TensorDict
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import Compose, InitTracker, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.utils import check_env_specs
from torchrl.testing import rollout_consistency_assertion

from torchrl_swm import EnvPool

POOLS = {
    "cartpole": lambda: EnvPool("CartPole-v1", num_envs=4, seed=0),
    "pendulum": lambda: EnvPool("Pendulum-v1", num_envs=3, seed=0),
    "dict": lambda: EnvPool([DictObsEnv] * 3, seed=0),
    "counting": lambda: EnvPool([functools.partial(counting, max_length=5)] * 4, seed=0),
    # infos that come and go: ("info_mask", key) leaves
    "sparse_info": lambda: EnvPool([functools.partial(sparse_info, period=p) for p in (1, 2, 3)], seed=0,
                                   info_spec={"bonus": 0.0, "success": False}),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_check_env_specs(name):
    pool = POOLS[name]()
    check_env_specs(pool)
    check_env_specs(pool, break_when_any_done="both")
    pool.close()


@pytest.mark.parametrize("name", ["cartpole", "counting"])
def test_rollout_300_nonstop_is_consistent(name):
    pool = POOLS[name]()
    rollout = pool.rollout(300, break_when_any_done=False)
    assert rollout.batch_size == (pool.num_envs, 300)
    assert rollout["next", "done"].any(-2).all(), "every env should finish at least once in 300 steps"
    rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    pool.close()


def test_rollout_dict_observations_nonstop():
    pool = POOLS["dict"]()
    rollout = pool.rollout(60, break_when_any_done=False)
    assert rollout["next", "goal", "target"].shape == (3, 60, 2)
    not_done = ~rollout["next", "done"][:, :-1, 0]
    assert torch.equal(rollout["position"][:, 1:][not_done], rollout["next", "position"][:, :-1][not_done])
    pool.close()


def test_rollout_break_when_all_done():
    pool = EnvPool([functools.partial(counting, length=n) for n in (3, 6)], seed=0)
    rollout = pool.rollout(20, break_when_any_done=False, break_when_all_done=True)
    assert rollout.shape == (2, 6)
    pool.close()


def test_collector_batches_and_traj_ids():
    pool = EnvPool([functools.partial(counting, max_length=6)] * 4, seed=0)
    collector = Collector(pool, None, frames_per_batch=200, total_frames=600)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 3 and batches[0].batch_size == (4, 50)
    for batch in batches:
        obs, nxt = batch["observation"][..., 0], batch["next", "observation"][..., 0]
        assert torch.equal(nxt, obs + 1)
        traj = batch["collector", "traj_ids"]
        done = batch["next", "done"][..., 0]
        # a new trajectory id starts right after every done
        assert (traj[:, 1:][done[:, :-1]] != traj[:, :-1][done[:, :-1]]).all()
        assert (traj[:, 1:][~done[:, :-1]] == traj[:, :-1][~done[:, :-1]]).all()
    pool.close()


def make_cartpole_pool(n):
    return EnvPool("CartPole-v1", num_envs=n, seed=0)


def test_multisync_collector_with_spawn():
    collector = MultiSyncCollector(
        [functools.partial(make_cartpole_pool, 4)] * 2, None, frames_per_batch=160, total_frames=320,
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    batch = batches[0]
    assert batch["next", "observation"].shape[-1] == 4 and batch.numel() == 160
    assert batch["next", "done"].any()


def test_transformed_env_with_step_counter_reward_sum_init_tracker():
    pool = EnvPool([functools.partial(counting, length=100)] * 3, seed=0)
    env = TransformedEnv(pool, Compose(StepCounter(max_steps=4), RewardSum(), InitTracker()))
    check_env_specs(env)
    rollout = env.rollout(13, break_when_any_done=False, policy=lambda td: td.set("action", torch.ones(3, dtype=torch.int64)))
    counts = rollout["next", "step_count"][0, :, 0].tolist()
    assert counts == [1, 2, 3, 4] * 3 + [1]
    assert torch.equal(rollout["next", "truncated"], rollout["next", "step_count"] == 4)
    # StepCounter's truncation reaches the pool as a masked "_reset": the counting env restarts at 0
    assert rollout["observation"][0, :, 0].tolist() == [0, 1, 2, 3] * 3 + [0]
    assert rollout["next", "episode_reward"][0, :, 0].tolist() == [1, 2, 3, 4] * 3 + [1]
    assert rollout["is_init"][0, :, 0].tolist() == [True, False, False, False] * 3 + [True]
    pool.close()


def test_step_counter_on_one_row_resets_only_that_row():
    pool = EnvPool([functools.partial(counting, length=100)] * 2, seed=0)
    env = TransformedEnv(pool, StepCounter())
    td = env.reset()
    for _ in range(3):
        td["action"] = torch.ones(2, dtype=torch.int64)
        _, td = env.step_and_maybe_reset(td)
    td.set("_reset", torch.tensor([[True], [False]]))
    out = env.reset(td)
    assert out["observation"][:, 0].tolist() == [0.0, 3.0]
    assert out["step_count"].view(-1).tolist() == [0, 3]
    pool.close()


def test_replay_buffer_extend_with_collected_batches():
    pool = EnvPool("CartPole-v1", num_envs=4, seed=0)
    collector = Collector(pool, None, frames_per_batch=64, total_frames=256)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
    for batch in collector:
        rb.extend(batch.reshape(-1))
    collector.shutdown()
    assert len(rb) == 256
    sample = rb.sample(32)
    assert sample["next", "observation"].shape == (32, 4) and sample["episode_seed"].shape == (32, 1)
    pool.close()


def test_reset_td_with_only_reset_key_from_maybe_reset_path():
    """TorchRL's maybe_reset passes a td holding only "_reset": only those rows are reset."""
    pool = EnvPool([functools.partial(counting, length=100)] * 3, seed=0)
    td = pool.reset()
    td["action"] = torch.ones(3, dtype=torch.int64)
    td = pool.step(td)["next"].clone()
    out = pool._reset(TensorDict({"_reset": torch.tensor([[False], [True], [False]])}, [3]))
    assert out["observation"][:, 0].tolist() == [1.0, 0.0, 1.0]
    pool.close()


def _stepped_input(pool):
    return pool.reset().set("action", torch.ones(pool.num_envs, dtype=torch.int64))


def test_a_next_entry_the_caller_preset_is_kept_by_step_and_step_and_maybe_reset_as_torchrl_keeps_it():
    # TorchRL's EnvBase.step merges the step's outputs into a "next" the caller put in the input: the pool's own
    # step_and_maybe_reset must keep a preset ("next", k) as TorchRL's generic path does, not replace "next"
    from torchrl.envs import EnvBase

    preset = torch.arange(3.0).view(3, 1)
    outs = {}
    for name, step_and_maybe_reset in (("pool", EnvPool.step_and_maybe_reset),
                                       ("torchrl", EnvBase._step_and_maybe_reset)):
        pool = EnvPool([functools.partial(counting, length=3)] * 3, seed=0)
        td = _stepped_input(pool).set(("next", "my_key"), preset.clone())
        out, root = step_and_maybe_reset(pool, td)
        assert torch.equal(out["next", "my_key"], preset), name
        outs[name] = (out, root)
        stepped = pool.step(_stepped_input(pool).set(("next", "my_key"), preset.clone()))
        assert torch.equal(stepped["next", "my_key"], preset), name
        pool.close()
    (out, root), (want_out, want_root) = outs["pool"], outs["torchrl"]
    for got, want in ((out, want_out), (root, want_root)):
        assert set(got.keys(True, True)) == set(want.keys(True, True)) and (got == want).all()


def test_step_and_maybe_reset_refuses_a_tensordict_of_the_wrong_batch_size_with_torchrls_error_as_step_does():
    pool = EnvPool([functools.partial(counting, length=3)] * 3, seed=0)
    try:
        td = _stepped_input(pool).unsqueeze(-1)  # [3, 1] for a pool of 3
        with pytest.raises(RuntimeError) as by_step:
            pool.step(td.clone())
        with pytest.raises(RuntimeError) as by_step_and_maybe_reset:
            pool.step_and_maybe_reset(td.clone())
        assert str(by_step.value).startswith("Expected a tensordict with shape==env.batch_size")
        assert type(by_step_and_maybe_reset.value) is type(by_step.value)
        assert str(by_step_and_maybe_reset.value) == str(by_step.value)
    finally:
        pool.close()
