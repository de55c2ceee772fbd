"""Unbiased evaluation: episodes are assigned to envs up front, so short episodes are not favoured.

CountingEnv draws its episode length from the reset seed, so the length of every
episode is known in advance: ``expected_length(seed)``.
"""

import functools

import gymnasium as gym
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


# -- a VectorEnv pool steps every row: World keeps idle rows out of the results ----------------------------------
PER_EPISODE = ("episode_lengths", "episode_returns", "seeds", "env_indices", "episode_terminated", "episode_truncated")


def vector_pool_of(n, max_length, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP):
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, max_length=max_length)] * n,
                                    autoreset_mode=autoreset_mode)
    return EnvPool(venv, seed=0)


def steps_taken(pool):
    return sum(env.unwrapped.steps_called for env in pool._backend.venv.envs)


@pytest.mark.parametrize("autoreset_mode", list(gym.vector.AutoresetMode), ids=lambda m: m.name)
@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
@pytest.mark.parametrize("episodes", [2, 7])
def test_vector_env_pool_runs_exactly_the_planned_episodes(autoreset_mode, reset_mode, episodes):
    n, max_length, seed = 3, 6, 5
    pool = vector_pool_of(n, max_length, autoreset_mode)
    world = World(pool, ones(n))
    assert not world.can_freeze_rows and World(pool_of(1, 2)).can_freeze_rows
    before = steps_taken(pool)
    result = world.evaluate(episodes, seed=seed, reset_mode=reset_mode, progress=False)
    truth = [expected_length(seed + j, max_length) for j in range(episodes)]
    assert result["num_episodes"] == episodes
    assert result["episode_lengths"].tolist() == truth  # idle rows' episodes are never counted
    assert result["episode_returns"].tolist() == truth  # reward 1 per step, from the episode's own rows only
    assert result["seeds"].tolist() == list(range(seed, seed + episodes))
    assert result["env_indices"].tolist() == [j % n for j in range(episodes)]
    assert result["episode_terminated"].all() and not result["episode_truncated"].any()
    # every row was stepped at every World step, and env_steps says so
    assert result["env_steps"] == steps_taken(pool) - before >= sum(truth)
    assert result["env_steps"] % n == 0
    # the same per-episode results as a pool of single envs (that one freezes rows), with a random policy too
    for policy, max_steps in ((ones(n), None), (ones(n), 3), (None, None)):
        world.set_policy(policy)
        got = world.evaluate(episodes, seed=seed, reset_mode=reset_mode, max_steps=max_steps, progress=False)
        ref = World(pool_of(n, max_length), policy).evaluate(episodes, seed=seed, reset_mode=reset_mode,
                                                             max_steps=max_steps, progress=False)
        for key in PER_EPISODE:
            assert np.array_equal(got[key], ref[key]), (key, policy, max_steps)
    pool.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 4),
    episodes=st.integers(0, 10),
    max_length=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(["auto", "wait"]),
    max_steps=st.sampled_from([None, 1, 3]),
)
def test_property_vector_env_pool_matches_a_pool_of_single_envs(n, episodes, max_length, seed, mode, max_steps):
    pool = vector_pool_of(n, max_length)
    got = World(pool).evaluate(episodes, seed=seed, reset_mode=mode, max_steps=max_steps, progress=False)
    ref = World(pool_of(n, max_length)).evaluate(episodes, seed=seed, reset_mode=mode, max_steps=max_steps,
                                                progress=False)
    truth = [min(expected_length(seed + j, max_length), max_steps or max_length) for j in range(episodes)]
    assert got["episode_lengths"].tolist() == truth
    for key in PER_EPISODE:
        assert np.array_equal(got[key], ref[key]), key
    pool.close()


@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
def test_vector_env_pool_collect_stores_only_the_planned_episodes(tmp_path, reset_mode):
    n, max_length, episodes, seed = 3, 6, 7, 5
    truth = [expected_length(seed + j, max_length) for j in range(episodes)]
    datasets = []
    for name, pool in (("vector", vector_pool_of(n, max_length)), ("single", pool_of(n, max_length))):
        world = World(pool, max_episode_steps=max_length)
        datasets.append(world.collect(tmp_path / name, episodes, seed=seed, reset_mode=reset_mode, progress=False))
        pool.close()
    vec, single = datasets
    assert vec.num_episodes == episodes and len(vec) == sum(truth)  # no row of an idle env
    assert vec.episode_lengths.tolist() == truth and vec.episode_seeds.tolist() == list(range(seed, seed + episodes))
    for k in range(episodes):
        ep = vec.episode(k)
        assert ep["step_count"].view(-1).tolist() == list(range(truth[k]))
        assert ep["is_init"][0].item() and not ep["is_init"][1:].any()
        assert ep["next", "done"][-1].item() and not ep["next", "done"][:-1].any()
        assert ep["observation"][:, 0].tolist() == list(range(truth[k]))  # t: from the episode's own reset
    a, b = vec.td.to_tensordict(), single.td.to_tensordict()
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if key in ("observation", ("next", "observation")):
            # column 1 counts the env's resets, which include the idle rows' extra resets: not a seeded quantity
            x, y = x[:, [0, 2]], y[:, [0, 2]]
        assert torch.equal(x, y), key


def test_natively_batched_vector_env_evaluates_in_both_modes():
    # CartPoleVectorEnv: one RNG for the batch, a masked reset adapter, NEXT_STEP autoreset
    venv = gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point")
    world = World(EnvPool(venv, seed=0))
    assert not world.can_freeze_rows
    for mode in ("auto", "wait"):
        result = world.evaluate(7, seed=0, reset_mode=mode, progress=False, max_steps=40)
        assert result["num_episodes"] == 7 and (result["episode_lengths"] >= 1).all()
        assert (result["episode_lengths"] <= 40).all()
        assert result["episode_returns"].tolist() == result["episode_lengths"].astype(float).tolist()
    world.env.close()
