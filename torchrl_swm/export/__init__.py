"""TorchRL envs as gymnasium envs, gymnasium vector envs and Stable-Baselines3 ``VecEnv``.

* :func:`to_gymnasium`: ``batch_size == [N]`` → :class:`~.vector_env.TorchRLVectorEnv`
  (a ``gymnasium.vector.VectorEnv`` with exact NEXT_STEP / SAME_STEP / DISABLED
  autoreset); ``batch_size == []`` → :class:`~.gymnasium_env.TorchRLGymEnv`
  (a ``gymnasium.Env`` that passes ``check_env``).
* :func:`to_sb3_vec_env`: an SB3 ``VecEnv`` (``stable-baselines3`` is an optional extra).
* :func:`register_gymnasium_env`: ``gymnasium.make(id)`` and ``gymnasium.make_vec(id, num_envs=N)``.

Every conversion between TorchRL data and gymnasium data happens in
:mod:`torchrl_swm.export._core`.
"""

from __future__ import annotations

from torchrl.envs import EnvBase

from ..errors import check_bool
from .gymnasium_env import TorchRLGymEnv
from .registration import register_gymnasium_env
from .sb3 import to_sb3_vec_env
from .vector_env import TorchRLVectorEnv

__all__ = ["to_gymnasium", "to_sb3_vec_env", "register_gymnasium_env", "TorchRLGymEnv", "TorchRLVectorEnv"]


def to_gymnasium(env: EnvBase, *, autoreset_mode="next_step", numpy: bool = True, observation_keys=None,
                 info_keys=None):
    """Export a TorchRL env to gymnasium.

    Args:
        env: any TorchRL env: an ``EnvPool``, a world-model env, a ``TransformedEnv``
            of either, or another TorchRL env with ``batch_size`` ``[]`` or ``[N]``.
            The export owns it (closing the export closes the env).

    Keyword Args:
        autoreset_mode: for batched envs, ``"next_step"`` (gymnasium's default),
            ``"same_step"`` or ``"disabled"``; written to ``metadata["autoreset_mode"]``.
            Ignored for unbatched envs, which never reset themselves.
        numpy: numpy outputs (default), or torch tensors on the env's device
            (``False``; then actions may be torch tensors too and no data leaves
            the device except the done flags).
        observation_keys: ``None`` (every observation leaf except the infos and
            the bookkeeping of ``StepCounter``, ``RewardSum`` and ``InitTracker``
            transforms: a ``Box`` when there is one, else a ``Dict``; an ``EnvPool`` with a
            ``Dict`` observation space keeps its ``Dict`` while that leaf is one of
            its entries, as gymnasium's ``SyncVectorEnv`` does), one key (a string
            or a tuple for a nested key: that leaf's space), or a list of keys (a
            ``Dict``).
        info_keys: ``None`` (the leaves under ``"info"`` and ``"episode_seed"``),
            one key (a string or a tuple for a nested key), or a list of keys,
            ``[]`` for none. Leaves chosen here leave the default observation.

    Spaces are what gymnasium's own ``SyncVectorEnv`` over the same envs shows:
    a leaf or action of an ``EnvPool`` at the base whose spec no transform
    changed keeps the pool's gymnasium space (``Discrete(n, start)``, with its
    values ``start..start+n-1``); other leaves get the space of their TorchRL
    spec (categorical specs hold indices from 0).

    Returns:
        a :class:`TorchRLVectorEnv` (batched env) or a :class:`TorchRLGymEnv`.

    Examples:
        >>> from torchrl_swm import EnvPool, to_gymnasium
        >>> envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=8))
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, envs.single_action_space
        ((8, 4), Discrete(2))
        >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        >>> envs.close()
    """
    check_bool(numpy, "to_gymnasium: numpy")  # "no" would give numpy
    if not isinstance(env, EnvBase):
        raise TypeError(f"to_gymnasium: expected a TorchRL EnvBase, got {type(env).__module__}.{type(env).__name__}")
    if len(env.batch_size) == 0:
        return TorchRLGymEnv(env, numpy=numpy, observation_keys=observation_keys, info_keys=info_keys)
    if len(env.batch_size) == 1:
        return TorchRLVectorEnv(env, autoreset_mode=autoreset_mode, numpy=numpy, observation_keys=observation_keys,
                                info_keys=info_keys)
    from ..errors import SpecError

    raise SpecError(
        f"to_gymnasium: env has batch_size {list(env.batch_size)}; the export supports [] (a gymnasium.Env) or [N] "
        "(a gymnasium VectorEnv). Flatten the batch first (e.g. one EnvPool of N*M envs)."
    )
