"""World: collect a dataset, evaluate in auto and wait modes, evaluate from the dataset, write videos.

The whole loop of a world-model project on a real goal-conditioned task,
``torchrl_swm/PointMaze-v0`` (a point mass in a maze, numpy only: pixels, a
goal image, ``is_success`` and a state hook), in one file that runs in seconds
on two CPU cores:

1. collect a dataset with a noisy scripted expert (TorchRL storage on disk);
2. read it back lazily and sample ``(batch, time)`` sequences with a SliceSampler;
3. evaluate policies in ``auto`` and ``wait`` modes (unbiased, per-episode metrics);
4. evaluate a goal-conditioned policy from dataset states, with goals
   ``goal_offset`` steps ahead, on fewer envs than episodes (chunked);
5. give a planner its context with the ``History`` transform;
6. write one video per episode.

Usage:
    pip install 'torchrl-swm[video]'
    python tutorials/world_evaluate_collect.py [--out /tmp/pointmaze] [--episodes 40]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torchrl.envs import TransformedEnv

import torchrl_swm.envs  # noqa: F401  (registers torchrl_swm/PointMaze-v0 with gymnasium)
from torchrl_swm import EnvPool, History, World, load_dataset
from torchrl_swm.envs import PointMazeExpert

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=None,
                    help="where to write OUT/dataset and OUT/videos (default: a new temp dir). A rerun replaces the "
                         "torchrl_swm dataset in OUT/dataset and the episode_*.mp4 files in OUT/videos; it refuses "
                         "an OUT/dataset that is not a torchrl_swm dataset and an OUT/videos holding other files")
parser.add_argument("--episodes", type=int, default=40)
parser.add_argument("--num-envs", type=int, default=8)
args = parser.parse_args()
torch.set_num_threads(1)  # the tensors here are tiny: extra intra-op threads only add contention

out = Path(args.out or tempfile.mkdtemp(prefix="torchrl_swm_tutorial_"))
# A rerun replaces this tutorial's own outputs and nothing else: collect(overwrite=True) below replaces only a
# torchrl_swm dataset (it refuses any other folder), and the videos folder may hold only earlier episode videos.
old_videos = sorted((out / "videos").glob("episode_*.mp4"))
others = sorted(set((out / "videos").iterdir()) - set(old_videos)) if (out / "videos").is_dir() else []
if others or ((out / "videos").exists() and not (out / "videos").is_dir()):
    parser.error(f"{out / 'videos'} holds files this tutorial did not write (e.g. {(others or [out / 'videos'])[0]}); "
                 "choose another --out")
for old in old_videos:  # an earlier run's videos: a run with fewer episodes would leave some of them beside its own
    old.unlink()
ENV = "torchrl_swm/PointMaze-v0"

# --- 1. Collect ------------------------------------------------------------------------------------------
# World builds an EnvPool from the gymnasium id: 8 envs, 64x64 pixels. Episode j runs on env j % 8 from
# seed 0 + j, whichever episodes finish first. A policy that reads only the observation gives the same dataset
# on any number of envs; this expert's noise is one torch draw for the whole batch, so it depends on the number.
world = World(ENV, num_envs=args.num_envs, image_shape=(64, 64))
try:  # overwrite=True replaces an earlier run's dataset, never a folder that is not one
    dataset = world.collect(out / "dataset", args.episodes, seed=0, policy=PointMazeExpert("u", noise=0.5),
                            overwrite=True)
except FileExistsError as err:
    world.close()
    parser.error(f"{err}; or choose another --out")
print(dataset.summary())

# --- 2. Read it back ----------------------------------------------------------------------------------------
# TorchRL's episode layout: row t holds step t at the root and step t+1 under "next"; the reset frame is the
# root of row 0 and each action sits on the row of the step it was taken at.
ds = load_dataset(out / "dataset")  # lazy: memory-mapped files, nothing read yet
episode = ds.episode(0)
print(f"\nepisode 0: {episode.batch_size[0]} steps, seed {int(episode['episode_seed'][0])}, "
      f"is_init {episode['is_init'].view(-1)[:3].tolist()}..., last next.done {bool(episode['next', 'done'][-1])}")
slice_len = min(8, int(ds.episode_lengths.max()))  # slices stay inside one episode: shorter ones are skipped
rb = ds.replay_buffer(num_slices=16, slice_len=slice_len)  # TensorDictReplayBuffer + SliceSampler(traj_key="episode")
batch = rb.sample().reshape(16, slice_len)                 # (batch, time, ...)
print(f"sequence batch: pixels {tuple(batch['pixels'].shape)}, actions {tuple(batch['action'].shape)}, "
      f"one episode per row: {bool((batch['episode'] == batch['episode'][:, :1]).all())}")

# --- 3. Evaluate: auto and wait modes --------------------------------------------------------------------------
# Success is the env's info["is_success"] (never "terminated"); the result has per-episode returns, lengths,
# steps-to-success and seeds, in a fixed episode order.
print()
random_result = world.evaluate(32, seed=100)  # the default policy: uniform random actions
print(random_result)
world.set_policy(PointMazeExpert("u"))
auto = world.evaluate(32, seed=100, reset_mode="auto")
wait = world.evaluate(32, seed=100, reset_mode="wait")
print(auto)
# Same episodes, same seeds: a deterministic policy gets identical per-episode results in both modes.
identical = all(np.array_equal(auto[k], wait[k])
                for k in ("seeds", "episode_lengths", "episode_returns", "episode_successes"))
assert identical
print(f"{wait['reset_mode']} mode: identical per-episode results (seeds, lengths, returns, successes): {identical}, "
      f"{wait['env_steps']} env-steps in {wait['wall_time']:.2f} s (auto: {auto['wall_time']:.2f} s); "
      f"first lengths {auto['episode_lengths'][:8].tolist()}")


# --- 4. Evaluate from the dataset --------------------------------------------------------------------------------
# Each env starts from the state at start_steps[i] of dataset episode episodes_idx[i] (through the env's
# reset_options_from_dataset hook); the goal is the dataset step goal_offset later, handed to the policy under
# ("goal", key) for every observation key: ("goal", "state"), ("goal", "pixels"), ("goal", "target").
# Up to 24 episodes run on 4 envs, in chunks of 4. The greedy policy below ignores walls, so goals around a corner fail.
def greedy_goal_policy(td):
    """Goal-conditioned and map-free: accelerate straight towards ("goal", "state"). It ignores walls."""
    pos, vel = td["state"][:, :2], td["state"][:, 2:]
    goal = td["goal", "state"][:, :2]
    return td.set("action", (4.0 * (goal - pos) - 8.0 * vel).clamp(-1, 1))


eligible = np.flatnonzero(ds.episode_lengths >= 20)[:24]  # long enough for a goal 20 steps ahead
print()
if len(eligible):
    with World(ENV, num_envs=4, image_shape=(64, 64), policy=greedy_goal_policy) as small:
        from_data = small.evaluate(dataset=ds, episodes_idx=eligible, start_steps=0, goal_offset=20, eval_budget=40,
                                   reset_mode="wait", seed=0, video=out / "videos")
    print(from_data)
    videos = sorted((out / "videos").glob("*.mp4"))
    print(f"{len(videos)} videos (agent | goal), e.g. {videos[0]}")
else:
    print(f"no episode of the {len(ds.episode_lengths)} collected has 20 steps: collect more (--episodes)")

# --- 5. Context for a planner: History ----------------------------------------------------------------------------
# A world-model planner needs the last k frames. History keeps them as (N, k, H, W, 3) and clears only the
# rows that were reset; frozen envs (wait mode) add no duplicate frames.
pool = EnvPool(ENV, num_envs=4, image_shape=(64, 64), seed=0)
env = TransformedEnv(pool, History(["pixels"], 4))
shapes, newest_is_current = set(), set()


def planner_stub(td):
    shapes.add(tuple(td["history", "pixels"].shape))
    newest_is_current.add(bool((td["history", "pixels"][:, -1] == td["pixels"]).all()))  # the last frame is now
    return PointMazeExpert("u")(td)


print()
print(World(env, planner_stub).evaluate(8, seed=5, reset_mode="wait", progress=False).summary().splitlines()[0])
print(f"the planner saw history of shape {' and '.join(map(str, sorted(shapes)))}, "
      f"its newest frame the current pixels: {newest_is_current == {True}}")
env.close()
world.close()
print(f"\noutputs in {out}")
