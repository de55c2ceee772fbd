"""A learned world model as a batched TorchRL env: adapters, return forms, transforms, resets, collectors.

Run: python tutorials/world_model_env.py        (a few seconds on a laptop CPU)

WorldModelEnv turns any model into a TorchRL env with batch size [num_envs]: the model
is called once per step for the whole batch, its latent state stays on the env (on the
model's device), and steps run under torch.no_grad() unless you ask for gradients.
make_world_model_env adds the seed design's extras (action adapter, reward/terminal
adapters, time limit, decoder) as TorchRL transforms you can swap.
"""

import logging

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import RewardSum
from torchrl.envs.utils import check_env_specs

from torchrl_swm import WorldModelEnv, make_env, make_world_model_env

torch.manual_seed(0)
logging.getLogger("torchrl").setLevel(logging.WARNING)  # no "check_env_specs succeeded!" lines in the output

# --- 1. A model and the env --------------------------------------------------------------------
# Any object works. This one has a `step(state, action, generator=None)` method, which the env
# finds by itself (discovery order: env_step, step, predict_step, predict, imagine_step,
# transition, __call__). It returns the seed design's mapping form.
LATENT, ACTION = 8, 2


class TinyWorldModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.dynamics = nn.Linear(LATENT + ACTION, LATENT)
        self.reward_head = nn.Linear(LATENT, 1)

    def step(self, state, action, generator=None):
        noise = torch.randn(state.shape, generator=generator, device=state.device)  # the env's seeded generator
        nxt = torch.tanh(self.dynamics(torch.cat([state, action], -1)) + 0.05 * noise)
        return {"state": nxt, "reward": self.reward_head(nxt), "terminated": nxt[:, 0] < -0.43}

    def encode(self, obs):  # used for real observations (initial_observation, start_states)
        return torch.tanh(obs)


model = TinyWorldModel()
latent_space = gym.spaces.Box(-1.0, 1.0, (LATENT,), np.float32)
force_space = gym.spaces.Box(-1.0, 1.0, (ACTION,), np.float32)
env = WorldModelEnv(model, latent_space, force_space, num_envs=16, initial_state=torch.zeros(LATENT), seed=0)
print(env)  # shows how the transition is called
check_env_specs(env)
rollout = env.rollout(50, break_when_any_done=False)  # rows that terminate restart; the others keep going
print(
    "rollout", tuple(rollout.batch_size), "dones:", int(rollout["next", "done"].sum()), "keys:", sorted(rollout.keys())
)

# --- 2. Adapters: with or without the model, decided once from the signature ---------------------
# transition_fn(model, state, action) and transition_fn(state, action) are both fine; so are
# action_transform_fn(model, action) / action_transform_fn(action), reward_fn, terminal_fn.


def transition(state, action):  # no model argument, no reward: reward_fn fills it in
    return {"state": model.step(state, action)["state"]}


def one_hot(action):  # the policy picks one of 4 discrete moves; the model wants 2-d forces
    moves = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    return moves[action]


wm = make_world_model_env(
    model,
    observation_space=latent_space,
    action_space=gym.spaces.Discrete(4),  # what the policy sees
    num_envs=16,
    initial_state=torch.zeros(LATENT),
    transition_fn=transition,
    action_transform_fn=one_hot,  # an inverse TorchRL transform on "action"
    reward_fn=lambda model, state, obs, action: -obs.pow(2).sum(-1),
    terminal_fn=lambda state, obs, action: obs[:, 1] > 0.9,
    max_episode_steps=20,  # TorchRL's StepCounter
    transforms=[RewardSum()],  # and any TorchRL transform you like
    seed=0,
)
print("transforms:", [type(t).__name__ for t in wm.transform])
print(
    "policy action spec:",
    wm.action_spec.__class__.__name__,
    tuple(wm.action_spec.shape),
    "| model action spec:",
    tuple(wm.base_env.action_spec.shape),
)
rollout = wm.rollout(45, break_when_any_done=False)
print("time-limit truncations:", int(rollout["next", "truncated"].sum()), "of", rollout.numel(), "steps")

# --- 3. Return forms --------------------------------------------------------------------------
# Every form of the seed design is accepted: (obs, reward, terminated, truncated, info),
# (obs, reward, done, info), (state, obs, reward), (state, obs, reward, terminated, truncated,
# info), mappings, and lists read like tuples. A dict *state* (no reserved key) is a state:
# here an RSSM-style {"deter", "stoch"} latent, returned bare, advances as it should.


def rssm_step(state, action):
    deter = torch.tanh(state["deter"] + action.sum(-1, keepdim=True))
    return {"deter": deter, "stoch": state["stoch"] * 0.5 + deter[:, :2]}


rssm_obs = gym.spaces.Dict(
    {"deter": gym.spaces.Box(-1, 1, (4,), np.float32), "stoch": gym.spaces.Box(-5, 5, (2,), np.float32)}
)
rssm = WorldModelEnv(
    object(),
    rssm_obs,
    force_space,
    num_envs=4,
    transition_fn=rssm_step,
    initial_state={"deter": torch.zeros(4), "stoch": torch.zeros(2)},
)
print("RSSM deter over 3 steps:", rssm.rollout(3, break_when_any_done=False)["next", "deter"][0, :, 0].tolist())

# A return that matches no form is an error naming what arrived and what was expected:
broken = WorldModelEnv(
    object(),
    latent_space,
    force_space,
    num_envs=4,
    initial_state=torch.zeros(LATENT),
    transition_fn=lambda s, a: (s, s),
)  # a 2-tuple is no transition form
try:
    broken.rollout(1)
except TypeError as err:
    print("error:", str(err)[:160], "...")

# --- 4. Resets: masks and real data ---------------------------------------------------------------
# "_reset" restarts only the masked rows; the others keep their state.
td = env.reset()
td["action"] = torch.ones(16, ACTION) * 0.3
td = env.step(td)["next"].clone()
before = td["observation"].clone()
mask = torch.zeros(16, 1, dtype=torch.bool)
mask[3] = True
after = env.reset(td.update({"_reset": mask}))  # TorchRL merges the reset rows into td
print("rows changed by a masked reset:", (after["observation"] != before).any(-1).nonzero().view(-1).tolist())

# Episodes can also start from real observations (DIAMOND/IRIS style): a TensorDict or a TorchRL
# replay buffer; each reset row samples one entry (its own hash of the seed, the row and its reset
# count: resetting some rows never changes the others' starts), encoded by model.encode.
real = TensorDictReplayBuffer(storage=LazyTensorStorage(1000))
real.extend(TensorDict({"observation": torch.rand(200, LATENT) * 2 - 1}, [200]))
from_data = WorldModelEnv(model, latent_space, force_space, num_envs=16, start_states=real, seed=0)
start = from_data.reset()
print(
    "start obs come from the buffer:",
    bool(torch.isin(start["observation"][:, 0], real[:]["observation"][:, 0]).all()),
    "| state = encode(obs):",
    torch.allclose(from_data.state, torch.tanh(start["observation"])),
)

# --- 5. Seeds and gradients ---------------------------------------------------------------------------
# The same seed gives the same rollout, the model's own randomness included (it takes `generator=`).
# (TorchRL's random policy, rollout(policy=None), draws from torch's global RNG: use a policy.)
policy = TensorDictModule(nn.Linear(LATENT, ACTION), in_keys=["observation"], out_keys=["action"])
a = WorldModelEnv(model, latent_space, force_space, num_envs=4, initial_state=torch.zeros(LATENT), seed=7)
b = WorldModelEnv(model, latent_space, force_space, num_envs=4, initial_state=torch.zeros(LATENT), seed=7)
same = torch.equal(
    a.rollout(20, policy, break_when_any_done=False)["next", "observation"],
    b.rollout(20, policy, break_when_any_done=False)["next", "observation"],
)
print("same seed, same rollout:", same)

# differentiable=True keeps the graph (Dreamer-style imagination): the return's gradient reaches the policy.
imagine = WorldModelEnv(
    model, latent_space, force_space, num_envs=32, initial_state=torch.full((LATENT,), 0.1), differentiable=True, seed=0
)
actor = TensorDictModule(
    nn.Sequential(nn.Linear(LATENT, ACTION), nn.Tanh()), in_keys=["observation"], out_keys=["action"]
)
trajectory = imagine.rollout(15, actor, break_when_any_done=False)
(-trajectory["next", "reward"].mean()).backward()
print("actor gradient norm:", round(float(actor.module[0].weight.grad.norm()), 4))

# --- 6. Collectors ------------------------------------------------------------------------------------
collector = Collector(env, None, frames_per_batch=16 * 25, total_frames=16 * 50)
for i, batch in enumerate(collector):
    print(f"batch {i}: {tuple(batch.batch_size)}, trajectories: {batch['collector', 'traj_ids'].unique().numel()}")
collector.shutdown()

# --- 7. One factory for pools and models -----------------------------------------------------------------
same_thing = make_env(
    model,
    backend="wm",
    observation_space=latent_space,
    action_space=force_space,
    num_envs=4,
    initial_state=torch.zeros(LATENT),
)
print("make_env(backend='wm') ->", type(same_thing).__name__, "over", type(same_thing.base_env).__name__)
