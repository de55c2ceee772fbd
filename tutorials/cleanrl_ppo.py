"""CleanRL's PPO (ppo.py), unchanged in its loop, on a TorchRL env exported with to_gymnasium.

The training loop below is CleanRL's single-file PPO
(https://docs.cleanrl.dev/rl-algorithms/ppo/#ppopy), top to bottom: it only talks to
a gymnasium vector env through ``envs.single_observation_space``,
``envs.single_action_space``, ``envs.reset(seed=...)`` and
``envs.step(action.cpu().numpy())``. Three things differ from CleanRL: episode
statistics are read from gymnasium 1.x's ``infos["episode"]`` / ``infos["_episode"]``
(CleanRL's ppo.py reads the pre-1.0 ``infos["final_info"]``), the agent gains a Gaussian
head for ``--env-id world-model``, and the line that builds ``envs`` (plus one torch thread, set
with the seeds: small MLPs only contend for more on a CPU): instead of
``gym.vector.SyncVectorEnv([...])`` it is

    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=args.num_envs, seed=args.seed),
                        autoreset_mode="same_step")

a batched TorchRL env exported as a gymnasium ``VectorEnv``. SAME_STEP autoreset, because
CleanRL's loop was written for gymnasium's pre-1.0 vector envs, which reset an env in the
step it finishes: under NEXT_STEP (gymnasium 1.x's default) the step after each episode
end is the reset, and this loop would store it as a transition (reward 0, its action
ignored) and train on it. Episode statistics come from gymnasium's vector
``RecordEpisodeStatistics`` wrapper.

``--env-id world-model`` runs the same loop on a learned world model (the package's
``WorldModelEnv`` over a small MLP, continuous actions): the agent then uses a
Gaussian policy head and the envs clip its actions to the Box with gymnasium's
``ClipAction`` wrapper, as CleanRL's ppo_continuous_action.py does (the buffer keeps the
raw sample, so its log-prob stays right; the model never sees an action outside the
``[-1, 1]`` it was trained on).

Usage:
    python tutorials/cleanrl_ppo.py                            # CartPole, 100k steps (~1 min CPU)
    python tutorials/cleanrl_ppo.py --total-timesteps 2048     # a smoke run
    python tutorials/cleanrl_ppo.py --env-id world-model --total-timesteps 4096
"""

import argparse
import random
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical
from torch.distributions.normal import Normal

from torchrl_swm import EnvPool, to_gymnasium


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--torch-deterministic", type=int, default=1)
    parser.add_argument("--cuda", type=int, default=0, help="use CUDA for the agent when available")
    parser.add_argument("--env-id", type=str, default="CartPole-v1", help="a gymnasium id, or 'world-model'")
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--learning-rate", type=float, default=2.5e-4)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--anneal-lr", type=int, default=1)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--norm-adv", type=int, default=1)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--clip-vloss", type=int, default=1)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--target-kl", type=float, default=None)
    args = parser.parse_args()
    for flag in ("total_timesteps", "num_envs", "num_steps", "num_minibatches"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.num_envs * args.num_steps % args.num_minibatches:  # a last, smaller minibatch: NaN advantages at 1
        parser.error(f"--num-minibatches {args.num_minibatches} must divide the batch, --num-envs x --num-steps "
                     f"= {args.num_envs * args.num_steps}")
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)
    return args


def world_model_env(args):
    """A learned world model as a batched env. Here the model is a small MLP ``(latent, action) -> (next latent,
    reward, done logit)`` with random weights; put yours in its place, and say how it steps and how an episode
    starts: ``transition_fn`` returns a mapping (or any of the tuple forms), ``reset_fn`` each episode's
    first state."""
    from torchrl_swm import WorldModelEnv
    from torchrl_swm.benchmarks.export import ACT, LAT, make_model

    def transition(model, state, action):
        latent, reward, done_logit = model(state, action)
        return {"state": latent, "observation": latent, "reward": reward, "terminated": done_logit > 0}

    def reset(model, seed, options, num_envs, generator):  # the env's generator: seeded episodes
        return torch.tanh(torch.randn(num_envs, LAT, generator=generator)) * 0.1

    return WorldModelEnv(
        make_model(seed=args.seed),
        observation_space=gym.spaces.Box(-1.0, 1.0, (LAT,), np.float32),
        action_space=gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32),
        num_envs=args.num_envs, transition_fn=transition, reset_fn=reset, seed=args.seed,
    )


def make_envs(args):
    """The one line that differs from CleanRL: a TorchRL env exported to gymnasium."""
    if args.env_id == "world-model":
        env = world_model_env(args)
    else:
        env = EnvPool(args.env_id, num_envs=args.num_envs, seed=args.seed)
    envs = to_gymnasium(env, autoreset_mode="same_step")
    if isinstance(envs.single_action_space, gym.spaces.Box):  # as CleanRL's ppo_continuous_action.py
        envs = gym.wrappers.vector.ClipAction(envs)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        obs_dim = int(np.array(envs.single_observation_space.shape).prod())
        self.discrete = isinstance(envs.single_action_space, gym.spaces.Discrete)
        act_dim = envs.single_action_space.n if self.discrete else int(np.prod(envs.single_action_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        out = self.actor(x)
        if self.discrete:
            probs = Categorical(logits=out)
            if action is None:
                action = probs.sample()
            return action, probs.log_prob(action), probs.entropy(), self.critic(x)
        probs = Normal(out, self.actor_logstd.expand_as(out).exp())
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


if __name__ == "__main__":
    args = parse_args()

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = bool(args.torch_deterministic)
    # small MLPs on a CPU: one intra-op thread (several only contend, ~8x slower on a busy 2-core machine)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = make_envs(args)
    assert isinstance(envs.single_action_space, (gym.spaces.Discrete, gym.spaces.Box)), "unsupported action space"

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    episode_returns = deque(maxlen=20)
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

            if "episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    episode_returns.append(float(infos["episode"]["r"][i]))

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                mb_actions = b_actions.long()[mb_inds] if agent.discrete else b_actions[mb_inds]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], mb_actions)
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        if episode_returns:
            sps = int(global_step / (time.time() - start_time))
            print(f"global_step={global_step} mean_return_last_20={np.mean(episode_returns):.1f} SPS={sps}")

    envs.close()
    final = float(np.mean(episode_returns)) if episode_returns else float("nan")
    print(f"final mean_return_last_20={final:.2f} episodes={len(episode_returns)}")
