"""A library call that may block for long (a query, a remote read) on a daemon thread, the
caller waiting for it in Python: so Ctrl-C reaches the caller at once, and a wait can end
at a deadline even when the library's own timeouts nest (Lance retries each of its GETs).

    call = Bounded(lambda: ds.take(rows))
    if not call.wait(60):            # False: still running after 60 s (it is left to finish)
        raise ...
    table = call.result()            # its value, or its exception raised here

The thread is a daemon: a call abandoned at a deadline never holds up the process's exit.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
POLL_S = 0.1  # the longest a Ctrl-C waits to be seen (Event.wait in slices: an interrupt lands between them)


class Bounded(Generic[T]):
    """``call()`` started on a daemon thread; ``wait`` for it, then ``result``."""

    def __init__(self, call: Callable[[], T], name: str = "lmdata-call") -> None:
        self._done = threading.Event()
        self._box: dict[str, Any] = {}
        threading.Thread(target=self._run, args=(call,), name=name, daemon=True).start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._box["value"] = call()
        except BaseException as exc:  # handed to the caller as it was
            self._box["error"] = exc
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the call finished within ``timeout`` seconds (None: wait until it does).

        Not ``Thread.join``: a join that a KeyboardInterrupt broke can report a live thread gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(POLL_S if deadline is None else max(min(POLL_S, deadline - time.monotonic()), 0)):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def result(self) -> T:
        """The call's value, or its exception raised here (only after ``wait`` said it finished)."""
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
