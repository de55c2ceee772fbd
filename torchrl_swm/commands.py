"""The ``bench`` and ``quickstart`` subcommands of ``torchrl-swm`` (registered in :mod:`torchrl_swm.cli`).

Kept light: the CLI imports this module before parsing; the heavy modules load
only when a command runs.
"""

from .cli import register_command


def _configure_bench(parser):
    from .benchmarks.__main__ import build_parser

    build_parser(parser)


@register_command("bench", help="benchmark the pool, the world-model env and the export against their peers",
                  configure=_configure_bench)
def _bench(args) -> int:
    from .benchmarks.__main__ import check_args, run
    from .cli import CLIError

    try:
        check_args(args)
    except ValueError as err:
        raise CLIError(str(err)) from None  # a usage error: exit 2
    return run(args)


# every argument, --help included, goes to the quickstart's own parser
@register_command("quickstart", help="collect data, train a world model, plan in it, evaluate for real (CPU, minutes)",
                  configure=lambda parser: None, passthrough=True)
def _quickstart(args) -> int:
    from .quickstart import main

    return main(args.passthrough_args, prog="torchrl-swm quickstart")
