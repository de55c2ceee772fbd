import os
import signal
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
# Spawned workers (collectors, the process backend) import tests/envs.py too.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

# One intra-op thread: CI has 2 cores, and tests run small ops where a thread pool
# only adds contention (several times slower on a loaded 2-core machine).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # spawned workers and subprocesses too

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# A run started in the background (`cmd &`, nohup) inherits an ignored SIGINT, and Python then installs no
# KeyboardInterrupt handler: the tests that send themselves a real Ctrl-C need Python's default one
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(autouse=True, scope="session")
def _sb3_log_dir(tmp_path_factory):
    # SB3's learn() makes a log folder (tempdir/SB3-<time>) per call unless SB3_LOGDIR names one:
    # keep them in pytest's tmp tree (subprocesses, e.g. the tutorials, inherit it) instead of /tmp
    os.environ.setdefault("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
    yield
