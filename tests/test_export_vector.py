"""to_gymnasium on batched TorchRL envs: a gymnasium VectorEnv with gymnasium's exact semantics.

The reference is gymnasium's own SyncVectorEnv over the same seeded envs (see
export_helpers.sync_twin): every output of every step must be identical.
"""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from export_helpers import PoolSeedSchedule, action_stream, assert_same, probed, sync_twin, without
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import wide_boxes, wide_discretes, wide_multi_discretes
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import EnvBase, RewardScaling, StepCounter, TransformedEnv

from envs import CountingEnv, DictObsEnv, InfoEnv, StartActionEnv, assert_reaped, counting, sparse_info
from torchrl_swm import EnvError, EnvPool, SpecError, to_gymnasium
from torchrl_swm.benchmarks.export import ACT, LAT, MLPWorldModelEnv, make_model, world_model_env
from torchrl_swm.export import TorchRLVectorEnv

MODES = ["next_step", "same_step", "disabled"]


def _compare_to_sync(ours, ref, steps, seed, *, drop=()):
    """Step both with the same actions; resets finished envs by mask in DISABLED mode."""
    obs, infos = ours.reset(seed=seed)
    obs_ref, infos_ref = ref.reset(seed=seed)
    assert_same(obs, obs_ref, "reset obs")
    assert_same(without(infos, *drop), infos_ref, "reset infos")
    finished = 0
    for t, action in enumerate(action_stream(ours.action_space, steps, seed)):
        out, out_ref = ours.step(action), ref.step(action)
        for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], out_ref[:4]):
            if name == "rewards":  # gymnasium's SyncVectorEnv widens rewards to float64
                np.testing.assert_array_equal(a, b, err_msg=f"step {t}: rewards")
            else:
                assert_same(a, b, f"step {t}: {name}")
        assert_same(without(out[4], *drop), out_ref[4], f"step {t}: infos")
        done = out[2] | out[3]
        finished += int(done.sum())
        if ours.autoreset_mode is AutoresetMode.DISABLED and done.any():
            obs, infos = ours.reset(options={"reset_mask": done.copy()})
            obs_ref, infos_ref = ref.reset(options={"reset_mask": done.copy()})
            assert_same(obs, obs_ref, f"step {t}: masked reset obs")
            assert_same(without(infos, *drop), infos_ref, f"step {t}: masked reset infos")
    return finished


@pytest.mark.parametrize("mode", MODES)
def test_cartpole_matches_sync_vector_env(mode, device):
    """Hundreds of steps of random actions: obs, rewards, flags, infos and final_obs all identical.

    On an accelerator the pool's outputs live there and each step is one packed transfer."""
    n = 8
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, device=device), autoreset_mode=mode)
    ref = sync_twin("CartPole-v1", n, AutoresetMode(ours.metadata["autoreset_mode"]))
    assert ours.metadata["autoreset_mode"] is ref.metadata["autoreset_mode"]
    finished = _compare_to_sync(ours, ref, 400, seed=3, drop=("episode_seed",))
    assert finished > 100  # autoresets were exercised, many of them mid-batch
    ours.close()
    ref.close()


@pytest.mark.parametrize("mode", MODES)
def test_truncation_and_infos_match_sync_vector_env(mode):
    """Truncations (TimeLimit), and numeric infos with their masks, including final_info."""
    n = 5
    factory = functools.partial(gym.make, "CartPole-v1", max_episode_steps=7)
    ours = to_gymnasium(EnvPool([factory] * n, seed=0), autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(
        [lambda: PoolSeedSchedule(factory(), n) for _ in range(n)],
        autoreset_mode=AutoresetMode(ours.metadata["autoreset_mode"]),
    )
    _compare_to_sync(ours, ref, 60, seed=11, drop=("episode_seed",))


@pytest.mark.parametrize("mode", MODES)
def test_infos_that_come_and_go_match_sync_vector_env(mode):
    """"bonus" every few steps and "success" at the end: the same keys, "_key" masks and
    final_info as gymnasium's SyncVectorEnv (the pool's ("info_mask", key) leaves)."""
    periods = (1, 2, 3, 4)
    n = len(periods)
    fns = [functools.partial(sparse_info, period=p, max_length=6) for p in periods]
    # float64: gymnasium stores a Python float info in a float64 array
    pool = EnvPool(fns, seed=0, info_spec={"bonus": np.float64(0), "success": False})
    ours = to_gymnasium(pool, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv(
        [lambda f=f: PoolSeedSchedule(probed(f()), n) for f in fns], autoreset_mode=AutoresetMode(ours.metadata["autoreset_mode"])
    )
    finished = _compare_to_sync(ours, ref, 150, seed=5, drop=("episode_seed",))
    assert finished > 40
    ours.close()
    ref.close()


class _NestedInfoEnv(gym.Env):
    """info {"stats": {"always": t}}, plus {"stats": {"sometimes": t}} every ``period`` steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, period):
        self.period, self.t = period, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"stats": {"always": 0}}

    def step(self, action):
        self.t += 1
        info = {"stats": {"always": self.t}}
        if self.t % self.period == 0:
            info["stats"]["sometimes"] = float(self.t)
        return np.full(1, self.t, np.float32), 0.0, False, self.t >= 5, info


def test_nested_info_group_mask_is_the_union_of_its_leaves_masks():
    # as gymnasium's VectorEnv._add_info: "_stats" is set where any leaf of "stats" is present
    fns = [lambda: _NestedInfoEnv(2), lambda: _NestedInfoEnv(3)]
    ours = to_gymnasium(EnvPool(fns, seed_every_episode=False, info_spec={("stats", "sometimes"): 0.0}))
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode(ours.metadata["autoreset_mode"]))
    assert _compare_to_sync(ours, ref, 12, seed=0, drop=("episode_seed",)) == 4
    ours.reset(seed=0)
    infos = [ours.step(np.zeros(2, np.int64))[4] for _ in range(3)]
    assert "sometimes" not in infos[0]["stats"]  # no env reported it yet
    assert [info["stats"]["_sometimes"].tolist() for info in infos[1:]] == [[True, False], [False, True]]
    assert all(info["_stats"].tolist() == [True, True] for info in infos)
    ours.close()
    ref.close()


@pytest.mark.parametrize("mode", MODES)
def test_transformed_pool_matches_sync_vector_env(mode):
    """TransformedEnv(EnvPool, StepCounter(10)) against gymnasium's TimeLimit(10): the export's own
    handling of frozen rows (restored from their reset values) is exact too."""
    n = 6
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=n), StepCounter(10))
    ours = to_gymnasium(env, autoreset_mode=mode, observation_keys="observation", info_keys=[])
    assert not ours.traits.frozen_rows_exact
    ref = sync_twin("CartPole-v1", n, ours.autoreset_mode, max_episode_steps=10)
    assert _compare_to_sync(ours, ref, 150, seed=8) > 60



@pytest.mark.parametrize("mode", MODES)
def test_transformed_pool_with_infos_that_come_and_go_matches_sync_vector_env(mode):
    """A transformed pool (its frozen rows restored by the export) with "bonus"/"success" infos that come and
    go: the step that restarts a finished env reports the reset's presence masks ("_success" False), not
    the terminal step's, as on SyncVectorEnv. The restore covers the ("info_mask", key) leaves too."""
    periods = (1, 2, 3, 4)
    n = len(periods)
    fns = [functools.partial(sparse_info, period=p, max_length=4) for p in periods]
    pool = EnvPool(fns, seed=0, info_spec={"bonus": np.float64(0), "success": False})
    env = TransformedEnv(pool, RewardScaling(loc=0.0, scale=1.0))
    ours = to_gymnasium(env, autoreset_mode=mode, observation_keys="observation",
                        info_keys=[("info", "t"), ("info", "bonus"), ("info", "success")])
    assert not ours.traits.frozen_rows_exact
    ref = gym.vector.SyncVectorEnv(
        [lambda f=f: PoolSeedSchedule(probed(f()), n) for f in fns], autoreset_mode=ours.autoreset_mode
    )
    assert _compare_to_sync(ours, ref, 120, seed=5) > 40
    ours.close()
    ref.close()

def test_info_keys_become_vector_infos_with_masks():
    n = 3
    pool = EnvPool([functools.partial(CountingEnv, length=2)] * n, seed=0)
    envs = to_gymnasium(pool, autoreset_mode="same_step")
    _, infos = envs.reset(seed=0)
    assert set(infos) == {"t", "_t", "length", "_length", "episode_seed", "_episode_seed"}
    assert infos["t"].shape == (n,) and infos["_t"].all() and infos["length"].tolist() == [2, 2, 2]
    assert infos["episode_seed"].tolist() == [0, 1, 2]
    _, _, _, _, infos = envs.step(np.ones(n, np.int64))
    assert infos["t"].tolist() == [1, 1, 1] and "final_obs" not in infos
    obs, _, term, _, infos = envs.step(np.full(n, 2))
    assert term.all() and infos["_final_obs"].all() and infos["_final_info"].all()
    assert infos["final_info"]["t"].tolist() == [2, 2, 2] and infos["final_info"]["_t"].all()
    assert infos["t"].tolist() == [0, 0, 0]  # the reset infos
    final = np.stack(infos["final_obs"])  # [t, episode, last action] of the finished episodes
    assert final[:, 0].tolist() == [2, 2, 2] and final[:, 2].tolist() == [2, 2, 2]
    assert obs[:, 0].tolist() == [0, 0, 0] and (obs[:, 1] == final[:, 1] + 1).all()  # the next episode


def test_info_keys_and_observation_keys_can_be_chosen():
    pool = EnvPool([functools.partial(CountingEnv, length=2)] * 2, seed=0)
    envs = to_gymnasium(pool, info_keys=[("info", "t")], observation_keys=["observation"])
    obs, infos = envs.reset(seed=0)
    assert isinstance(envs.single_observation_space, gym.spaces.Dict) and obs["observation"].shape == (2, 3)
    assert set(infos) == {"t", "_t"}
    envs = to_gymnasium(EnvPool([functools.partial(CountingEnv, length=2)] * 2), info_keys=[])
    assert envs.reset(seed=0)[1] == {}


class OwnSeedInfoEnv(gym.Env):
    """Reports an ``"episode_seed"`` info of its own (a level id), as the pool names its root leaf."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.level = 1000 + int(self.np_random.integers(100))
        return np.zeros(1, np.float32), {"episode_seed": self.level, "goal": np.array([0.5, -0.5], np.float32)}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, self.level % 2 == 0, False, {"episode_seed": self.level,
                                                                           "goal": np.array([0.5, -0.5], np.float32)}


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_an_envs_own_info_named_like_a_pool_leaf_is_exported_as_sync_vector_env_shows_it(mode):
    # the pool's root "episode_seed" and the env's ("info", "episode_seed") would both go to infos["episode_seed"]
    envs = to_gymnasium(EnvPool([OwnSeedInfoEnv] * 3, seed=0, seed_every_episode=False), autoreset_mode=mode)
    modes = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}
    sync = gym.vector.SyncVectorEnv([OwnSeedInfoEnv] * 3, autoreset_mode=modes[mode])
    assert_same(envs.reset(seed=0)[1], sync.reset(seed=0)[1], "reset infos")
    for t in range(6):
        (obs, reward, term, trunc, infos), expected = envs.step(np.zeros(3, np.int64)), sync.step(np.zeros(3, np.int64))
        assert_same((obs, term, trunc, infos), tuple(expected[i] for i in (0, 2, 3, 4)), f"step {t}")
        assert np.array_equal(reward, expected[1])  # float32 against float64: the values
    with pytest.raises(SpecError, match=r"info leaves \('info', 'episode_seed'\) and \('episode_seed',\) would both "
                                        r"go to info\['episode_seed'\]: choose one of them with info_keys="):
        to_gymnasium(EnvPool([OwnSeedInfoEnv] * 3), info_keys=[("info", "episode_seed"), "episode_seed"])
    chosen = to_gymnasium(EnvPool([OwnSeedInfoEnv] * 3, seed=0), info_keys=["episode_seed"])
    assert chosen.reset(seed=0)[1]["episode_seed"].tolist() == [0, 1, 2]  # the pool's, when chosen alone


def test_an_info_leaf_chosen_as_an_observation_has_the_infos_shape():
    envs = to_gymnasium(EnvPool([OwnSeedInfoEnv] * 3, seed=0), observation_keys=["observation", ("info", "goal")])
    assert envs.single_observation_space["info"]["goal"] == gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    obs, infos = envs.reset(seed=0)
    assert obs["info"]["goal"].shape == infos["goal"].shape == (3, 2) and obs in envs.observation_space
    assert np.array_equal(obs["info"]["goal"], np.tile([0.5, -0.5], (3, 1)))
    obs = envs.step(np.zeros(3, np.int64))[0]
    assert obs["info"]["goal"].shape == (3, 2) and obs in envs.observation_space


def test_dict_observation_space_and_nested_keys():
    n = 4
    envs = to_gymnasium(EnvPool([DictObsEnv] * n, seed=0), autoreset_mode="same_step")
    single = envs.single_observation_space
    assert isinstance(single, gym.spaces.Dict) and set(single) == {"position", "goal"}
    # the env's own Discrete(4, start=1), as SyncVectorEnv shows it (the pool stores indices 0..3)
    assert single["goal"]["kind"] == gym.spaces.Discrete(4, start=1)
    assert single == DictObsEnv().observation_space
    assert envs.observation_space == gym.vector.utils.batch_space(single, n)
    obs, infos = envs.reset(seed=0)
    assert obs in envs.observation_space
    assert obs["goal"]["target"].shape == (n, 2) and obs["goal"]["kind"].dtype == np.int64
    assert obs["goal"]["kind"].min() >= 1
    assert infos["distance"].dtype == np.float64 and infos["_distance"].all()  # a Python float, as SyncVectorEnv
    finished = 0
    for action in action_stream(envs.action_space, 30):
        obs, _, term, trunc, infos = envs.step(action)
        assert obs in envs.observation_space
        for i in np.flatnonzero(term | trunc):
            assert infos["final_obs"][i] in single and isinstance(infos["final_obs"][i]["goal"], dict)
            finished += 1
    assert finished >= n  # every env truncated at t = 20


def test_dict_final_obs_of_envs_finishing_on_the_same_step_match_sync_vector_env():
    """SAME_STEP, a Dict observation, several envs finishing on one step (DictObsEnv truncates every env
    at t = 20): infos["final_obs"][i] is env i's own terminal observation, as on SyncVectorEnv."""
    n = 4
    ours = to_gymnasium(EnvPool([DictObsEnv] * n, seed_every_episode=False), autoreset_mode="same_step",
                        info_keys=[])
    ref = gym.vector.SyncVectorEnv([DictObsEnv] * n, autoreset_mode=AutoresetMode.SAME_STEP)
    space = ours.single_observation_space
    assert_same(ours.reset(seed=0)[0], ref.reset(seed=0)[0], "reset obs")
    together = 0
    for t, action in enumerate(action_stream(ours.action_space, 25)):
        out, out_ref = ours.step(action), ref.step(action)
        assert_same(out[0], out_ref[0], f"step {t}: obs")
        assert_same(out[2:4], out_ref[2:4], f"step {t}: flags")
        done = out_ref[2] | out_ref[3]
        assert out[4].get("_final_obs", np.zeros(n, bool)).tolist() == done.tolist(), t
        for i in np.flatnonzero(done):  # the env's Python int "kind" is the export's numpy int: same value
            final, final_ref = out[4]["final_obs"][i], out_ref[4]["final_obs"][i]
            assert np.array_equal(gym.spaces.flatten(space, final), gym.spaces.flatten(space, final_ref)), (t, i)
        together += int(done.sum() > 1)
    assert together >= 1
    ours.close()
    ref.close()


def test_single_key_dict_space_of_a_pool_stays_a_dict():
    class OneKey(gym.Env):
        observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,), np.float32)})
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return {"x": np.zeros(2, np.float32)}, {}

        def step(self, action):
            return {"x": np.zeros(2, np.float32)}, 0.0, False, False, {}

    envs = to_gymnasium(EnvPool([OneKey] * 2))
    assert isinstance(envs.single_observation_space, gym.spaces.Dict)
    assert envs.reset(seed=0)[0]["x"].shape == (2, 2)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_record_episode_statistics(mode):
    """gymnasium's RecordEpisodeStatistics sees the same episodes as on a SyncVectorEnv."""
    n = 6
    ours = gym.wrappers.vector.RecordEpisodeStatistics(
        to_gymnasium(EnvPool("CartPole-v1", num_envs=n), autoreset_mode=mode, info_keys=[])
    )
    ref = gym.wrappers.vector.RecordEpisodeStatistics(sync_twin("CartPole-v1", n, ours.env.autoreset_mode))
    ours.reset(seed=5)
    ref.reset(seed=5)
    for action in action_stream(ours.action_space, 300, 5):
        out, out_ref = ours.step(action), ref.step(action)
        assert ("episode" in out[4]) == ("episode" in out_ref[4])
        if "episode" in out_ref[4]:
            assert_same(out[4]["_episode"], out_ref[4]["_episode"], "_episode")
            assert_same(out[4]["episode"]["r"], out_ref[4]["episode"]["r"], "returns")
            assert_same(out[4]["episode"]["l"], out_ref[4]["episode"]["l"], "lengths")
    assert len(ours.return_queue) > 20
    assert list(ours.return_queue) == list(ref.return_queue)
    assert list(ours.length_queue) == list(ref.length_queue)


def test_record_episode_statistics_with_masked_resets():
    """DISABLED mode + reset(options={"reset_mask": ...}): statistics restart for those envs only.

    (gymnasium 1.4's own SyncVectorEnv pops "reset_mask" out of the caller's options,
    so RecordEpisodeStatistics over it restarts every env; the export leaves the
    caller's options alone, so the statistics are checked against hand-made sums.)
    """
    n = 6
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        to_gymnasium(EnvPool("CartPole-v1", num_envs=n), autoreset_mode="disabled", info_keys=[])
    )
    envs.reset(seed=5)
    returns, lengths, expected = np.zeros(n), np.zeros(n, int), []
    for action in action_stream(envs.action_space, 300, 5):
        _, rewards, term, trunc, infos = envs.step(action)
        returns += rewards
        lengths += 1
        done = term | trunc
        if done.any():
            assert infos["_episode"].tolist() == done.tolist()
            assert infos["episode"]["r"][done].tolist() == returns[done].tolist()
            assert infos["episode"]["l"][done].tolist() == lengths[done].tolist()
            expected += returns[done].tolist()
            returns[done], lengths[done] = 0, 0
            envs.reset(options={"reset_mask": done.copy()})
    assert len(expected) > 20 and list(envs.return_queue) == expected[-100:]


def test_standard_vector_wrappers():
    n = 4
    base = to_gymnasium(EnvPool("Pendulum-v1", num_envs=n), info_keys=[])  # observation wrappers need NEXT_STEP
    envs = gym.wrappers.vector.NormalizeObservation(base)
    envs = gym.wrappers.vector.NormalizeReward(envs)
    envs = gym.wrappers.vector.ClipAction(envs)
    envs = gym.wrappers.vector.TransformObservation(envs, lambda o: o * 2.0, envs.observation_space)
    envs = gym.wrappers.vector.DictInfoToList(gym.wrappers.vector.RecordEpisodeStatistics(envs))
    envs.reset(seed=0)
    for _ in range(210):  # Pendulum truncates at 200
        obs, rewards, term, trunc, infos = envs.step(np.full((n, 1), 5.0, np.float32))  # clipped to 2
    assert isinstance(infos, list) and len(infos) == n and obs.shape == (n, 3)
    dict_envs = gym.wrappers.vector.FlattenObservation(to_gymnasium(EnvPool([DictObsEnv] * 2)))
    obs, _ = dict_envs.reset(seed=0)
    assert obs.shape == (2, gym.spaces.flatdim(dict_envs.env.single_observation_space))


def test_next_step_ignores_the_action_of_a_resetting_env():
    """On the step after a done, that env's action is ignored: it returns its reset outputs."""
    pool = EnvPool([functools.partial(CountingEnv, length=2)] * 2, seed=0)
    envs = to_gymnasium(pool, autoreset_mode="next_step")
    envs.reset(seed=0)
    envs.step(np.array([1, 1]))
    obs, rewards, term, _, infos = envs.step(np.array([2, 2]))
    assert term.all() and obs[:, 0].tolist() == [2, 2]  # terminal observations
    steps_before = [e.unwrapped.steps_called for e in pool.envs]
    obs, rewards, term, trunc, infos = envs.step(np.array([1, 1]))  # ignored
    assert [e.unwrapped.steps_called for e in pool.envs] == steps_before
    assert rewards.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
    assert obs[:, 0].tolist() == [0, 0] and infos["t"].tolist() == [0, 0]
    obs, rewards, *_ = envs.step(np.array([2, 1]))
    assert rewards.tolist() == [2.0, 1.0] and obs[:, 0].tolist() == [1, 1]


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_transformed_env_step_counter(mode):
    """A TransformedEnv of a pool: StepCounter's truncations, the counter restored on frozen rows."""
    n, limit = 3, 4
    env = TransformedEnv(EnvPool([functools.partial(CountingEnv, length=100)] * n, seed=0), StepCounter(limit))
    envs = to_gymnasium(env, autoreset_mode=mode, observation_keys=["observation", "step_count"])
    obs, _ = envs.reset(seed=0)
    counts = []
    for _ in range(3 * (limit + 1)):
        obs, rewards, term, trunc, infos = envs.step(np.ones(n, np.int64))
        counts.append(int(obs["step_count"][0, 0]))  # StepCounter: (N, 1)
        assert not term.any()
        if trunc.any():
            assert trunc.all() and obs["observation"][0, 0] == (limit if mode == "next_step" else 0)
    if mode == "next_step":  # terminal step count 4, then the reset step (0), then 1...
        assert counts[: limit + 2] == [1, 2, 3, 4, 0, 1]
    else:
        assert counts[:limit + 1] == [1, 2, 3, 0, 1]


def _world_model(kind, model, b, device="cpu", seed=0):
    """The hand-written MLP env, the package's WorldModelEnv over the same MLP, or its TransformedEnv."""
    if kind == "mlp":
        return MLPWorldModelEnv(model, b, device=device, seed=seed)
    env = world_model_env(model, b, device=device, seed=seed)
    if kind == "transformed":  # make_world_model_env's form: TransformedEnv(WorldModelEnv, Compose(...))
        from torchrl.envs import Compose, InitTracker

        env = TransformedEnv(env, Compose(StepCounter(25), InitTracker()))
    return env


WORLD_MODELS = ["mlp", "WorldModelEnv", "transformed"]


@pytest.mark.parametrize("kind", WORLD_MODELS)
@pytest.mark.parametrize("mode", MODES)
def test_world_model_env_export(mode, kind, device):
    """Batched world-model envs: shapes, dtypes, autoresets, and the client loop of the tutorials."""
    b = 16
    model = make_model(done_rate_bias=0.0)  # ~50 % dones: many resets
    env = _world_model(kind, model, b, device)
    keys = "observation" if kind == "transformed" else None  # StepCounter/InitTracker add observation keys
    envs = to_gymnasium(env, autoreset_mode=mode, observation_keys=keys)
    assert envs.single_observation_space == gym.spaces.Box(-1, 1, (LAT,), np.float32)
    assert envs.single_action_space == gym.spaces.Box(-1, 1, (ACT,), np.float32)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (b, LAT) and obs.dtype == np.float32
    pending = np.zeros(b, bool)
    finished = 0
    for action in action_stream(envs.action_space, 40):
        obs, rewards, term, trunc, infos = envs.step(action)
        assert obs in envs.observation_space and rewards.dtype == np.float32 and rewards.shape == (b,)
        if mode == "next_step":  # the step after a done: reset observation, reward 0, not done
            assert np.all(rewards[pending] == 0) and not (term | trunc)[pending].any()
            assert np.all(np.abs(obs[pending]) <= 0.1 + 1e-6)  # fresh start latents are tanh(.) * 0.1
        done = term | trunc
        finished += int(done.sum())
        if mode == "same_step" and done.any():
            assert infos["_final_obs"].tolist() == done.tolist()
            assert np.all(np.abs(obs[done]) <= 0.1 + 1e-6)
        pending = done
        if mode == "disabled" and pending.any():
            obs, _ = envs.reset(options={"reset_mask": pending})
            assert np.all(np.abs(obs[pending]) <= 0.1 + 1e-6)
            pending = np.zeros(b, bool)
    assert finished > b
    envs.close()


@pytest.mark.parametrize("kind", WORLD_MODELS)
def test_world_model_modes_agree_up_to_the_first_reset(kind):
    """Same seed and actions: the three modes give the same transitions up to the first done, and
    SAME_STEP's final_obs is the terminal observation NEXT_STEP and DISABLED return."""
    b, model = 8, make_model(done_rate_bias=-1.0)
    keys = "observation" if kind == "transformed" else None
    runs = {m: to_gymnasium(_world_model(kind, model, b, seed=4), autoreset_mode=m, observation_keys=keys)
            for m in MODES}
    first = {m: envs.reset(seed=4)[0] for m, envs in runs.items()}
    assert np.array_equal(first["same_step"], first["next_step"]) and np.array_equal(first["same_step"],
                                                                                     first["disabled"])
    for action in action_stream(runs["same_step"].action_space, 50):
        out = {m: envs.step(action) for m, envs in runs.items()}
        same, nxt, dis = out["same_step"], out["next_step"], out["disabled"]
        for i in range(1, 4):
            assert np.array_equal(nxt[i], dis[i]) and np.array_equal(same[i], nxt[i])
        done = nxt[2] | nxt[3]
        assert np.array_equal(nxt[0], dis[0])
        assert np.array_equal(same[0][~done], nxt[0][~done])
        if done.any():
            for i in np.flatnonzero(done):
                assert np.array_equal(same[4]["final_obs"][i], nxt[0][i])
            return
    pytest.fail("no episode ended")


def test_numpy_false_returns_torch_on_the_env_device(device):
    envs = to_gymnasium(MLPWorldModelEnv(make_model(done_rate_bias=0.0), 8, device=device),
                        autoreset_mode="same_step", numpy=False)
    obs, infos = envs.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.device.type == device.type and obs.shape == (8, LAT)
    action = torch.zeros(8, ACT, device=device)
    for _ in range(10):
        obs2, rewards, term, trunc, infos = envs.step(action)
        assert all(isinstance(x, torch.Tensor) and x.device.type == device.type for x in (obs2, rewards, term, trunc))
        assert rewards.shape == (8,) and term.dtype == torch.bool
        if term.any():
            assert isinstance(infos["final_obs"][int(term.nonzero()[0])], torch.Tensor)
    obs2.add_(1.0)  # the caller owns what it gets: the env's state is not touched
    obs3, *_ = envs.step(action)
    assert obs3.abs().max() <= 1.0



def test_numpy_false_same_step_final_obs_is_the_terminal_observation_as_sync_vector_env():
    """SAME_STEP with numpy=False: infos["final_obs"] holds each finished env's terminal observation (as
    torch tensors), the values gymnasium's SyncVectorEnv gives, not the reset observation returned in obs."""
    n = 3
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n), autoreset_mode="same_step", numpy=False)
    ref = sync_twin("CartPole-v1", n, AutoresetMode.SAME_STEP)
    ours.reset(seed=5)
    ref.reset(seed=5)
    finished = 0
    for t, action in enumerate(action_stream(ours.action_space, 120, seed=5)):
        obs, _, term, trunc, infos = ours.step(torch.from_numpy(action))
        obs_ref, _, term_ref, trunc_ref, infos_ref = ref.step(action)
        assert obs.numpy().tolist() == obs_ref.tolist(), t
        done = (term | trunc).numpy()
        assert done.tolist() == (term_ref | trunc_ref).tolist(), t
        for i in np.flatnonzero(done):
            final = infos["final_obs"][i]
            assert isinstance(final, torch.Tensor)
            assert final.numpy().tolist() == infos_ref["final_obs"][i].tolist(), (t, i)
            assert final.numpy().tolist() != obs_ref[i].tolist(), (t, i)  # not the reset observation
            finished += 1
    assert finished > 5
    ours.close()
    ref.close()



def test_numpy_false_same_step_final_info_is_in_the_finished_envs_rows_as_sync_vector_env():
    """SAME_STEP with numpy=False: infos["final_info"][key] holds each finished env's terminal info in that
    env's own row (tensors), with the masks of gymnasium's SyncVectorEnv; env 1 (length 2) finishes alone."""
    fns = [functools.partial(CountingEnv, length=k) for k in (5, 2, 4)]
    ours = to_gymnasium(EnvPool(fns, seed_every_episode=False, info_keys=["t", "length"]),
                        autoreset_mode="same_step", numpy=False)
    ref = gym.vector.SyncVectorEnv([lambda f=f: probed(f()) for f in fns], autoreset_mode=AutoresetMode.SAME_STEP)
    ours.reset(seed=0)
    ref.reset(seed=0)
    finals = []
    for t in range(12):
        action = np.array([1, 2, 0])
        *_, infos = ours.step(torch.from_numpy(action))
        *_, infos_ref = ref.step(action)
        assert ("final_info" in infos) == ("final_info" in infos_ref), t
        if "final_info" not in infos_ref:
            continue
        assert infos["_final_info"].tolist() == infos_ref["_final_info"].tolist(), t
        for key in ("t", "length"):
            value, value_ref = infos["final_info"][key], infos_ref["final_info"][key]
            assert isinstance(value, torch.Tensor)
            mask = infos["final_info"]["_" + key]
            assert mask.tolist() == infos_ref["final_info"]["_" + key].tolist(), (t, key)
            assert value.cpu().numpy()[mask].tolist() == value_ref[mask].tolist(), (t, key)
            assert not value.cpu().numpy()[~mask].any(), (t, key)  # rows of envs that did not finish read 0
        finals.append(infos["final_info"]["t"].tolist())
    assert finals[0] == [0, 2, 0]  # env 1 finished alone, at t = 2
    assert len(finals) > 3
    ours.close()
    ref.close()

def test_numpy_false_next_step_reset_step_reward_is_zero_for_a_reward_shifting_transform():
    """NEXT_STEP over TransformedEnv(EnvPool, RewardScaling(loc=1)): the pool's frozen rows are not exact
    (the transform adds 1 to every row), so the export zeroes the reward of the step that restarts a
    finished env itself. numpy=False gives the rewards of numpy=True and of SyncVectorEnv with the same
    reward shift: 0 on the reset step, 2 on the others."""
    n = 3

    def export(numpy):
        env = TransformedEnv(EnvPool("CartPole-v1", num_envs=n), RewardScaling(loc=1.0, scale=1.0))
        return to_gymnasium(env, numpy=numpy, observation_keys="observation", info_keys=[])

    ours, ours_np = export(False), export(True)
    ref = gym.vector.SyncVectorEnv(
        [lambda: PoolSeedSchedule(gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: r + 1.0), n)
         for _ in range(n)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )
    for envs in (ours, ours_np, ref):
        envs.reset(seed=2)
    reset_steps = 0
    for t, action in enumerate(action_stream(ours.action_space, 80, seed=2)):
        _, rewards, term, trunc, _ = ours.step(torch.from_numpy(action))
        _, rewards_np, *_ = ours_np.step(action)
        _, rewards_ref, term_ref, trunc_ref, _ = ref.step(action)
        assert isinstance(rewards, torch.Tensor)
        assert rewards.tolist() == rewards_np.tolist() == rewards_ref.tolist(), t
        assert (term | trunc).tolist() == (term_ref | trunc_ref).tolist(), t
        reset_steps += int((rewards_ref == 0).sum())
    assert reset_steps > 3  # autoreset steps were exercised
    for envs in (ours, ours_np, ref):
        envs.close()


def test_outputs_are_fresh_arrays():
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=2), autoreset_mode="same_step")
    obs0, _ = envs.reset(seed=0)
    keep = obs0.copy()
    obs1, *_ = envs.step(np.zeros(2, np.int64))
    assert not np.shares_memory(obs0, obs1) and np.array_equal(obs0, keep)
    obs1[:] = 100.0  # writing into a returned array changes nothing in the env
    obs2, *_ = envs.step(np.zeros(2, np.int64))
    assert np.abs(obs2).max() < 10



def _masks(infos: dict, path=()) -> dict:
    """Copies of every ``_key`` mask array of ``infos`` (final_info's too), by path."""
    out = {}
    for key, value in infos.items():
        if isinstance(value, dict):
            out.update(_masks(value, (*path, key)))
        elif key.startswith("_"):
            out[(*path, key)] = value
    return out


def test_info_masks_are_fresh_arrays():
    """The "_final_obs", "_final_info" and "_key" masks a step returns are the caller's: later masked and
    full resets and steps (which update the export's own done flags) leave them as they were."""
    n = 4
    fns = [functools.partial(sparse_info, period=2, max_length=5)] * n
    envs = to_gymnasium(EnvPool(fns, seed=0, info_spec={"bonus": np.float64(0), "success": False}),
                        autoreset_mode="same_step")
    envs.reset(seed=0)
    for action in action_stream(envs.action_space, 50, seed=0):
        *_, term, trunc, infos = envs.step(action)
        if "_final_obs" in infos and not infos["_final_obs"].all():
            break
    else:
        pytest.fail("no step where some but not all envs finished")
    masks = _masks(infos)
    assert {("_final_obs",), ("_final_info",), ("final_info", "_success")} <= set(masks)
    kept = {path: mask.copy() for path, mask in masks.items()}
    envs.reset(options={"reset_mask": (term | trunc).copy()})
    envs.step(np.zeros(n, np.int64))
    envs.reset()
    for path, mask in masks.items():
        assert mask.tolist() == kept[path].tolist(), path
    envs.close()

def test_seeding_reproduces_and_lists_of_seeds():
    def run(seed):
        envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=3))
        first, _ = envs.reset(seed=seed)
        out = [envs.step(a)[0] for a in action_stream(envs.action_space, 50)]
        return first, np.stack(out)

    a, b = run(7), run(7)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    envs = to_gymnasium(EnvPool("CartPole-v1", num_envs=3))
    obs_list, _ = envs.reset(seed=[7, 8, 9])
    assert np.array_equal(obs_list, a[0])
    # np_random and np_random_seed are the sub-envs', as SyncVectorEnv's
    envs.reset(seed=7)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    sync.reset(seed=7)
    assert envs.np_random_seed == sync.np_random_seed == (7, 8, 9)
    assert [g.random() for g in envs.np_random] == [g.random() for g in sync.np_random]
    sync.close()


def test_world_model_seed_goes_through_set_seed():
    envs = to_gymnasium(MLPWorldModelEnv(make_model(), 4))
    a, _ = envs.reset(seed=3)
    b, _ = envs.reset(seed=3)
    c, _ = envs.reset(seed=[None] * 4)  # no seed: the stream continues
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # the env is seeded as a whole: an explicit per-env list cannot be honoured, so it is refused
    for seeds in ([3, 4, 5, 6], [3, 9, 1, 2]):
        with pytest.raises(ValueError, match="per-env seeds need an EnvPool"):
            envs.reset(seed=seeds)
    with pytest.raises(TypeError, match="reset options"):
        envs.reset(options={"foo": 1})


class _IgnoresStep(EnvBase):
    """MLPWorldModelEnv's dynamics in a batch-locked TorchRL env of user code that ignores "_step"
    (composition, not a subclass: a subclass of a package env keeps the package's "_step" contract)."""

    def __init__(self, *args, **kwargs):
        inner = MLPWorldModelEnv(*args, **kwargs)
        super().__init__(batch_size=inner.batch_size, device=inner.device)
        self.inner = inner
        self.observation_spec = inner.observation_spec.clone()
        self.action_spec = inner.action_spec.clone()
        self.reward_spec = inner.reward_spec.clone()
        self.done_spec = inner.done_spec.clone()

    def _reset(self, tensordict=None, **kwargs):
        return self.inner._reset(tensordict, **kwargs)

    def _step(self, tensordict):
        return self.inner._step(tensordict.exclude("_step"))

    def _set_seed(self, seed):
        self.inner._set_seed(seed)


def test_foreign_env_without_partial_steps_next_step():
    """A batch-locked TorchRL env that ignores "_step": finished rows are stepped once more, then reset."""
    b, model = 8, make_model(done_rate_bias=0.0)
    foreign = to_gymnasium(_IgnoresStep(model, b, seed=1), autoreset_mode="next_step")
    assert not foreign.traits.partial_steps and not foreign.traits.package_env
    ours = to_gymnasium(MLPWorldModelEnv(model, b, seed=1), autoreset_mode="next_step")
    assert ours.traits.partial_steps
    foreign.reset()
    ours.reset()
    pending = np.zeros(b, bool)
    for t, action in enumerate(action_stream(ours.action_space, 30)):
        o1, r1, t1, _, _ = foreign.step(action)
        o2, r2, t2, _, _ = ours.step(action)
        # identical until the first reset: afterwards the start latents are drawn at a different time
        assert np.all(r1[pending] == 0) and not t1[pending].any()
        assert np.all(np.abs(o1[pending]) <= 0.1 + 1e-6)
        if t == 0:
            assert np.array_equal(o1, o2)
        pending = t1.copy()


class BatchLockedCounting(EnvBase):
    """``CountingEnv``s (gymnasium, fixed lengths) as one batch-locked TorchRL env that ignores
    ``"_step"``: every step steps every row. The observation ``[t, episode, last_action]``
    counts resets (``episode``), and so does each sub-env (``resets_called``)."""

    def __init__(self, lengths, truncate=False):
        n = len(lengths)
        super().__init__(batch_size=torch.Size([n]))
        self.envs = [CountingEnv(length=length, truncate=truncate) for length in lengths]
        self.observation_spec = Composite(observation=Unbounded((n, 3)), shape=(n,))
        self.action_spec = Categorical(3, shape=(n,))
        self.reward_spec = Unbounded((n, 1))
        flag = lambda: Categorical(2, shape=(n, 1), dtype=torch.bool)  # noqa: E731
        self.done_spec = Composite(done=flag(), terminated=flag(), truncated=flag(), shape=(n,))
        self.last = np.zeros((n, 3), np.float32)

    def _reset(self, tensordict=None, **kwargs):
        mask = None if tensordict is None else tensordict.get("_reset", None)
        rows = range(len(self.envs)) if mask is None else np.flatnonzero(mask.reshape(-1).numpy()).tolist()
        for i in rows:
            self.last[i] = self.envs[i].reset()[0]
        false = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return TensorDict(observation=torch.from_numpy(self.last.copy()), done=false, terminated=false.clone(),
                          truncated=false.clone(), batch_size=self.batch_size)

    def _step(self, tensordict):
        out = [env.step(a) for env, a in zip(self.envs, tensordict.get("action").tolist())]
        self.last = np.stack([o[0] for o in out])
        term = torch.tensor([[o[2]] for o in out])
        trunc = torch.tensor([[o[3]] for o in out])
        return TensorDict(observation=torch.from_numpy(self.last.copy()), reward=torch.tensor([[o[1]] for o in out]),
                          done=term | trunc, terminated=term, truncated=trunc, batch_size=self.batch_size)

    def _set_seed(self, seed):
        pass


@pytest.mark.parametrize("truncate", [False, True])
def test_foreign_env_next_step_resets_each_episode_once(truncate):
    """NEXT_STEP on a batch-locked env without "_step" support against SyncVectorEnv over the same
    gymnasium envs: identical outputs, and each finished episode is reset exactly once."""
    lengths = [2, 3, 1, 4]
    n = len(lengths)
    ours = to_gymnasium(BatchLockedCounting(lengths, truncate), autoreset_mode="next_step")
    assert not ours.traits.partial_steps
    ref = gym.vector.SyncVectorEnv([lambda k=k: CountingEnv(length=k, truncate=truncate) for k in lengths],
                                   autoreset_mode=AutoresetMode.NEXT_STEP)
    assert_same(ours.reset()[0], ref.reset()[0], "reset obs")
    for t, action in enumerate(action_stream(ours.action_space, 40)):
        out, out_ref = ours.step(action), ref.step(action)
        for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], out_ref[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")
    resets = [env.resets_called for env in ours.env.envs]
    assert resets == [env.resets_called for env in ref.envs] and min(resets) > 5


def test_next_step_export_of_a_subclass_with_its_own_step_reports_the_reset_step_as_gymnasium():
    """A subclass whose _step shapes the reward (+100) must still report reward 0 on NEXT_STEP's reset step, as
    SyncVectorEnv around the same shaping does: its frozen rows' outputs are its own, not a reset's."""

    class ShapedPool(EnvPool):
        def _step(self, tensordict):
            out = super()._step(tensordict)
            out["reward"] = out["reward"] + 100
            return out

    from torchrl_swm import WorldModelEnv

    class ShapedWM(WorldModelEnv):
        def _step(self, tensordict):
            out = super()._step(tensordict)
            out["reward"] = out["reward"] + 100
            return out

    def transition(state, action):  # row 0 ends at t == 3, row 1 at t == 4
        t = state + 1
        return t, t, torch.zeros(len(state)), t[:, 0] >= torch.tensor([3.0, 4.0]), torch.zeros(len(state),
                                                                                                dtype=torch.bool), {}

    box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    fns = [functools.partial(CountingEnv, length=3), functools.partial(CountingEnv, length=4)]
    shaped = [lambda fn=fn: gym.wrappers.TransformReward(fn(), lambda r: r + 100) for fn in fns]
    made = {
        "pool": (to_gymnasium(ShapedPool(fns, seed_every_episode=False)), np.zeros(2, np.int64)),
        "world model": (to_gymnasium(ShapedWM(object(), box, box, num_envs=2, initial_state=torch.zeros(1),
                                              transition_fn=transition)), np.zeros((2, 1), np.float32)),
        "SyncVectorEnv": (gym.vector.SyncVectorEnv(shaped), np.zeros(2, np.int64)),
    }
    rewards = {}
    for name, (envs, action) in made.items():
        envs.reset(seed=0)
        rewards[name] = [envs.step(action)[1].tolist() for _ in range(6)]
        envs.close()
    expected = [[100, 100], [100, 100], [100, 100], [0, 100], [100, 0], [100, 100]]
    assert rewards == {name: expected for name in made}


def test_subclasses_of_package_envs_export_like_the_package_envs():
    """A user subclass of EnvPool (or WorldModelEnv) is exported exactly like the class it derives from:
    same traits, same outputs (info shapes included)."""

    class MyPool(EnvPool):
        pass

    assert MyPool.__module__ != EnvPool.__module__
    fns = [functools.partial(CountingEnv, length=k) for k in (2, 3, 4)]
    for mode in MODES:
        ours, base = to_gymnasium(MyPool(fns, seed=0), autoreset_mode=mode), to_gymnasium(EnvPool(fns, seed=0),
                                                                                         autoreset_mode=mode)
        assert ours.traits.partial_steps and ours.traits.package_env and ours.traits.frozen_rows_exact
        a, b = ours.reset(seed=0), base.reset(seed=0)
        assert_same(a, b, "reset")
        assert a[1]["episode_seed"].shape == (3,)
        for t, action in enumerate(action_stream(ours.action_space, 12)):
            out, out_ref = ours.step(action), base.step(action)
            assert_same(out, out_ref, f"{mode} step {t}")
            done = out[2] | out[3]
            if mode == "disabled" and done.any():
                assert_same(ours.reset(options={"reset_mask": done.copy()}),
                            base.reset(options={"reset_mask": done.copy()}), "masked reset")

    from torchrl_swm import WorldModelEnv

    class MyWM(WorldModelEnv):
        pass

    def transition(state, action):
        nxt = state + action
        return nxt, nxt.sum(-1), nxt[..., 0] > 1.5, torch.zeros_like(nxt[..., 0], dtype=torch.bool), {"x": nxt[..., 1]}

    def world_model(cls):
        return cls(None, observation_space=gym.spaces.Box(-9, 9, (2,)), action_space=gym.spaces.Box(-1, 1, (2,)),
                   num_envs=3, initial_state=torch.zeros(2), transition_fn=transition, info_spec={"x": torch.zeros(())})

    ours, base = to_gymnasium(world_model(MyWM)), to_gymnasium(world_model(WorldModelEnv))
    assert ours.traits == base.traits and ours.traits.partial_steps and ours.traits.package_env
    assert_same(ours.reset(seed=0), base.reset(seed=0), "reset")
    for t in range(6):
        action = np.full((3, 2), 0.5, np.float32)
        out, out_ref = ours.step(action), base.step(action)
        # the NEXT_STEP reset step (t = 4) reports the reset's info, which has no "x": absent, as on SyncVectorEnv
        assert ("x" in out[4]) == (t != 4) and (t == 4 or out[4]["x"].shape == (3,))
        assert_same(out, out_ref, f"world model step {t}")


class _StartEnv(gym.Env):
    """``Discrete(5, start=10)`` observations, ``Discrete(3, start=-1)`` actions (checked each step)."""

    observation_space = gym.spaces.Discrete(5, start=10)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.s = np.int64(10 + self.np_random.integers(5))  # a numpy integer, as Discrete.sample() gives
        self.t = 0
        return self.s, {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.s = np.int64(np.clip(self.s + action, 10, 14))
        self.t += 1
        return self.s, float(action), self.s == 14, self.t >= 6, {}


class _MultiStartEnv(gym.Env):
    """``MultiDiscrete`` with a ``start``, as observation and action."""

    observation_space = gym.spaces.MultiDiscrete([3, 4], start=[-1, 5])
    action_space = gym.spaces.MultiDiscrete([2, 3], start=[1, -2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.start + self.np_random.integers(0, [3, 4]), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        obs = self.observation_space.start + (np.abs(action) + self.t) % [3, 4]
        return obs, float(action.sum()), False, self.t >= 5, {}


@pytest.mark.parametrize("env_cls", [_StartEnv, _MultiStartEnv])
@pytest.mark.parametrize("categorical", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_discrete_start_matches_sync_vector_env(env_cls, categorical, mode):
    """Discrete/MultiDiscrete spaces with a start: the export shows the env's own spaces, observations in
    [start, start + n) and takes actions in that range, step by step as gymnasium's SyncVectorEnv."""
    n = 3
    pool = EnvPool([env_cls] * n, seed=0, categorical_action_encoding=categorical)
    ours = to_gymnasium(pool, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv([lambda: PoolSeedSchedule(env_cls(), n) for _ in range(n)],
                                   autoreset_mode=ours.autoreset_mode)
    assert ours.single_observation_space == ref.single_observation_space == env_cls.observation_space
    assert ours.single_action_space == ref.single_action_space == env_cls.action_space
    assert ours.observation_space == ref.observation_space and ours.action_space == ref.action_space
    assert _compare_to_sync(ours, ref, 40, seed=4, drop=("episode_seed",)) > 5
    # actions out of [start, start + n) are refused, in the original range accepted
    if env_cls is _StartEnv and mode == "same_step":
        ours.reset(seed=0)
        with pytest.raises(ValueError, match=r"must lie in Discrete\(3, start=-1\)"):
            ours.step(np.array([-1, 0, 2]))
        with pytest.raises(ValueError, match=r"must lie in Discrete\(3, start=-1\)"):
            ours.step(torch.tensor([-2, 0, 1]))
        ours.step(torch.tensor([-1, 0, 1]))
        ours.step(np.array([-1, 0, 1], np.int8))
    elif env_cls is _MultiStartEnv and mode == "same_step":
        ours.reset(seed=0)
        with pytest.raises(ValueError, match=r"must lie in MultiDiscrete"):
            ours.step(np.array([[1, -2], [2, 0], [0, 0]]))  # [0, 0]: below start [1, -2]
        with pytest.raises(ValueError, match=r"must lie in MultiDiscrete"):
            ours.step(np.array([[1, -2], [2, 0], [3, 0]]))  # 3 >= start + nvec = 3
        ours.step(np.array([[1, -2], [2, 0], [2, 0]], np.int32))


def test_discrete_start_through_a_transform_and_numpy_false():
    """A transform that leaves the leaves alone keeps the pool's spaces; numpy=False gives the same values."""
    n = 2
    ours = to_gymnasium(TransformedEnv(EnvPool([_StartEnv] * n, seed=0), StepCounter(4)), numpy=False,
                        observation_keys="observation", info_keys=[])
    assert ours.single_observation_space == gym.spaces.Discrete(5, start=10)
    assert ours.single_action_space == gym.spaces.Discrete(3, start=-1)
    ref = sync_twin_of(_StartEnv, n, AutoresetMode.NEXT_STEP, max_episode_steps=4)
    obs, _ = ours.reset(seed=1)
    obs_ref, _ = ref.reset(seed=1)
    assert isinstance(obs, torch.Tensor) and obs.tolist() == obs_ref.tolist()
    for t, action in enumerate(action_stream(ours.action_space, 20)):
        obs, *_ = ours.step(torch.from_numpy(action))
        obs_ref, *_ = ref.step(action)
        assert obs.tolist() == obs_ref.tolist(), t



@pytest.mark.parametrize("categorical", [True, False])
def test_numpy_false_actions_on_the_envs_device_with_a_start_reach_the_env_in_its_range(categorical, device):
    """A torch action on the env's device for Discrete(3, start=-1): the env gets the values sent (its
    reward is the action it received, and it checks each one against its space). On an accelerator the
    action is not range-checked on the host: the export shifts it by the start there, on the device."""
    envs = to_gymnasium(EnvPool([StartActionEnv] * 3, seed=0, device=device, categorical_action_encoding=categorical),
                        autoreset_mode="disabled", numpy=False)
    envs.reset(seed=0)
    for values in ([-1, 0, 1], [1, 1, -1], [0, -1, 0]):
        _, rewards, *_ = envs.step(torch.tensor(values, device=device))
        assert rewards.device.type == device.type
        assert rewards.tolist() == values
    envs.close()

def sync_twin_of(env_cls, n, mode, max_episode_steps=None):
    def make():
        env = env_cls()
        if max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_episode_steps)
        return PoolSeedSchedule(env, n)

    return gym.vector.SyncVectorEnv([make for _ in range(n)], autoreset_mode=mode)


@pytest.mark.parametrize("kind", ["pool", "transformed", "foreign"])
def test_next_step_resets_while_envs_wait_match_sync_vector_env(kind):
    """NEXT_STEP with masked and full resets at random times, also while some envs wait for their
    autoreset: envs left out show their final observation, envs reset get exactly one reset,
    as on SyncVectorEnv (unseeded, seeded, and masked)."""
    rng = np.random.default_rng(0)
    n = 5
    if kind == "foreign":
        lengths = [2, 3, 1, 4, 2]
        ours = to_gymnasium(BatchLockedCounting(lengths), autoreset_mode="next_step")
        ref = gym.vector.SyncVectorEnv([lambda k=k: CountingEnv(length=k) for k in lengths],
                                       autoreset_mode=AutoresetMode.NEXT_STEP)
        drop = ()
    else:
        env = EnvPool("CartPole-v1", num_envs=n)
        limit = None
        if kind == "transformed":
            limit = 9
            env = TransformedEnv(env, StepCounter(limit))
        ours = to_gymnasium(env, autoreset_mode="next_step", observation_keys="observation", info_keys=[])
        ref = sync_twin("CartPole-v1", n, AutoresetMode.NEXT_STEP, **({"max_episode_steps": limit} if limit else {}))
        drop = ("episode_seed",)
    assert_same(ours.reset(seed=0)[0], ref.reset(seed=0)[0], "reset obs")
    reset_waiting = left_waiting = 0  # resets of an env waiting for its autoreset; resets of others while one waits
    for t, action in enumerate(action_stream(ours.action_space, 300)):
        out, out_ref = ours.step(action), ref.step(action)
        for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], out_ref[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"step {t}: {name}")
        done = out[2] | out[3]
        if rng.random() < (0.6 if done.any() else 0.1):
            mask = rng.random(n) < 0.5
            if not mask.any():
                mask[rng.integers(n)] = True
            reset_waiting += int((done & mask).any())
            left_waiting += int((done & ~mask).any())
            seed = int(rng.integers(100)) if rng.random() < 0.3 else None
            options = None if rng.random() < 0.2 else {"reset_mask": mask}
            res, res_ref = ours.reset(seed=seed, options=options), ref.reset(seed=seed, options=options)
            assert_same(res[0], res_ref[0], f"step {t}: reset obs (mask {options}, seed {seed})")
            if kind != "foreign":  # BatchLockedCounting reports no infos
                assert_same(without(res[1], *drop), res_ref[1], f"step {t}: reset infos")
    assert reset_waiting > 5 and left_waiting > 5
    if kind == "foreign":
        assert [e.resets_called for e in ours.env.envs] == [e.resets_called for e in ref.envs]


def test_next_step_seed_list_reset_of_an_env_that_just_finished_matches_sync_vector_env():
    """NEXT_STEP, an env finished on the last step, then reset(seed=[...]) with None for some envs: a seeded
    env starts the episode of its seed and an unseeded one the episode its autoreset started, as on
    SyncVectorEnv. The finished env is seeded at the 1st and 3rd resets, left unseeded (the others seeded)
    at the 2nd."""
    n = 3
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=False), info_keys=[])
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    assert_same(ours.reset(seed=0)[0], ref.reset(seed=0)[0], "reset obs")
    checked = 0
    for t in range(200):
        action = np.zeros(n, np.int64)  # push left: a pole falls every few steps
        out, out_ref = ours.step(action), ref.step(action)
        assert_same((out[0], *out[2:4]), (out_ref[0], *out_ref[2:4]), f"step {t}")
        done = out_ref[2] | out_ref[3]
        if not done.any():
            continue
        if checked % 2 == 0:  # the first finished env gets a seed, the others none
            seeds = [None] * n
            seeds[int(np.flatnonzero(done)[0])] = 70 + t
        else:  # the finished envs get none, the others a seed
            seeds = [None if done[k] else 70 + t + k for k in range(n)]
        assert_same(ours.reset(seed=seeds)[0], ref.reset(seed=seeds)[0], f"step {t}: reset(seed={seeds})")
        checked += 1
        if checked == 3:
            break
    assert checked == 3
    ours.close()
    ref.close()


@pytest.mark.parametrize("masked", [False, True])
def test_next_step_reset_options_without_a_seed_reach_an_env_that_just_finished(masked):
    """NEXT_STEP: an env that finished on the last step was reset when it finished; reset(options=...) with
    no seed still resets it with those options (CartPole's "low"/"high" bound every start state), as
    SyncVectorEnv hands them to each env it resets. (Its episode is not SyncVectorEnv's: see reset's
    docstring, so the bounds are what is compared.)"""
    n = 4
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=False), info_keys=[])
    ours.reset(seed=0)
    for _ in range(200):
        _, _, term, trunc, _ = ours.step(np.zeros(n, np.int64))
        done = term | trunc
        if done.any():
            break
    assert done.any()
    options = {"low": 0.2, "high": 0.25}
    rows = np.ones(n, bool)
    if masked:
        options["reset_mask"], rows = done.copy(), done
    obs, _ = ours.reset(options=options)
    assert ((obs[rows] >= 0.2) & (obs[rows] <= 0.25)).all(), obs
    if masked:  # the others keep their state, outside those bounds
        assert not ((obs[~rows] >= 0.2) & (obs[~rows] <= 0.25)).all()
    ours.close()


def test_next_step_masked_reset_of_one_of_two_waiting_envs_matches_sync_vector_env(device):
    """NEXT_STEP, envs 0 and 1 finish on the same step; reset(options={"reset_mask": [True, False, False]})
    resets env 0 only. On the next step env 0 steps from that reset (its action applied) while env 1 makes
    its autoreset (reward 0), as on SyncVectorEnv. (On an accelerator the export's copy of the waiting rows
    is its own: the reset must clear env 0 from it.)"""
    lengths = [3, 3, 5]
    fns = [functools.partial(CountingEnv, length=k) for k in lengths]
    ours = to_gymnasium(EnvPool(fns, device=device, seed_every_episode=False), info_keys=[])
    ref = gym.vector.SyncVectorEnv([lambda f=f: probed(f()) for f in fns], autoreset_mode=AutoresetMode.NEXT_STEP)
    assert_same(ours.reset(seed=0)[0], ref.reset(seed=0)[0], "reset obs")

    def step(action, what):
        out, out_ref = ours.step(np.array(action)), ref.step(np.array(action))
        for name, a, b in zip(("obs", "rewards", "terminations", "truncations"), out[:4], out_ref[:4]):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}")  # SyncVectorEnv's rewards are float64
        return out

    for t in range(3):
        out = step([1, 1, 1], f"step {t}")
    assert out[2].tolist() == [True, True, False]
    mask = np.array([True, False, False])
    assert_same(ours.reset(options={"reset_mask": mask})[0], ref.reset(options={"reset_mask": mask})[0],
                "masked reset")
    obs, rewards, *_ = step([2, 2, 2], "the step after the masked reset")
    # [t, episode, last action]: env 0 stepped from its reset, env 1 restarted, env 2 stepped on
    assert obs.tolist() == [[1, 2, 2], [0, 2, 0], [4, 1, 2]] and rewards.tolist() == [2, 0, 2]
    for t in range(4):
        step([t % 3, 1, 2], f"step {t} after")
    ours.close()
    ref.close()


def test_vector_env_is_a_gymnasium_vector_env():
    envs = to_gymnasium(EnvPool([counting] * 2, seed=0))
    assert isinstance(envs, gym.vector.VectorEnv) and isinstance(envs, TorchRLVectorEnv)
    assert envs.num_envs == 2 and envs.unwrapped is envs
    assert envs.get_attr("length") is not None
    assert envs.call("get_wrapper_attr", "max_length") == (9, 9)
    envs.set_attr("max_length", 3)
    assert envs.get_attr("max_length") == (3, 3)
    envs.close()
    assert envs.closed and envs.env.is_closed


class _KeywordMethodEnv(CountingEnv):
    def echo(self, name=None, indices=None):
        return (name, indices)


def test_call_passes_every_keyword_to_the_sub_env_method():
    # SyncVectorEnv.call(name, *args, **kwargs) gives all kwargs to the method, an indices= among them
    ours = to_gymnasium(EnvPool([_KeywordMethodEnv] * 2, seed=0))
    ref = gym.vector.SyncVectorEnv([_KeywordMethodEnv] * 2)
    assert ours.call("echo", indices=1) == ref.call("echo", indices=1) == ((None, 1),) * 2
    # a name= too (which SyncVectorEnv's own name parameter refuses)
    assert ours.call("echo", name="x", indices=[0]) == (("x", [0]),) * 2
    assert ours.call("get_wrapper_attr", name="max_length") == (9, 9)
    assert ours.call(name="echo") == ref.call(name="echo") == ((None, None),) * 2  # the name as a keyword
    ours.close()
    ref.close()


class _IntKeyDictEnv(CountingEnv):
    """A counting env whose Dict observation has int keys (gymnasium allows any hashable key)."""

    def __init__(self):
        super().__init__(length=3)
        self.observation_space = gym.spaces.Dict(
            {1: gym.spaces.Box(-10, 10, (1,), np.float32), 2: gym.spaces.Dict({3: gym.spaces.Discrete(5, start=2)})})

    def _wrap(self, obs):
        return {1: obs[:1].astype(np.float32), 2: {3: 2 + int(obs[0]) % 5}}

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return self._wrap(obs), info

    def step(self, action):
        obs, *rest = super().step(action)
        return (self._wrap(obs), *rest)


@pytest.mark.parametrize("mode", ["same_step", "next_step"])
def test_dict_observation_keeps_the_envs_own_keys_as_sync_vector_env(mode):
    ours = to_gymnasium(EnvPool([_IntKeyDictEnv] * 2, seed=0, seed_every_episode=False), autoreset_mode=mode,
                        info_keys=[])
    ref = gym.vector.SyncVectorEnv([_IntKeyDictEnv] * 2, autoreset_mode=AutoresetMode[mode.upper()])
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.observation_space == ref.observation_space
    assert_same(ours.reset(seed=0)[0], ref.reset(seed=0)[0], "reset")
    for t in range(7):
        action = np.array([t % 2, 1])
        out, out_ref = ours.step(action), ref.step(action)
        assert_same(out[0], out_ref[0], f"step {t}")
        assert ours.observation_space.contains(out[0]) and list(out[0]) == [1, 2]
        if mode == "same_step" and out_ref[2].any():
            space = ours.single_observation_space
            for i in np.flatnonzero(out_ref[2]):  # the env's Python int is the export's numpy int: same value
                final, final_ref = out[4]["final_obs"][i], out_ref[4]["final_obs"][i]
                assert list(final) == [1, 2] and list(final[2]) == [3]
                assert np.array_equal(gym.spaces.flatten(space, final), gym.spaces.flatten(space, final_ref))
    ours.close()
    ref.close()


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_missing_sub_env_attributes_are_attribute_errors(backend):
    """As on SyncVectorEnv: ``except AttributeError`` probes work; the error names the env (EnvAttributeError)."""
    envs = to_gymnasium(EnvPool([counting] * 2, backend=backend, seed=0))
    try:
        for probe in (lambda: envs.get_attr("no_such_attribute"), lambda: envs.call("no_such_method")):
            with pytest.raises(AttributeError, match="no_such") as info:
                probe()
            assert isinstance(info.value, EnvError) and info.value.env_index in (0, 1)
        with pytest.raises(EnvError, match="TypeError"):  # other errors stay what they are
            envs.call("step", 1, 2)
    finally:
        envs.close()


def test_info_env_masks_partial_reset():
    n = 3
    pool = EnvPool([functools.partial(InfoEnv, {"r": 1.0}, [{"r": 2.0}])] * n, seed=0)
    envs = to_gymnasium(pool, autoreset_mode="disabled", info_keys=[("info", "r")])
    envs.reset(seed=0)
    envs.step(np.zeros(n, np.int64))
    _, infos = envs.reset(options={"reset_mask": np.array([False, True, False])})
    assert infos["_r"].tolist() == [False, True, False] and infos["r"].tolist() == [0.0, 1.0, 0.0]



@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_masked_reset_infos_of_envs_not_reset_read_zero_even_when_not_finite(value):
    """An env a masked reset leaves alone reads 0 with "_d" False, whatever its last info value was (inf or
    NaN too): numpy=False gives what numpy=True and SyncVectorEnv give, not a NaN from a product."""
    def make():
        return InfoEnv({"d": 1.0}, [{"d": value}])

    mask = np.array([True, False])
    ref = gym.vector.SyncVectorEnv([make, make], autoreset_mode=AutoresetMode.DISABLED)
    ref.reset(seed=0)
    ref.step(np.zeros(2, np.int64))
    _, infos_ref = ref.reset(options={"reset_mask": mask.copy()})
    assert infos_ref["d"].tolist() == [1.0, 0.0] and infos_ref["_d"].tolist() == [True, False]
    for numpy in (True, False):
        envs = to_gymnasium(EnvPool([make, make], seed_every_episode=False), autoreset_mode="disabled",
                            numpy=numpy, info_keys=[("info", "d")])
        envs.reset(seed=0)
        *_, infos = envs.step(np.zeros(2, np.int64) if numpy else torch.zeros(2, dtype=torch.int64))
        assert np.array_equal(np.asarray(infos["d"]), [value, value], equal_nan=True)
        _, infos = envs.reset(options={"reset_mask": mask.copy()})
        assert isinstance(infos["d"], np.ndarray if numpy else torch.Tensor)
        assert infos["d"].tolist() == infos_ref["d"].tolist(), numpy
        assert infos["_d"].tolist() == infos_ref["_d"].tolist(), numpy
        envs.close()
    ref.close()

@pytest.mark.parametrize("mode", MODES)
def test_packed_transfer_path(mode):
    """The accelerator path (every leaf packed into one device-to-host copy), run on the CPU."""
    n = 8
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n), autoreset_mode=mode)
    ours.packed_transfer = True
    ref = sync_twin("CartPole-v1", n, ours.autoreset_mode)
    assert _compare_to_sync(ours, ref, 200, seed=2, drop=("episode_seed",)) > 30


def test_to_host_packs_mixed_dtypes():
    from torchrl_swm.export._core import to_host

    leaves = [torch.rand(3, 5), torch.rand(3) > 0.5, torch.arange(6).view(3, 2), torch.rand(3, 2, dtype=torch.float64),
              torch.randint(0, 255, (3, 4, 4, 3), dtype=torch.uint8), torch.rand(3, 1).half()]
    for packed in (False, True):
        out = to_host(leaves, packed)
        for t, a in zip(leaves, out):
            assert a.dtype == t.numpy().dtype and a.shape == tuple(t.shape) and np.array_equal(a, t.numpy())
            assert not np.shares_memory(a, t.numpy()) and a.flags.aligned


def _counting_gym_env():
    from torchrl.envs import GymWrapper

    return GymWrapper(CountingEnv(length=3))


@pytest.mark.parametrize("mode", MODES)
def test_torchrl_serial_env(mode):
    """Any other batched TorchRL env: a SerialEnv of GymWrapper envs (OneHot actions). On the
    NEXT_STEP reset step the finished worker is frozen, not stepped: its counter restarts at 1."""
    from torchrl.envs import SerialEnv

    n = 3
    serial = SerialEnv(n, _counting_gym_env)
    envs = to_gymnasium(serial, autoreset_mode=mode)
    assert envs.traits.partial_steps and envs.single_action_space == gym.spaces.Discrete(3)
    obs, _ = envs.reset(seed=0)
    counts = []
    for _ in range(6):
        obs, rewards, term, trunc, infos = envs.step(np.ones(n, np.int64))
        counts.append(obs[0, 0])
        if mode == "disabled" and term.any():
            obs, _ = envs.reset(options={"reset_mask": term.copy()})
            counts.append(obs[0, 0])
    expected = {"next_step": [1, 2, 3, 0, 1, 2], "same_step": [1, 2, 0, 1, 2, 0], "disabled": [1, 2, 3, 0, 1, 2, 3, 0]}
    assert counts == expected[mode]  # NEXT_STEP: 0 on the reset step, then 1: the frozen worker was not stepped


def _counting_gym_env_of_length(length):
    from torchrl.envs import GymWrapper

    return GymWrapper(CountingEnv(length=length))


@pytest.mark.parametrize("mode", MODES)
def test_torchrl_serial_env_under_a_reshaping_transform_matches_sync_vector_env(mode):
    """CatFrames reshapes the SerialEnv's own "observation": TorchRL's partial step then fails
    (it copies the stacked root into the workers' buffers), so such an env steps every row, and
    its episodes still match SyncVectorEnv over FrameStackObservation in every mode."""
    from torchrl.envs import CatFrames, SerialEnv

    lengths = (2, 3, 5)
    serial = SerialEnv(3, [functools.partial(_counting_gym_env_of_length, k) for k in lengths])
    ours = to_gymnasium(TransformedEnv(serial, CatFrames(N=2, dim=-1, in_keys=["observation"])),
                        autoreset_mode=mode, info_keys=[])
    assert not ours.traits.partial_steps
    ref = gym.vector.SyncVectorEnv(
        [functools.partial(lambda k: gym.wrappers.FrameStackObservation(CountingEnv(length=k), 2,
                                                                        padding_type="reset"), k) for k in lengths],
        autoreset_mode=AutoresetMode[mode.upper()],
    )
    # [t, last_action] of both frames (TorchRL's GymWrapper resets each env once more when it builds, so
    # the episode counters differ by one)
    flat = lambda obs: np.asarray(obs).reshape(3, 2, 3)[..., [0, 2]]  # noqa: E731
    assert np.array_equal(flat(ours.reset(seed=0)[0]), flat(ref.reset(seed=0)[0]))
    finishes = 0
    for t, action in enumerate(action_stream(ours.action_space, 24)):
        out, out_ref = ours.step(action), ref.step(action)
        assert np.array_equal(flat(out[0]), flat(out_ref[0])), f"step {t}"
        np.testing.assert_array_equal(out[1], out_ref[1])
        assert np.array_equal(out[2], out_ref[2]) and np.array_equal(out[3], out_ref[3]), f"step {t}"
        done = out_ref[2] | out_ref[3]
        finishes += int(done.sum())
        if mode == "disabled" and done.any():
            mask = {"reset_mask": done.copy()}
            assert np.array_equal(flat(ours.reset(options=dict(mask))[0]), flat(ref.reset(options=dict(mask))[0]))
    assert finishes >= 8
    ours.close()


def test_gym_wrapper_of_a_vector_env_refuses_next_step_and_matches_sync_vector_env_otherwise():
    """TorchRL's GymWrapper over a gymnasium VectorEnv steps and auto-resets every row at once: NEXT_STEP
    could not hold a finished row back, and once crashed at the first uneven episode end."""
    from torchrl.envs import GymWrapper

    def inner(mode):
        return gym.vector.SyncVectorEnv(
            [functools.partial(gym.make, "CartPole-v1", max_episode_steps=k) for k in (3, 5, 8)], autoreset_mode=mode
        )

    with pytest.raises(ValueError, match="GymWrapper wraps an already-batched env.*'same_step' or 'disabled'"):
        to_gymnasium(GymWrapper(inner(AutoresetMode.SAME_STEP)))
    ours = to_gymnasium(GymWrapper(inner(AutoresetMode.SAME_STEP)), autoreset_mode="same_step", info_keys=[])
    ref = inner(AutoresetMode.SAME_STEP)
    assert np.array_equal(ours.reset(seed=0)[0], ref.reset(seed=0)[0])
    for t, action in enumerate(action_stream(ours.action_space, 20)):
        out, out_ref = ours.step(action), ref.step(action)
        assert_same((out[0], *out[2:4]), (out_ref[0], *out_ref[2:4]), f"step {t}")
        for i in np.flatnonzero(out_ref[2] | out_ref[3]):
            assert np.array_equal(out[4]["final_obs"][i], out_ref[4]["final_obs"][i])
    # TorchRL resets it as a whole or exactly in its finished rows: any other mask is refused, naming both
    ours.reset(seed=0)
    for _ in range(3):
        done = np.logical_or(*ours.step(np.zeros(3, np.int64))[2:4])
    assert done.tolist() == [True, False, False]
    with pytest.raises(ValueError, match=r"finished on the last step \(\[0\]\); got a mask of rows \[1, 2\]"):
        ours.reset(options={"reset_mask": ~done})
    assert ours.reset(options={"reset_mask": done})[0].shape == (3, 4)
    ours.close()


@pytest.mark.parametrize("seed_every_episode", [True, False])
def test_seed_lists_with_none_match_sync_vector_env(seed_every_episode):
    """reset(seed=[1, None, 3]): None leaves that env unseeded (it continues its schedule or stream), as
    SyncVectorEnv's list[int | None]; on the first reset, after steps, and with a reset mask."""
    n = 3
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=seed_every_episode), info_keys=[])
    if seed_every_episode:
        ref = sync_twin("CartPole-v1", n, AutoresetMode.NEXT_STEP)
    else:  # gymnasium's own convention: plain SyncVectorEnv
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    assert_same(ours.reset(seed=[5, 6, 7]), ref.reset(seed=[5, 6, 7]), "first reset")
    fresh = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=seed_every_episode), info_keys=[])
    obs, _ = fresh.reset(seed=[1, None, 3])  # the first reset, mixed: seeded rows are seeded
    assert obs.shape == (n, 4) and np.array_equal(obs[[0, 2]], ours.reset(seed=[1, 2, 3])[0][[0, 2]])
    ours.reset(seed=0)
    ref.reset(seed=0)
    for t, action in enumerate(action_stream(ours.action_space, 60)):
        out, out_ref = ours.step(action), ref.step(action)
        np.testing.assert_array_equal(out[1], out_ref[1])  # SyncVectorEnv widens rewards to float64
        assert_same((out[0], *out[2:4]), (out_ref[0], *out_ref[2:4]), f"step {t}")
        if t % 10 == 9:
            seeds = [[1, None, 3], [None, None, None], [None, 7, None], np.array([4, 5, 6])][(t // 10) % 4]
            options = {"reset_mask": np.array([True, True, False])} if t % 20 == 9 else None
            assert_same(ours.reset(seed=seeds, options=dict(options) if options else None),
                        ref.reset(seed=[None if x is None else int(x) for x in seeds],
                                  options=dict(options) if options else None), f"reset {seeds}")
    with pytest.raises(TypeError, match="integers or None"):
        ours.reset(seed=[1, 2.5, None])
    # other envs are seeded as a whole: all-None lists are fine, mixed ones are refused
    wm = to_gymnasium(MLPWorldModelEnv(make_model(), 3))
    wm.reset(seed=[None, None, None])
    with pytest.raises(ValueError, match="per-env seeds need an EnvPool"):
        wm.reset(seed=[1, None, 3])


def test_a_full_reset_with_a_mixed_seed_list_in_disabled_mode_is_silent_and_exact():
    # the reset runs in two masked parts (seeded rows, unseeded rows); a finished env's done flag must not
    # make TorchRL warn about a partial reset the user never asked for
    import warnings

    n = 4
    ours = to_gymnasium(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=False), autoreset_mode="disabled",
                        info_keys=[])
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)],
                                   autoreset_mode=AutoresetMode.DISABLED)
    assert_same(ours.reset(seed=0), ref.reset(seed=0), "reset")
    while True:  # push left until a pole falls
        out, out_ref = ours.step(np.zeros(n, np.int64)), ref.step(np.zeros(n, np.int64))
        assert_same(out[0], out_ref[0], "step")
        if (out[2] | out[3]).any():
            break
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(ours.reset(seed=[5, None, 7, None]), ref.reset(seed=[5, None, 7, None]), "mixed seeds")
    ours.close()


def test_transform_leaving_one_leaf_of_a_dict_pool_gives_a_box():
    """CatTensors over a Dict-observation pool leaves one leaf: a Box, with the values gymnasium's
    FlattenObservation gives on SyncVectorEnv."""
    from torchrl.envs import CatTensors

    class TwoBoxes(gym.Env):
        observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32),
                                             "b": gym.spaces.Box(-1, 1, (3,), np.float32)})
        action_space = gym.spaces.Discrete(2)

        def _obs(self):
            return {"a": self.np_random.uniform(-1, 1, 2).astype(np.float32),
                    "b": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self._obs(), {}

        def step(self, action):
            return self._obs(), 0.0, False, False, {}

    n = 2
    ours = to_gymnasium(TransformedEnv(EnvPool([TwoBoxes] * n), CatTensors(["a", "b"], "observation")))
    assert isinstance(ours.single_observation_space, gym.spaces.Box) and ours.single_observation_space.shape == (5,)
    ref = gym.vector.SyncVectorEnv([lambda: PoolSeedSchedule(gym.wrappers.FlattenObservation(TwoBoxes()), n)
                                    for _ in range(n)])
    obs, _ = ours.reset(seed=0)
    np.testing.assert_array_equal(obs, ref.reset(seed=0)[0])
    for _ in range(3):
        np.testing.assert_array_equal(ours.step(np.zeros(n, np.int64))[0], ref.step(np.zeros(n, np.int64))[0])
    # a pool's own Dict stays a Dict while its entries are the observation (as SyncVectorEnv shows it)
    kept = to_gymnasium(TransformedEnv(EnvPool([TwoBoxes] * n), StepCounter(5)), info_keys=["step_count"])
    assert kept.single_observation_space == TwoBoxes.observation_space


def test_info_keys_leave_the_default_observation():
    """A leaf chosen as an info is not also in the default observation (which is every leaf but the infos)."""
    n = 3
    env = TransformedEnv(EnvPool("CartPole-v1", num_envs=n), StepCounter(5))
    ours = to_gymnasium(env, info_keys=["step_count"])
    assert ours.single_observation_space == gym.make("CartPole-v1").observation_space  # a Box, not a Dict
    ref = sync_twin("CartPole-v1", n, AutoresetMode.NEXT_STEP, max_episode_steps=5)
    obs, infos = ours.reset(seed=0)
    assert_same(obs, ref.reset(seed=0)[0], "reset obs")
    assert infos["step_count"].tolist() == [0] * n and infos["_step_count"].all()
    for t in range(4):
        obs, *_, infos = ours.step(np.ones(n, np.int64))
        assert_same(obs, ref.step(np.ones(n, np.int64))[0], f"step {t}")
        assert infos["step_count"].tolist() == [t + 1] * n
    # naming the leaf in observation_keys too is explicit: both
    both = to_gymnasium(TransformedEnv(EnvPool("CartPole-v1", num_envs=n), StepCounter(5)),
                        observation_keys=["observation", "step_count"], info_keys=["step_count"])
    assert set(both.single_observation_space) == {"observation", "step_count"}


def test_info_keys_tuple_is_one_nested_key():
    """info_keys=("info", "t") names one nested key, as observation_keys does; a list names several."""
    pool = lambda: EnvPool([functools.partial(CountingEnv, length=2)] * 2, seed=0)  # noqa: E731
    nested = to_gymnasium(pool(), info_keys=("info", "t")).reset(seed=0)[1]
    listed = to_gymnasium(pool(), info_keys=[("info", "t")]).reset(seed=0)[1]
    assert set(nested) == set(listed) == {"t", "_t"}
    assert_same(nested, listed, "infos")
    several = to_gymnasium(pool(), info_keys=[("info", "t"), "episode_seed"]).reset(seed=0)[1]
    assert set(several) == {"t", "_t", "episode_seed", "_episode_seed"}
    assert set(to_gymnasium(pool(), info_keys=("info",)).reset(seed=0)[1]) == {"t", "_t", "length", "_length"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an accelerator")
def test_accelerator_actions_for_a_cpu_env_are_range_checked():
    envs = to_gymnasium(EnvPool([_StartEnv] * 3, seed=0), numpy=False)
    envs.reset(seed=0)
    with pytest.raises(ValueError, match=r"must lie in Discrete\(3, start=-1\)"):
        envs.step(torch.tensor([-1, 0, 2], device="cuda"))
    obs, *_ = envs.step(torch.tensor([-1, 0, 1], device="cuda"))
    assert obs.min() >= 10


# -- pools over a gymnasium VectorEnv (they step every row at once) ------------------------------------
@pytest.mark.parametrize("inner", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
@pytest.mark.parametrize("mode", ["same_step", "disabled"])
def test_pool_over_a_sync_vector_env_matches_sync_vector_env(inner, mode):
    n = 4
    # an inner SAME_STEP env resets finished rows itself, unseeded: the pool then seeds once, and
    # both sides continue each env's stream; otherwise both follow the pool's seed schedule
    seed_once = inner is AutoresetMode.SAME_STEP

    def make():
        return gym.make("CartPole-v1") if seed_once else PoolSeedSchedule(gym.make("CartPole-v1"), n)

    pool = EnvPool(gym.vector.SyncVectorEnv([make] * n, autoreset_mode=inner), seed_every_episode=not seed_once)
    ours = to_gymnasium(pool, autoreset_mode=mode)
    ref = gym.vector.SyncVectorEnv([make] * n, autoreset_mode=AutoresetMode(ours.metadata["autoreset_mode"]))
    assert _compare_to_sync(ours, ref, 300, seed=3, drop=("episode_seed",)) > 30
    ours.close()
    ref.close()


class _ResetCounter(gym.Env):
    """Ends every ``length`` steps; each reset draws its observation from the env's RNG and is counted."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length):
        self.length, self.resets, self.t = length, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.resets = 0, self.resets + 1
        return np.array([self.np_random.normal(), 0.0]), {}

    def step(self, action):
        self.t += 1
        return np.array([0.0, self.t]), 1.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("lengths", [[2, 3, 2], [2, 2, 2]])  # some envs ended, or all of them
def test_a_full_reset_after_a_same_step_vector_env_reset_rows_itself_resets_each_env_once(lengths):
    """Exported DISABLED over a SAME_STEP SyncVectorEnv: reset() after some envs ended resets every env once, as
    SyncVectorEnv(DISABLED) does; the rows the inner env had already reset take that reset, not a second one."""
    fns = [functools.partial(_ResetCounter, k) for k in lengths]
    inner = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    ours = to_gymnasium(EnvPool(inner, seed_every_episode=False), autoreset_mode="disabled")
    ref = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED)
    for env in (ours, ref):
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.zeros(3, np.int64))
    ref_obs, _ = ref.reset()
    our_obs, _ = ours.reset()
    np.testing.assert_array_equal(our_obs, ref_obs)
    # one reset more each: the pool's construction probe
    assert [r + 1 for r in ref.get_attr("resets")] == list(ours.get_attr("resets"))
    ours.close()
    ref.close()


def test_pool_over_a_natively_batched_vector_env_exports():
    venv = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    pool = EnvPool(venv, seed=0)
    env = to_gymnasium(pool, autoreset_mode="same_step")
    assert env.metadata["render_fps"] == venv.metadata["render_fps"]  # the VectorEnv's own metadata
    env.reset(seed=0)
    finished = 0
    for action in action_stream(env.action_space, 200):
        obs, _, term, trunc, infos = env.step(action)
        finished += int((term | trunc).sum())
        for i in np.flatnonzero(term):  # a terminal observation is past a threshold, never a reset one
            final = infos["final_obs"][i]
            assert abs(final[0]) > 2.4 or abs(final[2]) > 12 * 2 * np.pi / 360
            assert (np.abs(obs[i]) <= 0.05).all()
    assert finished > 20
    env.close()


def test_next_step_export_of_a_pool_over_a_vector_env_is_refused_clearly():
    # a VectorEnv steps every row: NEXT_STEP's unstepped env after a done cannot be expressed
    pool = EnvPool(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"), seed=0)
    with pytest.raises(ValueError, match=r"runs a gymnasium VectorEnv.*autoreset_mode='same_step' or 'disabled'"):
        to_gymnasium(pool)
    to_gymnasium(pool, autoreset_mode="same_step").close()


@pytest.mark.parametrize("kind", ["vector", "single", "sb3", "make", "make_vec"])
def test_closing_an_export_closes_the_pool_and_its_envs(kind):
    """TorchRL's EnvBase starts with is_closed=True, so "close unless closed" never closed anything."""
    from envs import CLOSED_ENVS, ClosingEnv

    from torchrl_swm import register_gymnasium_env, to_sb3_vec_env

    pytest.importorskip("stable_baselines3") if kind == "sb3" else None
    from torchrl_swm.export import TorchRLGymEnv

    n = 1 if kind in ("single", "make") else 3
    if kind in ("make", "make_vec"):
        env_id = f"TestClosing-{kind}-v0"
        def closing_pool(num_envs, seed_every_episode=True):
            return EnvPool([ClosingEnv] * num_envs, seed_every_episode=seed_every_episode)

        register_gymnasium_env(env_id, closing_pool)
        export = gym.make(env_id) if kind == "make" else gym.make_vec(env_id, num_envs=n)
        pool = export.unwrapped.env
        gym.registry.pop(env_id)
    else:
        pool = EnvPool([ClosingEnv] * n, seed=0)
        export = {"vector": to_gymnasium, "single": functools.partial(TorchRLGymEnv, squeeze_batch=True),
                  "sb3": to_sb3_vec_env}[kind](pool)
    assert isinstance(pool, EnvPool) and pool.num_envs == n and not pool.is_closed
    export.reset()
    CLOSED_ENVS.clear()
    export.close()
    assert len(CLOSED_ENVS) == n and pool.is_closed
    # the message names an export's close too, where the pool's user may look for it (review F F3)
    with pytest.raises(RuntimeError, match=r"EnvPool is closed \(close\(\) was called: .*an export's, "
                                           r"to_gymnasium\(pool\).close\(\) or SB3's VecEnv.close\(\)"):
        pool.reset()
    export.close()  # a second close does nothing
    assert len(CLOSED_ENVS) == n


@pytest.mark.parametrize("kind", ["vector", "single", "sb3"])
def test_an_export_reopened_by_a_reset_after_close_closes_its_world_model_again(kind):
    # a WorldModelEnv reopens at a full reset (as TorchRL's batched envs): through a closed export too, and the
    # export (its `closed` set) then never closed it again, its rows' state never released
    from torchrl_swm import to_sb3_vec_env
    from torchrl_swm.export import TorchRLGymEnv

    pytest.importorskip("stable_baselines3") if kind == "sb3" else None
    wm = world_model_env(make_model(), 1 if kind == "single" else 3)
    export = {"vector": to_gymnasium, "single": functools.partial(TorchRLGymEnv, squeeze_batch=True),
              "sb3": to_sb3_vec_env}[kind](wm)
    action = np.zeros((ACT,) if kind == "single" else (3, ACT), np.float32)
    for _ in range(2):
        export.reset()
        export.step(action)
        export.close()
        assert wm.is_closed
        with pytest.raises(RuntimeError, match="WorldModelEnv is closed"):
            export.step(action)
    export.close()  # a second close does nothing
    assert wm.is_closed


@pytest.mark.parametrize("kind", ["vector", "single"])
def test_a_closed_export_refuses_to_step_a_torchrl_batched_env_back_to_life(kind):
    # TorchRL's batched envs restart on any call: a step through the closed export rebuilt their envs (workers,
    # for a ParallelEnv) with the export still marked closed, so no close() ever ended them
    from torchrl.envs import GymEnv, SerialEnv

    from torchrl_swm.export import TorchRLGymEnv

    env = SerialEnv(1 if kind == "single" else 2, functools.partial(GymEnv, "Pendulum-v1"))
    export = to_gymnasium(env) if kind == "vector" else TorchRLGymEnv(env, squeeze_batch=True)
    action = np.zeros((1,) if kind == "single" else (2, 1), np.float32)
    export.reset(seed=0)
    export.step(action)
    export.close()
    assert env.is_closed
    with pytest.raises(RuntimeError, match=r"^TorchRL(Vector|Gym)Env\.step\(\) after close\(\): SerialEnv is closed; reset\(\) reopens it"):
        export.step(action)
    assert env.is_closed
    export.reset(seed=0)  # reopened: the next close() closes it again
    export.step(action)
    export.close()
    assert env.is_closed


class _FailsToStartAt13(CountingEnv):
    def reset(self, *, seed=None, options=None):
        if seed == 13:
            raise ValueError("simulator failed to start")
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize("kind", ["vector", "single"])
def test_a_closed_export_reopens_only_by_a_full_reset_and_closes_what_a_failed_one_restarted(kind):
    from torchrl.envs import GymWrapper, SerialEnv

    from torchrl_swm.export import TorchRLGymEnv

    env = SerialEnv(1 if kind == "single" else 2, lambda: GymWrapper(_FailsToStartAt13()))
    export = to_gymnasium(env) if kind == "vector" else TorchRLGymEnv(env, squeeze_batch=True)
    export.reset(seed=0)
    export.close()
    if kind == "vector":  # the other rows' state went with the close: a masked reset is refused
        with pytest.raises(RuntimeError, match=r"reset_mask.*after close\(\): reset every env to reopen"):
            export.reset(options={"reset_mask": np.array([True, False])})
        assert export.closed and env.is_closed
    with pytest.raises((ValueError, gym.error.Error)):  # refused before the env is touched: still closed
        export.reset(seed=[1, 2, 3] if kind == "vector" else "13")
    with pytest.raises(RuntimeError, match=r"step\(\) after close\(\)"):
        export.step(np.zeros(2 if kind == "vector" else (), np.int64))
    assert env.is_closed
    with pytest.raises(ValueError, match="simulator failed to start"):
        export.reset(seed=13)  # restarted the sub-envs, then failed
    assert not env.is_closed
    export.close()  # still closes what the failed reset restarted
    assert env.is_closed


def test_a_closed_next_step_world_model_export_reopens_at_a_plain_reset_with_rows_that_had_finished():
    # NEXT_STEP resets a finished row when it finishes (an env that honours "_step"); the next reset() skips
    # it: after close() that made the reopening reset a partial one, which a closed WorldModelEnv refuses
    from torchrl_swm.world_model import WorldModelEnv

    def transition(state, action):
        state = state + action.sum(-1, keepdim=True)
        return state, state[:, :1], state[:, 0] > 0.5, torch.zeros_like(state[:, 0], dtype=torch.bool), {}

    env = WorldModelEnv(None, gym.spaces.Box(-9, 9, (2,)), gym.spaces.Box(-1, 1, (1,)), num_envs=2,
                        initial_state=torch.zeros(2), transition_fn=transition, seed=0)
    export = to_gymnasium(env)
    export.reset(seed=0)
    assert export.step(np.array([[1.0], [0.0]], np.float32))[2].tolist() == [True, False]
    export.close()
    obs, _ = export.reset()
    assert obs.tolist() == [[0.0, 0.0], [0.0, 0.0]] and not env.is_closed
    export.step(np.zeros((2, 1), np.float32))
    export.close()
    assert env.is_closed


def test_closing_an_export_reaps_the_pool_workers():
    pool = EnvPool([counting] * 2, backend="process", num_workers=2, seed=0)
    pids = pool._backend.pids
    assert len(pids) == 2
    export = to_gymnasium(pool)
    export.reset(seed=0)
    export.close()
    assert_reaped(pids)  # the workers exited and were waited for, no zombie left


@pytest.mark.parametrize("source", ["serial", "vector"])
def test_np_random_seed_is_one_seed_per_env_as_on_sync_vector_env(source):
    n = 3
    make = functools.partial(gym.make, "CartPole-v1")
    pool = EnvPool([make] * n, seed_every_episode=False) if source == "serial" else EnvPool(
        gym.vector.SyncVectorEnv([make] * n), seed_every_episode=False)
    venv, sync = to_gymnasium(pool, autoreset_mode="same_step"), gym.vector.SyncVectorEnv([make] * n)
    for seed in (0, [7, 8, 9]):
        venv.reset(seed=seed)
        sync.reset(seed=seed)
        assert venv.np_random_seed == sync.np_random_seed == ((0, 1, 2) if seed == 0 else (7, 8, 9))
        ours_rng, sync_rng = venv.np_random, sync.np_random  # the sub-envs' generators, at the same point
        if source == "serial":
            assert isinstance(ours_rng, tuple) and len(ours_rng) == n
            assert [g.random() for g in ours_rng] == [g.random() for g in sync_rng]
        else:  # a pool of one SyncVectorEnv: that vector env's own
            assert ours_rng == pool._backend.venv.np_random
    with pytest.raises(AttributeError, match="seed them with reset"):
        venv.np_random = np.random.default_rng(0)
    venv.close()
    sync.close()


class _RunningSum(EnvBase):
    """A TorchRL env with batch ``[n]`` whose state lives in the tensordict: obs += action + 1, ending at >= 6."""

    def __init__(self, n, unlocked):
        super().__init__(batch_size=torch.Size([n]))
        flag = lambda: Categorical(2, (n, 1), dtype=torch.bool)  # noqa: E731
        self.observation_spec = Composite(observation=Unbounded((n, 1)), shape=(n,))
        self.action_spec = Categorical(3, shape=(n,))
        self.reward_spec = Unbounded((n, 1))
        self.done_spec = Composite(done=flag(), terminated=flag(), truncated=flag(), shape=(n,))
        if unlocked:
            self._batch_locked = False

    def _reset(self, td):
        bs = td.batch_size if td is not None else self.batch_size
        obs = torch.zeros(*bs, 1)
        if td is not None and "_reset" in td.keys() and "observation" in td.keys():
            obs = torch.where(td["_reset"], 0.0, td["observation"])
        z = torch.zeros(*bs, 1, dtype=torch.bool)
        return TensorDict({"observation": obs, "done": z, "terminated": z.clone(), "truncated": z.clone()}, bs)

    def _step(self, td):
        a = td["action"].float().unsqueeze(-1)
        s = td["observation"] + a + 1
        term = s >= 6
        return TensorDict({"observation": s, "reward": a + 1, "done": term, "terminated": term,
                           "truncated": torch.zeros_like(term)}, td.batch_size)

    def _set_seed(self, seed):
        pass


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_a_batch_unlocked_env_with_a_batch_dim_exports_as_its_batch_locked_twin(mode):
    # TorchRL steps an unlocked env's "_step" rows as a sub-batch, which an env with a batch dim cannot take:
    # the export steps every row of it (as for any env that cannot freeze rows), and matches the locked twin
    outputs = []
    for unlocked in (False, True):
        env = to_gymnasium(_RunningSum(4, unlocked), autoreset_mode=mode)
        steps = [env.reset()[0]]
        for _ in range(8):  # row 0 ends every 2 steps, the others every 6
            steps.append(env.step(np.array([2, 0, 0, 0]))[:4])
        outputs.append(steps)
        env.close()
    locked, unlocked = outputs
    for a, b in zip(locked, unlocked, strict=True):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True):
            assert np.array_equal(x, y)
    if mode == "next_step":  # row 0: 3, 6 (end), reset 0, 3, 6, reset 0, ...
        assert [float(s[0][0, 0]) for s in locked[1:]] == [3, 6, 0, 3, 6, 0, 3, 6]


class _NoTruncatedKey(EnvBase):
    """Two rows with done/terminated only (no "truncated" key) and a reward of ``reward_dtype`` (action + 1):
    row 0 terminates at every step, row 1 never."""

    def __init__(self, reward_dtype=torch.float32):
        super().__init__(batch_size=torch.Size([2]))
        flag = lambda: Categorical(2, (2, 1), dtype=torch.bool)
        self.observation_spec = Composite(observation=Unbounded((2, 1)), shape=(2,))
        self.action_spec = Categorical(2, shape=(2,))
        self.reward_spec = Unbounded((2, 1), dtype=reward_dtype)
        self.done_spec = Composite(done=flag(), terminated=flag(), shape=(2,))

    def _reset(self, td):
        z = torch.zeros(2, 1, dtype=torch.bool)
        return TensorDict(observation=torch.zeros(2, 1), done=z, terminated=z.clone(), batch_size=[2])

    def _step(self, td):
        term = torch.tensor([[True], [False]])
        reward = (td["action"].unsqueeze(-1) + 1).to(self.reward_spec.dtype)
        return TensorDict(observation=torch.ones(2, 1), reward=reward, done=term, terminated=term.clone(),
                          batch_size=[2])

    def _set_seed(self, seed):
        pass


@pytest.mark.parametrize("mode", MODES)
def test_an_env_without_a_truncated_key_reports_no_truncations(mode):
    """A done spec of done/terminated only: truncations are all False (not the terminations), with numpy=True
    as with numpy=False, and in SAME_STEP the finished row is the one that terminated."""
    assert "truncated" not in _NoTruncatedKey().done_keys
    for numpy in (True, False):
        envs = to_gymnasium(_NoTruncatedKey(), autoreset_mode=mode, numpy=numpy)
        envs.reset(seed=0)
        _, _, term, trunc, infos = envs.step(np.zeros(2, np.int64))
        assert term.tolist() == [True, False] and trunc.tolist() == [False, False], numpy
        assert trunc.dtype in (np.bool_, torch.bool)
        if mode == "same_step":
            assert infos["_final_obs"].tolist() == [True, False]
        envs.close()


@pytest.mark.parametrize("numpy", [True, False])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16])
def test_an_integer_reward_spec_gives_float32_rewards(dtype, numpy):
    """gymnasium's rewards are floats (SyncVectorEnv's float64, the export's float32): an integer (or half)
    reward reaches the caller as float32 values, with numpy=True as with numpy=False."""
    envs = to_gymnasium(_NoTruncatedKey(dtype), autoreset_mode="same_step", numpy=numpy)
    envs.reset(seed=0)
    rewards = envs.step(np.array([0, 1]))[1]
    assert isinstance(rewards, np.ndarray if numpy else torch.Tensor)
    assert rewards.dtype == (np.float32 if numpy else torch.float32) and rewards.tolist() == [1.0, 2.0]
    envs.close()


@pytest.mark.parametrize("mode", MODES)
def test_torchrl_gym_env_with_num_envs_is_refused_in_every_mode(mode):
    # GymEnv(id, num_envs=N) adds TorchRL's VecGymEnvTransform, which rewrites the vector env's autoreset:
    # its finished rows came out with terminal (SAME_STEP) or zero (DISABLED) observations
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1", num_envs=3)
    with pytest.raises(ValueError,
                       match=r"GymEnv\(id, num_envs=N\).*NEXT_STEP autoreset.*Export EnvPool\(gym.make_vec"):
        to_gymnasium(env, autoreset_mode=mode)
    env.close()


@pytest.mark.parametrize("transformed", [False, True])
def test_a_closed_pool_export_says_the_pool_cannot_be_reopened_on_step_and_masked_reset(transformed):
    # a step (and a masked reset) after close() advised a reset that a closed EnvPool refuses; under a
    # TransformedEnv too, whose base is the pool
    from torchrl.envs import StepCounter, TransformedEnv

    pool = EnvPool([functools.partial(CountingEnv, length=5)] * 2, seed=0)
    export = to_gymnasium(TransformedEnv(pool, StepCounter()) if transformed else pool)
    export.reset(seed=0)
    export.close()
    advice = r" after close\(\): the EnvPool it wraps is closed, and a closed pool cannot be reopened; export a new pool$"
    with pytest.raises(RuntimeError, match=r"^TorchRLVectorEnv\.step\(\)" + advice):
        export.step(np.zeros(2, np.int64))
    with pytest.raises(RuntimeError, match=r"^TorchRLVectorEnv\.reset\(options=\{'reset_mask': \.\.\.\}\)" + advice):
        export.reset(options={"reset_mask": np.array([True, False])})


@pytest.mark.parametrize("layout", ["big-endian", "negative-strides"])
def test_a_float_action_array_in_any_numpy_layout_steps_as_its_native_contiguous_copy(layout):
    """numpy arrays gymnasium's vector envs accept: a big-endian dtype (read from a file, say) or a view with negative
    strides (a flipped array) reach the env with the same values as a native, contiguous copy of them."""
    def make():
        return to_gymnasium(EnvPool([lambda: gym.make("Pendulum-v1")] * 3, seed=0), autoreset_mode="same_step")

    ours, twin = make(), make()
    ours.reset(seed=4)
    twin.reset(seed=4)
    gen = np.random.default_rng(0)
    for _ in range(5):
        native = gen.uniform(-2, 2, (3, 1)).astype(np.float32)
        if layout == "big-endian":
            given = native.astype(">f4")
        else:
            given = native[::-1].copy()[::-1]
            assert given.strides[0] < 0
        got, want = ours.step(given), twin.step(native)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    ours.close()
    twin.close()


# -- actions over any supported action space reach the envs as gymnasium's SyncVectorEnv passes them ---------------
class _ReceivingEnv(gym.Env):
    """Keeps a copy of every action it gets."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, action_space):
        self.action_space = action_space
        self.received = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        return np.zeros(1, np.float32), 0.0, False, False, {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=st.one_of(wide_boxes(), wide_discretes, wide_multi_discretes(),
                       st.integers(1, 4).map(gym.spaces.MultiBinary)),
       n=st.integers(1, 3), categorical=st.booleans(), numpy=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sampled_actions_of_any_supported_space_reach_the_envs_as_sync_vector_env_passes_them(
        space, n, categorical, numpy, seed):
    """The exported action space is the env's own (Discrete/MultiDiscrete ``start`` included), and an action
    sampled from it, given as numpy or torch, with a categorical or one-hot pool, reaches every sub-env with the
    same value, dtype and shape as gymnasium's SyncVectorEnv gives it."""
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim > 1:
        categorical = True  # TorchRL has no one-hot spec for an n-d nvec

    def make():
        return _ReceivingEnv(space)

    envs = to_gymnasium(EnvPool([make] * n, seed=0, categorical_action_encoding=categorical), numpy=numpy,
                        info_keys=[])
    ref = gym.vector.SyncVectorEnv([make] * n)
    try:
        assert envs.single_action_space == space
        envs.reset(seed=0)
        ref.reset(seed=0)
        envs.action_space.seed(seed)
        for _ in range(3):
            action = envs.action_space.sample()
            envs.step(action if numpy else torch.as_tensor(action))
            ref.step(action)
        # the pool probes each env once when it is built: compare the last three actions
        for got, want in zip(envs.get_attr("received"), ref.get_attr("received"), strict=True):
            for a, b in zip(got[-3:], want[-3:], strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), (a, b, space)
    finally:
        envs.close()
        ref.close()
