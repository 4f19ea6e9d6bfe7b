"""BenchError: why a benchmark cannot run, in one line for its user.

The library raises it where the command line used to stop with an error (a workload that
is not one, a tokenizer that does not load, a daemon that exits); ``suffixd bench`` prints
it as its one ``Error:`` line (cli/bench.py), a script under bench/ lets it propagate.
"""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark cannot go on; the message says why (no traceback needed)."""
