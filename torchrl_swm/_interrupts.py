"""Holding Ctrl-C (SIGINT) back through steps that an interrupt must not cut in half.

A ``KeyboardInterrupt`` raised in the middle of a pipe message, a file move or a subprocess start
leaves something half done (a garbled pipe, a half-moved dataset, an MP4 writer whose ``ffmpeg``
never got a frame; one raised inside a fork's at-fork callbacks is even printed and dropped). These
helpers hold the interrupt and raise it once the step is done. Only the main thread runs Python's
signal handlers and may set them; elsewhere they hold nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["hold_interrupts", "release_interrupts", "interrupts_held", "start_ignoring_interrupts"]


def hold_interrupts():
    """Start holding Ctrl-C. Returns what :func:`release_interrupts` needs (``None``: nothing held)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    return previous, caught


def release_interrupts(held) -> None:
    """Restore the handler :func:`hold_interrupts` replaced and deliver a Ctrl-C that came meanwhile."""
    if held is None:
        return
    previous, caught = held
    signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, caught[0])  # Python's default handler raises KeyboardInterrupt here
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


@contextlib.contextmanager
def interrupts_held():
    """Hold Ctrl-C through the block, then deliver it (``with interrupts_held(): ...``)."""
    held = hold_interrupts()
    try:
        yield
    finally:
        release_interrupts(held)


def start_ignoring_interrupts(proc) -> None:
    """``proc.start()`` for a worker process that ignores Ctrl-C from its first instruction.

    A terminal's Ctrl-C reaches the whole process group. A spawned worker that sets SIGINT to
    ``SIG_IGN`` itself does so only after re-importing the main module and this package (seconds), and
    a Ctrl-C before then killed it with a traceback. A disposition of ``SIG_IGN`` survives ``exec``, so
    the worker starts with it; this process blocks SIGINT meanwhile, so that a Ctrl-C sent then stays
    pending and is raised here once the worker has started (Linux never discards a blocked signal).
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        proc.start()
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # starting it unblocks SIGINT in this thread: start it first
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a Ctrl-C held meanwhile is raised here
