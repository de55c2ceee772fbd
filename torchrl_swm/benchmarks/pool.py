"""Pool benchmark: EnvPool against a plain loop, gymnasium and TorchRL, in one process run.

Sections (each returns :class:`~.harness.Row` objects, ratios to its reference row):

* ``cartpole``: CartPole-v1 with random actions, env-steps/s, ratio to the plain
  loop over ``gym.make`` envs (the reference, 1.00), the in-process rows measured
  interleaved; plus two ``ceiling`` rows: the best ratio TorchRL's own ``rollout``
  and ``Collector`` leave any env (see :func:`ceilings`).
* ``vector``: the numpy-batched ``CartPoleVectorEnv`` raw, and through EnvPool.
* ``fixed``: the pool's fixed cost per batched step on an env that does nothing,
  with no env finishing and with k envs finishing per step, next to TorchRL's
  own ``EnvBase`` floor.
* ``expensive``: an env burning ~1 ms of CPU per step: serial vs process backend
  vs TorchRL ``ParallelEnv`` with the same envs.

Actions are drawn once and cycled, so no row pays for a policy.
"""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
import torch

from .harness import Row, failed_row, is_next_step, measure, measure_together, require, step_next_step

__all__ = ["run", "SECTIONS", "BusyEnv", "NoopEnv", "RandomLengthNoopEnv", "cartpole_subjects"]

K_ACTIONS = 64  # pre-drawn action batches, cycled


# -- envs used by the benchmark (module level: worker processes import them) ------------
class NoopEnv(gym.Env):
    """Does nothing: returns a constant observation; ends every ``period`` steps (0: never)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, period: int = 0):
        self.obs = np.zeros(4, np.float32)
        self.period, self.t = period, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        return self.obs, 1.0, bool(self.period) and self.t >= self.period, False, {}


class RandomLengthNoopEnv(NoopEnv):
    """A :class:`NoopEnv` whose every episode lasts a random number of steps in ``[low, high]`` (its own RNG,
    seeded at construction: the pool's per-episode seeds leave the lengths alone), so that, as CartPole's
    under random actions, episodes of different envs end at scattered steps, not in synchronized clumps."""

    def __init__(self, seed: int, low: int = 12, high: int = 32):
        super().__init__(0)
        self.rng, self.low, self.high = np.random.default_rng(seed), low, high

    def reset(self, *, seed=None, options=None):
        self.period = int(self.rng.integers(self.low, self.high + 1))
        return super().reset(seed=seed, options=options)


class BusyEnv(gym.Env):
    """A CPU-bound env: each step burns about ``ms`` milliseconds of CPU (like physics)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, ms: float = 1.0, episode: int = 200):
        self.ms, self.episode, self.t = ms, episode, 0
        self.state = np.zeros(8, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.state = self.np_random.standard_normal(8).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action):
        end = time.thread_time() + self.ms / 1000.0
        x = 0.0
        while time.thread_time() < end:  # CPU time, not a sleep: it needs a core
            x += 1.0
        self.t += 1
        self.state = (self.state * 0.99 + (action - 0.5) * 0.01).astype(np.float32)
        return self.state.copy(), 1.0, False, self.t >= self.episode, {}


def _cartpole():
    return gym.make("CartPole-v1")


def _sync_vector_wrapped(n):
    """TorchRL's ``GymWrapper`` over a SAME_STEP ``SyncVectorEnv`` of ``n`` CartPoles (a ``ParallelEnv`` worker's env)."""
    from torchrl.envs import GymWrapper

    return GymWrapper(gym.vector.SyncVectorEnv([_cartpole] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))


def _actions(n, k=K_ACTIONS, seed=0):
    return np.random.default_rng(seed).integers(0, 2, size=(k, n))


# -- subjects: run(units) and close() ---------------------------------------------------------
class PlainLoop:
    """The reference: N gym.make envs, a Python loop, numpy buffers, manual reset."""

    def __init__(self, n, factory=_cartpole, numpy_actions=False, seed_every_episode=False):
        self.envs = [factory() for _ in range(n)]
        # with per-episode seeds, env i's k-th later episode gets seed i + (k + 1) * n, as EnvPool(seed=0) gives
        self.next_seed = list(range(n, 2 * n)) if seed_every_episode else None
        self.obs = np.zeros((n, *self.envs[0].observation_space.shape), np.float32)
        self.rew = np.zeros(n, np.float32)
        self.term = np.zeros(n, bool)
        self.trunc = np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            self.obs[i], _ = env.reset(seed=i)
        # Python ints, as the reference of ../shared/bench/peers_cartpole.py; numpy integers
        # (what Discrete.sample() and gymnasium's vector envs pass) pass Discrete.contains faster
        self.acts = [list(row) for row in _actions(n)] if numpy_actions else _actions(n).tolist()

    def run(self, units):
        envs, obs, rew, term, trunc, acts = self.envs, self.obs, self.rew, self.term, self.trunc, self.acts
        seeds, n = self.next_seed, len(envs)
        for s in range(units):
            a = acts[s % K_ACTIONS]
            for i, env in enumerate(envs):
                o, r, te, tr, _ = env.step(a[i])
                if te or tr:
                    if seeds is None:
                        o, _ = env.reset()
                    else:
                        o, _ = env.reset(seed=seeds[i])
                        seeds[i] += n
                obs[i] = o
                rew[i] = r
                term[i] = te
                trunc[i] = tr

    def close(self):
        for env in self.envs:
            env.close()


class GymVector:
    """A gymnasium VectorEnv stepped with batches of actions (its own autoreset). Under NEXT_STEP
    autoreset a call after an env's last step only resets that env: it is not counted as an env-step."""

    def __init__(self, venv, n):
        self.env, self.n = venv, n
        self.env.reset(seed=0)
        self.acts = _actions(n)
        self.next_step, self.waiting = is_next_step(venv), 0

    def run(self, units):
        step, acts = self.env.step, self.acts
        if self.next_step:
            transitions, self.waiting = step_next_step(step, acts, self.n, units, self.waiting)
            return transitions
        for s in range(units):
            step(acts[s % K_ACTIONS])
        return None

    def close(self):
        self.env.close()


class StepLoop:
    """A TorchRL env driven like a collector: set the action, step_and_maybe_reset."""

    def __init__(self, env):
        self.env = env
        env.set_seed(0)
        self.td = env.reset()
        self.acts = [env.action_spec.rand() for _ in range(K_ACTIONS)]

    def run(self, units):
        env, acts, td = self.env, self.acts, self.td
        with torch.no_grad():
            for s in range(units):
                td.set("action", acts[s % K_ACTIONS])
                _, td = env.step_and_maybe_reset(td)
        self.td = td

    def close(self):
        self.env.close()


class CyclePolicy:
    """Pre-drawn random actions, as a TorchRL policy (a callable on a TensorDict)."""

    def __init__(self, env):
        self.acts = [env.action_spec.rand() for _ in range(K_ACTIONS)]
        self.i = 0

    def __call__(self, td):
        self.i += 1
        return td.set("action", self.acts[self.i % K_ACTIONS])


class Rollout:
    """``env.rollout(T, policy, break_when_any_done=False)``: T steps per unit."""

    def __init__(self, env, steps=100):
        self.env, self.steps = env, steps
        env.set_seed(0)
        self.policy = CyclePolicy(env)

    def run(self, units):
        with torch.no_grad():
            for _ in range(units):
                self.env.rollout(self.steps, self.policy, break_when_any_done=False)

    def close(self):
        self.env.close()


class CollectorLoop:
    """A torchrl ``Collector`` with a random policy: one batch of ``frames`` per unit."""

    def __init__(self, env, frames, **collector_kwargs):
        from torchrl.collectors import Collector

        self.env = env
        self.collector = Collector(env, CyclePolicy(env), frames_per_batch=frames, total_frames=-1, **collector_kwargs)
        self.iterator = iter(self.collector)

    def run(self, units):
        for _ in range(units):
            next(self.iterator)

    def close(self):
        self.collector.shutdown()
        self.env.close()


def _floor_env(n):
    """TorchRL's EnvBase floor: a minimal masked pool that does no env work at all."""
    from tensordict import TensorDict
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class Floor(EnvBase):
        def __init__(self):
            super().__init__(batch_size=torch.Size([n]))
            self.observation_spec = Composite(observation=Unbounded((n, 4)), shape=(n,))
            self.action_spec = Categorical(2, shape=(n,))
            self.reward_spec = Unbounded((n, 1))
            self._obs = np.zeros((n, 4), np.float32)
            self._flags = np.zeros((n, 1), bool)

        def _step(self, td):
            term = torch.from_numpy(self._flags.copy())
            return TensorDict(
                {"observation": torch.from_numpy(self._obs.copy()), "reward": torch.ones(n, 1),
                 "terminated": term, "truncated": term.clone(), "done": term.clone()},
                batch_size=self.batch_size,
            )

        def _reset(self, td=None, **kwargs):
            z = torch.zeros(n, 1, dtype=torch.bool)
            return TensorDict({"observation": torch.from_numpy(self._obs.copy()), "terminated": z,
                               "truncated": z.clone(), "done": z.clone()}, batch_size=self.batch_size)

        def _set_seed(self, seed):
            pass

    return Floor()


# -- sections ---------------------------------------------------------------------------------
def _row(section, key, label, n, result, ref=None, **extra) -> Row:
    return Row(section, key, label, n, result["rate"], result["spread"], result["us_per_call"],
               None if ref is None else result["rate"] / ref, extra)


def cartpole_subjects(n, env_id="CartPole-v1", include_slow=True) -> list[tuple]:
    """The in-process subjects of :func:`cartpole`, as ``(key, label, make, batched steps per unit)``:
    the steps a subject credits per unit must be the steps its ``run(1)`` takes (``tests/test_benchmarks.py``
    counts them on a counting env registered under another ``env_id``)."""
    from torchrl.envs import GymEnv, GymWrapper, SerialEnv

    from ..pool import EnvPool

    factory = functools.partial(gym.make, env_id)
    pool = functools.partial(EnvPool, env_id, num_envs=n, seed=0)
    once = functools.partial(EnvPool, env_id, num_envs=n, seed=0, seed_every_episode=False)
    together = [
        ("plain", "plain loop over gym.make envs [reference]", lambda: PlainLoop(n, factory), 1),
        ("plain_numpy_actions", "plain loop, numpy integer actions (as SyncVectorEnv and EnvPool pass)",
         lambda: PlainLoop(n, factory, numpy_actions=True), 1),
        ("plain_seeded", "plain loop, numpy actions, every episode reset with its own seed (EnvPool's default)",
         lambda: PlainLoop(n, factory, numpy_actions=True, seed_every_episode=True), 1),
        ("pool_step", "EnvPool, step_and_maybe_reset loop", lambda: StepLoop(pool()), 1),
        ("pool_rollout", "EnvPool, rollout(100, break_when_any_done=False)", lambda: Rollout(pool()), 100),
        ("pool_collector", "EnvPool, Collector (random policy)", lambda: CollectorLoop(pool(), n * 50), 50),
        ("pool_step_once", "EnvPool(seed_every_episode=False), step loop", lambda: StepLoop(once()), 1),
        ("pool_rollout_once", "EnvPool(seed_every_episode=False), rollout(100)", lambda: Rollout(once()), 100),
        ("pool_collector_once", "EnvPool(seed_every_episode=False), Collector",
         lambda: CollectorLoop(once(), n * 50), 50),
        ("gym_sync", "gymnasium SyncVectorEnv", lambda: GymVector(gym.vector.SyncVectorEnv([factory] * n), n), 1),
        ("torchrl_gymwrapper", "TorchRL GymWrapper(SyncVectorEnv, SAME_STEP)",
         lambda: StepLoop(GymWrapper(gym.vector.SyncVectorEnv(
             [factory] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))), 1),
        ("floor", "TorchRL EnvBase floor (no env work)", lambda: StepLoop(_floor_env(n)), 1),
    ]
    if include_slow:
        together.append(("torchrl_serial", "TorchRL SerialEnv(N, GymEnv)",
                         lambda: StepLoop(SerialEnv(n, functools.partial(GymEnv, env_id))), 1))
    return together


def cartpole(ns=(16, 256), seconds=2.0, include_slow=True) -> list[Row]:
    """CartPole-v1 rows. The subjects that run in this process are measured together, interleaved in
    passes forward and backward (:func:`~.harness.measure_together`), so their ratios to the plain loop
    hold on a shared machine; those with processes of their own (``AsyncVectorEnv``, ``ParallelEnv``) run after,
    one at a time, so their workers never compete with the others' rounds."""
    from torchrl.envs import GymEnv, ParallelEnv, SerialEnv

    rows = []
    for n in ns:
        together = cartpole_subjects(n, include_slow=include_slow)
        makers = {key: make for key, _, make, _ in together}
        makers.update(_noop_pools(n))
        steps_per_unit = {key: steps for key, _, _, steps in together}
        steps_per_unit.update(_NOOP_PATHS)
        failures: dict = {}
        results = measure_together(makers, envs_per_step=n, seconds=seconds * len(makers), repeats=3,
                                   steps_per_unit=steps_per_unit, failures=failures)
        require(results, failures, ("plain", *_NOOP_PATHS))  # the reference and the ceilings' own pools
        ref = results["plain"]
        for key, label, _, _ in together:  # a peer that cannot run here is reported, not fatal
            rows.append(_row_or_failed("cartpole", key, label, n, results, failures, ref["rate"]))

        def alone(key, label, make, envs=n):
            try:
                res = measure(make, envs_per_step=envs, seconds=seconds)
            except Exception as err:  # a peer that cannot run here is reported, not fatal
                rows.append(failed_row("cartpole", key, label, n, err))
                return
            rows.append(_row("cartpole", key, label, n, res, ref["rate"]))

        if n <= 32:
            alone("gym_async", "gymnasium AsyncVectorEnv (one process per env)",
                  lambda: GymVector(gym.vector.AsyncVectorEnv([_cartpole] * n, context="spawn"), n))
        if include_slow and n >= 2:  # 2 x (N // 2) envs: credited with those it steps (odd N: one fewer)
            alone("torchrl_parallel", "TorchRL ParallelEnv(2 workers x SerialEnv(N/2))",
                  lambda: StepLoop(ParallelEnv(2, functools.partial(
                      SerialEnv, n // 2, functools.partial(GymEnv, "CartPole-v1")))), envs=2 * (n // 2))
            # the faster of TorchRL's two usual ParallelEnv setups (the ParallelEnv figures are this one's)
            alone("torchrl_parallel_vec", "TorchRL ParallelEnv(2 workers x GymWrapper(SyncVectorEnv(N/2), SAME_STEP))",
                  lambda: StepLoop(ParallelEnv(2, functools.partial(_sync_vector_wrapped, n // 2))),
                  envs=2 * (n // 2))
        rows += ceilings(n, results)
    return rows


#: TorchRL's own per-step cost of rollout and Collector is measured on these NoopEnv pools (see :func:`ceilings`)
_NOOP_PATHS = {"noop_step": 1, "noop_rollout": 100, "noop_collector": 50}


def _noop_pools(n) -> dict:
    """Makers of the :func:`ceilings` subjects: a pool of :class:`RandomLengthNoopEnv` whose episodes last
    about as long as CartPole's under random actions (12 to 32 steps, 22 on average) and end at scattered
    steps, so that about as many batched steps hold a partial reset (half of them at N=16, nearly all at 256)."""
    from ..pool import EnvPool

    fns = [functools.partial(RandomLengthNoopEnv, i) for i in range(n)]
    return {
        "noop_step": lambda: StepLoop(EnvPool(fns, seed=0)),
        "noop_rollout": lambda: Rollout(EnvPool(fns, seed=0), 100),
        "noop_collector": lambda: CollectorLoop(EnvPool(fns, seed=0), n * 50),
    }


def ceilings(n, results) -> list[Row]:
    """The best ratio to the plain loop that TorchRL's ``rollout`` and ``Collector`` leave any env.

    Their own cost per batched step is their time on the :func:`_noop_pools` minus the step loop's
    (all measured in the same interleaved rounds as the plain loop, ``results``). A row's ``ratio`` is
    the plain loop's time over (that time plus this overhead): what an env exactly as fast as the plain
    loop would reach through that path. An upper bound: next to real envs, which touch more memory per
    step, TorchRL's overhead measured higher here.
    """
    us = {key: results[key]["us_per_call"] for key in _NOOP_PATHS}  # per batched step
    plain_us = results["plain"]["us_per_call"]
    rows = []
    for key, label in (("rollout", "rollout(100, break_when_any_done=False)"), ("collector", "Collector")):
        overhead = us[f"noop_{key}"] - us["noop_step"]
        if not overhead > 0:  # the difference of two noisy timings, swamped by noise in this run: no bound
            nan = float("nan")
            rows.append(Row("cartpole", f"ceiling_{key}", f"ceiling: the plain loop + TorchRL's own {label} cost "
                            f"(not measurable in this run: {overhead:.0f} µs/step on NoopEnv, noise)", n, nan, nan,
                            nan, nan, {"torchrl_overhead_us": overhead, "noop_step_us": us["noop_step"]}))
            continue
        total = plain_us + overhead
        rows.append(Row("cartpole", f"ceiling_{key}", f"ceiling: the plain loop + TorchRL's own {label} cost "
                        f"({overhead:.0f} µs/step on NoopEnv)", n, n / total * 1e6, results[f"noop_{key}"]["spread"],
                        total, plain_us / total, {"torchrl_overhead_us": overhead, "noop_step_us": us["noop_step"]}))
    return rows


def vector(ns=(16, 256), seconds=2.0) -> list[Row]:
    """The pool over gymnasium's natively batched ``CartPoleVectorEnv`` against that env's own step, timed
    together (interleaved, as every section's rows: a host whose speed drifts shifts both alike)."""
    from ..pool import EnvPool

    def make_vec(n):
        return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")

    rows = []
    for n in ns:
        makers = {
            "raw": lambda: GymVector(make_vec(n), n),
            "pool": lambda: StepLoop(EnvPool(make_vec(n), seed=0)),
        }
        failures: dict = {}
        res = measure_together(makers, envs_per_step=n, seconds=seconds * len(makers), failures=failures)
        require(res, failures, ["raw"])
        ref = res["raw"]["rate"]
        rows.append(_row("vector", "raw", "CartPoleVectorEnv raw step [reference]", n, res["raw"], ref))
        rows.append(_row_or_failed("vector", "pool", "EnvPool(CartPoleVectorEnv), step_and_maybe_reset", n, res,
                                   failures, ref))
    return rows


def _row_or_failed(section, key, label, n, results, failures, ref, **extra) -> Row:
    """The row of ``key``, or its failed row when it could not run here."""
    if key in results:
        return _row(section, key, label, n, results[key], ref, **extra)
    return failed_row(section, key, label, n, failures[key])


def fixed(n=16, seconds=2.0) -> list[Row]:
    """Fixed cost per batched step: NoopEnv never ends, or k envs end every step; timed together with
    TorchRL's EnvBase floor."""
    from ..pool import EnvPool

    makers = {"floor": lambda: StepLoop(_floor_env(n))}
    finishing = {}
    for k in sorted({min(k, n) for k in (0, 1, 4)}):  # at most the n envs there are
        # k envs with period 1 end every step; the others never end
        fns = [functools.partial(NoopEnv, 1 if i < k else 0) for i in range(n)]
        makers[f"pool_k{k}"] = functools.partial(lambda fns: StepLoop(EnvPool(fns, seed=0)), fns)
        finishing[f"pool_k{k}"] = k
    failures: dict = {}
    res = measure_together(makers, envs_per_step=n, seconds=seconds * len(makers), failures=failures)
    require(res, failures, ["floor"])
    floor = res["floor"]["rate"]
    rows = [_row("fixed", "floor", "TorchRL EnvBase floor (no env work, no resets)", n, res["floor"], floor)]
    for key, k in finishing.items():
        rows.append(_row_or_failed("fixed", key, f"EnvPool on NoopEnv, {k} envs finishing per step", n, res, failures,
                                   floor, finishing=k))
    return rows


def expensive(n=8, workers=2, ms=1.0, seconds=3.0) -> list[Row]:
    """Envs whose step burns ``ms`` of CPU: the process backend against the serial one and TorchRL's
    ``ParallelEnv``, timed together (the idle subjects' workers block and use no CPU meanwhile)."""
    from torchrl.envs import ParallelEnv

    from ..pool import EnvPool

    busy = functools.partial(BusyEnv, ms)
    more = 2 * workers
    subjects = [
        ("serial", f"EnvPool serial, {n} envs x {ms:g} ms/step [reference]",
         lambda: StepLoop(EnvPool([busy] * n, seed=0))),
        ("process", f"EnvPool process backend, {workers} workers",
         lambda: StepLoop(EnvPool([busy] * n, backend="process", num_workers=workers, seed=0))),
        ("process_oversubscribed", f"EnvPool process backend, {more} workers",
         lambda: StepLoop(EnvPool([busy] * n, backend="process", num_workers=more, seed=0))),
        ("torchrl_parallel", f"TorchRL ParallelEnv({workers} x GymWrapper(SyncVectorEnv))",
         lambda: StepLoop(ParallelEnv(workers, functools.partial(_torchrl_sync_busy, n // workers, ms)))),
    ]
    failures: dict = {}
    res = measure_together({key: make for key, _, make in subjects}, envs_per_step=n, seconds=seconds * len(subjects),
                           failures=failures)
    require(res, failures, ["serial"])
    serial = res["serial"]["rate"]
    return [_row_or_failed("expensive", key, label, n, res, failures, serial) for key, label, _ in subjects]


def _torchrl_sync_busy(n, ms):
    from torchrl.envs import GymWrapper

    return GymWrapper(gym.vector.SyncVectorEnv(
        [functools.partial(BusyEnv, ms)] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))


SECTIONS = {"cartpole": cartpole, "vector": vector, "fixed": fixed, "expensive": expensive}


def run(sections=("cartpole", "vector", "fixed", "expensive"), ns=(16, 256), seconds=2.0, quick=False) -> list[Row]:
    """Run the pool sections; ``quick`` shrinks everything for a smoke test."""
    rows = []
    for name in sections:
        if name == "cartpole":
            rows += cartpole(ns, seconds, include_slow=not quick)
        elif name == "vector":
            rows += vector(ns, seconds)
        elif name == "fixed":
            rows += fixed(min(ns), seconds)
        elif name == "expensive":
            rows += expensive(n=4 if quick else 8, ms=0.2 if quick else 1.0, seconds=seconds)
    return rows
