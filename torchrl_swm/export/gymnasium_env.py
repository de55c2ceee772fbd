"""An unbatched TorchRL env (``batch_size == []``) as a ``gymnasium.Env``.

It passes ``gymnasium.utils.env_checker.check_env`` without warnings when the
env's spaces do (bounded, normalised action boxes): seeding goes through
``super().reset(seed=...)``, rewards are Python floats, done flags Python bools,
and every call returns fresh arrays.

The same class also serves ``gymnasium.make`` for a *batched* env factory
(``squeeze_batch=True``): the factory is built with one env and its batch dim of
1 is dropped on the way out and added on the way in.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from ..errors import check_bool
from ._core import Layout, nest, set_leaf, step_after_close_error, to_host, torch_copies, traits
from .seeding import reset_kwargs

__all__ = ["TorchRLGymEnv"]


class TorchRLGymEnv(gym.Env):
    """A TorchRL env with ``batch_size == []`` as a ``gymnasium.Env``.

    Prefer :func:`torchrl_swm.to_gymnasium`, which picks this class for unbatched envs.

    Args:
        env: the TorchRL env. The export owns it: :meth:`close` closes it.

    Keyword Args:
        numpy: return numpy observations and infos (default); torch tensors on the
            env's device with ``False`` (rewards and flags stay Python scalars).
        observation_keys, info_keys: see :func:`torchrl_swm.to_gymnasium`.
        squeeze_batch: accept an env with ``batch_size == [1]`` and expose its only row.

    Example:
        A TorchRL env of one (``batch_size == []``), for single-env gymnasium code:

        >>> from gymnasium.utils.env_checker import check_env
        >>> from torchrl.envs import GymEnv, StepCounter, TransformedEnv
        >>> from torchrl_swm import to_gymnasium
        >>> env = to_gymnasium(TransformedEnv(GymEnv("MountainCarContinuous-v0"), StepCounter(max_steps=5)))
        >>> env, env.observation_space.shape, env.action_space
        (TorchRLGymEnv(TransformedEnv), (2,), Box(-1.0, 1.0, (1,), float32))
        >>> obs, info = env.reset(seed=0)
        >>> for _ in range(5):
        ...     obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> type(reward).__name__, terminated, truncated              # the StepCounter's limit truncates
        ('float', False, True)
        >>> check_env(env, skip_render_check=True)                    # gymnasium's own checker passes
        >>> env.close()
    """

    metadata = {"render_modes": []}

    def __init__(self, env: EnvBase, *, numpy: bool = True, observation_keys=None, info_keys=None,
                 squeeze_batch: bool = False):
        if not isinstance(env, EnvBase):
            raise TypeError(f"to_gymnasium: expected a TorchRL EnvBase, got {type(env).__name__}")
        expected = (1,) if squeeze_batch else ()
        if tuple(env.batch_size) != expected:
            raise ValueError(
                f"TorchRLGymEnv: expected an env with batch_size {list(expected)}, got {list(env.batch_size)}"
                + ("" if squeeze_batch else "; use to_gymnasium(env), which returns a VectorEnv for batch_size [N]")
            )
        self.env = env
        self._closed = False
        self._unreset_since_close = False  # closed, and no reset has succeeded since: step() is refused
        self.layout = Layout(env, observation_keys=observation_keys, info_keys=info_keys)
        self.traits = traits(env)
        self.numpy = check_bool(numpy, "TorchRLGymEnv: numpy")
        self._squeeze = squeeze_batch
        self._batch = expected
        self.observation_space = self.layout.single_observation_space
        self.action_space = self.layout.single_action_space
        self.render_mode = None
        pool = self.traits.pool
        if pool is not None:
            sub = pool.env_metadata
            self.metadata = {k: v for k, v in dict(sub).items() if k in ("render_modes", "render_fps")}
            self.render_mode = pool.render_mode
        self._root: TensorDictBase | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # a closed env this reset reopens (a WorldModelEnv; TorchRL's batched envs, whose set_seed restarts them
        # too): open from here, so that close() closes what the reset restarts even if it fails; step() stays
        # refused until a reset succeeds
        self._closed = False
        super().reset(seed=seed)
        kwargs = reset_kwargs(self.env, self.traits, seed, options, 1, "reset")
        with torch.no_grad():
            root = self.env.reset(**kwargs)
            self._root = root
            layout = self.layout
            values = [*layout.observations(root), *layout.infos(root)]
            values = to_host(values) if self.numpy else torch_copies(values)
        n_obs = len(layout.obs_leaves)
        self._unreset_since_close = False
        return self._observation(values[:n_obs]), self._info(values[n_obs:])

    def step(self, action):
        if self._unreset_since_close:
            raise step_after_close_error("TorchRLGymEnv.step()", self.env)
        if self._root is None:
            raise RuntimeError("TorchRLGymEnv.step() was called before reset(); call reset() first")
        layout = self.layout
        with torch.no_grad():
            tensor = layout.encode_action(action, ())
            if self._squeeze:
                tensor = tensor.unsqueeze(0)
            root = self._root
            set_leaf(root, layout.action_key, tensor)
            td = self.env.step(root)
            nxt = td.get("next")
            self._root = self.env.step_mdp(td)
            leaves = [*layout.observations(nxt), *layout.infos(nxt)]
            flags = list(layout.flags(nxt, self._batch))
            if self.numpy:
                host = to_host([*leaves, *flags])
                leaves, flags = host[: len(leaves)], host[len(leaves) :]
            else:
                leaves = torch_copies(leaves)
                flags = to_host(flags)
        n_obs = len(layout.obs_leaves)
        reward = float(flags[0].reshape(-1)[0])
        terminated = bool(flags[1].reshape(-1)[0])
        truncated = bool(flags[2].reshape(-1)[0])
        return self._observation(leaves[:n_obs]), reward, terminated, truncated, self._info(leaves[n_obs:])

    def _row(self, value, keep_array: bool = False):
        if self._squeeze:
            value = value[0, ...]  # a 0-d array (not a scalar) for a leaf of shape ()
        if isinstance(value, np.ndarray) and value.ndim == 0 and not keep_array:
            return value[()]  # a numpy scalar, as gymnasium's Discrete observations are (a Box keeps a 0-d array)
        return value

    def _observation(self, values):
        values = [self._row(v, keep_array=box) for v, box in zip(values, self.layout.obs_is_box)]
        return values[0] if self.layout.single_leaf else nest(self.layout.obs_leaves, values)

    def _info(self, values) -> dict:
        # a leaf with a presence mask appears only when the env reported it, as in gymnasium
        leaves, kept = [], []
        for leaf, value, mask in self.layout.info_entries(values):
            if mask is not None and not bool(self._row(mask)):
                continue
            value = self._row(value)
            leaves.append(leaf)
            kept.append(value.item() if isinstance(value, np.generic) else value)
        return nest(leaves, kept)

    def render(self):
        """The frame of the env (``EnvPool`` at the base only)."""
        pool = self.traits.pool
        if pool is None:
            raise NotImplementedError(f"render() reaches the sub-env of an EnvPool; {type(self.env).__name__} has none")
        return pool.call("render")[0]

    def close(self):
        if not self._closed:  # the wrapped env's is_closed cannot be trusted: a plain EnvBase starts "closed"
            self._closed = self._unreset_since_close = True
            self.env.close(raise_if_closed=False)

    def __repr__(self) -> str:
        name = self.spec.id if self.spec is not None else type(self.env).__name__
        return f"TorchRLGymEnv({name})"
