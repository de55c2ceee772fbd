"""Bad input gets clear errors; failing envs are named; the pool can still be closed."""

import functools
import re
import types

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, DictObsEnv, FailingEnv, HumanRenderOnly, assert_reaped, counting
from tensordict import TensorDict
from torchrl.envs import StepCounter, TransformedEnv

from torchrl_swm import EnvError, EnvPool, SpecError, StepRefusedError
from torchrl_swm.errors import error_text


def fresh(pool):
    td = pool.reset()
    return td


@pytest.mark.parametrize(
    "action, error, match",
    [
        (torch.zeros(3, dtype=torch.int64), ValueError, r"expected shape \(4,\)"),
        (torch.zeros(4, 1, dtype=torch.int64), ValueError, r"expected shape \(4,\)"),
        (torch.zeros(4), TypeError, "integer dtype"),
        (torch.tensor([0, 1, 3, 0]), ValueError, r"env 2.*\[0, 3\).*got 3"),
        (torch.tensor([0, -1, 0, 0]), ValueError, r"env 1"),
    ],
)
def test_bad_discrete_actions(action, error, match):
    pool = EnvPool([functools.partial(counting, length=10)] * 4, seed=0)
    fresh(pool)
    with pytest.raises(error, match=match):
        pool._step(TensorDict({"action": action}, batch_size=[]))
    pool.close()


def test_bad_one_hot_action():
    pool = EnvPool([functools.partial(counting, length=10)] * 2, seed=0, categorical_action_encoding=False)
    assert pool.action_spec.shape == (2, 3)
    td = fresh(pool)
    td["action"] = torch.tensor([[1, 0, 0], [1, 1, 0]])
    with pytest.raises(ValueError, match="env 1.*one-hot"):
        pool._step(td)
    td["action"] = torch.tensor([[0, 0, 1], [0, 1, 0]])
    out = pool.step(td)["next"]
    assert out["reward"].view(-1).tolist() == [2.0, 1.0]
    pool.close()


@pytest.mark.parametrize("backend, masked", [("serial", False), ("serial", True), ("process", False),
                                             ("process", True), ("vector", False)],
                         ids=["serial", "serial-step-mask", "process", "process-step-mask", "vector"])
def test_a_bool_action_for_a_discrete_space_is_a_type_error_on_every_decode_path(backend, masked):
    # a bool is no index: read as one, True would reach a Discrete(3, start=5) env as 6 and False as 5, both in its
    # space. Refused on the serial backend's whole-batch and "_step" row paths and on the batched decode of the
    # process and vector backends, with and without a mask
    from envs import DiscreteEchoEnv

    fns = [functools.partial(DiscreteEchoEnv, 3, 5)] * 3
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv(fns), seed=0)
    else:
        pool = EnvPool(fns, seed=0, backend=backend, num_workers=2)
    with pool:
        td = fresh(pool)
        if masked:
            td["_step"] = torch.tensor([[True], [False], [True]])
        td["action"] = torch.tensor([True, False, True])
        with pytest.raises(TypeError, match=r"expected an integer dtype \(torch.int64\) for a Categorical action, "
                                            r"got torch.bool"):
            pool.step(td)
        td["action"] = torch.tensor([1, 2, 0])  # indices: start + index
        expected = [6.0, 0.0, 5.0] if masked else [6.0, 7.0, 5.0]  # (a frozen row keeps its reset observation 0)
        assert pool.step(td)["next", "observation"].view(-1).tolist() == expected


def test_box_action_dtype_and_shape():
    pool = EnvPool([DictObsEnv] * 2, seed=0)
    td = fresh(pool)
    td["action"] = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="floating dtype"):
        pool._step(td)
    td["action"] = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"expected shape \(2, 2\)"):
        pool._step(td)
    pool.close()


def test_frozen_rows_actions_are_not_validated():
    pool = EnvPool([functools.partial(counting, length=10)] * 2, seed=0)
    td = fresh(pool)
    td["action"] = torch.tensor([1, 99])
    td["_step"] = torch.tensor([[True], [False]])
    assert pool.step(td)["next", "reward"].view(-1).tolist() == [1.0, 0.0]
    pool.close()


def test_bad_action_under_a_step_mask_names_the_env_not_its_position_among_the_stepped_rows():
    pool = EnvPool([functools.partial(counting, length=10)] * 4, seed=0)
    td = fresh(pool)
    td["action"] = torch.tensor([0, 0, 0, 7])  # env 3 is the second stepped row
    td["_step"] = torch.tensor([[False], [True], [False], [True]])
    with pytest.raises(ValueError, match=r"env 3.*got 7"):
        pool.step(td)
    pool.close()


def test_env_raising_in_step_is_named_and_chained_and_pool_closes():
    fns = [functools.partial(counting, length=50)] * 3 + [functools.partial(FailingEnv, fail_at=3)]
    pool = EnvPool(fns, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(4, dtype=torch.int64)
    pool.step(td)  # the probe made step 1, this is step 2
    with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: boom") as err:
        pool.step(td)
    assert err.value.env_index == 3 and isinstance(err.value.__cause__, ValueError)
    pool.close()
    assert pool.is_closed


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_envs_raising_in_the_same_step_name_the_lowest_env_on_both_backends(backend):
    # envs 1 and 3 raise in the same step (with 2 workers, one in each worker): the error names env 1, as a
    # serial pool stepping the envs in order does
    kwargs = {"num_workers": 2} if backend == "process" else {}
    fns = [functools.partial(counting, length=50), functools.partial(FailingEnv, fail_at=3)] * 2
    pool = EnvPool(fns, seed=0, backend=backend, **kwargs)
    td = pool.reset()
    with pytest.raises(EnvError, match=r"env 1 \(step\): ValueError: boom") as err:
        for _ in range(5):
            td = pool.step(td.set("action", torch.zeros(4, dtype=torch.int64)))["next"]
    assert err.value.env_index == 1
    pool.close()


class _SilentFailure(CountingEnv):
    """Raises an exception with no message at its second step."""

    def step(self, action):
        if self.steps_called >= 1:
            raise KeyError()
        return super().step(action)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_an_env_error_without_a_message_is_named_by_its_type_alone(backend):
    # "env 1 (step): KeyError", not "KeyError: " with nothing after it
    pool = EnvPool([counting, _SilentFailure], seed=0, backend=backend)
    td = pool.reset().set("action", torch.zeros(2, dtype=torch.int64))
    with pytest.raises(EnvError) as err:
        for _ in range(3):
            td = pool.step(td)["next"].set("action", torch.zeros(2, dtype=torch.int64))
    assert str(err.value).splitlines()[0] == "env 1 (step): KeyError" and err.value.env_index == 1
    pool.close()


def test_env_raising_in_reset_is_named():
    fns = [functools.partial(counting, length=50), functools.partial(FailingEnv, in_reset=True)]
    pool = EnvPool(fns, seed=0)
    with pytest.raises(EnvError, match=r"env 1 \(reset\): ValueError: reset exploded") as err:
        pool.reset()
    assert isinstance(err.value.__cause__, ValueError)
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_factory_returning_a_non_env_or_not_callable_is_the_same_type_error_on_both_backends(backend):
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    with pytest.raises(TypeError, match=r"env_fns\[1\] returned builtins.int, expected a gymnasium.Env"):
        EnvPool([CountingEnv, functools.partial(int, 3)], **kwargs)
    with pytest.raises(TypeError, match=r"env_fns\[1\]: expected a zero-argument callable returning a gymnasium.Env"):
        EnvPool([CountingEnv, "not callable"], **kwargs)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_close_raises_the_first_env_close_error_and_notes_the_others(backend):
    from envs import BadCloseEnv

    # process: two workers of two envs each, so a worker's own later env is noted too, across the pipe
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    pool = EnvPool([BadCloseEnv, CountingEnv, BadCloseEnv, BadCloseEnv], seed=0, **kwargs)
    with pytest.raises(EnvError, match=r"env 0 \(close\): OSError: disk gone") as err:
        pool.close()
    notes = err.value.__notes__
    assert len(notes) == 2 and all("disk gone" in note for note in notes)
    assert "env 2 (close)" in notes[0] and "env 3 (close)" in notes[1]


class _ProxyUnwrapped(CountingEnv):
    """A distinct env whose ``unwrapped`` is a fresh handle at each access (a simulator proxy)."""

    @property
    def unwrapped(self):
        return types.SimpleNamespace(env=self)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_factories_returning_one_shared_env_are_refused(backend):
    # every row would step that one env; TorchRL's SerialEnv deep-copies a repeated instance, the pool says so
    shared = CountingEnv(length=3)
    kwargs = {"backend": "process", "num_workers": 1} if backend == "process" else {}
    with pytest.raises(ValueError, match=r"env_fns\[1\] returned the same env object as env_fns\[0\]"):
        EnvPool(lambda: shared, 2, **kwargs)
    # distinct envs whose unwrapped is a new object at each access are accepted, as SyncVectorEnv does; one such
    # env returned twice is still the same env
    pool = EnvPool([_ProxyUnwrapped, _ProxyUnwrapped], seed=0)
    assert pool.reset()["observation"].shape == (2, 3)
    pool.close()
    proxy = _ProxyUnwrapped()
    with pytest.raises(ValueError, match=r"env_fns\[1\] returned the same env object as env_fns\[0\]"):
        EnvPool(lambda: proxy, 2, **kwargs)
    with pytest.raises(ValueError, match=r"env_fns\[1\] returned a wrapper of the same env object as env_fns\[0\]"):
        EnvPool(lambda: gym.wrappers.TimeLimit(proxy, 10), 2, **kwargs)  # found through the layers it wraps
    # a new wrapper per call around that env steps it all the same
    with pytest.raises(ValueError, match=r"env_fns\[1\] returned a wrapper of the same env object as env_fns\[0\]"):
        EnvPool(lambda: gym.wrappers.TimeLimit(shared, 10), 2, **kwargs)


def test_factory_raising_is_named_and_earlier_envs_are_closed():
    closed = []

    class Tracked(CountingEnv):
        def close(self):
            closed.append(True)

    def bad():
        raise RuntimeError("cannot build")

    with pytest.raises(EnvError, match=r"env 1 \(make\).*cannot build"):
        EnvPool([Tracked, bad])
    assert closed == [True]


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_factorys_exception_is_chained_on_the_make_error(backend):
    # README: "the original exception chained", on both backends (the process backend rebuilds it from the worker)
    from envs import raising_factory

    kwargs = {"num_workers": 2} if backend == "process" else {}
    with pytest.raises(EnvError, match=r"env 1 \(make\): the factory raised RuntimeError: cannot build") as info:
        EnvPool([counting, raising_factory], backend=backend, **kwargs)
    assert type(info.value.__cause__) is RuntimeError and str(info.value.__cause__) == "cannot build"


def test_a_close_error_after_a_failed_process_construction_is_a_note_on_the_construction_error():
    # the spaces differ (the error to report); closing the envs built so far then raises: a note, never lost
    from envs import CloseRaisingEnv

    def other():
        env = CountingEnv()
        env.action_space = gym.spaces.Discrete(5)
        return env

    with pytest.raises(EnvError, match=r"env 1 \(make\): spaces .*Discrete\(5\) differ from env 0's") as info:
        EnvPool([CloseRaisingEnv, other], backend="process", num_workers=2)
    assert [note.splitlines()[0] for note in info.value.__notes__] == [
        "closing the pool's other envs then failed too: env 0 (close): OSError: disk gone"]


def test_spaces_must_match_and_first_differing_env_is_named():
    def other():
        env = CountingEnv()
        env.action_space = gym.spaces.Discrete(5)
        return env

    with pytest.raises(EnvError, match=r"env 2 \(make\): action_space Discrete\(5\)"):
        EnvPool([CountingEnv, CountingEnv, other, other])


def test_unsupported_observation_space_is_named():
    class TupleEnv(CountingEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))

    with pytest.raises(SpecError, match="Tuple"):
        EnvPool([TupleEnv])


def test_reserved_dict_key_is_rejected():
    class Clash(DictObsEnv):
        def __init__(self):
            super().__init__()
            self.observation_space = gym.spaces.Dict({"reward": gym.spaces.Box(0, 1, (1,))})

    with pytest.raises(SpecError, match="'reward'"):
        EnvPool([Clash])


class _NestedReservedNames(gym.Env):
    """A Dict observation whose nested entries are named like the pool's own keys: ("arm", "action"), ("arm",
    "reward"); the observation counts the steps."""

    observation_space = gym.spaces.Dict({
        "arm": gym.spaces.Dict({"action": gym.spaces.Box(-1, 1, (2,), np.float32),
                                "reward": gym.spaces.Box(0, 100, (1,), np.float32)}),
    })
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"arm": {"action": np.zeros(2, np.float32), "reward": np.zeros(1, np.float32)}}, {}

    def step(self, action):
        self.t += 1
        obs = {"arm": {"action": np.asarray(action, np.float32), "reward": np.array([self.t], np.float32)}}
        return obs, 1.0, False, False, {}


def test_a_nested_dict_entry_named_like_a_reserved_key_is_read_back_under_its_path():
    # robot envs nest the last command under the arm ({"arm": {"action": ...}}): ("arm", "action") clashes with
    # no key the pool writes, so what a user sees is the entry read back under its path, beside the pool's own
    # "action" and "reward"; a top-level "action" entry is still refused; review R4 R11
    pool = EnvPool([_NestedReservedNames] * 2, seed=0)
    td = fresh(pool)
    assert td["arm", "action"].tolist() == [[0, 0], [0, 0]]
    td["action"] = torch.tensor([[0.5, -0.5], [0.25, 1.0]])
    out = pool.step(td)
    assert out["next", "arm", "action"].tolist() == [[0.5, -0.5], [0.25, 1.0]]
    assert out["next", "arm", "reward"].tolist() == [[1.0], [1.0]] and out["next", "reward"].tolist() == [[1.0], [1.0]]
    assert out["action"].tolist() == [[0.5, -0.5], [0.25, 1.0]]
    pool.close()

    class TopLevel(_NestedReservedNames):
        observation_space = gym.spaces.Dict({"action": gym.spaces.Box(-1, 1, (2,), np.float32)})

    with pytest.raises(SpecError, match=r"observation_space: Dict key 'action' clashes with a key the pool writes"):
        EnvPool([TopLevel])


def assert_first_step_raises(env_fns, match, **pool_kwargs):
    """Reset a pool of ``env_fns``, step it once with action 0 everywhere: an EnvError matching ``match``."""
    pool = EnvPool(env_fns, seed=0, **pool_kwargs)
    td = pool.reset()
    td["action"] = torch.zeros(len(env_fns), dtype=torch.int64)
    with pytest.raises(EnvError, match=match):
        pool.step(td)
    pool.close()


def test_observation_of_wrong_shape_is_named():
    class WrongShape(CountingEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            return obs[:2], *rest

    assert_first_step_raises([CountingEnv, WrongShape], r"env 1 \(step\): observation \('observation',\): expected shape \(3,\)")


def test_unknown_env_id_and_misused_kwargs():
    with pytest.raises(gym.error.Error, match="CartPol"):
        EnvPool("CartPol-v1", num_envs=2)
    with pytest.raises(ValueError, match="num_envs"):
        EnvPool("CartPole-v1")
    with pytest.raises(TypeError, match="only accepted with a gymnasium id"):
        EnvPool([CountingEnv], max_episode_steps=3)
    with pytest.raises(TypeError, match="returning gymnasium.Env, one such factory with num_envs"):
        EnvPool(CountingEnv())


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_close_twice_and_double_close_errors_are_reported(backend):
    import time

    from envs import BadCloseEnv

    pool = EnvPool([CountingEnv, BadCloseEnv], seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    pids = getattr(pool._backend, "pids", [])
    start = time.monotonic()
    with pytest.raises(EnvError, match=r"env 1 \(close\): OSError: disk gone") as err:
        pool.close()
    assert err.value.env_index == 1
    # a hang guard, not a benchmark: the worker reports and exits at once when idle, but on a loaded
    # 2-core CI host close() has taken ~6 s; a hang would never return
    assert time.monotonic() - start < 15
    assert_reaped(pids)  # also when an env's close() raised
    pool.close(raise_if_closed=False)  # a second close is harmless
    assert pool.is_closed


def test_close_reports_a_worker_that_dies_closing_its_envs_and_every_close_error():
    from envs import BadCloseEnv, CrashingCloseEnv

    # worker 0 dies in env 0's close(); worker 1's env 2 raises: the env's error is raised, the death noted on it
    pool = EnvPool([CrashingCloseEnv, CountingEnv, BadCloseEnv, CountingEnv], seed=0, backend="process", num_workers=2)
    pids = pool._backend.pids
    with pytest.raises(EnvError, match=r"env 2 \(close\): OSError: disk gone") as err:
        pool.close()
    assert re.fullmatch(r"also: pool \(worker\): worker 0 \(envs 0..1, pid \d+\) died with exit code 3",
                        err.value.__notes__[0])
    assert_reaped(pids)
    # alone, the death is the error (close() returned as if all went well)
    pool = EnvPool([CrashingCloseEnv, CountingEnv], seed=0, backend="process", num_workers=2)
    with pytest.raises(EnvError, match=r"worker 0 \(envs 0..0, pid \d+\) died with exit code 3$"):
        pool.close()
    assert pool.is_closed


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_closed_pool_says_it_is_closed(backend):
    from torchrl.collectors import Collector

    pool = EnvPool([counting] * 2, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    td = pool.reset()
    collector = Collector(pool, None, frames_per_batch=4, total_frames=8)
    assert [batch.numel() for batch in collector] == [4, 4]
    collector.shutdown()  # TorchRL's collector closes the env it was given
    assert pool.is_closed
    for use in (pool.reset, lambda: pool.rand_step(td), lambda: pool.rollout(3), lambda: pool.call("render"),
                lambda: pool.get_attr("length"), lambda: pool.set_seed(3)):
        with pytest.raises(RuntimeError, match=r"EnvPool is closed .*Build a new EnvPool"):
            use()
    pool.close()  # closing again is still harmless
    # a pool closed before its first reset: the step says it is closed, not that its envs were never reset
    fresh = EnvPool([counting] * 2, seed=0, backend=backend, num_workers=2 if backend == "process" else None)
    action = fresh.rand_action()
    fresh.close()
    with pytest.raises(RuntimeError, match=r"EnvPool is closed"):
        fresh.step(action)


def test_env_error_pickles_and_rebuilds_from_its_message():
    import pickle

    err = EnvError(3, "step", "ValueError: boom")
    again = pickle.loads(pickle.dumps(err))
    assert (again.env_index, again.phase, again.message, str(again)) == (3, "step", "ValueError: boom", str(err))
    # TorchRL's collector workers re-raise an exception class from one preformatted message
    rebuilt = EnvError(str(err))
    assert str(rebuilt) == "env 3 (step): ValueError: boom"
    assert (rebuilt.env_index, rebuilt.phase, rebuilt.message) == (3, "step", "ValueError: boom")  # read back
    assert str(pickle.loads(pickle.dumps(rebuilt))) == str(rebuilt)
    pool_wide = EnvError(str(EnvError(None, "sample a probe action", "x (y): z\nmore")))
    assert (pool_wide.env_index, pool_wide.phase, pool_wide.message) == (None, "sample a probe action", "x (y): z\nmore")
    for text in ("something else: boom", "env x (step): boom"):  # not an EnvError's text: kept whole
        other = EnvError(text)
        assert (other.env_index, other.phase, other.message, str(other)) == (None, None, text, text)
        assert str(pickle.loads(pickle.dumps(other))) == text



def _env_error_classes():
    from torchrl_swm import errors

    return sorted((c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, EnvError)),
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _env_error_classes(), ids=lambda c: c.__name__)
def test_every_env_error_class_survives_a_pickle_round_trip_whole(cls):
    # an error raised in a Ray actor or a TorchRL collector worker reaches the user pickled: what they see is the
    # same class (so "except StepRefusedError" / "except AttributeError" still catch it), message, env index,
    # phase and the text of the exception that caused it; review R4 E8
    import pickle

    assert {"EnvError", "StepRefusedError", "EnvAttributeError"} <= {c.__name__ for c in _env_error_classes()}
    try:
        try:
            raise ValueError("boom")
        except ValueError as cause:
            raise cls(2, "step", error_text(cause)) from cause
    except EnvError as raised:
        err = raised
    for original in (err, cls(str(err))):  # also as TorchRL's workers rebuild it, from its text alone
        again = pickle.loads(pickle.dumps(original))
        assert type(again) is cls
        assert (again.env_index, again.phase, again.message, str(again)) == (2, "step", "ValueError: boom",
                                                                             "env 2 (step): ValueError: boom")
        assert isinstance(again, AttributeError) == issubclass(cls, AttributeError)


def test_step_returning_the_old_four_tuple_is_named():
    class OldApi(CountingEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            if self.steps_called > 1:  # after the construction probe
                return obs, reward, terminated or truncated, info
            return obs, reward, terminated, truncated, info

    class OldApiAtOnce(CountingEnv):
        def step(self, action):
            return super().step(action)[:4]

    with pytest.raises(EnvError, match=r"env 1 \(step\): expected step\(\) to return .*got tuple"):
        EnvPool([CountingEnv, OldApiAtOnce], seed=0)
    assert_first_step_raises([CountingEnv, CountingEnv, OldApi],
                             r"env 2 \(step\): expected step\(\) to return \(obs, reward, terminated, truncated, info\)")

    class ExtraItem(CountingEnv):  # one env of the batch returns a 6-tuple: never silently cut to 5
        def step(self, action):
            result = super().step(action)
            return (*result, "extra") if self.steps_called > 1 else result

    assert_first_step_raises([CountingEnv, ExtraItem, CountingEnv], r"env 1 \(step\): expected step\(\) to return .*got tuple")


def test_string_observation_is_named_even_when_the_batch_would_stack():
    class Text(CountingEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            return obs.astype(str), *rest

    assert_first_step_raises([CountingEnv, Text, CountingEnv],
                             r"env 1 \(step\): observation \('observation',\): expected dtype float32")


def test_observations_in_other_forms_are_written_row_for_row():
    # float64, int, a list and a torch tensor: each cast as the per-row rule does
    def other_form(kind):
        class Form(CountingEnv):
            def step(self, action):
                obs, *rest = super().step(action)
                value = {"f64": obs.astype("float64"), "int": obs.astype("int64"), "list": obs.tolist(),
                         "tensor": torch.from_numpy(obs)}[kind]
                return value, *rest
        return Form

    kinds = ["f64", "int", "list", "tensor"]
    pool = EnvPool([CountingEnv] + [other_form(k) for k in kinds], seed=0)
    reference = EnvPool([CountingEnv] * 5, seed=0)
    for env in (pool, reference):
        env.set_seed(0)
    td, ref = pool.reset(), reference.reset()
    for t in range(12):
        action = torch.tensor([t % 3] * 5)
        td, ref = pool.step(td.set("action", action)), reference.step(ref.set("action", action))
        assert torch.equal(td["next", "observation"], ref["next", "observation"])
        assert td["next", "observation"].dtype == torch.float32
        td, ref = pool.reset(td["next"].set("_reset", td["next", "done"])), reference.reset(
            ref["next"].set("_reset", ref["next", "done"]))
    pool.close()
    reference.close()


def test_render_raising_during_a_step_is_named():
    class BadRender(CountingEnv):
        def render(self):
            if self.steps_called > 1:  # after the construction probe
                raise RuntimeError("display lost")
            return super().render()

    assert_first_step_raises([functools.partial(counting, render_mode="rgb_array"),
                              functools.partial(BadRender, render_mode="rgb_array")],
                             r"env 1 \(render\): RuntimeError: display lost", pixels=True)


class _RenderFailsAfterReset(CountingEnv):
    """render() raises once the env has been reset twice (the construction probe's reset, then the user's)."""

    def render(self):
        if self.resets_called > 1:
            raise RuntimeError("display lost")
        return super().render()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_render_raising_after_a_reset_is_named_render_not_reset(backend):
    # the reset itself succeeded: the error must point at render(), as it does on a step
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, render_mode="rgb_array"),
                    functools.partial(_RenderFailsAfterReset, render_mode="rgb_array")],
                   pixels=True, backend=backend, **kwargs)
    try:
        with pytest.raises(EnvError, match=r"env 1 \(render\): RuntimeError: display lost"):
            pool.reset()
    finally:
        pool.close()


def test_dict_keys_starting_with_an_underscore_are_refused_at_any_depth():
    # the pool keeps "_" keys for its own scratch buffers and TorchRL treats them as private:
    # such a key would be missing from every output
    for space, name in (
        (gym.spaces.Dict({"_private": gym.spaces.Box(-1, 1, (2,)), "x": gym.spaces.Box(-1, 1, (1,))}), "_private"),
        (gym.spaces.Dict({"goal": gym.spaces.Dict({"_hidden": gym.spaces.Discrete(3)})}), "_hidden"),
    ):
        class Private(DictObsEnv):
            def __init__(self, space=space):
                super().__init__()
                self.observation_space = space

        with pytest.raises(SpecError, match=rf"Dict key '{name}' .*starts with '_'.*rename it in a gymnasium wrapper"):
            EnvPool([Private])


# -- Box actions of an integer dtype ---------------------------------------------------------------


class IntBoxActionEnv(gym.Env):
    """Box actions of dtype ``dtype``; the observation is the action the env received."""

    def __init__(self, dtype=np.int64, low=0, high=10):
        self.observation_space = gym.spaces.Box(-1000, 1000, (2,), np.float64)
        self.action_space = gym.spaces.Box(low, high, (2,), dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2), {}

    def step(self, action):
        assert action.dtype == self.action_space.dtype
        return action.astype(np.float64), 0.0, False, False, {}


@pytest.mark.parametrize("action_dtype", [torch.float32, torch.float64])
def test_float_action_for_an_integer_box_is_refused_not_truncated(action_dtype):
    pool = EnvPool([IntBoxActionEnv] * 2, seed=0)
    assert pool.action_spec.dtype == torch.int64
    td = fresh(pool)
    td["action"] = torch.tensor([[2.7, 9.9], [0.5, 3.999]], dtype=action_dtype)
    match = rf"expected an integer dtype \(torch.int64\).*space dtype int64, got {action_dtype}"
    with pytest.raises(TypeError, match=match):
        pool.step(td)
    td["action"] = torch.tensor([[2, 9], [0, 3]])
    assert pool.step(td)["next", "observation"].tolist() == [[2, 9], [0, 3]]
    pool.close()


def test_integer_action_that_does_not_fit_an_integer_box_is_named():
    pool = EnvPool([functools.partial(IntBoxActionEnv, np.uint8, 0, 200)] * 3, seed=0)
    td = fresh(pool)
    td["action"] = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int64)  # fits: cast
    assert pool.step(td)["next", "observation"].tolist() == [[1, 2], [3, 4], [5, 6]]
    td["action"] = torch.tensor([[1, 2], [3, -1], [5, 6]], dtype=torch.int64)  # would wrap to 255
    with pytest.raises(ValueError, match=r"action for env 1: .*uint8.*-1"):
        pool.step(td)
    pool.close()


@pytest.mark.parametrize("space_dtype, action_dtype", [(np.int8, torch.int16), (np.int8, torch.int32),
                                                       (np.int8, torch.int64), (np.int32, torch.int64)],
                         ids=["int16-into-int8", "int32-into-int8", "int64-into-int8", "int64-into-int32"])
def test_a_wider_integer_action_of_the_same_signedness_that_does_not_fit_the_box_dtype_is_named_never_wrapped(
        space_dtype, action_dtype):
    # int64 300 for an int8 Box would wrap to 44 in a cast: the same kind of integer is range-checked too, at just
    # past each end of the Box's dtype and at the action dtype's own extremes
    pool = EnvPool([functools.partial(IntBoxActionEnv, space_dtype, -3, 5)] * 2, seed=0)
    td = fresh(pool)
    box, wide = np.iinfo(space_dtype), torch.iinfo(action_dtype)
    for big in (box.max + 1, box.min - 1, wide.max, wide.min):
        for row in (0, 1):  # the first row too: the search for the first bad value starts there
            action = [[1, 2], [0, 1]]
            action[row][1] = big
            td["action"] = torch.tensor(action, dtype=action_dtype)
            match = rf"action for env {row}: expected values that fit the Box's dtype {np.dtype(space_dtype)}, " \
                    rf"got {action_dtype}: value {big} is out of the range"
            with pytest.raises(ValueError, match=match):
                pool.step(td)
    td["action"] = torch.tensor([[1, 2], [-3, 5]], dtype=action_dtype)  # values that fit: cast exactly
    assert pool.step(td)["next", "observation"].tolist() == [[1, 2], [-3, 5]]  # (the env asserts the dtype)
    pool.close()


@pytest.mark.parametrize("space_dtype, action_dtype, big",
                         [(np.float32, torch.float64, 1e300), (np.float16, torch.float32, 1e6)])
def test_a_float_action_that_overflows_the_box_dtype_is_named_never_inf(space_dtype, action_dtype, big):
    pool = EnvPool([functools.partial(IntBoxActionEnv, space_dtype, -1, 1)] * 2, seed=0)
    td = fresh(pool)
    td["action"] = torch.tensor([[0.5, 0.25], [big, 0.0]], dtype=action_dtype)
    with pytest.raises(ValueError, match=rf"action for env 1: .*{np.dtype(space_dtype)}.*overflows"):
        pool.step(td)
    td["action"] = torch.tensor([[0.5, 0.25], [-0.75, 0.0]], dtype=action_dtype)  # a wider dtype that fits: cast
    assert pool.step(td)["next", "observation"].tolist() == [[0.5, 0.25], [-0.75, 0.0]]
    pool.close()


def test_a_bfloat16_box_action_reaches_the_env_exactly():
    pool = EnvPool([functools.partial(IntBoxActionEnv, np.float32, -1, 1)] * 2, seed=0)
    td = fresh(pool)
    td["action"] = torch.tensor([[0.5, 0.25], [-0.75, 0.125]], dtype=torch.bfloat16)
    assert pool.step(td)["next", "observation"].tolist() == [[0.5, 0.25], [-0.75, 0.125]]
    pool.close()



def test_a_box_action_that_requires_grad_reaches_the_env_with_its_values():
    # a policy called outside torch.no_grad() gives actions that require grad: what a user sees is the step
    # working with those values, never "Can't call numpy() on Tensor that requires grad"; review R4 A10
    pool = EnvPool([functools.partial(IntBoxActionEnv, np.float32, -1, 1)] * 2, seed=0)
    td = fresh(pool)
    weight = torch.tensor([0.5, -0.25], requires_grad=True)
    td["action"] = torch.stack([weight, weight * 2])  # a non-leaf with a grad_fn, as a policy's output
    assert td["action"].requires_grad
    assert pool.step(td)["next", "observation"].tolist() == [[0.5, -0.25], [1.0, -0.5]]
    td["action"] = torch.tensor([[0.125, 0.75], [-1.0, 1.0]], requires_grad=True)  # a leaf that requires grad
    assert pool.step(td)["next", "observation"].tolist() == [[0.125, 0.75], [-1.0, 1.0]]
    pool.close()


@pytest.mark.parametrize("in_reset", [False, True])
def test_an_env_raising_a_base_exception_is_named_by_both_backends(in_reset):
    """SystemExit/KeyboardInterrupt from an env pass through the serial backend as they are (tagged with the env),
    and come back from a worker as an EnvError naming the env, like any other env error."""
    from envs import CountingEnv, ExitingEnv

    fns = [CountingEnv] * 3 + [functools.partial(ExitingEnv, in_reset=in_reset)] + [CountingEnv]
    phase = "reset" if in_reset else "step"

    def act(pool):
        td = pool.reset()
        if in_reset:  # a partial reset of rows 1 and 3 (env 3's third reset raises)
            pool.reset(td.set("_reset", torch.tensor([[False], [True], [False], [True], [False]])))
        td["action"] = torch.zeros(5, dtype=torch.int64)
        pool.step(td)

    serial = EnvPool(fns, seed=0, info_keys=[])
    with pytest.raises(SystemExit) as err:
        act(serial)
    assert (err.value.env_index, err.value.phase) == (3, phase)
    serial.close()
    process = EnvPool(fns, backend="process", num_workers=2, seed=0, info_keys=[])
    with pytest.raises(EnvError, match=rf"^env 3 \({phase}\): SystemExit: 5") as err:
        act(process)
    assert err.value.env_index == 3
    process.close()


def _exiting_factory():
    raise SystemExit(7)


def test_a_factory_raising_a_base_exception_is_named_by_both_backends():
    from envs import CountingEnv

    fns = [CountingEnv, _exiting_factory, CountingEnv]
    with pytest.raises(SystemExit) as err:  # in the caller's process: raised as it is, tagged with the env
        EnvPool(fns, seed=0, info_keys=[])
    assert (err.value.code, err.value.env_index, err.value.phase) == (7, 1, "make")
    with pytest.raises(EnvError, match=r"^env 1 \(make\): SystemExit: 7") as err:  # was "pool (worker)"
        EnvPool(fns, backend="process", num_workers=2, seed=0, info_keys=[])
    assert err.value.env_index == 1


class _ReadOnlyTagExit(SystemExit):
    @property
    def env_index(self):
        return "mine"


def test_an_exception_that_cannot_be_tagged_still_reaches_the_caller():
    from envs import ExitingEnv

    pool = EnvPool([functools.partial(ExitingEnv, error=_ReadOnlyTagExit)] * 2, seed=0, info_keys=[])
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(_ReadOnlyTagExit):  # never an AttributeError about the tag
        pool.step(td)
    pool.close()


# -- the process backend: a command that cannot be sent leaves no stale reply ------------------


class Unloadable:
    """Pickles fine, but fails to unpickle (in a worker)."""

    def __reduce__(self):
        import operator

        return operator.truediv, (1, 0)


def _process_pool():
    return EnvPool([functools.partial(counting, length=5)] * 4, backend="process", num_workers=2, seed=0)


def test_process_backend_unpicklable_options_name_the_env_and_leave_the_pool_consistent():
    import threading

    pool = _process_pool()
    pids = pool._backend.pids
    try:
        pool.reset()
        assert pool.get_attr("length") == [5] * 4
        options = [{"length": 7}, {"length": 7}, {"length": 8, "lock": threading.Lock()}, {"length": 8}]
        match = r"env 2 \(reset\): the reset options cannot be pickled .*worker 1.*_thread.lock"
        with pytest.raises(EnvError, match=match) as err:
            pool.reset(options=options)
        assert err.value.env_index == 2 and isinstance(err.value.__cause__, TypeError)
        # nothing was sent: every worker answers the next command with its own reply
        assert pool.get_attr("length") == [5] * 4
        # a masked reset names the env too, not its position among the rows reset
        options = [{"length": 7}, {"length": 7}, {"length": 8}, {"length": 8, "lock": threading.Lock()}]
        with pytest.raises(EnvError, match=r"env 3 \(reset\): the reset options cannot be pickled .*worker 1") as err:
            pool.reset(TensorDict({"_reset": torch.tensor([[False], [False], [True], [True]])}, [4]), options=options)
        assert err.value.env_index == 3 and pool.get_attr("length") == [5] * 4
        assert pool.get_attr("length", indices=[1, 3]) == [5, 5]
        with pytest.raises(EnvError, match=r"env 3 \(set_attr\): the values of set_attr\('length', \.\.\.\)"):
            pool.set_attr("length", [6, 6, 6, threading.Lock()])
        assert pool.get_attr("length") == [5] * 4
        with pytest.raises(EnvError, match=r"pool \(call\): the arguments of call\('reset', \.\.\.\)"):
            pool.call("reset", options={"lock": threading.Lock()})
        assert pool.get_attr("length") == [5] * 4
        # options a worker cannot unpickle: it answers with an error and keeps serving
        with pytest.raises(EnvError, match="cannot be unpickled in the worker: ZeroDivisionError"):
            pool.reset(options=[{"length": 6}, {"length": 6}, {"x": Unloadable()}, {"length": 6}])
        assert pool.get_attr("length", indices=[2, 3]) == [5, 5]
        before = pool._seeds.count.copy()
        with pytest.raises(EnvError, match="cannot be pickled"):
            pool.reset(options=options)
        assert (pool._seeds.count == before).all()  # the failed reset used up no episode seeds
        td = pool.reset(options=[{"length": 7}] * 2 + [{"length": 8}] * 2)
        assert pool.get_attr("length") == [7, 7, 8, 8]
        td["action"] = torch.ones(4, dtype=torch.int64)
        assert pool.step(td)["next", "observation"][:, 0].tolist() == [1.0] * 4
    finally:
        pool.close()
    assert len(pids) == 2
    assert_reaped(pids)  # close() reaped them


def test_process_backend_dead_worker_mid_command_leaves_no_stale_reply():
    import os
    import signal

    pool = _process_pool()
    processes, pids = list(pool._backend._processes), pool._backend.pids
    try:
        pool.reset()
        dead = processes[1]
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(timeout=10)
        with pytest.raises(EnvError, match=r"worker 1 \(envs 2\.\.3, pid \d+\) died"):
            pool.set_attr("length", 9)  # worker 0 gets it, worker 1 cannot
        # worker 0's reply to set_attr was read then: this reply is get_attr's own
        assert pool.get_attr("length", indices=[0, 1]) == [9, 9]
    finally:
        pool.close()
    assert_reaped(pids)


def _ghost_counting():
    """A counting env whose ``ghost`` attribute is of a class that exists in its worker process only
    (pickled by reference as ``envs.Ghost``, which the main process cannot find)."""
    import envs

    if not hasattr(envs, "Ghost"):
        class Ghost:
            pass

        Ghost.__module__, Ghost.__qualname__ = "envs", "Ghost"
        envs.Ghost = Ghost
    env = envs.CountingEnv(length=5)
    env.ghost = envs.Ghost()
    return env


def test_process_backend_reply_that_cannot_be_unpickled_leaves_no_stale_reply():
    pool = EnvPool([_ghost_counting] * 4, backend="process", num_workers=2, seed=0)
    try:
        pool.reset()
        unpicklable = r"\(get_attr\): the reply of worker \d \(envs \d\.\.\d\) cannot be unpickled here: Attrib"
        with pytest.raises(EnvError, match=unpicklable):
            pool.get_attr("ghost")
        assert pool.get_attr("length") == [5] * 4  # each worker's get_attr reply was read (and dropped) then
        assert pool.get_attr("length", indices=[3]) == [5]
    finally:
        pool.close()


class _FlagsEnv(gym.Env):
    """Steps return the given reward and done flags (as an env with a bug would)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, reward=0.0, terminated=False, truncated=False, bad_after=1):
        self.values, self.bad_after, self.t = (reward, terminated, truncated), bad_after, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        # the probe at construction steps once: the bad values come after it
        values = self.values if self.t > self.bad_after else (0.0, False, False)
        return (np.zeros(1, np.float32), *values, {})


@pytest.mark.parametrize("name, kwargs", [
    ("reward", {"reward": None}),
    ("terminated", {"terminated": "False"}),
    ("truncated", {"truncated": 0.5}),
    ("terminated", {"terminated": 2}),
    ("reward", {"reward": "1"}),
])
def test_bad_reward_or_done_flags_name_the_env_never_stored(name, kwargs):
    fns = [_FlagsEnv, functools.partial(_FlagsEnv, **kwargs)]
    pool = EnvPool(fns, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(EnvError, match=rf"env 1 \(step\): {name}: expected a scalar"):
        pool.step(td)
    pool.close()


def test_integer_done_flags_of_0_and_1_are_read_as_bools():
    pool = EnvPool([functools.partial(_FlagsEnv, reward=1, terminated=1, truncated=0)] * 2, seed=0)
    td = pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    out = pool.step(td)["next"]  # the construction probe took the one good step
    assert out["terminated"].view(-1).tolist() == [True, True] and out["truncated"].view(-1).tolist() == [False] * 2
    assert out["reward"].view(-1).tolist() == [1.0, 1.0]
    pool.close()


def test_an_unclosed_pool_is_closed_when_collected():
    """TorchRL's EnvBase.__del__ closes envs that say they are open: a pool does (is_closed starts False)."""
    import gc

    from envs import CLOSED_ENVS, ClosingEnv

    pool = EnvPool([ClosingEnv] * 3, seed=0)
    assert not pool.is_closed
    pool.reset()
    CLOSED_ENVS.clear()
    del pool
    gc.collect()
    assert len(CLOSED_ENVS) == 3


def test_an_interrupt_in_one_envs_close_still_closes_the_others_then_is_raised():
    # the pool is closed once close() has been called: a second close() does nothing, so the envs after the
    # interrupted one must be closed by the first (gymnasium's VectorEnv would close them at a retry)
    from envs import CLOSED_ENVS, BadCloseEnv, ClosingEnv, InterruptedCloseEnv

    pool = EnvPool([ClosingEnv, InterruptedCloseEnv, ClosingEnv, BadCloseEnv], seed=0)
    pool.reset()
    CLOSED_ENVS.clear()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.close()
    assert len(CLOSED_ENVS) == 2  # envs 0 and 2
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "env 1's close()" in notes and "env 3 (close)" in notes and "disk gone" in notes
    assert pool.is_closed


def test_an_interrupt_in_one_envs_close_carries_every_other_close_error():
    """Only the first error's first line reached the interrupt: a second failing env (a note on the first)
    was lost."""
    from envs import BadCloseEnv, InterruptedCloseEnv

    pool = EnvPool([BadCloseEnv, InterruptedCloseEnv, BadCloseEnv], seed=0)
    with pytest.raises(KeyboardInterrupt) as info:
        pool.close()
    notes = info.value.__notes__
    assert any(note.startswith("also: env 0 (close): ") for note in notes), notes
    assert any(note.startswith("also: env 2 (close) also raised ") for note in notes), notes


@pytest.mark.parametrize("failing", ["interrupt", "error"])
def test_a_sync_vector_env_pool_closes_every_env_once_whatever_one_of_them_raises(failing):
    # SyncVectorEnv.close_extras stops at the first env that raises, and its fallback close went over the
    # first envs again: env 0 closed twice, env 2 never
    from envs import CLOSED_ENVS, BadCloseEnv, ClosingEnv, InterruptedCloseEnv

    bad = InterruptedCloseEnv if failing == "interrupt" else BadCloseEnv
    venv = gym.vector.SyncVectorEnv([ClosingEnv, bad, ClosingEnv])
    pool = EnvPool(venv, seed=0)
    pool.reset()
    ids = [id(env) for env in venv.envs]
    CLOSED_ENVS.clear()
    with pytest.raises(KeyboardInterrupt if failing == "interrupt" else EnvError) as info:
        pool.close()
    assert CLOSED_ENVS == [ids[0], ids[2]]  # each once
    if failing == "error":
        assert info.value.env_index == 1 and info.value.phase == "close" and "disk gone" in str(info.value)
    assert pool.is_closed and venv.closed
    pool.close()
    assert CLOSED_ENVS == [ids[0], ids[2]]


class _FailingWrapperClose(gym.vector.VectorWrapper):
    def close(self, **kwargs):
        super().close(**kwargs)
        raise ValueError("wrapper flush failed")


@pytest.mark.parametrize("failing_env", [False, True])
def test_a_sync_vector_env_wrappers_close_error_is_an_env_error_and_never_hides_an_envs(failing_env):
    from envs import CLOSED_ENVS, ClosingEnv, InterruptedCloseEnv

    venv = gym.vector.SyncVectorEnv([ClosingEnv, InterruptedCloseEnv if failing_env else ClosingEnv, ClosingEnv])
    pool = EnvPool(_FailingWrapperClose(venv), seed=0)
    pool.reset()
    CLOSED_ENVS.clear()
    with pytest.raises(KeyboardInterrupt if failing_env else EnvError) as info:
        pool.close()
    assert len(CLOSED_ENVS) == (2 if failing_env else 3)
    if failing_env:  # the interrupt first, the wrapper's error a note on it
        assert "wrappers' close raised ValueError: wrapper flush failed" in "\n".join(info.value.__notes__)
    else:
        assert info.value.phase == "close" and "ValueError: wrapper flush failed" in str(info.value)


class _InterruptedWrapperClose(gym.vector.VectorWrapper):
    def close(self, **kwargs):
        super().close(**kwargs)
        raise KeyboardInterrupt


def test_a_sync_vector_env_wrappers_interrupt_comes_first_with_the_envs_close_error_as_a_note():
    from envs import BadCloseEnv, ClosingEnv

    pool = EnvPool(_InterruptedWrapperClose(gym.vector.SyncVectorEnv([ClosingEnv, BadCloseEnv])), seed=0)
    pool.reset()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.close()
    assert "env 1 (close): OSError: disk gone" in "\n".join(info.value.__notes__)


def test_a_sync_vector_env_subclass_is_closed_through_its_own_close_hooks():
    from envs import CLOSED_ENVS, ClosingEnv

    calls = []

    class Extras(gym.vector.SyncVectorEnv):
        def close_extras(self, **kwargs):
            calls.append("close_extras")
            super().close_extras(**kwargs)

    class Close(gym.vector.SyncVectorEnv):
        def close(self, **kwargs):
            calls.append("close")
            super().close(**kwargs)

    for cls in (Extras, Close):
        pool = EnvPool(cls([ClosingEnv] * 2), seed=0)
        pool.reset()
        CLOSED_ENVS.clear()
        pool.close()
        assert len(CLOSED_ENVS) == 2
    assert calls == ["close_extras", "close"]


@pytest.mark.parametrize("exit_code", [None, 3])
def test_an_interrupt_raised_by_an_envs_close_in_a_worker_is_that_envs_close_error(exit_code):
    # workers ignore Ctrl-C: a KeyboardInterrupt or SystemExit there is the env's own; it was dropped, or
    # reported as the worker's when it had exited by then
    from envs import InterruptedCloseEnv

    pool = EnvPool([functools.partial(InterruptedCloseEnv, exit_code), CountingEnv], seed=0, backend="process",
                   num_workers=2)
    pool.reset()
    with pytest.raises(EnvError, match=r"env 0 \(close\): (KeyboardInterrupt|SystemExit: 3)") as info:
        pool.close()
    assert info.value.env_index == 0 and info.value.phase == "close"
    assert isinstance(info.value.__cause__, KeyboardInterrupt if exit_code is None else SystemExit)


@pytest.mark.parametrize("image_shape, error", [
    ((32.7, 40.9), TypeError),  # int() would truncate to 32 x 40
    ((True, 40), TypeError),  # a bool is not a size
    (64, TypeError),  # a bare int: (64, 64) is meant, say it
    ((64,), TypeError),
    ("64", TypeError),
    ((0, 8), ValueError),
])
def test_image_shape_must_be_two_positive_integers_named_in_the_error(image_shape, error):
    with pytest.raises(error, match=r"image_shape: expected \(height, width\): two positive integers, got "):
        EnvPool("CartPole-v1", num_envs=1, image_shape=image_shape)


def test_image_shape_takes_numpy_integers_and_arrays():
    for image_shape in ((np.int64(12), 16), np.array([12, 16]), torch.Size([12, 16]), torch.tensor([12, 16]),
                        (torch.tensor(12), 16), [12, 16]):
        pool = EnvPool("CartPole-v1", num_envs=1, image_shape=image_shape)
        assert pool.reset()["pixels"].shape == (1, 12, 16, 3)
        pool.close()


@pytest.mark.parametrize("indices, match", [
    (np.array([True, False, True]), "boolean mask"),  # int(True) = 1: envs [1, 0, 1] were used
    ([True, False, True], "boolean mask"),
    (torch.tensor([True, False, True]), "boolean mask"),
    ([1.7], r"got float 1\.7"),
    (torch.tensor([0.9, 2.2]), "got float"),
    ("01", "got str"),
    (np.zeros((1, 2), np.int64), "1-d"),
])
def test_env_indices_refuse_masks_floats_and_strings(indices, match):
    pool = EnvPool([functools.partial(CountingEnv, length=5)] * 3, seed=0)
    pool.reset()
    pool.set_attr("tag", ["a", "b", "c"])
    for call in (lambda: pool.get_attr("tag", indices=indices), lambda: pool.set_attr("tag", "x", indices=indices),
                 lambda: pool.call("render", indices=indices)):
        with pytest.raises(TypeError, match=match):
            call()
    assert pool.get_attr("tag") == ["a", "b", "c"]  # the refused set_attr changed nothing
    # integer forms keep working: numpy/torch ints and arrays, np.flatnonzero(mask)
    mask = np.array([True, False, True])
    assert pool.get_attr("tag", indices=np.flatnonzero(mask)) == ["a", "c"]
    assert pool.get_attr("tag", indices=torch.tensor([2, 1])) == ["c", "b"]
    assert pool.get_attr("tag", indices=np.int64(1)) == ["b"]
    with pytest.raises(IndexError, match=r"env index 3 out of range for 3 envs"):
        pool.get_attr("tag", indices=[3])
    with pytest.raises(IndexError, match=r"env index -4 out of range for 3 envs \(expected -3 <= index < 3\)"):
        pool.get_attr("tag", indices=-4)
    # negative indices count from the end, as Python's (and SB3's DummyVecEnv's) indexing
    assert pool.get_attr("tag", indices=-1) == ["c"] and pool.get_attr("tag", indices=[-3, -2]) == ["a", "b"]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_negative_env_indices_count_from_the_end_on_every_backend(backend):
    # the process backend routes each index to a worker: a negative one must be the same env as in serial
    kwargs = {"num_workers": 2} if backend == "process" else {}
    pool = EnvPool("CartPole-v1", num_envs=4, seed=0, backend=backend, **kwargs)
    pool.reset()
    pool.set_attr("tag", [10, 20, 30, 40])
    assert pool.get_attr("tag", indices=[-1]) == [40] and pool.get_attr("tag", indices=[-4, -2]) == [10, 30]
    pool.set_attr("tag", 99, indices=[-1])
    assert pool.get_attr("tag") == [10, 20, 30, 99]
    assert pool.call("get_wrapper_attr", "np_random_seed", indices=[-1, 0]) == [3, 0]
    pool.close()


@pytest.mark.parametrize("value", [2.5, 3.9, "3", True])
def test_num_envs_and_num_workers_are_not_truncated(value):
    with pytest.raises(TypeError, match=r"num_envs: expected an int, got"):
        EnvPool("CartPole-v1", num_envs=value)
    with pytest.raises(TypeError, match=r"num_envs: expected an int, got"):
        EnvPool([functools.partial(CountingEnv, length=5)] * 2, num_envs=value if value != 2.5 else 2.0)
    with pytest.raises(TypeError, match=r"num_workers: expected an int, got"):
        EnvPool("CartPole-v1", num_envs=4, backend="process", num_workers=value)


def test_closing_a_pool_over_an_async_vector_env_with_a_dead_worker_reaps_the_others():
    import os
    import signal
    import time

    venv = gym.make_vec("CartPole-v1", 2, vectorization_mode="async")
    processes = list(venv.processes)
    pool = EnvPool(venv, seed=0)
    pool.rollout(5)
    os.kill(processes[0].pid, signal.SIGKILL)
    processes[0].join(5)
    with pytest.raises(EnvError):
        pool.rollout(5)
    with pytest.raises(EnvError, match=r"\(close\)"):
        pool.close()  # the graceful close fails on the dead pipe: the survivor is terminated, not left running
    deadline = time.monotonic() + 10
    while processes[1].is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = processes[1].is_alive()
    if alive:
        processes[1].kill()
    assert not alive


def test_a_bad_device_is_refused_before_any_env_is_built():
    built = []

    def make():
        built.append(1)
        return gym.make("CartPole-v1")

    for backend in ("serial", "process"):
        with pytest.raises(RuntimeError, match="bogus"):
            EnvPool([make] * 2, device="bogus", backend=backend)
    assert built == []  # (a process pool used to spawn its workers first, and the serial envs were never closed)


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("backend", ["serial", "process"])
def test_a_plain_step_of_envs_whose_episode_ended_is_refused_until_they_are_reset_or_frozen(backend, truncate):
    # counting envs of lengths 2, 4 and 3: observation [t, episode, last action]
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, length=n, truncate=truncate) for n in (2, 4, 3)], seed=0, **kwargs)
    td = pool.reset()
    for _ in range(2):
        td["action"] = torch.ones(3, dtype=torch.int64)
        td = pool.step_mdp(pool.step(td))
    assert td["observation"][:, 0].tolist() == [2, 2, 2] and td["done"].view(-1).tolist() == [True, False, False]
    td["action"] = torch.ones(3, dtype=torch.int64)
    with pytest.raises(StepRefusedError, match=r"env 0 \(step\): these envs must be reset before they step: envs \[0\] "
                                               r"since their episode ended \(terminated or truncated\) at their last "
                                               r"step: .*Call reset\(\) first .* or freeze them with a '_step' mask"):
        pool.step(td)
    # nothing moved: frozen, env 0 keeps its terminal observation (reward 0); envs 1 and 2 go on, and env 2 ends
    td["_step"] = torch.tensor([[False], [True], [True]])
    out = pool.step(td)["next"]
    assert out["observation"][:, 0].tolist() == [2, 3, 3] and out["reward"].view(-1).tolist() == [0, 1, 1]
    assert out["done"].view(-1).tolist() == [True, False, True]
    td = pool.step_mdp(td)
    td["_step"] = torch.ones(3, 1, dtype=torch.bool)
    with pytest.raises(StepRefusedError, match=r"env 0 \(step\): .*: envs \[0, 2\] since their episode ended"):
        pool.step(td)
    td["_step"] = torch.tensor([[False], [True], [False]])  # a refused step moved nothing: env 1 steps from t = 3
    out = pool.step(td)["next"]
    assert out["observation"][:, 0].tolist() == [2, 4, 3] and out["done"].view(-1).tolist() == [True, True, True]
    # a partial reset of envs 0 and 1 lets them step; env 2 is still refused
    td = pool.step_mdp(td).exclude("_step")
    td["_reset"] = torch.tensor([[True], [True], [False]])
    td = pool.reset(td).exclude("_reset")
    assert td["observation"][:, 0].tolist() == [0, 0, 3]
    td["action"] = torch.ones(3, dtype=torch.int64)
    with pytest.raises(StepRefusedError, match=r"env 2 \(step\): .*: envs \[2\] since their episode ended"):
        pool.step(td)
    td = pool.reset()  # a full reset clears every refusal
    td["action"] = torch.ones(3, dtype=torch.int64)
    assert pool.step(td)["next", "observation"][:, 0].tolist() == [1, 1, 1]
    pool.close()


def test_an_episode_that_ends_while_another_env_is_refused_is_refused_too_and_each_keeps_its_reason():
    # env 1's reset raises: it is refused until a reset works; meanwhile envs 0 and 2 step with env 1 frozen, and
    # env 0's episode (length 2) ends: a plain step of it is refused as well, and env 1 keeps its own reason
    # (review R1 E08: only rows no other reason refused were marked, one branch no test took)
    fns = [functools.partial(counting, length=2), functools.partial(FailingEnv, in_reset=True),
           functools.partial(counting, length=10)]
    pool = EnvPool(fns, seed=0)
    with pytest.raises(EnvError, match=r"env 1 \(reset\)"):
        pool.reset()
    td = pool.reset(TensorDict({"_reset": torch.tensor([[True], [False], [True]])}, [3]))
    frozen = torch.tensor([[True], [False], [True]])
    for _ in range(2):
        td = pool.step_mdp(pool.step(td.set("action", torch.ones(3, dtype=torch.int64)).set("_step", frozen)))
    assert td["done"].view(-1).tolist() == [True, False, False]
    with pytest.raises(StepRefusedError, match=r"envs \[0\] since their episode ended"):
        pool.step(td.set("_step", frozen))
    with pytest.raises(StepRefusedError) as refused:
        pool.step(td.exclude("_step"))
    assert re.search(r"envs \[1\] since a reset of theirs raised", str(refused.value))
    assert re.search(r"envs \[0\] since their episode ended", str(refused.value))
    out = pool.step(td.set("_step", torch.tensor([[False], [False], [True]])))["next"]  # env 2 goes on
    assert out["observation"][:, 0].tolist() == [2, 0, 3]
    pool.close()

    # a finished env whose reset then raised stays refused for the reset, not for its (still done) episode
    class EndsThenResetFails(CountingEnv):
        def reset(self, *, seed=None, options=None):
            if self.resets_called >= 2:  # the probe's and the first reset work
                raise ValueError("reset exploded")
            return super().reset(seed=seed, options=options)

    pool = EnvPool([functools.partial(EndsThenResetFails, length=2), functools.partial(counting, length=10)], seed=0)
    td = pool.reset()
    for _ in range(2):
        td = pool.step_mdp(pool.step(td.set("action", torch.ones(2, dtype=torch.int64))))
    with pytest.raises(EnvError, match=r"env 0 \(reset\)"):
        pool.reset(td.set("_reset", torch.tensor([[True], [False]])))
    td = pool.reset(td.set("_reset", torch.tensor([[False], [True]]))).exclude("_reset")  # (its step was lost)
    pool.step(td.set("_step", torch.tensor([[False], [True]])))  # env 0, frozen, still reads done
    with pytest.raises(StepRefusedError, match=r"envs \[0\] since a reset of theirs raised"):
        pool.step(td.exclude("_step"))
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_drivers_that_reset_finished_envs_are_not_refused(backend):
    # step_and_maybe_reset (rollout's and collectors' path), rollout(break_when_all_done=True) (it freezes finished
    # rows with "_step") and TorchRL's generic step_and_maybe_reset (under a type check) never step a finished env
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, length=n) for n in (2, 4, 3)], seed=0, **kwargs)
    rollout = pool.rollout(12, break_when_any_done=False)
    assert rollout["next", "observation"][:, :, 0].tolist() == [[1, 2] * 6, [1, 2, 3, 4] * 3, [1, 2, 3] * 4]
    rollout = pool.rollout(12, break_when_any_done=False, break_when_all_done=True)
    assert rollout.shape == (3, 4) and rollout["next", "done"].any(-2).all()
    pool._run_type_checks = True  # TorchRL's generic path: step, then maybe_reset of the done rows
    td = pool.reset()
    for t in range(5):
        td["action"] = torch.ones(3, dtype=torch.int64)
        _, td = pool.step_and_maybe_reset(td)
    assert td["observation"][:, 0].tolist() == [1, 1, 2]
    pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_stepping_an_env_never_reset_is_an_error_not_a_transition_of_no_episode(backend):
    # the construction probe reset and stepped every env once: a step before reset() would continue it
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    pool = EnvPool([functools.partial(counting, length=50)] * 3, seed=10, **kwargs)
    td = TensorDict({"action": torch.zeros(3, dtype=torch.int64)}, batch_size=[3])
    with pytest.raises(EnvError, match=r"env 0 \(step\): these envs must be reset before they step: envs \[0, 1, 2\] "
                                       r"since the pool was built \(never reset\)\. Call reset\(\) first"):
        pool.step(td)
    # a partial first reset: the rows it reset may step (the others frozen), not the others
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = pool.reset(td)
    assert td["observation"][1, 0] == 0  # a fresh episode, t = 0
    td["action"] = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(EnvError, match=r"env 0 \(step\): these envs must be reset before they step: envs \[0, 2\] "
                                       r"since the pool was built"):
        pool.step(td)
    td["_step"] = torch.tensor([[False], [True], [False]])
    assert pool.step(td)["next", "observation"][1, 0] == 1
    td = pool.reset()
    td["action"] = torch.zeros(3, dtype=torch.int64)
    assert pool.step(td)["next", "observation"][:, 0].tolist() == [1.0, 1.0, 1.0]
    assert td["episode_seed"].view(-1).tolist() == [10, 14, 12]  # env 1 starts its second episode
    pool.close()


class FailsOnce(CountingEnv):
    """A counting env (episodes of ``length`` steps) that raises once: at its ``step_at``-th step call or its
    ``reset_at``-th reset call, counting the construction probe's (one reset, one step)."""

    def __init__(self, step_at=None, reset_at=None, length=50):
        super().__init__(length=length)
        self.step_at, self.reset_at, self.step_calls, self.reset_calls = step_at, reset_at, 0, 0

    def reset(self, *, seed=None, options=None):
        self.reset_calls += 1
        if self.reset_calls == self.reset_at:
            raise ValueError("reset failed once")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.step_calls += 1
        if self.step_calls == self.step_at:
            raise ValueError("step failed once")
        return super().step(action)


def _every_env_steps_after_a_full_reset(env) -> None:
    """The usual recovery from a refused step: a full reset, after which every one of the 3 counting envs takes
    its first step (t 0 -> 1)."""
    td = env.reset().set("action", torch.zeros(3, dtype=torch.int64))
    assert env.step(td)["next", "observation"][:, 0].tolist() == [1.0, 1.0, 1.0]


def _fails_once_pool(backend, **where):
    """Five FailsOnce envs, env 3 failing as ``where`` says, seed 100; the process backend with 2 workers (env 3
    in the second)."""
    fns = [FailsOnce] * 3 + [functools.partial(FailsOnce, **where), FailsOnce]
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    return EnvPool(fns, seed=100, **kwargs)


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_envs_whose_step_raised_are_refused_until_reset_never_a_transition_from_an_unseen_state(backend):
    # env 3 fails the pool's second step: the envs stepped before it moved with no transition returned (serial:
    # envs 0-2; process: worker 0's), so a next step would report t 1 -> 3 as one transition
    pool = _fails_once_pool(backend, step_at=3)
    try:
        td = pool.reset().set("action", torch.zeros(5, dtype=torch.int64))
        td = pool.step(td)["next"]
        with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: step failed once"):
            pool.step(td.set("action", torch.zeros(5, dtype=torch.int64)))
        refused = r"env 0 \(step\): these envs must be reset before they step: envs \[0, 1, 2, 3, 4\] since a step " \
                  r"of theirs raised"
        with pytest.raises(EnvError, match=refused):
            pool.step(td)
        td = pool.reset(td.set("_reset", torch.tensor([[False]] * 3 + [[True], [False]])))  # the failed env only
        with pytest.raises(EnvError, match=r"envs \[0, 1, 2, 4\] since a step of theirs raised"):
            pool.step(td)
        with pytest.raises(EnvError, match=r"envs \[0, 1, 2, 4\] since a step of theirs raised"):  # the fused path
            pool.rollout(2, auto_reset=False, tensordict=td, break_when_any_done=False)
        td = pool.reset()
        out = pool.rollout(4, auto_reset=False, tensordict=td, break_when_any_done=False)
        assert out["observation"][:, :, 0].tolist() == [[0, 1, 2, 3]] * 5  # every row counts from its reset
        assert out["next", "observation"][:, :, 0].tolist() == [[1, 2, 3, 4]] * 5
        assert out["episode_seed"][:, 0, 0].tolist() == [105, 106, 107, 113, 109]  # env 3 reset alone with 108
    finally:
        pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_rows_a_failed_step_left_alone_step_on(backend):
    pool = _fails_once_pool(backend, step_at=2)
    try:
        td = pool.reset().set("action", torch.zeros(5, dtype=torch.int64))
        td["_step"] = torch.tensor([[False], [True], [False], [True], [False]])
        with pytest.raises(EnvError, match=r"env 3 \(step\): ValueError: step failed once"):
            pool.step(td)
        td["_step"] = torch.tensor([[True], [False], [True], [False], [True]])  # the rows frozen in it step on
        assert pool.step(td)["next", "observation"][[0, 2, 4], 0].tolist() == [1, 1, 1]
        td["_step"] = torch.tensor([[False], [True], [False], [False], [False]])
        with pytest.raises(EnvError, match=r"env 1 \(step\): these envs must be reset before they step: envs "
                                           r"\[1, 3\] since a step of theirs raised"):
            pool.step(td)
    finally:
        pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_envs_whose_reset_raised_are_refused_until_reset_and_the_retry_draws_the_same_seeds(backend):
    # env 3 fails the second full reset: the envs reset before it started episodes (seeds 105..) whose first
    # observation was never returned, and the seed schedule is rewound, so only a retry may step them
    pool = _fails_once_pool(backend, reset_at=3)
    try:
        td = pool.reset()
        with pytest.raises(EnvError, match=r"env 3 \(reset\): ValueError: reset failed once"):
            pool.reset()
        with pytest.raises(EnvError, match=r"envs \[0, 1, 2, 3, 4\] since a reset of theirs raised \(it may have "
                                           r"started episodes whose first observation was never returned\)"):
            pool.step(td.set("action", torch.zeros(5, dtype=torch.int64)))
        td = pool.reset()
        assert td["episode_seed"].view(-1).tolist() == [105, 106, 107, 108, 109]
        assert pool.get_attr("last_seed") == [105, 106, 107, 108, 109]
        assert td["observation"][:, 1].tolist() == pool.get_attr("episode")  # the episodes the pool reported
        out = pool.step(td.set("action", torch.ones(5, dtype=torch.int64)))
        assert out["next", "observation"][:, 0].tolist() == [1.0] * 5
    finally:
        pool.close()


@pytest.mark.parametrize("transformed", [False, True])
def test_a_failed_reset_of_done_rows_in_step_and_maybe_reset_refuses_the_rows_it_stepped(transformed):
    # the step's transition is lost with the reset that raised after it: its rows moved unseen (a TransformedEnv
    # takes TorchRL's generic step_and_maybe_reset: the pool sees a step, then a reset)
    fns = [functools.partial(FailsOnce, length=1 + j) for j in range(3)]
    fns[0] = functools.partial(FailsOnce, length=1, reset_at=3)
    pool = EnvPool(fns, seed=0)
    env = TransformedEnv(pool, StepCounter()) if transformed else pool
    try:
        td = env.reset().set("action", torch.zeros(3, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"env 0 \(reset\): ValueError: reset failed once"):
            env.step_and_maybe_reset(td.clone())
        td["_step"] = torch.tensor([[False], [True], [False]])  # env 1 alone: t 0 -> 2 would be one transition
        with pytest.raises(EnvError, match=r"envs \[0\] since a reset of theirs raised .*; envs \[1, 2\] since their "
                                           r"last step, which a reset that raised followed at once"):
            env.step(td)
        _every_env_steps_after_a_full_reset(env)
    finally:
        pool.close()


def test_a_reset_that_raises_after_a_delivered_step_refuses_that_steps_rows_too():
    # the pool cannot tell TorchRL's step_and_maybe_reset from a step whose output was delivered: a reset that
    # raises right after a step asks for those rows to be reset as well (a full reset, the usual recovery, does)
    fns = [functools.partial(FailsOnce, length=1, reset_at=3), FailsOnce, FailsOnce]
    pool = EnvPool(fns, seed=0)
    try:
        td = pool.reset().set("action", torch.zeros(3, dtype=torch.int64))
        td["_step"] = torch.tensor([[True], [True], [False]])
        out = pool.step(td)
        with pytest.raises(EnvError, match=r"env 0 \(reset\)"):
            pool.reset(out["next"].set("_reset", torch.tensor([[True], [False], [False]])))
        td["_step"] = torch.tensor([[False], [False], [True]])  # env 2 did not step: it steps on
        assert pool.step(td)["next", "observation"][2, 0] == 1
        with pytest.raises(EnvError, match=r"envs \[0\] since a reset .*; envs \[1\] since their last step"):
            pool.step(td.set("_step", torch.tensor([[False], [True], [False]])))
        _every_env_steps_after_a_full_reset(pool)
    finally:
        pool.close()


def test_a_reset_that_raises_after_a_successful_reset_refuses_only_its_own_rows():
    # a successful reset ends the "last step" a failed reset could have followed: after step, a reset of env 0, then
    # a reset of env 2 that raises, envs 0 and 1 step on (their transitions were delivered), env 2 is refused
    pool = EnvPool([FailsOnce, FailsOnce, functools.partial(FailsOnce, reset_at=3)], seed=0)
    try:
        td = pool.reset().set("action", torch.ones(3, dtype=torch.int64))
        pool.step(td)
        pool.reset(TensorDict({"_reset": torch.tensor([[True], [False], [False]])}, [3]))
        with pytest.raises(EnvError, match=r"env 2 \(reset\): ValueError: reset failed once"):
            pool.reset(TensorDict({"_reset": torch.tensor([[False], [False], [True]])}, [3]))
        td["_step"] = torch.tensor([[True], [True], [False]])
        assert pool.step(td)["next", "observation"][:2, 0].tolist() == [1.0, 2.0]
        td["_step"] = torch.tensor([[False], [False], [True]])
        with pytest.raises(EnvError, match=r"env 2 \(step\): these envs must be reset before they step: envs \[2\] "
                                           r"since a reset of theirs raised \(it may have started episodes whose first "
                                           r"observation was never returned\)\. Call reset"):
            pool.step(td)
    finally:
        pool.close()


def test_a_reset_that_raises_after_a_step_and_maybe_reset_with_no_env_done_refuses_that_steps_rows_too():
    # step_and_maybe_reset resets no row when no env is done, so its step is the pool's last step: a reset that
    # raises next refuses that step's rows as "their last step" (the pool cannot tell this from TorchRL's generic
    # step_and_maybe_reset, whose transition a failed reset loses), as after a plain step
    pool = EnvPool([functools.partial(FailsOnce, reset_at=3), FailsOnce, FailsOnce], seed=0)
    try:
        td = pool.reset().set("action", torch.ones(3, dtype=torch.int64))
        out, td = pool.step_and_maybe_reset(td)
        assert not out["next", "done"].any()
        with pytest.raises(EnvError, match=r"env 0 \(reset\): ValueError: reset failed once"):
            pool.reset(TensorDict({"_reset": torch.tensor([[True], [False], [False]])}, [3]))
        td = td.set("action", torch.ones(3, dtype=torch.int64)).set("_step", torch.tensor([[False], [True], [True]]))
        with pytest.raises(EnvError, match=r"env 1 \(step\): these envs must be reset before they step: envs \[0\] "
                                           r"since a reset of theirs raised .*; envs \[1, 2\] since their last step, "
                                           r"which a reset that raised followed at once"):
            pool.step(td)
        _every_env_steps_after_a_full_reset(pool)
    finally:
        pool.close()


class RenderFailsOnce(gym.Env):
    """Env ``index`` 1's ``render()`` raises at its 4th call (construction probe, reset, then steps)."""

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index):
        self.index, self.render_mode, self.renders = index, "rgb_array", 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def render(self):
        self.renders += 1
        if self.index == 1 and self.renders == 4:
            raise ValueError("render failed")
        return np.zeros((4, 4, 3), np.uint8)


@pytest.mark.parametrize("kind", ["serial", "sync_vector"])
def test_an_env_render_that_raises_is_an_env_error_of_phase_render(kind):
    fns = [functools.partial(RenderFailsOnce, i) for i in range(3)]
    pool = EnvPool(gym.vector.SyncVectorEnv(fns) if kind == "sync_vector" else fns, pixels=True, info_keys=[])
    try:
        td = pool.reset().set("action", torch.zeros(3, dtype=torch.int64))
        td = pool.step(td)["next"].set("action", torch.zeros(3, dtype=torch.int64))
        with pytest.raises(EnvError, match=r"\(render\): ValueError: render failed") as err:
            pool.step(td)
        assert err.value.phase == "render" and isinstance(err.value.__cause__, ValueError)
        assert err.value.env_index == 1  # a SyncVectorEnv runs its envs here: the traceback says which
        with pytest.raises(EnvError, match=r"since a step of theirs raised"):
            pool.step(td)
    finally:
        pool.close()


class _RaisesAfterItsEnvsStep(gym.vector.SyncVectorEnv):
    """Its sub-envs step fine; then the vector env's own code raises."""

    def step(self, actions):
        super().step(actions)
        raise ValueError("the vector env's own step failed")


def test_a_sync_vector_env_error_names_the_sub_env_that_raised_and_no_env_for_its_own():
    fns = [functools.partial(CountingEnv, length=50)] * 3 + [functools.partial(FailingEnv, fail_at=2)]
    for venv, index, message in (
        (gym.vector.SyncVectorEnv(fns), 3, r"env 3 \(step\): ValueError: boom at step 2"),
        (_RaisesAfterItsEnvsStep(fns[:3]), None, r"pool \(step\): ValueError: the vector env's own step failed"),
    ):
        pool = EnvPool(venv, seed=0, info_keys=[])  # no construction probe: its step would raise
        try:
            td = pool.reset()
            with pytest.raises(EnvError, match=message) as err:
                for _ in range(2):
                    td = pool.step(td.set("action", torch.zeros(pool.num_envs, dtype=torch.int64)))["next"]
            assert err.value.env_index == index and isinstance(err.value.__cause__, ValueError)
        finally:
            pool.close()


def test_a_step_without_an_action_says_what_it_expected():
    pool = EnvPool("CartPole-v1", num_envs=2, seed=0)
    td = pool.reset()
    with pytest.raises(TypeError, match=r"action: expected a torch.Tensor of shape \(2,\), got NoneType None"):
        pool.step(td)
    td["action"] = torch.tensor([0, 1])
    assert pool.step(td)["next", "observation"].shape == (2, 4)  # the pool is still usable
    pool.close()


def test_an_envs_own_children_keep_the_default_sigint_under_the_process_backend():
    """The worker ignored SIGINT with SIG_IGN, which its children inherit: a simulator or server the env stops
    with SIGINT never stopped (close() waited its timeout), unlike under the serial backend."""
    from envs import ChildSignalEnv

    for backend, kwargs in (("serial", {}), ("process", {"num_workers": 2})):
        with EnvPool([ChildSignalEnv] * 2, backend=backend, **kwargs) as pool:
            assert pool.get_attr("child_sigint") == ["<built-in function default_int_handler>"] * 2, backend


def test_a_ctrl_c_in_a_worker_neither_breaks_an_envs_blocking_call_nor_its_forked_childrens_default():
    """With a handler in place of SIG_IGN, a Ctrl-C broke an env's blocking C read (returned -1, EINTR, as data),
    and a helper the env forked without exec inherited the no-op handler (SIGINT never stopped it)."""
    import os
    import signal
    import threading

    from envs import ChildSignalEnv

    with EnvPool([ChildSignalEnv] * 2, backend="process", num_workers=2) as pool:
        pids = pool._backend.pids
        timer = threading.Timer(0.1, lambda: [os.kill(pid, signal.SIGINT) for pid in pids])
        timer.start()
        assert pool.call("read_through_a_signal") == [3, 3]
        timer.join()
        assert pool.call("fork_and_interrupt") == ["KeyboardInterrupt"] * 2
        assert pool.rollout(3, break_when_any_done=False).batch_size == (2, 3)  # the workers are alive and well


@pytest.mark.parametrize("fail_close", [False, True])
def test_a_close_interrupted_while_reaping_the_workers_is_finished_by_the_next_close(fail_close):
    """A Ctrl-C while close() waited for the exiting workers used up the shutdown: a second close() returned at
    once, the workers stayed zombies with their pipes open, and an env's close() error was lost."""
    import os
    import signal
    import threading
    import time

    from envs import SlowExitEnv

    pool = EnvPool([functools.partial(SlowExitEnv, fail_close=fail_close)] * 2, backend="process", num_workers=2)
    pool.reset()
    pids, conns = pool._backend.pids, pool._backend._conns
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))  # close() waits ~1 s for the exits
    timer.start()
    try:
        pool.close()
    except KeyboardInterrupt as err:
        interrupted = err  # kept, as a logger or IPython keeps it: nothing may rely on its collection
    timer.join()
    notes = getattr(interrupted, "__notes__", [])
    assert any("close() again finishes it" in note for note in notes), notes
    if fail_close:
        assert "it then raises env 0 (close): RuntimeError: the env's video was not written" in notes[-1]
        with pytest.raises(EnvError, match=r"env 0 \(close\): RuntimeError: the env's video was not written"):
            pool.close()
    else:
        pool.close()
    time.sleep(0.2)
    assert [os.path.exists(f"/proc/{pid}") for pid in pids] == [False, False]  # reaped, not zombies
    assert all(conn.closed for conn in conns)
    pool.close()  # and done
    del interrupted


_BIG_OBS_ENV = """
import multiprocessing
import numpy as np, gymnasium as gym
from torchrl_swm import EnvPool

class Big(gym.Env):  # 8 MiB observations: 10 envs need 80 MiB of buffers, /dev/shm holds 32
    observation_space = gym.spaces.Box(0, 1, (1024, 1024), np.float64)
    action_space = gym.spaces.Discrete(2)
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((1024, 1024)), {}
    def step(self, action):
        return np.zeros((1024, 1024)), 0.0, False, False, {}

if __name__ == "__main__":
    try:
        EnvPool([Big] * 10, backend="process", num_workers=2)
    except OSError as err:
        print("OSError", err.errno, err)
    print("workers left", len(multiprocessing.active_children()))
    with EnvPool([Big] * 2, backend="process", num_workers=2) as pool:  # what fits still runs
        print("rollout", tuple(pool.rollout(2)["observation"].shape))
"""


def _run_with_a_dev_shm_of(size: str, script_text: str, tmp_path):
    """Run ``script_text`` with a /dev/shm of ``size`` of its own (a private mount namespace)."""
    from small_tmpfs import run_with_a_tmpfs_at

    return run_with_a_tmpfs_at("/dev/shm", size, script_text, tmp_path)


def test_a_dev_shm_too_small_for_the_buffers_is_an_oserror_not_a_sigbus(tmp_path):
    """The segment was sparse: zeroing it past /dev/shm's free space killed the process with SIGBUS (exit 135,
    no exception, a leaked segment). Runs in a private mount namespace with a 32 MiB /dev/shm."""
    out = _run_with_a_dev_shm_of("32m", _BIG_OBS_ENV, tmp_path)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    assert re.search(r"OSError 28 \[Errno 28\] EnvPool\(backend='process'\): the pool's shared buffers need 80\.\d "
                     r"MiB of shared memory \(/dev/shm, 32\.0 MiB free\), which could not be reserved", out.stdout)
    assert "workers left 0" in out.stdout and "rollout (2, 2, 1024, 1024)" in out.stdout, out.stdout
    assert "leaked shared_memory" not in out.stderr, out.stderr


_CTRL_C_WHILE_RESERVING = """
import multiprocessing, os, signal, threading, time
import numpy as np, gymnasium as gym
from torchrl_swm import EnvPool

class Big(gym.Env):  # 8 MiB observations: 32 envs need a 256 MiB segment, which takes a while to reserve
    observation_space = gym.spaces.Box(0, 255, (2048, 4096), np.uint8)
    action_space = gym.spaces.Discrete(2)
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((2048, 4096), np.uint8), {}
    def step(self, action):
        return np.zeros((2048, 4096), np.uint8), 0.0, False, False, {}

def used_mib():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize >> 20

def ctrl_c_while_reserving():
    while not (any(f.startswith("psm_") for f in os.listdir("/dev/shm")) and used_mib() > 16):
        time.sleep(0.0002)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

if __name__ == "__main__":
    threading.Thread(target=ctrl_c_while_reserving, daemon=True).start()
    try:
        EnvPool([Big] * 32, backend="process", num_workers=2, info_keys=[])
    except KeyboardInterrupt as err:
        tb = err.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        print("interrupted in", tb.tb_frame.f_code.co_name)
    time.sleep(0.5)
    print("left", os.listdir("/dev/shm"), used_mib(), "MiB", "workers", len(multiprocessing.active_children()))
"""


def test_a_ctrl_c_while_the_buffers_are_reserved_leaves_no_segment(tmp_path):
    """The segment had no owner until its reservation returned: a Ctrl-C inside it (0.1 s for 512 MiB) left it
    in /dev/shm, its memory held until the process exited (a retry then failed for want of room)."""
    out = _run_with_a_dev_shm_of("384m", _CTRL_C_WHILE_RESERVING, tmp_path)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr[-2000:])
    assert "interrupted in" in out.stdout and "left [] 0 MiB workers 0" in out.stdout, out.stdout
    assert "leaked shared_memory" not in out.stderr, out.stderr[-2000:]


def test_an_interrupt_while_the_workers_attach_to_the_buffers_leaves_no_segment(monkeypatch):
    # the segment is named in /dev/shm until every worker has mapped it: a Ctrl-C (or a worker dying) then must
    # still remove the name (review R3's M02: the name stayed until the interpreter exited)
    import os

    from torchrl_swm.pool import process

    names = []

    def interrupted_attach(self, *args, **kwargs):
        names.append(self._shm.name)
        raise KeyboardInterrupt  # as a Ctrl-C landing while the workers map the segment

    monkeypatch.setattr(process.ProcessBackend, "attach", interrupted_attach)
    with pytest.raises(KeyboardInterrupt):
        EnvPool([functools.partial(counting, length=5)] * 2, backend="process", num_workers=2)
    assert len(names) == 1 and not os.path.exists(os.path.join("/dev/shm", names[0].lstrip("/")))


def test_close_after_a_worker_died_still_raises_the_other_workers_env_close_errors():
    # worker 0 is dead; worker 1's envs fail to close: close() reaps everything and says so (review R3's M21: a
    # close that sent to the dead worker first lost the other workers' close errors)
    import os
    import signal
    import time

    from envs import BadCloseEnv

    pool = EnvPool([functools.partial(counting, length=5)] * 2 + [BadCloseEnv] * 2, backend="process",
                   num_workers=2, seed=0)
    pool.reset()
    pids = list(pool._backend.pids)
    os.kill(pids[0], signal.SIGKILL)
    time.sleep(0.5)
    with pytest.raises(EnvError, match=r"env 2 \(close\): OSError: disk gone"):
        pool.close()
    assert_reaped(pids)


class _MarkedCloseEnv(gym.Env):
    """Writes ``env<i>.closed`` in ``folder`` when closed, after ``close_s`` s (a video written at close); then
    raises with ``fail``."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, i, folder, close_s=0.0, fail=False, die=False):
        self.i, self.folder, self.close_s, self.fail, self.die = i, folder, close_s, fail, die

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def close(self):
        import time

        time.sleep(self.close_s)
        if self.die:
            import os

            os._exit(3)
        (self.folder / f"env{self.i}.closed").touch()
        if self.fail:
            raise RuntimeError(f"env {self.i}'s video was not written")


def test_a_ctrl_c_while_the_workers_close_their_envs_lets_them_finish_and_keeps_the_errors(tmp_path):
    """The workers still closing their envs (they ignore Ctrl-C) were terminated at once, their other envs
    never closed (the serial backend closes them), and an env's close error that had arrived was lost."""
    import os
    import signal
    import threading
    import warnings

    fns = [functools.partial(_MarkedCloseEnv, i, tmp_path, close_s=2.0 if i == 2 else 0.0, fail=i == 0)
           for i in range(4)]
    pool = EnvPool(fns, backend="process", num_workers=2)
    pool.reset()
    timer = threading.Timer(0.6, lambda: os.kill(os.getpid(), signal.SIGINT))  # worker 1 is in env 2's close()
    timer.start()
    with warnings.catch_warnings(record=True) as caught, pytest.raises(KeyboardInterrupt) as interrupted:
        warnings.simplefilter("always")
        pool.close()
    timer.join()
    assert "also: env 0 (close): RuntimeError: env 0's video was not written" in interrupted.value.__notes__
    assert not [w for w in caught if "terminated" in str(w.message)]
    pool.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"env{i}.closed" for i in range(4)]


def test_close_errors_that_come_after_a_ctrl_c_are_notes_too(tmp_path):
    """Those that came during the wait after the Ctrl-C were a warning (the first) or lost (the others, a
    worker's death), and a worker's second failing env (a note on its first) was lost."""
    import os
    import signal
    import threading

    fns = [functools.partial(_MarkedCloseEnv, 0, tmp_path, fail=True),
           functools.partial(_MarkedCloseEnv, 1, tmp_path, fail=True),  # worker 0: two failures
           functools.partial(_MarkedCloseEnv, 2, tmp_path, close_s=1.5, fail=True),
           functools.partial(_MarkedCloseEnv, 3, tmp_path, close_s=1.5, fail=True),  # worker 1: after the Ctrl-C
           functools.partial(_MarkedCloseEnv, 4, tmp_path, close_s=1.5, die=True),  # worker 2: dies closing
           functools.partial(_MarkedCloseEnv, 5, tmp_path)]
    pool = EnvPool(fns, backend="process", num_workers=3)
    pool.reset()
    timer = threading.Timer(0.7, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt) as interrupted:
        pool.close()
    timer.join()
    notes = interrupted.value.__notes__
    expected = ["env 0 (close): RuntimeError: env 0's video was not written",
                "env 1 (close) also raised RuntimeError: env 1's video was not written",
                "env 2 (close): RuntimeError: env 2's video was not written",
                "env 3 (close) also raised RuntimeError: env 3's video was not written",
                "pool (worker): worker 2 (envs 4..5"]
    for text in expected:
        assert any(note.startswith(f"also: {text}") for note in notes), (text, notes)
    pool.close()


class _EchoMultiDiscrete(gym.Env):
    """Returns its action as the observation: an env that trusts its actions, as most do."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 4])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.asarray(action, np.float32), 0.0, False, False, {}


class _EchoBoolBox(_EchoMultiDiscrete):
    observation_space = gym.spaces.Box(0, 1, (2,), np.float32)
    action_space = gym.spaces.Box(0, 1, (2,), bool)


class _EchoMultiBinary(_EchoMultiDiscrete):
    observation_space = gym.spaces.Box(0, 9, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(2)


@pytest.mark.parametrize(
    "make, kwargs, bad, match",
    [
        (_EchoMultiDiscrete, {}, [-1, 2], r"expected indices below nvec=\[3, 4\], got \[-1, 2\]"),
        (_EchoBoolBox, {}, [0.5, 2.0], r"expected bools or 0/1 values.*got \[0\.5, 2\.0\]"),
        (_EchoBoolBox, {}, [0.5, 1.0], r"expected bools or 0/1 values.*got \[0\.5, 1\.0\]"),
        (_EchoBoolBox, {}, [-1, 0], r"expected bools or 0/1 values.*got \[-1, 0\]"),
        (_EchoMultiBinary, {}, [0, 2], r"expected 0/1 values, got \[0, 2\]"),
        (_EchoMultiBinary, {}, [-1, 1], r"expected 0/1 values, got \[-1, 1\]"),
        (functools.partial(counting, length=10), {"categorical_action_encoding": False}, [1, 1, -1],
         r"expected a one-hot vector, got \[1, 1, -1\]"),
    ],
    ids=["multidiscrete-negative", "bool-box-not-0-or-1", "bool-box-a-half", "bool-box-negative", "multibinary-2",
         "multibinary-negative", "one-hot-negative-entry"],
)
def test_actions_outside_their_space_are_refused_naming_the_env(make, kwargs, bad, match):
    # each passes a check the others need: a negative index below nvec; 0.5 and 2, which a cast makes True, and
    # 0.5 or -1 alone, which are below 1 (a bool Box and a MultiBinary take exactly 0 or 1, not anything <= 1);
    # [1, 1, -1], whose sum and max are those of a one-hot vector (argmax would read it as index 0)
    pool = EnvPool([make] * 2, seed=0, **kwargs)
    td = fresh(pool)
    good = pool.action_spec.rand()[0]  # a valid action (a one-hot spec's zero() is not one)
    td["action"] = torch.stack([good.to(torch.tensor(bad).dtype), torch.tensor(bad)])
    with pytest.raises(ValueError, match=r"env 1\b.*" + match):
        pool.step(td)
    td["action"] = torch.stack([good, good])
    pool.step(td)  # the pool still steps
    pool.close()


@pytest.mark.parametrize(
    "make, kwargs, action, match",
    [
        (_EchoMultiDiscrete, {}, [[0.7, 1.9], [0.0, 0.0]], "an integer dtype for a MultiCategorical action"),
        (_EchoMultiDiscrete, {}, [[True, False], [False, True]], "an integer dtype for a MultiCategorical action"),
        (functools.partial(counting, length=10), {"categorical_action_encoding": False},
         [[0j, 1 + 0j, 0j], [1 + 0j, 0j, 0j]], "an integer, bool or 0/1 float one-hot action"),
        (_EchoMultiBinary, {}, [[0j, 1 + 0j], [1 + 0j, 1 + 0j]], "bools or 0/1 numbers for a MultiBinary action"),
    ],
    ids=["multicategorical-float", "multicategorical-bool", "one-hot-complex", "multibinary-complex"],
)
def test_a_float_action_for_an_index_or_one_hot_space_is_a_type_error_never_truncated(make, kwargs, action, match):
    # float indices would be truncated ([0.7, 1.9] read as [0, 1]): a MultiCategorical takes integers only, as
    # torch's Categorical samples them. One-hot and binary actions take exact 0/1 floats (the next test)
    pool = EnvPool([make] * 2, seed=0, **kwargs)
    td = fresh(pool)
    action = torch.tensor(action)
    td["action"] = action
    with pytest.raises(TypeError, match=rf"action: expected {match}, got {action.dtype}"):
        pool.step(td)
    td["action"] = pool.action_spec.rand()
    pool.step(td)  # the pool still steps
    pool.close()


def _pool_of(make, backend, **kwargs):
    if backend == "vector":
        return EnvPool(gym.vector.SyncVectorEnv([make] * 2), seed=0, **kwargs)
    extra = {"backend": "process", "num_workers": 1} if backend == "process" else {}
    return EnvPool([make] * 2, seed=0, **extra, **kwargs)


@pytest.mark.parametrize("backend", ["serial", "vector", "process"])
def test_exact_float_one_hot_and_binary_actions_are_taken_as_distributions_sample_them(backend):
    # a OneHotCategorical or Bernoulli sample is a float tensor of exact 0s and 1s: TorchRL's GymEnv steps it, and
    # so does the pool (the serial one row by row, the others as one batch); any other float is refused, never
    # rounded, naming the env
    with _pool_of(functools.partial(counting, length=10), backend, categorical_action_encoding=False) as pool:
        td = fresh(pool)
        td["action"] = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
        assert pool.step(td)["next", "reward"].view(-1).tolist() == [1.0, 2.0]  # counting: reward = the index
        sample = torch.distributions.OneHotCategorical(logits=torch.zeros(2, 3)).sample()
        td["action"] = sample
        assert pool.step(td)["next", "reward"].view(-1).tolist() == sample.argmax(-1).float().tolist()
        for bad in ([0.5, 0.5, 0.0], [1.0, 1e-8, 0.0], [float("nan"), 1.0, 0.0], [1.0, 1.0, -1.0]):
            td["action"] = torch.tensor([[1.0, 0.0, 0.0], bad])
            with pytest.raises(ValueError, match=r"action for env 1: expected a one-hot vector, got \["):
                pool.step(td)
        td["action"] = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float16)
        assert pool.step(td)["next", "reward"].view(-1).tolist() == [0.0, 1.0]  # the pool still steps
    with _pool_of(_EchoMultiDiscrete, backend, categorical_action_encoding=False) as pool:
        td = fresh(pool)
        td["action"] = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]])
        assert pool.step(td)["next", "observation"].tolist() == [[0.0, 2.0], [2.0, 3.0]]
        td["action"] = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.75]])
        with pytest.raises(ValueError, match=r"action for env 1: expected a one-hot vector, got \[0\.0, 0\.0, 0\.0, 0\.75\]"):
            pool.step(td)
    with _pool_of(_EchoMultiBinary, backend) as pool:
        td = fresh(pool)
        sample = torch.distributions.Bernoulli(probs=torch.full((2, 2), 0.5)).sample()
        td["action"] = sample
        assert pool.step(td)["next", "observation"].tolist() == sample.tolist()
        td["action"] = torch.tensor([[0.0, 1.0], [1.0, 0.5]])
        with pytest.raises(ValueError, match=r"action for env 1: expected 0/1 values, got \[1\.0, 0\.5\]"):
            pool.step(td)


@pytest.mark.parametrize("bad", [-1, 3])  # below 0, and n itself (off by one: it would reach the env as n + start)
@pytest.mark.parametrize("backend", ["vector", "process"])
def test_a_discrete_index_out_of_range_is_refused_where_actions_are_decoded_as_a_batch(backend, bad):
    # a VectorEnv pool and the process backend decode a batch of Discrete actions at once (one reduction checks
    # both bounds), not env by env
    if backend == "vector":
        pool = EnvPool(gym.vector.SyncVectorEnv([functools.partial(counting, length=10)] * 2), seed=0)
    else:
        pool = EnvPool([functools.partial(counting, length=10)] * 2, seed=0, backend="process", num_workers=2)
    with pool:
        td = fresh(pool)
        td["action"] = torch.tensor([1, bad])
        with pytest.raises(ValueError, match=rf"action for env 1: expected an index in \[0, 3\), got {bad}"):
            pool.step(td)
        td["action"] = torch.tensor([1, 2])
        assert pool.step(td)["next", "reward"].view(-1).tolist() == [1.0, 2.0]  # the pool still steps


class _ClipsItsActionInPlace(_EchoMultiDiscrete):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def step(self, action):
        np.clip(action, -1, 1, out=action)  # common in env code
        return action.copy(), 0.0, False, False, {}


def test_an_env_that_edits_its_action_in_place_leaves_the_recorded_action_alone():
    # each env gets an array of its own (actions.py): the action the policy sent is what the tensordict records,
    # unclipped, as TorchRL's GymWrapper leaves Box actions
    pool = EnvPool([_ClipsItsActionInPlace] * 2, seed=0)
    td = fresh(pool)
    td["action"] = torch.full((2, 2), 5.0)
    out = pool.step(td)
    assert out["action"].tolist() == [[5.0, 5.0], [5.0, 5.0]]
    assert out["next", "observation"].tolist() == [[1.0, 1.0], [1.0, 1.0]]  # the env did clip its own copy
    pool.close()


def test_a_worker_that_exited_with_code_0_while_idle_is_a_dead_worker_at_the_next_step(tmp_path):
    # a simulator quitting cleanly (exit code 0) between commands is as dead as a killed one: the next step, even
    # of envs not reset yet, says the worker died, never "reset these envs first" (a reset would then fail
    # differently)
    from envs import LaterExitEnv

    pool = EnvPool([LaterExitEnv] * 2, backend="process", num_workers=2)
    pool.call("exit_once", str(tmp_path / "now"), indices=[1])
    (tmp_path / "now").touch()
    worker = pool._backend._processes[1]
    worker.join(timeout=60)
    assert worker.exitcode == 0
    action = TensorDict({"action": torch.zeros(2, dtype=torch.int64)}, batch_size=[2])
    for call in (lambda: pool.step(action), pool.reset):
        with pytest.raises(EnvError, match=r"worker 1 \(envs 1\.\.1, pid \d+\) died with exit code 0"):
            call()
    pool.close()


def test_an_attribute_error_inside_an_env_step_is_the_same_error_on_both_backends():
    # EnvAttributeError (an AttributeError) is for a missing attribute of get_attr/call; an env whose own step
    # raises AttributeError gives an EnvError on both backends (the process backend raised EnvAttributeError, so
    # `except AttributeError` caught it on one backend only)
    from envs import StepAttributeErrorEnv

    from torchrl_swm.errors import EnvAttributeError

    for backend, kwargs in (("serial", {}), ("process", {"num_workers": 2})):
        pool = EnvPool([StepAttributeErrorEnv] * 2, backend=backend, info_keys=[], **kwargs)
        td = pool.reset()
        td["action"] = torch.zeros(2, dtype=torch.int64)
        with pytest.raises(EnvError, match=r"env 0 \(step\): AttributeError: 'NoneType' object has no") as info:
            pool.step(td)
        assert not isinstance(info.value, AttributeError), backend
        assert type(info.value.__cause__) is AttributeError, backend
        with pytest.raises(EnvAttributeError, match=r"env 0 \(.*\): .*no_such_attribute"):  # a missing one still is
            pool.get_attr("no_such_attribute")
        pool.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("pixels", [dict(pixels=True), dict(image_shape=(8, 8))])
def test_pixels_from_an_id_whose_env_cannot_render_rgb_array_are_refused_before_any_env_is_built(backend, pixels):
    # the refusal names the env's render modes and what to leave out (before: gymnasium's env checker's bare
    # AssertionError at the first frame, from inside the pool); the checker off, the env's frames tell
    gym.register("HumanRenderOnly-v0", entry_point=HumanRenderOnly, max_episode_steps=5)
    try:
        kwargs = dict(backend=backend, num_workers=2) if backend == "process" else {}
        with pytest.raises(ValueError, match=r"EnvPool\('HumanRenderOnly-v0', pixels=True\): pixels are the frames "
                                             r"the env renders with render_mode='rgb_array', but HumanRenderOnly-v0 "
                                             r"declares render_modes=\['human'\]; leave pixels .* out"):
            EnvPool("HumanRenderOnly-v0", num_envs=2, **pixels, **kwargs)
        with pytest.raises(EnvError, match=r"env 0 \(render\)"):  # the checker off: the pool's own frame check
            EnvPool("HumanRenderOnly-v0", num_envs=2, disable_env_checker=True, **pixels)
    finally:
        gym.registry.pop("HumanRenderOnly-v0")


def test_a_meta_device_is_refused_before_any_env_is_built():
    # meta tensors hold no data: it failed deep inside torch ("Tensor.item() cannot be called on meta tensors")
    # after every env was built (review R4 B5); pool.to("meta") still moves a built pool's outputs
    # (test_to_moves_the_outputs_not_only_the_specs)
    built = []

    def factory():
        built.append(1)
        return CountingEnv(length=5)

    with pytest.raises(ValueError, match=r"EnvPool: device='meta' holds no data to build the pool's specs on; "
                                         r"expected 'cpu', a CUDA device or None"):
        EnvPool([factory] * 2, device=torch.device("meta"))
    assert built == []


def test_a_num_envs_too_large_to_hold_is_a_value_error_naming_num_envs():
    # [factory] * 10**30 raised OverflowError "cannot fit 'int' into an index-sized integer", naming nothing
    too_many = r"num_envs: 1000000000000000000000000000000 is more than this process can hold"
    with pytest.raises(ValueError, match=rf"^EnvPool\('CartPole-v1'\): {too_many}") as info:
        EnvPool("CartPole-v1", num_envs=10**30)
    assert isinstance(info.value.__cause__, OverflowError)
    with pytest.raises(ValueError, match=rf"^EnvPool: {too_many}"):
        EnvPool(functools.partial(CountingEnv, length=5), num_envs=10**30)  # one factory and a count


@pytest.mark.parametrize("keyword, value, hint", [
    ("from_pixels", True, r"for from_pixels=, EnvPool renders frames itself: pixels=True"),
    ("pixels_only", False, r"for pixels_only=, EnvPool renders frames itself"),
    ("frame_skip", 4, r"for frame_skip=, repeat actions with TransformedEnv\(pool, torchrl_swm.FrameSkip\(k\)\)"),
    ("wrappers", [], r"for wrappers=, wrap each env in a factory"),
    ("vectorization_mode", "sync", r"for vectorization_mode=, pass the vector env itself"),
    ("context", "fork", r"for context=, the process backend's start method is mp_start_method="),
])
def test_a_torchrl_or_make_vec_keyword_the_env_refuses_is_told_the_pools_way(keyword, value, hint):
    # EnvPool passes keywords it does not know to gym.make: GymEnv's from_pixels=True or make_vec's wrappers= then
    # failed inside CartPole's __init__, naming CartPole, not the keyword the pool spells otherwise
    with pytest.raises(EnvError, match=r"env 0 \(make\): .*unexpected keyword argument '" + keyword + "'.*" + hint) as info:
        EnvPool("CartPole-v1", 2, **{keyword: value})
    assert isinstance(info.value.__cause__, TypeError)


def test_a_keyword_no_one_knows_gets_gymnasiums_error_alone():
    with pytest.raises(EnvError, match=r"unexpected keyword argument 'colour'") as info:
        EnvPool("CartPole-v1", 2, colour="red")
    assert "EnvPool passes keywords" not in str(info.value)


@pytest.mark.parametrize("error", [TypeError("bad context"), ValueError("got an unexpected keyword argument 'wrappers'")])
def test_no_keyword_hint_for_a_factory_error_that_is_not_an_unexpected_keyword(error):
    # only a TypeError for an unexpected keyword the pool spells otherwise gets the hint (review G F1, F2)
    def factory():
        raise error

    with pytest.raises(EnvError, match=r"env 0 \(make\): the factory raised") as info:
        EnvPool(factory, 2)
    assert "EnvPool passes keywords" not in str(info.value)
