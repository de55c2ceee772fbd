"""The process backend: sub-envs stepped in worker processes, several envs per worker.

Each worker runs a :class:`~.serial.SerialBackend` over a contiguous slice of
the envs and writes its rows straight into the pool's buffers, which live in
shared memory; actions travel the same way. A pipe carries only tiny commands
(``("step", rows)``) and acknowledgements, so no observation is pickled per
step. Workers block on their pipe (no busy-waiting), so more workers than cores
degrade gracefully; on Linux they run under ``SCHED_BATCH``, so a worker woken by
its command never preempts the pool's process while it sends the others theirs.

Faults never hang the pool: an env that raises inside a worker comes back as an
:class:`~torchrl_swm.errors.EnvError` naming the env, with the worker's
traceback and the env's exception chained; a worker that dies is noticed
through its process sentinel at once; ``close()`` always reaps every worker and
frees the shared memory, also after errors and at interpreter exit. An env call
that never returns (or a stopped worker) is waited for, as a serial loop would
wait: Ctrl-C interrupts the wait, and ``close()`` then terminates that worker.
Meanwhile the other workers' envs answer ``call``/``get_attr``/``set_attr``;
``step`` and ``reset`` wait for the stuck one again.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from multiprocessing import connection, resource_tracker
from multiprocessing.reduction import ForkingPickler
from multiprocessing.shared_memory import SharedMemory

import cloudpickle
import numpy as np
import torch

from .._interrupts import hold_interrupts, interrupts_held, release_interrupts
from ..errors import EnvAttributeError, EnvError, add_as_notes, add_note, check_int, error_text
from .rows import action_kind
from .worker import REPLY_OK, worker_main

__all__ = ["ProcessBackend"]

_CLOSE_TIMEOUT = 5.0  # seconds close() gives a worker left in an env call by an interrupt, before terminating it


def _unpickled_cause(data: bytes | None) -> BaseException | None:
    """The env's exception a worker sent (:func:`~.worker._pickled_cause`); ``None`` when there is none or it
    cannot be rebuilt here (an exception class whose ``__init__`` takes other arguments than its ``args``):
    the error's message still carries the worker's traceback."""
    if data is None:
        return None
    try:
        cause = cloudpickle.loads(data)
    except Exception:
        return None
    return cause if isinstance(cause, BaseException) else None


def _split(n: int, k: int) -> list[range]:
    """``k`` contiguous, near-equal slices of ``range(n)``."""
    bounds = np.linspace(0, n, k + 1).round().astype(int)
    return [range(bounds[w], bounds[w + 1]) for w in range(k)]


def _reserve(shm: SharedMemory, nbytes: int) -> None:
    """Give ``shm`` its pages now. A segment is sparse: where ``/dev/shm`` cannot hold it (Docker's default is
    64 MiB), the first write past the free space kills the process with SIGBUS, which no ``except`` can catch.
    Raises an ``OSError`` that names the size and the remedies (the caller removes the segment)."""
    fd = getattr(shm, "_fd", -1)
    if not hasattr(os, "posix_fallocate") or fd < 0:  # no such call (macOS): the segment is written as it is
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as err:
        try:
            free = f"{shutil.disk_usage('/dev/shm').free / 2**20:,.1f} MiB free"
        except OSError:
            free = "its free space unknown"
        raise OSError(
            err.errno,
            f"EnvPool(backend='process'): the pool's shared buffers need {nbytes / 2**20:,.1f} MiB of shared memory "
            f"(/dev/shm, {free}), which could not be reserved ({os.strerror(err.errno)}). Give it more room (Docker: "
            "--shm-size=1g), make the buffers smaller (fewer envs, a smaller image_shape=), or use backend='serial'",
        ) from err


def _end(proc) -> None:
    """Terminate ``proc``; kill it if it survives SIGTERM (a simulator that handles the signal itself)."""
    proc.terminate()
    proc.join(timeout=2)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _shutdown(processes, conns, shm, owed: dict, slices) -> None:
    """Reap every worker and free the shared memory (the end of close(), and the finalizer of a pool
    collected unclosed, which runs before EnvPool.__del__ in a garbage-collected cycle).

    A worker closes its envs and exits: that is waited for however long it takes, as the serial
    backend waits for ``env.close()``. A worker that still owes replies (an interrupt left it in an
    env call, which may never return) has ``_CLOSE_TIMEOUT`` to send them, as in close(): one
    deadline for all such workers (k of them cost 5 s, not 5k). One that does is waited for like the
    others; one still silent then is terminated with a warning.
    """
    for conn in conns:
        try:
            conn.send(("close", None))
        except (OSError, ValueError, BrokenPipeError):
            pass
    deadline = time.monotonic() + _CLOSE_TIMEOUT
    stuck = []
    for w, count in list(owed.items()):
        for _ in range(count or 0):
            try:
                if not conns[w].poll(max(0.0, deadline - time.monotonic())):
                    stuck.append(w)
                    break
                conns[w].recv_bytes()  # the interrupted call's reply: dropped, as close() drops it
            except (EOFError, OSError):  # the worker is gone: nothing to wait for
                break
    for w in stuck:
        processes[w].join(timeout=max(0.0, deadline - time.monotonic()))
    for w, proc in enumerate(processes):
        if w not in stuck:
            proc.join()
    for w, proc in enumerate(processes):
        if proc.is_alive():
            rows = slices[w]
            warnings.warn(
                f"EnvPool: worker {w} (envs {rows.start}..{rows.stop - 1}) was still in an env call when the pool "
                "was closed and was terminated; its envs were not closed", RuntimeWarning, stacklevel=2,
            )
            _end(proc)
    # all or nothing under a Ctrl-C: a shutdown it cut short runs again at the next close(), and a Process
    # released twice raises
    with interrupts_held():
        for conn in conns:
            conn.close()
        for proc in processes:
            # its sentinel pipe now: a dead worker's error can keep the pool in a reference cycle, and the pipe
            # would stay open until the next cyclic garbage collection
            proc.close()
        processes.clear()  # all reaped and released: nothing left for a second run to wait for
        if shm is not None:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


def _frames_to_resize(replies: list) -> dict | None:
    """The frames of another size (``image_shape=``) in the workers' step or reset replies, by row (see
    ``InProcessBackend.store_frame``); ``None`` when there are none, the usual reply."""
    if not any(replies):
        return None
    return {i: frame for reply in replies if reply for i, frame in reply.items()}


class ProcessBackend:
    """Steps the envs in ``num_workers`` processes, several envs per worker.

    Args:
        env_fns: zero-argument factories returning ``gymnasium.Env``; they are
            sent to the workers with cloudpickle (lambdas and partials work).
        num_workers: number of worker processes (default: ``min(cpu_count, N)``).
        pixels: render an ``rgb_array`` frame after every reset and step.
        start_method: multiprocessing start method (default ``"spawn"``, as TorchRL).
    """

    batched_actions = True
    needs_action_buffer = True

    def __init__(
        self,
        env_fns: Sequence[Callable],
        num_workers: int | None = None,
        pixels: bool = False,
        start_method: str = "spawn",
    ):
        if mp.current_process().daemon:  # multiprocessing's own refusal is a bare AssertionError
            raise RuntimeError(
                "EnvPool(backend='process'): this is a daemonic process (a gymnasium AsyncVectorEnv or SB3 "
                "SubprocVecEnv worker, or a process backend's), which may not start processes; use "
                "backend='serial' here"
            )
        n = len(env_fns)
        num_workers = min(os.cpu_count() or 1, n) if num_workers is None else check_int(num_workers, "num_workers")
        if not 1 <= num_workers <= n:
            raise ValueError(f"num_workers: expected 1 <= num_workers <= num_envs={n}, got {num_workers}")
        self.num_envs = n
        self.slices = _split(n, num_workers)
        self._owed: dict[int, int] = {}  # worker -> replies still owed to an interrupted command
        self._late_error: EnvError | None = None  # an env's error in an interrupted command, raised by the next
        self._dead_worker: EnvError | None = None  # the first worker found dead after start: no step or reset since
        self._shm = None
        self._action_buf = None
        if start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"EnvPool(backend='process'): mp_start_method must be one of {mp.get_all_start_methods()} "
                f"on this platform, got {start_method!r}"
            )
        ctx = mp.get_context(start_method)
        self._start_method, self._started = ctx.get_start_method(), False  # started: every worker made its envs
        self._processes, self._conns, self._pids = [], [], []
        self._reap_pending = False  # a close() interrupted while reaping the workers: the next one finishes it
        self._close_error: EnvError | None = None  # an env's close() error that close() had yet to raise
        self._arm_finalizer()
        gathering = False  # reading the workers' replies to "make": an interrupt leaves those unread owed
        # the shared buffers' tracker, started before the workers: forked ones then share it (a tracker of their
        # own would report the segment, which the pool unlinks, as leaked when they exit)
        resource_tracker.ensure_running()
        try:
            for w, rows in enumerate(self.slices):
                chunk = list(env_fns[rows.start : rows.stop])
                try:
                    payload = cloudpickle.dumps(chunk)
                except Exception as err:
                    raise TypeError(
                        f"env_fns[{rows.start}:{rows.stop}] cannot be sent to worker {w}: {error_text(err)}. "
                        "Factories must be picklable with cloudpickle: use module-level functions or "
                        "functools.partial, not closures over locks, open files or live envs."
                    ) from err
                parent, child = ctx.Pipe(duplex=True)
                # a forked worker inherits the pool's ends of its own pipe and the earlier workers': it closes
                # them first, or a pool's process that dies without close() leaves it waiting for an end of file
                # that never comes (its envs never closed). Spawned workers inherit no descriptors
                inherited = [c.fileno() for c in (*self._conns, parent)] if self._start_method == "fork" else []
                proc = ctx.Process(target=worker_main, args=(child, payload, rows.start, pixels, inherited),
                                   daemon=True, name=f"torchrl_swm-pool-worker-{w}")
                proc.start()
                child.close()
                self._processes.append(proc)
                self._pids.append(proc.pid)  # still known once close() has released the Process objects
                self._conns.append(parent)
            gathering = True
            spaces = self._gather(range(num_workers), "make")
            self._started = True
            self.observation_space, self.action_space = spaces[0]
            for w, (obs_space, act_space) in enumerate(spaces[1:], 1):
                if obs_space != self.observation_space or act_space != self.action_space:
                    raise EnvError(
                        self.slices[w].start, "make",
                        f"spaces {obs_space}, {act_space} differ from env 0's {self.observation_space}, "
                        f"{self.action_space}; all sub-envs of a pool must have the same spaces",
                    )
        except BaseException as err:
            if not gathering and not isinstance(err, Exception):
                # a Ctrl-C before the replies to "make" were read: every started worker owes one (close() would
                # read it as its own, and wait on a worker still making its envs however long that takes)
                for w in range(len(self._processes)):
                    self._owed[w] = self._owed.get(w, 0) + 1
            try:
                self.close()
            except Exception as close_err:  # the construction's error is the one to report
                add_note(err, f"closing the pool's other envs then failed too: {close_err}")
            raise

    def __len__(self) -> int:
        return self.num_envs

    # -- plumbing ------------------------------------------------------------------------
    # Every command is pickled for all its workers before any is sent, and a failed send
    # waits for the replies of the workers already sent to: a worker's reply is always
    # read by the command that asked for it, never by the next one. A wait interrupted by
    # the user (KeyboardInterrupt) leaves the unread replies owed; the next command reads
    # and drops them first.
    def _encode(self, w: int, command: str, args=None, rows=None, items=None, what: str = "the arguments"):
        """``(command, args)`` pickled for worker ``w``, or an :class:`EnvError` naming the first
        of ``rows`` whose item of ``items`` does not pickle.

        Steps (the hot path: rows only) use the standard pickler; every other command uses
        cloudpickle, as the factories do, so objects of classes defined in the user's script
        (options, attribute values, wrapper classes) reach the worker as the same classes the
        envs were built with, and come back as the caller's own classes."""
        dumps = ForkingPickler.dumps if command == "step" else cloudpickle.dumps
        try:
            return dumps((command, args))
        except Exception as err:
            index = None
            for i, item in zip(() if rows is None else rows, () if items is None else items):
                try:
                    dumps(item)
                except Exception:
                    index = int(i)
                    break
            span = self.slices[w]
            raise EnvError(
                index, command,
                f"{what} cannot be pickled to send to worker {w} (envs {span.start}..{span.stop - 1}): "
                f"{error_text(err)}. With the process backend they must be picklable (no locks, open "
                "files or live envs). Nothing was sent: the pool is unchanged.",
            ) from err

    def _broadcast(self, messages) -> list[int]:
        """Send pre-pickled ``[(worker, bytes)]``; return the workers, whose replies ``_gather`` reads.

        If a send fails (a dead worker), the replies of the workers already sent to are
        read and dropped before the error is raised, so no reply is left for a later command."""
        # only the workers sent to: a worker stuck in an interrupted env call keeps the others answering
        # (call/get_attr/set_attr of their envs), as a serial loop would; step and reset drain every worker first
        self._drain_owed(workers=[w for w, _ in messages])
        sent = []
        try:
            held = hold_interrupts()  # each message is sent whole, and counted as sent, or not at all
            try:
                for w, message in messages:
                    try:
                        self._conns[w].send_bytes(message)
                    except (OSError, BrokenPipeError) as err:
                        raise self._dead(w) from err
                    sent.append(w)
            finally:
                release_interrupts(held)
        except BaseException:
            try:
                self._gather(sent, "drain")
            except EnvError:
                pass
            raise
        return sent

    def _drain_owed(self, timeout: float | None = None, workers=None) -> list[int]:
        """Read and drop the replies an interrupted command left unread (see ``_gather``), of ``workers``
        (default: all).

        With ``timeout``, give up after that many seconds in all: returns the workers still silent
        then (stuck in an env call), whose replies stay owed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stuck = []
        for w in [w for w in self._owed if workers is None or w in workers]:
            while self._owed.get(w):
                self._owed[w] -= 1  # counted again by _gather if this wait is interrupted or times out
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    self._gather([w], "drain", timeout=left)
                except EnvError as err:
                    if err.phase == "drain (timed out)":
                        stuck.append(w)
                        break
                    if err.env_index is not None and self._late_error is None:
                        self._late_error = err  # an env raised in the interrupted command (a dead worker: the
                        # next send sees it)
            if w not in stuck:
                self._owed.pop(w, None)
        late, self._late_error = self._late_error, None
        if late is not None:
            add_note(
                late,
                "raised in a command that a KeyboardInterrupt interrupted; reported by the next command, which was "
                "not sent: that env's state is unknown, reset it"
            )
            if timeout is None:
                raise late
            warnings.warn(f"closing the pool: {late}", RuntimeWarning, stacklevel=3)  # close() goes on
        return stuck

    def _dead(self, w: int) -> EnvError:
        proc = self._processes[w]
        proc.join(timeout=0.1)
        rows = self.slices[w]
        hint = ""
        if not self._started:
            hint = " before it made its envs"
            if proc.exitcode == 1 and self._start_method != "fork":
                # an uncaught exception (Python exits with 1); the usual one: the worker re-imported the user's
                # main module, which builds a pool at import time
                hint += (
                    f" (its own error is on stderr above). A {self._start_method!r} worker imports the main module "
                    "again: a script that builds the pool at its top level must do it under "
                    "`if __name__ == \"__main__\":`"
                )
        error = EnvError(  # not one env's error: the worker held several, and which one killed it is unknown
            None, "worker",
            f"worker {w} (envs {rows.start}..{rows.stop - 1}, pid {proc.pid}) died with exit code {proc.exitcode}"
            + hint,
        )
        if self._started and self._dead_worker is None:
            self._dead_worker = error
        return error

    def _refuse_after_a_dead_worker(self, command: str) -> None:
        """A step or reset after a worker died would move the other workers' envs on their own (as the command
        that found it dead may have), out of step with what the caller saw: refused, naming the worker."""
        if self._dead_worker is not None:
            raise EnvError(
                None, command,
                f"{self._dead_worker.message}: the pool cannot step or reset after a worker died (the other workers' "
                "envs may have moved on in the command that found it dead); close() it and build a new EnvPool",
            )

    def _gather(self, workers, phase: str, timeout: float | None = None, errors: dict | None = None) -> list:
        """Wait for one reply from each of ``workers``; after all replied, raise the error of the
        lowest worker that reported one (the env the serial backend would name).

        ``timeout``: seconds to wait in all; workers still silent then are an error. ``errors``: a dict
        that receives every worker's error (by worker), none raised; their replies are then ``None``."""
        collect = errors is not None
        errors = {} if errors is None else errors
        pending = {self._conns[w]: w for w in workers}
        sentinels = {self._processes[w].sentinel: w for w in workers}
        replies = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._wait_replies(pending, sentinels, replies, errors, phase, deadline)
        except BaseException:
            # interrupted: an env error already received is the command's outcome too; the next command
            # raises it (_drain_owed), never drops it
            env_errors = [errors[w] for w in sorted(errors) if getattr(errors[w], "env_index", None) is not None]
            if env_errors and not collect and self._late_error is None:
                self._late_error = env_errors[0]
            raise
        finally:
            for w in pending.values():  # interrupted or past the deadline: their replies will come, for no one
                self._owed[w] = self._owed.get(w, 0) + 1
        if errors and not collect:
            raise errors[min(errors)]
        return [replies.get(w) for w in workers]

    def _wait_replies(self, pending, sentinels, replies, errors, phase, deadline) -> None:
        """Read replies into ``replies``/``errors`` until none is ``pending`` or the deadline passes."""
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            ready = connection.wait(list(pending) + list(sentinels), timeout=left)
            if not ready and deadline is not None and time.monotonic() >= deadline:
                for w in sorted(pending.values()):
                    rows = self.slices[w]
                    errors.setdefault(w, EnvError(
                        None, f"{phase} (timed out)", f"worker {w} (envs {rows.start}..{rows.stop - 1}) did not "
                        "answer within the time limit (an env call that never returns?)",
                    ))
                return
            held = hold_interrupts()  # each reply is read whole, and counted as read, or not at all
            try:
                self._read_ready(ready, pending, sentinels, replies, errors, phase)
            finally:
                release_interrupts(held)

    def _read_ready(self, ready, pending, sentinels, replies, errors, phase) -> None:
        for item in ready:
            if item in pending:
                try:
                    message = item.recv_bytes()
                except (EOFError, OSError):
                    w = pending.pop(item)
                    errors.setdefault(w, self._dead(w))
                    continue
                w = pending.pop(item)
                sentinels.pop(self._processes[w].sentinel, None)
                try:
                    status, value = ForkingPickler.loads(message)
                except Exception as err:  # the whole reply was read: the pipe stays in step
                    rows = self.slices[w]
                    error = EnvError(
                        None, phase,
                        f"the reply of worker {w} (envs {rows.start}..{rows.stop - 1}) cannot be unpickled here: "
                        f"{error_text(err)}",
                    )
                    error.__cause__ = err
                    errors.setdefault(w, error)
                    continue
                if status == REPLY_OK:
                    replies[w] = value
                else:
                    index, where, message, trace, missing_attribute, cause, wrapped, notes = value
                    cause = _unpickled_cause(cause)
                    if not wrapped and isinstance(cause, Exception) and not missing_attribute:
                        # the pool's own check (a factory that returned no env): raised with its own type,
                        # as the serial backend raises it
                        add_note(cause, f"--- raised in worker {w} ---\n{trace}")
                        errors.setdefault(w, cause)
                        continue
                    # as in the serial backend: a missing attribute is also an AttributeError
                    cls = EnvAttributeError if missing_attribute else EnvError
                    error = cls(index, where, f"{message}\n--- worker {w} traceback ---\n{trace}")
                    if cause is None and missing_attribute:
                        cause = AttributeError(message)
                    error.__cause__ = cause  # the env's own exception, as the serial backend chains it
                    error.__notes__ = notes  # the worker's own notes (its other envs' close errors)
                    errors.setdefault(w, error)
            elif item in sentinels:
                w = sentinels.pop(item)
                conn = self._conns[w]
                if conn in pending and conn.poll():
                    continue  # it replied before exiting: read the reply first
                pending.pop(conn, None)
                errors.setdefault(w, self._dead(w))

    def _by_worker(self, rows: np.ndarray):
        """``[(worker, local rows, positions in rows)]`` for the workers that own some of ``rows``."""
        out = []
        for w, span in enumerate(self.slices):
            owned = (rows >= span.start) & (rows < span.stop)
            if owned.any():
                out.append((w, rows[owned] - span.start, np.flatnonzero(owned)))
        return out

    # -- the backend API ---------------------------------------------------------------------
    def probe(self, seeds: Sequence[int], step: bool = True) -> dict:
        workers = self._broadcast(
            [(w, self._encode(w, "probe", (list(seeds[span.start : span.stop]), step)))
             for w, span in enumerate(self.slices)]
        )
        results = self._gather(workers, "probe")
        other = None
        for w, result in enumerate(results):  # the first env whose frame differs from env 0's, as serial finds it
            if result["frame_shape"] != results[0]["frame_shape"]:
                other = (self.slices[w].start, result["frame_shape"])
            else:
                other = result["other_frame"]
            if other is not None:
                break
        return {"infos": [item for r in results for item in r["infos"]], "frame_shape": results[0]["frame_shape"],
                "other_frame": other}

    def allocate(self, layout) -> torch.Tensor:
        """The pool's flat buffer, in shared memory that the workers attach to."""
        shm = SharedMemory(create=True, size=layout.nbytes)
        try:
            _reserve(shm, layout.nbytes)  # a full /dev/shm raises here, not SIGBUS at the first write
        except BaseException:  # a Ctrl-C too (a large reservation takes a while): nothing owns the segment yet
            shm.close()
            shm.unlink()
            raise
        self._shm = shm
        self._arm_finalizer()
        flat = np.ndarray((layout.nbytes,), dtype=np.uint8, buffer=self._shm.buf)
        flat[:] = 0
        return torch.from_numpy(flat)

    def attach(self, layout, arrays, info_schema, frame_key, any_frame_size: bool = False) -> None:
        kind = action_kind(self.action_space)
        self._action_buf = arrays[("_action",)]
        args = (self._shm.name, layout, info_schema, frame_key, any_frame_size, kind)
        self._gather(self._broadcast([(w, self._encode(w, "attach", args)) for w in range(len(self.slices))]), "attach")
        # every process that uses the segment has mapped it: remove its name now, so that nothing is left in
        # /dev/shm even when no close() runs (a Ray actor ended by ray.kill, a SIGKILL); the mappings stay valid
        self._shm.unlink()

    def reset(self, rows, seeds, options=None, episode_seeds=None) -> dict | None:
        self._drain_owed()  # first: an interrupted command's replies may show a worker died since
        self._refuse_after_a_dead_worker("reset")
        episode_seeds = seeds if episode_seeds is None else episode_seeds
        messages = []
        if rows is None:
            for w, span in enumerate(self.slices):
                part = slice(span.start, span.stop)
                opts = None if options is None else list(options[part])
                args = (None, list(seeds[part]), opts, list(episode_seeds[part]))
                messages.append((w, self._encode(w, "reset", args, span, opts, "the reset options")))
        else:
            for w, local, pos in self._by_worker(rows):
                opts = None if options is None else [options[k] for k in pos]
                args = (local, [seeds[k] for k in pos], opts, [episode_seeds[k] for k in pos])
                messages.append((w, self._encode(w, "reset", args, rows[pos], opts, "the reset options")))
        return _frames_to_resize(self._gather(self._broadcast(messages), "reset"))

    def settle(self) -> None:
        """Wait until no worker is still writing the buffers: the workers of a command a Ctrl-C interrupted
        finish it (and write their rows) after the pool's process has moved on. The pool settles them
        before it touches the buffers itself (a frozen row's zero reward) or reads them."""
        self._drain_owed()

    def check_ready(self, command: str) -> None:
        """Raise what would stop ``command`` before it reaches an env: an env error of an interrupted command, a
        dead worker (the pool reports these before refusing rows of its own accord)."""
        self._drain_owed()
        if self._dead_worker is None:  # one that died while idle is found only by the next command: look now
            for w, proc in enumerate(self._processes):
                if proc.exitcode is not None:
                    self._dead(w)
                    break
        self._refuse_after_a_dead_worker(command)

    def step(self, actions: np.ndarray, rows) -> dict | None:
        self._drain_owed()  # an interrupted step's workers may still read the action buffer (and may have died)
        self._refuse_after_a_dead_worker("step")
        if rows is None:
            self._action_buf[...] = actions
            targets = [(w, None) for w in range(len(self.slices))]
        else:
            self._action_buf[rows] = actions
            targets = [(w, local) for w, local, _ in self._by_worker(rows)]
        replies = self._gather(self._broadcast([(w, self._encode(w, "step", local)) for w, local in targets]), "step")
        return _frames_to_resize(replies)

    def _per_worker_call(self, rows, command, *args) -> list:
        rows = np.asarray(rows, dtype=np.int64)
        targets = self._by_worker(rows)
        what = f"the arguments of {command}({args[0]!r}, ...)"
        messages = [(w, self._encode(w, command, (local.tolist(), *args), what=what)) for w, local, _ in targets]
        replies = self._gather(self._broadcast(messages), command)
        out = [None] * len(rows)
        for (w, local, pos), reply in zip(targets, replies):
            for k, value in zip(pos, reply or [None] * len(pos)):
                out[k] = value
        return out

    def call(self, rows, name, args, kwargs) -> list:
        return self._per_worker_call(rows, "call", name, args, kwargs)

    def get_attr(self, rows, name) -> list:
        return self._per_worker_call(rows, "get_attr", name)

    def is_wrapped(self, rows, wrapper_class) -> list[bool]:
        return self._per_worker_call(rows, "is_wrapped", wrapper_class)

    def set_attr(self, rows, name, values, outermost: bool = False) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        messages = []
        for w, local, pos in self._by_worker(rows):
            items = [values[k] for k in pos]
            what = f"the values of set_attr({name!r}, ...)"
            args = (local.tolist(), name, items, outermost)
            messages.append((w, self._encode(w, "set_attr", args, rows[pos], items, what)))
        self._gather(self._broadcast(messages), "set_attr")

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def close(self) -> None:
        """Close the envs (each worker closes its own, then exits), reap every worker and free the
        shared memory. As in the serial backend, an env's ``close()`` is waited for however long it
        takes, and one that raises is reported after everything is reaped. A worker still in an env
        call an interrupt left running is terminated (with a ``RuntimeWarning``) after 5 s."""
        error = None
        if self._reap_pending:
            self._reap()
            error, self._close_error = self._close_error, None
        elif self._finalizer.alive:
            stuck, errors = [], {}
            try:
                # a worker that still owes replies is in an env call an interrupt left running (it may
                # never return): it gets _CLOSE_TIMEOUT to finish it, then counts as stuck and is
                # terminated below. Closing the envs may take long (a video written in close()): it
                # is waited for, as the serial backend waits for env.close()
                stuck = self._drain_owed(timeout=_CLOSE_TIMEOUT)
                for w in stuck:  # not waited for again (by _broadcast's drain): terminated below
                    self._owed.pop(w, None)
                live = [w for w, proc in enumerate(self._processes) if proc.is_alive() and w not in stuck]
                message = bytes(ForkingPickler.dumps(("close", None)))
                sent = self._broadcast([(w, message) for w in live])
                self._gather(sent, "close", errors=errors)
                # an env's close() that raised, as the serial backend raises it; else a worker that died
                # closing its envs. Every one is reported: the first raised, the others as notes on it
                ordered = self._close_errors(errors)
                if ordered:
                    error = ordered[0]
                    add_as_notes(error, ordered[1:])
            except EnvError as err:
                if err.phase == "close":  # an env's close() raised (a dead worker has nothing to close)
                    error = err
            except KeyboardInterrupt as interrupt:
                # a Ctrl-C while the workers close their envs (they ignore it): as an env call an interrupt left
                # running, each gets _CLOSE_TIMEOUT to finish (an env writing its video), then is terminated
                # below; every close error, before or during that wait, is a note on the interrupt (the last
                # one, after a second Ctrl-C), as the serial backend's
                raised = interrupt
                try:
                    closing = [w for w, owed in self._owed.items() if owed and w not in stuck]
                    for w in closing:
                        self._owed[w] -= 1  # its close reply, read here (counted again if it does not come)
                    self._gather(closing, "close", timeout=_CLOSE_TIMEOUT, errors=errors)
                except BaseException as again:
                    raised = again
                    raise
                finally:
                    add_as_notes(raised, self._close_errors(errors))
                raise
            finally:
                # stuck in an env call, or interrupted while closing
                for w in sorted({*stuck, *(w for w, owed in self._owed.items() if owed)}):
                    rows = self.slices[w]
                    doing = ("in an env call" if self._started
                             else "making or closing its envs (the construction was cut short)")
                    warnings.warn(
                        f"EnvPool.close(): worker {w} (envs {rows.start}..{rows.stop - 1}) was still {doing} and was "
                        "terminated; its envs may not all be closed", RuntimeWarning, stacklevel=3,
                    )
                    _end(self._processes[w])  # here: the finalizer below waits, unbounded, on workers owing nothing
                self._owed.clear()
                self._close_error = error  # the next close() raises it if a Ctrl-C cuts the reaping short
                self._reap()
                self._close_error = None
        if error is not None:
            raise error

    def _close_errors(self, errors: dict) -> list[EnvError]:
        """``close()``'s errors by worker, in the order they are reported: envs' close errors first, then workers
        that died closing them; not a worker that had exited by itself (after a failed make), nor one still
        closing past the deadline (terminated, with a warning)."""
        kept = {w: err for w, err in errors.items() if err.phase != "close (timed out)"
                and not (err.phase == "worker" and self._processes[w].exitcode == 0)}
        return [err for _, err in sorted(kept.items(), key=lambda item: (item[1].phase != "close", item[0]))]

    def _arm_finalizer(self) -> None:
        """(Re)register the shutdown that reaps the workers and frees the segment, for close() and for a pool
        collected unclosed."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._conns, self._shm, self._owed,
                                           self.slices)

    def _reap(self) -> None:
        """Run the shutdown; a Ctrl-C that cuts it short (joining the exiting workers) leaves it armed, so that
        the next close() (or the pool's collection) reaps them: otherwise they stayed zombies, their pipes open."""
        try:
            self._finalizer()
        except BaseException as err:
            self._arm_finalizer()
            self._reap_pending = True
            pending = "" if self._close_error is None else f" (it then raises {str(self._close_error).splitlines()[0]})"
            add_note(err, f"EnvPool.close() was cut short while its workers exited: close() again finishes it{pending}")
            raise
        self._reap_pending = False
