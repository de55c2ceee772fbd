"""Edge cases of WorldModelEnv (export reset arguments, frozen rows' infos and step counts, the transition's
``mask=`` extra, unbatched reset infos) and the exports (Dict key order, list options, SB3 render_fps)."""

from __future__ import annotations

import uuid
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.vector import FlattenObservation
from torch import nn
from torchrl.envs import Compose, InitTracker, RewardSum, StepCounter, TransformedEnv

from torchrl_swm import (
    EnvPool,
    WorldModelEnv,
    make_world_model_env,
    register_gymnasium_env,
    to_gymnasium,
    to_sb3_vec_env,
)
from torchrl_swm.export import TorchRLGymEnv
from torchrl_swm.introspect import bookkeeping_keys

BOX1 = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
BOX2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
BOX3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT1 = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
ACT3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def _seeded_obs(seed):
    return torch.randn(3, generator=torch.Generator().manual_seed(0 if seed is None else seed))


def _recording_reset_fn(seen):
    def reset_fn(model, seed, options):
        seen.append((seed, options))
        return _seeded_obs(seed)

    return reset_fn


def _frozen(flags):
    """A ``"_step"`` mask ``(N, 1)``: True for the rows stepped."""
    return torch.tensor([[f] for f in flags])


# -- 1. the export's reset(seed=, options=) reach the WorldModelEnv's reset_fn ---------------------------------------


@pytest.mark.parametrize("transformed", [False, True], ids=["WorldModelEnv", "make_world_model_env"])
def test_vector_export_passes_seed_and_options_to_reset_fn(transformed):
    """to_gymnasium(world model).reset(seed=3, options=...) calls reset_fn(model, 3, options), as the env's own
    reset does (the seed used to arrive as None, options raised); a per-env seed list is refused."""
    seen = []
    make = make_world_model_env if transformed else WorldModelEnv
    env = make(None, BOX3, ACT3, num_envs=2, reset_fn=_recording_reset_fn(seen), transition_fn=lambda s, a: s + a)
    envs = to_gymnasium(env)
    obs, _ = envs.reset(seed=3)
    assert seen[-1] == (3, {})  # the seed design: options={} when none were given
    np.testing.assert_allclose(obs, np.stack([_seeded_obs(3).numpy()] * 2))
    obs, _ = envs.reset(seed=3, options={"level": 1})
    assert seen[-1] == (3, {"level": 1})
    np.testing.assert_allclose(obs[0], _seeded_obs(3).numpy())
    obs, _ = envs.reset(seed=5)
    assert seen[-1] == (5, {})
    np.testing.assert_allclose(obs[1], _seeded_obs(5).numpy())
    calls = len(seen)
    with pytest.raises(ValueError, match=r"WorldModelEnv.*one int.*\[1, 2\]"):
        envs.reset(seed=[1, 2])
    assert len(seen) == calls  # refused before any reset
    envs.close()


def test_single_export_passes_seed_and_options_to_reset_fn():
    """An unbatched world model (num_envs=None) exported as a gymnasium.Env: reset(seed=, options=) reach
    reset_fn and the observation is the seeded one."""
    seen = []
    env = WorldModelEnv(None, BOX3, ACT3, num_envs=None, state_key="observation", reset_fn=_recording_reset_fn(seen),
                        transition_fn=lambda s, a: s + a)
    genv = to_gymnasium(env)
    assert isinstance(genv, TorchRLGymEnv)
    obs, _ = genv.reset(seed=3)
    assert seen[-1] == (3, {})
    np.testing.assert_allclose(obs, _seeded_obs(3).numpy())
    obs, _ = genv.reset(seed=7, options={"level": 2})
    assert seen[-1] == (7, {"level": 2})
    np.testing.assert_allclose(obs, _seeded_obs(7).numpy())
    genv.close()


def _shifting_world_model(state_key="observation"):
    """An unbatched world model whose state is its observation: reset gives ``[0.1, 0.2, 0.3]``, a step adds the
    action (deterministic, so an output that aliases the env's state shows up in the next step)."""
    return WorldModelEnv(None, BOX3, ACT3, num_envs=None, state_key=state_key,
                         reset_fn=lambda seed, options: torch.tensor([0.1, 0.2, 0.3]), transition_fn=lambda s, a: s + a)


@pytest.mark.parametrize("numpy_out", [True, False], ids=["numpy", "torch"])
@pytest.mark.parametrize("edited", ["reset", "step"])
def test_single_export_outputs_are_copies_a_user_may_edit_in_place(edited, numpy_out):
    """The observation reset()/step() return (a numpy array, or a torch tensor with numpy=False) is the caller's:
    normalising it in place does not change the world model's state, so the next step is the same as without the
    edit (the state of a state_key world model is that observation)."""
    genv = to_gymnasium(_shifting_world_model(), numpy=numpy_out)
    action = np.full(3, 0.25, np.float32) if numpy_out else torch.full((3,), 0.25)
    obs, _ = genv.reset(seed=0)
    if edited == "step":
        obs = genv.step(action)[0]
    obs *= 0
    nxt = genv.step(action)[0]
    expected = np.array([0.1, 0.2, 0.3], np.float32) + (0.5 if edited == "step" else 0.25)
    np.testing.assert_allclose(np.asarray(nxt), expected, rtol=1e-6)
    genv.close()


def test_single_export_follows_torchrls_own_step_loop_on_a_world_model():
    """Each step of the gymnasium export continues from the state the previous step reached, as TorchRL's own
    reset/step/step_mdp loop on the same world model does (a state_key model: the state lives in the tensordict)."""
    from wm_models import NoisyModel

    obs_space, act_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)

    def make():
        return WorldModelEnv(NoisyModel(), obs_space, act_space, num_envs=None, state_key="observation", seed=0,
                             reset_fn=lambda seed, options: torch.zeros(4) + 0.1)

    genv = to_gymnasium(make())
    genv.reset(seed=0)
    got = [genv.step(np.full(2, 0.5, np.float32)) for _ in range(4)]
    genv.close()
    ref = make()
    td = ref.reset(seed=0)
    for obs, reward, terminated, truncated, _ in got:
        td["action"] = torch.full((2,), 0.5)
        td = ref.step(td)
        nxt = td["next"]
        np.testing.assert_allclose(obs, nxt["observation"].numpy(), rtol=1e-6)
        assert reward == pytest.approx(float(nxt["reward"].reshape(-1)[0]), rel=1e-6)
        assert terminated == bool(nxt["terminated"].reshape(-1)[0]) and truncated is False
        td = ref.step_mdp(td)
    assert len({tuple(np.round(g[0], 6)) for g in got}) == len(got)  # the state moved on at every step


# -- 2. a frozen row keeps its info --------------------------------------------------------------------------------


def test_frozen_row_keeps_its_last_info_as_envpool_does():
    """A row frozen by "_step" keeps its observation and its last info values (reward 0), as EnvPool's rows do;
    it used to report info 0."""

    def trans(state, action):
        nxt = state + 1
        flag = torch.zeros(state.shape[0], 1, dtype=torch.bool)
        return nxt, torch.ones(state.shape[0], 1), flag, flag.clone(), {"t": nxt[:, 0] * 10}

    env = WorldModelEnv(None, BOX1, ACT1, num_envs=2, initial_state=torch.zeros(1), transition_fn=trans,
                        info_spec={"t": torch.zeros(())})
    td = env.reset()
    td["action"] = torch.zeros(2, 1)
    nxt = env.step(td)["next"]
    assert nxt["info", "t"].flatten().tolist() == [10.0, 10.0]
    for _ in range(2):  # frozen twice in a row: still the last stepped value
        td = nxt.clone()
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([False, True])
        nxt = env.step(td)["next"]
    assert nxt["observation"].flatten().tolist() == [1.0, 3.0]
    assert nxt["reward"].flatten().tolist() == [0.0, 1.0]
    assert nxt["info", "t"].flatten().tolist() == [10.0, 30.0]
    td = nxt.clone()
    td["action"] = torch.zeros(2, 1)
    td["_step"] = _frozen([True, False])  # row 0 steps again: its new info; row 1 now keeps 30
    nxt = env.step(td)["next"]
    assert nxt["info", "t"].flatten().tolist() == [20.0, 30.0]


# -- 3. make_world_model_env(max_episode_steps=): frozen rows keep their step count -----------------------------------


def _limited_env(max_steps, transition_fn=None):
    return make_world_model_env(
        None, BOX1, ACT1, num_envs=2, initial_state=torch.zeros(1), max_episode_steps=max_steps,
        transition_fn=transition_fn or (lambda s, a: {"state": s + 1, "reward": torch.ones(s.shape[0], 1)}),
    )


def test_time_limit_counts_only_the_steps_a_row_took():
    """Rows frozen by "_step" keep their step_count and are not truncated before max_episode_steps real steps;
    the transform is RowStepCounter, a StepCounter."""
    from torchrl_swm.world_model import RowStepCounter

    env = _limited_env(5)
    counters = [t for t in env.transform if isinstance(t, StepCounter)]
    assert len(counters) == 1 and isinstance(counters[0], RowStepCounter)
    td = env.reset()
    for t in range(5):
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([not (1 <= t <= 3), True])  # row 0 frozen at t = 1, 2, 3
        nxt = env.step(td)["next"]
        td = nxt.clone()
    assert nxt["observation"].flatten().tolist() == [2.0, 5.0]
    assert nxt["step_count"].flatten().tolist() == [2, 5]
    assert nxt["truncated"].flatten().tolist() == [False, True]
    assert nxt["done"].flatten().tolist() == [False, True]
    for _ in range(3):  # row 0's three remaining steps: truncated at its fifth
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([True, False])
        nxt = env.step(td)["next"]
        td = nxt.clone()
    assert nxt["observation"][0].item() == 5.0
    assert nxt["step_count"].flatten().tolist() == [5, 5]
    assert nxt["truncated"].flatten().tolist() == [True, True]


def test_time_limit_truncated_row_stays_truncated_while_frozen():
    """A row truncated by the limit, then frozen (not reset), keeps its count and stays truncated and done."""
    env = _limited_env(2)
    td = env.reset()
    for t in range(4):
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([t < 2, True])  # row 0 truncated at t = 1, then frozen
        nxt = env.step(td)["next"]
        td = nxt.clone()
    assert nxt["observation"][0].item() == 2.0
    assert nxt["step_count"][0].item() == 2
    assert nxt["truncated"][0].item() and nxt["done"][0].item()
    assert not nxt["terminated"][0].item()


def test_time_limit_keeps_a_model_truncation_of_a_frozen_row():
    """A row the model itself truncated (before the limit) stays truncated while frozen, with its count kept."""

    def trans(state, action):
        nxt = state + 1
        return {"state": nxt, "reward": torch.ones(state.shape[0], 1), "truncated": nxt >= 2}

    env = _limited_env(10, trans)
    td = env.reset()
    for t in range(4):
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([t < 2, False])  # row 0: truncated by the model at t = 1, then frozen
        nxt = env.step(td)["next"]
        td = nxt.clone()
    assert nxt["step_count"].flatten().tolist() == [2, 0]
    assert nxt["truncated"].flatten().tolist() == [True, False]
    assert nxt["done"].flatten().tolist() == [True, False]


def test_time_limit_row_frozen_one_step_before_the_limit_is_not_done():
    """TorchRL's StepCounter counts a frozen row to the limit and sets its done: RowStepCounter puts done back too."""
    env = _limited_env(3)
    td = env.reset()
    for t in range(3):
        td["action"] = torch.zeros(2, 1)
        td["_step"] = _frozen([True, t < 2])  # row 1 frozen at what would be its third step
        nxt = env.step(td)["next"]
        td = nxt.clone()
    assert nxt["step_count"].flatten().tolist() == [3, 2]
    assert nxt["truncated"].flatten().tolist() == [True, False]
    assert nxt["done"].flatten().tolist() == [True, False]


# -- 4. transitions that declare mask= -----------------------------------------------------------------------------


def test_transition_fn_receives_the_stepped_rows_as_mask():
    """transition_fn(state, action, mask): a bool tensor of the batch shape, all True without a partial "_step",
    True for the stepped rows with one."""
    seen = []

    def trans(state, action, mask=None):
        seen.append(mask)
        return state + 1

    env = WorldModelEnv(None, BOX1, ACT1, num_envs=3, initial_state=torch.zeros(1), transition_fn=trans)
    td = env.reset()
    td["action"] = torch.zeros(3, 1)
    env.step(td)
    td["_step"] = _frozen([True, False, True])
    env.step(td)
    assert all(isinstance(m, torch.Tensor) for m in seen), seen
    assert [m.dtype for m in seen] == [torch.bool, torch.bool]
    assert [tuple(m.shape) for m in seen] == [(3,), (3,)]
    assert seen[0].tolist() == [True, True, True]
    assert seen[1].tolist() == [True, False, True]


def test_transition_fn_with_model_and_required_mask():
    """transition_fn(model, state, action, mask) with a required mask: called with the mask, the model first."""
    seen = []

    class Model:
        pass

    model = Model()

    def trans(m, state, action, mask):
        seen.append((m, mask.tolist()))
        return state + 1

    env = WorldModelEnv(model, BOX1, ACT1, num_envs=2, initial_state=torch.zeros(1), transition_fn=trans)
    td = env.reset()
    td["action"] = torch.zeros(2, 1)
    td["_step"] = _frozen([False, True])
    nxt = env.step(td)["next"]
    assert seen == [(model, [False, True])]
    assert nxt["observation"].flatten().tolist() == [0.0, 1.0]


class _Stateful:
    """A model that keeps its own state ``h`` and honours the mask it is given."""

    def __init__(self, n):
        self.h = torch.zeros(n, 1)
        self.masks = []

    def reset(self, num_envs=None, mask=None):
        self.h = torch.where(mask.view(-1, 1), torch.zeros_like(self.h), self.h)
        return torch.zeros(num_envs, 1)

    def step(self, action, mask=None):
        self.masks.append(mask)
        self.h = torch.where(mask.view(-1, 1), self.h + 1, self.h)
        return {"observation": self.h.clone(), "reward": torch.ones(self.h.shape[0], 1)}


class _StatefulKwOnly(_Stateful):
    def step(self, action, *, mask=None):
        return super().step(action, mask=mask)


@pytest.mark.parametrize("model_cls", [_Stateful, _StatefulKwOnly], ids=["mask=None", "keyword-only mask"])
def test_discovered_step_with_mask_keeps_frozen_rows_state(model_cls):
    """A discovered model.step(action, mask=None) is the one-argument (action) form with the mask extra, so a
    model keeping its own state leaves a frozen row's state as it was."""
    model = model_cls(2)
    env = WorldModelEnv(model, BOX1, ACT1, num_envs=2)
    td = env.reset()
    obs = []
    for t in range(3):
        td["action"] = torch.full((2, 1), 0.5)
        td["_step"] = _frozen([t != 1, True])  # row 0 frozen at t = 1
        td = env.step(td)["next"].clone()
        obs.append(td["observation"][:, 0].tolist())
    assert [o[0] for o in obs] == [1.0, 1.0, 2.0]
    assert [o[1] for o in obs] == [1.0, 2.0, 3.0]
    assert model.h.flatten().tolist() == [2.0, 3.0]
    assert [m.tolist() for m in model.masks] == [[True, True], [False, True], [True, True]]
    rollout = env.rollout(4)  # resets (the model clears h), then no "_step": every row steps
    assert rollout["next", "observation"][:, -1, 0].tolist() == [4.0, 4.0]


# -- 5. an unbatched reset return broadcasts its info ---------------------------------------------------------------


def test_unbatched_reset_info_is_broadcast_and_batched_info_is_per_row():
    """reset_fn returning one row's (obs, info): the declared info leaves are repeated over the reset rows, as the
    observation is (it used to be refused); a batched (obs, info) is still read row by row."""

    def trans(s, a):
        flag = torch.zeros(s.shape[0], 1, dtype=torch.bool)
        return s + a, s + a, torch.zeros(s.shape[0], 1), flag, flag.clone(), {"t": torch.ones(s.shape[0])}

    env = WorldModelEnv(None, BOX2, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=3,
                        reset_fn=lambda seed, options: (torch.zeros(2), {"t": torch.tensor(5.0)}),
                        transition_fn=trans, info_spec={"t": torch.zeros(())})
    td = env.reset()
    assert td["info", "t"].shape == (3, 1)
    assert td["info", "t"].flatten().tolist() == [5.0, 5.0, 5.0]
    td["action"] = torch.zeros(3, 2)
    nxt = env.step(td)["next"]
    assert nxt["info", "t"].flatten().tolist() == [1.0, 1.0, 1.0]
    nxt["_reset"] = _frozen([False, True, False])
    out = env.reset(nxt)  # a partial reset: the broadcast fills only the reset row
    assert out["info", "t"].flatten().tolist() == [1.0, 5.0, 1.0]

    def batched_reset(seed, options, num_envs=None):
        return torch.zeros(num_envs, 2), {"t": torch.arange(num_envs, dtype=torch.float32) + 7}

    env = WorldModelEnv(None, BOX2, gym.spaces.Box(-1, 1, (2,), np.float32), num_envs=3, reset_fn=batched_reset,
                        transition_fn=trans, info_spec={"t": torch.zeros(())})
    td = env.reset()
    assert td["info", "t"].flatten().tolist() == [7.0, 8.0, 9.0]
    td["action"] = torch.zeros(3, 2)
    nxt = env.step(td)["next"]
    nxt["_reset"] = _frozen([True, False, True])  # two rows reset: the batched return's two rows, in order
    assert env.reset(nxt)["info", "t"].flatten().tolist() == [7.0, 1.0, 8.0]


# -- 6. a Dict observation space keeps the env's key order ---------------------------------------------------------


class _OrderedDictEnv(gym.Env):
    """A Dict observation whose key order is not sorted (nested too), as goal envs build them."""

    observation_space = gym.spaces.Dict(OrderedDict([
        ("z", gym.spaces.Box(-5, 5, (2,), np.float32)),
        ("m", gym.spaces.Dict(OrderedDict([("y", gym.spaces.Box(-5, 5, (1,), np.float32)),
                                           ("b", gym.spaces.Box(-5, 5, (1,), np.float32))]))),
        ("a", gym.spaces.Box(-5, 5, (1,), np.float32)),
    ]))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs = OrderedDict(z=np.array([1, 2], np.float32), m=OrderedDict(y=np.array([3], np.float32),
                                                                        b=np.array([4], np.float32)),
                          a=np.array([5], np.float32))
        return obs, {}

    def step(self, action):
        return self.reset()[0], 0.0, False, False, {}


def test_dict_observation_keeps_the_env_key_order_like_sync_vector_env():
    """The exported single_observation_space has the env's key order (not sorted), equal to SyncVectorEnv's, so
    FlattenObservation gives the same vector."""
    sync = gym.vector.SyncVectorEnv([_OrderedDictEnv, _OrderedDictEnv])
    envs = to_gymnasium(EnvPool([_OrderedDictEnv, _OrderedDictEnv]))
    space = envs.single_observation_space
    assert list(space.keys()) == ["z", "m", "a"] == list(sync.single_observation_space.keys())
    assert list(space["m"].keys()) == ["y", "b"]
    assert space == sync.single_observation_space
    flat_sync = FlattenObservation(sync).reset(seed=0)[0]
    flat = FlattenObservation(envs).reset(seed=0)[0]
    np.testing.assert_array_equal(flat_sync, [[1, 2, 3, 4, 5]] * 2)
    np.testing.assert_array_equal(flat, flat_sync)
    sync.close()
    envs.close()


# -- 7. reset(options=[...]) is refused -----------------------------------------------------------------------------


class _OptEnv(gym.Env):
    observation_space = gym.spaces.Box(-100, 100, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seen = options
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


_LIST_OPTIONS = r"options must be a dict.*got list"


def test_vector_export_refuses_a_list_of_options():
    """A list of per-env option dicts is a TypeError naming the expected dict and the list received (it used to be
    turned into a dict of the first dict's keys, or a cryptic ValueError)."""
    envs = to_gymnasium(EnvPool([_OptEnv, _OptEnv]))
    envs.reset(seed=0)
    for options in ([{"x": 1, "y": 2}, {"x": 3, "y": 4}], [{"x": 1}, {"x": 3}]):
        with pytest.raises(TypeError, match=_LIST_OPTIONS):
            envs.reset(options=options)
    assert envs.get_attr("seen") == (None, None)  # the envs were not reset with garbage options
    obs, _ = envs.reset(options={"x": 1})  # one dict still goes to every env
    assert envs.get_attr("seen") == ({"x": 1}, {"x": 1})
    envs.close()


def test_single_exports_refuse_a_list_of_options():
    """The single-env export (a one-env pool, an unbatched world model) refuses a list of options the same way."""
    genv = TorchRLGymEnv(EnvPool([_OptEnv]), squeeze_batch=True)
    genv.reset(seed=0)
    with pytest.raises(TypeError, match=_LIST_OPTIONS):
        genv.reset(options=[{"x": 1}])
    assert genv.env.get_attr("seen") == [None]
    genv.close()
    wm = WorldModelEnv(None, BOX3, ACT3, num_envs=None, state_key="observation",
                       reset_fn=lambda seed, options: torch.zeros(3), transition_fn=lambda s, a: s + a)
    genv = to_gymnasium(wm)
    with pytest.raises(TypeError, match=_LIST_OPTIONS):
        genv.reset(options=[{"x": 1}, {"x": 2}])
    genv.close()


# -- 8. SB3 metadata: render_fps --------------------------------------------------------------------------------------


def test_sb3_vec_env_metadata_has_the_envs_render_fps():
    """to_sb3_vec_env(EnvPool("CartPole-v1")).metadata["render_fps"] is CartPole's (50), as DummyVecEnv's is
    (VecVideoRecorder reads its frame rate there)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    fps = gym.make("CartPole-v1").metadata["render_fps"]
    assert fps == 50
    dummy = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    venv = to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=2))
    assert venv.metadata.get("render_fps") == dummy.metadata["render_fps"] == fps
    venv.close()
    dummy.close()



# -- 9. the exports leave bookkeeping transform leaves out of the default observation ------------------------------

CARTPOLE_BOX = gym.make("CartPole-v1").observation_space


class _Drift(nn.Module):
    def forward(self, obs, action):
        return {"state": obs + 0.1 * action, "reward": -obs.pow(2).sum(-1, keepdim=True)}


def test_world_model_env_with_max_episode_steps_exports_the_models_box():
    """to_gymnasium(make_world_model_env(max_episode_steps=20)): the observation is the model's Box (its StepCounter's
    step_count is not part of it, as gymnasium's TimeLimit never changes the observation); the limit still truncates."""
    wm = make_world_model_env(_Drift(), observation_space=BOX2, action_space=gym.spaces.Box(-1, 1, (2,), np.float32),
                              num_envs=4, initial_state=torch.zeros(2), max_episode_steps=20)
    envs = to_gymnasium(wm)
    assert envs.single_observation_space == BOX2
    assert int(np.array(envs.single_observation_space.shape).prod()) == 2  # CleanRL's obs_dim
    obs, _ = envs.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == (4, 2)
    zero = np.zeros((4, 2), np.float32)
    truncated = [envs.step(zero)[3] for _ in range(20)]
    assert truncated[-1].all() and not any(t.any() for t in truncated[:-1])
    envs.close()


@pytest.mark.parametrize("transform", [RewardSum, StepCounter, InitTracker])
@pytest.mark.parametrize("export", ["gymnasium", "sb3"])
def test_pool_with_a_bookkeeping_transform_exports_cartpoles_box(transform, export):
    _assert_default_export_is_cartpoles_box(TransformedEnv(EnvPool("CartPole-v1", num_envs=2), transform()), export)


def _assert_default_export_is_cartpoles_box(env, export):
    if export == "gymnasium":
        envs = to_gymnasium(env)
        space = envs.single_observation_space
        obs, _ = envs.reset(seed=0)
    else:
        envs = to_sb3_vec_env(env)
        space = envs.observation_space
        obs = envs.reset()
    assert space == CARTPOLE_BOX
    assert isinstance(obs, np.ndarray) and obs.shape == (2, 4)
    envs.close()


@pytest.mark.parametrize("export", ["gymnasium", "sb3"])
def test_a_bookkeeping_transform_in_a_nested_compose_is_left_out_of_the_default_observation(export):
    """A RewardSum inside a Compose inside the env's Compose is bookkeeping as a top-level one is: its
    "episode_reward" is not part of the default observation, CartPole's Box."""
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), Compose(StepCounter(7), Compose(RewardSum())))
    assert bookkeeping_keys(env) == {("step_count",), ("episode_reward",)}
    _assert_default_export_is_cartpoles_box(env, export)


def test_bookkeeping_leaf_is_left_out_by_default_and_exported_when_asked_for():
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter())
    default = to_gymnasium(env)
    assert default.single_observation_space == CARTPOLE_BOX
    envs = to_gymnasium(env, observation_keys=["observation", "step_count"])
    space = envs.single_observation_space
    assert isinstance(space, gym.spaces.Dict) and list(space.spaces) == ["observation", "step_count"]
    assert space["observation"] == CARTPOLE_BOX
    obs, _ = envs.reset(seed=0)
    assert obs["observation"].shape == (2, 4) and obs["step_count"].reshape(-1).tolist() == [0, 0]
    obs = envs.step(np.array([0, 1]))[0]
    assert obs["step_count"].reshape(-1).tolist() == [1, 1]
    envs.close()


def test_sb3_ppo_mlp_policy_builds_on_a_step_counter_export():
    from stable_baselines3 import PPO

    venv = to_sb3_vec_env(TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter(max_steps=20)))
    model = PPO("MlpPolicy", venv, n_steps=8, batch_size=8, device="cpu")  # a Dict space needs MultiInputPolicy
    assert model.observation_space == CARTPOLE_BOX
    venv.close()


def _pool_factory(num_envs, seed_every_episode=True, **kwargs):
    return EnvPool("CartPole-v1", num_envs=num_envs, seed_every_episode=seed_every_episode, **kwargs)


def test_make_vec_max_episode_steps_and_a_direct_step_counter_export_give_the_pools_box():
    """register_gymnasium_env's make_vec(max_episode_steps=7) and to_gymnasium(TransformedEnv(pool, StepCounter(7)))
    give the same observation, the pool's Box, and both truncate at 7."""
    env_id = f"TorchRLSWMTest/Pool{uuid.uuid4().hex[:6]}-v0"
    register_gymnasium_env(env_id, _pool_factory)
    registered = gym.make_vec(env_id, num_envs=2, max_episode_steps=7)
    direct = to_gymnasium(TransformedEnv(EnvPool("CartPole-v1", num_envs=2), StepCounter(max_steps=7)))
    for envs in (registered, direct):
        assert envs.single_observation_space == CARTPOLE_BOX
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4)
        for t in range(1, 8):  # alternating pushes keep the pole up
            _, _, terminated, truncated, _ = envs.step(np.array([t % 2, 1 - t % 2]))
            assert not terminated.any()
            assert truncated.all() == (t == 7)
        envs.close()


class _EncodingCounter(nn.Module):
    """latent = scale * obs at a reset (``encode``); each step adds 1; an episode ends at latent >= 3."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def encode(self, obs):
        return obs * self.scale

    def step(self, state, action):
        nxt = state + 1
        flags = torch.zeros(state.shape[0], dtype=torch.bool)
        return nxt, nxt, torch.zeros(state.shape[0]), nxt[:, 0] >= 3, flags, {}


@pytest.mark.parametrize("transformed", [False, True])
def test_next_step_export_restarts_finished_rows_at_the_next_step_as_gymnasium(transformed):
    # a start encoded by a model trained between steps: gymnasium restarts a finished env inside the next
    # step(), after the update, so the new episode starts from the updated encoder (observation 1, latent 10,
    # so the next observation is 11)
    model = _EncodingCounter()
    env = WorldModelEnv(model, gym.spaces.Box(-100, 100, (1,), np.float32), gym.spaces.Discrete(2), num_envs=3,
                        initial_observation=torch.ones(1))
    assert not env.fixed_start
    envs = to_gymnasium(TransformedEnv(env, StepCounter()) if transformed else env, autoreset_mode="next_step")
    envs.reset(seed=0)
    seen = []
    for _ in range(5):
        obs, reward, terminated, _, _ = envs.step(np.zeros(3, np.int64))
        seen.append((obs[0, 0].item(), bool(terminated[0])))
        if terminated.any():
            with torch.no_grad():
                model.scale.fill_(10.0)  # a training update between steps
    assert seen == [(2.0, False), (3.0, True), (1.0, False), (11.0, True), (1.0, False)]
    # a fixed start gives the same values whenever the reset runs: the fast path (reset when finished) is kept
    fixed = WorldModelEnv(_EncodingCounter(), gym.spaces.Box(-100, 100, (1,), np.float32), gym.spaces.Discrete(2),
                          num_envs=3, initial_state=torch.ones(1))
    assert fixed.fixed_start and not to_gymnasium(fixed, autoreset_mode="next_step")._defer_resets


def test_render_of_a_world_model_export_is_not_implemented_on_both_exports_as_on_gymnasiums_vector_env():
    """The vector export raised AttributeError, the single-env one NotImplementedError (gymnasium's VectorEnv.render
    raises NotImplementedError): one exception for both."""
    env = make_world_model_env(None, BOX3, ACT3, num_envs=2, initial_state=torch.zeros(3),
                               transition_fn=lambda s, a: s + a)
    vector, single = to_gymnasium(env), TorchRLGymEnv(make_world_model_env(
        None, BOX3, ACT3, num_envs=None, state_key="observation", initial_state=torch.zeros(3),
        transition_fn=lambda s, a: s + a))
    for exported in (vector, single):
        exported.reset(seed=0)
        with pytest.raises(NotImplementedError, match="render\\(\\) reaches the sub-env"):
            exported.render()
        exported.close()
    pytest.importorskip("stable_baselines3")
    sb3 = to_sb3_vec_env(env)
    with pytest.raises(NotImplementedError, match="render\\(\\) reaches the sub-env"):  # as SB3's VecEnv.get_images
        sb3.get_images()
    sb3.close()
