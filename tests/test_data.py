"""World.collect and load_dataset: TorchRL episode layout on disk, round trip, sequences, interruptions."""

import functools
import json
import os
import re
import shutil
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, counting
from tensordict import NonTensorData, TensorDict, tensorclass
from tensordict.memmap import MemoryMappedTensor
from torchrl.data import LazyMemmapStorage, SliceSampler, TensorDictReplayBuffer

from torchrl_swm import EnvPool, World, load_dataset
from torchrl_swm.data import DatasetError, DatasetWriter

torch.set_num_threads(1)


def counting_pool(n=3, seed=0, max_length=6, pixels=False, **kw):
    factory = functools.partial(counting, max_length=max_length, render_mode="rgb_array" if pixels else None, **kw)
    return EnvPool([factory] * n, seed=seed, pixels=pixels)


def cycling_policy(n):
    """Actions 1, 2, 0, 1, 2, ... per env, so every row's action is identifiable."""
    state = {"k": 0}

    def policy(td):
        state["k"] += 1
        return td.set("action", torch.full((n,), state["k"] % 3, dtype=torch.int64))

    return policy


def expected_length(seed, max_length=6):
    env = CountingEnv(max_length=max_length)
    env.reset(seed=seed)
    return env.length


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "ds"
    pool = counting_pool(3, pixels=True)
    world = World(pool, cycling_policy(3), max_episode_steps=10)
    ds = world.collect(path, 8, seed=100, progress=False)
    pool.close()
    return path, ds


# -- round trip ------------------------------------------------------------------------------------------------
def test_round_trip_episode_layout(collected):
    path, ds = collected
    ds = load_dataset(path)  # reopen from disk
    assert ds.num_episodes == 8 and ds.metadata["complete"] is True
    assert ds.episode_ids.tolist() == list(range(8))  # a finished collect stores episodes in id order
    lengths = [expected_length(100 + j) for j in range(8)]
    assert ds.episode_lengths.tolist() == lengths
    assert len(ds) == ds.num_steps == sum(lengths)
    assert ds.episode_seeds.tolist() == list(range(100, 108))
    for k in range(8):
        ep = ds.episode(k)
        L = lengths[k]
        t = torch.arange(L)
        assert ep.batch_size == (L,)
        # the reset frame is the root of row 0; row t holds step t at the root and t + 1 under "next"
        assert torch.equal(ep["observation"][:, 0], t.float())
        assert torch.equal(ep["next", "observation"][:, 0], t.float() + 1)
        assert torch.equal(ep["step_count"].view(-1), t) and torch.equal(ep["next", "step_count"].view(-1), t + 1)
        assert torch.equal(ep["is_init"].view(-1), t == 0)
        # the action on row t is the one taken at step t: the env echoes it in the next observation
        assert torch.equal(ep["next", "observation"][:, 2], ep["action"].float())
        assert ep["action"].dtype == torch.int64 and ((ep["action"] >= 0) & (ep["action"] < 3)).all()
        assert torch.equal(ep["next", "reward"].view(-1), ep["action"].float())
        # done only on the last row; never at the root
        assert ep["next", "done"].view(-1).tolist() == [False] * (L - 1) + [True]
        assert torch.equal(ep["next", "terminated"], ep["next", "done"]) and not ep["next", "truncated"].any()
        assert not ep["done"].any()
        assert (ep["episode"] == k).all() and (ep["episode_seed"] == 100 + k).all()
        # pixels and infos are recorded at both ends of the transition
        assert torch.equal(ep["pixels"][:, 0, 0, 0].long(), t)
        assert torch.equal(ep["next", "pixels"][:, 0, 0, 0].long(), t + 1)
        assert torch.equal(ep["info", "t"].view(-1), t) and torch.equal(ep["next", "info", "t"].view(-1), t + 1)
        assert (ep["info", "length"] == L).all()


def test_observations_chain_within_episodes(collected):
    _, ds = collected
    td = ds.td
    not_last = ~td["next", "done"].view(-1)
    same_episode = td["episode"][1:] == td["episode"][:-1]
    keep = not_last[:-1]
    assert torch.equal(same_episode, keep)
    assert torch.equal(td["observation"][1:][keep], td["next", "observation"][:-1][keep])
    assert torch.equal(td["pixels"][1:][keep], td["next", "pixels"][:-1][keep])


def test_step_accessor_and_final_observation(collected):
    _, ds = collected
    L = int(ds.episode_lengths[2])
    assert ds.step(2, 0)["observation"][0] == 0
    last = ds.step(2, L)
    assert last["observation"][0] == L and last["pixels"].shape == (8, 12, 3)
    assert "action" not in last.keys() and "reward" not in last.keys()
    with pytest.raises(IndexError):
        ds.step(2, L + 1)
    with pytest.raises(IndexError):
        ds.episode(8)
    assert set(ds.observation_keys) >= {"observation", "pixels", ("info", "t"), "episode_seed"}
    assert not {"step_count", "done", "terminated", "truncated"} & set(ds.observation_keys)  # bookkeeping, not obs


def test_negative_episode_positions_count_from_the_end(collected):
    # Dataset.episode/step take Python-style positions: -1 is the last stored episode, -n the first
    _, ds = collected
    n = ds.num_episodes
    assert torch.equal(ds.episode(-1)["observation"], ds.episode(n - 1)["observation"])
    assert ds.episode(-1)["episode"].unique().tolist() == [int(ds.episode_ids[-1])]
    assert ds.episode(-n)["episode"].unique().tolist() == [int(ds.episode_ids[0])]
    L = int(ds.episode_lengths[-1])
    assert torch.equal(ds.step(-1, L)["observation"], ds.step(n - 1, L)["observation"])
    with pytest.raises(IndexError):
        ds.episode(-n - 1)
    with pytest.raises(IndexError):
        ds.step(-n - 1, 0)


def test_load_is_lazy_memory_mapped(collected):
    path, _ = collected
    ds = load_dataset(path)
    assert isinstance(ds.td["pixels"], MemoryMappedTensor)
    assert isinstance(ds.td["next", "observation"], MemoryMappedTensor)
    files = {f for f in os.listdir(path / "storage")}
    assert "pixels.memmap" in files and "storage_metadata.json" in files
    assert json.loads((path / "storage" / "storage_metadata.json").read_text())["len"] == ds.num_steps


def test_slice_sampler_gives_batch_time_sequences(collected):
    _, ds = collected
    rb = ds.replay_buffer(num_slices=5, slice_len=3)
    torch.manual_seed(0)
    for _ in range(10):
        batch = rb.sample().reshape(5, 3)
        assert batch.batch_size == (5, 3)
        assert (batch["episode"] == batch["episode"][:, :1]).all()  # one episode per sequence
        steps = batch["step_count"].squeeze(-1)
        assert torch.equal(steps[:, 1:] - steps[:, :-1], torch.ones(5, 2, dtype=torch.int64))
        assert torch.equal(batch["observation"][:, 1:], batch["next", "observation"][:, :-1])
        assert batch["pixels"].shape == (5, 3, 8, 12, 3)


def test_plain_torchrl_replay_buffer_loads_the_directory(collected):
    path, ds = collected
    storage = LazyMemmapStorage(ds.num_steps, scratch_dir=path / "storage")
    rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=2, traj_key="episode"))
    rb.loads(path)
    assert len(rb) == ds.num_steps
    assert isinstance(storage._storage["observation"], MemoryMappedTensor)  # loaded in place, not copied
    batch = rb.sample(8).reshape(4, 2)
    assert (batch["episode"][:, 0] == batch["episode"][:, 1]).all()
    assert torch.equal(batch["observation"][:, 1], batch["next", "observation"][:, 0])


@pytest.mark.parametrize("compact", [True, False])
def test_a_plain_buffer_of_the_recorded_storage_rows_loads_any_dataset(tmp_path, compact):
    # an uncompacted storage (compact=False, or an interrupted collect) keeps its capacity on disk:
    # dataset.json says how many rows a plain TorchRL storage needs to load it
    with World("CartPole-v1", num_envs=2) as world:
        ds = world.collect(tmp_path / "ds", 3, seed=0, max_steps=50, compact=compact, progress=False)
    rows = ds.metadata["storage_rows"]
    assert rows == (ds.num_steps if compact else 3 * 50)
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(rows, scratch_dir=tmp_path / "ds" / "storage"))
    rb.loads(tmp_path / "ds")
    assert len(rb) == ds.num_steps
    assert torch.equal(rb.storage[: ds.num_steps]["observation"], ds.td["observation"])


def test_summary_describes_the_dataset(collected):
    _, ds = collected
    text = ds.summary()
    assert "8 episodes" in text and "complete" in text and "seeds      100..107" in text
    assert "pixels" in text and "info.t" in text and "MiB" in text
    stats = ds.stats()
    assert np.allclose(stats["returns"], [float(ds.episode(k)["next", "reward"].sum()) for k in range(8)])


def test_same_seed_gives_identical_datasets(tmp_path):
    tds = []
    for name in ("a", "b"):
        pool = counting_pool(2)
        World(pool, max_episode_steps=8).collect(tmp_path / name, 5, seed=3, progress=False)
        tds.append(load_dataset(tmp_path / name).td.to_tensordict())
        pool.close()
    assert (tds[0] == tds[1]).all()


@pytest.mark.parametrize("mode", ["auto", "wait"])
def test_step_limit_truncates_and_wait_mode_collects(tmp_path, mode):
    pool = EnvPool([functools.partial(counting, length=20)] * 2, seed=0)
    ds = World(pool, cycling_policy(2)).collect(tmp_path / "d", 3, seed=0, max_steps=4, reset_mode=mode,
                                                 progress=False)
    assert ds.episode_lengths.tolist() == [4, 4, 4]
    last = ds.td[torch.as_tensor(ds.episode_starts + 3)]
    assert last["next", "truncated"].all() and last["next", "done"].all() and not last["next", "terminated"].any()
    pool.close()


# -- interrupted collection ------------------------------------------------------------------------------------------
class Interrupt:
    """A policy that raises ``error`` on its ``at``-th call."""

    def __init__(self, n, at, error):
        self.n, self.at, self.error, self.calls = n, at, error, 0

    def __call__(self, td):
        self.calls += 1
        if self.calls == self.at:
            raise self.error
        return td.set("action", torch.ones(self.n, dtype=torch.int64))


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("policy crashed")])
def test_interrupted_collect_keeps_every_completed_episode_and_no_partial_one(tmp_path, error):
    lengths = [2, 5, 3]
    pool = EnvPool([functools.partial(counting, length=n) for n in lengths], seed=0)
    world = World(pool, Interrupt(3, at=7, error=error), max_episode_steps=10)
    with pytest.raises(type(error)) as raised:
        world.collect(tmp_path / "d", 9, seed=0, progress=False)
    # an error of the policy's says so (the CLI prints the note); a Ctrl-C is nobody's error
    notes = getattr(raised.value, "__notes__", [])
    if isinstance(error, KeyboardInterrupt):
        assert notes == []
    else:
        assert notes == ["raised by the policy Interrupt object, called with the step's tensordict (a TorchRL "
                         "policy reads its observation keys and writes 'action')"]
    ds = load_dataset(tmp_path / "d")
    # after 6 World steps: env 0 finished 3 episodes (2+2+2), env 1 one (5), env 2 two (3+3)
    assert sorted(ds.episode_ids.tolist()) == [0, 1, 2, 3, 5, 6]
    reason = "KeyboardInterrupt" if isinstance(error, KeyboardInterrupt) else "RuntimeError: policy crashed"
    assert ds.metadata["complete"] is False and ds.metadata["interrupted"] == reason  # not "KeyboardInterrupt: "
    assert ds.num_steps == 2 * 3 + 5 + 3 * 2
    # compacted at its exact size, in completion order: a plain buffer of storage_rows loads it (it kept the
    # capacity, 9 * 10 rows, which rb.loads allocated in full)
    assert ds.metadata["compacted"] is True and ds.metadata["storage_rows"] == ds.num_steps
    assert ds.episode_ids.tolist() == [0, 2, 3, 1, 6, 5]  # as they completed
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(ds.num_steps, scratch_dir=tmp_path / "rb"))
    rb.loads(tmp_path / "d")
    assert len(rb) == ds.num_steps and torch.equal(rb[:]["observation"], ds.td["observation"])
    for k in range(ds.num_episodes):
        ep = ds.episode(k)
        L = lengths[int(ds.episode_ids[k]) % 3]
        assert ep.batch_size == (L,)
        assert ep["step_count"].view(-1).tolist() == list(range(L))
        assert ep["next", "done"].view(-1).tolist() == [False] * (L - 1) + [True]
    assert f"INCOMPLETE ({reason});" in ds.summary()
    pool.close()


def test_env_failure_mid_collect_leaves_loadable_dataset(tmp_path):
    from envs import FailingEnv

    pool = EnvPool([functools.partial(counting, length=2), functools.partial(FailingEnv, fail_at=6)], seed=0)
    with pytest.raises(Exception, match="boom"):
        World(pool, max_episode_steps=100).collect(tmp_path / "d", 6, seed=0, progress=False)
    ds = load_dataset(tmp_path / "d")
    assert ds.episode_ids.tolist() == [0, 2] and ds.episode_lengths.tolist() == [2, 2]
    pool.close()


def test_interrupt_before_any_episode_completes(tmp_path):
    pool = EnvPool([functools.partial(counting, length=5)], seed=0)
    with pytest.raises(KeyboardInterrupt):
        World(pool, Interrupt(1, at=2, error=KeyboardInterrupt()), max_episode_steps=9).collect(
            tmp_path / "d", 2, seed=0, progress=False
        )
    assert not (tmp_path / "d").exists()  # nothing is written until an episode is complete
    pool.close()
    writer = DatasetWriter(tmp_path / "empty", 10)  # a dataset with no episodes still loads
    writer.open()
    writer.close(complete=False)
    ds = load_dataset(tmp_path / "empty")
    assert ds.num_episodes == 0 and len(ds) == 0 and ds.td is None
    assert "0 episodes" in ds.summary()


# -- paths, overwrite, errors --------------------------------------------------------------------------------
def test_overwrite_rules(tmp_path):
    pool = counting_pool(2)
    world = World(pool, max_episode_steps=8)
    world.collect(tmp_path / "d", 2, seed=0, progress=False)
    with pytest.raises(FileExistsError, match="overwrite"):
        world.collect(tmp_path / "d", 2, seed=0, progress=False)
    assert world.collect(tmp_path / "d", 3, seed=0, overwrite=True, progress=False).num_episodes == 3
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not a torchrl_swm dataset"):
        world.collect(other, 2, seed=0, overwrite=True, progress=False)
    assert (other / "keep.txt").read_text() == "precious"
    # "dataset.json" is a common name: another tool's, or an unreadable one, does not make the directory ours to
    # delete (any dataset.json did, and overwrite removed the directory with the user's files)
    for content, why in [('{"format": "coco", "images": []}', "has format 'coco', not 'torchrl_swm.dataset'"),
                         ("[1, 2]", "has format None"), ("{not json", "is unreadable: JSONDecodeError")]:
        (other / "dataset.json").write_text(content)
        for lazy in (False, True):
            with pytest.raises(FileExistsError, match=rf"not a torchrl_swm dataset \(its dataset.json {why}"):
                DatasetWriter(other, 4, overwrite=True, lazy=lazy)
        with pytest.raises(FileExistsError, match="not a torchrl_swm dataset"):
            world.collect(other, 2, seed=0, overwrite=True, progress=False)
        assert (other / "keep.txt").read_text() == "precious"
    pool.close()


def test_a_lazy_overwrite_removes_the_old_dataset_when_it_opens_and_checks_the_path_again(tmp_path):
    # DatasetWriter(lazy=True, overwrite=True): open() (or the first add) removes the old dataset whole, and
    # refuses a path that stopped being free (or a dataset) since the writer was made
    def episode(i, n=2):
        return TensorDict({"episode": torch.full((n,), i), "x": torch.full((n,), float(i))}, [n])

    old = DatasetWriter(tmp_path / "d", capacity=4)
    old.add(episode(0))
    old.close(complete=True)
    (tmp_path / "d" / "old_extra.txt").write_text("from the old dataset")
    writer = DatasetWriter(tmp_path / "d", capacity=4, overwrite=True, lazy=True)
    assert (tmp_path / "d" / "old_extra.txt").exists()  # lazy: nothing removed yet
    writer.add(episode(5))
    assert not (tmp_path / "d" / "old_extra.txt").exists()  # nothing of the old dataset survives
    writer.close(complete=True)
    assert load_dataset(tmp_path / "d").episode_ids.tolist() == [5]

    late = DatasetWriter(tmp_path / "late", capacity=4, lazy=True)  # free when made
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        late.open()
    assert (tmp_path / "late" / "keep.txt").read_text() == "precious"
    notes = tmp_path / "notes"
    replacing = DatasetWriter(notes, capacity=4, overwrite=True, lazy=True)  # free when made
    notes.mkdir()
    (notes / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not a torchrl_swm dataset"):
        replacing.add(episode(0))
    assert (notes / "keep.txt").read_text() == "precious"


def test_collect_needs_a_step_bound(tmp_path):
    pool = counting_pool(2)
    with pytest.raises(ValueError, match="max_steps"):
        World(pool).collect(tmp_path / "d", 2, progress=False)
    with pytest.raises(ValueError, match="episodes"):
        World(pool, max_episode_steps=3).collect(tmp_path / "d", 0, progress=False)
    pool.close()


def test_load_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="dataset.json is missing"):
        load_dataset(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "dataset.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(tmp_path / "bad")
    (tmp_path / "bad" / "dataset.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(DatasetError, match="unknown format"):
        load_dataset(tmp_path / "bad")
    from torchrl_swm.data import FORMAT

    for field, value in (("version", "1.0"), ("num_steps", None), ("num_steps", -3), ("num_steps", True)):
        (tmp_path / "bad" / "dataset.json").write_text(json.dumps({"format": FORMAT, field: value}))
        with pytest.raises(DatasetError, match=rf"dataset.json': '{field}' must be a non-negative integer, "
                                               rf"got {value!r}; the dataset's metadata is damaged"):
            load_dataset(tmp_path / "bad")


_COLLECT_INTO_A_SMALL_DISK = """
import json, sys, warnings
from torchrl_swm import World, load_dataset
path = sys.argv[1] if len(sys.argv) > 1 else {path!r}
warnings.simplefilter("always")
with World("CartPole-v1", num_envs=2, image_shape=(64, 64)) as world:
    try:
        with warnings.catch_warnings(record=True) as caught:
            world.collect(path, {episodes}, seed=0, progress=False)
        print("collected", [str(w.message)[:600] for w in caught])
    except OSError as err:
        print("OSError", err.errno, err)
meta = json.load(open(path + "/dataset.json"))
print("meta", {{k: meta.get(k) for k in ("complete", "compacted", "num_episodes", "storage_rows")}},
      "compaction_skipped" in meta)
ds = load_dataset(path)
print("loaded", ds.num_episodes, len(ds), ds.td is None or bool((ds.td["pixels"].float().mean() > 0)))
"""


@pytest.mark.parametrize("size, episodes", [("3m", 40), ("30m", 40)], ids=["data", "compaction-copy"])
def test_a_full_disk_is_an_oserror_or_a_skipped_compaction_never_a_sigbus(tmp_path, size, episodes):
    """The storage's files are sparse memory maps: writing past the disk's free space killed the process with
    SIGBUS (exit 135, nothing printed), while collecting (3 MiB) or while compacting (30 MiB: room for the data,
    not for its copy). Runs in a private mount namespace with a tmpfs of that size."""
    from small_tmpfs import run_with_a_tmpfs_at

    mount = tmp_path / "mnt"
    out = run_with_a_tmpfs_at(mount, size, _COLLECT_INTO_A_SMALL_DISK.format(path=str(mount / "ds"),
                                                                           episodes=episodes), tmp_path)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    if size == "3m":
        assert re.search(r"OSError 28 \[Errno 28\] DatasetWriter: episode \d+ \(\d+ steps\) needs [\d.]+ MiB on the "
                         r"filesystem of .*, which has [\d.]+ MiB free; free some space or write the dataset elsewhere",
                         out.stdout), out.stdout
        assert "meta {'complete': False, 'compacted': False" in out.stdout, out.stdout
    else:  # every episode written; the copy skipped, with a warning
        assert re.search(r"collected \[.*compacting the storage \(a copy\) needs .*; the dataset is left uncompacted \(its "
                         r"storage keeps its 20000 rows; every episode is there\)", out.stdout)
        assert "meta {'complete': True, 'compacted': False, 'num_episodes': 40, 'storage_rows': " in out.stdout
        assert "} True" in out.stdout and "loaded 40 " in out.stdout, out.stdout
    assert re.search(r"loaded \d+ \d+ True", out.stdout), out.stdout


def test_an_uncompacted_dataset_maps_only_its_committed_rows(tmp_path):
    """The reader mapped every file privately at the storage's full capacity before slicing it: an interrupted
    collect of a large capacity (49 GB sparse, 3 MB written) could not be opened (the kernel refuses a private
    mapping that large)."""
    pool = counting_pool(2)
    ds = World(pool, max_episode_steps=50).collect(tmp_path / "d", 4, seed=0, compact=False, progress=False)
    assert ds.metadata["storage_rows"] == 200 > ds.num_steps
    for key, leaf in ds.td.items(True, True):
        assert leaf.untyped_storage().nbytes() == leaf.numel() * leaf.element_size(), key  # num_steps rows mapped
    pool.close()


def test_uncompacted_dataset_loads_with_the_committed_length(tmp_path):
    pool = counting_pool(2)
    ds = World(pool, max_episode_steps=50).collect(tmp_path / "d", 4, seed=0, compact=False, progress=False)
    full = TensorDict.load_memmap(tmp_path / "d" / "storage")
    assert full.batch_size[0] == 4 * 50 > ds.num_steps  # sparse capacity left in place
    assert ds.num_episodes == 4 and ds.metadata["compacted"] is False
    pool.close()


def test_overwrite_and_friends_refuse_truthy_non_bools(tmp_path):
    """overwrite="no" was truthy: it replaced an existing dataset."""
    path = tmp_path / "ds"
    with World("CartPole-v1", num_envs=2, seed=0) as world:
        world.collect(path, 2, seed=0, progress=False)
        before = sorted(p.name for p in path.rglob("*"))
        with pytest.raises(TypeError, match=r"collect: overwrite: expected True or False, got str 'no'"):
            world.collect(path, 2, seed=1, progress=False, overwrite="no")
        with pytest.raises(TypeError, match=r"collect: compact: expected True or False, got NoneType None"):
            world.collect(tmp_path / "other", 2, seed=1, progress=False, compact=None)
        # progress="no" would draw the bar: refused before anything runs, in collect and in evaluate
        with pytest.raises(TypeError, match=r"collect: progress: expected True, False or None, got str 'no'"):
            world.collect(tmp_path / "other", 2, seed=1, progress="no")
        with pytest.raises(TypeError, match=r"evaluate: progress: expected True, False or None, got str 'no'"):
            world.evaluate(2, seed=1, progress="no")
    assert sorted(p.name for p in path.rglob("*")) == before and load_dataset(path).num_episodes == 2
    assert not (tmp_path / "other").exists()
    with pytest.raises(TypeError, match=r"DatasetWriter: overwrite: expected True or False, got str 'no'"):
        DatasetWriter(path, 10, overwrite="no")
    with pytest.raises(TypeError, match=r"DatasetWriter: lazy: expected True or False, got int 1"):
        DatasetWriter(tmp_path / "third", 10, lazy=1)
    assert load_dataset(path).num_episodes == 2


def test_writer_rejects_overflow_and_late_adds(tmp_path):
    writer = DatasetWriter(tmp_path / "w", capacity=3)
    ep = TensorDict({"episode": torch.zeros(2, dtype=torch.int64), "x": torch.ones(2, 1)}, [2])
    writer.add(ep)
    with pytest.raises(RuntimeError, match="does not fit"):
        writer.add(ep.clone().fill_("episode", 1))
    writer.close(complete=True)
    with pytest.raises(RuntimeError, match="after close"):
        writer.add(ep)
    assert load_dataset(tmp_path / "w").num_steps == 2



@pytest.mark.parametrize("kwargs, error, said", [
    ({"capacity": 2.9}, TypeError, r"capacity \(rows\): expected an int, got float 2.9"),  # it was 2 rows
    ({"capacity": True}, TypeError, r"capacity \(rows\): expected an int, got bool"),  # it was 1 row
    ({"capacity": 0}, ValueError, r"capacity \(rows\): expected an int >= 1, got 0"),
    ({"commit_every": float("nan")}, ValueError, r"commit_every \(seconds\) must be >= 0, got nan"),  # never
    ({"commit_every": -1}, ValueError, r"commit_every \(seconds\) must be >= 0, got -1"),
    ({"commit_every": "2"}, TypeError, r"commit_every \(seconds\) must be a number, got str"),
    ({"metadata": {"format": "mine", "note": 1}}, ValueError, r"metadata keys \['format'\] are the dataset's own"),
    ({"metadata": {"num_steps": 3, "versions": {}}}, ValueError, r"keys \['num_steps', 'versions'\]"),
    ({"metadata": [1]}, TypeError, r"metadata: expected a mapping of JSON values, got list"),
])
def test_writer_refuses_bad_arguments_before_it_creates_anything(tmp_path, kwargs, error, said):
    # review R4: a float capacity was truncated, a NaN commit_every never committed, and metadata={"format": ...}
    # made the dataset unreadable ("versions" was silently replaced)
    kwargs = {"capacity": 10, **kwargs}
    with pytest.raises(error, match=said):
        DatasetWriter(tmp_path / "w", **kwargs)
    assert not (tmp_path / "w").exists()
    writer = DatasetWriter(tmp_path / "ok", capacity=10, metadata={"note": "mine"})
    writer.add(TensorDict({"episode": torch.zeros(2, dtype=torch.int64), "x": torch.ones(2, 1)}, [2]))
    writer.close(complete=True)
    assert load_dataset(tmp_path / "ok").metadata["note"] == "mine"


def test_writer_with_commit_every_zero_commits_after_each_episode_before_close(tmp_path):
    """DatasetWriter commits after each episode at most every commit_every seconds: with commit_every=0 a reader
    (or a run after the writer was killed) loads every episode added so far while the writer is still open."""
    writer = DatasetWriter(tmp_path / "w", capacity=20, commit_every=0)
    for i, length in enumerate((3, 2)):
        writer.add(TensorDict({"episode": torch.full((length,), i), "x": torch.full((length, 1), float(i))}, [length]))
        ds = load_dataset(tmp_path / "w")  # the writer is still open
        assert ds.episode_ids.tolist() == list(range(i + 1)) and ds.episode_lengths.tolist() == [3, 2][: i + 1]
        assert ds.td["x"].view(-1).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0][: ds.num_steps]
    writer.close(complete=True)
    assert load_dataset(tmp_path / "w").num_steps == 5


def test_writer_refuses_an_episode_unlike_the_first_a_repeated_id_or_no_id(tmp_path):
    # the storage is laid out by the first episode: it would store a missing entry as zeros, drop an extra one
    def episode(i, length, **entries):
        entries = entries or {"x": torch.full((length, 2), float(i))}
        return TensorDict({"episode": torch.full((length,), i), **entries}, [length])

    writer = DatasetWriter(tmp_path / "w", capacity=20)
    writer.add(episode(0, 3))
    cases = [
        (episode(1, 2, y=torch.ones(2, 2)), r"missing \['x'\], extra \['y'\]"),
        (episode(1, 2, x=torch.ones(2, 2), y=torch.ones(2, 2)), r"missing \[\], extra \['y'\]"),
        (episode(1, 2, x=torch.ones(2, 3)), r"changed \[\('x', \{'shape': \[2\].*\{'shape': \[3\]"),
        (episode(1, 2, x=torch.ones(2, 2, dtype=torch.float64)), r"changed .*torch.float64"),
        (episode(0, 2), "episode 0 is already in the dataset"),
        (episode(1, 2).exclude("episode"), "no integer 'episode' entry"),
        (episode(1, 2).set("episode", torch.tensor([1, 2])), r"several 'episode' ids: \[1, 2\]"),
        (TensorDict({"episode": torch.zeros(0, dtype=torch.int64)}, [0]), "L >= 1"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            writer.add(bad)
    lazy = DatasetWriter(tmp_path / "lazy", capacity=20, lazy=True)
    for bad in ({"episode": torch.zeros(3)}, TensorDict({"episode": torch.zeros(())}, [])):
        with pytest.raises(ValueError, match=r"expected one episode, a TensorDict of batch \[L\]"):
            lazy.add(bad)
    assert not (tmp_path / "lazy").exists()  # a refused episode creates nothing
    writer.add(episode(1, 2))  # nothing of the refused episodes was written
    writer.close(complete=True)
    ds = load_dataset(tmp_path / "w")
    assert ds.episode_ids.tolist() == [0, 1] and ds.episode_lengths.tolist() == [3, 2]
    assert ds.td["x"][:, 0].tolist() == [0, 0, 0, 1, 1]


def test_a_full_storage_of_episodes_added_out_of_id_order_is_compacted_sorted_by_id(tmp_path):
    # close(compact=True) stores episodes sorted by id even when the storage is full (no rows to trim)
    def episode(i, n):
        return TensorDict({"episode": torch.full((n,), i), "x": torch.full((n,), float(i))}, [n])

    writer = DatasetWriter(tmp_path / "w", capacity=5)
    writer.add(episode(1, 3))
    writer.add(episode(0, 2))
    writer.close(complete=True)
    ds = load_dataset(tmp_path / "w")
    assert ds.episode_ids.tolist() == [0, 1] and ds.episode_lengths.tolist() == [2, 3]
    assert ds.td["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_the_writers_episode_ids_and_lengths_follow_the_compacted_storage(tmp_path):
    # after close(complete=True), writer.episode_ids / episode_lengths are in id order, as the storage is
    writer = DatasetWriter(tmp_path / "w", capacity=10)
    for i, n in ((2, 1), (1, 2), (0, 3)):
        writer.add(TensorDict({"episode": torch.full((n,), i), "x": torch.full((n,), float(i))}, [n]))
    assert writer.episode_ids == [2, 1, 0]  # completion order until the compaction
    writer.close(complete=True)
    assert writer.episode_ids == [0, 1, 2] and writer.episode_lengths == [3, 2, 1]
    ds = load_dataset(tmp_path / "w")
    assert ds.episode_ids.tolist() == writer.episode_ids and ds.episode_lengths.tolist() == writer.episode_lengths


def test_writer_refuses_a_repeated_id_added_before_the_last_episode(tmp_path):
    # each episode id can be added once, whichever episode came last (ids 0, 1, 0)
    writer = DatasetWriter(tmp_path / "w", capacity=20)
    for i in (0, 1):
        writer.add(TensorDict({"episode": torch.full((2,), i), "x": torch.ones(2)}, [2]))
    with pytest.raises(ValueError, match="episode 0 is already in the dataset"):
        writer.add(TensorDict({"episode": torch.zeros(2, dtype=torch.int64), "x": torch.ones(2)}, [2]))
    writer.close(complete=True)
    assert load_dataset(tmp_path / "w").episode_ids.tolist() == [0, 1]


def test_a_first_episode_whose_write_fails_does_not_lay_out_the_dataset(tmp_path):
    # the storage is laid out by the first episode WRITTEN: after a failed first write (a Ctrl-C inside the
    # storage's write) another first episode, with other entries, is accepted with its own layout
    writer = DatasetWriter(tmp_path / "w", capacity=20)
    writer.open()
    advance = writer.storage._get_new_len

    def advance_then_interrupt(*args, **kwargs):
        advance(*args, **kwargs)
        raise KeyboardInterrupt

    writer.storage._get_new_len = advance_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        writer.add(TensorDict({"episode": torch.zeros(3, dtype=torch.int64), "x": torch.ones(3)}, [3]))
    assert writer.num_steps == 0 and writer.episode_ids == [] and writer.keys is None
    writer.add(TensorDict({"episode": torch.ones(2, dtype=torch.int64), "y": torch.full((2,), 2.0)}, [2]))
    writer.close(complete=True)
    ds = load_dataset(tmp_path / "w")
    assert ds.episode_ids.tolist() == [1] and ds.td["y"].tolist() == [2.0, 2.0] and "x" not in ds.td.keys()


@tensorclass
class _Position:
    x: torch.Tensor


_DENSE = r"dense tensors with data, of dtype bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, "
_UNSTORABLE = {  # what is refused, then what a dataset stores instead
    "non-tensor": (lambda: NonTensorData("hi", batch_size=[3]), r"holds non-tensor data \(NonTensorData: \['hi'",
                   r"tensors only"),
    "uint16": (lambda: torch.ones(3, dtype=torch.uint16), r"is Tensor\(dtype=torch.uint16, shape=\(3,\)\)", _DENSE),
    "float8": (lambda: torch.ones(3).to(torch.float8_e4m3fn), r"is Tensor\(dtype=torch.float8_e4m3fn", _DENSE),
    "sparse": (lambda: torch.eye(3).to_sparse(),
               r"is Tensor\(dtype=torch.float32, shape=\(3, 3\)\), layout torch.sparse_coo", _DENSE),
    "meta": (lambda: torch.ones(3, device="meta"), r"is Tensor\(dtype=torch.float32, shape=\(3,\)\), on meta", _DENSE),
    # a tensorclass was written and then not read back; a leaf with no elements has no file: the dataset could
    # not be opened at the end of the collect
    "tensorclass": (lambda: _Position(x=torch.ones(3), batch_size=[3]), r"is a tensorclass \(_Position\)",
                    r"tensors and TensorDicts \(its \.to_tensordict\(\)\)"),
    "no elements": (lambda: torch.zeros(3, 0), r"is Tensor\(dtype=torch.float32, shape=\(3, 0\)\), with no elements",
                    r"tensors with at least one element per row"),
}


@pytest.mark.parametrize("kind", list(_UNSTORABLE))
def test_an_entry_the_storage_cannot_hold_is_refused_before_anything_is_written(tmp_path, kind):
    # a non-tensor entry was dropped without a word; a float8 one failed at the commit with a bare KeyError after
    # the episode was counted (the next episode was then refused as "entries differ"); uint16, sparse and meta
    # ones with torch's own errors
    make, what, stored = _UNSTORABLE[kind]
    writer = DatasetWriter(tmp_path / "w", capacity=20, lazy=True)
    bad = TensorDict({"episode": torch.zeros(3, dtype=torch.int64), "x": torch.ones(3), "bad": make()}, [3])
    with pytest.raises(TypeError, match=r"DatasetWriter.add: episode 0's entry 'bad' " + what
                       + r".*; a dataset stores " + stored + r".*: leave it out, or convert it$"):
        writer.add(bad)
    assert not (tmp_path / "w").exists() and writer.keys is None
    writer.add(TensorDict({"episode": torch.ones(2, dtype=torch.int64), "y": torch.full((2,), 2.0)}, [2]))
    writer.close(complete=True)
    assert load_dataset(tmp_path / "w").episode_ids.tolist() == [1]


def test_every_storable_dtype_is_written_and_read_back_exactly(tmp_path):
    # listed here, not read from STORABLE_DTYPES: a dtype dropped from that list would be refused
    storable = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128)
    writer = DatasetWriter(tmp_path / "w", capacity=20)
    values = {str(dtype).removeprefix("torch."): (torch.arange(3) % 2 + 1).to(dtype) for dtype in storable}
    writer.add(TensorDict({"episode": torch.zeros(3, dtype=torch.int64), **values}, [3]))
    writer.close(complete=True)
    td = load_dataset(tmp_path / "w").td
    for name, value in values.items():
        stored = td[name][:3].clone()
        if value.dtype is torch.complex32:  # torch compares no ComplexHalf: compare its float view
            stored, value = torch.view_as_real(stored), torch.view_as_real(value)
        assert stored.dtype == value.dtype and torch.equal(stored, value), name


def test_an_interrupt_inside_the_storage_write_leaves_no_rows_of_that_episode_for_rb_loads(tmp_path):
    """TorchRL's writer advances its cursor and the storage length before writing: a Ctrl-C landing there
    must not leave rows of no episode in the storage metadata that a plain ``rb.loads(path)`` reads."""
    writer = DatasetWriter(tmp_path / "w", capacity=20)

    def episode(i, n):
        return TensorDict({"episode": torch.full((n,), i), "x": torch.arange(n, dtype=torch.float32) + 1}, [n])

    writer.add(episode(0, 3))
    storage = writer.storage
    advance = storage._get_new_len

    def advance_then_interrupt(*args, **kwargs):
        advance(*args, **kwargs)
        raise KeyboardInterrupt

    storage._get_new_len = advance_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        writer.add(episode(1, 5))
    storage._get_new_len = advance
    writer.add(episode(2, 4))  # the next episode lands right after the last complete one
    writer.close(complete=False, interrupted="KeyboardInterrupt", compact=False)  # the storage as written
    assert load_dataset(tmp_path / "w").num_steps == 7
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(20))
    rb.loads(tmp_path / "w")
    assert len(rb) == 7
    assert rb[:7]["episode"].tolist() == [0] * 3 + [2] * 4 and rb[:7]["x"].tolist() == [1, 2, 3, 1, 2, 3, 4]


def test_an_interrupt_while_the_first_episode_creates_the_storage_leaves_the_writer_usable(tmp_path, monkeypatch):
    from tensordict import TensorDictBase

    writer = DatasetWriter(tmp_path / "w", capacity=20)
    memmap_like = TensorDictBase.memmap_like

    def create_then_interrupt(self, *args, **kwargs):
        memmap_like(self, *args, **kwargs)  # the storage files exist now
        raise KeyboardInterrupt

    monkeypatch.setattr(TensorDictBase, "memmap_like", create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        writer.add(TensorDict({"episode": torch.zeros(3, dtype=torch.int64), "x": torch.ones(3)}, [3]))
    monkeypatch.setattr(TensorDictBase, "memmap_like", memmap_like)
    assert writer.num_steps == 0 and writer.episode_ids == []
    writer.add(TensorDict({"episode": torch.ones(2, dtype=torch.int64), "x": torch.full((2,), 2.0)}, [2]))
    writer.close(complete=True)
    ds = load_dataset(tmp_path / "w")
    assert ds.num_episodes == 1 and ds.episode(0)["x"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("failure", [OSError, KeyboardInterrupt], ids=["mmap failed", "Ctrl-C"])
@pytest.mark.parametrize("earlier", [None, "dataset", "empty dir"])
def test_a_collect_whose_first_episode_cannot_be_written_leaves_the_path_as_it_was(tmp_path, monkeypatch, failure,
                                                                                 earlier):
    """World.collect's writer is lazy: nothing is created or replaced until an episode is written. A first
    episode whose storage fails (an mmap the address space refuses) or is interrupted left a directory of 0
    episodes, and under overwrite=True the earlier dataset was already deleted; review R2 B1."""
    from tensordict import TensorDictBase

    path = tmp_path / "d"
    if earlier == "dataset":
        World(counting_pool(2), max_episode_steps=8).collect(path, 2, seed=0, progress=False)
        before = sorted(str(f.relative_to(path)) for f in path.rglob("*"))
        stamp = (path / "dataset.json").stat()
    elif earlier == "empty dir":
        path.mkdir()
    memmap_like = TensorDictBase.memmap_like

    def create_then_fail(self, *args, **kwargs):
        memmap_like(self, *args, **kwargs)  # the storage files exist now
        raise failure("unable to mmap") if failure is OSError else failure()

    monkeypatch.setattr(TensorDictBase, "memmap_like", create_then_fail)
    with pytest.raises(failure):
        World(counting_pool(2), max_episode_steps=8).collect(path, 3, seed=1, progress=False, overwrite=True)
    monkeypatch.setattr(TensorDictBase, "memmap_like", memmap_like)
    assert [p.name for p in tmp_path.iterdir() if p.name != "d"] == []  # nothing set aside is left
    if earlier is None:
        assert not path.exists()
    elif earlier == "empty dir":
        assert path.is_dir() and not any(path.iterdir())
    else:
        assert sorted(str(f.relative_to(path)) for f in path.rglob("*")) == before
        now = (path / "dataset.json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)  # the CLI's "is unchanged"
        assert load_dataset(path).num_episodes == 2
    # and the same collect then writes, replacing what was there
    ds = World(counting_pool(2), max_episode_steps=8).collect(path, 3, seed=1, progress=False, overwrite=True)
    assert ds.num_episodes == 3 and load_dataset(path).num_episodes == 3
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_a_lazy_writer_removes_the_dataset_it_replaces_at_its_first_commit(tmp_path):
    path = tmp_path / "d"
    World(counting_pool(2), max_episode_steps=8).collect(path, 2, seed=0, progress=False)
    writer = DatasetWriter(path, capacity=20, overwrite=True, lazy=True, commit_every=0)
    assert load_dataset(path).num_episodes == 2  # still there
    writer.add(TensorDict({"episode": torch.zeros(3, dtype=torch.int64), "x": torch.ones(3)}, [3]))
    # the old dataset is gone; the lock of the writer writing d lies beside it until close
    assert sorted(p.name for p in tmp_path.iterdir()) == [".d.lock", "d"] and load_dataset(path).num_episodes == 1
    writer.close(complete=False)  # an interrupted collection of one episode keeps it
    assert load_dataset(path).num_episodes == 1 and [p.name for p in tmp_path.iterdir()] == ["d"]


def test_exclude_keys_are_not_stored(tmp_path):
    pool = counting_pool(2, pixels=True)
    ds = World(pool, max_episode_steps=8).collect(tmp_path / "d", 3, seed=0, progress=False,
                                                  exclude_keys=["pixels", ("info", "length")])
    keys = set(ds.td.keys(True, True))
    assert "pixels" not in keys and ("next", "pixels") not in keys
    assert ("info", "length") not in keys and ("next", "info", "length") not in keys
    assert ("info", "t") in keys and "observation" in keys
    assert ds.metadata["excluded_keys"] == ["pixels", ["info", "length"]]
    # a key the steps do not have (a typo) is an error, never a silent "excluded" that stored everything
    with pytest.raises(ValueError, match=r"exclude_keys \['observaton', \('info', 'lenght'\)\] are not keys"):
        World(pool, max_episode_steps=8).collect(tmp_path / "typo", 3, seed=0, progress=False,
                                                 exclude_keys=["observaton", ("info", "lenght")])
    pool.close()


def test_replay_buffer_slices_and_batch_size_must_agree(collected):
    _, ds = collected
    with pytest.raises(ValueError, match=r"batch_size 30 is not num_slices \* slice_len = 4 \* 5 = 20"):
        ds.replay_buffer(num_slices=4, slice_len=5, batch_size=30)
    with pytest.raises(ValueError, match="num_slices needs slice_len"):
        ds.replay_buffer(num_slices=4, batch_size=8)
    with pytest.raises(ValueError, match="batch_size 10 is not a multiple of slice_len 4"):  # TorchRL: at sample()
        ds.replay_buffer(slice_len=4, batch_size=10)
    assert ds.replay_buffer(num_slices=4, slice_len=2, batch_size=8).sample().reshape(4, 2).batch_size == (4, 2)



class RootSuccessEnv(gym.Env):
    """Dict observation {"t", "success"}: "success" (a root key, as World accepts) turns on at t=2, of 3 steps."""

    observation_space = gym.spaces.Dict({"t": gym.spaces.Box(0, 10, (1,), np.float32),
                                         "success": gym.spaces.MultiBinary(1)})
    action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"t": np.array([self.t], np.float32), "success": np.array([self.t >= 2], np.int8)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 3, False, {}


def test_stats_read_success_from_root_keys_as_world_does(tmp_path):
    pool = EnvPool([RootSuccessEnv] * 2, seed=0)
    World(pool, max_episode_steps=5).collect(tmp_path / "ds", 4, seed=0, progress=False)
    stats = load_dataset(tmp_path / "ds").stats()
    assert stats["lengths"].tolist() == [3] * 4
    assert stats["successes"] is not None and stats["successes"].all()
    pool.close()


class TerminalSuccessEnv(gym.Env):
    """Success is reported in the step info of the step that ends the episode only (as PointMaze and Fetch do), and
    only for episodes of an even seed; the reset info has no success key."""

    observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.wins = 0, seed is not None and seed % 2 == 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= 3
        return np.full(1, self.t, np.float32), 1.0, done, False, {"is_success": bool(done and self.wins)}


class TwoSuccessKeysEnv(TerminalSuccessEnv):
    """Reports "success" (always False) beside "is_success": World reads the first of its SUCCESS_KEYS."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "success": False}


@pytest.mark.parametrize("env_cls", [TerminalSuccessEnv, TwoSuccessKeysEnv])
def test_stats_read_a_success_reported_by_the_terminating_step_as_world_does(tmp_path, env_cls):
    # the flag of the step that ends an episode is stored under "next" only (never at the root of any row); of two
    # success keys, stats() reads the one World reads
    pool = EnvPool([env_cls] * 2, seed=0)
    world = World(pool, max_episode_steps=5)
    evaluated = world.evaluate(4, seed=0, progress=False)["episode_successes"].tolist()
    ds = world.collect(tmp_path / "ds", 4, seed=0, progress=False)
    assert evaluated == [True, False, True, False]
    assert not ds.td["info", "is_success"].any() and ds.td["next", "info", "is_success"].any()
    assert ds.stats()["successes"].tolist() == evaluated
    assert re.search(r"^  success +0\.500 \(2/4\)$", ds.summary(), re.M), ds.summary()
    pool.close()


def test_the_free_space_check_counts_every_byte_a_storage_row_takes_on_disk(collected):
    # float, int, bool and uint8 pixel entries: an undercount would let a write go ahead that the disk cannot back
    from torchrl_swm.data import _row_bytes

    path, ds = collected
    on_disk = sum(f.stat().st_size for f in (path / "storage").rglob("*.memmap"))
    dtypes = {str(ds.td.get(k).dtype) for k in ds.td.keys(True, True)}
    assert {"torch.float32", "torch.int64", "torch.bool", "torch.uint8"} <= dtypes, dtypes
    assert _row_bytes(ds.metadata["keys"]) * ds.metadata["storage_rows"] == on_disk


def test_replay_buffer_without_strict_length_samples_episodes_shorter_than_a_slice(tmp_path):
    pool = EnvPool([functools.partial(counting, length=n) for n in (2, 5, 3)], seed=0)
    ds = World(pool, max_episode_steps=10).collect(tmp_path / "d", 6, seed=0, progress=False)
    lengths = dict(zip(ds.episode_ids.tolist(), ds.episode_lengths.tolist()))
    assert sorted(lengths.values()) == [2, 2, 3, 3, 5, 5]
    for strict in (True, False):
        torch.manual_seed(0)
        rb = ds.replay_buffer(num_slices=4, slice_len=5, strict_length=strict)
        samples = [rb.sample() for _ in range(20)]
        sampled = {int(e) for b in samples for e in b["episode"].view(-1)}
        sizes = {b.batch_size[0] for b in samples}
        if strict:  # only the 5-step episodes fill a slice
            assert {lengths[e] for e in sampled} == {5} and sizes == {20}
        else:
            assert {lengths[e] for e in sampled} == {2, 3, 5} and min(sizes) < 20
    pool.close()


def test_a_second_ctrl_c_while_an_interrupted_collect_is_compacted_propagates(tmp_path, monkeypatch):
    # close(complete=False) records a failed compaction of an interrupted dataset, unless the failure is itself
    # an interrupt: the user's second Ctrl-C stops the program, and the uncompacted dataset stays loadable
    import signal
    import warnings

    import torchrl.data

    writer = DatasetWriter(tmp_path / "d", capacity=100)
    for i in (1, 0):  # out of id order and fewer rows than the capacity: close compacts
        writer.add(TensorDict({"episode": torch.full((5,), i), "observation": torch.randn(5, 3),
                               "next": {"observation": torch.randn(5, 3)}}, [5]))
    dumps = torchrl.data.ReplayBuffer.dumps

    def interrupted_dumps(self, path):
        if str(path).endswith(".compact"):
            os.kill(os.getpid(), signal.SIGINT)
        return dumps(self, path)

    monkeypatch.setattr(torchrl.data.ReplayBuffer, "dumps", interrupted_dumps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the interrupt is not turned into a "compaction failed" warning
        with pytest.raises(KeyboardInterrupt):
            writer.close(complete=False, interrupted="the first Ctrl-C")
    monkeypatch.undo()
    assert not {".compact", ".old"} & set(os.listdir(tmp_path / "d"))
    ds = load_dataset(tmp_path / "d")
    assert ds.metadata["complete"] is False and ds.metadata["compacted"] is False
    assert sorted(ds.episode_ids.tolist()) == [0, 1] and ds.num_steps == 10


def test_a_ctrl_c_while_a_commit_writes_the_storages_files_is_raised_after_them(tmp_path, monkeypatch):
    """A Ctrl-C inside a periodic commit's rb.dumps left a truncated json file of TorchRL's: close()'s commit read
    it back, and a JSONDecodeError replaced the KeyboardInterrupt (review R2 d1, one run in 45). The commit now
    holds it until the files are written."""
    import json
    import signal

    import torchrl.data.replay_buffers.checkpointers as checkpointers

    writer = DatasetWriter(tmp_path / "d", capacity=100, commit_every=0)
    episode = lambda i: TensorDict({"episode": torch.full((3,), i), "observation": torch.randn(3, 2)}, [3])  # noqa: E731
    writer.add(episode(0))
    dump, calls = json.dump, []

    def interrupted_dump(obj, file, **kwargs):
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)  # the file is open for writing, and still empty
        calls.append(1)
        return dump(obj, file, **kwargs)

    monkeypatch.setattr(checkpointers.json, "dump", interrupted_dump)
    with pytest.raises(KeyboardInterrupt):
        writer.add(episode(1))  # commits at once (commit_every=0)
    monkeypatch.undo()
    assert len(calls) > 1  # the interrupt came after every file was written
    writer.close(complete=False, interrupted="Ctrl-C")
    ds = load_dataset(tmp_path / "d")
    assert ds.episode_ids.tolist() == [0, 1] and ds.metadata["complete"] is False


# -- review fixes: argument errors before anything is written, excluded keys --------------------------------------


def test_bad_collect_arguments_write_nothing_and_the_path_stays_usable(tmp_path):
    world = World(counting_pool(2))
    path = tmp_path / "ds"
    with pytest.raises(ValueError, match="exploration"):
        world.collect(path, 2, seed=0, max_steps=10, exploration="bogus", progress=False)
    assert not path.exists()
    with pytest.raises(TypeError, match="policy: expected a TensorDictModule or a callable"):
        world.collect(path, 2, seed=0, max_steps=10, policy=42, progress=False)
    assert not path.exists()
    ds = world.collect(path, 2, seed=0, max_steps=10, progress=False)  # no FileExistsError from a failed call
    assert ds.num_episodes == 2 and ds.metadata["complete"]


def test_a_collect_failing_at_its_first_step_leaves_the_path_and_an_old_dataset_as_they_were(tmp_path):
    # exclude_keys are checked against the first recorded step: a typo must not leave an empty dataset behind,
    # nor (overwrite=True) delete the complete one it was meant to replace
    world = World(counting_pool(2))
    path = tmp_path / "ds"
    with pytest.raises(ValueError, match="are not keys of the recorded steps"):
        world.collect(path, 2, seed=0, max_steps=10, exclude_keys=["typo"], progress=False)
    assert not path.exists()
    old = world.collect(path, 2, seed=0, max_steps=10, progress=False)  # the corrected retry
    steps = old.num_steps
    with pytest.raises(ValueError, match="are not keys of the recorded steps"):
        world.collect(path, 3, seed=1, max_steps=10, exclude_keys=["typo"], overwrite=True, progress=False)
    kept = load_dataset(path)
    assert kept.num_episodes == 2 and kept.num_steps == steps and kept.metadata["complete"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: stored, but numpy has no view of it
def test_a_key_of_any_storable_dtype_left_out_after_the_first_step_is_an_error(tmp_path, dtype):
    def drops_it(td):  # "aux" written at the first step, then removed
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        if not hasattr(drops_it, "done"):
            drops_it.done = True
            td["aux"] = torch.full((*td.batch_size, 1), 7.0, dtype=dtype)
        elif "aux" in td.keys():
            del td["aux"]
        return td

    with pytest.raises(ValueError, match=r"'aux' was written at the first step but not at this one"):
        World(counting_pool(2)).collect(tmp_path / "d", 2, seed=0, max_steps=10, policy=drops_it, progress=False)


def test_a_key_written_at_some_steps_only_is_an_error_never_uninitialised_memory(tmp_path):
    def first_step_only(td):  # "extra" only on the first step of the collection
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        if not hasattr(first_step_only, "done"):
            first_step_only.done = True
            td["extra"] = torch.full(td.batch_size, 7.0)
        return td

    world = World(counting_pool(2))
    # a root entry carries over to the next steps (TorchRL's step_mdp, as in its collectors' data): recorded
    ds = world.collect(tmp_path / "a", 2, seed=0, max_steps=10, policy=first_step_only, progress=False)
    assert (ds.td["extra"] == 7.0).all()

    def first_step_only_next(td):  # under "next", nothing carries it: missing at the later steps
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        if not hasattr(first_step_only_next, "done"):
            first_step_only_next.done = True
            td["next", "extra"] = torch.full(td.batch_size, 7.0)
        return td

    with pytest.raises(ValueError, match=r"'extra'\) was written at the first step but not at this one.*exclude_keys="):
        world.collect(tmp_path / "a2", 2, seed=0, max_steps=10, policy=first_step_only_next, progress=False)

    def later_steps_only(td):
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        if hasattr(later_steps_only, "seen"):
            td["late"] = torch.ones(td.batch_size)
        later_steps_only.seen = True
        return td

    with pytest.raises(ValueError, match=r"'late' was not written at the first step but is at this one"):
        world.collect(tmp_path / "b", 2, seed=0, max_steps=10, policy=later_steps_only, progress=False)
    # excluded, the key is no trouble
    first_step_only.__dict__.pop("done")
    ds = world.collect(tmp_path / "c", 2, seed=0, max_steps=10, policy=first_step_only, exclude_keys=["extra"],
                       progress=False)
    assert "extra" not in ds.td.keys()


@pytest.mark.parametrize("late", [False, True], ids=["first-step", "later-step"])
def test_a_non_tensor_entry_is_refused_naming_it_never_dropped(tmp_path, late):
    """A policy's NonTensorData ("note": a string) was left out of the dataset without a word (TensorDict's leaves
    skip non-tensors); now an error naming the key and exclude_keys=, and excluded it is no trouble."""
    from tensordict import NonTensorData

    calls = []

    def noting(td):
        calls.append(1)
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        if not late or len(calls) > 3:
            td["policy", "note"] = NonTensorData("hello", batch_size=td.batch_size)
        return td

    world = World(counting_pool(2))
    with pytest.raises(TypeError, match=r"\('policy', 'note'\) holds non-tensor data \(NonTensorData: \['hello', "
                                        r"'hello'\].*exclude_keys=\[\('policy', 'note'\)\]"):
        world.collect(tmp_path / "a", 2, seed=0, max_steps=10, policy=noting, progress=False)
    if late:
        return
    assert not (tmp_path / "a").exists()  # refused at the first step: nothing created
    ds = world.collect(tmp_path / "b", 2, seed=0, max_steps=10, policy=noting, exclude_keys=[("policy", "note")],
                       progress=False)
    assert ds.num_episodes == 2 and ("policy", "note") not in ds.td.keys(True)


def test_a_policy_entry_of_a_dtype_the_storage_cannot_hold_is_refused_at_its_first_step(tmp_path):
    def policy(td):
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        td["policy", "code"] = torch.ones(td.batch_size, dtype=torch.uint16)
        return td

    world = World(counting_pool(2))
    with pytest.raises(TypeError, match=r"World.collect: \('policy', 'code'\) is Tensor\(dtype=torch.uint16.*"
                                        r"exclude_keys=\[\('policy', 'code'\)\]"):
        world.collect(tmp_path / "a", 2, seed=0, max_steps=10, policy=policy, progress=False)
    assert not (tmp_path / "a").exists()


def test_excluding_the_reward_keeps_the_dataset_summarisable(tmp_path):
    world = World(counting_pool(2))
    ds = world.collect(tmp_path / "ds", 3, seed=0, max_steps=10, exclude_keys=[("next", "reward")], progress=False)
    assert ("next", "reward") not in ds.td.keys(True, True)
    stats = ds.stats()
    assert stats["returns"] is None and stats["lengths"].tolist() == ds.episode_lengths.tolist()
    assert "3 episodes" in ds.summary()


def test_exclude_keys_are_checked(tmp_path):
    world = World(counting_pool(2))
    for key in ("episode", "done", ("next", "terminated")):
        with pytest.raises(ValueError, match="cannot be excluded: the dataset format needs it"):
            world.collect(tmp_path / "a", 2, seed=0, max_steps=10, exclude_keys=[key], progress=False)
    with pytest.raises(TypeError, match="ambiguous"):
        world.collect(tmp_path / "a", 2, seed=0, max_steps=10, exclude_keys=("info", "t"), progress=False)
    with pytest.raises(TypeError, match="exclude_keys: expected str or tuple-of-str keys, got 3"):
        world.collect(tmp_path / "a", 2, seed=0, max_steps=10, exclude_keys=[3], progress=False)
    assert not (tmp_path / "a").exists()
    # a bare string is one key, not its characters
    ds = world.collect(tmp_path / "b", 2, seed=0, max_steps=10, exclude_keys="episode_seed", progress=False)
    keys = set(ds.td.keys(True, True))
    assert "episode_seed" not in keys and ("next", "episode_seed") not in keys and "is_init" in keys
    assert ds.metadata["excluded_keys"] == ["episode_seed"]


@pytest.mark.parametrize("where", ["copy", "swap"])
def test_ctrl_c_during_the_final_compaction_leaves_one_complete_dataset_and_no_leftover(tmp_path, monkeypatch, where):
    # a real SIGINT (Ctrl-C) "copy": while the compacted copy is written (the uncompacted storage stays);
    # "swap": while it is moved into place (the swap is finished first). A second Ctrl-C then arrives while
    # the leftovers are removed. Either way the dataset is complete and loadable, with no leftover.
    import signal

    import torchrl.data

    from torchrl_swm import data

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)

    if where == "copy":
        dumps = torchrl.data.ReplayBuffer.dumps

        def interrupted_dumps(self, path):
            if str(path).endswith(".compact"):
                ctrl_c()
            return dumps(self, path)

        monkeypatch.setattr(torchrl.data.ReplayBuffer, "dumps", interrupted_dumps)
    else:
        replace, moved = os.replace, []

        def interrupted_replace(src, dst):
            if ".compact" in str(src):
                moved.append(src)
                if len(moved) == 2:
                    ctrl_c()
            return replace(src, dst)

        monkeypatch.setattr(data.os, "replace", interrupted_replace)
    rmtree = shutil.rmtree

    def interrupted_rmtree(path, *args, **kwargs):
        if str(path).endswith(".compact"):
            ctrl_c()  # the second Ctrl-C
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(data.shutil, "rmtree", interrupted_rmtree)
    pool = EnvPool([functools.partial(counting, length=n) for n in (2, 5, 3)], seed=0)
    with pytest.raises(KeyboardInterrupt):
        World(pool, max_episode_steps=10).collect(tmp_path / "d", 6, seed=0, progress=False)
    monkeypatch.undo()
    assert not {".compact", ".old"} & set(os.listdir(tmp_path / "d"))
    ds = load_dataset(tmp_path / "d")
    assert ds.metadata["complete"] is True and ds.metadata["compacted"] is (where == "swap")
    assert ds.metadata["storage_rows"] == (ds.num_steps if where == "swap" else 6 * 10)
    # the Ctrl-C that cut the copy short, by name (not "KeyboardInterrupt: ", its message being empty)
    assert ds.metadata.get("compaction_failed") == ("KeyboardInterrupt" if where == "copy" else None)
    assert sorted(ds.episode_ids.tolist()) == list(range(6))
    for k in range(ds.num_episodes):
        ep = ds.episode(k)
        assert ep["step_count"].view(-1).tolist() == list(range([2, 5, 3][int(ds.episode_ids[k]) % 3]))
    pool.close()


def test_a_damaged_or_partial_dataset_is_a_dataset_error_never_a_silent_load(tmp_path):
    # tensordict would load without a missing file (the entry silently gone) and grow a short one (zeros)
    world = World(counting_pool(2))
    for name in ("missing", "short", "no_meta", "not_object"):
        world.collect(tmp_path / name, 2, seed=0, max_steps=10, progress=False)
    (tmp_path / "missing" / "storage" / "next" / "observation.memmap").unlink()
    with pytest.raises(DatasetError, match=r"entry 'next.observation' is missing from the storage"):
        load_dataset(tmp_path / "missing")
    short = tmp_path / "short" / "storage" / "observation.memmap"
    size = short.stat().st_size
    with open(short, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DatasetError, match=rf"entry 'observation' is cut short: .* holds {size // 2} bytes, "
                                           rf"expected {size}"):
        load_dataset(tmp_path / "short")
    assert short.stat().st_size == size // 2  # reading never grows the file back
    (tmp_path / "no_meta" / "storage" / "meta.json").unlink()
    with pytest.raises(DatasetError, match=r"the storage cannot be read \(FileNotFoundError"):
        load_dataset(tmp_path / "no_meta")
    (tmp_path / "not_object" / "dataset.json").write_text("[]")
    with pytest.raises(DatasetError, match=r"dataset.json': expected a JSON object, got list"):
        load_dataset(tmp_path / "not_object")


def _load_while_written_back(path, file, mid_way: str, after: float = 0.1):
    """``load_dataset(path)`` while ``file`` holds ``mid_way`` until a timer writes its content back ``after`` s in."""
    content = file.read_text()
    file.write_text(mid_way)
    timer = threading.Timer(after, file.write_text, args=(content,))
    timer.start()
    try:
        return load_dataset(path)
    finally:
        timer.join()


def test_a_dataset_being_committed_to_is_read_again_not_called_damaged(tmp_path):
    # each commit of a collection in progress rewrites storage/meta.json (TorchRL's dumps): a reader that catches
    # it half written (here: empty until a timer writes it back) reads again while dataset.json says incomplete
    World(counting_pool(2)).collect(tmp_path / "ds", 3, seed=0, max_steps=10, progress=False)
    expected = load_dataset(tmp_path / "ds").td.to_dict()
    dataset_json, storage_meta = tmp_path / "ds" / "dataset.json", tmp_path / "ds" / "storage" / "meta.json"
    dataset_json.write_text(json.dumps({**json.loads(dataset_json.read_text()), "complete": False}))
    ds = _load_while_written_back(tmp_path / "ds", storage_meta, "")
    assert (ds.td == TensorDict(expected, batch_size=ds.td.batch_size)).all()
    storage_meta.write_text("")  # never written back: damaged, and the message says it may be in progress
    with pytest.raises(DatasetError, match=r"storage cannot be read \(JSONDecodeError.*still being written"):
        load_dataset(tmp_path / "ds")


def test_a_dataset_caught_between_compaction_and_its_last_dataset_json_is_read_again(tmp_path):
    # a finished collect compacts the storage to num_steps rows, then writes dataset.json (complete, storage_rows):
    # in between, dataset.json still gives the capacity, and the compacted files look cut short
    World(counting_pool(2)).collect(tmp_path / "ds", 3, seed=0, max_steps=10, progress=False)
    dataset_json = tmp_path / "ds" / "dataset.json"
    meta = json.loads(dataset_json.read_text())
    expected = load_dataset(tmp_path / "ds").td.to_dict()
    mid_way = json.dumps({**meta, "complete": False, "storage_rows": 10 * meta["num_steps"]})
    ds = _load_while_written_back(tmp_path / "ds", dataset_json, mid_way)
    assert ds.metadata["complete"] is True
    assert (ds.td == TensorDict(expected, batch_size=ds.td.batch_size)).all()
    dataset_json.write_text(mid_way)
    with pytest.raises(DatasetError, match=r"is cut short.*still being written"):
        load_dataset(tmp_path / "ds")


@pytest.mark.parametrize("damage", ["shape", "dtype", "storage_rows", "no_episode", "num_steps"])
def test_a_storage_that_disagrees_with_dataset_json_is_a_dataset_error(tmp_path, damage):
    # the storage's own meta.json would reshape (or reinterpret) the rows without a word
    World(counting_pool(2)).collect(tmp_path / "ds", 3, seed=0, max_steps=10, progress=False)
    storage_meta, dataset_json = tmp_path / "ds" / "storage" / "meta.json", tmp_path / "ds" / "dataset.json"
    meta, info = json.loads(storage_meta.read_text()), json.loads(dataset_json.read_text())
    if damage == "shape":
        meta["observation"]["shape"] = [meta["observation"]["shape"][0], 1]  # the rows, 1 value each
        message = r"entry 'observation': dataset.json says shape \[3\] .* the storage holds shape \[1\]"
    elif damage == "dtype":
        meta["observation"]["dtype"] = "torch.int32"
        message = r"entry 'observation': .*dtype torch.float32 per row, the storage holds .*dtype torch.int32"
    elif damage == "storage_rows":
        info["storage_rows"] = "20 rows"
        message = r"'storage_rows' must be a non-negative integer, got '20 rows'"
    elif damage == "num_steps":  # more rows than the storage holds: torch's "file ... is smaller than" before
        message = rf"storage has {info['num_steps']} rows, dataset.json says {info['num_steps'] + 5}"
        info["num_steps"] += 5
    else:  # no "episode" anywhere: neither listed nor stored
        meta.pop("episode")
        del info["keys"]["episode"]
        message = "the storage has no 'episode' entry"
    storage_meta.write_text(json.dumps(meta))
    dataset_json.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=message):
        load_dataset(tmp_path / "ds")


def test_collect_sizes_its_buffers_by_the_env_limit_and_grows_them_with_the_episodes(tmp_path):
    # CartPole stops at 500 steps: a bound far above it is neither allocated nor recorded
    with World("CartPole-v1", num_envs=2) as world:
        world.collect(tmp_path / "big", 2, seed=0, max_steps=10**12, progress=False)
    ds = load_dataset(tmp_path / "big")
    assert ds.metadata["max_steps"] == 500 and ds.num_episodes == 2
    # episodes of 300-700 steps: the per-env rows grow past their first 256, every row recorded once
    factory = functools.partial(counting, max_length=700, truncate=True)
    lengths = [expected_length(s, max_length=700) for s in range(3)]
    with World(EnvPool([factory] * 2, seed=0)) as world:
        world.collect(tmp_path / "long", 3, seed=0, max_steps=800, progress=False)
    ds = load_dataset(tmp_path / "long")
    assert sorted(ds.episode_lengths.tolist()) == sorted(lengths) and max(lengths) > 256
    for i in range(ds.num_episodes):
        episode = ds.episode(i)
        assert episode["observation"][:, 0].tolist() == list(range(len(episode)))  # t counts 0, 1, ... in order


class _DottedInfo(gym.Wrapper):
    """CartPole with an info key holding a '.' ("cost.total")."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "cost.total": 0.0}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cost.total": 1.0}


def test_entries_whose_names_hold_a_dot_are_found_on_disk(tmp_path):
    # dataset.json joins a key's parts with "." (info.cost.total); its file is info/cost.total.memmap
    world = World(EnvPool([lambda: _DottedInfo(gym.make("CartPole-v1"))] * 2, seed=0))
    ds = world.collect(tmp_path / "ds", 2, seed=0, max_steps=50, progress=False)
    assert "info.cost.total" in ds.metadata["keys"]
    assert load_dataset(tmp_path / "ds").td["next", "info", "cost.total"].sum() == ds.num_steps
    (tmp_path / "ds" / "storage" / "info" / "cost.total.memmap").unlink()
    with pytest.raises(DatasetError, match=r"entry 'info.cost.total' is missing from the storage"):
        load_dataset(tmp_path / "ds")


class _OwnEpisodeKeys(gym.Env):
    """A Dict observation with entries named like World's own dataset entries."""

    def __init__(self, name):
        self.name = name
        self.observation_space = gym.spaces.Dict({name: gym.spaces.Box(0, 1e6, (1,), np.float32),
                                                  "x": gym.spaces.Box(-1, 1, (1,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {self.name: np.array([500.0], np.float32), "x": np.zeros(1, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {self.name: np.array([500.0 + self.t], np.float32), "x": np.zeros(1, np.float32)}, 0.0, self.t >= 3, \
            False, {}


def test_collect_refuses_an_env_step_count_of_several_values_up_front(tmp_path):
    class TwoCounts(_OwnEpisodeKeys):
        def __init__(self):
            super().__init__("step_count")
            self.observation_space["step_count"] = gym.spaces.Box(0, 1e6, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed)
            return {**obs, "step_count": np.zeros(2, np.float32)}, info

        def step(self, action):
            obs, *rest = super().step(action)
            return {**obs, "step_count": np.array([self.t, 1000 + 7 * self.t], np.float32)}, *rest

    pool = EnvPool([TwoCounts] * 2, seed=0)
    with pytest.raises(ValueError, match="the env has an entry 'step_count', which World writes in every dataset"):
        World(pool, max_episode_steps=5).collect(tmp_path / "d", 2, seed=0, progress=False)
    pool.close()


@pytest.mark.parametrize("name", ["episode", "step_count"])
def test_collect_refuses_env_entries_that_world_would_overwrite(tmp_path, name):
    pool = EnvPool([functools.partial(_OwnEpisodeKeys, name)] * 2, seed=0)
    # "episode" is refused up front; a "step_count" that is not World's count (500 + t) at the first step
    match = ("the env has an entry 'episode', which World writes in every dataset row" if name == "episode" else
             r"the env's own 'step_count' of env 0 reads 501.0 after step 1 of its episode")
    with pytest.raises(ValueError, match=match):
        World(pool, max_episode_steps=5).collect(tmp_path / "d", 2, seed=0, progress=False)
    assert not (tmp_path / "d").exists()
    pool.close()


def test_collect_keeps_a_step_counter_step_count(tmp_path):
    # TorchRL's StepCounter counts the steps World counts: World writes the same values, so it is not a clash,
    # whether the StepCounter is the env's own transform or hidden inside a SerialEnv's envs
    from torchrl.envs import GymEnv, SerialEnv, StepCounter, TransformedEnv

    def inner():
        return TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=20))

    for env in (TransformedEnv(EnvPool("CartPole-v1", num_envs=2, seed=0), StepCounter()), SerialEnv(2, inner)):
        ds = World(env, max_episode_steps=20).collect(tmp_path / "d", 3, seed=0, progress=False, overwrite=True)
        for k in range(3):
            episode = ds.episode(k)
            assert episode["step_count"].view(-1).tolist() == list(range(len(episode)))
            assert episode["next", "step_count"].view(-1).tolist() == list(range(1, len(episode) + 1))
        env.close()


def test_the_dataset_names_a_random_policys_action_space_apart_from_the_batch(tmp_path):
    from torchrl_swm.specs import batch_spec, space_to_spec
    from torchrl_swm.world import RandomPolicy

    with World("CartPole-v1", num_envs=3) as world:
        ds = world.collect(tmp_path / "ds", 1, seed=0, progress=False)
    assert ds.metadata["policy"] == "RandomPolicy(Discrete(2), batch=(3,))"
    for space in (gym.spaces.MultiDiscrete([3, 7]), gym.spaces.MultiBinary(5), gym.spaces.Box(-2, 2, (1,))):
        spec = batch_spec(space_to_spec(space), (2,))
        assert repr(RandomPolicy(spec, batch_dims=1)) == f"RandomPolicy({space}, batch=(2,))"
        assert repr(RandomPolicy(space_to_spec(space))) == f"RandomPolicy({space})"  # a spec with no batch


def test_a_step_counter_that_does_not_end_episodes_is_no_step_limit(tmp_path):
    from torchrl.envs import StepCounter, TransformedEnv

    from torchrl_swm.introspect import step_counter_limit

    for update_done, length in ((True, 5), (False, 8)):
        env = TransformedEnv(counting_pool(2, max_length=50), StepCounter(5, update_done=update_done))
        assert step_counter_limit(env) == (5 if update_done else None)
        with World(env, max_episode_steps=8) as world:
            ds = world.collect(tmp_path / f"ds{update_done}", 2, seed=0, progress=False)
            assert ds.episode_lengths.tolist() == [length, length] and ds.metadata["max_steps"] == length
            assert world.evaluate(2, seed=0, progress=False)["episode_lengths"].tolist() == [length, length]


def _no_truncated_env(lengths=(3, 5), terminates=True):
    """A TorchRL env whose done triplet lacks "truncated": row i ends after lengths[i] steps, terminated (or, with
    ``terminates=False``, done without terminating: TorchRL reads that as a truncation)."""
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class NoTruncated(EnvBase):
        def __init__(self):
            n = len(lengths)
            super().__init__(batch_size=torch.Size([n]))
            self.lengths = torch.tensor(lengths).view(-1, 1)
            self.observation_spec = Composite(observation=Unbounded((n, 1)), shape=(n,))
            self.action_spec = Categorical(2, shape=(n,))
            self.reward_spec = Unbounded((n, 1))
            self.full_done_spec = Composite(done=Categorical(2, (n, 1), dtype=torch.bool),
                                            terminated=Categorical(2, (n, 1), dtype=torch.bool), shape=(n,))
            self.t = torch.zeros(n, 1)

        def _reset(self, td):
            rows = td.get("_reset").view(-1) if td is not None and "_reset" in td.keys() else slice(None)
            self.t[rows] = 0
            flags = torch.zeros(self.batch_size[0], 1, dtype=torch.bool)
            return TensorDict(observation=self.t.clone(), done=flags, terminated=flags.clone(),
                              batch_size=self.batch_size)

        def _step(self, td):
            self.t += 1
            end = self.t >= self.lengths
            return TensorDict(observation=self.t.clone(), reward=torch.ones(self.batch_size[0], 1), done=end.clone(),
                              terminated=end & terminates, batch_size=self.batch_size)

        def _set_seed(self, seed):
            return seed

    return NoTruncated()


def test_a_dataset_holds_the_whole_done_triplet_for_an_env_without_truncated(tmp_path):
    # World's cut is the truncation; the env's done its termination (both on a terminal step at the limit)
    with World(_no_truncated_env()) as world:
        ds = world.collect(tmp_path / "ds", 2, seed=0, max_steps=3, progress=False)
    last = ds.episode_starts + ds.episode_lengths - 1
    assert ds.td["next", "terminated"][last].view(-1).tolist() == [True, False]
    assert ds.td["next", "truncated"][last].view(-1).tolist() == [True, True]
    assert not ds.td["next", "truncated"][ds.episode_starts].any()  # not before the limit
    assert not ds.td["truncated"].any() and not ds.td["terminated"].any()  # the root's flags: False
    # an env whose done is no termination: the dataset's truncated says so, as World's metrics do
    with World(_no_truncated_env((2, 2), terminates=False)) as world:
        ds = world.collect(tmp_path / "truncating", 2, seed=0, max_steps=5, progress=False)
        result = world.evaluate(2, seed=0, max_steps=5, progress=False)
    last = ds.episode_starts + ds.episode_lengths - 1
    assert ds.td["next", "truncated"][last].view(-1).tolist() == result["episode_truncated"].tolist() == [True, True]
    assert not ds.td["next", "terminated"].any() and not result["episode_terminated"].any()


def test_the_dataset_records_numpy_pool_arguments_and_names_the_unrecordable(tmp_path):
    """np.bool_/np.int64 arguments (accepted by the pool) vanished from dataset.json's env_kwargs, and
    arguments with no JSON form were dropped without a trace."""
    kwargs = dict(pixels=np.True_, seed_every_episode=np.False_, image_shape=(np.int64(16), np.int64(16)))
    with World("CartPole-v1", num_envs=2, masked_reset=None, **kwargs) as world:
        world.collect(tmp_path / "ds", 2, seed=0, progress=False)
    meta = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert meta["env_kwargs"] == {"num_envs": 2, "masked_reset": None, "pixels": True, "seed_every_episode": False,
                                  "image_shape": [16, 16]}
    assert meta["env_kwargs_unrecorded"] == {}
    from torchrl_swm.world import _recordable_kwargs

    assert _recordable_kwargs({"fn": len, "n": np.int32(3), "shape": np.array([2, 3])}) == (
        {"n": 3, "shape": [2, 3]}, {"fn": "builtin_function_or_method"})
    # a 0-d array (it crashed collect: iteration over a 0-d array) and a mapping of JSON data are recorded
    assert _recordable_kwargs({"g": np.array(9.81), "camera": {"distance": 4.0, "ids": (1, np.int8(2))},
                               "odd": {1: 2}, "deep": {"f": print}, "goal": -np.inf, "nan": [np.nan]}) == (
        {"g": 9.81, "camera": {"distance": 4.0, "ids": [1, 2]}},
        {"odd": "dict", "deep": "dict", "goal": "float", "nan": "list"})  # JSON has no inf or NaN
    with World("Pendulum-v1", num_envs=2, g=np.array(9.81), max_episode_steps=5) as world:
        world.collect(tmp_path / "pendulum", 2, seed=0, progress=False)
    assert json.loads((tmp_path / "pendulum" / "dataset.json").read_text())["env_kwargs"]["g"] == 9.81


def test_a_collect_interrupted_before_its_first_episode_leaves_the_path_as_it_was(tmp_path):
    # steps were recorded but no episode ended: an earlier dataset is kept (overwrite=True replaces it only with a
    # dataset holding an episode), and a free path stays free
    with World(EnvPool([functools.partial(CountingEnv, length=6)] * 2), max_episode_steps=10) as world:
        world.collect(tmp_path / "ds", 2, seed=0, progress=False)
        calls = []

        def interrupted(td):
            calls.append(1)
            if len(calls) == 4:  # after 3 recorded steps; these episodes end at their 6th
                raise KeyboardInterrupt
            return td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))

        with pytest.raises(KeyboardInterrupt):
            world.collect(tmp_path / "ds", 4, seed=5, policy=interrupted, overwrite=True, progress=False)
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            world.collect(tmp_path / "free", 4, seed=5, policy=interrupted, progress=False)
    kept = load_dataset(tmp_path / "ds")
    assert kept.num_episodes == 2 and kept.metadata["complete"] is True and kept.metadata["seed"] == 0
    assert not (tmp_path / "free").exists()


def test_a_dataset_path_that_is_a_symbolic_link_is_written_where_it_points(tmp_path):
    # overwrite through a link replaces the dataset it points to (the link stays); a dangling link gets its target
    real, link = tmp_path / "real", tmp_path / "link"
    with World(counting_pool(2), max_episode_steps=8) as world:
        world.collect(real, 2, seed=0, progress=False)
        link.symlink_to(real, target_is_directory=True)
        assert world.collect(link, 3, seed=1, overwrite=True, progress=False).num_episodes == 3
        assert link.is_symlink() and load_dataset(real).metadata["seed"] == 1
        dangling = tmp_path / "dangling"
        dangling.symlink_to(tmp_path / "later", target_is_directory=True)
        world.collect(dangling, 2, seed=2, progress=False)
    assert dangling.is_symlink() and load_dataset(tmp_path / "later").num_episodes == 2


def test_a_lazy_writer_interrupted_while_it_opens_leaves_the_replaced_dataset_and_warns_of_stale_ones(
        tmp_path, monkeypatch):
    # review R7 B5/B4/B6: a Ctrl-C between setting the old dataset aside and creating the new one left an empty
    # directory; a killed run's aside copy was never mentioned again; "." had no name to set a dataset aside by
    import shutil
    import signal

    path = tmp_path / "d"
    World(counting_pool(2), max_episode_steps=8).collect(path, 2, seed=0, progress=False)
    writer = DatasetWriter(path, capacity=20, overwrite=True, lazy=True)
    new_storage = DatasetWriter._new_storage

    def interrupted(self):
        os.kill(os.getpid(), signal.SIGINT)  # held until the new dataset exists: nothing half-done
        new_storage(self)

    monkeypatch.setattr(DatasetWriter, "_new_storage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.open()
    monkeypatch.undo()
    assert writer.opened  # opened in full before the interrupt came
    writer.close(complete=False)  # before any episode: the path as it was
    assert load_dataset(path).num_episodes == 2 and [p.name for p in tmp_path.iterdir()] == ["d"]
    # a failure (not an interrupt) while opening puts the old dataset back at once
    writer = DatasetWriter(path, capacity=20, overwrite=True, lazy=True)
    monkeypatch.setattr(DatasetWriter, "_new_storage", lambda self: (_ for _ in ()).throw(OSError("no space")))
    with pytest.raises(OSError, match="no space"):
        writer.open()
    monkeypatch.undo()
    assert load_dataset(path).num_episodes == 2 and [p.name for p in tmp_path.iterdir()] == ["d"]
    # a dataset set aside by a killed run is named at the next open
    (tmp_path / ".d.replaced-1-2").mkdir()
    with pytest.warns(UserWarning, match=r"\.d\.replaced-1-2'\] hold datasets an overwrite of .* set aside.*rename one "
                                         r"back to recover it"):
        DatasetWriter(path, capacity=20, overwrite=True, lazy=True).open()
    # "." (the working directory, here the dataset) is a path like any other
    shutil.rmtree(tmp_path / ".d.replaced-1-2")
    monkeypatch.chdir(path)
    writer = DatasetWriter(".", capacity=20, lazy=True, overwrite=True)
    assert writer.path == path
    writer.close(complete=False)


# -- one writer per path ---------------------------------------------------------------------------------------
def _episode(episode_id, length=3):
    return TensorDict({"episode": torch.full((length,), episode_id, dtype=torch.int64),
                       "x": torch.full((length,), float(episode_id))}, [length])


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_writer_of_a_path_being_written_is_refused_and_the_first_keeps_its_data(tmp_path, overwrite):
    # nothing locked the path: an overwrite set the live dataset aside and removed it at its first commit (the
    # first run then wrote into the second's directory, both "succeeded", the data was corrupt); two first
    # episodes ending together deleted each other's files (review R4 B1, B2)
    path = tmp_path / "d"
    first = DatasetWriter(path, capacity=20, commit_every=0)
    first.add(_episode(0))
    being_written = rf"'{re.escape(str(path))}' is being written by another DatasetWriter \(pid {os.getpid()}"
    with pytest.raises(FileExistsError, match=being_written):
        DatasetWriter(path, capacity=20, overwrite=overwrite)
    # two lazy writers made while the path was free: the second to open is refused, and deletes nothing
    other = tmp_path / "e"
    lazy = [DatasetWriter(other, capacity=20, overwrite=overwrite, lazy=True, commit_every=0) for _ in range(2)]
    lazy[0].add(_episode(1))
    with pytest.raises(FileExistsError, match="is being written by another DatasetWriter"):
        lazy[1].add(_episode(2))
    lazy[1].close(complete=False)
    lazy[0].add(_episode(3))
    lazy[0].close(complete=True)
    assert load_dataset(other).td["episode"].tolist() == [1] * 3 + [3] * 3
    first.add(_episode(4))
    first.close(complete=True)
    assert load_dataset(path).td["episode"].tolist() == [0] * 3 + [4] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "e"]  # the locks go with their writers
    # closed, the path is free again
    DatasetWriter(path, capacity=20, overwrite=True).close(complete=True)


def test_a_writer_in_another_process_holds_its_path_until_it_ends_even_killed(tmp_path):
    import signal
    import subprocess
    import sys

    path = tmp_path / "d"
    script = (
        "import sys, torch\nfrom tensordict import TensorDict\nfrom torchrl_swm.data import DatasetWriter\n"
        f"w = DatasetWriter({str(path)!r}, capacity=20, commit_every=0)\n"
        "w.add(TensorDict({'episode': torch.zeros(3, dtype=torch.int64), 'x': torch.ones(3)}, [3]))\n"
        "print('ready', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(FileExistsError, match=rf"being written by another DatasetWriter \(pid {child.pid},"):
            World(counting_pool(2), max_episode_steps=8).collect(path, 2, seed=0, overwrite=True, progress=False)
        assert load_dataset(path).num_episodes == 1  # the child's, untouched
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # killed: the kernel released its lock; its lock file, left behind, is taken over by the next open, and a
    # writer's check at construction leaves it as it is
    lock_file = tmp_path / ".d.lock"
    assert lock_file.read_text().strip() == str(child.pid)
    DatasetWriter(path, capacity=20, overwrite=True, lazy=True).close(complete=False)
    assert lock_file.read_text().strip() == str(child.pid)
    ds = World(counting_pool(2), max_episode_steps=8).collect(path, 2, seed=0, overwrite=True, progress=False)
    assert ds.num_episodes == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_writer_never_closed_releases_its_path_when_collected(tmp_path):
    import gc

    writer = DatasetWriter(tmp_path / "d", capacity=20, commit_every=0)
    writer.add(_episode(0))
    del writer
    gc.collect()
    assert not (tmp_path / ".d.lock").exists()
    DatasetWriter(tmp_path / "d", capacity=20, overwrite=True).close(complete=True)


def test_a_swap_that_fails_midway_is_finished_and_the_compacted_dataset_loads(tmp_path, monkeypatch):
    # an OSError between two entries' os.replace left some entries compacted, some not: the close finishes the
    # swap it had begun (review R4 M12: without that the dataset no longer loads, "cut short")
    import torchrl_swm.data as data_module

    path = tmp_path / "d"
    writer = DatasetWriter(path, capacity=20, commit_every=0)
    for k in (1, 0):
        writer.add(_episode(k))
    real_replace, calls = os.replace, []

    def failing_once(src, dst):
        calls.append(src)
        if len(calls) == 3:  # inside the swap, after the first entry moved
            raise OSError("disk hiccup")
        return real_replace(src, dst)

    monkeypatch.setattr(data_module.os, "replace", failing_once)
    with pytest.raises(OSError, match="disk hiccup"):
        writer.close(complete=True)
    monkeypatch.undo()
    ds = load_dataset(path)
    assert ds.td["episode"].tolist() == [0] * 3 + [1] * 3  # compacted: in id order, at its exact size
    assert ds.metadata.get("compacted") is True and "compaction_failed" not in ds.metadata
    assert sorted(p.name for p in path.iterdir() if p.name.startswith(".")) == []  # no .compact / .old left


def test_a_damaged_dataset_json_without_a_complete_key_is_not_taken_for_one_being_written(tmp_path):
    # only "complete": false (a collect in progress) is read again and worded so (review R4 M16)
    World(counting_pool(2)).collect(tmp_path / "ds", 3, seed=0, max_steps=10, progress=False)
    dataset_json = tmp_path / "ds" / "dataset.json"
    info = json.loads(dataset_json.read_text())
    del info["complete"]
    info["num_steps"] += 5
    dataset_json.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"dataset.json says") as error:
        load_dataset(tmp_path / "ds")
    assert "still being written" not in str(error.value)


def test_a_writer_releases_its_lock_and_its_descriptor_even_when_closing_fails(tmp_path, monkeypatch):
    # a close whose metadata write raised kept the path's lock while the writer lived: a retry in the same session
    # was refused as "being written by another DatasetWriter" (its own pid); and every writer's lock descriptor
    # must be closed, one per collect otherwise (review C L2, L4)
    path = tmp_path / "d"
    DatasetWriter(path, capacity=10, overwrite=True).close(complete=True)  # the first opens torch's own (shm, pipe)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        writer = DatasetWriter(path, capacity=10, overwrite=True, commit_every=0)
        writer.add(_episode(0))
        writer.close(complete=True)
    assert len(os.listdir("/proc/self/fd")) == fds
    writer = DatasetWriter(path, capacity=10, overwrite=True, commit_every=0)
    writer.add(_episode(1))

    def failing_write(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_write_metadata", failing_write)
    with pytest.raises(OSError, match="disk full"):
        writer.close(complete=True)
    assert not (tmp_path / ".d.lock").exists()
    DatasetWriter(path, capacity=10, overwrite=True).close(complete=True)  # the path is free again
    assert len(os.listdir("/proc/self/fd")) == fds
