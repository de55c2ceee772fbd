"""Model-predictive control with TorchRL's MPPI and CEM planners over a WorldModelEnv.

Run: python tutorials/planner.py        (about 10 s on a laptop CPU)

A planner imagines many action sequences in a model env and executes the first action of
the best ones. TorchRL's planners (torchrl.modules.planners) need a model env that takes any
batch size and reads the start state from the tensordict it is given: that is a WorldModelEnv
with num_envs=None and state_key (here the observation *is* the state). The "real" env is a
batched WorldModelEnv too, over the same exact point-mass dynamics, so the planner has a perfect
model and must reach the goal.
"""

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torchrl.modules.planners import CEMPlanner, MPPIPlanner

from torchrl_swm import WorldModelEnv

torch.manual_seed(0)  # the planners sample candidates from torch's global RNG
GOAL = (1.0, -0.5)


# --- 1. Exact dynamics: a damped point mass pushed by a bounded force -------------------------------
class PointMass(nn.Module):
    """state = [x, y, vx, vy]; action = force in [-1, 1]^2; reward = -distance to the goal."""

    dt = 0.1

    def __init__(self, goal):
        super().__init__()
        self.register_buffer("goal", torch.tensor(goal))

    def forward(self, state, action):  # works for any leading batch dims (the planner adds one)
        pos, vel = state[..., :2], state[..., 2:]
        vel = 0.9 * vel + self.dt * action
        pos = pos + self.dt * vel
        return {"state": torch.cat([pos, vel], -1), "reward": -(pos - self.goal).norm(dim=-1, keepdim=True)}


model = PointMass(GOAL)
state_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
force_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

# --- 2. The model env the planner imagines in ------------------------------------------------------
# num_envs=None: batch-unlocked, any batch size (the planner expands [B] to [B, candidates]).
# state_key="observation": the state comes from the tensordict, so imagination starts where the real env is.
model_env = WorldModelEnv(
    model, state_space, force_space, num_envs=None, state_key="observation", initial_state=torch.zeros(4)
)

# --- 3. The real env: two point masses starting at rest at the origin --------------------------------
real_env = WorldModelEnv(model, state_space, force_space, num_envs=2, initial_state=torch.zeros(4), seed=0)


class ReturnToGo(nn.Module):
    """MPPI scores candidates with an advantage module: here the undiscounted return-to-go."""

    def forward(self, td):
        td["advantage"] = td["next", "reward"].flip(-2).cumsum(-2).flip(-2)
        return td


planners = {
    "MPPI": MPPIPlanner(
        model_env, ReturnToGo(), temperature=1.0, planning_horizon=10, optim_steps=4, num_candidates=64, top_k=8
    ),
    "CEM": CEMPlanner(model_env, planning_horizon=10, optim_steps=4, num_candidates=64, top_k=8),
}

# --- 4. Plan and act --------------------------------------------------------------------------------
for name, planner in planners.items():
    rollout = real_env.rollout(50, planner)  # the planner is the policy
    positions = rollout["next", "observation"][..., :2]
    distance = (positions - torch.tensor(GOAL)).norm(dim=-1)  # [2 envs, 50 steps]
    print(
        f"{name}: distance to goal every 10 steps (env 0):",
        [round(d, 3) for d in distance[0, ::10].tolist()],
        f"final: {distance[:, -1].tolist()}",
    )
    assert (distance[:, -1] < 0.1).all(), f"{name} should reach the goal"
print("both planners reached the goal")
