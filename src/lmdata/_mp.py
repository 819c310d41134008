"""Start methods per platform, and scripts without an ``if __name__ == "__main__":`` guard.

``spawn`` and ``forkserver`` start each worker by re-running the user's ``__main__`` as
``__mp_main__``: a plain script (nanoGPT style, no guard) that builds a loader or calls
``ingest`` at top level would run again in every worker, and die or loop there.
``reimports_unguarded_main(method)`` tells beforehand, so the caller can pick ``fork`` or
threads instead. The start methods by platform:

    Linux          fork (default), forkserver where the parent may hold threads a fork loses
    macOS          spawn (Python's default there: fork is unsafe with the system frameworks)
    Windows        spawn (the only one)
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import signal
import sys
from functools import lru_cache
from typing import Any

REIMPORTING = ("spawn", "forkserver")


def default_method() -> str:
    """The platform's start method (what ``multiprocessing`` uses unless told otherwise)."""
    return mp.get_start_method(allow_none=True) or mp.get_context().get_start_method()


def clean_method() -> str:
    """A start method whose workers inherit no threads: forkserver where it exists, else spawn."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def can_fork() -> bool:
    """fork is a safe choice here (Linux); on macOS it is unsafe, on Windows it does not exist."""
    return sys.platform.startswith("linux")


def ignore_sigint() -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (one line, exit 130), not a traceback per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init(initializer: Any, initargs: tuple) -> None:
    ignore_sigint()
    if initializer is not None:
        initializer(*initargs)


def worker_pool(processes: int, method: str | None = None, initializer: Any = None, initargs: tuple = ()) -> Any:
    """A ``multiprocessing`` Pool whose workers leave Ctrl-C to the parent.

    For a script without a main guard whose workers ``method`` would re-run it, the pool
    forks on Linux and is a thread pool elsewhere (same ``apply_async`` API).
    """
    from multiprocessing.pool import ThreadPool

    if reimports_unguarded_main(method):
        if not can_fork():
            return ThreadPool(processes, initializer, initargs)
        method = "fork"
    return mp.get_context(method).Pool(processes, _init, (initializer, initargs))


def reimports_unguarded_main(method: str | None) -> bool:
    """True when workers started with ``method`` would re-run top-level code of ``__main__``.

    That is: the method is spawn or forkserver, ``__main__`` is a file, and the call that got
    here comes from ``__main__``'s top level outside an ``if __name__ == "__main__":`` block.
    """
    if (method or default_method()) not in REIMPORTING:
        return False
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or getattr(main, "__name__", "") != "__main__":
        return False
    frame: Any = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # not called from the script's top level (a thread, a callback): assume guarded
        return False
    return frame.f_lineno not in _guarded_lines(path)


@lru_cache(maxsize=8)
def _guarded_lines(path: str) -> frozenset[int]:
    """Line numbers of ``path`` inside an ``if ... __name__ ...:`` block (all lines if it cannot be parsed)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return frozenset(range(1, 1 << 20))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)
