"""The scale-out tutorial runs unchanged with each collector (tiny sizes)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("collector", ["single", "multisync", "ray"])
def test_scale_out_tutorial(collector):
    if collector == "ray":
        pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchrl-swm[ray]'")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tutorials", "scale_out.py"), "--collector", collector,
         "--workers", "2", "--envs-per-worker", "4", "--frames-per-batch", "512", "--total-frames", "1024"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{collector}: 1024 frames" in proc.stdout
