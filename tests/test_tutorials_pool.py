"""The pool tutorial runs as a script."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pool_masks_tutorial_runs():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tutorials", "pool_masks.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "rows that changed after resetting env 1: [1]" in out
    # the terminal observation is the one the episode ended on, and the reset one follows it (near upright)
    assert ("step 9: env 1 ended, the pole fell past 0.209 rad: terminal cart +0.12, angle -0.213 rad; "
            "next obs starts over at angle +0.002\n") in out
    # a step with "_step" masks envs 1 and 3: they report reward 0 and keep their observation
    assert "reward of frozen envs is 0: [1.0, 0.0, 1.0, 0.0]\n" in out
    assert "frozen envs keep their observation: True\n" in out
    # an info is reported (its info_mask) after a step, never at reset
    assert "reported at reset / after a step: False True\n" in out
    assert "no ghost steps): True" in out
