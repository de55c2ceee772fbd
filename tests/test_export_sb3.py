"""to_sb3_vec_env: an SB3 VecEnv, checked against SB3's own DummyVecEnv and by training PPO."""

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from export_helpers import PoolSeedSchedule, action_stream, assert_same, probed  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.env_checker import check_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecMonitor  # noqa: E402
from torchrl.envs import GymEnv  # noqa: E402

from envs import CountingEnv, sparse_info  # noqa: E402
from torchrl_swm import EnvPool, to_gymnasium, to_sb3_vec_env  # noqa: E402
from torchrl_swm.benchmarks.export import MLPWorldModelEnv  # noqa: E402


def test_sb3_check_env_on_unbatched_exports():
    check_env(to_gymnasium(GymEnv("MountainCar-v0")), warn=True)
    check_env(to_gymnasium(GymEnv("MountainCarContinuous-v0")), warn=True)


def test_matches_dummy_vec_env_step_by_step():
    """Same seeds, same actions: obs, rewards, dones, terminal_observation, TimeLimit.truncated, reset_infos."""
    n = 6
    make = functools.partial(gym.make, "CartPole-v1", max_episode_steps=30)
    ours = to_sb3_vec_env(EnvPool([make] * n), info_keys=[])
    ref = DummyVecEnv([lambda: PoolSeedSchedule(make(), n) for _ in range(n)])
    assert isinstance(ours, VecEnv)
    assert ours.observation_space == ref.observation_space and ours.action_space == ref.action_space
    assert ours.seed(4) == ref.seed(4)
    assert_same(ours.reset(), ref.reset(), "reset obs")
    assert ours.reset_infos == ref.reset_infos
    truncations = terminations = 0
    for t, action in enumerate(action_stream(gym.spaces.MultiDiscrete([2] * n), 300, 4)):
        obs, rewards, dones, infos = ours.step(action)
        obs_ref, rewards_ref, dones_ref, infos_ref = ref.step(action)
        assert_same(obs, obs_ref, f"step {t}: obs")
        assert_same(rewards, rewards_ref, f"step {t}: rewards")
        assert_same(dones, dones_ref, f"step {t}: dones")
        assert_same(infos, infos_ref, f"step {t}: infos")
        assert ours.reset_infos == ref.reset_infos
        truncations += sum(i["TimeLimit.truncated"] for i in infos)
        terminations += sum(d and not i["TimeLimit.truncated"] for d, i in zip(dones, infos))
    assert truncations > 5 and terminations > 20


def test_per_env_seeds_with_none_match_dummy_vec_env():
    """VecEnv._seeds may mix ints and None (an env not reseeded): DummyVecEnv passes them per env, and so
    does the export."""
    n = 4
    ours = to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=n), info_keys=[])
    ref = DummyVecEnv([lambda: PoolSeedSchedule(gym.make("CartPole-v1"), n) for _ in range(n)])
    ours.seed(3)
    ref.seed(3)
    assert_same(ours.reset(), ref.reset(), "reset obs")
    for t, action in enumerate(action_stream(gym.spaces.MultiDiscrete([2] * n), 40, 3)):
        assert_same(ours.step(action)[:3], ref.step(action)[:3], f"step {t}")
        if t % 10 == 9:
            for venv in (ours, ref):
                venv._seeds = [7, None, 9, None] if t % 20 == 9 else [None] * n  # what reset() reads
            assert_same(ours.reset(), ref.reset(), f"step {t}: reset")
            assert ours.reset_infos == ref.reset_infos


def test_infos_that_come_and_go_match_dummy_vec_env():
    """An info key appears in an env's dict only at the steps that env reported it."""
    periods = (1, 2, 3)
    n = len(periods)
    fns = [functools.partial(sparse_info, period=p, max_length=5) for p in periods]
    ours = to_sb3_vec_env(EnvPool(fns, info_spec={"bonus": 0.0, "success": False}), info_keys=["info"])
    ref = DummyVecEnv([lambda f=f: PoolSeedSchedule(probed(f()), n) for f in fns])
    ours.seed(2)
    ref.seed(2)
    assert_same(ours.reset(), ref.reset(), "reset obs")
    assert ours.reset_infos == ref.reset_infos
    seen = set()
    for t, action in enumerate(action_stream(gym.spaces.MultiDiscrete([3] * n), 60, 1)):
        obs, rewards, dones, infos = ours.step(action)
        obs_ref, rewards_ref, dones_ref, infos_ref = ref.step(action)
        assert_same(obs, obs_ref, f"step {t}: obs")
        for info, info_ref in zip(infos, infos_ref):
            assert set(info) == set(info_ref), f"step {t}"
            for key, value in info.items():
                assert np.array_equal(value, info_ref[key]), f"step {t}: {key}"  # bonus: float32 vs float
        assert ours.reset_infos == ref.reset_infos
        seen |= {key for info in infos for key in info}
    assert {"bonus", "success", "terminal_observation"} <= seen


def test_info_keys_starting_with_an_underscore_are_kept_as_dummy_vec_env_keeps_them():
    # gymnasium masks "k" with "_k": an env's own "_private" (masked by "__private") is a key, not a mask
    from envs import InfoEnv

    make = functools.partial(InfoEnv, {"_private": 1.5, "public": 1.5}, [{"_private": 2.5, "public": 2.5}])
    ours, ref = to_sb3_vec_env(EnvPool([make] * 2, seed=0)), DummyVecEnv([make] * 2)
    ours.reset()
    ref.reset()
    expected = [{"_private": 1.5, "public": 1.5}] * 2
    assert [without_seed(info) for info in ours.reset_infos] == ref.reset_infos == expected
    infos, infos_ref = ours.step(np.zeros(2, np.int64))[3], ref.step(np.zeros(2, np.int64))[3]
    assert [without_seed(info) for info in infos] == infos_ref
    assert infos_ref[0]["_private"] == 2.5
    ours.close()


def without_seed(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "episode_seed"}


def test_env_method_name_keyword_env_is_wrapped_and_negative_indices_as_dummy_vec_env():
    from gymnasium.envs.classic_control import CartPoleEnv

    fns = [lambda: gym.make("CartPole-v1")] * 2
    ours, ref = to_sb3_vec_env(EnvPool(fns)), DummyVecEnv(fns)
    assert ours.env_method("get_wrapper_attr", name="gravity") == ref.env_method("get_wrapper_attr", name="gravity")
    # SB3's is_wrapped looks at the wrappers only, never at the env they wrap
    for cls in (CartPoleEnv, gym.wrappers.TimeLimit, gym.Env, Monitor):
        assert ours.env_is_wrapped(cls) == ref.env_is_wrapped(cls), cls
    assert ours.env_is_wrapped(CartPoleEnv) == [False, False]
    ours.set_attr("tag", "last", indices=-1)
    ref.set_attr("tag", "last", indices=-1)
    assert ours.get_attr("tag", -1) == ref.get_attr("tag", -1) == ["last"]  # Python's negative indexing
    ours.close()


def test_per_env_infos_and_terminal_observation():
    n = 3
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=2)] * n, seed=0))
    venv.reset()
    assert venv.reset_infos[0] == {"t": 0, "length": 2, "episode_seed": 0}
    venv.step(np.ones(n, np.int64))
    obs, rewards, dones, infos = venv.step(np.full(n, 2))
    assert dones.all() and rewards.dtype == np.float32 and rewards.tolist() == [2.0] * n
    assert infos[1]["t"] == 2 and infos[1]["TimeLimit.truncated"] is False
    assert infos[1]["terminal_observation"][0] == 2 and obs[1, 0] == 0
    assert venv.reset_infos[1]["t"] == 0 and venv.reset_infos[1]["episode_seed"] == 1 + n


def test_env_method_get_attr_set_attr_seed():
    n = 4
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * n, seed=0))
    assert venv.get_attr("fixed_length") == [5] * n
    assert venv.get_attr("fixed_length", indices=[1, 2]) == [5, 5]
    venv.set_attr("fixed_length", 2, indices=1)
    assert venv.get_attr("fixed_length") == [5, 2, 5, 5]
    venv.set_attr("tags", ["a", "b"])  # one value for every env, even a list (as DummyVecEnv)
    assert venv.get_attr("tags") == [["a", "b"]] * n
    venv.reset()
    assert venv.env_method("render", indices=[0])[0].shape == (8, 12, 3)
    obs, *_ = venv.env_method("reset", seed=9, indices=2)[0]
    assert venv.has_attr("max_length") and not venv.has_attr("no_such_attribute")
    assert venv.env_is_wrapped(Monitor) == [False] * n
    assert venv.seed(10) == [10, 11, 12, 13]
    venv.reset()
    assert [info["episode_seed"] for info in venv.reset_infos] == [10, 11, 12, 13]
    # attributes through gymnasium wrappers, as DummyVecEnv's get_wrapper_attr
    cartpole = to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=2))
    assert cartpole.get_attr("gravity") == [9.8, 9.8]
    assert cartpole.get_attr("render_mode") == [None, None]


def test_set_options_reach_the_sub_envs():
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * 2, seed=0))
    venv.set_options({"length": 1})
    venv.reset()
    _, _, dones, _ = venv.step(np.zeros(2, np.int64))
    assert dones.all()


@pytest.mark.parametrize("what", ["seed", "set_options"])
def test_seed_and_set_options_apply_at_the_next_reset_only_as_dummy_vec_env(what):
    """VecEnv.seed(s) and set_options(...) are for the next reset() only (DummyVecEnv clears them there): the
    resets after it continue each env's stream without them (CartPole's "low"/"high" options bound the start
    state), as on DummyVecEnv."""
    n = 3
    ours = to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=n, seed_every_episode=False), info_keys=[])
    ref = DummyVecEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    assert ours.seed(7) == ref.seed(7)
    assert_same(ours.reset(), ref.reset(), "seeded reset")
    if what == "set_options":
        for venv in (ours, ref):
            venv.set_options({"low": 0.2, "high": 0.25})
        obs = ours.reset()
        assert_same(obs, ref.reset(), "reset with options")
        assert ((obs >= 0.2) & (obs <= 0.25)).all()
    for k in range(3):  # no seed, no options
        obs = ours.reset()
        assert_same(obs, ref.reset(), f"reset {k} after it")
        assert ours.reset_infos == ref.reset_infos
        assert np.abs(obs).max() <= 0.05  # CartPole's own start bounds
    for t, action in enumerate(action_stream(gym.spaces.MultiDiscrete([2] * n), 20, 7)):
        assert_same(ours.step(action)[:3], ref.step(action)[:3], f"step {t}")
    ours.close()
    ref.close()


@pytest.mark.parametrize("options", [[{"length": 1}], 5, "x", [["ab"], ["ab"]]])
def test_set_options_refuses_bad_options_and_keeps_the_previous_ones(options):
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * 2, seed=0))
    with pytest.raises(TypeError, match=r"set_options: expected a dict"):
        venv.set_options(options)
    venv.reset()  # still works: nothing bad was stored
    _, _, dones, _ = venv.step(np.zeros(2, np.int64))
    assert not dones.any()
    with pytest.raises(ValueError, match="one options dict for every env"):
        venv.set_options([{"length": 1}, None])
    venv.set_options(({"length": 1}, {"length": 1}))  # a tuple of one dict per env
    venv.reset()
    assert venv.step(np.zeros(2, np.int64))[2].all()
    venv.close()


def test_world_model_vec_env():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3 warns when get_attr("render_mode") raises
        venv = to_sb3_vec_env(MLPWorldModelEnv(batch_size=8))
    assert venv.render_mode is None and venv.num_envs == 8
    assert venv.get_attr("render_mode") == [None] * 8  # an env without sub-envs renders as a whole, if at all
    with pytest.raises(AttributeError, match="EnvPool"):
        venv.get_attr("gravity")
    with pytest.raises(AttributeError, match="EnvPool"):
        venv.env_method("reset")
    with pytest.raises(AttributeError, match="EnvPool"):
        venv.set_attr("x", 1)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (8, 64)
    venv.seed(0)  # VecEnv.seed(s) seeds an env without sub-envs as a whole: the same start again
    assert np.array_equal(venv.reset(), obs)
    for seed in (0, 5):  # ... with s itself, as env.set_seed(s) does (not s + N - 1, the seed list's last)
        torch.manual_seed(123)
        direct = MLPWorldModelEnv(batch_size=4)
        torch.manual_seed(123)
        exported = to_sb3_vec_env(MLPWorldModelEnv(batch_size=4))
        direct.set_seed(seed)
        assert exported.seed(seed) == [seed, seed + 1, seed + 2, seed + 3]
        assert np.array_equal(exported.reset(), direct.reset()["observation"].numpy())
    obs, rewards, dones, infos = venv.step(np.zeros((8, 6), np.float32))
    assert rewards.shape == (8,) and len(infos) == 8


def _monitored_counting(length):
    return Monitor(CountingEnv(length=length))


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_env_is_wrapped_looks_where_the_envs_live(backend):
    fns = [functools.partial(_monitored_counting, 3), functools.partial(CountingEnv, length=3)]
    venv = to_sb3_vec_env(EnvPool(fns, backend=backend, seed=0))
    try:
        assert venv.env_is_wrapped(Monitor) == [True, False]
        assert venv.env_is_wrapped(Monitor, indices=[1]) == [False]
        assert venv.env_is_wrapped(gym.Wrapper) == [True, False]
    finally:
        venv.close()


def _monitored_cartpole():
    return Monitor(gym.make("CartPole-v1"))  # TimeLimit inside Monitor


@pytest.mark.parametrize("backend", ["serial", "process"])
def test_set_attr_sets_the_outermost_wrapper_as_dummy_vec_env(backend):
    """SB3's VecEnvs setattr() on each sub-env itself, so an inner wrapper's attribute of the same name
    (TimeLimit's _max_episode_steps under Monitor) is untouched: same episode lengths as DummyVecEnv."""
    n = 2
    venv = to_sb3_vec_env(
        EnvPool([_monitored_cartpole] * n, backend=backend, seed_every_episode=False, info_keys=[])
    )
    reference = DummyVecEnv([_monitored_cartpole] * n)
    try:
        for env in (venv, reference):
            env.set_attr("_max_episode_steps", 3)
            env.set_attr("tag", "a", indices=[1])
            env.seed(5)
            env.reset()
        assert venv.get_attr("_max_episode_steps") == reference.get_attr("_max_episode_steps") == [3, 3]
        assert venv.get_attr("tag", indices=[1]) == ["a"]
        for _ in range(12):  # the inner TimeLimit still allows 500 steps: no episode ends at step 3
            actions = np.zeros(n, np.int64)
            ours, theirs = venv.step(actions), reference.step(actions)
            np.testing.assert_array_equal(ours[0], theirs[0])
            np.testing.assert_array_equal(ours[2], theirs[2])
    finally:
        venv.close()
        reference.close()


class _BinaryActionEnv(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert action.dtype.kind in "biu", action.dtype  # the env receives integers, whatever SB3 sent
        return action.astype(np.float32), float(action.sum()), False, False, {}


def test_multibinary_float_actions_from_sb3_policies():
    venv = to_sb3_vec_env(EnvPool([_BinaryActionEnv] * 2, seed=0))
    venv.reset()
    obs, rewards, _, _ = venv.step(np.array([[1.0, 0.0], [1.0, 1.0]], np.float32))  # what PPO's policy sends
    assert obs.tolist() == [[1.0, 0.0], [1.0, 1.0]] and rewards.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="must be 0 or 1"):
        venv.step(np.array([[0.5, 0.0], [1.0, 1.0]], np.float32))
    model = PPO("MlpPolicy", venv, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(32)  # SB3's own loop, end to end


def test_ppo_learns_cartpole_through_the_pool():
    """SB3 PPO("MlpPolicy") on to_sb3_vec_env(EnvPool("CartPole-v1", 8)): returns rise far above random."""
    torch.set_num_threads(1)
    venv = VecMonitor(to_sb3_vec_env(EnvPool("CartPole-v1", num_envs=8, seed=0)))
    venv.seed(0)
    venv.reset()
    random_returns = []
    rng = np.random.default_rng(0)
    while len(random_returns) < 50:
        _, _, dones, infos = venv.step(rng.integers(0, 2, 8))
        random_returns += [info["episode"]["r"] for info, done in zip(infos, dones) if done]
    random_mean = float(np.mean(random_returns))
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=256, n_epochs=4, learning_rate=1e-3, seed=0,
                device="cpu", verbose=0)
    model.learn(30_000)
    trained_mean = float(np.mean([ep["r"] for ep in model.ep_info_buffer]))
    assert random_mean < 40
    assert trained_mean > 100 and trained_mean > 4 * random_mean, (random_mean, trained_mean)


# -- per-env info dicts built a column at a time: the same dicts as env by env --------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchrl_swm.export.sb3 import _row, _rows  # noqa: E402


@st.composite
def vector_infos(draw, n, depth=0):
    infos = {}
    for k in range(draw(st.integers(0, 4))):
        key = f"k{k}"
        kind = draw(st.sampled_from(["float", "int", "bool", "wide", "object"] + (["dict"] if depth < 1 else [])))
        if kind == "dict":
            infos[key] = draw(vector_infos(n, depth + 1))
        elif kind == "wide":
            infos[key] = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
        elif kind == "object":
            infos[key] = np.array([f"s{i}" for i in range(n)], dtype=object)
        else:
            infos[key] = np.arange(n).astype({"float": np.float32, "int": np.int64, "bool": bool}[kind])
        if draw(st.booleans()):
            infos["_" + key] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return infos


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 5))
def test_sb3_info_rows_match_the_per_env_rule(data, n):
    infos = data.draw(vector_infos(n))
    fast, slow = _rows(infos, n), [_row(infos, i) for i in range(n)]

    def same(a, b):
        if isinstance(a, dict):
            return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, np.ndarray):
            return isinstance(b, np.ndarray) and np.array_equal(a, b)
        return type(a) is type(b) and a == b

    assert len(fast) == len(slow) == n and all(same(f, s) for f, s in zip(fast, slow))


def test_discrete_spaces_with_a_start_reach_sb3_as_indices():
    # SB3 ignores Discrete.start (its policies emit 0..n-1, it one-hot encodes n classes): the
    # SB3 export's spaces start at 0 and carry the pool's indices; the envs still get start + index
    from envs import ActionRecordingEnv, DictObsEnv

    pool = EnvPool([ActionRecordingEnv] * 2, seed=0)
    venv = to_sb3_vec_env(pool)
    assert venv.action_space == gym.spaces.Discrete(5)
    venv.reset()
    venv.step_async(np.array([0, 4]))
    obs, *_ = venv.step_wait()
    assert obs[:, 0].tolist() == [-2.0, 2.0]  # the envs saw start + index
    PPO("MlpPolicy", venv, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu").learn(32)
    venv.close()
    dict_venv = to_sb3_vec_env(EnvPool([DictObsEnv] * 2, seed=0))
    assert dict_venv.observation_space["goal"]["kind"] == gym.spaces.Discrete(4)  # DictObsEnv: Discrete(4, start=1)
    obs = dict_venv.reset()
    assert set(obs["goal"]["kind"].tolist()) <= {0, 1, 2, 3}
    dict_venv.close()


def test_multi_discrete_spaces_with_a_start_reach_sb3_as_indices():
    # the same for MultiDiscrete(nvec, start): SB3's space has no start (its policies emit 0..nvec-1 per entry),
    # and index [0, 0] reaches the env as start itself
    from envs import NarrowActionEnv  # MultiDiscrete([3, 4], start=[0, -2], int32); the obs echoes the action

    venv = to_sb3_vec_env(EnvPool([functools.partial(NarrowActionEnv, "multidiscrete")] * 2, seed=0))
    assert venv.action_space == gym.spaces.MultiDiscrete([3, 4], dtype=np.int32)
    assert venv.action_space.start.tolist() == [0, 0]
    venv.reset()
    venv.step_async(np.array([[0, 0], [2, 3]]))
    obs, *_ = venv.step_wait()
    assert obs[:, :2].tolist() == [[0.0, -2.0], [2.0, 1.0]]  # the envs saw start + index
    PPO("MlpPolicy", venv, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu").learn(32)  # (env asserts)
    venv.close()


def test_per_env_options_are_refused_when_set_and_never_kept():
    from envs import counting

    from torchrl_swm import EnvPool, to_sb3_vec_env

    venv = to_sb3_vec_env(EnvPool([counting] * 2, seed=0))
    with pytest.raises(ValueError, match=r"set_options: expected one options dict for every env"):
        venv.set_options([{"length": 2}, {"length": 3}])
    venv.reset()  # the refused options are not waiting for this reset
    venv.set_options({"length": 7})  # one dict for all: fine
    venv.reset()
    assert [info["length"] for info in venv.reset_infos] == [7, 7]
    venv.close()


def test_set_attr_on_an_async_vector_env_pool_needs_every_env_or_says_why():
    """An AsyncVectorEnv reaches its sub-envs themselves only with one call() on every env: a subset is refused
    with an error naming set_attr (not a call the user never made)."""
    venv = to_sb3_vec_env(EnvPool(gym.vector.AsyncVectorEnv([_monitored_cartpole] * 2), info_keys=[]))
    try:
        venv.set_attr("tag", "b")
        assert venv.get_attr("tag") == ["b", "b"]
        with pytest.raises(ValueError, match=r"set_attr\('tag', outermost=True\): AsyncVectorEnv"):
            venv.set_attr("tag", "c", indices=[1])
    finally:
        venv.close()


def test_sb3_indices_refuse_a_boolean_mask_and_floats():
    # DummyVecEnv raises TypeError for both; int(True) would have picked env 1
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * 3, seed=0))
    venv.set_attr("tag", "a")
    for bad in (np.array([True, False, True]), [0.5]):
        with pytest.raises(TypeError, match="indices"):
            venv.get_attr("tag", indices=bad)
        with pytest.raises(TypeError, match="indices"):
            venv.set_attr("tag", "b", indices=bad)
        with pytest.raises(TypeError, match="indices"):
            venv.env_method("render", indices=bad)
        with pytest.raises(TypeError, match="indices"):
            venv.env_is_wrapped(Monitor, indices=bad)
    assert venv.get_attr("tag") == ["a"] * 3
    assert venv.get_attr("tag", indices=np.flatnonzero([True, False, True])) == ["a", "a"]
    venv.close()


class _RgbOnly(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def render(self):
        return np.zeros((4, 4, 3), np.uint8)


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_metadata_is_the_envs_own_as_on_dummy_vec_env(render_mode):
    make = functools.partial(_RgbOnly, render_mode)
    ours, ref = to_sb3_vec_env(EnvPool([make] * 2, seed=0)), DummyVecEnv([make] * 2)
    assert ours.metadata["render_modes"] == ref.metadata["render_modes"] == ["rgb_array"]
    assert ours.metadata["render_fps"] == ref.metadata["render_fps"] == 10
    ours.close()
    ref.close()


def test_sb3_step_errors_name_the_sb3_export_and_a_closed_pool_is_not_offered_a_reset():
    # they named the gymnasium export inside (TorchRLVectorEnv.step()), and after close() suggested that
    # reset() reopens the env, which a closed EnvPool never does
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * 2, seed=0))
    with pytest.raises(RuntimeError, match=r"^TorchRLSB3VecEnv\.step\(\) was called before reset\(\)"):
        venv.step(np.zeros(2, np.int64))
    venv.reset()
    venv.close()
    with pytest.raises(RuntimeError, match=r"^TorchRLSB3VecEnv\.step\(\) after close\(\): the EnvPool it wraps is "
                                           r"closed, and a closed pool cannot be reopened; export a new pool$"):
        venv.step(np.zeros(2, np.int64))
    venv.set_options({"reset_mask": np.array([True, False])})
    with pytest.raises(RuntimeError, match=r"^TorchRLSB3VecEnv\.reset\(\) with set_options\(\{'reset_mask': \.\.\.\}\) "
                                           r"after close\(\): the EnvPool it wraps is closed"):
        venv.reset()


def test_step_wait_without_step_async_is_refused_not_a_repeat_of_the_last_actions():
    venv = to_sb3_vec_env(EnvPool([functools.partial(CountingEnv, length=5)] * 2, seed=0))
    venv.reset()
    venv.step_async(np.zeros(2, np.int64))
    venv.step_wait()
    refusal = r"^TorchRLSB3VecEnv\.step_wait\(\) was called without step_async\(actions\): each step_wait\(\) needs"
    with pytest.raises(RuntimeError, match=refusal):
        venv.step_wait()
    venv.close()


def test_sb3_masked_reset_after_close_of_a_reopenable_env_gives_advice_that_works():
    # SB3 keeps a refused reset's options: "reset every env" failed again while the reset_mask stayed set
    venv = to_sb3_vec_env(MLPWorldModelEnv(batch_size=2))
    venv.reset()
    venv.close()
    venv.set_options({"reset_mask": np.array([True, False])})
    with pytest.raises(RuntimeError, match=r"after close\(\): set_options\(None\), then reset\(\) every env, to reopen"):
        venv.reset()
    venv.set_options(None)
    assert venv.reset().shape[0] == 2
    venv.close()


def test_float64_rewards_reach_sb3_as_float32_as_dummy_vec_env_gives_them():
    from torchrl.data import Unbounded

    from torchrl_swm import WorldModelEnv

    def step(state, action):
        s = state + 1
        return s, s, s.sum(-1).double(), s[:, 0] > 100, s[:, 0] > 100, {}

    env = WorldModelEnv(object(), gym.spaces.Box(-100, 100, (1,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32),
                        num_envs=2, initial_state=torch.zeros(1), transition_fn=step,
                        reward_spec=Unbounded(shape=(1,), dtype=torch.float64))
    venv = to_sb3_vec_env(env)
    venv.reset()
    rewards = venv.step(np.zeros((2, 1), np.float32))[1]
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 1.0]
    venv.close()
