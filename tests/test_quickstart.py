"""The quickstart (python -m torchrl_swm.quickstart) runs end to end with tiny sizes.

The numbers of a tiny run mean nothing: these tests check that every stage runs and reports,
not that the planner beats random (the real run prints that).
"""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from torchrl_swm import quickstart
from torchrl_swm.quickstart import QuickstartConfig, _earlier_outputs, parse_args, run, standard_error
from torchrl_swm.world import SEED_LIMIT

ROOT = Path(__file__).resolve().parents[1]
HAS_PLOT = importlib.util.find_spec("matplotlib") is not None
HAS_VIDEO = all(importlib.util.find_spec(m) is not None for m in ("imageio", "imageio_ffmpeg"))
STAT_KEYS = {"episodes", "success_rate", "success_ci", "mean_return", "std_return", "mean_length",
             "steps_to_success", "returns", "wall_time"}


def test_quickstart_command_tiny(tmp_path):
    out = tmp_path / "qs"
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "torchrl_swm.quickstart", "--tiny", "--out", str(out), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    stdout = proc.stdout
    for k in range(1, 8):
        assert f"=== [{k}/7]" in stdout, f"stage {k} header missing:\n{stdout}"
    # the held-out error table, the evaluation table, the export loop, the output paths
    assert "held-out prediction error" in stdout and "(no change)" in stdout and "done accuracy" in stdout
    assert "success (95% CI)" in stdout
    rows = ("random        real", "MPPI planner  real", "random        imagined", "MPPI planner  imagined")
    for row in rows:
        assert row in stdout, f"table row {row!r} missing:\n{stdout}"
    assert [stdout.index(row) for row in rows] == sorted(stdout.index(row) for row in rows), stdout  # README's order
    assert "check_env_specs: passed" in stdout
    assert "single_observation_space Box(" in stdout and "envs.step(numpy actions)" in stdout
    assert f"results  {out / 'results.json'}" in stdout
    results = json.loads((out / "results.json").read_text())
    assert results["eval"]["real"]["planner"]["episodes"] == QuickstartConfig.tiny().eval_episodes
    assert (out / "world_model.pt").exists()
    assert (out / "data" / "train" / "dataset.json").exists()
    assert (out / "data" / "heldout" / "dataset.json").exists()
    if HAS_PLOT:
        assert f"plot     {out / 'quickstart.png'}" in stdout
        assert (out / "quickstart.png").stat().st_size > 0
    if HAS_VIDEO:
        assert f"video    {out / 'video' / 'grid.mp4'}" in stdout
        assert (out / "video" / "grid.mp4").stat().st_size > 0


def test_run_returns_key_figures(tmp_path):
    # an earlier run into the same folder wrote a plot and a video; this one writes neither: they would describe
    # the earlier results, so they go
    (tmp_path / "video").mkdir()
    earlier = {"plot": tmp_path / "quickstart.png", "video": tmp_path / "video" / "grid.mp4"}
    for path in earlier.values():
        path.write_bytes(b"earlier run")
    (tmp_path / "results.json").write_text(json.dumps({"files": {k: str(v) for k, v in earlier.items()}}))
    cfg = QuickstartConfig.tiny(out=str(tmp_path), video=False, plot=False, progress=False, planner="cem")
    figures = run(cfg)
    assert not earlier["plot"].exists() and not earlier["video"].exists()
    # what this run writes stays, and so does everything in a folder no quickstart wrote results into
    for path in earlier.values():
        path.write_bytes(b"this run")
    assert _earlier_outputs(tmp_path, {"plot": str(earlier["plot"]), "video": None}) == [earlier["video"]]
    other = tmp_path / "other"
    (other / "video").mkdir(parents=True)
    (other / "quickstart.png").write_bytes(b"a user's")
    (other / "video" / "grid.mp4").write_bytes(b"a user's")
    assert _earlier_outputs(other, {"plot": None, "video": None}) == []
    model = figures["model"]
    for key in ("next_obs_mse", "multi_step_mse", "reward_mse"):
        assert model[key] >= 0 and model[f"{key}_baseline"] >= 0
    assert 0 <= model["done_accuracy"] <= 1 and 0 <= model["done_accuracy_baseline"] <= 1
    assert 0 <= model["terminations_caught"] <= model["terminations"]
    curve = figures["curve"]
    assert len(curve["train"]) == cfg.train_steps and curve["heldout_step"][-1] == cfg.train_steps - 1
    for env_name in ("real", "imagined"):
        for policy in ("random", "planner"):
            stats = figures["eval"][env_name][policy]
            assert set(stats) == STAT_KEYS
            assert stats["episodes"] == cfg.eval_episodes and len(stats["returns"]) == cfg.eval_episodes
            assert 0 <= stats["success_rate"] <= 1
            n = len(stats["returns"])  # the plot's error bar: the standard error, with the sample std
            assert standard_error(stats) == pytest.approx(np.std(stats["returns"], ddof=1) / np.sqrt(n))
    assert figures["export"]["num_envs"] == cfg.export_envs and figures["export"]["steps"] == cfg.export_steps
    assert figures["files"]["plot"] is None and figures["files"]["video"] is None
    assert Path(figures["files"]["results"]).exists()
    assert set(figures["timings"]) == {"collect", "train", "wrap", "planner", "evaluate", "export", "outputs"}


def test_a_model_that_predicts_no_change_scores_exactly_the_baselines():
    # the held-out table's baselines: "no change" after 1 step and after the whole sequence (from its first
    # observation), the mean reward, "never done"; a DynamicsModel with zero output layers predicts exactly those
    model = quickstart.DynamicsModel(obs_dim=6, action_dim=2, hidden=8)
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    g = torch.Generator().manual_seed(0)
    seqs = TensorDict({"observation": torch.randn(5, 4, 6, generator=g), "action": torch.rand(5, 4, 2, generator=g),
                       "next": {"observation": torch.randn(5, 4, 6, generator=g)}}, batch_size=[5, 4])
    terminated = torch.zeros(20, 1, dtype=torch.bool)
    terminated[[3, 11, 17]] = True
    data = TensorDict({"observation": torch.randn(20, 6, generator=g), "action": torch.rand(20, 2, generator=g),
                       "next": {"observation": torch.randn(20, 6, generator=g),
                                "reward": torch.randn(20, 1, generator=g), "terminated": terminated}},
                      batch_size=[20])
    m = quickstart.heldout_metrics(model, seqs, data)
    one_step = (data["observation"] - data["next", "observation"]).pow(2).mean().item()
    whole_sequence = (seqs["observation"][:, 0] - seqs["next", "observation"][:, -1]).pow(2).mean().item()
    assert m["next_obs_mse"] == pytest.approx(one_step) and m["next_obs_mse_baseline"] == pytest.approx(one_step)
    assert m["multi_step"] == 4
    assert m["multi_step_mse"] == pytest.approx(whole_sequence)
    assert m["multi_step_mse_baseline"] == pytest.approx(whole_sequence)
    assert m["reward_mse"] == pytest.approx(m["reward_mse_baseline"])
    assert m["done_accuracy"] == pytest.approx(17 / 20) and m["done_accuracy_baseline"] == pytest.approx(17 / 20)
    assert (m["terminations"], m["terminations_caught"], m["false_terminations"]) == (3, 0, 0)


def test_model_table_says_how_many_times_lower_the_models_error_is(capsys):
    quickstart.print_model_table({
        "transitions": 100, "next_obs_mse": 1e-4, "next_obs_mse_baseline": 2e-2, "multi_step": 8,
        "multi_step_mse": 0.5, "multi_step_mse_baseline": 1.0, "reward_mse": 0.3, "reward_mse_baseline": 0.3,
        "done_accuracy": 0.99, "done_accuracy_baseline": 0.97, "terminations": 3, "terminations_caught": 2,
        "false_terminations": 1,
    })
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("  next-observation MSE, 1 step") and lines[2].endswith("(no change)     200x lower")
    assert lines[3].startswith("  next-observation MSE, 8 steps") and lines[3].endswith("(no change)     2.0x lower")
    assert lines[4].startswith("  reward MSE") and lines[4].rstrip().endswith("(mean reward)")  # no better: nothing
    assert "99.00%" in lines[5] and "97.00%" in lines[5] and "terminations caught 2/3, false alarms 1" in lines[5]


def test_imagined_success_is_a_predicted_termination_not_a_time_out():
    td = TensorDict({"next": {"terminated": torch.tensor([[True], [False], [False]]),
                              "truncated": torch.tensor([[False], [True], [False]]),
                              "done": torch.tensor([[True], [True], [False]])}}, batch_size=[3])
    assert quickstart.imagined_success(td).tolist() == [True, False, False]


def test_random_and_the_planner_play_the_same_real_episodes():
    # evaluate_real runs the random policy on the episodes seeded seed, seed + 1, ...: the policy it compares
    # to plays those same episodes
    seen = []

    def still(td):
        seen.append(td["episode_seed"].reshape(-1).tolist())
        return td.set("action", torch.zeros(td.shape[0], 2))

    cfg = QuickstartConfig.tiny(env_id="torchrl_swm/PointMaze-Open-v0", eval_episodes=4, progress=False)
    results = quickstart.evaluate_real(cfg, still, seed=7)
    assert seen[0] == [7, 8, 9, 10]
    assert results["random"]["episodes"] == results["planner"]["episodes"] == 4


def test_parse_args():
    cfg = parse_args(["--tiny", "--train-steps", "7", "--no-video", "--out", "x", "--seed", "3"])
    assert cfg.smoke and cfg.train_steps == 7 and cfg.num_envs == QuickstartConfig.tiny().num_envs
    assert cfg.video is False and cfg.plot is True and cfg.out == "x" and cfg.seed == 3
    default = parse_args([])
    assert default.progress == sys.stderr.isatty()  # bars on a terminal only, unless asked
    assert dataclasses.replace(default, progress=True) == QuickstartConfig() and default.smoke is False
    assert parse_args(["--progress"]).progress is True and parse_args(["--no-progress"]).progress is False
    with pytest.raises(SystemExit):
        parse_args(["--planner", "nope"])


# the run's World seeds: seed (training set), seed + 1_000_000 (held-out set), seed + 2_000_000 (evaluation)
LAST_SEED = SEED_LIMIT - 2_000_000 - 1


@pytest.mark.parametrize("overrides, error, message", [
    ({"top_k": 32}, ValueError, (r"^top_k: expected an int <= candidates \(16\), the candidates the planner keeps "
                                 r"its best of, got 32$")),
    ({"planner": "MPPI"}, ValueError, r"^planner: expected one of \['mppi', 'cem'\], got 'MPPI'$"),
    ({"env_id": "CartPole-v1"}, ValueError, (r"^env_id: expected one of \[.*'torchrl_swm/PointMaze-Open-v0'.*\], "
                                             r"got 'CartPole-v1'$")),
    ({"seed": LAST_SEED + 1}, ValueError, (rf"^seed: expected an int in \[0, 2\*\*62 - 2000000\) \(the run's "
                                           rf"evaluation uses the seeds from seed \+ 2000000\), got {LAST_SEED + 1}$")),
    ({"seed": -1}, ValueError, r"^seed: expected an int in \[0, 2\*\*62 - 2000000\) .*got -1$"),
    ({"seed": 1.5}, TypeError, r"^seed: expected an int, got float 1.5$"),
    ({"num_envs": 0}, ValueError, r"^num_envs: expected an int >= 1, got 0$"),
    ({"export_envs": 0}, ValueError, r"^export_envs: expected an int >= 1, got 0$"),
    ({"eval_episodes": 2.5}, TypeError, r"^eval_episodes: expected an int, got float 2.5$"),
    ({"threads": -1}, ValueError, r"^threads: expected 0 \(torch's default\) or an int >= 1, got -1$"),
    ({"stickiness": 1.5}, ValueError, r"^stickiness: expected a probability in \[0, 1\], got 1.5$"),
    ({"lr": 0.0}, ValueError, r"^lr: expected a finite number > 0, got 0.0$"),
    ({"video": "no"}, TypeError, r"^video: expected True or False, got str 'no'$"),
])
def test_run_checks_its_config_before_any_work(tmp_path, monkeypatch, overrides, error, message):
    # run() from Python checked only env_id: top_k > candidates failed in TorchRL's planner ("selected index k out
    # of range") after the collection and the training, planner="MPPI" at stage 4, a seed near 2**62 after the
    # training set's collection; the CLI checked some of these up front, with checks of its own
    monkeypatch.setattr(quickstart, "_run", lambda cfg: pytest.fail("the run started"))
    out = tmp_path / "qs"
    with pytest.raises(error, match=message):
        run(QuickstartConfig.tiny(out=str(out), **overrides))
    assert not out.exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"^out .*afile: exists and is not a directory"):
        run(QuickstartConfig.tiny(out=str(tmp_path / "afile")))


@pytest.mark.parametrize("env_id, limit", [
    ("torchrl_swm/PointMaze-Open-v0", 60), ("torchrl_swm/PointMaze-v0", 100), ("torchrl_swm/PointMaze-Medium-v0", 150),
])
def test_run_refuses_a_seq_len_longer_than_the_envs_episodes_before_any_work(tmp_path, monkeypatch, env_id, limit):
    # J4 finding 1: seq_len=61 on PointMaze-Open (60-step episodes) passed the check, collected both datasets, then
    # failed in TorchRL's SliceSampler: "Did not find a single trajectory with sufficient length" (no seq_len named)
    monkeypatch.setattr(quickstart, "_run", lambda cfg: pytest.fail("the run started"))
    out = tmp_path / "qs"
    with pytest.raises(ValueError, match=(rf"^seq_len: expected an int <= {limit}, the most steps an episode of "
                                          rf"{env_id} has \(its max_episode_steps\): every sequence is seq_len steps "
                                          rf"of one episode, got {limit + 1}$")):
        run(QuickstartConfig.tiny(out=str(out), env_id=env_id, seq_len=limit + 1))
    assert not out.exists()
    quickstart._check_config(QuickstartConfig.tiny(out=str(out), env_id=env_id, seq_len=limit))  # the limit: fine


def test_cli_seed_past_the_runs_last_seed_is_a_usage_error_before_any_work(monkeypatch, capsys):
    # --seed checked only >= 0: 2**62 - 1 collected the training set, then failed with a traceback naming
    # seed + 1_000_000
    monkeypatch.setattr(quickstart, "run", lambda cfg: pytest.fail("the run started"))
    assert parse_args(["--tiny", "--seed", str(LAST_SEED)]).seed == LAST_SEED
    for seed in (LAST_SEED + 1, SEED_LIMIT - 1, 2**64):
        with pytest.raises(SystemExit) as info:
            quickstart.main(["--tiny", "--seed", str(seed)])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"error: --seed: expected an int in [0, 2**62 - 2000000) (the run's evaluation uses the seeds from " \
               f"seed + 2000000), got {seed}" in err


def test_cli_errors_are_runs_with_the_flags_for_the_fields(capsys):
    # one check for both (they had checks of their own): the CLI's message is run()'s, naming flags
    for argv, fields, cli, python in (
        (["--top-k", "32", "--candidates", "16"], {"top_k": 32, "candidates": 16},
         "--top-k: expected an int <= --candidates (16), the candidates the planner keeps its best of, got 32",
         "top_k: expected an int <= candidates (16), the candidates the planner keeps its best of, got 32"),
        (["--num-envs", "0"], {"num_envs": 0}, "--num-envs: expected an int >= 1, got 0",
         "num_envs: expected an int >= 1, got 0"),
        (["--threads", "-1"], {"threads": -1}, "--threads: expected 0 (torch's default) or an int >= 1, got -1",
         "threads: expected 0 (torch's default) or an int >= 1, got -1"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--tiny", *argv])
        assert f"error: {cli}\n" in capsys.readouterr().err
        with pytest.raises(ValueError) as from_python:
            quickstart._check_config(QuickstartConfig.tiny(**fields))
        assert str(from_python.value) == python


def test_the_boundary_values_of_the_config_are_accepted():
    # top_k == candidates keeps every candidate; threads 0 is torch's default; stickiness 0 is i.i.d. actions
    for fields in ({"top_k": 16, "candidates": 16}, {"threads": 0}, {"stickiness": 0.0}, {"stickiness": 1.0}):
        quickstart._check_config(QuickstartConfig.tiny(**fields))
    parsed = parse_args(["--tiny", "--top-k", "16", "--candidates", "16", "--threads", "0"])
    assert (parsed.top_k, parsed.candidates, parsed.threads) == (16, 16, 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.one_of(st.integers(-2**65, 2**65), st.integers(LAST_SEED - 3, LAST_SEED + 3)))
def test_property_run_and_cli_accept_the_same_seeds(seed):
    # the seed of each of the run's World calls (seed, seed + 1_000_000, seed + 2_000_000) is below World's 2**62
    expected = 0 <= seed <= LAST_SEED
    try:
        quickstart._check_config(QuickstartConfig.tiny(seed=seed))
        accepted = True
    except ValueError:
        accepted = False
    try:
        parse_args(["--tiny", "--seed", str(seed)])
        parsed = True
    except SystemExit:
        parsed = False
    assert accepted == parsed == expected


def test_model_table_claims_no_gain_below_a_tenth(capsys):
    quickstart.print_model_table({
        "transitions": 10, "next_obs_mse": 0.3, "next_obs_mse_baseline": 0.31, "multi_step": 2,
        "multi_step_mse": 0.3, "multi_step_mse_baseline": 0.34, "reward_mse": 0.3, "reward_mse_baseline": 0.3,
        "done_accuracy": 0.9, "done_accuracy_baseline": 0.9, "terminations": 0, "terminations_caught": 0,
        "false_terminations": 0,
    })
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].rstrip().endswith("(no change)")  # 1.03x: no "1.0x lower"
    assert lines[3].rstrip().endswith("(no change)     1.1x lower")  # 1.13x


def test_the_sticky_data_policy_draws_afresh_at_every_episode_start():
    # an action kept across an episode boundary would make an episode depend on the one its env ran before
    from torchrl.data import Bounded

    torch.manual_seed(0)
    policy = quickstart.StickyRandomPolicy(Bounded(-1.0, 1.0, shape=(3, 2)), stickiness=1.0)  # always keep
    first = policy(TensorDict({"is_init": torch.ones(3, 1, dtype=torch.bool)}, [3]))["action"].clone()
    second = policy(TensorDict({"is_init": torch.tensor([[True], [False], [False]])}, [3]))["action"]
    assert torch.equal(second[1:], first[1:])  # mid-episode rows keep their action
    assert (second[0] != first[0]).all()  # the row starting an episode draws a new one
