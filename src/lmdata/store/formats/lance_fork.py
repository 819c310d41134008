"""Lance and ``fork``: whether its runtime runs here, and whether it ran in the parent of a fork.

Lance is not fork-safe: its runtime's threads do not survive a fork, and a forked child
that reads through Lance mostly works and once in a while hangs for good (one CI run did, in
a test that read in such a child; Lance warns "lance is not fork-safe" at every fork). So a
reader refuses, with the way out, in a process forked after Lance ran in its parent, and
``make_loader`` forks Lance workers from a clean forkserver instead (``LanceReader.fork_safe``).
"""

from __future__ import annotations

import os
import sys

from lmdata.errors import LmdataError

_runtime_at_fork = False  # the parent's answer, taken just before each fork
_inherited_runtime = False  # this process was forked from one whose Lance runtime ran


def lance_runtime_started() -> bool:
    """Whether Lance's runtime threads run in this process (Linux: by their names; elsewhere: assume so)."""
    if "lance" not in sys.modules:  # not imported: no runtime (and no /proc walk at each fork)
        return False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                if fh.read().startswith("lance"):
                    return True
        except OSError:
            continue
    return False


def _before_fork() -> None:
    global _runtime_at_fork
    _runtime_at_fork = lance_runtime_started()


def _in_child() -> None:
    global _inherited_runtime
    _inherited_runtime = _inherited_runtime or _runtime_at_fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def refuse_if_forked_after_lance(where: object) -> None:
    """Raise the way out where Lance would hang: this process was forked after Lance ran in its parent."""
    if _inherited_runtime:
        raise LmdataError(
            f"{where}: this process was forked after Lance ran in its parent, and Lance is not fork-safe "
            "(reads hang or crash there); start workers with 'spawn' or 'forkserver' "
            "(lmdata's make_loader does), e.g. DataLoader(..., multiprocessing_context='forkserver')"
        )
