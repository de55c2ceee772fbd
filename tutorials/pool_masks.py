"""EnvPool with masks: partial resets, frozen envs, exact terminal observations, infos, seeds.

Run: python tutorials/pool_masks.py

An EnvPool is N gymnasium envs behind one TorchRL env with batch size [N].
This script walks through what the pool writes into each TensorDict and how
TorchRL's per-env masks drive it.
"""

import gymnasium as gym
import torch
from tensordict import TensorDict

from torchrl_swm import EnvPool

# --- 1. A pool from a registered id ------------------------------------------------------
# Every output is a TensorDict of batch [N]; Discrete actions are Categorical indices.
pool = EnvPool("CartPole-v1", num_envs=4, seed=0)
print(pool.action_spec)  # Categorical, shape (4,)
td = pool.reset()
print("reset keys:", sorted(td.keys()))
# "episode_seed" is the seed of each env's current episode: set_seed(s) gives env i s + i.
print("episode seeds:", td["episode_seed"].view(-1).tolist())

# --- 2. Terminal observations are exact ---------------------------------------------------
# The pool never auto-resets inside a step. step_and_maybe_reset returns the true
# terminal observation under ("next", "observation") and the reset observation at the
# root of the next step: what TorchRL collectors and rollouts expect.
actions = torch.Generator().manual_seed(0)  # seeded: the same episode ends every run
for t in range(500):
    td["action"] = torch.randint(0, 2, (4,), generator=actions)
    transition, td = pool.step_and_maybe_reset(td)
    done = transition["next", "done"].view(-1)
    if done.any():
        i = int(done.nonzero()[0])
        cart, angle = transition["next", "observation"][i, [0, 2]].tolist()
        why = "the pole fell past 0.209 rad" if abs(angle) > 0.2095 else "the cart left the track (|x| > 2.4)"
        print(f"step {t}: env {i} ended, {why}: terminal cart {cart:+.2f}, angle {angle:+.3f} rad;"
              f" next obs starts over at angle {td['observation'][i, 2]:+.3f}")
        break

# --- 3. Partial reset with "_reset" -------------------------------------------------------
# A bool (N, 1) mask resets only those rows; the other envs are not touched at all.
before = td["observation"].clone()
td = pool.reset(td.update(TensorDict({"_reset": torch.tensor([[False], [True], [False], [False]])}, [4])))
print("rows that changed after resetting env 1:", (td["observation"] != before).any(-1).nonzero().view(-1).tolist())

# --- 4. Partial step with "_step": frozen envs are not stepped ----------------------------
# rollout(..., break_when_all_done=True) sends this mask itself; here by hand.
td["action"] = torch.ones(4, dtype=torch.int64)
td["_step"] = torch.tensor([[True], [False], [True], [False]])
out = pool.step(td)["next"]
print("reward of frozen envs is 0:", out["reward"].view(-1).tolist())
print("frozen envs keep their observation:", torch.equal(out["observation"][[1, 3]], td["observation"][[1, 3]]))
pool.close()

# --- 5. Infos are stacked with a time dim of 1 --------------------------------------------
# Numeric info values land under ("info", key) with shape (N, 1, ...): the (batch, time, ...)
# layout world-model networks expect. Their specs come from the reset and first step of every env.
pool = EnvPool("Pendulum-v1", num_envs=3, seed=0)
rollout = pool.rollout(50, break_when_any_done=False)
print("rollout batch:", tuple(rollout.batch_size), "| observation", tuple(rollout["observation"].shape))


class GoalInfo(gym.Wrapper):
    """Adds an "upright" info to Pendulum (cos of the angle: 1 upright, -1 hanging), to show the info buffers."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["upright"] = float(obs[0])
        return obs, reward, terminated, truncated, info


pool.close()
pool = EnvPool([lambda: GoalInfo(gym.make("Pendulum-v1"))] * 3, seed=0)
rollout = pool.rollout(20, break_when_any_done=False)
print("info 'upright':", tuple(rollout["next", "info", "upright"].shape), "= (N, T, 1)")
# Reset infos lack "upright", so the pool records where it was reported, as gymnasium's
# vector infos do with "_upright": ("info_mask", key) is False on reset rows, where the value reads 0.
print("reported at reset / after a step:", rollout["info_mask", "upright"][0, 0].item(),
      rollout["next", "info_mask", "upright"][0, 0].item())
pool.close()

# --- 6. A batched gymnasium VectorEnv is a native path ------------------------------------
# Any autoreset mode works, including gymnasium's default NEXT_STEP: no ghost transitions.
venv = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point")
pool = EnvPool(venv, seed=0)
rollout = pool.rollout(200, break_when_any_done=False)
print("vector pool: episodes ended", int(rollout["next", "done"].sum()), "| every reward is 1 (no ghost steps):",
      bool((rollout["next", "reward"] == 1).all()))
pool.close()
