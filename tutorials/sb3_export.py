"""Stable-Baselines3 PPO on a TorchRL env, through to_sb3_vec_env.

``to_sb3_vec_env`` turns a batched TorchRL env (here an ``EnvPool`` of 8 CartPoles)
into an SB3 ``VecEnv``: same-step autoreset, ``terminal_observation`` and
``TimeLimit.truncated`` in the per-env infos, and working ``env_method``,
``get_attr``, ``set_attr`` and ``seed``. SB3's ``VecMonitor`` records the episodes.

Usage:
    pip install 'torchrl-swm[sb3]'
    python tutorials/sb3_export.py                          # 50k steps
    python tutorials/sb3_export.py --total-timesteps 2048   # a smoke run
"""

import argparse

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecMonitor

from torchrl_swm import EnvPool, to_sb3_vec_env

parser = argparse.ArgumentParser()
parser.add_argument("--env-id", default="CartPole-v1")
parser.add_argument("--num-envs", type=int, default=8)
parser.add_argument("--total-timesteps", type=int, default=50_000)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
torch.set_num_threads(1)  # a small MLP: one thread is fastest on a CPU

# A batched TorchRL env, exported as an SB3 VecEnv. The VecEnv owns the pool.
venv = VecMonitor(to_sb3_vec_env(EnvPool(args.env_id, num_envs=args.num_envs, seed=args.seed)))

# The sub-envs stay reachable the SB3 way.
print("gravity of each sub-env:", venv.get_attr("gravity"))
print("seeds of the next reset:", venv.seed(args.seed))

model = PPO("MlpPolicy", venv, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3, seed=args.seed,
            device="cpu", verbose=0)
model.learn(args.total_timesteps)
train_mean = np.mean([ep["r"] for ep in model.ep_info_buffer]) if model.ep_info_buffer else float("nan")
print(f"mean training episode return (last {len(model.ep_info_buffer)} episodes): {train_mean:.1f}")

returns, _ = evaluate_policy(model, venv, n_eval_episodes=16, deterministic=True, return_episode_rewards=True,
                             warn=False)
print(f"evaluation ({len(returns)} episodes, deterministic): mean return {np.mean(returns):.1f} "
      f"+/- {np.std(returns):.1f}")
venv.close()
