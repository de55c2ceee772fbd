"""The torchrl-swm command, run as a subprocess: collect, eval, info, errors, the command registry."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from torchrl_swm import cli

SCRIPT = Path(sys.executable).parent / "torchrl-swm"


def run(*args, cwd=None, extra_path=None, timeout=240):
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchrl_swm.cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1", SDL_VIDEODRIVER="dummy")
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=env)


def test_console_script_is_installed_and_lists_commands():
    assert SCRIPT.exists() or shutil.which("torchrl-swm"), "pip install -e . should install the console script"
    out = run("--help")
    assert out.returncode == 0
    for name in ("collect", "eval", "info"):
        assert name in out.stdout


def test_python_dash_m_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "torchrl_swm", "--help"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: torchrl-swm") and "collect" in out.stdout
    out = subprocess.run([sys.executable, "-m", "torchrl_swm", "info", "no/such/dataset"], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 2 and "no dataset at 'no/such/dataset'" in out.stderr


def test_collect_info_eval_round_trip(tmp_path, capsys):
    data = tmp_path / "data" / "cartpole"  # a missing parent is created, as World.collect does (README's data/maze)
    out = run("collect", "CartPole-v1", "--episodes", 5, "--num-envs", 2, "--out", data, "--seed", 3)
    assert out.returncode == 0, out.stderr
    assert "5 episodes" in out.stdout and (data / "dataset.json").exists()
    assert json.loads((data / "dataset.json").read_text())["seed"] == 3

    info = run("info", data)
    assert info.returncode == 0, info.stderr
    assert "5 episodes" in info.stdout and "CartPole-v1" in info.stdout and "seeds      3..7" in info.stdout
    assert cli.main(["info", str(data), "--json"]) == 0  # in-process: the same code, one interpreter less

    meta = json.loads(capsys.readouterr().out)
    assert meta["num_episodes"] == 5 and meta["complete"] is True

    result_file = tmp_path / "result.json"
    ev = run("eval", "CartPole-v1", "--episodes", 6, "--num-envs", 3, "--json", result_file)
    assert ev.returncode == 0, ev.stderr
    assert "6 episodes on 3 envs (reset_mode=auto" in ev.stdout  # no --mode, no --dataset: "auto"
    assert "success rate  n/a" in ev.stdout  # random CartPole: no success signal, not 100%
    result = json.loads(result_file.read_text())
    assert len(result["episode_returns"]) == 6 and result["success_rate"] is None
    assert result["seeds"] == [0, 1, 2, 3, 4, 5] and result["reset_mode"] == "auto"
    # --seed S: episode j starts from seed S + j (in-process: the same code, one interpreter less)
    assert cli.main(["eval", "CartPole-v1", "--episodes", "3", "--num-envs", "2", "--seed", "7", "--no-progress",
                     "--json", str(result_file)]) == 0
    assert json.loads(result_file.read_text())["seeds"] == [7, 8, 9]


def test_goal_env_with_policy_factory_dataset_eval_and_video(tmp_path, capsys):
    from torchrl_swm import load_dataset

    data = tmp_path / "maze"
    # --image-shape H W, not square: H rows by W columns, in the dataset and in eval's frames and goals alike
    out = run("collect", "torchrl_swm/PointMaze-v0", "--episodes", 6, "--out", data, "--image-shape", 24, 32,
              "--policy", "torchrl_swm.envs:expert_policy", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "success    1.000" in out.stdout and "pixels" in out.stdout
    assert tuple(load_dataset(data).td.get("pixels").shape[1:]) == (24, 32, 3)
    # no --num-envs: collect's default, the one its --help states
    assert json.loads((data / "dataset.json").read_text())["num_envs"] == 4
    with pytest.raises(SystemExit):
        cli.main(["collect", "--help"])
    assert "parallel envs (default 4)" in " ".join(capsys.readouterr().out.split())
    # the dataset's pixels are H x W = 24 x 32: --image-shape 32 24 (W H) is refused, 24 32 taken
    code = cli.main(["eval", "torchrl_swm/PointMaze-v0", "--dataset", str(data), "--goal-offset", "3",
                     "--eval-budget", "12", "--image-shape", "32", "24", "--no-progress"])
    assert code == 2 and "--image-shape 32 24: the dataset's pixels are 24 x 32" in capsys.readouterr().err
    ev = run("eval", "torchrl_swm/PointMaze-v0", "--dataset", data, "--goal-offset", 3, "--eval-budget", 12,
             "--num-envs", 2, "--policy", "torchrl_swm.envs:expert_policy", "--video", tmp_path / "vid",
             "--image-shape", 24, 32, "--no-progress", "--json", tmp_path / "ev.json")
    assert ev.returncode == 0, ev.stderr
    assert "6 episodes on 2 envs (reset_mode=wait" in ev.stdout and "goal_offset=3" in ev.stdout
    assert json.loads((tmp_path / "ev.json").read_text())["start_steps"] == [0] * 6  # no --start-step: step 0
    assert len(list((tmp_path / "vid").glob("episode_*.mp4"))) == 6


def test_warnings_are_one_line_on_stderr_like_errors(tmp_path, capsys, monkeypatch):
    # the default display showed a source line of the package's ("cli.py:444: UserWarning: ...\n  result = ...")
    import warnings

    pytest.importorskip("imageio_ffmpeg")
    (tmp_path / "vid").mkdir()
    (tmp_path / "vid" / "episode_00000.mp4").write_bytes(b"an earlier run's")
    default = warnings.showwarning
    assert cli.main(["eval", "torchrl_swm/PointMaze-v0", "--episodes", "1", "--max-steps", "3", "--video",
                     str(tmp_path / "vid"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "torchrl-swm eval: warning: VideoRecorder: " in err and "already holds 1 video(s)" in err
    assert "UserWarning" not in err and ".py:" not in err
    assert warnings.showwarning is default  # the test process's display is its own again
    # a category other than UserWarning is named on the line
    (tmp_path / "warn_policies.py").write_text(
        "import torch, warnings\n"
        "def policy(td):\n"
        "    warnings.warn('policy saturated', RuntimeWarning)\n"
        "    return td.set('action', torch.zeros(td.batch_size[0], dtype=torch.int64))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["eval", "CartPole-v1", "--episodes", "1", "--num-envs", "1", "--no-progress",
                     "--policy", "warn_policies:policy"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "torchrl-swm eval: warning: RuntimeWarning: policy saturated", err


def test_video_grid_writes_one_grid_video(tmp_path, capsys):
    # --video DIR --video-grid: one grid.mp4 of all episodes instead of an episode_*.mp4 each
    pytest.importorskip("imageio_ffmpeg")
    assert cli.main(["eval", "CartPole-v1", "--episodes", "3", "--num-envs", "2", "--max-steps", "10",
                     "--image-shape", "16", "16", "--video", str(tmp_path / "v"), "--video-grid",
                     "--no-progress"]) == 0
    assert sorted(os.listdir(tmp_path / "v")) == ["grid.mp4"]
    # without --video there is nowhere to write it: a usage error, never a silent run without a video
    assert cli.main(["eval", "CartPole-v1", "--episodes", "1", "--video-grid", "--no-progress"]) == 2
    assert "--video-grid needs --video DIR" in capsys.readouterr().err


def test_policy_object_from_a_module(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_policies.py").write_text(
        "import torch\n"
        "def push_right(td):\n"
        "    return td.set('action', torch.ones(td.batch_size[0], dtype=torch.int64))\n"
        "not_callable = 3\n"
        "class Holder:\n"
        "    @staticmethod\n"
        "    def push(td):\n"
        "        return td.set('action', torch.ones(td.batch_size[0], dtype=torch.int64))\n"
    )
    ok = run("eval", "CartPole-v1", "--episodes", 2, "--policy", "my_policies:push_right", extra_path=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "2 episodes" in ok.stdout
    # the error paths are the same code in-process (faster than one interpreter each)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--policy", "my_policies:nope"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--policy", "my_policies:not_callable"]) == 2
    assert "expected a policy" in capsys.readouterr().err
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--policy", "no_such_module_xyz:p"]) == 2
    assert "cannot import module" in capsys.readouterr().err
    # a missing parent package is the same usage error, not the ModuleNotFoundError of an import inside a module
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--policy", "nosuchpkg_xyz.sub:p"]) == 2
    assert "cannot import module 'nosuchpkg_xyz.sub'" in capsys.readouterr().err
    # the attribute may be dotted (module:Class.method), as in an entry point
    assert cli.main(["eval", "CartPole-v1", "--episodes", "2", "--num-envs", "2", "--no-progress", "--policy",
                     "my_policies:Holder.push"]) == 0
    assert "2 episodes on 2 envs" in capsys.readouterr().out
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--policy", "no_colon"]) == 2
    assert "module:attribute" in capsys.readouterr().err


def _env_that_fails_to_build():
    raise RuntimeError("this env was built")


def test_clear_errors_for_unknown_envs_and_bad_paths(tmp_path, capsys):
    out = run("eval", "CartPol-v1", "--episodes", 1)
    assert out.returncode == 2 and "unknown environment id 'CartPol-v1'" in out.stderr and "CartPole" in out.stderr
    out = run("info", tmp_path / "missing")
    assert out.returncode == 2 and "does not exist" in out.stderr

    def error(*argv):
        code = cli.main([str(a) for a in argv])
        return code, capsys.readouterr().err

    (tmp_path / "plain").mkdir()
    code, err = error("info", tmp_path / "plain")
    assert code == 2 and "not a torchrl_swm dataset" in err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("x")
    code, err = error("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "full")
    assert code == 2 and "not empty" in err
    # --overwrite replaces a dataset only: any other directory is refused before an env is built
    gym.register("tests/BuildFails-v0", entry_point=_env_that_fails_to_build)
    try:
        code, err = error("collect", "tests/BuildFails-v0", "--episodes", 1, "--max-steps", 5,
                          "--out", tmp_path / "full", "--overwrite")
    finally:
        gym.registry.pop("tests/BuildFails-v0")
    assert code == 2 and "not a torchrl_swm dataset" in err and "built" not in err
    assert (tmp_path / "full" / "x.txt").read_text() == "x"
    (tmp_path / "file").write_text("x")
    code, err = error("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "file" / "dir")
    assert code == 2 and "is not a directory" in err
    code, err = error("eval", "CartPole-v1", "--dataset", tmp_path / "plain", "--goal-offset", 1, "--eval-budget", 2)
    assert code == 2 and "--dataset" in err
    code, err = error("eval", "CartPole-v1", "--goal-offset", 1)
    assert code == 2 and "only used with --dataset" in err
    code, err = error("eval", "torchrl_swm/NoSuchMaze-v0")
    assert code == 2 and "unknown environment id" in err
    code, err = error("eval", "CartPole-v1", "--env-kwargs", "{bad")
    assert code == 2 and "invalid JSON" in err
    code, err = error("eval", "CartPole-v1", "--env-kwargs", "[1]")
    assert code == 2 and "--env-kwargs: expected a JSON object" in err and "got list" in err
    code, err = error("eval", "CartPole-v1", "--no-progress", "--env-kwargs", '{"no_such_kwarg": 1}')
    assert code == 1 and "no_such_kwarg" in err and "--traceback" in err
    # a gym.make argument that has a flag of its own here is a usage error naming the flag
    for kwarg, flag in (("max_episode_steps", "--max-steps"), ("seed", "--seed"), ("num_envs", "--num-envs")):
        for command in ("eval", "collect"):
            extra = ["--out", tmp_path / f"ek-{kwarg}"] if command == "collect" else []
            code, err = error(command, "CartPole-v1", "--episodes", 1, *extra, "--env-kwargs", json.dumps({kwarg: 10}))
            assert code == 2 and f"{kwarg} has a flag of its own here: use {flag}" in err, (command, err)
    # bench refuses bad sizes and sections as usage errors, before any work
    for argv in (["--sections", "nope"], ["--ns", "0"], ["--bs", "x"], ["--seconds", "0"]):
        code, err = error("bench", *argv)
        assert code == 2 and argv[0] in err, (argv, err)
    code, err = error("bench", "--sections", ",")
    assert code == 2 and "--sections: no section in ','; expected some of cartpole" in err  # was "unknown []"


def test_command_registry_in_process(capsys):
    def configure(parser):
        parser.add_argument("--value", type=int, default=1)

    @cli.register_command("echo-test", help="test command", configure=configure)
    def _echo(args):
        print(f"value={args.value}")
        return 0

    try:
        assert cli.main(["echo-test", "--value", "7"]) == 0
        assert "value=7" in capsys.readouterr().out
        with pytest.raises(ValueError, match="already registered"):
            cli.register_command("echo-test", help="again", configure=configure)(_echo)
    finally:
        cli.COMMANDS.pop("echo-test", None)
    assert cli.main(["info", "/definitely/not/here"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_ctrl_c_during_collect_leaves_a_loadable_dataset(tmp_path):
    import signal
    import time

    from torchrl_swm import load_dataset

    data = tmp_path / "interrupted"
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchrl_swm.cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # A test run started in the background (`cmd &`, nohup) ignores SIGINT, and the child would inherit that:
    # Python then installs no KeyboardInterrupt handler. With a handler here, exec gives the child the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([*command, "collect", "CartPole-v1", "--episodes", "20000", "--out", str(data),
                                 "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        # a cold start (no bytecode cache: PYTHONDONTWRITEBYTECODE) on a loaded CI machine imports torch and
        # torchrl from source first; a SIGINT during those imports would test them, not the collect
        deadline = time.monotonic() + 300
        committed = False
        while time.monotonic() < deadline and proc.poll() is None:  # wait for the first committed episode
            meta = data / "dataset.json"
            if meta.exists() and json.loads(meta.read_text()).get("num_episodes", 0) > 0:
                committed = True
                break
            time.sleep(0.2)
        assert committed, f"no episode committed within 300 s (exit code {proc.poll()})"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    ds = load_dataset(data)
    assert f"interrupted: {data} holds {ds.num_episodes} complete episode" in stderr, stderr
    assert ds.metadata["complete"] is False and "KeyboardInterrupt" in ds.metadata["interrupted"]
    assert ds.num_episodes >= 1
    for k in range(ds.num_episodes):  # every stored episode is whole: starts at 0, ends done
        ep = ds.episode(k)
        assert ep["step_count"][0].item() == 0 and ep["next", "done"][-1].item()
        assert not ep["next", "done"][:-1].any()


@pytest.mark.parametrize("interrupted_at_call", [1, 3])
def test_collect_overwrite_interrupted_before_its_first_episode_says_the_dataset_is_unchanged(
        tmp_path, capsys, monkeypatch, interrupted_at_call):
    """An interrupt before the first episode is complete writes nothing (the earlier dataset is kept, overwrite or
    not), at the first step or after a few (CartPole's episodes last 8 steps or more): the CLI must not report the
    earlier run's episodes as this run's, and --overwrite must not trade them for an empty dataset."""
    from torchrl_swm import load_dataset

    module = f"ctrlc_policy_{interrupted_at_call}"  # a module of its own: an imported one keeps its calls
    (tmp_path / f"{module}.py").write_text(
        "import torch\ncalls = []\n"
        "def policy(td):\n"
        "    calls.append(1)\n"
        f"    if len(calls) == {interrupted_at_call}:\n"
        "        raise KeyboardInterrupt\n"
        "    return td.set('action', torch.zeros(td.batch_size, dtype=torch.int64))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "data"
    assert cli.main(["collect", "CartPole-v1", "--episodes", "3", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    code = cli.main(["collect", "CartPole-v1", "--episodes", "50", "--out", str(out), "--overwrite",
                     "--policy", f"{module}:policy", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130 and "before any episode was complete" in err and "unchanged" in err, err
    assert "complete episodes" not in err
    kept = load_dataset(out)
    assert kept.num_episodes == 3 and kept.metadata["complete"] is True


def test_pixels_or_a_video_of_an_env_that_cannot_render_rgb_array_is_a_usage_error(tmp_path, capsys):
    # refused before any env is built, naming the flag and the env's render modes (not gymnasium's assertion)
    gym.register("CliHumanRender-v0", entry_point="envs:HumanRenderOnly", max_episode_steps=5)
    try:
        for argv, flag in [
            (["eval", "CliHumanRender-v0", "--episodes", "1", "--video", str(tmp_path / "v")], "--video"),
            (["eval", "CliHumanRender-v0", "--episodes", "1", "--pixels"], "--pixels"),
            (["collect", "CliHumanRender-v0", "--episodes", "1", "--out", str(tmp_path / "d"), "--image-shape",
              "8", "8"], "--image-shape"),
        ]:
            code = cli.main([*argv, "--no-progress"])
            err = capsys.readouterr().err
            assert code == 2 and f"{flag}: EnvPool('CliHumanRender-v0', pixels=True)" in err, err
            assert "render_modes=['human']" in err and "Traceback" not in err
        assert not (tmp_path / "d").exists() and not (tmp_path / "v").exists()
    finally:
        gym.registry.pop("CliHumanRender-v0")


def test_bad_arguments_are_usage_errors_with_exit_code_2(tmp_path, capsys):
    def error(*argv):
        code = cli.main([str(a) for a in argv])
        return code, capsys.readouterr().err

    for argv, message in [
        (("eval", "CartPole-v1", "--max-steps", 0), "--max-steps must be >= 1, got 0"),
        (("eval", "CartPole-v1", "--seed", -1), "--seed must be >= 0"),
        (("eval", "CartPole-v1", "--num-envs", 0), "--num-envs must be >= 1"),
        (("eval", "CartPole-v1", "--image-shape", 0, 8), "--image-shape"),
        (("eval", "CartPole-v1", "--episodes", -1), "--episodes must be >= 0"),
        (("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "a", "--max-steps", 0), "--max-steps"),
        (("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "b", "--seed", -3), "--seed must be >= 0"),
    ]:
        code, err = error(*argv, "--no-progress")
        assert code == 2 and message in err, (argv, err)
        assert "Traceback" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    out = run("eval", "CartPole-v1", "--seed", -1, "--no-progress")  # the console script too
    assert out.returncode == 2 and "--seed must be >= 0" in out.stderr


def test_image_shape_with_any_size_below_1_is_a_usage_error(capsys):
    # --image-shape H W needs both sizes positive: "8 0" is refused as "0 8" is, before any env is built
    gym.register("tests/BuildFails-v0", entry_point=_env_that_fails_to_build)
    try:
        for shape in (("8", "0"), ("0", "8"), ("8", "-1")):
            code = cli.main(["eval", "tests/BuildFails-v0", "--no-progress", "--image-shape", *shape])
            err = capsys.readouterr().err
            assert code == 2 and f"--image-shape: expected two positive sizes H W, got {' '.join(shape)}" in err, err
    finally:
        gym.registry.pop("tests/BuildFails-v0")


def test_collect_episodes_below_1_is_a_usage_error_before_any_env_is_built(tmp_path, capsys):
    # collect --episodes 0 would write an empty dataset: a usage error (exit 2), found before the env is built
    gym.register("tests/BuildFails-v0", entry_point=_env_that_fails_to_build)
    try:
        for episodes in (0, -2):
            code = cli.main(["collect", "tests/BuildFails-v0", "--episodes", str(episodes), "--max-steps", "5",
                             "--out", str(tmp_path / "ds"), "--no-progress"])
            err = capsys.readouterr().err
            assert code == 2 and f"--episodes must be >= 1, got {episodes}" in err and "built" not in err, err
    finally:
        gym.registry.pop("tests/BuildFails-v0")
    assert not (tmp_path / "ds").exists()


def test_eval_episodes_0_runs_no_episode_and_exits_0(tmp_path, capsys):
    # eval takes --episodes >= 0 ("--episodes must be >= 0"): 0 evaluates nothing, an empty result, exit 0
    result = tmp_path / "r.json"
    code = cli.main(["eval", "CartPole-v1", "--episodes", "0", "--num-envs", "2", "--no-progress",
                     "--json", str(result)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "0 episodes on 2 envs" in out
    saved = json.loads(result.read_text())
    assert saved["num_episodes"] == 0 and saved["episode_returns"] == [] and saved["env_steps"] == 0


def test_env_kwargs_image_shape_and_pixels_name_their_own_flags(tmp_path, capsys):
    # --env-kwargs may not hold what a flag sets: image_shape names --image-shape, pixels names --pixels
    for kwargs, flag in (({"image_shape": [8, 8]}, "--image-shape"), ({"pixels": True}, "--pixels")):
        for command in ("eval", "collect"):
            extra = ["--out", str(tmp_path / "ds")] if command == "collect" else []
            code = cli.main([command, "CartPole-v1", "--episodes", "1", "--no-progress", *extra,
                             "--env-kwargs", json.dumps(kwargs)])
            err = capsys.readouterr().err
            name = next(iter(kwargs))
            assert code == 2 and f"{name} has a flag of its own here: use {flag}" in err, (command, err)
    assert not (tmp_path / "ds").exists()
    # frames need render_mode='rgb_array': another one there contradicts --video/--pixels/--image-shape (review R2
    # B3: an EnvError from gym.make, exit 1)
    for extra, flag in ((["--video", str(tmp_path / "v")], "--video"), (["--pixels"], "--pixels"),
                        (["--image-shape", "8", "8"], "--image-shape")):
        code = cli.main(["eval", "CartPole-v1", "--episodes", "1", "--no-progress", *extra,
                         "--env-kwargs", json.dumps({"render_mode": "human"})])
        err = capsys.readouterr().err
        assert code == 2 and f"{flag} renders frames with render_mode='rgb_array', but --env-kwargs sets " \
                             "render_mode='human'" in err, err
    assert not (tmp_path / "v").exists()


def test_a_function_whose_env_parameter_is_not_first_is_a_policy_not_a_factory(tmp_path, monkeypatch, capsys):
    # a factory is a function or class whose FIRST parameter is named env; policy(td, env=None) is a policy
    (tmp_path / "env_second.py").write_text(
        "import torch\n"
        "def push(td, env=None):\n"
        "    return td.set('action', torch.ones(td.batch_size[0], dtype=torch.int64))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["eval", "CartPole-v1", "--episodes", "2", "--num-envs", "2", "--no-progress",
                     "--policy", "env_second:push"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "2 episodes on 2 envs" in out


@pytest.fixture(scope="module")
def maze_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("cli") / "maze"
    assert cli.main(["collect", "torchrl_swm/PointMaze-v0", "--episodes", "4", "--num-envs", "2", "--out", str(data),
                     "--image-shape", "16", "16", "--policy", "torchrl_swm.envs:expert_policy", "--no-progress",
                     "--max-steps", "30"]) == 0
    return data


def test_dataset_flags_that_contradict_are_usage_errors(maze_data, capsys):
    def error(*argv):
        code = cli.main([str(a) for a in argv])
        return code, capsys.readouterr().err

    base = ("eval", "torchrl_swm/PointMaze-v0", "--dataset", maze_data, "--no-progress", "--num-envs", 2)
    # --max-steps would silently cut episodes (it becomes the env's TimeLimit) while eval-budget is reported
    code, err = error(*base, "--goal-offset", 2, "--eval-budget", 10, "--max-steps", 2)
    assert code == 2 and "--max-steps 2 cannot be combined with --dataset" in err and "--eval-budget" in err
    code, err = error(*base, "--goal-offset", 2, "--eval-budget", 10, "--episodes", 5)  # one more than it holds
    assert code == 2 and "--episodes 5: the dataset" in err and "holds only 4 episodes" in err
    code, err = error(*base, "--goal-offset", -1, "--eval-budget", 10)
    assert code == 2 and "--goal-offset must be >= 0" in err
    code, err = error(*base, "--goal-offset", 1, "--eval-budget", 0)
    assert code == 2 and "--eval-budget must be >= 1" in err
    code, err = error(*base, "--goal-offset", 1, "--eval-budget", 3, "--start-step", -1)
    assert code == 2 and "--start-step must be >= 0" in err
    code, err = error(*base, "--goal-offset", 1, "--eval-budget", 3, "--start-step", 1000)
    assert code == 2 and "past the end of 4 of the 4 dataset episodes" in err
    code, err = error("eval", "CartPole-v1", "--episodes", 2, "--start-step", 4, "--no-progress")
    assert code == 2 and "only used with --dataset" in err
    # --pixels renders at the dataset's frame size (goals are its frames), as when no flag asks for pixels
    assert cli.main([*map(str, base), "--goal-offset", "1", "--eval-budget", "3", "--episodes", "2", "--pixels"]) == 0
    capsys.readouterr()
    # what is valid still runs: the first --episodes dataset episodes, judged within the eval budget
    assert cli.main([*map(str, base), "--goal-offset", "2", "--eval-budget", "6", "--episodes", "3",
                     "--start-step", "1"]) == 0
    out = capsys.readouterr().out
    assert "3 episodes on 2 envs" in out and "eval_budget=6" in out


def test_goal_offset_0_is_accepted(maze_data, capsys):
    # --goal-offset 0 is valid as World.evaluate's goal_offset=0: the goal is the start step itself
    code = cli.main(["eval", "torchrl_swm/PointMaze-v0", "--dataset", str(maze_data), "--no-progress", "--num-envs",
                     "2", "--goal-offset", "0", "--eval-budget", "2", "--episodes", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "2 episodes on 2 envs" in out and "goal_offset=0" in out


def test_unwritable_json_path_fails_before_the_evaluation(tmp_path, capsys, monkeypatch):
    import torchrl_swm.world as world_module

    ran = []
    original = world_module.World.evaluate
    monkeypatch.setattr(world_module.World, "evaluate", lambda self, *a, **k: ran.append(1) or original(self, *a, **k))
    (tmp_path / "afile").write_text("")
    for path, message in [(tmp_path / "no" / "dir" / "r.json", "parent directory"),
                          (tmp_path / "afile" / "r.json", "afile exists and is not a directory"),
                          (tmp_path, "is a directory")]:
        code = cli.main(["eval", "CartPole-v1", "--episodes", "2", "--no-progress", "--json", str(path)])
        err = capsys.readouterr().err
        assert code == 2 and "--json" in err and message in err, err
    assert ran == []  # nothing was evaluated, so no result was lost
    target = tmp_path / "ok.json"
    assert cli.main(["eval", "CartPole-v1", "--episodes", "2", "--no-progress", "--json", str(target)]) == 0
    assert ran == [1] and len(json.loads(target.read_text())["episode_returns"]) == 2
    capsys.readouterr()
    # the up-front check leaves no stray file behind when the run then fails
    stray = tmp_path / "stray.json"
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--json", str(stray), "--env-kwargs",
                     '{"no_such_kwarg": 1}']) == 1
    assert not stray.exists()
    # and an existing file (an earlier run's results) survives the check when the run then fails: it is only
    # replaced by a run that ends
    target.write_text('{"earlier": "results"}')
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--json", str(target), "--env-kwargs",
                     '{"no_such_kwarg": 1}']) == 1
    assert target.read_text() == '{"earlier": "results"}'


def test_policy_class_that_is_not_a_factory_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "class_policies.py").write_text(
        "import torch\n"
        "class Pusher:\n"
        "    def __init__(self, strength=1):\n"
        "        self.strength = strength\n"
        "    def __call__(self, td):\n"
        "        return td.set('action', torch.ones(td.batch_size[0], dtype=torch.int64))\n"
        "class PusherFactory(Pusher):\n"
        "    def __init__(self, env):\n"
        "        super().__init__()\n"
        "pusher = Pusher()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["eval", "CartPole-v1", "--episodes", "2", "--no-progress", "--policy"]
    assert cli.main([*base, "class_policies:Pusher"]) == 2
    err = capsys.readouterr().err
    assert "Pusher is a class" in err and "'strength'" in err and "not 'env'" in err
    assert "policy = Pusher(...)" in err and "def make_policy(env)" in err
    # the real package's policy class, as the review ran it: refused before any env is built
    assert cli.main(["eval", "torchrl_swm/PointMaze-v0", "--episodes", "2", "--num-envs", "2", "--no-progress",
                     "--policy", "torchrl_swm.envs:PointMazeExpert"]) == 2
    assert "PointMazeExpert is a class" in capsys.readouterr().err
    # checked before the env is built (an env that cannot be built would otherwise fail first, exit 1), by both
    # commands
    gym.register("tests/PolicyBeforeEnv-v0", entry_point=_env_that_fails_to_build, max_episode_steps=5)
    try:
        for extra in (["eval"], ["collect", "--out", str(tmp_path / "never")]):
            code = cli.main([extra[0], "tests/PolicyBeforeEnv-v0", "--episodes", "2", *extra[1:], "--no-progress",
                             "--policy", "class_policies:Pusher"])
            err = capsys.readouterr().err
            assert code == 2 and "Pusher is a class" in err and "this env was built" not in err, (extra, err)
    finally:
        gym.registry.pop("tests/PolicyBeforeEnv-v0")
    assert not (tmp_path / "never").exists()
    # an instance and a class taking env both work
    assert cli.main([*base, "class_policies:pusher"]) == 0
    assert cli.main([*base, "class_policies:PusherFactory"]) == 0
    assert capsys.readouterr().out.count("2 episodes") == 2


def test_a_closed_stdout_pipe_ends_quietly_and_the_json_is_written_first(tmp_path):
    # `torchrl-swm eval ... --json out.json | head -1`: the reader may be gone before the summary is printed
    def run_into_closed_pipe(*args):
        read_end, write_end = os.pipe()
        os.close(read_end)
        command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchrl_swm.cli"]
        # stdout block-buffered, as in a shell (PYTHONUNBUFFERED would make every print fail at once)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        try:
            return subprocess.run([*command, *map(str, args)], stdout=write_end, stderr=subprocess.PIPE, text=True,
                                  timeout=240, env=dict(env, OMP_NUM_THREADS="1"))
        finally:
            os.close(write_end)

    out = run_into_closed_pipe("eval", "CartPole-v1", "--episodes", 3, "--num-envs", 2, "--no-progress",
                               "--json", tmp_path / "r.json")
    assert out.returncode == 141 and out.stderr == ""
    assert len(json.loads((tmp_path / "r.json").read_text())["episode_returns"]) == 3
    assert cli.main(["collect", "CartPole-v1", "--episodes", "2", "--num-envs", "2", "--out", str(tmp_path / "d"),
                     "--no-progress"]) == 0
    out = run_into_closed_pipe("info", tmp_path / "d")
    assert out.returncode == 141 and out.stderr == ""


def test_bad_output_paths_seeds_and_step_limits_are_usage_errors_before_any_work(tmp_path, capsys, monkeypatch):
    import gymnasium as gym

    import torchrl_swm.world as world_module

    built = []
    monkeypatch.setattr(world_module.World, "__init__",
                        lambda self, *a, original=world_module.World.__init__, **k: built.append(1) or original(
                            self, *a, **k))

    def error(*argv):
        code = cli.main([str(a) for a in argv])
        return code, capsys.readouterr().err

    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = [
        (("eval", "CartPole-v1", "--video", tmp_path / "afile"), "--video"),
        (("eval", "CartPole-v1", "--video", tmp_path / "dangling"), "dangling symlink"),
        (("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "dangling"), "dangling symlink"),
        (("eval", "CartPole-v1", "--seed", 2**62), "--seed must be >= 0 and < 2**62"),
        (("collect", "CartPole-v1", "--episodes", 1, "--out", tmp_path / "s", "--seed", 2**62), "< 2**62"),
        (("bench", "--quick", "--json", tmp_path / "no" / "b.json"), "--json"),
        (("bench", "--quick", "--plot", tmp_path), "--plot"),
    ]
    if os.path.isdir("/proc"):  # a directory nobody can create entries in, not even root
        cases.append((("collect", "CartPole-v1", "--episodes", 1, "--out", "/proc/torchrl_swm_ds"), "--out"))
    for argv, message in cases:
        code, err = error(*argv, *(["--no-progress"] if argv[0] != "bench" else []))
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)
    assert built == []
    # an env without a step limit: collect names the flag that sizes the storage
    gym.register("CliNoLimit-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        code, err = error("collect", "CliNoLimit-v0", "--episodes", 1, "--out", tmp_path / "n", "--no-progress")
        assert code == 2 and "pass --max-steps" in err, err
        assert cli.main(["collect", "CliNoLimit-v0", "--episodes", "1", "--out", str(tmp_path / "n"), "--max-steps",
                         "5", "--no-progress"]) == 0
    finally:
        gym.registry.pop("CliNoLimit-v0")


def test_image_shape_other_than_the_datasets_pixels_is_a_usage_error(maze_data, capsys):
    code = cli.main(["eval", "torchrl_swm/PointMaze-v0", "--dataset", str(maze_data), "--goal-offset", "2",
                     "--eval-budget", "6", "--image-shape", "8", "8", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "the dataset's pixels are 16 x 16" in err, err


def test_an_empty_dataset_is_a_usage_error(tmp_path, capsys):
    # a dataset with no episodes: a writer opened and closed without an episode
    from torchrl_swm.data import DatasetWriter

    writer = DatasetWriter(tmp_path / "empty", 10)
    writer.open()
    writer.close(complete=False)
    code = cli.main(["eval", "CartPole-v1", "--dataset", str(tmp_path / "empty"), "--goal-offset", "1",
                     "--eval-budget", "3", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "holds no episodes" in err and "Traceback" not in err


@pytest.mark.parametrize("module", ["torchrl_swm", "torchrl_swm.cli"])
def test_every_way_of_running_the_cli_has_every_command(module):
    # `python -m torchrl_swm.cli` runs cli.py as __main__, a second copy of the module: the commands other modules
    # register (bench, quickstart) must still be there
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for command in ("bench", "quickstart", "eval"):
        out = subprocess.run([sys.executable, "-m", module, command, "--help"], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0 and f"usage: torchrl-swm {command}" in out.stdout, (command, out.stderr[-300:])


def test_policy_module_errors_of_its_own_are_not_usage_errors(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_policies.py").write_text("import no_such_dependency_xyz\npolicy = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["eval", "CartPole-v1", "--episodes", "1", "--no-progress", "--policy"]
    # the module was found: the failing import inside it is a bug there (exit 1, the traceback on request)
    assert cli.main([*argv, "broken_policies:policy"]) == 1
    err = capsys.readouterr().err
    assert "ModuleNotFoundError: No module named 'no_such_dependency_xyz'" in err and "--traceback" in err
    assert "cannot import module" not in err
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        cli.main(["--traceback", *argv, "broken_policies:policy"])
    # module names importlib cannot take are usage errors, as a missing colon is
    for spec in (":policy", ".relative:policy", "module:"):
        assert cli.main([*argv, spec]) == 2
        err = capsys.readouterr().err
        assert "expected 'module:attribute' (an absolute module name)" in err and repr(spec) in err, err


def test_progress_bars_only_on_a_terminal_unless_asked(tmp_path, capsys):
    # stderr is captured here (not a terminal): no bar by default, one with --progress
    assert cli.main(["eval", "CartPole-v1", "--episodes", "2"]) == 0
    assert "evaluate" not in capsys.readouterr().err
    assert cli.main(["eval", "CartPole-v1", "--episodes", "2", "--progress"]) == 0
    assert "evaluate:   0%" in capsys.readouterr().err  # (a bar that ends fast is cleared: leave=False)


def test_eval_warns_when_the_env_has_no_step_limit(capsys):
    gym.register("CliNoLimitEval-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        assert cli.main(["eval", "CliNoLimitEval-v0", "--episodes", "2", "--no-progress"]) == 0
        assert "has no step limit" in capsys.readouterr().err  # random CartPole still ends its episodes
        assert cli.main(["eval", "CliNoLimitEval-v0", "--episodes", "2", "--max-steps", "5", "--no-progress"]) == 0
        assert "no step limit" not in capsys.readouterr().err
    finally:
        gym.registry.pop("CliNoLimitEval-v0")


def test_quickstart_help_is_the_quickstarts_own(capsys):
    # the console script showed a stub pointing at `python -m torchrl_swm.quickstart --help`
    with pytest.raises(SystemExit) as exit_:
        cli.main(["quickstart", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert out.startswith("usage: torchrl-swm quickstart ") and "--tiny" in out and "--num-envs N" in out


def test_quickstart_out_naming_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["quickstart", "--tiny", "--out", str(tmp_path / "afile")])
    assert exit_info.value.code == 2
    assert "torchrl-swm quickstart: error: --out" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under_a_file", "unwritable"])
def test_quickstart_out_that_cannot_be_created_is_a_usage_error_before_any_work(tmp_path, capsys, where):
    # it was a raw FileNotFoundError, exit code 1, after the whole run's training
    (tmp_path / "afile").write_text("x")
    if where == "unwritable":
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out, expected = locked / "q", f"cannot write in {locked}"
    else:
        out, expected = tmp_path / "afile" / "q", "exists and is not a directory"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["quickstart", "--tiny", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "torchrl-swm quickstart: error: --out" in err and expected in err


def test_output_and_dataset_paths_expand_a_tilde_as_the_video_writer_does(tmp_path, monkeypatch, capsys):
    # '--out=~/x' reaches the program unexpanded (the shell expands ~ only at a word's start): the dataset went
    # to ./~/x while imageio wrote the video under $HOME, after the whole run
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["collect", "CartPole-v1", "--episodes", "1", "--max-steps", "5", "--out=~/data",
                     "--no-progress"]) == 0
    assert (tmp_path / "data" / "dataset.json").exists() and not (tmp_path / "~").exists()
    assert cli.main(["info", "~/data"]) == 0
    assert cli.main(["eval", "CartPole-v1", "--episodes", "1", "--max-steps", "5", "--json=~/r.json",
                     "--no-progress"]) == 0
    assert (tmp_path / "r.json").exists()
    from torchrl_swm.quickstart import parse_args

    assert parse_args(["--out=~/q"]).out == str(tmp_path / "q")


def test_a_command_started_with_stdout_closed_does_its_work_and_exits_0(tmp_path):
    # a cron- or daemon-style launch (`>&-`): Python's sys.stdout is None; the command has nothing to print to
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchrl_swm.cli"]
    result_file = tmp_path / "result.json"
    out = subprocess.run([*command, "eval", "CartPole-v1", "--episodes", "2", "--json", str(result_file)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=240,
                         preexec_fn=lambda: os.close(1))
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and json.loads(result_file.read_text())["num_episodes"] == 2


def test_an_error_raised_by_the_policy_names_the_policy(tmp_path):
    (tmp_path / "numpy_policies.py").write_text(
        "import numpy as np\n"
        "def act(obs):  # a function of the observation array, not a TorchRL policy\n"
        "    return (np.asarray(obs, dtype=np.float32)[..., 2] > 0).astype(np.int64)\n"
    )
    out = run("eval", "CartPole-v1", "--episodes", 1, "--policy", "numpy_policies:act", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "; raised by the policy numpy_policies.act, called with the step's tensordict (a TorchRL policy reads " \
           "its observation keys and writes 'action') (run with --traceback for details)" in out.stderr


def test_collect_mode_reaches_the_dataset(tmp_path, capsys):
    # --mode wait is World.collect's reset_mode="wait" (recorded in the dataset); no --mode is "auto"
    from torchrl_swm import load_dataset

    for mode in ("wait", None):
        out = tmp_path / str(mode)
        argv = ["collect", "CartPole-v1", "--episodes", "3", "--num-envs", "2", "--max-steps", "10", "--out", str(out),
                "--no-progress", *(["--mode", mode] if mode else [])]
        assert cli.main(argv) == 0
        assert load_dataset(out).metadata["reset_mode"] == (mode or "auto")


def test_ctrl_c_during_eval_exits_130(tmp_path, monkeypatch, capsys):
    # README: an interrupt ends with 130 (128 + SIGINT), as a shell reports a Ctrl-C, not 1 (an error). A Ctrl-C
    # is a KeyboardInterrupt wherever the main thread is; here it comes from inside the policy
    (tmp_path / "ctrlc_eval_policy.py").write_text("def policy(td):\n    raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["eval", "CartPole-v1", "--episodes", "4", "--num-envs", "2", "--no-progress",
                     "--policy", "ctrlc_eval_policy:policy", "--json", str(tmp_path / "r.json")])
    assert code == 130 and capsys.readouterr().err == "interrupted\n"
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(not sys.platform.startswith(("linux", "darwin")), reason="needs a pseudo-terminal (pty)")
def test_progress_bar_goes_to_stderr_when_only_stderr_is_a_terminal(tmp_path):
    # `torchrl-swm eval ... > result.txt` in a terminal: the bar is drawn on stderr (README: "a progress bar on
    # stderr when it is a terminal"), whatever stdout is; stdout keeps the summary only
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchrl_swm.cli"]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with open(tmp_path / "result.txt", "w") as stdout:
        proc = subprocess.Popen([*command, "eval", "CartPole-v1", "--episodes", "2", "--num-envs", "2"], stdout=stdout,
                                stderr=slave, env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(slave)
    terminal = b""
    deadline = time.monotonic() + 240
    try:
        while select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:  # nothing by then: stop
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        assert proc.wait(timeout=240) == 0, terminal
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert b"evaluate:   0%" in terminal, terminal  # tqdm's bar (the summary says "World.evaluate: 2 episodes")
    result = (tmp_path / "result.txt").read_text()
    assert "2 episodes on 2 envs" in result and "evaluate:   0%" not in result and "%|" not in result


def test_collect_into_a_path_another_writer_holds_is_a_usage_error_before_any_env(tmp_path, capsys):
    import torch
    from tensordict import TensorDict

    from torchrl_swm.data import DatasetWriter

    writer = DatasetWriter(tmp_path / "d", capacity=20, commit_every=0)
    writer.add(TensorDict({"episode": torch.zeros(3, dtype=torch.int64), "x": torch.ones(3)}, [3]))
    code = cli.main(["collect", "no/such-env-v0", "--episodes", "2", "--out", str(tmp_path / "d"), "--overwrite"])
    assert code == 2 and f"is being written by another DatasetWriter (pid {os.getpid()}" in capsys.readouterr().err
    writer.close(complete=True)


def test_output_paths_that_would_fail_after_the_run_are_usage_errors_before_it(tmp_path, capsys, monkeypatch):
    # each of these passed the up-front check, then failed once the work was done (its results lost), or wrote
    # nothing (an empty --json) or into the current directory (an empty --out); review R4 B1, B2, B4
    import torchrl_swm.world as world_module

    monkeypatch.setattr(world_module.World, "__init__", lambda *a, **k: pytest.fail("an env was built"))
    monkeypatch.setattr("torchrl_swm.benchmarks.__main__.run_sections", lambda *a, **k: pytest.fail("it ran"))
    monkeypatch.chdir(tmp_path)

    def error(*argv):
        with pytest.raises(SystemExit) as info:  # argparse's own usage errors exit 2 themselves
            cli.main([str(a) for a in argv])
        return info.value.code, capsys.readouterr().err

    for argv, flag in ((["eval", "CartPole-v1", "--json", ""], "--json"), (["eval", "CartPole-v1", "--video", ""],
                       "--video"), (["collect", "CartPole-v1", "--episodes", 1, "--out", ""], "--out"),
                       (["eval", "CartPole-v1", "--dataset", ""], "--dataset"), (["info", ""], "path"),
                       (["bench", "--json", ""], "--json"), (["bench", "--plot", ""], "--plot")):
        code, err = error(*argv)
        assert code == 2 and f"argument {flag}: expected a path, got ''" in err, (argv, err)
    assert os.listdir(tmp_path) == []

    def usage(*argv):
        code = cli.main([str(a) for a in argv])
        return code, capsys.readouterr().err

    code, err = usage("eval", "CartPole-v1", "--json", "res/")
    assert code == 2 and "--json res/: ends with a path separator, expected a file path" in err
    code, err = usage("eval", "CartPole-v1", "--json", "same", "--video", "same")
    assert code == 2 and "--json same and --video same are the same path" in err
    code, err = usage("bench", "--json", "b.png", "--plot", "b.png")
    assert code == 2 and "--json b.png and --plot b.png are the same file" in err
    code, err = usage("bench", "--plot", "b.xyz")
    assert code == 2 and "--plot b.xyz: unknown image format 'xyz'; expected a file name ending in one of" in err
    (tmp_path / "d.png").mkdir()  # no extension is matplotlib's PNG: the file checked is the one it would write
    code, err = usage("bench", "--plot", "d")
    assert code == 2 and "--plot d.png: is a directory" in err
    assert sorted(os.listdir(tmp_path)) == ["d.png"]


def test_bench_plot_without_an_extension_writes_and_prints_the_png_it_checked(tmp_path, capsys):
    from torchrl_swm.benchmarks.__main__ import build_parser, check_args

    args = build_parser().parse_args(["--plot", str(tmp_path / "chart")])
    check_args(args)
    assert args.plot == str(tmp_path / "chart.png")


@pytest.mark.parametrize("value", ["null", '"x"', "3", "true"])
def test_env_kwargs_that_are_not_an_object_are_usage_errors(value, capsys):
    assert cli.main(["eval", "CartPole-v1", "--no-progress", "--env-kwargs", value]) == 2
    assert "--env-kwargs: expected a JSON object, got " in capsys.readouterr().err


def test_env_kwargs_naming_the_env_or_the_policy_are_usage_errors(capsys):
    for key in ("env", "env_fns", "policy", "id", "env_id"):  # id: gym.make's own, the one a user tries first
        assert cli.main(["eval", "CartPole-v1", "--no-progress", "--env-kwargs", json.dumps({key: 1})]) == 2
        assert f"--env-kwargs: {key} is not a gym.make keyword argument" in capsys.readouterr().err


def test_an_interrupt_while_the_commands_load_exits_130_without_a_traceback(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["eval", "CartPole-v1"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
