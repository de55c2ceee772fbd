"""``python -m torchrl_swm.benchmarks``: run the benchmark, print the table, save JSON/PNG."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import sys
import textwrap
import time

__all__ = ["main", "run", "build_parser", "run_sections", "format_table", "save_plot"]

SECTIONS = ("cartpole", "vector", "fixed", "expensive", "world_model", "export")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m torchrl_swm.benchmarks", description=__doc__)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {', '.join(SECTIONS)}")
    parser.add_argument("--ns", default="16,256", help="pool sizes N for the pool sections")
    parser.add_argument("--bs", default="1,64,1024", help="batch sizes B for the world-model sections")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed seconds per row (split over 3 repeats in the cartpole section, 5 in the "
                             "others)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    from ..cli import path_arg

    parser.add_argument("--json", type=path_arg, help="save the rows to this JSON file")
    parser.add_argument("--plot", type=path_arg,
                        help="save a bar chart of the ratios to this image file (PNG without an extension: PATH.png)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    return parser


def machine() -> str:
    import gymnasium
    import torch
    import numpy
    import tensordict
    import torchrl

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cpus, python {platform.python_version()}, torch {torch.__version__}, "
            f"torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, gymnasium {gymnasium.__version__}, "
            f"numpy {numpy.__version__}, torch threads {torch.get_num_threads()}")


def run_sections(sections, ns, bs, seconds, quick, progress=print):
    from . import pool

    rows = []
    for name in sections:
        start = time.perf_counter()
        if name in pool.SECTIONS:
            rows += pool.run((name,), ns, seconds, quick)
        elif name == "world_model":
            from . import world_model

            rows += world_model.run(bs=bs, seconds=seconds)
        elif name == "export":
            from . import export

            rows += export.run(ns=ns, bs=[b for b in bs if b >= 64] or bs, seconds=seconds)
        else:
            raise SystemExit(f"unknown section {name!r}; expected some of {', '.join(SECTIONS)}")
        progress(f"# section {name}: {time.perf_counter() - start:.0f} s")
    return rows


def format_table(rows) -> str:
    lines = ["| section | N/B | row | env-steps/s (median) | spread | µs/batched step | ratio |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "" if r.ratio is None or math.isnan(r.ratio) else f"{r.ratio:.2f}"
        # a row with no figures (a peer that failed, a ceiling noise swamped): its label says why
        rate = "n/a" if math.isnan(r.rate) else f"{r.rate:,.0f}"
        spread = "" if math.isnan(r.spread) else f"{r.spread:.0%}"
        us = "" if math.isnan(r.us_per_call) else f"{r.us_per_call:,.1f}"
        lines.append(f"| {r.section} | {r.n} | {r.label} | {rate} | {spread} | {us} | {ratio} |")
    return "\n".join(lines)


#: rows of this package (drawn blue; the peers and references grey)
_OURS = ("EnvPool", "WorldModelEnv", "make_world_model_env", "to_gymnasium", "to_sb3_vec_env", "World")


def _no_nan(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def save_plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in rows:
        if r.ratio is not None and r.ratio > 0:  # a log scale: no failed (NaN) or unmeasurable rows
            groups.setdefault((r.section, r.n), []).append(r)
    if not groups:
        raise ValueError("save_plot: no row has a measured ratio to plot")
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 2.2 + 0.35 * max(len(g) for g in groups.values()) * len(groups)),
                             squeeze=False)
    low = min(r.ratio for g in groups.values() for r in g)
    high = max(r.ratio for g in groups.values() for r in g)
    left = 10 ** math.floor(math.log10(min(low, 0.1)))  # one fixed origin: bar lengths compare across groups
    for ax, ((section, n), items) in zip(axes[:, 0], groups.items()):
        labels = [textwrap.shorten(r.label, 55, placeholder="...") for r in items]
        values = [r.ratio for r in items]
        ours = [r.label.startswith(_OURS) and "reference" not in r.label for r in items]  # a reference: grey
        ax.barh(range(len(items)), [v - left for v in values], left=left,
                color=["tab:blue" if o else "tab:gray" for o in ours])
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax.set_yticks(range(len(items)), labels, fontsize=7)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(left, max(high, 1.0) * 3)
        ax.set_title(f"{section}, N/B = {n}: ratio to the reference row (log scale)", fontsize=9)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as err:
        parser.error(str(err))  # exit 2, as argparse does for a bad argument
    return run(args)


def _sizes(text: str, flag: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return sizes


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before any work (``ValueError`` naming the flag)."""
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if not sections or unknown:
        got = f"unknown {unknown!r}" if unknown else f"no section in {args.sections!r}"
        raise ValueError(f"--sections: {got}; expected some of {', '.join(SECTIONS)}")
    _sizes(args.ns, "--ns")
    _sizes(args.bs, "--bs")
    if not 0 < args.seconds <= 3600:  # also refuses inf and nan
        raise ValueError(f"--seconds: expected a positive number of seconds per row (at most 3600), got {args.seconds}")
    if args.threads < 1:
        raise ValueError(f"--threads: expected >= 1, got {args.threads}")
    from ..cli import CLIError, _check_output_file

    if args.plot is not None:
        try:  # found now, not after the whole run
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            raise ValueError('--plot needs matplotlib: pip install "torchrl-swm[plot]" (or drop --plot)') from None
        # the file matplotlib writes is the one checked and printed: no extension is its default format, PNG
        suffix = os.path.splitext(args.plot)[1][1:].lower()
        formats = FigureCanvasBase.get_supported_filetypes()
        if not suffix and os.path.basename(args.plot) and not os.path.isdir(args.plot):
            args.plot += ".png"  # (a directory, or a path ending in a separator, is refused as such below)
        elif suffix and suffix not in formats:
            raise ValueError(f"--plot {args.plot}: unknown image format {suffix!r}; expected a file name ending in "
                             f"one of {', '.join('.' + f for f in sorted(formats))}")
    if args.json is not None and args.plot is not None and os.path.abspath(args.json) == os.path.abspath(args.plot):
        raise ValueError(f"--json {args.json} and --plot {args.plot} are the same file: the plot would replace the rows")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:  # found now, not after minutes of benchmarking
            try:
                _check_output_file(path, flag)
            except CLIError as err:
                raise ValueError(str(err)) from None


@contextlib.contextmanager
def _quiet_torchrl():
    """TorchRL logs INFO lines (its peers' spec checks) to stdout, into the table: WARNING and up while the sections
    run, here and in the worker processes they start (``RL_LOGGING_LEVEL``), unless the user set that variable."""
    if "RL_LOGGING_LEVEL" in os.environ:
        yield
        return
    logger = logging.getLogger("torchrl")
    level = logger.level
    os.environ["RL_LOGGING_LEVEL"] = "WARNING"
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        os.environ.pop("RL_LOGGING_LEVEL", None)
        logger.setLevel(level)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark for arguments that passed :func:`check_args` (``main`` and the
    ``torchrl-swm bench`` command check them first)."""
    import torch

    torch.set_num_threads(args.threads)
    sections = [s for s in args.sections.split(",") if s]
    ns = _sizes(args.ns, "--ns")
    bs = _sizes(args.bs, "--bs")
    if args.quick:
        ns, bs, args.seconds = [min(ns)], [min(bs)], min(args.seconds, 0.3)
    # how the figures were made, for the JSON: a quick smoke run is not a measurement
    run_info = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": sections, "ns": ns,
                "bs": bs, "seconds": args.seconds, "quick": bool(args.quick), "threads": args.threads}
    print(f"# {machine()}")
    with _quiet_torchrl():
        rows = run_sections(sections, ns, bs, args.seconds, args.quick)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            # strict JSON: a failed row's NaN rate is null
            data = {"machine": machine(), "run": run_info, "rows": [_no_nan(r.as_dict()) for r in rows]}
            json.dump(data, f, indent=1, allow_nan=False)
    if args.plot:
        save_plot(rows, args.plot)
        print(f"# plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
