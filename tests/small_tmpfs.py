"""Run a script with a small tmpfs of its own mounted somewhere (a private mount namespace): disk-full tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def run_with_a_tmpfs_at(mount_point, size: str, script_text: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``script_text`` in a private mount namespace where ``mount_point`` is a tmpfs of ``size`` (skips without
    ``unshare -m`` and mount rights); the completed process."""
    if shutil.which("unshare") is None or subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True
    ).returncode != 0:
        pytest.skip("needs unshare -m and mount (root) to give the test a small tmpfs of its own")
    os.makedirs(mount_point, exist_ok=True)
    script = tmp_path / "script.py"
    script.write_text(script_text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        ["unshare", "-m", "sh", "-c",
         f"mount -t tmpfs -o size={size} tmpfs {mount_point} && exec {sys.executable} {script}"],
        capture_output=True, text=True, timeout=300, env=env,
    )
