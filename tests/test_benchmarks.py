"""Smoke tests: the benchmark runs end to end with tiny sizes (no timing assertions)."""

import json
import math
import subprocess
import sys


def test_pool_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    proc = subprocess.run(
        [sys.executable, "-m", "torchrl_swm.benchmarks", "--sections", "cartpole,vector,fixed", "--quick",
         "--json", str(out), "--plot", str(plot)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| cartpole | 16 | plain loop" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    keys = {(r["section"], r["key"]) for r in rows}
    assert {("cartpole", "plain"), ("cartpole", "pool_step"), ("cartpole", "pool_rollout"), ("cartpole", "pool_collector"),
            ("vector", "raw"), ("vector", "pool"), ("fixed", "pool_k0"), ("fixed", "floor")} <= keys
    assert all(r["rate"] > 0 and not math.isnan(r["rate"]) for r in rows if r["key"] != "gym_async")
    assert plot.stat().st_size > 1000
