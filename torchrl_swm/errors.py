"""Errors raised by torchrl_swm, formatted in one place.

Every error that concerns one sub-environment names its index, says what was
expected and what was received, and chains the original exception (``raise
... from err``) so no traceback is lost.
"""

from __future__ import annotations

import contextlib
import re
import sys

import numpy as np

__all__ = [
    "EnvError", "EnvAttributeError", "StepRefusedError", "SpecError", "add_note", "counted", "describe", "check_int",
    "check_indices",
]


def add_note(err: BaseException, note: str) -> None:
    """``err.add_note(note)``, on Python 3.10 too (no ``add_note`` there: the note is kept in ``__notes__``,
    where 3.11's traceback prints it from, without being printed)."""
    if sys.version_info >= (3, 11):
        err.add_note(note)
    else:  # pragma: no cover - exercised by the 3.10 run only
        err.__notes__ = [*getattr(err, "__notes__", ()), note]


def error_text(err: BaseException) -> str:
    """``"Type: message"``, or ``"Type"`` for an error without one (a Ctrl-C's ``KeyboardInterrupt``)."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def counted(n: int, noun: str) -> str:
    """``"1 episode"``, ``"3 episodes"``: a count and its noun, for summaries and messages."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe(value) -> str:
    """A short description of ``value`` for error messages: type, dtype, shape."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__}(dtype={dtype}, shape={tuple(shape)})"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def add_as_notes(error: BaseException, others) -> None:
    """Each of ``others`` as an ``also:`` note on ``error``: its first line, then its own notes (the errors it
    carries), so that none is lost."""
    for other in others:
        for note in [str(other).splitlines()[0], *getattr(other, "__notes__", ())]:
            add_note(error, f"also: {note}")


def _integral(value) -> bool:
    """An int, a numpy integer or a 0-d integer array/tensor; never a bool (``True`` is not an index)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iu"
    if _is_tensor(value):
        torch = sys.modules["torch"]
        return value.ndim == 0 and not value.dtype.is_floating_point and not value.dtype.is_complex \
            and value.dtype is not torch.bool
    return False


def _real(value) -> bool:
    """A Python or numpy int or float; never a bool (``True`` is no radius or frame rate), nor a numpy
    ``timedelta64`` (numpy makes it a signed integer; ``float()`` refuses it)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_, np.timedelta64))


def check_number(value, what: str) -> float:
    """``value`` as a float, refusing anything :func:`_real` does not accept, naming ``what``.

    Raises:
        TypeError: ``value`` is not a real number.
    """
    if not _real(value):
        raise TypeError(f"{what} must be a number, got {describe(value)}")
    return float(value)


def _is_tensor(value) -> bool:
    # torch is not imported here: the process backend's workers import this module and stay free of torch
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def check_int(value, what: str, *, minimum: int | None = None) -> int:
    """``value`` as a Python int, refusing what ``int()`` would silently truncate or reinterpret.

    ``int(2.5)``, ``int(True)`` and ``int("3")`` all succeed; here a float, a bool or a
    string raises, naming ``what``, instead of building 2 envs when 2.5 were asked for.

    Raises:
        TypeError: ``value`` is not an integer.
        ValueError: ``value`` is below ``minimum``.
    """
    if not _integral(value):
        raise TypeError(f"{what}: expected an int, got {describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{what}: expected an int >= {minimum}, got {value}")
    return value


@contextlib.contextmanager
def count_fits(what: str, value: int):
    """Turn the ``MemoryError``/``OverflowError`` of building ``value`` of something into a ``ValueError``
    naming ``what``: ``[x] * 10**30`` raises "cannot fit 'int' into an index-sized integer", which names no
    argument."""
    try:
        yield
    except (MemoryError, OverflowError) as err:
        raise ValueError(
            f"{what}: {value} is more than this process can hold ({type(err).__name__}"
            f"{': ' + str(err) if str(err) else ''}); ask for fewer"
        ) from err


def check_bool(value, what: str, *, allow_none: bool = False) -> bool | None:
    """``value`` as a Python bool, refusing the truthy objects ``bool()`` would accept (``"no"`` is True).

    Raises:
        TypeError: ``value`` is not ``True``/``False`` (or ``None`` where ``allow_none``).
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        expected = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"{what}: expected {expected}, got {describe(value)}")
    return bool(value)


def check_indices(indices, n: int, what: str = "indices") -> list[int]:
    """``indices`` (``None`` = all, one int, or a sequence/1-d array/tensor of ints) as a list of ints in ``[0, n)``;
    a negative index counts from the end, as in Python.

    A boolean mask is refused rather than read as the indices 0 and 1 (``int(True)``);
    the error says to pass ``np.flatnonzero(mask)``.

    Raises:
        TypeError: a bool mask, a float, a string...
        IndexError: an index outside ``[-n, n)``.
    """
    if indices is None:
        return list(range(n))
    if _integral(indices):
        indices = [indices]
    elif isinstance(indices, np.ndarray) or _is_tensor(indices):
        if indices.ndim != 1:
            raise TypeError(f"{what}: expected a 1-d sequence of env indices, got {describe(indices)}")
        indices = indices.tolist()  # a bool or float array gives bools or floats: refused below
    elif isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise TypeError(f"{what}: expected an int or a sequence of ints, got {describe(indices)}")
    indices = list(indices)
    out = []
    for i in indices:
        if not _integral(i):
            if isinstance(i, (bool, np.bool_)):
                raise TypeError(
                    f"{what}: expected env indices (ints), got a boolean mask {describe(indices)}; pass the indices "
                    "of its True entries instead (np.flatnonzero(mask))"
                )
            raise TypeError(f"{what}: expected env indices (ints), got {describe(i)} in {describe(indices)}")
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"{what}: env index {i} out of range for {n} envs (expected -{n} <= index < {n})")
        out.append(i % n)  # a negative index counts from the end, as Python's (and DummyVecEnv's) indexing
    return out


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside this package and
    TorchRL (whose env metaclass calls ``__init__``): the user's line, however deep the warning is raised."""
    import os
    import sys

    packages = tuple(
        os.path.dirname(os.path.abspath(module.__file__)) + os.sep
        for module in (sys.modules[__package__], sys.modules.get("torchrl"))
        if module is not None and getattr(module, "__file__", None)
    )
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(packages):
        frame, level = frame.f_back, level + 1
    return level


_ENV_ERROR_HEAD = re.compile(r"(?:env (\d+)|pool) \((.+?)\): ", re.S)  # the start of an EnvError's text


class EnvError(RuntimeError):
    """A sub-environment failed or produced data that does not fit the pool.

    Attributes:
        env_index: index of the sub-environment in the pool, or ``None`` when
            the error is not tied to one env.
        phase: what the pool was doing: ``"reset"``, ``"step"``, ``"render"``...
    """

    def __init__(self, env_index: int | str | None, phase: str | None = None, message: str | None = None):
        if isinstance(env_index, str) and phase is None and message is None:
            # One preformatted message: how TorchRL's collector workers re-raise an exception
            # class in the main process (``exc_class(text)``); the env and phase are read back from it
            text = env_index
            head = _ENV_ERROR_HEAD.match(text)
            if head is None:
                self.env_index, self.phase, self.message = None, None, text
            else:
                self.env_index = None if head[1] is None else int(head[1])
                self.phase, self.message = head[2], text[head.end():]
            super().__init__(text)
            return
        self.env_index = env_index
        self.phase = phase
        self.message = message
        where = f"env {env_index}" if env_index is not None else "pool"
        super().__init__(f"{where} ({phase}): {message}")

    def __reduce__(self):  # picklable across worker processes
        if self.phase is None:  # rebuilt from one preformatted message
            return (type(self), (self.message,))
        return (type(self), (self.env_index, self.phase, self.message))


class StepRefusedError(EnvError):
    """A step the pool refused before any env moved: rows that must be reset first (their episode ended, or a
    step or reset of theirs raised, or the pool was never reset), or a VectorEnv asked to freeze rows. Unlike a
    step that raised, it leaves every env where it was, so no env has to be reset because of it."""


class EnvAttributeError(EnvError, AttributeError):
    """A sub-environment has no attribute of that name (``pool.get_attr``, ``pool.call``): an
    :class:`EnvError` naming the env that is also an ``AttributeError``, as gymnasium's vector envs raise,
    so ``except AttributeError`` probes work on every backend."""


class SpecError(TypeError):
    """A space, spec or declared key cannot be converted or does not match."""
