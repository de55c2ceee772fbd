"""Videos of evaluation runs, written from the ``"pixels"`` key with imageio/ffmpeg.

:class:`VideoRecorder` is driven by :class:`torchrl_swm.World`; frames follow
the World's masks:

* ``layout="episodes"`` (default) writes one MP4 per episode,
  ``episode_<index>.mp4`` where ``index`` is the episode's position in the
  evaluation result. An episode of ``L`` steps has ``L + 1`` frames: the reset
  frame, then one frame per step the env actually took. A frozen env adds no
  frame, and a reset starts a new file. When the evaluation has goals
  (``dataset=`` evaluation), each frame shows the agent and the goal image side
  by side.
* ``layout="grid"`` writes one ``grid.mp4`` with a tile per env and one frame
  per World step (plus one per reset round); frozen envs keep their last frame,
  dimmed.

A run cut by an error or Ctrl-C keeps its episodes' videos; an episode it cut keeps the frames it
has, as ``episode_<index>.cut.mp4``. Ctrl-C is held while a file starts, while a frame is written
and while a file is finished, so every file is a readable video.

imageio and imageio-ffmpeg are an optional extra: ``pip install "torchrl-swm[video]"``.
"""

from __future__ import annotations

import glob
import math
import os
import warnings
from pathlib import Path

import numpy as np

from ._interrupts import interrupts_held
from .errors import _real, add_as_notes, add_note, check_number, describe, error_text

__all__ = ["VideoRecorder", "require_imageio", "count_frames"]


def require_imageio():
    """Import imageio (with its ffmpeg plugin), or raise an ImportError that says how to install it."""
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "writing videos needs imageio and imageio-ffmpeg; install them with "
            "`pip install \"torchrl-swm[video]\"` (or `pip install imageio imageio-ffmpeg`)"
        ) from err
    return imageio


def _check_frames(frames: np.ndarray, ndim: int, what: str = "frames") -> None:
    """Frames are uint8 RGB: anything else would be cast (a float frame in [0, 1] turns black); an empty one
    (no pixels, or no frames) ffmpeg cannot write."""
    if (
        not isinstance(frames, np.ndarray)
        or frames.dtype != np.uint8
        or frames.ndim != ndim
        or frames.shape[-1] != 3
        or 0 in frames.shape
    ):
        expected = "(H, W, 3)" if ndim == 3 else "(N, H, W, 3)"
        raise TypeError(
            f"video: expected {what} of uint8 RGB {expected}, every size >= 1, got {describe(frames)}; make the "
            "pixels uint8 (e.g. a decoder returning (x * 255).to(torch.uint8))"
        )


def _even(frame: np.ndarray) -> np.ndarray:
    """Pad to even height and width (H.264 with yuv420p needs them)."""
    h, w = frame.shape[:2]
    ph, pw = h % 2, w % 2
    if ph or pw:
        frame = np.pad(frame, ((0, ph), (0, pw), (0, 0)))
    return frame


# ffmpeg gets fps as a fraction of denominator <= 10**6 (far smaller rounds to 0); far larger it cannot parse, and
# imageio then writes no file without a word
_MIN_FPS, _MAX_FPS = 0.001, 10_000


def _usable_fps(fps) -> bool:
    return _real(fps) and math.isfinite(fps) and _MIN_FPS <= fps <= _MAX_FPS


class VideoRecorder:
    """Writes MP4 videos of a :class:`~torchrl_swm.World` run.

    Args:
        directory: where the files go (created if needed).

    Keyword Args:
        layout: ``"episodes"`` (one file per episode) or ``"grid"`` (one file).
        fps: frames per second; default: the env's ``metadata["render_fps"]``, else 30.
        prefix: file name prefix for ``layout="episodes"``.
        quality: imageio-ffmpeg's quality, from 1 (smallest files) to 10 (best).

    Attributes:
        files: the paths written so far, in the order they were closed.
        frame_counts: ``{path: number of frames}`` for every closed file.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        layout: str = "episodes",
        fps: float | None = None,
        prefix: str = "episode",
        quality: float = 7,
    ):
        if layout not in ("episodes", "grid"):
            raise ValueError(f"VideoRecorder: layout must be 'episodes' or 'grid', got {layout!r}")
        if fps is not None and not _usable_fps(check_number(fps, "VideoRecorder: fps")):
            raise ValueError(f"VideoRecorder: fps must be a number from {_MIN_FPS} to {_MAX_FPS} (ffmpeg takes it "
                             f"as a fraction), got {fps!r}")
        # imageio-ffmpeg asserts 1 <= quality <= 10 at the first frame (imageio's docs say 0-10): checked here
        if not 1 <= check_number(quality, "VideoRecorder: quality") <= 10:
            raise ValueError(f"VideoRecorder: quality must be a number from 1 to 10 (imageio-ffmpeg's quality), "
                             f"got {quality!r}")
        self.imageio = require_imageio()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        # (a grid run rewrites its one grid.mp4 whole: nothing of an earlier run is left beside it)
        old = sorted(self.directory.glob(f"{glob.escape(prefix)}_*.mp4")) if layout == "episodes" else []
        if old:
            # as gymnasium's RecordVideo: a shorter run overwrites some files and leaves the others beside them
            warnings.warn(
                f"VideoRecorder: {self.directory} already holds {len(old)} video(s) ({old[0].name}, ...): this run "
                "overwrites those of the same names and leaves the rest; use a new directory to keep runs apart",
                stacklevel=2,
            )
        self.layout = layout
        self.fps = None if fps is None else float(fps)  # imageio takes a float (or a Fraction), not a numpy int
        self.prefix = prefix
        self.quality = float(quality)
        self.files: list[Path] = []
        self.frame_counts: dict[Path, int] = {}
        self._writers: dict[int, tuple] = {}  # env -> (writer, path, count, goal)
        self._grid = None
        self._last: np.ndarray | None = None

    # -- called by World ----------------------------------------------------------------------
    def bind(self, num_envs: int, fps: float | None) -> None:
        """Called once by World before the run."""
        self.num_envs = num_envs
        if self.fps is None:  # fractional, as gymnasium's RecordVideo keeps it; 30 where the env's is unusable
            self.fps = float(fps) if _usable_fps(fps) else 30

    def _open(self, path: Path, first_frame: np.ndarray):
        """A writer of ``path`` that holds ``first_frame``. Callers hold Ctrl-C until they have recorded it:
        the first frame starts ``ffmpeg`` (a fork, inside whose callbacks a KeyboardInterrupt is printed and
        dropped), and a writer cut before its first frame leaves a file no player opens."""
        writer = self.imageio.get_writer(
            path, fps=self.fps, codec="libx264", quality=self.quality, macro_block_size=1, ffmpeg_log_level="error"
        )
        try:
            writer.append_data(first_frame)
        except BaseException as err:
            try:
                writer.close()
            except Exception as close_err:  # the first frame's error is the one to report
                add_note(err, f"closing its writer then failed too: {error_text(close_err)}")
            path.unlink(missing_ok=True)
            raise
        return writer

    def start_episode(self, env: int, index: int, frame: np.ndarray, goal: np.ndarray | None = None) -> None:
        """Env ``env`` starts episode ``index``; ``frame`` is its reset frame."""
        if self.layout != "episodes":
            return
        if env in self._writers:
            self.end_episode(env)
        path = self.directory / f"{self.prefix}_{index:05d}.mp4"
        if goal is not None:
            _check_frames(goal, 3, "a goal frame")
        frame = _episode_frame(frame, goal)
        with interrupts_held():  # a Ctrl-C comes once the writer is recorded here, which close() finishes
            self._writers[env] = [self._open(path, frame), path, 1, goal]

    def add_frame(self, env: int, frame: np.ndarray) -> None:
        """One frame of a stepped env (never called for frozen envs)."""
        entry = self._writers.get(env)
        if entry is None:
            return
        frame = _episode_frame(frame, entry[3])
        with interrupts_held():  # cut mid-frame, imageio kills ffmpeg: the file would be unreadable
            entry[0].append_data(frame)
            entry[2] += 1

    def end_episode(self, env: int) -> None:
        entry = self._writers.pop(env, None)
        if entry is None:
            return
        writer, path, count, _ = entry
        with interrupts_held():  # ffmpeg finishes the file (cut, it would be unreadable), then it is listed
            writer.close()
            self.files.append(path)
            self.frame_counts[path] = count

    def grid_frame(self, frames: np.ndarray, active: np.ndarray) -> None:
        """One grid frame: ``frames`` (N, H, W, 3) uint8, frozen envs (``~active``) dimmed."""
        if self.layout != "grid":
            return
        _check_frames(frames, 4)
        n, h, w, _ = frames.shape
        if len(active) != n:
            raise ValueError(f"video: grid_frame got {n} frames but {len(active)} active flags; expected one per frame")
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        canvas = np.zeros((rows * h, cols * w, 3), dtype=np.uint8)
        for i in range(n):
            tile = frames[i] if active[i] else (frames[i] // 3)
            r, c = divmod(i, cols)
            canvas[r * h : (r + 1) * h, c * w : (c + 1) * w] = tile
        if self._grid is None:
            path = self.directory / "grid.mp4"
            with interrupts_held():
                self._grid = [self._open(path, _even(canvas)), path, 1]
            return
        canvas = _even(canvas)
        with interrupts_held():  # as add_frame's
            self._grid[0].append_data(canvas)
            self._grid[2] += 1

    def close(self) -> None:
        """Close every open file.

        An episode still open (a run cut by an error or Ctrl-C: World ends every episode it plays) keeps
        the frames it has, as ``<prefix>_<index>.cut.mp4``, so that no ``<prefix>_<index>.mp4`` is a cut
        episode. A grid video keeps its name.

        Every writer is closed (each an ffmpeg process) even when one fails, as a file removed under it
        makes it; the first error is then raised, the others added to it as notes.
        """
        errors: list[Exception] = []
        with interrupts_held():  # a second Ctrl-C while a cut run closes must not leave files half done
            for env in list(self._writers):
                path = self._writers[env][1]
                try:
                    self.end_episode(env)
                    cut = path.with_name(f"{path.stem}.cut{path.suffix}")
                    os.replace(path, cut)
                except Exception as err:
                    errors.append(err)
                    if path in self.frame_counts and not path.exists():  # listed by end_episode, gone since
                        self.files.remove(path)
                        del self.frame_counts[path]
                    continue
                self.files[self.files.index(path)] = cut
                self.frame_counts[cut] = self.frame_counts.pop(path)
            if self._grid is not None:
                writer, path, count = self._grid
                self._grid = None
                try:
                    writer.close()
                except Exception as err:
                    errors.append(err)
                else:
                    self.files.append(path)
                    self.frame_counts[path] = count
        if errors:
            add_as_notes(errors[0], errors[1:])
            raise errors[0]


def _episode_frame(frame: np.ndarray, goal: np.ndarray | None) -> np.ndarray:
    """An episode video's frame: the env's ``(H, W, 3)`` frame, with the goal's frame beside it."""
    _check_frames(frame, 3)
    if goal is not None:
        if goal.shape[0] != frame.shape[0]:
            raise ValueError(
                f"video: the goal frame {tuple(goal.shape)} is shown beside the env's frame {tuple(frame.shape)}, "
                "so it needs the same height; render the goal at the env's image size"
            )
        frame = np.concatenate([frame, goal], axis=1)
    return _even(np.ascontiguousarray(frame))


def count_frames(path: str | os.PathLike) -> int:
    """The number of frames in a video file (decodes it; for tests and checks)."""
    imageio = require_imageio()
    reader = imageio.get_reader(path)
    try:
        return sum(1 for _ in reader)
    finally:
        reader.close()
