"""Learned world models as batched TorchRL environments.

* :class:`WorldModelEnv`: the env (``batch_size=[num_envs]``, one model call per step).
* :func:`make_world_model_env`: the env plus the adapter transforms, as a ``TransformedEnv``
  (:class:`WorldModelTransformedEnv`).
* :mod:`.transforms`: :class:`ActionAdapter`, :class:`RewardAdapter`, :class:`TerminalAdapter`,
  :class:`ObservationDecoder`, :class:`RowStepCounter` (the time limit: TorchRL's ``StepCounter``,
  with rows frozen by ``"_step"`` keeping their count).
* :mod:`.adapters`: calling conventions and return forms.
"""

from .adapters import AdapterError, ReturnFormError
from .env import WorldModelEnv
from .transforms import (
    ActionAdapter,
    ObservationDecoder,
    RewardAdapter,
    RowStepCounter,
    TerminalAdapter,
    WorldModelTransformedEnv,
    make_world_model_env,
)

__all__ = [
    "WorldModelEnv",
    "make_world_model_env",
    "WorldModelTransformedEnv",
    "ActionAdapter",
    "RewardAdapter",
    "TerminalAdapter",
    "ObservationDecoder",
    "RowStepCounter",
    "AdapterError",
    "ReturnFormError",
]
