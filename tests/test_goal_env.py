"""PointMaze: a goal-conditioned numpy env with pixels, a goal image, is_success and a state hook."""

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import torchrl_swm.envs  # noqa: F401
from torchrl_swm import EnvPool, World
from torchrl_swm.envs import ENV_IDS, LAYOUTS, PointMazeEnv, PointMazeExpert, expert_actions, expert_policy

torch.set_num_threads(1)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gymnasium_env_checker(layout):
    check_env(gym.make("torchrl_swm/PointMaze-v0", layout=layout, render_mode="rgb_array").unwrapped,
              skip_render_check=False)
    check_env(gym.make("torchrl_swm/PointMaze-v0", layout=layout).unwrapped)


@pytest.mark.parametrize("env_id", sorted(ENV_IDS))
def test_registered_ids(env_id):
    env = gym.make(env_id, render_mode="rgb_array", render_size=48)
    obs, info = env.reset(seed=0)
    assert set(obs) == {"state", "target"} and obs["state"].dtype == np.float32
    assert info["goal_pixels"].shape == (48, 48, 3) and info["goal_pixels"].dtype == np.uint8
    assert env.render().shape == (48, 48, 3)
    assert env.spec.max_episode_steps == ENV_IDS[env_id][1]
    env.close()


def test_is_success_terminated_reward_and_goal_image():
    env = PointMazeEnv(layout="open", render_mode="rgb_array")
    obs, info = env.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.62, 1.5]})
    assert info["is_success"]  # already within goal_radius
    obs, reward, terminated, truncated, info = env.step(np.zeros(2, np.float32))
    assert info["is_success"] and terminated and not truncated and reward == pytest.approx(-info["distance"])
    # the goal image is the frame with the agent on the target
    env.reset(seed=1, options={"state": [1.5, 2.5], "target": [3.5, 1.5]})
    goal = env.goal_frame()
    env.set_state([3.5, 1.5, 0.0, 0.0])
    assert np.array_equal(env.render(), goal)
    sparse = PointMazeEnv(layout="open", reward_type="sparse", terminate_on_success=False)
    sparse.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.55, 1.5]})
    _, r, term, _, info = sparse.step(np.zeros(2, np.float32))
    assert r == 1.0 and not term and info["is_success"]


def test_set_state_with_a_new_target_renders_the_new_targets_goal_pixels():
    # set_state(target=...) moves the goal: info["goal_pixels"] is then the new target's frame, not a cached old one
    env = PointMazeEnv(layout="open", render_mode="rgb_array")
    _, info = env.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.5, 3.5]})
    old = info["goal_pixels"]
    env.set_state([1.5, 1.5, 0.0, 0.0], target=[3.5, 3.5])
    _, _, _, _, info = env.step(np.zeros(2, np.float32))
    assert np.array_equal(info["goal_pixels"], env.goal_frame()) and not np.array_equal(info["goal_pixels"], old)


def test_render_needs_no_pygame():
    code = (
        "import sys, torchrl_swm.envs as e; env = e.PointMazeEnv(render_mode='rgb_array'); env.reset(seed=0);"
        "frame = env.render(); assert frame.shape == (64, 64, 3); assert 'pygame' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_reset_options_and_state_hook_reproduce_trajectories():
    env = PointMazeEnv(layout="u")
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, size=(30, 2)).astype(np.float32)
    states = [env.get_state()]
    for a in actions:
        env.step(a)
        states.append(env.get_state())
    # restarting from any recorded state (with its velocity) replays the same future
    for k in (0, 7, 19):
        other = PointMazeEnv(layout="u")
        opts = other.reset_options_from_dataset({"state": states[k]}, {"state": states[-1]})
        obs, _ = other.reset(seed=99, options=opts)
        assert np.array_equal(obs["state"], states[k]) and np.allclose(obs["target"], states[-1][:2])
        for j, a in enumerate(actions[k:], start=k + 1):
            obs, *_ = other.step(a)
            assert np.allclose(obs["state"], states[j], atol=1e-6)


@pytest.mark.parametrize("layout", ["open", "u"])
def test_a_target_alone_never_starts_the_episode_in_its_cell(layout):
    # the start was drawn before the option replaced the target: in its cell one episode in ten (open room),
    # solved at reset in 4 % of them, for any policy; without options episodes keep their draws
    env, same = PointMazeEnv(layout), PointMazeEnv(layout)
    free = [tuple(c) for c in env.free_cells]
    target = np.array(free[len(free) // 2], dtype=np.float64)[::-1] + 0.5  # a cell's centre, [x, y]
    starts = set()
    for seed in range(300):
        obs, info = env.reset(seed=seed, options={"target": target})
        assert env.cell_of(obs["state"][:2]) != env.cell_of(target) and not info["is_success"], seed
        starts.add(env.cell_of(obs["state"][:2]))
        np.testing.assert_array_equal(obs["target"], target.astype(np.float32))
        plain = env.reset(seed=seed)[0]
        assert (plain["state"] == same.reset(seed=seed)[0]["state"]).all()
    assert len(starts) == len(free) - 1  # every other free cell is a start


@pytest.mark.parametrize("layout", ["open", "u"])
def test_a_state_alone_never_draws_the_target_in_its_cell(layout):
    # the target was drawn uniformly over every free cell, the state's own included: one episode in 20 of the
    # U maze began solved, counted a success for a no-op policy
    env = PointMazeEnv(layout)
    free = [tuple(c) for c in env.free_cells]
    state = np.array([*np.array(free[len(free) // 2], dtype=np.float64)[::-1] + 0.5, 0.1, -0.1])
    targets = set()
    for seed in range(300):
        obs, info = env.reset(seed=seed, options={"state": state})
        assert env.cell_of(obs["target"]) != env.cell_of(state[:2]) and not info["is_success"], seed
        targets.add(env.cell_of(obs["target"]))
        np.testing.assert_allclose(obs["state"], state.astype(np.float32))
        assert not env.step(np.zeros(2, np.float32))[2]
    assert len(targets) == len(free) - 1  # every other free cell is a target
    with pytest.raises(ValueError, match=r"state must be \[x, y\] or \[x, y, vx, vy\], got shape \(3,\)"):
        env.reset(seed=0, options={"state": state[:3]})


def test_a_given_velocity_beyond_max_speed_is_clipped_into_the_observation_space():
    env = PointMazeEnv("open")
    obs, _ = env.reset(seed=0, options={"state": [1.5, 1.5, 5.0, -5.0]})
    assert obs["state"][2:].tolist() == pytest.approx([env.max_speed, -env.max_speed])
    assert env.observation_space.contains(obs)


def test_invalid_states_are_rejected():
    env = PointMazeEnv(layout="u")
    with pytest.raises(ValueError, match="wall"):
        env.reset(seed=0, options={"state": [0.5, 0.5]})
    with pytest.raises(ValueError, match="wall"):
        env.reset(seed=0, options={"target": [1.5, 2.5]})  # row 2, col 1 is a wall in the "u" maze
    with pytest.raises(ValueError, match="unknown options"):
        env.reset(seed=0, options={"goal": [1, 1]})
    with pytest.raises(ValueError, match="layout"):
        PointMazeEnv(layout="nope")
    with pytest.raises(ValueError, match="enclosed"):
        PointMazeEnv(layout=["...", "#.#"])
    # two rooms: start and target in different rooms would never meet (corners do not connect cells)
    for layout, cut_off in ((["#####", "#.#.#", "#####"], r"\[\(1, 3\)\]"),
                            (["####", "#.##", "##.#", "####"], r"\[\(2, 2\)\]")):
        with pytest.raises(ValueError, match=rf"every free cell must be reachable .* cells {cut_off} \(row, column\) "
                                             r"are cut off from \(1, 1\)"):
            PointMazeEnv(layout=layout)
    PointMazeEnv(layout=["#####", "#...#", "#.#.#", "#####"])  # around a wall: fine
    # geometry that would fail at reset, freeze the agent or make the goal unreachable is refused up front
    for kwargs, error, message in (
        ({"agent_radius": 0.6}, ValueError, r"agent_radius must be in \(0.0, 0.45\], got 0.6"),
        ({"goal_radius": -1}, ValueError, r"goal_radius must be in \(0.0, 1e\+06\], got -1"),
        ({"max_speed": 0}, ValueError, r"max_speed must be in \(0.0, 1\], got 0"),
        ({"max_speed": 2.0}, ValueError, r"max_speed must be in \(0.0, 1\], got 2.0"),  # through walls
        ({"damping": 1.5}, ValueError, r"damping must be in \[0.0, 1\], got 1.5"),
        ({"force_scale": float("nan")}, ValueError, r"force_scale must be in \(0.0, 1e\+06\], got nan"),
        ({"force_scale": float("inf")}, ValueError, r"force_scale must be in \(0.0, 1e\+06\], got inf"),
        ({"goal_radius": "0.2"}, TypeError, "goal_radius must be a number, got str"),
        ({"render_size": 63.9}, TypeError, "render_size: expected an int, got float 63.9"),
        ({"render_size": 4}, ValueError, "render_size: expected an int >= 8, got 4"),
    ):
        with pytest.raises(error, match=message):
            PointMazeEnv(**kwargs)
    assert PointMazeEnv(agent_radius=0.45, damping=0, render_size=np.int64(16)).render_size == 16


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), layout=st.sampled_from(sorted(LAYOUTS)))
def test_property_agent_never_enters_walls(seed, layout):
    env = PointMazeEnv(layout=layout)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(60):
        obs, *_ = env.step(rng.uniform(-1, 1, 2).astype(np.float32))
        assert not env._blocked(obs["state"][:2].astype(np.float64))
        assert env.observation_space.contains(obs)


def test_same_seed_same_episode():
    a, b = PointMazeEnv(), PointMazeEnv()
    oa, _ = a.reset(seed=5)
    ob, _ = b.reset(seed=5)
    assert all(np.array_equal(oa[k], ob[k]) for k in oa)
    oc, _ = PointMazeEnv().reset(seed=6)
    assert not np.array_equal(oa["state"], oc["state"])


def test_expert_solves_and_random_mostly_fails():
    with World("torchrl_swm/PointMaze-v0", num_envs=8) as world:
        random = world.evaluate(48, seed=0, progress=False)
        world.set_policy(expert_policy(world.env))
        expert = world.evaluate(48, seed=0, progress=False)
    assert expert["success_rate"] >= 0.95
    assert random["success_rate"] <= 0.3
    assert expert["success_source"] == "info/is_success"
    assert np.nanmean(expert["steps_to_success"]) < 60
    assert (expert["seeds"] == random["seeds"]).all()  # the same start states for both policies


def test_pool_outputs_and_expert_actions():
    pool = EnvPool("torchrl_swm/PointMaze-v0", num_envs=3, image_shape=(32, 32), seed=0)
    td = pool.reset()
    assert td["pixels"].shape == (3, 32, 32, 3)
    assert td["info", "goal_pixels"].shape == (3, 1, 64, 64, 3)  # the env renders goals at render_size
    action = expert_actions(pool.envs[0].unwrapped.walls, td["state"].numpy(), td["target"].numpy())
    assert action.shape == (3, 2) and np.abs(action).max() <= 1
    out = PointMazeExpert("u", noise=0.1)(td)
    assert out["action"].dtype == torch.float32 and out["action"].shape == (3, 2)
    with pytest.raises(TypeError, match="PointMaze"):
        expert_policy(EnvPool("CartPole-v1", num_envs=1))
    pool.close()


@pytest.mark.parametrize("batch_shape", [(), (3, 2)])
def test_expert_acts_on_any_batch_shape(batch_shape):
    # an unbatched td (a single exported env) or a [T, N] one: each row gets the action of its own state
    states = torch.tensor([[1.5, 1.5, 0.0, 0.0], [3.5, 1.5, 0.0, 0.0], [3.5, 3.5, 0.1, 0.0]])
    index = torch.arange(int(np.prod(batch_shape, dtype=int))).reshape(batch_shape) % 3
    td = TensorDict({"state": states[index], "target": torch.tensor([1.5, 3.5]).expand(*batch_shape, 2)}, batch_shape)
    action = PointMazeExpert("u")(td)["action"]
    assert action.shape == (*batch_shape, 2)
    expected = expert_actions(PointMazeExpert("u").walls, states.numpy(), np.array([[1.5, 3.5]] * 3))
    assert torch.equal(action, torch.as_tensor(expected, dtype=torch.float32)[index])


def test_expert_policy_on_a_process_pool():
    # the envs live in the workers: the layout is read through the pool, not pool.envs
    pool = EnvPool("torchrl_swm/PointMaze-v0", num_envs=2, backend="process", num_workers=1, seed=0)
    policy = expert_policy(pool)
    assert isinstance(policy, PointMazeExpert)
    td = policy(pool.reset())
    assert td["action"].shape == (2, 2) and td["action"].abs().max() <= 1
    pool.close()


def test_non_finite_velocities_and_foreign_datasets_are_clear_errors():
    env = PointMazeEnv()
    env.reset(seed=0)
    start = env.get_state()
    with pytest.raises(ValueError, match=r"velocity must be 2 finite numbers"):
        env.reset(options={"state": [*start[:2], float("nan"), 0.0]})
    for action in ([float("nan"), 0.0], [float("inf"), 0.0], [0.0, -float("inf")]):  # inf was clipped to +-1
        with pytest.raises(ValueError, match=r"PointMaze.step: action must be finite"):
            env.step(np.array(action, np.float32))
    # a dataset of another env (CartPole: no "state" observation) names what the hook needs
    with pytest.raises(KeyError, match=r"start step has no 'state' observation \(keys: \['observation'\]\)"):
        env.reset_options_from_dataset({"observation": np.zeros(4)}, {"observation": np.zeros(4)})


@pytest.mark.parametrize("flag", ["terminate_on_success", "show_target", "goal_image"])
def test_flags_refuse_truthy_non_bools(flag):
    """terminate_on_success="false" (a YAML or CLI string) was True: every episode ended at success."""
    with pytest.raises(TypeError, match=rf"PointMaze: {flag}: expected True or False, got str 'false'"):
        gym.make("torchrl_swm/PointMaze-Open-v0", **{flag: "false"})
    assert getattr(PointMazeEnv(**{flag: np.False_}), flag) is False


@pytest.mark.parametrize("layout, error, received", [
    (None, TypeError, r"got NoneType None"),
    (5, TypeError, r"got int 5"),
    ([["#", "#", "#"], ["#", ".", "#"]], TypeError, r"got a list whose row 0 is list \['#', '#', '#'\]"),
    ([], ValueError, r"got an empty list"),
    (["#####", "#...#", "###"], ValueError, r"got rows of lengths \[5, 5, 3\]"),
    ("nope", ValueError, r"got 'nope'"),
])
def test_a_layout_of_the_wrong_form_names_the_expected_form_and_what_it_got(layout, error, received):
    # None and 5 raised a raw "'NoneType' object is not iterable"; a grid of characters was read through str(row)
    # and refused for its characters: "must be '#' or '.', got [' ', "'", ',', '[', ']']"
    expected = (r"PointMaze: layout: expected a layout name \(one of \['medium', 'open', 'u'\]\) or a non-empty "
                r"list of equal-length strings of '#' and '.', ")
    for make in (PointMazeEnv, PointMazeExpert):
        with pytest.raises(error, match=expected + received):
            make(layout)
    rows = np.array(LAYOUTS["u"])  # an array of strings is a list of strings
    assert np.array_equal(PointMazeEnv(rows).walls, PointMazeEnv("u").walls)


def test_a_layout_with_a_single_free_cell_is_refused():
    # start and target are drawn in two different free cells: one cell leaves no episode to draw
    for layout in (["###", "#.#", "###"], ["###", "###", "###"]):
        with pytest.raises(ValueError, match="PointMaze: a layout needs at least two free cells"):
            PointMazeEnv(layout)
    PointMazeEnv(["####", "#..#", "####"])  # two are enough


@pytest.mark.parametrize("layout", [
    ["#####", "#....", "#####"],  # right
    ["#####", "....#", "#####"],  # left
    ["##.##", "#...#", "#####"],  # top
    ["#####", "#...#", "##.##"],  # bottom
])
def test_a_layout_open_on_any_border_is_refused(layout):
    # an open border cell lets the agent's square leave the grid: each of the four borders is checked
    with pytest.raises(ValueError, match=r"the layout must be enclosed by walls \('#' on every border cell\)"):
        PointMazeEnv(layout)


@pytest.mark.parametrize("option, value, what", [
    ("state", [float("nan"), 1.5], "state position"),
    ("state", [1.5, float("nan"), 0.0, 0.0], "state position"),
    ("state", [float("inf"), 1.5], "state position"),
    ("target", [1.5, float("nan")], "target"),
])
def test_a_non_finite_position_is_a_clear_error(option, value, what):
    # a NaN reached the wall check: "cannot convert float NaN to integer"; an inf was "inside a wall"
    env = PointMazeEnv("open")
    with pytest.raises(ValueError, match=rf"PointMaze: {what} must be 2 finite numbers \[x, y\], got array"):
        env.reset(seed=0, options={option: value})
    with pytest.raises(ValueError, match=rf"PointMaze: {what} must be 2 finite numbers"):
        if option == "state":
            env.set_state(value)
        else:
            env.set_state([1.5, 1.5], target=value)


def test_a_refused_reset_or_set_state_leaves_the_env_unchanged():
    # reset(options={"state": ..., "target": <a wall>}) raised, but had already put the agent at the
    # state (with the old target) and re-seeded the RNG; set_state(state, target=<a wall>) had moved the agent too
    env = PointMazeEnv("u")
    env.reset(seed=0)
    state, target, rng = env.get_state(), env._target.copy(), env.np_random.bit_generator.state
    for refused in (lambda: env.reset(seed=1, options={"state": [3.5, 3.5, 0.1, 0.0], "target": [1.5, 2.5]}),
                    lambda: env.set_state([3.5, 3.5, 0.1, 0.0], target=[1.5, 2.5])):  # row 2, col 1: a wall
        with pytest.raises(ValueError, match=r"^PointMaze: target \[1.5, 2.5\] is inside a wall"):
            refused()
        assert env.get_state().tolist() == state.tolist()
        assert env._target.tolist() == target.tolist()
        assert env.np_random.bit_generator.state == rng


def test_a_position_refused_for_its_distance_to_a_wall_says_so():
    # [1.1, 1.5] is in free cell (1, 1) of the U maze, 0.1 from a wall, and was refused as "inside a
    # wall or outside the maze"; the agent's square (half-width agent_radius) would overlap the wall there
    env = PointMazeEnv("u")
    for option, pos, what in (("target", [1.1, 1.5], "target"), ("state", [1.5, 1.9], "state position")):
        with pytest.raises(ValueError, match=(rf"^PointMaze: {what} \[{pos[0]}, {pos[1]}\] is within agent_radius=0.15 "
                                              r"of a wall \(the agent, a square of half-width agent_radius around its "
                                              r"position, would overlap the wall\)$")):
            env.reset(seed=0, options={option: pos})
    with pytest.raises(ValueError, match=r"^PointMaze: target \[1.5, 2.5\] is inside a wall \(cell \(2, 1\) "
                                         r"\(row, column\)\)$"):
        env.reset(seed=0, options={"target": [1.5, 2.5]})
    with pytest.raises(ValueError, match=r"^PointMaze: state position \[-0.5, 1.5\] is outside the maze "
                                         r"\(x in \[0, 5\), y in \[0, 5\)\)$"):
        env.reset(seed=0, options={"state": [-0.5, 1.5]})
    thin = PointMazeEnv("u", agent_radius=0.05)  # a smaller agent fits there
    obs, _ = thin.reset(seed=0, options={"target": [1.1, 1.5], "state": [1.5, 1.9]})
    assert obs["target"].tolist() == pytest.approx([1.1, 1.5])
    assert obs["state"][:2].tolist() == pytest.approx([1.5, 1.9])


_STATE_FORM = r"\[x, y\] or \[x, y, vx, vy\]"
_TARGET_FORM = r"2 finite numbers \[x, y\]"


@pytest.mark.parametrize("option, value, message", [
    ("state", "abc", rf"^PointMaze: state must be {_STATE_FORM}, got str 'abc'$"),
    ("state", {"x": 1.5, "y": 1.5}, rf"^PointMaze: state must be {_STATE_FORM}, got dict \{{'x': 1.5, 'y': 1.5\}}$"),
    ("state", None, rf"^PointMaze: state must be {_STATE_FORM}, got NoneType None$"),
    ("state", ["1.5", "1.5"], rf"^PointMaze: state must be {_STATE_FORM}, got list \['1.5', '1.5'\]$"),
    ("target", None, rf"^PointMaze: target must be {_TARGET_FORM}, got NoneType None$"),
    ("target", "abc", rf"^PointMaze: target must be {_TARGET_FORM}, got str 'abc'$"),
    ("target", [{"x": 1}, 2], rf"^PointMaze: target must be {_TARGET_FORM}, got list \[\{{'x': 1\}}, 2\]$"),
])
def test_a_non_numeric_state_or_target_names_pointmaze_the_option_and_what_it_got(option, value, message):
    # "abc" gave numpy's bare "could not convert string to float: 'abc'", a dict "float() argument must
    # be a string or a real number", None "got shape (1,)" (the NaN array it became): none named PointMaze or the option
    env = PointMazeEnv("open")
    with pytest.raises(TypeError, match=message):
        env.reset(seed=0, options={option: value})
    if value is not None or option == "state":  # set_state(state, target=None) keeps the target
        with pytest.raises(TypeError, match=message):
            env.set_state(value) if option == "state" else env.set_state([1.5, 1.5], target=value)


def test_a_second_reset_with_a_new_target_renders_the_new_targets_goal_pixels():
    # the goal image is cached per episode: a reset that moves the target must not show the previous episode's
    env = PointMazeEnv("open", render_mode="rgb_array")
    _, first = env.reset(seed=0, options={"target": [1.5, 1.5]})
    _, info = env.reset(seed=0, options={"target": [3.5, 3.5]})
    assert np.array_equal(info["goal_pixels"], env.goal_frame())
    assert not np.array_equal(info["goal_pixels"], first["goal_pixels"])


@settings(max_examples=30, deadline=None)
@given(action=st.lists(st.floats(-10, 10), min_size=2, max_size=2), velocity=st.floats(-0.15, 0.15))
def test_property_an_action_acts_as_its_clip_to_the_action_space(action, velocity):
    # Box(-1, 1): a force of 2 pushes as hard as 1 (unclipped, the point mass accelerated past the declared range)
    state = [2.5, 2.5, velocity, -velocity]
    given_, clipped = PointMazeEnv("open"), PointMazeEnv("open")
    given_.reset(seed=0, options={"state": state})
    clipped.reset(seed=0, options={"state": state})
    out = given_.step(np.array(action))[0]["state"]
    assert np.array_equal(out, clipped.step(np.clip(action, -1, 1))[0]["state"])


@pytest.mark.parametrize("layout, pos", [
    (["#########", "#.......#", "#########"], [7.5, 1.5]),  # wide: 9 columns, 3 rows
    (["###", "#.#", "#.#", "#.#", "#.#", "#.#", "#.#", "#.#", "###"], [1.5, 7.5]),  # tall
])
def test_a_non_square_maze_draws_the_agent_at_its_position(layout, pos):
    # the frame is square and so are the cells: render_size / max(rows, cols) pixels per cell, the shorter side
    # padded with wall
    from torchrl_swm.envs.point_maze import _AGENT

    env = PointMazeEnv(layout, render_mode="rgb_array", render_size=36)
    env.reset(seed=0, options={"state": pos})
    frame = env.render()
    assert frame.shape == (36, 36, 3)
    ys, xs = np.nonzero((frame == _AGENT).all(-1))
    scale = 36 / 9
    assert len(ys) > 0 and abs(ys.mean() + 0.5 - pos[1] * scale) < 0.6 and abs(xs.mean() + 0.5 - pos[0] * scale) < 0.6


@pytest.mark.parametrize("render_size", [32, 64, 128])
def test_the_agent_is_drawn_as_a_disk_of_a_quarter_cell(render_size):
    # radius 0.25 cells: its pixel count is the disk's area, pi * (0.25 * pixels per cell) ** 2
    from torchrl_swm.envs.point_maze import _AGENT

    env = PointMazeEnv("open", render_mode="rgb_array", render_size=render_size)
    env.reset(seed=0, options={"state": [2.5, 2.5]})
    pixels = int((env.render() == _AGENT).all(-1).sum())
    area = np.pi * (0.25 * render_size / 5) ** 2
    assert abs(pixels - area) <= 0.25 * area + 4, (pixels, area)
    # at the smallest frame a quarter cell is under a pixel: the disk is one pixel wide, still visible
    tiny = PointMazeEnv("medium", render_mode="rgb_array", render_size=8)
    tiny.reset(seed=0, options={"state": [3.5, 3.5]})
    assert (tiny.render() == _AGENT).all(-1).any()


def test_the_noisy_expert_stays_in_the_action_space():
    # noise=0.5 on actions at +-1: the sum is clamped back to Box(-1, 1) (unclamped: |action| up to ~2)
    from tensordict import TensorDict

    torch.manual_seed(0)
    td = TensorDict(state=torch.tensor([[1.5, 1.5, 0.0, 0.0]] * 64), target=torch.tensor([[3.5, 1.5]] * 64),
                    batch_size=[64])
    action = PointMazeExpert("u", noise=0.5)(td)["action"]
    assert action.abs().max() <= 1 and action.std(0).min() > 0.1  # noisy, and inside the box


# -- behaviours the module docstring states ------------------------------------------------------------------------
def test_a_step_damps_the_velocity_then_adds_the_force():
    # v <- damping * v + force_scale * a: 0.7 * 0.1 + 0.05 * 1 = 0.12 (not damping * (v + force_scale * a) = 0.105),
    # then the point moves by v
    env = PointMazeEnv("open")
    env.reset(seed=0, options={"state": [2.5, 2.5, 0.1, 0.0]})
    state = env.step(np.array([1.0, 0.0], np.float32))[0]["state"]
    np.testing.assert_allclose(state, [2.62, 2.5, 0.12, 0.0], atol=1e-6)


def test_an_axis_move_into_a_wall_is_cancelled_and_zeroes_that_velocity():
    # x 1.2 - 0.105 puts the agent's square (half-width 0.15) into the wall column 0: x stays and vx is zeroed
    env = PointMazeEnv("open")
    env.reset(seed=0, options={"state": [1.2, 2.5, -0.15, 0.0]})
    state = env.step(np.zeros(2, np.float32))[0]["state"]
    np.testing.assert_allclose(state, [1.2, 2.5, 0.0, 0.0], atol=1e-6)


def test_a_steps_reward_and_success_describe_the_position_it_moved_to():
    # from 0.3 away the agent moves 0.15 towards the target: 0.15 < goal_radius 0.2 after the move (measured before
    # it: not terminated, reward -0.3)
    env = PointMazeEnv("open")
    env.reset(seed=0, options={"state": [1.5, 1.5, 0.15, 0.0], "target": [1.8, 1.5]})
    obs, reward, terminated, _, info = env.step(np.array([1.0, 0.0], np.float32))
    np.testing.assert_allclose(obs["state"][:2], [1.65, 1.5], atol=1e-6)
    assert terminated and info["is_success"]
    assert info["distance"] == pytest.approx(0.15) and reward == pytest.approx(-0.15)


def test_the_distance_and_dense_reward_are_euclidean():
    # (1.5, 1.5) to (2.5, 2.5): sqrt(2), not the L1 2.0
    env = PointMazeEnv("open")
    _, info = env.reset(seed=0, options={"state": [1.5, 1.5], "target": [2.5, 2.5]})
    reward, _, _, info2 = env.step(np.zeros(2, np.float32))[1:]
    assert info["distance"] == pytest.approx(2**0.5) and info2["distance"] == pytest.approx(2**0.5)
    assert reward == pytest.approx(-(2**0.5))


def test_the_sparse_reward_is_0_until_success_then_1():
    # "1.0 on success": 0.0 elsewhere
    env = PointMazeEnv("open", reward_type="sparse")
    env.reset(seed=0, options={"state": [1.5, 1.5], "target": [3.5, 3.5]})
    assert env.step(np.zeros(2, np.float32))[1] == 0.0
    env.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.6, 1.5]})
    assert env.step(np.zeros(2, np.float32))[1] == 1.0


def test_success_is_a_distance_strictly_below_goal_radius():
    # "Success: distance below goal_radius": exactly goal_radius away is no success, in info (reset and step) and for
    # terminated and the sparse reward
    for reward_type in ("dense", "sparse"):
        env = PointMazeEnv("open", goal_radius=0.25, reward_type=reward_type)
        _, info = env.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.75, 1.5]})
        assert info["distance"] == 0.25 and not info["is_success"]
        _, reward, terminated, _, info = env.step(np.zeros(2, np.float32))
        assert info["distance"] == 0.25 and not info["is_success"] and not terminated
        assert reward == (0.0 if reward_type == "sparse" else -0.25)


def test_a_non_square_mazes_spaces_are_x_by_columns_and_y_by_rows():
    # every other test maze is square: spaces with rows and columns swapped went unnoticed
    layout = ["#########", "#.......#", "#########"]  # 3 rows, 9 columns
    env = PointMazeEnv(layout)
    assert env.observation_space["state"].high[:2].tolist() == [9, 3]
    assert env.observation_space["target"].high.tolist() == [9, 3]
    obs, _ = env.reset(seed=0, options={"state": [7.5, 1.5], "target": [6.5, 1.5]})
    assert env.observation_space.contains(obs)
    for seed in range(20):
        assert env.observation_space.contains(env.reset(seed=seed)[0]), seed


@pytest.mark.parametrize("layout", ["u", "medium", ("#########", "#.......#", "#.##.##.#", "#########")])
def test_the_rendered_walls_match_the_layout(layout):
    # the pixel at each cell's centre is a wall pixel exactly where the layout has a wall (not transposed); a
    # non-square maze is padded with wall below
    from torchrl_swm.envs.point_maze import _FLOOR, _WALL

    env = PointMazeEnv(layout, render_mode="rgb_array", render_size=90)
    env.reset(seed=0)
    frame = env.render()
    rows, cols = env.walls.shape
    scale = 90 / max(rows, cols)
    agent = env.cell_of(env.get_state())
    for r in range(max(rows, cols)):
        for c in range(max(rows, cols)):
            if (r, c) == agent:
                continue
            wall = r >= rows or c >= cols or env.walls[r, c]
            pixel = frame[int((r + 0.5) * scale), int((c + 0.5) * scale)]
            assert pixel.tolist() == (_WALL if wall else _FLOOR).tolist(), (r, c)


def test_show_target_draws_the_target_disk_at_the_target():
    # show_target=True: a green disk centred on the target; off by default
    from torchrl_swm.envs.point_maze import _TARGET

    options = {"state": [1.5, 1.5], "target": [3.5, 3.5]}
    env = PointMazeEnv("open", render_mode="rgb_array", render_size=50, show_target=True)
    env.reset(seed=0, options=options)
    ys, xs = np.nonzero((env.render() == _TARGET).all(-1))
    assert len(ys) > 0
    centre = [(xs.mean() + 0.5) / 10, (ys.mean() + 0.5) / 10]  # 10 pixels per cell
    assert centre == pytest.approx([3.5, 3.5], abs=0.1)
    off = PointMazeEnv("open", render_mode="rgb_array", render_size=50)
    off.reset(seed=0, options=options)
    assert not (off.render() == _TARGET).all(-1).any()
