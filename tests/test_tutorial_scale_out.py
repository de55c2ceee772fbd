"""The scale-out tutorial runs unchanged with each collector (tiny sizes)."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

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
    # 8 envs x 64 steps per batch: episodes end in every batch, and a CartPole episode lasts 8 to 500 steps
    import re

    lengths = [float(m) for m in re.findall(r"mean length of the episodes that ended +([\d.]+)", proc.stdout)]
    assert len(lengths) == 2 and all(8 <= n <= 64 * 2 for n in lengths), proc.stdout
    # the same 8 envs (2 workers x 4) for every collector: one pool of 8, or one pool of 4 per worker
    layout = "(8, 64)" if collector == "single" else "(2, 4, 64)"
    assert proc.stdout.count(f"| batch {layout} |") == 2, proc.stdout


def _load_scale_out():
    """The tutorial as a module: it parses its flags and runs only in main()."""
    spec = importlib.util.spec_from_file_location("scale_out", os.path.join(ROOT, "tutorials", "scale_out.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flags, message", [
    (["--total-frames", "1000", "--frames-per-batch", "2048"],
     "--total-frames (1000) must be a multiple of --frames-per-batch (2048), at least one batch"),
    (["--total-frames", "3000", "--frames-per-batch", "2048"],
     "--total-frames (3000) must be a multiple of --frames-per-batch (2048)"),
    (["--frames-per-batch", "0"], "--frames-per-batch must be positive, got 0"),
    (["--total-frames", "-5"], "--total-frames must be positive, got -5"),
    (["--envs-per-worker", "0"], "--envs-per-worker must be positive, got 0"),
    (["--workers", "0"], "--workers must be positive, got 0"),
])
def test_scale_out_refuses_sizes_it_cannot_run(monkeypatch, capsys, flags, message):
    """Fewer total frames than a batch divided by a zero collection time; 3000 of 2048 trained on 2048 silently."""
    tutorial = _load_scale_out()
    monkeypatch.setattr(sys, "argv", ["scale_out.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        tutorial.main()
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_scale_out_counts_episode_lengths_across_batches():
    ended_lengths = _load_scale_out().ended_lengths
    running = torch.zeros(2, dtype=torch.long)
    # env 0 ends after 2 steps, then after 3 more; env 1 runs through the batch
    done = torch.tensor([[False, True, False, False, True], [False, False, False, False, False]])
    assert ended_lengths(done, running) == [2, 3] and running.tolist() == [0, 5]
    # the next batch: env 1's episode started in the previous one (5 + 2 steps), env 0 starts afresh
    done = torch.tensor([[False, False, False], [False, True, False]])
    assert ended_lengths(done, running) == [7] and running.tolist() == [3, 1]


def test_scale_out_workers_seed_their_pools_2_to_the_32_apart():
    # a pool seeded s plays its episodes from the seeds s, s+1, ...: workers seeded close together would replay
    # each other's episodes
    tutorial = _load_scale_out()
    tutorial.args = tutorial.parser.parse_args(["--envs-per-worker", "3", "--seed", "5"])
    for w, make in enumerate(tutorial.pool_factories(2)):
        pool = make()
        try:
            seeds = pool.reset()["episode_seed"].reshape(-1).tolist()
        finally:
            pool.close()
        assert seeds == [5 + w * 2**32 + i for i in range(3)], (w, seeds)
