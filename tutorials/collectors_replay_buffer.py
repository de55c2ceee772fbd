"""TorchRL collectors over an EnvPool, a replay buffer, and (batch, time) sequences.

Run: python tutorials/collectors_replay_buffer.py        (about 10 s on 2 CPU cores)

An EnvPool is a TorchRL env with batch size [N], so TorchRL's own data pipeline runs on it unchanged:

1. a ``Collector`` steps one pool with a TorchRL policy and yields batches ``[N, T]``;
2. a ``TensorDictReplayBuffer`` stores them (``LazyTensorStorage`` in memory, ``LazyMemmapStorage``
   on disk) and a ``SliceSampler`` returns ``(batch, time)`` sequences, each from one trajectory;
3. what the pool guarantees inside the batches: ``("collector", "traj_ids")``, exact terminal
   observations at done steps, and an ``"episode_seed"`` that replays any episode;
4. a ``MultiSyncCollector`` runs one pool per worker process, built from ``EnvPool.factory(...)``.
"""

import logging
import tempfile

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.modules import ProbabilisticActor

from torchrl_swm import EnvPool


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny tensors: extra intra-op threads only add contention
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # no "Initialized LazyTensorStorage" lines

    # --- 1. A Collector over one pool ------------------------------------------------------------------------
    # 8 CartPole envs, one TorchRL env of batch [8]. The policy is a regular TorchRL actor: an MLP giving
    # logits and a Categorical distribution (it samples during collection and stores its log-prob).
    pool = EnvPool("CartPole-v1", num_envs=8, seed=0)
    logits = TensorDictModule(nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)),
                              in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
                               spec=pool.action_spec, return_log_prob=True)
    # (auto_register_policy_transforms=False: the actor is not recurrent and needs no InitTracker; it also
    # silences torchrl 0.14's FutureWarning, which flags every nn.Module policy.)
    collector = Collector(pool, actor, frames_per_batch=8 * 64, total_frames=8 * 64 * 4,
                          auto_register_policy_transforms=False)

    # --- 2. Into a replay buffer; sample (batch, time) sequences ------------------------------------------------
    # The collector marks each trajectory with ("collector", "traj_ids"); the SliceSampler cuts slices of
    # slice_len consecutive steps inside one trajectory. Batches are stored flat (env-major), so each env's
    # steps of a batch stay contiguous in the storage.
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100_000),
        sampler=SliceSampler(slice_len=8, traj_key=("collector", "traj_ids"), strict_length=True),
        batch_size=32 * 8,  # 32 slices of 8 steps
    )
    for i, batch in enumerate(collector):
        ids = batch["collector", "traj_ids"]
        print(f"batch {i}: {tuple(batch.batch_size)} [envs, time], {int(batch['next', 'done'].sum())} episode ends, "
              f"trajectory ids {int(ids.min())}..{int(ids.max())}")
        buffer.extend(batch.reshape(-1))
    collector.shutdown()
    sequences = buffer.sample().reshape(32, 8)  # (batch, time, ...)
    one_trajectory = (sequences["collector", "traj_ids"] == sequences["collector", "traj_ids"][:, :1]).all()
    print(f"\nsequences {tuple(sequences.batch_size)}: observation {tuple(sequences['observation'].shape)}, "
          f"action {tuple(sequences['action'].shape)}, log-prob {tuple(sequences['action_log_prob'].shape)}; "
          f"one trajectory per row: {bool(one_trajectory)}")

    # --- 3. What the pool guarantees in a batch ----------------------------------------------------------------
    # Exact terminal observations: the pool never auto-resets inside a step, so ("next", "observation") at a
    # done step is the observation the episode ended on (the pole past 0.2095 rad, or the cart past 2.4), and
    # the reset observation is at the root of the following step (every entry within +-0.05).
    done = batch["next", "done"].squeeze(-1)  # [envs, time]
    env, t = (done[:, :-1]).nonzero()[0].tolist()  # an episode end that is not the last step of the batch
    terminal = batch["next", "observation"][env, t]
    restart = batch["observation"][env, t + 1]
    print(f"\nenv {env} ended at step {t}: terminal observation {[round(v, 3) for v in terminal.tolist()]} "
          f"(|angle| > 0.2095 or |x| > 2.4: {bool(terminal[2].abs() > 0.2095 or terminal[0].abs() > 2.4)})")
    print(f"  and the next step starts over from {[round(v, 3) for v in restart.tolist()]}, "
          f"a new trajectory id: {int(batch['collector', 'traj_ids'][env, t + 1])} "
          f"(was {int(batch['collector', 'traj_ids'][env, t])})")
    # "episode_seed": the seed of the episode each step belongs to (env i's k-th episode is seed + i + k * N).
    # A plain gymnasium env reset with it starts exactly where the pool's episode started.
    seed = int(batch["episode_seed"][env, t + 1])
    replayed, _ = gym.make("CartPole-v1").reset(seed=seed)
    same = torch.allclose(torch.as_tensor(replayed), restart)
    print(f"  episode_seed {seed}: gym.make('CartPole-v1').reset(seed={seed}) gives the same observation: {same}")

    # LazyMemmapStorage keeps the same data in memory-mapped files (datasets bigger than RAM, shared across
    # processes); the buffer API is the same.
    with tempfile.TemporaryDirectory() as scratch:
        on_disk = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(100_000, scratch_dir=scratch),
            sampler=SliceSampler(slice_len=8, traj_key=("collector", "traj_ids")), batch_size=16 * 8,
        )
        on_disk.extend(batch.reshape(-1))
        print(f"\nmemory-mapped buffer: {len(on_disk)} steps in {scratch}, "
              f"sample {tuple(on_disk.sample().reshape(16, 8).batch_size)}")
        del on_disk

    # --- 4. One pool per worker process: MultiSyncCollector + EnvPool.factory ----------------------------------
    # EnvPool.factory(...) is a picklable zero-argument factory (checked at once): each worker builds its own
    # pool of 8 envs. A pool seeded s plays its episodes from the seeds s, s+1, s+2...: seeds 2**32 apart keep the
    # two pools' episodes distinct however long they run (as in scale_out.py; episode_seed >> 32 names the worker),
    # and the trajectory ids are unique across workers. policy=None: random actions.
    # (In torchrl 0.14.1, a MultiSyncCollector given an nn.Module policy sets up a shared-memory weight-sync
    # scheme whose __del__ can hang at garbage collection: use policy=None or a plain callable here, and always
    # call shutdown().)
    factories = [EnvPool.factory("CartPole-v1", num_envs=8, seed=w * 2**32) for w in range(2)]
    multi = MultiSyncCollector(factories, None, frames_per_batch=2 * 8 * 32, total_frames=2 * 8 * 32 * 2)
    multi_buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100_000),
        sampler=SliceSampler(slice_len=8, traj_key=("collector", "traj_ids")), batch_size=32 * 8,
    )
    print()
    try:
        for i, batch in enumerate(multi):
            ids = batch["collector", "traj_ids"]  # [workers, envs, time]
            shared = set(ids[0].unique().tolist()) & set(ids[1].unique().tolist())
            print(f"multi batch {i}: {tuple(batch.batch_size)} [workers, envs, time]; episode seeds "
                  f"{int(batch['episode_seed'][0].min())}.. (worker 0) and {int(batch['episode_seed'][1].min())}.. "
                  f"(worker 1); {ids.unique().numel()} trajectories, ids shared by the workers: {len(shared)}")
            multi_buffer.extend(batch.reshape(-1))
    finally:
        multi.shutdown()
    print(f"replay buffer of the multi-process data: {len(multi_buffer)} steps, "
          f"sample {tuple(multi_buffer.sample().reshape(32, 8).batch_size)}")
    pool.close()


if __name__ == "__main__":  # worker processes import this file: keep the work under main
    main()
