"""FrameSkip: TorchRL's frame skip, stopping each row at the end of its episode (review R1 B1).

TorchRL's FrameSkipTransform repeats the action whatever happens, so a row whose episode ends mid-skip is stepped
past its end, which EnvPool refuses. FrameSkip freezes such rows for the repeats left; the reference is a hand loop
over the same gymnasium envs that breaks the repeats at the episode's end, as gymnasium's frame-skip wrappers do.
"""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, counting
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, FrameSkipTransform, StepCounter, TransformedEnv

from torchrl_swm import EnvPool, StepRefusedError, World, WorldModelEnv
from torchrl_swm.transforms import FrameSkip

torch.set_num_threads(1)

ACTION = 2  # CountingEnv's reward is its action


def reference(lengths, skip, steps):
    """Per env: (next observation, summed reward, done) of each skipped step, reset after done."""
    rows = []
    for length in lengths:
        env = CountingEnv(length=length)
        env.reset(seed=0)  # the pool's construction probe: its episode index 0
        env.reset(seed=0)
        out = []
        for _ in range(steps):
            total = 0.0
            for _ in range(skip):
                obs, reward, terminated, truncated, _ = env.step(ACTION)
                total += reward
                if terminated or truncated:
                    break
            out.append((obs.tolist(), total, terminated or truncated))
            if terminated or truncated:
                env.reset()
        rows.append(out)
    return rows


def pool_of(lengths, **kwargs):
    return EnvPool([functools.partial(counting, length=n) for n in lengths], seed=0, **kwargs)


def constant_action(td):
    return td.set("action", torch.full(td.batch_size, ACTION, dtype=torch.int64))


def assert_matches_reference(rollout, lengths, skip):
    want = reference(lengths, skip, rollout.shape[1])
    for i, rows in enumerate(want):
        assert rollout["next", "observation"][i].tolist() == [obs for obs, _, _ in rows], i
        assert rollout["next", "reward"][i].view(-1).tolist() == [reward for _, reward, _ in rows], i
        assert rollout["next", "done"][i].view(-1).tolist() == [done for _, _, done in rows], i


@pytest.mark.parametrize("backend", ["serial", "process"])
@pytest.mark.parametrize("skip", [1, 3, 4])
def test_a_skipped_rollout_equals_a_hand_loop_that_stops_each_env_at_its_episodes_end(backend, skip):
    lengths = [2, 5, 7]  # 2 and 5 end mid-skip for 3 and 4
    kwargs = {"backend": "process", "num_workers": 2} if backend == "process" else {}
    env = TransformedEnv(pool_of(lengths, **kwargs), FrameSkip(skip))
    rollout = env.rollout(12, constant_action, break_when_any_done=False)
    assert_matches_reference(rollout, lengths, skip)
    env.close()


def test_torchrls_frame_skip_steps_a_finished_env_which_the_pool_refuses():
    # why FrameSkip exists: TorchRL's transform steps env 0 (length 2) a third time, past its episode's end
    import torchrl_swm

    assert torchrl_swm.FrameSkip is FrameSkip and issubclass(FrameSkip, FrameSkipTransform)
    env = TransformedEnv(pool_of([2, 5]), FrameSkipTransform(3))
    with pytest.raises(StepRefusedError, match=r"envs \[0\] since their episode ended"):
        env.rollout(3, constant_action, break_when_any_done=False)
    env.close()


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4), skip=st.integers(1, 4), steps=st.integers(1, 10),
       frozen=st.lists(st.booleans(), min_size=4, max_size=4))
def test_skipping_keeps_a_callers_frozen_rows_frozen_and_equals_the_hand_loop(lengths, skip, steps, frozen):
    n = len(lengths)
    env = TransformedEnv(pool_of(lengths), FrameSkip(skip))
    rollout = env.rollout(steps, constant_action, break_when_any_done=False)
    assert_matches_reference(rollout, lengths, skip)
    # a "_step" mask of the caller's: its frozen rows are not stepped by any repeat, and the mask comes back as given
    td = env.reset()
    mask = torch.tensor(frozen[:n]).view(n, 1)
    mask[0] = True  # (an all-False mask is TorchRL's placeholder step)
    td = constant_action(td).set("_step", mask.clone())
    out = env.step(td)["next"]
    assert torch.equal(td["_step"], mask)
    expect = [min(skip, length) if stepped else 0 for length, stepped in zip(lengths, mask.view(-1).tolist())]
    assert out["observation"][:, 0].tolist() == expect  # t: the repeats each row took
    assert out["reward"].view(-1).tolist() == [ACTION * t for t in expect]
    env.close()


def test_collectors_world_and_world_models_run_with_frame_skip():
    lengths = [2, 5, 7]
    env = TransformedEnv(pool_of(lengths), FrameSkip(3))
    collector = Collector(env, constant_action, frames_per_batch=30, total_frames=60)
    batches = list(collector)
    collector.shutdown()
    assert [b.numel() for b in batches] == [30, 30]
    assert_matches_reference(torch.cat(batches, dim=1), lengths, 3)
    # World in both reset modes: an episode of length L takes ceil(L / 3) steps and returns ACTION * L
    for mode in ("auto", "wait"):
        world = World(TransformedEnv(pool_of(lengths), FrameSkip(3)), policy=constant_action)
        result = world.evaluate(episodes=3, reset_mode=mode, progress=False)
        assert sorted(result["episode_lengths"].tolist()) == [1, 2, 3]
        assert sorted(result["episode_returns"].tolist()) == [4, 10, 14]
        world.close()
    # a world model freezes rows too (StepCounter counts the skipped steps, as TorchRL's transforms see them)
    model = WorldModelEnv(object(), gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), gym.spaces.Discrete(3),
                          num_envs=2, initial_state=torch.zeros(1),
                          transition_fn=lambda s, a: (s + 1, torch.ones(2), s.view(-1) + 1 >= torch.tensor([2.0, 9.0]),
                                                      False, {}))
    env = TransformedEnv(model, FrameSkip(3))
    env.append_transform(StepCounter())
    out = env.step(constant_action(env.reset()))["next"]
    assert out["observation"].view(-1).tolist() == [2.0, 3.0] and out["reward"].view(-1).tolist() == [2.0, 3.0]
    assert out["done"].view(-1).tolist() == [True, False]


def test_a_vector_env_pool_cannot_freeze_rows_and_says_to_skip_inside_each_env():
    venv = gym.vector.SyncVectorEnv([functools.partial(counting, length=n) for n in (2, 5)])
    env = TransformedEnv(EnvPool(venv, seed=0), FrameSkip(3))
    with pytest.raises(StepRefusedError, match=r"cannot freeze rows.*FrameSkip.*MaxAndSkipObservation"):
        env.rollout(3, constant_action, break_when_any_done=False)
    env.close()


def test_truncation_mid_skip_stops_the_row_as_termination_does():
    # every done key counts (review R7 M2: reading "terminated" alone stepped a truncated row past its end)
    env = TransformedEnv(EnvPool([functools.partial(counting, length=n, truncate=True) for n in (2, 5)], seed=0),
                         FrameSkip(3))
    rollout = env.rollout(4, constant_action, break_when_any_done=False)
    assert rollout["next", "truncated"][0].view(-1).tolist() == [True, True, True, True]
    assert rollout["next", "observation"][0, :, 0].tolist() == [2.0, 2.0, 2.0, 2.0]
    assert rollout["next", "reward"][1].view(-1).tolist() == [6.0, 4.0, 6.0, 4.0]
    env.close()


def test_torchrls_batched_envs_and_a_stateless_world_model_give_the_hand_loops_data():
    # review R7: TorchRL's SerialEnv gives a frozen row its input values back (the observation before the step,
    # done False), and a batch-unlocked WorldModelEnv reads its state from the tensordict: the repeats must start
    # from the last repeat's outputs and frozen rows keep theirs
    from torchrl.envs import GymWrapper, SerialEnv

    lengths = [2, 5]
    serial = SerialEnv(2, [functools.partial(lambda n: GymWrapper(CountingEnv(length=n),
                                                                   categorical_action_encoding=True), n)
                           for n in lengths])
    env = TransformedEnv(serial, FrameSkip(3))
    env.set_seed(0)
    rollout = env.rollout(3, constant_action, break_when_any_done=False)
    assert rollout["next", "observation"][..., 0].tolist() == [[2.0, 2.0, 2.0], [3.0, 5.0, 3.0]]
    assert rollout["next", "reward"][..., 0].tolist() == [[4.0, 4.0, 4.0], [6.0, 4.0, 6.0]]
    assert rollout["next", "done"][..., 0].tolist() == [[True, True, True], [False, True, False]]
    env.close()

    def transition(state, action):
        return state + 1, torch.ones(state.shape[0]), state.view(-1) + 1 >= 2, False, {}

    model = WorldModelEnv(object(), gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), gym.spaces.Discrete(3),
                          num_envs=None, state_key="observation", initial_state=torch.zeros(1),
                          transition_fn=transition)
    td = torch.zeros(2, 1)
    td[1] = 1.5
    from tensordict import TensorDict

    out = TransformedEnv(model, FrameSkip(3)).step(TensorDict({"observation": td, "action": torch.tensor([2, 2])},
                                                              [2]))["next"]
    assert out["observation"].view(-1).tolist() == [2.0, 2.5]  # 0 -> 1 -> 2 (done); 1.5 -> 2.5 (done)
    assert out["reward"].view(-1).tolist() == [2.0, 1.0] and out["done"].view(-1).tolist() == [True, True]


def test_transforms_before_the_skip_see_every_repeat_and_those_after_see_one_step():
    from torchrl.envs import Compose, RewardSum

    pool = EnvPool([functools.partial(counting, length=n) for n in (2, 7)], seed=0)
    env = TransformedEnv(pool, Compose(StepCounter(), RewardSum(), FrameSkip(3)))
    env.append_transform(StepCounter(step_count_key="agent_steps"))
    rollout = env.rollout(4, constant_action, break_when_any_done=False)
    assert rollout["next", "step_count"][..., 0].tolist() == [[2, 2, 2, 2], [3, 6, 7, 3]]  # frames
    assert rollout["next", "episode_reward"][..., 0].tolist() == [[4.0] * 4, [6.0, 12.0, 14.0, 6.0]]
    assert rollout["next", "agent_steps"][..., 0].tolist() == [[1, 1, 1, 1], [1, 2, 3, 1]]
    env.close()


def test_an_action_transform_before_the_skip_maps_every_repeats_action_once():
    # review R8: the repeats stepped the parent TransformedEnv, which applied the earlier transforms' inv again
    # (an action remap twice: the policy's 0 reached the env as 1, then 2)
    from torchrl.envs import Compose, Transform

    class PlusOne(Transform):
        def __init__(self):
            super().__init__(in_keys_inv=["action"], out_keys_inv=["action"])

        def _inv_apply_transform(self, action):
            return action + 1

        def transform_input_spec(self, input_spec):
            return input_spec

    env = TransformedEnv(pool_of([2, 7]), Compose(PlusOne(), FrameSkip(3)))
    td = env.reset().set("action", torch.zeros(2, dtype=torch.int64))  # the env sees 1: its reward is 1 per frame
    out = env.step(td)["next"]
    assert out["observation"][:, 2].tolist() == [1.0, 1.0]  # the last action the envs got
    assert out["reward"].view(-1).tolist() == [2.0, 3.0] and out["observation"][:, 0].tolist() == [2.0, 3.0]
    env.close()


@pytest.mark.parametrize("layered", [False, True])
def test_world_reads_a_step_limit_that_a_frame_skip_repeats_in_its_own_steps(layered, tmp_path):
    # StepCounter(max_steps=7) before FrameSkip(3) counts frames: the episode is cut at frame 7, world step 3
    lengths = [20, 20]
    if layered:  # the counter in an inner layer, the skip in an outer one: the same order of application
        env = TransformedEnv(TransformedEnv(pool_of(lengths), StepCounter(max_steps=7)), FrameSkip(3),
                             auto_unwrap=False)
        assert isinstance(env.base_env, TransformedEnv)
    else:
        env = TransformedEnv(pool_of(lengths), Compose(StepCounter(max_steps=7), FrameSkip(3)))
    world = World(env, policy=constant_action)
    result = world.evaluate(episodes=2, progress=False)
    assert result["episode_lengths"].tolist() == [3, 3]
    assert result["episode_truncated"].tolist() == [True, True]
    assert result["max_steps"] == 3 and result["env_time_limit"] == 3
    # a counter after the skip counts the world's steps
    after = TransformedEnv(pool_of(lengths), Compose(FrameSkip(3), StepCounter(max_steps=4)))
    result = World(after, policy=constant_action).evaluate(episodes=2, progress=False)
    assert result["episode_lengths"].tolist() == [4, 4] and result["env_time_limit"] == 4
    # a gymnasium TimeLimit counts frames under every skip: CartPole-v1's 500 under 2 x 3 is 84 world steps
    cartpole = TransformedEnv(TransformedEnv(EnvPool("CartPole-v1", num_envs=1, seed=0), FrameSkip(2)), FrameSkip(3),
                              auto_unwrap=False)
    assert World(cartpole, policy=None).evaluate(episodes=0, progress=False)["env_time_limit"] == 84
    world.close()
    cartpole.close()


def test_collect_refuses_a_step_counter_that_counts_frames_and_records_one_that_counts_steps(tmp_path):
    lengths = [7, 7]
    inside = TransformedEnv(pool_of(lengths), Compose(StepCounter(), FrameSkip(3)))
    with pytest.raises(ValueError, match=r"'step_count' of env 0 reads 3 after step 1 .*place it after the FrameSkip"):
        World(inside, policy=constant_action).collect(tmp_path / "inside", 2, max_steps=10, progress=False)
    after = TransformedEnv(pool_of(lengths), Compose(FrameSkip(3), StepCounter()))
    dataset = World(after, policy=constant_action).collect(tmp_path / "after", 2, max_steps=10, progress=False)
    episode = dataset.episode(0)
    assert episode["step_count"].view(-1).tolist() == [0, 1, 2]
    assert episode["next", "step_count"].view(-1).tolist() == [1, 2, 3]
    assert episode["next", "observation"][:, 0].tolist() == [3.0, 6.0, 7.0]
    inside.close()
    after.close()


class _TerminatedOnly(EnvBase):
    """A TorchRL env whose ``_step`` writes ``terminated`` and no ``done`` (``EnvBase.step`` completes it);
    row 0 ends at t=2, row 1 at t=9; it freezes rows by ``"_step"``."""

    def __init__(self):
        super().__init__(batch_size=[2])
        self.observation_spec = Composite(observation=Unbounded((2, 1)), shape=(2,))
        self.action_spec = Categorical(3, shape=(2,))
        self.reward_spec = Unbounded((2, 1))
        self.done_spec = Composite(done=Categorical(2, (2, 1), dtype=torch.bool),
                                   terminated=Categorical(2, (2, 1), dtype=torch.bool), shape=(2,))
        self.t = torch.zeros(2, 1)

    def _reset(self, tensordict):
        self.t.zero_()
        return TensorDict({"observation": self.t.clone(), "terminated": torch.zeros(2, 1, dtype=torch.bool)}, [2])

    def _step(self, tensordict):
        stepped = tensordict.get("_step", torch.ones(2, 1, dtype=torch.bool)).view(2, 1)
        self.t = torch.where(stepped, self.t + 1, self.t)
        return TensorDict({"observation": self.t.clone(), "reward": stepped.float(),
                           "terminated": self.t >= torch.tensor([[2.0], [9.0]])}, [2])

    def _set_seed(self, seed):
        return seed


def test_frame_skip_completes_the_done_flag_of_an_env_whose_step_writes_terminated_only():
    env = TransformedEnv(_TerminatedOnly(), FrameSkip(3))
    out = env.step(constant_action(env.reset()))["next"]
    assert out["observation"].view(-1).tolist() == [2.0, 3.0]
    assert out["reward"].view(-1).tolist() == [2.0, 3.0]
    assert out["done"].view(-1).tolist() == [True, False]
    assert out["terminated"].view(-1).tolist() == [True, False]
