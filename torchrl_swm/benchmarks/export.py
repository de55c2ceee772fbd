"""Benchmark section: the gymnasium export against what it wraps.

Rows (each measured in this process, ratios against a reference row of the same run):

* ``export/pool``: ``EnvPool("CartPole-v1", N)`` stepped directly with
  ``step_and_maybe_reset`` (``pool``, the reference), then through
  ``to_gymnasium`` in NEXT_STEP and SAME_STEP mode with numpy actions, and through
  ``to_sb3_vec_env`` when stable-baselines3 is installed. Target: the export costs
  at most 10 % over the pool at N=256 (ratio >= 0.9).
* ``export/world_model``: the 64-d latent / 2x256 MLP of
  ``shared/bench/peers_worldmodel.py`` as a raw batched forward (``raw``, the
  reference: the compute limit), the same with the done mask and masked reset
  (``raw+reset``), :class:`MLPWorldModelEnv` (a minimal batched TorchRL env over
  that model) stepped with ``step_and_maybe_reset`` (``torchrl``: the floor of
  any export that goes through TorchRL), and that env exported with
  ``to_gymnasium`` (NEXT_STEP and SAME_STEP); then the package's ``WorldModelEnv`` over the
  same model, stepped and exported the same way.
  Target (perf.md W5): export >= 0.85x the raw forward at B >= 64.

The rows of one group (one N or one B) are measured together, interleaved round by
round (:func:`~torchrl_swm.benchmarks.harness.measure_together`), so their ratios hold on a shared machine.
``run()`` returns :class:`~torchrl_swm.benchmarks.harness.Row` objects; it prints nothing.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn as nn
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from ..masks import row_mask
from .harness import Row, failed_row, is_next_step, measure_together, require, step_next_step
from .world_model import ACT, HID, LAT, RefWorldModel, make_ref_model

__all__ = ["run", "MLPWorldModel", "MLPWorldModelEnv", "make_model", "world_model_env", "LAT", "ACT", "HID"]

_K_ACT = 64  # pre-drawn random action batches, cycled


# The reference model of the world-model section, shared: one definition of the MLP.
MLPWorldModel = RefWorldModel


def make_model(seed: int = 0, device="cpu", done_rate_bias: float = -2.0) -> RefWorldModel:
    """The reference model, its done head calibrated so ~2-4 % of random-action steps end an episode."""
    return make_ref_model(seed, device, done_rate_bias)


class MLPWorldModelEnv(EnvBase):
    """A world model as a batched TorchRL env, written to TorchRL's contract by hand.

    The latent is the observation (``"observation"``, ``(B, 64)`` in ``[-1, 1]``);
    actions are ``(B, 6)`` in ``[-1, 1]``; an episode ends when the done head's
    logit is positive. The latent lives inside the env, as in a pool. ``_reset``
    honours the ``"_reset"`` mask (fresh start latents for the reset rows, drawn
    from a seeded generator), ``_step`` honours the ``"_step"`` mask (frozen rows keep their
    latent and report reward 0, not done).

    This is the stand-in world-model env of the export's tests and benchmark.
    """

    def __init__(self, model: nn.Module | None = None, batch_size: int = 64, device="cpu", seed: int = 0):
        super().__init__(batch_size=torch.Size([batch_size]), device=torch.device(device))
        b, dev = batch_size, self.device
        self.model = (model if model is not None else make_model()).to(dev)
        self.observation_spec = Composite(
            observation=Bounded(-1.0, 1.0, shape=(b, LAT), dtype=torch.float32, device=dev), shape=(b,), device=dev
        )
        self.action_spec = Bounded(-1.0, 1.0, shape=(b, ACT), dtype=torch.float32, device=dev)
        self.reward_spec = Unbounded(shape=(b, 1), dtype=torch.float32, device=dev)
        flag = lambda: Categorical(2, shape=(b, 1), dtype=torch.bool, device=dev)  # noqa: E731
        self.done_spec = Composite(done=flag(), terminated=flag(), truncated=flag(), shape=(b,), device=dev)
        self._gen = torch.Generator(device=dev)
        self._gen.manual_seed(seed)
        self._z = torch.zeros(b, LAT, device=dev)
        self._false = torch.zeros(b, 1, dtype=torch.bool, device=dev)

    def _start(self, k: int) -> torch.Tensor:
        return torch.tanh(torch.randn(k, LAT, generator=self._gen, device=self.device)) * 0.1

    def _reset(self, tensordict=None, **kwargs):
        mask = None if tensordict is None else tensordict.get("_reset", None)
        if mask is None:
            self._z = self._start(self.batch_size[0])
        else:  # start latents for the reset rows only (~3 % of them): the least work a reset must do
            rows = row_mask(mask, self.batch_size[0], "_reset")
            z = self._z.clone()
            z[rows] = self._start(int(rows.count_nonzero()))
            self._z = z
        false = self._false
        return TensorDict._new_unsafe(
            {"observation": self._z, "done": false, "terminated": false, "truncated": false},
            batch_size=self.batch_size, device=self.device,
        )

    def _step(self, tensordict):
        z, reward, logit = self.model(self._z, tensordict.get("action"))
        done = logit > 0
        mask = tensordict.get("_step", None)
        if mask is not None:
            rows = row_mask(mask, self.batch_size[0], "_step").unsqueeze(-1)
            z = torch.where(rows, z, self._z)
            reward = reward * rows
            done = done & rows
        self._z = z
        return TensorDict._new_unsafe(
            {"observation": z, "reward": reward, "done": done, "terminated": done, "truncated": self._false},
            batch_size=self.batch_size, device=self.device,
        )

    def _set_seed(self, seed: int | None) -> None:
        self._gen.manual_seed(0 if seed is None else int(seed))


# ----------------------------------------------------------------------------------------
# subjects: run(units) + close()
# ----------------------------------------------------------------------------------------


class _PoolDirect:
    def __init__(self, n):
        from ..pool import EnvPool

        self.env = EnvPool("CartPole-v1", num_envs=n, seed=0)
        gen = torch.Generator().manual_seed(0)
        self.actions = torch.randint(0, 2, (_K_ACT, n), generator=gen)
        self.td = self.env.reset()
        self.i = 0

    def run(self, units):
        env, td, actions = self.env, self.td, self.actions
        for _ in range(units):
            self.i += 1
            td.set("action", actions[self.i % _K_ACT])
            _, td = env.step_and_maybe_reset(td)
        self.td = td

    def close(self):
        self.env.close()


class _GymLoop:
    """A gymnasium vector env stepped with batches of actions; under NEXT_STEP a call that only resets
    an env after its last step is not counted as an env-step."""

    def __init__(self, venv, actions: np.ndarray):
        self.env, self.actions, self.i = venv, actions, 0
        self.env.reset(seed=0)
        self.next_step, self.waiting = is_next_step(venv), 0

    def run(self, units):
        step, actions = self.env.step, self.actions
        if self.next_step:
            transitions, self.waiting = step_next_step(step, actions, actions.shape[1], units, self.waiting, self.i + 1)
            self.i += units
            return transitions
        for _ in range(units):
            self.i += 1
            step(actions[self.i % len(actions)])
        return None

    def close(self):
        self.env.close()


class _SB3Loop(_GymLoop):
    def __init__(self, venv, actions):
        self.env, self.actions, self.i = venv, actions, 0
        self.env.seed(0)
        self.env.reset()
        self.next_step = False  # SB3 resets a finished env inside the step: every call is a transition


class _Raw:
    def __init__(self, model, b, masked_reset):
        gen = torch.Generator().manual_seed(0)
        self.m, self.masked = model, masked_reset
        self.z = torch.tanh(torch.randn(b, LAT, generator=gen))
        self.z0 = torch.tanh(torch.randn(b, LAT, generator=gen)) * 0.1
        self.acts = torch.rand(_K_ACT, b, ACT, generator=gen) * 2 - 1
        self.i = 0

    def run(self, units):
        m, acts, z, z0 = self.m, self.acts, self.z, self.z0
        with torch.no_grad():  # as every loop here, and as the reference the issue defines (not inference_mode)
            for _ in range(units):
                self.i += 1
                z, r, dl = m(z, acts[self.i % _K_ACT])
                if self.masked:
                    z = torch.where(dl > 0, z0, z)
        self.z = z

    def close(self):
        pass


class _TorchRLLoop:
    def __init__(self, env, b):
        gen = torch.Generator().manual_seed(0)
        self.env = env
        self.acts = torch.rand(_K_ACT, b, ACT, generator=gen) * 2 - 1
        self.td = env.reset()
        self.i = 0

    def run(self, units):
        env, td, acts = self.env, self.td, self.acts
        with torch.no_grad():
            for _ in range(units):
                self.i += 1
                td.set("action", acts[self.i % _K_ACT])
                _, td = env.step_and_maybe_reset(td)
        self.td = td

    def close(self):
        self.env.close()


def _mlp_transition(model, state, action):
    latent, reward, logit = model(state, action)
    done = logit > 0
    return latent, latent, reward, done, torch.zeros_like(done), {}  # (state, obs, reward, term, trunc, info)


def _mlp_reset(model, seed, options, num_envs, generator):
    return torch.tanh(torch.randn(num_envs, LAT, generator=generator, device=generator.device)) * 0.1


def world_model_env(model: nn.Module | None = None, num_envs: int = 64, device="cpu", seed: int = 0):
    """The package's ``WorldModelEnv`` over the reference MLP: the same dynamics as :class:`MLPWorldModelEnv`."""
    import gymnasium as gym

    from ..world_model import WorldModelEnv

    model = (model if model is not None else make_model()).to(device)
    return WorldModelEnv(
        model,
        observation_space=gym.spaces.Box(-1.0, 1.0, (LAT,), np.float32),
        action_space=gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32),
        num_envs=num_envs, transition_fn=_mlp_transition, reset_fn=_mlp_reset, device=device, seed=seed,
    )


def _rows(section, n, specs, results, failures, ref_key) -> list[Row]:
    require(results, failures, [ref_key])
    ref = results[ref_key]["rate"]
    return [
        Row(section, key, label, n, results[key]["rate"], results[key]["spread"], results[key]["us_per_call"],
            results[key]["rate"] / ref, {"setup_s": results[key]["setup_s"], "reference": ref_key})
        if key in results else failed_row(section, key, label, n, failures[key])  # reported, not fatal
        for key, label in specs
    ]


def _pool_rows(ns, seconds) -> list[Row]:
    from ..export import to_gymnasium
    from ..pool import EnvPool

    rows = []
    for n in ns:
        actions = np.random.default_rng(0).integers(0, 2, (_K_ACT, n))
        makers = {"pool": lambda: _PoolDirect(n)}
        labels = [("pool", "EnvPool CartPole, step_and_maybe_reset (reference)")]
        for mode in ("next_step", "same_step"):
            makers[f"gym-{mode}"] = functools.partial(
                lambda mode: _GymLoop(to_gymnasium(EnvPool("CartPole-v1", num_envs=n), autoreset_mode=mode), actions),
                mode,
            )
            labels.append((f"gym-{mode}", f"to_gymnasium(EnvPool), {mode}"))
        try:
            import stable_baselines3  # noqa: F401

            from ..export import to_sb3_vec_env

            makers["sb3"] = lambda: _SB3Loop(to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=n)), actions)
            labels.append(("sb3", "to_sb3_vec_env(EnvPool)"))
        except ImportError:
            pass
        failures: dict = {}
        results = measure_together(makers, envs_per_step=n, seconds=seconds * len(makers), failures=failures)
        rows += _rows("export/pool", n, labels, results, failures, "pool")
    return rows


def _world_model_rows(bs, seconds) -> list[Row]:
    from ..export import to_gymnasium

    model = make_model()
    rows = []
    for b in bs:
        actions = (np.random.default_rng(0).random((_K_ACT, b, ACT)) * 2 - 1).astype(np.float32)
        makers = {
            "raw": lambda: _Raw(model, b, False),
            "raw+reset": lambda: _Raw(model, b, True),
            "torchrl": lambda: _TorchRLLoop(MLPWorldModelEnv(model, b), b),
        }
        labels = [("raw", "raw batched forward (limit, reference)"),
                  ("raw+reset", "raw forward + done mask + masked reset"),
                  ("torchrl", "MLPWorldModelEnv, step_and_maybe_reset")]
        for mode in ("next_step", "same_step"):
            makers[f"gym-{mode}"] = functools.partial(
                lambda mode: _GymLoop(to_gymnasium(MLPWorldModelEnv(model, b), autoreset_mode=mode), actions), mode
            )
            labels.append((f"gym-{mode}", f"to_gymnasium(MLPWorldModelEnv), {mode}"))
        makers["wm-torchrl"] = lambda: _TorchRLLoop(world_model_env(model, b), b)
        labels.append(("wm-torchrl", "WorldModelEnv, step_and_maybe_reset"))
        for mode in ("next_step", "same_step"):
            makers[f"wm-gym-{mode}"] = functools.partial(
                lambda mode: _GymLoop(to_gymnasium(world_model_env(model, b), autoreset_mode=mode), actions), mode
            )
            labels.append((f"wm-gym-{mode}", f"to_gymnasium(WorldModelEnv), {mode}"))
        failures: dict = {}
        results = measure_together(makers, envs_per_step=b, seconds=seconds * len(makers), failures=failures)
        rows += _rows("export/world_model", b, labels, results, failures, "raw")
    return rows


def run(ns=(16, 256), bs=(64, 1024), seconds: float = 2.0) -> list[Row]:
    """Measure the export section; see the module docstring. Returns rows, prints nothing."""
    return [*_pool_rows(ns, seconds), *_world_model_rows(bs, seconds)]
