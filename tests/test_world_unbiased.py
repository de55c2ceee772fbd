"""Unbiased evaluation: episodes are assigned to envs up front, so short episodes are not favoured.

CountingEnv draws its episode length from the reset seed, so the length of every
episode is known in advance: ``expected_length(seed)``.
"""

import functools

import numpy as np
import pytest
import torch
from envs import CountingEnv, counting
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrl_swm import EnvPool, World

torch.set_num_threads(1)


def expected_length(seed, max_length):
    env = CountingEnv(max_length=max_length)
    env.reset(seed=seed)
    return env.length


def pool_of(n, max_length, seed=0):
    return EnvPool([functools.partial(counting, max_length=max_length)] * n, seed=seed)


def ones(n):
    return lambda td: td.set("action", torch.ones(n, dtype=torch.int64))


def naive_first_finished(pool, episodes, seed):
    """stable-worldmodel's protocol: auto-reset every env and keep the first ``episodes`` completions."""
    n = pool.num_envs
    td = pool.reset(seed=seed)
    lengths = []
    while len(lengths) < episodes:
        td["action"] = torch.ones(n, dtype=torch.int64)
        step, td = pool.step_and_maybe_reset(td)
        done = step["next", "done"].view(-1)
        for i in torch.nonzero(done).view(-1).tolist():
            lengths.append(int(step["next", "observation"][i, 0]))
    return lengths[:episodes]


def test_world_lengths_are_those_of_the_assigned_seeds_and_naive_sampling_is_biased():
    n, episodes, max_length = 8, 8, 30
    pool = pool_of(n, max_length)
    world = World(pool, ones(n))
    world_means, naive_means, true_means = [], [], []
    for seed in range(0, 400, 8):
        truth = [expected_length(seed + j, max_length) for j in range(episodes)]
        for mode in ("auto", "wait"):
            result = world.evaluate(episodes, seed=seed, reset_mode=mode, progress=False)
            assert result["episode_lengths"].tolist() == truth  # exactly the pre-assigned episodes
            assert result["seeds"].tolist() == list(range(seed, seed + episodes))
        world_means.append(np.mean(truth))
        true_means.append(np.mean(truth))
        naive_means.append(np.mean(naive_first_finished(pool, episodes, seed)))
    assert world_means == true_means
    # completion-order sampling over-represents short episodes: its mean length is far below the truth
    # (expected (1 + 30) / 2 = 15.5 for the true mean)
    assert abs(np.mean(true_means) - 15.5) < 1.5
    assert np.mean(naive_means) < 0.8 * np.mean(true_means)
    pool.close()


def test_more_episodes_than_envs_are_unbiased_too():
    n, episodes, max_length = 4, 24, 20
    pool = pool_of(n, max_length)
    result = World(pool, ones(n)).evaluate(episodes, seed=1000, progress=False)
    truth = [expected_length(1000 + j, max_length) for j in range(episodes)]
    assert result["episode_lengths"].tolist() == truth
    naive = naive_first_finished(pool, episodes, 1000)
    assert np.mean(naive) < np.mean(truth)
    pool.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 5),
    episodes=st.integers(0, 13),
    max_length=st.integers(1, 7),
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(["auto", "wait"]),
)
def test_property_every_assigned_episode_runs_exactly_once(n, episodes, max_length, seed, mode):
    pool = pool_of(n, max_length, seed=0)
    steps0 = [e.steps_called for e in pool.envs]
    resets0 = [e.resets_called for e in pool.envs]
    result = World(pool, ones(n)).evaluate(episodes, seed=seed, reset_mode=mode, progress=False)
    truth = [expected_length(seed + j, max_length) for j in range(episodes)]
    assert result["episode_lengths"].tolist() == truth
    assert result["env_indices"].tolist() == [j % n for j in range(episodes)]
    # every env took exactly the steps and resets of its assigned episodes: frozen envs were never stepped
    for i, env in enumerate(pool.envs):
        mine = [truth[j] for j in range(i, episodes, n)]
        assert env.steps_called - steps0[i] == sum(mine)
        assert env.resets_called - resets0[i] == len(mine)
    assert result["env_steps"] == sum(truth)
    pool.close()


@pytest.mark.parametrize("n", [1, 3, 7])
def test_results_do_not_depend_on_num_envs(n):
    pool = pool_of(n, 12)
    result = World(pool, ones(n)).evaluate(10, seed=42, progress=False)
    assert result["episode_lengths"].tolist() == [expected_length(42 + j, 12) for j in range(10)]
    pool.close()
