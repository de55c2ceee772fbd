"""Iterate a TorchRL multi-process collector so that a failed worker always raises.

TorchRL 0.14.1's ``MultiSyncCollector``/``MultiAsyncCollector`` check their worker
processes while they wait for data, so a worker whose env raised usually ends the
collection with "At least one process failed". ``MultiAsyncCollector`` has a gap: when
the surviving workers reach ``total_frames`` before the failed worker's process has
exited, iteration ends normally, the batches after the failure came from the other
workers, and the failure is only in the log. :func:`raise_on_worker_failure` closes that gap.

Example:
    >>> from torchrl.collectors import MultiAsyncCollector
    >>> from torchrl_swm import EnvPool, raise_on_worker_failure
    >>> make = EnvPool.factory("CartPole-v1", num_envs=4)
    >>> collector = MultiAsyncCollector([make, make], None, frames_per_batch=64, total_frames=256)
    >>> sum(batch.numel() for batch in raise_on_worker_failure(collector))
    256
    >>> collector.shutdown()
"""

from __future__ import annotations

import signal
from collections.abc import Container, Iterator
from typing import Any

from tensordict import TensorDictBase

__all__ = ["raise_on_worker_failure"]

_TORCHRL_CLOSE_RACE = "Cannot close a process while it is still running"
_SHUT_DOWN = (0, -signal.SIGTERM, 128 + signal.SIGTERM)


def raise_on_worker_failure(collector: Any, *, shutdown_timeout: float = 60.0) -> Iterator[TensorDictBase]:
    """Yield ``collector``'s batches, then shut it down and raise if any worker process failed.

    After each batch the worker processes' exit codes are checked; once the collector is
    exhausted it is shut down (which joins its workers) and checked again, so a worker
    that died during the last batches is reported too. The collector is also shut down
    when the loop ends early (``break`` or an exception). Collectors without worker
    processes (``Collector``, ``RayCollector``, which raises ``RayActorError`` itself)
    pass through unchanged.

    Args:
        collector: a TorchRL collector.
        shutdown_timeout: how long the workers get to close their envs and exit (TorchRL's
            ``shutdown(timeout=...)``; its default, 10 s, terminates envs that take seconds to
            close). A worker the shutdown had to terminate is reported: a worker whose env
            raised while its envs were still closing looks the same.

    Raises:
        RuntimeError: naming each worker that exited with a non-zero code (also when TorchRL's
            own check, racing a worker still exiting, raised a ``ValueError`` instead). The worker's
            own traceback (for an :class:`~torchrl_swm.EnvPool`, an ``EnvError`` naming
            the env index) is in its stderr.
    """
    procs = list(getattr(collector, "procs", None) or [])
    running: set[int] = set()
    found_dead: dict[int, int] = {}  # after TorchRL's fault check raised ValueError: fault
    fault: ValueError | None = None
    try:
        try:
            for batch in collector:
                # any exit while batches still come is a failure, even with code 0 (an env's sys.exit(): Python
                # prints no traceback for it, and a MultiAsyncCollector goes on with the other workers)
                _raise_if_any_failed(procs, when="during collection", clean_exit_fails=range(len(procs)))
                yield batch
        except ValueError as err:
            if not procs or _TORCHRL_CLOSE_RACE not in str(err):
                raise
            # TorchRL found a dead worker, terminated the others and closed each 0.1 s later: one still exiting
            # (a worker tearing down a process pool, a simulator handling SIGTERM) raised this instead of its
            # "At least one process failed". TorchRL's own shutdown has run since: the others exited by its SIGTERM
            # (-15, or 128 + 15 from a handler of it) or cleanly (0, which is also a handler's exit): the dead
            # are the workers whose exit code none of these explains.
            codes = {i: code for i, code in enumerate(map(_exit_code, procs)) if code is not None}
            found_dead = {i: code for i, code in codes.items() if code not in _SHUT_DOWN}
            fault = err
    finally:
        running = {i for i, proc in enumerate(procs) if _exit_code(proc) is None}
        if procs:
            collector.shutdown(timeout=shutdown_timeout)
        else:
            collector.shutdown()
    if fault is not None:
        workers = ", ".join(f"worker {i} (exit code {code})" for i, code in found_dead.items())
        raise RuntimeError(
            f"collector {workers or 'worker'} failed during collection; TorchRL then terminated the other workers"
            f"{'' if workers else ' (whose exit codes cannot tell which one died: an env exited with code 0?)'}. "
            "The worker's traceback is in its stderr (an EnvPool names the env index that raised)."
        ) from fault
    # a worker that had exited before the shutdown died, whatever its code (0: an env's os._exit(0) or sys.exit())
    _raise_if_any_failed(procs, when="before the collection ended", running=running, timeout=shutdown_timeout,
                         clean_exit_fails={i for i in range(len(procs)) if i not in running})


def _exit_code(proc: Any) -> int | None:
    try:
        return proc.exitcode
    except ValueError:  # TorchRL closes the Process objects of workers it found dead
        return None


def _raise_if_any_failed(procs: list, *, when: str, running: set[int] = frozenset(), timeout: float = 0.0,
                         clean_exit_fails: Container[int] = ()) -> None:
    """``clean_exit_fails``: the workers for which an exit code of 0 is a failure too."""
    failed = [(i, code) for i, code in enumerate(map(_exit_code, procs))
              if code is not None and (code != 0 or i in clean_exit_fails)]
    if failed:
        def describe(i, code):
            if code < 0 and i in running:  # a signal, maybe the shutdown's own SIGTERM: say so
                return (f"worker {i} (exit code {code}: killed by a signal, e.g. terminated by the shutdown after "
                        f"{0.8 * timeout:.0f} s; if its envs only close slowly, pass shutdown_timeout=)")
            if code == 0:
                return f"worker {i} (exit code 0 while the collection was still running: an env's sys.exit()?)"
            return f"worker {i} (exit code {code})"

        workers = ", ".join(describe(i, code) for i, code in failed)
        raise RuntimeError(
            f"collector {workers} failed {when}; its data stops at the failure (with a MultiAsyncCollector, "
            "later batches came from the other workers only). "
            "The worker's traceback is in its stderr (an EnvPool names the env index that raised)."
        )
