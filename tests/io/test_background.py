"""Background fetches across a fork (``io/background.py``): a fork (or a pause) waits for the fetch
running, no fetch starts until it is made (left), and the child starts with none of the parent's."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import pytest

from lmdata.io import background


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@contextmanager
def _fork_hooks():
    """The at-fork hooks as ``os.fork`` runs them around a fork, from one thread."""
    background._before_fork()
    try:
        yield
    finally:
        background._after_fork_in_parent()


@pytest.mark.parametrize("block", [_fork_hooks, background.paused], ids=["fork", "paused"])
def test_a_fork_or_pause_waits_for_the_running_fetch_and_no_fetch_starts_until_it_ends(block):
    a_in, a_go, entered, leave, b_in = (threading.Event() for _ in range(5))

    def fetch_a():
        with background.fetching():
            a_in.set()
            a_go.wait(30)

    def hold():
        with block():
            entered.set()
            leave.wait(30)

    def fetch_b():
        with background.fetching():
            b_in.set()

    a = _in_thread(fetch_a)
    assert a_in.wait(30)
    h = _in_thread(hold)
    assert not entered.wait(0.5)  # a fetch is running
    a_go.set()
    assert entered.wait(30)  # the fetch ended: the fork (or pause) goes on
    b = _in_thread(fetch_b)
    assert not b_in.wait(0.5)  # no fetch starts meanwhile
    leave.set()
    assert b_in.wait(30)  # made (left): fetches go on
    for t in (a, h, b):
        t.join(30)
    assert background._running == 0 and background._paused == 0  # (a fork in progress counts as a pause)


def test_os_fork_is_made_after_the_running_fetch_and_the_child_can_fetch():
    import select
    import signal

    inside, forking, finishing = threading.Event(), threading.Event(), []

    def fetch():
        with background.fetching():
            inside.set()
            forking.wait(30)
            threading.Event().wait(0.3)  # a fork that did not wait would be made meanwhile
            finishing.append(True)

    thread = _in_thread(fetch)
    assert inside.wait(30)
    read, write = os.pipe()
    forking.set()
    pid = os.fork()
    if pid == 0:  # the child: no fetch of the parent's counted, and fetching() does not hang
        try:
            with background.fetching():
                os.write(write, f"{background._running} {len(background._threads)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    assert finishing == [True]  # the fork waited for the fetch
    try:
        assert select.select([read], [], [], 30)[0], "the child hangs"
        assert os.read(read, 100) == b"1 0"
    finally:
        os.close(read)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    thread.join(30)


def test_a_fork_from_inside_a_fetch_does_not_wait_for_that_fetch(monkeypatch):
    monkeypatch.setattr(background, "FORK_WAIT_S", 600.0)  # waiting for itself would hang the test, not pass it
    forked = threading.Event()

    def fetch_and_fork():
        with background.fetching():
            background._before_fork()
            forked.set()
            background._after_fork_in_parent()

    thread = _in_thread(fetch_and_fork)
    assert forked.wait(30)
    thread.join(30)
    assert background._running == 0
