"""A Ctrl-C that lands before DuckDB begins the query still stops it (CI saw one that did not).

DuckDB clears its interrupt flag when a query begins, so an interrupt sent while the statement
is still on its way (parsed, bound, or not yet handed over) is forgotten. ``_interruptible``
repeats the interrupt until the call returns. Real DuckDB, real KeyboardInterrupt.
"""

from __future__ import annotations

import _thread
import threading
import time

import duckdb
import pytest

from lmdata.inspect.sandbox import _interruptible

ENDLESS = "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c"


def test_duckdb_forgets_an_interrupt_sent_before_the_query():
    """The premise: without a repeat, the query would run on (stopped here by a second interrupt)."""
    con = duckdb.connect()
    con.interrupt()
    late = threading.Timer(1.0, con.interrupt)
    late.start()
    started = time.monotonic()
    with pytest.raises(duckdb.InterruptException):
        con.execute(ENDLESS)
    assert time.monotonic() - started >= 0.9  # ran until the second interrupt, not stopped by the first
    con.close()


def test_a_ctrl_c_before_the_query_begins_stops_it():
    con = duckdb.connect()

    def late_query():
        time.sleep(0.5)  # the statement still on its way when Ctrl-C comes
        return con.execute(ENDLESS)

    threading.Timer(0.1, _thread.interrupt_main).start()
    stuck: list[bool] = []
    with pytest.raises(KeyboardInterrupt):
        _interruptible(con, late_query, stuck)
    assert stuck == []  # the query stopped, so the connection can be closed
    con.close()


def test_a_ctrl_c_while_the_query_thread_starts_closes_the_connection(sample_store, monkeypatch):
    """``Thread.start`` waits for the new thread: a Ctrl-C there left ``_interruptible`` with the query
    running, and DuckDB 2.x refused to close the busy connection (ResourceInUseException replaced the
    KeyboardInterrupt, then the exit aborted). The KeyboardInterrupt must come out, the query stopped."""
    from lmdata.inspect import sandbox

    started: list[threading.Event] = []

    class InterruptedWhileStarting(sandbox.Bounded):
        def __init__(self, call, name="lmdata-call"):
            begun = threading.Event()
            started.append(begun)

            def call_then_say():
                begun.set()
                return call()

            super().__init__(call_then_say, name)  # the thread runs the query...
            begun.wait(10)
            time.sleep(0.3)  # ...which is under way when the Ctrl-C lands, before any wait
            raise KeyboardInterrupt

    monkeypatch.setattr(sandbox, "Bounded", InterruptedWhileStarting)
    endless = "SELECT count(*) FROM docs a, docs b, docs c, docs d, docs e, range(100000) f"
    with pytest.raises(KeyboardInterrupt):
        sandbox.sql(sample_store, endless)
    assert started and started[0].is_set()
