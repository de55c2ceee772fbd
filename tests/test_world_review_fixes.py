"""Review fixes in World, its datasets, make_env, the quickstart's and the CLI's arguments, and pool seeds."""

import functools
import time

import pytest
import torch
from envs import counting
from tensordict import TensorDict
from torchrl.envs import RenameTransform, TransformedEnv

import torchrl_swm
from torchrl_swm import EnvPool, World, cli, load_dataset
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
