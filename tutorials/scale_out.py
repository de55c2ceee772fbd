"""Scale out: one PPO loop, three collectors — Collector, MultiSyncCollector, RayCollector.

Only `make_collector` changes between them; the envs, the policy and the training
loop are the same. EnvPool needs no cluster code of its own: TorchRL's collectors
build a pool in each worker process or Ray actor from a picklable factory.

Run:
    python tutorials/scale_out.py --collector single
    python tutorials/scale_out.py --collector multisync --workers 2
    python tutorials/scale_out.py --collector ray --workers 2            # starts a local Ray instance
    python tutorials/scale_out.py --collector ray --ray-address auto     # joins a running cluster

To go past one machine: on the head node run `ray start --head`, on every other node
`ray start --address=<head-ip>:6379`, then run this script on the head node with
`--ray-address auto` (it calls `ray.init(address="auto")`). Each Ray actor builds its
own EnvPool, so the env's dependencies must be installed on every node.
"""

import argparse
import time

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector, MultiSyncCollector
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from torchrl_swm import EnvPool

# Worker processes (spawn) and Ray actors re-import this file: everything that runs is
# under `if __name__ == "__main__"` at the bottom; the definitions above it are cheap.
parser = argparse.ArgumentParser()
parser.add_argument("--collector", choices=["single", "multisync", "ray"], default="single")
parser.add_argument("--workers", type=int, default=2, help="worker processes / Ray actors")
parser.add_argument("--envs-per-worker", type=int, default=8)
parser.add_argument("--frames-per-batch", type=int, default=2048)
parser.add_argument("--total-frames", type=int, default=40_960)
parser.add_argument("--ray-address", default=None, help="None: a local Ray instance; 'auto' or host:port: a cluster")
parser.add_argument("--seed", type=int, default=0)
args = None  # parsed in main


# --- The envs: picklable pool factories, one per worker, each with its own seeds ---------------
# A pool seeded s starts its episodes from the seeds s, s+1, s+2... (one per episode), so workers
# 1000 apart would replay each other's episodes after 1000 of them: space them 2**32 apart.
def pool_factories(workers):
    return [EnvPool.factory("CartPole-v1", num_envs=args.envs_per_worker, seed=args.seed + w * 2**32)
            for w in range(workers)]


# --- The collector: the only part that changes ------------------------------------------------
def make_collector(kind, policy):
    common = dict(frames_per_batch=args.frames_per_batch, total_frames=args.total_frames)
    if kind == "single":  # one process, one pool holding every env
        make = EnvPool.factory("CartPole-v1", num_envs=args.workers * args.envs_per_worker, seed=args.seed)
        # the MLP policy keeps no recurrent state, so it needs no InitTracker (TorchRL 0.14 warns for any
        # module policy on an env without an is_init entry unless told not to look)
        return Collector(make, policy, auto_register_policy_transforms=False, **common)
    if kind == "multisync":  # one pool per worker process; batches are gathered in lock-step
        return MultiSyncCollector(pool_factories(args.workers), policy, **common)
    import ray
    from torchrl.collectors.distributed import RayCollector

    ray.init(address=args.ray_address, num_cpus=None if args.ray_address else args.workers,
             include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    return RayCollector(pool_factories(args.workers), policy, sync=True,
                        remote_configs={"num_cpus": 1, "num_gpus": 0, "memory": 1024**3}, **common)


# --- The policy and the loss: PPO with TorchRL's own modules ------------------------------------
def make_ppo():
    actor = ProbabilisticActor(
        TensorDictModule(MLP(in_features=4, out_features=2, num_cells=[64, 64], activation_class=nn.Tanh),
                         in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical, return_log_prob=True,
    )
    critic = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
                           in_keys=["observation"])
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01)
    return actor, loss, GAE(gamma=0.99, lmbda=0.95, value_network=critic), torch.optim.Adam(loss.parameters(), lr=3e-4)


# --- Episode lengths, counted across batches: an env's episode may start in one batch and end in another
def ended_lengths(done, running):
    """The lengths of the episodes that end in a batch, ``done`` (envs, time); ``running`` holds each env's
    steps in its current episode, and is updated in place for the next batch."""
    ended = []
    for t in range(done.shape[1]):
        running += 1
        ended += running[done[:, t]].tolist()
        running[done[:, t]] = 0
    return ended


# --- The training loop: identical for every collector ------------------------------------------
def main():
    global args
    args = parser.parse_args()
    for flag in ("workers", "envs_per_worker", "frames_per_batch", "total_frames"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.total_frames < args.frames_per_batch or args.total_frames % args.frames_per_batch:
        # the loop takes total // per-batch batches: it would train on none, or silently drop the rest
        parser.error(f"--total-frames ({args.total_frames}) must be a multiple of --frames-per-batch "
                     f"({args.frames_per_batch}), at least one batch")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    actor, loss, advantage, optimizer = make_ppo()
    collector = make_collector(args.collector, actor)
    frames, collect_time, start = 0, 0.0, time.perf_counter()
    running = None  # each env's steps in its current episode
    collector.update_policy_weights_()  # the workers start from this actor's weights (RayCollector warns if not)
    batches = iter(collector)
    try:
        for it in range(args.total_frames // args.frames_per_batch):
            t0 = time.perf_counter()
            batch = next(batches)
            collect_time += time.perf_counter() - t0
            frames += batch.numel()
            layout = tuple(batch.shape)  # single: (envs, time); multisync and ray: (workers, envs, time)
            batch = batch.reshape(-1, batch.shape[-1])  # (envs, time): GAE runs along the last dim
            with torch.no_grad():
                advantage(batch)
            flat = batch.reshape(-1)
            for _ in range(4):  # PPO epochs over minibatches of 512
                for idx in torch.randperm(flat.numel()).split(512):
                    losses = loss(flat[idx])
                    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optimizer.zero_grad()
                    total.backward()
                    optimizer.step()
            collector.update_policy_weights_()
            done = batch["next", "done"].squeeze(-1)  # (envs, time)
            running = torch.zeros(done.shape[0], dtype=torch.long) if running is None else running
            ended = ended_lengths(done, running)
            mean_length = f"{sum(ended) / len(ended):6.1f}" if ended else "   n/a"
            print(f"iter {it:3d} | frames {frames:7d} | batch {layout} | mean length of the episodes that ended "
                  f"{mean_length} | collection {frames / collect_time:8,.0f} frames/s")
    finally:
        collector.shutdown()
        if args.collector == "ray":
            import ray

            ray.shutdown()
    wall = time.perf_counter() - start
    print(f"{args.collector}: {frames} frames, collection {frames / collect_time:,.0f} frames/s, "
          f"training loop {frames / wall:,.0f} frames/s")


if __name__ == "__main__":
    main()
