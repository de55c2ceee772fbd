"""torchrl_swm: batched gymnasium pools and world-model environments for TorchRL.

Public API (imported lazily, so ``import torchrl_swm`` stays cheap):

* :class:`EnvPool`: N gymnasium envs as one TorchRL env with batch ``[N]``.
* :class:`WorldModelEnv`, :func:`make_world_model_env`: a learned model as a batched TorchRL env
  (:class:`WorldModelTransformedEnv`: the ``TransformedEnv`` that keeps rows frozen by ``"_step"``).
* :func:`make_env`, :func:`register_backend`, :func:`list_backends` (:func:`backend_aliases`,
  :func:`unregister_backend`): one factory for both.
* :func:`to_gymnasium`, :func:`to_sb3_vec_env`, :func:`register_gymnasium_env`: export.
* :class:`World`, :func:`load_dataset`, :class:`History`: evaluation and datasets.
* :class:`FrameSkip`: TorchRL's frame skip, stopping each row at the end of its episode.
* :func:`raise_on_worker_failure`: iterate a multi-process collector so a failed worker always raises.
"""

from __future__ import annotations

import importlib

from .errors import EnvAttributeError, EnvError, SpecError, StepRefusedError

_LAZY = {
    "EnvPool": "torchrl_swm.pool",
    "WorldModelEnv": "torchrl_swm.world_model",
    "make_world_model_env": "torchrl_swm.world_model",
    "WorldModelTransformedEnv": "torchrl_swm.world_model",
    "make_env": "torchrl_swm.factory",
    "register_backend": "torchrl_swm.factory",
    "list_backends": "torchrl_swm.factory",
    "backend_aliases": "torchrl_swm.factory",
    "unregister_backend": "torchrl_swm.factory",
    "to_gymnasium": "torchrl_swm.export",
    "to_sb3_vec_env": "torchrl_swm.export",
    "register_gymnasium_env": "torchrl_swm.export",
    "World": "torchrl_swm.world",
    "load_dataset": "torchrl_swm.data",
    "History": "torchrl_swm.transforms",
    "FrameSkip": "torchrl_swm.transforms",
    "raise_on_worker_failure": "torchrl_swm.collectors",
}

__all__ = ["EnvError", "EnvAttributeError", "StepRefusedError", "SpecError", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchrl_swm' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except AttributeError as err:  # keep a failing import from reading as "no such name"
        raise ImportError(f"torchrl_swm.{name}: importing {module} failed: {err}") from err
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
