"""Small world models with known dynamics for the WorldModelEnv tests (importable by spawned workers)."""

from __future__ import annotations

from collections import namedtuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

OBS3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT1 = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


class CountingModel:
    """State = observation = ``[t, episode, last_action]`` (float32, ``(N, 3)``).

    ``step`` adds 1 to ``t``; an episode terminates at ``t == length`` (``length`` may be a
    tensor of per-row lengths). The reward is the action. ``calls`` counts model calls and
    ``batch_sizes`` records the batch of each call (one call per env step, whatever ``N``).
    """

    def __init__(self, length=5, truncate=False):
        self.length = length
        self.truncate = truncate
        self.calls = 0
        self.batch_sizes = []

    def step(self, state, action):
        self.calls += 1
        self.batch_sizes.append(state.shape[0])
        t = state[:, :1] + 1
        nxt = torch.cat([t, state[:, 1:2], action], -1)
        end = t >= torch.as_tensor(self.length, dtype=t.dtype).reshape(-1, 1)
        out = {"state": nxt, "reward": action[:, :1].clone()}
        out["truncated" if self.truncate else "terminated"] = end
        return out


def counting_env(num_envs=4, length=5, **kwargs):
    from torchrl_swm import WorldModelEnv

    kwargs.setdefault("initial_state", torch.zeros(3))
    return WorldModelEnv(CountingModel(length), OBS3, ACT1, num_envs=num_envs, **kwargs)


class NoisyModel(nn.Module):
    """A small MLP latent model with noise drawn from the ``generator`` it is given, and a done head."""

    def __init__(self, latent=4, action=2, seed=0, done_bias=-0.6):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(latent + action, latent, generator=g) * 0.5)
        self.r = nn.Parameter(torch.randn(latent, 1, generator=g) * 0.5)
        self.done_bias = done_bias

    def step(self, state, action, generator=None):
        x = torch.cat([state, action], -1)
        noise = torch.randn(state.shape, generator=generator, device=state.device, dtype=state.dtype)
        nxt = torch.tanh(x @ self.w + 0.3 * noise)
        reward = nxt @ self.r
        return nxt, nxt, reward, (nxt[:, :1] + self.done_bias) > 0, torch.zeros_like(reward, dtype=torch.bool), {}


RSSMState = namedtuple("RSSMState", ["deter", "stoch"])


class RSSMLike(nn.Module):
    """A Dreamer/RSSM-style model: ``imagine_step(prev_state, prev_action, nonterm=1.0)`` returns a dict state."""

    def __init__(self, deter=3, stoch=2, action=1):
        super().__init__()
        self.lin = nn.Linear(deter + stoch + action, deter + stoch)
        self.deter, self.stoch = deter, stoch
        self.seen = []

    def imagine_step(self, prev_state, prev_action, nonterm=1.0):
        self.seen.append(prev_state)
        x = torch.cat([prev_state["deter"], prev_state["stoch"], prev_action], -1)
        y = self.lin(x) + 1.0
        return {"deter": prev_state["deter"] + y[:, : self.deter].abs(), "stoch": y[:, self.deter :]}


class PointMass(nn.Module):
    """Exact 2-D point-mass dynamics: state ``[x, y, vx, vy]``, action = force; reward = -distance to ``goal``."""

    dt = 0.1

    def __init__(self, goal=(1.0, -0.5)):
        super().__init__()
        self.register_buffer("goal", torch.tensor(goal, dtype=torch.float32))

    def forward(self, state, action):
        pos, vel = state[..., :2], state[..., 2:]
        vel = 0.9 * vel + self.dt * action
        pos = pos + self.dt * vel
        return {"state": torch.cat([pos, vel], -1), "reward": -(pos - self.goal).norm(dim=-1, keepdim=True)}


def make_counting_env(num_envs=4, **kwargs):
    """A picklable env factory for multi-process collectors (``kwargs`` go to :class:`WorldModelEnv`)."""
    return counting_env(num_envs, length=torch.tensor([2, 3, 5, 7][:num_envs]), **kwargs)


class EncoderModel(nn.Module):
    """A latent model with a learned encoder: ``encode(obs)`` (2 -> 4), ``step`` and a decoder (4 -> 2).

    With ``noise > 0`` the encoder samples (a posterior draw) from the ``generator`` it is given.
    """

    def __init__(self, noise=0.0, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Linear(2, 4)
        self.dyn = nn.Linear(6, 4)
        self.dec = nn.Linear(4, 2)
        self.noise = noise

    def encode(self, obs, generator=None):
        latent = self.enc(obs)
        if self.noise:
            latent = latent + self.noise * torch.randn(latent.shape, generator=generator, dtype=latent.dtype)
        return latent

    def step(self, state, action):
        nxt = self.dyn(torch.cat([state, action], -1))
        return {"state": nxt, "observation": self.dec(nxt)}
