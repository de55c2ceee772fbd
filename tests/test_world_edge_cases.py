"""Edge cases of World, its datasets, make_env, the quickstart's and the CLI's arguments, and pool seeds."""

import functools
import pickle
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import counting
from tensordict import MemoryMappedTensor, TensorDict
from torch import nn
from torchrl.envs import Compose, RenameTransform, RewardSum, StepCounter, Transform, TransformedEnv

import torchrl_swm
from torchrl_swm import EnvPool, World, WorldModelEnv, cli, load_dataset, make_world_model_env
from torchrl_swm.data import DatasetWriter
from torchrl_swm.errors import EnvError
from torchrl_swm.quickstart import parse_args

torch.set_num_threads(1)


def collect_cartpole(path, episodes=3):
    with World("CartPole-v1", num_envs=2) as world:
        world.collect(path, episodes, seed=0, progress=False)
    return path


# -- 1. a loaded dataset is copy-on-write ------------------------------------------------------------
def test_loaded_dataset_reads_the_stored_data_and_in_place_edits_never_reach_the_files(tmp_path):
    path = collect_cartpole(tmp_path / "ds")
    raw = TensorDict.load_memmap(path / "storage")  # the files as written
    ds = load_dataset(path)
    n = ds.num_steps
    stored_obs = raw["observation"][:n].clone()
    stored_reward = raw["next", "reward"][:n].clone()
    assert torch.equal(ds.td["observation"], stored_obs)  # reads give the stored data
    assert torch.equal(ds.td["next", "reward"], stored_reward)
    start, length = int(ds.episode_starts[1]), int(ds.episode_lengths[1])
    assert torch.equal(ds.episode(1)["observation"], stored_obs[start:start + length])

    ds.episode(0)["observation"] -= 100.0  # "normalise my copy of the episode"
    ds.td["next", "reward"].mul_(0.0)
    ds.td["observation"][-1] = 42.0

    reopened = load_dataset(path)
    assert torch.equal(reopened.td["observation"], stored_obs)
    assert torch.equal(reopened.td["next", "reward"], stored_reward)
    assert torch.equal(TensorDict.load_memmap(path / "storage")["observation"][:n], stored_obs)


def test_replay_buffer_extend_does_not_overwrite_the_dataset_on_disk(tmp_path):
    path = collect_cartpole(tmp_path / "ds")
    ds = load_dataset(path)
    before = ds.td["observation"].clone()
    rb = ds.replay_buffer(batch_size=4)
    assert len(rb) == ds.num_steps
    assert rb.sample()["observation"].shape == (4, 4)
    new = ds.td[:2].to_tensordict().apply(lambda x: torch.full_like(x, 7) if x.dtype.is_floating_point else x)
    rb.extend(new)  # a full storage overwrites its oldest rows: in memory only
    after = load_dataset(path).td["observation"]
    assert torch.equal(after, before), "rb.extend overwrote dataset rows on disk"


# -- 2. World refuses envs whose reward/done keys are not the defaults ---------------------------------
def test_world_refuses_a_renamed_reward_key_at_construction_naming_both_keys():
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), RenameTransform(in_keys=["reward"], out_keys=["r"]))
    try:
        with pytest.raises(ValueError) as info:
            World(env)
        msg = str(info.value)
        assert "['r']" in msg  # the env's reward keys
        assert "'reward'" in msg  # what World expects
    finally:
        env.close()


# -- 3. make_env builds process/serial EnvPools -------------------------------------------------------
@pytest.mark.parametrize("backend, kwargs", [("process", {"num_workers": 2}), ("serial", {})])
def test_make_env_builds_an_env_pool_with_the_serial_or_process_backend(backend, kwargs):
    pool = torchrl_swm.make_env("CartPole-v1", backend=backend, num_envs=2, seed=0, **kwargs)
    try:
        assert isinstance(pool, EnvPool)
        assert pool.batch_size == torch.Size([2])
        assert type(pool._backend).__name__.lower().startswith(backend)
        rollout = pool.rollout(5, break_when_any_done=False)
        assert rollout.batch_size == torch.Size([2, 5])
        assert rollout["episode_seed"][:, 0, 0].tolist() == [0, 1]
    finally:
        start = time.monotonic()
        pool.close()
        assert time.monotonic() - start < 15


# -- 4. quickstart validates its sizes as usage errors -------------------------------------------------
@pytest.mark.parametrize("extra, flag", [
    (["--num-envs", "0"], "--num-envs"),
    (["--eval-episodes", "0"], "--eval-episodes"),
    (["--top-k", "99"], "--top-k"),
    (["--seed", "-1"], "--seed"),
])
def test_quickstart_bad_sizes_are_usage_errors_naming_the_flag(extra, flag, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--tiny", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    # the valid neighbours of those values still parse
    cfg = parse_args(["--tiny", "--num-envs", "1", "--seed", "0", "--top-k", "2", "--candidates", "2"])
    assert (cfg.num_envs, cfg.seed, cfg.top_k, cfg.candidates) == (1, 0, 2, 2)
    if flag == "--top-k":
        assert "--candidates" in err


# -- 5. --traceback after the subcommand ---------------------------------------------------------------
def test_cli_traceback_flag_after_the_subcommand_raises_the_error(capsys):
    failing = ["eval", "CartPole-v1", "--episodes", "1", "--num-envs", "1", "--no-progress",
               "--env-kwargs", '{"bogus": 1}']
    with pytest.raises(EnvError, match="bogus"):
        cli.main([*failing, "--traceback"])
    assert cli.main(failing) == 1  # without it: one line, exit 1
    assert "run with --traceback" in capsys.readouterr().err
    with pytest.raises(EnvError, match="bogus"):
        cli.main(["--traceback", *failing])  # before the command, as before


# -- 6. seeds and replay-buffer sizes are checked up front -----------------------------------------------
@pytest.mark.parametrize("seed", [2**62, 2**63 - 1, 2**64])
def test_world_evaluate_and_collect_refuse_seeds_past_the_limit(seed, tmp_path):
    with World("CartPole-v1", num_envs=2) as world:
        with pytest.raises(ValueError, match=r"seed.*2\*\*62"):
            world.evaluate(2, seed=seed, progress=False)
        with pytest.raises(ValueError, match=r"seed.*2\*\*62"):
            world.collect(tmp_path / "ds", 2, seed=seed, progress=False)
        assert world.evaluate(2, seed=2**62 - 10, progress=False)["seeds"].tolist() == [2**62 - 10, 2**62 - 9]


@pytest.mark.parametrize("kwargs, name", [
    ({"slice_len": 0, "num_slices": 4}, "slice_len"),
    ({"slice_len": -2, "num_slices": 4}, "slice_len"),
    ({"slice_len": 2, "num_slices": 0}, "num_slices"),
])
def test_replay_buffer_refuses_non_positive_slice_sizes_naming_the_argument(kwargs, name, tmp_path):
    ds = load_dataset(collect_cartpole(tmp_path / "ds", episodes=2))
    with pytest.raises(ValueError, match=name) as info:
        ds.replay_buffer(**kwargs)
    assert str(kwargs[name]) in str(info.value)
    batch = ds.replay_buffer(slice_len=2, num_slices=3).sample()  # a valid one still samples
    assert batch.shape == (6,)


# -- 7. the seed schedule behind the factory recipes (w * 2**32 per worker) ---------------------------------
def episode_seeds(rollout, env):
    root, nxt = rollout["episode_seed"][env], rollout["next", "episode_seed"][env]
    return set(root.view(-1).tolist()) | set(nxt.view(-1).tolist())


@pytest.mark.parametrize("seed", [0, 2**32])
def test_pool_seeded_s_uses_the_seeds_s_onward_one_per_episode(seed):
    # passes on the old code too: it pins the documented schedule the README/tutorial spacing relies on
    n = 2
    pool = EnvPool.factory("CartPole-v1", num_envs=n, seed=seed)()
    try:
        rollout = pool.rollout(200, break_when_any_done=False)  # random actions: many episodes
    finally:
        pool.close()
    # episodes started per env and recorded: an episode that ends on the last step starts after the rollout
    counts = [int(rollout["next", "done"][i, :-1].sum()) + 1 for i in range(n)]
    assert sum(counts) > 10
    for i in range(n):  # env i's k-th episode has the seed s + i + k * N
        assert episode_seeds(rollout, i) == {seed + i + k * n for k in range(counts[i])}
    everything = episode_seeds(rollout, 0) | episode_seeds(rollout, 1)
    assert len(everything) == sum(counts) and min(everything) == seed and max(everything) < seed + n * max(counts)


def test_equal_length_episodes_use_exactly_the_seeds_s_to_s_plus_e_minus_1():
    # passes on the old code too; pins why workers 1000 apart would replay each other's episodes
    n, length, steps = 3, 2, 40
    seeds = {}
    for s in (0, 2**32):
        pool = EnvPool([functools.partial(counting, length=length)] * n, seed=s)
        try:
            rollout = pool.rollout(steps, break_when_any_done=False)
        finally:
            pool.close()
        seeds[s] = set().union(*(episode_seeds(rollout, i) for i in range(n)))
        episodes = n * (steps // length)  # the rollout's reset, then a new one after each but the last episode
        assert seeds[s] == set(range(s, s + episodes))
    assert not seeds[0] & seeds[2**32]


# -- 8. a pickled loaded dataset stays copy-on-write ------------------------------------------------------------
def test_pickled_loaded_dataset_reads_the_files_and_writes_into_the_copy_never_reach_them(tmp_path):
    path = collect_cartpole(tmp_path / "ds", episodes=2)
    ds = load_dataset(path)
    stored_obs = ds.td["observation"].clone()
    stored_reward = ds.td["next", "reward"].clone()
    start, length = int(ds.episode_starts[1]), int(ds.episode_lengths[1])
    for part, rows in [(ds.td, slice(None)), (ds.episode(0), slice(0, int(ds.episode_lengths[0]))),
                       (ds.episode(1), slice(start, start + length)), (ds.td[:5], slice(0, 5))]:
        copy_ = pickle.loads(pickle.dumps(part))  # what a spawn worker / a Ray actor receives
        assert copy_.batch_size == part.batch_size
        assert isinstance(copy_["observation"], MemoryMappedTensor)
        assert isinstance(copy_["next", "reward"], MemoryMappedTensor)
        assert torch.equal(copy_["observation"], stored_obs[rows])  # reads give the stored data
        assert torch.equal(copy_["next", "reward"], stored_reward[rows])
        copy_["observation"].add_(1000.0)  # the worker edits its copy
        copy_["next", "reward"].mul_(0.0)
        reopened = load_dataset(path)
        assert torch.equal(reopened.td["observation"], stored_obs), "a write into the unpickled copy hit the files"
        assert torch.equal(reopened.td["next", "reward"], stored_reward)
        assert torch.equal(TensorDict.load_memmap(path / "storage")["observation"][:ds.num_steps], stored_obs)
    assert torch.equal(ds.td["observation"], stored_obs)  # nor this process's mapping


def test_pickled_loaded_dataset_does_not_carry_the_in_memory_edits(tmp_path):
    ds = load_dataset(collect_cartpole(tmp_path / "ds", episodes=2))
    stored = ds.td["observation"].clone()
    ds.td["observation"].mul_(0.0)  # an edit of this process's copy (memory only, as documented)
    assert not ds.td["observation"].any()
    copy_ = pickle.loads(pickle.dumps(ds.td))
    assert isinstance(copy_["observation"], MemoryMappedTensor)
    assert torch.equal(copy_["observation"], stored)  # the files, mapped privately again
    copy_["observation"].add_(1.0)
    assert not ds.td["observation"].any()  # and the copies stay apart
    assert torch.equal(load_dataset(ds.path).td["observation"], stored)


# -- 9. World reads a TorchRL StepCounter(max_steps=...) time limit ---------------------------------------------
def keep_up(td):
    """A decent CartPole controller: its episodes outlast a 20-step limit."""
    td["action"] = (td["observation"][..., 2] + 0.3 * td["observation"][..., 3] > 0).long()
    return td


def test_world_reports_a_step_counter_limit_and_episodes_are_truncated_at_it():
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter(max_steps=20))
    try:
        result = World(env, keep_up).evaluate(4, seed=0, progress=False)
    finally:
        env.close()
    assert result["max_steps"] == 20 and result["env_time_limit"] == 20  # not CartPole's TimeLimit (500)
    lengths, truncated = result["episode_lengths"], result["episode_truncated"]
    assert len(lengths) == 4 and all(1 <= n <= 20 for n in lengths.tolist())
    assert truncated.any()
    assert all(n == 20 for n, t in zip(lengths.tolist(), truncated.tolist()) if t)
    assert "step limit 20" in result.summary()


@pytest.mark.parametrize("layout", ["two_step_counters", "nested_transformed_envs"])
def test_world_reports_the_step_limit_that_cuts_episodes_whatever_the_transform_layout(layout):
    """World's step limit is the smallest StepCounter(max_steps=...) that ends episodes, wherever it sits: of two
    StepCounters (20 and 5) the 5 that cuts the episodes, and a StepCounter(7) in an inner TransformedEnv layer
    (auto_unwrap=False keeps the layers apart)."""
    pool = EnvPool("CartPole-v1", num_envs=2)
    if layout == "two_step_counters":
        env = TransformedEnv(pool, Compose(StepCounter(max_steps=20), StepCounter(max_steps=5, step_count_key="c2")))
        limit = 5
    else:
        env = TransformedEnv(TransformedEnv(pool, StepCounter(max_steps=7)), RewardSum(), auto_unwrap=False)
        limit = 7
    try:
        result = World(env, keep_up).evaluate(3, seed=0, progress=False)
    finally:
        env.close()
    assert result["max_steps"] == limit and result["env_time_limit"] == limit
    assert result["episode_lengths"].tolist() == [limit] * 3 and result["episode_truncated"].all()
    assert f"step limit {limit}" in result.summary()


class _Drift(nn.Module):
    def forward(self, s, a):
        return {"state": s + 0.01 * a, "reward": torch.zeros(s.shape[0], 1)}


def test_world_collects_a_world_model_env_with_max_episode_steps_without_max_steps(tmp_path):
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    env = make_world_model_env(_Drift(), observation_space=box, action_space=box, num_envs=2,
                               initial_state=torch.zeros(2), max_episode_steps=7)
    world = World(env)
    result = world.evaluate(2, seed=0, progress=False)
    assert result["max_steps"] == 7 and result["env_time_limit"] == 7
    world.collect(tmp_path / "wm", episodes=3, seed=0, progress=False)  # used to need max_steps=
    ds = load_dataset(tmp_path / "wm")
    assert ds.num_episodes == 3 and ds.episode_lengths.tolist() == [7, 7, 7]
    assert ds.td["observation"].shape == (21, 2)


class _LearnedDrift(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(2, 2)

    def forward(self, s, a):
        s = torch.tanh(s + self.w(a))
        return {"state": s, "reward": s[:, :1]}


def test_world_runs_a_differentiable_world_model_env_without_building_a_graph(tmp_path):
    # the env a Dreamer user trains the actor in, reused for evaluation: rewards carried a graph and numpy() failed
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    env = make_world_model_env(_LearnedDrift(), observation_space=box, action_space=box, num_envs=2,
                               initial_state=torch.zeros(2), max_episode_steps=4, differentiable=True, seed=0)
    world = World(env)
    result = world.evaluate(3, seed=0, progress=False)
    assert result["episode_lengths"].tolist() == [4, 4, 4]
    world.collect(tmp_path / "wm", episodes=2, seed=0, progress=False)
    ds = load_dataset(tmp_path / "wm")
    assert ds.num_episodes == 2 and not ds.td["next", "reward"].requires_grad
    td = env.rollout(3, break_when_any_done=False)  # the env itself stays differentiable
    assert td["next", "reward"].requires_grad


class _AutogradEnv(gym.Env):
    """A gymnasium env whose step differentiates a potential with torch.autograd (needs grad mode)."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self.np_random.uniform(-1, 1, 2).astype(np.float32), 0
        return self.x.copy(), {}

    def step(self, action):
        with torch.enable_grad():  # World runs episodes under no_grad, as TorchRL's collectors do
            x = torch.tensor(self.x, requires_grad=True)
            (force,) = torch.autograd.grad((x**2).sum(), x)
        self.x = (self.x + 0.05 * (np.asarray(action) - force.numpy())).astype(np.float32)
        self.t += 1
        return self.x.copy(), 0.0, False, self.t >= 3, {}


class _LearnedRewardScale(Transform):
    """A reward transform with parameters: under grad mode its rewards would carry a graph."""

    def __init__(self):
        super().__init__(in_keys=["reward"], out_keys=["reward"])
        self.scale = nn.Linear(1, 1)

    def _apply_transform(self, reward):
        return self.scale(reward)

    def transform_reward_spec(self, reward_spec):
        return reward_spec


def test_world_runs_without_grad_as_torchrl_collectors_do():
    # a transform with parameters used to make World's numpy() fail; an env that needs autograd enables it
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2, seed=0), _LearnedRewardScale())
    result = World(env).evaluate(2, seed=0, progress=False)
    assert np.isfinite(result["episode_returns"]).all()
    env.close()
    result = World(EnvPool([_AutogradEnv] * 2, seed=0)).evaluate(2, seed=0, progress=False)
    assert result["episode_lengths"].tolist() == [3, 3]


# -- 10. the CLI finds a --policy module in the current directory ------------------------------------------------
def test_cli_policy_module_in_the_cwd_loads_when_the_cwd_is_not_on_sys_path(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_policy.py").write_text(
        "calls = 0\n"
        "def policy(td):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    td['action'] = (td['observation'][..., 2] > 0).long()\n"
        "    return td\n"
    )
    monkeypatch.chdir(tmp_path)
    cwd = {"", ".", str(tmp_path), str(tmp_path.resolve())}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in cwd])  # as the console script starts
    sys.modules.pop("my_policy", None)
    try:
        code = cli.main(["eval", "CartPole-v1", "--episodes", "2", "--num-envs", "2", "--no-progress",
                         "--policy", "my_policy:policy"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "cannot import module" not in captured.err
        assert "2 episodes" in captured.out
        assert sys.modules["my_policy"].calls > 0  # the module of the cwd was the policy
    finally:
        sys.modules.pop("my_policy", None)


# -- 11. WorldModelEnv starts episodes from a loaded dataset ------------------------------------------------------
class _Still(nn.Module):
    def forward(self, s, a):
        return {"state": s, "reward": torch.zeros(s.shape[0], 1)}


CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def test_world_model_env_start_states_from_a_loaded_dataset(tmp_path):
    ds = load_dataset(collect_cartpole(tmp_path / "ds", episodes=2))
    data = ds.td["observation"]
    env = WorldModelEnv(_Still(), CARTPOLE_OBS, gym.spaces.Discrete(2), num_envs=6, start_states=ds, seed=0)
    obs = env.reset()["observation"]
    assert obs.shape == (6, 4)
    assert (obs[:, None, :] == data[None]).all(-1).any(1).all()  # every start is a row of the dataset
    assert len({tuple(row) for row in obs.tolist()}) > 1
    same = WorldModelEnv(_Still(), CARTPOLE_OBS, gym.spaces.Discrete(2), num_envs=6, start_states=ds.td, seed=0)
    assert torch.equal(same.reset()["observation"], obs)  # as the dataset's TensorDict gives
    nxt = env.rand_step(env.reset())["next", "observation"]
    assert (nxt[:, None, :] == data[None]).all(-1).any(1).all()  # the still model keeps them


def test_world_model_env_start_states_from_an_empty_dataset_is_a_value_error(tmp_path):
    DatasetWriter(tmp_path / "empty", capacity=4).close(complete=True)  # a dataset of 0 episodes
    ds = load_dataset(tmp_path / "empty")
    assert ds.td is None
    with pytest.raises(ValueError, match="holds no episodes") as info:
        WorldModelEnv(_Still(), CARTPOLE_OBS, gym.spaces.Discrete(2), num_envs=2, start_states=ds)
    assert "empty" in str(info.value)  # names the dataset's path


# -- an env's own "goal" observation, and gymnasium's "module:Env-v0" ids -------------------------------
class _OwnGoalEnv(gym.Env):
    """A Dict observation with a "goal" of the env's own (World injects goals only in dataset evaluation)."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-10, 10, (2,), np.float32),
                                         "goal": gym.spaces.Box(-10, 10, (2,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = np.zeros(2, np.float32), 0
        self.goal = self.np_random.uniform(-5, 5, 2).astype(np.float32)
        return {"pos": self.pos.copy(), "goal": self.goal.copy()}, {}

    def step(self, action):
        self.pos, self.t = self.pos + action, self.t + 1
        return {"pos": self.pos.copy(), "goal": self.goal.copy()}, 0.0, False, self.t >= 4, {}


def test_collect_records_an_envs_own_goal_observation(tmp_path):
    with World(EnvPool([_OwnGoalEnv] * 2), max_episode_steps=4) as world:
        ds = world.collect(tmp_path / "ds", 3, seed=0, progress=False)
    assert "goal" in ds.observation_keys and "pos" in ds.observation_keys
    goal, next_goal = ds.td["goal"], ds.td["next", "goal"]
    assert goal.shape == next_goal.shape == (ds.num_steps, 2)
    torch.testing.assert_close(goal, next_goal)  # constant within an episode: the root is the same goal
    episodes = ds.td["episode"]
    assert len({tuple(goal[episodes == e][0].tolist()) for e in episodes.unique().tolist()}) == 3


def _registering_module(path, name: str) -> str:
    """Write module ``name`` registering ``ModuleIdTest/{name}-v0`` (CartPole, 7 steps); returns that id."""
    env_id = f"ModuleIdTest/{name}-v0"
    (path / f"{name}.py").write_text(
        "import gymnasium as gym\n"
        f"gym.register({env_id!r}, entry_point='gymnasium.envs.classic_control:CartPoleEnv', max_episode_steps=7)\n"
    )
    return env_id


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_module_colon_env_ids_work_as_with_gym_make(tmp_path, monkeypatch, backend):
    """gym.make("module:Env-v0") imports the module (which registers the id) first; so does the package."""
    name = f"swm_registers_{backend}"
    env_id = _registering_module(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    pool = EnvPool(f"{name}:{env_id}", num_envs=2, backend=backend, seed=0)
    try:
        reference = gym.make("CartPole-v1")
        td = pool.reset()
        np.testing.assert_array_equal(td["observation"][1].numpy(), reference.reset(seed=1)[0])
        assert pool.call("get_wrapper_attr", "_max_episode_steps") == [7, 7]
    finally:
        pool.close()
    with pytest.raises(ModuleNotFoundError, match="no_such_registering_module"):
        EnvPool("no_such_registering_module:Whatever-v0", num_envs=1)


def test_module_colon_env_ids_in_world_and_the_cli(tmp_path, monkeypatch, capsys):
    env_id = _registering_module(tmp_path, "swm_registers_world")
    monkeypatch.syspath_prepend(str(tmp_path))
    with World(f"swm_registers_world:{env_id}", num_envs=2) as world:
        result = world.evaluate(2, seed=0, progress=False)
    assert result["num_episodes"] == 2 and max(result["episode_lengths"]) <= 7
    env_id = _registering_module(tmp_path, "swm_registers_cli")
    assert cli.main(["eval", f"swm_registers_cli:{env_id}", "--episodes", "2", "--no-progress"]) == 0
    assert cli.main(["eval", "no_such_registering_module:Whatever-v0", "--no-progress"]) == 2
    assert "cannot import" in capsys.readouterr().err


# -- collect records every leaf exactly, through numpy views or, for torch-only dtypes, torch ------------
@pytest.mark.parametrize("extra_dtype", [torch.float64, torch.bfloat16])
def test_collect_records_policy_leaves_of_any_dtype_row_by_row(tmp_path, extra_dtype):
    # the recorder writes leaves numpy can view through numpy, a bfloat16 one through torch; env i's
    # episodes last lengths[i] steps and its seeds are i, i + 3, ... (seed=0, one seed per episode)
    lengths = [2, 3, 5]

    def policy(td):
        obs = td["observation"]
        td["action"] = (obs[:, 0] % 3).long()
        td["policy", "row"] = torch.arange(3, dtype=extra_dtype).unsqueeze(-1)
        td["policy", "image"] = obs[:, :1, None].expand(-1, 8, 8).to(torch.uint8)
        return td

    with World(EnvPool([functools.partial(counting, length=n) for n in lengths]), policy) as world:
        ds = world.collect(tmp_path / "ds", 9, seed=0, max_steps=10, progress=False)
    assert ds.td["policy", "row"].dtype == extra_dtype
    obs = ds.td["observation"]
    torch.testing.assert_close(ds.td["policy", "image"], obs[:, :1, None].expand(-1, 8, 8).to(torch.uint8))
    torch.testing.assert_close(ds.td["action"], (obs[:, 0] % 3).long())
    for k in range(ds.num_episodes):
        episode = ds.episode(k)
        env = int(episode["episode_seed"][0]) % 3
        assert episode.batch_size[0] == lengths[env]
        assert episode["observation"][:, 0].tolist() == list(range(lengths[env]))
        assert episode["policy", "row"].float().flatten().tolist() == [env] * lengths[env]


def test_collect_does_not_log_its_storage_on_stdout(tmp_path):
    # TorchRL logs "Initialized LazyMemmapStorage with torch.Size([capacity]) shape" (INFO, on stdout) when a
    # storage is first written: a dataset's inner storage, twice per collect (write and compaction)
    import logging

    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("torchrl")
    logger.addHandler(handler)
    try:
        with World("CartPole-v1", num_envs=2) as world:
            world.collect(tmp_path / "ds", 3, seed=0, progress=False)
        logger.info("Initialized LazyMemmapStorage elsewhere")  # other storages still log
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["Initialized LazyMemmapStorage elsewhere"]
    assert load_dataset(tmp_path / "ds").num_episodes == 3


@pytest.mark.parametrize("mode", ["same_step", "disabled", "gym_env_num_envs"])  # GymWrapper refuses NEXT_STEP
def test_world_refuses_torchrl_wrappers_of_a_gymnasium_vector_env_and_names_the_pool(mode):
    # TorchRL's GymWrapper over a VectorEnv steps every row (no "_step" freezing) and GymEnv(num_envs=N)
    # records a ghost step per episode: World's metrics would be wrong, so it points to EnvPool instead
    from torchrl.envs import GymEnv, GymWrapper

    if mode == "gym_env_num_envs":
        env = GymEnv("CartPole-v1", num_envs=2)
    else:
        autoreset = gym.vector.AutoresetMode.SAME_STEP if mode == "same_step" else gym.vector.AutoresetMode.DISABLED
        env = TransformedEnv(GymWrapper(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync",
                                                     vector_kwargs={"autoreset_mode": autoreset})), StepCounter())
    try:
        with pytest.raises(TypeError, match=r"wraps a gymnasium (Sync|Async)VectorEnv .*World\(EnvPool\(gym.make_vec"):
            World(env)
    finally:
        env.close()
    with World(EnvPool(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))) as world:  # what it points to
        assert world.evaluate(3, seed=0, progress=False)["episode_lengths"].shape == (3,)


def test_collect_refuses_an_entry_that_changes_dtype_between_steps_naming_it(tmp_path):
    # a policy building a leaf from Python numbers: int64 on the first step, float32 later; numpy would
    # store the floats truncated into the first step's int64 column without a word
    calls = []

    def policy(td):
        calls.append(1)
        td["action"] = torch.zeros(2, dtype=torch.int64)
        td["policy", "value"] = torch.full((2, 1), 2) if len(calls) == 1 else torch.full((2, 1), 1.5)
        return td

    with World(EnvPool([functools.partial(counting, length=4)] * 2), policy, max_episode_steps=10) as world:
        with pytest.raises(TypeError, match=r"\('policy', 'value'\) changed dtype between steps, from torch.int64 to "
                                            r"torch.float32"):
            world.collect(tmp_path / "ds", 2, seed=0, progress=False)


def test_world_over_a_vector_env_pool_takes_options_with_fewer_episodes_than_envs():
    # the idle envs are reset in the same call (a VectorEnv steps every row): they get the episodes' options,
    # since a VectorEnv takes one options dict for every row it resets
    pool = EnvPool(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), seed=0)
    world = World(pool)
    out = world.evaluate(2, seed=0, options={"low": 0.02, "high": 0.02}, progress=False)
    assert len(out["episode_lengths"]) == 2
    pool.close()


def test_a_world_refused_after_it_built_its_pool_closes_that_pool():
    # World(id, ...) builds the pool first: a bad policy then must not leave its workers running
    import multiprocessing

    before = set(multiprocessing.active_children())
    with pytest.raises(TypeError, match="expected a TensorDictModule or a callable td -> td, got int"):
        World("CartPole-v1", num_envs=2, backend="process", num_workers=2, policy=5)
    assert set(multiprocessing.active_children()) - before == set()
    # a pool whose close() then fails too: the refusal is still the error, the close failure a note on it
    gym.register("TestBadCloseWorld-v0", entry_point="envs:BadCloseEnv")
    try:
        with pytest.raises(TypeError, match="got int") as caught:
            World("TestBadCloseWorld-v0", num_envs=2, policy=5)
        assert any("closing the pool World built then failed too" in note and "disk gone" in note
                   for note in caught.value.__notes__)
    finally:
        gym.registry.pop("TestBadCloseWorld-v0")


def _root_counting_policy(seen):
    """A policy keeping state at the root, as TorchRL's OrnsteinUhlenbeckProcessModule does (its noise and step
    count): it reads what it wrote at the last step, which TorchRL's step_mdp carries over."""

    def policy(td):
        count = td.get("_my_steps", None)
        count = torch.zeros(td.batch_size[0], 1, dtype=torch.int64) if count is None else count + 1
        seen.append(count.view(-1).tolist())
        td.set("_my_steps", count)
        return td.set("action", torch.zeros(td.batch_size[0], dtype=torch.int64))

    return policy


@pytest.mark.parametrize("mode", ["evaluate", "collect"])
def test_world_carries_the_policys_root_entries_over_as_step_mdp(tmp_path, mode):
    rollout_seen, world_seen = [], []
    EnvPool("CartPole-v1", num_envs=1, seed=0).rollout(6, _root_counting_policy(rollout_seen))
    world = World(EnvPool("CartPole-v1", num_envs=1), policy=_root_counting_policy(world_seen))
    if mode == "evaluate":
        world.evaluate(episodes=1, seed=0, max_steps=6, progress=False)
    else:
        world.collect(tmp_path / "d", episodes=1, seed=0, max_steps=6, progress=False)
    assert rollout_seen == [[k] for k in range(6)]
    assert world_seen[:6] == rollout_seen


def _zero_action_policy(td):
    return td.set("action", torch.zeros(td.batch_size[0], dtype=torch.int64))


def test_world_collect_records_the_step_after_the_post_step_mdp_hooks(tmp_path):
    """A transform's post-step_mdp hook may drop transient keys from the step's data (NextObservationDelta drops
    the full next observation): rollout and the collectors record the data after it; so does World.collect."""
    from torchrl.collectors import Collector
    from torchrl.envs.transforms import NextObservationDelta

    def make():
        return TransformedEnv(EnvPool("CartPole-v1", num_envs=2, seed=0), NextObservationDelta(in_keys=["observation"]))

    collector = Collector(make(), _zero_action_policy, frames_per_batch=20, total_frames=20)
    batch = next(iter(collector))
    collector.shutdown()
    ds = World(make(), policy=_zero_action_policy).collect(tmp_path / "d", episodes=2, seed=0, max_steps=50,
                                                            progress=False)
    for data in (batch, ds.td):
        keys = set(data.keys(True))
        assert ("next", "delta", "observation") in keys and ("next", "observation") not in keys


def test_world_full_reset_keeps_the_root_entries_as_torchrls_maybe_reset(tmp_path):
    """When every row restarts (one env, wait mode, episodes ending together), TorchRL's maybe_reset resets with the
    tensordict and keeps the root's own entries; World did a reset without it, so a policy's state at the root was
    lost there and kept on partial resets: the data depended on num_envs."""
    from torchrl.collectors import Collector

    def counting(td):
        count = td.get("my_count", None)
        td.set("my_count", torch.zeros(td.batch_size[0], 1, dtype=torch.int64) if count is None else count + 1)
        return _zero_action_policy(td)

    collector = Collector(EnvPool("CartPole-v1", num_envs=1, seed=0), counting, frames_per_batch=30, total_frames=30)
    batch = next(iter(collector))
    collector.shutdown()
    end = int(batch["next", "done"].view(-1).nonzero()[0])
    ds = World(EnvPool("CartPole-v1", num_envs=1), policy=counting).collect(tmp_path / "d", 2, seed=0, progress=False)
    first_rows = ds.td["my_count"].view(-1)[ds.td["step_count"].view(-1) == 0].tolist()
    assert first_rows == [0, int(batch["my_count"].view(-1)[end + 1])] and first_rows[1] > 0


def test_world_refuses_an_env_whose_action_is_not_at_action():
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2, seed=0),
                         RenameTransform([], [], in_keys_inv=["action"], out_keys_inv=["act"]))
    with pytest.raises(ValueError, match=r"expected the env's action at 'action'.*\['act'\]"):
        World(env)
    env.close()


def test_dataset_goals_leave_out_bookkeeping_transform_entries(tmp_path):
    from torchrl.envs import Compose, InitTracker, RewardSum

    from torchrl_swm.envs import PointMazeExpert, make

    def env(n):
        return TransformedEnv(EnvPool([lambda: make("torchrl_swm/PointMaze-v0")] * n),
                              Compose(InitTracker(), RewardSum()))

    ds = World(env(2), policy=PointMazeExpert("u", noise=0.3)).collect(tmp_path / "d", episodes=2, seed=0,
                                                                        max_steps=60, progress=False)
    result = World(env(2), policy=PointMazeExpert("u")).evaluate(dataset=ds, start_steps=2, goal_offset=3,
                                                                 eval_budget=5, progress=False)
    assert result["goal_keys"] == ["state", "target"]


class _NoisyBatched(gym.vector.VectorEnv):
    """Natively batched (one RNG for the batch), DISABLED autoreset with a masked reset; row i's episodes last
    2 + i steps; every reward is a fresh draw from the batch RNG."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}

    def __init__(self, n=3):
        from gymnasium.vector.utils import batch_space

        self.num_envs = n
        self.single_observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.t = np.zeros(n, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        mask = np.ones(self.num_envs, bool) if not options else np.asarray(options["reset_mask"])
        self.t[mask] = 0
        return self.t[:, None].copy(), {}

    def step(self, action):
        self.t += 1
        reward = self.np_random.random(self.num_envs)
        return self.t[:, None].copy(), reward, self.t >= 2 + np.arange(self.num_envs), np.zeros(self.num_envs, bool), {}


class _SameStepBatched(_NoisyBatched):
    """The same, SAME_STEP, with no masked reset (as many GPU/JAX batched envs); rewards 1."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def reset(self, *, seed=None, options=None):
        gym.vector.VectorEnv.reset(self, seed=seed)
        self.t[:] = 0
        return self.t[:, None].copy(), {}

    def step(self, action):
        self.t += 1
        term = self.t >= 2 + np.arange(self.num_envs)
        obs, info = self.t[:, None].copy(), {}
        if term.any():
            info = {"final_obs": np.array([o if d else None for o, d in zip(obs, term)], dtype=object),
                    "_final_obs": term.copy(), "final_info": {}, "_final_info": term.copy()}
            self.t[term] = 0
            obs = self.t[:, None].copy()
        return obs, np.ones(self.num_envs), term, np.zeros(self.num_envs, bool), info


@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
def test_world_on_a_natively_batched_env_never_replays_its_random_stream(tmp_path, reset_mode):
    # one RNG for the batch: World reseeded it at every episode start, an idle row's refill with the same seed
    # each time, so episodes shared their reward noise (understated spreads); now the stream continues
    def rewards(path):
        ds = World(EnvPool(_NoisyBatched(3))).collect(path, 9, seed=0, reset_mode=reset_mode, max_steps=10,
                                                      progress=False)
        return [ds.episode(k)["next", "reward"].view(-1).tolist() for k in range(ds.num_episodes)]

    first = rewards(tmp_path / "a")
    draws = [r for episode in first for r in episode]
    assert len(first) == 9 and len(set(draws)) == len(draws)  # no draw repeated across the run's episodes
    assert rewards(tmp_path / "b") == first  # and the run is reproducible from World's seed


@pytest.mark.parametrize("reset_mode", ["auto", "wait"])
def test_world_on_a_same_step_batched_env_without_a_masked_reset_takes_the_resets_it_made(reset_mode):
    # World seeded every episode start, which such an env cannot do for some rows: the first episode end raised
    result = World(EnvPool(_SameStepBatched(3))).evaluate(6, seed=0, reset_mode=reset_mode, progress=False)
    lengths = sorted(result["episode_lengths"].tolist())
    assert len(lengths) == 6 and set(lengths) <= {2, 3, 4}
    assert result["episode_returns"].tolist() == result["episode_lengths"].astype(float).tolist()


def test_an_async_vector_env_without_shared_memory_is_refused_in_next_step_mode():
    # gymnasium's worker clears a pending NEXT_STEP autoreset at a reset only with shared memory: the step after a
    # masked reset restarted the env again, a ghost transition with reward 0 in every later episode
    venv = gym.vector.AsyncVectorEnv([functools.partial(counting, length=3)] * 2, shared_memory=False)
    try:
        with pytest.raises(torchrl_swm.SpecError, match=r"shared_memory=False\) in NEXT_STEP mode.*ghost transition"):
            EnvPool(venv)
    finally:
        venv.close()
    venv = gym.vector.AsyncVectorEnv([functools.partial(counting, length=3)] * 2, shared_memory=False,
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    pool = EnvPool(venv)
    try:
        result = World(pool).evaluate(4, seed=0, progress=False)
        assert result["episode_lengths"].tolist() == [3] * 4
    finally:
        pool.close()


class _IsInitObsEnv(gym.Env):
    """A Dict observation with an entry named "is_init" (a float phase), as World names its own flag."""

    observation_space = gym.spaces.Dict({"is_init": gym.spaces.Box(0, 1, (1,), np.float32),
                                         "pos": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"is_init": np.array([0.25 * (self.t % 4)], np.float32), "pos": np.zeros(2, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, self.t >= 3, False, {}


class _OwnFlagEnv(_IsInitObsEnv):
    """A bool "is_init" of its own: True at odd steps."""

    observation_space = gym.spaces.Dict({"is_init": gym.spaces.Box(0, 1, (1,), np.bool_),
                                         "pos": gym.spaces.Box(-1, 1, (2,), np.float32)})

    def _obs(self):
        return {"is_init": np.array([self.t % 2 == 1]), "pos": np.zeros(2, np.float32)}


class _TerminalFlagEnv(_IsInitObsEnv):
    """A bool "is_init" that is World's flag at every root, but True on the terminal observation."""

    observation_space = _OwnFlagEnv.observation_space

    def _obs(self):
        return {"is_init": np.array([self.t in (0, 3)]), "pos": np.zeros(2, np.float32)}


def test_an_env_observation_named_is_init_is_refused_not_overwritten(tmp_path):
    """World replaced it at the root with its own flag (the policy and the dataset's root lost the env's values,
    "next" kept them), while "episode" and "step_count" were refused."""
    from torchrl.envs import InitTracker

    with World(EnvPool(_IsInitObsEnv, 2), max_episode_steps=10) as world:
        for run in (lambda: world.evaluate(2, seed=0, progress=False),
                    lambda: world.collect(tmp_path / "ds", 2, seed=0, progress=False)):
            with pytest.raises(ValueError, match=r"the env has an observation 'is_init', which World sets .* rename "
                                                 r"it \(e\.g\. torchrl\.envs\.RenameTransform\)"):
                run()
    assert not (tmp_path / "ds").exists()
    renamed = TransformedEnv(EnvPool(_IsInitObsEnv, 2), RenameTransform(["is_init"], ["phase"]))
    with World(renamed, max_episode_steps=10) as world:
        ds = world.collect(tmp_path / "ds", 2, seed=0, progress=False)
    assert ds.episode(0)["phase"].flatten().tolist() == [0.0, 0.25, 0.5]
    with World(TransformedEnv(EnvPool("CartPole-v1", 2), InitTracker()), max_episode_steps=5) as world:
        assert world.evaluate(2, seed=0, progress=False)["num_episodes"] == 2  # an InitTracker's is World's flag
    from torchrl.envs import GymEnv, SerialEnv

    def tracked():
        return TransformedEnv(GymEnv("CartPole-v1"), InitTracker())

    with World(SerialEnv(2, tracked), max_episode_steps=5) as world:  # one inside the batched env's envs too
        assert world.evaluate(2, seed=0, progress=False)["num_episodes"] == 2
        world.collect(tmp_path / "tracked", 2, seed=0, progress=False, reset_mode="wait")
    # a bool per env of the env's own, not that flag, is refused once it differs (it was written over)
    with World(EnvPool(_OwnFlagEnv, 2), max_episode_steps=5) as world:
        with pytest.raises(ValueError, match=r"the env's own 'is_init' of env 0 reads False at step 0 of its episode"):
            world.collect(tmp_path / "own", 2, seed=0, progress=False)
    # and under "next", which the dataset records as it is (it was never checked)
    with World(EnvPool(_TerminalFlagEnv, 2), max_episode_steps=5) as world:
        with pytest.raises(ValueError, match=r"the env's own 'is_init' of env 0 reads True at step 3 of its episode"):
            world.collect(tmp_path / "terminal", 2, seed=0, progress=False)


def test_a_policy_error_gets_one_note_naming_the_policy_even_when_raised_again_or_from_a_proxy():
    """The note says the policy raised; a policy that raises one error object at every call keeps one note,
    and a proxy whose ``__getattr__`` fails (an RPC stub) still surfaces the policy's own error."""
    error = ValueError("weights failed to load")

    def cached_failure(td):
        raise error

    class Proxy:
        def __getattr__(self, name):
            raise ConnectionError(f"server has no attribute {name!r}")

        def __call__(self, td):
            raise ValueError("remote policy failed")

    world = World(EnvPool([counting] * 2, seed=0), cached_failure, max_episode_steps=5)
    for _ in range(3):
        with pytest.raises(ValueError, match="weights failed to load") as raised:
            world.evaluate(2, seed=0, progress=False)
        assert raised.value.__notes__ == [
            f"raised by the policy {__name__}.test_a_policy_error_gets_one_note_naming_the_policy_even_when_raised_"
            "again_or_from_a_proxy.<locals>.cached_failure, called with the step's tensordict (a TorchRL policy "
            "reads its observation keys and writes 'action')"]
    world.set_policy(Proxy())
    with pytest.raises(ValueError, match="remote policy failed") as raised:
        world.evaluate(2, seed=0, progress=False)
    assert raised.value.__notes__[0].startswith("raised by the policy Proxy object, called with")
    world.close()


@pytest.mark.parametrize("call", ["evaluate", "collect"])
def test_an_episode_count_too_large_to_plan_is_a_value_error_naming_episodes(call, tmp_path):
    # a plan per episode: [options] * 10**30 raised OverflowError (MemoryError at 10**10), naming nothing
    world = World("CartPole-v1", num_envs=2)
    kwargs = {"path": tmp_path / "ds"} if call == "collect" else {}
    too_many = r"^episodes: 1000000000000000000000000000000 is more than this process can hold"
    with pytest.raises(ValueError, match=too_many):
        getattr(world, call)(episodes=10**30, progress=False, **kwargs)
    assert not (tmp_path / "ds").exists()
    world.close()
