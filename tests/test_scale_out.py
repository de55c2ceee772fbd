"""EnvPool under TorchRL's multi-process and Ray collectors: same data as one process, faults end cleanly."""

import functools
import os
import shutil
import tempfile
import time

import pytest
import torch
from envs import FailingEnv, counting
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

from torchrl_swm import EnvPool, raise_on_worker_failure

TESTS = os.path.dirname(os.path.abspath(__file__))
N, T = 3, 20  # envs per pool, steps per batch


@pytest.fixture(autouse=True)
def _workers_temp_dir(monkeypatch):
    """A temp dir of its own for each test's spawned workers, removed after it. A TorchRL collector worker that sends
    shared tensors starts multiprocessing's resource sharer (a socket in a ``pymp-*`` dir of its temp dir); TorchRL
    terminates the survivors when another worker fails, which skips the finalizer that removes that dir. (Short:
    an AF_UNIX socket path must fit in 107 bytes.)"""
    path = tempfile.mkdtemp(prefix="swm-")
    monkeypatch.setenv("TMPDIR", path)
    yield
    shutil.rmtree(path, ignore_errors=True)


class CountPolicy:
    """Deterministic: the action is (t + episode) mod 3, read from the counting observation.

    A plain callable rather than an ``nn.Module``: torchrl 0.14.1's multi-process
    collectors give module policies a shared-memory weight-sync scheme whose
    ``__del__`` can deadlock the interpreter at garbage collection.
    """

    def __call__(self, td):
        obs = td["observation"]
        return td.set("action", (obs[..., 0] + obs[..., 1]).long() % 3)


def policy():
    return CountPolicy()


def make_pool(seed):
    return EnvPool([functools.partial(counting, max_length=7)] * N, seed=seed)


def single_run(seed, batches):
    """The reference: a single-process Collector over the same pool."""
    collector = Collector(make_pool(seed), policy(), frames_per_batch=N * T, total_frames=N * T * batches)
    out = [batch.clone() for batch in collector]
    collector.shutdown()
    return out


DATA_KEYS = [("observation",), ("action",), ("episode_seed",), ("next", "observation"), ("next", "reward"),
             ("next", "done"), ("next", "terminated"), ("next", "truncated"), ("next", "info", "t")]


def assert_same_transitions(a, b):
    for key in DATA_KEYS:
        assert torch.equal(a[key], b[key]), key


def assert_traj_ids_follow_episodes(batch):
    traj = batch["collector", "traj_ids"]
    done = batch["next", "done"][..., 0]
    t = batch["observation"][..., 0]
    assert (traj[..., 1:][done[..., :-1]] != traj[..., :-1][done[..., :-1]]).all()
    assert (traj[..., 1:][~done[..., :-1]] == traj[..., :-1][~done[..., :-1]]).all()
    assert (t[..., 1:][done[..., :-1]] == 0).all()  # every new trajectory starts at a reset frame


def test_multisync_spawn_equals_single_process_per_worker():
    seeds = [0, 1000]
    collector = MultiSyncCollector([EnvPool.factory([functools.partial(counting, max_length=7)] * N, seed=s)
                                    for s in seeds], policy(), frames_per_batch=2 * N * T, total_frames=2 * N * T * 3,
                                   cat_results="stack")
    batches = [b.clone() for b in collector]
    collector.shutdown()
    assert len(batches) == 3 and batches[0].batch_size == (2, N, T)
    for w, seed in enumerate(seeds):
        reference = single_run(seed, 3)
        for got, want in zip(batches, reference):
            assert_same_transitions(got[w], want)
    for batch in batches:
        assert_traj_ids_follow_episodes(batch)
        # trajectory ids are unique across workers
        assert not set(batch["collector", "traj_ids"][0].unique().tolist()) & set(batch["collector", "traj_ids"][1].unique().tolist())


def test_create_env_kwargs_reach_one_factory_as_the_workers_own_arguments():
    # TorchRL's idiom for per-worker settings: one factory, create_env_kwargs=[...] (env_fun(**kwargs) in the worker)
    make = EnvPool.factory([functools.partial(counting, max_length=7)] * N, seed=5)
    with make(seed=1000) as pool:  # called with keyword arguments: they replace the factory's
        assert pool.reset()["episode_seed"].view(-1).tolist() == list(range(1000, 1000 + N))
    with make() as pool:
        assert pool.reset()["episode_seed"].view(-1).tolist() == list(range(5, 5 + N))
    by_position = EnvPool.factory("CartPole-v1", 2, seed=0)  # the README's form: the id and num_envs by position
    with by_position(num_envs=3, env_fns="Acrobot-v1", max_episode_steps=7) as pool:
        assert pool.num_envs == 3 and pool.single_action_space.n == 3  # Acrobot's 3 actions
        assert [spec.max_episode_steps for spec in pool.get_attr("spec")] == [7] * 3  # a gym.make keyword
    import gymnasium as gym

    gym.register("OnlyHereForTheFactory-v0", entry_point="envs:CountingEnv", kwargs={"length": 4})
    try:
        only_here = EnvPool.factory("OnlyHereForTheFactory-v0", num_envs=2, seed=0)
    finally:
        gym.registry.pop("OnlyHereForTheFactory-v0")  # as in a worker: the factory carries the resolved spec
    with only_here(seed=3) as pool:
        assert pool.reset()["episode_seed"].view(-1).tolist() == [3, 4]
    seeds = [0, 1000]
    collector = MultiSyncCollector([make] * 2, policy(), frames_per_batch=2 * N * T, total_frames=2 * N * T * 2,
                                   cat_results="stack", create_env_kwargs=[{"seed": s} for s in seeds])
    batches = [b.clone() for b in collector]
    collector.shutdown()
    for w, seed in enumerate(seeds):
        for got, want in zip(batches, single_run(seed, 2)):
            assert_same_transitions(got[w], want)


def test_multiasync_spawn_equals_single_process_per_worker():
    seeds = [0, 1000]
    collector = MultiAsyncCollector([EnvPool.factory([functools.partial(counting, max_length=7)] * N, seed=s)
                                     for s in seeds], policy(), frames_per_batch=N * T, total_frames=N * T * 6)
    batches = [b.clone() for b in collector]
    collector.shutdown()
    by_worker = {0: [], 1000: []}
    for batch in batches:
        base = int(batch["episode_seed"].min()) // 1000 * 1000  # pool seeds 0.. vs 1000..
        by_worker[base].append(batch)
        assert_traj_ids_follow_episodes(batch)
    for seed, got in by_worker.items():
        for g, want in zip(got, single_run(seed, len(got))):
            assert_same_transitions(g, want)
    assert sum(len(v) for v in by_worker.values()) == 6


def _bad_pool():
    """N envs like make_pool's, the last of which raises at its 30th step."""
    return EnvPool([functools.partial(counting, max_length=7)] * (N - 1) + [functools.partial(FailingEnv, fail_at=30)],
                   seed=0)


def test_multisync_worker_whose_env_raises_ends_with_an_error_naming_the_worker():
    good = make_pool_factory(0)
    collector = MultiSyncCollector([good, _bad_pool], None, frames_per_batch=40, total_frames=4000)
    pids = [proc.pid for proc in collector.procs]
    start = time.monotonic()
    # TorchRL names the worker, unless its close of the others races one still exiting (a loaded host): then its
    # ValueError names none (README, Limitations; raise_on_worker_failure names it, tested below)
    with pytest.raises((RuntimeError, ValueError)) as err:
        for _ in collector:
            pass
    if isinstance(err.value, ValueError):
        assert "Cannot close a process while it is still running" in str(err.value)
    else:
        assert "worker 1" in str(err.value)
    collector.shutdown()
    assert time.monotonic() - start < 120
    for pid in pids:  # every worker was reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _pool_failing_at(step):
    return EnvPool([functools.partial(counting, max_length=7)] * (N - 1) + [functools.partial(FailingEnv, fail_at=step)],
                   seed=0)


def test_env_error_while_a_collector_worker_starts_reaches_the_main_process_as_env_error():
    # The worker's first rollout step runs while the collector is built; TorchRL re-raises
    # the worker's exception class from its message, and EnvError must survive that.
    from torchrl_swm import EnvError

    with pytest.raises(EnvError, match=rf"env {N - 1} \(step\): ValueError: boom at step 1") as info:
        MultiAsyncCollector([make_pool_factory(0), functools.partial(_pool_failing_at, 1)], None,
                            frames_per_batch=N * T, total_frames=N * T * 4)
    assert (info.value.env_index, info.value.phase) == (N - 1, "step")  # read back from the text (were None)


def test_multiasync_failure_after_the_others_finish_is_raised_by_raise_on_worker_failure():
    # Worker 1 raises at its second step; worker 0 alone can reach total_frames. TorchRL's
    # MultiAsyncCollector then may end normally; raise_on_worker_failure must not.
    collector = MultiAsyncCollector([make_pool_factory(0), functools.partial(_pool_failing_at, 2)], None,
                                    frames_per_batch=N * T, total_frames=N * T * 4)
    pids = [proc.pid for proc in collector.procs]
    batches = []
    with pytest.raises(RuntimeError, match="worker 1"):
        for batch in raise_on_worker_failure(collector):
            batches.append(batch.clone())
    for batch in batches:  # whatever arrived came from the healthy worker, intact
        assert batch.batch_size == (N, T)
        assert_traj_ids_follow_episodes(batch)
    for pid in pids:  # shut down and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _pool_quitting_at(step, after_file=None):
    from envs import QuittingEnv

    return EnvPool([functools.partial(counting, max_length=7)] * (N - 1)
                   + [functools.partial(QuittingEnv, step, after_file=after_file)], seed=0)


def test_a_worker_exiting_with_code_0_mid_collection_is_a_failure():
    # os._exit(0) in an env leaves no traceback anywhere: the collection must still fail
    # total_frames is far more than the healthy worker alone collects before the other's start-up (spawn, imports)
    # and quit, even on a loaded machine: the collection cannot end healthy first
    # The message names worker 1, unless TorchRL found it dead first and its close of the healthy worker raced that
    # worker's exit (a loaded machine): its code 0 then reads as a shutdown's, and the message says it cannot tell
    collector = MultiAsyncCollector([make_pool_factory(0), functools.partial(_pool_quitting_at, 2)], None,
                                    frames_per_batch=N * T, total_frames=N * T * 10_000)
    with pytest.raises(RuntimeError, match=r"worker 1 \(exit code 0|whose exit codes cannot tell which one died"):
        for _ in raise_on_worker_failure(collector):
            pass
    # when it exits after the last batch TorchRL checked and before the shutdown, the collection ends as if
    # healthy and every worker then reads 0: the final check counts a worker gone before the shutdown as failed
    import multiprocessing

    from torchrl_swm.collectors import _raise_if_any_failed

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=time.sleep, args=(0,)), ctx.Process(target=time.sleep, args=(30,))]
    for proc in procs:
        proc.start()
    procs[0].join(30)
    try:
        running = {1}  # as raise_on_worker_failure records them before the shutdown
        with pytest.raises(RuntimeError, match=r"collector worker 0 \(exit code 0 while the collection was still "
                                               r"running"):
            _raise_if_any_failed(procs, when="before the collection ended", running=running,
                                 clean_exit_fails={0})
        _raise_if_any_failed(procs, when="before the collection ended", running=running)  # code 0 alone: fine
    finally:
        procs[1].terminate()
        procs[1].join(10)


def test_a_worker_exiting_with_code_0_after_the_last_batch_and_before_the_shutdown_is_a_failure(tmp_path):
    # the collection reaches total_frames and TorchRL ends it as healthy, but the worker had exited (code 0, an env's
    # os._exit(0)) before raise_on_worker_failure shut it down: its final check names it. One worker, batches of
    # 100 steps, an env quitting at its step 250 once the loop body has the last batch: TorchRL asks for a third
    # batch as it yields the second (the last), and the worker quits half-way through that one
    steps, go = 100, tmp_path / "quit-now"
    collector = MultiAsyncCollector([functools.partial(_pool_quitting_at, 2 * steps + steps // 2, str(go))], None,
                                    frames_per_batch=N * steps, total_frames=2 * N * steps)
    proc = collector.procs[0]
    batches = 0
    with pytest.raises(RuntimeError, match=r"collector worker 0 \(exit code 0 while the collection was still running"
                                           r".*\) failed before the collection ended"):
        for _ in raise_on_worker_failure(collector):
            batches += 1
            if batches == 2:  # the last batch, checked healthy: now the worker quits, within the next batch
                go.touch()
                proc.join(30)
                assert proc.exitcode == 0
    assert batches == 2


def test_raise_on_worker_failure_passes_healthy_collections_through_and_shuts_down():
    collector = MultiAsyncCollector([make_pool_factory(0), make_pool_factory(1000)], policy(),
                                    frames_per_batch=N * T, total_frames=N * T * 4)
    pids = [proc.pid for proc in collector.procs]
    batches = [batch.clone() for batch in raise_on_worker_failure(collector)]
    assert len(batches) == 4 and all(b.numel() == N * T for b in batches)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    single = Collector(make_pool(0), policy(), frames_per_batch=N * T, total_frames=N * T * 2)
    assert [b.numel() for b in raise_on_worker_failure(single)] == [N * T, N * T]


class _PostprocFailingAt:
    """A collector postproc (it runs in the main process) raising ValueError at its ``at``-th batch."""

    def __init__(self, at):
        self.at, self.calls = at, 0

    def __call__(self, td):
        self.calls += 1
        if self.calls == self.at:
            raise ValueError("postproc: bad batch")
        return td


def test_a_value_error_of_the_callers_own_during_a_multi_process_collection_reaches_it_unchanged():
    # only TorchRL's "Cannot close a process while it is still running" is read as a worker failure: any other
    # ValueError (here the postproc's) is the caller's own, raised as itself; the workers are still shut down
    collector = MultiSyncCollector([make_pool_factory(0), make_pool_factory(1000)], None, frames_per_batch=2 * N * T,
                                   total_frames=2 * N * T * 100, postproc=_PostprocFailingAt(2))
    pids = [proc.pid for proc in collector.procs]
    with pytest.raises(ValueError, match="^postproc: bad batch$"):
        for _ in raise_on_worker_failure(collector):
            pass
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("leave", ["break", "exception"])
def test_leaving_raise_on_worker_failure_early_shuts_a_single_process_collector_down(leave):
    # a Collector has no worker process, but it is shut down all the same when the loop is left early
    # (its pool closed), as it is when the collection ends
    pool = make_pool(0)
    collector = Collector(pool, None, frames_per_batch=N * T, total_frames=N * T * 20)
    if leave == "break":
        for _ in raise_on_worker_failure(collector):
            break
    else:
        with pytest.raises(KeyError):
            for _ in raise_on_worker_failure(collector):
                raise KeyError("the loop body's")
    assert pool.is_closed


def test_a_worker_killed_by_a_signal_before_the_shutdown_is_not_described_as_terminated_by_the_shutdown():
    # the worker is SIGKILLed (an OOM kill) while the loop body has the last batch: TorchRL ends the collection as
    # healthy and the final check names it, by its exit code alone; only a worker still running when the shutdown
    # began may have been terminated by it (and is told to pass shutdown_timeout=)
    import signal

    collector = MultiAsyncCollector([make_pool_factory(0)], None, frames_per_batch=N * T, total_frames=2 * N * T)
    proc = collector.procs[0]
    batches = 0
    with pytest.raises(RuntimeError, match=r"^collector worker 0 \(exit code -9\) failed before the collection "
                                           r"ended") as caught:
        for _ in raise_on_worker_failure(collector, shutdown_timeout=10):
            batches += 1
            if batches == 2:  # the last batch, checked healthy
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(30)
                assert proc.exitcode == -signal.SIGKILL
    assert batches == 2
    assert "shutdown" not in str(caught.value)


def test_raise_on_worker_failure_waits_for_slow_closes_and_reports_what_the_shutdown_terminated():
    # TorchRL's shutdown() terminates a worker still closing its envs after 8 of its 10 s: raise_on_worker_failure
    # gives them shutdown_timeout (60 s) so that a healthy collection whose envs close slowly is not a failed one,
    # and says so when it had to terminate them (a worker whose env raised while closing looks the same)
    from envs import SlowCloseEnv

    def collector(close_s, fail_worker=None):
        make = [EnvPool.factory([functools.partial(SlowCloseEnv, close_s, 3 if w == fail_worker else None)] * 2,
                                seed=w * 2**32) for w in range(2)]
        return MultiAsyncCollector(make, None, frames_per_batch=20, total_frames=40)

    healthy = collector(12.0)
    assert sum(batch.numel() for batch in raise_on_worker_failure(healthy)) == 40
    assert [proc.exitcode for proc in healthy.procs] == [0, 0]
    # TorchRL's shutdown(timeout=3) terminates after 80 % of it: 2.4 s, said as "2 s" (3 s would be wrong)
    with pytest.raises(RuntimeError, match=r"terminated by the shutdown after 2 s; if its envs only close slowly, "
                                           r"pass shutdown_timeout="):
        for _ in raise_on_worker_failure(collector(12.0), shutdown_timeout=3.0):
            pass
    with pytest.raises(RuntimeError, match=r"worker 1 \(exit code 1\)"):  # its env raised, then closed slowly
        for _ in raise_on_worker_failure(collector(3.0, fail_worker=1)):
            pass


def test_a_plain_shutdown_of_collector_workers_over_process_pools_lets_them_exit_normally():
    # each collector worker closes a process-backend pool, whose workers exit after their envs close: that took
    # up to 8 s on a busy host (the interpreter's last collection over torch, torchrl and Ray, which a spawned
    # worker imports again with the main module), and TorchRL's shutdown() terminated the collector workers
    make = [EnvPool.factory([functools.partial(counting, max_length=7)] * 4, seed=w * 2**32, backend="process",
                            num_workers=2) for w in range(2)]
    collector = MultiSyncCollector(make, None, frames_per_batch=40, total_frames=80)
    assert sum(batch.numel() for batch in collector) == 80
    collector.shutdown()
    assert [proc.exitcode for proc in collector.procs] == [0, 0]


def test_a_process_pool_worker_freezes_what_it_imported_and_collects_its_envs_as_usual():
    # what a spawned worker imported before its envs (the main module again) is frozen: never traversed by the
    # collector again, nor at exit; the envs are not, so their garbage is collected as in any process
    from envs import GcStateEnv

    pool = EnvPool([GcStateEnv] * 2, backend="process", num_workers=2)
    assert pool.call("gc_state") == [(True, True), (True, True)]
    pool.close()


@pytest.mark.parametrize("slow", [(True, True), (False, True, False), (False, False, True)],
                         ids=["two-slow", "three-one-slow", "three-last-slow"])
def test_a_killed_worker_is_reported_as_failed_when_torchrl_races_a_worker_slow_to_exit(slow):
    # TorchRL's fault check terminates the surviving workers and closes each 0.1 s later; a worker still exiting
    # then (here: its env handles SIGTERM for 1.5 s) made it raise "ValueError: Cannot close a process while it
    # is still running" instead of naming the dead worker. Its shutdown then stops the workers after the slow
    # one, which exit with 0: healthy, not named. A worker TorchRL terminated and closed before it reached the
    # slow one (three-last-slow: worker 1) has no exit code left to read: not named either.
    import signal

    from envs import SlowToTerminateEnv

    make = [EnvPool.factory([SlowToTerminateEnv if s else functools.partial(counting, max_length=7)] * 2,
                            seed=w * 2**32) for w, s in enumerate(slow)]
    collector = MultiSyncCollector(make, None, frames_per_batch=20 * len(slow), total_frames=20 * 10_000)
    pids = [proc.pid for proc in collector.procs]
    with pytest.raises(RuntimeError, match=r"collector worker 0 \(exit code -9\) failed during collection; TorchRL "
                                           r"then terminated the other workers\. ") as caught:
        for i, _ in enumerate(raise_on_worker_failure(collector, shutdown_timeout=10)):
            if i == 1:
                os.kill(pids[0], signal.SIGKILL)
    assert "Cannot close a process while it is still running" in str(caught.value.__cause__)
    deadline = time.monotonic() + 30
    for pid in pids:  # every worker was reaped
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"collector worker {pid} outlived the collection")


def test_non_picklable_factory_gets_a_clear_error():
    import threading

    lock = threading.Lock()

    def env_fn():
        with lock:
            return counting()

    with pytest.raises(TypeError, match="cannot be pickled.*module-level functions or functools.partial"):
        EnvPool.factory([env_fn] * 2)


def test_a_factory_of_an_id_registered_only_here_builds_in_spawned_workers():
    # a spawned worker's gymnasium registry lacks the ids registered at run time in this process (under
    # `if __name__ == "__main__":`, in a notebook): the factory carries the resolved spec, as the pool's own
    # process backend does
    import gymnasium as gym

    gym.register("TestOnlyInTheMainProcess-v0", entry_point="envs:CountingEnv", kwargs={"length": 4})
    try:
        make = [EnvPool.factory("TestOnlyInTheMainProcess-v0", num_envs=2, seed=w * 100) for w in range(2)]
        assert "TestOnlyInTheMainProcess-v0" in repr(make[0])  # the id the caller gave
        collector = MultiSyncCollector(make, None, frames_per_batch=16, total_frames=32)
        batches = [batch for batch in collector]
        collector.shutdown()
    finally:
        gym.registry.pop("TestOnlyInTheMainProcess-v0")
    assert sum(b.numel() for b in batches) == 32
    # CountingEnv(length=4): every episode's step counter runs 0, 1, 2, 3 in every worker
    t = batches[0]["observation"][..., 0]
    assert set(t.unique().tolist()) <= {0.0, 1.0, 2.0, 3.0} and batches[0]["next", "done"].any()


def _rollout_shape(factory):
    with factory() as pool:
        return tuple(pool.rollout(3, break_when_any_done=False).shape)


def test_a_factory_of_lambdas_pickles_with_the_standard_pickle_too():
    import multiprocessing
    import pickle

    factory = EnvPool.factory([lambda: counting(max_length=5)] * 2, seed=0)  # noqa: E731 (a closure, on purpose)
    assert _rollout_shape(pickle.loads(pickle.dumps(factory))) == (2, 3)
    with multiprocessing.get_context("spawn").Pool(1) as workers:  # arguments pickled by the standard pickle
        assert workers.apply(_rollout_shape, (factory,)) == (2, 3)


# -- Ray: a local cluster started (and shut down) by the test ---------------------------------
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchrl-swm[ray]'")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": TESTS}})
    yield
    ray.shutdown()


RAY_RESOURCES = {"num_cpus": 1, "num_gpus": 0, "memory": 512 * 1024**2}


def test_ray_collector_matches_single_process(ray_cluster):
    from torchrl.collectors.distributed import RayCollector

    seeds = [0, 1000]
    collector = RayCollector([EnvPool.factory([functools.partial(counting, max_length=7)] * N, seed=s) for s in seeds],
                             policy(), frames_per_batch=2 * N * T, total_frames=2 * N * T * 3, sync=True,
                             remote_configs=RAY_RESOURCES)
    batches = [b.clone() for b in collector]
    collector.shutdown()
    assert sum(b.numel() for b in batches) == 2 * N * T * 3
    for batch in batches:
        assert batch.batch_size[:2] == (2, N)
        for w in range(2):
            assert_traj_ids_follow_episodes(batch[w])
    for w, seed in enumerate(seeds):
        # each actor's stream of frames, end to end, is the single-process stream: nothing dropped or repeated
        got = torch.cat([b[w] for b in batches], dim=-1)
        want = torch.cat(single_run(seed, 3), dim=-1)
        assert_same_transitions(got, want)
    # the README's fix for TorchRL numbering each actor's trajectories from 0: ids unique across workers, each
    # trajectory one episode (one id, one episode_seed) across batches too
    ids = torch.cat([b["collector", "traj_ids"] * 2 + torch.arange(2).view(2, 1, 1) for b in batches], dim=-1)
    episode_seed = torch.cat([b["episode_seed"][..., 0] for b in batches], dim=-1)
    assert not set(ids[0].unique().tolist()) & set(ids[1].unique().tolist())
    for i in ids.unique():
        assert episode_seed[ids == i].unique().numel() == 1
    assert_traj_ids_follow_episodes(torch.cat(batches, dim=-1).set(("collector", "traj_ids"), ids))


def test_collector_backend_ray_runs_envpool(ray_cluster):
    collector = Collector([make_pool_factory(0)], policy(), frames_per_batch=N * T, total_frames=N * T * 2,
                          backend="ray", backend_options={"remote_configs": RAY_RESOURCES})
    batches = [b.clone() for b in collector]
    collector.shutdown()
    got = torch.cat(batches, dim=-1)
    assert_same_transitions(got, torch.cat(single_run(0, 2), dim=-1))


def make_pool_factory(seed):
    return EnvPool.factory([functools.partial(counting, max_length=7)] * N, seed=seed)


def test_ray_actor_whose_env_raises_ends_the_collection(ray_cluster):
    from ray.exceptions import RayActorError
    from torchrl.collectors.distributed import RayCollector

    collector = RayCollector([make_pool_factory(0), _bad_pool], None, frames_per_batch=20, total_frames=4000,
                             sync=True, remote_configs=RAY_RESOURCES)
    start = time.monotonic()
    with pytest.raises(RayActorError):
        for _ in collector:
            pass
    collector.shutdown()
    assert time.monotonic() - start < 120


def test_killed_ray_actor_ends_the_collection(ray_cluster):
    from ray.exceptions import RayActorError
    from torchrl.collectors.distributed import RayCollector

    collector = RayCollector([make_pool_factory(0), make_pool_factory(1000)], None, frames_per_batch=20,
                             total_frames=100_000, sync=False, remote_configs=RAY_RESOURCES)
    start = time.monotonic()
    with pytest.raises(RayActorError):
        for i, _ in enumerate(collector):
            if i == 2:
                ray.kill(collector.remote_collectors[1])
    collector.shutdown()
    assert time.monotonic() - start < 120
    assert not _alive_ray_actors()


def _alive_ray_actors():
    """The actors the GCS has alive, with their class names (Ray's state API needs the dashboard, not started here)."""
    from ray._private import state

    return [a.get("ActorClassName") for a in state.actors().values() if a["State"] == "ALIVE"]


def test_the_alive_actor_check_sees_an_actor_left_alive(ray_cluster):
    # test_killed_ray_actor_ends_the_collection's orphan check must be able to fail
    @ray.remote(num_cpus=0)
    class Idle:
        def ping(self):
            return 1

    actor = Idle.remote()
    ray.get(actor.ping.remote())
    try:
        assert any("Idle" in str(name) for name in _alive_ray_actors())
    finally:
        ray.kill(actor)


# -- WorldModelEnv under collectors ------------------------------------------------------------------
class HalfPolicy:
    """Deterministic action in [-1, 1] from the counting world model's observation."""

    def __call__(self, td):
        obs = td["observation"]
        return td.set("action", torch.tanh(obs[..., :1] - 2.0))


def wm_factory(length):
    import wm_models

    return functools.partial(wm_models.counting_env, num_envs=N, length=length)


def test_world_model_env_in_a_collector_with_policy_on_the_model_device(device):
    import wm_models
    from tensordict.nn import TensorDictModule

    env = wm_models.counting_env(num_envs=N, length=4, device=device)
    policy = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"]).to(device)
    collector = Collector(env, policy, frames_per_batch=N * T, total_frames=N * T * 2, device=device)
    for batch in collector:
        assert batch["next", "observation"].device.type == device.type
        t, t_next = batch["observation"][..., 0], batch["next", "observation"][..., 0]
        assert torch.equal(t_next, t + 1)
        done = batch["next", "done"][..., 0]
        assert (t_next[done] == 4).all() and (batch["observation"][..., 1:, 0][done[..., :-1]] == 0).all()
        assert_traj_ids_follow_episodes(batch)
    collector.shutdown()
    assert env.model.batch_sizes and set(env.model.batch_sizes) == {N}  # one model call per step, whole batch


def test_world_model_env_under_multisync_cpu_workers_matches_single_process():
    make = wm_factory(5)
    collector = MultiSyncCollector([make, make], HalfPolicy(), frames_per_batch=2 * N * T, total_frames=2 * N * T * 2,
                                   cat_results="stack")
    batches = [b.clone() for b in collector]
    collector.shutdown()
    single = Collector(make(), HalfPolicy(), frames_per_batch=N * T, total_frames=N * T * 2)
    reference = [b.clone() for b in single]
    single.shutdown()
    keys = [("observation",), ("action",), ("next", "observation"), ("next", "reward"), ("next", "done")]
    for got, want in zip(batches, reference):
        for w in range(2):
            for key in keys:
                assert torch.equal(got[w][key], want[key]), key
            assert_traj_ids_follow_episodes(got[w])


def test_a_factory_of_a_module_qualified_id_imports_the_module_first(tmp_path, monkeypatch):
    # "module:Env-v0": gym.make imports the module, which registers the id; so do EnvPool and its factory
    (tmp_path / "registers_on_import.py").write_text(
        "import gymnasium as gym\n"
        "gym.register(id='RegisteredOnImport-v0', entry_point='envs:CountingEnv', kwargs={'length': 3})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import gymnasium as gym

    try:
        factory = EnvPool.factory("registers_on_import:RegisteredOnImport-v0", num_envs=2, seed=0)
        with factory() as pool:
            assert pool.env_spec.id == "RegisteredOnImport-v0"
        with pytest.raises(ModuleNotFoundError, match="cannot import 'not_a_module_anywhere'"):
            EnvPool.factory("not_a_module_anywhere:Foo-v0", num_envs=2)
    finally:
        gym.registry.pop("RegisteredOnImport-v0", None)
