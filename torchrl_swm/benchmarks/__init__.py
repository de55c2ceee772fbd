"""Benchmarks: ``python -m torchrl_swm.benchmarks`` (or ``torchrl-swm bench``).

Every section measures this package next to its peers in one process run and
reports ratios to a reference row of the same run.
"""

from .harness import Row, measure

__all__ = ["Row", "measure"]
