"""EnvPool edge cases: infos a pool cannot record are refused at construction with a clear error,
unusual observations, spaces and keyword arguments, the fast step path's device, and the process
backend's faults (interrupted waits, hung envs, classes defined in the user's script)."""

import contextlib
import functools
import os
import signal
import sys
import threading
import time
import warnings

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import assert_reaped, end_leftovers
from gymnasium.vector import AutoresetMode, VectorEnv
from tensordict import TensorDict
from torchrl.data import Bounded, Unbounded
from wm_models import counting_env

from torchrl_swm import EnvError, EnvPool, SpecError
from torchrl_swm.specs import space_to_spec

BOX2 = gym.spaces.Box(-1, 1, (2,), np.float32)


@pytest.fixture(autouse=True, scope="module")
def _pickle_this_module_by_value():
    # The process backend's workers then get this module's classes by value, as they get the classes of
    # a user's script (__main__), and never import this module (nor, through it, torch).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# -- 1. a VectorEnv info value for the whole batch -------------------------------------------------
class BatchWideInfoVectorEnv(VectorEnv):
    """A natively batched env (3 envs): ``info["good"]`` is per env (``10 * t + i``), ``info["step_count"]``
    is ``batch_wide``: one value for the whole batch."""

    metadata = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(self, batch_wide, n=3):
        self.num_envs = n
        self.batch_wide = batch_wide
        self.single_observation_space = BOX2
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)
        self.t = 0

    def _out(self):
        info = {"step_count": self.batch_wide, "good": 10.0 * self.t + np.arange(self.num_envs)}
        return np.zeros((self.num_envs, 2), np.float32), info

    def reset(self, seed=None, options=None):
        self.t = 0
        return self._out()

    def step(self, actions):
        self.t += 1
        obs, info = self._out()
        z = np.zeros(self.num_envs)
        return obs, z, z.astype(bool), z.astype(bool), info


@pytest.mark.parametrize("batch_wide", [0, np.array(1.5), np.zeros(2)], ids=["int", "0-d array", "wrong length"])
def test_vector_info_with_one_value_for_the_batch_is_refused_at_construction_unless_left_out(batch_wide):
    with pytest.raises(EnvError, match=r"vector info key 'step_count' is .*: one value for the whole batch"):
        EnvPool(BatchWideInfoVectorEnv(batch_wide), seed=0)
    with pytest.raises(EnvError, match=r"'step_count' is .*one value for the whole batch"):
        EnvPool(BatchWideInfoVectorEnv(batch_wide), seed=0, info_spec={"step_count": 0})
    # declaring it asks for a per-env value the env does not give: refused even where info_keys= leaves it out
    with pytest.raises(EnvError, match=r"'step_count' is .*one value for the whole batch"):
        EnvPool(BatchWideInfoVectorEnv(batch_wide), seed=0, info_keys=["good"], info_spec={"step_count": 0})
    # left out with info_keys=: the pool records the other keys
    pool = EnvPool(BatchWideInfoVectorEnv(batch_wide), seed=0, info_keys=["good"])
    assert list(pool.observation_spec["info"].keys()) == ["good"]
    td = pool.reset()
    assert td["info", "good"].view(-1).tolist() == [0.0, 1.0, 2.0]
    td["action"] = torch.zeros(3, dtype=torch.int64)
    assert pool.step(td)["next", "info", "good"].view(-1).tolist() == [10.0, 11.0, 12.0]
    pool.close()


# -- 2. a key numeric in one env and None in another ----------------------------------------------
class MixedInfoEnv(gym.Env):
    """``info["lives"]`` is 3 in env 1 and None in env 0 (``at`` reset, or at each step, or never);
    ``info["name"]`` is a string everywhere."""

    observation_space = BOX2
    action_space = gym.spaces.Discrete(2)

    def __init__(self, idx, at="reset"):
        self.idx, self.at = idx, at

    def _info(self, phase):
        info = {"name": f"env{self.idx}"}
        if phase == self.at:
            info["lives"] = 3 if self.idx == 1 else None
        return info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), self._info("reset")

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, self._info("step")


@pytest.mark.parametrize("at", ["reset", "step"])
def test_info_key_numeric_in_one_env_and_none_in_another_is_refused_at_construction(at):
    fns = [functools.partial(MixedInfoEnv, 0, at), functools.partial(MixedInfoEnv, 1, at)]
    with pytest.raises(EnvError, match=rf"env 0 \({at}\): info key 'lives' is NoneType None here, "
                                      rf"but a number in env 1 at {at}") as err:
        EnvPool(fns, seed=0)
    assert err.value.env_index == 0
    # a key declared with info_spec= that is None in every env: refused at construction too, naming the declaration
    with pytest.raises(EnvError, match=rf"env 0 \({at}\): info key 'lives' is NoneType None here, "
                                      r"but a number in its info_spec= declaration"):
        EnvPool([functools.partial(MixedInfoEnv, 0, at)] * 2, seed=0, info_spec={"lives": 0})
    # a key that is non-numeric in every env (the string "name", here without "lives") is still skipped, silently
    pool = EnvPool([functools.partial(MixedInfoEnv, i, "never") for i in range(2)], seed=0)
    assert "info" not in pool.observation_spec.keys()
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    pool.step(td)
    pool.close()


# -- 3. observations as torch tensors that require grad --------------------------------------------
class GradObsEnv(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return torch.tensor([0.0, 0.5], requires_grad=True), {}

    def step(self, action):
        self.t += 1
        return torch.tensor([float(self.t), 0.5], requires_grad=True), 0.0, False, False, {}


def test_observations_that_require_grad_are_recorded_at_reset_and_step():
    pool = EnvPool([GradObsEnv] * 2, seed=0)
    td = pool.reset()
    assert td["observation"].tolist() == [[0.0, 0.5]] * 2
    for t in (1, 2):
        td["action"] = torch.zeros(2, dtype=torch.int64)
        td = pool.step_and_maybe_reset(td)[1]
        assert td["observation"].tolist() == [[float(t), 0.5]] * 2
        assert not td["observation"].requires_grad
    pool.close()


# -- 4. a Box at the float dtype's finite extremes -------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_box_at_the_float_extremes_converts_to_unbounded(dtype):
    big = np.finfo(dtype).max
    spec = space_to_spec(gym.spaces.Box(-big, big, (3,), dtype))
    assert isinstance(spec, Unbounded) and not isinstance(spec, Bounded)
    assert spec.shape == (3,) and spec.dtype == (torch.float32 if dtype is np.float32 else torch.float64)
    assert torch.isfinite(spec.rand()).all()
    for space in (gym.spaces.Box(-1, 1, (3,), dtype), gym.spaces.Box(-big, 1, (3,), dtype)):
        bounded = space_to_spec(space)  # a normal (or half-open) Box stays Bounded
        assert isinstance(bounded, Bounded) and bounded.space.high.tolist() == [1.0] * 3


def test_pool_with_a_box_at_the_float_extremes_draws_finite_varied_random_actions():
    dtype = np.float32  # (gymnasium's Box.sample, used by the construction probe, overflows for float64)
    big = np.finfo(dtype).max

    class ExtremeBoxEnv(gym.Env):
        observation_space = gym.spaces.Box(-big, big, (2,), dtype)
        action_space = gym.spaces.Box(-big, big, (3,), dtype)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2, dtype), {}

        def step(self, action):
            return np.zeros(2, dtype), 0.0, False, False, {}

    pool = EnvPool([ExtremeBoxEnv] * 2, seed=0)
    assert isinstance(pool.action_spec, Unbounded) and isinstance(pool.observation_spec["observation"], Unbounded)
    actions = pool.action_spec.rand()
    assert actions.shape == (2, 3) and torch.isfinite(actions).all()
    assert actions.abs().max() < 1e6 and actions.unique().numel() > 1
    pool.close()


class ScalarBoxEnv(gym.Env):
    """Scalar (shape ``()``) Box observation and action spaces of ``dtype``; the observation is the action the
    env received, which it checks is a 0-d array in its space (what ``Box.sample()`` gives)."""

    def __init__(self, dtype=np.float32):
        self.observation_space = gym.spaces.Box(-3, 5, (), dtype)
        self.action_space = gym.spaces.Box(-3, 5, (), dtype)
        self.received = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((), self.observation_space.dtype), {}

    def step(self, action):
        self.received.append((type(action).__name__, np.shape(action), str(np.asarray(action).dtype)))
        assert self.action_space.contains(action), action
        return np.array(action, self.observation_space.dtype), 0.0, False, False, {}


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
def test_a_scalar_box_keeps_shape_unit_so_the_pool_leaves_are_n_as_gymnasium_batches_them(backend, dtype):
    # a Box(shape=()) is no (1,) vector (GymWrapper's choice): the observation leaf and the action spec are (N,),
    # the shape gymnasium's batch_space gives, and a random action reaches each env as a 0-d array in its space
    n = 3
    fns = [functools.partial(ScalarBoxEnv, dtype)] * n
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    try:
        space = gym.spaces.Box(-3, 5, (), dtype)
        batched = gym.vector.utils.batch_space(space, n)
        td = pool.reset()
        assert td["observation"].shape == batched.shape == (n,)
        assert pool.observation_spec["observation"].shape == pool.action_spec.shape == batched.shape
        torch.manual_seed(0)
        actions = [pool.action_spec.rand() for _ in range(4)]
        for action in actions:
            assert action.shape == (n,) and pool.action_spec.is_in(action)
            td["action"] = action
            td = pool.step(td)["next"]
            assert td["observation"].shape == (n,) and torch.equal(td["observation"], action)  # the env echoes it
        assert torch.stack(actions).unique().numel() > 1  # varied, not one bound
    finally:
        pool.close()


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_scalar_box_action_reaches_each_env_as_a_0_d_array_as_box_sample_gives(backend, dtype):
    # what a single env stepped with a float Box's sample() gets, with or without a "_step" mask, and in the
    # construction probe's step too (an integer Box's sample() is a numpy scalar, which Box.contains warns about)
    # (a SyncVectorEnv's own iterate() is gymnasium's choice, not the pool's)
    make = functools.partial(ScalarBoxEnv, dtype)
    pool = EnvPool([make] * 3, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    try:
        td = pool.reset()
        before = [len(r) for r in pool.get_attr("received")]
        assert before == [1, 1, 1]  # the probe's step
        td["action"] = pool.action_spec.rand()
        pool.step(td)
        td["_step"] = torch.tensor([True, False, True])
        pool.step(td)
        received = pool.get_attr("received")
        assert [len(r) for r in received] == [3, 2, 3]
        for r in received:
            assert set(r) == {("ndarray", (), np.dtype(dtype).name)}
    finally:
        pool.close()


# -- 5. a non-dict info --------------------------------------------------------------------------
class ListInfoEnv(gym.Env):
    """Reset and first-step infos are ``first``; later steps return a list of pairs."""

    observation_space = BOX2
    action_space = gym.spaces.Discrete(2)

    def __init__(self, first):
        self.first = first

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), dict(self.first)

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, False, (dict(self.first) if self.t == 1 else [("x", 3.0)])


@pytest.mark.parametrize("first", [{"x": 1.0}, {}], ids=["recorded key", "no info keys"])
def test_step_info_that_is_not_a_dict_is_named(first):
    pool = EnvPool([functools.partial(ListInfoEnv, first)] * 2, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    td = pool.step_and_maybe_reset(td)[1]
    with pytest.raises(EnvError, match=r"env 0 \(step\): expected the env's info to be a dict, got list") as err:
        pool.step(td)
    assert err.value.env_index == 0
    pool.close()


# -- 6. bfloat16 infos and info_spec= --------------------------------------------------------------
class Bf16InfoEnv(gym.Env):
    observation_space = BOX2
    action_space = gym.spaces.Discrete(2)

    def __init__(self, idx=0):
        self.idx = idx

    def _info(self, t):
        return {"logit": torch.tensor(1 / 3 + self.idx + t, dtype=torch.bfloat16)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), self._info(0)

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, False, self._info(self.t)


def _bf16(x):
    return torch.tensor(x, dtype=torch.bfloat16).float().item()


@pytest.mark.parametrize("backend", ["serial", "sync_vector"])
def test_bfloat16_infos_are_recorded_as_float32_exactly(backend):
    fns = [functools.partial(Bf16InfoEnv, i) for i in range(2)]
    pool = EnvPool(gym.vector.SyncVectorEnv(fns) if backend == "sync_vector" else fns, seed=0)
    assert pool.observation_spec["info", "logit"].dtype == torch.float32
    td = pool.reset()
    assert td["info", "logit"].view(-1).tolist() == [_bf16(1 / 3), _bf16(1 / 3 + 1)]
    assert _bf16(1 / 3) != 1 / 3  # the recorded values are the bfloat16 ones
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", "info", "logit"].view(-1).tolist() == [_bf16(1 / 3 + 1), _bf16(1 / 3 + 2)]
    pool.close()


def test_info_spec_of_bfloat16_or_with_a_batch_shape_is_a_spec_error():
    fns = [functools.partial(ListInfoEnv, {"x": 1.0})] * 2
    with pytest.raises(SpecError, match=r"info_spec\['x'\]: dtype torch.bfloat16 has no numpy equivalent"):
        EnvPool(fns, seed=0, info_spec={"x": Unbounded((), dtype=torch.bfloat16)})
    other = EnvPool(fns, seed=0)
    batched = other.observation_spec["info"]
    other.close()
    with pytest.raises(SpecError, match=r"info_spec: expected per-env value shapes, got a Composite with batch shape"):
        EnvPool(fns, seed=0, info_spec=batched)


# -- 7. uint32 infos -----------------------------------------------------------------------------
class Uint32InfoEnv(gym.Env):
    observation_space = BOX2
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {"rng_state": np.uint32(7)}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {"rng_state": np.uint32(4_000_000_000)}


def test_uint32_info_error_suggests_info_spec_with_int64():
    with pytest.raises(SpecError, match=r"info key 'rng_state': dtype uint32 is not supported.*"
                                        r"declare it int64 with info_spec=\{'rng_state': np\.int64\(0\)\}"):
        EnvPool([Uint32InfoEnv] * 2, seed=0)
    pool = EnvPool([Uint32InfoEnv] * 2, seed=0, info_spec={"rng_state": np.int64(0)})  # the advice works
    out = pool.rollout(2)
    assert out["next", "info", "rng_state"].view(-1).tolist() == [4_000_000_000] * 4
    pool.close()


# -- 8. auto_reset= ------------------------------------------------------------------------------
def test_auto_reset_true_is_refused_for_pools_and_world_model_envs():
    with pytest.raises(TypeError, match=r"EnvPool\(auto_reset=True\).*Drop auto_reset="):
        EnvPool("CartPole-v1", 2, seed=0, auto_reset=True)
    with pytest.raises(TypeError, match=r"WorldModelEnv\(auto_reset=True\)"):
        counting_env(num_envs=2, auto_reset=True)
    pool = EnvPool("CartPole-v1", 2, seed=0, auto_reset=False)
    assert type(pool) is EnvPool and pool.rollout(3).shape == (2, 3)
    pool.close()
    env = counting_env(num_envs=2, auto_reset=False)
    assert type(env).__name__ == "WorldModelEnv" and env.rollout(3).shape == (2, 3)


# -- 9. the fast step_and_maybe_reset's device -----------------------------------------------------
def test_fast_step_and_maybe_reset_moves_a_deviceless_input_to_the_pool_device(device):
    pool = EnvPool("CartPole-v1", 3, seed=0, device=device)
    td = pool.reset().clear_device_()  # as a policy that builds its tensordict without a device
    td["action"] = torch.zeros(3, dtype=torch.int64)
    out, nxt = pool.step_and_maybe_reset(td)
    assert (out.device, out["next"].device, nxt.device) == (pool.device,) * 3
    assert all(v.device == pool.device for v in nxt.values(True, True))
    assert nxt["observation"].shape == (3, 4)
    pool.close()


@pytest.mark.parametrize("input_device", [None, "cpu"])
@pytest.mark.parametrize("finishing", [False, True])
def test_fast_step_and_maybe_reset_keeps_the_inputs_device_on_a_deviceless_pool(input_device, finishing):
    # as TorchRL's generic path (step_mdp keeps the tensordict's device) and GymEnv do, at every level (a Dict
    # observation's and the infos' sub-tensordicts too)
    from envs import DictObsEnv
    from torchrl.envs import EnvBase

    class Ends(DictObsEnv):
        def step(self, action):
            obs, reward, _, truncated, info = super().step(action)
            return obs, reward, finishing, truncated, info

    def devices(td):  # the device of the tensordict and of each sub-tensordict
        subs = [key for key in td.keys(True) if isinstance(td.get(key), TensorDict)]
        return {(): td.device, **{key: td.get(key).device for key in subs}}

    results = []
    for step in (EnvPool.step_and_maybe_reset, EnvBase._step_and_maybe_reset):
        pool = EnvPool([Ends] * 3, seed=0)
        td = pool.reset()
        td = td.to(input_device) if input_device else td.clear_device_()
        td["action"] = torch.zeros(3, 2)
        out, root = step(pool, td)
        assert bool(out["next", "terminated"].all()) is finishing
        results.append((devices(out), devices(root)))
        pool.close()
    expected = None if input_device is None else torch.device(input_device)
    assert results[0] == results[1]
    assert set(results[0][0].values()) == set(results[0][1].values()) == {expected}


def test_a_default_pool_is_deviceless_as_torchrl_gymenv_and_collectors_skip_their_cast():
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    gym_env = GymEnv("CartPole-v1")
    pool, on_cpu = EnvPool("CartPole-v1", 3, seed=0), EnvPool("CartPole-v1", 3, seed=0, device="cpu")
    collector = Collector(pool, None, frames_per_batch=30, total_frames=30)
    reference = Collector(on_cpu, None, frames_per_batch=30, total_frames=30)
    try:
        assert pool.device is None and gym_env.device is None
        assert pool.observation_spec.device is None and pool.full_done_spec.device is None
        assert on_cpu.device == torch.device("cpu") and on_cpu.observation_spec.device == torch.device("cpu")
        # TorchRL's Collector re-casts its carrier every step to an env's explicit device: not to a deviceless one
        assert not collector._cast_to_env_device and reference._cast_to_env_device
        torch.manual_seed(0)
        batch = next(iter(collector))
        torch.manual_seed(0)
        expected = next(iter(reference))
        assert batch["next", "done"].any()  # partial resets happened
        assert all(value.device.type == "cpu" for value in batch.values(True, True))
        for key in (("next", "observation"), "observation", ("next", "done"), "action", "episode_seed"):
            assert torch.equal(batch[key], expected[key]), key
    finally:
        collector.shutdown()
        reference.shutdown()
        gym_env.close()


# -- 10. the process backend ---------------------------------------------------------------------
class SlowEnv(gym.Env):
    """obs = ``[steps since reset]``; each step after the construction probe sleeps ``delay`` seconds."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay=0.0):
        self.delay = delay
        self.t = 0
        self.probing = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0], np.float32), {}

    def step(self, action):
        if not self.probing:
            time.sleep(self.delay)
        self.probing = False
        self.t += 1
        return np.array([self.t], np.float32), 0.0, False, False, {}

    def modules(self):
        return sorted(m for m in ("torch", "torchrl", "tensordict") if m in sys.modules)


class CloseHung(Exception):
    pass


@contextlib.contextmanager
def _interrupt_after(seconds, error=KeyboardInterrupt):
    """``error`` raised in the main thread after ``seconds`` (by SIGUSR1: pytest-timeout owns SIGALRM)."""

    def handler(*_):
        raise error

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


def _step_interrupted(pool, after: float):
    """Step ``pool`` (zero actions) and interrupt the step ``after`` seconds in, as a user's Ctrl-C; returns
    the tensordict it stepped."""
    td = pool.reset()
    td["action"] = torch.zeros(pool.num_envs, dtype=torch.int64)
    with pytest.raises(KeyboardInterrupt), _interrupt_after(after):
        pool.step(td)
    return td


def _workers(pool):
    return list(getattr(pool._backend, "_processes", []))


def _reap(processes):
    """Terminate the workers a failed or cut-short close() left running (see ``envs.end_leftovers``)."""
    end_leftovers(processes)


@contextlib.contextmanager
def _process_pool(env_fns, num_workers):
    """A process-backend pool, closed and its workers reaped (terminated if need be) whatever the test does."""
    pool = EnvPool(env_fns, backend="process", num_workers=num_workers, seed=0)
    processes = _workers(pool)
    try:
        yield pool
    finally:
        try:
            pool.close()
        finally:
            _reap(processes)


def test_process_backend_interrupted_step_does_not_desync_the_replies():
    with _process_pool([functools.partial(SlowEnv, 0.5)] * 2, 2) as pool:
        td = _step_interrupted(pool, 0.15)  # interrupted while the workers sleep in step 1
        assert pool.get_attr("t") == [1, 1]  # its own reply, not the interrupted step's
        # the interrupted step moved the envs with no transition returned: they step again only once reset
        with pytest.raises(EnvError, match=r"envs \[0, 1\] since a step of theirs raised"):
            pool.step(td)
        td = pool.reset()
        assert pool.get_attr("t") == [0, 0]
        assert pool.step(td.set("action", torch.zeros(2, dtype=torch.int64)))["next", "observation"].view(-1).tolist() \
            == [1.0, 1.0]
        assert pool.get_attr("t") == [1, 1]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_vector_pool_after_an_interrupted_step(kind):
    # a SyncVectorEnv's envs step again once reset; an AsyncVectorEnv still waits for the interrupted call's
    # answers and cannot step or reset again: said as such, not "call reset() first"
    fns = [functools.partial(SlowEnv, 0.5)] * 2
    pool = EnvPool(gym.vector.AsyncVectorEnv(fns) if kind == "async" else gym.vector.SyncVectorEnv(fns), seed=0)
    try:
        td = _step_interrupted(pool, 0.15)
        if kind == "async":
            waits = (r"the AsyncVectorEnv still waits for the answers of a call that failed or was interrupted "
                     r"\(step\); it cannot step, reset or call again")
            with pytest.raises(EnvError, match=waits):
                pool.step(td)
            for use in (pool.reset, lambda: pool.get_attr("t")):  # not gymnasium's AlreadyPendingCallError
                with pytest.raises(EnvError, match=waits):
                    use()
        else:
            with pytest.raises(EnvError, match=r"envs \[0, 1\] since a step of theirs raised"):
                pool.step(td)
            td = pool.reset().set("action", torch.zeros(2, dtype=torch.int64))
            assert pool.step(td)["next", "observation"].view(-1).tolist() == [1.0, 1.0]
    finally:
        pool.close()


class SlowExitingEnv(SlowEnv):
    """A :class:`SlowEnv` whose worker process exits (code 3) in its first step after the probe."""

    def step(self, action):
        if not self.probing:
            time.sleep(self.delay)
            os._exit(3)
        return super().step(action)


def test_a_worker_that_died_in_an_interrupted_step_stops_every_later_step_and_reset():
    # the death shows in the replies the next command drains; a reset or step masked to the survivors' rows
    # must not go through on their own
    fns = [functools.partial(SlowEnv, 0.0)] * 2 + [functools.partial(SlowExitingEnv, 0.5)] * 2
    with _process_pool(fns, 2) as pool:
        td = _step_interrupted(pool, 0.15)
        processes = _workers(pool)
        processes[1].join(10)
        assert processes[1].exitcode == 3
        refused = r"worker 1 \(envs 2..3, pid \d+\) died with exit code 3: the pool cannot step or reset"
        with pytest.raises(EnvError, match=refused):
            pool.reset(td.clone().set("_reset", torch.tensor([[True], [False], [False], [False]])))
        with pytest.raises(EnvError, match=refused):
            pool.step(td.clone().set("_step", torch.tensor([True, True, False, False])))
        assert pool.get_attr("t", indices=[0, 1]) == [1, 1]  # the survivors stepped once, in the interrupted step


def test_an_async_vector_env_worker_that_dies_mid_step_is_named_with_its_exit_code():
    # it was "pool (step): EOFError", then gymnasium's AlreadyPendingCallError at the next reset (review R4 B4)
    fns = [functools.partial(SlowEnv, 0.0), functools.partial(SlowExitingEnv, 0.0)]
    pool = EnvPool(gym.vector.AsyncVectorEnv(fns), seed=0)
    try:
        td = pool.reset().set("action", torch.zeros(2, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"env 1 \(step\): its AsyncVectorEnv worker process ended with exit "
                                           r"code 3 \(EOFError.*\); close this pool and build a new one"):
            pool.step(td)
        with pytest.raises(EnvError, match=r"still waits for the answers of a call that failed or was interrupted"):
            pool.reset()
    finally:
        pool.close()


@pytest.mark.parametrize("env, code", [("BadCloseEnv", 1), ("CrashingCloseEnv", 3)])
def test_an_async_vector_env_whose_env_fails_to_close_raises_naming_it(env, code):
    # gymnasium's worker closes its env after it acknowledged the close: an error there was lost, where the other
    # backends raise "env i (close)" (review R4 B3)
    import envs

    venv = gym.vector.AsyncVectorEnv([envs.CountingEnv, getattr(envs, env)])
    pool = EnvPool(venv, seed=0)
    pool.reset()
    with pytest.raises(EnvError, match=rf"env 1 \(close\): its AsyncVectorEnv worker exited with code {code} while "
                                       r"closing its env"):
        pool.close()
    assert [p.is_alive() for p in venv.processes] == [False, False]
    pool.close(raise_if_closed=False)  # closed: nothing more to do


class MyWrapper(gym.Wrapper):
    pass


class Goal:
    def __init__(self, x):
        self.x = x


class GoalEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.goal = Goal(0)
        self.option_goal = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options and "goal" in options:
            self.option_goal = (type(options["goal"]) is Goal, options["goal"].x)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def goal_is_goal(self):
        return type(self.goal) is Goal, self.goal.x


def _wrapped_goal_env():
    return MyWrapper(GoalEnv())


def _goal_results(pool):
    out = {"env_is_wrapped": pool.env_is_wrapped(MyWrapper)}
    goals = pool.get_attr("goal")
    out["get_attr"] = [(type(g) is Goal, g.x) for g in goals]
    pool.set_attr("goal", Goal(1))
    out["set_attr"] = pool.call("goal_is_goal")
    pool.reset(options={"goal": Goal(2)})
    out["reset options"] = pool.get_attr("option_goal")
    return out


def test_process_backend_passes_objects_of_classes_pickled_by_value_as_serial_does():
    # this module's classes travel by value (see the fixture above), as a user script's classes do
    results = {}
    for backend in ("serial", "process"):
        pool = EnvPool([_wrapped_goal_env] * 2, backend=backend, num_workers=2, seed=0)
        processes = _workers(pool)
        try:
            results[backend] = _goal_results(pool)
        finally:
            pool.close()
            _reap(processes)
    assert results["serial"] == {
        "env_is_wrapped": [True, True], "get_attr": [(True, 0)] * 2, "set_attr": [(True, 1)] * 2,
        "reset options": [(True, 2)] * 2,
    }
    assert results["process"] == results["serial"]


def test_process_backend_close_after_an_interrupted_hung_step_terminates_the_worker():
    pool = EnvPool([functools.partial(SlowEnv, 3600.0)] * 2, backend="process", num_workers=2, seed=0)
    processes, pids = _workers(pool), pool._backend.pids
    try:
        _step_interrupted(pool, 0.3)  # the envs hang; the user interrupts
        start = time.monotonic()
        with _interrupt_after(20.0, CloseHung), pytest.warns(RuntimeWarning, match="was terminated"):
            pool.close()  # (a guard above: the bug is a close() that never returns)
        assert time.monotonic() - start < 15
        assert_reaped(pids)  # terminated and waited for
    finally:
        _reap(processes)


def test_a_worker_stuck_in_an_interrupted_step_leaves_the_other_workers_envs_answering():
    # every call/get_attr/set_attr waited for the reply the stuck worker owed, even one for another worker's env
    # (until the next Ctrl-C, for every such call); a serial loop answers them at once (review R1 B1)
    pool = EnvPool([functools.partial(SlowEnv, 0.0), functools.partial(SlowEnv, 3600.0)], backend="process",
                   num_workers=2, seed=0)
    processes = _workers(pool)
    try:
        _step_interrupted(pool, 0.5)  # env 1 hangs; env 0's step has returned
        with _interrupt_after(20.0, CloseHung):  # (a guard: the bug is a call that never returns)
            assert pool.get_attr("t", indices=[0]) == [1]
            pool.set_attr("delay", [0.25], indices=[0])
            assert pool.call("get_wrapper_attr", "delay", indices=[0]) == [0.25]
        with pytest.warns(RuntimeWarning, match="was terminated"):
            pool.close()
    finally:
        _reap(processes)


class CallableEnv(SlowEnv):
    """A SlowEnv whose methods take functions (a lambda reaches a process worker only through cloudpickle), and
    one that ends its worker."""

    def run(self, fn):
        return fn(self.t)

    def run_hook(self):
        return self.hook(self.t)

    def die(self):
        os._exit(3)


def test_a_process_pool_sends_lambdas_to_its_envs_in_call_and_set_attr_arguments():
    with _process_pool([CallableEnv] * 4, 2) as pool:
        pool.reset()
        assert pool.call("run", lambda t: t + 10) == [10] * 4
        offset = 5
        pool.set_attr("hook", [lambda t, k=k: t + k * offset for k in range(4)])  # closures over local names
        assert pool.call("run_hook") == [0, 5, 10, 15]


def test_a_worker_that_died_in_a_call_stops_the_next_step_before_any_env_moves():
    # no row waits for a reset, so nothing else checks the workers first: the step was sent to the live workers,
    # whose envs moved, before the dead one's send failed
    with _process_pool([CallableEnv] * 4, 2) as pool:
        td = pool.reset().set("action", torch.zeros(4, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2..3, pid \d+\) died with exit code 3"):
            pool.call("die", indices=[2])
        with pytest.raises(EnvError, match=r"died with exit code 3: the pool cannot step or reset"):
            pool.step(td)
        assert pool.get_attr("t", indices=[0, 1]) == [0, 0]


class SlowToMakeEnv(SlowEnv):
    """A SlowEnv whose construction takes ``make_delay`` seconds (a simulator starting); with ``marks``, it writes
    ``made-<i>`` once made and ``closed-<i>`` when closed into that folder."""

    def __init__(self, make_delay=0.0, marks=None, i=0):
        time.sleep(make_delay)
        super().__init__(0.0)
        self.marks, self.i = marks, i
        if marks is not None:
            (marks / f"made-{i}").touch()

    def close(self):
        if self.marks is not None:
            (self.marks / f"closed-{self.i}").touch()


class _SlowToPickle:
    """A factory whose pickling takes ``seconds`` (one closing over a large object)."""

    def __init__(self, seconds, inner):
        self.seconds, self.inner = seconds, inner

    def __call__(self):
        return self.inner()

    def __reduce__(self):
        time.sleep(self.seconds)
        return _SlowToPickle, (0, self.inner)


def test_a_ctrl_c_while_a_later_workers_factories_are_pickled_gives_the_started_workers_close_s_5_s(tmp_path):
    # worker 0 is making a slow env when the Ctrl-C lands on the pickling of worker 1's factory: close() read worker
    # 0's "make" reply as its own, waiting until the env was made (60 s); now worker 0 owes it, gets close()'s 5 s,
    # and is terminated with the warning
    fns = [functools.partial(SlowToMakeEnv, 60.0, tmp_path, 0), _SlowToPickle(60.0, SlowToMakeEnv)]
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"worker 0 \(envs 0\.\.0\) was still making or closing its envs"):
        with pytest.raises(KeyboardInterrupt), _interrupt_after(1.0):
            EnvPool(fns, backend="process", num_workers=2, seed=0)
    assert time.monotonic() - start < 30  # the bug waited for the 60 s make
    assert not _pool_workers_alive()


def _pool_workers_alive():
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.name.startswith("torchrl_swm-pool-worker")]


@pytest.mark.parametrize("after", [0.05, 1.5], ids=["while-starting-workers", "while-they-make-envs"])
def test_a_ctrl_c_during_a_process_pool_construction_names_workers_still_making_their_envs(after):
    # they were reported "still in an env call"; an interrupt before the replies to "make" were read also left
    # close() reading a worker's "make" reply as its own and waiting however long that worker's envs took
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt), _interrupt_after(after):
            EnvPool([functools.partial(SlowToMakeEnv, 60.0)] * 2, backend="process", num_workers=2, seed=0)
    about_workers = [str(w.message) for w in caught if "EnvPool.close(): worker" in str(w.message)]
    assert all("still making or closing its envs (the construction was cut short)" in text for text in about_workers)
    assert not _pool_workers_alive()


def test_a_ctrl_c_during_a_process_pool_construction_closes_the_envs_already_made(tmp_path):
    # worker 0 has made its env, worker 1 is still making its own: worker 0's env is closed (a simulator it
    # started is stopped), worker 1 is terminated once close()'s 5 s are up, with a warning naming it
    fns = [functools.partial(SlowToMakeEnv, 0.0, tmp_path, 0), functools.partial(SlowToMakeEnv, 60.0, tmp_path, 1)]

    def interrupt_once_made():
        deadline = time.monotonic() + 60
        while not (tmp_path / "made-0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)

    def handler(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    thread = threading.Thread(target=interrupt_once_made, daemon=True)
    try:
        with pytest.warns(RuntimeWarning, match=r"worker 1 \(envs 1\.\.1\) was still making or closing its envs"):
            with pytest.raises(KeyboardInterrupt):
                thread.start()
                EnvPool(fns, backend="process", num_workers=2, seed=0)
                time.sleep(60)  # (an interrupt that came late lands here)
    finally:
        thread.join()
        signal.signal(signal.SIGUSR1, previous)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["closed-0", "made-0"]
    assert not _pool_workers_alive()


def test_process_backend_workers_do_not_import_torch():
    with _process_pool([SlowEnv] * 2, 2) as pool:
        assert pool.call("modules") == [[], []]
        pool.reset()
        assert pool.call("modules") == [[], []]


class FrameEnv(SlowEnv):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, size=4):
        super().__init__(0.0)
        self.size = size
        self.render_mode = "rgb_array"

    def render(self):
        return np.zeros((self.size, self.size, 3), np.uint8)


@pytest.mark.parametrize("odd", [2, 3])  # the first env of worker 1 (between workers), or a later one (inside it)
def test_process_backend_frame_shape_mismatch_names_the_env_as_serial(odd):
    fns = [FrameEnv] * odd + [functools.partial(FrameEnv, 5)] * (4 - odd)
    errors = {}
    for backend in ("serial", "process"):
        with pytest.raises(EnvError) as err:
            EnvPool(fns, backend=backend, num_workers=2, pixels=True)
        errors[backend] = (err.value.env_index, str(err.value).splitlines()[0])
    assert errors["process"] == errors["serial"] == (
        odd, f"env {odd} (render): frame shape (5, 5, 3) differs from env 0's (4, 4, 3); frames must keep one size, "
        "unless image_shape=(H, W) is given (it resizes every frame)"
    )


class FailStepEnv(SlowEnv):
    """Each step after the probe sleeps ``fail_delay`` seconds then raises (``fail=True``)."""

    def __init__(self, fail_delay=0.0, fail=True):
        super().__init__(0.0)
        self.fail_delay, self.fail = fail_delay, fail

    def step(self, action):
        if self.fail and not self.probing:
            time.sleep(self.fail_delay)
            raise RuntimeError(f"fail after {self.fail_delay}s")
        return super().step(action)


def test_process_backend_failures_in_two_workers_name_the_lowest_env_as_serial():
    ok = functools.partial(FailStepEnv, fail=False)
    # env 3 (worker 1) fails first; env 1 (worker 0) half a second later
    fns = [ok, functools.partial(FailStepEnv, 0.5), ok, functools.partial(FailStepEnv, 0.0)]
    errors = {}
    for backend in ("serial", "process"):
        pool = EnvPool(fns, backend=backend, num_workers=2, seed=0)
        processes = _workers(pool)
        try:
            td = pool.reset()
            td["action"] = torch.zeros(4, dtype=torch.int64)
            with pytest.raises(EnvError) as err:
                pool.step(td)
            errors[backend] = (err.value.env_index, str(err.value).splitlines()[0])
        finally:
            pool.close()
            _reap(processes)
    assert errors["process"] == errors["serial"] == (1, "env 1 (step): RuntimeError: fail after 0.5s")


def test_a_float64_box_action_space_at_the_dtype_extremes_builds_a_pool():
    """gymnasium's Box.sample() overflows for float64 bounds at finfo.min/max; the construction probe
    steps with the zero action then, and the pool's Unbounded spec samples finite actions."""
    big = np.finfo(np.float64).max

    class WideAction(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Box(-big, big, (3,), np.float64)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), float(np.abs(action).sum()), False, False, {}

    pool = EnvPool([WideAction, WideAction], seed=0)
    action = pool.action_spec.rand()
    assert action.dtype == torch.float64 and torch.isfinite(action).all() and action.std() > 0
    td = pool.reset()
    td["action"] = action
    assert torch.isfinite(pool.step(td)["next", "reward"]).all()
    pool.close()


class WidestIntAction(gym.Env):
    """Any non-negative int64 action: gymnasium's Box.sample() computes ``high + 1``, which wraps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(0, np.iinfo(np.int64).max, (), np.int64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.array([float(action)], np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("backend", ["serial", "process", "vector"])
def test_an_int64_box_action_up_to_the_dtype_maximum_builds_a_pool(backend):
    """The probe's sample raised ValueError (high - low < 0), reported as the env's step failing: the probe
    steps with the zero action there too, and the pool's spec samples the whole range."""
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv([WidestIntAction] * 2), seed=0)
    else:
        pool = EnvPool([WidestIntAction] * 2, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    try:
        action = pool.action_spec.rand()
        assert action.dtype == torch.int64 and (action >= 0).all() and pool.action_spec.is_in(action)
        td = pool.reset()
        td["action"] = torch.tensor([3, np.iinfo(np.int64).max])
        assert pool.step(td)["next", "observation"][:, 0].tolist() == [3.0, float(np.iinfo(np.int64).max)]
    finally:
        pool.close()


def test_a_failing_probe_sample_is_named_as_the_pools_not_the_envs_step():
    class Unsampleable(gym.spaces.Discrete):
        def sample(self, mask=None, probability=None):
            raise RuntimeError("no samples here")

    class Env(WidestIntAction):
        action_space = Unsampleable(3)

    with pytest.raises(EnvError, match=r"^env 0 \(sample a probe action\): RuntimeError: no samples here") as err:
        EnvPool([Env, Env])
    assert isinstance(err.value.__cause__, RuntimeError)


# -- 11. Ctrl-C while a large message is half sent or half read (process backend) -------------------
class BigAttrEnv(SlowEnv):
    """A SlowEnv with a ``mb`` MB attribute ``big``: its get_attr reply takes a while to read."""

    def __init__(self, mb=100):
        super().__init__(0.0)
        self.big = np.ones(mb * 2**20, np.uint8)


@contextlib.contextmanager
def _sigint_soon_after(conn, method, delay):
    """A real SIGINT (Ctrl-C) ``delay`` seconds after ``conn.<method>`` (the real one, still called) starts."""
    original, timers = getattr(conn, method), []

    def spied(*args, **kwargs):
        if not timers:
            timers.append(threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)))
            timers[0].start()
        return original(*args, **kwargs)

    setattr(conn, method, spied)
    try:
        yield
    finally:
        delattr(conn, method)
        for timer in timers:
            timer.cancel()


def _assert_in_step(pool, td, n):
    """The next commands get their own replies: get_attr, a step, get_attr."""
    with _interrupt_after(10.0, CloseHung):  # a guard: a pipe left mid-message can hang the next command
        assert pool.get_attr("t") == [0] * n
        td["action"] = torch.zeros(n, dtype=torch.int64)
        assert pool.step(td)["next", "observation"].view(-1).tolist() == [1.0] * n
        assert pool.get_attr("t") == [1] * n


# (On the old code these fail when the SIGINT lands mid-message, which is likely but not certain.)
def test_process_backend_ctrl_c_while_a_large_reply_is_read_is_raised_after_the_read():
    with _process_pool([BigAttrEnv] * 2, 1) as pool:
        td = pool.reset()
        with pytest.raises(KeyboardInterrupt), _sigint_soon_after(pool._backend._conns[0], "recv_bytes", 0.02):
            pool.get_attr("big")  # a ~200 MB reply
            time.sleep(3)  # (a signal that came late lands here, not in pytest)
        _assert_in_step(pool, td, 2)


def test_process_backend_ctrl_c_while_a_large_command_is_sent_is_raised_after_the_send():
    with _process_pool([SlowEnv] * 2, 1) as pool:
        td = pool.reset()
        payload = np.ones(200 * 2**20, np.uint8)
        with pytest.raises(KeyboardInterrupt), _sigint_soon_after(pool._backend._conns[0], "send_bytes", 0.01):
            pool.set_attr("payload", payload)
            time.sleep(3)
        del payload
        _assert_in_step(pool, td, 2)


# -- 12. a call()/get_attr() value that cannot be pickled back (process backend) -------------------
class LockAttrEnv(SlowEnv):
    """``lock`` is a threading.Lock (not picklable) if ``locked``, else None."""

    def __init__(self, locked=False):
        super().__init__(0.0)
        self.lock = threading.Lock() if locked else None

    def get_lock(self):
        return self.lock


@pytest.mark.parametrize("phase", ["get_attr", "call"])
def test_process_backend_unpicklable_reply_names_the_env_and_the_pool_stays_usable(phase):
    with _process_pool([LockAttrEnv] * 3 + [functools.partial(LockAttrEnv, True)], 2) as pool:
        td = pool.reset()
        with pytest.raises(EnvError) as err:
            pool.get_attr("lock") if phase == "get_attr" else pool.call("get_lock")
        assert (err.value.env_index, err.value.phase) == (3, phase)
        message = str(err.value)
        assert message.startswith(f"env 3 ({phase}): the value it returned cannot be pickled to send back")
        assert "cannot pickle '_thread.lock' object" in message
        assert "the process backend needs picklable attribute and call() values" in message
        assert pool.get_attr("lock", indices=[0, 1, 2]) == [None] * 3
        _assert_in_step(pool, td, 4)


# -- 13. a VectorEnv's batch-wide info value under a key chosen with info_keys= ----------------------
class NestedBatchWideInfoVectorEnv(BatchWideInfoVectorEnv):
    """``info["ep"]``: ``"r"`` per env, ``"n"`` one value (5) for the whole batch."""

    def _out(self):
        obs, _ = super()._out()
        return obs, {"ep": {"r": 10.0 * self.t + np.arange(self.num_envs), "n": 5}, "good": np.arange(3.0)}


def test_vector_info_batch_wide_value_under_a_chosen_info_key_is_refused_at_construction():
    with pytest.raises(EnvError, match=r"vector info key 'step_count' is float 5.0: one value for the whole batch"):
        EnvPool(BatchWideInfoVectorEnv(5.0), seed=0, info_keys=["step_count"])
    with pytest.raises(EnvError, match=r"vector info key \('ep', 'n'\) is int 5: one value for the whole batch"):
        EnvPool(NestedBatchWideInfoVectorEnv(0), seed=0, info_keys=["ep"])
    # keys left out by info_keys= are still fine
    pool = EnvPool(NestedBatchWideInfoVectorEnv(0), seed=0, info_keys=["good"])
    assert pool.reset()["info", "good"].view(-1).tolist() == [0.0, 1.0, 2.0]
    pool.close()


# -- 14. info_keys= as one key (a string or a nested-key tuple) or a list of keys --------------------
class NestedInfoEnv(SlowEnv):
    """info: ``{"episode": {"r": t + 0.5, "l": t}, "x": 2 * t}``."""

    def _info(self):
        return {"episode": {"r": self.t + 0.5, "l": self.t}, "x": 2.0 * self.t}

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, self._info()

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, self._info()


def _info_keys(pool):
    return {key if isinstance(key, tuple) else (key,) for key in pool.observation_spec["info"].keys(True, True)}


def test_info_keys_string_is_one_key_a_tuple_one_nested_key_and_a_list_several():
    pool = EnvPool("Taxi-v4", num_envs=2, seed=0, info_keys="prob")  # Taxi's infos: "prob" and "action_mask"
    assert _info_keys(pool) == {("prob",)}
    assert pool.reset()["info", "prob"].view(-1).tolist() == [1.0, 1.0]
    pool.close()
    for info_keys, expected in [
        ("x", {("x",)}),
        (("episode", "r"), {("episode", "r")}),  # one nested key, as TorchRL reads it
        (["episode", "x"], {("episode", "l"), ("episode", "r"), ("x",)}),
        ([("episode", "l"), "x"], {("episode", "l"), ("x",)}),
    ]:
        pool = EnvPool([NestedInfoEnv] * 2, seed=0, info_keys=info_keys)
        assert _info_keys(pool) == expected, info_keys
        td = pool.reset()
        td["action"] = torch.zeros(2, dtype=torch.int64)
        nxt = pool.step(td)["next", "info"]
        if ("episode", "r") in expected:
            assert nxt["episode", "r"].view(-1).tolist() == [1.5, 1.5]
        if ("x",) in expected:
            assert nxt["x"].view(-1).tolist() == [2.0, 2.0]
        pool.close()


# -- 15. info_spec= as a nested dict --------------------------------------------------------------
class FixedLengthEnv(SlowEnv):
    """Reward 1 per step; terminates after ``n`` steps."""

    def __init__(self, n):
        super().__init__(0.0)
        self.n = n

    def step(self, action):
        obs, _, _, truncated, info = super().step(action)
        return obs, 1.0, self.t >= self.n, truncated, info


def _episode_stats_env(n):
    return gym.wrappers.RecordEpisodeStatistics(FixedLengthEnv(n))


def test_info_spec_nested_dict_declares_the_episode_statistics_of_record_episode_statistics():
    fns = [functools.partial(_episode_stats_env, 3), functools.partial(_episode_stats_env, 2)]
    pool = EnvPool(fns, seed=0, info_spec={"episode": {"r": 0.0, "l": 0, "t": 0.0}})
    assert _info_keys(pool) == {("episode", "l"), ("episode", "r"), ("episode", "t")}
    out = pool.rollout(7, break_when_any_done=False)
    done = out["next", "done"].squeeze(-1)
    assert done.tolist() == [[False, False, True] * 2 + [False], [False, True] * 3 + [False]]
    for key in ("r", "l", "t"):
        assert out["next", "info_mask", "episode", key].squeeze(-1).tolist() == done.tolist()
    r, length = out["next", "info", "episode", "r"].squeeze(-1), out["next", "info", "episode", "l"].squeeze(-1)
    assert r[done].tolist() == [3.0, 3.0, 2.0, 2.0, 2.0] and length[done].tolist() == [3, 3, 2, 2, 2]
    assert (r[~done] == 0).all() and (length[~done] == 0).all()
    pool.close()


# -- EnvPool.to(device) moves the outputs, as TorchRL's Collector(env_device=...) needs ------------------------
class _UnboundedCounter(gym.Env):
    """Unbounded specs only (they can move to the "meta" device, the CPU stand-in for an accelerator);
    the observation counts steps, and an episode terminates every 3 steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, float(self.np_random.integers(100))], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, float(action)], np.float32), float(action), self.t % 3 == 0, False, {}


@pytest.mark.parametrize("device", ["meta"] + (["cuda"] if torch.cuda.is_available() else []))
def test_to_moves_the_outputs_not_only_the_specs(device):
    pool, twin = EnvPool([_UnboundedCounter] * 3, seed=0), EnvPool([_UnboundedCounter] * 3, seed=0)
    try:
        assert pool.to(device) is pool and pool.device.type == device
        td = pool.reset()
        assert td.device.type == device and td["observation"].device.type == device
        if device == "meta":  # meta tensors hold no data: a host action reaches the envs, the outputs go to meta
            out = pool._step(TensorDict({"action": torch.ones(3, dtype=torch.int64)}, [3]))
            assert out.device.type == device and all(v.device.type == device for v in out.values(True, True))
        else:
            td.set("action", torch.ones(3, dtype=torch.int64, device=device))
            out, nxt = pool.step_and_maybe_reset(td)
            assert out["next", "observation"].device.type == device and nxt["observation"].device.type == device
            assert pool.rollout(4, break_when_any_done=False)["next", "done"].device.type == device
        # and back: every output on the CPU again and equal to a pool that never moved, resets included
        pool.to("cpu")
        actions = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
        td, ref = pool.reset(seed=5), twin.reset(seed=5)
        for action in actions:
            td["action"], ref["action"] = action, action.clone()
            (out, td), (expected, ref) = pool.step_and_maybe_reset(td), twin.step_and_maybe_reset(ref)
            assert out.device == torch.device("cpu")
            assert (out == expected).all() and (td == ref).all()
    finally:
        pool.close()
        twin.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_collector_with_env_device_cuda_moves_a_cpu_pool():
    from torchrl.collectors import Collector

    collector = Collector(EnvPool("CartPole-v1", num_envs=4, seed=0), None, frames_per_batch=64, total_frames=64,
                          env_device="cuda")
    reference = Collector(EnvPool("CartPole-v1", num_envs=4, seed=0), None, frames_per_batch=64, total_frames=64)
    try:
        batch, expected = next(iter(collector)), next(iter(reference))
        assert batch["next", "observation"].device.type == "cuda"
        torch.testing.assert_close(batch["next", "done"].cpu(), expected["next", "done"])
    finally:
        collector.shutdown()
        reference.shutdown()


# -- the construction probe: a legal action for masked envs, and no step when the arguments settle the infos ----
class _LoggedMaskedEnv(gym.Env):
    """Only action 2 is legal (its "action_mask" is in the observation, or the info); every call is logged."""

    action_space = gym.spaces.Discrete(4)

    def __init__(self, mask_in: str = "obs"):
        self.mask_in, self.log = mask_in, []
        box = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.observation_space = (gym.spaces.Dict({"observation": box, "action_mask": gym.spaces.MultiBinary(4)})
                                  if mask_in == "obs" else box)
        self.mask = np.array([0, 0, 1, 0], np.int8)

    def _out(self, info):
        if self.mask_in == "obs":
            return {"observation": np.zeros(2, np.float32), "action_mask": self.mask}, info
        return np.zeros(2, np.float32), {**info, "action_mask": self.mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.log.append("reset")
        return self._out({})

    def step(self, action):
        self.log.append(("step", int(action)))
        if not self.mask[action]:
            raise ValueError(f"illegal action {action}")
        obs, info = self._out({"score": 1.0})
        return obs, 1.0, False, False, info


@pytest.mark.parametrize("mask_in", ["obs", "info"])
def test_the_construction_probe_takes_a_legal_action_in_a_masked_env(mask_in):
    pool = EnvPool([functools.partial(_LoggedMaskedEnv, mask_in)] * 3, seed=0)
    try:
        assert pool.call("get_wrapper_attr", "log") == [["reset", ("step", 2)]] * 3
        assert ("info", "score") in pool.observation_spec.keys(True, True)
    finally:
        pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("settled", [dict(info_keys=[]), dict(info_keys=["score"], info_spec={"score": 0.0})])
def test_info_keys_that_settle_the_schema_skip_the_construction_step(backend, settled):
    pool = EnvPool([functools.partial(_LoggedMaskedEnv, "obs")] * 2, seed=0, backend=backend, **settled)
    try:
        assert pool.call("get_wrapper_attr", "log") == [["reset"]] * 2
        td = pool.reset()
        td["action"] = torch.full((2,), 2)
        out = pool.step(td)
        if settled["info_keys"]:
            assert out["next", "info", "score"].tolist() == [[1.0], [1.0]]
        else:
            assert "info" not in out["next"].keys()
    finally:
        pool.close()
    # a key chosen but not declared still needs the step, to find its spec
    pool = EnvPool([functools.partial(_LoggedMaskedEnv, "obs")] * 2, seed=0, info_keys=["score"])
    assert pool.call("get_wrapper_attr", "log") == [["reset", ("step", 2)]] * 2
    pool.close()


class _RefusesRandomActions(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise ValueError(f"illegal action {action}")


def test_a_construction_step_that_raises_says_how_to_skip_it():
    with pytest.raises(EnvError, match=r"env 0 \(step\).*illegal action.*info_keys=\[\]") as caught:
        EnvPool([_RefusesRandomActions] * 2, seed=0)
    assert isinstance(caught.value.__cause__, ValueError)
    pool = EnvPool([_RefusesRandomActions] * 2, seed=0, info_keys=[])  # the way out it names
    assert pool.reset()["observation"].shape == (2, 2)
    pool.close()


class _ScoredEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {"a": 1.0}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {"a": 2.0, "b": 3}


@pytest.mark.parametrize("make_keys", [lambda: iter(["a", "b"]), lambda: (k for k in ["a", "b"]), lambda: ["a", "b"]])
def test_info_keys_given_as_any_iterable_are_read_once(make_keys):
    pool = EnvPool([_ScoredEnv] * 2, seed=0, info_keys=make_keys())
    assert sorted(k[1] for k in pool.observation_spec.keys(True, True) if k[0] == "info") == ["a", "b"]
    pool.close()


def test_the_vector_backend_probe_takes_a_legal_action_per_row():
    venv = gym.vector.SyncVectorEnv([functools.partial(_LoggedMaskedEnv, "info")] * 3)
    pool = EnvPool(venv, seed=0)
    try:
        assert [env.log for env in venv.envs] == [["reset", ("step", 2)]] * 3
    finally:
        pool.close()


def test_version_less_ids_resolve_to_the_latest_version_as_gym_make():
    from torchrl_swm.envs import spec

    assert spec("CartPole").id == "CartPole-v1" and spec("gymnasium:CartPole").id == "CartPole-v1"
    with pytest.warns(Warning, match="CartPole-v1"):  # gym.make's own warning, in the factory
        pool = EnvPool("CartPole", num_envs=2, seed=0)
    assert pool.reset()["observation"].shape == (2, 4)
    pool.close()


class _IntKeyedDictEnv(gym.Env):
    """A Dict observation keyed by agent ids (ints), nested too; SyncVectorEnv takes it as is."""

    observation_space = gym.spaces.Dict({
        1: gym.spaces.Box(-10, 10, (2,), np.float32),
        2: gym.spaces.Dict({7: gym.spaces.Discrete(5)}),
    })
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return {1: np.full(2, self.t, np.float32), 2: {7: self.t % 5}}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 3, False, {}


@pytest.mark.parametrize("backend", ["serial", "vector"])
def test_dict_observations_with_non_string_keys_are_read_with_the_envs_keys(backend):
    """The pool's keys are the strings ("1", ("2", "7")); the values are read with the env's own keys."""
    env_fns = [_IntKeyedDictEnv] * 2
    pool = EnvPool(gym.vector.SyncVectorEnv(env_fns) if backend == "vector" else env_fns, seed=0)
    try:
        td = pool.reset()
        assert td["1"].tolist() == [[0.0, 0.0]] * 2 and td["2", "7"].tolist() == [0, 0]
        for t in (1, 2):
            td["action"] = torch.zeros(2, dtype=torch.int64)
            out, td = pool.step_and_maybe_reset(td)
            assert out["next", "1"].tolist() == [[t, t]] * 2 and out["next", "2", "7"].tolist() == [t, t]
    finally:
        pool.close()


class _ArrayRewardEnv(gym.Env):
    """Returns its reward (and, with ``array_terminated``, its terminated flag) as (1,) arrays, which
    gymnasium's vector envs refuse."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, array_terminated=True):
        self.array_terminated = array_terminated

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        terminated = np.array([False]) if self.array_terminated else False
        return np.zeros(2, np.float32), np.array([1.5], np.float32), terminated, False, {}


@pytest.mark.parametrize("array_terminated", [True, False], ids=["reward and terminated", "reward alone"])
@pytest.mark.parametrize("num_envs", [1, 3])
def test_a_reward_of_shape_1_is_refused_whatever_the_number_of_rows_stepped(num_envs, array_terminated):
    # a (1,) reward is refused even in a one-env pool, where numpy would store it in the (1,) row silently
    pool = EnvPool([functools.partial(_ArrayRewardEnv, array_terminated)] * num_envs, seed=0, info_keys=[])
    try:
        td = pool.reset()
        td["action"] = torch.zeros(num_envs, dtype=torch.int64)
        with pytest.raises(EnvError, match=r"env 0 \(step\): reward: expected a scalar float, got ndarray"):
            pool.step(td)
        if num_envs > 1:  # one row stepped: the same verdict
            td = pool.reset().set("action", torch.zeros(num_envs, dtype=torch.int64))
            td["_step"] = torch.tensor([[True]] + [[False]] * (num_envs - 1))
            with pytest.raises(EnvError, match="reward: expected a scalar float"):
                pool.step(td)
    finally:
        pool.close()


@pytest.mark.parametrize("space", [
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3))),
    gym.spaces.Dict({"a": gym.spaces.Discrete(2)}),
    gym.spaces.Text(4),
])
def test_an_unsupported_action_space_lists_only_the_supported_ones(space):
    class Env(_ScoredEnv):
        action_space = space

    with pytest.raises(SpecError, match=rf"{type(space).__name__} action spaces .* expected Box, Discrete, "
                                        r"MultiDiscrete or MultiBinary\. Flatten"):
        EnvPool([Env], seed=0)


# -- process backend: a slow env.close(), a terminal's Ctrl-C, missing attributes, dead workers -----------------
class _SlowCloseEnv(SlowEnv):
    """close() takes ``seconds`` and then writes ``path`` (as a video or log flush would)."""

    def __init__(self, path, seconds, step_delay=0.0):
        super().__init__(step_delay)
        self.path, self.seconds = path, seconds

    def close(self):
        time.sleep(self.seconds)
        with open(self.path, "w") as f:
            f.write("closed")


def test_process_close_waits_for_a_slow_env_close_as_the_serial_backend(tmp_path, monkeypatch):
    from torchrl_swm.pool import process

    monkeypatch.setattr(process, "_CLOSE_TIMEOUT", 0.2)  # the limit for busy workers only: idle ones are waited for
    paths = [tmp_path / f"closed_{i}" for i in range(2)]
    pool = EnvPool([functools.partial(_SlowCloseEnv, str(p), 1.0) for p in paths], backend="process", num_workers=2)
    processes = _workers(pool)
    try:
        pool.reset()
        with warnings_as_errors():
            pool.close()
        assert all(p.read_text() == "closed" for p in paths)
    finally:
        _reap(processes)


def test_a_process_pool_collected_unclosed_in_a_cycle_waits_for_a_slow_env_close(tmp_path, monkeypatch):
    """The backend's finalizer runs before EnvPool.__del__ when the cyclic GC frees a pool (weakref callbacks
    come first): it used to give the worker 5 s and terminate it silently, so a close() longer than that
    (a video flushed) never finished. It waits for an idle worker, as close() and the serial backend do."""
    import gc

    from torchrl_swm.pool import process

    monkeypatch.setattr(process, "_CLOSE_TIMEOUT", 0.2)  # the limit for busy workers only: idle ones are waited for
    path = tmp_path / "closed"
    pool = EnvPool([functools.partial(_SlowCloseEnv, str(path), 5.5)], backend="process", num_workers=1)
    processes, pids = _workers(pool), pool._backend.pids
    try:
        pool.reset()
        holder = {"pool": pool}
        holder["self"] = holder  # owned by an object graph with a cycle (a trainer, a collector...)
        del pool, holder
        with warnings_as_errors():
            gc.collect()
        assert path.read_text() == "closed"
        assert_reaped(pids)
    finally:
        _reap(processes)


def test_a_process_pool_collected_unclosed_after_an_interrupt_gives_its_stuck_workers_one_deadline(monkeypatch):
    """Ctrl-C in a hung step, then the script ends without close(): the finalizer terminates the stuck workers
    after one _CLOSE_TIMEOUT shared by all, as close() does (it waited that long for each in turn)."""
    import gc

    from torchrl_swm.pool import process

    monkeypatch.setattr(process, "_CLOSE_TIMEOUT", 2.0)
    pool = EnvPool([functools.partial(SlowEnv, 3600.0)] * 4, backend="process", num_workers=4, seed=0)
    processes, pids = _workers(pool), pool._backend.pids
    try:
        _step_interrupted(pool, 0.5)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="was terminated"):
            del pool
            gc.collect()
        assert time.monotonic() - start < 6.0  # 4 workers waited for in turn: 8 s
        assert_reaped(pids)
    finally:
        _reap(processes)


def test_a_process_pool_collected_unclosed_waits_for_a_worker_whose_interrupted_call_has_returned(tmp_path,
                                                                                                monkeypatch):
    """An interrupted step that returned before the pool was collected leaves its worker idle: its envs' close()
    is waited for however long it takes, as close() does, not cut off at _CLOSE_TIMEOUT with a false warning."""
    import gc

    from torchrl_swm.pool import process

    monkeypatch.setattr(process, "_CLOSE_TIMEOUT", 1.0)
    path = tmp_path / "closed"
    pool = EnvPool([functools.partial(_SlowCloseEnv, str(path), 2.5, 1.0), SlowEnv], backend="process",
                   num_workers=2, seed=0)
    processes, pids = _workers(pool), pool._backend.pids
    try:
        _step_interrupted(pool, 0.3)  # the step takes 1 s: it has returned in the worker 1 s later
        time.sleep(1.5)
        with warnings_as_errors():
            del pool
            gc.collect()
        assert path.read_text() == "closed"
        assert_reaped(pids)
    finally:
        _reap(processes)


@contextlib.contextmanager
def warnings_as_errors():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_a_terminal_ctrl_c_reaching_the_workers_leaves_them_running():
    """A terminal's Ctrl-C goes to the whole process group: the workers ignore it, the pool stays usable."""
    with _process_pool([functools.partial(SlowEnv, 0.0)] * 4, 2) as pool:
        td = pool.reset()
        for proc in _workers(pool):
            os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        assert all(proc.is_alive() for proc in _workers(pool))
        td["action"] = torch.zeros(4, dtype=torch.int64)
        assert pool.step(td)["next", "observation"].tolist() == [[1.0]] * 4


class _MaybeGoal(SlowEnv):
    def __init__(self, has_goal):
        super().__init__(0.0)
        if has_goal:
            self.goal = 3


@pytest.mark.parametrize("backend", ["serial", "process", "sync_vector"])
def test_a_missing_attribute_is_an_attribute_error_naming_the_env_on_every_backend(backend):
    from torchrl_swm.errors import EnvAttributeError

    fns = [functools.partial(_MaybeGoal, i != 2) for i in range(4)]
    if backend == "sync_vector":  # its envs run here: the traceback says which one lacks it
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, backend=backend, num_workers=2, seed=0) if backend == "process" else EnvPool(fns, seed=0)
    try:
        for call in (lambda: pool.get_attr("goal"), lambda: pool.call("goal")):
            with pytest.raises(AttributeError, match="has no attribute 'goal'") as caught:
                call()
            assert isinstance(caught.value, EnvAttributeError) and caught.value.env_index == 2
        if backend != "sync_vector":  # a vector env's get_attr reaches every env
            assert pool.get_attr("goal", indices=[0, 3]) == [3, 3]
    finally:
        pool.close()


def test_a_dead_worker_is_not_blamed_on_one_of_its_envs():
    with _process_pool([functools.partial(SlowEnv, 0.0)] * 4, 2) as pool:
        td = pool.reset()
        os.kill(_workers(pool)[1].pid, signal.SIGKILL)
        td["action"] = torch.zeros(4, dtype=torch.int64)
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2..3, pid \d+\) died") as caught:
            pool.step(td)
        assert caught.value.env_index is None


class _FailingCloseEnv(SlowEnv):
    def close(self):
        raise RuntimeError("close failed: video not written")


def test_close_after_a_caught_interrupt_reads_the_envs_own_close_replies():
    """The step an interrupt left running finishes within the limit: its stale reply is dropped, and
    close() then waits for the real close replies (here an env's close() error, reported)."""
    pool = EnvPool([functools.partial(_FailingCloseEnv, 0.6)] * 2, backend="process", num_workers=2, seed=0)
    processes = _workers(pool)
    try:
        _step_interrupted(pool, 0.2)
        with warnings_as_errors(), pytest.raises(EnvError, match=r"env 0 \(close\): .*video not written"):
            pool.close()  # no worker is stuck (no warning), and the close error is not lost
    finally:
        _reap(processes)


def test_a_vector_env_pool_reports_a_missing_attribute_as_env_attribute_error():
    from torchrl_swm.errors import EnvAttributeError

    pool = EnvPool(gym.vector.SyncVectorEnv([functools.partial(SlowEnv, 0.0)] * 2), seed=0)
    try:
        for call in (lambda: pool.get_attr("nope"), lambda: pool.call("nope"), lambda: pool.call("nope", indices=[1])):
            with pytest.raises(EnvAttributeError, match="nope"):
                call()
    finally:
        pool.close()


# -- a caught Ctrl-C, then a step that freezes rows (process backend) --------------------------------
class PayingSlowEnv(SlowEnv):
    """A SlowEnv whose every step pays reward 1."""

    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        return obs, 1.0, term, trunc, info


@contextlib.contextmanager
def _interrupted_step(env_fns, step_mask=None, settle: float = 0.0):
    """A 2-worker process pool of ``env_fns`` (4 envs), reset and stepped with zero actions (the rows of
    ``step_mask``) with a real SIGINT (Ctrl-C) delivered 0.3 s into the step; yields ``(pool, the tensordict it
    stepped)`` ``settle`` seconds after the interrupt. Python's default SIGINT handler is installed meanwhile (a
    background run may ignore SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _process_pool(env_fns, 2) as pool:
            td = pool.reset()
            td["action"] = torch.zeros(4, dtype=torch.int64)
            if step_mask is not None:
                td["_step"] = torch.tensor(step_mask).view(4, 1)
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                pool.step(td)
                time.sleep(3)  # (a signal that came late lands here, not in pytest)
            timer.cancel()
            time.sleep(settle)
            yield pool, td
    finally:
        signal.signal(signal.SIGINT, previous)


def test_process_backend_frozen_rows_report_zero_reward_after_an_interrupted_step():
    # the interrupted step's slow workers finish it after the pool's process has moved on: their rewards
    # must not land on the zeros the next step gives its frozen rows
    fns = [PayingSlowEnv, PayingSlowEnv, functools.partial(PayingSlowEnv, 1.0), functools.partial(PayingSlowEnv, 1.0)]
    # worker 1's envs sleep 1 s: the Ctrl-C lands while they step
    with _interrupted_step(fns, [False, False, True, True]) as (pool, td):
        td["_step"] = torch.tensor([[True], [True], [False], [False]])
        out = pool.step(td)  # rows 2-3 must be reset before they step again, not before they are frozen
        assert out["next", "reward"].view(-1).tolist() == [1.0, 1.0, 0.0, 0.0]
        # the interrupted step happened in envs 2-3; the frozen rows keep its observation
        assert out["next", "observation"].view(-1).tolist() == [1.0, 1.0, 1.0, 1.0]


class SlowFailingEnv(SlowEnv):
    """A SlowEnv whose first step after the probe sleeps ``delay`` seconds, then raises (once)."""

    failed = False

    def step(self, action):
        if not self.probing and not self.failed:
            self.failed = True
            time.sleep(self.delay)
            raise ValueError("transient failure")
        return super().step(action)


@pytest.mark.parametrize("raises", ["before", "after"])
def test_process_backend_an_env_error_in_an_interrupted_step_is_raised_by_the_next_command(raises):
    # env 3 (worker 1) raises in the step a Ctrl-C interrupts: its reply comes before the interrupt (the other
    # worker's envs are slow) or after it (it is slow itself). Either way the next command raises it, never
    # stepping on as if env 3 were fine
    slow, failing = (1.0, 0.0) if raises == "before" else (0.0, 1.0)
    fns = [functools.partial(SlowEnv, slow)] * 2 + [SlowEnv, functools.partial(SlowFailingEnv, failing)]
    with _interrupted_step(fns, settle=1.5) as (pool, td):  # every worker has finished the interrupted step
        with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: transient failure") as err:
            pool.step(td)
        assert "interrupted" in "\n".join(err.value.__notes__)
        assert err.value.env_index == 3
        pool.set_attr("delay", 0.0)  # reported once, before anything was sent
        # envs 0-2 stepped in the interrupted step, with no transition returned: reset before they step
        with pytest.raises(EnvError, match=r"envs \[0, 1, 2, 3\] since a step of theirs raised"):
            pool.step(td)
        td = pool.reset().set("action", torch.zeros(4, dtype=torch.int64))
        assert pool.step(td)["next", "observation"].view(-1).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_process_backend_env_errors_in_two_workers_of_an_interrupted_step_name_the_lowest_env_as_serial():
    # envs 1 (worker 0) and 3 (worker 1) both raise in the step a Ctrl-C interrupts, after the interrupt: the next
    # command reports env 1, the env a serial loop would have raised first, not the last reply it read
    fns = [SlowEnv, functools.partial(SlowFailingEnv, 1.0)] * 2
    with _interrupted_step(fns, settle=1.5) as (pool, td):  # every worker has finished the interrupted step
        with pytest.raises(EnvError, match=r"env 1 \(step\): ValueError: transient failure") as err:
            pool.step(td)
        assert err.value.env_index == 1 and "interrupted" in "\n".join(err.value.__notes__)


def _returns_none():
    return None


def _slow_cartpole():
    time.sleep(30)
    return gym.make("CartPole-v1")


def test_ctrl_c_during_construction_after_a_workers_own_error_stays_a_keyboard_interrupt():
    # worker 0 replies at once with the pool's own (non-EnvError) refusal of its factory's return, worker 1 is
    # still making its env when Ctrl-C lands: the interrupt (or that refusal) comes out, never an AttributeError
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(15, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises((KeyboardInterrupt, TypeError)):
            EnvPool([_returns_none, _slow_cartpole], backend="process", num_workers=2)
            time.sleep(30)  # (a signal that came late lands here, not in pytest)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def test_an_out_of_date_id_warns_as_gym_make_does():
    # the factories carry the resolved EnvSpec: gym.make(spec) would skip gym.make(id)'s version check
    with pytest.warns(Warning, match="CartPole-v0 is out of date"):
        pool = EnvPool("CartPole-v0", num_envs=2, seed=0)
    pool.close()


class _IgnoresSigterm(gym.Env):
    """A simulator-like env whose process handles SIGTERM itself, and whose armed step blocks for a long time."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.armed = False  # the construction probe's step must return
        signal.signal(signal.SIGTERM, lambda *_: None)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        end = time.time() + (600 if self.armed else 0)
        while time.time() < end:
            time.sleep(0.05)
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_close_after_a_ctrl_c_kills_a_stuck_worker_that_ignores_sigterm(monkeypatch):
    # close() terminates a worker an interrupt left in an env call; one that survives SIGTERM is killed,
    # never waited for without end by the finalizer that follows
    import threading

    from torchrl_swm.pool import process

    monkeypatch.setattr(process, "_CLOSE_TIMEOUT", 0.2)
    pool = EnvPool([_IgnoresSigterm], backend="process", num_workers=1)
    processes, pids = _workers(pool), pool._backend.pids
    try:
        pool.reset()
        pool.set_attr("armed", True)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            pool.rand_step()
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="was still in an env call and was terminated"):
            pool.close()
        assert time.monotonic() - start < 30
        assert_reaped(pids)  # killed and waited for
    finally:
        _reap(processes)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_pool_is_a_context_manager_that_closes_it_even_on_an_error(backend):
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    with EnvPool("CartPole-v1", num_envs=2, seed=0, **kwargs) as pool:
        assert pool.reset()["observation"].shape == (2, 4)
    assert pool.is_closed
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset()
    with pytest.raises(ZeroDivisionError):
        with EnvPool("CartPole-v1", num_envs=2, seed=0, **kwargs) as pool:
            1 / 0
    assert pool.is_closed
    pool.close()  # closing again is fine


def test_a_pool_takes_a_gymnasium_env_spec_as_an_id():
    spec = gym.spec("CartPole-v1")
    with EnvPool(spec, num_envs=2, seed=0) as pool, EnvPool("CartPole-v1", num_envs=2, seed=0) as same:
        assert pool.env_spec.id == "CartPole-v1" and pool.env_spec.max_episode_steps == 500
        rollouts = []
        for env in (pool, same):
            torch.manual_seed(0)  # the same random actions
            rollouts.append(env.rollout(20, break_when_any_done=False))
        torch.testing.assert_close(*rollouts)
    needs = r"EnvPool\('CartPole-v1'\) needs num_envs= \(the number of parallel envs\), got None"
    with pytest.raises(ValueError, match=needs):
        EnvPool(spec)


def test_a_ctrl_c_held_under_the_default_sigint_action_still_ends_the_process():
    # a script that set SIGINT to SIG_DFL (Ctrl-C kills at once) and pressed it while the pool held interrupts:
    # released, the Ctrl-C is delivered again with that action (the process ends by SIGINT), never dropped
    import subprocess

    code = ("import os, signal\nfrom torchrl_swm._interrupts import interrupts_held\n"
            "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "with interrupts_held():\n    os.kill(os.getpid(), signal.SIGINT)\n    print('held', flush=True)\n"
            "print('the Ctrl-C was dropped')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGINT and out.stdout == "held\n", (out.returncode, out.stdout, out.stderr)


@pytest.mark.parametrize("masked", [False, True])
def test_a_ctrl_c_that_lands_as_the_step_loop_ends_is_raised_as_the_interrupt(masked):
    # every env had stepped when the interrupt came: naming "the env being stepped" indexed past the loop's order,
    # and an IndexError ("range object index out of range") replaced the KeyboardInterrupt (review R6 d: one
    # Ctrl-C'd collect recorded it as its interruption reason)
    import types

    from envs import CountingEnv

    class InterruptedAtTheEnd(list):
        def __iter__(self):
            yield from list.__iter__(self)
            raise KeyboardInterrupt

    pool = EnvPool([functools.partial(CountingEnv, length=50)] * 3, seed=0)
    try:
        td = pool.reset().set("action", torch.ones(3, dtype=torch.int64))
        if masked:  # (a masked step loops over the row order, not the envs)
            td["_step"] = torch.ones(3, 1, dtype=torch.bool)
            td["_step"][1] = False
        backend = pool._backend
        envs = backend.envs
        backend.envs = InterruptedAtTheEnd(envs)
        order = types.SimpleNamespace(tolist=lambda: InterruptedAtTheEnd([0, 2]))
        try:
            with pytest.raises(KeyboardInterrupt) as caught:
                if masked:
                    backend.step([1, 1], order)
                else:
                    pool.step(td)
        finally:
            backend.envs = envs
        assert getattr(caught.value, "env_index", None) is None  # no env was mid-step
        td = pool.reset()  # the usual recovery
        assert td["observation"][:, 0].tolist() == [0.0, 0.0, 0.0]
    finally:
        pool.close()


def test_the_repr_names_attributes_the_pool_has():
    # the repr said observation_space=..., an attribute the pool lacks: a gymnasium user typed it from there
    import re

    pool = EnvPool("CartPole-v1", num_envs=2, seed=0)
    text = repr(pool)
    names = re.findall(r"(\w+)=", text)
    assert {"num_envs", "single_observation_space", "single_action_space"} <= set(names)
    for name in set(names) - {"info_keys"}:  # info_keys: the info leaves, listed for reading
        assert f"{name}={getattr(pool, name)}" in text
    pool.close()


class _LowPrecisionTensorObsEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, dtype):
        self.dtype = dtype

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return torch.tensor([0.5, 1.0], dtype=self.dtype), {}

    def step(self, action):
        return torch.tensor([0.5, 3.0], dtype=self.dtype), 0.0, False, False, {}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_a_bfloat16_or_float8_tensor_observation_is_stored_exactly(dtype):
    # numpy has no such dtype: the pool failed with numpy's bare "Got unsupported ScalarType BFloat16", where infos
    # and actions already took them (float32 holds their values exactly) (review D D3, round 17)
    pool = EnvPool([functools.partial(_LowPrecisionTensorObsEnv, dtype)] * 2, seed=0)
    td = pool.reset()
    assert td["observation"].tolist() == [[0.5, 1.0]] * 2
    td["action"] = torch.zeros(2, dtype=torch.int64)
    assert pool.step(td)["next", "observation"].tolist() == [[0.5, 3.0]] * 2
    pool.close()
