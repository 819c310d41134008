"""A pause of the cyclic GC around work that makes many objects and no cycles (a manifest's parse).

A process that has just imported torch owes a full pass over torch's objects, and the
manifest's allocations were what set it off: 63-76 ms of a 182-shard store's ~0.11 s
``open_store``, 0.025 s without (a fresh process, Lance, 2 workers; bench/README "Peers
(local)"). The pass is not skipped, only left to a later moment of the run.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_gc_paused = {"depth": 0, "enabled": False}  # no_gc_pass's callers now, and whether GC was on before the first
_gc_lock = threading.Lock()
_held = threading.local()  # .n: the pauses this thread is inside


def _after_fork_in_child() -> None:
    """The child has a free lock and only the forking thread: the pauses of other threads (a parse
    mid-way) are gone, so GC is back as it was before them; the forking thread's own pauses stay
    open, and GC comes back when it leaves them, as in the parent."""
    global _gc_lock
    _gc_lock = threading.Lock()
    own = getattr(_held, "n", 0)
    if _gc_paused["depth"] and not own and _gc_paused["enabled"]:
        gc.enable()
    _gc_paused["depth"] = own


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def no_gc_pass() -> Iterator[None]:
    """No cyclic-GC pass inside the block. Threads inside at once share one pause: the last to
    leave puts GC back as the first found it (a caller that had disabled it keeps it disabled)."""
    with _gc_lock:
        if _gc_paused["depth"] == 0:
            _gc_paused["enabled"] = gc.isenabled()
            gc.disable()
        _gc_paused["depth"] += 1
    _held.n = getattr(_held, "n", 0) + 1
    try:
        yield
    finally:
        _held.n -= 1
        with _gc_lock:
            _gc_paused["depth"] -= 1
            if _gc_paused["depth"] == 0 and _gc_paused["enabled"]:
                gc.enable()
