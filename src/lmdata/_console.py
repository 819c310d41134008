"""The ``lmdata`` command's entry point: a Ctrl-C while the CLI is still being imported is one line too.

Python raises ``KeyboardInterrupt`` wherever SIGINT lands. In a command's first ~50 ms that is inside
an import, before ``lmdata.cli.main`` can catch it, and the user saw an import traceback; here the
import itself is guarded, and ``main`` takes over from the first line of the command.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from lmdata.cli import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run_cli()
