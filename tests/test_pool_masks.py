"""EnvPool masks and terminal observations: "_reset", "_step", mask isolation, dynamics continuity."""

import functools
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, KeepActionEnv, counting
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mask_sequences import drive_against_reference
from tensordict import TensorDict
from torchrl.testing import rollout_consistency_assertion

from torchrl_swm import EnvPool


def counting_pool(n=4, seed=0, **kwargs):
    return EnvPool([functools.partial(counting, **kwargs)] * n, seed=seed)


def reset_mask(n, rows):
    mask = torch.zeros(n, 1, dtype=torch.bool)
    mask[list(rows)] = True
    return TensorDict({"_reset": mask}, batch_size=[n])


def test_partial_reset_touches_only_masked_rows():
    pool = counting_pool(4, length=50)
    pool.reset()
    td = pool.reset()
    for _ in range(3):
        td["action"] = torch.ones(4, dtype=torch.int64)
        td = pool.step(td)["next"].clone()
    resets_before = [env.resets_called for env in pool.envs]
    steps_before = [env.steps_called for env in pool.envs]
    out = pool.reset(td.update(reset_mask(4, [1])))
    assert [env.resets_called for env in pool.envs] == [r + (i == 1) for i, r in enumerate(resets_before)]
    assert [env.steps_called for env in pool.envs] == steps_before
    # row 1 restarted at t=0; the others keep t=3
    assert out["observation"][:, 0].tolist() == [3.0, 0.0, 3.0, 3.0]
    pool.close()


def test_reset_output_has_full_batch_and_false_done_on_reset_rows():
    pool = counting_pool(3, length=1)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    nxt = pool.step(td)["next"]
    assert nxt["done"].all() and nxt["terminated"].all() and not nxt["truncated"].any()
    out = pool._reset(reset_mask(3, [0]))
    assert out.batch_size == torch.Size([3])
    assert not out["done"][0] and out["done"][1:].all()  # unmasked rows are left as they were
    pool.close()


def test_terminal_observation_is_exact_and_reset_obs_follows():
    pool = counting_pool(2, length=3)
    td = pool.reset()
    seen = []
    for _ in range(7):
        td["action"] = torch.tensor([1, 2])
        td, td_next = pool.step_and_maybe_reset(td)
        seen.append((td["next", "observation"][:, 0].tolist(), td["next", "done"].view(-1).tolist(),
                     td_next["observation"][:, 0].tolist()))
        td = td_next
    # step 3 is the done step: next obs is the terminal count 3, the root of the next step is the reset obs 0
    assert seen[2] == ([3.0, 3.0], [True, True], [0.0, 0.0])
    assert seen[3][0] == [1.0, 1.0]
    pool.close()


def test_mask_isolation_two_same_seed_pools():
    """Reset row k in one of two same-seed pools; every other row stays identical for 300 steps."""
    n, k = 6, 2
    a = EnvPool("CartPole-v1", num_envs=n, seed=7)
    b = EnvPool("CartPole-v1", num_envs=n, seed=7)
    ta, tb = a.reset(), b.reset()
    gen = torch.Generator().manual_seed(0)
    for t in range(300):
        if t == 10:
            tb = b.reset(tb.update(reset_mask(n, [k])))
        action = torch.randint(0, 2, (n,), generator=gen)
        ta["action"], tb["action"] = action, action.clone()
        ra, ta = a.step_and_maybe_reset(ta)
        rb, tb = b.step_and_maybe_reset(tb)
        others = [i for i in range(n) if i != k]
        assert (ra[others] == rb[others]).all(), f"rows other than {k} diverged at step {t}"
    assert not torch.equal(ra["next", "observation"][k], rb["next", "observation"][k])
    a.close()
    b.close()


@pytest.mark.parametrize("truncate", [False, True])
def test_dynamics_continuity_counting_env_300_steps(truncate):
    """obs[t+1] == obs[t] + 1 within an episode; a reset restarts at 0; the episode counter grows."""
    n = 5
    pool = counting_pool(n, seed=3, max_length=9, truncate=truncate)
    rollout = pool.rollout(320, break_when_any_done=False)
    obs, nxt = rollout["observation"][..., 0], rollout["next", "observation"][..., 0]
    done = rollout["next", "done"].squeeze(-1)
    assert torch.equal(nxt, obs + 1)
    assert torch.equal(rollout["observation"][:, 1:, 0][done[:, :-1]], torch.zeros(int(done[:, :-1].sum())))
    assert torch.equal(rollout["observation"][:, 1:][~done[:, :-1]], rollout["next", "observation"][:, :-1][~done[:, :-1]])
    mixed = ((done.any(0)) & ~(done.all(0))).sum()
    assert mixed > 100, "most steps should mix done and running rows"
    # each episode's length matches its seed-drawn length (info "length")
    lengths = rollout["next", "info", "length"].squeeze(-1)
    assert torch.equal(nxt[done], lengths[done].float())
    key = "truncated" if truncate else "terminated"
    assert torch.equal(rollout["next", key], rollout["next", "done"])
    rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)
    pool.close()


def test_partial_step_freezes_rows_and_does_not_call_step():
    pool = counting_pool(4, length=50)
    td = pool.reset()
    td["action"] = torch.tensor([1, 1, 2, 2])
    td = pool.step(td)["next"].clone()
    td["action"] = torch.tensor([1, 1, 2, 2])
    td["_step"] = torch.tensor([[True], [False], [True], [False]])
    before = [env.steps_called for env in pool.envs]
    frozen_obs = td["observation"][[1, 3]].clone()
    out = pool.step(td)["next"]
    assert [env.steps_called for env in pool.envs] == [before[0] + 1, before[1], before[2] + 1, before[3]]
    assert torch.equal(out["observation"][[1, 3]], frozen_obs)
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, 2.0, 0.0]
    assert torch.equal(out["info", "t"].view(-1), torch.tensor([2, 1, 2, 1]))
    pool.close()


@pytest.mark.parametrize("backend_kwargs", [{}, {"backend": "process", "num_workers": 2}], ids=["serial", "process"])
def test_partial_step_renders_only_the_stepped_rows(backend_kwargs):
    """pixels=True: frozen rows are left alone, render() included (a slow or stateful render must not run for them)."""
    pool = EnvPool([functools.partial(counting, length=50, render_mode="rgb_array")] * 3, seed=0, pixels=True,
                   **backend_kwargs)
    try:
        td = pool.reset()
        before = pool.get_attr("renders_called")
        td["action"] = torch.ones(3, dtype=torch.int64)
        td["_step"] = torch.tensor([[True], [False], [True]])
        pool.step(td)
        assert [a - b for a, b in zip(pool.get_attr("renders_called"), before)] == [1, 0, 1]
    finally:
        pool.close()


@pytest.mark.parametrize("backend_kwargs", [{}, {"backend": "process", "num_workers": 2}], ids=["serial", "process"])
def test_an_env_keeps_the_action_arrays_it_was_given(backend_kwargs):
    """Each env gets its own copy of its action, as gymnasium's AsyncVectorEnv gives one: never a view of the
    pool's (shared-memory) action buffer, which the next step overwrites."""
    pool = EnvPool([KeepActionEnv] * 3, seed=0, **backend_kwargs)
    try:
        td = pool.reset()
        for value in (0.25, 0.5):
            pool.step(td.set("action", torch.full((3, 2), value)))
        assert [a.tolist() for a in pool.get_attr("kept", indices=[2])[0]] == [[0.25, 0.25], [0.5, 0.5]]
    finally:
        pool.close()


def test_an_action_tensor_reused_in_place_does_not_change_the_actions_an_env_kept():
    """A policy that writes each action into one preallocated tensor: the env keeps what it got at each step, so a
    float Box action of the env's own dtype must reach the env as a copy, never a view of the caller's tensor."""
    pool = EnvPool([KeepActionEnv] * 2, seed=0)
    try:
        td = pool.reset()
        action = torch.full((2, 2), 0.25)
        pool.step(td.set("action", action))
        action.fill_(0.5)
        pool.step(td.set("action", action))
        assert [a.tolist() for a in pool.get_attr("kept", indices=[1])[0]] == [[0.25, 0.25], [0.5, 0.5]]
    finally:
        pool.close()


def test_a_one_env_vector_pool_steps_under_an_all_true_step_mask():
    """An all-True "_step" (World's wait mode, a user's loop) is a plain step, also when the pool holds one env:
    a vector-backed pool must not read it as a partial step and refuse it."""
    pool = EnvPool(gym.vector.SyncVectorEnv([functools.partial(counting, max_length=9)]), seed=0)
    try:
        td = pool.reset()
        td["action"] = torch.zeros(1, dtype=torch.int64)
        td["_step"] = torch.ones(1, 1, dtype=torch.bool)
        out = pool.step(td)
        assert out["next", "observation"][0, 0].item() == 1.0 and out["next", "reward"][0].item() == 0.0
    finally:
        pool.close()


def test_frozen_done_row_keeps_reporting_done():
    pool = EnvPool([functools.partial(counting, length=1), functools.partial(counting, length=5)], seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step(td)["next"].clone()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td["_step"] = torch.tensor([[False], [True]])
    out = pool.step(td)["next"]
    assert out["done"][0] and out["terminated"][0] and out["reward"][0] == 0
    pool.close()


def test_rollout_break_when_all_done_steps_each_env_exactly_its_length():
    lengths = [2, 5, 3, 7]
    pool = EnvPool([functools.partial(counting, length=length) for length in lengths], seed=0)
    rollout = pool.rollout(50, break_when_any_done=False, break_when_all_done=True)
    assert rollout.shape == (4, max(lengths))
    assert [env.steps_called for env in pool.envs] == [length + 1 for length in lengths]  # +1: the probe step
    final = rollout["next", "observation"][:, -1, 0]
    assert final.tolist() == [float(x) for x in lengths]
    pool.close()


def test_step_mask_all_false_is_a_no_op():
    pool = counting_pool(3, length=10)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    td["_step"] = torch.zeros(3, 1, dtype=torch.bool)
    before = [env.steps_called for env in pool.envs]
    pool.step(td)
    assert [env.steps_called for env in pool.envs] == before
    pool.close()


def test_all_false_step_mask_reports_reward_zero_even_with_a_reward_at_the_root():
    """td = pool.step(td)["next"] leaves the last reward at the root; TorchRL's placeholder for a skipped step
    copies it. A frozen row reports reward 0, whether some rows or all are frozen, and keeps its observation."""
    pool = counting_pool(2, length=10)
    td = pool.reset()
    td["action"] = torch.ones(2, dtype=torch.int64)  # the counting env's reward is its action: 1
    td = pool.step(td)["next"]
    assert td["reward"].flatten().tolist() == [1.0, 1.0]
    for mask, reward in (([True, False], [1.0, 0.0]), ([False, False], [0.0, 0.0])):
        x = td.clone()
        x["action"] = torch.ones(2, dtype=torch.int64)
        x["_step"] = torch.tensor(mask).unsqueeze(-1)
        out = pool.step(x)["next"]
        assert out["reward"].flatten().tolist() == reward, mask
        assert torch.equal(out["observation"][1], td["observation"][1]) and not out["done"].any()
    pool.close()


@pytest.mark.parametrize(
    "mask, error",
    [
        (torch.ones(3, 1, dtype=torch.bool), ValueError),
        (torch.ones(4, 1, dtype=torch.int64), TypeError),
    ],
)
def test_bad_masks_raise_clear_errors(mask, error):
    pool = counting_pool(4, length=10)
    pool.reset()
    with pytest.raises(error, match="_reset"):
        pool._reset(TensorDict({"_reset": mask}, batch_size=[]))
    pool.close()


def test_mask_rows_gives_int64_row_indices_or_none_for_every_row():
    # masks.mask_rows: the selected rows as an int64 numpy array (possibly empty), None when every row is selected
    from torchrl_swm.masks import mask_rows

    rows = mask_rows(torch.tensor([[True], [False], [True]]), 3, "_reset")
    assert isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.tolist() == [0, 2]
    none = mask_rows(torch.zeros(3, dtype=torch.bool), 3, "_step")
    assert none.dtype == np.int64 and none.size == 0
    assert mask_rows(torch.ones(3, 1, dtype=torch.bool), 3, "_step") is None
    assert mask_rows(None, 3, "_step") is None
    # a 1-D mask of another length is refused, never read as row indices of the envs it covers
    with pytest.raises(ValueError, match=r"'_reset' mask: expected shape \(3, 1\) \(or \(3,\)\), one flag per env, "
                                         r"got \(2,\)"):
        mask_rows(torch.tensor([False, True]), 3, "_reset")


def test_bad_step_mask_shape():
    pool = counting_pool(4, length=10)
    bad = pool.reset()
    bad["action"] = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(TypeError, match="_step"):
        pool._step(bad.set("_step", torch.ones(4, 1)))
    pool.close()


@pytest.mark.parametrize("shape", [(3, 2), (3, 1, 1), (3, 2, 2)])
def test_masks_of_another_shape_are_refused_before_any_env_steps_or_resets(shape):
    # a row is one env: a (3, 2) mask has nothing to select within a row, and reducing it with any() (as this
    # pool once did) silently acted on rows the caller may not have meant; TorchRL's SerialEnv refuses it too
    pool = counting_pool(3, length=50)
    td = pool.reset()
    steps, resets = [env.steps_called for env in pool.envs], [env.resets_called for env in pool.envs]
    mask = torch.zeros(shape, dtype=torch.bool)
    mask.view(-1)[-1] = True
    td["action"] = torch.ones(3, dtype=torch.int64)
    expected = r"mask: expected shape \(3, 1\) \(or \(3,\)\), one flag per env, got " + re.escape(str(shape))
    with pytest.raises(ValueError, match="'_step' " + expected):
        pool.step(td.clone().set("_step", mask))
    with pytest.raises(ValueError, match="'_step' " + expected):
        pool.step_and_maybe_reset(td.clone().set("_step", mask))
    with pytest.raises(ValueError, match="'_reset' " + expected):
        pool.reset(td.clone().set("_reset", mask))
    assert [env.steps_called for env in pool.envs] == steps and [env.resets_called for env in pool.envs] == resets
    td = pool.step(td)["next"]  # the pool is still usable
    assert td["observation"][:, 0].tolist() == [1.0, 1.0, 1.0]
    pool.close()


def test_gymnasium_env_untouched_by_other_rows_reset():
    pool = EnvPool("CartPole-v1", num_envs=3, seed=1)
    pool.reset()
    states = [np.array(env.unwrapped.state).copy() for env in pool.envs]
    pool.reset(reset_mask(3, [2]))
    for i in (0, 1):
        assert np.array_equal(pool.envs[i].unwrapped.state, states[i])
    assert not np.array_equal(pool.envs[2].unwrapped.state, states[2])
    pool.close()


def test_env_instances_are_distinct():
    pool = counting_pool(3)
    assert len({id(env) for env in pool.envs}) == 3 and all(isinstance(e, CountingEnv) for e in pool.envs)
    assert isinstance(pool.envs[0], gym.Env)
    pool.close()


def test_a_partial_reset_of_a_tensordict_without_done_flags_keeps_the_envs_flags():
    """As TorchRL's own merge (_reset_check_done): the flags of rows not reset come from the env,
    with TorchRL's warning, never zero-padded (which would report finished envs as running)."""
    import warnings

    from tensordict import TensorDict

    pool = EnvPool([functools.partial(counting, length=1)] * 3, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    assert pool.step(td)["next", "done"].all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pool.reset(TensorDict({"_reset": torch.tensor([[True], [False], [False]])}, [3]))
    assert out["done"].view(-1).tolist() == [False, True, True]
    assert out["terminated"].view(-1).tolist() == [False, True, True]
    assert out["truncated"].view(-1).tolist() == [False, False, False]
    assert any("wasn't present in the input tensordict" in str(w.message) for w in caught)
    pool.close()


class _Reference:
    """Plain gymnasium envs stepped one by one, with the pool's seed schedule (env ``i``'s ``k``-th
    reset gets ``seed + i + k * n``; with ``every_episode=False`` only its first, the later ones
    continue its random stream) and its frozen-row rule (a row left out of ``"_step"`` keeps
    everything and reports reward 0)."""

    def __init__(self, seed, truncate, every_episode=True):
        self.n, self.seed, self.every_episode = len(truncate), seed, every_episode
        self.envs = [CountingEnv(max_length=4, truncate=t) for t in truncate]
        self.resets = [0] * self.n
        self.rows = [None] * self.n
        self.episode0 = None  # each env's episode counter in the first output checked (the first reset)

    def reset(self, i):
        fresh_seed = self.every_episode or self.resets[i] == 0
        s = self.seed + i + self.resets[i] * self.n if fresh_seed else self.rows[i]["seed"]
        self.resets[i] += 1
        obs, info = self.envs[i].reset(seed=s if fresh_seed else None)
        self.rows[i] = {"obs": obs, "reward": 0.0, "terminated": False, "truncated": False, "t": info["t"],
                        "length": info["length"], "seed": s}

    def step(self, i, action):
        obs, reward, terminated, truncated, info = self.envs[i].step(action)
        self.rows[i] = {**self.rows[i], "obs": obs, "reward": reward, "terminated": terminated,
                        "truncated": truncated, "t": info["t"], "length": info["length"]}

    def freeze(self, i):
        self.rows[i] = {**self.rows[i], "reward": 0.0}

    def done(self, i) -> bool:
        return self.rows[i]["terminated"] or self.rows[i]["truncated"]

    def assert_matches(self, td, where, with_reward=True):
        if self.episode0 is None:  # the pool may probe its envs once: count its episodes from here
            self.episode0 = [obs[1] for obs in td["observation"].tolist()]
        for i, row in enumerate(self.rows):
            obs = td["observation"][i].tolist()
            assert obs[0] == row["obs"][0] and obs[2] == row["obs"][2], (where, i, obs, row)
            assert obs[1] - self.episode0[i] == self.resets[i] - 1, (where, i)  # as many resets as the reference
            flags = [td[key][i].item() for key in ("terminated", "truncated", "done")]
            assert flags == [row["terminated"], row["truncated"], self.done(i)], (where, i, flags, row)
            assert td["info", "t"][i].item() == row["t"] and td["info", "length"][i].item() == row["length"], (
                where, i)
            assert td["episode_seed"][i].item() == row["seed"], (where, i)
            if with_reward:
                assert td["reward"][i].item() == row["reward"], (where, i)


def _plan(draw, n, steps, step_masks=True, smr=False):
    """``steps`` entries ``(reset, step mask, how, actions)``; a reset is None (none), "full" (``reset()``
    with no mask) or a ``"_reset"`` mask; a step mask None (no ``"_step"``) or, with ``step_masks``, a mask;
    ``how`` "step" or, with ``smr``, also "smr" (``step_and_maybe_reset``)."""
    rows = st.lists(st.booleans(), min_size=n, max_size=n)
    masks = st.one_of(rows, st.just([True] * n), st.just([False] * n))
    actions = st.lists(st.integers(0, 2), min_size=n, max_size=n)
    entry = st.tuples(st.one_of(st.none(), st.just("full"), masks), st.one_of(st.none(), masks) if step_masks
                      else st.none(), st.sampled_from(["step", "smr"]) if smr else st.just("step"), actions)
    return draw(st.lists(entry, min_size=steps // 2, max_size=steps))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 5), seed=st.integers(0, 2**40), every_episode=st.booleans())
def test_any_sequence_of_reset_and_step_masks_matches_plain_envs_stepped_one_by_one(data, n, seed, every_episode):
    truncate = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))  # per env: truncates, or terminates
    plan = data.draw(st.composite(lambda draw: _plan(draw, n, 30))())
    pool = EnvPool([functools.partial(counting, max_length=4, truncate=t) for t in truncate], seed=seed,
                   seed_every_episode=every_episode)
    try:
        drive_against_reference(pool, _Reference(seed, truncate, every_episode), plan)
    finally:
        pool.close()


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**40))
def test_any_sequence_of_masks_on_the_process_backend_matches_plain_envs(data, seed):
    truncate = [False, True, False, True]
    plan = data.draw(st.composite(lambda draw: _plan(draw, 4, 40))())
    pool = EnvPool([functools.partial(counting, max_length=4, truncate=t) for t in truncate], seed=seed,
                   backend="process", num_workers=2)
    try:
        drive_against_reference(pool, _Reference(seed, truncate), plan)
    finally:
        pool.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 5), seed=st.integers(0, 2**40),
       mode=st.sampled_from(list(AutoresetMode)), every_episode=st.sampled_from([None, True, False]))
def test_any_sequence_of_reset_masks_on_the_vector_backend_matches_plain_envs(data, n, seed, mode, every_episode):
    """A pool over a SyncVectorEnv in each autoreset mode, driven by any mix of "_reset" masks, full resets,
    step and step_and_maybe_reset: every output (obs, flags, reward, infos, episode_seed; the terminal obs of a
    done row and the reset obs that follows it) equals plain envs stepped one by one with the pool's seeds."""
    if mode is AutoresetMode.SAME_STEP and every_episode:
        every_episode = False  # documented: a seed of its own costs a SAME_STEP episode a second reset
    truncate = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    plan = data.draw(st.composite(lambda draw: _plan(draw, n, 24, step_masks=False, smr=True))())
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, max_length=4, truncate=t) for t in truncate],
                                    autoreset_mode=mode)
    pool = EnvPool(venv, seed=seed, seed_every_episode=every_episode)
    try:
        drive_against_reference(pool, _Reference(seed, truncate, pool.seed_every_episode), plan)
    finally:
        pool.close()


def test_a_step_mask_carried_into_the_next_root_is_false_on_the_rows_that_reset():
    # README: step_and_maybe_reset (and rollout) carry "_step" into the next root, False on rows that reset, as
    # TorchRL's step_mdp + maybe_reset give it (review R5: no test named "_step" for this)
    pool = EnvPool([functools.partial(counting, length=n) for n in (2, 5)], seed=0)
    td = pool.reset()
    for t in range(2):
        td = td.set("action", torch.ones(2, dtype=torch.int64)).set("_step", torch.ones(2, 1, dtype=torch.bool))
        out, td = pool.step_and_maybe_reset(td)
    assert out["next", "done"].view(-1).tolist() == [True, False]
    assert td["_step"].view(-1).tolist() == [False, True]  # env 0 was reset
    assert td["observation"][:, 0].tolist() == [0.0, 2.0]
    pool.close()
