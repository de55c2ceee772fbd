"""The worker process of the process backend: a serial backend behind a pipe.

Kept free of torch and torchrl (see :mod:`.rows`): a spawned worker imports
numpy, gymnasium and cloudpickle only, so it starts in well under a second
plus the envs' own import time.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from multiprocessing.shared_memory import SharedMemory

import cloudpickle
import numpy as np

from ..errors import EnvError, error_text
from .rows import env_action_list

__all__ = ["worker_main", "batch_scheduling", "REPLY_OK", "REPLY_ERROR"]

REPLY_OK = "ok"
REPLY_ERROR = "error"
_OK_NONE = bytes(ForkingPickler.dumps((REPLY_OK, None)))  # the reply to every step and reset (but frames to resize)


def _encode_reply(status: str, value) -> bytes:
    # cloudpickle, as the commands: objects of classes defined in the user's script come back as
    # the caller's own classes (the standard pickler refers to them by a name the parent cannot use)
    return _OK_NONE if status is REPLY_OK and value is None else cloudpickle.dumps((status, value))


def _reply(conn, status: str, value) -> None:
    conn.send_bytes(_encode_reply(status, value))


def _unpicklable_reply(command: str, args, reply, first: int, err: Exception) -> EnvError:
    """The error for a ``call``/``get_attr`` value that cannot travel back: it names the env that returned it."""
    index = None
    rows = args[0] if isinstance(args, tuple) and args and isinstance(args[0], list) else None
    if rows is not None and isinstance(reply, list):
        for j, value in zip(rows, reply):
            try:
                cloudpickle.dumps(value)
            except Exception:
                index = first + j
                break
    return EnvError(
        index, command,
        f"the value it returned cannot be pickled to send back to the pool ({error_text(err)}); the "
        "process backend needs picklable attribute and call() values (the serial backend does not)",
    )


def _ignore_interrupt(signum, frame) -> None:
    """The worker's SIGINT handler: the pool's process handles Ctrl-C (see worker_main)."""


class _Terminated(SystemExit):
    """A SIGTERM: the worker leaves its command loop and closes its envs, then exits with 128 + SIGTERM."""

    ends_the_worker = True  # not an env's own error, even inside its close() (see close_envs)


def _terminate(signum, frame) -> None:
    """The worker's SIGTERM handler: the envs are closed on the way out (a simulator an env owns must not
    outlive it, as after the pool's end); a second SIGTERM, as a stuck close gets, kills as by default."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise _Terminated(128 + signal.SIGTERM)


def _default_interrupt() -> None:
    """In a child forked from a worker: Ctrl-C raises KeyboardInterrupt again and SIGTERM ends it, as in any
    Python process."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.siginterrupt(signal.SIGINT, True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def worker_main(conn, payload: bytes, first: int, pixels: bool, inherited_fds: Sequence[int] = ()) -> None:
    """Worker main loop: build the envs, then serve commands until "close" or EOF.

    ``inherited_fds``: the pool's pipe ends a forked worker inherited, closed first (see ``ProcessBackend``)."""
    for fd in inherited_fds:
        os.close(fd)
    # a terminal's Ctrl-C reaches the whole process group: the pool's process alone handles it (it holds
    # the interrupt through a message and drains the replies it left unread); a worker killed by it here
    # would break a pool the user means to keep using. First thing: the window before it (spawn's import of
    # the main module and this package) cannot be closed from the parent without losing its own Ctrl-C.
    # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored in every program an env
    # starts (a simulator or server it stops with SIGINT would never stop), a handler is reset in them. It
    # restarts the system calls it interrupts (an env's blocking read in C would fail, as SIG_IGN never made
    # it), and a child the env forks without exec gets Python's default back.
    signal.signal(signal.SIGINT, _ignore_interrupt)
    if hasattr(signal, "siginterrupt"):  # POSIX only, as fork
        signal.siginterrupt(signal.SIGINT, False)
        os.register_at_fork(after_in_child=_default_interrupt)
    from .serial import SerialBackend

    backend = shm = None
    signal.signal(signal.SIGTERM, _terminate)  # SIGTERM's default ends the worker without closing its envs
    batch_scheduling()
    # everything imported so far (a spawned worker runs the user's main module again: torch, torchrl, Ray...)
    # stays alive until the worker exits: frozen, the collector never traverses it again. The interpreter's
    # last collection at exit traversed it all: a 2-worker pool's close() took 1.7-2.9 s (0.14 s frozen), up
    # to 8 s in a busy TorchRL collector worker, whose shutdown() then terminated it. The envs' objects are
    # not frozen: collected as in any process
    gc.freeze()

    action_view = None
    kind = None
    try:
        env_fns = cloudpickle.loads(payload)
        backend = SerialBackend(env_fns, first=first, pixels=pixels)
        _reply(conn, REPLY_OK, (backend.observation_space, backend.action_space))
    except _Terminated:  # the pool reads the exit code; make_envs closed the envs of a make it cut short
        if backend is not None:  # made, cut in its reply
            try:
                backend.close(interrupts_as_errors=True)
            except Exception as err:  # no pool to report it to: the worker's stderr says it
                print(f"torchrl_swm pool worker (envs from {first}): closing the envs after a SIGTERM failed: "
                      f"{error_text(err)}", file=sys.stderr, flush=True)
        raise
    except BaseException as err:  # report, then exit: the pool raises in the main process
        _reply(conn, REPLY_ERROR, _error_payload(err))
        return
    try:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):  # the pool is gone: exit, never orphan
                break
            try:
                # unpickled here, not by recv(): a command that cannot be unpickled (a class
                # this process cannot import...) is answered with an error, and the loop goes on
                try:
                    command, args = ForkingPickler.loads(message)
                except Exception as err:
                    raise EnvError(
                        None, "worker", f"a command cannot be unpickled in the worker: {error_text(err)}"
                    ) from err
                if command == "step":
                    rows = args
                    local = slice(first, first + len(backend)) if rows is None else first + rows
                    actions = env_action_list(kind, action_view[local])
                    reply = backend.step(actions, rows)  # None, unless frames of another size (image_shape=)
                elif command == "reset":
                    reply = backend.reset(*args)
                elif command == "probe":
                    reply = backend.probe(*args)
                elif command == "attach":
                    shm_name, layout, info_schema, frame_key, any_frame_size, kind = args
                    # spawned workers share the pool's resource tracker, which unlinks
                    # the segment once, when the pool frees it
                    shm = SharedMemory(name=shm_name)
                    arrays = layout.views(np.ndarray((layout.nbytes,), dtype=np.uint8, buffer=shm.buf))
                    backend.attach(layout, arrays, info_schema, frame_key, any_frame_size)
                    action_view = arrays[("_action",)]
                    reply = None
                elif command == "call":
                    reply = backend.call(*args)
                elif command == "get_attr":
                    reply = backend.get_attr(*args)
                elif command == "is_wrapped":
                    reply = backend.is_wrapped(*args)
                elif command == "set_attr":
                    reply = backend.set_attr(*args)
                elif command == "close":
                    try:
                        backend.close(interrupts_as_errors=True)  # an env's own SystemExit: its close error
                    except _Terminated:
                        raise  # not an env's error (close_envs closed the other envs): the worker exits with 143
                    except BaseException as err:  # reported, and the worker still exits
                        _reply(conn, REPLY_ERROR, _error_payload(err))
                    else:
                        _reply(conn, REPLY_OK, None)
                    break
                else:
                    raise ValueError(f"unknown command {command!r}")
                try:
                    payload = _encode_reply(REPLY_OK, reply)
                except Exception as err:
                    raise _unpicklable_reply(command, args, reply, first, err) from err
                conn.send_bytes(payload)
            except _Terminated:
                raise  # out of the loop: the envs are closed below
            except BaseException as err:
                try:
                    _reply(conn, REPLY_ERROR, _error_payload(err))
                except OSError:  # the pool is gone (a reply found the pipe broken): exit, as at EOF
                    break
    finally:
        if backend is not None and backend.envs:
            # the pool's process died without a "close" (killed, a Ray actor ended): close the envs anyway, as
            # gymnasium's workers do, so the processes an env owns (a simulator, a renderer) end with it
            try:
                backend.close(interrupts_as_errors=True)
            except BaseException as err:  # no pool left to report it to: the worker's stderr says it
                print(f"torchrl_swm pool worker (envs from {first}): closing the envs after the pool's process "
                      f"ended failed: {error_text(err)}", file=sys.stderr, flush=True)
        action_view = backend = None
        if shm is not None:
            shm.close()


def batch_scheduling() -> bool:
    """Run this process under Linux's ``SCHED_BATCH`` policy (CPU-bound, non-interactive work); returns
    whether it could.

    A worker woken by its command must not preempt the pool's process before that process has sent the
    other workers theirs: on 2 cores that preemption held one worker's command back by ~1.4 ms on one
    broadcast in ten (a 4 ms step then took ~5 ms). A ``SCHED_BATCH`` task keeps its full share of the CPU
    (same weight as its nice value gives) but never preempts another task when it wakes up. Elsewhere
    (no ``SCHED_BATCH``, or a sandbox that refuses it) the worker keeps the default policy."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def _error_payload(err: BaseException) -> tuple:
    return (
        getattr(err, "env_index", None),
        getattr(err, "phase", "worker"),
        err.message if isinstance(err, EnvError) else error_text(err),
        "".join(traceback.format_exception(err)),
        isinstance(err, AttributeError),  # a missing attribute (get_attr, call): EnvAttributeError, as serially
        _pickled_cause(err),
        isinstance(err, EnvError),  # else the pool's own check raised it (a factory returning no env)
        list(getattr(err, "__notes__", ())),  # e.g. the other envs' close errors
    )


def _pickled_cause(err: BaseException) -> bytes | None:
    """The env's own exception (what an :class:`EnvError` wraps, or ``err`` itself), pickled so the pool's
    process can chain it as the serial backend does; ``None`` when there is none or it cannot be pickled
    (its traceback travels as text either way)."""
    cause = err.__cause__ if isinstance(err, EnvError) else err
    if cause is None:
        return None
    try:
        return cloudpickle.dumps(cause)
    except Exception:
        return None
