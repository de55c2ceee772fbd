"""Small gymnasium envs for the tests: counting envs with known dynamics, Dict
observations, configurable infos, and envs that fail on purpose.

They are importable by worker processes (spawn), so keep them at module level.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """Observation ``[t, episode, last_action]``: ``t`` counts steps since reset.

    The episode length is ``length`` when given, else drawn from the reset seed
    in ``1..max_length``, so lengths differ by seed. At ``t == length`` the
    episode terminates (or truncates with ``truncate=True``). The reward is the
    action. ``steps_called``/``resets_called`` count calls to the gymnasium API.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, length: int | None = None, max_length: int = 9, truncate: bool = False,
                 render_mode: str | None = None, frame_size: int = 8):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.fixed_length, self.max_length, self.truncate = length, max_length, truncate
        self.render_mode = render_mode
        self.frame_size = frame_size
        self.steps_called = 0
        self.resets_called = 0
        self.renders_called = 0
        self.episode = -1
        self.t = 0
        self.last_action = 0
        self.last_seed = None

    def _obs(self):
        return np.array([self.t, self.episode, self.last_action], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets_called += 1
        self.episode += 1
        self.t = 0
        self.last_action = 0
        self.last_seed = seed
        self.length = self.fixed_length or 1 + int(self.np_random.integers(self.max_length))
        if options and "length" in options:
            self.length = int(options["length"])
        return self._obs(), {"t": 0, "length": self.length, "name": "counting"}

    def step(self, action):
        self.steps_called += 1
        self.t += 1
        self.last_action = int(action)
        end = self.t >= self.length
        terminated, truncated = (False, end) if self.truncate else (end, False)
        return self._obs(), float(action), terminated, truncated, {"t": self.t, "length": self.length, "name": "counting"}

    def render(self):
        self.renders_called += 1
        frame = np.zeros((self.frame_size, self.frame_size + 4, 3), dtype=np.uint8)
        frame[..., 0] = min(self.t, 255)
        frame[..., 1] = min(self.episode, 255)
        return frame


class KeepActionEnv(gym.Env):
    """Box actions, each array kept as given (as an action-repeat wrapper or a recorder keeps it) in ``kept``."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.kept = []
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.kept.append(action)
        return np.zeros(2, np.float32), 0.0, False, False, {}


class SparseInfoEnv(CountingEnv):
    """A counting env whose infos come and go: ``"t"`` always, ``"bonus"`` (``= t``) at
    every ``period``-th step, ``"success"`` only at the step that ends the episode."""

    def __init__(self, period: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.period = period

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"t": 0}

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        info = {"t": self.t}
        if self.t % self.period == 0:
            info["bonus"] = float(self.t)
        if terminated or truncated:
            info["success"] = True
        return obs, reward, terminated, truncated, info


def sparse_info(period=3, max_length=9):
    """A picklable factory for :class:`SparseInfoEnv`."""
    return SparseInfoEnv(period=period, max_length=max_length)


class ActionRecordingEnv(gym.Env):
    """Discrete(5, start=-2) actions: observes its last action and keeps each action's type."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-10, 10, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(5, start=-2)
        self.action_types: list[str] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.action_types.append(type(action).__name__)
        return np.array([action], np.float32), 0.0, False, False, {}


class DictObsEnv(gym.Env):
    """A Dict observation with a nested Dict and a Discrete leaf; Box actions."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({
            "position": gym.spaces.Box(-10, 10, shape=(2,), dtype=np.float32),
            "goal": gym.spaces.Dict({
                "target": gym.spaces.Box(-10, 10, shape=(2,), dtype=np.float32),
                "kind": gym.spaces.Discrete(4, start=1),
            }),
        })
        self.action_space = gym.spaces.Box(-1, 1, shape=(2,), dtype=np.float32)

    def _obs(self):
        return {"position": self.pos.copy(), "goal": {"target": self.target.copy(), "kind": self.kind}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.kind = int(self.np_random.integers(1, 5))
        self.t = 0
        return self._obs(), {"distance": float(np.linalg.norm(self.pos - self.target))}

    def step(self, action):
        self.t += 1
        self.pos = np.clip(self.pos + 0.1 * np.asarray(action, dtype=np.float32), -10, 10).astype(np.float32)
        dist = float(np.linalg.norm(self.pos - self.target))
        success = dist < 0.1
        return self._obs(), -dist, success, self.t >= 20, {"distance": dist, "is_success": success}


class OneKeyDictObsEnv(gym.Env):
    """A Dict observation with a single key (``{"a": Box(2)}``), which stays a dict; Discrete(2) actions."""

    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"a": np.zeros(2, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {"a": np.full(2, 0.1 * min(self.t, 10), np.float32)}, 1.0, False, self.t >= 10, {}


class InfoEnv(gym.Env):
    """Returns the info dicts it is given: ``reset_info`` and ``step_infos[t]``."""

    def __init__(self, reset_info=None, step_infos=None):
        self.observation_space = gym.spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.reset_info = reset_info or {}
        self.step_infos = step_infos or [{}]
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), dict(self.reset_info)

    def step(self, action):
        info = self.step_infos[min(self.t, len(self.step_infos) - 1)]
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, False, dict(info)


class FailingEnv(CountingEnv):
    """A counting env that raises on its ``fail_at``-th step (or reset with ``in_reset``)."""

    def __init__(self, fail_at: int = 3, in_reset: bool = False, **kwargs):
        super().__init__(length=100, **kwargs)
        self.fail_at, self.in_reset = fail_at, in_reset

    def reset(self, *, seed=None, options=None):
        if self.in_reset and self.resets_called >= 1:
            raise ValueError("reset exploded")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.steps_called + 1 >= self.fail_at:
            raise ValueError(f"boom at step {self.steps_called + 1}")
        return super().step(action)


class ExitingEnv(CountingEnv):
    """A counting env that raises ``error(5)`` (by default ``SystemExit``, a ``BaseException``, not an
    ``Exception``) at its first step or, with ``in_reset``, at its third reset (a pool's construction probe
    and its first reset pass)."""

    def __init__(self, in_reset: bool = False, error: type = SystemExit, **kwargs):
        super().__init__(length=100, **kwargs)
        self.in_reset, self.error = in_reset, error

    def reset(self, *, seed=None, options=None):
        if self.in_reset and self.resets_called >= 2:
            raise self.error(5)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if not self.in_reset:
            raise self.error(5)
        return super().step(action)


class QuittingEnv(CountingEnv):
    """A counting env whose process exits with code 0 (``os._exit(0)``, as a quitting simulator) at step ``at``;
    with ``after_file``, only once that file exists (a test decides when)."""

    def __init__(self, at: int = 2, after_file: str | None = None, **kwargs):
        super().__init__(length=100, **kwargs)
        self.at, self.after_file = at, after_file

    def step(self, action):
        if self.steps_called + 1 >= self.at and not getattr(self, "probing", False):
            import os
            import time

            deadline = time.monotonic() + 60
            while self.after_file is not None and not os.path.exists(self.after_file) and time.monotonic() < deadline:
                time.sleep(0.005)
            os._exit(0)
        return super().step(action)


class StubbornError(Exception):
    """An exception whose ``__init__`` takes other arguments than its ``args``: pickles, but cannot be rebuilt."""

    def __init__(self, code: int, detail: str):
        super().__init__(f"code {code}: {detail}")


class StubbornFailingEnv(CountingEnv):
    """A counting env whose first step raises :class:`StubbornError`."""

    def step(self, action):
        raise StubbornError(7, "stuck")


class SlowCloseEnv(CountingEnv):
    """A counting env whose ``close()`` takes ``close_s`` seconds (a video written at close); with
    ``fail_at`` it raises on that step."""

    def __init__(self, close_s: float = 12.0, fail_at: int | None = None, **kwargs):
        super().__init__(length=5, **kwargs)
        self.close_s, self.fail_at = close_s, fail_at

    def step(self, action):
        if self.fail_at is not None and self.steps_called + 1 >= self.fail_at:
            raise ValueError(f"boom at step {self.steps_called + 1}")
        return super().step(action)

    def close(self):
        import time

        time.sleep(self.close_s)


class SlowToTerminateEnv(CountingEnv):
    """A counting env whose process takes ``exit_s`` seconds to exit on SIGTERM (a simulator that handles the
    signal to tear down first). Built in the main thread of the process it runs in."""

    def __init__(self, exit_s: float = 1.5, **kwargs):
        import signal

        super().__init__(length=5, **kwargs)

        def tear_down(signum, frame):
            import time

            time.sleep(exit_s)
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, tear_down)


def counting(length=None, max_length=9, truncate=False, render_mode=None):
    """A picklable factory for :class:`CountingEnv` (use with functools.partial)."""
    return CountingEnv(length=length, max_length=max_length, truncate=truncate, render_mode=render_mode)


class StartActionEnv(gym.Env):
    """``Discrete(3, start=-1)`` actions, checked on every step; the reward is the action received."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        return np.zeros(1, np.float32), float(action), False, False, {}


class NarrowActionEnv(gym.Env):
    """An action space of a non-default dtype (``Discrete(3, dtype=int8)``, ``MultiDiscrete([3, 4],
    dtype=int32)``, ``MultiBinary(2)`` (int8) or ``Box(-3, 3, (2,), int16)``), checked with ``contains`` on
    every step, as CartPole does (an int64 action fails it), and for the action's own dtype, which
    ``MultiBinary.contains`` does not check."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def __init__(self, kind: str = "discrete"):
        if kind == "discrete":
            self.action_space = gym.spaces.Discrete(3, start=-1, dtype=np.int8)
        elif kind == "multidiscrete":
            self.action_space = gym.spaces.MultiDiscrete([3, 4], start=[0, -2], dtype=np.int32)
        elif kind == "multibinary":
            self.action_space = gym.spaces.MultiBinary(2)
        else:
            self.action_space = gym.spaces.Box(-3, 3, (2,), np.int16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), (action, getattr(action, "dtype", type(action)))
        assert action.dtype == self.action_space.dtype, (action, action.dtype)
        obs = np.zeros(2, np.float32)
        obs[: np.size(action)] = action
        return obs, 0.0, False, False, {}


class DiscreteEchoEnv(gym.Env):
    """``Discrete(n, start)`` actions, checked on every step; the observation is the action received (float64,
    exact)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)

    def __init__(self, n: int = 5000, start: int = 3):
        self.action_space = gym.spaces.Discrete(n, start=start)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        return np.array([action], np.float64), 0.0, False, False, {}


CLOSED_ENVS: list[int] = []  # ids of ClosingEnv instances closed in this process


class ClosingEnv(CountingEnv):
    """A counting env that records its ``close()`` in :data:`CLOSED_ENVS` (this process only)."""

    def close(self):
        CLOSED_ENVS.append(id(self))
        super().close()


class CrashingCloseEnv(CountingEnv):
    """A counting env whose ``close()`` ends its process at once (``os._exit(3)``): a worker dying while closing."""

    def close(self):
        import os

        os._exit(3)


class BadCloseEnv(CountingEnv):
    """A counting env whose ``close()`` raises ``OSError("disk gone")``."""

    def close(self):
        raise OSError("disk gone")


class InterruptedCloseEnv(CountingEnv):
    """A counting env whose ``close()`` raises ``KeyboardInterrupt`` (a Ctrl-C while it flushes a video, say),
    or ``SystemExit`` with ``exit_code``."""

    def __init__(self, exit_code: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.exit_code = exit_code

    def close(self):
        if self.exit_code is not None:
            raise SystemExit(self.exit_code)
        raise KeyboardInterrupt


class ChildSignalEnv(CountingEnv):
    """Starts a Python child at construction that reports its SIGINT disposition (``child_sigint``): an env's
    simulator or server, which it may stop with SIGINT."""

    def __init__(self, *args, **kwargs):
        import subprocess
        import sys

        super().__init__(*args, **kwargs)
        self.child_sigint = subprocess.run(
            [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()

    def read_through_a_signal(self, delay=0.3) -> int:
        """A blocking C ``read()`` of 3 bytes that arrive ``delay`` s later, as a simulator's client waits: the
        bytes read (-1 when a signal meanwhile broke the call)."""
        import ctypes
        import os
        import threading

        r, w = os.pipe()
        writer = threading.Timer(delay, os.write, (w, b"abc"))
        writer.start()
        try:
            return ctypes.CDLL(None).read(r, ctypes.create_string_buffer(3), 3)
        finally:
            writer.join()
            os.close(r)
            os.close(w)

    def fork_and_interrupt(self) -> str:
        """Fork a Python helper (no exec), stop it with SIGINT: how it ended."""
        import os
        import signal
        import time

        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(5)
            except KeyboardInterrupt:
                os._exit(0)
            os._exit(1)
        time.sleep(0.2)
        os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
        return "KeyboardInterrupt" if os.waitstatus_to_exitcode(status) == 0 else f"status {status}"


class SlowExitEnv(CountingEnv):
    """Closes at once, but leaves its process a non-daemon thread that keeps it from exiting for 1 s; with
    ``fail_close``, its close() then raises."""

    def __init__(self, *args, fail_close=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_close = fail_close

    def close(self):
        import threading
        import time

        threading.Thread(target=time.sleep, args=(1.0,)).start()
        super().close()
        if self.fail_close:
            raise RuntimeError("the env's video was not written")


class GcStateEnv(CountingEnv):
    """Reports its process's garbage collector: whether objects are frozen, and whether this env is not."""

    def gc_state(self):
        import gc

        return gc.get_freeze_count() > 0, any(obj is self for obj in gc.get_objects())


class SlowFirstRowEnv(CountingEnv):
    """A counting env that knows its row: env 0's ``who()`` and ``slow_row`` take ``delay`` s, the others' none,
    so that the worker holding env 0 replies last. Both return the row."""

    def __init__(self, row: int = 0, delay: float = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.row, self.delay = row, delay

    def who(self) -> int:
        import time

        time.sleep(self.delay if self.row == 0 else 0.0)
        return self.row

    @property
    def slow_row(self) -> int:
        return self.who()


class LaterExitEnv(CountingEnv):
    """A counting env that can make its process exit with code 0 (as a simulator quitting cleanly) while the
    process is idle: ``exit_once(path)`` returns at once and exits the process when the file ``path`` appears."""

    def exit_once(self, path):
        import os
        import threading
        import time

        def wait_then_exit():
            while not os.path.exists(path):
                time.sleep(0.005)
            os._exit(0)

        threading.Thread(target=wait_then_exit, daemon=True).start()


class CloseRaisingEnv(CountingEnv):
    """A counting env whose ``close()`` raises ``OSError("disk gone")``."""

    def close(self):
        raise OSError("disk gone")


class StepAttributeErrorEnv(CountingEnv):
    """A counting env whose ``step`` raises ``AttributeError`` (a bug inside the env, not a missing pool attribute)."""

    def step(self, action):
        raise AttributeError("'NoneType' object has no attribute 'sim'")


def raising_factory(message="cannot build"):
    raise RuntimeError(message)


# -- worker processes --------------------------------------------------------------------------------------------
def pid_exists(pid: int) -> bool:
    """``pid`` is still in the process table: running, or a zombie its parent has not waited for."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_reaped(pids) -> None:
    """Every pid is gone from the process table: its process exited and was waited for (a process pool's close()
    reaps its workers before it returns). A zombie still answers ``os.kill(pid, 0)``, and fails this."""
    left = {}
    for pid in pids:
        if pid_exists(pid):
            try:
                with open(f"/proc/{pid}/status") as f:
                    left[pid] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("State:")), "?")
            except OSError:
                continue  # gone meanwhile
    assert not left, f"worker processes not reaped (pid: state): {left}"


def end_leftovers(processes) -> None:
    """Cleanup for a test: terminate the workers a failed or cut-short close() left running. A ``Process`` that
    close() released (``Process.close()``, a ValueError on any use now) was reaped first: nothing to do."""
    for proc in processes:
        try:
            alive = proc.is_alive()
        except ValueError:  # closed: already reaped
            continue
        if alive:
            proc.terminate()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


class HumanRenderOnly(gym.Env):
    """Declares render_modes without "rgb_array" (gymnasium's env checker fails at the first frame)."""

    metadata = {"render_modes": ["human"]}
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return None  # "human" rendering

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class MarkerClosingEnv(CountingEnv):
    """A counting env whose ``close()`` writes a file into ``marker_dir`` (seen from any process); each step
    after the first (the construction probe's) takes ``step_s`` seconds."""

    def __init__(self, marker_dir: str, step_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.marker_dir, self.step_s = marker_dir, step_s

    def step(self, action):
        if self.step_s and self.steps_called:
            import time

            time.sleep(self.step_s)
        return super().step(action)

    def close(self):
        with open(os.path.join(self.marker_dir, f"closed-{os.getpid()}-{id(self)}"), "w"):
            pass
        super().close()


PARENT_MARK = None  # set by a test in the pool's process: a forked worker inherits it, a spawned one does not


def marked_counting(length=3):
    env = CountingEnv(length=length)
    env.inherited_mark, env.pid = PARENT_MARK, os.getpid()
    return env


def slow_marker_factory(marker_dir: str, make_s: float, made_dir: str | None = None):
    """A factory that takes ``make_s`` seconds to make a :class:`MarkerClosingEnv`; then, with ``made_dir``, it
    writes a file there saying so."""
    import time

    time.sleep(make_s)
    env = MarkerClosingEnv(marker_dir, length=50)
    if made_dir is not None:
        with open(os.path.join(made_dir, f"made-{os.getpid()}-{id(env)}"), "w"):
            pass
    return env
