"""Background fetches across a fork (``io/background.py``): a fork waits for the fetch running, no
fetch starts while a fork is made, and the child starts with none of the parent's."""

from __future__ import annotations

import os
import threading

from lmdata.io import background


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_fork_waits_for_the_running_fetch_and_no_fetch_starts_until_it_is_made():
    a_in, a_go, forking, made, b_in = (threading.Event() for _ in range(5))

    def fetch_a():
        with background.fetching():
            a_in.set()
            a_go.wait(30)

    def fork():  # the hooks, as os.fork runs them (from one thread)
        background._before_fork()
        forking.set()
        made.wait(30)
        background._after_fork_in_parent()

    def fetch_b():
        with background.fetching():
            b_in.set()

    a = _in_thread(fetch_a)
    assert a_in.wait(30)
    f = _in_thread(fork)
    assert not forking.wait(0.5)  # the fork waits: a fetch is running
    a_go.set()
    assert forking.wait(30)  # the fetch ended: the fork goes on
    b = _in_thread(fetch_b)
    assert not b_in.wait(0.5)  # no fetch starts while the fork is made
    made.set()
    assert b_in.wait(30)  # the fork made: fetches go on
    for t in (a, f, b):
        t.join(30)
    assert background._running == 0 and not background._forking


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


def test_paused_waits_for_the_running_fetch_and_starts_none_until_left():
    a_in, a_go, entered, leave, b_in = (threading.Event() for _ in range(5))

    def fetch_a():
        with background.fetching():
            a_in.set()
            a_go.wait(30)

    def pause():
        with background.paused():
            entered.set()
            leave.wait(30)

    def fetch_b():
        with background.fetching():
            b_in.set()

    a = _in_thread(fetch_a)
    assert a_in.wait(30)
    p = _in_thread(pause)
    assert not entered.wait(0.5)  # a fetch runs
    a_go.set()
    assert entered.wait(30)
    b = _in_thread(fetch_b)
    assert not b_in.wait(0.5)  # paused: no fetch starts
    leave.set()
    assert b_in.wait(30)
    for t in (a, p, b):
        t.join(30)
    assert background._running == 0 and background._paused == 0


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
