"""Seeding: set_seed schedules, reset(seed=...) forms, options, and reproducibility."""

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, counting
from tensordict import TensorDict

from torchrl_swm import EnvPool


def seeds_of(td):
    return td["episode_seed"].view(-1).tolist()


def test_set_seed_gives_env_i_seed_s_plus_i_then_unique_later_seeds():
    n = 3
    pool = EnvPool([functools.partial(counting, length=2)] * n)
    pool.set_seed(100)
    td = pool.reset()
    assert seeds_of(td) == [100, 101, 102]
    assert [env.last_seed for env in pool.envs] == [100, 101, 102]
    rollout = pool.rollout(6, break_when_any_done=False)
    # every env resets every 2 steps: its k-th episode has seed 100 + i + k * n
    episode_seeds = rollout["next", "episode_seed"][:, :, 0]
    # the rollout itself starts with a reset, so each env is on its 2nd seed at t=0
    assert episode_seeds[:, 0].tolist() == [103, 104, 105]
    assert episode_seeds[:, 2].tolist() == [106, 107, 108]
    assert len(set(rollout["episode_seed"].unique().tolist())) == 9
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_set_seed_between_a_reset_and_a_step_warns_that_the_episodes_in_progress_keep_their_seeds(backend):
    # a Collector resets its env when it is built, so Collector.set_seed comes after that reset: restarting the
    # episodes then (TorchRL's GymWrapper does) would pair the Collector's root with another episode's "next".
    # The pool keeps every transition whole and says how to seed from the first step
    from torchrl.collectors import Collector

    kwargs = {"backend": backend, "num_workers": 2} if backend == "process" else {}
    pool = EnvPool("CartPole-v1", num_envs=4, **kwargs)
    collector = Collector(pool, None, frames_per_batch=40, total_frames=40)
    collector.set_seed(7)
    with pytest.warns(UserWarning, match=r"set_seed\(\) came after the last reset.*EnvPool.factory\(..., seed=s\)"):
        batch = next(iter(collector))
    collector.shutdown()
    # every transition is whole: the root is the previous step's "next" (or the reset), same episode seed
    assert torch.equal(batch["episode_seed"][:, 1:], torch.where(
        batch["next", "done"][:, :-1], batch["episode_seed"][:, 1:], batch["next", "episode_seed"][:, :-1]))
    assert torch.equal(batch["episode_seed"][:, 0], batch["next", "episode_seed"][:, 0])

    def run():  # the way out the warning gives: a seeded factory
        torch.manual_seed(123)
        collector = Collector(EnvPool.factory("CartPole-v1", num_envs=4, seed=7, **kwargs), None,
                              frames_per_batch=200, total_frames=200)
        out = next(iter(collector)).clone()
        collector.shutdown()
        return out

    a, b = run(), run()
    assert (a.exclude("collector") == b.exclude("collector")).all()
    assert a["episode_seed"][:, 0, 0].tolist() == [7, 8, 9, 10]


def test_set_seed_then_reset_starts_the_seeded_episodes_without_a_warning():
    import warnings

    pool = EnvPool([functools.partial(counting, length=4)] * 3, seed=0)
    pool.reset()
    pool.set_seed(100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td = pool.reset()
        assert seeds_of(td) == [100, 101, 102]
        td["action"] = pool.action_spec.zero()
        pool.step(td)
        pool.set_seed(200)  # mid-episode: the next resets take it, and nothing is said
        td = pool.step(td)["next"]
    assert seeds_of(pool.reset()) == [200, 201, 202]
    pool.close()


def test_set_seed_mid_episode_after_a_partial_reset_says_nothing():
    """A partial reset after a step leaves the other rows mid-episode: a set_seed() then is mid-episode too (a pool
    counting the partial reset as a reset of every env would warn at the next step)."""
    import warnings

    pool = EnvPool([functools.partial(counting, length=50)] * 3, seed=0)
    td = pool.reset()
    td = pool.step(td.set("action", pool.action_spec.zero()))["next"]
    td = pool.reset(td.set("_reset", torch.tensor([[False], [True], [False]])))
    pool.set_seed(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.step(td.set("action", pool.action_spec.zero()))
    pool.close()


@pytest.mark.parametrize(("reset_rows", "named"), [([], "every env"), ([1], r"envs \[0, 2\]")])
def test_set_seed_then_a_reset_of_some_envs_still_warns_at_the_step(reset_rows, named):
    # the envs a partial reset leaves alone are still in the episodes they started before set_seed
    pool = EnvPool([functools.partial(counting, length=50)] * 3, seed=0)
    td = pool.reset()
    pool.set_seed(100)
    td["_reset"] = torch.tensor([[i in reset_rows] for i in range(3)])
    td = pool.reset(td)
    assert seeds_of(td) == [100 + i if i in reset_rows else i for i in range(3)]
    td["action"] = pool.action_spec.zero()
    with pytest.warns(UserWarning, match=rf"set_seed\(\) came after the last reset of {named} and before"):
        pool.step(td)
    pool.close()


@pytest.mark.parametrize("final_step", ["step", "step_and_maybe_reset"])
@pytest.mark.parametrize("second_reset", ["all-True mask", "partial mask", "every env done in step_and_maybe_reset"])
def test_set_seed_after_every_env_was_reset_warns_at_the_step(second_reset, final_step):
    # every env reset and none stepped since, then set_seed: the episodes in progress keep their old seeds. An
    # all-True "_reset" (TorchRL's maybe_reset when every env is done) resets every env as reset() does; a partial
    # reset right after a full one leaves every env in a not-yet-stepped episode
    pool = EnvPool([functools.partial(counting, length=2)] * 3, seed=0)
    td = pool.reset()
    if second_reset == "every env done in step_and_maybe_reset":  # the pool's own fast path, not TorchRL's
        for _ in range(2):
            _, td = pool.step_and_maybe_reset(td.set("action", pool.action_spec.zero()))
        assert td["observation"][:, 0].eq(0).all()  # every env restarted
    else:
        td = pool.step(td.set("action", pool.action_spec.zero()))["next"]  # stepped: not fresh
        if second_reset == "partial mask":
            td = pool.reset()
        rows = [0, 1, 2] if second_reset == "all-True mask" else [0]
        td["_reset"] = torch.tensor([[i in rows] for i in range(3)])
        td = pool.reset(td).exclude("_reset")
    pool.set_seed(100)
    with pytest.warns(UserWarning, match=r"set_seed\(\) came after the last reset of every env and before"):
        getattr(pool, final_step)(td.set("action", pool.action_spec.zero()))
    pool.close()


def test_set_seed_then_every_env_reset_in_parts_starts_the_seeded_episodes_without_a_warning():
    import warnings

    from torchrl_swm import to_gymnasium

    pool = EnvPool([functools.partial(counting, length=50)] * 3, seed=0)
    td = pool.reset()
    pool.set_seed(100)
    for rows in ([0], [1, 2]):
        td["_reset"] = torch.tensor([[i in rows] for i in range(3)])
        td = pool.reset(td)
    assert seeds_of(td) == [100, 101, 102]
    td["action"] = pool.action_spec.zero()
    exported = to_gymnasium(EnvPool([functools.partial(counting, length=50)] * 3, seed=0))
    exported.reset()
    exported.env.set_seed(5)
    _, infos = exported.reset(seed=[None, 11, None])  # two resets: the seeded row, then the others
    assert infos["episode_seed"].tolist() == [5, 11, 7]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.step(td)
        exported.step(np.zeros(3, np.int64))
    pool.close()
    exported.close()


def test_same_seed_same_rollout_and_different_seed_differs():
    def run(seed):
        pool = EnvPool("CartPole-v1", num_envs=4, seed=seed)
        torch.manual_seed(0)
        out = pool.rollout(120, break_when_any_done=False)
        pool.close()
        return out

    a, b, c = run(5), run(5), run(6)
    assert (a == b).all()
    assert not torch.equal(a["observation"], c["observation"])


@pytest.mark.parametrize(
    "seed, expected",
    [
        (7, [7, 8, 9]),
        (np.int64(7), [7, 8, 9]),
        (np.int32(7), [7, 8, 9]),
        ([5, 50, 500], [5, 50, 500]),
        ((5, 50, 500), [5, 50, 500]),
        (np.array([5, 50, 500]), [5, 50, 500]),
        (torch.tensor([5, 50, 500]), [5, 50, 500]),
    ],
)
def test_reset_seed_forms(seed, expected):
    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    assert seeds_of(pool.reset(seed=seed)) == expected
    assert [env.last_seed for env in pool.envs] == expected
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_none_seed_entry_leaves_that_env_on_its_own_schedule(backend):
    # as the README says: [7, None, 9] after seed 5 (and one reset) gives env 1 its next scheduled seed, 6 + 3
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, length=2)] * 3, seed=5, backend=backend, **kwargs)
    assert seeds_of(pool.reset()) == [5, 6, 7]
    with pytest.warns(UserWarning, match=r"env 1 \(at seed 9\) and env 2 \(at seed 9\) on one schedule"):
        assert seeds_of(pool.reset(seed=[7, None, 9])) == [7, 9, 9]
    assert seeds_of(pool.reset(seed=np.array([None, 40, None], dtype=object))) == [10, 40, 12]
    # the restarted schedules go on from their new bases; env 1's was never restarted before this
    assert seeds_of(pool.reset(seed=[None, None, None])) == [13, 43, 15]
    if backend == "serial":
        assert [env.last_seed for env in pool.envs] == [13, 43, 15]
    # a partial reset: the masked rows only, None rows on their schedule
    td = pool.reset()
    assert seeds_of(td) == [16, 46, 18]
    td["_reset"] = torch.tensor([[True], [True], [False]])
    assert seeds_of(pool.reset(td, seed=[100, None, 300])) == [100, 49, 18]
    pool.close()


@pytest.mark.parametrize("seed, error", [
    ([1, 2], ValueError), (np.arange(4), ValueError), (-1, ValueError), (1.5, TypeError), ([1, None, 2.5], TypeError),
    ([1, None, -3], ValueError),
    # a bool inside a list is refused as a bare bool is, not read as the seed 1
    ([True, 1, 2], TypeError), ((5, None, True), TypeError),
    # a 0-d float or bool array/tensor is refused, not truncated to an int seed (3.7 -> 3, True -> 1)
    (np.array(3.7), TypeError), (torch.tensor(3.7), TypeError), (np.array(True), TypeError),
    # one seed per env, but not a 1-D array of them (a (N, 1) tensor as the "episode_seed" leaf): its shape is named
    (np.array([[1], [2], [3]]), ValueError), (torch.tensor([[1], [2], [3]]), ValueError),
    (np.arange(6).reshape(3, 2), ValueError),
])
def test_bad_seeds(seed, error):
    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    with pytest.raises(error, match="seed"):
        pool.reset(seed=seed)
    pool.close()


def test_the_episode_seed_leaf_passed_back_as_a_seed_says_its_shape():
    pool = EnvPool([functools.partial(counting, length=2)] * 3, seed=0)
    td = pool.reset()
    with pytest.raises(ValueError, match=r"seed: expected an int or 3 seeds \(one per env\), got shape \(3, 1\)"):
        pool.reset(seed=td["episode_seed"])
    assert seeds_of(pool.reset(seed=td["episode_seed"].view(-1))) == [0, 1, 2]  # flattened, it is taken
    pool.close()


@pytest.mark.parametrize("where", ["constructor", "set_seed"])
def test_an_object_array_of_seeds_is_refused_where_no_none_entry_is_allowed(where):
    """EnvPool(seed=) and set_seed() take ints only (reset(seed=) alone takes None entries, an object array of
    them included): an object array is a TypeError naming its dtype, even one holding only ints."""
    seeds = np.array([1, 2, 3], dtype=object)
    with pytest.raises(TypeError, match="seed: expected integer seeds, got dtype object"):
        if where == "constructor":
            EnvPool([functools.partial(counting, length=2)] * 3, seed=seeds)
        else:
            EnvPool([functools.partial(counting, length=2)] * 3).set_seed(seeds)
    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    assert seeds_of(pool.reset(seed=seeds)) == [1, 2, 3]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "vector"])
@pytest.mark.parametrize("where", ["constructor", "set_seed", "reset", "reset_list"])
def test_the_largest_seed_2_63_minus_1_is_accepted_and_the_next_episode_wraps_to_0(where, backend):
    """Seeds must be below 2**63: 2**63 - 1 itself is valid (for a one-env pool given it as its seed); the env's
    next episode, seeded s + 1, wraps to 0."""
    top = 2**63 - 1
    fns = [functools.partial(counting, length=1)]
    env = gym.vector.SyncVectorEnv(fns) if backend == "vector" else fns
    pool = EnvPool(env, seed=top if where == "constructor" else None)
    if where == "set_seed":
        pool.set_seed(top)
    td = pool.reset(seed={"reset": top, "reset_list": [top]}.get(where))
    assert seeds_of(td) == [top]
    assert pool.get_attr("last_seed") == [top]
    td = pool.step_and_maybe_reset(td.set("action", torch.zeros(1, dtype=torch.int64)))[1]
    assert seeds_of(td) == [0]
    assert pool.get_attr("last_seed") == [0]
    pool.close()


def test_options_dict_is_copied_per_env_and_list_is_per_env():
    pool = EnvPool([functools.partial(counting)] * 3, seed=0)
    shared = {"length": 4, "payload": []}
    pool.reset(options=shared)
    assert [env.length for env in pool.envs] == [4, 4, 4]
    pool.reset(options=[{"length": 1}, None, {"length": 3}])
    assert pool.envs[0].length == 1 and pool.envs[2].length == 3
    with pytest.raises(ValueError, match="options"):
        pool.reset(options=[{"length": 1}])
    pool.close()


class OptionsRecorder(CountingEnv):
    def reset(self, *, seed=None, options=None):
        self.options_seen = options
        return super().reset(seed=seed, options=options)


def test_options_are_distinct_objects():
    pool = EnvPool([OptionsRecorder] * 2, seed=0)
    pool.reset(options={"payload": [1]})
    a, b = (env.options_seen for env in pool.envs)
    assert a == b and a is not b and a["payload"] is not b["payload"]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("rows", [[1, 2], [2, 3]])  # with 2 workers: a row in each, then both rows in the second
def test_a_partial_reset_gives_each_reset_row_its_own_options(backend, rows):
    # options=[N dicts] with a "_reset" mask: row j starts with options[j], whichever worker holds it
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, length=50)] * 4, seed=0, backend=backend, **kwargs)
    td = pool.reset()
    mask = torch.zeros(4, 1, dtype=torch.bool)
    mask[rows] = True
    out = pool.reset(td.set("_reset", mask), options=[{"length": 10 + j} for j in range(4)])
    assert out["info", "length"].view(-1).tolist() == [10 + j if j in rows else 50 for j in range(4)]
    pool.close()


def test_unseeded_pools_still_record_distinct_seeds():
    pool = EnvPool([functools.partial(counting, length=2)] * 4)
    seeds = seeds_of(pool.reset())
    assert len(set(seeds)) == 4 and all(s >= 0 for s in seeds)
    pool.close()


def test_partial_reset_with_seed_only_reseeds_masked_rows():
    from tensordict import TensorDict

    pool = EnvPool([functools.partial(counting, length=5)] * 3, seed=0)
    td = pool.reset()
    mask = torch.tensor([[False], [True], [False]])
    out = pool.reset(td.update(TensorDict({"_reset": mask}, [3])), seed=[10, 20, 30])
    assert seeds_of(out) == [0, 20, 2]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_partial_reset_without_per_episode_seeds_records_each_rows_stream_seed(backend):
    # seed_every_episode=False: the rows reset by a "_reset" mask continue their streams (reset unseeded)
    # and keep the seed their stream started from, on every backend
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool("CartPole-v1", num_envs=4, seed=100, seed_every_episode=False, backend=backend, **kwargs)
    td = pool.reset()
    assert seeds_of(td) == [100, 101, 102, 103]
    mask = torch.tensor([[False], [True], [False], [True]])
    for _ in range(2):
        out = pool.reset(td.empty().set("_reset", mask))
        assert seeds_of(out)[1::2] == [101, 103]  # the reset rows (the others are not part of a reset's output)
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_full_resets_without_per_episode_seeds_record_each_rows_stream_seed_and_match_serial(backend):
    # seed_every_episode=False: a second full reset() continues every env's stream (reset unseeded) and records
    # the seed that stream started from; reset(seed=[7, None, 9]) restarts rows 0 and 2 only. The process
    # backend sends each worker the seeds to reset with and the episode seeds to record: they differ here
    def run(pool):
        out = []
        for seed in (None, None, [7, None, 9], None):
            td = pool.reset(seed=seed)
            out.append(td.clone())
            td["action"] = torch.tensor([1, 2, 0])
            out.append(pool.step(td).clone())
        pool.close()
        return out

    fns = [functools.partial(counting, max_length=9)] * 3
    kwargs = {"num_workers": 2} if backend == "process" else {}
    ours = run(EnvPool(fns, seed=10, seed_every_episode=False, backend=backend, **kwargs))
    assert [seeds_of(td) for td in ours[::2]] == [[10, 11, 12], [10, 11, 12], [7, 11, 9], [7, 11, 9]]
    assert [td["next", "episode_seed"].view(-1).tolist() for td in ours[1::2]] == [seeds_of(td) for td in ours[::2]]
    serial = run(EnvPool(fns, seed=10, seed_every_episode=False))
    for t, (a, b) in enumerate(zip(ours, serial)):
        assert set(a.keys(True, True)) == set(b.keys(True, True)), t
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), (t, key)  # the streams continued as serial's did: same lengths


def test_seed_every_episode_false_follows_gymnasium_convention():
    """Only the first reset after a seed passes it; later episodes continue each env's stream."""
    pool = EnvPool([functools.partial(counting, length=2)] * 3, seed=10, seed_every_episode=False)
    rollout = pool.rollout(7, break_when_any_done=False)
    assert [env.last_seed for env in pool.envs] == [None, None, None]  # later resets were unseeded
    assert rollout["episode_seed"].unique().tolist() == [10, 11, 12]  # the stream seed of each env
    pool.close()

    # still reproducible, and the same as gymnasium's own vector env seeded the same way
    import gymnasium as gym

    def rollout_obs(seed):
        pool = EnvPool("CartPole-v1", num_envs=3, seed=seed, seed_every_episode=False)
        td, out = pool.reset(), []
        for t in range(200):
            td["action"] = torch.tensor([t % 2, 1, 0])
            step, td = pool.step_and_maybe_reset(td)
            out.append(step["next", "observation"])
        pool.close()
        return torch.stack(out)

    ours = rollout_obs(4)
    assert torch.equal(ours, rollout_obs(4))
    venv = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    venv.reset(seed=4)
    theirs = []
    for t in range(200):
        obs, _, term, trunc, info = venv.step(np.array([t % 2, 1, 0]))
        obs = obs.copy()
        for i in np.flatnonzero(term | trunc):
            obs[i] = info["final_obs"][i]
        theirs.append(torch.from_numpy(obs))
    assert torch.equal(ours, torch.stack(theirs))


@pytest.mark.parametrize("every_episode", [True, False])
def test_batch_rng_vector_env_records_the_seed_of_its_stream(every_episode):
    # a natively batched env has one RNG for the batch: a row's episode continues the stream of
    # the seed the vector env was last seeded with, whichever row was reset
    import gymnasium as gym

    venv = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="vector_entry_point")
    pool = EnvPool(venv, seed=10, seed_every_episode=every_episode)
    td = pool.reset()
    assert seeds_of(td) == [10, 10, 10]
    td = pool.reset(td.set("_reset", torch.tensor([[False], [False], [True]])))
    assert venv.unwrapped._np_random_seed == (15 if every_episode else 10)
    # every_episode: the reset reseeded the batch with row 2's next seed, 12 + 3; else: stream 10 continues
    assert seeds_of(td) == ([10, 10, 15] if every_episode else [10, 10, 10])
    pool.close()


def test_batch_rng_vector_env_is_seeded_by_the_first_seed_given_even_after_a_none():
    # one RNG for the batch: reset(seed=[None, 7, ...]) seeds it with 7, not with nothing because row 0 has none
    import gymnasium as gym

    make = lambda: gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")  # noqa: E731
    pool = EnvPool(make(), seed=5)
    pool.reset()
    td = pool.reset(seed=[None, 7, None, None])
    assert seeds_of(td) == [7, 7, 7, 7]
    ref = make()
    obs, _ = ref.reset(seed=7)
    ref.close()
    assert np.allclose(obs, td["observation"].numpy())
    pool.close()


def test_a_wrapped_sync_vector_env_keeps_a_seed_per_env_and_per_episode():
    # vector wrappers keep the SyncVectorEnv's one RNG per env: seeded as the bare one, s + i + k * N
    import gymnasium as gym

    venv = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([functools.partial(CountingEnv, length=2)] * 3))
    pool = EnvPool(venv, seed=3, info_keys=["t"])
    assert pool.per_env_seeds and pool.seed_every_episode
    rollout = pool.rollout(4, break_when_any_done=False)
    assert [sorted(set(rollout["episode_seed"][i, :, 0].tolist())) for i in range(3)] == [[3, 6], [4, 7], [5, 8]]
    pool.close()


@pytest.mark.parametrize("override", [None, [40, 41, 42]])
@pytest.mark.parametrize("partial", [False, True])
def test_a_reset_that_raises_leaves_the_seed_schedule_as_it_was(override, partial):
    from envs import FailingEnv

    from torchrl_swm import EnvError

    pool = EnvPool([functools.partial(counting, length=9)] * 2 + [functools.partial(FailingEnv, in_reset=True)],
                   seed=10)
    # the construction probe reset the envs once: the FailingEnv raises from now on
    before = pool._seeds.base.copy(), pool._seeds.count.copy()
    td = TensorDict({"_reset": torch.tensor([[False], [True], [True]])}, [3]) if partial else None
    with pytest.raises(EnvError, match="env 2 .*reset exploded"):
        pool.reset(td, seed=override)
    assert (pool._seeds.base == before[0]).all() and (pool._seeds.count == before[1]).all()
    pool.close()


@pytest.mark.parametrize("n", [3, 12])  # few rows: the Python-int path; many: the int64 array path
def test_per_episode_seeds_wrap_below_2_63_instead_of_overflowing(n):
    # the check at reset(seed=) covers the first episode only; s + i + k * N then crossed 2**63 mid-run
    # (an OverflowError on one path, a negative seed gymnasium refused on the other)
    top = 2**63
    base = top - n - 1
    pool = EnvPool([functools.partial(counting, length=1)] * n, seed=base)
    td = pool.reset()
    for k in range(1, 4):
        action = torch.zeros(n, dtype=torch.int64)
        td = pool.reset() if k % 2 else pool.step_and_maybe_reset(td.set("action", action))[1]
        expected = [(base + i + k * n) % top for i in range(n)]
        assert seeds_of(td) == expected
        assert [env.last_seed for env in pool.envs] == expected  # what the envs were really reset with
    pool.close()


def test_unseeded_pools_draw_their_base_seed_from_the_whole_seed_range():
    # pools seeded by chance use consecutive seeds from their base, one per episode: 32 bits of entropy let
    # many pools running millions of episodes replay each other's (5 % of 16-pool runs at 1e6 episodes each)
    from torchrl_swm.pool.seeding import SeedSchedule

    n = 7
    bases = [int(SeedSchedule(n).base[0]) for _ in range(200)]
    assert max(bases) > 2**40 and len(set(bases)) == 200
    assert all(b + n - 1 <= 2**63 - 1 for b in bases)  # every env's seed is valid
    pool = EnvPool("CartPole-v1", num_envs=n)
    seeds = pool.reset()["episode_seed"].view(-1).tolist()
    assert seeds == list(range(seeds[0], seeds[0] + n))
    pool.close()


@pytest.mark.parametrize("seed, warned", [
    ([0, 3, 6], r"env 0 \(at seed 0\) and env 1 \(at seed 3\) on one schedule: each env's seeds step by num_envs=3 "
                r"and theirs are both 0 modulo 3, so env 0 replays env 1's episodes, 1 episode behind it"),
    ([5, 50, 500], r"env 0 \(at seed 5\) and env 1 \(at seed 50\).* 15 episodes behind it"),
    ([4, 4, 6], None),  # the same seed to two envs: on purpose
    ([10, 11, 12], None),
    ([5, 5000, 9], None),  # 5 and 5000 meet only after 1665 episodes: random seeds in a wide range often would
    (7, None),
])
def test_a_list_of_seeds_putting_two_envs_on_one_schedule_warns_that_one_replays_the_other(seed, warned):
    # each env's seeds step by N: seeds equal modulo N put two envs in one residue class, where one replays the
    # other's episodes at every later reset, silently duplicating data (review A A1)
    import warnings

    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = seeds_of(pool.reset(seed=seed))
    ours = [w for w in caught if "on one schedule" in str(w.message)]
    if warned is None:
        assert not ours
    else:
        assert len(ours) == 1 and ours[0].filename == __file__, [(str(w.message), w.filename) for w in caught]
        assert re.search(warned, str(ours[0].message))
        # what it says: the env behind goes through the seeds of the one ahead
        later = [seeds_of(pool.reset()) for _ in range(20)]
        behind, ahead = (int(i) for i in re.search(r"env (\d+) replays env (\d+)", str(ours[0].message)).groups())
        assert {s[ahead] for s in [first] + later} & {s[behind] for s in later}
    pool.close()


def test_a_partial_reset_judges_only_the_rows_it_restarts():
    # the entries of rows a partial reset leaves alone are not used, so they put no env on another's schedule
    import warnings

    pool = EnvPool([functools.partial(counting, length=2)] * 3, seed=0)
    td = pool.reset()
    td["_reset"] = torch.tensor([[True], [False], [False]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seeds_of(pool.reset(td, seed=[9, 1, 2])) == [9, 1, 2]  # 9 is 0 modulo 3, as env 0's own 0 was
    td["_reset"] = torch.tensor([[True], [False], [False]])  # TorchRL's reset took the mask out of td
    with pytest.warns(UserWarning, match=r"env 1 \(at seed 1\) and env 0 \(at seed 7\).* 2 episodes behind it"):
        assert seeds_of(pool.reset(td, seed=[7, 0, 0])) == [7, 1, 2]  # 7 is env 1's class (1 modulo 3)
    pool.close()


@pytest.mark.parametrize("seed, warned", [
    ([0, 1, 1500], True),     # env 1 meets env 2 after 500 episodes: within the 1000 the check looks ahead
    ([0, 1, 3001], False),    # 1000 episodes apart: beyond it
    ([9000, 0, 1], False),    # no two envs in one residue class, whatever the order of their bases
    ([600, 0, 9], True),      # env 1 and env 2 (0 and 9, 3 episodes apart), not env 0 (600) and another
])
def test_the_overlap_check_looks_1000_episodes_ahead_within_each_residue_class(seed, warned):
    import warnings

    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool.reset(seed=seed)
    ours = [str(w.message) for w in caught if "on one schedule" in str(w.message)]
    assert bool(ours) == warned, ours
    if seed == [600, 0, 9]:
        assert "env 1 (at seed 0) and env 2 (at seed 9)" in ours[0]
    pool.close()


def test_the_overlap_check_judges_only_rows_the_seeds_restart_and_warns_once_per_pool():
    import warnings

    def ours(pool, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pool.reset(**kwargs)
        return [w for w in caught if "on one schedule" in str(w.message)]

    pool = EnvPool([functools.partial(counting, length=2)] * 3)
    assert len(ours(pool, seed=[0, 3, 6])) == 1
    assert not ours(pool, seed=[0, 3, 6])  # said once per pool: a run that resets with such lists is not flooded
    fresh = EnvPool([functools.partial(counting, length=2)] * 3, seed=0)
    fresh.reset()
    fresh._seeds.base[:] = [0, 3, 6]  # rows 0 and 1 overlap already; rows given None are not restarted now
    assert not ours(fresh, seed=[None, None, 8])
    td = fresh.reset()
    td["_reset"] = torch.tensor([[False], [False], [True]])
    assert not ours(fresh, tensordict=td, seed=[0, 0, 8])  # entries of rows a partial reset leaves are not used
    pool.close()
    fresh.close()
    unseeded_episodes = EnvPool([functools.partial(counting, length=2)] * 3, seed_every_episode=False)
    assert not ours(unseeded_episodes, seed=[0, 3, 6])  # one seed per env, no schedule: nothing to overlap
    unseeded_episodes.close()


def test_the_overlap_warning_points_at_the_callers_line_through_a_transform_or_an_export():
    import warnings

    from torchrl.envs import StepCounter, TransformedEnv

    from torchrl_swm import to_gymnasium

    for wrap in (lambda pool: TransformedEnv(pool, StepCounter()), to_gymnasium):
        pool = EnvPool([functools.partial(counting, length=2)] * 3)
        env = wrap(pool)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.reset(seed=[0, 3, 6])
        ours = [w for w in caught if "on one schedule" in str(w.message)]
        assert len(ours) == 1 and ours[0].filename == __file__, [(w.filename, w.lineno) for w in ours]
        env.close()
        pool.close()


def test_the_overlap_check_measures_from_where_each_env_is_not_where_its_schedule_began():
    # env 0 seeded 0 and 3000 episodes on is at seed 6000: a row restarted at 6002 replays its episodes one
    # episode later, though their first seeds (0 and 6002) were 3001 episodes apart (review G G7, round 17)
    import warnings

    pool = EnvPool([functools.partial(counting, length=2)] * 2, seed=0)
    td = pool.reset()
    pool._seeds.count[:] = 3001  # as after 3000 more episodes each: env 0 at seed 6000, env 1 at 6001
    td["_reset"] = torch.tensor([[False], [True]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert seeds_of(pool.reset(td, seed=[None, 6002])) == [0, 6002]  # env 0's root keeps its first episode's
    ours = [str(w.message) for w in caught if "on one schedule" in str(w.message)]
    assert len(ours) == 1 and "env 0 (at seed 6000) and env 1 (at seed 6002)" in ours[0], ours
    assert [seeds_of(pool.reset()) for _ in range(2)] == [[6002, 6004], [6004, 6006]]  # env 0 replays env 1's
    pool.close()
