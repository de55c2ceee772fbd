"""Timing harness shared by every benchmark section.

Each row builds its subject, warms it up, calibrates how many units fill about
``seconds / repeats``, then times ``repeats`` runs. It reports the median rate
and the spread ``(max - min) / median``. Rates are compared as ratios to a
reference row measured in the same process run: these machines are shared and
noisy, so absolute numbers across runs mean little.

Timed runs start from a frozen heap (:func:`frozen_heap`): the objects that exist once the
subjects are built and warmed up (every subject of a row group, the peers' included) are
left out of garbage collections, so a collection during one row's run traverses what that
row allocated, not the other subjects' objects. Without it, a ``SerialEnv`` of 256
``GymEnv`` alive next to a ``Collector`` made the ``Collector`` pay ~0.6 ms per batched
step in full collections of the whole benchmark's heap.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["Row", "measure", "measure_together", "frozen_heap", "failed_row", "require"]


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then leave every object alive now out of later garbage collections (:func:`gc.freeze`)
    until the block ends; collections still run, over the objects allocated inside the block. A heap that
    is frozen already (by the caller, or an enclosing block) is left as it is: ``gc.unfreeze`` would thaw
    all of it, not only what this block froze."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass
class Row:
    """One measured row of a benchmark table."""

    section: str
    key: str
    label: str
    n: int
    rate: float  # env-steps per second (median)
    spread: float  # (max - min) / median over the repeats
    us_per_call: float  # microseconds per batched step (median)
    ratio: float | None = None  # rate / reference rate (same run)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def failed_row(section: str, key: str, label: str, n: int, err: BaseException) -> Row:
    """A subject that cannot run here (a peer's error): reported with its error (NaN figures, ``null`` in the
    JSON), never fatal to the run."""
    from ..errors import error_text

    nan = float("nan")
    return Row(section, key, f"{label} (failed: {error_text(err)})", n, nan, nan, nan)


def require(results: dict, failures: dict, keys) -> None:
    """Raise the error of the first of ``keys`` (the rows every other row is compared with) that failed."""
    for key in keys:
        if key not in results:
            raise failures[key]


def _calibrate(subject, target: float = 0.1) -> tuple[int, float]:
    """Warm ``subject`` up, then double the units until one run lasts ``target`` seconds."""
    subject.run(1)  # warm-up: first-call costs, lazy buffers
    units = 1
    while True:
        t0 = time.perf_counter()
        subject.run(units)
        dt = time.perf_counter() - t0
        if dt >= target or units >= 1 << 22:
            return units, dt
        units *= 2


def _summary(units: int, steps_per_unit: int, envs_per_step: int, times: list[float], setup: float,
             counts: list | None = None) -> dict:
    # a subject whose run() returns a number of env-steps is credited with it (a NEXT_STEP vector env,
    # whose call after an episode's end only resets that env); else every batched step is envs_per_step
    steps = units * steps_per_unit
    counts = counts or [None] * len(times)
    rates = [(steps * envs_per_step if c is None else c) / t for c, t in zip(counts, times)]
    median = statistics.median(rates)
    return {
        "rate": median,
        "spread": (max(rates) - min(rates)) / median,
        "us_per_call": statistics.median(times) / steps * 1e6,
        "setup_s": setup,
    }


def measure(
    make: Callable[[], object],
    *,
    steps_per_unit: int = 1,
    envs_per_step: int,
    seconds: float = 2.0,
    repeats: int = 3,
) -> dict:
    """Time ``subject.run(units)`` of the object ``make()`` returns.

    ``subject`` must have ``run(units)`` and ``close()``; each unit is
    ``steps_per_unit`` batched steps of ``envs_per_step`` env-steps.

    Returns ``{"rate", "spread", "us_per_call", "setup_s"}``.
    """
    t0 = time.perf_counter()
    subject = make()
    setup = time.perf_counter() - t0
    try:
        units, dt = _calibrate(subject)
        units = max(1, int(math.ceil(seconds / repeats * units / max(dt, 1e-9))))
        times, counts = [], []
        with frozen_heap():
            for _ in range(repeats):
                t0 = time.perf_counter()
                counts.append(subject.run(units))
                times.append(time.perf_counter() - t0)
    finally:
        subject.close()
    return _summary(units, steps_per_unit, envs_per_step, times, setup, counts)


def measure_together(makers: dict, *, envs_per_step: int, seconds: float = 2.0, repeats: int = 5,
                     steps_per_unit: dict | None = None, failures: dict | None = None) -> dict:
    """:func:`measure` for several subjects at once, interleaved.

    Every subject is built, warmed up and calibrated, then timed ``repeats`` times, each time in two
    passes of about ``seconds / repeats / len(makers) / 2`` per subject: the subjects in order, then in
    the reverse order. A repeat's figure for a subject is the sum of its two passes, whose midpoints
    average to the repeat's midpoint whatever the subject's place: a host that speeds up or slows down
    steadily then shifts every row alike, so the ratios between rows stay meaningful even when absolute
    rates move. (One pass per repeat, in any rotation, leaves each subject's median at its place in the
    middle pass: drifts of 1 %/s shifted ratios by up to 4.5 %.) Returns ``{key: measure()-style dict}``.

    ``steps_per_unit``: ``{key: batched steps per unit}`` (default 1). ``failures``: a dict that
    collects ``{key: exception}`` for subjects that fail to build, warm up or run (a peer that cannot
    run here), which are then left out; without it such an error propagates.
    """
    subjects, setup, units = {}, {}, {}
    steps_per_unit = steps_per_unit or {}

    def failed(key, err):
        if failures is None:
            raise err
        failures[key] = err
        subject = subjects.pop(key, None)
        if subject is not None:
            try:
                subject.close()
            except Exception:  # the failure itself is what gets reported
                pass

    try:
        for key, make in makers.items():
            t0 = time.perf_counter()
            try:
                subjects[key] = make()
            except Exception as err:
                failed(key, err)
                continue
            setup[key] = time.perf_counter() - t0
        calibration = {}
        for key, subject in list(subjects.items()):
            try:
                calibration[key] = _calibrate(subject)
            except Exception as err:
                failed(key, err)
        for key, (u, dt) in calibration.items():
            if key in subjects:
                units[key] = max(1, int(math.ceil(seconds / repeats / len(subjects) / 2 * u / max(dt, 1e-9))))
        times = {key: [] for key in subjects}
        counts = {key: [] for key in subjects}
        order = list(subjects)
        with frozen_heap():
            for _ in range(repeats if order else 0):  # every subject failed: nothing to time
                passes = {key: [] for key in order}  # (seconds, count) per pass
                for key in order + order[::-1]:
                    if key not in subjects:
                        continue
                    t0 = time.perf_counter()
                    try:
                        count = subjects[key].run(units[key])
                    except Exception as err:
                        failed(key, err)
                        continue
                    passes[key].append((time.perf_counter() - t0, count))
                for key in subjects:
                    (t1, c1), (t2, c2) = passes[key]
                    times[key].append(t1 + t2)
                    counts[key].append(None if c1 is None else c1 + c2)
    finally:
        for subject in subjects.values():
            subject.close()
    # a repeat's time is two passes' worth of units
    return {key: _summary(2 * units[key], steps_per_unit.get(key, 1), envs_per_step, times[key], setup[key],
                          counts[key]) for key in subjects}


def is_next_step(venv) -> bool:
    """Whether a gymnasium vector env autoresets NEXT_STEP (its call after an env's last step only resets it)."""
    import gymnasium as gym

    mode = getattr(venv, "autoreset_mode", None) or venv.metadata.get("autoreset_mode")
    return mode in (gym.vector.AutoresetMode.NEXT_STEP, "NextStep", "next_step")


def step_next_step(step, actions, n: int, units: int, waiting: int, offset: int = 0) -> tuple[int, int]:
    """Step a NEXT_STEP vector env ``units`` times; returns ``(transitions, rows waiting for their reset)``:
    a row that finished at the previous call is only reset by this one."""
    transitions = 0
    for s in range(units):
        _, _, terminated, truncated, _ = step(actions[(s + offset) % len(actions)])
        transitions += n - waiting
        waiting = int(np.count_nonzero(np.logical_or(terminated, truncated)))
    return transitions, waiting
