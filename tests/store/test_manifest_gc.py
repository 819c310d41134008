"""Reading a manifest runs no cyclic-GC pass, and leaves the collector as it found it."""

from __future__ import annotations

import gc
import os

import pytest

from lmdata.errors import LmdataError
from lmdata.store import manifest as manifest_module
from lmdata.store.manifest import MANIFEST_NAME, Manifest, read_manifest


@pytest.fixture
def eager_gc(monkeypatch):
    """Call it to get a collector that runs a pass after every allocation of a tracked object;
    its list fills with the passes that start while a manifest's JSON is parsed and its objects built."""
    old = gc.get_threshold()
    passes: list[int] = []
    parsing = [False]
    loads = manifest_module.json.loads

    def parse(*args, **kwargs):
        parsing[0] = True
        return loads(*args, **kwargs)

    def built(manifest):  # the objects are built: the parse is over
        parsing[0] = False
        return manifest

    from_json = Manifest.from_json.__func__

    def count(phase: str, info: dict) -> None:
        if phase == "start" and parsing[0]:
            passes.append(info["generation"])

    def start() -> list[int]:
        monkeypatch.setattr(manifest_module.json, "loads", parse)
        monkeypatch.setattr(Manifest, "from_json", classmethod(lambda cls, *a, **k: built(from_json(cls, *a, **k))))
        gc.callbacks.append(count)
        gc.set_threshold(1, 1, 1)
        return passes

    try:
        yield start
    finally:
        gc.set_threshold(*old)
        if count in gc.callbacks:
            gc.callbacks.remove(count)


def test_no_pass_while_a_manifest_is_parsed(make_store, eager_gc):
    store = make_store(["memmap", "parquet"], n_tokens=30_000, shard_tokens=2_000).path
    passes = eager_gc()
    manifest = read_manifest(store)
    assert passes == []  # thousands of objects made, and not one pass over the heap
    assert len(manifest.splits["train"].formats["memmap"]) > 10
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(make_store):
    store = make_store(["memmap"]).path
    gc.disable()
    try:
        read_manifest(store)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_back_after_a_bad_manifest(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(LmdataError, match="not valid JSON"):
        read_manifest(tmp_path)
    assert gc.isenabled()


def test_threads_parsing_at_once_share_one_pause():
    from lmdata._gc_pause import no_gc_pass

    with no_gc_pass():
        with no_gc_pass():  # another caller, finishing first
            pass
        assert not gc.isenabled()  # still parsing: the pause holds
    assert gc.isenabled()


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() of a process with threads
def test_a_child_forked_during_another_threads_pause_has_gc_back_and_can_parse(make_store):
    import threading

    from lmdata._gc_pause import no_gc_pass

    store = make_store(["memmap"]).path
    inside, leave = threading.Event(), threading.Event()

    def parse_slowly():
        with no_gc_pass():
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=parse_slowly)
    thread.start()
    inside.wait(30)
    assert not gc.isenabled()
    pid = os.fork()
    if pid == 0:  # the child: that thread's pause is gone with it; a parse neither deadlocks nor leaves GC off
        ok = gc.isenabled()
        read_manifest(store)
        os._exit(0 if ok and gc.isenabled() else 1)
    code = _exit_code(pid)
    leave.set()
    thread.join()
    assert code == 0
    assert gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_inside_its_own_pause_gets_gc_back_when_it_leaves_it(make_store):
    from lmdata._gc_pause import no_gc_pass

    store = make_store(["memmap"]).path
    with no_gc_pass():
        pid = os.fork()
        if pid == 0:
            steps = [gc.isenabled()]  # still inside: off, as in the parent
    if pid == 0:
        steps.append(gc.isenabled())  # left it: back on
        with no_gc_pass():  # later pauses still pause
            steps.append(gc.isenabled())
        read_manifest(store)
        steps.append(gc.isenabled())
        os._exit(0 if steps == [False, True, False, True] else 1)
    assert _exit_code(pid) == 0
    assert gc.isenabled()
