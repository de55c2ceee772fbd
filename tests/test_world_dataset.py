"""Dataset-driven evaluation: start from dataset states, goals from later steps, budgets, chunking."""

import functools
import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import counting

import torchrl_swm.envs  # noqa: F401  (registers torchrl_swm/PointMaze-v0)
from torchrl_swm import EnvError, EnvPool, World, load_dataset
from torchrl_swm.envs import PointMazeExpert

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def maze_dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("maze") / "ds"
    with World("torchrl_swm/PointMaze-v0", num_envs=4, image_shape=(32, 32)) as world:
        world.collect(path, 10, seed=0, policy=PointMazeExpert("u", noise=0.4), progress=False)
    return load_dataset(path)


class GoalSpy(PointMazeExpert):
    """The expert, recording the goal and state the World hands it."""

    def __init__(self):
        super().__init__("u")
        self.seen = []

    def __call__(self, td):
        self.seen.append(td.select("goal", "state", "is_init").clone())
        return super().__call__(td)


def plan(ds, count, offset):
    idx = [k % ds.num_episodes for k in range(count)]
    starts = [min(k % 3, int(ds.episode_lengths[i]) - offset) for k, i in enumerate(idx)]
    return idx, starts


def test_dataset_eval_chunks_episodes_over_fewer_envs(maze_dataset):
    ds = maze_dataset
    offset, budget = 5, 25
    idx, starts = plan(ds, 7, offset)
    spy = GoalSpy()
    with World("torchrl_swm/PointMaze-v0", num_envs=3, image_shape=(32, 32), policy=spy) as world:
        result = world.evaluate(dataset=ds, episodes_idx=idx, start_steps=starts, goal_offset=offset,
                                eval_budget=budget, progress=False)
    assert result["num_episodes"] == 7 and result["reset_mode"] == "auto"
    assert result["env_indices"].tolist() == [m % 3 for m in range(7)]
    assert result["episodes_idx"].tolist() == idx and result["start_steps"].tolist() == starts
    assert (result["episode_lengths"] <= budget).all()
    assert result["success_rate"] >= 6 / 7  # the expert reaches a goal 5 expert steps away
    assert result["seeds"].tolist() == [int(ds.episode_seeds[i]) for i in idx]
    assert set(result["goal_keys"]) == {"state", "target", "pixels"}
    # the policy saw the dataset goal (observation and pixels) of each episode, and started from its state
    first = {}
    for td in spy.seen:
        for i in torch.nonzero(td["is_init"].view(-1)).view(-1).tolist():
            m = len([k for k in first if k[0] == i]) * 3 + i
            first[(i, m)] = td[i]
    assert len(first) == 7
    for (i, m), row in first.items():
        goal = ds.step(idx[m], starts[m] + offset)
        start = ds.step(idx[m], starts[m])
        assert torch.equal(row["goal", "state"], goal["state"])
        assert torch.equal(row["goal", "pixels"], goal["pixels"])
        assert torch.equal(row["state"], start["state"])



class SeedSpy(PointMazeExpert):
    """The expert, recording per env the episode_seed each new episode (is_init) was reset with."""

    def __init__(self, num_envs):
        super().__init__("u")
        self.seeds = [[] for _ in range(num_envs)]

    def __call__(self, td):
        for i in torch.nonzero(td["is_init"].view(-1)).view(-1).tolist():
            self.seeds[i].append(int(td["episode_seed"][i]))
        return super().__call__(td)


def test_dataset_eval_resets_each_episode_with_its_dataset_episodes_own_seed(maze_dataset):
    """episodes_idx in any order (not 0, 1, 2...): episode m resets with the seed of dataset episode
    episodes_idx[m], not the seed of the m-th dataset episode (evaluate's docstring: "With dataset=, episodes
    reset with the dataset episodes' own seeds")."""
    ds = maze_dataset
    idx, n = [3, 1, 2], 2
    spy = SeedSpy(n)
    with World("torchrl_swm/PointMaze-v0", num_envs=n, image_shape=(32, 32), policy=spy) as world:
        result = world.evaluate(dataset=ds, episodes_idx=idx, goal_offset=2, eval_budget=6, progress=False)
    want = [int(ds.episode_seeds[k]) for k in idx]
    assert len(set(int(s) for s in ds.episode_seeds)) == ds.num_episodes  # each episode its own seed
    assert result["seeds"].tolist() == want
    # the pool's envs were reset with them: env i runs episodes i, i + n, ... of the evaluation
    assert spy.seeds == [want[i::n] for i in range(n)]


def test_chunked_and_unchunked_runs_agree(maze_dataset):
    ds = maze_dataset
    idx, starts = plan(ds, 6, 4)
    results = []
    for n, mode in [(2, "wait"), (6, "wait"), (4, "auto")]:
        with World("torchrl_swm/PointMaze-v0", num_envs=n, image_shape=(32, 32), policy=PointMazeExpert("u")) as w:
            results.append(w.evaluate(dataset=ds, episodes_idx=idx, start_steps=starts, goal_offset=4, eval_budget=12,
                                      reset_mode=mode, progress=False))
    for other in results[1:]:
        for key in ("episode_successes", "episode_lengths", "episode_returns", "steps_to_success"):
            assert np.array_equal(results[0][key], other[key], equal_nan=True), key


def test_goal_is_the_env_target_so_success_means_reaching_the_dataset_goal(maze_dataset):
    ds = maze_dataset
    idx, starts = [0, 1], [0, 0]
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32), policy=PointMazeExpert("u")) as w:
        result = w.evaluate(dataset=ds, episodes_idx=idx, start_steps=starts, goal_offset=3, eval_budget=15,
                            progress=False)
        for i in range(2):
            target = w.pool.envs[i].unwrapped._target
            assert np.allclose(target, ds.step(idx[i], 3)["state"][:2].numpy(), atol=1e-6)
    assert result["episode_successes"].all()


def test_goal_offset_zero_starts_solved(maze_dataset):
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32), policy=PointMazeExpert("u")) as w:
        result = w.evaluate(dataset=maze_dataset, episodes_idx=[0, 1], goal_offset=0, eval_budget=3, progress=False)
    assert result["start_successes"].all()
    assert "already successful at reset" in result.summary()


def test_errors(maze_dataset, tmp_path):
    ds = maze_dataset
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32)) as w:
        with pytest.raises(ValueError, match="goal_offset= and eval_budget="):
            w.evaluate(dataset=ds, episodes_idx=[0], progress=False)
        too_far = int(ds.episode_lengths[0]) + 1
        with pytest.raises(ValueError, match="within the episode"):
            w.evaluate(dataset=ds, episodes_idx=[0], goal_offset=too_far, eval_budget=5, progress=False)
        with pytest.raises(IndexError, match="out of range"):
            w.evaluate(dataset=ds, episodes_idx=[99], goal_offset=1, eval_budget=5, progress=False)
        with pytest.raises(ValueError, match="start_steps"):
            w.evaluate(dataset=ds, episodes_idx=[0, 1], start_steps=[0], goal_offset=1, eval_budget=5, progress=False)
        with pytest.raises(ValueError, match="options"):
            w.evaluate(dataset=ds, episodes_idx=[0], goal_offset=1, eval_budget=5, options={}, progress=False)
        with pytest.raises(ValueError, match=r"max_steps=9 cannot be combined with dataset=.*eval_budget="):
            w.evaluate(dataset=ds, episodes_idx=[0], goal_offset=1, eval_budget=5, max_steps=9, progress=False)
        # a state hook that ignores the dataset state is caught by the start check
        with pytest.raises(RuntimeError, match="did not start from the dataset state"):
            w.evaluate(dataset=ds, episodes_idx=[3], start_steps=[2], goal_offset=1, eval_budget=5,
                       reset_options_fn=lambda start, goal: {}, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(64, 64)) as w:
        with pytest.raises(ValueError, match="image_shape"):
            w.evaluate(dataset=ds, episodes_idx=[0], goal_offset=1, eval_budget=5, progress=False)


def test_a_negative_episodes_idx_is_out_of_range_not_counted_from_the_end(maze_dataset):
    # episodes_idx are storage positions 0..num_episodes-1: a negative one is refused, never read as Python's -1
    with World("torchrl_swm/PointMaze-v0", num_envs=1, image_shape=(32, 32)) as w:
        with pytest.raises(IndexError, match=r"episodes_idx\[1\] = -1 is out of range"):
            w.evaluate(dataset=maze_dataset, episodes_idx=[0, -1], goal_offset=1, eval_budget=5, progress=False)
        n = maze_dataset.num_episodes  # one past the last: refused by name, not by numpy's own IndexError
        with pytest.raises(IndexError, match=rf"episodes_idx\[0\] = {n} is out of range: the dataset has {n} episodes"):
            w.evaluate(dataset=maze_dataset, episodes_idx=[n], goal_offset=1, eval_budget=5, progress=False)


def test_bad_argument_types_are_named(maze_dataset):
    ds = maze_dataset
    run = dict(goal_offset=1, eval_budget=5, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32)) as w:
        with pytest.raises(TypeError, match="episodes_idx: expected a list of values, got int 1"):
            w.evaluate(dataset=ds, episodes_idx=1, **run)
        with pytest.raises(TypeError, match="start_steps: expected an int or a list of values, got float 1.0"):
            w.evaluate(dataset=ds, episodes_idx=[0], start_steps=1.0, **run)
        for zero in (np.int64(0), np.array(0), torch.tensor(0)):  # 0-d integers are ints, as check_int reads them
            result = w.evaluate(dataset=ds, episodes_idx=[0, 1], start_steps=zero, **run)
            assert result["start_steps"].tolist() == [0, 0]
        assert w.evaluate(dataset=ds, episodes_idx=np.array([1]), start_steps=torch.tensor([1]),
                          **run)["start_steps"].tolist() == [1]
        with pytest.raises(TypeError, match="dataset= expected a path to a dataset or a WorldDataset.*got int 123"):
            w.evaluate(dataset=123, **run)
        for name in ("success_fn", "reset_options_fn"):
            with pytest.raises(TypeError, match=f"evaluate: {name}= expected a callable.*got int 3"):
                w.evaluate(dataset=ds, episodes_idx=[0], **{name: 3}, **run)
        with pytest.raises(TypeError, match="success_fn= expected a callable"):
            w.evaluate(episodes=1, success_fn="reached", progress=False)  # refused before any env runs
        # check_start: a bare string is one key, as exclude_keys= takes it (not its characters)
        result = w.evaluate(dataset=ds, episodes_idx=[0], check_start="state", **run)
        assert result["num_episodes"] == 1
        # and a tuple of names is as ambiguous as for exclude_keys= (one nested key, or several keys?)
        with pytest.raises(TypeError, match=r"check_start=\('state', 'target'\) is ambiguous: pass a list"):
            w.evaluate(dataset=ds, episodes_idx=[0], check_start=("state", "target"), **run)
        assert w.evaluate(dataset=ds, episodes_idx=[0], check_start=[("state",)], **run)["num_episodes"] == 1


@pytest.mark.parametrize("goal_key", ["is_init", "done", "terminated", "action", "reward", "next", "episode", "_reset"])
def test_goal_key_cannot_replace_what_world_or_torchrl_writes(maze_dataset, goal_key):
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32)) as w:
        with pytest.raises(ValueError, match=f"goal_key={goal_key!r} is a key World or TorchRL writes"):
            w.evaluate(dataset=maze_dataset, episodes_idx=[0], goal_offset=1, eval_budget=5, goal_key=goal_key,
                       progress=False)


def test_env_without_state_hook_gets_a_clear_error(tmp_path):
    pool = EnvPool([functools.partial(counting, max_length=6)] * 2, seed=0)
    world = World(pool, max_episode_steps=10)
    ds = world.collect(tmp_path / "d", 3, seed=0, progress=False)
    with pytest.raises(TypeError, match="reset_options_from_dataset"):
        world.evaluate(dataset=ds, episodes_idx=[0, 1], goal_offset=1, eval_budget=4, progress=False)
    # a user-supplied hook works with any env whose reset honours the options it returns
    result = world.evaluate(dataset=tmp_path / "d", episodes_idx=[0, 1, 2], goal_offset=1, eval_budget=4,
                            reset_options_fn=lambda start, goal: {"length": 2}, progress=False)
    assert result["episode_lengths"].tolist() == [2, 2, 2]
    pool.close()


def test_a_dataset_without_seeds_resets_episode_j_of_the_evaluation_with_seed_plus_j(tmp_path):
    # evaluate's docstring: with no recorded seeds, episode j resets with seed + j (j its evaluation index, not
    # the position of its dataset episode: episodes_idx out of order tells them apart)
    pool = EnvPool([functools.partial(counting, max_length=6)] * 2, seed=0)
    world = World(pool, max_episode_steps=10)
    ds = world.collect(tmp_path / "d", 3, seed=0, exclude_keys="episode_seed", progress=False)
    assert ds.episode_seeds is None
    result = world.evaluate(dataset=ds, episodes_idx=[2, 0, 1], seed=10, goal_offset=1, eval_budget=4,
                            reset_options_fn=lambda start, goal: {"length": 2}, progress=False)
    assert result["seeds"].tolist() == [10, 11, 12]
    assert [env.last_seed for env in pool.envs] == [12, 11]  # env 0 ran episodes 0 and 2, env 1 episode 1
    pool.close()


class _UnpicklableHookEnv(gym.Wrapper):
    """A PointMaze whose state hook cannot leave a worker process: the env it is bound to holds a lock."""

    def __init__(self):
        import threading

        super().__init__(gym.make("torchrl_swm/PointMaze-v0"))
        self.lock = threading.Lock()

    def reset_options_from_dataset(self, start, goal):
        return self.env.get_wrapper_attr("reset_options_from_dataset")(start, goal)


def test_a_state_hook_a_worker_cannot_send_back_is_named_not_reported_missing(maze_dataset):
    pool = EnvPool([_UnpicklableHookEnv] * 2, backend="process", num_workers=2, seed=0)
    with pytest.raises(EnvError, match=r"env 0 has 'reset_options_from_dataset', but it could not be fetched .*pickle"):
        World(pool).evaluate(dataset=maze_dataset, episodes_idx=[0], goal_offset=1, eval_budget=3, progress=False)
    pool.close()


def test_dataset_eval_with_reset_options_fn_over_a_natively_batched_vector_env(tmp_path):
    # CartPoleVectorEnv has no per-env attributes to look a state hook up in: reset_options_fn= is the way
    world = World(EnvPool(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")))
    world.collect(tmp_path / "ds", episodes=2, seed=0, progress=False)
    calls = []
    result = world.evaluate(dataset=tmp_path / "ds", episodes=2, seed=0, goal_offset=3, eval_budget=5,
                            reset_options_fn=lambda start, goal: calls.append((start, goal)) or {}, progress=False)
    assert result["episode_lengths"].tolist() == [5, 5] and len(calls) == 2  # one per episode
    # the vector env takes one options dict for every row it resets: per-episode start states are refused
    with pytest.raises(ValueError, match="one options dict for every row it resets"):
        world.evaluate(dataset=tmp_path / "ds", episodes=2, seed=0, goal_offset=3, eval_budget=5,
                       reset_options_fn=lambda start, goal: {"start": id(start)}, progress=False)
    with pytest.raises(TypeError, match="has no state hook"):
        world.evaluate(dataset=tmp_path / "ds", episodes=2, goal_offset=3, eval_budget=5, progress=False)
    world.close()


def test_dataset_eval_needs_an_envpool(maze_dataset):
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    with pytest.raises(TypeError, match="EnvPool"):
        World(env).evaluate(dataset=maze_dataset, episodes_idx=[0], goal_offset=1, eval_budget=3, progress=False)
    env.close(raise_if_closed=False)


def test_process_backend_gives_the_same_results(maze_dataset):
    """The state hook is found through gymnasium wrappers on any backend (here: worker processes)."""
    kwargs = dict(dataset=maze_dataset, episodes_idx=[0, 1, 2, 3, 4], goal_offset=4, eval_budget=12, progress=False)
    results = []
    for backend in ("serial", "process"):
        extra = {"num_workers": 2} if backend == "process" else {}
        world = World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32), seed=0, backend=backend,
                      policy=PointMazeExpert("u"), **extra)
        results.append((world.evaluate(**kwargs), world.evaluate(6, seed=3, progress=False)))
        world.close()
    for a, b in zip(*results):
        for key in ("episode_lengths", "episode_returns", "episode_successes", "seeds"):
            assert np.array_equal(a[key], b[key]), key


class GoalMutator(GoalSpy):
    """Records the goal it is handed, then edits it in place (as an in-place normalisation would)."""

    def __call__(self, td):
        out = super().__call__(td)
        td["goal", "state"].mul_(0.5)
        td["goal", "pixels"].zero_()
        return out


def test_a_policy_editing_the_goal_in_place_does_not_change_later_goals(maze_dataset):
    ds = maze_dataset
    idx, starts, offset, budget = [3, 1, 4], [0, 1, 0], 6, 10
    kwargs = dict(dataset=ds, episodes_idx=idx, start_steps=starts, goal_offset=offset, eval_budget=budget,
                  progress=False)
    results = []
    for policy in (GoalMutator(), GoalSpy()):
        with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32), policy=policy) as world:
            results.append(world.evaluate(**kwargs))
        # every step of every episode saw its dataset goal, unchanged by the policy's earlier edits
        episode = [0, 1]  # the plan each env is running
        steps = 0
        for td in policy.seen:
            for i in range(2):
                if td["is_init"][i].item() and steps:
                    episode[i] += 2
                m = episode[i]
                if m >= len(idx):
                    continue
                goal = ds.step(idx[m], starts[m] + offset)
                assert torch.equal(td["goal", "state"][i], goal["state"]), (steps, i)
                assert torch.equal(td["goal", "pixels"][i], goal["pixels"]), (steps, i)
            steps += 1
        assert steps >= 4  # several steps per episode, each checked
    for key in ("episode_successes", "episode_lengths", "episode_returns"):
        assert np.array_equal(results[0][key], results[1][key]), key


def test_episodes_without_episodes_idx_takes_the_first_dataset_episodes(maze_dataset):
    ds = maze_dataset
    with World("torchrl_swm/PointMaze-v0", num_envs=2, image_shape=(32, 32), policy=PointMazeExpert("u")) as w:
        kwargs = dict(dataset=ds, goal_offset=1, eval_budget=5, progress=False)
        result = w.evaluate(3, **kwargs)  # no episodes_idx: the first 3 dataset episodes
        assert result["num_episodes"] == 3 and result["episodes_idx"].tolist() == [0, 1, 2]
        same = w.evaluate(episodes_idx=[0, 1, 2], **kwargs)
        assert np.array_equal(result["episode_lengths"], same["episode_lengths"])
        assert w.evaluate(**kwargs)["episodes_idx"].tolist() == list(range(ds.num_episodes))  # default: all
        with pytest.raises(ValueError, match=rf"episodes=11 but the dataset holds {ds.num_episodes} episodes"):
            w.evaluate(11, **kwargs)
        with pytest.raises(ValueError, match="episodes=3 but episodes_idx has 2 entries"):
            w.evaluate(3, episodes_idx=[0, 1], **kwargs)


@pytest.mark.parametrize("bad", [1.5, True, "1"])
def test_dataset_episode_and_step_indices_are_not_truncated(maze_dataset, bad):
    with pytest.raises(TypeError, match=r"episode: expected an int"):
        maze_dataset.episode(bad)
    with pytest.raises(TypeError, match=r"episode: expected an int"):
        maze_dataset.step(bad, 0)
    with pytest.raises(TypeError, match=r"step: expected an int"):
        maze_dataset.step(0, bad)
    assert maze_dataset.episode(np.int64(1))["action"].shape[0] == maze_dataset.episode_lengths[1]


def test_evaluating_a_dataset_on_another_env_warns_naming_both(maze_dataset):
    with World("torchrl_swm/PointMaze-Open-v0", num_envs=2, reward_type="sparse") as world:
        with pytest.warns(UserWarning, match=r"collected on 'torchrl_swm/PointMaze-v0', but this World runs "
                                             r"'torchrl_swm/PointMaze-Open-v0'") as caught:
            world.evaluate(dataset=maze_dataset, episodes=2, goal_offset=3, eval_budget=5, progress=False)
    # one warning (the other env's arguments are not compared), pointing at the caller's line
    assert len([w for w in caught if w.category is UserWarning]) == 1 and caught[0].filename == __file__
    for same in ("torchrl_swm/PointMaze-v0", "torchrl_swm.envs:torchrl_swm/PointMaze-v0"):  # gym.make's module:id
        with World(same, num_envs=2) as world, warnings.catch_warnings():
            warnings.simplefilter("error")  # the same env: no warning
            world.evaluate(dataset=maze_dataset, episodes=2, goal_offset=3, eval_budget=5, progress=False)


def test_evaluating_a_dataset_with_other_env_kwargs_of_the_same_id_warns_naming_them(maze_dataset):
    # the dataset's env: PointMaze-v0 with its registered layout "u"; here the same id on another maze
    kwargs = dict(dataset=maze_dataset, episodes=2, goal_offset=3, eval_budget=5, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, layout="open") as world:
        with pytest.warns(UserWarning, match=r"other keyword arguments than this World's \(layout: 'u' there, "
                                             r"'open' here\)") as caught:
            world.evaluate(**kwargs)
    assert caught[0].filename == __file__  # the caller's line
    with World("torchrl_swm/PointMaze-v0", num_envs=2, layout="u") as world, warnings.catch_warnings():
        warnings.simplefilter("error")  # the id's registered layout, spelled out: the same env
        world.evaluate(**kwargs)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="sparse", render_size=32) as world:
        with pytest.warns(UserWarning, match=r"\(render_size: given here only, reward_type: given here only\)"):
            world.evaluate(**kwargs)
    # the pool's own arguments (num_envs, image_shape, seed, ...) may differ freely
    with World("torchrl_swm/PointMaze-v0", num_envs=3, seed=7) as world, warnings.catch_warnings():
        warnings.simplefilter("error")
        world.evaluate(**kwargs)


def test_a_dataset_env_kwarg_given_on_both_sides_with_other_values_is_named_with_both(tmp_path):
    path = tmp_path / "ds"
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="sparse") as world:
        world.collect(path, 2, seed=0, policy=PointMazeExpert("u", noise=0.4), progress=False)
    kwargs = dict(dataset=path, episodes=2, goal_offset=1, eval_budget=3, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="dense") as world:
        with pytest.warns(UserWarning, match=r"\(reward_type: 'sparse' there, 'dense' here\)"):
            world.evaluate(**kwargs)
    with World("torchrl_swm/PointMaze-v0", num_envs=2) as world:
        with pytest.warns(UserWarning, match=r"\(reward_type: given there only\)"):
            world.evaluate(**kwargs)
    with World("torchrl_swm/PointMaze-v0", num_envs=4, reward_type="sparse") as world, warnings.catch_warnings():
        warnings.simplefilter("error")
        world.evaluate(**kwargs)
    with World(EnvPool("torchrl_swm/PointMaze-v0", num_envs=2)) as world, warnings.catch_warnings():
        warnings.simplefilter("error")  # a World over a built pool does not know its env's arguments: no warning
        world.evaluate(**kwargs)


def test_a_dataset_env_kwarg_without_a_json_form_is_compared_by_its_type(tmp_path):
    from collections import UserList

    from torchrl_swm.envs import LAYOUTS

    path = tmp_path / "ds"
    u_rows = UserList(LAYOUTS["u"])  # a sequence of rows that is not a list or tuple: no JSON form
    with World("torchrl_swm/PointMaze-v0", num_envs=2, layout=u_rows) as world:
        world.collect(path, 2, seed=0, policy=PointMazeExpert("u", noise=0.4), progress=False)
    kwargs = dict(dataset=path, episodes=2, goal_offset=1, eval_budget=3, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, layout="open") as world:
        with pytest.warns(UserWarning, match=r"\(layout: a UserList \(no JSON form\) there, 'open' here\)"):
            world.evaluate(**kwargs)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, layout=u_rows) as world, warnings.catch_warnings():
        warnings.simplefilter("error")  # without a JSON form on both sides: not compared
        world.evaluate(**kwargs)


def test_a_dataset_from_unversioned_ids_of_two_envs_warns_naming_both(tmp_path):
    # ids without "-v": both Worlds were built from an id (their records hold num_envs), so the ids are compared
    for name, layout in (("MazeU", "u"), ("MazeOpen", "open")):
        gym.register(name, entry_point="torchrl_swm.envs.point_maze:PointMazeEnv", kwargs={"layout": layout},
                     max_episode_steps=60)
    try:
        with World("MazeU", num_envs=2) as world:
            world.collect(tmp_path / "ds", 2, seed=0, policy=PointMazeExpert("u", noise=0.4), progress=False)
        with World("MazeOpen", num_envs=2) as world:
            with pytest.warns(UserWarning, match=r"collected on 'MazeU', but this World runs 'MazeOpen'"):
                world.evaluate(dataset=tmp_path / "ds", episodes=2, goal_offset=1, eval_budget=3, progress=False)
    finally:
        for name in ("MazeU", "MazeOpen"):
            gym.registry.pop(name)


def test_a_dataset_recorded_before_unrecordable_arguments_were_named_compares_what_both_give(tmp_path):
    path = tmp_path / "ds"
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="sparse") as world:
        world.collect(path, 2, seed=0, policy=PointMazeExpert("u", noise=0.4), progress=False)
    meta = json.loads((path / "dataset.json").read_text())
    del meta["env_kwargs_unrecorded"]  # an older record: dicts and numpy values were left out without a word
    (path / "dataset.json").write_text(json.dumps(meta))
    kwargs = dict(dataset=path, episodes=2, goal_offset=1, eval_budget=3, progress=False)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="sparse", goal_radius=0.3) as world, \
            warnings.catch_warnings():
        warnings.simplefilter("error")  # goal_radius may be one the old record left out: not compared
        world.evaluate(**kwargs)
    with World("torchrl_swm/PointMaze-v0", num_envs=2, reward_type="dense") as world:
        with pytest.warns(UserWarning, match=r"\(reward_type: 'sparse' there, 'dense' here\)"):
            world.evaluate(**kwargs)


def test_episodes_with_episodes_idx_is_not_truncated_either(maze_dataset):
    with World("torchrl_swm/PointMaze-v0", num_envs=2) as world:
        with pytest.raises(TypeError, match=r"episodes: expected an int, got float 2\.5"):
            world.evaluate(dataset=maze_dataset, episodes=2.5, episodes_idx=[0, 1], goal_offset=3, eval_budget=5,
                           progress=False)


class _NestedReach(gym.Env):
    """GoalEnv-style Dict observation whose "observation" is itself a Dict(pos, vel); the dataset hook restores
    both (``vel_error`` spoils the velocity it restores, to check that check_start compares nested leaves)."""

    dataset_state_keys = ("observation",)

    def __init__(self, vel_error=0.0):
        box = gym.spaces.Box(-10, 10, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            observation=gym.spaces.Dict(pos=box, vel=box), achieved_goal=box, desired_goal=box
        )
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.vel_error = vel_error

    def _obs(self):
        return {"observation": {"pos": self.pos.copy(), "vel": self.vel.copy()}, "achieved_goal": self.pos.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-5, 5, 2).astype(np.float32)
        self.vel = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-5, 5, 2).astype(np.float32)
        for name in ("pos", "vel", "goal"):
            if options and name in options:
                setattr(self, name, np.asarray(options[name], np.float32).copy())
        return self._obs(), {}

    def step(self, action):
        self.vel = np.clip(action, -1, 1).astype(np.float32)
        self.pos = np.clip(self.pos + self.vel, -10, 10).astype(np.float32)
        return self._obs(), 0.0, False, False, {"is_success": float(np.linalg.norm(self.pos - self.goal) < 0.5)}

    def reset_options_from_dataset(self, start, goal):
        obs = start["observation"]
        return {"pos": obs["pos"], "vel": np.asarray(obs["vel"]) + self.vel_error, "goal": goal["achieved_goal"]}


def test_check_start_compares_the_leaves_of_a_nested_observation(tmp_path):
    pool = EnvPool([_NestedReach] * 2, seed=0)
    World(pool, max_episode_steps=6).collect(tmp_path / "ds", episodes=2, seed=1, progress=False)
    ds = load_dataset(tmp_path / "ds")
    result = World(pool).evaluate(dataset=ds, goal_offset=3, eval_budget=4, check_start=["observation"], progress=False)
    assert result["num_episodes"] == 2
    pool.close()
    spoiled = EnvPool([functools.partial(_NestedReach, vel_error=0.5)] * 2, seed=0)
    with pytest.raises(RuntimeError, match=r"env 0 did not start from the dataset state for episode 0: "
                                           r"\('observation', 'vel'\) is"):
        World(spoiled).evaluate(dataset=ds, goal_offset=3, eval_budget=4, check_start=["observation"], progress=False)
    spoiled.close()


def test_dataset_evaluation_and_the_expert_on_an_async_vector_env_pool(tmp_path):
    # an AsyncVectorEnv's call reaches every env: env 0's attributes are read from all of them's answers
    from torchrl_swm.envs import expert_policy, make

    with World("torchrl_swm/PointMaze-v0", num_envs=2, policy=PointMazeExpert("u")) as world:
        ds = world.collect(tmp_path / "ds", 2, seed=0, progress=False)
    factory = functools.partial(make, "torchrl_swm/PointMaze-v0")
    results = []
    for kind in (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv):
        pool = EnvPool(kind([factory] * 2))
        try:
            assert isinstance(expert_policy(pool), PointMazeExpert)
            for k in (0, 1):  # one episode at a time: a VectorEnv takes one options dict for the rows it resets
                result = World(pool, PointMazeExpert("u")).evaluate(dataset=ds, episodes_idx=[k], goal_offset=2,
                                                                    eval_budget=5, progress=False)
                results.append((kind, result["episode_lengths"].tolist(), result["episode_successes"].tolist()))
        finally:
            pool.close()
    assert [r[1:] for r in results[:2]] == [r[1:] for r in results[2:]] and all(r[2] == [True] for r in results)
