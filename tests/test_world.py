"""World.evaluate: auto/wait semantics on counting envs, seeds, success, limits, policies, results."""

import functools
import json
import math
import sys
import types
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, DictObsEnv, assert_reaped, counting
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.envs import TransformedEnv

from torchrl_swm import EnvPool, History, World
from torchrl_swm.world import EvalResult, RandomPolicy

torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention on shared CI cores


def ones(n):
    return lambda td: td.set("action", torch.ones(n, dtype=torch.int64))


class StepSpy:
    """A policy that records, before every World step, how many gymnasium steps each env has taken."""

    def __init__(self, pool, action=1):
        self.pool, self.action, self.calls, self.tds = pool, action, [], []

    def __call__(self, td):
        self.calls.append([env.steps_called for env in self.pool.envs])
        self.tds.append(td.clone())
        return td.set("action", torch.full((self.pool.num_envs,), self.action, dtype=torch.int64))

    def stepped(self):
        """(iterations, N) bool: which envs were stepped at each World step."""
        counts = np.array(self.calls + [[env.steps_called for env in self.pool.envs]])
        return np.diff(counts, axis=0) > 0


def fixed_length_pool(lengths, seed=0):
    return EnvPool([functools.partial(counting, length=n) for n in lengths], seed=seed)


# -- auto and wait: exactly which envs are stepped --------------------------------------------------------------
def test_auto_mode_steps_each_env_exactly_its_assigned_episodes():
    lengths = [2, 5, 3]
    pool = fixed_length_pool(lengths)
    spy = StepSpy(pool)
    world = World(pool, spy)
    result = world.evaluate(6, seed=0, reset_mode="auto", progress=False)
    # episode j runs on env j % 3; env i runs 2 episodes of lengths[i], back to back, then is frozen
    assert result["env_indices"].tolist() == [0, 1, 2, 0, 1, 2]
    assert result["episode_lengths"].tolist() == [2, 5, 3, 2, 5, 3]
    stepped = spy.stepped()
    assert stepped.shape == (10, 3)  # the longest env needs 2 * 5 steps
    for i, length in enumerate(lengths):
        assert stepped[:, i].tolist() == [k < 2 * length for k in range(10)], f"env {i}"
    assert [env.steps_called for env in pool.envs] == [1 + 2 * n for n in lengths]  # +1: the pool's probe step
    assert [env.resets_called for env in pool.envs] == [1 + 2] * 3  # probe + 2 episodes
    assert result["env_steps"] == 2 * sum(lengths)
    pool.close()


def test_wait_mode_freezes_finished_envs_until_the_round_ends():
    lengths = [2, 5, 3]
    pool = fixed_length_pool(lengths)
    spy = StepSpy(pool)
    result = World(pool, spy).evaluate(6, seed=0, reset_mode="wait", progress=False)
    stepped = spy.stepped()
    assert stepped.shape == (10, 3)  # two rounds of max(lengths) = 5 steps
    for i, length in enumerate(lengths):
        assert stepped[:, i].tolist() == [(k % 5) < length for k in range(10)], f"env {i}"
    # within a round, a finished env is frozen: it is never stepped past its end
    assert [env.steps_called for env in pool.envs] == [1 + 2 * n for n in lengths]
    assert result["episode_lengths"].tolist() == [2, 5, 3, 2, 5, 3]
    # the second round starts only once every env has finished: all resets happen at the same World step
    is_init = np.array([td["is_init"].view(-1).tolist() for td in spy.tds])
    assert np.flatnonzero(is_init.all(1)).tolist() == [0, 5]
    assert is_init.sum() == 6
    pool.close()


def test_wait_mode_partial_last_round_leaves_spare_envs_untouched():
    pool = fixed_length_pool([3, 3, 3, 3])
    resets_before = [env.resets_called for env in pool.envs]
    steps_before = [env.steps_called for env in pool.envs]
    result = World(pool, ones(4)).evaluate(5, seed=0, reset_mode="wait", progress=False)
    assert result["env_indices"].tolist() == [0, 1, 2, 3, 0]
    assert [e.steps_called - s for e, s in zip(pool.envs, steps_before)] == [6, 3, 3, 3]
    assert [e.resets_called - r for e, r in zip(pool.envs, resets_before)] == [2, 1, 1, 1]
    pool.close()


def test_fewer_episodes_than_envs_never_touches_the_spare_envs():
    pool = fixed_length_pool([4] * 5)
    before = [(e.steps_called, e.resets_called) for e in pool.envs]
    for mode in ("auto", "wait"):
        World(pool, ones(5)).evaluate(2, seed=0, reset_mode=mode, progress=False)
    after = [(e.steps_called, e.resets_called) for e in pool.envs]
    assert after[2:] == before[2:]
    assert after[0] == (before[0][0] + 8, before[0][1] + 2)
    pool.close()


@pytest.mark.parametrize("mode", ["auto", "wait"])
def test_is_init_marks_exactly_the_first_step_of_each_episode(mode):
    pool = fixed_length_pool([2, 3])
    spy = StepSpy(pool)
    World(pool, spy).evaluate(4, seed=0, reset_mode=mode, progress=False)
    obs_t = np.array([td["observation"][:, 0].tolist() for td in spy.tds])
    is_init = np.array([td["is_init"].view(-1).tolist() for td in spy.tds])
    stepped = spy.stepped()
    # is_init is True exactly where a stepped env is at t == 0
    assert np.array_equal(is_init & stepped, (obs_t == 0) & stepped)
    pool.close()


def test_works_without_a_prior_reset_and_ignores_leftover_state():
    pool = fixed_length_pool([6, 6])
    world = World(pool, ones(2))
    first = world.evaluate(2, seed=0, max_steps=4, progress=False)  # cut mid-episode: envs left at t = 4
    assert first["episode_lengths"].tolist() == [4, 4] and first["episode_truncated"].all()
    second = world.evaluate(2, seed=0, progress=False)  # starts fresh episodes, not the leftover ones
    assert second["episode_lengths"].tolist() == [6, 6]
    assert second["episode_terminated"].all() and not second["episode_truncated"].any()
    pool.close()


def test_fresh_world_from_id_evaluates_without_reset():
    with World("CartPole-v1", num_envs=3) as world:
        result = world.evaluate(4, seed=1, progress=False)
    assert result["num_episodes"] == 4 and (result["episode_lengths"] > 0).all()


# -- seeds and reproducibility -------------------------------------------------------------------------------
def test_same_seed_same_results_random_policy():
    world = World("CartPole-v1", num_envs=4)
    a = world.evaluate(10, seed=7, progress=False)
    b = world.evaluate(10, seed=7, progress=False)
    c = world.evaluate(10, seed=8, progress=False)
    for key in ("episode_returns", "episode_lengths", "seeds"):
        assert np.array_equal(a[key], b[key]), key
    assert not np.array_equal(a["episode_lengths"], c["episode_lengths"])
    assert a["seeds"].tolist() == list(range(7, 17))
    world.close()


def balance(td):
    """A deterministic CartPole policy that depends only on the observation."""
    obs = td["observation"]
    return td.set("action", ((obs[:, 2] + 0.5 * obs[:, 3]) > 0).long())


def test_auto_wait_and_num_envs_give_identical_per_episode_results():
    results = []
    for n, mode in [(3, "auto"), (3, "wait"), (5, "auto"), (1, "wait")]:
        with World("CartPole-v1", num_envs=n, policy=balance, max_episode_steps=120) as world:
            results.append(world.evaluate(7, seed=11, reset_mode=mode, progress=False))
    ref = results[0]
    for other in results[1:]:
        for key in ("episode_returns", "episode_lengths", "seeds", "episode_terminated", "episode_truncated"):
            assert np.array_equal(ref[key], other[key]), key
    assert ref["seeds"].tolist() == list(range(11, 18))


def test_unseeded_runs_record_unique_seeds_that_replay_each_episode():
    pool = EnvPool([functools.partial(counting, max_length=9)] * 3)
    world = World(pool, ones(3))
    a = world.evaluate(6, progress=False)
    b = world.evaluate(6, progress=False)
    for result in (a, b):
        seeds = result["seeds"]
        assert len(set(seeds.tolist())) == 6
        assert result["seed"] == seeds[0]
        # each reported seed reproduces the reported episode length
        assert result["episode_lengths"].tolist() == [expected_length(int(s)) for s in seeds]
    assert a["seed"] != b["seed"]
    pool.close()


def expected_length(seed, max_length=9):
    env = CountingEnv(max_length=max_length)
    env.reset(seed=seed)
    return env.length


def test_seed_validation():
    world = World(fixed_length_pool([2]), ones(1))
    for bad, error in ((-1, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)):
        with pytest.raises(error, match="seed: expected an int"):
            world.evaluate(1, seed=bad, progress=False)
    for good in (np.int64(3), np.array(3), torch.tensor(3)):  # the integer forms EnvPool takes
        assert world.evaluate(1, seed=good, progress=False)["seeds"].tolist() == [3]


# -- success, returns, lengths -------------------------------------------------------------------------------
def test_random_cartpole_has_no_success_rate_not_100_percent():
    """Regression: stable-worldmodel scored a random CartPole policy 100% because success meant terminated."""
    with World("CartPole-v1", num_envs=4) as world:
        result = world.evaluate(8, seed=0, progress=False)
    assert result["episode_terminated"].any()
    assert result["success_rate"] is None
    assert result["episode_successes"] is None and result["steps_to_success"] is None
    assert result["success_source"] is None
    assert "n/a" in result.summary()


class TerminatesOnFailure(gym.Env):
    """Terminates at step 3 with is_success False (a failure), or succeeds at step 2 when seeded odd."""

    key = "is_success"

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.good = 0, bool(seed is not None and seed % 2)
        return np.zeros(1, np.float32), {self.key: False}

    def step(self, action):
        self.t += 1
        success = self.good and self.t >= 2
        return np.zeros(1, np.float32), 1.0, self.t >= 3, False, {self.key: success}


class TerminatesOnFailureSaysSuccess(TerminatesOnFailure):
    key = "success"


@pytest.mark.parametrize("env", [TerminatesOnFailure, TerminatesOnFailureSaysSuccess])
def test_success_comes_from_info_not_terminated(env):
    # info["is_success"] (gymnasium-robotics') or info["success"] (review R6: the second was never tested)
    pool = EnvPool([env] * 2, seed=0)
    result = World(pool).evaluate(6, seed=0, progress=False)
    assert result["episode_terminated"].all()
    assert result["episode_successes"].tolist() == [False, True] * 3
    assert result["success_rate"] == pytest.approx(0.5)
    assert np.isnan(result["steps_to_success"][0::2]).all()
    assert result["steps_to_success"][1::2].tolist() == [2.0] * 3
    assert result["success_source"] == f"info/{env.key}"
    assert result["start_successes"].tolist() == [False] * 6
    lo, hi = result["success_ci"]
    assert 0 < lo < 0.5 < hi < 1
    pool.close()


@pytest.mark.parametrize("success, expected", [(None, (0.1876, 0.8124)), (False, (0.0, 0.3903)),
                                               (True, (0.6097, 1.0))])
def test_success_ci_is_the_wilson_score_interval(success, expected):
    # reference Wilson 95% intervals for 3/6, 0/6 and 6/6 (with the z^2/(4n^2) term of the half-width)
    pool = EnvPool([TerminatesOnFailure] * 2, seed=0)
    success_fn = None if success is None else (lambda td: torch.full((2,), success))
    result = World(pool).evaluate(6, seed=0, success_fn=success_fn, progress=False)
    assert int(result["episode_successes"].sum()) == {None: 3, False: 0, True: 6}[success]
    assert result["success_ci"] == pytest.approx(expected, abs=1e-4)
    pool.close()


def test_success_fn_overrides_and_reports_steps_to_success():
    pool = EnvPool([functools.partial(counting, max_length=9)] * 3, seed=0)
    result = World(pool, ones(3)).evaluate(9, seed=5, success_fn=lambda td: td["next", "observation"][:, 0] >= 4,
                                           progress=False)
    lengths = result["episode_lengths"]
    assert result["episode_successes"].tolist() == (lengths >= 4).tolist()
    assert np.array_equal(result["steps_to_success"][lengths >= 4], np.full((lengths >= 4).sum(), 4.0))
    assert np.isnan(result["steps_to_success"][lengths < 4]).all()
    assert result["success_source"] == "success_fn"
    pool.close()


def test_success_fn_bad_output():
    pool = fixed_length_pool([3, 3])
    world = World(pool, ones(2))
    with pytest.raises(TypeError, match="bool"):
        world.evaluate(2, seed=0, success_fn=lambda td: td["next", "reward"], progress=False)
    with pytest.raises(ValueError, match="2 flags"):
        world.evaluate(2, seed=0, success_fn=lambda td: torch.ones(3, dtype=torch.bool), progress=False)
    for returned, what in ((None, "None"), ("yes", "str 'yes'"), ([[True], [True, False]], "list")):
        with pytest.raises(TypeError, match=rf"success_fn must return a bool tensor of shape \(2,\) or \(2, 1\), "
                                            rf"got {what}"):
            world.evaluate(2, seed=0, success_fn=lambda td, returned=returned: returned, progress=False)
    pool.close()


def test_returns_and_lengths_per_episode():
    pool = EnvPool([functools.partial(counting, max_length=6)] * 2, seed=0)
    result = World(pool, lambda td: td.set("action", torch.full((2,), 2, dtype=torch.int64))).evaluate(
        5, seed=3, progress=False
    )
    assert result["episode_lengths"].tolist() == [expected_length(3 + j, 6) for j in range(5)]
    assert np.array_equal(result["episode_returns"], 2.0 * result["episode_lengths"])  # reward = action
    assert result["episode_returns"].dtype == np.float64 and result["episode_lengths"].dtype == np.int64
    pool.close()


def test_already_solved_start_states_are_reported():
    class SolvedAtReset(TerminatesOnFailure):
        def reset(self, *, seed=None, options=None):
            obs, _ = super().reset(seed=seed)
            return obs, {"is_success": True}

    pool = EnvPool([SolvedAtReset] * 2, seed=0)
    result = World(pool).evaluate(2, seed=0, progress=False)
    assert result["start_successes"].all()
    assert "already successful at reset" in result.summary()
    pool.close()


# -- step limits ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "wait"])
def test_max_steps_truncates_and_frozen_envs_are_not_stepped_past_it(mode):
    pool = fixed_length_pool([50, 2])
    before = [e.steps_called for e in pool.envs]
    result = World(pool, ones(2)).evaluate(4, seed=0, max_steps=7, reset_mode=mode, progress=False)
    assert result["episode_lengths"].tolist() == [7, 2, 7, 2]
    assert result["episode_truncated"].tolist() == [True, False, True, False]
    assert result["episode_terminated"].tolist() == [False, True, False, True]
    assert [e.steps_called - b for e, b in zip(pool.envs, before)] == [14, 4]
    pool.close()


def test_an_episode_terminating_on_worlds_limit_step_is_truncated_too_as_under_a_time_limit(tmp_path):
    # gymnasium's TimeLimit and TorchRL's StepCounter report both flags then; so does World's own cut
    from torchrl.envs import StepCounter

    flags = []
    for make, max_steps in (
        (lambda: EnvPool([functools.partial(counting, length=3)] * 2, seed=0), 3),
        (lambda: EnvPool([lambda: gym.wrappers.TimeLimit(CountingEnv(length=3), 3)] * 2, seed=0), None),
        (lambda: TransformedEnv(EnvPool([functools.partial(counting, length=3)] * 2, seed=0), StepCounter(3)), None),
    ):
        with World(make(), ones(2)) as world:
            result = world.evaluate(2, seed=0, max_steps=max_steps, progress=False)
            ds = world.collect(tmp_path / f"ds{len(flags)}", 2, seed=0, max_steps=max_steps or 3, progress=False)
        last = ds.episode_starts + ds.episode_lengths - 1
        flags.append((result["episode_terminated"].tolist(), result["episode_truncated"].tolist(),
                      ds.td["next", "terminated"][last].view(-1).tolist(), ds.td["next", "truncated"][last].view(-1).tolist()))
    assert flags == [([True, True], [True, True], [True, True], [True, True])] * 3


def test_world_max_episode_steps_default_and_gym_timelimit():
    pool = fixed_length_pool([50])
    assert World(pool, ones(1), max_episode_steps=5).evaluate(1, seed=0, progress=False)["episode_lengths"][0] == 5
    with World("CartPole-v1", num_envs=2, policy=balance, max_episode_steps=12) as world:
        result = world.evaluate(2, seed=0, progress=False)
    assert result["episode_lengths"].tolist() == [12, 12] and result["episode_truncated"].all()
    pool.close()


def test_reported_step_limit_is_the_effective_one(tmp_path):
    # World(max_episode_steps=10) from an id makes 10 the env's TimeLimit: a larger max_steps cannot lift it
    with World("CartPole-v1", num_envs=2, policy=balance, max_episode_steps=10) as world:
        result = world.evaluate(4, seed=0, max_steps=20, progress=False)
        assert result["episode_lengths"].tolist() == [10] * 4
        assert result["max_steps"] == 10 and result["env_time_limit"] == 10
        assert "(step limit 10)" in result.summary()
        assert world.evaluate(2, seed=0, max_steps=5, progress=False)["max_steps"] == 5
        assert world.evaluate(2, seed=0, progress=False)["max_steps"] == 10
        ds = world.collect(tmp_path / "d", 2, seed=0, max_steps=20, progress=False)
        assert ds.metadata["max_steps"] == 10 and ds.episode_lengths.tolist() == [10, 10]
    pool = EnvPool("CartPole-v1", num_envs=2, seed=0)
    result = World(pool, balance, max_episode_steps=30).evaluate(2, seed=0, progress=False)
    assert result["max_steps"] == 30 and result["env_time_limit"] == 500
    assert World(pool, balance).evaluate(2, seed=0, max_steps=600, progress=False)["max_steps"] == 500
    pool.close()
    counting_pool = fixed_length_pool([50])  # no gymnasium spec: World's limit is the only one
    result = World(counting_pool, ones(1)).evaluate(1, seed=0, max_steps=8, progress=False)
    assert result["max_steps"] == 8 and result["env_time_limit"] is None
    counting_pool.close()


@pytest.mark.parametrize("backend", ["serial", "process", "sync_vector"])
def test_a_time_limit_wrapped_by_hand_is_the_envs_step_limit(tmp_path, backend):
    # an env made without gym.make has no spec: its TimeLimit is read from the wrapper itself, so that the
    # results report the limit that cut the episodes and collect sizes its storage from it

    def limited(limit=7):
        return gym.wrappers.TimeLimit(CountingEnv(length=1000), limit)

    if backend == "sync_vector":
        pool = EnvPool(gym.vector.SyncVectorEnv([limited] * 2), seed=0)
    else:
        pool = EnvPool([limited] * 2, seed=0, **({"backend": "process", "num_workers": 2} if backend == "process"
                                                  else {}))
    with pool:
        world = World(pool, ones(2))
        result = world.evaluate(3, seed=0, max_steps=100, progress=False)
        assert result["episode_lengths"].tolist() == [7, 7, 7] and result["episode_truncated"].all()
        assert result["max_steps"] == 7 and result["env_time_limit"] == 7
        assert "(step limit 7)" in result.summary()
        ds = world.collect(tmp_path / "d", 2, seed=0, progress=False)  # no max_steps: the TimeLimit's
        assert ds.metadata["max_steps"] == 7 and ds.episode_lengths.tolist() == [7, 7]


def test_pooled_envs_with_different_hand_wrapped_time_limits_run_each_to_its_own_limit(tmp_path):
    # World's step limit is the largest TimeLimit in the pool: the env with the larger limit must never be cut at
    # the smaller one, in evaluate and in collect, and that larger limit is the one reported
    pool = EnvPool([functools.partial(_limited_counting_env, 1000, limit) for limit in (5, 10)], seed=0)
    with pool:
        world = World(pool, ones(2))
        result = world.evaluate(2, seed=0, progress=False)
        assert result["env_time_limit"] == 10 and result["max_steps"] == 10
        assert result["episode_lengths"].tolist() == [5, 10] and result["episode_truncated"].all()
        ds = world.collect(tmp_path / "d", 2, seed=0, progress=False)
        assert ds.metadata["max_steps"] == 10 and ds.episode_lengths.tolist() == [5, 10]


def test_world_leaves_an_async_vector_pool_without_time_limits_usable():
    # an attribute an AsyncVectorEnv's sub-env lacks shuts its worker down for good (gymnasium 1.4): World must
    # not probe them for a TimeLimit they may not have
    def make():
        return CountingEnv(length=1000)  # no gym.make: no spec, no TimeLimit

    with EnvPool(gym.vector.AsyncVectorEnv([make, make]), seed=0) as pool:
        world = World(pool, ones(2))
        result = world.evaluate(2, seed=0, max_steps=6, progress=False)
        assert result["episode_lengths"].tolist() == [6, 6] and result["env_time_limit"] is None
        assert world.evaluate(2, seed=0, max_steps=4, progress=False)["episode_lengths"].tolist() == [4, 4]


@pytest.mark.parametrize("mode", ["sync", "vector_entry_point"])
def test_a_make_vec_pools_own_time_limit_is_worlds_not_the_registrys(mode):
    # gym.make_vec(..., max_episode_steps=K) keeps the registry's 500 in spec.max_episode_steps: World must run
    # an episode of this policy to its 586-step termination under K=700, and report a limit of 15 under K=15
    for limit, length in [(700, 586), (15, 15)]:
        venv = gym.make_vec("CartPole-v1", 1, vectorization_mode=mode, max_episode_steps=limit)
        with World(EnvPool(venv), policy=lambda td: td.set("action", (td["observation"][:, 2]
                                                                     + 0.3 * td["observation"][:, 3] > 0).long())) as w:
            result = w.evaluate(1, seed=0, progress=False)
        assert result["episode_lengths"].tolist() == [length]
        assert result["episode_terminated"].tolist() == [limit == 700]
        assert result["max_steps"] == limit and result["env_time_limit"] == limit


def test_env_spec_and_metadata_are_read_once_not_per_evaluate(monkeypatch):
    # on a process pool each get_attr is a round trip to a worker
    pool = EnvPool("CartPole-v1", num_envs=2, backend="process", num_workers=2, seed=0)
    try:
        world = World(pool, balance)
        assert world.env_id == "CartPole-v1" and world._step_limit() == 500
        calls = []
        original = pool.get_attr
        monkeypatch.setattr(pool, "get_attr", lambda *a, **k: calls.append(a) or original(*a, **k))
        for _ in range(2):
            world.evaluate(2, seed=0, progress=False)  # the step limit comes from the env's spec
        assert calls == []
    finally:
        pool.close()


# -- a VectorEnv pool (it cannot freeze rows) ---------------------------------------------------------------------
def vector_counting_pool(lengths, **kwargs):
    factories = [functools.partial(counting, length=n, render_mode="rgb_array") for n in lengths]
    return EnvPool(gym.vector.SyncVectorEnv(factories), seed=0, **kwargs)


def test_vector_env_pool_in_auto_and_wait_mode_never_sends_a_step_mask():
    lengths = [2, 5, 3]
    pool = vector_counting_pool(lengths)
    world = World(pool, ones(3))
    assert not world.can_freeze_rows
    assert World(fixed_length_pool(lengths)).can_freeze_rows
    assert World(TransformedEnv(pool)).can_freeze_rows is False  # found through transforms
    for mode in ("auto", "wait"):
        result = world.evaluate(5, seed=0, reset_mode=mode, progress=False)
        assert result["episode_lengths"].tolist() == [2, 5, 3, 2, 5]
        assert result["episode_returns"].tolist() == [2.0, 5.0, 3.0, 2.0, 5.0]
        assert result["env_steps"] == 3 * 10  # every row at each of the 10 World steps (both modes)
    pool.close()


@pytest.mark.parametrize("mode", ["wait", "auto"])
def test_a_vector_env_pool_resets_each_env_once_per_planned_episode(mode):
    # a row that starts its next planned episode (at a round's end in wait mode, at its episode's end in auto
    # mode) gets that episode's reset only, no idle-row reset before it
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, length=2)] * 3)
    with World(EnvPool(venv, seed=0), ones(3)) as world:
        before = [env.resets_called for env in venv.envs]
        result = world.evaluate(9, seed=0, reset_mode=mode, progress=False)
    assert result["episode_lengths"].tolist() == [2] * 9
    assert [env.resets_called - k for env, k in zip(venv.envs, before)] == [3, 3, 3]  # 3 episodes each
    assert [env.last_seed for env in venv.envs] == [6, 7, 8]  # the last planned seeds


def test_vector_env_pool_videos_show_only_the_episodes(tmp_path):
    pytest.importorskip("imageio")
    pytest.importorskip("imageio_ffmpeg")
    from torchrl_swm.video import VideoRecorder

    class Capture(VideoRecorder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.grid, self.added = [], []

        def grid_frame(self, frames, active):
            self.grid.append((frames[..., 0].copy(), active.copy()))  # red channel: CountingEnv's t
            super().grid_frame(frames, active)

        def add_frame(self, env, frame):
            self.added.append((env, int(frame[0, 0, 0])))
            super().add_frame(env, frame)

    lengths = [2, 5, 3]
    captured = []
    for name, pool in (("vector", vector_counting_pool(lengths, pixels=True)),
                       ("single", EnvPool([functools.partial(counting, length=n, render_mode="rgb_array")
                                           for n in lengths], seed=0, pixels=True))):
        grid = Capture(tmp_path / name / "grid", layout="grid")
        episodes = Capture(tmp_path / name / "episodes")
        world = World(pool, ones(3))
        world.evaluate(5, seed=0, reset_mode="wait", video=grid, progress=False)
        result = world.evaluate(5, seed=0, video=episodes, progress=False)
        assert sorted(episodes.frame_counts.values()) == sorted(n + 1 for n in result["episode_lengths"])
        captured.append((grid, episodes))
        pool.close()
    (vec_grid, vec_eps), (ref_grid, ref_eps) = captured
    assert vec_eps.added == ref_eps.added  # one frame per step of each episode, none from idle rows
    assert len(vec_grid.grid) == len(ref_grid.grid) == 12  # two rounds of 5 steps, each with its reset frame
    last = {}
    for (frames, active), (ref_frames, ref_active) in zip(vec_grid.grid, ref_grid.grid):
        assert active.tolist() == ref_active.tolist()
        for i in range(3):
            if active[i]:
                assert np.array_equal(frames[i], ref_frames[i])
                last[i] = frames[i]
            elif i in last:  # an idle row keeps its last frame, although the vector env stepped it
                assert np.array_equal(frames[i], last[i])


# -- policies ------------------------------------------------------------------------------------------------
def test_default_policy_is_random_from_the_action_spec():
    pool = EnvPool([DictObsEnv] * 3, seed=0)
    world = World(pool)
    assert isinstance(world.policy, RandomPolicy)
    seen = []
    world.set_policy(lambda td: seen.append(RandomPolicy(pool.action_spec)(td)["action"].clone()) or td)
    world.evaluate(3, seed=0, progress=False)
    actions = torch.stack(seen)
    assert actions.shape[1:] == (3, 2) and actions.abs().max() <= 1 and actions.std() > 0.1
    world.set_policy(None)
    assert isinstance(world.policy, RandomPolicy)
    pool.close()


def test_tensordict_module_policy_and_out_of_place_policies():
    pool = fixed_length_pool([3, 4])
    module = TensorDictModule(lambda obs: (obs[:, :1] * 0 + 2).long().squeeze(-1), in_keys=["observation"],
                              out_keys=["action"])
    result = World(pool, module).evaluate(2, seed=0, progress=False)
    assert result["episode_returns"].tolist() == [6.0, 8.0]
    out_of_place = lambda td: TensorDict({"action": torch.ones(2, dtype=torch.int64)}, batch_size=[2])  # noqa: E731
    assert World(pool, out_of_place).evaluate(2, seed=0, progress=False)["episode_returns"].tolist() == [3.0, 4.0]
    def in_place_none(td):
        td.set("action", torch.ones(2, dtype=torch.int64))

    assert World(pool, in_place_none).evaluate(2, seed=0, progress=False)["episode_returns"].tolist() == [3.0, 4.0]
    with pytest.raises(KeyError, match="action"):
        World(pool, lambda td: td).evaluate(2, seed=0, progress=False)
    with pytest.raises(TypeError, match="policy returned"):
        World(pool, lambda td: 3).evaluate(2, seed=0, progress=False)
    with pytest.raises(TypeError, match="callable"):
        World(pool, policy=3)
    pool.close()


def test_policy_sees_only_torchrl_keys_and_frozen_rows_are_ignored():
    pool = fixed_length_pool([1, 3])
    spy = StepSpy(pool)
    World(pool, spy).evaluate(2, seed=0, reset_mode="wait", progress=False)
    td = spy.tds[-1]
    assert {"observation", "done", "is_init", "episode_seed", "info"} <= set(td.keys())
    assert td["done"][0].item()  # env 0 is done and frozen; the policy still gets a full batch
    pool.close()


# -- other envs ----------------------------------------------------------------------------------------------
def test_transformed_pool_with_history():
    pool = fixed_length_pool([2, 4])
    env = TransformedEnv(pool, History(["observation"], 3))
    seen = []

    def policy(td):
        seen.append(td["history", "observation"][..., 0].clone())
        return td.set("action", torch.ones(2, dtype=torch.int64))

    world = World(env, policy)
    assert world.pool is pool
    result = world.evaluate(2, seed=0, reset_mode="wait", progress=False)
    assert result["episode_lengths"].tolist() == [2, 4]
    # env 0 is frozen after 2 steps: its history stops changing (no duplicated frames)
    assert seen[2][0].tolist() == [0.0, 1.0, 2.0] and seen[3][0].tolist() == [0.0, 1.0, 2.0]
    assert seen[3][1].tolist() == [1.0, 2.0, 3.0]
    pool.close()


def test_generic_batched_torchrl_env():
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    world = World(env, policy=balance, max_episode_steps=30)
    a = world.evaluate(4, seed=3, progress=False)
    b = world.evaluate(4, seed=3, progress=False)
    assert a["num_episodes"] == 4 and (a["episode_lengths"] <= 30).all()
    assert np.array_equal(a["episode_lengths"], b["episode_lengths"])
    assert a["seeds"] is None  # a TorchRL env without episode_seed does not report per-episode seeds
    env.close()


def _done_only_env(length: int | None = 3):
    """A batched TorchRL env ([2], observation = step count, done after ``length`` steps, never with ``None``) whose
    done spec is only "done", as TorchRL's Pendulum tutorial env: TorchRL adds "terminated", nothing adds "truncated"."""
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class Env(EnvBase):
        def __init__(self):
            super().__init__(batch_size=torch.Size([2]))
            self.observation_spec = Composite(observation=Unbounded((2, 1)), shape=(2,))
            self.action_spec = Categorical(2, shape=(2,))
            self.reward_spec = Unbounded((2, 1))
            self.done_spec = Composite(done=Categorical(2, (2, 1), dtype=torch.bool), shape=(2,))
            self.t = torch.zeros(2, 1)

        def _reset(self, td=None, **kwargs):
            rows = torch.ones(2, 1, dtype=torch.bool) if td is None or "_reset" not in td.keys() else td["_reset"]
            self.t = torch.where(rows.view(2, 1), 0.0, self.t)
            return TensorDict(observation=self.t.clone(), done=torch.zeros(2, 1, dtype=torch.bool), batch_size=[2])

        def _step(self, td):
            step = td.get("_step", None)
            self.t = self.t + (1.0 if step is None else step.view(2, 1).float())
            done = torch.zeros(2, 1, dtype=torch.bool) if length is None else self.t >= length
            return TensorDict(observation=self.t.clone(), reward=torch.ones(2, 1), done=done, batch_size=[2])

        def _set_seed(self, seed):
            pass

    return Env()


def test_step_limit_on_an_env_without_a_truncated_flag_ends_episodes_as_done():
    env = _done_only_env(length=None)
    assert "truncated" not in env.done_keys
    result = World(env, max_episode_steps=3).evaluate(4, seed=0, progress=False)
    assert result["episode_lengths"].tolist() == [3] * 4
    assert result["episode_returns"].tolist() == [3.0] * 4


def test_an_env_with_only_a_done_flag_ends_its_episodes_terminated_not_truncated():
    # without a "truncated" flag, the env's done is a termination: no episode is reported as truncated, and the
    # summary counts them all as terminated (none as truncated or "both")
    env = _done_only_env(length=3)
    assert "truncated" not in env.done_keys
    result = World(env, ones(2)).evaluate(4, seed=0, progress=False)
    assert result["episode_lengths"].tolist() == [3] * 4
    assert result["episode_terminated"].tolist() == [True] * 4
    assert result["episode_truncated"].tolist() == [False] * 4
    assert result.summary().endswith("ended by      terminated 4, truncated 0")  # no "both"


def test_collect_on_an_env_with_only_a_done_flag_records_a_consistent_done_triplet(tmp_path):
    # the dataset holds done, terminated and truncated: the env's own end is a termination, World's cut a truncation
    world = World(_done_only_env(length=3), ones(2))
    flags = {}
    for max_steps in (10, 2):  # the env ends its episodes at 3 steps; World cuts them at 2
        ds = world.collect(tmp_path / f"d{max_steps}", 2, seed=0, max_steps=max_steps, progress=False)
        last = ds.episode_starts + ds.episode_lengths - 1
        flags[max_steps] = (ds.episode_lengths.tolist(),
                            *(ds.td["next", key][last].view(-1).tolist() for key in ("done", "terminated", "truncated")))
    assert flags[10] == ([3, 3], [True, True], [True, True], [False, False])
    assert flags[2] == ([2, 2], [True, True], [False, False], [True, True])


def test_device_parametrized(device):
    pool = EnvPool([functools.partial(counting, length=3)] * 2, seed=0, device=device)
    result = World(pool, lambda td: td.set("action", torch.ones(2, dtype=torch.int64, device=device))).evaluate(
        4, seed=0, progress=False
    )
    assert result["episode_returns"].tolist() == [3.0] * 4
    pool.close()


# -- construction and argument errors ------------------------------------------------------------------------
def test_construction_errors():
    with pytest.raises(TypeError, match="num_envs"):
        World("CartPole-v1")
    with pytest.raises(gym.error.Error):
        World("NoSuchEnv-v0", num_envs=2)
    pool = fixed_length_pool([2])
    with pytest.raises(TypeError, match="gymnasium id"):
        World(pool, num_envs=2)
    with pytest.raises(TypeError, match="EnvPool"):
        World(gym.make("CartPole-v1"))
    from torchrl.envs import GymEnv

    with pytest.raises(ValueError, match="batch_size"):
        World(GymEnv("CartPole-v1"))
    world = World(pool, ones(1))
    with pytest.raises(ValueError, match="reset_mode"):
        world.evaluate(1, reset_mode="lazy", progress=False)
    with pytest.raises(ValueError, match="only used with dataset"):
        world.evaluate(1, goal_offset=3, progress=False)
    with pytest.raises(ValueError, match="max_steps"):
        world.evaluate(1, max_steps=0, progress=False)
    with pytest.raises(ValueError, match="episodes"):
        world.evaluate(-1, progress=False)
    pool.close()


def test_reset_options_per_episode():
    pool = fixed_length_pool([9, 9])
    result = World(pool, ones(2)).evaluate(
        3, seed=0, options=[{"length": 1}, {"length": 2}, {"length": 3}], progress=False
    )
    assert result["episode_lengths"].tolist() == [1, 2, 3]
    assert World(pool, ones(2)).evaluate(2, seed=0, options={"length": 4}, progress=False)[
        "episode_lengths"
    ].tolist() == [4, 4]
    pool.close()


class _PopsItsOptions(CountingEnv):
    """Takes its options apart (``pop``), as some envs do: each episode must still get the options it was given."""

    def reset(self, *, seed=None, options=None):
        length = options.pop("length") if options else None
        return super().reset(seed=seed, options=None if length is None else {"length": length})


def test_one_options_dict_reaches_every_episode_whole_even_when_an_env_pops_from_it():
    given = {"length": 3}
    pool = EnvPool([functools.partial(_PopsItsOptions, length=9)] * 2, seed=0)
    result = World(pool, ones(2)).evaluate(6, seed=0, options=given, progress=False)
    assert result["episode_lengths"].tolist() == [3] * 6 and given == {"length": 3}
    pool.close()


def test_evaluate_acts_deterministically_by_default():
    from tensordict.nn import TensorDictModule
    from torch.distributions import Categorical as Dist
    from torchrl.modules import ProbabilisticActor

    class Logits(torch.nn.Module):  # action 1 is the mode; a sample is any of the three
        def forward(self, observation):
            return torch.tensor([0.0, 0.1, 0.0]).expand(observation.shape[0], 3)

    actor = ProbabilisticActor(TensorDictModule(Logits(), ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=Dist)
    pool = EnvPool([functools.partial(counting, length=5)] * 2, seed=0)
    result = World(pool, actor).evaluate(4, seed=0, progress=False)
    assert result["episode_returns"].tolist() == [5.0] * 4  # reward = action: always the mode, 1
    pool.close()


@pytest.mark.parametrize("options, match", [
    ("ab", r"options: expected a dict \(or None\) of reset options, got str"),
    (5, r"options: expected a dict \(or None\) of reset options, got int"),
    ([3, 4], r"options\[0\]: expected a dict"),
    ([["ab"], ["cd"]], r"options\[0\]: expected a dict"),  # dict([["ab"]]) would have given {"a": "b"}
])
def test_reset_options_must_be_dicts(options, match):
    pool = fixed_length_pool([9, 9])
    with pytest.raises(TypeError, match=match):
        World(pool, ones(2)).evaluate(2, seed=0, options=options, progress=False)
    pool.close()


# -- the result object ---------------------------------------------------------------------------------------
def test_eval_result_mapping_summary_and_json():
    pool = EnvPool([TerminatesOnFailure] * 2, seed=0)
    result = World(pool).evaluate(4, seed=0, progress=False)
    assert isinstance(result, EvalResult)
    assert result.success_rate == result["success_rate"] == 0.5
    assert {"success_rate", "episode_successes", "episode_returns", "episode_lengths", "steps_to_success",
            "seeds"} <= set(result)
    text = str(result)
    assert "success rate  0.500" in text and "2/4" in text and "return" in text and "length" in text
    data = json.loads(json.dumps(result.to_dict()))
    assert data["steps_to_success"] == [None, 2.0, None, 2.0]
    assert len(data["episode_returns"]) == 4
    assert "EvalResult(num_episodes=4" in repr(result)
    empty = World(pool).evaluate(0, seed=0, progress=False)
    assert empty["num_episodes"] == 0 and "0 episodes" in empty.summary()
    pool.close()


def test_a_return_of_minus_inf_is_strict_json_null_and_summarised_without_warnings():
    """A reward of -inf (a log-likelihood reward, an overflow) makes the episode's return -inf: JSON has no
    token for it, so to_dict gives None, as for NaN, and the summary prints it without numpy warnings."""
    def make():
        return gym.wrappers.TransformReward(_limited_counting_env(3, 3), lambda r: -math.inf)

    pool = EnvPool([make] * 2, seed=0)
    result = World(pool).evaluate(2, seed=0, progress=False)
    assert np.isneginf(result["episode_returns"]).all()
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["episode_returns"] == [None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "return        mean -inf" in result.summary()
    pool.close()


def test_summaries_count_one_episode_env_and_step_in_the_singular(tmp_path):
    pool = EnvPool([functools.partial(_limited_counting_env, 1, 3)], seed=0)
    world = World(pool)
    head = world.evaluate(1, seed=0, progress=False).summary().splitlines()[0]
    assert head.startswith("World.evaluate: 1 episode on 1 env (reset_mode=auto, seed=0), 1 env-step in "), head
    ds = world.collect(tmp_path / "d", 1, seed=0, progress=False)
    assert "  1 episode, 1 step (complete; 1 requested)" in ds.summary().splitlines()
    assert "World.evaluate: 2 episodes on 1 env (" in world.evaluate(2, seed=0, progress=False).summary()
    pool.close()


def _limited_counting_env(length, limit):
    return gym.wrappers.TimeLimit(CountingEnv(length=length), limit)


def test_summary_counts_an_episode_both_terminated_and_truncated_once():
    # terminating on the time limit's own step sets both flags (gymnasium): the summary must not count it twice
    pool = EnvPool([functools.partial(_limited_counting_env, k, 3) for k in (2, 3, 5)], seed=0)
    result = World(pool).evaluate(3, seed=0, progress=False)
    assert result["episode_terminated"].tolist() == [True, True, False]
    assert result["episode_truncated"].tolist() == [False, True, True]
    assert "ended by      terminated 1, truncated 1, both 1" in result.summary()
    pool.close()


def test_summary_std_is_the_population_std_of_the_episodes():
    # numpy's default (ddof=0), as in the README's example: returns and lengths 2 and 4 give mean 3 ± 1
    pool = fixed_length_pool([2, 4])
    text = World(pool, ones(2)).evaluate(2, seed=0, progress=False).summary()
    assert "  return        mean 3.000 ± 1.000 (std), min 2.000, max 4.000" in text.splitlines()
    assert "  length        mean 3.0 ± 1.0, min 2, max 4" in text.splitlines()
    pool.close()


class _SuccessOnlyInStepInfos(gym.Env):
    """Fetch-style: the reset info is empty, steps report ``is_success`` (1.0 from the first step)."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, True, False, {"is_success": 1.0}


def test_start_successes_is_none_when_the_reset_info_has_no_success_signal():
    # the pool's 0 under ("info", "is_success") at reset is a fill value (its presence mask is False), not "not solved"
    pool = EnvPool([_SuccessOnlyInStepInfos] * 2, seed=0)
    assert not pool.reset()["info_mask", "is_success"].any()
    result = World(pool).evaluate(4, seed=0, progress=False)
    assert result["start_successes"] is None
    assert result["success_rate"] == 1.0 and result["steps_to_success"].tolist() == [1.0] * 4
    pool.close()


def test_progress_bar_runs(capsys):
    pool = fixed_length_pool([2, 2])
    World(pool, ones(2)).evaluate(4, seed=0, progress=True)
    assert "evaluate" in capsys.readouterr().err
    pool.close()


@pytest.mark.parametrize("run", ["evaluate", "collect"])
def test_the_default_progress_bar_is_drawn_only_where_someone_watches(run, capsys, monkeypatch, tmp_path):
    # as the CLI: a log or a pipe gets no bar (tqdm's carriage returns filled them), a terminal or a notebook does
    world = World(fixed_length_pool([2, 2]), ones(2))
    calls = iter(range(10))

    def go(**kwargs):
        if run == "collect":
            return world.collect(tmp_path / f"ds{next(calls)}", 4, seed=0, max_steps=5, **kwargs)
        return world.evaluate(4, seed=0, **kwargs)

    assert not sys.stderr.isatty()  # captured
    go()
    assert run not in capsys.readouterr().err
    go(progress=True)
    assert run in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    go()
    assert run in capsys.readouterr().err
    go(progress=False)
    assert run not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # a Jupyter kernel's stderr
    go()
    assert run in capsys.readouterr().err
    world.close()


def _time_limited_counting(length, limit):
    return gym.wrappers.TimeLimit(CountingEnv(length=length), max_episode_steps=limit)


@pytest.mark.parametrize(
    "length, limit, terminated, truncated",
    [(4, 4, True, True), (3, 6, True, False), (6, 3, False, True)],  # both flags / terminated / truncated
)
def test_episode_flags_are_the_env_flags(length, limit, terminated, truncated):
    world = World(EnvPool([functools.partial(_time_limited_counting, length, limit)] * 2, seed=0))
    out = world.evaluate(4, seed=0, progress=False)
    assert out["episode_lengths"].tolist() == [min(length, limit)] * 4
    assert out["episode_terminated"].tolist() == [terminated] * 4
    assert out["episode_truncated"].tolist() == [truncated] * 4


class _BothFlagsEnv(CountingEnv):
    """Sets terminated and truncated itself on its last step (no TimeLimit World could see)."""

    def step(self, action):
        obs, reward, terminated, _, info = super().step(action)
        return obs, reward, terminated, terminated, info


@pytest.mark.parametrize("mode", ["auto", "wait"])
def test_an_env_setting_both_flags_itself_ends_episodes_terminated_and_truncated(mode):
    pool = EnvPool([functools.partial(_BothFlagsEnv, length=3)] * 2, seed=0)
    result = World(pool).evaluate(3, seed=0, reset_mode=mode, progress=False)
    assert result["max_steps"] is None and result["episode_lengths"].tolist() == [3] * 3
    assert result["episode_terminated"].tolist() == [True] * 3
    assert result["episode_truncated"].tolist() == [True] * 3
    assert "ended by      terminated 0, truncated 0, both 3" in result.summary()
    pool.close()


def test_video_must_be_a_directory_or_a_recorder():
    world = World(EnvPool([functools.partial(counting, render_mode="rgb_array")] * 2, pixels=True))
    with pytest.raises(TypeError, match="video: expected a directory"):
        world.evaluate(2, video=True, progress=False)


def test_close_closes_the_pool_world_built_and_reaps_its_workers():
    # TorchRL's EnvBase starts with is_closed=True, so "close unless closed" used to close nothing
    world = World("CartPole-v1", num_envs=2, backend="process", num_workers=2)
    pids = world.env._backend.pids
    assert len(pids) == 2
    world.evaluate(2, seed=0, progress=False)
    world.close()
    assert_reaped(pids)  # the workers exited and were waited for, no zombie left
    assert world.env.is_closed
    world.close()  # a second close does nothing
    # a pool the caller built stays the caller's
    pool = EnvPool("CartPole-v1", num_envs=2, seed=0)
    World(pool).close()
    assert not pool.is_closed and pool.reset().batch_size == (2,)
    pool.close()


@pytest.mark.parametrize("call", [
    lambda w: w.evaluate(2.9, seed=0, progress=False),
    lambda w: w.evaluate(True, seed=0, progress=False),
    lambda w: w.evaluate(2, seed=0, max_steps=4.9, progress=False),
    lambda w: w.collect("/nonexistent/never-written", 2.9, seed=0, progress=False),
    lambda w: World("CartPole-v1", num_envs=2, max_episode_steps=4.9),
])
def test_counts_that_int_would_truncate_are_type_errors(call):
    world = World("CartPole-v1", num_envs=2)
    with pytest.raises(TypeError, match=r"expected an int, got (float 2\.9|bool True|float 4\.9)"):
        call(world)
    world.close()


@pytest.mark.parametrize("num_envs", [2.5, True, "3"])
def test_world_num_envs_is_not_truncated(num_envs):
    with pytest.raises(TypeError, match=r"num_envs: expected an int, got"):
        World("CartPole-v1", num_envs=num_envs)


def test_a_natively_batched_env_is_reseeded_whenever_every_row_restarts_and_reports_that_seed():
    """One RNG for the batch: World seeds it at a reset of every row (a run's first, a wait-mode round with an
    episode for every row) with the seed of that reset's first episode (``seed + j``), and reports the seed each
    episode's stream started from. Rows restarting without the others (a shorter last round, auto mode) continue
    the stream. So wait mode's second round (episodes 3-5, seed 5 + 3) replays the first round of a run seeded 8,
    and auto mode, where rows restart one at a time, reports 5 throughout."""
    def lean(td):  # deterministic: episodes differ only through their start states
        return td.set("action", (td["observation"][:, 2] > 0).long())

    venv = gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point")
    with World(EnvPool(venv), policy=lean) as world:
        wait = world.evaluate(9, seed=5, reset_mode="wait", progress=False)
        assert wait["seeds"].tolist() == [5, 5, 5, 8, 8, 8, 11, 11, 11]
        lengths = wait["episode_lengths"].tolist()
        assert len(set(lengths)) > 3  # the rounds differ: the check below can tell them apart
        for k, seed in enumerate((5, 8, 11)):
            round_k = world.evaluate(3, seed=seed, reset_mode="wait", progress=False)
            assert round_k["episode_lengths"].tolist() == lengths[3 * k : 3 * k + 3]
        # a last round with fewer episodes than rows restarts some rows only: they continue the stream
        assert world.evaluate(7, seed=5, reset_mode="wait", progress=False)["seeds"].tolist() == [5] * 3 + [8] * 4
        auto = world.evaluate(9, seed=5, reset_mode="auto", progress=False)
        assert auto["seeds"].tolist() == [5] * 9
        assert auto["episode_lengths"].tolist()[:3] == lengths[:3]  # the same first reset as wait mode's
        assert auto["episode_lengths"].tolist()[3:] != lengths[3:]  # later ones continue the stream


@pytest.fixture
def postfixes(monkeypatch):
    """The ``(success, n)`` pairs a run's progress bar shows, in order: a tqdm that records what the run sets on
    it (everything else is tqdm's own)."""
    import tqdm.auto

    shown = []

    class RecordingTqdm(tqdm.auto.tqdm):
        def set_postfix(self, *args, **kwargs):
            shown.append((kwargs.get("success"), self.n))
            return super().set_postfix(*args, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", RecordingTqdm)
    return shown


def test_the_progress_bar_shows_the_final_success_count(postfixes):
    """The bar's postfix is refreshed every 8 episodes and at the last one, before the bar's last update: with
    17 episodes the final frame reads the 17th episode's count, not the 16th's."""
    pool = EnvPool([functools.partial(counting, max_length=9)] * 3, seed=0)
    with World(pool, ones(3)) as world:
        result = world.evaluate(17, seed=5, success_fn=lambda td: td["next", "observation"][:, 0] >= 4,
                                progress=True)
    k = int(result["episode_successes"].sum())
    assert postfixes[-1] == (f"{k}/17", 16)  # set before the 17th update
    assert [n for _, n in postfixes] == [7, 15, 16]


def test_the_progress_bar_counts_the_successes_of_the_episodes_finished_so_far(postfixes):
    """Auto mode finishes episodes out of index order: env 0's one-step episodes (0, 3, ..., 15), the only
    successful ones, finish first, so the 8th episode to finish is episode 15 and 6 of those 8 succeeded
    (counting episodes 0-7 instead would say 3)."""
    pool = fixed_length_pool([1, 3, 3])
    with World(pool, ones(3)) as world:
        result = world.evaluate(17, seed=0, success_fn=lambda td: torch.tensor([True, False, False]), progress=True)
    assert result["episode_successes"].nonzero()[0].tolist() == [0, 3, 6, 9, 12, 15]
    assert postfixes == [("6/8", 7), ("6/16", 15), ("6/17", 16)]


@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
def test_world_gives_every_episode_its_seed_so_the_pools_overlapping_schedule_warning_never_shows(reset_mode):
    # World seeds each episode (and each idle row of a vector env) itself, so the pool's warning that a list of
    # seeds put two envs on one schedule does not apply: its own schedules never pick a seed here
    pool = EnvPool(gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=3)] * 3))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            result = World(pool).evaluate(episodes=4, seed=0, reset_mode=reset_mode)
        assert result.seeds.tolist() == [0, 1, 2, 3]
    finally:
        pool.close()


def test_envs_made_with_other_time_limits_each_end_their_episodes_at_their_own():
    # World read the step limit from env 0's spec (EnvPool.env_spec): env 1, made with max_episode_steps=50, had
    # every episode cut at env 0's 2 steps, reported truncated with a partial return (review E, round 17)
    limits = [2, 50]
    pool = EnvPool([functools.partial(gym.make, "CartPole-v1", max_episode_steps=limit) for limit in limits], seed=0)

    def push_left(td):
        return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))

    try:
        world = World(pool, push_left)
        result = world.evaluate(6, seed=3, progress=False)
    finally:
        pool.close()
    reference = []
    for j in range(6):  # episode j runs on env j % 2, seeded 3 + j
        env = gym.make("CartPole-v1", max_episode_steps=limits[j % 2])
        env.reset(seed=3 + j)
        steps, ret, terminated, truncated = 0, 0.0, False, False
        while not (terminated or truncated):
            _, reward, terminated, truncated, _ = env.step(0)
            steps, ret = steps + 1, ret + reward
        reference.append((steps, ret, truncated and not terminated))
        env.close()
    assert result.episode_lengths.tolist() == [r[0] for r in reference]
    assert result.episode_returns.tolist() == [r[1] for r in reference]
    assert result.episode_truncated.tolist() == [r[2] for r in reference]
    assert result.env_time_limit == 50
    assert min(result.episode_lengths[1::2].tolist()) > 2  # env 1's episodes were not cut at env 0's limit


def test_the_success_rate_interval_stays_within_0_and_1():
    # Wilson's interval at 0 successes has a lower bound of 0 only up to rounding (-2.8e-17 at 0 of 7): clamped
    from torchrl_swm.world import _wilson

    for n in range(1, 200):
        assert _wilson(0, n)[0] == 0.0 and _wilson(n, n)[1] == 1.0
        for k in (0, 1, n // 2, n - 1, n):
            low, high = _wilson(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0


class _SeedLogEnv(CountingEnv):
    """Logs the seed of every reset."""

    def reset(self, *, seed=None, options=None):
        self.__dict__.setdefault("seed_log", []).append(seed)
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
def test_idle_rows_of_a_vector_env_never_reset_with_a_planned_episodes_seed(reset_mode):
    # a VectorEnv steps every row: rows with no episode left are reset outside any episode, with seeds past the
    # plan's (seed .. seed + E - 1), so that no planned episode is played twice (review E M17, round 17)
    pool = EnvPool(gym.vector.SyncVectorEnv([functools.partial(_SeedLogEnv, length=3)] * 3))
    try:
        World(pool).evaluate(4, seed=10, reset_mode=reset_mode, progress=False)
        logs = [env.unwrapped.seed_log for env in pool._backend.venv.envs]
    finally:
        pool.close()
    used = [seed for log in logs for seed in log if seed is not None and seed >= 10]
    assert sorted(seed for seed in used if seed < 14) == [10, 11, 12, 13]  # each planned seed once


class _WarnEveryStepEnv(CountingEnv):
    def step(self, action):
        warnings.warn("_WarnEveryStepEnv: a deprecated thing", UserWarning)
        return super().step(action)


def test_world_leaves_an_envs_own_repeated_warning_shown_once():
    # World once silenced the pool's seed-schedule warning with a warnings filter around each reset: changing the
    # filters clears Python's record of warnings already shown, so an env's own warning came back after every
    # reset (22 times for 20 episodes, review G, round 17)
    pool = EnvPool([functools.partial(_WarnEveryStepEnv, length=3)] * 2, seed=0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            World(pool).evaluate(20, seed=0, progress=False)
    finally:
        pool.close()
    assert len([w for w in caught if "a deprecated thing" in str(w.message)]) == 1
