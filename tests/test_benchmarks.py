"""Smoke tests: the benchmark runs end to end with tiny sizes (no timing assertions)."""

import json
import math
import subprocess
import sys
import time
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv


def test_pool_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrl_swm.benchmarks", "--sections", "cartpole,vector,fixed", "--quick",
         "--json", str(out), "--plot", str(plot)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| cartpole | 16 | plain loop" in proc.stdout
    data = json.loads(out.read_text())
    rows = data["rows"]
    # how the figures were made: a quick smoke run is told apart from a measurement
    assert data["run"]["quick"] is True and data["run"]["seconds"] == 0.3 and data["run"]["ns"] == [16]
    assert data["run"]["sections"] == ["cartpole", "vector", "fixed"] and data["run"]["started_utc"].endswith("Z")
    keys = {(r["section"], r["key"]) for r in rows}
    assert {("cartpole", "plain"), ("cartpole", "pool_step"), ("cartpole", "pool_rollout"), ("cartpole", "pool_collector"),
            ("vector", "raw"), ("vector", "pool"), ("fixed", "pool_k0"), ("fixed", "floor"),
            ("cartpole", "plain_seeded"), ("cartpole", "ceiling_rollout"), ("cartpole", "ceiling_collector")} <= keys
    ceiling = next(r for r in rows if r["key"] == "ceiling_collector")
    if ceiling["extra"]["torchrl_overhead_us"] > 0:  # a difference of two timings: noise can swamp it
        assert 0 < ceiling["ratio"] < 1
    else:
        assert ceiling["ratio"] is None and "not measurable" in ceiling["label"]
    assert all(r["rate"] > 0 and not math.isnan(r["rate"]) for r in rows if r["key"] != "gym_async")
    assert plot.stat().st_size > 1000


def test_a_next_step_vector_env_is_credited_with_its_transitions_only():
    # NoopEnv(period=2) ends every 2nd step; under NEXT_STEP the call after the end only resets it
    import functools

    import gymnasium as gym

    from torchrl_swm.benchmarks.pool import GymVector, NoopEnv

    n = 3
    for mode, expected in ((gym.vector.AutoresetMode.NEXT_STEP, 4 * n), (gym.vector.AutoresetMode.SAME_STEP, None)):
        venv = gym.vector.SyncVectorEnv([functools.partial(NoopEnv, 2)] * n, autoreset_mode=mode)
        subject = GymVector(venv, n)
        assert subject.run(6) == expected  # None: every call is n env-steps
        subject.close()


def test_a_failed_row_is_written_as_strict_json():
    # a peer that cannot run is a row with a NaN rate: the JSON holds null, which strict parsers accept
    from torchrl_swm.benchmarks.__main__ import _no_nan
    from torchrl_swm.benchmarks.harness import Row
    from torchrl_swm.benchmarks.harness import failed_row as _failed_row

    row = Row("cartpole", "peer", "a peer (failed: ...)", 1, float("nan"), 0, 0, float("nan"), {"x": float("inf")})
    text = json.dumps(_no_nan(row.as_dict()), allow_nan=False)
    assert json.loads(text)["rate"] is None and json.loads(text)["extra"] == {"x": None}
    # a failed peer has no figures at all: not 0 µs per step (infinitely fast) or a 0 % spread
    failed = json.loads(json.dumps(_no_nan(_failed_row("cartpole", "peer", "a peer", 4, OSError("x")).as_dict())))
    assert failed["rate"] is None and failed["spread"] is None and failed["us_per_call"] is None


def test_measure_together_credits_steps_per_unit_and_reports_subjects_that_cannot_be_built():
    from torchrl_swm.benchmarks.harness import measure_together

    class Sleeper:
        def __init__(self, seconds):
            self.seconds = seconds

        def run(self, units):
            time.sleep(self.seconds * units)

        def close(self):
            pass

    def broken():
        raise RuntimeError("cannot run here")

    failures = {}
    results = measure_together({"one": lambda: Sleeper(0.002), "ten": lambda: Sleeper(0.002), "broken": broken},
                               envs_per_step=4, seconds=0.3, repeats=2, steps_per_unit={"ten": 10}, failures=failures)
    assert set(results) == {"one", "ten"} and isinstance(failures["broken"], RuntimeError)
    # the same time per unit: ten batched steps per unit make each step ten times cheaper
    assert results["ten"]["us_per_call"] < results["one"]["us_per_call"] / 5
    assert results["ten"]["rate"] > 5 * results["one"]["rate"]


def test_measure_together_reports_a_subject_that_fails_while_warming_up_or_running():
    from torchrl_swm.benchmarks.harness import measure_together

    class Failing:
        """Fails at its first call (warm-up), or at its second timed round (``later``), or never."""

        closed = 0

        def __init__(self, when):
            self.when, self.calls, self.units, self.rounds = when, 0, [], 0

        def run(self, units):
            self.calls += 1
            # calibration doubles units; the timed rounds repeat one count
            self.rounds += bool(self.units) and units == self.units[-1]
            self.units.append(units)
            if self.when == "warmup" or (self.when == "later" and self.rounds == 2):
                raise RuntimeError(f"failed at call {self.calls}")
            time.sleep(0.001 * units)

        def close(self):
            Failing.closed += 1

    failures = {}
    results = measure_together({"ok": lambda: Failing(None), "warmup": lambda: Failing("warmup"),
                                "later": lambda: Failing("later")},
                               envs_per_step=2, seconds=0.2, repeats=3, failures=failures)
    assert set(results) == {"ok"} and set(failures) == {"warmup", "later"}
    assert "call 1" in str(failures["warmup"]) and results["ok"]["rate"] > 0 and Failing.closed == 3
    failures = {}
    assert measure_together({"a": lambda: Failing("warmup"), "b": lambda: Failing("later")},
                            envs_per_step=2, seconds=0.1, repeats=2, failures=failures) == {}
    assert set(failures) == {"a", "b"}
    with pytest.raises(RuntimeError, match="failed at call 1"):  # without failures=, the error propagates
        measure_together({"warmup": lambda: Failing("warmup")}, envs_per_step=2, seconds=0.1, repeats=2)


def test_the_ceiling_pools_end_episodes_at_scattered_steps_like_cartpole():
    """Most batched steps of a CartPole pool hold a partial reset; the ceilings' no-op pools must too, or
    they undercount TorchRL's reset round trips (lengths in lockstep clumps gave 16 % at N=16)."""
    from torchrl_swm.benchmarks.pool import _noop_pools

    for n, least in ((16, 0.35), (256, 0.9)):
        subject = _noop_pools(n)["noop_step"]()
        env, td, any_done = subject.env, subject.td, []
        for s in range(400):
            td["action"] = subject.acts[s % len(subject.acts)]
            out, td = env.step_and_maybe_reset(td)
            any_done.append(bool(out["next", "done"].any()))
        subject.close()
        assert np.mean(any_done) > least, (n, np.mean(any_done))


def test_a_ceiling_drowned_in_noise_is_reported_unmeasurable_and_the_plot_still_renders(tmp_path):
    # noop rollout timed faster than the noop step loop (a loaded machine): no negative or > 1 "upper bound"
    from torchrl_swm.benchmarks.__main__ import save_plot
    from torchrl_swm.benchmarks.pool import ceilings

    def timing(us):
        return {"us_per_call": us, "spread": 0.1, "rate": 3 / us * 1e6}

    results = {"plain": timing(30.0), "noop_step": timing(80.0), "noop_rollout": timing(46.0),
               "noop_collector": timing(130.0)}
    rollout, collector = ceilings(3, results)
    assert math.isnan(rollout.ratio) and math.isnan(rollout.rate) and "not measurable" in rollout.label
    assert rollout.extra["torchrl_overhead_us"] == -34.0
    assert collector.ratio == 30.0 / 80.0 and collector.us_per_call == 80.0  # 30 µs + 50 µs of Collector
    save_plot([rollout, collector], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_timed_runs_start_from_a_frozen_heap_that_is_thawed_after_even_on_failure():
    # a garbage collection during one row's timed run must not traverse the other subjects' objects
    # (a SerialEnv of 256 GymEnv next to a Collector cost the Collector ~0.6 ms per batched step)
    import gc

    from torchrl_swm.benchmarks.harness import measure, measure_together

    seen = []

    class Subject:
        def __init__(self, fail=False):
            self.fail, self.timed = fail, False
            self.heap = [[i] for i in range(1000)]  # objects built before timing

        def run(self, units):
            seen.append(gc.get_freeze_count())
            if self.fail and len(seen) > 8:
                raise RuntimeError("fails while timed")
            time.sleep(0.0005 * units)

        def close(self):
            pass

    assert gc.get_freeze_count() == 0
    measure(Subject, envs_per_step=1, seconds=0.05, repeats=2)
    assert seen[0] == 0 and seen[-1] >= 1000  # warm-up on a live heap; timed runs with the subject frozen
    assert gc.get_freeze_count() == 0
    seen.clear()
    failures = {}
    results = measure_together({"a": Subject, "b": lambda: Subject(fail=True)}, envs_per_step=1, seconds=0.05,
                               repeats=3, failures=failures)
    assert set(results) == {"a"} and set(failures) == {"b"} and max(seen) >= 2000
    assert gc.get_freeze_count() == 0


def test_a_heap_the_caller_froze_stays_frozen():
    # gc.unfreeze() thaws everything: the harness must not thaw what it did not freeze
    import gc

    from torchrl_swm.benchmarks.harness import frozen_heap, measure

    class Tiny:
        def run(self, units):
            time.sleep(1e-4 * units)

        def close(self):
            pass

    state = [[i] for i in range(1000)]  # kept alive, frozen below

    def still_frozen():  # the frozen heap is not in gc.get_objects() (the count alone drops as frozen objects die)
        tracked = {id(o) for o in gc.get_objects()}
        return not any(id(x) in tracked for x in state)

    gc.freeze()
    try:
        measure(Tiny, envs_per_step=1, seconds=0.02, repeats=2)
        assert still_frozen()
        with frozen_heap():
            with frozen_heap():
                pass
            assert still_frozen()
        assert still_frozen()
    finally:
        gc.unfreeze()
    with frozen_heap():
        with frozen_heap():  # nested: the inner block leaves the outer one's heap frozen
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_the_plot_draws_the_package_rows_blue_and_the_references_grey():
    from torchrl_swm.benchmarks.__main__ import _OURS

    ours = ["make_world_model_env (TransformedEnv + StepCounter) step loop", "WorldModelEnv step_and_maybe_reset loop",
            "to_gymnasium(MLPWorldModelEnv), same_step", "EnvPool CartPole, step_and_maybe_reset (reference)"]
    references = ["MLPWorldModelEnv, step_and_maybe_reset", "raw batched forward (limit, reference)"]
    assert all(label.startswith(_OURS) for label in ours)
    assert not any(label.startswith(_OURS) for label in references)


def test_the_plot_shows_each_rows_ratio_label_and_colour(tmp_path):
    """save_plot: one axis per (section, N), a bar per measured row, in table order, ending at its ratio on the
    log axis, labelled with the ratio to 2 d.p. as the table gives it; the package's rows blue, references and
    peers grey; rows without a ratio left out (review R2: only the file's existence was tested)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    from torchrl_swm.benchmarks.__main__ import save_plot
    from torchrl_swm.benchmarks.harness import Row

    rows = [Row("cartpole", "plain", "plain loop over gym.make envs [reference]", 16, 1.0, 0.0, 1.0, 1.0),
            Row("cartpole", "pool", "EnvPool, step_and_maybe_reset loop", 16, 1.0, 0.0, 1.0, 0.613),
            Row("cartpole", "sync", "gymnasium SyncVectorEnv", 16, 1.0, 0.0, 1.0, 0.85),
            Row("cartpole", "ceil", "ceiling: not measurable", 16, 1.0, 0.0, 1.0, None),
            Row("export/pool", "ref", "EnvPool CartPole, step_and_maybe_reset (reference)", 256, 1.0, 0.0, 1.0, 1.0),
            Row("export/pool", "exp", "to_gymnasium(EnvPool), next_step", 256, 1.0, 0.0, 1.0, 0.0412)]
    save_plot(rows, tmp_path / "p.png")
    fig = plt.gcf()
    try:
        assert (tmp_path / "p.png").stat().st_size > 1000
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == [
            "cartpole, N/B = 16: ratio to the reference row (log scale)",
            "export/pool, N/B = 256: ratio to the reference row (log scale)"]
        blue, grey = to_rgba("tab:blue"), to_rgba("tab:gray")
        expected = [[(rows[0], grey), (rows[1], blue), (rows[2], grey)], [(rows[4], grey), (rows[5], blue)]]
        for ax, want in zip(axes, expected):
            bars = sorted(ax.patches, key=lambda p: p.get_y())
            ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))
            texts = sorted(ax.texts, key=lambda t: t.get_position()[1])
            assert len(bars) == len(want) == len(texts)
            for y, (bar, text, (row, colour)) in enumerate(zip(bars, texts, want)):
                assert bar.get_x() + bar.get_width() == pytest.approx(row.ratio)  # the bar ends at the ratio
                assert bar.get_facecolor() == colour, row.label
                assert ticks[y] == row.label and text.get_text() == f" {row.ratio:.2f}"
                assert text.get_position() == (pytest.approx(row.ratio), y)
            assert ax.get_xscale() == "log" and ax.get_xlim()[0] <= min(r.ratio for r, _ in want)
            assert ax.yaxis_inverted()  # the table's first row on top
    finally:
        plt.close(fig)


@pytest.mark.parametrize("drift", [0.01, -0.01])
def test_measure_together_keeps_ratios_of_identical_subjects_at_one_on_a_host_whose_speed_drifts(monkeypatch, drift):
    """Identical subjects on a host that slows down (or speeds up) by 1 %/s: every row must come out
    alike, whatever its place in the round (one pass per round, even rotated, left each subject's median at
    its place in the middle round, up to 4.5 % off). The host is a virtual clock: a unit costs 1 ms times
    the host's speed at that moment."""
    import types

    from torchrl_swm.benchmarks import harness

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    class Identical:
        def run(self, units):
            for _ in range(units):
                clock.now += 1e-3 * (1 + drift * clock.now)

        def close(self):
            pass

    keys = [f"s{i}" for i in range(16)]
    results = harness.measure_together({key: Identical for key in keys}, envs_per_step=1, seconds=32.0, repeats=3)
    ratios = [results[key]["rate"] / results["s0"]["rate"] for key in keys]
    assert max(abs(r - 1) for r in ratios) < 2e-3, ratios


def test_a_failed_row_prints_no_figures_in_the_table():
    from torchrl_swm.benchmarks.__main__ import format_table
    from torchrl_swm.benchmarks.harness import failed_row as _failed_row

    table = format_table([_failed_row("cartpole", "peer", "a peer", 16, OSError("spawn failed"))])
    assert table.splitlines()[-1] == "| cartpole | 16 | a peer (failed: OSError: spawn failed) | n/a |  |  |  |"


class _CountingCartPole(CartPoleEnv):
    """CartPole counting, across every instance, its steps and its seeded and unseeded resets."""

    steps = seeded = unseeded = 0

    def step(self, action):
        _CountingCartPole.steps += 1
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        if seed is None:
            _CountingCartPole.unseeded += 1
        else:
            _CountingCartPole.seeded += 1
        return super().reset(seed=seed, options=options)


def test_every_cartpole_row_is_credited_with_the_env_steps_it_takes_and_seeds_as_its_label_says(monkeypatch):
    """Each in-process subject of the ``cartpole`` section credits ``steps_per_unit`` batched steps of N envs
    per unit (or returns the transitions it made): counted on a CartPole that counts its calls. The rows
    labelled as seeding every episode reset with a seed each time, the others without (a plain loop that
    stopped seeding would still carry its label)."""
    from torchrl_swm.benchmarks.pool import _NOOP_PATHS, RandomLengthNoopEnv, _noop_pools, cartpole_subjects

    env_id = "TorchrlSwmTestCountingCartPole-v0"
    gym.register(env_id, entry_point=_CountingCartPole, max_episode_steps=500)
    n = 4
    seeded = {"plain_seeded", "pool_step", "pool_rollout", "pool_collector"}
    unseeded = {"plain", "plain_numpy_actions", "pool_step_once", "pool_rollout_once", "pool_collector_once"}
    try:
        subjects = cartpole_subjects(n, env_id)
        assert seeded | unseeded <= {key for key, *_ in subjects}
        for key, _, make, steps_per_unit in subjects:
            if key == "floor":  # TorchRL's no-work floor steps no env
                continue
            subject = make()
            subject.run(1)  # warm-up: construction and first resets
            _CountingCartPole.steps = _CountingCartPole.seeded = _CountingCartPole.unseeded = 0
            units = -(-200 // steps_per_unit)  # enough steps for episodes to end
            transitions = subject.run(units)
            subject.close()
            expected = units * steps_per_unit * n if transitions is None else transitions
            assert _CountingCartPole.steps == expected, (key, _CountingCartPole.steps, expected)
            assert _CountingCartPole.seeded + _CountingCartPole.unseeded > 0, key
            if key in seeded:
                assert _CountingCartPole.unseeded == 0, (key, _CountingCartPole.unseeded)
            if key in unseeded:
                assert _CountingCartPole.seeded == 0, (key, _CountingCartPole.seeded)
    finally:
        gym.registry.pop(env_id)

    # the ceilings' no-op pools: steps counted on their env class
    steps = []
    original = RandomLengthNoopEnv.step
    monkeypatch.setattr(RandomLengthNoopEnv, "step", lambda self, action: (steps.append(1), original(self, action))[1])
    for key, make in _noop_pools(n).items():
        subject = make()
        subject.run(1)
        steps.clear()
        subject.run(3)
        subject.close()
        assert len(steps) == 3 * _NOOP_PATHS[key] * n, (key, len(steps))


def test_measure_together_reports_absolute_rates_times_and_counts_on_a_steady_host(monkeypatch):
    """On a virtual clock where a unit costs exactly 1 ms: 4 envs x 10 batched steps per unit is 40,000
    env-steps/s and 100 µs per batched step; a subject that returns its transitions (a NEXT_STEP vector
    env) is credited with their sum, 3 per unit here: 3,000/s."""
    import types

    from torchrl_swm.benchmarks import harness

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    class Steady:
        def __init__(self, transitions=None):
            self.transitions = transitions

        def run(self, units):
            clock.now += 1e-3 * units
            return None if self.transitions is None else self.transitions * units

        def close(self):
            pass

    results = harness.measure_together({"steps": Steady, "counted": lambda: Steady(3)}, envs_per_step=4,
                                       seconds=2.0, repeats=3, steps_per_unit={"steps": 10})
    assert results["steps"]["rate"] == pytest.approx(40_000) and results["steps"]["us_per_call"] == pytest.approx(100)
    assert results["counted"]["rate"] == pytest.approx(3_000) and results["counted"]["spread"] == pytest.approx(0)


def test_the_parallel_env_of_sync_vector_env_workers_peer_runs_and_steps_every_env():
    import functools

    from torchrl.envs import ParallelEnv

    from torchrl_swm.benchmarks.pool import StepLoop, _sync_vector_wrapped

    subject = StepLoop(ParallelEnv(2, functools.partial(_sync_vector_wrapped, 3)))
    try:
        assert subject.env.batch_size == (2, 3)  # credited with 2 x (N // 2) env-steps per call
        subject.run(30)  # CartPole episodes end and SAME_STEP resets them inside the workers
        assert subject.td["observation"].shape == (2, 3, 4)
    finally:
        subject.close()


def test_summary_reports_the_median_rate_and_the_spread_over_the_median():
    """Three repeats of 10 batched steps of 4 envs lasting 1 s, 2 s and 4 s: rates 40, 20 and 10 env-steps/s.
    The rate is their median (20, not the mean 23.3), the spread (max - min) / median = 30 / 20."""
    from torchrl_swm.benchmarks.harness import _summary

    s = _summary(10, 1, 4, [1.0, 2.0, 4.0], 0.5)
    assert s["rate"] == 20.0
    assert s["spread"] == 1.5
    assert s["us_per_call"] == pytest.approx(2.0 / 10 * 1e6)
    assert s["setup_s"] == 0.5


def test_measure_credits_a_subject_with_the_transitions_it_returns(monkeypatch):
    """measure() (the rows timed alone, as gym_async) credits a NEXT_STEP subject's returned transitions,
    not every batched step: a unit costs 1 ms of a virtual clock and makes 3 transitions out of 4 envs."""
    import types

    from torchrl_swm.benchmarks import harness

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    class Steady:
        def run(self, units):
            clock.now += 1e-3 * units
            return 3 * units

        def close(self):
            pass

    result = harness.measure(Steady, envs_per_step=4, seconds=1.0)
    assert result["rate"] == pytest.approx(3_000) and result["us_per_call"] == pytest.approx(1_000)


def test_a_next_step_vector_env_credits_no_reset_only_call_after_a_truncation_or_across_runs():
    """Under NEXT_STEP the call after an episode's end only resets that env: after a truncation too
    (BusyEnv(0 ms, episode=2) truncates every 2nd step), and when the end was the previous run()'s last call."""
    import functools

    from torchrl_swm.benchmarks.pool import BusyEnv, GymVector, NoopEnv

    ns = gym.vector.AutoresetMode.NEXT_STEP
    n = 3
    subject = GymVector(gym.vector.SyncVectorEnv([functools.partial(BusyEnv, 0.0, 2)] * n, autoreset_mode=ns), n)
    assert subject.run(6) == 4 * n  # steps 3 and 6 only reset
    subject.close()
    subject = GymVector(gym.vector.SyncVectorEnv([functools.partial(NoopEnv, 2)] * n, autoreset_mode=ns), n)
    # episodes end at calls 2 and 5: call 3 (the second run's only one) and call 6 only reset
    assert [subject.run(2), subject.run(1), subject.run(3)] == [2 * n, 0, 2 * n]
    subject.close()


def test_step_next_step_counts_truncations_and_the_rows_left_waiting():
    from torchrl_swm.benchmarks.harness import step_next_step

    f, t = np.zeros(3, bool), np.array([True, False, True])
    outcomes = iter([(f, t), (f, f), (t, f)])  # (terminated, truncated) per call

    def step(action):
        terminated, truncated = next(outcomes)
        return None, None, terminated, truncated, {}

    assert step_next_step(step, [0], 3, 1, 1) == (2, 2)  # one row waiting; two rows truncated
    assert step_next_step(step, [0], 3, 2, 2) == (1 + 3, 2)


def test_a_pool_row_ratio_is_its_rate_over_the_reference_rate():
    from torchrl_swm.benchmarks.pool import _row

    row = _row("cartpole", "k", "l", 4, {"rate": 200.0, "spread": 0.1, "us_per_call": 1.0}, 100.0, finishing=2)
    assert (row.rate, row.spread, row.us_per_call, row.ratio, row.extra) == (200.0, 0.1, 1.0, 2.0, {"finishing": 2})
    assert _row("cartpole", "k", "l", 4, {"rate": 200.0, "spread": 0.1, "us_per_call": 1.0}).ratio is None


def test_export_rows_ratios_are_rates_over_the_reference_rate():
    from torchrl_swm.benchmarks.export import _rows

    def result(rate):
        return {"rate": rate, "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0}

    rows = _rows("export/pool", 4, [("pool", "p"), ("gym", "g"), ("sb3", "s")],
                 {"pool": result(100.0), "gym": result(50.0), "sb3": result(400.0)}, {}, "pool")
    assert [r.ratio for r in rows] == [1.0, 0.5, 4.0]
    assert all(r.extra["reference"] == "pool" for r in rows)


def test_a_ceiling_rate_is_n_env_steps_per_its_time_per_batched_step():
    """ceilings(): time per batched step = the plain loop's + (path - step loop) on the no-op pools;
    rate = N / that time; ratio = plain time / that time."""
    from torchrl_swm.benchmarks.pool import ceilings

    def result(us):
        return {"us_per_call": us, "spread": 0.1, "rate": 3 / us * 1e6}

    res = {"plain": result(30.0), "noop_step": result(80.0), "noop_rollout": result(100.0),
           "noop_collector": result(130.0)}
    rows = {r.key: r for r in ceilings(3, res)}
    rollout, collector = rows["ceiling_rollout"], rows["ceiling_collector"]
    assert rollout.us_per_call == pytest.approx(50.0) and collector.us_per_call == pytest.approx(80.0)
    assert rollout.rate == pytest.approx(3 / 50.0 * 1e6) and collector.rate == pytest.approx(3 / 80.0 * 1e6)
    assert rollout.ratio == pytest.approx(30 / 50) and collector.ratio == pytest.approx(30 / 80)


def test_the_table_prints_each_figure_under_its_header():
    from torchrl_swm.benchmarks.__main__ import format_table
    from torchrl_swm.benchmarks.harness import Row

    lines = format_table([Row("cartpole", "k", "label", 4, 1000.0, 0.05, 12.5, 1.0)]).splitlines()

    def cells(line):
        return [c.strip() for c in line.strip("|").split("|")]

    assert dict(zip(cells(lines[0]), cells(lines[-1]))) == {
        "section": "cartpole", "N/B": "4", "row": "label", "env-steps/s (median)": "1,000", "spread": "5%",
        "µs/batched step": "12.5", "ratio": "1.00"}


def test_the_fixed_section_ratios_are_to_the_env_base_floor(monkeypatch):
    """fixed(): every row's ratio is its rate over TorchRL's EnvBase floor's, all timed in one interleaved call
    (measure_together() faked: no env runs)."""
    from torchrl_swm.benchmarks import pool

    rates = iter([1000.0, 500.0, 250.0, 125.0])
    monkeypatch.setattr(pool, "measure", None)  # no row timed alone
    monkeypatch.setattr(pool, "measure_together", lambda makers, **kw: {
        key: {"rate": next(rates), "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0} for key in makers})
    rows = {r.key: r for r in pool.fixed(n=2, seconds=0.0)}
    assert list(rows) == ["floor", "pool_k0", "pool_k1", "pool_k2"]
    assert [r.ratio for r in rows.values()] == [1.0, 0.5, 0.25, 0.125]
    assert [rows[f"pool_k{k}"].extra["finishing"] for k in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("section, kwargs, keys", [
    ("vector", {"ns": (2,)}, ["raw", "pool"]),
    ("expensive", {"n": 2, "workers": 1, "ms": 0.0}, ["serial", "process", "process_oversubscribed",
                                                       "torchrl_parallel"]),
])
def test_the_vector_and_expensive_sections_time_their_rows_together_against_their_reference(monkeypatch, section,
                                                                                           kwargs, keys):
    """vector() and expensive(): every row timed in one interleaved call (a drifting host shifts them alike), each
    row's ratio its rate over the section's reference row (the first) (measure_together() faked: no env runs)."""
    from torchrl_swm.benchmarks import pool

    calls = []

    def together(makers, **kw):
        calls.append(list(makers))
        return {key: {"rate": 100.0 * (i + 1), "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0}
                for i, key in enumerate(makers)}

    monkeypatch.setattr(pool, "measure", None)  # no row timed alone
    monkeypatch.setattr(pool, "measure_together", together)
    rows = getattr(pool, section)(seconds=0.0, **kwargs)
    assert calls == [keys] and [r.key for r in rows] == keys
    assert [r.ratio for r in rows] == [float(i + 1) for i in range(len(keys))]
    assert "reference" in rows[0].label


def test_the_cartpole_ratios_are_to_the_plain_loop(monkeypatch):
    """cartpole(): every measured row's ratio is its rate over the plain loop's (the [reference], 1.00), the
    rows timed together and alone alike (measure_together and measure faked with distinct rates: no env runs)."""
    from torchrl_swm.benchmarks import pool

    def result(rate):
        return {"rate": rate, "spread": 0.0, "us_per_call": 2 / rate * 1e6, "setup_s": 0.0}

    results = {}

    def together(makers, **kw):
        results.update({key: result(100.0 * (i + 1)) for i, key in enumerate(makers)})
        results["noop_rollout"]["us_per_call"] = results["noop_step"]["us_per_call"] + 10  # a measurable ceiling
        return dict(results)

    monkeypatch.setattr(pool, "measure_together", together)
    monkeypatch.setattr(pool, "measure", lambda make, **kw: result(7.0))
    rows = {r.key: r for r in pool.cartpole(ns=(2,), seconds=0.0, include_slow=False)}
    plain = results["plain"]["rate"]
    assert rows["plain"].ratio == 1.0 and results["plain_seeded"]["rate"] != plain
    measured = [key for key in rows if not key.startswith("ceiling_")]
    assert {"plain_seeded", "pool_step", "floor", "gym_async"} <= set(measured)
    for key in measured:
        assert rows[key].ratio == rows[key].rate / plain, key


class _LastStepEnv(gym.Env):
    """Observation [env id, step count, episode]; reward = the step count; env 0 terminates and env 1
    truncates every 3rd step, env 2 never ends. Keeps what it last returned (a reset's observation
    after an episode's end)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)
    made: ClassVar[list] = []

    def __init__(self):
        self.id, self.t, self.episode = len(_LastStepEnv.made), 0, 0
        _LastStepEnv.made.append(self)

    def _obs(self):
        self.last_obs = np.array([self.id, self.t, self.episode], np.float32)
        return self.last_obs

    def reset(self, *, seed=None, options=None):
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        ends = self.t % 3 == 0 and self.id in (0, 1)
        self.last = (float(self.t), ends and self.id == 0, ends and self.id == 1)
        return self._obs(), *self.last, {}


@pytest.mark.parametrize("numpy_actions, seed_every_episode", [(False, False), (True, False), (True, True)])
def test_the_plain_loop_writes_every_step_into_its_buffers(numpy_actions, seed_every_episode):
    # the reference row must do the work a pool does per step: store observation (the reset's after an
    # episode's end), reward, terminated and truncated of every env in its numpy buffers, not drop them
    from torchrl_swm.benchmarks.pool import PlainLoop

    _LastStepEnv.made = []
    subject = PlainLoop(3, _LastStepEnv, numpy_actions=numpy_actions, seed_every_episode=seed_every_episode)
    envs = _LastStepEnv.made
    for units in (1, 2, 3):  # ends at steps 3 and 6 (the last): the buffers then hold the reset's observation
        subject.run(units)
        assert np.array_equal(subject.obs, np.stack([env.last_obs for env in envs])), subject.obs
        assert subject.rew.tolist() == [env.last[0] for env in envs]
        assert subject.term.tolist() == [env.last[1] for env in envs]
        assert subject.trunc.tolist() == [env.last[2] for env in envs]
    assert [env.episode for env in envs] == [3, 3, 1] and subject.obs[0].tolist() == [0, 0, 3]
    subject.close()


class _ActionTypeCartPole(CartPoleEnv):
    """CartPole recording the type of every action it is stepped with."""

    types: ClassVar[list] = []

    def step(self, action):
        _ActionTypeCartPole.types.append(type(action))
        return super().step(action)


def test_the_plain_loop_rows_pass_the_action_type_their_labels_say():
    # "plain" steps its envs with Python ints; the rows labelled with numpy integer actions (the type
    # Discrete.sample() and gymnasium's vector envs pass, faster through Discrete.contains) with numpy integers
    from torchrl_swm.benchmarks.pool import cartpole_subjects

    env_id = "TorchrlSwmTestActionTypeCartPole-v0"
    gym.register(env_id, entry_point=_ActionTypeCartPole, max_episode_steps=500)
    try:
        subjects = {key: make for key, _, make, _ in cartpole_subjects(2, env_id, include_slow=False)}
        for key, expected in (("plain", int), ("plain_numpy_actions", np.int64), ("plain_seeded", np.int64)):
            subject = subjects[key]()
            _ActionTypeCartPole.types = []
            subject.run(40)
            subject.close()
            assert len(_ActionTypeCartPole.types) == 80 and set(_ActionTypeCartPole.types) == {expected}, (
                key, set(_ActionTypeCartPole.types))
    finally:
        gym.registry.pop(env_id)


def test_the_fixed_section_pools_have_exactly_k_envs_finishing_per_step(monkeypatch):
    """The "k envs finishing per step" rows: stepping the pool each row's maker builds ends exactly k
    episodes at every step (k + 1 would be timed under the label of k). measure_together() is faked to
    hand back the makers: the pools are built and stepped here, not timed."""
    from torchrl_swm.benchmarks import pool

    built = {}

    def together(makers, **kw):
        built.update(makers)
        return {key: {"rate": 1.0, "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0} for key in makers}

    monkeypatch.setattr(pool, "measure_together", together)
    n = 6
    rows = pool.fixed(n=n, seconds=0.0)
    finishing = {r.key: r.extra["finishing"] for r in rows if r.key != "floor"}
    assert finishing == {"pool_k0": 0, "pool_k1": 1, "pool_k4": 4}
    for key, k in finishing.items():
        subject = built[key]()
        env, td = subject.env, subject.td
        try:
            for s in range(5):
                td["action"] = subject.acts[s]
                out, td = env.step_and_maybe_reset(td)
                assert int(out["next", "done"].sum()) == k, (key, s, int(out["next", "done"].sum()))
        finally:
            subject.close()


def test_each_export_group_is_rated_against_the_row_its_label_calls_the_reference(monkeypatch):
    """export/pool and export/world_model: the row labelled "reference" has ratio 1.0 and is every row's
    ``extra["reference"]``; every other row's ratio is its rate over that row's rate (measure_together()
    faked with distinct rates per row: nothing runs)."""
    from torchrl_swm.benchmarks import export

    rates = {}

    def together(makers, **kw):
        out = {}
        for i, key in enumerate(makers):
            rates[key] = 100.0 * (i + 2)  # distinct, none 1.0
            out[key] = {"rate": rates[key], "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0}
        return out

    monkeypatch.setattr(export, "measure_together", together)
    for group in (export._pool_rows, export._world_model_rows):
        rates.clear()
        rows = group((2,), 0.0)
        references = [r for r in rows if "reference" in r.label]
        assert len(references) == 1, [r.label for r in rows]
        ref = references[0]
        assert ref.ratio == 1.0 and len(rows) >= 4
        for r in rows:
            assert r.extra["reference"] == ref.key, (r.key, r.extra["reference"])
            assert r.ratio == rates[r.key] / rates[ref.key], r.key
        assert ref.key == {export._pool_rows: "pool", export._world_model_rows: "raw"}[group]


def test_measure_times_each_repeat_for_about_its_share_of_the_seconds(monkeypatch):
    """measure(seconds=1.5, repeats=3): each timed run lasts about 0.5 s, not the whole 1.5 s (a row timed
    alone would take three times its budget). Virtual clock: a unit costs 1 ms."""
    import types

    from torchrl_swm.benchmarks import harness

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    durations = []

    class Steady:
        def run(self, units):
            clock.now += 1e-3 * units
            durations.append(1e-3 * units)

        def close(self):
            pass

    harness.measure(Steady, envs_per_step=2, seconds=1.5, repeats=3)
    timed = durations[-3:]  # warm-up and calibration first, then the three timed runs
    assert timed == [timed[0]] * 3 and timed[0] == pytest.approx(0.5, rel=0.05), durations


def test_an_unmeasurable_ratio_prints_as_an_empty_cell_not_nan():
    from torchrl_swm.benchmarks.__main__ import format_table
    from torchrl_swm.benchmarks.harness import Row
    from torchrl_swm.benchmarks.pool import ceilings

    def cells(line):
        return [c.strip() for c in line.strip("|").split("|")]

    row = Row("cartpole", "k", "a ratio of no meaning", 4, 1000.0, 0.05, 12.5, float("nan"))
    assert cells(format_table([row]).splitlines()[-1])[-1] == ""
    # a ceiling drowned in noise (NaN ratio): no "nan" anywhere in its line
    timing = {"us_per_call": 80.0, "spread": 0.1, "rate": 1.0}
    rollout, _ = ceilings(3, {"plain": timing, "noop_step": timing, "noop_rollout": dict(timing, us_per_call=46.0),
                              "noop_collector": dict(timing, us_per_call=130.0)})
    line = format_table([rollout]).splitlines()[-1]
    assert cells(line)[-1] == "" and "nan" not in line.lower(), line
    assert cells(line)[3] == "n/a", line  # nothing failed: no "failed" in the rate column either


def test_torchrl_info_lines_stay_out_of_the_table_on_stdout_here_and_in_worker_processes(monkeypatch):
    """TorchRL logs INFO lines to stdout (its peers' spec checks), which would land in the markdown table: the run
    raises TorchRL's level to WARNING, for the worker processes it starts too (RL_LOGGING_LEVEL), and puts both
    back after; a level the user set is kept."""
    import logging
    import os

    import torchrl  # noqa: F401  (sets up its logger)

    from torchrl_swm.benchmarks import __main__ as bench

    seen = {}

    def sections(*args, **kwargs):
        seen["info_logged"] = logging.getLogger("torchrl").isEnabledFor(logging.INFO)
        seen["env"] = os.environ.get("RL_LOGGING_LEVEL")
        return []

    logger = logging.getLogger("torchrl")
    monkeypatch.setattr(logger, "level", logging.INFO)  # TorchRL's default, whatever an earlier test set
    monkeypatch.delenv("RL_LOGGING_LEVEL", raising=False)
    monkeypatch.setattr(bench, "run_sections", sections)
    assert bench.main(["--sections", "cartpole"]) == 0
    assert seen == {"info_logged": False, "env": "WARNING"}
    assert "RL_LOGGING_LEVEL" not in os.environ and logger.level == logging.INFO
    monkeypatch.setenv("RL_LOGGING_LEVEL", "INFO")  # the user's own choice is kept
    assert bench.main(["--sections", "cartpole"]) == 0
    assert seen == {"info_logged": True, "env": "INFO"}


def _cannot_run(*args, **kwargs):
    raise RuntimeError("this peer cannot run here")


def test_a_peer_that_cannot_run_is_a_failed_row_in_every_section_and_the_run_goes_on(monkeypatch):
    # only the cartpole section reported a failed peer; elsewhere its error ended the whole run, losing every row
    from torchrl_swm.benchmarks import export as E
    from torchrl_swm.benchmarks import pool as P
    from torchrl_swm.benchmarks import world_model as W

    monkeypatch.setattr(W, "_model_based_env", _cannot_run)
    monkeypatch.setattr(P, "_torchrl_sync_busy", _cannot_run)
    monkeypatch.setattr(E, "_SB3Loop", _cannot_run)
    sections = {
        "world_model": (W.run(bs=(2,), seconds=0.05), "torchrl/model_based"),
        "expensive": (P.expensive(n=2, workers=1, ms=0.05, seconds=0.05), "torchrl_parallel"),
        "export/pool": ([r for r in E.run(ns=(2,), bs=(), seconds=0.05)], "sb3"),
    }
    for name, (rows, peer) in sections.items():
        failed = [r for r in rows if r.key == peer]
        assert len(failed) == 1 and "(failed: RuntimeError: this peer cannot run here)" in failed[0].label, name
        assert math.isnan(failed[0].rate) and failed[0].ratio is None, name
        measured = [r for r in rows if r.key != peer]
        assert measured and all(r.rate > 0 for r in measured), name
    # the reference every other row is compared with is no peer: its failure still ends the section
    monkeypatch.setattr(P, "BusyEnv", _cannot_run)
    with pytest.raises(RuntimeError, match="this peer cannot run here"):
        P.expensive(n=2, workers=1, ms=0.05, seconds=0.05)


def _capture_makers(monkeypatch, module, section, *args, **kwargs) -> dict:
    """The subject makers a section hands measure_together() (faked: nothing is built or timed here)."""
    built = {}

    def together(makers, **kw):
        built.update(makers)
        return {key: {"rate": 1.0, "spread": 0.0, "us_per_call": 1.0, "setup_s": 0.0} for key in makers}

    monkeypatch.setattr(module, "measure_together", together)
    section(*args, **kwargs)
    return built


def _record_cartpole(monkeypatch) -> dict:
    """Every CartPole in this process records its steps as (env, action) and the seed of each of its resets."""
    seen = {"steps": [], "seeds": []}
    step, reset = CartPoleEnv.step, CartPoleEnv.reset

    def recording_step(self, action):
        seen["steps"].append((id(self), int(np.asarray(action).argmax() if np.size(action) > 1 else action)))
        return step(self, action)

    def recording_reset(self, *, seed=None, options=None):
        seen["seeds"].append(seed)
        return reset(self, seed=seed, options=options)

    monkeypatch.setattr(CartPoleEnv, "step", recording_step)
    monkeypatch.setattr(CartPoleEnv, "reset", recording_reset)
    return seen


def _every_env_varies_its_actions(steps) -> bool:
    actions = {}
    for env, action in steps:
        actions.setdefault(env, set()).add(action)
    return bool(actions) and all(len(a) == 2 for a in actions.values())


_CARTPOLE_LOOPS = ["plain", "pool_step", "pool_rollout", "pool_collector", "pool_step_once", "pool_rollout_once",
                   "pool_collector_once", "gym_sync", "torchrl_gymwrapper", "torchrl_serial"]


@pytest.mark.parametrize("key", _CARTPOLE_LOOPS + ["noop_step", "noop_rollout", "noop_collector"])
def test_every_cartpole_row_steps_each_env_with_varying_random_actions(monkeypatch, key):
    """The step-loop, rollout and Collector rows (and the ceilings' no-op pools) cycle through their pre-drawn
    random action batches: each env sees both actions over a run, as the plain loop's envs do. One action batch
    repeated would change CartPole's episode lengths (about 9 steps instead of 22) and with them the resets the
    row pays for."""
    from torchrl_swm.benchmarks.pool import _NOOP_PATHS, RandomLengthNoopEnv, _noop_pools, cartpole_subjects

    n = 3
    if key in _NOOP_PATHS:
        seen = {"steps": []}
        original = RandomLengthNoopEnv.step
        monkeypatch.setattr(RandomLengthNoopEnv, "step", lambda self, action: (
            seen["steps"].append((id(self), int(action))), original(self, action))[1])
        make, steps_per_unit = _noop_pools(n)[key], _NOOP_PATHS[key]
    else:
        seen = _record_cartpole(monkeypatch)
        make, steps_per_unit = {k: (m, s) for k, _, m, s in cartpole_subjects(n)}[key]
    subject = make()
    try:
        subject.run(1)
        seen["steps"].clear()
        subject.run(max(1, 40 // steps_per_unit))
    finally:
        subject.close()
    assert len(seen["steps"]) >= 30 * n  # (gym_sync: NEXT_STEP calls that only reset an env step none)
    assert _every_env_varies_its_actions(seen["steps"]), key


def test_every_export_pool_row_varies_its_actions_and_seeds_every_episode_as_the_reference(monkeypatch):
    """export/pool: the reference (EnvPool stepped directly) and the to_gymnasium and SB3 rows step each env with
    varying actions and reset every episode with a seed (EnvPool's default). A row seeding only its first episodes
    would skip the per-episode seeding cost (~8 % at N=256) the reference pays."""
    from torchrl_swm.benchmarks import export

    makers = _capture_makers(monkeypatch, export, export._pool_rows, (3,), 0.0)
    assert {"pool", "gym-next_step", "gym-same_step"} <= set(makers)
    seen = _record_cartpole(monkeypatch)
    for key, make in makers.items():
        subject = make()
        try:
            subject.run(1)
            seen["steps"].clear()
            seen["seeds"].clear()
            subject.run(80)  # CartPole episodes last ~22 steps under random actions
        finally:
            subject.close()
        assert _every_env_varies_its_actions(seen["steps"]), key
        assert seen["seeds"] and None not in seen["seeds"], (key, seen["seeds"])


@pytest.mark.parametrize("n", [3, 100])
def test_a_next_step_export_row_is_credited_with_the_env_steps_it_takes_at_any_size(monkeypatch, n):
    """``to_gymnasium(EnvPool, autoreset_mode="next_step")``: the transitions a run credits are the CartPole
    steps it took, N per call less the envs only being reset, for N other than the 64 pre-drawn action batches."""
    from torchrl_swm.benchmarks import export

    make = _capture_makers(monkeypatch, export, export._pool_rows, (n,), 0.0)["gym-next_step"]
    seen = _record_cartpole(monkeypatch)
    subject = make()
    try:
        subject.run(1)
        credited = 0
        for units in (30, 7):
            seen["steps"].clear()
            transitions = subject.run(units)
            assert transitions == len(seen["steps"]) > 0, (units, transitions, len(seen["steps"]))
            credited += transitions
        assert credited < 37 * n  # some calls only reset an env
    finally:
        subject.close()


def test_every_export_world_model_row_varies_its_actions(monkeypatch):
    """export/world_model: every row (the raw forwards, the TorchRL loops, the gymnasium exports) calls the model
    with a different action batch from step to step, not one batch repeated (which changes the done rate)."""
    import torch

    from torchrl_swm.benchmarks import export

    model, actions = export.make_model(), []

    class Recording(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, latent, action):
            actions.append(action.clone())
            return self.model(latent, action)

    monkeypatch.setattr(export, "make_model", Recording)
    makers = _capture_makers(monkeypatch, export, export._world_model_rows, (2,), 0.0)
    assert {"raw", "torchrl", "wm-torchrl", "gym-next_step", "wm-gym-same_step"} <= set(makers)
    for key, make in makers.items():
        subject = make()
        try:
            subject.run(1)
            actions.clear()
            subject.run(10)
        finally:
            subject.close()
        assert len(actions) >= 10, key
        assert len({tuple(a.flatten().tolist()) for a in actions}) >= 9, key


def test_the_expensive_sections_parallel_env_peer_runs_the_same_busy_envs_as_the_pools(monkeypatch):
    """expensive(): the TorchRL ParallelEnv peer's workers build N envs burning the same ``ms`` of CPU per step as
    the serial reference's and the process backend's (a peer doing half the work would read twice as fast).
    Its worker factories are called here, in this process: no worker is started."""
    from torchrl_swm.benchmarks import pool

    monkeypatch.setattr(pool, "StepLoop", lambda env: env)  # the makers hand back their env, not reset
    makers = _capture_makers(monkeypatch, pool, pool.expensive, n=4, workers=2, ms=0.3, seconds=0.0)
    made = []
    original = pool.BusyEnv.__init__

    def recording_init(self, ms=1.0, episode=200):
        made.append(ms)
        original(self, ms, episode)

    monkeypatch.setattr(pool.BusyEnv, "__init__", recording_init)
    serial = makers["serial"]()
    serial.close()
    assert made == [0.3] * 4
    parallel = makers["torchrl_parallel"]()
    made.clear()
    for factory in parallel.create_env_fn:  # what each worker builds
        factory().close()
    assert made == [0.3] * 4
