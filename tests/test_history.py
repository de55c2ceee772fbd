"""History: the last `length` steps as (N, length, ...), cleared only for reset rows, frozen rows untouched."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import counting
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, OneHot
from torchrl.envs import TransformedEnv
from torchrl.envs.utils import check_env_specs, step_mdp

from torchrl_swm import EnvPool, History, World

torch.set_num_threads(1)


def env_with_history(n=3, length=3, lengths=None, pixels=False, **kwargs):
    lengths = lengths or [50] * n
    factories = [functools.partial(counting, length=m, render_mode="rgb_array" if pixels else None) for m in lengths]
    pool = EnvPool(factories, seed=0, pixels=pixels)
    keys = kwargs.pop("keys", ["observation"])
    return TransformedEnv(pool, History(keys, length, **kwargs))


def act(td, n):
    td["action"] = torch.ones(n, dtype=torch.int64)
    return td


def hist(td, key=("history", "observation")):
    return td[key][..., 0]  # the counting env's t


def test_specs_and_shapes():
    env = env_with_history(3, 4, pixels=True, keys=["observation", "pixels", ("info", "t")])
    check_env_specs(env)
    td = env.reset()
    assert td["history", "observation"].shape == (3, 4, 3)
    assert td["history", "pixels"].shape == (3, 4, 8, 12, 3) and td["history", "pixels"].dtype == torch.uint8
    assert td["history", "info", "t"].shape == (3, 4, 1)  # the pool's (N, 1) info leaf, stacked
    spec = env.observation_spec["history", "pixels"]
    assert spec.shape == (3, 4, 8, 12, 3) and spec.dtype == torch.uint8
    env.close()


def test_reset_repeats_then_steps_shift():
    env = env_with_history(2, 3)
    td = env.reset()
    assert hist(td).tolist() == [[0, 0, 0]] * 2
    for expected in ([0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]):
        td = step_mdp(env.step(act(td, 2)))
        assert hist(td).tolist() == [expected] * 2
    env.close()


def test_length_one_matches_the_seed_convention():
    env = env_with_history(2, 1)
    td = step_mdp(env.step(act(env.reset(), 2)))
    assert td["history", "observation"].shape == (2, 1, 3)
    assert torch.equal(td["history", "observation"][:, 0], td["observation"])
    env.close()


def test_partial_reset_clears_only_reset_rows():
    env = env_with_history(3, 3)
    td = env.reset()
    for _ in range(4):
        td = step_mdp(env.step(act(td, 3)))
    before = hist(td).clone()
    td["_reset"] = torch.tensor([[False], [True], [False]])
    td = env.reset(td)
    assert hist(td)[1].tolist() == [0, 0, 0]
    assert torch.equal(hist(td)[[0, 2]], before[[0, 2]])
    env.close()


def test_auto_reset_through_step_and_maybe_reset():
    env = env_with_history(2, 2, lengths=[2, 5])
    rollout = env.rollout(8, break_when_any_done=False)
    h = rollout["history", "observation"][..., 0]
    # env 0 (length 2): [0,0] [0,1] | reset [0,0] [0,1] | ...; env 1 (length 5) is never cleared before t = 5
    assert h[0].tolist() == [[0, 0], [0, 1], [0, 0], [0, 1], [0, 0], [0, 1], [0, 0], [0, 1]]
    assert h[1].tolist() == [[0, 0], [0, 1], [1, 2], [2, 3], [3, 4], [0, 0], [0, 1], [1, 2]]
    nxt = rollout["next", "history", "observation"][..., 0]
    assert nxt[0, 1].tolist() == [1, 2]  # the terminal step keeps its true history under "next"
    env.close()


def test_frozen_rows_keep_their_history():
    env = env_with_history(3, 3)
    td = step_mdp(env.step(act(env.reset(), 3)))
    before = hist(td).clone()
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = env.step(act(td, 3))["next"]
    assert hist(out)[1].tolist() == before[1].tolist()  # no duplicated frame for the frozen env
    assert hist(out)[0].tolist() == [0, 1, 2]
    env.close()


def test_zeros_padding_and_custom_out_keys():
    env = env_with_history(2, 3, padding="zeros", out_keys=["ctx"])
    td = env.reset()
    assert not td["ctx"][:, :2].any() and torch.equal(td["ctx"][:, 2], td["observation"])  # zeros, then the obs
    td = step_mdp(env.step(act(td, 2)))
    assert td["ctx"][..., 0].tolist() == [[0, 0, 1]] * 2
    env.close()
    pool = EnvPool([functools.partial(counting, length=9)] * 2, seed=0)
    in_place = TransformedEnv(pool, History("observation", 2, out_keys=["observation"]))
    td = step_mdp(in_place.step(act(in_place.reset(), 2)))
    assert td["observation"].shape == (2, 2, 3) and td["observation"][..., 0].tolist() == [[0, 1]] * 2
    in_place.close()


def test_zeros_padding_of_length_two_is_one_zero_then_the_observation():
    # padding="zeros" holds for every length > 1: length 2 gives [0, obs] at reset, never [obs, obs]
    env = env_with_history(2, 2, padding="zeros")
    td = env.reset()
    assert td["observation"].any()  # the counting env's episode number: a zero frame is not the observation
    assert not td["history", "observation"][:, 0].any()
    assert torch.equal(td["history", "observation"][:, 1], td["observation"])
    first = td["observation"].clone()
    td = step_mdp(env.step(act(td, 2)))
    assert torch.equal(td["history", "observation"][:, 0], first)
    assert torch.equal(td["history", "observation"][:, 1], td["observation"])
    env.close()


def test_argument_errors():
    for length in (0, 2.5, True, "3"):  # never truncated or coerced
        with pytest.raises(ValueError, match=r"length must be an int >= 1, got"):
            History(["observation"], length)
    with pytest.raises(ValueError, match="padding"):
        History(["observation"], 2, padding="reflect")
    with pytest.raises(ValueError, match="out_keys"):
        History(["a", "b"], 2, out_keys=["x"])
    with pytest.raises(ValueError, match=r"out_keys \['ctx'\] appear more than once"):
        History(["a", "b"], 2, out_keys=["ctx", "ctx"])  # one history would overwrite the other
    with pytest.raises(RuntimeError, match="SliceSampler"):
        History(["observation"], 2)(TensorDict({"observation": torch.zeros(2, 3)}, [2]))


def test_world_with_history_in_wait_mode():
    env = env_with_history(2, 4, lengths=[2, 5])
    seen = []

    def policy(td):
        seen.append(hist(td).clone())
        return act(td, 2)

    World(env, policy).evaluate(2, seed=0, reset_mode="wait", progress=False)
    assert seen[-1][0].tolist() == [0, 0, 1, 2]  # env 0 froze after 2 steps: its history stopped
    assert seen[-1][1].tolist() == [1, 2, 3, 4]
    env.close()


class Reference:
    """A plain-Python model of History for one env row."""

    def __init__(self, length):
        self.length, self.h = length, None

    def reset(self, obs):
        self.h = [obs] * self.length

    def step(self, obs):
        self.h = self.h[1:] + [obs]


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 4), ops=st.lists(st.tuples(st.sampled_from(["step", "reset"]),
                                                        st.lists(st.booleans(), min_size=3, max_size=3)),
                                              max_size=12))
def test_property_matches_a_reference_model(length, ops):
    n = 3
    env = env_with_history(n, length)
    td = env.reset()
    refs = [Reference(length) for _ in range(n)]
    for i in range(n):
        refs[i].reset(float(td["observation"][i, 0]))
    for op, flags in ops:
        mask = torch.tensor(flags).view(n, 1)
        if op == "step":
            td["_step"] = mask
            td = step_mdp(env.step(act(td, n)))
            td.pop("_step", None)
            for i in np.flatnonzero(flags):
                refs[i].step(float(td["observation"][i, 0]))
        else:
            if not any(flags):
                continue
            td["_reset"] = mask
            td = env.reset(td)
            td.pop("_reset", None)
            for i in np.flatnonzero(flags):
                refs[i].reset(float(td["observation"][i, 0]))
        assert hist(td).tolist() == [r.h for r in refs]
    env.close()


def test_a_key_the_env_lacks_is_named_with_the_keys_it_has():
    env = TransformedEnv(EnvPool([counting] * 2, seed=0), History(["pixels"], 3))
    for use in (env.reset, lambda: env.observation_spec):
        # (KeyError's text is quoted, so the pattern matches around the quotes)
        with pytest.raises(KeyError, match=r"pixels.. is not an observation entry of the env \(its observation "
                                           r"entries: \[.*observation.*pixels=True"):
            use()
    env.close()
    # an entry the env writes that is no observation (actions, rewards, flags) is named as such
    for key in ("action", "reward", "done"):
        env = TransformedEnv(EnvPool([counting] * 2, seed=0), History([key], 3))
        for use in (env.reset, lambda: env.observation_spec):
            with pytest.raises(KeyError, match=rf"{key}.. is not an observation entry.*History keeps observations"):
                use()
        env.close()


def test_an_input_without_history_starts_one_even_when_the_feature_size_equals_the_length():
    # observation (N, 3) and length 3: a raw observation must not pass for a (N, 3, 3) history
    pool = EnvPool([functools.partial(counting, length=9)] * 2, seed=0)
    env = TransformedEnv(pool, History("observation", 3, out_keys=["observation"]))
    td = pool.reset()  # the raw observation, no history
    out = env.step(act(td, 2))["next"]
    assert out["observation"].shape == (2, 3, 3)
    assert out["observation"][..., 0].tolist() == [[1, 1, 1]] * 2  # a fresh history of the new observation
    env.close()


class _AwayFromZero(gym.Env):
    """Box(1, 2) observations: zero padding lies outside the observation's bounds."""

    observation_space = gym.spaces.Box(1.0, 2.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, 1.5, np.float32), {}

    def step(self, action):
        return np.full(2, 1.5, np.float32), 0.0, False, False, {}


def test_zero_padding_is_inside_the_declared_history_spec():
    from torchrl.envs.utils import check_env_specs

    from torchrl_swm import to_gymnasium

    env = TransformedEnv(EnvPool([_AwayFromZero] * 2, seed=0), History(["observation"], 4, padding="zeros"))
    spec = env.observation_spec["history", "observation"]
    td = env.reset()
    assert td["history", "observation"][0, :3].eq(0).all() and spec.is_in(td["history", "observation"])
    assert spec.space.low.min() == 0 and spec.space.high.max() == 2  # widened to 0, not unbounded
    check_env_specs(env)
    vec = to_gymnasium(env, observation_keys=[("history", "observation")])
    assert vec.observation_space.contains(vec.reset(seed=0)[0])
    vec.close()
    # "same" padding repeats a real observation: the observation's own spec stays
    first = TransformedEnv(EnvPool([_AwayFromZero] * 2, seed=0), History(["observation"], 4, padding="same"))
    assert first.observation_spec["history", "observation"].space.low.min() == 1
    first.close()


@pytest.mark.parametrize("spec, kind", [
    (OneHot(5, shape=(3, 4, 5)), "Binary"),
    (Bounded(5, 9, shape=(3, 4, 1), dtype=torch.int64), "Bounded"),
    (Categorical(5, shape=(3, 4, 1)), "Categorical"),  # 0 is a valid index: unchanged
])
def test_zero_padded_history_specs_of_discrete_observations_admit_zeros(spec, kind):
    from torchrl_swm.transforms import _admitting_zeros

    widened = _admitting_zeros(spec)
    assert type(widened).__name__.startswith(kind) and widened.shape == spec.shape and widened.dtype == spec.dtype
    assert widened.is_in(torch.zeros(spec.shape, dtype=spec.dtype)) and widened.is_in(spec.rand())


@pytest.mark.parametrize("padding", ["same", "zeros"])
def test_a_group_entry_keeps_a_history_of_each_leaf(padding):
    # ("info",) is a group (a TensorDict of leaves): both paddings, each leaf as it would be alone
    factories = [functools.partial(counting, length=50)] * 2
    grouped = TransformedEnv(EnvPool(factories, seed=0), History(["info"], 3, padding=padding))
    single = TransformedEnv(EnvPool(factories, seed=0), History([("info", "t")], 3, padding=padding))
    check_env_specs(grouped)
    a, b = grouped.reset(), single.reset()
    for _ in range(4):
        assert torch.equal(a["history", "info", "t"], b["history", "info", "t"])
        a, b = step_mdp(grouped.step(act(a, 2))), step_mdp(single.step(act(b, 2)))
    assert a["history", "info", "t"][:, :, 0].tolist() == [[2, 3, 4]] * 2
    grouped.close()
    single.close()


class _BelowZero(gym.Env):
    """Box(-2, -1) observations: zero padding lies above the observation's upper bound."""

    observation_space = gym.spaces.Box(-2.0, -1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, -1.5, np.float32), {}

    def step(self, action):
        return np.full(2, -1.5, np.float32), 0.0, False, False, {}


def test_zero_padding_of_an_all_negative_observation_raises_the_upper_bound_to_zero():
    # the bounds stretch to 0 on either side: here the high (-1) goes up to 0, the low stays -2
    env = TransformedEnv(EnvPool([_BelowZero] * 2, seed=0), History(["observation"], 3, padding="zeros"))
    spec = env.observation_spec["history", "observation"]
    td = env.reset()
    assert td["history", "observation"][:, :2].eq(0).all() and spec.is_in(td["history", "observation"])
    assert spec.space.high.max() == 0 and spec.space.low.min() == -2
    check_env_specs(env)
    env.close()


def test_a_tuple_key_is_one_nested_key():
    # ("info", "t") names one entry, as [("info", "t")] does: not the two keys "info" and "t"
    factories = [functools.partial(counting, length=9)] * 2
    tupled = TransformedEnv(EnvPool(factories, seed=0), History(("info", "t"), 3))
    listed = TransformedEnv(EnvPool(factories, seed=0), History([("info", "t")], 3))
    assert tupled.transform.in_keys == [("info", "t")] and tupled.transform.out_keys == [("history", "info", "t")]
    a, b = step_mdp(tupled.step(act(tupled.reset(), 2))), step_mdp(listed.step(act(listed.reset(), 2)))
    assert a["history", "info", "t"].shape == (2, 3, 1)
    assert torch.equal(a["history", "info", "t"], b["history", "info", "t"])
    tupled.close()
    listed.close()


def test_a_tuple_out_key_is_one_nested_out_key():
    # out_keys=("ctx", "t") is where the one key's history goes, not two out keys for one key
    env = TransformedEnv(EnvPool([functools.partial(counting, length=9)] * 2, seed=0),
                         History([("info", "t")], 3, out_keys=("ctx", "t")))
    assert env.transform.out_keys == [("ctx", "t")]
    td = step_mdp(env.step(act(env.reset(), 2)))
    assert td["ctx", "t"][..., 0].tolist() == [[0, 0, 1]] * 2 and ("history", "info", "t") not in td.keys(True)
    env.close()


@pytest.mark.parametrize("mask_shape", [(3, 1), (3,)])
def test_a_direct_reset_call_with_a_partial_reset_keeps_the_other_rows_history(mask_shape):
    # In a TransformedEnv (TorchRL 0.14.1) History._reset gets only the reset and state keys, no old history,
    # and TorchRL puts the rows that were not reset back itself. Transform._reset(tensordict, tensordict_reset)
    # is TorchRL's API though: a direct call with the old history and a partial "_reset" reaches History's own
    # merge, which must refresh the reset rows only.
    transform = History(["observation"], 3)
    old = torch.arange(18.0).reshape(3, 3, 2) + 100
    reset = torch.tensor([True, False, True]).reshape(mask_shape)
    td = TensorDict({"_reset": reset, ("history", "observation"): old}, [3])
    obs = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    out = transform._reset(td, TensorDict({"observation": obs.clone()}, [3]))["history", "observation"]
    assert torch.equal(out[1], old[1])  # not reset: its history stays
    assert torch.equal(out[[0, 2]], obs[[0, 2]].unsqueeze(1).expand(2, 3, 2))  # reset: the observation, repeated
    # a full reset, or no old history to keep, gives every row a fresh history
    for old_td in (TensorDict({"_reset": torch.ones(mask_shape, dtype=torch.bool), ("history", "observation"): old},
                              [3]),
                   TensorDict({"_reset": reset}, [3])):
        out = transform._reset(old_td, TensorDict({"observation": obs.clone()}, [3]))["history", "observation"]
        assert torch.equal(out, obs.unsqueeze(1).expand(3, 3, 2))
    # an old history of another length (another History's) is not this one's to keep: every row starts afresh
    shorter = TensorDict({"_reset": reset, ("history", "observation"): old[:, :2]}, [3])
    out = transform._reset(shorter, TensorDict({"observation": obs.clone()}, [3]))["history", "observation"]
    assert torch.equal(out, obs.unsqueeze(1).expand(3, 3, 2))


class _GroupAwayFromZero(gym.Env):
    """A nested Dict observation whose leaf is Box(1, 2, int8): zero padding lies outside the leaf's bounds."""

    observation_space = gym.spaces.Dict({"a": gym.spaces.Dict({"x": gym.spaces.Box(1, 2, (2,), np.int8)})})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"a": {"x": np.ones(2, np.int8)}}, {}

    def step(self, action):
        return {"a": {"x": np.full(2, 2, np.int8)}}, 0.0, False, False, {}


def test_zero_padding_of_a_group_entry_widens_the_spec_of_each_leaf():
    env = TransformedEnv(EnvPool([_GroupAwayFromZero] * 2, seed=0), History([("a",)], 3, padding="zeros"))
    spec = env.observation_spec["history", "a", "x"]
    td = env.reset()
    assert td["history", "a", "x"][:, :2].eq(0).all() and spec.is_in(td["history", "a", "x"])
    assert spec.space.low.min() == 0 and spec.space.high.max() == 2
    check_env_specs(env)
    env.close()
