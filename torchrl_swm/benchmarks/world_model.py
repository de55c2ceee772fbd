"""Benchmark section: :class:`~torchrl_swm.WorldModelEnv` against the raw batched forward of its model.

The model is perf.md's reference world model (``shared/bench/peers_worldmodel.py``): a 64-d
latent, a 6-d action, a 2x256 MLP with reward and done heads, its done head calibrated so that
~3 % of random-action steps end an episode. Rows, per batch size ``B`` (all in one process run,
interleaved; ``ratio`` = rate / rate of row ``raw`` at the same ``B``):

* ``raw``: the model's forward in a ``torch.no_grad()`` loop (the compute limit, reference).
* ``raw+reset``: the same plus the done mask and a masked reset (``torch.where``).
* ``env/step``: ``WorldModelEnv.step_and_maybe_reset`` in a loop (collector style).
  Targets: >= 0.90 at B=1024, >= 0.70 at B=64, <= 30 us added per step at B=1
  (``extra["added_us"]``).
* ``env/rollout``: ``WorldModelEnv.rollout(100, break_when_any_done=False)``. Target >= 0.85 at B=1024.
* ``env/rollout-out``: the same with TorchRL's ``out=`` reusing one output buffer. At large B a
  rollout's 100 steps are tens of MB; glibc hands freed blocks that large back to the OS, so a plain
  rollout page-faults its memory in again every time.
* ``env/transformed``: ``make_world_model_env(..., max_episode_steps=1000)`` (a TransformedEnv with
  StepCounter: TorchRL's generic path) stepped like ``env/step``, for reference.
* ``torchrl/model_based``: TorchRL's ``ModelBasedEnvBase`` with the model as a ``TensorDictModule``,
  ``rollout(100)`` (what TorchRL offers; its ``_reset`` resets every row).
* ``env/step-no-dones``: ``env/step`` with a termination that is never true (same ops, no resets).
* ``env/reset``: the masked reset alone (``B`` x 3 % rows, at least one: every row at B=1), fast path,
  per call;
  ``extra["fraction_of_step"]`` is its cost over the ``env/step`` time per step. Target <= 0.05 at
  B=1024. ``extra["in_loop_fraction"]`` is the same measured inside the loop: (``env/step`` minus
  ``env/step-no-dones``) over ``env/step-no-dones``, where ``env/step-no-dones`` is the same loop with a
  termination that is never true (same ops, no resets). Noisier: a difference of two timings.

``run()`` returns :class:`~torchrl_swm.benchmarks.harness.Row` objects and prints nothing. On a GPU,
``run(bs=(16384,), device="cuda")`` gives the large-batch comparison on the accelerator.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .harness import Row, failed_row, measure_together, require

__all__ = ["run", "RefWorldModel", "make_ref_model", "world_model_subjects", "LAT", "ACT", "HID"]

LAT, ACT, HID = 64, 6, 256
ROLL = 100
_K = 64  # pre-drawn random action batches, cycled
SECTION = "world_model"


class RefWorldModel(nn.Module):
    """``(latent, action) -> (next latent, reward, done logit)``."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(LAT + ACT, HID), nn.ReLU(), nn.Linear(HID, HID), nn.ReLU(), nn.Linear(HID, LAT + 2)
        )

    def forward(self, latent, action):
        out = self.net(torch.cat((latent, action), -1))
        return torch.tanh(out[..., :LAT]), out[..., LAT : LAT + 1], out[..., LAT + 1 :]


def make_ref_model(seed: int = 0, device="cpu", done_rate_bias: float = -2.0) -> RefWorldModel:
    """The reference model with its done head calibrated to ~2-4 % dones under random actions (seed 0, the
    benchmark's; other seeds land near it, e.g. ~1.5 % with seed 2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RefWorldModel().eval()
    with torch.no_grad():
        z = torch.tanh(torch.randn(4096, LAT, generator=gen))
        a = torch.rand(4096, ACT, generator=gen) * 2 - 1
        for _ in range(5):
            z, _, _ = model(z, a)
        _, _, d = model(z, a)
        last = model.net[-1]
        last.weight[LAT + 1] /= d.std().clamp_min(1e-6)
        last.bias[LAT + 1] = 0.0
        _, _, d = model(z, a)
        last.bias[LAT + 1] = done_rate_bias - d.mean()
    for p in model.parameters():
        p.requires_grad_(False)
    return model.to(device)


def _transition(model, state, action):
    z, r, d = model(state, action)
    return {"state": z, "reward": r, "terminated": d > 0}


def _transition_no_done(model, state, action):
    z, r, d = model(state, action)
    return {"state": z, "reward": r, "terminated": d > float("inf")}  # same work, never done: no resets


def _spaces():
    import gymnasium as gym
    import numpy as np

    return (
        gym.spaces.Box(-1.0, 1.0, (LAT,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32),
    )


def _make_env(model, b, device, transition=_transition):
    from ..world_model import WorldModelEnv

    obs, act = _spaces()
    return WorldModelEnv(
        model, obs, act, num_envs=b, initial_state=_start_latent().to(device), transition_fn=transition,
        device=device, seed=0,
    )


def _start_latent() -> torch.Tensor:
    """Every episode's first latent (the env rows' ``initial_state``, the raw loops' reset value)."""
    return torch.tanh(torch.randn(LAT, generator=torch.Generator().manual_seed(1))) * 0.1


class _Raw:
    """The model's forward in a loop, from the env rows' start latent with their actions (``_Policy``'s),
    so that ``raw+reset`` ends episodes exactly as often as they do."""

    def __init__(self, model, b, device, reset):
        self.m, self.reset = model, reset
        self.z0 = _start_latent().to(device)
        self.z = self.z0.expand(b, LAT).clone()
        self.acts = _Policy(b, device).acts
        self.i = 0

    def run(self, units):
        m, acts, z, z0, reset = self.m, self.acts, self.z, self.z0, self.reset
        i = self.i
        with torch.no_grad():
            for _ in range(units):
                i += 1
                z, r, d = m(z, acts[i % _K])
                if reset:
                    done = d > 0
                    if done.any():
                        z = torch.where(done, z0, z)
        self.z, self.i = z, i

    def close(self):
        pass


class _Policy:
    def __init__(self, b, device):
        gen = torch.Generator().manual_seed(3)
        self.acts = (torch.rand(_K, b, ACT, generator=gen) * 2 - 1).to(device)
        self.i = 0

    def __call__(self, td):
        self.i += 1
        td.set("action", self.acts[self.i % _K])
        return td


class _StepLoop:
    def __init__(self, env, b, device):
        self.env, self.policy = env, _Policy(b, device)
        self.td = env.reset()

    def run(self, units):
        env, policy, td = self.env, self.policy, self.td
        with torch.no_grad():
            for _ in range(units):
                _, td = env.step_and_maybe_reset(policy(td))
        self.td = td

    def close(self):
        pass


class _Rollout:
    """``rollout(ROLL)``; with ``reuse_out``, TorchRL's ``out=`` writes every rollout into the first one's buffer."""

    def __init__(self, env, b, device, reuse_out=False):
        self.env, self.policy = env, _Policy(b, device)
        self.out = None
        self.reuse_out = reuse_out

    def run(self, units):
        with torch.no_grad():
            for _ in range(units):
                out = self.env.rollout(ROLL, self.policy, break_when_any_done=False, out=self.out)
                if self.reuse_out:
                    self.out = out

    def close(self):
        pass


def _reset_rows(b: int, rate: float = 0.03) -> int:
    """The rows ``env/reset`` restarts per call: ~3 % of ``b``, at least one (so 100 % at B=1)."""
    return max(1, round(rate * b))


class _ResetOnly:
    """The fast path's maybe_reset alone: the done count (host sync) and the restart of ~3 % random rows."""

    def __init__(self, env, b, device, rate=0.03):
        self.env = env
        td = env.reset()
        td.set("action", torch.zeros(b, ACT, device=device))
        nxt = env.step(td)["next"]
        self.root = {"action": td["action"], **{k: v for k, v in nxt.items() if k != "reward"}}
        gen = torch.Generator().manual_seed(4)
        k = _reset_rows(b, rate)
        self.dones = []
        for _ in range(16):
            mask = torch.zeros(b, 1, dtype=torch.bool)
            mask[torch.randperm(b, generator=gen)[:k]] = True
            self.dones.append(mask.to(device))

    def run(self, units):
        env, dones, root = self.env, self.dones, self.root
        with torch.no_grad():
            for s in range(units):
                done = dones[s % 16]
                n_done = int(done.count_nonzero())
                if n_done:
                    env._reset_rows_into(dict(root), done, n_done)

    def close(self):
        pass


def _model_based_env(model, b, device):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torchrl.data import Bounded, Categorical, Composite, Unbounded
    from torchrl.envs.model_based import ModelBasedEnvBase

    class Head(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, latent, action):
            z, r, d = self.m(latent, action)
            done = d > 0
            return z, r, done, done.clone()

    module = TensorDictModule(
        Head(model), in_keys=["latent", "action"], out_keys=["latent", "reward", "done", "terminated"]
    )
    z0 = _start_latent().expand(b, LAT).to(device)

    class Env(ModelBasedEnvBase):
        def __init__(self):
            super().__init__(module, batch_size=torch.Size([b]), device=device)
            self.observation_spec = Composite(latent=Unbounded((b, LAT), device=device), shape=(b,))
            self.action_spec = Bounded(-1.0, 1.0, (b, ACT), device=device)
            self.reward_spec = Unbounded((b, 1), device=device)
            self.done_spec = Composite(
                done=Categorical(2, shape=(b, 1), dtype=torch.bool, device=device),
                terminated=Categorical(2, shape=(b, 1), dtype=torch.bool, device=device),
                shape=(b,),
            )

        def _reset(self, td=None, **kwargs):
            zeros = torch.zeros(b, 1, dtype=torch.bool, device=device)
            return TensorDict(
                {"latent": z0.clone(), "done": zeros, "terminated": zeros.clone()},
                batch_size=self.batch_size,
                device=device,
            )

    return Env()


def _transformed_env(model, b, device):
    from ..world_model import make_world_model_env

    obs, act = _spaces()
    return make_world_model_env(
        model,
        obs,
        act,
        num_envs=b,
        initial_state=_start_latent().to(device),
        transition_fn=_transition,
        max_episode_steps=1000,
        device=device,
        seed=0,
    )


def run(bs=(1, 64, 1024), seconds: float = 2.0, device="cpu", threads: int | None = None) -> list[Row]:
    """Measure every row for each batch size in ``bs``; returns the rows (nothing is printed).

    ``threads``: torch intra-op threads during the run (restored after). On a shared, loaded
    machine ``threads=1`` avoids OpenMP threads waiting on each other, which otherwise swamps
    the large-batch rows with noise; the default leaves torch's setting alone.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        return _run(bs, seconds, torch.device(device))
    finally:
        torch.set_num_threads(previous)


def _run(bs, seconds, device) -> list[Row]:
    model = make_ref_model(0, device)
    rows: list[Row] = []
    for b in bs:
        rows += _rows_for(model, int(b), seconds, device)
    return rows


def world_model_subjects(model, b: int, device) -> list[tuple]:
    """The subjects of one batch size, as ``(key, label, make, batched steps per unit)``: the steps a subject
    credits per unit must be the model calls its ``run(1)`` makes (``tests/test_world_model_benchmark.py`` counts
    them), except ``env/reset``, whose unit is one masked reset."""
    return [
        ("raw", "raw batched forward, torch.no_grad() loop (reference)", lambda: _Raw(model, b, device, False), 1),
        ("raw+reset", "raw forward + done mask + masked reset", lambda: _Raw(model, b, device, True), 1),
        ("env/step", "WorldModelEnv step_and_maybe_reset loop",
         lambda: _StepLoop(_make_env(model, b, device), b, device), 1),
        ("env/rollout", f"WorldModelEnv rollout({ROLL}, break_when_any_done=False)",
         lambda: _Rollout(_make_env(model, b, device), b, device), ROLL),
        ("env/rollout-out", f"WorldModelEnv rollout({ROLL}, out=the previous rollout's buffer)",
         lambda: _Rollout(_make_env(model, b, device), b, device, reuse_out=True), ROLL),
        ("env/transformed", "make_world_model_env (TransformedEnv + StepCounter) step loop",
         lambda: _StepLoop(_transformed_env(model, b, device), b, device), 1),
        ("torchrl/model_based", f"TorchRL ModelBasedEnvBase rollout({ROLL})",
         lambda: _Rollout(_model_based_env(model, b, device), b, device), ROLL),
        ("env/step-no-dones", "WorldModelEnv step loop, termination never true (no resets)",
         lambda: _StepLoop(_make_env(model, b, device, _transition_no_done), b, device), 1),
        ("env/reset", f"masked reset of {_reset_rows(b)} of {b} rows ({100 * _reset_rows(b) / b:.3g} %, fast path), "
         "per call",
         lambda: _ResetOnly(_make_env(model, b, device), b, device), 1),
    ]


def _rows_for(model, b: int, seconds: float, device) -> list[Row]:
    subjects = world_model_subjects(model, b, device)
    # interleaved rounds (as every section): a host whose speed drifts shifts every row alike
    failures: dict = {}
    results = measure_together({key: make for key, _, make, _ in subjects}, envs_per_step=b,
                               seconds=seconds * len(subjects), steps_per_unit={key: s for key, _, _, s in subjects},
                               failures=failures)
    require(results, failures, ["raw", "env/step", "env/step-no-dones", "env/reset"])  # what the others derive from
    rows: list[Row] = []
    for key, label, _, _ in subjects:
        if key not in results:  # a peer that cannot run here is reported, not fatal
            rows.append(failed_row(SECTION, key, label, b, failures[key]))
            continue
        result = results[key]
        rows.append(Row(SECTION, key, label, b, result["rate"], result["spread"], result["us_per_call"],
                        extra={"setup_s": result["setup_s"]}))
    by_key = {r.key: r for r in rows}
    raw, step, no_done, reset = by_key["raw"], by_key["env/step"], by_key["env/step-no-dones"], by_key["env/reset"]
    reset.extra["fraction_of_step"] = reset.us_per_call / step.us_per_call
    reset.extra["in_loop_fraction"] = (step.us_per_call - no_done.us_per_call) / no_done.us_per_call
    for r in rows:
        if r.key in failures:
            continue
        r.extra["threads"] = torch.get_num_threads()
        if r is not reset:
            r.ratio = r.rate / raw.rate
            r.extra["added_us"] = r.us_per_call - raw.us_per_call
    return rows
