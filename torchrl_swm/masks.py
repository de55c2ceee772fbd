"""Per-env masks: TorchRL's ``"_reset"`` and ``"_step"`` keys turned into row indices.

Every env of the package (the pool, its backends, the world-model env) reads
its masks through :func:`mask_rows`, so a mask means the same thing everywhere:
a bool tensor shaped like the done leaf, ``(N, 1)``, True for the rows to act on.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["mask_rows", "row_mask", "row_view", "zero_rewards"]


def row_mask(mask: torch.Tensor, num_envs: int, key: str) -> torch.Tensor:
    """Validate ``mask`` and reduce it to one bool per env, shape ``(num_envs,)``.

    Accepted shapes are ``(N, 1)`` (the done shape TorchRL sends) and ``(N,)``. Any
    other shape is refused, never reduced: a row's envs have no extra dims for a
    ``(N, 2)`` mask to select within (TorchRL's ``SerialEnv`` refuses such masks too).

    Raises:
        TypeError: when the mask is not a bool tensor.
        ValueError: when its shape is neither ``(num_envs, 1)`` nor ``(num_envs,)``.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{key!r} mask: expected a bool torch.Tensor of shape ({num_envs}, 1), got {type(mask).__name__}")
    if mask.dtype is not torch.bool:
        raise TypeError(f"{key!r} mask: expected dtype torch.bool, got {mask.dtype} (shape {tuple(mask.shape)})")
    if mask.ndim == 1 and mask.shape[0] == num_envs:
        return mask
    if mask.ndim == 2 and mask.shape[0] == num_envs and mask.shape[1] == 1:
        return mask.view(num_envs)
    raise ValueError(
        f"{key!r} mask: expected shape ({num_envs}, 1) (or ({num_envs},)), one flag per env, got {tuple(mask.shape)}"
    )


def mask_rows(mask: torch.Tensor | None, num_envs: int, key: str) -> np.ndarray | None:
    """Row indices selected by ``mask``, or ``None`` when every row is selected.

    ``None`` (no mask) selects every row. The result is an int64 numpy array
    (possibly empty) so that backends index their buffers without torch.
    """
    if mask is None:
        return None
    flags = row_mask(mask, num_envs, key).cpu().numpy()
    if flags.all():
        return None
    return np.flatnonzero(flags)


def row_view(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A row mask, ``(N,)`` or TorchRL's done shape ``(N, 1)``, viewed to broadcast against ``t`` (``(N, ...)``)."""
    if mask.ndim == 2 and mask.shape[1] == 1:
        if t.ndim == 2:
            return mask
        mask = mask.view(mask.shape[0])
    return mask.view(mask.shape + (1,) * (t.ndim - mask.ndim))


def zero_rewards(env, next_td):
    """``next_td`` with every reward leaf of ``env`` set to zero, in place: the output of a step that an
    all-False ``"_step"`` skipped. TorchRL's placeholder for it (``EnvBase._skip_tensordict``) copies the
    input's entries, a root ``"reward"`` left by ``td = env.step(td)["next"]`` included, where a frozen row
    reports reward 0."""
    next_td.update(env.full_reward_spec.zero())
    return next_td
