"""Smoke test of the world-model benchmark section (tiny sizes; no timing assertions)."""

import pytest
import torch

from torchrl_swm.benchmarks.world_model import _make_env, _Raw, _StepLoop, make_ref_model, run


def test_world_model_benchmark_runs_and_fills_ratios():
    rows = run(bs=(2,), seconds=0.02)
    keys = [row.key for row in rows]
    assert keys == [
        "raw",
        "raw+reset",
        "env/step",
        "env/rollout",
        "env/rollout-out",
        "env/transformed",
        "torchrl/model_based",
        "env/step-no-dones",
        "env/reset",
    ]
    by_key = {row.key: row for row in rows}
    assert by_key["raw"].ratio == 1.0
    for row in rows:
        assert row.n == 2 and row.rate > 0 and row.us_per_call > 0 and row.section == "world_model"
        if row.key != "env/reset":
            assert row.ratio is not None and "added_us" in row.extra
    assert "fraction_of_step" in by_key["env/reset"].extra


class _CountingDones(torch.nn.Module):
    """The reference model, counting the episode ends (done logits > 0) it computes."""

    def __init__(self, model):
        super().__init__()
        self.model, self.dones = model, 0

    def forward(self, latent, action):
        out = self.model(latent, action)
        self.dones += int((out[2] > 0).sum())
        return out


@pytest.mark.parametrize("b", [1, 8])
def test_the_raw_reference_with_resets_ends_episodes_exactly_as_the_env_rows_do(b):
    # "raw+reset" is the least work any env around the model must do: the same starts and actions as the
    # env rows, so the same episode ends (not, say, four times as many at B=1 from another start latent)
    model, cpu = make_ref_model(0, "cpu"), torch.device("cpu")
    raw, env = _CountingDones(model), _CountingDones(model)
    _Raw(raw, b, cpu, True).run(600)
    _StepLoop(_make_env(env, b, cpu), b, cpu).run(600)
    assert raw.dones == env.dones > 0


def test_the_export_floor_env_draws_start_latents_for_the_reset_rows_only():
    from torchrl_swm.benchmarks.export import LAT, MLPWorldModelEnv

    env = MLPWorldModelEnv(batch_size=4, seed=3)
    td = env.reset()
    before = td["observation"].clone()
    gen = torch.Generator().manual_seed(3)
    torch.randn(4, LAT, generator=gen)  # the full reset's draw
    td["_reset"] = torch.tensor([[False], [True], [False], [False]])
    after = env.reset(td)["observation"]
    assert torch.equal(after[[0, 2, 3]], before[[0, 2, 3]])
    assert torch.equal(after[1], torch.tanh(torch.randn(1, LAT, generator=gen))[0] * 0.1)


def test_every_world_model_row_is_credited_with_the_model_calls_it_makes():
    """A row credits ``steps_per_unit`` batched steps per unit: each must be one batched model call (a
    rollout credited with 100 steps that ran 25 would read 4x too fast)."""
    from torchrl_swm.benchmarks.world_model import world_model_subjects

    model, b = make_ref_model(0), 3
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    subjects = world_model_subjects(model, b, "cpu")
    assert [key for key, *_ in subjects][-1] == "env/reset"
    for key, _, make, steps_per_unit in subjects[:-1]:  # env/reset's unit is one masked reset, not a step
        subject = make()
        subject.run(1)  # warm-up
        calls.clear()
        subject.run(3)
        subject.close()
        assert calls == [b] * (3 * steps_per_unit), (key, len(calls), steps_per_unit)


def test_world_model_row_ratios_added_us_and_reset_fraction_against_the_raw_reference(monkeypatch):
    """Each row's ratio is its rate over the raw forward's and ``added_us`` its µs over the raw's; env/reset
    (unit: one masked reset, not a step) has neither, and its ``fraction_of_step`` is its µs over env/step's.
    measure_together() is faked with distinct figures per row: no model runs."""
    from torchrl_swm.benchmarks import world_model

    us = {"raw": 10.0, "raw+reset": 12.0, "env/step": 20.0, "env/rollout": 16.0, "env/rollout-out": 15.0,
          "env/transformed": 25.0, "torchrl/model_based": 30.0, "env/step-no-dones": 18.0, "env/reset": 4.0}
    b = 4
    subjects = world_model.world_model_subjects(None, b, torch.device("cpu"))
    assert [key for key, *_ in subjects] == list(us)
    figures = {key: {"rate": b / u * 1e6, "spread": 0.0, "us_per_call": u, "setup_s": 0.0} for key, u in us.items()}

    def together(makers, **kw):  # every row timed in one interleaved call (drift shifts them alike)
        assert list(makers) == list(us)
        return {key: figures[key] for key in makers}

    monkeypatch.setattr(world_model, "measure_together", together)
    rows = {r.key: r for r in world_model._rows_for(None, b, 0.0, torch.device("cpu"))}
    raw = rows["raw"]
    assert raw.ratio == 1.0 and raw.extra["added_us"] == 0.0
    for key, r in rows.items():
        if key == "env/reset":
            continue
        assert r.ratio == r.rate / raw.rate, key
        assert r.extra["added_us"] == pytest.approx(us[key] - us["raw"]), key
    assert rows["env/step"].ratio == pytest.approx(0.5) and rows["env/step"].extra["added_us"] == pytest.approx(10.0)
    reset = rows["env/reset"]
    assert reset.ratio is None and "added_us" not in reset.extra
    assert reset.extra["fraction_of_step"] == pytest.approx(4.0 / 20.0)
    assert reset.extra["in_loop_fraction"] == pytest.approx((20.0 - 18.0) / 18.0)


@pytest.mark.parametrize("b", [1, 2, 8, 40])
def test_the_reset_row_restarts_its_share_of_rows_and_at_least_one_at_every_batch_size(b):
    # env/reset times masked resets: every call must restart _reset_rows(b) rows (~3 %, at least one), or at
    # small B it times a done count and nothing else
    from torchrl_swm.benchmarks.world_model import _reset_rows, world_model_subjects

    k = _reset_rows(b)
    assert k >= 1 and k == max(1, round(0.03 * b))
    make = {key: make for key, _, make, _ in world_model_subjects(make_ref_model(0), b, "cpu")}["env/reset"]
    subject = make()
    env, restarted = subject.env, []
    original = env._reset_rows_into

    def counting(root, rows, n_rows, *args, **kwargs):
        restarted.append((int(rows.count_nonzero()), n_rows))
        return original(root, rows, n_rows, *args, **kwargs)

    env._reset_rows_into = counting
    subject.run(20)
    subject.close()
    assert restarted == [(k, k)] * 20, restarted


@pytest.mark.parametrize("b", [3, 8])
def test_the_raw_reference_with_resets_restarts_done_rows_from_the_start_latent(b):
    # raw+reset: after each step, the rows whose done logit is positive hold the start latent and the
    # others the model's next latent (hand computation over the same start and actions, step by step)
    from torchrl_swm.benchmarks.world_model import _start_latent

    model, cpu = make_ref_model(0, "cpu"), torch.device("cpu")
    raw = _Raw(model, b, cpu, True)
    z0 = _start_latent()
    z, partial = z0.expand(b, -1).clone(), 0
    with torch.no_grad():
        for i in range(1, 300):
            raw.run(1)
            z, _, d = model(z, raw.acts[i % len(raw.acts)])
            done = d > 0
            partial += bool(done.any()) and not bool(done.all())
            z = torch.where(done, z0, z)
            assert torch.equal(raw.z, z), i
    assert partial > 0  # steps where some rows, not all, ended: the masked reset was exercised


def test_the_reference_model_ends_2_to_4_percent_of_random_action_steps_from_the_start_latent():
    # the done head's calibration (make_ref_model's docstring): ~2-4 % of steps end an episode when the
    # benchmark's raw+reset loop runs from the start latent with random actions (seed 0: the benchmark's
    # model; seed 1: another draw)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for seed in (0, 1):
            counting = _CountingDones(make_ref_model(seed))
            _Raw(counting, 256, torch.device("cpu"), True).run(100)
            rate = counting.dones / (256 * 100)
            assert 0.02 <= rate <= 0.04, (seed, rate)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("key", ["env/step", "env/rollout", "env/rollout-out", "env/transformed",
                                 "torchrl/model_based"])
def test_every_env_row_ends_episodes_as_often_as_the_raw_reference_with_resets(key):
    """The episodes an env row actually ends (its ``("next", "done")`` flags, not the done logits its model
    computes) come at the raw reference's rate: a row whose env ended fewer episodes would do fewer resets
    than ``raw+reset`` and read faster for it. Counted over 600 batched steps of 8 rows."""
    from torchrl_swm.benchmarks.world_model import _Rollout, world_model_subjects

    model, cpu, b, steps = make_ref_model(0, "cpu"), torch.device("cpu"), 8, 600
    raw = _CountingDones(model)
    _Raw(raw, b, cpu, True).run(steps)  # raw+reset restarts exactly the rows whose logit is positive
    raw_rate = raw.dones / (b * steps)
    assert raw_rate > 0.01

    subject = {k: make for k, _, make, _ in world_model_subjects(model, b, cpu)}[key]()
    env, ends = subject.env, []
    if isinstance(subject, _Rollout):
        rollout = env.rollout

        def counting_rollout(*args, **kwargs):
            out = rollout(*args, **kwargs)
            ends.append(int(out["next", "done"].sum()))
            return out

        env.rollout = counting_rollout
        subject.run(steps // 100)
    else:
        step_and_maybe_reset = env.step_and_maybe_reset

        def counting_step(td, *args, **kwargs):
            out, root = step_and_maybe_reset(td, *args, **kwargs)
            ends.append(int(out["next", "done"].sum()))
            return out, root

        env.step_and_maybe_reset = counting_step
        subject.run(steps)
    subject.close()
    assert len(ends) == (steps // 100 if isinstance(subject, _Rollout) else steps)
    rate = sum(ends) / (b * steps)
    assert 0.75 * raw_rate <= rate <= 1.25 * raw_rate, (key, rate, raw_rate)


@pytest.mark.parametrize("key, reuses", [("env/rollout", False), ("env/rollout-out", True)])
def test_only_the_rollout_out_row_hands_rollout_the_previous_rollouts_buffer(key, reuses):
    """``env/rollout`` allocates a fresh output every rollout (``out=None``), as a plain ``rollout()`` does;
    only ``env/rollout-out`` passes the previous rollout's result back as ``out=`` (a plain row that reused
    the buffer would skip the page faults its label says it pays)."""
    from torchrl_swm.benchmarks.world_model import world_model_subjects

    b = 2
    subject = {k: make for k, _, make, _ in world_model_subjects(make_ref_model(0), b, torch.device("cpu"))}[key]()
    env, outs, results = subject.env, [], []
    rollout = env.rollout

    def recording_rollout(*args, out=None, **kwargs):
        outs.append(out)
        result = rollout(*args, out=out, **kwargs)
        results.append(result)
        return result

    env.rollout = recording_rollout
    subject.run(3)
    subject.close()
    assert outs[0] is None
    if reuses:
        assert outs[1] is results[0] and outs[2] is results[1]
    else:
        assert outs == [None, None, None]
        assert results[0]["next", "observation"].data_ptr() != results[1]["next", "observation"].data_ptr()


def test_the_export_floor_envs_masked_reset_leaves_the_terminal_observations_it_returned_untouched():
    """``MLPWorldModelEnv``'s masked reset writes the reset rows' start latents into a new tensor: the
    ``("next", "observation")`` a step returned (an ended row's terminal observation) keeps its values after
    the reset that follows, as TorchRL's ``step_and_maybe_reset`` needs (the floor row must do that copy)."""
    from torchrl_swm.benchmarks.export import ACT, MLPWorldModelEnv

    env = MLPWorldModelEnv(batch_size=4, seed=3)
    td = env.reset()
    td["action"] = torch.rand(4, ACT, generator=torch.Generator().manual_seed(0)) * 2 - 1
    stepped = env.step(td)
    terminal = stepped["next", "observation"]
    kept = terminal.clone()
    root = stepped["next"].exclude("reward")  # what step_and_maybe_reset hands maybe_reset
    root["_reset"] = torch.tensor([[True], [False], [True], [False]])
    reset = env.reset(root)
    assert torch.equal(terminal, kept)
    assert not torch.equal(reset["observation"][0], kept[0]) and torch.equal(reset["observation"][1], kept[1])
