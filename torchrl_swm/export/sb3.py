"""A batched TorchRL env as a Stable-Baselines3 ``VecEnv``.

SB3's ``VecEnv`` contract is gymnasium's SAME_STEP autoreset plus a list of
per-env info dicts, so this adapter drives a :class:`~.vector_env.TorchRLVectorEnv`
in SAME_STEP mode and reshapes its outputs:

* ``step_wait`` returns ``(obs, rewards float32 (N,), dones bool (N,), infos)``,
  ``infos`` a list of ``N`` dicts. Each holds that env's info values and
  ``"TimeLimit.truncated"`` (truncated and not terminated); a finished env's dict
  holds its final step's info and ``"terminal_observation"``, and its reset info
  goes to ``reset_infos[i]``, exactly as SB3's ``DummyVecEnv`` does.
* ``seed(s)`` and ``set_options(...)`` apply at the next ``reset()``; per-env seeds
  may be ``None`` (that env is not reseeded), as on ``DummyVecEnv``. Options are one
  dict for every env (a list of different dicts is refused by ``set_options``).
* ``env_method``, ``get_attr``, ``set_attr`` and ``env_is_wrapped`` reach the
  sub-envs of an :class:`~torchrl_swm.pool.EnvPool` (``get_attr`` looks through
  gymnasium wrappers like ``DummyVecEnv``); other envs have no sub-envs and raise
  ``AttributeError`` (``render_mode`` reads ``None``).

``stable-baselines3`` is an optional dependency (``pip install torchrl-swm[sb3]``),
imported when :func:`to_sb3_vec_env` is first called.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
from gymnasium.utils.env_checker import data_equivalence  # option values may be arrays
from torchrl.envs import EnvBase

from ..errors import check_indices, describe
from ..pool.infos import is_vector_mask
from ._core import attribute_errors as _attribute_errors

__all__ = ["to_sb3_vec_env"]


def _require_sb3():
    try:
        from stable_baselines3.common.vec_env import VecEnv
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "to_sb3_vec_env needs stable-baselines3, an optional extra of torchrl-swm: "
            "pip install 'torchrl-swm[sb3]' (or pip install stable-baselines3)"
        ) from err
    return VecEnv


def to_sb3_vec_env(env: EnvBase, *, observation_keys=None, info_keys=None):
    """Export a batched TorchRL env (``batch_size == [N]``) as an SB3 ``VecEnv``.

    Args:
        env: the TorchRL env; the ``VecEnv`` owns it (``close()`` closes it).
        observation_keys, info_keys: as :func:`torchrl_swm.to_gymnasium`.

    Raises:
        ImportError: stable-baselines3 is not installed.

    Examples:
        >>> from stable_baselines3 import PPO
        >>> from torchrl_swm import EnvPool, to_sb3_vec_env
        >>> venv = to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=8))
        >>> model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, device="cpu").learn(256)
        >>> model.num_timesteps
        256
        >>> venv.close()
    """
    return _sb3_class()(env, observation_keys=observation_keys, info_keys=info_keys)


@functools.cache
def _sb3_class():
    VecEnv = _require_sb3()
    from .vector_env import TorchRLVectorEnv

    class TorchRLSB3VecEnv(VecEnv):
        """See :mod:`torchrl_swm.export.sb3`."""

        def __init__(self, env: EnvBase, *, observation_keys=None, info_keys=None):
            if not isinstance(env, EnvBase) or len(env.batch_size) != 1:
                raise ValueError(
                    "to_sb3_vec_env: expected a TorchRL env with batch_size [N], got "
                    + (f"batch_size {list(env.batch_size)}" if isinstance(env, EnvBase) else type(env).__name__)
                )
            # SB3 ignores a Discrete space's start (its policies emit 0..n-1, it one-hot encodes n
            # classes): its spaces start at 0, and values are the indices the pool keeps
            self.venv = TorchRLVectorEnv(
                env, autoreset_mode="same_step", observation_keys=observation_keys, info_keys=info_keys,
                index_spaces=True,
            )
            self.venv._step_call = "TorchRLSB3VecEnv.step()"
            self.venv._masked_reset_call = "TorchRLSB3VecEnv.reset() with set_options({'reset_mask': ...})"
            # SB3 keeps the options of a refused reset: the mask must go before a reset of every env
            self.venv._reopen_advice = "set_options(None), then reset() every env, to reopen the env it wraps"
            self._actions = None
            super().__init__(self.venv.num_envs, self.venv.single_observation_space, self.venv.single_action_space)
            # as DummyVecEnv, the envs' own render modes and frame rate (VecVideoRecorder reads render_fps)
            own = {key: self.venv.metadata[key] for key in ("render_modes", "render_fps") if key in self.venv.metadata}
            self.metadata = {**self.metadata, **own}

        @property
        def env(self) -> EnvBase:
            """The wrapped TorchRL env."""
            return self.venv.env

        # -- stepping ------------------------------------------------------------------
        def set_options(self, options=None) -> None:
            n = self.num_envs
            if isinstance(options, (list, tuple)):
                if len(options) != n or any(o is not None and not isinstance(o, Mapping) for o in options):
                    raise TypeError(
                        f"set_options: expected a dict, or a list of {n} dicts (or None), one per env; got "
                        f"{type(options).__name__} of {len(options)}: {[type(o).__name__ for o in options]}"
                    )
                options = [{} if o is None else o for o in options]
            elif options is not None and not isinstance(options, Mapping):
                raise TypeError(f"set_options: expected a dict or a list of {n} dicts, got {describe(options)}")
            super().set_options(dict(options) if isinstance(options, Mapping) else options)
            given = self._options
            if any(not data_equivalence(o, given[0], exact=True) for o in given[1:]):
                self._reset_options()  # refused: nothing is kept for the next reset
                raise ValueError(
                    f"set_options: expected one options dict for every env (the export passes one dict to all of "
                    f"them, as a gymnasium VectorEnv takes it), got different ones per env: {given!r}"
                )

        def reset(self):
            seeds = self._seeds
            # per env an int or None (that env is not reseeded), as DummyVecEnv passes them
            seed = None if all(s is None for s in seeds) else list(seeds)
            if (seed is not None and self.venv.traits.pool is None and None not in seed
                    and seed == list(range(seed[0], seed[0] + len(seed)))):
                seed = seed[0]  # VecEnv.seed(s)'s [s, s+1, ...] for an env seeded as a whole: env.set_seed(s)
            options = self._options
            if all(not o for o in options):
                options = None
            else:
                options = dict(options[0])
            obs, infos = self.venv.reset(seed=seed, options=options)
            self.reset_infos = _rows(infos, self.num_envs)
            self._reset_seeds()
            self._reset_options()
            return obs

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = actions

        def step_wait(self):
            if self._actions is None:
                raise RuntimeError(
                    "TorchRLSB3VecEnv.step_wait() was called without step_async(actions): each step_wait() needs "
                    "its own step_async(actions) first (or call step(actions), which does both)"
                )
            actions, self._actions = self._actions, None
            obs, rewards, terminated, truncated, infos = self.venv.step(actions)
            dones = terminated | truncated
            per_env = _rows(infos, self.num_envs)
            if dones.any():
                final_obs, final_info = infos["final_obs"], infos["final_info"]
                for i in np.flatnonzero(dones).tolist():
                    self.reset_infos[i] = per_env[i]  # after a SAME_STEP reset: the reset info
                    per_env[i] = _row(final_info, i)  # the step's own info
                    per_env[i]["terminal_observation"] = final_obs[i]
            for info, cut in zip(per_env, (truncated & ~terminated).tolist()):
                info["TimeLimit.truncated"] = cut
            return obs, rewards.astype(np.float32, copy=False), dones, per_env

        def close(self) -> None:
            self.venv.close()

        # -- sub-envs ---------------------------------------------------------------------
        def _pool(self, what: str):
            return self.venv._pool(what)

        def _get_indices(self, indices) -> list[int]:
            # SB3's passes a bool mask or floats through (as int(True) = 1): refuse them, naming the problem
            return check_indices(indices, self.num_envs)

        def get_attr(self, attr_name: str, indices=None) -> list:
            if self.venv.traits.pool is None and attr_name == "render_mode":
                return [self.venv.render_mode for _ in self._get_indices(indices)]
            pool = self._pool(f"get_attr({attr_name!r})")
            with _attribute_errors():
                return list(pool.call("get_wrapper_attr", attr_name, indices=self._get_indices(indices)))

        def set_attr(self, attr_name: str, value, indices=None) -> None:
            # on each sub-env itself, as DummyVecEnv/SubprocVecEnv's setattr(env_i, ...) (gymnasium's
            # set_wrapper_attr would reach an inner wrapper of that name instead)
            pool = self._pool(f"set_attr({attr_name!r})")
            rows = list(self._get_indices(indices))
            pool.set_attr(attr_name, [value] * len(rows), indices=rows, outermost=True)

        def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list:
            pool = self._pool(f"env_method({method_name!r})")
            with _attribute_errors():
                return list(pool.call(method_name, *method_args, indices=self._get_indices(indices), **method_kwargs))

        def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
            rows = list(self._get_indices(indices))
            pool = self.venv.traits.pool
            if pool is None:
                return [False] * len(rows)  # a TorchRL env: no gymnasium sub-envs, so no wrappers
            return pool.env_is_wrapped(wrapper_class, indices=rows)

        def get_images(self):
            return list(self.venv.render())  # NotImplementedError without sub-envs, as SB3's VecEnv.get_images

    TorchRLSB3VecEnv.__module__ = __name__
    TorchRLSB3VecEnv.__qualname__ = "TorchRLSB3VecEnv"
    return TorchRLSB3VecEnv




def _rows(infos: dict, n: int) -> list[dict]:
    """Every env's :func:`_row` of gymnasium vector infos, built a column at a time.

    The same dicts as ``[_row(infos, i) for i in range(n)]`` (same keys, order and
    values: Python scalars for numeric arrays, row views for wider ones), without a
    per-env pass over every key.
    """
    out = [{} for _ in range(n)]
    for key, value in infos.items():
        if key in ("final_obs", "final_info") or is_vector_mask(key, infos):
            continue
        mask = infos.get("_" + key)
        if isinstance(value, dict):
            column = [_row(value, i) if mask is None or mask[i] else None for i in range(n)]
        elif isinstance(value, np.ndarray) and value.ndim == 1:
            column = value.tolist()  # Python scalars (objects stay themselves), as .item() gives
        else:
            column = [value[i] for i in range(n)]
            column = [item.item() if isinstance(item, np.generic) else item for item in column]
        if mask is None:
            for info, item in zip(out, column):
                info[key] = item
        else:
            for i in np.flatnonzero(mask).tolist():
                out[i][key] = column[i]
    return out


def _row(infos: dict, i: int) -> dict:
    """Env ``i``'s entries of gymnasium vector infos (keys whose ``_key`` mask is set)."""
    out = {}
    for key, value in infos.items():
        if key in ("final_obs", "final_info") or is_vector_mask(key, infos):
            continue
        mask = infos.get("_" + key)
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            out[key] = _row(value, i)
        else:
            item = value[i]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out


def __getattr__(name):
    if name == "TorchRLSB3VecEnv":
        return _sb3_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
