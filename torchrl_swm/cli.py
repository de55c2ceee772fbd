"""The ``torchrl-swm`` command: collect datasets, evaluate policies, inspect datasets.

::

    torchrl-swm collect torchrl_swm/PointMaze-v0 --episodes 50 --out data/maze --image-shape 64 64 \\
        --policy torchrl_swm.envs:expert_policy
    torchrl-swm eval CartPole-v1 --episodes 100 [--policy module:attr] [--mode wait] [--json out.json]
    torchrl-swm eval torchrl_swm/PointMaze-v0 --dataset data/maze --goal-offset 5 --eval-budget 20 \\
        --policy torchrl_swm.envs:expert_policy
    torchrl-swm info data/maze

Subcommands live in a registry: :func:`register_command` adds one (its name,
help, a function that adds its arguments to an ``argparse`` parser, and a
function that runs it and returns an exit code). Modules listed in
:data:`COMMAND_MODULES` are imported before parsing, so a command defined
elsewhere (e.g. ``bench``) only needs its module listed there.

Policies (``--policy module:attr``): ``attr`` is a TorchRL policy (a
``TensorDictModule`` or a callable ``td -> td`` writing ``"action"``), or a
factory: a function or class whose first parameter is named ``env``, called
with the World's env and returning a policy. Any other class is refused (a
class is not a policy: point at an instance or a factory). Without
``--policy`` actions are uniformly random.

Contradictory flags are usage errors: ``--max-steps``/``--start-step`` with and
without ``--dataset`` respectively, ``--episodes`` beyond the dataset's
episodes. Output paths that cannot be written (``--out``, ``--video``,
``--json``, ``--plot``) are found before any work.

Exit codes: 0 on success, 2 for usage errors (unknown env id, bad paths, bad
arguments), 1 for other errors (one line; ``--traceback`` shows the whole
traceback), 130 when interrupted, 141 when stdout's reader has gone (``| head``;
a ``--json`` file is written first).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import counted, error_text  # (the package's __init__ imports errors already)

__all__ = ["main", "register_command", "COMMANDS", "COMMAND_MODULES", "CLIError"]

#: Modules imported before parsing, so that the commands they register exist.
COMMAND_MODULES: list[str] = ["torchrl_swm.commands"]


class CLIError(Exception):
    """A usage error: printed as ``torchrl-swm: error: ...`` with exit code 2."""


@dataclass
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    passthrough: bool = False  # its arguments, --help included, go to its own parser (args.passthrough_args)


COMMANDS: dict[str, Command] = {}


def register_command(name: str, *, help: str, configure: Callable[[argparse.ArgumentParser], None],
                     passthrough: bool = False):
    """Decorator registering ``run(args) -> exit code`` as the subcommand ``name``.

    Example::

        def _configure(p):
            p.add_argument("--sizes", default="8,64")

        @register_command("bench", help="measure throughput", configure=_configure)
        def _bench(args):
            ...
            return 0
    """

    def decorator(run: Callable[[argparse.Namespace], int]):
        if name in COMMANDS:
            raise ValueError(f"torchrl-swm: command {name!r} is already registered")
        COMMANDS[name] = Command(name, help, configure, run, passthrough)
        return run

    return decorator


# -- shared helpers -----------------------------------------------------------------------------------
def _check_env_id(env_id: str) -> None:
    import gymnasium as gym

    from .envs import spec  # knows the torchrl_swm/* ids and imports a module:Env-v0 id's module

    try:
        spec(env_id)
    except gym.error.Error as err:
        raise CLIError(f"unknown environment id {env_id!r}: {err}") from None
    except ModuleNotFoundError as err:
        raise CLIError(f"environment id {env_id!r}: cannot import its module ({err})") from None


def _load_object(spec: str):
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or module_name.startswith(".") or not attr:
        raise CLIError(f"--policy: expected 'module:attribute' (an absolute module name), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and not (module_name == err.name or module_name.startswith(err.name + ".")):
            raise  # the module exists; an import inside it failed: its own error (exit 1, --traceback shows where)
        raise CLIError(f"--policy {spec}: cannot import module {module_name!r} ({err})") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CLIError(f"--policy {spec}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _is_factory(obj) -> bool:
    try:
        from torch import nn

        if isinstance(obj, nn.Module):
            return False
    except ImportError:  # pragma: no cover
        pass
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return False
    try:
        params = list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "env"


def _check_policy_spec(spec: str | None):
    """Load ``--policy`` up front (before any env is built); a class must be a factory taking ``env``."""
    if spec is None:
        return None
    obj = _load_object(spec)
    if inspect.isclass(obj) and not _is_factory(obj):
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            params = []
        first = f"its first parameter is {params[0]!r}" if params else "it takes no parameters"
        raise CLIError(
            f"--policy {spec}: {obj.__name__} is a class, and {first}, not 'env': it is neither a policy nor a "
            f"factory(env). Point --policy at a policy object (e.g. a module-level `policy = {obj.__name__}(...)`) "
            f"or at a factory `def make_policy(env): return {obj.__name__}(...)`"
        )
    return obj


def _policy(spec: str | None, world):
    if spec is None:
        return None
    obj = _check_policy_spec(spec)
    if _is_factory(obj):
        obj = obj(env=world.env)
    if not callable(obj):
        raise CLIError(
            f"--policy {spec}: expected a policy (callable td -> td) or a factory(env), got {type(obj).__name__}"
        )
    return obj


def _json_arg(text: str | None, name: str) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise CLIError(f"{name}: invalid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CLIError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value


def path_arg(text: str) -> str:
    """An argparse ``type`` for paths: ``~`` expanded, an empty string refused (``--json "$OUT"`` with ``OUT``
    unset would otherwise write nothing, or into the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return os.path.expanduser(text)


def _check_output_file(path: str, flag: str) -> None:
    """Fail before any work when ``path`` cannot be written (the file is created only at the end)."""
    if path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise CLIError(f"{flag} {path}: ends with a path separator, expected a file path")
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise CLIError(f"{flag} {path}: is a directory, expected a file path")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        what = "exists and is not a directory" if os.path.exists(parent) else "does not exist"
        raise CLIError(f"{flag} {path}: parent directory {parent} {what}")
    existed = os.path.exists(target)
    try:
        with open(target, "a"):
            pass
    except OSError as err:
        raise CLIError(f"{flag} {path}: cannot write it ({err.strerror or err})") from None
    if not existed:
        os.remove(target)


def _check_output_dir(path: str, flag: str) -> None:
    """Fail before any work when directory ``path`` cannot be created or written (missing parents are fine)."""
    target = os.path.abspath(path)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CLIError(f"{flag} {path}: exists and is not a directory (or is a dangling symlink)")
    existing = target
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise CLIError(f"{flag} {path}: {existing} exists and is not a directory")
    import tempfile

    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as err:
        raise CLIError(f"{flag} {path}: cannot write in {existing} ({err.strerror or err})") from None


def _stamp(path) -> tuple | None:
    """What tells a dataset at ``path`` from one written later: its ``dataset.json``'s inode and mtime (``None``
    when there is none)."""
    try:
        st = (Path(path) / "dataset.json").stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _check_env_args(args) -> None:
    """Usage errors of the shared arguments, before any env is built."""
    if args.num_envs < 1:
        raise CLIError(f"--num-envs must be >= 1, got {args.num_envs}")
    from .world import SEED_LIMIT

    if not 0 <= args.seed < SEED_LIMIT:
        raise CLIError(f"--seed must be >= 0 and < 2**62 (gymnasium seeds are non-negative), got {args.seed}")
    if args.max_steps is not None and args.max_steps < 1:
        raise CLIError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.image_shape is not None and min(args.image_shape) < 1:
        raise CLIError(f"--image-shape: expected two positive sizes H W, got {' '.join(map(str, args.image_shape))}")


def _add_env_arguments(p: argparse.ArgumentParser, default_envs: int, mode_help: str, seed_help: str = "") -> None:
    p.add_argument("env", help="a gymnasium id (torchrl_swm/* ids are registered automatically)")
    p.add_argument("--num-envs", type=int, default=default_envs, help=f"parallel envs (default {default_envs})")
    p.add_argument("--seed", type=int, default=0,
                   help=f"base seed: episode j starts from seed + j (default 0){seed_help}")
    p.add_argument("--max-steps", type=int, default=None,
                   help="per-episode step limit, also the env's TimeLimit (default: the env's TimeLimit)")
    p.add_argument("--mode", choices=("auto", "wait"), default=None,
                   help=mode_help)
    p.add_argument("--image-shape", type=int, nargs=2, metavar=("H", "W"), default=None,
                   help="record pixels resized to H x W (implies --pixels)")
    p.add_argument("--pixels", action="store_true",
                   help="record pixels, at the env's render size unless --image-shape is given")
    p.add_argument("--env-kwargs", default=None,
                   help="JSON object of gym.make keyword arguments; EnvPool's own options among them (backend, "
                        "num_workers, device, seed_every_episode...) configure the pool, as EnvPool(id, ...) takes them")
    p.add_argument("--policy", default=None,
                   help="module:attr of a policy object, or of a function/class taking env; attr may be dotted "
                        "(module:Class.method) (default: random)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal)")


def _progress(args) -> bool:
    """--progress / --no-progress, else a bar only on a terminal (none in logs and pipes)."""
    return sys.stderr.isatty() if args.progress is None else args.progress


def _world(args, policy_spec):
    from .world import World

    _check_env_id(args.env)
    _check_env_args(args)
    kwargs = _json_arg(args.env_kwargs, "--env-kwargs")
    flags = {"max_episode_steps": "--max-steps", "seed": "--seed", "num_envs": "--num-envs",
             "image_shape": "--image-shape", "pixels": "--pixels"}
    not_make = sorted(k for k in kwargs if k in ("env", "env_fns", "policy", "id", "env_id"))
    if not_make:
        raise CLIError(f"--env-kwargs: {', '.join(not_make)} is not a gym.make keyword argument (the env is the "
                       "command's ENV argument, the policy --policy)")
    taken = sorted(k for k in kwargs if k in flags)
    if taken:
        raise CLIError(
            f"--env-kwargs: {', '.join(taken)} has a flag of its own here: use "
            f"{', '.join(flags[k] for k in taken)} instead"
        )
    if args.image_shape is not None:
        kwargs["image_shape"] = tuple(args.image_shape)
    elif args.pixels:
        kwargs["pixels"] = True
    if "image_shape" in kwargs or "pixels" in kwargs:  # a usage error, before any env is built
        from .envs import spec
        from .pool.env_pool import check_renders_rgb_array

        flag = "--video" if getattr(args, "video", None) else "--image-shape" if args.image_shape else "--pixels"
        try:
            check_renders_rgb_array(spec(args.env))
        except ValueError as err:
            raise CLIError(f"{flag}: {err}") from None
        if kwargs.get("render_mode", "rgb_array") != "rgb_array":
            raise CLIError(
                f"{flag} renders frames with render_mode='rgb_array', but --env-kwargs sets "
                f"render_mode={kwargs['render_mode']!r}: drop it from --env-kwargs"
            )
    world = World(args.env, num_envs=args.num_envs, max_episode_steps=args.max_steps, seed=args.seed, **kwargs)
    try:
        world.set_policy(_policy(policy_spec, world))
    except BaseException:
        world.close()
        raise
    return world


# -- collect ---------------------------------------------------------------------------------------------
def _configure_collect(p: argparse.ArgumentParser) -> None:
    _add_env_arguments(p, default_envs=4, mode_help="reset mode (default: auto)")
    p.add_argument("--episodes", type=int, required=True, help="episodes to collect")
    p.add_argument("--out", required=True, type=path_arg,
                   help="dataset directory (must not exist, or be empty; missing parents are created)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")


@register_command("collect", help="run a policy and write a dataset (TorchRL memory-mapped storage)",
                  configure=_configure_collect)
def _collect(args) -> int:
    out = os.path.abspath(args.out)
    _check_output_dir(args.out, "--out")
    from .data import _check_target, _WriterLock

    try:  # a non-empty directory, or one --overwrite may not replace (not a dataset, being written): refused
        _WriterLock(Path(out)).check_free()  # before an env is built
        _check_target(Path(out), args.overwrite, remove=False)
    except FileExistsError as err:
        raise CLIError(f"--out {args.out}: {err}") from None
    if args.episodes < 1:
        raise CLIError(f"--episodes must be >= 1, got {args.episodes}")
    _check_env_args(args)
    _check_policy_spec(args.policy)
    world = _world(args, args.policy)
    try:
        if args.max_steps is None and world._step_limit() is None:
            raise CLIError(
                f"{args.env} has no step limit (no gymnasium TimeLimit): pass --max-steps, which also sizes the "
                "dataset's storage"
            )
        before = _stamp(out)
        try:
            ds = world.collect(out, args.episodes, seed=args.seed, reset_mode=args.mode or "auto",
                               progress=_progress(args),
                               overwrite=args.overwrite)
        except FileExistsError as err:
            raise CLIError(str(err)) from None
        except KeyboardInterrupt:
            from .data import load_dataset

            if _stamp(out) == before:  # None: there was nothing, and there is still nothing
                # interrupted before the first episode was complete: nothing was written, an earlier dataset is kept
                print(f"interrupted before any episode was complete: {out} is unchanged", file=sys.stderr)
                return 130
            try:
                partial = load_dataset(out)
                print(f"interrupted: {out} holds {counted(partial.num_episodes, 'complete episode')}", file=sys.stderr)
            except Exception as err:  # not every failure means no episode: say which it was
                print(f"interrupted: {out} cannot be opened ({error_text(err)})", file=sys.stderr)
            return 130
    finally:
        world.close()
    print(ds.summary())
    return 0


# -- eval ---------------------------------------------------------------------------------------------------
def _configure_eval(p: argparse.ArgumentParser) -> None:
    _add_env_arguments(p, default_envs=8, mode_help="reset mode (default: auto; wait for --dataset evaluation)",
                       seed_help="; with --dataset, episodes start from the dataset episodes' own seeds, and this "
                       "seeds the policy's randomness only")
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes (default: one per env, or all dataset episodes)")
    p.add_argument("--video", default=None, type=path_arg, help="write one MP4 per episode to this directory")
    p.add_argument("--video-grid", action="store_true", help="write a single grid video instead")
    p.add_argument("--json", default=None, type=path_arg,
                   help="also write the result (per-episode arrays) to this JSON file")
    g = p.add_argument_group("dataset-driven evaluation")
    g.add_argument("--dataset", default=None, type=path_arg,
                   help="start episodes from states of this dataset (the first --episodes of its episodes; "
                        "--max-steps does not apply: --eval-budget is the step limit)")
    g.add_argument("--goal-offset", type=int, default=None, help="goal = dataset step start + goal offset")
    g.add_argument("--eval-budget", type=int, default=None, help="steps allowed to reach the goal")
    g.add_argument("--start-step", type=int, default=None, help="dataset step to start from (default 0)")


@register_command("eval", help="evaluate a policy; prints the result table", configure=_configure_eval)
def _eval(args) -> int:
    dataset_kwargs = {}
    if args.episodes is not None and args.episodes < 0:
        raise CLIError(f"--episodes must be >= 0, got {args.episodes}")
    if args.dataset is not None:
        from .data import DatasetError, load_dataset

        try:
            ds = load_dataset(args.dataset)
        except DatasetError as err:
            raise CLIError(f"--dataset: {err}") from None
        if args.goal_offset is None or args.eval_budget is None:
            raise CLIError("--dataset needs --goal-offset and --eval-budget")
        if args.max_steps is not None:
            raise CLIError(
                f"--max-steps {args.max_steps} cannot be combined with --dataset: --eval-budget is the step limit of "
                "a dataset episode (and --max-steps would also cut episodes as the env's TimeLimit)"
            )
        if args.goal_offset < 0:
            raise CLIError(f"--goal-offset must be >= 0, got {args.goal_offset}")
        if args.eval_budget < 1:
            raise CLIError(f"--eval-budget must be >= 1, got {args.eval_budget}")
        start = 0 if args.start_step is None else args.start_step
        if start < 0:
            raise CLIError(f"--start-step must be >= 0, got {start}")
        if ds.num_episodes == 0:
            raise CLIError(f"--dataset {args.dataset} holds no episodes (a collect stopped before any episode ended?)")
        count = ds.num_episodes if args.episodes is None else args.episodes
        if count > ds.num_episodes:
            raise CLIError(f"--episodes {count}: the dataset {args.dataset} holds only {ds.num_episodes} episodes")
        from .world import goals_outside_episodes  # World's own rule, checked before any env is built

        short = goals_outside_episodes(ds, range(count), [start] * count, args.goal_offset)
        if short:
            raise CLIError(
                f"--start-step {start} + --goal-offset {args.goal_offset} is past the end of {len(short)} of the "
                f"{count} dataset episodes (e.g. episode {short[0][0]}, length {short[0][2]})"
            )
        pixels = ds.td.get("pixels").shape[1:3] if ds.td is not None and "pixels" in ds.td.keys() else None
        if pixels is not None and args.image_shape is None:
            args.image_shape = list(pixels)  # render goals and frames alike (--pixels too: goals are its frames)
        elif pixels is not None and args.image_shape is not None and list(args.image_shape) != list(pixels):
            raise CLIError(
                f"--image-shape {' '.join(map(str, args.image_shape))}: the dataset's pixels are {pixels[0]} x "
                f"{pixels[1]}, and goals are its frames; leave --image-shape out (or pass {pixels[0]} {pixels[1]})"
            )
        dataset_kwargs = dict(dataset=ds, episodes_idx=list(range(count)), start_steps=start,
                              goal_offset=args.goal_offset, eval_budget=args.eval_budget)
    elif args.goal_offset is not None or args.eval_budget is not None or args.start_step is not None:
        raise CLIError("--goal-offset/--eval-budget/--start-step are only used with --dataset")
    if args.video_grid and args.video is None:
        raise CLIError("--video-grid needs --video DIR")
    if args.json is not None:
        _check_output_file(args.json, "--json")
    if args.video is not None:
        _check_output_dir(args.video, "--video")
        if args.json is not None and os.path.abspath(args.json) == os.path.abspath(args.video):
            raise CLIError(f"--json {args.json} and --video {args.video} are the same path: the video directory "
                           "would take the results file's place")
    _check_env_args(args)
    _check_policy_spec(args.policy)
    if args.video and args.image_shape is None and not args.pixels:
        args.pixels = True
    world = _world(args, args.policy)
    try:
        if not dataset_kwargs and args.max_steps is None and world._step_limit() is None:
            print(f"torchrl-swm eval: warning: {args.env} has no step limit (no gymnasium TimeLimit): each episode "
                  "runs until the env ends it; pass --max-steps to bound it", file=sys.stderr)
        video = None
        if args.video:
            from .video import VideoRecorder

            video = VideoRecorder(args.video, layout="grid" if args.video_grid else "episodes")
        result = world.evaluate(
            None if dataset_kwargs else args.episodes, seed=args.seed,
            reset_mode=args.mode or ("wait" if dataset_kwargs else "auto"),
            max_steps=None if dataset_kwargs else args.max_steps, video=video,
            progress=_progress(args), **dataset_kwargs,
        )
    finally:  # an interrupt reaches main(), which reports it
        world.close()
    if args.json:  # first: the results are kept even if printing fails (stdout piped into `head`)
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=1, allow_nan=False)  # strict JSON: to_dict has no NaN/inf
    print(result.summary())
    return 0


# -- info -------------------------------------------------------------------------------------------------------
def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=path_arg, help="a dataset directory written by collect")
    p.add_argument("--json", action="store_true", help="print dataset.json instead of the summary")


@register_command("info", help="summarise a dataset", configure=_configure_info)
def _info(args) -> int:
    from .data import DatasetError, load_dataset

    try:
        ds = load_dataset(args.path)
    except DatasetError as err:
        raise CLIError(str(err)) from None
    if args.json:
        print(json.dumps(ds.metadata, indent=1))
    else:
        print(ds.summary())
    return 0


# -- entry point ------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    parser = argparse.ArgumentParser(
        prog="torchrl-swm", description="Collect datasets and evaluate policies on gymnasium envs through TorchRL."
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help, add_help=not cmd.passthrough)
        if cmd.passthrough:
            p.set_defaults(_passthrough=True, passthrough_args=[])
        # also after the command, where the error hint's reader appends it (SUPPRESS: the top-level one stands)
        p.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        cmd.configure(p)
        p.set_defaults(_command=cmd)
    return parser


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end). If so,
    stdout is pointed at ``/dev/null``, so that Python's flush at exit does not fail on it again."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        closed = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no real stdout
        return False
    if closed:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return closed


def _warning_printer(command: str):
    """Warnings as one line on stderr, like the command's errors (the default shows a source line of this
    package's, which tells a shell user nothing)."""

    def show(message, category, filename, lineno, file=None, line=None):
        kind = "" if category is UserWarning else f"{category.__name__}: "
        print(f"torchrl-swm {command}: warning: {kind}{message}", file=sys.stderr if file is None else file)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchrl-swm`` command; returns the exit code."""
    # modules named by --policy module:attr or an env id module:Env-v0 may live in the current directory,
    # as with `python -m torchrl_swm.cli` (a console script's sys.path starts at its bin directory instead)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
    except KeyboardInterrupt:  # the commands' modules import torch: a Ctrl-C there is an interrupt, no traceback
        print("interrupted", file=sys.stderr)
        return 130
    if extra:  # only commands that hand their arguments on (quickstart) take unknown ones
        if not getattr(args, "_passthrough", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.passthrough_args = extra
    try:
        with warnings.catch_warnings():  # restores the default display when the command ends
            warnings.showwarning = _warning_printer(args.command)
            code = int(args._command.run(args) or 0)
        if sys.stdout is not None:  # None when started with stdout closed (`>&-`): nothing to flush
            sys.stdout.flush()  # here, not at exit: a pipe whose reader has gone fails now, where it is handled
        return code
    except CLIError as err:
        print(f"torchrl-swm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # an error from the env, the policy or the data: one line unless --traceback
        if isinstance(err, BrokenPipeError) and _stdout_closed():
            return 141  # the reader of stdout went away (`| head`): stop quietly, with a shell's 128 + SIGPIPE
        if args.traceback:
            raise
        notes = "".join(f"; {note}" for note in getattr(err, "__notes__", ()))  # e.g. which env or policy raised
        print(f"torchrl-swm {args.command}: error: {error_text(err)}{notes} "
              "(run with --traceback for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    # `python -m torchrl_swm.cli` runs this file as __main__, a second copy of the module: the commands
    # registered by COMMAND_MODULES (bench, quickstart) land in torchrl_swm.cli's COMMANDS, so run that one
    from torchrl_swm.cli import main as _package_main

    sys.exit(_package_main())
