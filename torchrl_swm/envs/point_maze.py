"""PointMaze: a small goal-conditioned point-mass maze, pure numpy.

A point mass moves through a grid maze towards a target. It is meant for
world-model research loops that must run anywhere (CI, laptops, no MuJoCo, no
pygame): it renders its own ``rgb_array`` frames with numpy, reports a goal
image and ``is_success`` in ``info``, and can start from any state through reset
options, which is what dataset-driven evaluation needs.

Coordinates are in cell units: cell ``(row, col)`` covers ``x in [col, col+1)``
and ``y in [row, row+1)``; ``y`` grows downwards, like image rows.

Spaces:
    * observation: ``Dict(state=Box(4,), target=Box(2,))``; ``state`` is
      ``[x, y, vx, vy]`` and ``target`` the goal position ``[x, y]``.
    * action: ``Box(-1, 1, (2,))``, a force on the point mass.

Dynamics, per step: ``v <- damping * v + force_scale * a`` (clipped to
``max_speed``), then the point moves by ``v``, one axis at a time; an axis move
that would bring the agent (a square of half-width ``agent_radius``) into a wall
is cancelled and that velocity component is zeroed.

Reward: ``-distance`` to the target (``reward_type="dense"``) or ``1.0`` on
success (``"sparse"``). Success: distance below ``goal_radius``. The episode
terminates on success (``terminate_on_success=True``); the registered ids add a
``TimeLimit``.

``info``: ``is_success`` (bool), ``distance`` (float) and, when rendering
(``render_mode="rgb_array"``) with ``goal_image=True``, ``goal_pixels``: the
frame the env would render with the agent resting on the target, ``(S, S, 3)``
uint8 with ``S = render_size``.

Reset options (all optional): ``state`` (``[x, y, vx, vy]`` or ``[x, y]``) and
``target`` (``[x, y]``) start the episode from that state / with that target;
both are validated before anything changes (numbers, inside the maze, and the agent's square of half-width
``agent_radius`` clear of the walls: a position in a free cell but within ``agent_radius`` of a wall is refused); a
refused reset leaves the env as it was. With ``target`` alone the start is
drawn as without options, in another cell than the target's. The state hook used by
:meth:`torchrl_swm.World.evaluate` with ``dataset=`` is
:meth:`PointMazeEnv.reset_options_from_dataset`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np

from ..errors import EnvError, check_bool, check_int, check_number, describe

__all__ = ["PointMazeEnv", "PointMazeExpert", "LAYOUTS", "expert_actions", "expert_policy"]

#: Built-in maze layouts: ``#`` is a wall, ``.`` a free cell.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "open": (
        "#####",
        "#...#",
        "#...#",
        "#...#",
        "#####",
    ),
    "u": (
        "#####",
        "#...#",
        "###.#",
        "#...#",
        "#####",
    ),
    "medium": (
        "#######",
        "#..#..#",
        "#..#..#",
        "#.....#",
        "###.#.#",
        "#.....#",
        "#######",
    ),
}

_FLOOR = np.array([232, 232, 224], dtype=np.uint8)
_WALL = np.array([60, 64, 80], dtype=np.uint8)
_AGENT = np.array([220, 50, 47], dtype=np.uint8)
_TARGET = np.array([60, 170, 80], dtype=np.uint8)


_LAYOUT_FORM = (f"a layout name (one of {sorted(LAYOUTS)}) or a non-empty list of equal-length strings of '#' "
                "and '.'")


def _layout_rows(layout) -> list[str]:
    """The rows of ``layout`` (a name of :data:`LAYOUTS` or a sequence of strings), refusing any other form with an
    error that names the expected form and what was received."""
    if isinstance(layout, str):
        if layout not in LAYOUTS:
            raise ValueError(f"PointMaze: layout: expected {_LAYOUT_FORM}, got {layout!r} (no such layout name)")
        return list(LAYOUTS[layout])
    if not isinstance(layout, (Sequence, np.ndarray)) or isinstance(layout, (bytes, bytearray)) or (
            isinstance(layout, np.ndarray) and layout.ndim != 1):
        raise TypeError(f"PointMaze: layout: expected {_LAYOUT_FORM}, got {describe(layout)}")
    kind = type(layout).__name__
    for i, row in enumerate(layout):
        if not isinstance(row, str):  # a grid of characters, a bytes row...: one string per row
            raise TypeError(f"PointMaze: layout: expected {_LAYOUT_FORM}, got a {kind} whose row {i} is "
                            f"{describe(row)}")
    rows = [str(r) for r in layout]
    if not rows:
        raise ValueError(f"PointMaze: layout: expected {_LAYOUT_FORM}, got an empty {kind}")
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"PointMaze: layout: expected {_LAYOUT_FORM}, got rows of lengths {[len(r) for r in rows]}")
    return rows


def _as_numbers(value, what: str, form: str) -> np.ndarray:
    """``value`` as a flat float64 array, refusing what is not numbers (``None``, a string, a dict...) with a
    ``TypeError`` naming PointMaze, the option and what was received: numpy's own error names neither, and ``None``
    would pass as ``nan``, a string of digits as a number."""
    array = None
    if value is not None and not isinstance(value, (str, bytes, Mapping)):
        try:
            array = np.asarray(value)
            array = array.astype(np.float64) if array.dtype.kind in "iufO" else None
        except (TypeError, ValueError):  # a dict inside a list, a ragged list...
            array = None
    if array is None:
        raise TypeError(f"PointMaze: {what} must be {form}, got {describe(value)}")
    return array.reshape(-1)


def _parse_layout(layout) -> np.ndarray:
    rows = _layout_rows(layout)
    walls = np.array([[ch == "#" for ch in r] for r in rows], dtype=bool)
    bad = {ch for r in rows for ch in r} - {"#", "."}
    if bad:
        raise ValueError(f"PointMaze: layout characters must be '#' or '.', got {sorted(bad)}")
    if (~walls).sum() < 2:
        raise ValueError("PointMaze: a layout needs at least two free cells")
    if not (walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()):
        raise ValueError("PointMaze: the layout must be enclosed by walls ('#' on every border cell)")
    free = [tuple(int(i) for i in cell) for cell in np.argwhere(~walls)]
    reached = _bfs_parents(walls, free[0])
    cut_off = [cell for cell in free if cell not in reached]
    if cut_off:  # episodes start and end in random free cells: some would never reach their target
        raise ValueError(
            f"PointMaze: every free cell must be reachable from every other (through side-by-side free cells), but "
            f"cells {cut_off[:5]}{' ...' if len(cut_off) > 5 else ''} (row, column) are cut off from {free[0]}"
        )
    return walls


class PointMazeEnv(gym.Env):
    """A goal-conditioned point mass in a grid maze (see the module docstring).

    Args:
        layout: a name from :data:`LAYOUTS` (``"open"``, ``"u"``, ``"medium"``)
            or a non-empty list of equal-length strings of ``#`` (wall) and ``.`` (free), one per row.
        render_mode: ``None`` or ``"rgb_array"``.
        render_size: side of the square rendered frame, in pixels.
        goal_image: add ``info["goal_pixels"]`` when rendering.
        show_target: draw the target as a green disk in rendered frames. Off
            by default, so that frames (and goal images) only show the agent.
        reward_type: ``"dense"`` (``-distance``) or ``"sparse"`` (``1.0`` on success).
        terminate_on_success: end the episode when the target is reached.
        goal_radius: success distance, in cells (> 0).
        agent_radius: half-width of the agent for collisions, in cells (in ``(0, 0.45]``).
        damping, force_scale, max_speed: the dynamics (see the module docstring); ``damping`` in
            ``[0, 1]``, ``max_speed`` at most 1 (one cell per step: a faster agent could pass a wall).

    Example:
        >>> import gymnasium as gym, numpy as np
        >>> import torchrl_swm.envs      # registers torchrl_swm/PointMaze-v0 (the U maze), -Open-v0, -Medium-v0
        >>> env = gym.make("torchrl_swm/PointMaze-v0", render_mode="rgb_array")
        >>> obs, info = env.reset(seed=0, options={"state": [1.5, 1.5], "target": [1.5, 3.5]})  # else drawn
        >>> obs
        {'state': array([1.5, 1.5, 0. , 0. ], dtype=float32), 'target': array([1.5, 3.5], dtype=float32)}
        >>> sorted(info), info["distance"], env.render().shape     # goal_pixels: the goal image
        (['distance', 'goal_pixels', 'is_success'], 2.0, (64, 64, 3))
        >>> obs, reward, terminated, truncated, info = env.step(np.array([1.0, 0.0], np.float32))  # push right
        >>> obs["state"], round(reward, 3)                          # [x, y, vx, vy]; reward -distance
        (array([1.55, 1.5 , 0.05, 0.  ], dtype=float32), -2.001)
        >>> env.close()
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    #: Observation keys that :meth:`reset_options_from_dataset` restores exactly;
    #: ``World.evaluate(dataset=...)`` checks them after every reset.
    dataset_state_keys = ("state",)

    def __init__(
        self,
        layout: str | Sequence[str] = "u",
        render_mode: str | None = None,
        render_size: int = 64,
        goal_image: bool = True,
        show_target: bool = False,
        reward_type: str = "dense",
        terminate_on_success: bool = True,
        goal_radius: float = 0.2,
        agent_radius: float = 0.15,
        damping: float = 0.7,
        force_scale: float = 0.05,
        max_speed: float = 0.15,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"PointMaze: render_mode must be None or 'rgb_array', got {render_mode!r}")
        if reward_type not in ("dense", "sparse"):
            raise ValueError(f"PointMaze: reward_type must be 'dense' or 'sparse', got {reward_type!r}")
        render_size = check_int(render_size, "PointMaze: render_size", minimum=8)  # 63.9 is no size
        # (name, value, low, high, whether low itself is allowed): a radius or speed out of range would make the
        # maze unsolvable, the agent frozen, its starts unplaceable (a cell is 1 wide) or, faster than one cell
        # per step, able to pass through a wall (a move is checked where it ends)
        for name, value, low, high, closed in (
            ("goal_radius", goal_radius, 0.0, 1e6, False),
            ("agent_radius", agent_radius, 0.0, 0.45, False),
            ("damping", damping, 0.0, 1.0, True),
            ("force_scale", force_scale, 0.0, 1e6, False),
            ("max_speed", max_speed, 0.0, 1.0, False),
        ):
            check_number(value, f"PointMaze: {name}")
            if not ((low <= value if closed else low < value) and value <= high):
                bounds = f"{'[' if closed else '('}{low}, {high:g}]"
                raise ValueError(f"PointMaze: {name} must be in {bounds}, got {value!r}")
        self.walls = _parse_layout(layout)
        self.layout = layout if isinstance(layout, str) else tuple(layout)
        self.render_mode = render_mode
        self.render_size = int(render_size)
        self.goal_image = check_bool(goal_image, "PointMaze: goal_image")  # "false" from a config is truthy
        self.show_target = check_bool(show_target, "PointMaze: show_target")
        self.reward_type = reward_type
        self.terminate_on_success = check_bool(terminate_on_success, "PointMaze: terminate_on_success")
        self.goal_radius = float(goal_radius)
        self.agent_radius = float(agent_radius)
        self.damping, self.force_scale, self.max_speed = float(damping), float(force_scale), float(max_speed)

        rows, cols = self.walls.shape
        self.free_cells = np.argwhere(~self.walls)  # (K, 2) of (row, col)
        high = np.array([cols, rows, self.max_speed, self.max_speed], dtype=np.float32)
        low = np.array([0, 0, -self.max_speed, -self.max_speed], dtype=np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "state": gym.spaces.Box(low, high, dtype=np.float32),
                "target": gym.spaces.Box(np.zeros(2, np.float32), np.array([cols, rows], np.float32), dtype=np.float32),
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

        self._pos = np.zeros(2, dtype=np.float64)
        self._vel = np.zeros(2, dtype=np.float64)
        self._target = np.zeros(2, dtype=np.float64)
        self._goal_frame: np.ndarray | None = None
        self._build_canvas()

    # -- geometry ------------------------------------------------------------------------
    def _blocked(self, pos: np.ndarray) -> bool:
        """Whether the agent's square at ``pos`` overlaps a wall or leaves the maze."""
        r = self.agent_radius
        rows, cols = self.walls.shape
        x0, x1, y0, y1 = pos[0] - r, pos[0] + r, pos[1] - r, pos[1] + r
        if x0 < 0 or y0 < 0 or x1 >= cols or y1 >= rows:
            return True
        c0, c1 = int(np.floor(x0)), int(np.floor(x1))
        r0, r1 = int(np.floor(y0)), int(np.floor(y1))
        return bool(self.walls[r0 : r1 + 1, c0 : c1 + 1].any())

    def _sample_position(self, cell: np.ndarray) -> np.ndarray:
        margin = self.agent_radius + 0.05
        offset = self.np_random.uniform(margin, 1.0 - margin, size=2)
        return np.array([cell[1] + offset[0], cell[0] + offset[1]], dtype=np.float64)

    def _check_position(self, pos, what: str) -> np.ndarray:
        pos = _as_numbers(pos, what, "2 finite numbers [x, y]")
        if pos.shape != (2,) or not np.isfinite(pos).all():
            raise ValueError(f"PointMaze: {what} must be 2 finite numbers [x, y], got {pos!r}")
        if self._blocked(pos):
            rows, cols = self.walls.shape
            if not (0 <= pos[0] < cols and 0 <= pos[1] < rows):
                why = f"is outside the maze (x in [0, {cols}), y in [0, {rows}))"
            elif self.walls[self.cell_of(pos)]:
                why = f"is inside a wall (cell {self.cell_of(pos)} (row, column))"
            else:  # in a free cell, but the agent's square there overlaps a wall
                why = (f"is within agent_radius={self.agent_radius:g} of a wall (the agent, a square of half-width "
                       f"agent_radius around its position, would overlap the wall)")
            raise ValueError(f"PointMaze: {what} {pos.tolist()} {why}")
        return pos

    @staticmethod
    def cell_of(pos) -> tuple[int, int]:
        """The ``(row, col)`` cell containing position ``[x, y]``."""
        return int(np.floor(pos[1])), int(np.floor(pos[0]))

    # -- state hooks ---------------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        """``[x, y, vx, vy]`` as float32 (the ``"state"`` observation)."""
        return np.concatenate([self._pos, self._vel]).astype(np.float32)

    def _check_state(self, state) -> tuple[np.ndarray, np.ndarray]:
        """The position and velocity of ``state`` (``[x, y, vx, vy]`` or ``[x, y]``), validated; changes nothing."""
        state = _as_numbers(state, "state", "[x, y] or [x, y, vx, vy]")
        if state.shape not in ((2,), (4,)):
            raise ValueError(f"PointMaze: state must be [x, y] or [x, y, vx, vy], got shape {state.shape}")
        if not np.isfinite(state[2:]).all():
            raise ValueError(f"PointMaze: state velocity must be 2 finite numbers [vx, vy], got {state[2:]!r}")
        pos = self._check_position(state[:2], "state position")
        vel = np.clip(state[2:], -self.max_speed, self.max_speed) if state.shape == (4,) else np.zeros(2)
        return pos, vel

    def set_state(self, state, target=None) -> None:
        """Place the agent at ``state`` (``[x, y, vx, vy]`` or ``[x, y]``) and
        optionally move the target. Validated (both before either is applied): raises ``ValueError`` on walls."""
        pos, vel = self._check_state(state)
        target = None if target is None else self._check_position(target, "target")
        self._pos, self._vel = pos, vel
        if target is not None:
            self._target = target
            self._goal_frame = None

    def reset_options_from_dataset(self, start: Mapping, goal: Mapping) -> dict:
        """Reset options that start an episode from dataset step ``start`` with
        the position of dataset step ``goal`` as the target.

        ``start`` and ``goal`` map observation keys (``"state"``, ...) to numpy
        arrays, one dataset step each. This is the hook
        :meth:`torchrl_swm.World.evaluate` calls for ``dataset=`` evaluation.
        """
        for name, step in (("start", start), ("goal", goal)):
            if "state" not in step:
                raise KeyError(
                    f"PointMaze.reset_options_from_dataset: the dataset's {name} step has no 'state' observation "
                    f"(keys: {sorted(map(str, step))}); evaluate from a dataset collected on a PointMaze env"
                )
        return {"state": np.asarray(start["state"]).copy(), "target": np.asarray(goal["state"])[:2].copy()}

    # -- gymnasium API --------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        options = dict(options or {})
        unknown = set(options) - {"state", "target"}
        if unknown:
            raise ValueError(f"PointMaze.reset: unknown options {sorted(unknown)}; expected 'state' and/or 'target'")
        state_given, target_given = "state" in options, "target" in options
        # every option is validated before anything changes (the seed included): a refused reset leaves the env as it
        # was, not at the given state with the old target. The state first: a bad state is named before the target.
        state = self._check_state(options["state"]) if state_given else None
        target = self._check_position(options["target"], "target") if target_given else None
        super().reset(seed=seed)
        k = len(self.free_cells)
        start_cell, target_cell = self.np_random.choice(k, size=2, replace=False)
        # One of the two given: the other is drawn away from it, in another cell, as when both are drawn: if the
        # drawn cell is the given one's, it takes the other drawn cell (distinct from it), uniform over the rest.
        if target_given and not state_given and (self.free_cells[start_cell] == self.cell_of(target)).all():
            start_cell = target_cell
        elif state_given and not target_given and (self.free_cells[target_cell] == self.cell_of(state[0])).all():
            target_cell = start_cell
        # both positions are drawn whatever is given: a seed's draws stay the same with and without options
        start = self._sample_position(self.free_cells[start_cell])
        drawn_target = self._sample_position(self.free_cells[target_cell])
        self._pos, self._vel = state if state_given else (start, np.zeros(2))
        self._target = drawn_target if target is None else target
        self._goal_frame = None
        return self._obs(), self._info(self._distance())

    def step(self, action):
        action = np.asarray(action, dtype=np.float64).reshape(2)
        if not np.isfinite(action).all():  # before clipping, which would pass an inf as +-1
            raise ValueError(f"PointMaze.step: action must be finite, got {action!r}")
        action = np.clip(action, -1.0, 1.0)
        vel = np.clip(self.damping * self._vel + self.force_scale * action, -self.max_speed, self.max_speed)
        pos = self._pos.copy()
        for axis in (0, 1):
            moved = pos.copy()
            moved[axis] += vel[axis]
            if self._blocked(moved):
                vel[axis] = 0.0
            else:
                pos = moved
        self._pos, self._vel = pos, vel
        distance = self._distance()
        success = distance < self.goal_radius
        reward = float(success) if self.reward_type == "sparse" else -distance
        terminated = bool(success and self.terminate_on_success)
        return self._obs(), reward, terminated, False, self._info(distance)

    def _distance(self) -> float:
        return float(np.linalg.norm(self._pos - self._target))

    def _obs(self) -> dict:
        return {"state": self.get_state(), "target": self._target.astype(np.float32)}

    def _info(self, distance: float) -> dict:
        info = {"is_success": bool(distance < self.goal_radius), "distance": distance}
        if self.render_mode == "rgb_array" and self.goal_image:
            if self._goal_frame is None:
                self._goal_frame = self._draw(self._target)
            info["goal_pixels"] = self._goal_frame.copy()  # fresh data on every call
        return info

    # -- rendering -----------------------------------------------------------------------------
    def _build_canvas(self) -> None:
        size = self.render_size
        rows, cols = self.walls.shape
        self._scale = size / max(rows, cols)  # pixels per cell
        centers = (np.arange(size) + 0.5) / self._scale  # pixel centres in cell units
        self._px_x = centers[None, :]
        self._px_y = centers[:, None]
        r = np.clip(np.floor(self._px_y).astype(int), 0, rows - 1)[:, 0]
        c = np.clip(np.floor(self._px_x).astype(int), 0, cols - 1)[0]
        inside = (centers[:, None] < rows) & (centers[None, :] < cols)
        wall = self.walls[r][:, c] | ~inside
        canvas = np.empty((size, size, 3), dtype=np.uint8)
        canvas[:] = _FLOOR
        canvas[wall] = _WALL
        self._canvas = canvas
        self._disk = max(0.25, 1.0 / self._scale)  # drawn radius: a quarter cell, at least one pixel

    def _paint_disk(self, frame: np.ndarray, pos: np.ndarray, radius: float, color: np.ndarray) -> None:
        lo = max(int((pos[1] - radius) * self._scale) - 1, 0), max(int((pos[0] - radius) * self._scale) - 1, 0)
        hi = int((pos[1] + radius) * self._scale) + 2, int((pos[0] + radius) * self._scale) + 2
        ys, xs = self._px_y[lo[0] : hi[0]], self._px_x[:, lo[1] : hi[1]]
        inside = (xs - pos[0]) ** 2 + (ys - pos[1]) ** 2 <= radius**2
        frame[lo[0] : hi[0], lo[1] : hi[1]][inside] = color

    def _draw(self, agent_pos: np.ndarray) -> np.ndarray:
        frame = self._canvas.copy()
        if self.show_target:
            self._paint_disk(frame, self._target, self.goal_radius, _TARGET)
        self._paint_disk(frame, agent_pos, self._disk, _AGENT)
        return frame

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self._draw(self._pos)

    def goal_frame(self) -> np.ndarray:
        """The goal image: the frame rendered with the agent on the target."""
        return self._draw(self._target)


# -- a scripted expert: shortest path over cells, then a PD controller ----------------------------
def _bfs_parents(walls: np.ndarray, goal: tuple[int, int]) -> dict:
    """Breadth-first search from ``goal`` over free cells (4-connected): ``{cell: the next cell towards goal}``
    for every cell that reaches it."""
    parents = {goal: goal}
    queue = deque([goal])
    while queue:
        cur = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (cur[0] + dr, cur[1] + dc)
            if not walls[nxt] and nxt not in parents:
                parents[nxt] = cur
                queue.append(nxt)
    return parents


def _next_waypoints(walls: np.ndarray, starts: np.ndarray, goals: np.ndarray) -> np.ndarray:
    """For each (start cell, goal cell), the centre of the next cell on a shortest path."""
    out = np.empty((len(starts), 2), dtype=np.float64)
    cache: dict[tuple[int, int], dict] = {}
    for i, (s, g) in enumerate(zip(map(tuple, starts), map(tuple, goals))):
        parents = cache.get(g)
        if parents is None:
            parents = cache[g] = _bfs_parents(walls, g)
        step = parents.get(s, s)
        out[i] = (step[1] + 0.5, step[0] + 0.5)
    return out


def expert_actions(walls: np.ndarray, state: np.ndarray, target: np.ndarray, gain: float = 4.0) -> np.ndarray:
    """Expert actions for a batch: ``state`` (B, 4), ``target`` (B, 2) → (B, 2) in [-1, 1]."""
    state = np.asarray(state, dtype=np.float64).reshape(-1, 4)
    target = np.asarray(target, dtype=np.float64).reshape(-1, 2)
    pos, vel = state[:, :2], state[:, 2:]
    cells = np.floor(pos[:, ::-1]).astype(int)
    goal_cells = np.floor(target[:, ::-1]).astype(int)
    same = (cells == goal_cells).all(1)
    waypoint = np.where(same[:, None], target, _next_waypoints(walls, cells, goal_cells))
    return np.clip(gain * (waypoint - pos) - 2.0 * gain * vel, -1.0, 1.0)


class PointMazeExpert:
    """A scripted TorchRL policy for :class:`PointMazeEnv`: ``td -> td`` writing ``"action"``.

    It reads ``"state"`` and ``"target"`` (any batch shape), follows a shortest
    path over the maze cells, and adds Gaussian noise of scale ``noise`` so that
    collected data is diverse. The noise comes from torch's global generator,
    which :class:`torchrl_swm.World` forks and seeds for each run, so runs with
    the same seed are identical.

    Example:
        >>> from torchrl_swm import World
        >>> from torchrl_swm.envs import PointMazeExpert
        >>> world = World("torchrl_swm/PointMaze-v0", num_envs=4, policy=PointMazeExpert("u"))
        >>> world.evaluate(8, seed=0, progress=False)["success_rate"]   # a random policy's: 0.0
        1.0
        >>> world.set_policy(PointMazeExpert("u", noise=0.5))           # noisier, for a more diverse dataset
        >>> world.collect("data/expert", episodes=8, seed=0, progress=False).num_episodes
        8
        >>> world.close()
    """

    def __init__(self, layout: str | Sequence[str] = "u", noise: float = 0.0):
        self.layout = layout
        self.walls = _parse_layout(layout)
        self.noise = float(noise)

    def __call__(self, td):
        import torch

        state = td.get("state")
        action = expert_actions(self.walls, state.detach().cpu().numpy(), td.get("target").detach().cpu().numpy())
        # any batch shape, [] included: expert_actions works on a flat batch
        action = torch.as_tensor(action, dtype=torch.float32).reshape(*state.shape[:-1], 2)
        if self.noise:
            action = (action + self.noise * torch.randn(action.shape)).clamp_(-1.0, 1.0)
        td.set("action", action.to(state.device))
        return td

    def __repr__(self) -> str:
        return f"PointMazeExpert(layout={self.layout!r}, noise={self.noise})"


def expert_policy(env, noise: float = 0.0) -> PointMazeExpert:
    """A :class:`PointMazeExpert` for the maze of ``env`` (an EnvPool of PointMaze envs,
    possibly transformed). Usable as ``torchrl-swm eval ... --policy torchrl_swm.envs:expert_policy``."""
    from torchrl.envs import TransformedEnv

    base = env
    while isinstance(base, TransformedEnv):
        base = base.base_env
    try:
        # through the pool's call: a process pool's envs live in its workers
        unwrapped = base._query_first("get_wrapper_attr", "unwrapped")
    except (AttributeError, IndexError, EnvError) as err:
        raise TypeError(f"expert_policy: expected an EnvPool of PointMaze envs, got {type(env).__name__}") from err
    if not isinstance(unwrapped, PointMazeEnv):
        raise TypeError(f"expert_policy: the env is {type(unwrapped).__name__}, not PointMazeEnv")
    return PointMazeExpert(unwrapped.layout, noise=noise)
