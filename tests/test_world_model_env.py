"""WorldModelEnv as a TorchRL env: specs, batched stepping, masked resets, reset sources, seeding, gradients,
the fast step_and_maybe_reset path, transforms, collectors and planners."""

from __future__ import annotations

import functools
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mask_sequences import drive_against_reference
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import (
    Bounded,
    Composite,
    LazyTensorStorage,
    MultiOneHot,
    OneHot,
    ReplayBuffer,
    TensorDictReplayBuffer,
    Unbounded,
)
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.utils import check_env_specs
from torchrl.testing import rollout_consistency_assertion
from wm_models import ACT1, OBS3, CountingModel, EncoderModel, NoisyModel, PointMass, RSSMLike, counting_env

from torchrl_swm import WorldModelEnv, make_world_model_env, to_gymnasium
from torchrl_swm.errors import SpecError
from torchrl_swm.world_model import ActionAdapter, ObservationDecoder, RewardAdapter, TerminalAdapter
from torchrl_swm.world_model.adapters import AdapterError, ReturnFormError

BOX2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
FORCE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def reset_td(n, rows):
    mask = torch.zeros(n, 1, dtype=torch.bool)
    mask[list(rows)] = True
    return TensorDict({"_reset": mask}, batch_size=[n])


def noisy_env(n=6, seed=0, device="cpu", **kwargs):
    kwargs.setdefault("initial_state", torch.zeros(4))
    return WorldModelEnv(NoisyModel().to(device), BOX4, FORCE, num_envs=n, seed=seed, device=device, **kwargs)


def dict_obs_env(n=3):
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)}),
        }
    )

    def transition(state, action):
        nxt = state + action
        return {
            "state": nxt,
            "observation": {"pos": nxt, "goal": {"xy": -nxt}},
            "reward": nxt[:, 0],
            "terminated": nxt[:, 0].abs() > 1.0,
        }

    return WorldModelEnv(
        object(),
        space,
        FORCE,
        num_envs=n,
        initial_state=torch.zeros(2),
        initial_observation={"pos": torch.zeros(2), "goal": {"xy": torch.zeros(2)}},
        transition_fn=transition,
    )


def full_factory_env(n=3):
    def to_model(action):
        return torch.nn.functional.one_hot(action, 3).float()

    def transition(model, state, action):
        return {"state": state + action[:, :1] - action[:, 2:]}

    return make_world_model_env(
        object(),
        BOX2,
        gym.spaces.Discrete(3),
        num_envs=n,
        initial_state=torch.zeros(2),
        transition_fn=transition,
        action_transform_fn=to_model,
        reward_fn=lambda s, o, a: o[:, 0],
        terminal_fn=lambda s, o, a: o[:, 0] > 3,
        max_episode_steps=7,
        decoder=lambda obs: (obs.abs().clamp(0, 1) * 255).to(torch.uint8).unsqueeze(-1).expand(-1, 2, 4),
        seed=0,
    )


ENVS = {
    "counting": lambda: counting_env(4, length=torch.tensor([2, 3, 4, 5])),
    "noisy": lambda: noisy_env(5),
    "dict-obs": lambda: dict_obs_env(3),
    "discrete": lambda: WorldModelEnv(
        object(),
        BOX2,
        gym.spaces.Discrete(4),
        num_envs=3,
        initial_state=torch.zeros(2),
        transition_fn=lambda s, a: s + a.unsqueeze(-1).float(),
    ),
    "state-key": lambda: noisy_env(3, state_key="latent", initial_observation=torch.zeros(4)),
    "rssm-state-key": lambda: WorldModelEnv(
        RSSMLike(),
        gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        ACT1,
        num_envs=2,
        state_key="rssm",
        initial_state={"deter": torch.zeros(3), "stoch": torch.zeros(2)},
        initial_observation=torch.zeros(3),
        transition_fn=lambda m, s, a: (lambda n: {"state": n, "observation": n["deter"]})(m.imagine_step(s, a)),
    ),
    "info": lambda: WorldModelEnv(
        object(),
        BOX2,
        BOX2,
        num_envs=3,
        initial_state=torch.zeros(2),
        info_spec={"u": torch.zeros(2)},
        transition_fn=lambda s, a: (s + a, s + a, torch.zeros(3), (s + a)[:, 0] > 0.5, False, {"u": a * 2}),
    ),
    "factory": lambda: full_factory_env(3),
    "unlocked": lambda: WorldModelEnv(
        PointMass(), BOX4, FORCE, num_envs=None, state_key="observation", initial_state=torch.zeros(4)
    ),
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_check_env_specs(name):
    env = ENVS[name]()
    check_env_specs(env)
    check_env_specs(env, break_when_any_done="both")


def test_batched_env_spec_shapes():
    env = counting_env(5)
    assert env.batch_size == (5,) and env.batch_locked
    assert env.observation_spec["observation"].shape == (5, 3)
    assert env.action_spec.shape == (5, 1) and env.reward_spec.shape == (5, 1)
    assert env.full_done_spec["done"].shape == (5, 1) and env.full_done_spec["truncated"].dtype == torch.bool
    # gymnasium spaces or TorchRL specs, both accepted
    env2 = WorldModelEnv(CountingModel(), Unbounded((3,)), ACT1, num_envs=5, initial_state=torch.zeros(3))
    assert env2.observation_spec["observation"].shape == (5, 3)


def test_model_is_called_once_per_step_for_the_whole_batch():
    env = counting_env(16, length=100)
    env.rollout(20, break_when_any_done=False)
    assert env.model.calls == 20 and set(env.model.batch_sizes) == {16}


def test_rollout_nonstop_with_a_done_head_resets_only_done_rows():
    n = 5
    env = counting_env(n, length=torch.tensor([2, 3, 4, 5, 7]))
    rollout = env.rollout(100, break_when_any_done=False)
    assert rollout.batch_size == (n, 100) and rollout.names[-1] == "time"
    t, nt = rollout["observation"][..., 0], rollout["next", "observation"][..., 0]
    done = rollout["next", "done"][..., 0]
    assert torch.equal(nt, t + 1)
    assert torch.equal(rollout["observation"][:, 1:, 0][done[:, :-1]], torch.zeros(int(done[:, :-1].sum())))
    assert torch.equal(done, nt == torch.tensor([2, 3, 4, 5, 7.0]).unsqueeze(-1))
    mixed = (done.any(0) & ~done.all(0)).sum()
    assert mixed > 50
    rollout_consistency_assertion(rollout, done_key="done", observation_key="observation", done_strict=True)


def test_masked_reset_touches_only_masked_rows():
    env = counting_env(4, length=50)
    td = env.reset()
    for _ in range(3):
        td["action"] = torch.ones(4, 1)
        td = env.step(td)["next"].clone()
    calls = env.model.calls
    before = env.state.clone()
    out = env.reset(td.update(reset_td(4, [1])))
    assert out["observation"][:, 0].tolist() == [3.0, 0.0, 3.0, 3.0]
    assert env.model.calls == calls, "a reset must not step the model"
    keep = [0, 2, 3]
    assert torch.equal(env.state[keep], before[keep]) and env.state[1].tolist() == [0.0, 0.0, 0.0]


def test_reset_from_the_maybe_reset_path_gets_only_the_mask_and_returns_the_full_batch():
    env = counting_env(3, length=1)
    td = env.reset()
    td["action"] = torch.zeros(3, 1)
    nxt = env.step(td)["next"]
    assert nxt["done"].all() and nxt["terminated"].all()
    out = env._reset(reset_td(3, [0]))
    assert out.batch_size == (3,)
    assert not out["done"][0] and out["done"][1:].all(), "unmasked rows are left as they were"
    assert out["observation"][:, 0].tolist() == [0.0, 1.0, 1.0]


def test_mask_isolation_two_same_seed_envs():
    """Reset row k in one of two same-seed envs of a stochastic model: every other row stays identical."""
    n, k = 6, 2
    a, b = noisy_env(n, seed=7), noisy_env(n, seed=7)
    ta, tb = a.reset(), b.reset()
    gen = torch.Generator().manual_seed(0)
    others = [i for i in range(n) if i != k]
    diverged, dones = False, 0
    for t in range(120):
        if t == 10:
            tb = b.reset(tb.update(reset_td(n, [k])))
        action = torch.rand(n, 2, generator=gen) * 2 - 1
        ta["action"], tb["action"] = action, action.clone()
        ra, ta = a.step_and_maybe_reset(ta)
        rb, tb = b.step_and_maybe_reset(tb)
        assert (ra[others] == rb[others]).all(), f"rows other than {k} diverged at step {t}"
        diverged |= not torch.equal(ra["next", "observation"][k], rb["next", "observation"][k])
        dones += int(ra["next", "done"][others].sum())
    assert diverged
    assert dones > 0, "other rows finished and restarted meanwhile (partial resets in both envs)"


def test_mask_isolation_with_starts_sampled_from_data(device):
    """Starts sampled from start_states, a stochastic model: resetting row k in one of two same-seed envs
    changes neither the model noise nor the later starts of any other row (they restart meanwhile too)."""
    n, k = 6, 2
    data = TensorDict({"observation": torch.randn(32, 4, generator=torch.Generator().manual_seed(5))}, [32]).to(device)
    a, b = (noisy_env(n, seed=7, device=device, start_states=data, initial_state=None) for _ in range(2))
    ta, tb = a.reset(), b.reset()
    gen = torch.Generator().manual_seed(0)
    others = [i for i in range(n) if i != k]
    restarts = 0
    for t in range(120):
        if t in (10, 40):
            tb = b.reset(tb.update(reset_td(n, [k]).to(device)))
        action = (torch.rand(n, 2, generator=gen) * 2 - 1).to(device)
        ta["action"], tb["action"] = action, action.clone()
        ra, ta = a.step_and_maybe_reset(ta)
        rb, tb = b.step_and_maybe_reset(tb)
        assert (ra[others] == rb[others]).all(), f"rows other than {k} diverged at step {t}"
        restarts += int(ra["next", "done"][others].sum())
    assert restarts > 0, "other rows restarted from sampled starts meanwhile"
    assert not torch.equal(a.state[k], b.state[k])


def test_outputs_never_change_after_later_steps():
    env = noisy_env(4, seed=1)
    td = env.reset()
    td["action"] = torch.ones(4, 2)
    out, td_ = env.step_and_maybe_reset(td)
    frozen = out.clone()
    for _ in range(30):
        td_["action"] = torch.ones(4, 2)
        _, td_ = env.step_and_maybe_reset(td_)
    assert (out == frozen).all()


def test_writing_into_reset_outputs_does_not_corrupt_later_resets():
    env = counting_env(2, length=100)
    td = env.reset()
    td["observation"].add_(100.0)  # callers (collectors) may write into what they received
    assert env.reset()["observation"].tolist() == [[0.0, 0.0, 0.0]] * 2


# -------------------------------------------------------------------------------------------------
# reset sources
# -------------------------------------------------------------------------------------------------


class EncodingModel(CountingModel):
    def encode(self, obs):
        return obs * 10


def test_initial_observation_is_encoded_with_model_encode_or_identity():
    env = WorldModelEnv(
        EncodingModel(),
        OBS3,
        ACT1,
        num_envs=2,
        initial_observation=torch.ones(3),
        transition_fn=lambda s, a: {"state": s, "observation": s / 10},
    )
    assert env.reset()["observation"].tolist() == [[1.0] * 3] * 2
    assert env.state.tolist() == [[10.0] * 3] * 2
    env = WorldModelEnv(EncodingModel(), OBS3, ACT1, num_envs=2, initial_observation=torch.ones(3), encode_fn=False)
    env.reset()
    assert env.state.tolist() == [[1.0] * 3] * 2
    env = WorldModelEnv(CountingModel(), OBS3, ACT1, num_envs=2, initial_observation=torch.ones(3))
    env.reset()
    assert env.state.tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("with_model", [True, False])
def test_encode_fn_both_signatures(with_model):
    model = CountingModel()
    encode = (lambda m, obs: obs + (5 if m is model else -99)) if with_model else (lambda obs: obs + 5)
    env = WorldModelEnv(model, OBS3, ACT1, num_envs=2, initial_observation=torch.zeros(3), encode_fn=encode)
    env.reset()
    assert env.state.tolist() == [[5.0] * 3] * 2


def test_reset_fn_gets_the_number_of_rows_and_fills_only_them():
    made = []

    def reset_fn(num_envs, generator):
        made.append(num_envs)
        episode = torch.full((num_envs, 1), float(len(made)))
        return torch.cat([torch.zeros(num_envs, 1), episode, torch.zeros(num_envs, 1)], -1)

    env = WorldModelEnv(CountingModel(length=100), OBS3, ACT1, num_envs=4, reset_fn=reset_fn)
    env.rollout(6, break_when_any_done=False)  # the fast path's resets call reset_fn too
    made.clear()
    td = env.reset()
    td["action"] = torch.zeros(4, 1)
    td = env.step(td)["next"].clone()
    out = env.reset(td.update(reset_td(4, [0, 3])))
    assert made == [4, 2]
    assert out["observation"][:, :2].tolist() == [[0.0, 2.0], [1.0, 1.0], [1.0, 1.0], [0.0, 2.0]]


def test_reset_fn_mask_is_one_flag_per_env_on_both_reset_paths():
    masks = []

    def reset_fn(num_envs, mask):
        masks.append(mask.clone())
        return torch.zeros(num_envs, 3)

    env = WorldModelEnv(CountingModel(length=torch.tensor([1, 100, 2])), OBS3, ACT1, num_envs=3, reset_fn=reset_fn)
    env.rollout(3, break_when_any_done=False)  # fast path resets
    env._reset(reset_td(3, [1]))  # generic path
    assert all(m.shape == (3,) and m.dtype == torch.bool for m in masks)
    assert masks[1].tolist() == [True, False, False] and masks[-1].tolist() == [False, True, False]


def test_a_reset_fn_that_writes_to_its_mask_changes_neither_the_callers_mask_nor_the_flags():
    """reset_fn's mask was a view of "_reset" (or, in step_and_maybe_reset, of the step's done), read again after
    the call: a reset_fn using it as scratch space cleared the caller's mask and kept the restarted row done."""

    def reset_fn(num_envs, mask):
        mask.zero_()
        return torch.full((num_envs, 2), 0.5)

    def transition(state, action):
        return {"state": state + action, "terminated": state[:, :1] + action[:, :1] > 1.0}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=reset_fn, transition_fn=transition)
    action = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    out, root = env.step_and_maybe_reset(env.reset().set("action", action))  # row 0 ends and restarts
    assert out["next", "done"].view(-1).tolist() == [True, False, False]
    assert root["done"].view(-1).tolist() == [False] * 3 and root["observation"][0].tolist() == [0.5, 0.5]
    td = env.step_mdp(env.step(env.reset().set("action", action)))
    mask = torch.tensor([[True], [False], [False]])
    after = env.reset(td.set("_reset", mask))
    assert mask.view(-1).tolist() == [True, False, False]
    assert after["done"].view(-1).tolist() == [False] * 3 and after["observation"][0].tolist() == [0.5, 0.5]
    assert after["observation"][1:].tolist() == td["observation"][1:].tolist()


def _real_data(m=10):
    obs = torch.arange(m * 3, dtype=torch.float32).view(m, 3)
    return obs, TensorDict({"observation": obs, "other": torch.zeros(m)}, [m])


@pytest.mark.parametrize("source", ["tensordict", "td_replay_buffer", "tensor_replay_buffer"])
def test_start_states_real_data_sampled_with_the_generator_and_encoded(source):
    obs, data = _real_data()
    if source == "tensordict":
        start = data
    elif source == "td_replay_buffer":
        start = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        start.extend(data)
    else:
        start = ReplayBuffer(storage=LazyTensorStorage(100))
        start.extend(obs)
    make = functools.partial(
        WorldModelEnv,
        EncodingModel(length=100),
        OBS3,
        ACT1,
        num_envs=6,
        start_states=start,
        transition_fn=lambda s, a: {"state": s, "observation": s / 10},
    )
    env = make(seed=3)
    first = env.reset()["observation"]
    rows = {tuple(r) for r in obs.tolist()}
    assert all(tuple(r) in rows for r in first.tolist())
    assert torch.equal(env.state, first * 10), "encoded by model.encode"
    assert torch.equal(make(seed=3).reset()["observation"], first), "same seed, same sampled starts"
    td = env.reset()
    td["action"] = torch.zeros(6, 1)
    nxt = env.step(td)["next"].clone()
    out = env.reset(nxt.update(reset_td(6, [2])))
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(out["observation"][keep], nxt["observation"][keep])
    assert tuple(out["observation"][2].tolist()) in rows


def test_start_states_with_encode_fn_and_errors():
    obs, data = _real_data()
    env = WorldModelEnv(CountingModel(), OBS3, ACT1, num_envs=2, start_states=data, encode_fn=lambda o: o - 1, seed=0)
    td = env.reset()
    assert torch.equal(env.state, td["observation"] - 1)
    with pytest.raises(KeyError, match="missing observation keys"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, num_envs=2, start_states=TensorDict({"x": torch.zeros(4, 3)}, [4]))
    with pytest.raises(TypeError, match="not both"):
        WorldModelEnv(CountingModel(), OBS3, ACT1, start_states=data, reset_fn=lambda: torch.zeros(3))
    with pytest.raises(TypeError, match="needs a way to start episodes"):
        WorldModelEnv(CountingModel(), OBS3, ACT1)


_ENDS_0_2 = torch.tensor([[True], [False], [True], [False]])  # rows 0 and 2 end at every step


@pytest.mark.parametrize("source", ["reset_fn", "start_states"])
def test_rows_a_partial_reset_restarts_show_the_new_episodes_observation_apart_from_the_state(source, monkeypatch):
    """Where the observation is not the state (a reset_fn returning (state, observation); start_states encoded by
    the model), a row a partial reset restarts shows its new episode's start observation next to its start state,
    and the other rows keep theirs: on env.reset with a "_reset" mask and on step_and_maybe_reset's fused restart.
    The expectations are written out by hand: the tests comparing both paths cannot see a fault in the restart they
    share (a restarted row kept its last observation next to its new state)."""
    if source == "reset_fn":
        calls = []

        def reset_fn(num_envs):
            calls.append(num_envs)
            k = float(len(calls))  # the k-th call starts state 100 k, observation -k
            return torch.full((num_envs, 3), 100.0 * k), torch.full((num_envs, 2), -k)

        def make():
            calls.clear()
            return WorldModelEnv(object(), BOX2, FORCE, num_envs=4, reset_fn=reset_fn,
                                 transition_fn=lambda s, a: {"state": s + 1, "observation": (s + 1)[:, :2],
                                                             "terminated": _ENDS_0_2.clone()})

        # rows 0 and 2 restart from the second reset_fn call; rows 1 and 3 stepped once from the first's
        start_obs, start_state = torch.full((2, 2), -2.0), torch.full((2, 3), 200.0)
        stepped_obs, stepped_state = torch.full((2, 2), 101.0), torch.full((2, 3), 101.0)
    else:
        model = EncoderModel()
        x0 = torch.tensor([[0.5, -0.25]])  # the only entry: every episode starts from it

        def make():
            return WorldModelEnv(model, BOX2, FORCE, num_envs=4, seed=0,
                                 start_states=TensorDict({"observation": x0}, [1]),
                                 transition_fn=lambda m, s, a: {**m.step(s, a), "terminated": _ENDS_0_2.clone()})

        with torch.no_grad():
            encoded = model.encode(x0)
            state = model.dyn(torch.cat([encoded, torch.zeros(1, 2)], -1))
            start_obs, start_state = x0.expand(2, 2), encoded.expand(2, 4)
            stepped_obs, stepped_state = model.dec(state).expand(2, 2), state.expand(2, 4)
        assert not torch.allclose(stepped_obs, start_obs)

    generic = make()
    td = generic.reset()
    td["action"] = torch.zeros(4, 2)
    nxt = generic.step(td)["next"].clone()
    generic_root = generic.reset(nxt.update(reset_td(4, [0, 2])))
    assert source != "reset_fn" or calls == [4, 2]

    calls_generic = []
    original = EnvBase._step_and_maybe_reset
    monkeypatch.setattr(EnvBase, "_step_and_maybe_reset",
                        lambda self, td: calls_generic.append(self) or original(self, td))
    fused = make()
    td = fused.reset()
    td["action"] = torch.zeros(4, 2)
    out, fused_root = fused.step_and_maybe_reset(td)
    assert calls_generic == [], "the fused path ran"
    assert source != "reset_fn" or calls == [4, 2]
    assert out["next", "done"].view(-1).tolist() == [True, False, True, False]

    for env, root in ((generic, generic_root), (fused, fused_root)):
        assert torch.equal(root["observation"][[0, 2]], start_obs), "restarted rows: the new episode's observation"
        torch.testing.assert_close(env.state[[0, 2]], start_state)
        torch.testing.assert_close(root["observation"][[1, 3]], stepped_obs)
        torch.testing.assert_close(env.state[[1, 3]], stepped_state)
        assert not root["done"].any()


def test_model_reset_method_is_discovered_and_explicit_initial_state_wins():
    class WithReset(CountingModel):
        def reset_state(self, seed, options):
            return torch.full((3,), 7.0)

    env = WorldModelEnv(WithReset(), OBS3, ACT1, num_envs=2)
    assert env.reset()["observation"].tolist() == [[7.0] * 3] * 2
    env = WorldModelEnv(WithReset(), OBS3, ACT1, num_envs=2, initial_state=torch.ones(3))
    assert env.reset()["observation"].tolist() == [[1.0] * 3] * 2


# -------------------------------------------------------------------------------------------------
# seeding
# -------------------------------------------------------------------------------------------------


def _rollout(env, steps=40):
    gen = torch.Generator().manual_seed(11)
    actions = iter(torch.rand(steps, env.batch_size[0], 2, generator=gen) * 2 - 1)
    return env.rollout(steps, lambda td: td.set("action", next(actions)), break_when_any_done=False)


def test_same_seed_same_rollout_model_randomness_included():
    obs = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    data = TensorDict({"observation": obs}, [20])
    make = functools.partial(noisy_env, 5, start_states=data, initial_state=None)
    r1, r2, r3 = _rollout(make(seed=3)), _rollout(make(seed=3)), _rollout(make(seed=4))
    assert (r1 == r2).all()
    assert not torch.equal(r1["next", "observation"], r3["next", "observation"])
    assert r1["next", "done"].any(), "the rollout should include resets (sampled from start_states)"
    env = make(seed=99)
    env.set_seed(3)
    assert (_rollout(env) == r1).all()


def test_unseeded_envs_draw_different_model_noise():
    # seed=None is fresh OS entropy for the model stream too, not torch's fixed default seed; same zero starts
    ra, rb = _rollout(noisy_env(seed=None), 5), _rollout(noisy_env(seed=None), 5)
    assert not torch.equal(ra["next", "observation"], rb["next", "observation"])


def test_reset_seed_keyword_reseeds_and_models_may_use_the_env_generator():
    holder = {}

    def transition(state, action):  # uses the env's generator directly
        return state + torch.randn(state.shape, generator=holder["env"].generator)

    def make():
        env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition)
        holder["env"] = env
        return env

    outs = []
    for _ in range(2):
        env = make()
        td = env.reset(seed=5)
        td["action"] = torch.zeros(3, 2)
        outs.append(env.step(td)["next", "observation"])
    assert torch.equal(outs[0], outs[1])


def test_generator_sits_on_the_env_device(device):
    env = WorldModelEnv(
        PointMass().to(device), BOX4, FORCE, num_envs=3, initial_state=torch.zeros(4), device=device, seed=0
    )
    assert env.generator.device.type == device.type
    rollout = env.rollout(5, break_when_any_done=False)
    assert rollout.device.type == device.type and rollout["next", "observation"].device.type == device.type
    check_env_specs(env)


def test_same_seed_same_rollout_on_device_with_start_states(device):
    data = TensorDict({"observation": torch.randn(20, 4, generator=torch.Generator().manual_seed(0))}, [20])
    make = functools.partial(noisy_env, 5, device=device, start_states=data.to(device), initial_state=None)
    gen = torch.Generator().manual_seed(11)
    actions = (torch.rand(30, 5, 2, generator=gen) * 2 - 1).to(device)

    def run(env):
        it = iter(actions)
        return env.rollout(30, lambda td: td.set("action", next(it)), break_when_any_done=False)

    r1, r2 = run(make(seed=3)), run(make(seed=3))
    assert r1.device.type == device.type and (r1 == r2).all() and r1["next", "done"].any()


@pytest.mark.parametrize("n", [1, 8])  # one row: the fast path counts the done rows its own way
def test_fast_path_equals_generic_path_on_device(device, n):
    fast, generic = noisy_env(n, seed=2, device=device), noisy_env(n, seed=2, device=device)
    tf, tg = fast.reset(), generic.reset()
    torch.manual_seed(0)
    restarts = 0
    for _ in range(60):
        action = fast.full_action_spec.rand()
        tf.update(action.clone())
        tg.update(action.clone())
        of, tf = fast.step_and_maybe_reset(tf)
        og, tg = EnvBase._step_and_maybe_reset(generic, tg)
        assert (of == og).all() and (tf == tg).all()
        restarts += int(of["next", "done"].sum())
    assert restarts >= 2  # the comparison covered restarts, not only steps


def test_env_does_not_own_or_move_the_model():
    model = NoisyModel()
    env = WorldModelEnv(model, BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4))
    assert list(env.parameters()) == [] and env.model is model
    assert env.to("cpu") is env
    with pytest.raises(RuntimeError, match="cannot be moved to meta"):
        env.to("meta")
    with pytest.raises(TypeError, match=r"expected a device.*model.to\(torch.float64\)"):
        env.to(torch.float64)
    transformed = make_world_model_env(model, BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4))
    assert transformed.to("cpu") is transformed
    for args, kwargs in (((torch.float64,), {}), ((), {"dtype": torch.float64}), (("cpu", torch.float64), {})):
        for which in (env, transformed):  # not torch's own error, however the dtype is given
            with pytest.raises(TypeError, match=r"expected a device.*model.to\(torch.float64\)"):
                which.to(*args, **kwargs)
    assert env.to(device="cpu") is env and transformed.to(device="cpu") is transformed
    with pytest.raises(RuntimeError, match="cannot be moved to meta"):
        transformed.to("meta")


def test_device_mismatch_is_an_error():
    with pytest.raises(ValueError, match="the model's parameters are on cpu"):
        WorldModelEnv(PointMass(), BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4), device="meta")


@pytest.mark.parametrize("name", ["reward", "terminated", "truncated"])
def test_a_reward_or_flag_on_another_device_than_the_envs_is_refused(device, name):
    """A reward or flag the model returns on another device than the env's (a reward head left on the CPU by a CUDA
    model) is a ReturnFormError naming both devices, not an output on the wrong device. On a CPU env the other
    device is 'meta' (no data: values of the right shape and dtype anywhere but the env's device)."""
    other = torch.device("cpu" if device.type == "cuda" else "meta")
    values = {"reward": torch.zeros(3, 1, device=other), "terminated": torch.zeros(3, 1, dtype=torch.bool, device=other),
              "truncated": torch.zeros(3, 1, dtype=torch.bool, device=other)}

    def transition(s, a):
        return {"state": s + a, name: values[name]}

    env = WorldModelEnv(object(), BOX2, FORCE, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition,
                        device=device)
    td = env.reset()
    td["action"] = torch.zeros(3, 2, device=device)
    with pytest.raises(ReturnFormError, match=rf"{name}: expected device {env.device}, got {other}"):
        env.step(td)


# -------------------------------------------------------------------------------------------------
# gradients
# -------------------------------------------------------------------------------------------------


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, state, action):
        nxt = torch.tanh(self.lin(torch.cat([state, action], -1)))
        return {"state": nxt, "reward": nxt.sum(-1)}


def _policy():
    torch.manual_seed(0)
    return TensorDictModule(nn.Sequential(nn.Linear(4, 2), nn.Tanh()), in_keys=["observation"], out_keys=["action"])


def test_differentiable_rollout_gradient_reaches_policy_parameters():
    model = Linear()
    env = WorldModelEnv(
        model, BOX4, FORCE, num_envs=3, initial_state=torch.full((4,), 0.1), differentiable=True, seed=0
    )
    policy = _policy()
    rollout = env.rollout(8, policy, break_when_any_done=False)
    loss = -rollout["next", "reward"].sum()
    loss.backward()
    grad = policy.module[0].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    assert model.lin.weight.grad is not None


def test_differentiable_through_the_adapter_transforms():
    model = Linear()

    def transition(m, state, action):
        return {"state": m(state, action)["state"]}  # no reward: the RewardAdapter supplies it

    env = make_world_model_env(
        model,
        BOX4,
        FORCE,
        num_envs=2,
        initial_state=torch.full((4,), 0.1),
        transition_fn=transition,
        reward_fn=lambda s, o, a: -(s**2).sum(-1),
        action_transform_fn=lambda a: a * 0.5,
        max_episode_steps=50,
        decoder=lambda obs: obs * 2,  # a float "image": decoded with the graph kept, like the rest
        decoder_spec=Unbounded(shape=(4,)),
        differentiable=True,
        seed=0,
    )
    policy = _policy()
    rollout = env.rollout(6, policy, break_when_any_done=False)
    assert rollout["next", "pixels"].requires_grad
    rollout["next", "reward"].sum().backward()
    assert policy.module[0].weight.grad.abs().sum() > 0


def test_no_grad_by_default_even_with_a_grad_policy():
    env = WorldModelEnv(Linear(), BOX4, FORCE, num_envs=3, initial_state=torch.full((4,), 0.1), seed=0)
    rollout = env.rollout(8, _policy(), break_when_any_done=False)
    assert not rollout["next", "reward"].requires_grad and env.state.grad_fn is None


# -------------------------------------------------------------------------------------------------
# partial steps and the fast path
# -------------------------------------------------------------------------------------------------


def test_rollout_break_when_all_done_uses_the_step_mask():
    env = counting_env(2, length=torch.tensor([3, 6]))
    rollout = env.rollout(20, break_when_any_done=False, break_when_all_done=True)
    assert rollout.shape == (2, 6)
    assert rollout["next", "observation"][0, :, 0].tolist() == [1, 2, 3, 3, 3, 3]


def test_a_plain_step_runs_a_row_past_its_predicted_end_unlike_the_pool():
    # imagination may run through a predicted terminal (Dreamer weighs such steps by the predicted
    # continuation): a plain step steps a finished row; EnvPool refuses it (StepRefusedError)
    env = counting_env(2, length=torch.tensor([2, 5]))
    td = env.reset()
    for _ in range(4):
        td["action"] = torch.ones(2, 1)
        td = env.step_mdp(env.step(td))
    assert td["observation"][:, 0].tolist() == [4.0, 4.0]
    assert td["terminated"].view(-1).tolist() == [True, False]  # row 0 still past its end (t >= 2)


def test_step_mask_freezes_rows_and_reports_reward_zero():
    env = counting_env(3, length=100)
    td = env.reset()
    td["action"] = torch.ones(3, 1)
    td = env.step(td)["next"].clone()
    td["action"] = torch.ones(3, 1)
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = env.step(td)["next"]
    assert out["observation"][:, 0].tolist() == [2.0, 1.0, 2.0]
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, 1.0]
    assert env.state[:, 0].tolist() == [2.0, 1.0, 2.0]



class _TruncatesOnceModel:
    """State = observation = [t]; the model reports truncated on the step that reaches t == 1 only (a
    frozen row stepped again by the model would read False)."""

    def step(self, state, action):
        nxt = state + 1
        return {"state": nxt, "reward": torch.ones(len(state), 1), "truncated": nxt[:, :1] == 1}


def _step_then_freeze(env, action, stepped):
    """Reset ``env``, step every row with ``action``, then step only the rows where ``stepped`` is True (a
    ``"_step"`` mask; the others wait); returns both steps' ``"next"`` tensordicts."""
    td = env.reset()
    td["action"] = action.clone()
    first = env.step(td)["next"]
    td = first.clone()
    td["action"] = action.clone()
    td["_step"] = torch.tensor(stepped).view(-1, 1)
    return first, env.step(td)["next"]


def test_rows_frozen_by_step_keep_their_truncated_and_done_flags():
    """A row frozen by "_step" keeps its flags from its last step (README "Frozen rows"): a model-reported
    truncation stays truncated (and done) while the row waits, not the model's value for the frozen row."""
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    env = WorldModelEnv(_TruncatesOnceModel(), box, ACT1, num_envs=3, initial_state=torch.zeros(1))
    first, out = _step_then_freeze(env, torch.zeros(3, 1), [False, True, False])  # rows 0 and 2 wait
    assert first["truncated"].view(-1).tolist() == [True, True, True]
    assert out["observation"].view(-1).tolist() == [1.0, 2.0, 1.0]
    assert out["reward"].view(-1).tolist() == [0.0, 1.0, 0.0]
    assert out["truncated"].view(-1).tolist() == [True, False, True]  # the frozen rows keep theirs
    assert out["done"].view(-1).tolist() == [True, False, True]
    assert not out["terminated"].any()


def test_rows_frozen_by_step_keep_a_model_truncation_under_a_step_limit():
    # RowStepCounter: a row the model truncated (before max_episode_steps), frozen by "_step", keeps truncated=True
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    env = make_world_model_env(_TruncatesOnceModel(), box, ACT1, num_envs=3, initial_state=torch.zeros(1),
                               max_episode_steps=5)
    first, out = _step_then_freeze(env, torch.zeros(3, 1), [False, True, False])  # rows 0 and 2 wait
    assert first["truncated"].view(-1).tolist() == [True, True, True]  # the model's, at step 1 of 5
    assert out["step_count"].view(-1).tolist() == [1, 2, 1]
    assert out["truncated"].view(-1).tolist() == [True, False, True]  # not the limit's False for 1 < 5
    assert out["done"].view(-1).tolist() == [True, False, True]


def _truncates_rows_0_2_at_1(state, action):
    """State = observation = [t]; the model itself truncates rows 0 and 2 at t = 1, rows 1 and 3 at t = 3."""
    nxt = state + 1
    return nxt, nxt, torch.ones(4), False, nxt >= torch.tensor([[1.0], [3.0], [1.0], [3.0]]), {}


def test_a_masked_reset_clears_a_model_truncation_on_the_rows_it_restarts():
    """env.reset with a "_reset" mask clears truncated (and done) on the rows it restarts, a truncation the model
    reported itself included; the other rows keep theirs."""
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    env = WorldModelEnv(object(), box, ACT1, num_envs=4, initial_state=torch.zeros(1),
                        transition_fn=_truncates_rows_0_2_at_1)
    td = env.reset()
    td["action"] = torch.zeros(4, 1)
    nxt = env.step(td)["next"].clone()
    assert nxt["truncated"].view(-1).tolist() == [True, False, True, False]
    out = env.reset(nxt.clone().update(reset_td(4, [0])))
    assert out["observation"].view(-1).tolist() == [0.0, 1.0, 1.0, 1.0]
    assert out["truncated"].view(-1).tolist() == [False, False, True, False]  # row 2, not reset, keeps its own
    assert out["done"].view(-1).tolist() == [False, False, True, False]
    out = env.reset(out.update(reset_td(4, [2])))
    assert not out["truncated"].any() and not out["done"].any()


def test_next_step_export_restarted_rows_report_no_truncation_of_the_model():
    """to_gymnasium(autoreset_mode="next_step") of a WorldModelEnv whose start depends on when it runs (a reset_fn)
    restarts the rows that finished at the next step (WorldModelEnv._step_then_reset): those rows report the start
    observation, reward 0 and neither terminated nor truncated, and step on at the step after, a truncation the
    model reported itself included (a truncation kept past the restart restarted them again and again)."""
    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    env = WorldModelEnv(object(), box, ACT1, num_envs=4, seed=0, reset_fn=lambda num_envs: torch.zeros(num_envs, 1),
                        transition_fn=_truncates_rows_0_2_at_1)
    envs = to_gymnasium(env, autoreset_mode="next_step")
    assert envs._step_then_reset is not None
    obs, _ = envs.reset(seed=0)
    assert obs.ravel().tolist() == [0.0] * 4
    steps = [envs.step(np.zeros((4, 1), np.float32)) for _ in range(4)]
    envs.close()
    got = [(o.ravel().tolist(), r.tolist(), te.tolist(), tr.tolist()) for o, r, te, tr, _ in steps]
    no = [False] * 4
    assert got == [
        ([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], no, [True, False, True, False]),
        ([0.0, 2.0, 0.0, 2.0], [0.0, 1.0, 0.0, 1.0], no, no),  # rows 0 and 2 restart
        ([1.0, 3.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0], no, [True, True, True, True]),  # and step on
        ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], no, no),
    ]


def test_rows_frozen_by_step_keep_a_model_termination_done_under_a_step_limit():
    # RowStepCounter: a row that terminated (before max_episode_steps), frozen by "_step" as World's wait mode
    # freezes it, keeps done=True next to its terminated=True: done stays terminated | truncated
    env = make_world_model_env(CountingModel(length=torch.tensor([1, 5, 5])), OBS3, ACT1, num_envs=3,
                               initial_state=torch.zeros(3), max_episode_steps=10)
    first, out = _step_then_freeze(env, torch.zeros(3, 1), [False, True, True])  # the finished row 0 waits
    assert first["terminated"].view(-1).tolist() == [True, False, False]
    assert out["step_count"].view(-1).tolist() == [1, 2, 2]
    assert out["terminated"].view(-1).tolist() == [True, False, False]
    assert not out["truncated"].any()
    assert out["done"].view(-1).tolist() == [True, False, False]


@pytest.mark.parametrize("shape", [(3, 2), (3, 1, 1)])
def test_masks_of_another_shape_are_refused_before_the_model_runs(shape):
    # one flag per env, as the pool takes them: a (3, 2) mask was reduced with any() on a step, and on a reset
    # failed inside TorchRL with a raw IndexError after the rows were already reset
    env = counting_env(3, length=100)
    td = env.reset()
    td["action"] = torch.ones(3, 1)
    td = env.step(td)["next"].clone()
    calls, state = env.model.calls, env.state.clone()
    mask = torch.zeros(shape, dtype=torch.bool)
    mask.view(-1)[-1] = True
    td["action"] = torch.ones(3, 1)
    for call, key in ((env.step, "_step"), (env.step_and_maybe_reset, "_step"), (env.reset, "_reset")):
        with pytest.raises(ValueError, match=rf"'{key}' mask: expected shape \(3, 1\) \(or \(3,\)\)"):
            call(td.clone().set(key, mask))
    assert env.model.calls == calls and torch.equal(env.state, state)


FAST_CASES = {
    "counting": lambda: counting_env(6, length=torch.tensor([1, 2, 3, 4, 5, 6])),
    "noisy": lambda: noisy_env(8, seed=2),
    "dict-obs": lambda: dict_obs_env(4),
    "state-key": lambda: noisy_env(5, seed=1, state_key="latent", initial_observation=torch.zeros(4)),
    "info": ENVS["info"],
    "all-done": lambda: counting_env(3, length=2),
    # rows the model truncates (done = terminated | truncated): TorchRL's maybe_reset restarts them too
    "truncating": lambda: WorldModelEnv(CountingModel(torch.tensor([1, 2, 3, 4]), truncate=True), OBS3, ACT1,
                                        num_envs=4, initial_state=torch.zeros(3)),
    "td-state-dict-start": lambda: WorldModelEnv(
        object(), BOX2, BOX2, num_envs=4, state_key="s", initial_observation=torch.zeros(2),
        initial_state={"x": torch.zeros(2)},  # nested dicts here, a TensorDict from the model
        transition_fn=lambda s, a: (lambda x: {"state": TensorDict({"x": x}, [x.shape[0]]), "observation": x,
                                              "terminated": x[:, :1].abs() > 1.5})(s["x"] + a),
    ),
    "dict-state-td-start": lambda: WorldModelEnv(
        object(), BOX2, BOX2, num_envs=4, state_key="s", initial_observation=torch.zeros(2),
        initial_state=TensorDict({"x": torch.zeros(2)}, []),  # a TensorDict here, nested dicts from the model
        transition_fn=lambda s, a: (lambda x: {"state": {"x": x}, "observation": x,
                                              "terminated": x[:, :1].abs() > 1.5})(s["x"] + a),
    ),
    "reset-fn": lambda: WorldModelEnv(
        NoisyModel(),
        BOX4,
        FORCE,
        num_envs=5,
        seed=0,
        reset_fn=lambda num_envs, generator: torch.randn(num_envs, 4, generator=generator),
    ),
    # rows of >= 16384 elements in all (state, action, info): the CPU row selects take their index path
    "large-batch-info": lambda: WorldModelEnv(
        object(), gym.spaces.Box(-np.inf, np.inf, (64,), np.float32), gym.spaces.Box(-1, 1, (64,), np.float32),
        num_envs=300, initial_state=torch.linspace(-1, 1, 64), info_spec={"u": torch.zeros(64)},
        transition_fn=lambda s, a: (s + a, s + a, a[:, 0], (s + a)[:, 0] > 2.5, False, {"u": a * 2}),
    ),
}


@pytest.mark.parametrize("name", sorted(FAST_CASES))
def test_fast_step_and_maybe_reset_equals_torchrl_generic_path(name):
    fast, generic = FAST_CASES[name](), FAST_CASES[name]()
    tf, tg = fast.reset(), generic.reset()
    torch.manual_seed(0)
    resets = 0
    for t in range(40):
        action = fast.full_action_spec.rand()  # the same action for both
        for td in (tf, tg):
            td.update(action.clone())
            td["policy_out"] = torch.arange(fast.batch_size[0], dtype=torch.float32).unsqueeze(-1) + t
            td["collector"] = TensorDict({"traj_ids": torch.arange(fast.batch_size[0])}, fast.batch_size)
            for group in [k for k, v in td.items() if isinstance(v, TensorDict) and k not in ("collector", "next")]:
                # a caller's leaf inside a group the env writes (a Dict observation, a TensorDict state,
                # "info"): TorchRL zeroes it on the rows a partial reset restarts
                td[group, "caller_extra"] = torch.full((fast.batch_size[0], 2), float(t + 1))
        if t % 3 == 1:  # freeze some rows with TorchRL's "_step" mask (never all of them)
            mask = torch.rand(fast.batch_size[0], 1) > 0.5
            mask[t % fast.batch_size[0]] = True
            tf["_step"], tg["_step"] = mask, mask.clone()
        else:
            tf.pop("_step", None)
            tg.pop("_step", None)
        of, tf = fast.step_and_maybe_reset(tf)
        og, tg = EnvBase._step_and_maybe_reset(generic, tg)
        resets += int(of["next", "done"].any())
        for a, b, what in ((of, og, "step output"), (tf, tg, "next root")):
            assert set(a.keys(True, True)) == set(b.keys(True, True)), (what, t)
            for key in a.keys(True, True):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (what, key, t)
    assert resets > 0


@pytest.mark.parametrize("name", sorted(FAST_CASES))
def test_fused_step_then_reset_equals_torchrl_step_step_mdp_and_masked_reset(name):
    """The gymnasium export's NEXT_STEP path: rows frozen by "_step" are restarted after the others step.
    _step_then_reset gives exactly what TorchRL's env.step -> env.step_mdp -> env.reset("_reset",
    select_reset_only=True) gives, rows that finished in this step keeping their done flags."""
    fused, generic = FAST_CASES[name](), FAST_CASES[name]()
    tf, tg = fused.reset(), generic.reset()
    n = fused.batch_size[0]
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    done = torch.zeros(n, dtype=torch.bool)
    restarted = kept_done = 0
    for t in range(40):
        action = fused.full_action_spec.rand()
        for td in (tf, tg):
            td.update(action.clone())
            td["policy_out"] = torch.arange(n, dtype=torch.float32).unsqueeze(-1) + t
            for group in [k for k, v in td.items() if isinstance(v, TensorDict)]:
                td[group, "caller_extra"] = torch.full((n, 2), float(t + 1))
        # the rows to restart: those that finished on the last step (as the export's), or any rows
        rows = done.clone() if t % 2 else torch.rand(n, generator=gen) > 0.6
        if t % 7 == 3:
            rows[:] = False
        if bool(rows.all()):
            rows[t % n] = False  # an all-False "_step" skips TorchRL's step: see the last check below
        tf["_step"], tg["_step"] = (~rows).unsqueeze(-1), (~rows).unsqueeze(-1)
        of, tf = fused._step_then_reset(tf, rows)
        og = generic.step(tg)
        tg = generic.step_mdp(og)
        tg["_reset"] = rows.unsqueeze(-1)
        tg = generic.reset(tg, select_reset_only=True)
        for td in (of, og, tf, tg):
            td.pop("_step", None)
            td.pop("_reset", None)
        for a, b, what in ((of, og, "step output"), (tf, tg, "next root")):
            assert set(a.keys(True, True)) == set(b.keys(True, True)), (what, t)
            for key in a.keys(True, True):
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (what, key, t)
        done = of["next", "done"].view(-1) & ~rows
        restarted += int(rows.any())
        kept_done += int(done.any())
        assert not tf["done"].view(-1)[rows].any() and torch.equal(tf["done"].view(-1)[done], done[done])
    assert restarted > 10 and kept_done > 0
    td = fused.reset()
    td.update(fused.full_action_spec.rand())
    td["_step"] = torch.zeros(n, 1, dtype=torch.bool)
    assert fused._step_then_reset(td, torch.ones(n, dtype=torch.bool)) is None  # TorchRL's generic calls


def _same_tree(a, b, where):
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _same_tree(a[key], b[key], (*where, key))
    else:
        assert type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b)), where


def _dict_obs_reset_fn_env():
    env = dict_obs_env(4)

    def reset_fn(num_envs, generator):
        s = torch.randn(num_envs, 2, generator=generator) * 0.3
        return {"state": s, "observation": {"pos": s, "goal": {"xy": -s}}}

    return WorldModelEnv(object(), gym.spaces.Dict({"pos": BOX2, "goal": gym.spaces.Dict({"xy": BOX2})}), FORCE,
                         num_envs=4, seed=0, reset_fn=reset_fn, transition_fn=env._transition.call)


# envs whose reset depends on when it runs (not fixed_start): the NEXT_STEP export restarts rows at the next step
DEFERRED_CASES = {
    "reset-fn": FAST_CASES["reset-fn"],
    "start-states-state-key": lambda: noisy_env(
        5, seed=1, state_key="latent", initial_state=None, state_spec=Unbounded(shape=(4,)),
        start_states=TensorDict({"observation": torch.randn(12, 4, generator=torch.Generator().manual_seed(0))}, [12]),
    ),
    "info-reset-fn": lambda: WorldModelEnv(
        object(), BOX2, BOX2, num_envs=4, seed=0, info_spec={"u": torch.zeros(2)},
        reset_fn=lambda num_envs, generator: torch.randn(num_envs, 2, generator=generator) * 0.3,
        transition_fn=lambda s, a: (s + a, s + a, s[:, 0], (s + a)[:, 0] > 0.8, False, {"u": a * 2}),
    ),
    "dict-obs-reset-fn": _dict_obs_reset_fn_env,
}


@pytest.mark.parametrize("name", sorted(DEFERRED_CASES))
def test_next_step_export_fused_restart_gives_the_data_of_the_generic_calls(name):
    """A NEXT_STEP export of a WorldModelEnv whose reset depends on when it runs restarts the finished rows at the
    next step through WorldModelEnv._step_then_reset: every output equals the generic step + masked reset's."""
    fused, generic = (to_gymnasium(DEFERRED_CASES[name](), autoreset_mode="next_step") for _ in range(2))
    assert not fused.env.fixed_start and fused._step_then_reset is not None
    generic._step_then_reset = None
    space = fused.action_space
    space.seed(0)
    n = fused.num_envs
    waited = 0
    for envs in (fused, generic):
        envs.reset(seed=3)
    for t in range(40):
        action = space.sample()
        if t == 20:
            mask = np.arange(n) % 2 == 0
            outs = [envs.reset(options={"reset_mask": mask}) for envs in (fused, generic)]
        else:
            outs = [envs.step(action) for envs in (fused, generic)]
            waited += int(fused._pending is not None)
        for i, (a, b) in enumerate(zip(*outs)):
            _same_tree(a, b, (t, i))
    assert waited > 0


class _ShapedCounting(WorldModelEnv):
    """A user's subclass: its _step adds 100 to every reward, its _reset counts its calls."""

    resets = 0

    def _step(self, tensordict):
        out = super()._step(tensordict)
        out["reward"] = out["reward"] + 100
        return out

    def _reset(self, tensordict=None, **kwargs):
        type(self).resets += 1
        return super()._reset(tensordict, **kwargs)


def test_a_subclass_own_step_and_reset_run_on_every_path():
    """The fused step_and_maybe_reset (rollout, collectors, the export) must not bypass a subclass's _step or
    _reset: such a subclass takes TorchRL's generic path, which calls them."""

    def make():
        return _ShapedCounting(CountingModel(length=3), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3))

    _ShapedCounting.resets = 0
    rollout = make().rollout(9, break_when_any_done=False)
    assert (rollout["next", "reward"] >= 99).all()
    assert _ShapedCounting.resets == 1 + 2  # the first reset, then one masked reset per episode end (t = 3, 6)
    collector = Collector(make(), None, frames_per_batch=12, total_frames=12)
    batch = next(iter(collector))
    collector.shutdown()
    assert (batch["next", "reward"] >= 99).all()
    for mode in ("same_step", "next_step"):
        envs = to_gymnasium(make(), autoreset_mode=mode)
        envs.reset(seed=0)
        rewards = [envs.step(np.zeros((2, 1), np.float32))[1] for _ in range(8)]
        stepped = [r for t, r in enumerate(rewards) if mode == "same_step" or t % 4 != 3]  # NEXT_STEP resets: 0
        assert all((r >= 99).all() for r in stepped), (mode, rewards)


@pytest.mark.parametrize("wrap", ["bare", "make_world_model_env", "RowStepCounter", "RewardAdapter"])
def test_all_false_step_mask_reports_reward_zero_even_with_a_reward_at_the_root(wrap):
    # TorchRL's placeholder for a skipped step copies the root's reward: the env and its transformed env zero it
    from torchrl_swm.world_model import RowStepCounter, WorldModelTransformedEnv

    env = counting_env(2, length=100)
    if wrap == "make_world_model_env":
        env = make_world_model_env(env.model, OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3))
    elif wrap == "RowStepCounter":
        env = WorldModelTransformedEnv(env, RowStepCounter(max_steps=50))
    elif wrap == "RewardAdapter":  # the model's reward is kept (it returned one)
        env = WorldModelTransformedEnv(env, RewardAdapter(lambda state, obs, action: torch.zeros(2)))
    td = env.reset()
    td["action"] = torch.ones(2, 1)
    td = env.step(td)["next"]  # the reward (the action, 1) stays at the root
    td["action"] = torch.ones(2, 1)
    td["_step"] = torch.zeros(2, 1, dtype=torch.bool)
    out = env.step(td)["next"]
    assert out["reward"].flatten().tolist() == [0.0, 0.0]
    assert out["observation"][:, 0].tolist() == [1.0, 1.0]


def test_fast_path_is_used_and_falls_back_for_transformed_envs(monkeypatch):
    calls = []
    original = EnvBase._step_and_maybe_reset

    def spy(self, td):
        calls.append(type(self).__name__)
        return original(self, td)

    monkeypatch.setattr(EnvBase, "_step_and_maybe_reset", spy)
    env = counting_env(3, length=2)
    env.rollout(10, break_when_any_done=False)
    assert "WorldModelEnv" not in calls, "the base env takes its own path"
    td = env.reset()
    td["_step"] = torch.tensor([[True], [False], [True]])
    td["action"] = torch.zeros(3, 1)
    env.step_and_maybe_reset(td)
    assert calls == [], "a partial '_step' takes the fast path too"
    td = env.reset()
    td["_step"] = torch.zeros(3, 1, dtype=torch.bool)
    td["action"] = torch.zeros(3, 1)
    env.step_and_maybe_reset(td)
    assert calls == ["WorldModelEnv"], "an all-False '_step' (TorchRL skips the step) takes the generic path"


# -------------------------------------------------------------------------------------------------
# transforms, collectors, planners
# -------------------------------------------------------------------------------------------------


def test_make_world_model_env_is_a_transformed_env_of_adapter_transforms():
    env = full_factory_env(3)
    assert isinstance(env, TransformedEnv) and isinstance(env.base_env, WorldModelEnv)
    names = [type(t).__name__ for t in env.transform]
    assert names == ["ActionAdapter", "RewardAdapter", "TerminalAdapter", "RowStepCounter", "ObservationDecoder"]
    assert env.action_spec.shape == (3,) and env.action_spec.dtype == torch.int64  # the outside (Discrete) spec
    assert env.base_env.action_spec.shape == (3, 3)  # the model's one-hot actions (probed)
    assert env.observation_spec["pixels"].dtype == torch.uint8
    td = env.reset()
    td["action"] = torch.tensor([0, 1, 2])
    out = env.step(td)["next"]
    assert out["observation"][:, 0].tolist() == [1.0, 0.0, -1.0]
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, -1.0]
    assert out["pixels"].shape == (3, 2, 4)


def test_time_limit_is_step_counter_and_resets_only_truncated_rows():
    env = make_world_model_env(
        CountingModel(length=100), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3), max_episode_steps=4
    )
    rollout = env.rollout(10, break_when_any_done=False)
    assert rollout["next", "truncated"][0, :, 0].tolist() == [False, False, False, True] * 2 + [False, False]
    assert rollout["observation"][0, :, 0].tolist() == [0, 1, 2, 3] * 2 + [0, 1]
    td = env.reset()
    for _ in range(2):
        td["action"] = torch.zeros(2, 1)
        _, td = env.step_and_maybe_reset(td)
    td.set("_reset", torch.tensor([[True], [False]]))
    out = env.reset(td)
    assert out["step_count"].view(-1).tolist() == [0, 2] and out["observation"][:, 0].tolist() == [0.0, 2.0]


def test_users_can_add_and_swap_transforms():
    env = make_world_model_env(
        CountingModel(length=100),
        OBS3,
        ACT1,
        num_envs=2,
        initial_state=torch.zeros(3),
        max_episode_steps=3,
        transforms=[RewardSum()],
    )
    rollout = env.rollout(4, lambda td: td.set("action", torch.ones(2, 1)), break_when_any_done=False)
    assert rollout["next", "episode_reward"][0, :, 0].tolist() == [1.0, 2.0, 3.0, 1.0]
    env.transform.pop(1)  # remove the StepCounter...
    env.append_transform(StepCounter(max_steps=2))  # ...and add another
    rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["next", "truncated"][0, :, 0].tolist() == [False, True, False]
    check_env_specs(env)


def test_adapter_transforms_report_bad_returns():
    env = make_world_model_env(
        CountingModel(),
        OBS3,
        gym.spaces.Discrete(2),
        num_envs=2,
        initial_state=torch.zeros(3),
        action_transform_fn=lambda a: a.float().unsqueeze(-1),
        model_action_space=ACT1,
    )
    env.transform[0]._fn = lambda a: a.float()  # now returns (N,) instead of (N, 1)
    env.transform[0]._bound = None
    td = env.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ReturnFormError, match=r"expected the model's action: dtype torch.float32, shape \(2, 1\)"):
        env.step(td)
    bad = make_world_model_env(
        object(),
        BOX2,
        BOX2,
        num_envs=2,
        initial_state=torch.zeros(2),
        transition_fn=lambda s, a: s,
        reward_fn=lambda s, o, a: torch.zeros(5),
    )
    with pytest.raises(ReturnFormError, match=r"reward_fn .* reward: expected shape \(2, 1\) or \(2,\)"):
        bad.rollout(2)
    with pytest.raises(RuntimeError, match="base env is a torchrl_swm.WorldModelEnv"):
        TransformedEnv(_plain_env(), RewardAdapter(lambda s, o, a: s)).rollout(2)


def test_an_action_transform_fn_returning_another_dtype_is_named_not_the_policys_action():
    """ActionAdapter checks the dtype too: a float64 model action names action_transform_fn, not the policy."""
    env = make_world_model_env(CountingModel(), OBS3, gym.spaces.Discrete(2), num_envs=2, initial_state=torch.zeros(3),
                               action_transform_fn=lambda a: a.double().unsqueeze(-1), model_action_space=ACT1)
    td = env.reset().set("action", torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ReturnFormError, match=r"action_transform_fn .*float64.*expected the model's action: "
                                              r"dtype torch\.float32, shape \(2, 1\)"):
        env.step(td)


@pytest.mark.parametrize("adapter", [False, True])
def test_a_half_open_action_box_gives_finite_random_actions_inside_it(adapter):
    """rand() and a rollout without a policy draw as gymnasium's Box.sample, not Bounded.rand's NaN/inf: on the env's
    own action spec, and on the outside one of an ActionAdapter (action_transform_fn)."""
    box = gym.spaces.Box(np.array([-np.inf, 5], np.float32), np.array([1, np.inf], np.float32))
    kwargs = {"action_transform_fn": lambda a: a.clamp(-1, 1), "model_action_space": FORCE} if adapter else {}
    env = make_world_model_env(object(), BOX2, box, num_envs=4, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: s + 0.01 * a, **kwargs)
    torch.manual_seed(0)
    actions = torch.cat([env.full_action_spec["action"].rand(), env.rollout(3)["action"].flatten(0, 1)])
    assert torch.isfinite(actions).all() and all(box.contains(a) for a in actions.numpy())
    assert torch.isfinite(env.rollout(3)["next", "observation"]).all()


def test_the_model_action_probe_keeps_the_dtype_the_action_transform_fn_returns():
    """Without model_action_space=, the probed model action spec has the transform's dtype (int64 here)."""
    seen = []

    def transition(state, action):
        seen.append(action)
        return state + action.float()

    env = make_world_model_env(object(), BOX2, gym.spaces.Discrete(3), num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=transition, action_transform_fn=lambda a: torch.stack([a, -a], -1))
    assert env.base_env.full_action_spec["action"].dtype == torch.int64
    td = env.reset().set("action", torch.tensor([1, 2]))
    assert env.step(td)["next", "observation"].tolist() == [[1.0, -1.0], [2.0, -2.0]]
    assert seen[-1].dtype == torch.int64


def test_the_model_action_probe_refuses_an_action_transform_fn_that_drops_the_batch_dim():
    """One model action for the whole batch is refused at construction, saying the fn gets the whole batch."""
    moves = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    with pytest.raises(ReturnFormError, match=r"returned Tensor\(dtype=torch\.float32, shape=\(2,\)\) for a batch "
                                              r"of 1 .*called once per step with the whole batch of outside actions, "
                                              r"shape \(num_envs, \*action_shape\)"):
        make_world_model_env(object(), BOX2, gym.spaces.Discrete(4), num_envs=3, initial_state=torch.zeros(2),
                             transition_fn=lambda s, a: s + a, action_transform_fn=lambda a: moves[a[0]])



class _OneHotModel:
    """The model of the seed's action_transform example: a Discrete action reaches it as a one-hot."""

    num_actions = 3

    def step(self, state, action):
        nxt = state + action
        return {"state": nxt, "observation": nxt, "reward": nxt @ torch.tensor([1.0, 10.0, 100.0])}


def _one_hot_batched(model, action):
    # the seed's example made batched; it returns numpy, as the seed's own does
    return np.eye(model.num_actions, dtype=np.float32)[action.cpu().numpy()]


def _one_hot_per_action(model, action):
    # the seed's example, literally: one action at a time
    one_hot = np.zeros(model.num_actions, dtype=np.float32)
    one_hot[int(action)] = 1.0
    return one_hot


_ONE_HOT_SPACES = dict(observation_space=gym.spaces.Box(-9, 9, (3,), np.float32), action_space=gym.spaces.Discrete(3))


@pytest.mark.parametrize("model_action_space", [None, gym.spaces.Box(0, 1, (3,), np.float32)],
                         ids=["probed", "model_action_space"])
def test_an_action_transform_fn_may_return_numpy_and_steps_as_a_hand_loop(model_action_space):
    """A numpy model action is converted onto the env's device, then checked, as a transition's numpy is;
    the probe reads its dtype and shape from the converted array."""
    kwargs = {} if model_action_space is None else {"model_action_space": model_action_space}
    env = make_world_model_env(_OneHotModel(), **_ONE_HOT_SPACES, num_envs=2, initial_state=torch.zeros(3),
                               action_transform_fn=_one_hot_batched, **kwargs)
    assert env.base_env.full_action_spec["action"].dtype == torch.float32
    state = [[0.0] * 3 for _ in range(2)]
    td = env.reset()
    for actions in ([0, 2], [1, 1], [2, 0], [2, 2]):
        out = env.step(td.set("action", torch.tensor(actions)))
        for i, a in enumerate(actions):  # the hand loop: one env, one action at a time
            state[i][a] += 1.0
        assert out["next", "observation"].tolist() == state
        assert out["next", "reward"].view(-1).tolist() == [s[0] + 10 * s[1] + 100 * s[2] for s in state]
        assert out["action"].tolist() == actions  # the caller's outside action is kept
        td = env.step_mdp(out)
    # a float64 array is refused, never cast: named as returned (an ndarray), with the dtype the model takes
    env = make_world_model_env(_OneHotModel(), **_ONE_HOT_SPACES, num_envs=2, initial_state=torch.zeros(3),
                               action_transform_fn=lambda model, action: np.eye(3)[action.numpy()],
                               model_action_space=gym.spaces.Box(0, 1, (3,), np.float32))
    with pytest.raises(ReturnFormError, match=r"returned ndarray\(dtype=float64, shape=\(2, 3\)\); expected the "
                                              r"model's action: dtype torch\.float32, shape \(2, 3\)"):
        env.rollout(1)


def test_the_seeds_per_action_action_transform_fn_fails_saying_the_fn_gets_the_whole_batch():
    """The seed called action_transform once per action; here it gets the batch. Its literal example fails
    saying so: at the probe, without sending the user to model_action_space=; with model_action_space=, with
    numpy's own error on int(batch), unchained, and a note naming the call and the batch it was given."""
    with pytest.raises(ReturnFormError, match=r"_one_hot_per_action\(model, action\).* returned ndarray\(dtype="
                                              r"float32, shape=\(3,\)\) for a batch of 1 action of shape \(1,\); "
                                              r"expected a batched tensor, one model action per row: "
                                              r"action_transform_fn is called once per step with the whole batch "
                                              r"of outside actions, shape \(num_envs, \*action_shape\)$") as caught:
        make_world_model_env(_OneHotModel(), **_ONE_HOT_SPACES, num_envs=2, initial_state=torch.zeros(3),
                             action_transform_fn=_one_hot_per_action)
    assert "model_action_space" not in str(caught.value)
    env = make_world_model_env(_OneHotModel(), **_ONE_HOT_SPACES, num_envs=2, initial_state=torch.zeros(3),
                               action_transform_fn=_one_hot_per_action,
                               model_action_space=gym.spaces.Box(0, 1, (3,), np.float32))
    with pytest.raises(ValueError, match="only one element tensors can be converted to Python scalars") as caught:
        env.rollout(2)
    assert caught.value.__cause__ is None
    [note] = caught.value.__notes__
    assert re.fullmatch(r"WorldModelEnv: raised inside action_transform_fn _one_hot_per_action\(model, action\) "
                        r".*, called once for the whole batch \(2,\), "
                        r"given action=Tensor\(dtype=torch\.int64, shape=\(2,\)\)", note), note


def test_action_adapter_refuses_a_dict_model_action_space_clearly():
    dict_actions = gym.spaces.Dict({"a": BOX2, "b": ACT1})
    with pytest.raises(TypeError, match=r"model's action space must be a single \(non-Dict\) space, got Dict"):
        make_world_model_env(
            CountingModel(), OBS3, gym.spaces.Discrete(2), num_envs=2, initial_state=torch.zeros(3),
            action_transform_fn=lambda a: a, model_action_space=dict_actions,
        )
    # the transform on its own, over a base env with Dict actions
    base = WorldModelEnv(
        CountingModel(), OBS3, dict_actions, num_envs=2, initial_state=torch.zeros(3),
        transition_fn=lambda s, a: (s + 1, torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.bool)),
    )
    env = TransformedEnv(base, ActionAdapter(lambda a: a.float(), gym.spaces.Discrete(2)))
    td = env.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"Dict model action space with keys \[\('action', 'a'\), \('action', 'b'\)\]"):
        env.step(td)


def _plain_env():
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    return ContinuousActionVecMockEnv()


def test_observation_decoder_standalone_with_spec():
    env = TransformedEnv(
        counting_env(2, length=100),
        ObservationDecoder(lambda obs: obs * 2, gym.spaces.Box(-1, 1, (3,), np.float32), out_key="decoded"),
    )
    td = env.reset()
    assert "decoded" in td.keys()
    td["action"] = torch.ones(2, 1)
    out = env.step(td)["next"]
    assert torch.equal(out["decoded"], out["observation"] * 2)



@pytest.mark.parametrize("decoder", [lambda obs, generator=None: obs * 2, lambda obs: (obs * 2).numpy()],
                         ids=["sampling-signature", "numpy"])
def test_a_standalone_observation_decoder_takes_a_sampling_signature_and_a_numpy_return(decoder):
    """With no WorldModelEnv to give it a generator, a decoder(obs, generator=None) is called without one (it is
    not refused as naming an extra it never receives); a numpy return is converted to a tensor."""
    dec = ObservationDecoder(decoder, gym.spaces.Box(-9, 9, (2,), np.float32))
    out = dec(TensorDict(observation=torch.ones(3, 2), batch_size=[3]))["pixels"]
    assert type(out) is torch.Tensor and out.tolist() == [[2.0, 2.0]] * 3
    env = TransformedEnv(counting_env(2, length=100), ObservationDecoder(decoder, out_key="decoded"))
    out = env.step(env.reset().set("action", torch.ones(2, 1)))["next"]
    assert type(out["decoded"]) is torch.Tensor and torch.equal(out["decoded"], out["observation"] * 2)


def test_a_decoder_may_return_numpy_in_the_spec_dtype_and_a_float64_array_is_refused():
    env = make_world_model_env(object(), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: s + a, decoder=lambda obs: (obs * 2).numpy())
    assert env.observation_spec["pixels"].dtype == torch.float32
    out = env.rollout(3)
    assert torch.equal(out["next", "pixels"], out["next", "observation"] * 2)
    env = make_world_model_env(object(), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: s + a, decoder=lambda obs: (obs * 2).double().numpy(),
                               decoder_spec=BOX2)
    with pytest.raises(ReturnFormError, match=r"returned ndarray\(dtype=float64, shape=\(2, 2\)\); expected dtype "
                                              r"torch\.float32, shape \(2, 2\) \(the 'pixels' spec"):
        env.rollout(1)


def test_a_probed_uint8_decoder_output_gets_a_bounded_0_255_spec():
    """ObservationDecoder without spec=: uint8 pixels are declared Bounded(0, 255), as its docstring says."""

    def decoder(obs):
        return (obs[:, None, None, :1].expand(-1, 4, 4, 3) * 50 + 100).clamp(0, 255).to(torch.uint8)

    env = make_world_model_env(object(), BOX2, FORCE, num_envs=3, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: s + a, decoder=decoder)
    spec = env.observation_spec["pixels"]
    assert isinstance(spec, Bounded) and spec.dtype == torch.uint8 and spec.shape == (3, 4, 4, 3)
    assert (spec.space.low == 0).all() and (spec.space.high == 255).all()
    check_env_specs(env)


def test_collector_drives_the_env():
    env = counting_env(4, length=torch.tensor([2, 3, 5, 6]))
    collector = Collector(env, None, frames_per_batch=80, total_frames=160)
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2 and batches[0].batch_size == (4, 20)
    for batch in batches:
        t, nt = batch["observation"][..., 0], batch["next", "observation"][..., 0]
        assert torch.equal(nt, t + 1)
        done = batch["next", "done"][..., 0]
        traj = batch["collector", "traj_ids"]
        assert (traj[:, 1:][done[:, :-1]] != traj[:, :-1][done[:, :-1]]).all()
        assert (traj[:, 1:][~done[:, :-1]] == traj[:, :-1][~done[:, :-1]]).all()


def test_multisync_collector_with_spawned_workers():
    from torchrl.collectors import MultiSyncCollector
    from wm_models import make_counting_env

    collector = MultiSyncCollector(
        [functools.partial(make_counting_env, 4)] * 2, None, frames_per_batch=80, total_frames=160
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 2
    batch = batches[0]
    assert batch.numel() == 80 and batch["next", "done"].any()
    t, nt = batch["observation"][..., 0], batch["next", "observation"][..., 0]
    assert torch.equal(nt, t + 1)


def test_a_first_reset_given_a_partial_reset_mask_restarts_every_row():
    # before any reset no row has a state to keep: a partial "_reset" at the first reset restarts every row
    start = torch.tensor([0.0, 7.0, 0.0])
    env = counting_env(3, initial_state=start)
    out = env._reset(reset_td(3, [1]))
    assert out["observation"].tolist() == [start.tolist()] * 3  # every row gets the start observation
    assert env.state.tolist() == [start.tolist()] * 3
    env = counting_env(3, initial_state=start)
    given = reset_td(3, [1])
    out = env.reset(given)  # through TorchRL's reset, which merges only the rows "_reset" names: all of them here
    assert out is given and "_reset" not in out.keys()
    assert out["observation"].tolist() == [start.tolist()] * 3 and not out["done"].any()
    assert env.state.tolist() == [start.tolist()] * 3
    nxt = env.step(out.set("action", torch.ones(3, 1)))["next"]
    assert nxt["observation"].tolist() == [[1.0, 7.0, 1.0]] * 3  # every row steps from the start


def test_collector_partial_reset_by_index():
    env = counting_env(3, length=100)
    collector = Collector(env, None, frames_per_batch=15, total_frames=30)
    it = iter(collector)
    next(it)
    collector.reset(index=torch.tensor([1]))
    batch = next(it)
    collector.shutdown()
    assert batch["observation"][:, 0, 0].tolist() == [5.0, 0.0, 5.0]


def test_state_key_exposes_the_state_and_reads_it_back():
    env = noisy_env(3, seed=0, state_key="latent", initial_observation=torch.zeros(4))
    td = env.reset()
    assert torch.equal(td["latent"], env.state)
    td["latent"] = torch.full((3, 4), 0.5)  # the tensordict is the source of truth when it holds the state
    td["action"] = torch.zeros(3, 2)
    before = env.generator.get_state()
    out = env.step(td)["next"]
    env.generator.set_state(before)
    expected = env.model.step(torch.full((3, 4), 0.5), torch.zeros(3, 2), generator=env.generator)[0]
    assert torch.allclose(out["latent"], expected)


def test_unlocked_env_takes_any_batch_and_needs_the_state_in_the_tensordict():
    env = ENVS["unlocked"]()
    assert not env.batch_locked and env.batch_size == ()
    start = TensorDict(
        {
            "observation": torch.zeros(5, 3, 4),
            "done": torch.zeros(5, 3, 1, dtype=torch.bool),
            "terminated": torch.zeros(5, 3, 1, dtype=torch.bool),
            "truncated": torch.zeros(5, 3, 1, dtype=torch.bool),
        },
        [5, 3],
    )
    rollout = env.rollout(4, auto_reset=False, tensordict=start, break_when_any_done=False)
    assert rollout.batch_size == (5, 3, 4)
    with pytest.raises(KeyError, match="has no state under 'observation'"):
        env._step(TensorDict({"action": torch.zeros(2, 2)}, [2]))
    with pytest.raises(ValueError, match=r"num_envs .*expected an int >= 1, got 0"):
        WorldModelEnv(PointMass(), BOX4, FORCE, num_envs=0, initial_state=torch.zeros(4))
    # not "expected num_envs >= 1, got 2.0", which 2.0 satisfies: the type is what is wrong, as EnvPool says
    for bad, text in ((2.0, "float 2.0"), ("2", "str '2'"), (True, "bool True"), (2.5, "float 2.5")):
        with pytest.raises(TypeError, match=rf"num_envs .*expected an int, got {text}"):
            WorldModelEnv(PointMass(), BOX4, FORCE, num_envs=bad, initial_state=torch.zeros(4))
    assert WorldModelEnv(PointMass(), BOX4, FORCE, num_envs=np.int64(2), initial_state=torch.zeros(4)).num_envs == 2


def test_unlocked_env_resets_any_batch_shape_from_reset_fn_and_dict_states():
    def reset_fn(num_envs, generator):
        state = {"pos": torch.randn(num_envs, 4, generator=generator), "count": torch.zeros(num_envs, 1)}
        return state, state["pos"]

    def transition(state, action):
        nxt = {"pos": state["pos"] + 0.1, "count": state["count"] + 1}
        return {"state": nxt, "observation": nxt["pos"]}

    env = WorldModelEnv(
        object(),
        BOX4,
        FORCE,
        num_envs=None,
        state_key="latent",
        reset_fn=reset_fn,
        transition_fn=transition,
        state_spec={"pos": Unbounded((4,)), "count": Unbounded((1,))},
        seed=0,
    )
    td = env.reset(TensorDict({}, [2, 3]))
    assert td["observation"].shape == (2, 3, 4) and td["latent", "count"].shape == (2, 3, 1)
    td["action"] = torch.zeros(2, 3, 2)
    out = env.step(td)["next"]
    assert torch.equal(out["latent", "count"], torch.ones(2, 3, 1))
    assert torch.allclose(out["observation"], td["observation"] + 0.1)


@pytest.mark.parametrize("form", ["bare", "6-tuple"])
def test_an_unlocked_env_of_batch_2_3_names_a_model_output_of_the_wrong_rows(form):
    # a model returning 4 rows for a (2, 3) batch: the env's ReturnFormError names expected and received,
    # never a raw reshape error from splitting the rows
    def transition(s, a):
        x = s[:4] + a[:4]
        return x if form == "bare" else (x, x, x[:, :1], x[:, :1] > 9, x[:, :1] > 9, {})

    env = WorldModelEnv(object(), OBS3, gym.spaces.Box(-1, 1, (3,), np.float32), num_envs=None,
                        state_key="observation", transition_fn=transition, initial_observation=torch.zeros(3))
    td = TensorDict({"observation": torch.zeros(2, 3, 3), "action": torch.zeros(2, 3, 3)}, [2, 3])
    with pytest.raises(ReturnFormError, match=r"expected .*shape \(2, 3, 3\), got .*shape=\(4, 3\)"):
        env.step(td)


@pytest.mark.parametrize("start", ["initial_state", "reset_fn", "reset_fn_tensordict"])
def test_unlocked_env_with_a_scalar_state_resets_batch_empty(start):
    """A 0-d state of a batch-unlocked env: batch () is one row, as check_env_specs and rollout use it."""

    def transition(s, a):
        x = s + a
        return x, x, x, x.abs() > 2, torch.zeros_like(x, dtype=torch.bool), {"twice": x * 2}

    starts = {
        "initial_state": {"initial_state": torch.tensor(0.5)},
        "reset_fn": {"reset_fn": lambda num_envs: torch.full((num_envs,), 0.5)},
        "reset_fn_tensordict": {"reset_fn": lambda num_envs: TensorDict(
            observation=torch.full((num_envs,), 0.5), batch_size=[num_envs])},
    }
    scalar = gym.spaces.Box(-9, 9, ())
    env = WorldModelEnv(None, scalar, gym.spaces.Box(-1, 1, ()), num_envs=None, transition_fn=transition,
                        state_key="observation", info_spec={"twice": torch.tensor(0.0)}, **starts[start])
    td = env.reset()
    assert td.batch_size == () and torch.equal(td["observation"], torch.tensor(0.5))
    assert env.reset(TensorDict(batch_size=[2, 3]))["observation"].shape == (2, 3)
    check_env_specs(env)
    # the episode ends at 2.5 (> 2): the third step starts over from 0.5
    out = env.rollout(3, policy=lambda td: td.set("action", torch.tensor(1.0)), break_when_any_done=False)
    assert torch.equal(out["observation"], torch.tensor([0.5, 1.5, 0.5]))
    assert torch.equal(out["next", "observation"], torch.tensor([1.5, 2.5, 1.5]))
    assert torch.equal(out["next", "info", "twice"], torch.tensor([[3.0], [5.0], [3.0]]))
    assert out["next", "done"].squeeze(-1).tolist() == [False, True, False]


@pytest.mark.parametrize("planner_name", ["MPPI", "CEM"])
def test_torchrl_planner_over_an_exact_point_mass_reaches_the_goal(planner_name):
    from torchrl.modules.planners import CEMPlanner, MPPIPlanner

    model = PointMass(goal=(1.0, -0.5))
    model_env = WorldModelEnv(model, BOX4, FORCE, num_envs=None, state_key="observation", initial_state=torch.zeros(4))
    real_env = WorldModelEnv(model, BOX4, FORCE, num_envs=1, initial_state=torch.zeros(4), seed=0)

    class ReturnToGo(nn.Module):
        def forward(self, td):
            td["advantage"] = td["next", "reward"].flip(-2).cumsum(-2).flip(-2)
            return td

    torch.manual_seed(0)
    if planner_name == "MPPI":
        planner = MPPIPlanner(
            model_env, ReturnToGo(), temperature=1.0, planning_horizon=10, optim_steps=4, num_candidates=48, top_k=6
        )
    else:
        planner = CEMPlanner(model_env, planning_horizon=10, optim_steps=4, num_candidates=48, top_k=6)
    rollout = real_env.rollout(50, planner)
    final = rollout["next", "observation"][0, -1, :2]
    assert torch.dist(final, torch.tensor([1.0, -0.5])) < 0.1


# -- Dict observations through every start path -----------------------------------------------
DICT_SPACE = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)}),
    }
)
DICT_OBS0 = {"pos": torch.ones(2), "goal": {"xy": torch.full((2,), 2.0)}}


def _dict_transition(state, action):
    nxt = state + action
    return {"state": nxt, "observation": {"pos": nxt, "goal": {"xy": -nxt}}}


def test_dict_initial_observation_is_encoded_as_a_nested_dict():
    env = WorldModelEnv(object(), DICT_SPACE, FORCE, num_envs=3, initial_observation=DICT_OBS0,
                        encode_fn=lambda obs: obs["pos"] * 10 + obs["goal"]["xy"], transition_fn=_dict_transition)
    td = env.reset()
    assert torch.equal(env.state, torch.full((3, 2), 12.0))
    assert torch.equal(td["pos"], torch.ones(3, 2)) and torch.equal(td["goal", "xy"], torch.full((3, 2), 2.0))


def test_dict_start_states_are_sampled_and_encoded():
    data = TensorDict({"pos": torch.arange(8.0).view(4, 2), "goal": {"xy": -torch.arange(8.0).view(4, 2)}}, [4])
    env = WorldModelEnv(object(), DICT_SPACE, FORCE, num_envs=3, start_states=data,
                        encode_fn=lambda obs: obs["pos"] - obs["goal"]["xy"], transition_fn=_dict_transition, seed=0)
    td = env.reset()
    rows = [int(i) for i in td["pos"][:, 0] // 2]  # which data rows were drawn
    assert torch.equal(td["pos"], data["pos"][rows]) and torch.equal(td["goal", "xy"], data["goal", "xy"][rows])
    assert torch.equal(env.state, 2 * data["pos"][rows])


def test_dict_initial_observation_completes_a_reset_fn_that_returns_only_a_state():
    env = WorldModelEnv(object(), DICT_SPACE, FORCE, num_envs=3, initial_observation=DICT_OBS0,
                        reset_fn=lambda: {"state": torch.zeros(3, 2)}, transition_fn=_dict_transition)
    td = env.reset()
    assert torch.equal(td["pos"], torch.ones(3, 2)) and torch.equal(td["goal", "xy"], torch.full((3, 2), 2.0))
    assert torch.equal(env.state, torch.zeros(3, 2))


@pytest.mark.parametrize("n", [1, 3])
def test_a_reset_fn_returning_one_envs_state_next_to_initial_observation_is_broadcast(n):
    # the seed design's reset: one env's latent, the observation from initial_observation=. Its leaves do not lead
    # with the rows, so it is one row, broadcast (it was read as batched: an error at N=1 and 3)
    latent = torch.arange(4.0)

    def transition(state, action):
        return {"state": state + 1, "observation": state[:, :2] + action, "reward": state[:, :1]}

    env = WorldModelEnv(object(), BOX2, FORCE, num_envs=n, initial_observation=torch.zeros(2),
                        reset_fn=lambda model, seed, options: {"state": latent}, transition_fn=transition)
    td = env.reset()
    assert torch.equal(env.state, latent.expand(n, 4)) and torch.equal(td["observation"], torch.zeros(n, 2))
    td = env.step(td.set("action", torch.ones(n, 2)))["next"]
    assert torch.equal(td["observation"], torch.tensor([[1.0, 2.0]] * n))
    assert torch.equal(env.state, (latent + 1).expand(n, 4))
    td["_reset"] = torch.tensor([[i == 0] for i in range(n)])
    env.reset(td)
    assert torch.equal(env.state, torch.stack([latent if i == 0 else latent + 1 for i in range(n)]))


def test_a_state_only_reset_with_a_leaf_not_led_by_the_rows_is_one_row():
    # one leaf leads with the 3 rows by chance, the other does not: the state is one row, broadcast
    env = WorldModelEnv(object(), BOX2, FORCE, num_envs=3, initial_observation=torch.zeros(2),
                        reset_fn=lambda seed, options: {"state": {"h": torch.ones(3, 8), "t": torch.tensor(0.0)}},
                        transition_fn=lambda s, a: ({"h": s["h"], "t": s["t"] + 1}, a, s["t"].view(-1, 1)))
    env.reset()
    assert env.state["h"].shape == (3, 3, 8) and env.state["t"].shape == (3,)


def test_a_state_only_reset_fn_told_its_rows_returns_them():
    # num_envs= tells it the rows: its state is per row, checked (a wrong row count is an error, never broadcast)
    def make(rows):
        return WorldModelEnv(object(), BOX2, FORCE, num_envs=3, initial_observation=torch.zeros(2),
                             reset_fn=lambda seed, options, num_envs: {"state": torch.zeros(num_envs + rows, 4)},
                             transition_fn=lambda s, a: (s, a, s[:, :1]))
    env = make(0)
    env.reset()
    assert env.state.shape == (3, 4)
    with pytest.raises(ReturnFormError, match=r"state: expected leading batch dims"):
        make(-1).reset()


def test_a_state_only_reset_whose_leaves_lead_with_the_rows_is_read_per_row_and_the_step_names_the_guess():
    # (4,) for 4 rows, no observation returned: per row (4 scalars), a guess. A model that steps it per row goes
    # on; the first step names the guess when the model fails on it or returns the other reading's layout
    def make(transition):
        return WorldModelEnv(object(), BOX2, FORCE, num_envs=4, initial_observation=torch.zeros(2),
                             reset_fn=lambda model, seed, options: {"state": torch.arange(4.0)},
                             transition_fn=transition)

    env = make(lambda s, a: (s + 1, a + s[:, None], s[:, None]))
    env.reset()
    assert env.state.shape == (4,)
    env.step(env.reset().set("action", torch.zeros(4, 2)))
    assert env.state.tolist() == [1.0, 2.0, 3.0, 4.0]
    env = make(lambda s, a: (s.expand(4, 4) + 1, a, s[:, None]))  # one row of (4,), stepped for 4 rows
    with pytest.raises(ReturnFormError, match="read the other way"):
        env.step(env.reset().set("action", torch.zeros(4, 2)))
    env = make(lambda state, action: (state[:, :2], state[:, :2], state[:, :1]))
    with pytest.raises(IndexError) as err:
        env.step(env.reset().set("action", torch.zeros(4, 2)))
    assert any("no observation (initial_observation= gave it)" in note and "read as 4 rows of ()" in note
               for note in err.value.__notes__)


@pytest.mark.parametrize("returned", ["unbatched tuple", "mapping", "batched tuple", "state only", "encode_fn"])
def test_a_numpy_state_from_a_reset_fn_or_an_encoder_becomes_a_tensor(returned):
    # as a step's numpy state and a numpy initial_state are (the seed's upstream reset adapter returns np.array)
    one = np.full(2, 3.0, np.float32)
    reset = {
        "unbatched tuple": lambda: (one, one),
        "mapping": lambda: {"state": one, "observation": one},
        "batched tuple": lambda: (np.stack([one] * 3), np.stack([one] * 3)),
        "state only": lambda: {"state": one},
        "encode_fn": None,
    }[returned]
    kwargs = {"initial_observation": torch.full((2,), 1.5), "encode_fn": lambda obs: obs.numpy() * 2} \
        if reset is None else {"reset_fn": lambda seed, options: reset(), "initial_observation": torch.zeros(2)}
    env = WorldModelEnv(object(), BOX2, FORCE, num_envs=3, transition_fn=lambda s, a: (s + a, s + a, s[:, :1]),
                        **kwargs)
    env.reset()
    assert type(env.state) is torch.Tensor and torch.equal(env.state, torch.full((3, 2), 3.0))
    td = env.step(env.reset().set("action", torch.ones(3, 2)))["next"]
    assert torch.equal(td["observation"], torch.full((3, 2), 4.0))
    assert torch.equal(td["reward"], torch.full((3, 1), 3.0))


def test_start_states_with_declared_info_start_at_zero_and_survive_partial_resets():
    # real data carries no model info: the declared keys read zero on sampled rows
    _, data = _real_data()
    env = WorldModelEnv(
        object(), BOX2, BOX2, num_envs=3, start_states=TensorDict({"observation": data["observation"][:, :2]}, [10]),
        info_spec={"u": torch.zeros(2)}, seed=0,
        transition_fn=lambda s, a: (s + a, s + a, torch.zeros(3), torch.zeros(3, dtype=torch.bool), False, {"u": a * 2}),
    )
    td = env.reset()
    assert set(td.keys()) >= {"info"} and torch.equal(td["info", "u"], torch.zeros(3, 1, 2))
    td["action"] = torch.ones(3, 2)
    td = env.step(td)["next"]
    assert torch.equal(td["info", "u"], torch.full((3, 1, 2), 2.0))
    td["_reset"] = torch.tensor([[True], [False], [False]])
    out = env.reset(td)
    assert torch.equal(out["info", "u"][:, 0, 0], torch.tensor([0.0, 2.0, 2.0]))
    check_env_specs(env)


def test_constant_start_with_declared_info_zeroes_the_info_of_reset_rows_only():
    def transition(state, action):
        nxt = state + 1
        return {"observation": nxt, "reward": torch.ones(state.shape[0], 1), "terminated": nxt[:, :1] >= 3,
                "info": {"score": nxt[:, :1] * 10}}

    env = WorldModelEnv(object(), BOX2, gym.spaces.Box(-1, 1, (1,)), num_envs=3, initial_state=torch.zeros(2),
                        info_spec={"score": torch.zeros(1)}, transition_fn=transition, seed=0)
    td = env.reset()
    for _ in range(2):
        td["action"] = torch.zeros(3, 1)
        td = env.step(td)["next"]
    assert td["info", "score"].view(-1).tolist() == [20.0, 20.0, 20.0]
    out = env.reset(td.set("_reset", torch.tensor([[True], [False], [False]])))
    assert out["observation"][:, 0].tolist() == [0.0, 2.0, 2.0]
    assert out["info", "score"].view(-1).tolist() == [0.0, 20.0, 20.0]
    # the fast path: rows that ended at step 3 restart from the constant start with zero info
    td = env.reset()
    for _ in range(3):
        td["action"] = torch.zeros(3, 1)
        step, td = env.step_and_maybe_reset(td)
    assert step["next", "done"].all() and step["next", "info", "score"].view(-1).tolist() == [30.0, 30.0, 30.0]
    assert td["observation"][:, 0].tolist() == [0.0, 0.0, 0.0]
    assert td["info", "score"].view(-1).tolist() == [0.0, 0.0, 0.0]


def test_a_five_tuple_info_model_state_is_the_state_channel_and_never_warned_about_as_unrecorded():
    # info["model_state"] of the tuple forms is the next state, not an info key: with an info_spec declaring
    # other keys it raises no "not recorded" warning; a really undeclared key is named alone
    def step(state, action):
        nxt = state + action
        n = state.shape[0]
        info = {"model_state": nxt, "x": nxt[:, 0]}
        return nxt * 10, torch.ones(n, 1), torch.zeros(n, 1, dtype=torch.bool), torch.zeros(n, 1, dtype=torch.bool), info

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=step,
                        info_spec={"x": torch.zeros(())}, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        td = env.reset().set("action", torch.ones(3, 2))
        out = env.step(td)["next"]
        _, td = env.step_and_maybe_reset(td)
        env.rollout(2)
    assert not [w for w in caught if "not recorded" in str(w.message)]
    assert out["observation"].tolist() == [[10.0, 10.0]] * 3  # the observation is the first entry...
    assert out["info", "x"].view(-1).tolist() == [1.0] * 3
    env.step(env.reset().set("action", torch.ones(3, 2)))
    assert env.state.tolist() == [[1.0, 1.0]] * 3  # ...and the state is info["model_state"]

    def noisy_info(state, action):
        *rest, info = step(state, action)
        return (*rest, {**info, "debug": 1.0})

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=noisy_info,
                        info_spec={"x": torch.zeros(())}, seed=0)
    with pytest.warns(UserWarning, match=r"info keys \['debug'\] that are not recorded"):
        env.step(env.reset().set("action", torch.ones(3, 2)))


def test_a_tensordict_info_is_read_like_a_dict():
    env = WorldModelEnv(
        object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), info_spec={"u": torch.zeros(2)},
        transition_fn=lambda s, a: {"state": s + a, "info": TensorDict({"u": a * 2}, [3])},
    )
    td = env.reset()
    td["action"] = torch.ones(3, 2)
    assert torch.equal(env.step(td)["next", "info", "u"], torch.full((3, 1, 2), 2.0))


def test_adapters_taking_the_generator_are_bound_alike_in_the_probe_and_the_decoder():
    # fn(action, generator) / decoder(obs, generator): the generator is a keyword extra, never the model
    def to_model(action, generator):
        return torch.nn.functional.one_hot(action, 3).float() + 0 * torch.rand(len(action), 3, generator=generator)

    env = make_world_model_env(
        object(), BOX2, gym.spaces.Discrete(3), num_envs=2, initial_state=torch.zeros(2),
        transition_fn=lambda s, a: {"state": s + a[:, :2]}, action_transform_fn=to_model,
        decoder=lambda obs, generator: obs + 0 * torch.rand(obs.shape, generator=generator),
        decoder_spec=Unbounded(shape=(2,)), seed=0,
    )
    td = env.reset()
    td["action"] = torch.tensor([0, 1])
    out = env.step(td)["next"]
    assert out["observation"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert torch.equal(out["pixels"], out["observation"])


# ---------------------------------------------------------------------------------------------
# review fixes: reset sources, state checks, adapters under "_step" masks
# ---------------------------------------------------------------------------------------------


def _nested_dict_transition(state, action):
    # the observation is the state: it must arrive nested, at every step (reset or not)
    pos = state["pos"] + action
    return {"observation": {"pos": pos, "goal": {"xy": state["goal"]["xy"]}}, "terminated": pos[:, :1] > 0.25}


@pytest.mark.parametrize("source", ["initial_observation", "start_states", "reset_fn"])
def test_dict_observation_is_the_state_in_its_nested_form_without_an_encoder(source):
    start = {"initial_observation": {"pos": torch.zeros(2), "goal": {"xy": torch.ones(2)}}}
    if source == "start_states":
        start = {"start_states": TensorDict({"pos": torch.zeros(8, 2), "goal": {"xy": torch.ones(8, 2)}}, [8])}
    elif source == "reset_fn":
        start = {"reset_fn": lambda: {"pos": torch.zeros(2), "goal": {"xy": torch.ones(2)}}}
    env = WorldModelEnv(object(), DICT_SPACE, FORCE, num_envs=3, transition_fn=_nested_dict_transition, seed=0,
                        **start)
    env.reset()
    assert set(env.state) == {"pos", "goal"} and set(env.state["goal"]) == {"xy"}
    # row 0 finishes every other step: partial resets mix fresh and stepped rows
    policy = lambda td: td.set("action", torch.tensor([[0.3, 0.0], [0.0, 0.0], [0.0, 0.0]]))  # noqa: E731
    rollout = env.rollout(6, policy=policy, break_when_any_done=False)
    assert rollout["next", "done"][0].sum() == 6 and rollout["next", "done"][1:].sum() == 0
    assert torch.equal(rollout["next", "goal", "xy"], torch.ones(3, 6, 2))


def test_encoded_initial_observation_follows_the_model_at_every_reset():
    model = EncoderModel()
    x0 = torch.ones(2)
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_observation=x0)
    env.reset()
    with torch.no_grad():
        model.enc.weight.add_(1.0)  # an optimizer step on the world model
        expected = model.encode(x0)
    env.reset()
    assert torch.allclose(env.state, expected.expand(2, 4))
    env.reset(reset_td(2, [1]))  # a partial reset encodes with the current model too
    assert torch.allclose(env.state, expected.expand(2, 4))


def test_differentiable_encoded_start_backpropagates_at_every_reset():
    model = EncoderModel()
    env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_observation=torch.ones(2), differentiable=True)
    for _ in range(2):  # the second backward needs a fresh graph from a fresh encoding
        model.zero_grad()
        env.rollout(2)["next", "observation"].sum().backward()
        assert model.enc.weight.grad is not None and model.enc.weight.grad.abs().sum() > 0


def test_stochastic_encoder_start_is_drawn_at_each_reset_with_the_env_generator():
    def env(seed=None):
        return WorldModelEnv(EncoderModel(noise=1.0), BOX2, BOX2, num_envs=3, initial_observation=torch.zeros(2),
                             seed=seed)

    a, b = env(), env()  # OS-entropy seeds
    a.set_seed(0), b.set_seed(0)
    a.reset(), b.reset()
    assert torch.equal(a.state, b.state)
    assert not torch.equal(a.state[0], a.state[1])  # one draw per row
    first = a.state.clone()
    a.reset()
    assert not torch.equal(a.state, first)  # one draw per reset
    # seed= at construction and set_seed give the same episodes (construction uses up no randomness)
    c = env(seed=0)
    c.reset()
    assert torch.equal(c.state, first)


def test_learned_initial_state_is_detached_at_reset_unless_differentiable():
    init = nn.Parameter(torch.zeros(2))
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=init, transition_fn=lambda s, a: s + a)
    td = env.reset()
    assert not td["observation"].requires_grad and td["observation"].grad_fn is None
    assert not env.rollout(3)["observation"].requires_grad
    with torch.no_grad():
        init.add_(1.0)  # trained: resets start from its current value
    assert torch.equal(env.reset()["observation"], torch.ones(3, 2))
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=init, transition_fn=lambda s, a: s + a,
                        differentiable=True)
    for _ in range(2):
        init.grad = None
        env.rollout(2)["next", "observation"].sum().backward()
        assert torch.equal(init.grad, torch.full((2,), 6.0))  # 3 rows x 2 steps


def test_reward_and_terminal_adapters_leave_frozen_rows_as_the_base_env_does():
    calls = []

    def terminal_fn(state, obs, action):
        calls.append(1)
        return torch.tensor([False, True, False]) if len(calls) == 1 else torch.ones(3, dtype=torch.bool)

    env = make_world_model_env(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: {"state": s + a},
                               reward_fn=lambda s, o, a: torch.ones(s.shape[0]), terminal_fn=terminal_fn)
    first, out = _step_then_freeze(env, torch.ones(3, 2), [True, False, False])
    assert first["terminated"].view(-1).tolist() == [False, True, False]
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, 0.0]
    assert out["terminated"].view(-1).tolist() == [True, True, False]  # frozen rows keep their previous flag
    assert out["done"].view(-1).tolist() == [True, True, False]
    assert out["observation"][:, 0].tolist() == [2.0, 1.0, 1.0]
    # a reset clears the handed-back flag of the reset rows only
    td = out.clone()
    td["_reset"] = torch.tensor([[True], [False], [False]])
    assert env.base_env._reset(td)["terminated"].view(-1).tolist() == [False, True, False]


def test_dict_observation_with_reserved_key_names_is_returned_bare():
    goal = gym.spaces.Dict({"observation": BOX2, "desired_goal": BOX2, "achieved_goal": BOX2})

    def reset_fn():
        return {"observation": torch.zeros(2), "desired_goal": torch.ones(2), "achieved_goal": torch.zeros(2)}

    def transition(state, action):  # a bare Dict observation = the next state
        o = state["observation"] + action
        return {"observation": o, "desired_goal": state["desired_goal"], "achieved_goal": o}

    env = WorldModelEnv(object(), goal, BOX2, num_envs=2, reset_fn=reset_fn, transition_fn=transition)
    td = env.reset()
    assert torch.equal(td["desired_goal"], torch.ones(2, 2))
    td["action"] = torch.ones(2, 2)
    out = env.step(td)["next"]
    assert torch.equal(out["observation"], torch.ones(2, 2)) and torch.equal(out["achieved_goal"], torch.ones(2, 2))
    # PointMaze's Dict(state=..., target=...) too, and the mapping return form still works around it
    maze = gym.spaces.Dict({"state": BOX4, "target": BOX2})
    env = WorldModelEnv(object(), maze, BOX2, num_envs=2,
                        reset_fn=lambda: {"state": torch.zeros(4), "target": torch.ones(2)},
                        transition_fn=lambda s, a: {"observation": {"state": s["state"] + 1, "target": s["target"]},
                                                    "reward": torch.ones(2)})
    td = env.reset()
    td["action"] = torch.zeros(2, 2)
    out = env.step(td)["next"]
    assert torch.equal(out["state"], torch.ones(2, 4)) and torch.equal(out["reward"], torch.ones(2, 1))


def test_reset_state_and_observation_are_batched_or_not_each():
    def reset_fn(num_envs):
        return torch.arange(num_envs * 5.0).view(num_envs, 5), torch.zeros(2)  # per-row latents, a shared obs

    def transition(state, action):
        assert state.shape == (3, 5)
        return state + 1, state[:, :2], torch.zeros(3)

    # without a known state layout: a reset_fn told how many rows it resets (num_envs=) returns a
    # per-row state next to a shared obs (never broadcast again into (3, 3, 5))...
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=reset_fn, transition_fn=transition)
    td = env.reset()
    assert torch.equal(env.state, torch.arange(15.0).view(3, 5)) and torch.equal(td["observation"], torch.zeros(3, 2))
    td["action"] = torch.zeros(3, 2)
    env.step(td)
    # told by a mask= alone too (the rows are mask's True ones)
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, transition_fn=transition,
                        reset_fn=lambda seed, options, mask: reset_fn(int(mask.sum())))
    env.reset()
    assert torch.equal(env.state, torch.arange(15.0).view(3, 5))
    # ...while one that is not told returns one row, broadcast, whatever its leading dim
    # (a (3,) state for 3 envs, a (1, 8) hidden state for num_envs=1)
    for n, shape in ((3, (3,)), (1, (1, 8))):
        env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, transition_fn=lambda s, a: (s, a, torch.zeros(n)),
                            reset_fn=lambda seed, options, shape=shape: (torch.ones(shape), torch.zeros(2)))
        env.reset()
        assert env.state.shape == (n, *shape)
    # initial_state (or state_spec=) gives one row's layout: the state is taken as batched, the obs broadcast
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=reset_fn, transition_fn=transition,
                        initial_state=torch.zeros(5))
    td = env.reset()
    assert torch.equal(env.state, torch.arange(15.0).view(3, 5)) and torch.equal(td["observation"], torch.zeros(3, 2))
    td["action"] = torch.zeros(3, 2)
    env.step(td)
    env.reset(reset_td(3, [1]))  # a partial reset: one row each
    assert env.state[1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    # and an unbatched state next to a batched observation is broadcast
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(5), transition_fn=transition,
                        reset_fn=lambda num_envs: (torch.ones(5), torch.zeros(num_envs, 2)))
    env.reset()
    assert torch.equal(env.state, torch.ones(3, 5))
    # a layout that matches neither is named
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(5), transition_fn=transition,
                        reset_fn=lambda: (torch.ones(3, 4), torch.zeros(2)))
    with pytest.raises(ReturnFormError, match=r"state leaves \(3, 4\) are neither one row \(5,\)"):
        env.reset()


@pytest.mark.parametrize("told_rows", [True, False], ids=["reset_fn(num_envs)", "reset_fn(seed, options)"])
def test_a_reset_state_whose_layout_was_a_guess_is_named_when_the_next_step_contradicts_it(told_rows):
    # no known layout, an unbatched observation, and a state whose leading dim equals the rows reset: told the
    # rows, the reset_fn's (4,) state is read as 4 rows of (); not told, its (4, 4) state as one row, broadcast.
    # The step contradicts the guess (its next state or observation has another layout, or the model fails on
    # it): the error says how the state was read and how to settle it, and nothing moves. (A model whose
    # outputs all broadcast back to the guessed layout cannot be caught: the docstring asks them to agree.)
    n = 4
    if told_rows:
        def reset_fn(num_envs):
            return torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.zeros(2)  # one row, to broadcast
    else:
        def reset_fn(seed, options):
            return torch.arange(16.0).view(4, 4), torch.zeros(2)  # one row per env
    def next_state_and_obs(state):
        return state, state[..., :2], torch.zeros(n)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, reset_fn=reset_fn,
                        transition_fn=lambda s, a: next_state_and_obs(s + a.sum(-1, keepdim=True)))
    td = env.reset()
    before = env.state.clone()
    td["action"] = torch.ones(n, 2)
    read = r"read as 4 rows of \(\) \(the reset_fn declares num_envs or mask" if told_rows else (
        r"read as one row, broadcast to the 4 rows \(the reset_fn declares neither")
    # told: the next state is (4, 4), not 4 rows of (); not told: the observation is (4, 4, 2), not (4, 2)
    said = "the layout of the reset.s state read the other way" if told_rows else r"expected .* shape \(4, 2\)"
    with pytest.raises(ReturnFormError, match=said) as info:
        env.step(td)
    assert re.search(read, "\n".join(info.value.__notes__))
    assert "return the observation batched too" in info.value.__notes__[-1]
    assert torch.equal(env.state, before)  # nothing moved
    # a model that fails on the misread state gets the same note
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, reset_fn=reset_fn,
                        transition_fn=lambda s, a: (torch.cat([s, a], -1)[:, :4], a.clone(), torch.zeros(n)))
    td = env.reset()
    td["action"] = torch.ones(n, 2)
    with pytest.raises(RuntimeError) as info:
        env.step(td)
    assert re.search(read, "\n".join(info.value.__notes__))
    # a state that legally changes layout (a context growing by one step) is not taken for the other reading
    # (review R7 B3: every layout change was refused after a guess)
    def grow(state, action):
        nxt = torch.cat([state, state[:, -1:] + 1], dim=1)
        return nxt, nxt[:, -1, :2], torch.ones(n), torch.zeros(n, dtype=torch.bool), False, {}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, transition_fn=grow,
                        reset_fn=lambda num_envs: (torch.zeros(num_envs, 1, 2), torch.zeros(2)))
    td = env.reset()
    for _ in range(3):
        td = env.step_mdp(env.step(td.set("action", torch.ones(n, 2))))
    assert env.state.shape == (n, 4, 2) and td["observation"][:, 0].tolist() == [3.0] * n
    # a step that keeps the layout confirms the guess: later steps are unchecked, as always
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=n, reset_fn=lambda num_envs: (torch.zeros(n), torch.zeros(2)),
                        transition_fn=lambda s, a: (s + 1, a.clone(), torch.zeros(n)))
    td = env.reset()
    td["action"] = torch.ones(n, 2)
    for _ in range(3):
        td = env.step_mdp(env.step(td))
        td["action"] = torch.ones(n, 2)
    assert torch.equal(env.state, torch.full((n,), 3.0))


def test_a_state_under_state_key_is_checked_against_its_spec():
    def transition(state, action):
        return {"state": torch.zeros(state.shape[0], 5, dtype=torch.float64), "observation": action.clone()}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="latent", initial_state=torch.zeros(3),
                        initial_observation=torch.zeros(2), transition_fn=transition)
    with pytest.raises(ReturnFormError, match=r"state \(exposed under state_key='latent'\): expected dtype "
                                              r"torch.float32, shape \(2, 3\).*got Tensor\(dtype=torch.float64, "
                                              r"shape=\(2, 5\)\)"):
        env.rollout(3, break_when_any_done=False)
    # dict states: each declared leaf; and a reset's state too
    def reset_fn(num_envs):
        return {"h": torch.zeros(num_envs, 3), "z": torch.zeros(num_envs, 1, dtype=torch.float64)}, torch.zeros(2)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="latent", transition_fn=lambda s, a: s,
                        state_spec={"h": Unbounded((3,)), "z": Unbounded((1,))}, reset_fn=reset_fn)
    with pytest.raises(ReturnFormError, match=r"state\['z'\] .*expected dtype torch.float32, shape \(2, 1\).*"
                                              r"got Tensor\(dtype=torch.float64"):
        env.reset()


def test_reset_fn_returning_the_whole_batch_for_a_partial_reset_is_a_clear_error():
    class Model:
        def reset(self, seed=None, options=None):
            return torch.zeros(4, 2)  # always the whole batch

        def step(self, state, action):
            return {"state": state + action}

    env = WorldModelEnv(Model(), BOX2, BOX2, num_envs=4)
    assert env.reset()["observation"].shape == (4, 2)
    with pytest.raises(ReturnFormError, match=r"observation: expected 1 row\(s\), one per row being reset.*"
                                              r"shape=\(4, 2\)\) \(the whole batch\); declare a num_envs "
                                              r"parameter .* or mask"):
        env.reset(reset_td(4, [0]))


def test_numpy_leaves_in_a_dict_observation_convert_like_a_box_observation():
    space = gym.spaces.Dict({"pos": BOX2})
    env = WorldModelEnv(object(), space, BOX2, num_envs=3, initial_observation={"pos": np.zeros(2, np.float32)},
                        transition_fn=lambda s, a: ({"pos": np.ones((3, 2), np.float32)}, 0.0, False, False, {}))
    td = env.reset()
    td["action"] = torch.zeros(3, 2)
    out = env.step(td)["next"]
    assert torch.equal(out["pos"], torch.ones(3, 2)) and torch.equal(env.state["pos"], torch.ones(3, 2))


def test_unlocked_reset_fn_receives_the_documented_mask():
    got = []

    def reset_fn(num_envs, mask):
        got.append((num_envs, mask))
        return torch.zeros(num_envs, 2)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", reset_fn=reset_fn,
                        transition_fn=lambda s, a: s + a)
    env.reset(TensorDict({"_reset": torch.tensor([[True], [False], [True]])}, [3]))
    (n, mask), = got
    # every row of a batch-unlocked env is started (TorchRL keeps the masked ones): one True flag per row
    assert n == 3 and isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.tolist() == [True] * 3


def test_an_adapter_taking_the_model_last_is_refused():
    def transition(state, action, model):
        return state + action

    with pytest.raises(AdapterError, match=r"transition\(state, action, model\): parameter 'model' looks like the "
                                           r"model but is not the first parameter"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)


def test_step_mask_with_state_key_freezes_rows_at_the_state_they_were_given():
    # with state_key the tensordict holds the state: a frozen row keeps the caller's, not the env's copy
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: s + a)
    td = env.reset()
    td["observation"] = torch.tensor([[5.0, 5.0], [7.0, 7.0]])
    td["action"] = torch.ones(2, 2)
    td["_step"] = torch.tensor([[True], [False]])
    out = env.step(td)["next"]
    assert out["observation"].tolist() == [[6.0, 6.0], [7.0, 7.0]]
    assert out["reward"].view(-1).tolist() == [0.0, 0.0]


def test_a_separate_state_with_the_observation_as_state_key_is_an_error():
    # state_key="observation": the next step reads the state back from the observation, so a state
    # returned apart from it would be silently lost
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=1, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: {"state": s + 1, "observation": s * 0 + 100})
    with pytest.raises(ReturnFormError, match=r"a state apart from the observation, but state_key='observation'"):
        env.rollout(2)
    same = WorldModelEnv(object(), BOX2, BOX2, num_envs=1, state_key="observation", initial_state=torch.zeros(2),
                         transition_fn=lambda s, a: (lambda n: {"state": n, "observation": n})(s + 1))
    assert same.rollout(3)["next", "observation"][0, :, 0].tolist() == [1.0, 2.0, 3.0]


def test_decoder_of_a_dict_observation_names_its_input_entry():
    box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def make(**kwargs):
        return make_world_model_env(
            object(), gym.spaces.Dict({"pos": box, "vel": box}), box, num_envs=2, initial_state=torch.zeros(2),
            initial_observation={"pos": torch.zeros(2), "vel": torch.zeros(2)},
            transition_fn=lambda s, a: {"state": s + a, "observation": {"pos": s + a, "vel": s}},
            decoder=lambda x: x * 2, **kwargs)

    # the default "observation" is not an entry of a Dict observation: say so, never call the decoder with None
    missing = r"no 'observation' entry to decode; the env has \[.*'pos', .*'vel'\].*decoder_in_key"
    with pytest.raises(KeyError, match=missing):
        make().reset()
    env = make(decoder_in_key="pos")
    td = env.reset()
    td["action"] = torch.ones(2, 2)
    assert env.step(td)["next", "pixels"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
    with pytest.raises(TypeError, match="decoder_in_key= only make sense with decoder="):
        make_world_model_env(object(), box, box, num_envs=1, initial_state=torch.zeros(2),
                             transition_fn=lambda s, a: s + a, decoder_in_key="pos")


def test_adapters_refuse_what_the_model_would_silently_lose():
    from torchrl_swm.errors import SpecError

    box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    # a decoder output off its declared spec (dtype, shape) or batch is named, on every reset and step
    env = make_world_model_env(None, box, box, num_envs=3, transition_fn=lambda s, a: s + a,
                               initial_state=torch.zeros(2), decoder=lambda o: o.repeat(1, 8),
                               decoder_spec=Bounded(0, 255, shape=(4, 4), dtype=torch.uint8))
    with pytest.raises(ReturnFormError, match=r"returned Tensor\(dtype=torch.float32, shape=\(3, 16\)\); expected dtype "
                                              r"torch.uint8, shape \(3, 4, 4\)"):
        env.rollout(2)
    short = make_world_model_env(None, box, box, num_envs=3, transition_fn=lambda s, a: s + a,
                                 initial_state=torch.zeros(2), decoder=lambda o: o[:1])
    with pytest.raises(ReturnFormError, match=r"expected leading dims \(3,\)"):
        short.reset()
    # the model reads "action": an ActionAdapter writing elsewhere would be ignored
    with pytest.raises(ValueError, match=r"action_key='act', but WorldModelEnv reads its action from 'action'"):
        ActionAdapter(lambda a: a, box, action_key="act")
    # a Discrete start would reach the model as 0..n-1
    for make in (lambda: WorldModelEnv(object(), box, gym.spaces.Discrete(3, start=-1), num_envs=2,
                                       initial_state=torch.zeros(2), transition_fn=lambda s, a: s),
                 lambda: ActionAdapter(lambda a: a, gym.spaces.MultiDiscrete([3, 2], start=[1, 0]))):
        with pytest.raises(SpecError, match=r"has a nonzero start"):
            make()
    # and an observation start would leave the 0-based spec (and the exported space) on every value
    nested = gym.spaces.Dict({"pos": box, "cell": gym.spaces.Discrete(5, start=10)})
    for space, name in ((gym.spaces.Discrete(5, start=10), "observation_space"),
                        (nested, r"observation_space\['cell'\]")):
        with pytest.raises(SpecError, match=rf"WorldModelEnv: {name} Discrete\(5, start=10\) has a nonzero start.*"
                                            r"return 0-based values"):
            WorldModelEnv(object(), space, box, num_envs=2, initial_state=torch.zeros(2), transition_fn=lambda s, a: s)
    with pytest.raises(SpecError, match=r"ObservationDecoder spec Discrete\(4, start=1\) has a nonzero start"):
        ObservationDecoder(lambda o: o, spec=gym.spaces.Discrete(4, start=1))


# -- a TensorDict state with batch_size [], a sampling decoder's streams, device "cpu:0" ---------------------
def _td_state_transition(state, action):
    deter = torch.tanh(state["deter"] + action.sum(-1, keepdim=True))
    # TensorDict(d) has batch_size [] unless told otherwise
    return {"state": TensorDict({"deter": deter, "stoch": state["stoch"] * 0.5}),
            "observation": deter[:, :2].clone(), "reward": deter[:, :1].clone()}


def _td_state_reset(seed, options, num_envs):
    state = TensorDict({"deter": torch.full((num_envs, 3), 0.1), "stoch": torch.ones(num_envs, 2)})
    return state, torch.zeros(num_envs, 2)


@pytest.mark.parametrize("start", ["initial_state", "reset_fn"])
def test_a_tensordict_state_without_batch_size_gets_the_envs_batch_under_state_key(start):
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    starts = (dict(initial_state=TensorDict({"deter": torch.zeros(3), "stoch": torch.ones(2)}),
                   initial_observation=torch.zeros(2))
              if start == "initial_state" else
              dict(reset_fn=_td_state_reset, state_spec={"deter": gym.spaces.Box(-1, 1, (3,), np.float32),
                                                         "stoch": gym.spaces.Box(-1, 1, (2,), np.float32)}))
    env = WorldModelEnv(object(), box, box, num_envs=4, transition_fn=_td_state_transition, state_key="latent",
                        seed=0, **starts)
    td = env.reset()
    assert td["latent"].batch_size == (4,)
    td["action"] = torch.full((4, 2), 0.2)
    out = env.step(td)
    assert out["next", "latent"].batch_size == (4,)
    torch.testing.assert_close(out["next", "latent", "stoch"], td["latent", "stoch"] * 0.5)
    assert out["next"][1]["latent", "deter"].shape == (3,)  # indexable: a valid [4] tensordict
    check_env_specs(env)
    rollout = env.rollout(5, break_when_any_done=False)
    assert rollout[0]["next", "latent"].batch_size == (5,)


def _noisy_step(state, action, generator=None):
    noise = 0.1 * torch.randn(state.shape, generator=generator)
    return {"state": torch.tanh(state + action.sum(-1, keepdim=True) + noise)}


def _sampling_decoder(obs, generator=None):
    probs = torch.sigmoid(obs).view(-1, 1, 1, 3).expand(-1, 2, 2, 3)
    return (torch.bernoulli(probs, generator=generator) * 255).to(torch.uint8)


def _decoded_env(decoder=_sampling_decoder):
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    return make_world_model_env(object(), box, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=4,
                                initial_state=torch.zeros(3), transition_fn=_noisy_step, decoder=decoder, seed=0)


def test_a_sampling_decoder_draws_resets_from_the_reset_stream_so_rows_stay_isolated():
    """Mask isolation with a decoder taking generator=: a partial reset of row 0 leaves rows 1..3 (latents and
    pixels) identical to a same-seed twin's, as the env's own adapters guarantee."""
    a, b = _decoded_env(), _decoded_env()
    ta, tb = a.reset(), b.reset()
    for t in range(8):
        ta["action"] = tb["action"] = torch.full((4, 2), 0.1)
        if t == 2:
            ta["_reset"] = torch.tensor([[True], [False], [False], [False]])
            ta = a.reset(ta)
        oa, ta = a.step_and_maybe_reset(ta)
        ob, tb = b.step_and_maybe_reset(tb)
        for key in ("observation", "pixels"):
            assert torch.equal(oa["next", key][1:], ob["next", key][1:]), (t, key)
    # and the decoder's spec probe and the reset decoding leave the model's step stream where it was: the first
    # step's latents are those of the env without a decoder
    plain = _decoded_env(decoder=None).rollout(1, lambda td: td.set("action", torch.full((4, 2), 0.1)))
    decoded = _decoded_env().rollout(1, lambda td: td.set("action", torch.full((4, 2), 0.1)))
    assert torch.equal(plain["next", "observation"], decoded["next", "observation"])


@pytest.mark.parametrize("after", ["nothing", "normalise", "stack"])
def test_rows_frozen_by_step_keep_the_pixels_a_sampling_decoder_gave_them(after):
    # the env keeps a frozen row's observation; a decoder that samples must not draw its pixels again, and
    # what it keeps is its own output, whatever later transforms make of it (normalised, stacked)
    from torchrl.envs import CatFrames, ObservationNorm, UnsqueezeTransform

    later = {
        "nothing": [],
        "normalise": [ObservationNorm(loc=100.0, scale=0.5, in_keys=["pixels"], standard_normal=True)],
        "stack": [UnsqueezeTransform(-4, in_keys=["pixels"]), CatFrames(2, dim=-4, in_keys=["pixels"])],
    }[after]
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    env = make_world_model_env(object(), box, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=4,
                               initial_state=torch.zeros(3), transition_fn=_noisy_step, decoder=_sampling_decoder,
                               seed=0, transforms=later)
    twin = make_world_model_env(object(), box, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=4,
                                initial_state=torch.zeros(3), transition_fn=_noisy_step, decoder=_sampling_decoder,
                                seed=0)  # the decoder alone: what it gave each row
    td, ref = env.reset(), twin.reset()
    for t in range(6):
        frozen = t in (2, 3)  # rows 1 and 3 wait for two steps
        for x in (td, ref):
            x.set("action", torch.full((4, 2), 0.1))
            if frozen:
                x.set("_step", torch.tensor([[True], [False], [True], [False]]))
        out, td = env.step_and_maybe_reset(td)
        out_ref, ref = twin.step_and_maybe_reset(ref)
        pixels, expected = out["next", "pixels"], out_ref["next", "pixels"]
        if after == "normalise":
            expected = (expected.float() - 100.0) / 0.5
        elif after == "stack":
            pixels = pixels[:, -1]  # the newest frame
        assert torch.equal(pixels, expected.to(pixels.dtype)), (after, t)
        if frozen:
            assert torch.equal(out_ref["next", "pixels"][[1, 3]], out_ref["pixels"][[1, 3]])


def test_a_partial_reset_leaves_the_other_rows_the_pixels_a_sampling_decoder_gave_them():
    # ObservationDecoder._reset: rows a partial reset leaves keep their pixels (not drawn again from the reset
    # stream), at the reset and when frozen by "_step" on the next step
    env = _decoded_env()
    td = env.reset()
    td["action"] = torch.full((4, 2), 0.1)
    td = env.step(td)["next"].clone()
    before = td["pixels"].clone()
    td["_reset"] = torch.tensor([[True], [False], [False], [False]])
    td = env.reset(td).exclude("_reset")
    assert torch.equal(td["pixels"][1:], before[1:])
    td["action"] = torch.full((4, 2), 0.1)
    td["_step"] = torch.tensor([[True], [False], [True], [False]])  # rows 1 and 3 wait
    out = env.step(td)["next"]
    assert torch.equal(out["pixels"][[1, 3]], before[[1, 3]])


@pytest.mark.parametrize("device", ["cpu:0", torch.device("cpu", 0)])
def test_cpu_with_an_index_is_the_cpu(device):
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    for model in (nn.Linear(2, 2).to(device), object()):
        env = WorldModelEnv(model, box, box, num_envs=2, initial_state=torch.zeros(2),
                            transition_fn=lambda s, a: {"state": s + a}, device=device)
        assert env.device == torch.device("cpu")
        assert env.rollout(3)["next", "observation"].shape == (2, 3, 2)
        assert env.to(device) is env


def test_frozen_rows_pixels_follow_a_branched_observation_and_truncated_bptt_runs():
    # (a) stepping again from an earlier tensordict (replanning), rows frozen: with state_key the env keeps
    # the caller's observation, and the pixels are that observation's; (b) truncated BPTT through a sampling
    # decoder, the tensordict detached between chunks and rows frozen at a chunk's start: no old graph comes back
    box, act = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
    frozen = torch.tensor([[True], [False], [True], [False]])

    def step(state, action):
        return {"state": torch.tanh(state + action.sum(-1, keepdim=True))}

    def decoder(obs):
        return ((obs + 1) * 127).round().clamp(0, 255).to(torch.uint8).view(-1, 1, 1, 3).expand(-1, 2, 2, 3)

    env = make_world_model_env(object(), box, act, num_envs=4, initial_state=torch.zeros(3), transition_fn=step,
                               decoder=decoder, seed=0, state_key="observation")
    _, td1 = env.step_and_maybe_reset(env.reset().set("action", torch.full((4, 2), 0.1)))
    saved = td1.clone()
    env.step_and_maybe_reset(td1.set("action", torch.full((4, 2), 0.2)))
    nxt = env.step(saved.set("action", torch.full((4, 2), -0.3)).set("_step", frozen))["next"]
    assert torch.equal(nxt["observation"][[1, 3]], saved["observation"][[1, 3]])
    assert torch.equal(nxt["pixels"], decoder(nxt["observation"]))

    weight = torch.nn.Parameter(torch.ones(3, 4))

    def sampling_decoder(obs, generator=None):
        return obs @ weight + 0.1 * torch.randn(obs.shape[0], 4, generator=generator)

    actor = torch.nn.Parameter(torch.full((1, 2), 0.1))  # a learned policy: its fresh action carries grad
    for state_key in (None, "observation"):
        env = make_world_model_env(object(), box, act, num_envs=4, initial_state=torch.zeros(3), transition_fn=step,
                                   decoder=sampling_decoder, decoder_spec=gym.spaces.Box(-10, 10, (4,), np.float32),
                                   seed=0, differentiable=True, state_key=state_key)
        td = env.reset()
        for chunk in range(3):
            loss = 0
            for t in range(3):
                td["action"] = torch.tanh(actor).expand(4, 2) if state_key else torch.full((4, 2), 0.1)
                if t == 0 and chunk:
                    td["_step"] = frozen
                out, td = env.step_and_maybe_reset(td)
                if t == 0 and chunk:  # the frozen rows kept their sampled pixels
                    assert torch.equal(out["next", "pixels"][[1, 3]].detach(), out["pixels"][[1, 3]])
                loss = loss + out["next", "pixels"].pow(2).mean()
            loss.backward()
            td = td.detach()


def test_a_sampling_decoder_keeps_frozen_rows_for_dict_and_nan_inputs_and_their_gradient():
    # the kept pixels are found for a sub-TensorDict input and for a NaN input (NaN equals NaN here), and a
    # frozen row inside one differentiable chunk keeps its gradient, even when a later transform renames it
    from torchrl.envs import RenameTransform

    box = lambda n: gym.spaces.Box(-1, 1, (n,), np.float32)  # noqa: E731
    act, frozen = box(2), torch.tensor([True, False, True, False])
    spec = gym.spaces.Box(-100, 100, (4,), np.float32)

    def dict_step(state, action):
        return {"lat": {"a": torch.tanh(state["lat"]["a"] + action.sum(-1, keepdim=True)), "b": state["lat"]["b"]}}

    def dict_decoder(obs, generator=None):
        return obs["a"].sum(-1, keepdim=True).expand(-1, 4) + torch.randn(obs.shape[0], 4, generator=generator)

    dict_space = gym.spaces.Dict({"lat": gym.spaces.Dict({"a": box(3), "b": box(2)})})
    env = make_world_model_env(object(), dict_space, act, num_envs=4, transition_fn=dict_step, decoder=dict_decoder,
                               initial_state={"lat": {"a": torch.zeros(3), "b": torch.zeros(2)}},
                               decoder_in_key="lat", decoder_spec=spec, seed=0)
    _, td = env.step_and_maybe_reset(env.reset().set("action", torch.full((4, 2), 0.1)))
    out = env.step(td.clone().set("action", torch.full((4, 2), 0.1)).set("_step", frozen))["next"]
    assert torch.equal(out["pixels"][[1, 3]], td["pixels"][[1, 3]])

    def nan_step(state, action):
        return {"state": state + action.sum(-1, keepdim=True)}

    def nan_decoder(obs, generator=None):
        return torch.nan_to_num(obs).sum(-1, keepdim=True) + torch.randn(obs.shape[0], 4, generator=generator)

    env = make_world_model_env(object(), gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), act, num_envs=4,
                               initial_state=torch.tensor([float("nan"), 0.0, 0.0]), transition_fn=nan_step,
                               decoder=nan_decoder, decoder_spec=spec, seed=0)
    _, td = env.step_and_maybe_reset(env.reset().set("action", torch.full((4, 2), 0.1)))
    out = env.step(td.clone().set("action", torch.full((4, 2), 0.1)).set("_step", frozen))["next"]
    assert torch.equal(out["pixels"][[1, 3]], td["pixels"][[1, 3]])

    weight = torch.nn.Parameter(torch.ones(3, 4))

    def learned_decoder(obs, generator=None):
        return obs @ weight + 0.1 * torch.randn(obs.shape[0], 4, generator=generator)

    for key, later in (("pixels", []), ("img", [RenameTransform(["pixels"], ["img"])])):
        env = make_world_model_env(object(), box(3), act, num_envs=2, initial_state=torch.zeros(3),
                                   transition_fn=lambda s, a: {"state": torch.tanh(s + a.sum(-1, keepdim=True))},
                                   decoder=learned_decoder, decoder_spec=spec, seed=0, differentiable=True,
                                   transforms=later)
        _, td = env.step_and_maybe_reset(env.reset().set("action", torch.full((2, 2), 0.3)))
        out, _ = env.step_and_maybe_reset(td.set("action", torch.full((2, 2), 0.3)).set("_step", frozen[:2]))
        weight.grad = None
        out["next", key][1].sum().backward()  # the frozen row's pixels, from the step before
        assert weight.grad is not None and weight.grad.abs().sum() > 0, key


@pytest.mark.parametrize("edit", ["one entry", "below isclose's default tolerance"])
def test_a_sampling_decoder_decodes_a_frozen_row_again_once_the_caller_edited_its_observation(edit, device):
    """With state_key the env keeps a frozen row's observation as the caller gave it, maybe edited: its old pixels
    are kept only when that observation is exactly the one they were decoded from, else it is decoded again."""

    def decoder(obs, generator):  # pixels = [obs, noise]: their first entries show which input they came from
        return torch.cat([obs, torch.rand(obs.shape[0], 1, generator=generator, device=obs.device)], -1)

    env = make_world_model_env(object(), BOX2, FORCE, num_envs=3, initial_state=torch.full((2,), 1000.0),
                               transition_fn=lambda s, a: s + a, state_key="observation", decoder=decoder, seed=0,
                               device=device)
    td = env.step(env.reset().set("action", torch.zeros(3, 2, device=device)))["next"].clone()
    if edit == "one entry":
        td["observation"][1, 0] += 5.0
    else:  # 1000 -> 1000.005: equal under torch.isclose's default rtol=1e-5
        td["observation"][1] += 0.005
    td["action"] = torch.zeros(3, 2, device=device)
    td["_step"] = torch.tensor([True, False, False], device=device)  # rows 1 and 2 frozen, row 1 edited
    out = env.step(td)["next"]
    assert torch.equal(out["observation"][1:], td["observation"][1:])
    assert torch.equal(out["pixels"][1, :2], td["observation"][1])  # decoded again from the edited observation
    assert torch.equal(out["pixels"][2], td["pixels"][2])  # the unedited frozen row keeps its pixels


@pytest.mark.parametrize("state", ["tensor", "dict"])
def test_detach_state_lets_truncated_bptt_go_on_from_the_envs_own_state(state):
    # with state_key=None the env keeps its state: td.detach() cannot cut its graph, detach_state() does
    box, act = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)

    def step(s, action):
        if state == "dict":
            return {"state": {"h": torch.tanh(s["h"] + action.sum(-1, keepdim=True))}, "obs": s["h"]}
        return {"state": torch.tanh(s + action.sum(-1, keepdim=True))}

    actor = torch.nn.Parameter(torch.full((2,), 0.1))
    initial = {"h": torch.zeros(3)} if state == "dict" else torch.zeros(3)

    def train(detach_state):
        env = make_world_model_env(object(), box, act, num_envs=4, initial_state=initial, transition_fn=step, seed=0,
                                   differentiable=True, initial_observation=torch.zeros(3))
        td = env.reset()
        for chunk in range(3):
            loss = 0
            for t in range(3):
                out, td = env.step_and_maybe_reset(td.set("action", torch.tanh(actor).expand(4, 2)))
                loss = loss + out["next", "observation"].pow(2).mean()
            loss.backward()
            td = td.detach()
            if detach_state:
                # a TransformedEnv hands it to its base env; None: env = env.detach_state() cannot drop transforms
                assert env.detach_state() is None
        return env

    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        train(detach_state=False)
    env = train(detach_state=True)
    assert actor.grad is not None and actor.grad.abs().sum() > 0
    assert not env.rollout(2, lambda td: td.set("action", torch.zeros(4, 2)))["next", "observation"].requires_grad


class _Recorder(nn.Module):
    """Keeps the actions it receives; the state never changes."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def step(self, state, action):
        self.seen.append(action.clone() if isinstance(action, torch.Tensor) else action.clone())
        n = state.shape[0]
        return state, torch.zeros(n, 1), torch.zeros(n, 1, dtype=torch.bool), {}


_BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


@pytest.mark.parametrize("space, good, bad, match", [
    (gym.spaces.Discrete(3), [2, 0], [7, 0], r"action of env 0: expected an index in \[0, 3\), got 7"),
    (gym.spaces.Discrete(3), [0, 1], [0, -1], r"action of env 1: expected an index in \[0, 3\), got -1"),
    (gym.spaces.MultiDiscrete([2, 3]), [[1, 2], [0, 0]], [[0, 0], [1, 3]], r"env 1: expected indices in \[0, nvec\)"),
    (gym.spaces.MultiBinary(2), [[1, 0], [0, 1]], [[3, 0], [0, 1]], r"env 0: expected entries 0 or 1, got \[3, 0\]"),
    (OneHot(3), [[0, 1, 0], [1, 0, 0]], [[1, 1, 1], [0, 0, 1]], r"env 0: expected a one-hot vector of size 3"),
    (OneHot(3, dtype=torch.float32), [[0, 1, 0], [1, 0, 0]], [[0, 1, 0], [0.5, 0.5, 0]], r"env 1: expected a one-hot"),
    (MultiOneHot([2, 3]), [[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]], [[0, 1, 0, 0, 0], [1, 0, 1, 0, 0]],
     r"env 0: expected one one-hot block"),
])
def test_discrete_actions_outside_the_space_are_refused_before_the_model(space, good, bad, match):
    model = _Recorder()
    env = WorldModelEnv(model, _BOX2, space, num_envs=2, initial_state=torch.zeros(2), seed=0)
    dtype = env.action_spec.dtype
    td = env.reset()
    env.step(td.set("action", torch.tensor(good).to(dtype)))
    assert len(model.seen) == 1 and model.seen[0].tolist() == torch.tensor(good).to(dtype).tolist()
    with pytest.raises(ValueError, match=match):
        env.step(td.set("action", torch.tensor(bad).to(dtype)))
    assert len(model.seen) == 1  # the model never saw it
    env.step(td.set("action", torch.tensor(good).to(dtype)))  # the env is still usable
    assert len(model.seen) == 2


def test_a_dict_action_checks_its_discrete_leaf_and_an_action_adapter_its_outside_space():
    model = _Recorder()
    space = gym.spaces.Dict(move=_BOX2, pick=gym.spaces.Discrete(2))
    env = WorldModelEnv(model, _BOX2, space, num_envs=2, initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    td["action"] = TensorDict({"move": torch.zeros(2, 2), "pick": torch.tensor([1, 2])}, batch_size=[2])
    with pytest.raises(ValueError, match=r"action\['pick'\] of env 1: expected an index in \[0, 2\), got 2"):
        env.step(td)
    assert not model.seen
    # outside Discrete(3) looked up in a table: -1 would silently pick the last entry
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    adapted = make_world_model_env(_Recorder(), _BOX2, gym.spaces.Discrete(3), num_envs=2, initial_state=torch.zeros(2),
                                   action_transform_fn=lambda a: table[a], model_action_space=_BOX2)
    td = adapted.reset()
    adapted.step(td.set("action", torch.tensor([2, 0])))
    with pytest.raises(ValueError, match=r"ActionAdapter: the outside action of env 0: expected an index in \[0, 3\)"):
        adapted.step(td.set("action", torch.tensor([-1, 0])))


@pytest.mark.parametrize("seed, error", [(1.7, TypeError), ("5", TypeError), (True, TypeError), (-1, ValueError),
                                         (2**64, ValueError), (torch.tensor(2.0), TypeError)])
def test_bad_seeds_are_refused_before_any_generator_changes(seed, error):
    with pytest.raises(error, match=r"WorldModelEnv: seed: expected an int"):
        counting_env(seed=seed)
    env = counting_env(seed=3)
    state = env.generator.get_state().clone()
    with pytest.raises(error, match=r"WorldModelEnv: seed: expected an int"):
        env.set_seed(seed)
    with pytest.raises(error, match=r"WorldModelEnv: seed: expected an int"):
        env.reset(seed=seed)
    assert torch.equal(env.generator.get_state(), state)
    for good in (np.int64(4), torch.tensor(4), 2**64 - 1):
        env.reset(seed=good)


def test_a_batched_initial_state_is_named_as_given_and_unbatched_is_asked_for():
    with pytest.raises(ReturnFormError) as err:
        counting_env(num_envs=4, initial_state=torch.zeros(4, 3)).reset()
    text = str(err.value)
    assert "initial_state of shape (4, 3)" in text and "one unbatched start" in text and "reset_fn=" in text


def test_make_world_model_env_transforms_take_a_list_or_one_transform():
    with pytest.raises(TypeError, match=r"transforms: expected a list of TorchRL Transforms, got int"):
        make_world_model_env(CountingModel(5), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3), transforms=5)
    env = make_world_model_env(CountingModel(5), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3),
                               transforms=StepCounter())
    assert "step_count" in env.reset().keys()
    for many in (nn.ModuleList([StepCounter(), RewardSum()]), (t for t in [StepCounter(), RewardSum()])):
        env = make_world_model_env(CountingModel(5), OBS3, ACT1, num_envs=2, initial_state=torch.zeros(3),
                                   transforms=many)  # any iterable of transforms
        assert {"step_count", "episode_reward"} <= set(env.reset().keys())


def test_start_states_from_a_collector_batch_or_a_2d_replay_buffer_sample_every_entry():
    # TorchRL's (num_envs, T) layouts: len() counts B * T entries while indexing walks the first dim only
    b, t = 3, 5
    obs = torch.arange(b * t * 3, dtype=torch.float32).reshape(b, t, 3)
    box = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100, ndim=2))
    rb.extend(TensorDict({"observation": obs}, [b, t]))
    plain = ReplayBuffer(storage=LazyTensorStorage(100, ndim=2))
    plain.extend(obs)
    starts = {}
    for name, data in (("td", TensorDict({"observation": obs}, [b, t])), ("rb", rb), ("plain", plain)):
        seen = set()
        for seed in range(6):
            env = WorldModelEnv(CountingModel(5), box, ACT1, num_envs=8, start_states=data, seed=seed)
            first = env.reset()["observation"]
            seen.update(int(v) for v in first[:, 0])
        starts[name] = seen
        assert seen <= set(range(0, b * t * 3, 3)) and len(seen) > b  # more starts than dim 0 alone holds
    assert starts["rb"] == starts["plain"]  # (the buffers index their storage, laid out apart from the batch)


def test_straight_through_one_hot_actions_pass_the_check_and_carry_gradient():
    # TorchRL's OneHotCategorical(PassThrough).rsample() gives out + probs - probs.detach(): 0.99999994, not 1
    from torchrl.modules import OneHotCategorical
    from torchrl.modules.distributions import ReparamGradientStrategy

    class Model(nn.Module):
        def step(self, state, action):
            state = state + action[:, :2]
            return state, state[:, :1], torch.zeros(state.shape[0], 1, dtype=torch.bool), torch.zeros(
                state.shape[0], 1, dtype=torch.bool), {}

    env = WorldModelEnv(Model(), _BOX2, OneHot(5, dtype=torch.float32), num_envs=64, initial_state=torch.zeros(2),
                        differentiable=True, seed=0)
    logits = nn.Parameter(torch.randn(64, 5, generator=torch.Generator().manual_seed(0)))
    td = env.reset()
    loss = 0
    for _ in range(3):
        action = OneHotCategorical(logits=logits, grad_method=ReparamGradientStrategy.PassThrough).rsample()
        _, td = env.step_and_maybe_reset(td.set("action", action))
        loss = loss + td["observation"].sum()
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="one-hot"):  # a soft vector is still refused
        env.step(td.set("action", torch.full((64, 5), 0.2)))


def test_frozen_rows_actions_are_ignored_and_the_model_never_sees_invalid_ones():
    # World's contract: the actions of frozen rows are ignored (a policy may write -1 there)
    model = _Recorder()
    env = WorldModelEnv(model, _BOX2, gym.spaces.Discrete(3), num_envs=3, initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    td.set("action", torch.tensor([2, -1, 7])).set("_step", torch.tensor([True, False, False]))
    env.step(td)
    assert model.seen[-1].tolist() == [2, 0, 0]  # placeholders for the frozen rows, the stepped row's own
    assert td["action"].tolist() == [2, -1, 7]  # the caller's tensordict is untouched
    td.set("_step", torch.tensor([False, True, False]))
    with pytest.raises(ValueError, match=r"action of env 1: expected an index in \[0, 3\), got -1"):
        env.step(td)


def test_start_states_from_a_split_trajs_collector_batch_skip_the_padding():
    b, t = 3, 4
    obs = torch.arange(1, b * t * 3 + 1, dtype=torch.float32).reshape(b, t, 3)
    valid = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])
    data = TensorDict({"observation": obs * valid.unsqueeze(-1), ("collector", "mask"): valid,
                       ("collector", "traj_ids"): torch.arange(b).view(b, 1).expand(b, t)}, [b, t])
    box = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    for seed in range(5):
        env = WorldModelEnv(CountingModel(5), box, ACT1, num_envs=16, start_states=data, seed=seed)
        starts = env.reset()["observation"]
        assert (starts.abs().sum(-1) > 0).all()  # never a zero-padded entry
        assert set(starts[:, 0].tolist()) <= set(obs[valid][:, 0].tolist())


def test_seeds_that_differ_only_above_32_bits_give_different_streams():
    # a CPU torch.Generator keeps the low 32 bits of its seed: s and s + 2**32 used to be the same env
    a = WorldModelEnv(NoisyModel(), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)), num_envs=4,
                      initial_state=torch.zeros(4), seed=5)
    b = WorldModelEnv(NoisyModel(), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)), num_envs=4,
                      initial_state=torch.zeros(4), seed=5 + 2**32)
    zero = lambda td: td.set("action", torch.zeros(4, 2))  # noqa: E731
    ra, rb = a.rollout(3, zero), b.rollout(3, zero)
    assert not torch.equal(ra["next", "observation"], rb["next", "observation"])
    c = WorldModelEnv(NoisyModel(), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)), num_envs=4,
                      initial_state=torch.zeros(4), seed=5)
    assert torch.equal(c.rollout(3, zero)["next", "observation"], ra["next", "observation"])


@pytest.mark.parametrize("low", [0, 1, 5, 2**32 - 1])
def test_seed_2_to_the_32_and_its_multiples_do_not_collide_with_the_low_32_bit_seed(low):
    # the boundary itself: seed 2**32 (and s + k * 2**32, the pool's worker seeds) is not the env of its low bits
    def rollout(seed):
        env = WorldModelEnv(NoisyModel(), gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)), num_envs=3,
                            initial_state=torch.zeros(4), seed=seed)
        return env.rollout(3, lambda td: td.set("action", torch.zeros(3, 2)))["next", "observation"]

    base = rollout(low)
    for k in (1, 2, 3):
        assert not torch.equal(rollout(low + k * 2**32), base), (low, k)
    assert torch.equal(rollout(low), base)  # the same seed is still the same env


def test_frozen_rows_invalid_multi_one_hot_actions_reach_the_model_as_one_hot_in_every_block():
    # a frozen row's invalid MultiOneHot action is swapped for a placeholder that is itself valid: exactly one 1
    # in each block, so the model (which gets the whole batch) never sees an invalid action
    model = _Recorder()
    nvec = [2, 3, 4]
    env = WorldModelEnv(model, _BOX2, MultiOneHot(nvec), num_envs=3, initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    stepped = [0, 1, 0, 0, 1, 0, 0, 0, 1]
    action = torch.tensor([stepped, [0] * 9, [1, 1, 0, 0, 0, 0, 0, 0, 0]], dtype=env.action_spec.dtype)
    td.set("action", action).set("_step", torch.tensor([True, False, False]))
    env.step(td)
    seen = model.seen[-1]
    assert seen[0].int().tolist() == stepped  # the stepped row's own action
    for row in (1, 2):  # the frozen rows: a valid placeholder
        blocks = seen[row].int().split(nvec)
        assert [int(b.sum()) for b in blocks] == [1, 1, 1], seen[row].tolist()
    assert env.action_spec.is_in(seen)
    assert torch.equal(td["action"], action)  # the caller's tensordict is untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_straight_through_one_hots_pass_and_soft_ones_do_not(dtype):
    model = _Recorder()
    env = WorldModelEnv(model, _BOX2, OneHot(4, dtype=dtype), num_envs=32, initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    probs = torch.softmax(torch.randn(32, 4, generator=torch.Generator().manual_seed(1)), -1).to(dtype)
    hard = nn.functional.one_hot(probs.float().argmax(-1), 4).to(dtype)
    env.step(td.set("action", hard + probs - probs.detach() * (1 + torch.finfo(dtype).eps)))  # off by rounding
    soft = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 32, dtype=dtype)
    with pytest.raises(ValueError, match="one-hot"):
        env.step(td.set("action", soft))


def test_a_float_index_action_must_be_a_whole_number():
    from torchrl.data import MultiCategorical

    env = WorldModelEnv(_Recorder(), _BOX2, MultiCategorical([3, 4], dtype=torch.float32), num_envs=2,
                        initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    env.step(td.set("action", torch.tensor([[2.0, 3.0], [0.0, 1.0]])))
    with pytest.raises(ValueError, match=r"env 0: expected indices in \[0, nvec\)"):
        env.step(td.set("action", torch.tensor([[2.7, 0.25], [0.0, 1.0]])))


def test_an_action_adapter_ignores_frozen_rows_actions_as_the_base_env_does():
    seen = []
    table = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])

    def adapt(action):
        seen.append(action.clone())
        return table[action]

    env = make_world_model_env(_Recorder(), _BOX2, gym.spaces.Discrete(3), num_envs=2, initial_state=torch.zeros(2),
                               action_transform_fn=adapt, model_action_space=_BOX2)
    td = env.reset()
    env.step(td.set("action", torch.tensor([2, -1])).set("_step", torch.tensor([True, False])))
    assert seen[-1].tolist() == [2, 0]  # the frozen row's -1 never reached table[...]
    with pytest.raises(ValueError, match="ActionAdapter: the outside action of env 1"):
        env.step(td.set("_step", torch.tensor([True, True])))


def test_start_states_from_a_2d_buffer_go_through_the_buffers_transform():
    from torchrl.envs import ObservationNorm

    obs = torch.arange(30, dtype=torch.float32).reshape(2, 5, 3)
    box = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    for ndim in (1, 2):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100, ndim=ndim),
                                    transform=ObservationNorm(loc=1000.0, scale=1.0, in_keys=["observation"]))
        rb.extend(TensorDict({"observation": obs}, [2, 5]) if ndim == 2 else TensorDict({"observation": obs.reshape(
            10, 3)}, [10]))
        env = WorldModelEnv(CountingModel(5), box, ACT1, num_envs=8, start_states=rb, seed=0)
        starts = env.reset()["observation"]
        assert (starts >= 1000).all(), ndim  # as rb[i] returns it, transformed


def test_start_states_from_split_trajectories_skip_its_padding():
    from torchrl.collectors.utils import split_trajectories

    pool_like = TensorDict({"observation": torch.arange(1, 25, dtype=torch.float32).reshape(8, 3),
                            ("next", "done"): torch.tensor([0, 1, 0, 0, 1, 0, 0, 1], dtype=torch.bool).view(8, 1),
                            "traj_ids": torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])}, [8])
    data = split_trajectories(pool_like, trajectory_key="traj_ids")
    assert "mask" in data.keys() and not data["mask"].all()
    box = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    env = WorldModelEnv(CountingModel(5), box, ACT1, num_envs=32, start_states=data, seed=0)
    assert (env.reset()["observation"].abs().sum(-1) > 0).all()


def test_the_batched_start_note_also_with_state_key_and_an_encoder():
    for kwargs in ({"state_key": "observation"}, {"encode_fn": lambda obs: obs}):
        with pytest.raises(ReturnFormError, match="one unbatched start"):
            counting_env(num_envs=4, initial_state=torch.zeros(4, 3), **kwargs).reset()


def test_nan_float_indices_are_refused_and_a_mask_observation_is_not_padding():
    from torchrl.data import Categorical

    env = WorldModelEnv(_Recorder(), _BOX2, Categorical(4, dtype=torch.float32), num_envs=2,
                        initial_state=torch.zeros(2), seed=0)
    td = env.reset()
    with pytest.raises(ValueError, match=r"env 0: expected an index in \[0, 4\), got nan"):
        env.step(td.set("action", torch.tensor([float("nan"), 2.0])))
    # a Dict observation with a bool "mask" of the batch shape: data, not split_trajectories padding
    space = Composite(x=Unbounded((1,)), mask=Unbounded((), dtype=torch.bool))
    door = torch.tensor([[True, False, False, False, False], [False, True, False, False, False]])
    data = TensorDict({"x": torch.arange(10.0).reshape(2, 5, 1), "mask": door, "traj_ids": torch.zeros(2, 5)},
                      [2, 5])
    env = WorldModelEnv(lambda s, a: s, space, _BOX2, num_envs=32, start_states=data, seed=0)
    assert len(set(env.reset()["x"].view(-1).tolist())) > 2  # not only the two entries whose "mask" is True


def test_start_states_whose_padding_mask_selects_nothing_are_refused_at_construction():
    data = TensorDict({"observation": torch.zeros(2, 3, 3), ("collector", "mask"): torch.zeros(2, 3, dtype=torch.bool),
                       ("collector", "traj_ids"): torch.zeros(2, 3)}, [2, 3])
    with pytest.raises(ValueError, match="padding mask .* selects no entry"):
        WorldModelEnv(CountingModel(5), gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), ACT1, num_envs=2,
                      start_states=data, seed=0)


def test_an_adapter_parameter_named_for_another_argument_is_refused_not_misbound():
    # by count, transition_fn(model, action) fits (state, action), reward_fn(model, obs, action) fits
    # (state, obs, action) and reset_fn(options) fits (model): each named parameter would get another argument
    model = nn.Linear(2, 2)

    def transition(model, action):
        return action

    with pytest.raises(AdapterError, match=r"transition\(model, action\): parameter 'model' would receive the state"):
        WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=transition)

    def reset_fn(options):
        return torch.zeros(2)

    with pytest.raises(AdapterError, match=r"reset_fn\(options\): parameter 'options' would receive the model.*"
                                           r"reset_fn\(seed, options\)"):
        WorldModelEnv(model, BOX2, BOX2, num_envs=2, reset_fn=reset_fn, transition_fn=lambda s, a: s + a)

    def reward_fn(model, obs, action):
        return obs.sum(-1)

    with pytest.raises(AdapterError, match=r"reward_fn\(model, obs, action\): parameter 'model' would receive the "
                                           r"state"):  # at construction, as every adapter's signature
        make_world_model_env(model, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                             transition_fn=lambda s, a: (s + a, s + a, None), reward_fn=reward_fn)

    def swapped(action, state):
        return state + action

    with pytest.raises(AdapterError, match=r"parameter 'action' would receive the state"):
        WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=swapped)
    # names the convention does not know, or that agree with it, bind as before
    for fn, form in ((lambda s, a: s + a, ("state", "action")), (lambda m, s, a: s + a, ("model", "state", "action")),
                     (lambda model, state, action: state + action, ("model", "state", "action"))):
        env = WorldModelEnv(model, BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=fn)
        assert env._transition.form == form


class PosteriorEncoder(nn.Module):
    """An RSSM-style posterior ``encode(obs, prev_state, prev_action)``: not callable as ``encode(obs)``."""

    def encode(self, obs, prev_state, prev_action):
        return obs + prev_state

    def imagine_step(self, state, action):
        return state + action, state + action, state.sum(-1)


def test_a_model_encode_of_another_signature_is_an_error_only_when_an_observation_must_be_encoded():
    # initial_state= never encodes: the env builds and runs
    env = WorldModelEnv(PosteriorEncoder(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2))
    assert env.rollout(3)["next", "observation"].shape == (2, 3, 2)
    # initial_observation= must be encoded into the start state: the error says how to proceed
    with pytest.raises(AdapterError, match=r"model.encode.*fits none of the accepted calling conventions.*needed to "
                                           r"encode an observation.*encode_fn=False"):
        WorldModelEnv(PosteriorEncoder(), BOX2, BOX2, num_envs=2, initial_observation=torch.zeros(2))
    # encode_fn=True asks for model.encode: refused at once
    with pytest.raises(AdapterError, match=r"model.encode"):
        WorldModelEnv(PosteriorEncoder(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), encode_fn=True)
    env = WorldModelEnv(PosteriorEncoder(), BOX2, BOX2, num_envs=2, initial_observation=torch.ones(2), encode_fn=False)
    assert torch.equal(env.reset()["observation"], torch.ones(2, 2))


def test_a_batched_initial_state_tensordict_is_refused_at_construction():
    state = TensorDict({"deter": torch.zeros(3, 2), "stoch": torch.zeros(3, 2)}, batch_size=[3])
    with pytest.raises(ValueError, match=r"initial_state: one env's state, broadcast to every env; got a TensorDict "
                                         r"with batch_size \[3\]"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=state, initial_observation=torch.zeros(2),
                      transition_fn=lambda s, a: (s, s["deter"] + a, None))
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=state[0], initial_observation=torch.zeros(2),
                        transition_fn=lambda s, a: (s, s["deter"] + a, None))
    assert env.rollout(2)["next", "observation"].shape == (3, 2, 2)


def test_a_decoder_on_a_batch_unlocked_env_is_probed_with_a_batch():
    # a decoder takes a batch: the unlocked env's spec (no batch dim) is probed as a batch of one
    box, act = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)

    def step(state, action):
        return {"state": torch.tanh(state + action.sum(-1, keepdim=True))}

    def decoder(obs):  # indexes the batch dim
        return ((obs[:, :2] + 1) * 127).round().to(torch.uint8).unsqueeze(-1).expand(-1, 2, 4).clone()

    env = make_world_model_env(object(), box, act, num_envs=None, state_key="observation",
                               initial_state=torch.zeros(3), transition_fn=step, decoder=decoder)
    assert env.observation_spec["pixels"].shape == (2, 4) and env.observation_spec["pixels"].dtype == torch.uint8
    td = env.reset(TensorDict(batch_size=[5]))
    assert td["pixels"].shape == (5, 2, 4) and (td["pixels"] == 127).all()
    td["action"] = torch.full((5, 2), 0.5)
    assert env.step(td)["next", "pixels"].shape == (5, 2, 4)


@pytest.mark.parametrize("bs", [(), (3,), (2, 3)])
def test_a_sampling_decoder_on_a_batch_unlocked_env_resets_episodes_of_any_batch(bs):
    # its rows are merged by TorchRL, not by the decoder: a (2, 3, 1) "_reset" was refused as a mask of the wrong
    # shape, and batch () compared the mask against the pixels' first dim
    box, act = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)

    def decoder(obs, generator=None):
        return obs + torch.rand(obs.shape, generator=generator, device=obs.device)

    env = make_world_model_env(object(), box, act, num_envs=None, state_key="observation", initial_state=torch.ones(2),
                               transition_fn=lambda state, action: state + action, max_episode_steps=4, decoder=decoder)
    td = env.reset(TensorDict(batch_size=bs))
    td = env.rollout(10, tensordict=td, auto_reset=False, break_when_any_done=False,
                     policy=lambda td: td.set("action", torch.ones(*bs, 2)))
    assert td.shape == (*bs, 10)
    truncated = td["next", "truncated"].reshape(-1, 10)
    assert (truncated == torch.tensor([t % 4 == 3 for t in range(10)])).all()
    obs = td["observation"].reshape(-1, 10, 2)
    assert (obs[:, :, 0] == torch.tensor([1.0 + t % 4 for t in range(10)])).all()  # restarted at each limit
    assert ((td["pixels"] - td["observation"]).abs() < 1).all()


@pytest.mark.parametrize("action, space", [
    (torch.tensor([0.0, 1, 2, 0]), gym.spaces.Discrete(3)),  # a float index
    (torch.tensor([[0], [1], [2], [0]]), gym.spaces.Discrete(3)),  # an (N, 1) index
    (torch.tensor([[1, 2, 0]] * 4), gym.spaces.MultiDiscrete([2, 3])),  # the wrong width
])
def test_an_adapted_env_checks_the_outside_action_before_the_adapter_sees_it(action, space):
    calls = []

    def adapt(a):
        calls.append(a)
        return a.float().sum(-1, keepdim=True) if a.ndim > 1 else a.float().unsqueeze(-1)

    env = make_world_model_env(object(), BOX2, space, num_envs=4, initial_state=torch.zeros(2),
                               transition_fn=lambda s, a: s + a, action_transform_fn=adapt,
                               model_action_space=gym.spaces.Box(-9, 9, (1,), np.float32))
    td = env.reset()
    with pytest.raises(ValueError, match=r"ActionAdapter: the outside action: expected dtype torch.int64 and shape "
                                         rf"\({4}, ?{'2' if space.shape else ''}\)"):
        env.step(td.set("action", action))
    assert not calls  # refused before action_transform_fn ran


class _EncodingStepper(nn.Module):
    """``encode(obs) = 100 * obs`` (a start state apart from the observation); ``step(state, action)``."""

    def encode(self, obs):
        return obs * 100

    def step(self, state, action):
        nxt = state + action
        return nxt, nxt, state[:, :1]


def test_state_key_naming_the_observation_refuses_a_start_state_apart_from_it():
    # the first step reads the observation back as the state: an encoded or separate start state would be lost
    kw = dict(num_envs=2, state_key="observation", seed=0)
    data = TensorDict(observation=torch.ones(10, 2), batch_size=[10])
    with pytest.raises(SpecError, match=r"state_key='observation' declares that the observation is the state, but "
                                        r"start_states would be encoded.*encode_fn=False"):
        WorldModelEnv(_EncodingStepper(), BOX2, BOX2, start_states=data, **kw)
    with pytest.raises(SpecError, match=r"initial_observation would be encoded"):
        WorldModelEnv(_EncodingStepper(), BOX2, BOX2, initial_observation=torch.ones(2), **kw)
    with pytest.raises(SpecError, match=r"pass initial_state= or initial_observation=, not both"):
        WorldModelEnv(_EncodingStepper(), BOX2, BOX2, initial_state=torch.full((2,), 7.0),
                      initial_observation=torch.ones(2), **kw)
    with pytest.raises(ReturnFormError, match=r"with a state apart from the observation"):
        WorldModelEnv(object(), BOX2, BOX2, reset_fn=lambda num_envs: (torch.zeros(num_envs, 2), torch.ones(num_envs, 2)),
                      transition_fn=lambda s, a: s + a, encode_fn=False, **kw).reset()
    # the observation as the start state is fine: encode_fn=False, or no encoder at all
    env = WorldModelEnv(_EncodingStepper(), BOX2, BOX2, start_states=data, encode_fn=False, **kw)
    td = env.reset().set("action", torch.ones(2, 2))
    assert env.step(td)["next", "observation"].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_frozen_rows_build_no_graph_unless_the_env_is_differentiable():
    # a caller's state that requires grad (replayed latents from an encoder): the frozen-row selects ran with grad
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: s + a)
    td = env.reset()
    td["observation"] = torch.ones(3, 2, requires_grad=True)
    td["action"] = torch.ones(3, 2)
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = env.step(td)["next"]
    assert not out["observation"].requires_grad and not env.state.requires_grad
    assert out["observation"].tolist() == [[2.0, 2.0], [1.0, 1.0], [2.0, 2.0]]


def test_a_step_mask_before_the_first_reset_is_a_clear_error():
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: s + a)
    td = TensorDict(observation=torch.ones(2, 2), action=torch.ones(2, 2), _step=torch.tensor([[True], [False]]),
                    batch_size=[2])
    with pytest.raises(RuntimeError, match=r"'_step' mask freezes rows.*has not been reset yet"):
        env.step(td)
    td.pop("_step")
    assert env.step(td)["next", "observation"].tolist() == [[2.0, 2.0], [2.0, 2.0]]  # every row: fine


@pytest.mark.parametrize("key", ["info", "next", "action", "reward", "_private"])
def test_dict_observation_keys_that_torchrl_writes_itself_are_refused(key):
    space = gym.spaces.Dict({"pos": BOX2, key: BOX2})
    with pytest.raises(SpecError, match=rf"observation_space: Dict keys \['{key}'\] clash with keys"):
        WorldModelEnv(object(), space, BOX2, num_envs=2, initial_state={"pos": torch.zeros(2), key: torch.zeros(2)},
                      transition_fn=lambda s, a: s)


def _reset_without_arguments():
    return torch.zeros(2)


def _add(state, action):
    return state + action


def _ones_policy(td):
    return td.set("action", torch.ones(*td.batch_size, 2))


def _reset_with_the_model_only(model):
    return torch.zeros(2)


class _KeepsItsOwnState(nn.Module):
    """``step(action)``: the model keeps its state (discovered as ``method(action)``)."""

    def __init__(self):
        super().__init__()
        self.h = torch.zeros(3, 2)

    def step(self, action):
        self.h = self.h + action
        return self.h, self.h, self.h[:, :1]


@pytest.mark.parametrize("case", ["reset_fn()", "reset_fn(model)", "model.step(action)", "deferred encode"])
def test_envs_with_prefix_adapters_or_deferred_errors_pickle(case):
    import pickle

    kw = dict(num_envs=3, seed=0)
    if case == "reset_fn()":
        env = WorldModelEnv(nn.Linear(2, 2), BOX2, BOX2, reset_fn=_reset_without_arguments,
                            transition_fn=_add, **kw)
    elif case == "reset_fn(model)":
        env = WorldModelEnv(nn.Linear(2, 2), BOX2, BOX2, reset_fn=_reset_with_the_model_only,
                            transition_fn=_add, **kw)
    elif case == "model.step(action)":
        env = WorldModelEnv(_KeepsItsOwnState(), BOX2, BOX2, initial_state=torch.zeros(2), **kw)
    else:
        env = WorldModelEnv(PosteriorEncoder(), BOX2, BOX2, initial_state=torch.zeros(2), **kw)
    copy_ = pickle.loads(pickle.dumps(env))
    expected = env.rollout(3, _ones_policy)["next", "observation"]
    assert torch.equal(copy_.rollout(3, _ones_policy)["next", "observation"], expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"device 'cuda': CUDA is not available here"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=_add,
                      device="cuda")
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2), transition_fn=_add)
    with pytest.raises(RuntimeError, match=r"CUDA is not available here"):
        env.to("cuda")


@pytest.mark.parametrize("with_truncated", [False, True])
def test_step_flags_are_separate_tensors(with_truncated):
    """An in-place write to next's done (a caller ending an episode early) leaves terminated, and the
    flags the env keeps for frozen rows, alone; so does a write to terminated for done."""

    def transition(state, action):
        out = {"state": state + 1, "terminated": state[:, 0] > 100}
        if with_truncated:
            out["truncated"] = state[:, 0] > 200
        return out

    env = WorldModelEnv(object(), OBS3, ACT1, num_envs=3, initial_state=torch.zeros(3), transition_fn=transition)
    td = env.reset()
    td["action"] = torch.zeros(3, 1)
    nxt = env.step(td)["next"]
    flags = [nxt["done"], nxt["terminated"], nxt["truncated"]]
    assert len({t.untyped_storage().data_ptr() for t in flags}) == 3
    nxt["done"][0] = True
    assert not nxt["terminated"].any() and not nxt["truncated"].any()
    # a frozen row keeps the flags the env computed, not the caller's write
    step = torch.tensor([False, True, True]).unsqueeze(-1)
    td2 = env.step(TensorDict({"action": torch.zeros(3, 1), "_step": step}, batch_size=[3]))["next"]
    assert not td2["terminated"].any() and not td2["done"].any()


@pytest.mark.parametrize("state_key", ["latent", "observation"])
def test_state_key_is_an_input_so_parallel_env_hands_the_callers_state_to_the_worker(state_key):
    # TorchRL's ParallelEnv sends its workers only the input spec's keys: a state read back from the
    # tensordict must be declared in state_spec, or an edited state is silently replaced by the worker's own
    from torchrl.envs import ParallelEnv
    from wm_models import make_counting_env

    env = make_counting_env(3, state_key=state_key)
    assert list(env.state_spec.keys()) == [state_key]
    check_env_specs(env)
    parallel = ParallelEnv(1, functools.partial(make_counting_env, 3, state_key=state_key))
    try:
        for e in (env, parallel):
            td = e.reset()
            td[state_key] = torch.full_like(td[state_key], 7.0)  # start from the caller's state: t = 7
            td["action"] = e.action_spec.zero() + 1
            out = e.step(td)["next"]
            assert out[state_key][..., 0].flatten().tolist() == [8.0, 8.0, 8.0]
    finally:
        if not parallel.is_closed:
            parallel.close()


def _bonus_on_even_steps(state, action):
    # state = [t, length]: the episode of a row ends at t == length; "bonus" is reported on even steps only
    t = state[:, :1] + 1
    info = {"bonus": t[:, 0] * 10} if int(t[0, 0]) % 2 == 0 else {}
    return {"state": torch.cat([t, state[:, 1:]], -1), "reward": torch.zeros(len(t), 1),
            "terminated": t >= state[:, 1:], "info": info}


def test_declared_info_keys_get_presence_masks_false_where_the_model_omitted_them():
    """As an EnvPool's declared keys: a declared key the model did not return reads 0 with its
    ("info_mask", key) False, never a made-up 0 that looks reported."""
    env = WorldModelEnv(object(), gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(2), num_envs=3,
                        initial_state=torch.tensor([0.0, 100.0]), transition_fn=_bonus_on_even_steps,
                        info_spec={"bonus": torch.zeros(())})
    assert env.observation_spec["info_mask", "bonus"].shape == (3, 1)
    check_env_specs(env)
    td = env.reset()
    assert not td["info_mask", "bonus"].any()  # a constant start reports no info
    td["action"] = env.action_spec.zero()
    for t in range(1, 5):
        td = env.step(td)
        assert td["next", "info_mask", "bonus"].flatten().tolist() == [t % 2 == 0] * 3
        assert td["next", "info", "bonus"].flatten().tolist() == [10.0 * t if t % 2 == 0 else 0.0] * 3
        td = env.step_mdp(td)
    # a partial reset clears the reset row's mask (its start reported nothing) and keeps the others'
    td["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(td)
    assert out["info_mask", "bonus"].flatten().tolist() == [True, False, True]
    assert out["info", "bonus"].flatten().tolist() == [40.0, 0.0, 40.0]


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_an_info_key_the_model_omits_is_absent_from_the_export_as_on_sync_vector_env(mode):
    from torchrl_swm import to_gymnasium

    class Twin(gym.Env):  # the same dynamics as a gymnasium env
        observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, length):
            self.length = length

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.array([0, self.length], np.float32), {}

        def step(self, action):
            self.t += 1
            info = {"bonus": np.float32(10 * self.t)} if self.t % 2 == 0 else {}
            return np.array([self.t, self.length], np.float32), 0.0, self.t >= self.length, False, info

    ours = to_gymnasium(
        WorldModelEnv(object(), Twin.observation_space, Twin.action_space, num_envs=2, transition_fn=_bonus_on_even_steps,
                      initial_state=torch.tensor([0.0, 4.0]), info_spec={"bonus": torch.zeros(())}, seed=0),
        autoreset_mode=mode,
    )
    ref = gym.vector.SyncVectorEnv([functools.partial(Twin, 4)] * 2, autoreset_mode=ours.autoreset_mode)
    out, out_ref = ours.reset(seed=0), ref.reset(seed=0)
    assert out[1] == out_ref[1] == {}
    for t in range(12):
        action = np.zeros(2, np.int64)
        out, out_ref = ours.step(action), ref.step(action)
        assert np.array_equal(out[0], out_ref[0]) and np.array_equal(out[2], out_ref[2]), f"step {t}"
        info = {k: v for k, v in out[4].items() if k not in ("final_obs", "_final_obs", "final_info", "_final_info")}
        info_ref = {k: v for k, v in out_ref[4].items() if k not in ("final_obs", "_final_obs", "final_info", "_final_info")}
        assert info.keys() == info_ref.keys(), f"step {t}: {out[4]} vs {out_ref[4]}"
        for key in info:
            np.testing.assert_array_equal(info[key], info_ref[key])
        if "final_info" in out_ref[4]:
            assert out[4]["final_info"].keys() == out_ref[4]["final_info"].keys()
        if mode == "disabled" and out[2].any():
            assert ours.reset(options={"reset_mask": out[2].copy()})[1] == {}
            ref.reset(options={"reset_mask": out[2].copy()})


# -------------------------------------------------------------------------------------------------
# row selects: torch.where / masked_fill semantics on both sides of the CPU index path's threshold
# -------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    n=st.sampled_from([1, 3, 255, 256, 257, 600]),
    row=st.sampled_from([(), (1,), (64,), (2, 40)]),
    done_shape=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]),
    data=st.data(),
)
def test_row_selects_match_torch_where_and_masked_fill(n, row, done_shape, dtype, data):
    from torchrl_swm.world_model import _tree

    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    density = data.draw(st.sampled_from([0.0, 0.03, 0.5, 1.0]))
    flat = torch.rand(n, generator=gen) < density
    mask = flat.unsqueeze(-1) if done_shape else flat
    new, old = (torch.randn(n, *row, generator=gen).mul(50).to(dtype) for _ in range(2))
    old = old.transpose(-1, -2).contiguous().transpose(-1, -2) if len(row) == 2 else old  # strided rows too
    expected = torch.where(flat.view(n, *([1] * len(row))), new, old)
    got = _tree.where_rows(mask, new, old)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert got.data_ptr() not in (new.data_ptr(), old.data_ptr())  # a new tensor: the inputs stay as they were
    tree = _tree.where_rows(mask, {"a": new, "b": (new, TensorDict({"c": new}, [n]))},
                            {"a": old, "b": (old, TensorDict({"c": old}, [n]))})
    assert all(torch.equal(t, expected) for t in (tree["a"], tree["b"][0], tree["b"][1]["c"]))
    zeroed = _tree.zero_rows(mask, old)
    assert torch.equal(zeroed, old.masked_fill(flat.view(n, *([1] * len(row))), 0))
    assert zeroed.data_ptr() != old.data_ptr()


class _CountingRows:
    """A per-row loop of ``CountingModel``: state ``[t, 0, last action]``, reward = action, the episode ends at
    ``t == length[i]`` (terminated, or truncated); a row left out of "_step" keeps its obs and flags and reports
    reward 0; a reset row restarts at ``[0, 0, 0]`` with its flags False."""

    def __init__(self, lengths, truncate):
        self.lengths, self.truncate, self.n = lengths, truncate, len(lengths)
        self.rows = [None] * len(lengths)
        for i in range(len(lengths)):
            self.reset(i)

    def reset(self, i):
        self.rows[i] = {"t": 0, "a": 0.0, "r": 0.0, "term": False, "trunc": False}

    def step(self, i, a):
        t = self.rows[i]["t"] + 1
        end = t >= self.lengths[i]
        self.rows[i] = {"t": t, "a": a, "r": a, "term": end and not self.truncate, "trunc": end and self.truncate}

    def freeze(self, i):
        self.rows[i] = {**self.rows[i], "r": 0.0}

    def done(self, i):
        return self.rows[i]["term"] or self.rows[i]["trunc"]

    def assert_matches(self, td, where, with_reward=True):
        for i, row in enumerate(self.rows):
            obs = td["observation"][i].tolist()
            assert obs == [row["t"], 0.0, row["a"]], (where, i, obs, row)
            flags = [bool(td[key][i].item()) for key in ("terminated", "truncated", "done")]
            assert flags == [row["term"], row["trunc"], self.done(i)], (where, i, flags, row)
            if with_reward:
                assert td["reward"][i].item() == row["r"], (where, i, td["reward"][i].item(), row)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(1, 5), truncate=st.booleans())
def test_any_sequence_of_reset_and_step_masks_matches_a_per_row_loop(data, n, truncate):
    """Any mix of "_reset" masks, full resets, "_step" masks, step and step_and_maybe_reset over rows of
    different episode lengths: every output equals the per-row loop (a frozen row keeps its obs and flags and
    reports reward 0; only the rows a reset selects restart from the initial state)."""
    lengths = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    env = WorldModelEnv(CountingModel(torch.tensor(lengths, dtype=torch.float32), truncate=truncate), OBS3, ACT1,
                        num_envs=n, initial_state=torch.zeros(3))
    ref = _CountingRows(lengths, truncate)
    masks = st.one_of(st.lists(st.booleans(), min_size=n, max_size=n), st.just([True] * n), st.just([False] * n))
    actions = st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=n, max_size=n)
    plan = data.draw(st.lists(st.tuples(st.one_of(st.none(), st.just("full"), masks), st.one_of(st.none(), masks),
                                        st.sampled_from(["step", "smr"]), actions), min_size=5, max_size=20))
    drive_against_reference(env, ref, plan, as_action=lambda action: torch.tensor(action).unsqueeze(-1))


def test_row_selects_keep_the_graph_of_a_differentiable_state():
    from torchrl_swm.world_model import _tree

    new = torch.randn(600, 64, requires_grad=True)
    old = torch.randn(600, 64, requires_grad=True)
    mask = torch.zeros(600, 1, dtype=torch.bool)
    mask[::7] = True
    _tree.where_rows(mask, new, old).sum().backward()
    assert torch.equal(new.grad, mask.expand(600, 64).float())
    assert torch.equal(old.grad, (~mask).expand(600, 64).float())
    old.grad = None
    _tree.zero_rows(mask, old).sum().backward()
    assert torch.equal(old.grad, (~mask).expand(600, 64).float())


def test_reset_fn_gets_the_env_seed_at_the_first_reset_after_seeding():
    # as a gymnasium env's reset gets it: seed= / set_seed reach the next reset_fn call once, then None;
    # reset(seed=) wins. A reset_fn sampling with np.random.default_rng(seed) is then reproducible
    seen = []

    def reset_fn(seed, options, num_envs):
        seen.append(seed)
        return torch.as_tensor(np.random.default_rng(seed).normal(size=(num_envs, 4)), dtype=torch.float32)

    def start(env, **kwargs):
        return env.reset(**kwargs)["observation"]

    make = functools.partial(WorldModelEnv, NoisyModel(), BOX4, FORCE, num_envs=3, reset_fn=reset_fn)
    a, b = make(seed=7), make(seed=7)
    assert torch.equal(start(a), start(b)) and seen == [7, 7]
    start(a)
    assert seen[-1] is None  # later resets continue, as gymnasium's reset(seed=None)
    a.set_seed(11)
    b.set_seed(11)
    assert torch.equal(start(a), start(b)) and seen[-2:] == [11, 11]
    start(a, seed=3)
    assert seen[-1] == 3
    # a partial reset after seeding gets it too (the rows it restarts)
    a.set_seed(5)
    td = a.reset()
    assert seen[-1] == 5
    td["_reset"] = torch.tensor([[True], [False], [False]])
    a.reset(td)
    assert seen[-1] is None
    unseeded = make(seed=None)
    start(unseeded)
    assert seen[-1] is None


def test_adapters_without_a_readable_signature_get_the_arguments_without_the_model():
    # C builtins (torch.tanh), TorchScript functions and torch.compile'd modules: none takes the model
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    env = make_world_model_env(PointMass(), BOX4, action_space, num_envs=3, initial_state=torch.zeros(4),
                               action_transform_fn=torch.tanh, seed=0)
    td = env.reset()
    td["action"] = torch.full((3, 2), 0.5)
    assert env.step(td)["next", "observation"].shape == (3, 4)

    class Step(nn.Module):
        def forward(self, state, action):
            nxt = state + action.sum(-1, keepdim=True)
            return nxt, nxt, torch.ones(state.shape[0])  # (state, obs, reward)

    scripted = torch.jit.script(Step())
    for transition in (scripted, torch.compile(Step(), backend="eager")):
        env = WorldModelEnv(object(), BOX4, FORCE, num_envs=3, initial_state=torch.zeros(4),
                            transition_fn=transition, seed=0)
        td = env.reset()
        td["action"] = torch.ones(3, 2)
        out = env.step(td)["next"]
        assert out["observation"][:, 0].tolist() == [2.0, 2.0, 2.0] and out["reward"].view(-1).tolist() == [1.0] * 3
    # a builtin that cannot take these arguments: an AdapterError naming the role, not a bare TypeError
    env = WorldModelEnv(PointMass(), BOX4, FORCE, num_envs=3, initial_state=torch.zeros(4), transition_fn=torch.tanh)
    td = env.reset()
    td["action"] = torch.ones(3, 2)
    with pytest.raises(AdapterError, match=r"transition_fn \S*tanh\(\.\.\.\) called as transition_fn\(state, action\) "
                                           r"\(its signature cannot be read.*raised TypeError"):
        env.step(td)


def test_max_episode_steps_takes_numpy_integers_and_names_a_bad_value():
    for steps in (np.int64(5), torch.tensor(5)):
        env = make_world_model_env(PointMass(), BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4),
                                   max_episode_steps=steps)
        rollout = env.rollout(6, break_when_any_done=False)
        assert rollout["next", "truncated"][:, 4].all() and not rollout["next", "truncated"][:, :4].any()
    with pytest.raises(TypeError, match=r"max_episode_steps: expected an int, got float 2.5"):
        make_world_model_env(PointMass(), BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4), max_episode_steps=2.5)
    with pytest.raises(ValueError, match=r"max_episode_steps: expected an int >= 1, got 0"):
        make_world_model_env(PointMass(), BOX4, FORCE, num_envs=2, initial_state=torch.zeros(4), max_episode_steps=0)


def test_an_initial_state_of_python_numbers_is_named():
    with pytest.raises(TypeError, match=r"initial_state\[0\]: expected tensors or arrays \(a state's leaves\), got "
                                        r"float 0.0; a list or tuple is a state of several tensors"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=[0.0, 0.0], transition_fn=lambda s, a: s + a)
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=np.zeros(2, np.float32),
                        transition_fn=lambda s, a: s + a)  # an array is one tensor
    assert env.reset()["observation"].shape == (2, 2)
    # numpy leaves of a dict state are tensors-to-be too
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="s", initial_observation=torch.zeros(2),
                        initial_state={"h": np.zeros(2, np.float32)},
                        transition_fn=lambda s, a: {"state": {"h": s["h"] + a}, "observation": s["h"] + a})
    assert env.reset()["s", "h"].shape == (2, 2)
    for state, where, got in (((np.float32(0.0), np.zeros(2)), r"initial_state\[0\]", "float32.*a list or tuple is"),
                              ({"name": "x"}, r"initial_state\['name'\]", "str 'x'$"),
                              (0.0, "initial_state", r"float 0.0; pass it as a tensor, e.g. torch.tensor\(value\)$"),
                              ({"h": np.float64(0.0)}, r"initial_state\['h'\]", "float.*; pass it as a tensor")):
        with pytest.raises(TypeError, match=rf"{where}: expected tensors or arrays \(a state's leaves\), got {got}"):
            WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="s", initial_observation=torch.zeros(2),
                          initial_state=state, transition_fn=lambda s, a: s)


@pytest.mark.parametrize("batch", [(), (1,), (3,), (2, 3)])
def test_a_batch_unlocked_env_gives_model_encoder_and_adapters_rows_whatever_the_batch(batch):
    # the contract: (N, ...) rows. A batch () is one row (check_env_specs, rollout), (2, 3) is six
    seen = {}
    box, act = gym.spaces.Box(-9, 9, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)

    def record(name, *values):
        seen.setdefault(name, set()).update(tuple(v.shape) for v in values)

    def transition(state, action):  # indexes the row dim, as the README's model does
        record("transition", state, action)
        nxt = state + action[:, :1]
        return nxt, nxt, None  # (state, obs, reward): no reward, reward_fn gives it

    def reward_fn(state, obs, action):
        record("reward_fn", state, obs, action)
        return state[:, 0] + action[:, 1]

    def terminal_fn(state, obs, action):
        record("terminal_fn", state, obs, action)
        return state[:, 0] > 100

    def adapt(action):
        record("action_transform_fn", action)
        return torch.cat((action[:, :1], -action[:, :1]), -1)

    def decoder(obs):
        record("decoder", obs)
        return obs[:, :2] * 10

    env = make_world_model_env(object(), box, act, num_envs=None, state_key="observation",
                               initial_state=torch.tensor([1.0, 2.0, 3.0]),
                               transition_fn=transition, reward_fn=reward_fn, terminal_fn=terminal_fn,
                               action_transform_fn=adapt, model_action_space=act, decoder=decoder)
    assert env.observation_spec["pixels"].shape == (2,)  # the decoder's probe: a batch of one
    seen.clear()
    td = env.reset(TensorDict(batch_size=batch))
    actions = torch.arange(2 * max(1, int(np.prod(batch))), dtype=torch.float32).reshape(*batch, 2) / 10
    td["action"] = actions
    out = env.step(td)["next"]
    rows = int(np.prod(batch))
    for name in ("transition", "reward_fn", "terminal_fn", "action_transform_fn", "decoder"):
        assert {shape[0] for shape in seen[name]} == {rows}, (name, seen[name])
        assert all(len(shape) == 2 for shape in seen[name]), (name, seen[name])
    expected = torch.tensor([1.0, 2.0, 3.0]).expand(*batch, 3) + actions[..., :1]
    torch.testing.assert_close(out["observation"], expected)
    # reward_fn sees the model's action (action_transform_fn's (a0, -a0))
    torch.testing.assert_close(out["reward"], expected[..., :1] - actions[..., :1])
    torch.testing.assert_close(out["pixels"], expected[..., :2] * 10)
    assert out.batch_size == batch and out["done"].shape == (*batch, 1) and not out["done"].any()
    if batch == ():
        check_env_specs(env)


@pytest.mark.parametrize("batch", [(), (2, 3)])
def test_a_batch_unlocked_env_encodes_a_constant_start_as_rows(batch):
    shapes = []

    def encode(obs):
        shapes.append(tuple(obs.shape))
        return obs[:, :1] + 1

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="latent",
                        state_spec=gym.spaces.Box(-9, 9, (1,), np.float32),
                        initial_observation=torch.tensor([1.0, 5.0]), encode_fn=encode,
                        transition_fn=lambda s, a: {"state": s + a[:, :1], "observation": a * s})
    td = env.reset(TensorDict(batch_size=batch))
    assert shapes == [(int(np.prod(batch)), 2)]
    assert td["latent"].shape == (*batch, 1) and (td["latent"] == 2).all()
    td["action"] = torch.ones(*batch, 2)
    nxt = env.step(td)["next"]
    assert (nxt["latent"] == 3).all() and (nxt["observation"] == 2).all()


def test_a_state_read_back_from_the_tensordict_is_checked_before_the_model_runs():
    calls = []

    def transition(state, action):
        calls.append(state)
        return {"state": state + 1, "observation": state[..., :2] + 1}

    # the observation is the state (the planner setup): a wrong width or dtype is the caller's, named as such
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation",
                        initial_state=torch.zeros(2), transition_fn=lambda s, a: s + a)
    for bad in (torch.zeros(4, 3), torch.zeros(4, 2, dtype=torch.float64)):
        td = TensorDict(observation=bad, action=torch.zeros(4, 2), batch_size=[4])
        with pytest.raises(ValueError, match=r"input tensordict's state 'observation'.*expected dtype torch.float32, "
                                             r"shape \(4, 2\)"):
            env.step(td)
    # a state of its own, with a spec: a (4, 1) latent the model would broadcast is refused, not accepted
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="latent",
                        state_spec=gym.spaces.Box(-9, 9, (2,), np.float32), initial_state=torch.zeros(2),
                        initial_observation=torch.zeros(2), transition_fn=transition)
    for bad in (torch.zeros(4, 1), torch.zeros(4, 2, dtype=torch.float64)):
        td = TensorDict(latent=bad, observation=torch.zeros(4, 2), action=torch.ones(4, 2), batch_size=[4])
        with pytest.raises(ValueError, match=r"input tensordict's state.*state_key='latent'.*shape \(4, 2\)"):
            env.step(td)
    assert calls == []
    # a locked env reading its state back: the same check on every step (the env's own outputs pass)
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, state_key="latent",
                        state_spec=gym.spaces.Box(-9, 9, (2,), np.float32), initial_state=torch.zeros(2),
                        initial_observation=torch.zeros(2), transition_fn=transition)
    assert env.rollout(4)["next", "latent"][:, -1].eq(4).all()
    td = env.reset()
    td["latent"] = td["latent"][:, :1]
    td["action"] = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="state_key='latent'"):
        env.step(td)


def test_an_observation_transform_with_keys_of_its_own_keeps_the_state_read_back():
    from torchrl.envs import ObservationNorm

    def plus_one(state, action):
        nxt = state + 1.0 + 0 * action
        return {"state": nxt, "reward": nxt[..., :1].clone()}

    one = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    for out_keys, rewards in ((["observation_norm"], [1.0, 2.0, 3.0, 4.0]), (None, [1.0, 11.0, 111.0, 1111.0])):
        base = WorldModelEnv(object(), one, one, num_envs=2, initial_state=torch.zeros(1), state_key="observation",
                             transition_fn=plus_one, seed=0)
        env = TransformedEnv(base, ObservationNorm(loc=0.0, scale=10.0, in_keys=["observation"], out_keys=out_keys))
        out = env.rollout(4, break_when_any_done=False)
        # with keys of its own the model's state is untouched; in place, the normalised observation is the state
        assert out["next", "reward"][0, :, 0].tolist() == pytest.approx(rewards)


def test_a_cloned_adapter_transform_binds_to_the_env_it_is_cloned_into():
    # the binding holds its env's model and generator: a clone in another env must not keep the first env's
    box = gym.spaces.Box(-9, 9, (2,), np.float32)

    class Model:
        def __init__(self, scale):
            self.scale = scale

    def base(seed, scale):
        return WorldModelEnv(Model(scale), box, box, num_envs=2, initial_state=torch.zeros(2), seed=seed,
                             transition_fn=lambda s, a: (s + a, s + a, None))

    def reward_fn(model, state, obs, action, generator):
        return model.scale * torch.randn(state.shape[0], generator=generator)

    def decoder(model, obs):
        return obs * model.scale

    adapters = [RewardAdapter(reward_fn), ObservationDecoder(decoder, in_key="observation", out_key="pixels")]
    first = TransformedEnv(base(0, 1.0), adapters[0])
    first.append_transform(adapters[1])
    first.rollout(2)
    second_base = base(1, 10.0)
    second = TransformedEnv(second_base, adapters[0].clone())
    second.append_transform(adapters[1].clone())
    reference = TransformedEnv(base(1, 10.0), RewardAdapter(reward_fn))
    reference.append_transform(ObservationDecoder(decoder, in_key="observation", out_key="pixels"))
    torch.manual_seed(0)
    got = second.rollout(3)
    torch.manual_seed(0)
    expected = reference.rollout(3)
    assert torch.equal(got["next", "reward"], expected["next", "reward"])
    assert torch.equal(got["next", "pixels"], expected["next", "pixels"])
    assert torch.equal(got["next", "pixels"], got["next", "observation"] * 10)


def test_hand_built_adapter_transforms_pass_their_own_model_first():
    """An adapter transform's model= is what its fn receives first (the base env's model is only the default)."""

    class Model:
        def __init__(self, scale):
            self.scale = scale

    base = WorldModelEnv(Model(1.0), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2),
                         transition_fn=lambda s, a: s + a)
    other = Model(10.0)
    env = TransformedEnv(base, Compose(
        ActionAdapter(lambda model, a: a * model.scale, FORCE, model=other),
        RewardAdapter(lambda model, s, o, a: torch.full((s.shape[0],), model.scale), model=other),
        TerminalAdapter(lambda model, s, o, a: torch.full((s.shape[0],), model.scale > 5), model=other),
    ))
    out = env.step(env.reset().set("action", torch.full((2, 2), 0.1)))["next"]
    assert out["observation"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert out["reward"].view(-1).tolist() == [10.0, 10.0]
    assert out["terminated"].view(-1).tolist() == [True, True]


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_row_merging_keeps_state_identity_and_nested_tensordicts(batch):
    # a TensorDict return whose state is its observation stays one tensor through the (B, C) <-> rows round trip
    def as_td(s, a):
        n = s + a
        return TensorDict(state=n, observation=n, reward=n[..., :1], batch_size=[])

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=as_td)
    td = env.reset(TensorDict(batch_size=batch)).set("action", torch.ones(*batch, 2))
    assert (env.step(td)["next", "observation"] == 1).all()

    # a dict state holding a TensorDict of its own batch reaches an adapter as rows too
    def nested(s, a):
        h = s["inner"]["h"] + a
        return {"state": {"inner": TensorDict(h=h, batch_size=[h.shape[0]])}, "observation": h}

    base = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="latent", transition_fn=nested,
                         initial_state={"inner": {"h": torch.zeros(2)}}, initial_observation=torch.zeros(2))
    env = TransformedEnv(base, RewardAdapter(lambda state, obs, action: state["inner"]["h"][:, 0] * 2))
    td = env.reset(TensorDict(batch_size=batch)).set("action", torch.ones(*batch, 2))
    assert env.step(td)["next", "reward"].tolist() == torch.full((*batch, 1), 2.0).tolist()

    # a TensorDict state of batch [num_envs] from reset_fn (an RSSM kept as a TensorDict) gets the caller's batch
    # back, no extra dim, and steps
    def td_reset(seed, options, num_envs=None):
        h = torch.arange(num_envs * 2.0).view(num_envs, 2)
        return TensorDict(h=h, batch_size=[num_envs]), h

    def td_step(state, action):
        h = state["h"] + action
        return TensorDict(h=h, batch_size=state.batch_size), h, h[:, 0]

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="latent", reset_fn=td_reset,
                        transition_fn=td_step, state_spec={"h": Unbounded(shape=(2,))})
    td = env.reset(TensorDict(batch_size=batch))
    start = torch.arange(2.0 * int(np.prod(batch))).view(*batch, 2)
    assert td["latent"].batch_size == batch and torch.equal(td["latent", "h"], start)
    assert torch.equal(td["observation"], start)
    nxt = env.step(td.set("action", torch.ones(*batch, 2)))["next"]
    assert nxt["latent"].batch_size == batch and torch.equal(nxt["latent", "h"], start + 1)
    assert torch.equal(nxt["observation"], start + 1) and torch.equal(nxt["reward"], start[..., :1] + 1)

    # one dict returned as both the state and a Dict observation, with numpy leaves: still one object after the
    # round trip, so the state is converted with the observation
    def same_dict(state, action):
        s = {"a": (state["a"] + action).numpy()}
        return s, s, 1.0

    dict_box = gym.spaces.Dict({"a": gym.spaces.Box(-99, 99, (2,), np.float32)})
    env = WorldModelEnv(object(), dict_box, BOX2, num_envs=None, initial_state={"a": torch.zeros(2)},
                        state_key="latent", state_spec=dict_box, transition_fn=same_dict)
    td = env.reset(TensorDict(batch_size=batch)).set("action", torch.ones(*batch, 2))
    nxt = env.step(td)["next"]
    assert type(nxt["latent", "a"]) is torch.Tensor and torch.equal(nxt["latent", "a"], torch.ones(*batch, 2))
    assert torch.equal(nxt["a"], torch.ones(*batch, 2))  # a Dict observation's entries are top-level keys


def test_a_state_read_back_may_be_any_tensor_a_parameter_or_a_memory_mapped_one():
    from tensordict import MemoryMappedTensor

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: (s + a).detach())
    starts = (torch.zeros(3, 2), nn.Parameter(torch.zeros(3, 2)), MemoryMappedTensor.from_tensor(torch.zeros(3, 2)))
    for start in starts:
        td = TensorDict(observation=start, action=torch.ones(3, 2), batch_size=[3])
        assert (env.step(td)["next", "observation"] == 1).all()


def _add_action(state, action):
    return state + action, state + action, None


def _first_state_entry(state, obs, action, generator):
    return state[:, 0].clone()


def test_an_env_with_adapter_transforms_pickles_after_it_has_stepped():
    # as ParallelEnv sends it to its workers: the adapters' bindings (to this process's env) are not pickled
    import copy
    import pickle

    env = make_world_model_env(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                               transition_fn=_add_action, reward_fn=_first_state_entry)
    env.rollout(2)  # binds the reward adapter to this env
    for again in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        out = again.rollout(3, break_when_any_done=False)
        # the copy's adapter reads the copy's state, not the original's
        assert torch.equal(out["next", "reward"][..., 0], out["next", "observation"][..., 0])


def _three_row_env():
    return WorldModelEnv(object(), BOX2, FORCE, num_envs=3, initial_state=torch.zeros(2),
                         transition_fn=lambda s, a: s + a)


def test_row_step_counter_keeps_frozen_rows_counts_in_a_batch_of_any_rank():
    # a SerialEnv of model envs has batch (workers, N); TorchRL freezes whole workers with a "_step" mask
    from torchrl.envs import SerialEnv

    from torchrl_swm.world_model import RowStepCounter

    for base in (_three_row_env(), SerialEnv(2, _three_row_env)):
        env = TransformedEnv(base, RowStepCounter(max_steps=3))
        td = env.reset()
        mask = torch.zeros(*env.batch_size, 1, dtype=torch.bool)
        mask[0] = True  # the first row, or the first worker's rows
        for _ in range(3):
            td = env.step(td.set("action", torch.ones(*env.batch_size, 2)).set("_step", mask))["next"].clone()
        frozen = ~mask.squeeze(-1)
        assert (td["observation"][frozen] == 0).all()  # never stepped
        assert (td["step_count"][frozen] == 0).all() and not td["truncated"][frozen].any()
        assert (td["step_count"][~frozen] == 3).all() and td["truncated"][~frozen].all()
        base.close()


def test_a_closed_world_model_env_refuses_steps_until_a_full_reset_reopens_it():
    # it kept stepping after close(); TorchRL's Collector closes its env itself once it reaches total_frames, and
    # TorchRL's batched envs restart at their next reset: a full reset reopens it (rollout, a new Collector)
    import copy

    env = counting_env(2, length=100)
    td = env.reset()
    assert [batch.numel() for batch in Collector(env, None, frames_per_batch=4, total_frames=8)] == [4, 4]
    assert env.is_closed  # closed by the collector at total_frames, with no shutdown() from the caller
    calls = env.model.calls
    for use in (lambda: env.rand_step(td), lambda: env.state, lambda: env.step_and_maybe_reset(env.rand_action(td)),
                lambda: env.reset(reset_td(2, [1]))):  # a partial reset would keep rows whose state is gone
        with pytest.raises(RuntimeError, match=r"WorldModelEnv is closed .*total_frames, or an export's, "
                                               r"to_gymnasium\(env\)\.close\(\).*reset\(\) every row"):
            use()
    assert env.model.calls == calls
    env.close()  # closing again is harmless
    assert "WorldModelEnv(num_envs=2" in repr(env) and type(copy.deepcopy(env)) is WorldModelEnv
    rollout = env.rollout(3)  # resets first: reopened, from the start
    assert not env.is_closed and rollout["next", "observation"][:, :, 0].tolist() == [[1.0, 2.0, 3.0]] * 2
    assert [batch.numel() for batch in Collector(env, None, frames_per_batch=4, total_frames=4)] == [4]
    export = to_gymnasium(counting_env(2, length=100))
    export.reset(seed=0)
    export.close()
    with pytest.raises(RuntimeError, match=r"WorldModelEnv is closed"):
        export.step(np.ones((2, 1), np.float32))
    assert export.reset(seed=0)[0][:, 0].tolist() == [0.0, 0.0]
    assert export.step(np.ones((2, 1), np.float32))[0][:, 0].tolist() == [1.0, 1.0]


def _drift_transition(state, action):
    nxt = state + action
    return {"state": nxt, "reward": nxt.sum(-1), "terminated": nxt[:, 0] > 2.5}


def _drift_env(num_envs, wrapped):
    kwargs = dict(num_envs=num_envs, state_key="observation", transition_fn=_drift_transition,
                  initial_state=torch.zeros(2))
    if wrapped:  # make_world_model_env's TransformedEnv goes through TorchRL's step of its own
        return make_world_model_env(None, BOX2, BOX2, reward_fn=lambda s, o, a: s.sum(-1), **kwargs)
    return WorldModelEnv(None, BOX2, BOX2, **kwargs)


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "make_world_model_env"])
def test_a_batch_unlocked_env_keeps_the_rows_a_step_mask_freezes_as_a_locked_one(wrapped):
    # TorchRL rebuilds an unlocked env's frozen rows from zeros: observation (here the state), action and
    # flags all 0, and the row's next step would restart from a zero state
    locked, unlocked = _drift_env(4, wrapped), _drift_env(None, wrapped)
    assert not unlocked.batch_locked
    outs = []
    for env in (locked, unlocked):
        td = env.reset(TensorDict({}, [4]))
        td["observation"] = torch.arange(8.0).view(4, 2) / 10
        steps = []
        for t, frozen in enumerate(([1], [0, 3], [], [0, 1, 2, 3], [2])):
            td["action"] = torch.full((4, 2), 0.25 + t / 10)
            mask = torch.ones(4, 1, dtype=torch.bool)
            mask[frozen] = False
            td["_step"] = mask
            out = env.step(td)
            steps.append(out.exclude("_step").clone())  # TorchRL keeps the mask in a locked env's output only
            td = env.step_mdp(out)
        outs.append(torch.stack(steps))
    expected, got = outs
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        torch.testing.assert_close(got[key], expected[key], msg=lambda m: f"{key}: {m}")
    # row 1, frozen at the first step: it keeps its observation, reward 0, then resumes from it
    assert got["next", "observation"][0, 1].tolist() == pytest.approx([0.2, 0.3])
    assert got["next", "reward"][0, 1].item() == 0.0
    assert got["next", "observation"][1, 1].tolist() == pytest.approx([0.55, 0.65])


def test_a_batch_unlocked_env_freezes_rows_of_any_batch_shape_and_in_rollouts():
    env = _drift_env(None, False)
    td = env.reset(TensorDict({}, [2, 3]))
    td["observation"] = torch.arange(12.0).view(2, 3, 2) / 10
    td["action"] = torch.ones(2, 3, 2)
    rows = torch.tensor([[True, False, True], [False, True, True]])
    for mask in (rows, rows.unsqueeze(-1)):
        out = env.step(td.clone().set("_step", mask))
        torch.testing.assert_close(out["next", "observation"][rows], td["observation"][rows] + 1)
        torch.testing.assert_close(out["next", "observation"][~rows], td["observation"][~rows])
        assert out["next", "reward"][~rows].eq(0).all() and out["next", "reward"][rows].ne(0).all()
    # every row frozen: nothing steps
    out = env.step(td.clone().set("_step", torch.zeros(2, 3, dtype=torch.bool)))
    torch.testing.assert_close(out["next", "observation"], td["observation"])
    # TorchRL's rollout freezes finished rows with "_step": the same rollout as a batch-locked env's
    rollouts = []
    for env in (_drift_env(None, False), _drift_env(3, False)):
        start = env.reset(TensorDict({}, [3]))
        start["observation"] = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
        policy = lambda td: td.set("action", torch.full((3, 2), 0.5))  # noqa: E731
        rollouts.append(env.rollout(8, policy, auto_reset=False, tensordict=start, break_when_any_done=False,
                                    break_when_all_done=True))
    assert rollouts[0].batch_size == rollouts[1].batch_size == (3, 6)
    for key in rollouts[1].keys(True, True):
        torch.testing.assert_close(rollouts[0][key], rollouts[1][key], msg=lambda m: f"{key}: {m}")


def test_a_batch_unlocked_partial_step_names_what_a_frozen_row_lacks_and_a_bad_mask():
    env = _drift_env(None, False)
    td = TensorDict({"observation": torch.zeros(3, 2), "action": torch.ones(3, 2)}, [3])
    with pytest.raises(KeyError, match=r"freezes rows, which keep their values .*"
                                       r"has no \['terminated', 'truncated', 'done'\]"):
        env.step(td.clone().set("_step", torch.tensor([True, False, True])))
    with pytest.raises(ValueError, match=r"'_step' mask: expected a bool tensor of the tensordict's batch shape "
                                         r"\(3,\) \(or \(3, 1\)\).*got Tensor\(dtype=torch.int64"):
        env.step(td.clone().set("_step", torch.tensor([1, 0, 1])))


def test_a_batch_unlocked_partial_step_sends_gradients_to_the_stepped_rows_only():
    env = WorldModelEnv(None, BOX2, BOX2, num_envs=None, state_key="observation", transition_fn=_drift_transition,
                        initial_state=torch.zeros(2), differentiable=True)
    td = env.reset(TensorDict({}, [3]))
    action = torch.ones(3, 2, requires_grad=True)
    td["action"] = action
    td["_step"] = torch.tensor([True, False, True])
    env.step(td)["next", "observation"].sum().backward()
    assert action.grad.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]


@pytest.mark.parametrize("with_spec", [False, True])
def test_a_namedtuple_state_under_state_key_is_refused_with_what_to_do(with_spec):
    # a tensordict entry cannot be a namedtuple: state_spec= does not help, a dict state or state_key=None does
    from collections import namedtuple

    Pos = namedtuple("Pos", "pos vel")
    kwargs = {"state_spec": {"pos": BOX2, "vel": BOX2}} if with_spec else {}
    with pytest.raises((SpecError, ReturnFormError), match=r"(?s)state_key must be a tensor, a dict or a TensorDict.*"
                                                           r"got Pos.*namedtuple state cannot be an entry of a "
                                                           r"tensordict: return it as a dict"):
        WorldModelEnv(None, BOX2, BOX2, num_envs=3, state_key="latent", initial_observation=torch.zeros(2),
                      transition_fn=lambda s, a: (s, s.pos, s.pos.sum(-1)),
                      initial_state=Pos(torch.zeros(2), torch.zeros(2)), **kwargs).reset()


def test_a_model_in_another_dtype_than_the_spaces_fails_with_a_note_saying_so():
    class Linear64(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Linear(4, 2)

        def forward(self, state, action):
            nxt = self.f(torch.cat([state, action], -1))
            return nxt, nxt, nxt.sum(-1)

    env = WorldModelEnv(Linear64().double(), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2))
    with pytest.raises(RuntimeError, match="dtype") as caught:  # the model's own error, its type unchanged
        env.rollout(2)
    assert any("the model's floating parameters are torch.float64, but its state and action are torch.float32"
               in note for note in caught.value.__notes__)
    # a model that casts its inputs itself is fine: no error, no note; nor a note on its errors of other kinds
    env = WorldModelEnv(Linear64().double(), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2),
                        transition_fn=lambda m, s, a: tuple(x.float() for x in m(s.double(), a.double())))
    assert env.rollout(2)["next", "observation"].dtype == torch.float32
    env = WorldModelEnv(Linear64().double(), BOX2, FORCE, num_envs=2, initial_state=torch.zeros(2),
                        transition_fn=lambda m, s, a: m(s.double(), a[:, :1].double()))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as caught:
        env.rollout(2)
    assert not any("floating parameters" in note for note in caught.value.__notes__)  # only the call's own note
    assert len(caught.value.__notes__) == 1
    assert caught.value.__notes__[0].startswith("WorldModelEnv: raised inside transition_fn ")

    # the encoder, called while the env is built, gets the note too
    class Encoder64(Linear64):
        def encode(self, obs):
            return self.f(torch.cat([obs, obs], -1))

    with pytest.raises(RuntimeError, match="dtype") as caught:
        WorldModelEnv(Encoder64().double(), BOX2, FORCE, num_envs=2, encode_fn=True,
                      initial_observation=torch.zeros(2))
    assert any("the model's floating parameters are torch.float64, but its observation is torch.float32" in note
               for note in caught.value.__notes__)


class _RaisedInside(Exception):
    """An error of the user's own code, raised inside an adapter."""


_T32 = "Tensor(dtype=torch.float32, shape=(3, 2))"
_ADAPTER_INPUTS = {  # the role -> what its note says it was given, for a batch of 3
    "transition_fn": f"state={_T32}, action={_T32}",
    "reset_fn": "seed=None, options=dict()",
    "reward_fn": f"state={_T32}, obs={_T32}, action={_T32}",
    "terminal_fn": f"state={_T32}, obs={_T32}, action={_T32}",
    "decoder": f"obs={_T32}",
    "action_transform_fn": f"action={_T32}",
    "encode_fn": f"obs={_T32}",
}


@pytest.mark.parametrize("error", [_RaisedInside, ReturnFormError], ids=["users-error", "ReturnFormError"])
@pytest.mark.parametrize("role", sorted(_ADAPTER_INPUTS))
def test_an_error_raised_inside_an_adapter_is_kept_with_one_note_naming_the_call_and_its_batch(role, error):
    """The adapter's own exception reaches the caller as raised (same object and type, its traceback ending in
    the user's code, nothing chained), with exactly one note: which adapter, that it is called once for the
    whole batch, and the shapes it was given. The package's own ReturnFormError already says all that: no note."""
    raised = []

    def fail(*args, **kwargs):
        raised.append(error("inside the adapter"))
        raise raised[-1]

    kwargs = dict(num_envs=3, initial_state=torch.zeros(2), transition_fn=lambda s, a: (s + a, s + a, None))
    if role == "transition_fn":
        kwargs["transition_fn"] = lambda state, action: fail()
    elif role == "reset_fn":
        del kwargs["initial_state"]
        kwargs["reset_fn"] = lambda seed, options: fail()
    elif role in ("reward_fn", "terminal_fn"):
        kwargs["transition_fn"] = lambda s, a: {"state": s + a}
        kwargs[role] = lambda state, obs, action: fail()
    elif role == "decoder":
        kwargs.update(decoder=lambda obs: fail(), decoder_spec=BOX2)  # a spec: no probe
    elif role == "action_transform_fn":
        kwargs.update(action_transform_fn=lambda action: fail(), model_action_space=BOX2)  # no probe
    else:
        del kwargs["initial_state"]
        kwargs.update(encode_fn=lambda obs: fail(), initial_observation=torch.zeros(2))
    with pytest.raises(error) as caught:
        make_world_model_env(object(), BOX2, BOX2, **kwargs).rollout(2)
    err = caught.value
    assert err is raised[-1] and type(err) is error and str(err) == "inside the adapter" and err.__cause__ is None
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "fail"
    if error is ReturnFormError:
        assert not getattr(err, "__notes__", None)
        return
    [note] = err.__notes__
    assert note.startswith(f"WorldModelEnv: raised inside {role} ")
    assert note.endswith(f", called once for the whole batch (3,), given {_ADAPTER_INPUTS[role]}"), note


# -------------------------------------------------------------------------------------------------
# wrong data and aliasing found by mutation testing (E2)
# -------------------------------------------------------------------------------------------------


def test_a_transition_that_writes_to_its_mask_changes_neither_the_callers_step_mask_nor_the_frozen_rows():
    """The transition's mask= is the env's copy of "_step": a model using it as scratch must not unfreeze a row."""

    def transition(state, action, mask):
        nxt = state + action
        mask.fill_(True)
        return {"state": nxt, "observation": nxt, "reward": nxt[:, 0]}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition)
    td = env.reset().set("action", torch.ones(3, 2)).set("_step", torch.tensor([[True], [False], [True]]))
    out = env.step(td)["next"]
    assert td["_step"].view(-1).tolist() == [True, False, True]
    assert out["reward"].view(-1).tolist() == [1.0, 0.0, 1.0] and out["observation"][1].tolist() == [0.0, 0.0]


def test_a_model_keeping_its_own_state_gets_the_stepped_rows_as_its_mask_and_frozen_rows_keep_their_info():
    """The transition's mask= is True for the rows stepped (a model keeping its own state advances only those),
    and a row frozen by "_step" keeps its info with its observation (README "Frozen rows"); review R3 M17, M22."""

    class OwnCounts:  # a discovered model.step(action, mask): the env never passes it a state
        def reset(self):
            self.count = torch.zeros(3)
            return torch.zeros(3, 2)

        def step(self, action, mask=None):
            self.count = self.count + mask.float()
            obs = torch.stack([self.count, self.count], -1)
            return obs, obs[:, 0], torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool), {}

    env = WorldModelEnv(OwnCounts(), BOX2, BOX2, num_envs=3)
    td = env.reset().set("action", torch.zeros(3, 2)).set("_step", torch.tensor([[True], [False], [True]]))
    td = env.step_mdp(env.step(td))
    td.pop("_step")
    out = env.step(td.set("action", torch.zeros(3, 2)))["next"]
    assert out["observation"][:, 0].tolist() == [2.0, 1.0, 2.0] and env.model.count.tolist() == [2.0, 1.0, 2.0]

    def transition(state, action):
        nxt = state + action
        return nxt, nxt[:, 0], torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool), {"x": nxt[:, 0]}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition,
                        info_spec={"x": torch.zeros(())})
    td = env.step_mdp(env.step(env.reset().set("action", torch.ones(3, 2))))
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = env.step(td.set("action", torch.ones(3, 2)))["next"]
    assert out["observation"][:, 0].tolist() == [2.0, 1.0, 2.0]
    assert out["info", "x"].view(-1).tolist() == [2.0, 1.0, 2.0]  # the frozen row's is its last step's
    assert out["info_mask", "x"].all()


def test_a_row_frozen_at_the_step_limit_keeps_truncated():
    """RowStepCounter: a row whose count reached max_steps, then frozen by "_step", still reads truncated (and
    done): wait-mode evaluation and rollout(break_when_all_done=True) rely on it; review R3 M35."""
    from torchrl_swm.world_model import RowStepCounter

    base = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.zeros(2),
                         transition_fn=lambda s, a: s + a)
    env = TransformedEnv(base, RowStepCounter(max_steps=1))
    td = env.step_mdp(env.step(env.reset().set("action", torch.zeros(2, 2))))  # both rows at the limit
    assert td["truncated"].all()
    td["_step"] = torch.tensor([[False], [True]])
    out = env.step(td.set("action", torch.zeros(2, 2)))["next"]
    assert out["step_count"].view(-1).tolist() == [1, 2]
    assert out["truncated"].view(-1).tolist() == [True, True] and out["done"].view(-1).tolist() == [True, True]


def test_a_partial_reset_with_an_encoder_shows_the_datas_observation_when_obs_and_state_are_one_tensor():
    """A transition returning one tensor as obs and state must not make a restarted row's obs its encoding."""

    def transition(state, action):
        nxt = state + action
        return nxt, nxt, nxt[:, 0], torch.zeros(nxt.shape[0], 1, dtype=torch.bool), False, {}

    data = TensorDict({"observation": torch.ones(4, 2)}, [4])
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, start_states=data, encode_fn=lambda obs: obs * 10,
                        transition_fn=transition)
    nxt = env.step_mdp(env.step(env.reset().set("action", torch.zeros(3, 2))))
    out = env.reset(nxt.set("_reset", torch.tensor([[True], [False], [False]])))
    assert out["observation"][0].tolist() == [1.0, 1.0] and env.state[0].tolist() == [10.0, 10.0]


def test_a_row_frozen_by_step_keeps_the_encoders_observation_when_obs_and_state_are_one_tensor():
    """A transition returning one tensor as obs and state must not make a frozen row's obs its encoded state."""
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_observation=torch.tensor([1.0, 2.0]),
                        encode_fn=lambda obs: obs * 10, transition_fn=lambda s, a: s + a)
    td = env.reset().set("action", torch.ones(2, 2)).set("_step", torch.tensor([[True], [False]]))
    out = env.step(td)["next"]
    assert out["observation"].tolist() == [[11.0, 21.0], [1.0, 2.0]] and env.state[1].tolist() == [10.0, 20.0]


def test_a_partial_reset_from_a_constant_start_shows_initial_observation_when_obs_and_state_are_one_tensor():
    """Given initial_state= and initial_observation=, a restarted row shows initial_observation, as a full reset."""
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=torch.tensor([10.0, 20.0]),
                        initial_observation=torch.tensor([1.0, 2.0]), transition_fn=lambda s, a: s + a)
    nxt = env.step_mdp(env.step(env.reset().set("action", torch.ones(2, 2))))
    out = env.reset(nxt.set("_reset", torch.tensor([[True], [False]])))
    assert out["observation"].tolist() == [[1.0, 2.0], [11.0, 21.0]] and env.state[0].tolist() == [10.0, 20.0]


def test_a_batch_unlocked_frozen_row_reports_reward_zero_even_with_a_reward_at_the_root():
    """An unlocked env's frozen rows report reward 0, not the root "reward" of td = env.step(td)["next"]."""
    env = _drift_env(None, False)
    td = env.reset(TensorDict({}, [3])).set("action", torch.ones(3, 2))
    td = env.step(td)["next"]  # the reward (2.0 per row) stays at the root
    td["action"] = torch.ones(3, 2)
    td["_step"] = torch.tensor([[True], [False], [True]])
    out = env.step(td)["next"]
    assert out["reward"].view(-1).tolist() == [4.0, 0.0, 4.0]


def test_the_zero_reward_and_false_flags_of_one_step_are_not_shared_with_the_next_step():
    """Placeholders for a model without reward/flags are new each step: writing one step's must not reach the next."""
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2),
                        transition_fn=lambda s, a: {"state": s + a, "observation": s + a})
    out = env.step(env.reset().set("action", torch.ones(3, 2)))
    second = env.step(env.step_mdp(out).set("action", torch.ones(3, 2)))["next"]
    out["next", "truncated"][0] = True
    out["next", "reward"][1] = 5.0
    assert not second["truncated"].any() and second["reward"].view(-1).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("length", [1, torch.tensor([1, 5, 5])], ids=["all_rows_restart", "some_rows_restart"])
def test_the_fused_roots_flags_after_a_restart_are_separate_tensors(length):
    """After step_and_maybe_reset restarts all or some rows, writing the root's done leaves terminated/truncated."""
    env = counting_env(3, length=length)
    _, root = env.step_and_maybe_reset(env.reset().set("action", torch.ones(3, 1)))
    root["done"][1] = True
    assert not root["terminated"].any() and not root["truncated"].any()


def test_the_fused_root_copies_the_inputs_sub_tensordicts_as_step_mdp_does():
    """A write into the next root's ("collector", ...) sub-td must not reach the step output returned before."""
    env = counting_env(3, length=100)
    td = env.reset().set("action", torch.ones(3, 1))
    td["collector"] = TensorDict({"traj_ids": torch.arange(3)}, [3])
    out, root = env.step_and_maybe_reset(td)
    root["collector", "traj_ids"] = torch.tensor([7, 8, 9])
    root["collector", "new"] = torch.zeros(3)
    assert out["collector", "traj_ids"].tolist() == [0, 1, 2] and list(out["collector"].keys()) == ["traj_ids"]


def test_a_batch_unlocked_reset_from_start_states_draws_from_the_reset_generator_only():
    """README: resets draw from env.reset_generator, steps from env.generator: an unlocked reset too."""
    data = TensorDict({"observation": torch.randn(20, 4, generator=torch.Generator().manual_seed(5))}, [20])
    env = WorldModelEnv(NoisyModel(), BOX4, FORCE, num_envs=None, seed=3, state_key="observation",
                        start_states=data, encode_fn=False)
    step_state, reset_state = env.generator.get_state(), env.reset_generator.get_state()
    env.reset(TensorDict({}, [4]))
    assert torch.equal(env.generator.get_state(), step_state)
    assert not torch.equal(env.reset_generator.get_state(), reset_state)


@pytest.mark.parametrize("seed", [0, 1000, 2**31 + 5])
def test_a_seeds_reset_stream_is_not_the_model_stream_of_a_seed_a_fixed_offset_away(seed):
    """A CPU generator keeps 32 bits of its seed: a reset generator seeded at a fixed offset from the model
    generator's seed would draw what the model generator of the seed that offset away draws (two collector workers
    seeded that far apart would share a stream)."""
    env, again = (WorldModelEnv(NoisyModel(), BOX4, FORCE, num_envs=2, seed=seed, initial_state=torch.zeros(4))
                  for _ in range(2))
    assert torch.equal(env.reset_generator.get_state(), again.reset_generator.get_state())  # one stream per seed
    twin = torch.Generator().manual_seed((seed + 0x9E3779B97F4A7C15) % 2**32)
    torch.randint(-(2**63), 2**63 - 1, (), generator=twin)  # the draw seeding makes from the reset stream
    assert not torch.equal(torch.rand(16, generator=env.reset_generator), torch.rand(16, generator=twin))


def test_reset_with_the_same_seed_gives_the_same_start_states_starts_again():
    """reset(seed=s) restarts the per-row start_states counters, so the same seed gives the same starts."""
    data = TensorDict({"observation": torch.arange(40.0).view(20, 2)}, [20])
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, start_states=data, encode_fn=False,
                        transition_fn=lambda s, a: (s + a, s + a))
    assert torch.equal(env.reset(seed=3)["observation"], env.reset(seed=3)["observation"])


def test_a_reset_whose_mask_selects_every_row_is_a_full_reset():
    """An all-True "_reset" is reset(): a model stepping in float64 restarts in the start's float32 either way."""

    def transition(state, action):
        nxt = state.double() + action.double()
        return {"state": nxt, "observation": nxt.float(), "reward": nxt[:, 0].float()}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition)
    nxt = env.step_mdp(env.step(env.reset().set("action", torch.ones(3, 2))))
    assert env.state.dtype == torch.float64
    env.reset(nxt.set("_reset", torch.ones(3, 1, dtype=torch.bool)))
    assert env.state.dtype == torch.float32 and env.state.tolist() == [[0.0, 0.0]] * 3


def test_a_reset_whose_mask_selects_no_row_calls_no_reset_fn_and_keeps_the_seed_pending():
    """An all-False "_reset" restarts nothing: no reset_fn(num_envs=0) call, and the seed waits for a real reset."""
    calls = []

    def reset_fn(seed, num_envs):
        calls.append((seed, num_envs))
        return torch.zeros(num_envs, 2)

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, reset_fn=reset_fn, transition_fn=lambda s, a: (s + a, s + a))
    td = env.reset()
    calls.clear()
    env.reset(td.set("_reset", torch.zeros(3, 1, dtype=torch.bool)), seed=7)
    assert calls == []
    env.reset()
    assert calls == [(7, 3)]


def test_the_fused_root_keeps_the_inputs_dim_names_as_step_mdp_does():
    """step_and_maybe_reset's next root keeps the input's dim names, as TorchRL's generic path does."""
    env = counting_env(3, length=100)
    td = env.reset().set("action", torch.ones(3, 1))
    td.refine_names("env")
    assert env.step_and_maybe_reset(td)[1].names == ["env"]


def test_the_reset_hook_reports_done_for_a_truncated_row_it_did_not_restart():
    """env._reset (what transforms' _reset hooks see) gives done = terminated | truncated on the rows it kept."""

    def transition(state, action):
        nxt = state + action
        return {"state": nxt, "reward": nxt[:, 0], "terminated": nxt[:, :1] > 5, "truncated": nxt[:, 1:2] > 0.5}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=transition)
    action = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # rows 0 and 1 truncate
    nxt = env.step_mdp(env.step(env.reset().set("action", action)))
    out = env._reset(nxt.set("_reset", torch.tensor([[True], [False], [False]])))
    assert out["truncated"].view(-1).tolist() == [False, True, False]
    assert out["done"].view(-1).tolist() == [False, True, False]


# -- start_states= refuses what it would ignore (G2's findings 1 and 2) ------------------------------------------


@pytest.mark.parametrize("constant", ["initial_state", "initial_observation"])
def test_start_states_refuse_a_constant_start_that_they_would_ignore(constant):
    """As reset_fn= with start_states=: every start is a sampled entry, so a constant start is refused, not dropped."""
    data = TensorDict({"observation": torch.arange(10.0).view(5, 2)}, [5])
    with pytest.raises(TypeError, match=rf"pass {constant}= or start_states=, not both"):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, start_states=data, transition_fn=_add,
                      **{constant: torch.full((2,), 7.0)})


def test_start_states_with_a_state_key_of_their_own_ask_for_state_spec_not_initial_state():
    data = TensorDict({"observation": torch.arange(10.0).view(5, 2)}, [5])
    kwargs = dict(num_envs=2, state_key="latent", start_states=data, encode_fn=lambda obs: obs * 2, transition_fn=_add)
    for extra in ({}, {"initial_state": torch.zeros(2)}):  # initial_state= would be refused next to start_states=
        with pytest.raises(SpecError, match=r"state_key='latent': pass state_spec=") as err:
            WorldModelEnv(object(), BOX2, BOX2, **kwargs, **extra)
        assert "initial_state" not in str(err.value)
    td = WorldModelEnv(object(), BOX2, BOX2, **kwargs, state_spec=BOX2, seed=0).reset()
    assert torch.equal(td["latent"], td["observation"] * 2)


@pytest.mark.parametrize("batch", [[0], [2, 0]])
def test_start_states_without_any_entry_are_refused_naming_start_states(batch):
    data = TensorDict({"observation": torch.zeros(*batch, 2)}, batch)
    match = r"start_states: .*\(at least one\), got batch " + re.escape(f"torch.Size({batch})")
    with pytest.raises(ValueError, match=match):
        WorldModelEnv(object(), BOX2, BOX2, num_envs=2, start_states=data, transition_fn=_add)


# -- behaviour pinned against G2's surviving mutants ---------------------------------------------------------------


def test_a_differentiable_partial_step_keeps_the_graph_of_the_stepped_rows(device):
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=_drift_transition,
                        differentiable=True, device=device)
    td = env.reset()
    action = torch.ones(3, 2, device=device, requires_grad=True)
    td["action"] = action
    td["_step"] = torch.tensor([[True], [False], [True]], device=device)
    out = env.step(td)["next"]
    assert out["reward"].requires_grad and out["observation"].requires_grad
    out["reward"].sum().backward()
    assert action.grad.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]  # frozen row: reward 0, no gradient


@pytest.mark.parametrize("entries", [2, 3])
def test_a_batch_locked_env_samples_every_start_states_entry_the_last_included(entries, device):
    data = TensorDict({"observation": torch.arange(float(entries))[:, None].expand(entries, 2).clone()}, [entries])
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=64, start_states=data, transition_fn=_add, seed=0,
                        device=device)
    assert sorted(set(env.reset()["observation"][:, 0].tolist())) == list(range(entries))


def test_a_batch_unlocked_env_samples_start_states_entries_with_replacement():
    data = TensorDict({"observation": torch.arange(6.0).view(3, 2)}, [3])
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", start_states=data,
                        encode_fn=False, transition_fn=_add, seed=0)
    starts = env.reset(TensorDict({}, [8]))["observation"]  # more rows than entries
    assert starts.shape == (8, 2) and set(starts[:, 0].tolist()) <= {0.0, 2.0, 4.0}
    repeated = 0
    for seed in range(5):
        env.set_seed(seed)
        repeated += len(set(env.reset(TensorDict({}, [3]))["observation"][:, 0].tolist())) < 3
    assert repeated > 0, "a batch of the data's size never repeated an entry: sampled without replacement"


def _sampling_encode(obs, generator=None):
    return obs + 0.1 * torch.randn(obs.shape, generator=generator, dtype=obs.dtype, device=obs.device)


class _SamplingEncoderNoisyModel(NoisyModel):
    def encode(self, obs, generator=None):
        return _sampling_encode(obs, generator)


@pytest.mark.parametrize("encoder", ["encode_fn", "model.encode"])
def test_a_sampling_start_states_encoder_leaves_the_other_rows_model_noise_alone(encoder, device):
    """README: resets draw from env.reset_generator, steps from env.generator, so a partial reset never changes
    another row's model noise: a start_states encoder given as encode_fn= as well as model.encode."""
    data = TensorDict({"observation": torch.rand(50, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1}, [50])

    def make():
        if encoder == "encode_fn":
            model, kwargs = NoisyModel(done_bias=-5.0), {"encode_fn": _sampling_encode}
        else:
            model, kwargs = _SamplingEncoderNoisyModel(done_bias=-5.0), {}
        return WorldModelEnv(model.to(device), BOX4, FORCE, num_envs=6, start_states=data, seed=3, device=device,
                             **kwargs)

    a, b = make(), make()
    ta, tb = a.reset(), b.reset()
    action = torch.full((6, 2), 0.5, device=device)
    for t in range(5):
        ta, tb = a.step_mdp(a.step(ta.set("action", action))), b.step_mdp(b.step(tb.set("action", action)))
        if t == 1:
            ta = a.reset(ta.set("_reset", reset_td(6, [0])["_reset"].to(device)))
    assert not torch.equal(ta["observation"][0], tb["observation"][0])
    assert torch.equal(ta["observation"][1:], tb["observation"][1:])


def test_detach_state_also_cuts_the_kept_observation_so_truncated_bptt_goes_on_after_a_partial_reset():
    # the observation is not the state: a partial reset takes the other rows' observation from what the env kept
    net = nn.Linear(2, 2)

    def step(state, action):
        nxt = torch.tanh(state + action)
        return {"state": nxt, "observation": 2 * nxt, "reward": nxt.sum(-1)}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=step,
                        differentiable=True, seed=0)
    td = env.reset()
    for chunk in range(2):
        loss = 0
        for t in range(3):
            td = env.step(td.set("action", torch.tanh(net(td["observation"]))))
            loss = loss + td["next", "reward"].sum()
            td = env.step_mdp(td)
        loss.backward()
        env.detach_state()
        td = env.reset(td.detach().set("_reset", torch.tensor([[True], [False], [False]])))
        assert not td["observation"].requires_grad
    assert net.weight.grad.abs().sum() > 0


def test_a_state_spec_inferred_from_initial_state_keeps_each_leafs_dtype():
    def step(state, action):
        nxt = {"h": state["h"] + action, "count": state["count"] + 1}
        return {"state": nxt, "observation": nxt["h"]}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, state_key="latent", transition_fn=step, seed=0,
                        initial_state={"h": torch.zeros(2), "count": torch.zeros(1, dtype=torch.int64)},
                        initial_observation=torch.zeros(2))
    assert env.state_spec["latent", "count"].dtype == torch.int64
    assert env.state_spec["latent", "h"].dtype == torch.float32
    check_env_specs(env, seed=0)
    assert env.rollout(3)["next", "latent", "count"][0].view(-1).tolist() == [1, 2, 3]


@pytest.mark.parametrize("declared, dtype, shape", [
    (torch.zeros((), dtype=torch.int64), torch.int64, ()),
    (gym.spaces.Box(0, 10, (), np.int64), torch.int64, ()),
    (BOX2, torch.float32, (2,)),
], ids=["int example tensor", "int space", "vector space"])
def test_a_declared_info_key_keeps_the_dtype_and_shape_it_was_declared_with(declared, dtype, shape):
    def step(state, action):
        row = torch.arange(len(state)).to(dtype).view(-1, *(1,) * len(shape)).expand(-1, *shape)
        return {"state": state + action, "info": {"k": row}}

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=3, initial_state=torch.zeros(2), transition_fn=step,
                        info_spec={"k": declared}, seed=0)
    spec = env.observation_spec["info", "k"]
    assert (spec.dtype, tuple(spec.shape)) == (dtype, (3, 1, *shape))
    check_env_specs(env, seed=0)
    info = env.rollout(2)["next", "info", "k"]
    assert info.dtype == dtype and tuple(info.shape) == (3, 2, 1, *shape)
    assert info[:, 1].reshape(3, -1)[:, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_a_batch_unlocked_transition_gets_one_mask_flag_per_model_row(batch):
    seen = {}

    def step(state, action, mask=None):
        seen["mask"] = mask.clone()
        return torch.where(mask[:, None], state + action, state)  # a model that keeps the rows its mask leaves out

    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=None, state_key="observation", initial_state=torch.zeros(2),
                        transition_fn=step, seed=0)
    td = env.reset(TensorDict({}, batch)).set("action", torch.ones(*batch, 2))
    out = env.step(td)["next", "observation"]
    rows = int(np.prod(batch))  # the model gets (N, ...) rows whatever the batch
    assert tuple(seen["mask"].shape) == (rows,) and seen["mask"].all()
    assert tuple(out.shape) == (*batch, 2) and bool((out == 1).all())


@pytest.mark.parametrize("form", ["(state, obs, reward)", "6-tuple", "mapping", "dict state"])
def test_a_transition_may_return_its_separate_next_state_as_numpy_arrays(form):
    # README: adapters may return torch tensors or numpy arrays; a step's separate state was the one exception
    # ("next state: expected tensors, ... found ndarray"), though a reset's numpy state was taken (review R5 A1)
    def transition(state, action):
        if form == "dict state":
            nxt = {"h": state["h"].numpy() + 1, "z": state["z"].numpy() * 2}
            return nxt, nxt["h"][:, :2], np.ones(2, np.float32)
        nxt = state.numpy() + 1
        if form == "6-tuple":
            return nxt, nxt[:, :2], np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), {}
        if form == "mapping":
            return {"state": nxt, "obs": nxt[:, :2]}
        return nxt, nxt[:, :2], np.ones(2, np.float32)

    start = {"h": torch.zeros(3), "z": torch.ones(1)} if form == "dict state" else torch.zeros(3)
    env = WorldModelEnv(object(), BOX2, BOX2, num_envs=2, initial_state=start, initial_observation=torch.zeros(2),
                        transition_fn=transition)
    td = env.reset()
    for _ in range(3):
        td = env.step_mdp(env.step(td.set("action", torch.zeros(2, 2))))
    state = env.state
    if form == "dict state":
        assert torch.equal(state["h"], torch.full((2, 3), 3.0)) and torch.equal(state["z"], torch.full((2, 1), 8.0))
    else:
        assert type(state) is torch.Tensor and torch.equal(state, torch.full((2, 3), 3.0))
    assert torch.equal(td["observation"], torch.full((2, 2), 3.0))
    # a frozen row keeps its state, as with tensors
    td = env.step(td.set("action", torch.zeros(2, 2)).set("_step", torch.tensor([[True], [False]])))
    rows = env.state["h"] if form == "dict state" else env.state
    assert rows[:, 0].tolist() == [4.0, 3.0]


@pytest.mark.parametrize("start", ["initial_state", "initial_observation"])
def test_a_float64_numpy_start_is_told_how_to_make_it_float32(start):
    # numpy's default dtype is float64: the first start a gymnasium user writes, np.zeros(4), was refused with no
    # word on how to fix it (review F F4, round 17)
    import gymnasium as gym

    from torchrl_swm import WorldModelEnv

    with pytest.raises(ReturnFormError, match=r"got Tensor\(dtype=torch.float64.*numpy arrays are float64 by default: "
                                              r"pass the start as np.zeros\(\.\.\., np.float32\)"):
        WorldModelEnv(lambda s, a: s, observation_space=gym.spaces.Box(-1, 1, (4,)),
                      action_space=gym.spaces.Box(-1, 1, (2,)), num_envs=3, **{start: np.zeros(4)}).reset()
    env = WorldModelEnv(lambda s, a: s, observation_space=gym.spaces.Box(-1, 1, (4,)),
                        action_space=gym.spaces.Box(-1, 1, (2,)), num_envs=3, **{start: np.zeros(4, np.float32)})
    assert env.reset()["observation"].dtype == torch.float32


def test_the_float64_hint_is_only_for_a_float64_start_refused_for_its_dtype():
    # a float64 start of the wrong shape for a float64 spec: its dtype is right, and no hint is given (review G M1)
    import gymnasium as gym

    from torchrl_swm import WorldModelEnv

    with pytest.raises(ReturnFormError) as err:
        WorldModelEnv(lambda s, a: s, observation_space=gym.spaces.Box(-1, 1, (4,), np.float64),
                      action_space=gym.spaces.Box(-1, 1, (2,)), num_envs=3, initial_state=np.zeros(5)).reset()
    assert "numpy arrays are float64 by default" not in str(err.value)
