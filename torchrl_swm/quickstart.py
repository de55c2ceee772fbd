"""The whole package in one command: real data -> world model -> imagined env -> planner -> real evaluation.

Run::

    python -m torchrl_swm.quickstart                # the real run: about 1-2 minutes on 2 CPU cores
    python -m torchrl_swm.quickstart --tiny         # a smoke run (seconds)
    python -m torchrl_swm.quickstart --help         # every size, the seed, the output directory

Everything runs on CPU with no download. The task is ``torchrl_swm/PointMaze-Open-v0``: a point
mass in an open 3x3 room must reach a target. Observation ``state = [x, y, vx, vy]`` and
``target = [x, y]``; action: a force in ``[-1, 1]^2``; reward: ``-distance`` to the target; the
episode terminates when the target is reached (``info["is_success"]``), else ends after 60 steps.

The stages (each prints a header):

1. **Collect real data.** An :class:`~torchrl_swm.EnvPool` of 16 envs, wrapped in a TorchRL
   ``CatTensors`` transform that writes ``observation = [state, target]`` (6 numbers), and
   :meth:`World.collect <torchrl_swm.World.collect>` with a random policy (uniform random
   actions, each held for a few steps) write a training and a held-out dataset: TorchRL
   replay-buffer storages on disk.
2. **Train a world model** from TorchRL replay buffers over those datasets: a ``SliceSampler``
   gives ``(batch, time)`` sequences for an open-loop multi-step loss on the next observation,
   and a uniform sampler gives transitions for the reward and done heads. Held-out prediction
   errors are printed next to trivial baselines.
3. **Wrap it as environments** with :func:`~torchrl_swm.make_world_model_env` /
   :class:`~torchrl_swm.WorldModelEnv`: episodes start from real reset observations of the
   dataset (``start_states=``).
4. **Plan** with TorchRL's ``MPPIPlanner`` (or ``CEMPlanner``) in a batch-unlocked world-model env.
5. **Evaluate** the planner in the *real* pool with :meth:`World.evaluate
   <torchrl_swm.World.evaluate>`, next to a random policy, and both in imagination; print a table.
6. **Export** the world-model env with :func:`~torchrl_swm.to_gymnasium` and step it with a
   CleanRL-style numpy loop.
7. **Save** a PNG (the model's learning curve; real vs imagined returns) and an MP4 of the real
   envs under the planner.

Outputs go to ``--out`` (default ``quickstart_out/``): ``data/{train,heldout}`` (datasets),
``world_model.pt``, ``quickstart.png``, ``video/grid.mp4``, ``results.json``.

From Python, :func:`run` takes a :class:`QuickstartConfig` (or keyword overrides) and returns
the key figures as a dict.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torch import nn

__all__ = ["QuickstartConfig", "DynamicsModel", "StickyRandomPolicy", "PlannerPolicy", "run", "main"]

ENV_IDS = ("torchrl_swm/PointMaze-Open-v0", "torchrl_swm/PointMaze-v0", "torchrl_swm/PointMaze-Medium-v0")
PLANNERS = ("mppi", "cem")
# the run's World seeds: the training set's episodes from seed, the held-out set's from seed + HELDOUT_SEED_OFFSET,
# the evaluation's (episodes no dataset has seen) from seed + EVAL_SEED_OFFSET
HELDOUT_SEED_OFFSET = 1_000_000
EVAL_SEED_OFFSET = 2_000_000
TERMINAL_WEIGHT = 10.0  # terminations are ~0.2% of the steps: weight them up in the done loss


@dataclasses.dataclass
class QuickstartConfig:
    """Every size of the quickstart. The defaults are the real run; :meth:`tiny` is a smoke run."""

    env_id: str = ENV_IDS[0]
    num_envs: int = 16
    seed: int = 0
    out: str = "quickstart_out"
    # 1. data
    train_episodes: int = 1000
    heldout_episodes: int = 100
    stickiness: float = 0.8  # probability that the random policy keeps its previous action
    # 2. model
    hidden: int = 128
    train_steps: int = 3000
    batch_slices: int = 64  # sequences per batch
    seq_len: int = 8  # steps per sequence
    lr: float = 3e-3
    # 4. planner
    planner: str = "mppi"  # or "cem"
    horizon: int = 12
    candidates: int = 128
    top_k: int = 16
    optim_steps: int = 3
    temperature: float = 1.0
    # 5./6. evaluation and export
    eval_episodes: int = 64
    export_envs: int = 8
    export_steps: int = 100
    # 7. outputs and runtime
    video: bool = True
    plot: bool = True
    progress: bool = True
    threads: int = 1  # torch intra-op threads (0: torch's default); the tensors here are tiny
    smoke: bool = False  # set by tiny(): the output then says that its numbers mean nothing

    @classmethod
    def tiny(cls, **overrides) -> QuickstartConfig:
        """Sizes for a CI smoke run: every stage runs, in seconds (the numbers mean nothing)."""
        sizes = dict(
            num_envs=4, train_episodes=24, heldout_episodes=8, train_steps=40, batch_slices=16, hidden=32,
            horizon=5, candidates=16, top_k=4, optim_steps=2, eval_episodes=8, export_envs=4, export_steps=30,
            smoke=True,
        )
        return cls(**{**sizes, **overrides})


# =====================================================================================================
# 1. Real data
# =====================================================================================================
def make_real_env(cfg: QuickstartConfig, *, pixels: bool = False):
    """An EnvPool of the real task, plus a TorchRL transform writing ``observation = [state, target]``.

    The world model sees that flat 6-number observation; the transform gives the real env the
    same key, so the same planner policy runs in the real env and in imagination.
    """
    from torchrl.envs import CatTensors, TransformedEnv

    from torchrl_swm import EnvPool

    render = {"pixels": True, "show_target": True, "goal_image": False, "render_size": 96} if pixels else {}
    pool = EnvPool(cfg.env_id, num_envs=cfg.num_envs, **render)  # World seeds every episode itself
    return TransformedEnv(pool, CatTensors(["state", "target"], "observation", del_keys=False, sort=False))


class StickyRandomPolicy:
    """Uniform random actions, each kept for a few steps: a TorchRL policy (``td -> td``).

    At every step each env draws a new action with probability ``1 - stickiness`` and keeps its
    previous one otherwise (and always draws at an episode's first step). Held actions push the
    point mass to full speed and into the walls, so the data covers the states a planner will
    visit; i.i.d. random actions mostly jitter in place. It draws from torch's global generator,
    which :class:`~torchrl_swm.World` seeds for each run.
    """

    def __init__(self, action_spec, stickiness: float = 0.8):
        self.action_spec = action_spec
        self.stickiness = float(stickiness)
        self.last: torch.Tensor | None = None

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        fresh = self.action_spec.rand()
        if self.last is None:
            self.last = fresh
        keep = (torch.rand(fresh.shape[:-1] + (1,)) < self.stickiness) & ~td.get("is_init")
        self.last = torch.where(keep, self.last, fresh)
        td.set("action", self.last.clone())
        return td

    def __repr__(self) -> str:
        return f"StickyRandomPolicy(stickiness={self.stickiness})"


def collect_data(cfg: QuickstartConfig, out: Path):
    """Collect a training and a held-out dataset (different episode seeds) with World.collect."""
    from torchrl_swm import World

    env = make_real_env(cfg)
    policy = StickyRandomPolicy(env.action_spec, cfg.stickiness)
    with World(env, policy) as world:
        train = world.collect(out / "data" / "train", cfg.train_episodes, seed=cfg.seed, overwrite=True,
                              progress=cfg.progress)
        heldout = world.collect(out / "data" / "heldout", cfg.heldout_episodes, seed=cfg.seed + HELDOUT_SEED_OFFSET,
                                overwrite=True, progress=cfg.progress)
    env.close()
    return train, heldout


# =====================================================================================================
# 2. The world model
# =====================================================================================================
def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, outputs)
    )


class DynamicsModel(nn.Module):
    """A small world model: ``(observation, action) -> (next observation, reward, done logit)``.

    * ``dynamics``: an MLP predicting the change of the observation (normalised by the typical
      change of each entry), so "no change" is its zero output.
    * ``heads``: an MLP reading the next observation and predicting the reward and a termination
      logit (reward and termination are functions of where the agent arrives).

    :meth:`step` is the transition :class:`~torchrl_swm.WorldModelEnv` calls (it finds a model's
    ``step`` method by itself), once per env step for the whole batch; it works for any leading
    batch dims, which the planners use (``[envs, candidates]``).
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: int = 128):
        super().__init__()
        self.dynamics = _mlp(obs_dim + action_dim, hidden, obs_dim)
        self.heads = _mlp(obs_dim, hidden, 2)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.register_buffer("delta_std", torch.ones(obs_dim))
        self.register_buffer("reward_mean", torch.zeros(()))
        self.register_buffer("reward_std", torch.ones(()))

    @torch.no_grad()
    def fit_normalization(self, data: TensorDictBase) -> None:
        """Input/output scales from the training transitions (a TensorDict ``[n]``)."""
        obs, nxt, reward = data["observation"], data["next", "observation"], data["next", "reward"]
        self.obs_mean.copy_(obs.mean(0))
        self.obs_std.copy_(obs.std(0).clamp_min(1e-3))
        self.delta_std.copy_((nxt - obs).std(0).clamp_min(1e-3))  # the target never moves: floor its scale
        self.reward_mean.copy_(reward.mean())
        self.reward_std.copy_(reward.std().clamp_min(1e-3))

    def _normalize(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def next_observation(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return obs + self.dynamics(torch.cat([self._normalize(obs), action], -1)) * self.delta_std

    def reward_and_done(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.heads(self._normalize(next_obs))
        return out[..., :1] * self.reward_std + self.reward_mean, out[..., 1:]

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        next_obs = self.next_observation(obs, action)
        reward, done_logit = self.reward_and_done(next_obs)
        return next_obs, reward, done_logit

    def step(self, observation: torch.Tensor, action: torch.Tensor) -> dict:
        """The WorldModelEnv transition, in the mapping return form (the observation is the state)."""
        next_obs, reward, done_logit = self(observation, action)
        return {"observation": next_obs, "reward": reward, "terminated": done_logit > 0}


_TRAIN_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"))
HELDOUT_SLICES = 256


def dynamics_loss(model: DynamicsModel, seq: TensorDictBase) -> torch.Tensor:
    """Open-loop multi-step loss on ``(batch, time)`` sequences: the model rolls out from the
    first observation with the recorded actions, each prediction feeding the next step."""
    obs = seq["observation"][:, 0]
    loss = 0.0
    for t in range(seq.shape[1]):
        obs = model.next_observation(obs, seq["action"][:, t])
        loss = loss + ((obs - seq["next", "observation"][:, t]) / model.delta_std).pow(2).mean()
    return loss / seq.shape[1]


def heads_loss(model: DynamicsModel, batch: TensorDictBase) -> torch.Tensor:
    """Reward regression and termination classification from the real next observation."""
    reward, done_logit = model.reward_and_done(batch["next", "observation"])
    reward_loss = ((reward - batch["next", "reward"]) / model.reward_std).pow(2).mean()
    done_loss = F.binary_cross_entropy_with_logits(
        done_logit, batch["next", "terminated"].float(), pos_weight=torch.tensor(TERMINAL_WEIGHT)
    )
    return reward_loss + done_loss


def heldout_data(cfg: QuickstartConfig, heldout_ds) -> tuple[TensorDict, TensorDict]:
    """Fixed held-out data: sequences ``(slices, seq_len)`` for the multi-step error, and every transition."""
    seqs = heldout_ds.replay_buffer(num_slices=HELDOUT_SLICES, slice_len=cfg.seq_len).sample()
    seqs = seqs.select(*_TRAIN_KEYS).reshape(HELDOUT_SLICES, cfg.seq_len).to_tensordict()
    return seqs, heldout_ds.td.select(*_TRAIN_KEYS).to_tensordict()


def train_world_model(cfg: QuickstartConfig, train_ds, heldout: tuple[TensorDict, TensorDict]):
    """Train the model from TorchRL replay buffers; returns the model and its learning curve."""
    from tqdm.auto import tqdm

    obs_dim = train_ds.td["observation"].shape[-1]
    action_dim = train_ds.td["action"].shape[-1]
    model = DynamicsModel(obs_dim, action_dim, cfg.hidden)
    model.fit_normalization(train_ds.td.select(*_TRAIN_KEYS))

    # TorchRL replay buffers over the memory-mapped dataset (no copy). SliceSampler(traj_key="episode")
    # returns num_slices runs of seq_len consecutive steps of one episode each, flat: reshape to (batch, time).
    sequences = train_ds.replay_buffer(num_slices=cfg.batch_slices, slice_len=cfg.seq_len)
    transitions = train_ds.replay_buffer(batch_size=cfg.batch_slices * cfg.seq_len)  # uniform transitions
    heldout_seqs, heldout_all = heldout

    optim = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optim, cfg.train_steps, eta_min=cfg.lr / 20)
    curve = {"step": [], "train": [], "heldout_step": [], "heldout": []}
    eval_every = max(1, cfg.train_steps // 40)
    bar = tqdm(range(cfg.train_steps), desc="train world model", disable=not cfg.progress, dynamic_ncols=True,
               leave=False)
    for step in bar:
        seq = sequences.sample().reshape(cfg.batch_slices, cfg.seq_len)
        loss = dynamics_loss(model, seq) + heads_loss(model, transitions.sample())
        optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optim.step()
        schedule.step()
        curve["step"].append(step)
        curve["train"].append(loss.item())
        if step % eval_every == 0 or step == cfg.train_steps - 1:
            with torch.no_grad():
                held = (dynamics_loss(model, heldout_seqs) + heads_loss(model, heldout_all)).item()
            curve["heldout_step"].append(step)
            curve["heldout"].append(held)
            bar.set_postfix(train=f"{loss.item():.3f}", heldout=f"{held:.3f}", refresh=False)
    bar.close()
    return model.eval(), curve


@torch.no_grad()
def heldout_metrics(model: DynamicsModel, seqs: TensorDictBase, data: TensorDictBase) -> dict:
    """Prediction errors on held-out episodes, next to trivial baselines."""
    obs, nxt, reward = data["observation"], data["next", "observation"], data["next", "reward"]
    terminated = data["next", "terminated"]
    pred_obs, pred_reward, done_logit = model(obs, data["action"])
    pred_done = done_logit > 0
    # open loop over whole sequences: the error after seq_len imagined steps
    rolled = seqs["observation"][:, 0]
    for t in range(seqs.shape[1]):
        rolled = model.next_observation(rolled, seqs["action"][:, t])
    last = seqs["next", "observation"][:, -1]
    return {
        "transitions": int(data.shape[0]),
        "next_obs_mse": (pred_obs - nxt).pow(2).mean().item(),
        "next_obs_mse_baseline": (obs - nxt).pow(2).mean().item(),  # "no change"
        "multi_step": int(seqs.shape[1]),
        "multi_step_mse": (rolled - last).pow(2).mean().item(),
        "multi_step_mse_baseline": (seqs["observation"][:, 0] - last).pow(2).mean().item(),
        "reward_mse": (pred_reward - reward).pow(2).mean().item(),
        "reward_mse_baseline": (model.reward_mean - reward).pow(2).mean().item(),  # the training mean
        "done_accuracy": (pred_done == terminated).float().mean().item(),
        "done_accuracy_baseline": (~terminated).float().mean().item(),  # "never done"
        "terminations": int(terminated.sum()),
        "terminations_caught": int((pred_done & terminated).sum()),
        "false_terminations": int((pred_done & ~terminated).sum()),
    }


def print_model_table(m: dict) -> None:
    def row(name, value, base, what):
        ratio = base / value if value > 0 else 0.0
        better = f"{ratio:,.0f}x lower" if ratio >= 10 else f"{ratio:.1f}x lower" if ratio >= 1.1 else ""
        print(f"  {name:<32}{value:>10.2e}{base:>12.2e}   {what:<16}{better}")

    print(f"held-out prediction error ({m['transitions']} transitions of unseen episodes):")
    print(f"  {'':<32}{'model':>10}{'baseline':>12}")
    row("next-observation MSE, 1 step", m["next_obs_mse"], m["next_obs_mse_baseline"], "(no change)")
    row(f"next-observation MSE, {m['multi_step']} steps", m["multi_step_mse"], m["multi_step_mse_baseline"],
        "(no change)")
    row("reward MSE", m["reward_mse"], m["reward_mse_baseline"], "(mean reward)")
    print(f"  {'done accuracy':<32}{m['done_accuracy']:>10.2%}{m['done_accuracy_baseline']:>12.2%}   "
          f"{'(never done)':<16}terminations caught {m['terminations_caught']}/{m['terminations']}, "
          f"false alarms {m['false_terminations']}")


# =====================================================================================================
# 3. World-model environments
# =====================================================================================================
def start_observations(ds) -> TensorDict:
    """The reset observations of the dataset's episodes: where imagined episodes start."""
    first = ds.td["observation"][torch.as_tensor(ds.episode_starts)].clone()
    return TensorDict(observation=first, batch_size=[first.shape[0]])


def _spaces(model: DynamicsModel):
    obs_dim = model.obs_mean.shape[0]
    obs_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (model.dynamics[0].in_features - obs_dim,), np.float32)
    return obs_space, action_space


def make_imagination_env(model: DynamicsModel, starts: TensorDict, num_envs: int, max_steps: int, seed: int):
    """A batched world-model env ``[num_envs]``: episodes start from real observations and end
    when the model predicts termination or after ``max_steps`` (TorchRL's StepCounter)."""
    from torchrl_swm import make_world_model_env

    obs_space, action_space = _spaces(model)
    return make_world_model_env(model, obs_space, action_space, num_envs=num_envs, start_states=starts,
                                max_episode_steps=max_steps, seed=seed)


def make_planning_env(model: DynamicsModel, starts: TensorDict):
    """The env a planner imagines in: batch-unlocked (``num_envs=None``: any batch, here
    ``[envs, candidates]``), reading the state from the tensordict (``state_key``)."""
    from torchrl_swm import WorldModelEnv

    obs_space, action_space = _spaces(model)
    return WorldModelEnv(model, obs_space, action_space, num_envs=None, state_key="observation",
                         start_states=starts)


# =====================================================================================================
# 4. The planner
# =====================================================================================================
class ReturnToGo(nn.Module):
    """MPPI's advantage module: the return-to-go of each imagined step, minus the best candidate's
    (a per-state constant: the ranking is unchanged and ``exp(temperature * advantage)`` stays finite)."""

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        reward = td["next", "reward"]  # [*batch, candidates, horizon, 1]
        to_go = reward.flip(-2).cumsum(-2).flip(-2)
        td["advantage"] = to_go - to_go[..., :1, :].amax(dim=-3, keepdim=True)
        return td


def make_planner(cfg: QuickstartConfig, planning_env):
    from torchrl.modules.planners import CEMPlanner, MPPIPlanner

    if cfg.planner == "mppi":
        return MPPIPlanner(planning_env, ReturnToGo(), temperature=cfg.temperature, planning_horizon=cfg.horizon,
                           optim_steps=cfg.optim_steps, num_candidates=cfg.candidates, top_k=cfg.top_k)
    if cfg.planner == "cem":
        return CEMPlanner(planning_env, planning_horizon=cfg.horizon, optim_steps=cfg.optim_steps,
                          num_candidates=cfg.candidates, top_k=cfg.top_k)
    raise ValueError(f"planner: expected one of {list(PLANNERS)}, got {cfg.planner!r}")


class PlannerPolicy:
    """A TorchRL policy (``td -> td``) that plans from ``td["observation"]`` and writes ``"action"``.

    The planner copies its input once per candidate, so it gets the observation only (not the
    pixels, infos... of the real env).
    """

    def __init__(self, planner):
        self.planner = planner

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        td.set("action", self.planner(td.select("observation"))["action"])
        return td

    def __repr__(self) -> str:
        p = self.planner
        return f"{type(p).__name__}(horizon={p.planning_horizon}, candidates={p.num_candidates}, top_k={p.top_k})"


# =====================================================================================================
# 5. Evaluation
# =====================================================================================================
def _summary(result) -> dict:
    steps = result["steps_to_success"]
    succeeded = steps[~np.isnan(steps)] if steps is not None else np.zeros(0)
    return {
        "episodes": int(result["num_episodes"]),
        "success_rate": result["success_rate"],
        "success_ci": list(result["success_ci"]) if result["success_ci"] is not None else None,
        "mean_return": float(np.mean(result["episode_returns"])),
        "std_return": float(np.std(result["episode_returns"])),
        "mean_length": float(np.mean(result["episode_lengths"])),
        "steps_to_success": float(np.mean(succeeded)) if len(succeeded) else None,
        "returns": [float(r) for r in result["episode_returns"]],
        "wall_time": float(result["wall_time"]),
    }


def standard_error(summary: dict) -> float:
    """The standard error of the mean return: the sample std (ddof=1) over sqrt(n); ``std_return`` is the
    episodes' own std (ddof=0), so that is ``std_return / sqrt(n - 1)`` (0 for a single episode)."""
    n = summary["episodes"]
    return summary["std_return"] / math.sqrt(n - 1) if n > 1 else 0.0


def imagined_success(td: TensorDictBase) -> torch.Tensor:
    """Success in imagination: the model predicts termination (PointMaze terminates exactly on success)."""
    return td["next", "terminated"].reshape(-1)


def make_video_recorder(cfg: QuickstartConfig, out: Path):
    """A grid video (one MP4, a tile per env) when imageio and its ffmpeg plugin are installed."""
    if not cfg.video:
        return None
    if not (_has("imageio") and _has("imageio_ffmpeg")):
        print("  (no video: pip install 'torchrl-swm[video]' for imageio and imageio-ffmpeg)")
        return None
    from torchrl_swm.video import VideoRecorder

    return VideoRecorder(out / "video", layout="grid")


def evaluate_real(cfg: QuickstartConfig, policy, seed: int, video=None) -> dict:
    """The random policy and ``policy`` on the same episodes (same seeds) of the real EnvPool."""
    from torchrl_swm import World

    env = make_real_env(cfg, pixels=video is not None)
    with World(env) as world:  # the default policy: uniform random actions
        random = world.evaluate(cfg.eval_episodes, seed=seed, progress=cfg.progress)
        world.set_policy(policy)
        planner = world.evaluate(cfg.eval_episodes, seed=seed, progress=cfg.progress, video=video)
    env.close()
    return {"random": _summary(random), "planner": _summary(planner)}


def evaluate_imagined(cfg: QuickstartConfig, model: DynamicsModel, starts: TensorDict, policy, seed: int,
                      max_steps: int) -> dict:
    """The same two policies in the world model, from real start observations."""
    from torchrl_swm import World

    env = make_imagination_env(model, starts, cfg.num_envs, max_steps, seed)
    results = {}
    with World(env) as world:
        for name, pi in (("random", None), ("planner", policy)):
            world.set_policy(pi)
            result = world.evaluate(cfg.eval_episodes, seed=seed, max_steps=max_steps, progress=cfg.progress,
                                    success_fn=imagined_success)
            results[name] = _summary(result)
    env.close()
    return results


def print_eval_table(results: dict, planner_name: str) -> None:
    head = f"  {'policy':<14}{'env':<10}{'episodes':>9}  {'success (95% CI)':<22}{'return':>18}{'length':>9}" \
           f"{'steps to success':>18}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    for env_name in ("real", "imagined"):
        for policy_name in ("random", "planner"):
            s = results[env_name][policy_name]
            label = "random" if policy_name == "random" else planner_name
            lo, hi = s["success_ci"]
            success = f"{s['success_rate']:6.1%} [{lo:.0%}, {hi:.0%}]"
            ret = f"{s['mean_return']:8.1f} ± {s['std_return']:5.1f}"
            steps = "-" if s["steps_to_success"] is None else f"{s['steps_to_success']:.1f}"
            print(f"  {label:<14}{env_name:<10}{s['episodes']:>9}  {success:<22}{ret:>18}{s['mean_length']:>9.1f}"
                  f"{steps:>18}")


# =====================================================================================================
# 6. Export to gymnasium, stepped CleanRL-style
# =====================================================================================================
def cleanrl_loop(cfg: QuickstartConfig, model: DynamicsModel, starts: TensorDict, max_steps: int) -> dict:
    """Export the world-model env as a gymnasium VectorEnv and drive it with numpy, as CleanRL does."""
    from torchrl_swm import to_gymnasium

    env = make_imagination_env(model, starts, cfg.export_envs, max_steps, cfg.seed)
    envs = to_gymnasium(env, observation_keys="observation")  # a Box observation, numpy in and out
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    print(f"  {envs.unwrapped}\n  single_observation_space {envs.single_observation_space}, "
          f"single_action_space {envs.single_action_space}")

    def controller(obs: np.ndarray) -> np.ndarray:  # push towards the target, brake with the velocity
        pos, vel, target = obs[:, 0:2], obs[:, 2:4], obs[:, 4:6]
        return np.clip(4.0 * (target - pos) - 8.0 * vel, -1.0, 1.0).astype(np.float32)

    obs, _ = envs.reset(seed=cfg.seed)
    returns, lengths = [], []
    for _ in range(cfg.export_steps):
        actions = controller(obs)
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "episode" in infos:  # gymnasium's RecordEpisodeStatistics, as in CleanRL
            done = infos["_episode"]
            returns += infos["episode"]["r"][done].tolist()
            lengths += infos["episode"]["l"][done].tolist()
    envs.close()
    stats = {
        "num_envs": cfg.export_envs,
        "steps": cfg.export_steps,
        "episodes": len(returns),
        "mean_return": float(np.mean(returns)) if returns else None,
        "mean_length": float(np.mean(lengths)) if lengths else None,
        "observation_space": str(envs.single_observation_space),
        "action_space": str(envs.single_action_space),
    }
    summary = (f"mean return {stats['mean_return']:.1f}, mean length {stats['mean_length']:.1f}"
               if returns else "no episode finished yet (raise --export-steps)")
    print(f"  {cfg.export_steps} steps x {cfg.export_envs} envs of envs.step(numpy actions) with a numpy "
          f"go-to-target controller: {len(returns)} imagined episodes finished, {summary}")
    return stats


# =====================================================================================================
# 7. Plot
# =====================================================================================================
def save_plot(path: Path, curve: dict, results: dict, planner_name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    train = np.asarray(curve["train"])
    window = max(1, len(train) // 50)
    smooth = np.convolve(train, np.ones(window) / window, mode="valid")
    ax1.plot(np.asarray(curve["step"])[window - 1:], smooth, label=f"train (moving average of {window})")
    ax1.plot(curve["heldout_step"], curve["heldout"], "o-", ms=3, label="held-out episodes")
    ax1.set_yscale("log")
    ax1.set_xlabel("gradient step")
    ax1.set_ylabel("loss (dynamics + reward + done)")
    ax1.set_title("World-model learning curve")
    ax1.legend()

    policies = ("random", "planner")
    x = np.arange(len(policies))
    for k, (env_name, color) in enumerate((("real", "tab:blue"), ("imagined", "tab:orange"))):
        stats = [results[env_name][p] for p in policies]
        errs = [standard_error(s) for s in stats]
        ax2.bar(x + (k - 0.5) * 0.38, [s["mean_return"] for s in stats], 0.38, yerr=errs, capsize=4, color=color,
                label=f"{env_name} env")
    labels = [  # the success rates go under each policy's name
        f"{'random' if p == 'random' else planner_name}\nsuccess: {results['real'][p]['success_rate']:.0%} real, "
        f"\n{results['imagined'][p]['success_rate']:.0%} imagined"
        for p in policies
    ]
    ax2.axhline(0, color="black", lw=0.8)
    ax2.set_xticks(x, labels)
    ax2.set_ylabel("mean episode return (± s.e.)")
    ax2.set_title("Real vs imagined returns")
    # returns are negative: room above the zero line for the legend, which "best" then finds
    bottom, top = ax2.get_ylim()
    ax2.set_ylim(bottom, top + 0.25 * (top - bottom))
    ax2.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# =====================================================================================================
# Driver
# =====================================================================================================
def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _header(k: int, title: str) -> None:
    print(f"\n=== [{k}/7] {title} " + "=" * max(3, 86 - len(title)), flush=True)


def _planner_name(cfg: QuickstartConfig) -> str:
    return f"{cfg.planner.upper()} planner"


def stage_collect(cfg: QuickstartConfig, out: Path):
    _header(1, f"Collect real data: EnvPool({cfg.env_id!r}, num_envs={cfg.num_envs}) + World.collect")
    print(f"  real env: EnvPool + CatTensors(state, target -> observation); data policy: random actions, each "
          f"kept with probability {cfg.stickiness}")
    train_ds, heldout_ds = collect_data(cfg, out)
    print(train_ds.summary().split("\n  keys")[0])
    print(f"held-out: {heldout_ds.num_episodes} more episodes ({len(heldout_ds)} steps) at {heldout_ds.path}")
    return train_ds, heldout_ds


def stage_train(cfg: QuickstartConfig, out: Path, train_ds, heldout_ds):
    _header(2, "Train a world model from TorchRL replay buffers (SliceSampler sequences)")
    print(f"  {cfg.train_steps} steps of {cfg.batch_slices} sequences x {cfg.seq_len} steps (open-loop dynamics "
          f"loss) + {cfg.batch_slices * cfg.seq_len} transitions (reward and done heads)")
    heldout = heldout_data(cfg, heldout_ds)
    model, curve = train_world_model(cfg, train_ds, heldout)
    metrics = heldout_metrics(model, *heldout)
    print_model_table(metrics)
    torch.save(model.state_dict(), out / "world_model.pt")
    return model, curve, metrics


def stage_wrap(cfg: QuickstartConfig, model: DynamicsModel, train_ds, max_steps: int):
    from torchrl.envs.utils import check_env_specs

    _header(3, "Wrap the model as TorchRL envs: make_world_model_env / WorldModelEnv")
    starts = start_observations(train_ds)
    imagined = make_imagination_env(model, starts, cfg.num_envs, max_steps, cfg.seed)
    check_env_specs(imagined, seed=cfg.seed)  # TorchRL's own consistency check of specs and outputs
    rollout = imagined.rollout(max_steps, break_when_any_done=False)  # random actions
    imagined.close()
    print(f"  imagination env: {type(imagined).__name__}(WorldModelEnv(num_envs={cfg.num_envs}), "
          f"{type(imagined.transform[-1]).__name__}(max_steps={max_steps})): one model.step call per step for all "
          f"{cfg.num_envs} envs, "
          f"episodes start from {starts.shape[0]} real reset observations (start_states=)")
    print(f"  check_env_specs: passed; a random rollout: {tuple(rollout.batch_size)} [envs, time], "
          f"{int(rollout['next', 'terminated'].sum())} predicted terminations")
    planning_env = make_planning_env(model, starts)
    print("  planning env: WorldModelEnv(num_envs=None, state_key='observation'): batch-unlocked (any batch size) "
          "and reading the state from the tensordict, as TorchRL's planners need")
    return starts, planning_env


def stage_plan(cfg: QuickstartConfig, planning_env) -> PlannerPolicy:
    planner = make_planner(cfg, planning_env)
    _header(4, f"Plan with TorchRL's {type(planner).__name__} over the world model")
    policy = PlannerPolicy(planner)
    print(f"  {policy}: {cfg.optim_steps} refinements x {cfg.candidates} candidate action sequences of "
          f"{cfg.horizon} steps, imagined in the world model at every real step")
    return policy


def stage_evaluate(cfg: QuickstartConfig, out: Path, model: DynamicsModel, starts: TensorDict, policy,
                   max_steps: int):
    _header(5, "Evaluate in the real EnvPool (World.evaluate) and in imagination")
    seed = cfg.seed + EVAL_SEED_OFFSET  # episodes no dataset has seen
    video = make_video_recorder(cfg, out)
    results = {
        "real": evaluate_real(cfg, policy, seed, video),
        "imagined": evaluate_imagined(cfg, model, starts, policy, seed, max_steps),
    }
    print_eval_table(results, _planner_name(cfg))
    real = results["real"]
    print(f"  real env: the {_planner_name(cfg)} succeeds in {real['planner']['success_rate']:.0%} of the episodes "
          f"(random: {real['random']['success_rate']:.0%}), mean return {real['planner']['mean_return']:.1f} "
          f"vs {real['random']['mean_return']:.1f}")
    video_path = video.files[0] if video is not None and video.files else None
    return results, video_path


def stage_export(cfg: QuickstartConfig, model: DynamicsModel, starts: TensorDict, max_steps: int) -> dict:
    _header(6, "Export the world-model env with to_gymnasium and step it CleanRL-style")
    return cleanrl_loop(cfg, model, starts, max_steps)


def stage_plot(cfg: QuickstartConfig, out: Path, curve: dict, results: dict) -> Path | None:
    _header(7, "Outputs: the plot, the video, the key figures")
    if not cfg.plot:
        return None
    if not _has("matplotlib"):
        print("  (no plot: pip install 'torchrl-swm[plot]' for matplotlib)")
        return None
    return save_plot(out / "quickstart.png", curve, results, _planner_name(cfg))


#: the config's sizes: ints >= 1
_SIZES = ("num_envs", "train_episodes", "heldout_episodes", "hidden", "train_steps", "batch_slices", "seq_len",
          "horizon", "candidates", "top_k", "optim_steps", "eval_episodes", "export_envs", "export_steps")


def _max_episode_steps(env_id: str) -> int:
    """The time limit of ``env_id``'s episodes, which the run's envs use (real, imagined and exported)."""
    import torchrl_swm.envs  # noqa: F401  (registers the PointMaze ids)

    return gym.spec(env_id).max_episode_steps


def _check_config(cfg: QuickstartConfig, name: Callable[[str], str] = str) -> None:
    """Refuse a config the run would fail on (minutes in, after the collection or the training), naming what was
    expected and what was received: the one check of :func:`run` and of the command line, which passes ``name``
    to call each field by its flag.

    Raises:
        TypeError: a field of the wrong type (a float size, a string flag...).
        ValueError: a value out of range.
    """
    from .cli import CLIError, _check_output_dir
    from .errors import check_bool, check_int, check_number
    from .world import SEED_LIMIT

    if cfg.env_id not in ENV_IDS:
        raise ValueError(f"{name('env_id')}: expected one of {list(ENV_IDS)}, got {cfg.env_id!r}")
    if cfg.planner not in PLANNERS:
        raise ValueError(f"{name('planner')}: expected one of {list(PLANNERS)}, got {cfg.planner!r}")
    for field in _SIZES:
        check_int(getattr(cfg, field), name(field), minimum=1)
    limit = _max_episode_steps(cfg.env_id)
    if cfg.seq_len > limit:  # the SliceSampler (strict_length) fails after the collection: "Did not find a single
        # trajectory with sufficient length"
        raise ValueError(f"{name('seq_len')}: expected an int <= {limit}, the most steps an episode of {cfg.env_id} "
                         f"has (its max_episode_steps): every sequence is {name('seq_len')} steps of one episode, got "
                         f"{cfg.seq_len}")
    if cfg.top_k > cfg.candidates:  # TorchRL's planner fails with "selected index k out of range"
        raise ValueError(f"{name('top_k')}: expected an int <= {name('candidates')} ({cfg.candidates}), the "
                         f"candidates the planner keeps its best of, got {cfg.top_k}")
    seed = check_int(cfg.seed, name("seed"))
    if not 0 <= seed < SEED_LIMIT - EVAL_SEED_OFFSET:  # World's seeds are below 2**62: the last ones used too
        raise ValueError(f"{name('seed')}: expected an int in [0, 2**62 - {EVAL_SEED_OFFSET}) (the run's evaluation "
                         f"uses the seeds from seed + {EVAL_SEED_OFFSET}), got {seed}")
    if check_int(cfg.threads, name("threads")) < 0:
        raise ValueError(f"{name('threads')}: expected 0 (torch's default) or an int >= 1, got {cfg.threads}")
    if not 0 <= check_number(cfg.stickiness, name("stickiness")) <= 1:
        raise ValueError(f"{name('stickiness')}: expected a probability in [0, 1], got {cfg.stickiness!r}")
    for field in ("lr", "temperature"):
        value = check_number(getattr(cfg, field), name(field))
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name(field)}: expected a finite number > 0, got {getattr(cfg, field)!r}")
    for field in ("video", "plot", "progress", "smoke"):
        check_bool(getattr(cfg, field), name(field))
    if not isinstance(cfg.out, (str, os.PathLike)):
        raise TypeError(f"{name('out')}: expected a path (str or os.PathLike), got {type(cfg.out).__name__}")
    try:  # not a raw FileNotFoundError minutes in, after the training
        _check_output_dir(cfg.out, name("out"))
    except CLIError as err:
        raise ValueError(str(err)) from None


def _flag(field: str) -> str:
    """The command-line flag of config field ``field``."""
    return "--env" if field == "env_id" else "--" + field.replace("_", "-")


def run(config: QuickstartConfig | None = None, **overrides) -> dict:
    """Run the seven stages and return the key figures (also written to ``OUT/results.json``).

    The config is checked first, as the command line checks its flags (``TypeError``/``ValueError`` before any
    work: sizes, ``top_k <= candidates``, ``seq_len`` at most the env's episode limit, the planner, the seed, the
    output directory...)."""
    cfg = dataclasses.replace(config or QuickstartConfig(), **overrides)
    _check_config(cfg)  # before any work: a bad value would fail minutes in, after the collection and the training
    threads = torch.get_num_threads()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    import torchrl  # noqa: F401  (it sets its logger's level on import)

    torchrl_logger = logging.getLogger("torchrl")
    log_level = torchrl_logger.level
    torchrl_logger.setLevel(logging.WARNING)  # no "Initialized LazyMemmapStorage" lines
    try:
        with torch.random.fork_rng(devices=[]):  # seeds torch's global generator without changing the caller's
            return _run(cfg)
    finally:
        torch.set_num_threads(threads)
        torchrl_logger.setLevel(log_level)


def _run(cfg: QuickstartConfig) -> dict:
    import torchrl_swm.envs  # noqa: F401  (registers the PointMaze ids)

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    max_steps = _max_episode_steps(cfg.env_id)
    timer = _Timer()
    if cfg.smoke:
        print("--tiny: a smoke run with tiny sizes; its numbers mean nothing")

    train_ds, heldout_ds = stage_collect(cfg, out)
    timer.lap("collect")
    model, curve, model_metrics = stage_train(cfg, out, train_ds, heldout_ds)
    timer.lap("train")
    starts, planning_env = stage_wrap(cfg, model, train_ds, max_steps)
    timer.lap("wrap")
    policy = stage_plan(cfg, planning_env)
    timer.lap("planner")
    results, video_path = stage_evaluate(cfg, out, model, starts, policy, max_steps)
    timer.lap("evaluate")
    export = stage_export(cfg, model, starts, max_steps)
    timer.lap("export")
    plot_path = stage_plot(cfg, out, curve, results)
    timer.lap("outputs")

    files = {
        "plot": None if plot_path is None else str(plot_path),
        "video": None if video_path is None else str(video_path),
        "datasets": [str(train_ds.path), str(heldout_ds.path)],
        "model": str(out / "world_model.pt"),
        "results": str(out / "results.json"),
    }
    figures = {
        "config": dataclasses.asdict(cfg),
        "data": {
            "train_episodes": train_ds.num_episodes,
            "train_steps": len(train_ds),
            "heldout_episodes": heldout_ds.num_episodes,
            "heldout_steps": len(heldout_ds),
        },
        "model": model_metrics,
        "curve": curve,
        "eval": results,
        "export": export,
        "files": files,
        "timings": timer.timings,
    }
    stale = _earlier_outputs(out, files)
    (out / "results.json").write_text(json.dumps({k: v for k, v in figures.items() if k != "curve"}, indent=1))
    for path in stale:  # this run replaced the earlier one's results: its plot or video would no longer match
        path.unlink()
        print(f"  removed the earlier run's {path} (this run wrote none)")
    for name in ("plot", "video", "results"):
        print(f"  {name:<8} {files[name] or '(not written)'}")
    print(f"\ndone in {sum(timer.timings.values()):.0f} s ("
          + ", ".join(f"{k} {v:.0f} s" for k, v in timer.timings.items()) + ")")
    return figures


def _earlier_outputs(out: Path, files: dict) -> list[Path]:
    """The plot and video an earlier run into ``out`` wrote (the folder holds its ``results.json``) that this
    run did not write again (``--no-plot``, ``--no-video``, no matplotlib): only the quickstart's own file names."""
    if not (out / "results.json").is_file():
        return []
    own = {"plot": out / "quickstart.png", "video": out / "video" / "grid.mp4"}
    return [path for name, path in own.items() if files[name] is None and path.is_file()]


class _Timer:
    def __init__(self):
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._last, 2)
        self._last = now


_SIZE_FLAGS = ("num_envs", "train_episodes", "heldout_episodes", "train_steps", "hidden", "horizon", "candidates",
               "top_k", "optim_steps", "eval_episodes", "export_steps")


def parse_args(argv: Sequence[str] | None = None, prog: str = "python -m torchrl_swm.quickstart") -> QuickstartConfig:
    d = QuickstartConfig()
    p = argparse.ArgumentParser(
        prog=prog,
        description="Collect real data, train a world model, plan in it, evaluate in the real env, export.",
    )
    from .cli import path_arg

    p.add_argument("--out", default=d.out, type=path_arg, help="output directory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--tiny", action="store_true", help="tiny sizes for a smoke run (CI); explicit flags still apply")
    p.add_argument("--no-video", action="store_true", help="do not write the MP4")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    p.add_argument("--env", dest="env_id", default=d.env_id, choices=ENV_IDS, help="default: %(default)s")
    p.add_argument("--planner", choices=PLANNERS, help=f"default: {d.planner}")
    tiny = QuickstartConfig.tiny()
    for name in _SIZE_FLAGS:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, metavar="N",
                       help=f"default: {getattr(d, name)} (--tiny: {getattr(tiny, name)})")
    p.add_argument("--threads", type=int, metavar="N",
                   help=f"torch intra-op threads, 0 for torch's default (default: {d.threads})")
    args = p.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items()
                 if v is not None and k not in ("tiny", "no_video", "no_plot", "progress")}
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    overrides.update(video=not args.no_video, plot=not args.no_plot, progress=progress)
    cfg = QuickstartConfig.tiny(**overrides) if args.tiny else QuickstartConfig(**overrides)
    try:  # usage errors (exit 2) before any work: run()'s own check, naming the flags
        _check_config(cfg, _flag)
    except (TypeError, ValueError) as err:
        p.error(str(err))
    return cfg


def main(argv: Sequence[str] | None = None, prog: str = "python -m torchrl_swm.quickstart") -> int:
    run(parse_args(argv, prog))
    return 0


if __name__ == "__main__":
    sys.exit(main())
