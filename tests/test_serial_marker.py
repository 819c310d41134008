"""The ``serial`` marker (tests/conftest.py): under pytest-xdist a serial test holds the workers'
shared lock file exclusively, any other test holds it shared, so the two never overlap."""

from __future__ import annotations

import fcntl
import os

import pytest


def _try_lock(path, mode: int) -> bool:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


@pytest.fixture
def lock_path(tmp_path_factory):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        pytest.skip("one process: no lock is taken (scripts/test.sh runs two)")
    return tmp_path_factory.getbasetemp().parent / "serial-tests.lock"


def test_a_test_holds_the_lock_shared(lock_path):
    assert _try_lock(lock_path, fcntl.LOCK_SH)  # others may run beside it
    assert not _try_lock(lock_path, fcntl.LOCK_EX)  # a serial test may not


@pytest.mark.serial
def test_a_serial_test_holds_the_lock_alone(lock_path):
    assert not _try_lock(lock_path, fcntl.LOCK_SH)  # no other test starts while it runs
