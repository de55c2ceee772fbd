"""Videos follow the World's masks: one file per episode, L + 1 frames, no frames from frozen envs."""

import builtins
import functools
import glob
import re

import numpy as np
import pytest
import torch
from envs import CountingEnv, counting

pytest.importorskip("imageio")
pytest.importorskip("imageio_ffmpeg")

from torchrl_swm import EnvPool, World  # noqa: E402
from torchrl_swm.video import VideoRecorder, count_frames  # noqa: E402

torch.set_num_threads(1)


def pixel_pool(lengths):
    return EnvPool(
        [functools.partial(counting, length=n, render_mode="rgb_array") for n in lengths], seed=0, pixels=True
    )


def ones(n):
    return lambda td: td.set("action", torch.ones(n, dtype=torch.int64))


def ctrl_c_at_call(k, policy):
    """``policy``, with a Ctrl-C pressed at its ``k``-th call."""
    calls = []

    def interrupted(td):
        calls.append(1)
        if len(calls) == k:
            raise KeyboardInterrupt
        return policy(td)

    return interrupted


@pytest.mark.parametrize("mode", ["auto", "wait"])
def test_one_file_per_episode_with_reset_frame_and_one_frame_per_step(tmp_path, mode):
    lengths = [2, 5, 3]
    pool = pixel_pool(lengths)
    result = World(pool, ones(3)).evaluate(5, seed=0, reset_mode=mode, video=tmp_path, progress=False)
    files = sorted(p.name for p in tmp_path.glob("*.mp4"))
    assert files == [f"episode_{j:05d}.mp4" for j in range(5)]  # a reset starts a new file
    for j, length in enumerate(result["episode_lengths"]):
        # the reset frame plus one frame per step the env took; a frozen env adds nothing
        assert count_frames(tmp_path / f"episode_{j:05d}.mp4") == length + 1
    pool.close()


def test_reusing_a_video_directory_warns_that_older_files_stay(tmp_path):
    # as gymnasium's RecordVideo: a shorter second run would leave the first run's later episodes beside its own
    import warnings

    pool = pixel_pool([2, 3])
    World(pool, ones(2)).evaluate(4, seed=0, video=tmp_path, progress=False)
    with pytest.warns(UserWarning, match=r"already holds 4 video\(s\) \(episode_00000.mp4, ...\).*leaves the rest"):
        World(pool, ones(2)).evaluate(2, seed=0, video=tmp_path, progress=False)
    assert len(list(tmp_path.glob("*.mp4"))) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another prefix or layout in the same directory is a fresh run
        VideoRecorder(tmp_path, prefix="other")
        VideoRecorder(tmp_path, layout="grid")
    pool.close()


def test_frames_show_the_episode_in_order(tmp_path):
    import imageio

    pool = pixel_pool([4])
    World(pool, ones(1)).evaluate(1, seed=0, video=tmp_path, progress=False)
    frames = [frame for frame in imageio.get_reader(tmp_path / "episode_00000.mp4")]
    # CountingEnv paints t into the red channel: 0, 1, 2, 3, 4 (lossy codec: compare loosely)
    reds = [int(f[..., 0].mean()) for f in frames]
    assert len(reds) == 5 and all(abs(r - t) <= 2 for r, t in zip(reds, range(5)))
    pool.close()


def test_recorder_counts_and_grid_layout(tmp_path):
    lengths = [2, 5, 3]
    pool = pixel_pool(lengths)
    rec = VideoRecorder(tmp_path / "grid", layout="grid", fps=5)
    World(pool, ones(3)).evaluate(6, seed=0, reset_mode="wait", video=rec, progress=False)
    path = tmp_path / "grid" / "grid.mp4"
    # two rounds of 5 steps, each with its reset frame
    assert rec.frame_counts == {path: 12}
    assert count_frames(path) == 12
    per_episode = VideoRecorder(tmp_path / "eps")
    World(pool, ones(3)).evaluate(4, seed=0, video=per_episode, progress=False)
    assert sorted(per_episode.frame_counts.values()) == sorted(n + 1 for n in [2, 5, 3, 2])
    pool.close()



def _record_one_episode(directory, frame, goal=None, steps=2):
    """Frames read back from a one-episode video of ``frame`` (and ``goal``) recorded by a VideoRecorder."""
    import imageio

    rec = VideoRecorder(directory, fps=5)
    rec.bind(1, None)
    rec.start_episode(0, 0, frame, goal)
    for _ in range(steps):
        rec.add_frame(0, frame)
    rec.end_episode(0)
    return [f for f in imageio.get_reader(directory / "episode_00000.mp4")]


def test_an_episode_video_shows_the_goal_image_beside_the_frame(tmp_path):
    # module docstring: each frame shows the agent and the goal image side by side (concatenated along the width)
    frame = np.full((32, 32, 3), 200, dtype=np.uint8)
    goal = np.full((32, 32, 3), 40, dtype=np.uint8)
    frames = _record_one_episode(tmp_path, frame, goal)
    assert len(frames) == 3 and all(f.shape == (32, 64, 3) for f in frames)
    # lossy codec: compare means away from the seam
    assert abs(float(frames[0][4:28, 4:28].mean()) - 200) < 15 and abs(float(frames[0][4:28, 36:60].mean()) - 40) < 15


@pytest.mark.parametrize("shape", [(33, 32), (32, 33), (33, 33)])
def test_odd_frame_sizes_are_padded_to_even_on_their_own_axis(tmp_path, shape):
    # H.264 (yuv420p) needs even sizes: an odd height is padded by one row, an odd width by one column, in both layouts
    h, w = shape
    frame = np.full((h, w, 3), 120, dtype=np.uint8)
    padded = (h + h % 2, w + w % 2, 3)
    assert all(f.shape == padded for f in _record_one_episode(tmp_path / "eps", frame))
    import imageio

    rec = VideoRecorder(tmp_path / "grid", layout="grid", fps=5)
    rec.bind(1, None)
    for _ in range(2):
        rec.grid_frame(frame[None], np.ones(1, dtype=bool))
    rec.close()
    assert all(f.shape == padded for f in imageio.get_reader(tmp_path / "grid" / "grid.mp4"))


@pytest.mark.parametrize("shape", [(33, 32), (32, 33), (33, 33)])
def test_odd_sizes_are_padded_at_the_bottom_and_right_with_black(tmp_path, shape):
    # the frame keeps its top-left corner: the padding row goes below it, the padding column to its right
    h, w = shape
    frame = np.full((h, w, 3), 220, dtype=np.uint8)
    got = _record_one_episode(tmp_path, frame)[0].astype(float)
    assert got[0].mean() > 170 and got[:, 0].mean() > 170  # the frame's own first row and column
    if h % 2:
        assert got[-1].mean() < 110 and got[-2].mean() > 170
    if w % 2:
        assert got[:, -1].mean() < 110 and got[:, -2].mean() > 170


@pytest.mark.parametrize("n, cols", [(3, 2), (5, 3)])
def test_grid_tiles_fill_a_near_square_row_by_row(tmp_path, n, cols):
    # ceil(sqrt(N)) columns, env i at row i // cols, column i % cols; slots past the last env stay black
    import imageio

    levels = [40 + 40 * i for i in range(n)]  # one brightness per env: 40, 80, ... 200
    frames = np.stack([np.full((32, 32, 3), v, dtype=np.uint8) for v in levels])
    rec = VideoRecorder(tmp_path, layout="grid", fps=5)
    rec.bind(n, None)
    for _ in range(2):
        rec.grid_frame(frames, np.ones(n, dtype=bool))
    rec.close()
    rows = -(-n // cols)
    frame = next(iter(imageio.get_reader(tmp_path / "grid.mp4")))
    assert frame.shape == (rows * 32, cols * 32, 3)
    for slot in range(rows * cols):
        r, c = divmod(slot, cols)
        tile = frame[r * 32 + 6 : (r + 1) * 32 - 6, c * 32 + 6 : (c + 1) * 32 - 6]  # lossy codec: away from seams
        expected = levels[slot] if slot < n else 0
        assert abs(float(tile.mean()) - expected) < 12, (slot, float(tile.mean()), expected)


def test_starting_an_episode_on_an_env_that_has_one_open_finishes_the_open_one(tmp_path):
    # a recorder driven by hand: the episode still open on env 0 is finished and listed, not left unwritten
    frame = np.full((16, 16, 3), 100, dtype=np.uint8)
    rec = VideoRecorder(tmp_path, fps=5)
    rec.bind(1, None)
    rec.start_episode(0, 0, frame)
    rec.add_frame(0, frame)
    rec.start_episode(0, 1, frame)
    first = tmp_path / "episode_00000.mp4"
    assert rec.files == [first] and rec.frame_counts == {first: 2} and count_frames(first) == 2
    rec.end_episode(0)
    assert rec.files == [first, tmp_path / "episode_00001.mp4"]


class _BrightCounting(CountingEnv):
    """CountingEnv with bright 32x32 frames (a dimmed tile stands out through the lossy codec)."""

    def render(self):
        return np.full((32, 32, 3), 210, dtype=np.uint8)


def test_grid_video_dims_the_tiles_of_frozen_envs(tmp_path):
    """In the grid layout, a frozen env's tile (an env whose episode ended and that waits) is dimmed, while
    the stepped envs' tiles keep their brightness: env 0 ends after 1 step and waits while env 1 plays 4."""
    import imageio

    pool = EnvPool([functools.partial(_BrightCounting, length=n, render_mode="rgb_array") for n in (1, 4)],
                   seed=0, pixels=True)
    rec = VideoRecorder(tmp_path, layout="grid", fps=5)
    World(pool, ones(2)).evaluate(2, seed=0, video=rec, progress=False)
    pool.close()
    frames = [frame for frame in imageio.get_reader(tmp_path / "grid.mp4")]
    assert len(frames) == 5  # the reset frame, then one per step of the longest episode
    # 1 row of 2 tiles of 32x32: env 0 left, env 1 right (lossy codec: compare means, away from the seam)
    env0 = [float(f[4:28, 4:28].mean()) for f in frames]
    env1 = [float(f[4:28, 36:60].mean()) for f in frames]
    assert all(abs(v - 210) < 15 for v in env1), env1  # always stepped: never dimmed
    assert all(abs(v - 210) < 15 for v in env0[:2]), env0  # reset frame and its one step
    assert all(abs(v - 210 // 3) < 15 for v in env0[2:]), env0  # frozen: dimmed to a third


def test_video_needs_pixels_and_imageio(tmp_path, monkeypatch):
    pool = EnvPool([functools.partial(counting, length=2)], seed=0)
    with pytest.raises(ValueError, match="pixels"):
        World(pool, ones(1)).evaluate(1, seed=0, video=tmp_path, progress=False)
    real_import = builtins.__import__

    def no_imageio(name, *args, **kwargs):
        if name.startswith("imageio"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_imageio)
    with pytest.raises(ImportError, match=r"torchrl-swm\[video\]"):
        VideoRecorder(tmp_path)
    with pytest.raises(ValueError, match="layout"):
        monkeypatch.undo()
        VideoRecorder(tmp_path, layout="mosaic")
    pool.close()


@pytest.mark.parametrize("layout", ["episodes", "grid"])
def test_frames_that_are_not_uint8_rgb_are_refused_in_both_layouts(tmp_path, layout):
    import numpy as np

    recorder = VideoRecorder(tmp_path / layout, layout=layout)
    recorder.bind(2, 10)
    frames = np.full((2, 8, 8, 3), 0.5, np.float32)  # float in [0, 1]: cast to uint8 it would be black
    rgba = np.zeros((2, 8, 8, 4), np.uint8)  # an alpha channel: the episode video dropped it, a grid failed later
    for bad, said in ((frames, r"ndarray\(dtype=float32"), (rgba, r"ndarray\(dtype=uint8, shape=\(\d, 8, 8, 4\)|"
                                                                     r"ndarray\(dtype=uint8, shape=\(8, 8, 4\)")):
        with pytest.raises(TypeError, match=r"expected frames of uint8 RGB .*got " + said):
            if layout == "grid":
                recorder.grid_frame(bad, np.ones(2, bool))
            else:
                recorder.start_episode(0, 0, bad[0])
    recorder.close()


@pytest.mark.parametrize("layout", ["episodes", "grid"])
@pytest.mark.parametrize("shape", [(0, 8, 3), (8, 0, 3), (0, 0, 3)])
def test_frames_without_pixels_are_refused_and_no_video_is_listed(tmp_path, layout, shape):
    # ffmpeg cannot write them: the recorder would list a file that was never written
    recorder = VideoRecorder(tmp_path / layout, layout=layout)
    recorder.bind(1, 10)
    given = (1, *shape) if layout == "grid" else shape
    with pytest.raises(TypeError, match=rf"every size >= 1, got ndarray\(dtype=uint8, shape={re.escape(str(given))}"):
        if layout == "grid":
            recorder.grid_frame(np.zeros((1, *shape), np.uint8), np.ones(1, bool))
        else:
            recorder.start_episode(0, 0, np.zeros(shape, np.uint8))
    recorder.close()
    assert recorder.files == [] and list((tmp_path / layout).iterdir()) == []


def test_an_empty_grid_and_a_wrong_number_of_active_flags_are_refused(tmp_path):
    import numpy as np

    recorder = VideoRecorder(tmp_path, layout="grid")
    recorder.bind(2, 10)
    with pytest.raises(TypeError, match=r"every size >= 1, got ndarray\(dtype=uint8, shape=\(0, 8, 8, 3\)"):
        recorder.grid_frame(np.zeros((0, 8, 8, 3), np.uint8), np.ones(0, bool))
    with pytest.raises(ValueError, match="grid_frame got 2 frames but 1 active flags"):
        recorder.grid_frame(np.zeros((2, 8, 8, 3), np.uint8), np.ones(1, bool))
    recorder.close()
    assert recorder.files == []


@pytest.mark.parametrize(
    "goal, error, match",
    [
        ("float", TypeError, r"expected a goal frame of uint8 RGB .*dtype=float32"),  # cast, it would be black
        ("gray", TypeError, r"expected a goal frame of uint8 RGB .*shape=\(8, 8\)"),
        ("short", ValueError, r"goal frame \(4, 8, 3\) is shown beside the env's frame \(8, 8, 3\).*same height"),
    ],
)
def test_a_goal_frame_is_checked_like_the_env_frames(tmp_path, goal, error, match):
    import numpy as np

    goals = {
        "float": np.full((8, 8, 3), 0.5, np.float32),
        "gray": np.zeros((8, 8), np.uint8),
        "short": np.zeros((4, 8, 3), np.uint8),
    }
    recorder = VideoRecorder(tmp_path)
    recorder.bind(1, 10)
    with pytest.raises(error, match=match):
        recorder.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8), goal=goals[goal])
    recorder.close()
    assert recorder.files == [] and list(tmp_path.iterdir()) == []


class _FractionalFpsEnv:
    """A rendering env whose metadata asks for a fractional frame rate."""

    def __new__(cls, fps):
        import gymnasium as gym
        import numpy as np

        class Env(gym.Env):
            metadata = {"render_modes": ["rgb_array"], "render_fps": fps}
            observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
            action_space = gym.spaces.Discrete(2)

            def __init__(self):
                self.render_mode = "rgb_array"

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return np.zeros(1, np.float32), {}

            def step(self, action):
                self.t += 1
                return np.zeros(1, np.float32), 0.0, self.t >= 5, False, {}

            def render(self):
                return np.full((8, 8, 3), 20 * self.t, np.uint8)

        return Env()


@pytest.mark.parametrize("fps", [12.5, 0.5])
def test_videos_keep_a_fractional_render_fps(tmp_path, fps):
    import imageio

    world = World(EnvPool([functools.partial(_FractionalFpsEnv, fps)] * 2, pixels=True, seed=0))
    world.evaluate(2, seed=0, video=tmp_path, progress=False)
    reader = imageio.get_reader(tmp_path / "episode_00000.mp4")
    meta = reader.get_meta_data()
    reader.close()
    world.close()
    assert meta["fps"] == pytest.approx(fps)
    assert meta["duration"] == pytest.approx(6 / fps, rel=0.05)  # the reset frame + 5 steps, as the env plays them


def test_video_recorder_checks_fps_and_quality_up_front(tmp_path):
    for kwargs, error, message in (
        ({"fps": 0}, ValueError, r"fps must be a number from 0.001 to 10000 \(ffmpeg takes it as a fraction\), got 0"),
        ({"fps": -5}, ValueError, "fps must be a number from 0.001 to 10000.*got -5"),
        ({"fps": float("nan")}, ValueError, "fps must be a number from 0.001 to 10000.*got nan"),
        ({"fps": float("inf")}, ValueError, "fps must be a number from 0.001 to 10000.*got inf"),
        ({"fps": 1e-7}, ValueError, "fps must be a number from 0.001 to 10000.*got 1e-07"),
        ({"fps": 1e10}, ValueError, "fps must be a number from 0.001 to 10000.*got 10000000000.0"),  # ffmpeg: no file
        ({"fps": "10"}, TypeError, "fps must be a number, got str"),
        ({"quality": 50}, ValueError, r"quality must be a number from 1 to 10 .*got 50"),
        ({"quality": 0}, ValueError, r"quality must be a number from 1 to 10 .*got 0"),  # imageio-ffmpeg's assert
        ({"quality": 0.5}, ValueError, r"quality must be a number from 1 to 10 .*got 0.5"),
        ({"quality": None}, TypeError, "quality must be a number"),
    ):
        with pytest.raises(error, match=message):
            VideoRecorder(tmp_path / "v", **kwargs)
    assert VideoRecorder(tmp_path / "v", fps=np.int64(12), quality=np.float32(5)).fps == 12.0
    for metadata_fps, used in ((float("inf"), 30), (1e-9, 30), (1e10, 30), (None, 30), (12.5, 12.5)):  # an env's
        recorder = VideoRecorder(tmp_path / "v")
        recorder.bind(2, metadata_fps)
        assert recorder.fps == used


def test_video_recorder_refuses_true_and_false_as_fps_or_quality(tmp_path):
    # True is an int to Python: fps=True (a YAML "yes" or a flag passed in the wrong slot) made a 1 fps video.
    # What a user sees is a TypeError naming the argument; an env's metadata render_fps=True is no frame rate
    # either, so the recorder keeps its 30 fps default; review R4 E10
    for kwargs, message in (
        ({"fps": True}, r"VideoRecorder: fps must be a number, got bool True"),
        ({"fps": np.True_}, r"VideoRecorder: fps must be a number, got bool\(dtype=bool"),
        ({"quality": True}, r"VideoRecorder: quality must be a number, got bool True"),
        ({"quality": False}, r"VideoRecorder: quality must be a number, got bool False"),
    ):
        with pytest.raises(TypeError, match=message):
            VideoRecorder(tmp_path / "v", **kwargs)
    recorder = VideoRecorder(tmp_path / "v")
    recorder.bind(2, True)
    assert recorder.fps == 30


def test_reusing_a_directory_warns_for_a_prefix_with_glob_characters(tmp_path):
    # the prefix is matched literally: "run[1]" as a glob pattern would look for "run1_*.mp4" and find nothing
    rec = VideoRecorder(tmp_path, prefix="run[1]")
    rec.bind(1, None)
    rec.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8))
    rec.end_episode(0)
    with pytest.warns(UserWarning, match=r"already holds 1 video\(s\) \(run\[1\]_00000.mp4, ...\)"):
        VideoRecorder(tmp_path, prefix="run[1]")


def test_quality_reaches_the_encoder(tmp_path):
    # quality= is ffmpeg's, not ignored: the same noisy clip takes more bytes at each higher quality
    frame = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    sizes = []
    for quality in (1, 5, 10):
        rec = VideoRecorder(tmp_path / str(quality), quality=quality)
        rec.bind(1, None)
        rec.start_episode(0, 0, frame)
        for _ in range(4):
            rec.add_frame(0, frame)
        rec.end_episode(0)
        sizes.append(rec.files[0].stat().st_size)
    assert sizes[0] < sizes[1] < sizes[2], sizes


def test_a_ctrl_c_cutting_the_first_frame_leaves_no_file(tmp_path):
    # a Ctrl-C as ffmpeg takes the first frame (its file exists by then): the unreadable file is removed, not left
    recorder = VideoRecorder(tmp_path)
    recorder.bind(1, 10)
    real = recorder.imageio

    class CtrlCAfterTheFirstFrame:  # the real imageio, with a Ctrl-C once a writer has written its first frame
        def get_writer(self, *args, **kwargs):
            writer = real.get_writer(*args, **kwargs)
            append = writer.append_data

            def append_then_ctrl_c(frame):
                append(frame)
                raise KeyboardInterrupt

            writer.append_data = append_then_ctrl_c
            return writer

    recorder.imageio = CtrlCAfterTheFirstFrame()
    with pytest.raises(KeyboardInterrupt):
        recorder.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8))
    assert list(tmp_path.iterdir()) == [] and recorder.files == []


def test_a_run_cut_by_ctrl_c_keeps_finished_videos_and_marks_the_cut_episodes(tmp_path):
    # every episode_<index>.mp4 is a whole episode; an episode the interrupt cut keeps its frames as .cut.mp4
    pool = pixel_pool([2, 30, 30])
    recorder = VideoRecorder(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        World(pool, ctrl_c_at_call(9, ones(3))).evaluate(9, seed=0, video=recorder, progress=False)
    names = sorted(p.name for p in tmp_path.glob("*.mp4"))
    whole = [n for n in names if not n.endswith(".cut.mp4")]
    cut = [n for n in names if n.endswith(".cut.mp4")]
    assert sorted(p.name for p in recorder.files) == names
    # each env plays its share, 3 episodes: env 0 its three 2-step ones; envs 1 and 2 were cut in their first
    assert len(whole) == 3 and len(cut) == 2
    for name in whole:
        assert count_frames(tmp_path / name) == 3  # the reset frame and 2 steps
    for name in cut:
        assert 1 <= count_frames(tmp_path / name) == recorder.frame_counts[tmp_path / name] <= 9
    pool.close()


def test_a_ctrl_c_while_an_episode_video_starts_comes_once_the_file_is_recorded(tmp_path):
    # starting ffmpeg forks: a KeyboardInterrupt inside the fork's callbacks was printed and dropped (the run went
    # on), and one before the first frame left a file no player opens; Ctrl-C is held until the writer is recorded
    import os
    import signal

    recorder = VideoRecorder(tmp_path)
    recorder.bind(1, 10)
    real = recorder.imageio

    class CtrlCWhileStarting:  # the real imageio, with a Ctrl-C pressed as a writer starts
        def get_writer(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            return real.get_writer(*args, **kwargs)

    recorder.imageio = CtrlCWhileStarting()
    with pytest.raises(KeyboardInterrupt):
        recorder.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8))
    recorder.close()
    assert [p.name for p in tmp_path.glob("*.mp4")] == ["episode_00000.cut.mp4"]
    assert count_frames(tmp_path / "episode_00000.cut.mp4") == 1


class _CtrlCWhileFinishing:
    """The real imageio, with a Ctrl-C pressed as each writer's ffmpeg finishes its file."""

    def __init__(self, imageio):
        self.imageio = imageio

    def get_writer(self, *args, **kwargs):
        import os
        import signal

        writer = self.imageio.get_writer(*args, **kwargs)
        close = writer.close

        def close_with_ctrl_c():
            writer.close = close  # once: imageio's __del__ closes again
            os.kill(os.getpid(), signal.SIGINT)
            close()

        writer.close = close_with_ctrl_c
        return writer


def test_a_ctrl_c_while_a_cut_run_closes_leaves_every_video_finished_marked_and_listed(tmp_path):
    # a second Ctrl-C while the first one's run closes its videos: the others were left unfinished, named as
    # whole episodes, and unlisted
    recorder = VideoRecorder(tmp_path)
    recorder.bind(3, 10)
    recorder.imageio = _CtrlCWhileFinishing(recorder.imageio)
    for env in range(3):
        recorder.start_episode(env, env, np.zeros((8, 8, 3), np.uint8))
        recorder.add_frame(env, np.full((8, 8, 3), 80, np.uint8))
    with pytest.raises(KeyboardInterrupt):
        recorder.close()
    names = [f"episode_{env:05d}.cut.mp4" for env in range(3)]
    assert sorted(p.name for p in tmp_path.glob("*.mp4")) == names
    assert [p.name for p in recorder.files] == names
    assert all(count_frames(tmp_path / n) == recorder.frame_counts[tmp_path / n] == 2 for n in names)
    recorder = VideoRecorder(tmp_path / "ended")
    recorder.bind(1, 10)
    recorder.imageio = _CtrlCWhileFinishing(recorder.imageio)
    recorder.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(KeyboardInterrupt):  # an episode that ended: finished and listed, then the Ctrl-C
        recorder.end_episode(0)
    assert recorder.files == [tmp_path / "ended" / "episode_00000.mp4"]
    assert count_frames(recorder.files[0]) == recorder.frame_counts[recorder.files[0]] == 1


@pytest.mark.parametrize("layout", ["episodes", "grid"])
def test_a_ctrl_c_while_frames_stream_leaves_a_readable_video(tmp_path, layout):
    # cut inside imageio's frame write, ffmpeg was killed and the file had no index: unreadable (with a grid, the
    # whole run's one video)
    import os
    import signal
    import threading

    recorder = VideoRecorder(tmp_path, layout=layout)
    recorder.bind(1, 10)
    frame = np.random.default_rng(0).integers(0, 255, (1024, 1024, 3), dtype=np.uint8)

    def write():
        if layout == "grid":
            recorder.grid_frame(frame[None], np.ones(1, bool))
        else:
            recorder.add_frame(0, frame)

    recorder.start_episode(0, 0, frame)
    write()
    ctrl_c = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(10_000):  # frames stream until the Ctrl-C (a few hundred ms of encoding)
                write()
    finally:
        ctrl_c.cancel()
        recorder.close()
    (path,) = recorder.files
    assert path.name == ("grid.mp4" if layout == "grid" else "episode_00000.cut.mp4")
    assert count_frames(path) == recorder.frame_counts[path] >= 2


def test_a_burst_of_ctrl_c_while_a_cut_run_unwinds_still_marks_its_cut_episodes(tmp_path):
    # a second Ctrl-C landing as World's cleanup starts closing the videos (before close() holds Ctrl-C itself)
    # skipped the close: cut episodes stayed open, then finished at exit under whole-episode names
    pool = pixel_pool([2, 30, 30])
    recorder = VideoRecorder(tmp_path)
    close = recorder.close
    calls = []

    def close_cut_by_a_second_ctrl_c():
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        close()

    recorder.close = close_cut_by_a_second_ctrl_c
    with pytest.raises(KeyboardInterrupt):
        World(pool, ctrl_c_at_call(5, ones(3))).evaluate(6, seed=0, video=recorder, progress=False)
    assert not recorder._writers
    names = sorted(p.name for p in tmp_path.glob("*.mp4"))
    assert sorted(p.name for p in recorder.files) == names
    assert [n for n in names if n.endswith(".cut.mp4")] == ["episode_00001.cut.mp4", "episode_00002.cut.mp4"]
    pool.close()


def test_close_closes_every_writer_when_one_cut_episode_cannot_be_renamed(tmp_path):
    # the video folder removed under a running recorder (a cleanup job): the first cut episode's rename failed and
    # close() stopped there, every later writer's ffmpeg left running, the grid writer too (review C, round 17)
    import os
    import shutil

    def children():  # this process's child processes, from /proc (Linux)
        found = set()
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(stat.split("/")[2]))
        return found

    folder = tmp_path / "videos"
    recorder = VideoRecorder(folder, fps=5)
    recorder.bind(3, None)
    frame = np.zeros((8, 8, 3), np.uint8)
    earlier = children()  # an earlier test's (a resource tracker...)
    for env in range(3):
        recorder.start_episode(env, env, frame)
        recorder.add_frame(env, frame)
    writers = [entry[0] for entry in recorder._writers.values()]
    before = children() - earlier
    assert len(before) == 3  # one ffmpeg per open episode
    shutil.rmtree(folder)
    with pytest.raises(FileNotFoundError) as err:
        recorder.close()
    assert all(writer.closed for writer in writers) and not recorder._writers
    assert len([note for note in getattr(err.value, "__notes__", []) if note.startswith("also:")]) == 2  # envs 1, 2
    assert not before & children()  # every ffmpeg has exited and been reaped
    assert recorder.files == [] and recorder.frame_counts == {}  # nothing listed that is not there


def test_a_run_whose_videos_cannot_be_closed_reports_its_own_error_first(tmp_path):
    # World.evaluate closes the recorder as the run's error goes by: a failing close no longer replaces that error
    import shutil

    pool = pixel_pool([30, 30])
    folder = tmp_path / "videos"

    def remove_the_folder_then_fail(td):
        if remove_the_folder_then_fail.calls == 3:
            shutil.rmtree(folder)
            raise RuntimeError("the policy failed")
        remove_the_folder_then_fail.calls += 1
        return td.set("action", torch.ones(2, dtype=torch.int64))

    remove_the_folder_then_fail.calls = 0
    with pytest.raises(RuntimeError, match="the policy failed") as err:
        World(pool, remove_the_folder_then_fail).evaluate(2, seed=0, video=VideoRecorder(folder), progress=False)
    assert any(note.startswith("closing the videos then failed too: FileNotFoundError")
               for note in err.value.__notes__)
    pool.close()


def test_close_finishes_the_grid_video_itself(tmp_path):
    # the grid writer was finished only by imageio's __del__ once close() dropped it (CPython's refcounting): a
    # caller still holding it, or another interpreter, kept an unfinished grid.mp4 and its ffmpeg (review C V2)
    recorder = VideoRecorder(tmp_path, layout="grid", fps=5)
    recorder.bind(2, None)
    recorder.grid_frame(np.zeros((2, 8, 8, 3), np.uint8), np.array([True, True]))
    writer = recorder._grid[0]
    recorder.close()
    assert writer.closed and count_frames(recorder.files[0]) == 1


def test_a_first_frame_that_fails_closes_its_writer(tmp_path):
    # its ffmpeg would otherwise live until the writer is collected (review C V6)
    recorder = VideoRecorder(tmp_path)
    recorder.bind(1, 10)
    real = recorder.imageio
    made = []

    class FailingFirstFrame:  # the real imageio, whose writers fail to take their first frame
        def get_writer(self, *args, **kwargs):
            writer = real.get_writer(*args, **kwargs)
            made.append(writer)

            def fail(frame):
                raise OSError("no space left on device")

            writer.append_data = fail
            return writer

    recorder.imageio = FailingFirstFrame()
    with pytest.raises(OSError, match="no space left"):
        recorder.start_episode(0, 0, np.zeros((8, 8, 3), np.uint8))
    assert made and all(writer.closed for writer in made) and recorder.files == []
