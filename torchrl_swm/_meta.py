"""The metaclass of the package's TorchRL envs: TorchRL's, refusing ``auto_reset=True``.

TorchRL's env metaclass takes ``auto_reset=True`` out of the constructor's arguments and wraps
the env in ``AutoResetEnv``, which assumes the env resets finished rows inside ``step``. The
package's envs never do (``step_and_maybe_reset``, rollouts and collectors reset them, with exact
terminal observations), so the wrap would silently record NaN terminal observations and never
reset a finished row: refuse it instead.
"""

from __future__ import annotations

from torchrl.envs import EnvBase

__all__ = ["NoAutoResetMeta"]


class NoAutoResetMeta(type(EnvBase)):
    """TorchRL's ``EnvBase`` metaclass, with a clear error for ``auto_reset=True``."""

    def __call__(cls, *args, **kwargs):
        if kwargs.get("auto_reset", False):
            raise TypeError(
                f"{cls.__name__}(auto_reset=True): TorchRL's auto_reset is for envs that reset finished rows "
                f"inside step(), which {cls.__name__} never does; its finished rows are reset by "
                "step_and_maybe_reset, rollout() and collectors, with exact terminal observations. "
                "Drop auto_reset=."
            )
        return super().__call__(*args, **kwargs)
