"""The pool tutorial runs as a script."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pool_masks_tutorial_runs():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", "pool_masks.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows that changed after resetting env 1: [1]" in proc.stdout
    assert "step 9: env 1 ended, the pole fell past 0.209 rad: terminal cart +0.12, angle -0.213 rad" in proc.stdout
    assert "no ghost steps): True" in proc.stdout
