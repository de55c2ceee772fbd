"""Errors raised by torchrl_swm, formatted in one place.

Every error that concerns one sub-environment names its index, says what was
expected and what was received, and chains the original exception (``raise
... from err``) so no traceback is lost.
"""

from __future__ import annotations

__all__ = ["EnvError", "EnvAttributeError", "SpecError", "describe"]


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
            # class in the main process (``exc_class(text)``).
            self.env_index, self.phase, self.message = None, None, env_index
            super().__init__(env_index)
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


class EnvAttributeError(EnvError, AttributeError):
    """A sub-environment has no attribute of that name (``pool.get_attr``, ``pool.call``): an
    :class:`EnvError` naming the env that is also an ``AttributeError``, as gymnasium's vector envs raise,
    so ``except AttributeError`` probes work on every backend."""


class SpecError(TypeError):
    """A space, spec or declared key cannot be converted or does not match."""
