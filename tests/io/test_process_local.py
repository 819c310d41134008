"""Per-process state: built once in each process, never pickled, rebuilt after a fork."""

from __future__ import annotations

import os
import pickle

import pytest

from lmdata.io.process_local import ProcessLocal, per_process


class Holder:
    def __init__(self) -> None:
        self.built = 0

    def _make(self) -> list:
        self.built += 1
        return [os.getpid()]

    value = per_process(_make)


def test_an_attribute_is_built_once_per_process_and_pickles_empty():
    h = Holder()
    assert h.value is h.value and h.built == 1
    h.value = ["set"]
    assert h.value == ["set"]
    again = pickle.loads(pickle.dumps(h))
    assert again.value == [os.getpid()] and again.built == 2  # rebuilt, not the parent's


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_a_forked_child_builds_its_own():
    h, shared = Holder(), ProcessLocal(lambda: [os.getpid()])
    parent = (h.value, shared.get())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh value for each, built here
        os.write(w, pickle.dumps((h.value, shared.get(), Holder.value.peek(h))))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        child = pickle.loads(fh.read())
    os.waitpid(pid, 0)
    assert child[0] == child[1] == [pid] and child[2] == [pid]
    assert parent == ([os.getpid()], [os.getpid()])
