"""The ``torchrl-swm bench`` subcommand: the same as ``python -m torchrl_swm.benchmarks``."""

from ..cli import register_command


def _configure(parser):
    from .__main__ import build_parser

    build_parser(parser)


@register_command("bench", help="benchmark the pool, the world-model env and the export against their peers",
                  configure=_configure)
def _bench(args) -> int:
    from .__main__ import run

    return run(args)
