"""Holding Ctrl-C (SIGINT) back through steps that an interrupt must not cut in half.

A ``KeyboardInterrupt`` raised in the middle of a pipe message, a file move or a video file's start
or end leaves something half done (a garbled pipe, a half-moved dataset, an MP4 writer whose ``ffmpeg``
never got a frame; one raised inside a fork's at-fork callbacks is even printed and dropped). These
helpers hold the interrupt and raise it once the step is done. Only the main thread runs Python's
signal handlers and may set them; elsewhere they hold nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["hold_interrupts", "release_interrupts", "interrupts_held", "through_interrupts"]


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


def through_interrupts(cleanup) -> None:
    """``cleanup()``, run again when a Ctrl-C cuts it short, then that Ctrl-C raised.

    For a ``finally`` after an interrupt, where a burst of Ctrl-C can land before ``cleanup`` holds
    them itself (:func:`interrupts_held`). ``cleanup`` must be safe to run again after a cut.
    """
    interrupted = None
    while True:
        try:
            cleanup()
            break
        except KeyboardInterrupt as err:
            interrupted = err
    if interrupted is not None:
        raise interrupted
