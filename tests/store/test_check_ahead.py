"""The check-ahead thread: a later read's blocks checked and its windows read on a thread of its own; the read
stays the authority."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from formats import FORMATS

from lmdata.errors import LmdataError
from lmdata.io.mappings import check_ahead
from lmdata.store import open_store

pytestmark = pytest.mark.skipif(check_ahead is None, reason="needs the C extension")


def _wait() -> int:
    """Until the check-ahead thread is idle: the unchecked blocks its finished jobs met (-1: none finished)."""
    from lmdata.io._preads import check_ahead_wait

    return check_ahead_wait()


def _blocks_of(reader):
    """The object holding the block state: the Lance reader's decoded copies, else the reader."""
    inner = getattr(reader, "_chunks", reader)
    return inner if inner not in (False, None) else reader


def _first_reads(reader, syn) -> None:
    """A few tokens of every shard, twice: a process's first read opens the shards (Parquet's and Lance's
    decoded copies made as they are met), the second maps them; check_ahead works from then on."""
    for _ in range(2):
        reader.windows(np.arange(0, len(syn.stream) - 10, 1000), 10)


def _starts(syn, n=64, length=1025, seed=0):
    return np.random.default_rng(seed).integers(100, len(syn.stream) - length, size=n)


def _expected(syn, starts, length):
    """The stream's windows of ``length`` tokens at ``starts``: what a read must return."""
    return syn.stream[np.asarray(starts)[:, None] + np.arange(length)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_handed_over_are_checked_and_the_windows_are_unchanged(make_store, fmt):
    syn = make_store([fmt], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", fmt)
    starts = _starts(syn)
    _wait()  # (jobs of earlier tests, reported)
    reader.check_ahead(starts, 1025)
    assert _wait() in (0, -1)  # before the first reads: nothing mapped, nothing checked
    _first_reads(reader, syn)
    state = _blocks_of(reader)
    before = int(state._done.sum())
    assert reader.check_ahead(starts, 1025) == -1  # handed over; no job has finished since
    checked = _wait()
    newly = int(state._done.sum()) - before
    assert newly > 0 and checked == newly + len(starts)  # checked and read on the other thread, and counted
    reader.check_ahead(starts, 1025)
    assert _wait() == len(starts)  # the repeat met no unchecked block, and read its windows again
    done = int(state._done.sum())
    assert len(state._read_ahead) == 1  # (the repeat's windows: the first read ahead let go)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not state._read_ahead  # the read took the windows read ahead
    assert int(state._done.sum()) == done  # the read found every block under its windows checked


def test_windows_read_ahead_are_taken_only_by_a_read_of_the_same_windows(make_store):
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    starts = _starts(syn)
    reader.check_ahead(starts, 1025)
    _wait()
    other = starts + 1
    np.testing.assert_array_equal(reader.windows(other, 1025), _expected(syn, other, 1025))
    np.testing.assert_array_equal(reader.windows(starts, 1024), _expected(syn, starts, 1024))
    assert len(reader._read_ahead) == 1  # neither was the read handed over
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not reader._read_ahead


def test_what_a_reader_holds_read_ahead_is_bounded_by_bytes(make_store, monkeypatch):
    from lmdata.store.formats import mapped_windows

    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    monkeypatch.setattr(mapped_windows, "READ_AHEAD_BYTES", 3 * 64 * 1025 * 2)  # three reads of 64 windows
    for seed in range(5):
        reader.check_ahead(_starts(syn, seed=seed), 1025)
    assert len(reader._read_ahead) == 3  # the next two only checked: the first three are the soonest read
    starts = _starts(syn, seed=4)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    fresh = open_store(syn.path).reader("train", "memmap")
    _first_reads(fresh, syn)
    _wait()
    before = int(fresh._done.sum())
    assert fresh.check_ahead(_starts(syn, n=200, seed=9), 1025) == -1  # larger than the bound: checked, not read
    assert 0 < _wait() == int(fresh._done.sum()) - before and not fresh._read_ahead


def test_size_verification_reads_ahead_without_checking(make_store):
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap", verify="size")
    _first_reads(reader, syn)
    starts = _starts(syn)
    _wait()
    assert reader.check_ahead(starts, 1025) == -1
    assert _wait() == len(starts) and not reader._done.any()  # read, nothing checked
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not reader._read_ahead


def test_a_bad_block_handed_over_is_left_unmarked_and_the_read_names_it(make_store):
    syn = make_store(["memmap"], n_tokens=70_000)
    shard = open_store(syn.path).manifest.splits["train"].formats["memmap"][1]
    path = syn.path / "train" / "memmap" / shard.files[0].path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # the token at the shard's middle
    path.write_bytes(bytes(data))
    reader = open_store(syn.path).reader("train", "memmap")
    for _ in range(2):  # the first reads (see _first_reads), in shard 0
        np.testing.assert_array_equal(reader.windows(np.array([5]), 100)[0], syn.stream[5:105])
    assert reader._mappings.bases.all()
    start = np.array([shard.first_token + shard.n_tokens // 2 - 20])
    reader.check_ahead(start, 100)
    _wait()
    block = reader._block_base[1] + (len(data) // 2) // 4096
    assert not reader._done[block]
    for _ in range(2):
        with pytest.raises(LmdataError, match=shard.files[0].path):
            reader.windows(start, 100)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # (imported by other tests; not used here)
def test_a_forked_child_starts_a_check_ahead_thread_of_its_own(make_store):
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    reader.check_ahead(_starts(syn), 1025)
    _wait()
    busy = _starts(syn, n=1_000_000, length=64)
    for _ in range(3):
        reader.check_ahead(busy, 64)  # jobs running and waiting at the fork: the child has no thread for them
    pid = os.fork()
    if pid == 0:  # the parent's thread is not here: a job handed over must still run, not hang
        signal.alarm(30)
        _wait()  # the parent's jobs are not the child's to wait for
        _first_reads(reader, syn)  # this process's own (its block state and mappings start empty)
        before = int(reader._done.sum())
        reader.check_ahead(_starts(syn, seed=1), 1025)
        _wait()
        held = reader._read_ahead  # this process's own: not the parent's, read by a thread it has not
        same = np.array_equal(reader.windows(_starts(syn), 1025), _expected(syn, _starts(syn), 1025))
        os._exit(0 if int(reader._done.sum()) > before and len(held) == 1 and same else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _wait()


def test_bad_arguments_are_a_value_error(make_store):
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    with pytest.raises(ValueError, match="check_ahead"):
        reader.check_ahead(np.array([len(syn.stream) - 5]), 1025)  # past the split's end


def test_a_reader_collected_while_its_job_runs_waits_for_it_before_unmapping(make_store):
    """The job names the reader's mappings, not the reader: unmapping under it would crash the thread."""
    import gc

    syn = make_store(["memmap"], shard_tokens=2_000)
    for seed in range(5):
        reader = open_store(syn.path).reader("train", "memmap")
        _first_reads(reader, syn)
        reader.check_ahead(_starts(syn, n=50_000, length=64, seed=seed), 64)
        del reader
        gc.collect()  # the mappings' finalizer: it waits for the job, then unmaps
    _wait()  # reaching here, the process alive, is the test


def test_jobs_handed_over_back_to_back_all_run(make_store, tmp_path):
    """A mixture hands one job per source a read: the second must not replace the first."""
    syn = make_store(["memmap"], shard_tokens=2_000)
    busy, *readers = [open_store(syn.path).reader("train", "memmap") for _ in range(4)]
    for reader in [busy, *readers]:
        _first_reads(reader, syn)
    before = [int(r._done.sum()) for r in readers]
    _wait()
    busy.check_ahead(_starts(syn, n=1_000_000, length=64), 64)  # keeps the thread busy while the rest wait
    for reader in readers:
        reader.check_ahead(_starts(syn), 1025)
    _wait()
    assert all(int(r._done.sum()) > b for r, b in zip(readers, before))


def test_the_starts_handed_over_are_the_jobs_own(make_store):
    """The thread reads the windows' starts later: a caller refilling its array must not reach it."""
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    busy = open_store(syn.path).reader("train", "memmap")
    _first_reads(busy, syn)
    _wait()
    busy.check_ahead(_starts(syn, n=1_000_000, length=64), 64)  # the next job waits behind this one
    starts = _starts(syn)
    reader.check_ahead(starts, 1025)
    starts[:] = -(1 << 40)  # outside every mapping
    assert _wait() > 0  # alive, and the job checked the windows it was given


def test_a_wait_is_for_the_jobs_handed_over_before_it(make_store):
    """Another thread handing over jobs without pause (the queue never empty) must not keep a wait (the
    mappings' finalizer, a replaced shard) waiting: it waits for the jobs it found, not for an idle thread."""
    import threading

    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    _wait()
    busy, stop, handed = _starts(syn, n=100_000, length=64), threading.Event(), []

    def hand_over():
        while not stop.is_set():
            reader.check_ahead(busy, 64)
            handed.append(1)

    feeder = threading.Thread(target=hand_over, daemon=True)
    feeder.start()
    while len(handed) < 200:  # the queue full (64 waiting) and kept full
        stop.wait(0.01)
    waiter = threading.Thread(target=_wait, daemon=True)
    waiter.start()
    waiter.join(timeout=120)  # a guard against a hang, not a timing: the wait needs ~65 jobs
    returned = not waiter.is_alive()
    stop.set()
    feeder.join()
    _wait()
    assert returned, "check_ahead_wait waited for a queue another thread kept full"


def test_a_read_whose_job_has_not_started_takes_it_back_and_reads_itself(make_store):
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader, busy = (open_store(syn.path).reader("train", "memmap") for _ in range(2))
    for r in (reader, busy):
        _first_reads(r, syn)
    _wait()
    for seed in range(3):  # check-only jobs (past the read-ahead bound) keeping the thread busy
        busy.check_ahead(_starts(syn, n=1_000_000, length=64, seed=seed), 64)
    starts = _starts(syn)
    reader.check_ahead(starts, 1025)
    (_, status, _), = reader._read_ahead.values()
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    _wait()
    assert status[0] == -3  # taken back before the thread reached it: never run


def test_a_read_waiting_for_its_running_job_takes_the_next_one_back(make_store, monkeypatch):
    import time

    from lmdata.store.formats import mapped_windows

    monkeypatch.setattr(mapped_windows, "READ_AHEAD_BYTES", 1 << 30)
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    _wait()
    running, after = _starts(syn, n=1_000_000, length=64), _starts(syn, seed=1)
    reader.check_ahead(running, 64)  # ~128 MB read ahead: running while the read below waits for it
    reader.check_ahead(after, 1025)
    statuses = [status for _, status, _ in reader._read_ahead.values()]
    time.sleep(0.005)  # (the thread woken and started on the first)
    got = reader.windows(running, 64)
    assert statuses[0][0] == -1 and statuses[1][0] == -3  # read by the thread; the next one taken back
    np.testing.assert_array_equal(got[:5], _expected(syn, running[:5], 64))
    np.testing.assert_array_equal(reader.windows(after, 1025), _expected(syn, after, 1025))
    _wait()
    assert statuses[1][0] == -3


def test_windows_read_ahead_and_never_taken_are_let_go(make_store, monkeypatch):
    from lmdata.store.formats import mapped_windows

    monkeypatch.setattr(mapped_windows, "READ_AHEAD_HANDED", 4)
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    left = _starts(syn, seed=99)
    reader.check_ahead(left, 1025)  # a pass left early: never read
    for seed in range(4):
        reader.check_ahead(_starts(syn, seed=seed), 1025)
    assert (left.tobytes(), 1025) in reader._read_ahead
    reader.check_ahead(_starts(syn, seed=4), 1025)  # the fifth hand-over since
    assert (left.tobytes(), 1025) not in reader._read_ahead and len(reader._read_ahead) == 5
    _wait()


def test_a_shard_cut_short_under_its_mapping_fails_the_job_and_the_read_names_it(make_store):
    syn = make_store(["memmap"], n_tokens=100_000, shard_tokens=20_000)
    reader = open_store(syn.path).reader("train", "memmap")
    _first_reads(reader, syn)
    shard = open_store(syn.path).manifest.splits["train"].formats["memmap"][2]
    path = syn.path / "train" / "memmap" / shard.files[0].path
    start = np.array([shard.first_token + shard.n_tokens - 300])
    _wait()
    os.truncate(path, 4096)  # the pages under the window gone from under the mapping
    reader.check_ahead(start, 100)
    _wait()  # the thread met SIGBUS in the window, caught it, and lives on
    (_, status, _), = reader._read_ahead.values()
    assert status[0] == 0  # the job's first window failed: the read does it again itself
    with pytest.raises(LmdataError, match=shard.files[0].path):
        reader.windows(start, 100)
    assert not reader._read_ahead
