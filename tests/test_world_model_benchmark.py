"""Smoke test of the world-model benchmark section (tiny sizes; no timing assertions)."""

from torchrl_swm.benchmarks.world_model import run


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
