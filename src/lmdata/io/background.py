"""Threads that fetch remote data behind a reader's back: stopped at exit, quiet across a fork.

A remote reader's first batch starts threads that fetch the rest of its split (``shard_copies``).
Two moments must not find one of them inside a fetch:

- **exit**: a daemon thread still inside native code when the interpreter finalizes (a Lance
  take, in Rust) aborts the process ("FATAL: exception not rethrown", exit -6). ``atexit`` lets
  each finish the fetch it is on (at most ``EXIT_WAIT_S``) and start no other.
- **fork**: a DataLoader forks its workers after the parent read a batch (a script that peeks at
  the data first). A thread inside an S3 call then holds the AWS SDK's locks and connection
  state, and the child inherits them held, with no thread to release them: its first read of
  the store can hang for good. ``os.register_at_fork`` makes each fork wait until no fetch is
  running (at most ``FORK_WAIT_S``) and lets none start until the fork is made; the parent's
  threads then go on, and the child, which has none, starts its own on its first batch.

A DataLoader forks its workers one after another: ``paused()``, around their start
(``make_loader``'s loader), waits once for the fetches running and starts none until the
workers are made, so each fork does not wait for a new fetch in turn.

A fetch runs inside ``fetching()``; a thread asks ``stopping()`` before taking the next one.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

EXIT_WAIT_S = 60.0  # at exit, how long the background fetches may take to finish their fetch
FORK_WAIT_S = 30.0  # at a fork, how long it waits for running fetches (a fetch stuck longer is forked over)

_stopping = threading.Event()  # set at exit: no new fetch
_threads: list[threading.Thread] = []
_state = threading.Condition()  # guards the two below; held across a fork
_running = 0  # fetches inside ``fetching()`` now
_paused = 0  # ``paused()`` blocks entered and not left, and a fork being made: no fetch starts
_own = threading.local()  # .n: the fetches this thread is inside (a fork it makes does not wait for them)


def start(name: str, target: Callable[[], None]) -> threading.Thread:
    """A daemon thread running ``target``, waited for at exit (``_stop``)."""
    _threads[:] = [t for t in _threads if t.is_alive()]
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    _threads.append(thread)
    return thread


def stopping() -> bool:
    """Whether the process is exiting: a background thread takes no new fetch."""
    return _stopping.is_set()


@contextmanager
def fetching() -> Iterator[None]:
    """Held around one remote fetch: a fork waits for it to end, and it does not start during a fork."""
    global _running
    with _state:
        _state.wait_for(lambda: not _paused)
        _running += 1
    _own.n = getattr(_own, "n", 0) + 1
    try:
        yield
    finally:
        _own.n -= 1
        with _state:
            _running = max(0, _running - 1)  # (0 in a child forked by this thread mid-fetch)
            _state.notify_all()


@contextmanager
def paused() -> Iterator[None]:
    """No fetch starts inside the block, and it is entered once the fetches running have ended (at
    most ``FORK_WAIT_S``): the forks made in it (a DataLoader starting its workers) wait for none."""
    global _paused
    with _state:
        _paused += 1
        _idle()
    try:
        yield
    finally:
        with _state:
            _paused = max(0, _paused - 1)
            _state.notify_all()


def _idle() -> None:
    """Wait, ``_state`` held, until no fetch but this thread's own runs (at most ``FORK_WAIT_S``)."""
    own = getattr(_own, "n", 0)
    _state.wait_for(lambda: _running <= own, FORK_WAIT_S)


def _stop() -> None:
    _stopping.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    for t in _threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _before_fork() -> None:
    global _paused
    _state.acquire()  # held until the fork is made: no thread is inside it then
    _paused += 1  # (while ``_idle`` waits, the lock is let go: no fetch may start meanwhile)
    _idle()


def _after_fork_in_parent() -> None:
    global _paused
    _paused -= 1
    _state.notify_all()
    _state.release()


def _after_fork_in_child() -> None:
    global _state, _running, _paused, _threads
    _state, _running, _paused, _threads = threading.Condition(), 0, 0, []  # no parent's thread here


atexit.register(_stop)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
