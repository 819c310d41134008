"""Stall accounting against arithmetic: loaders that take a known time, steps of a known time.

Not speed tests: every expected value follows from the sleeps, and the margins are wide
enough for a loaded 2-core machine (sleeps only overshoot, by a millisecond or so).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.bench import cache, stall


def sleeping_loader(load_ms: float, n: int):
    """Loads in the caller's thread, like num_workers=0: every next() costs load_ms."""
    for i in range(n):
        time.sleep(load_ms / 1e3)
        yield i, i


def prefetching_loader(load_ms: float, n: int, depth: int = 2):
    """Loads in a background thread into a bounded queue, like workers with prefetch."""
    q: queue.Queue = queue.Queue(maxsize=depth)

    def produce() -> None:
        for i in range(n):
            time.sleep(load_ms / 1e3)
            q.put((i, i))

    threading.Thread(target=produce, daemon=True).start()
    for _ in range(n):
        yield q.get()


def test_serial_loader_stall_is_load_over_load_plus_step():
    times = stall.time_steps(sleeping_loader(20, 12), stall.simulated_step(30), steps=12)
    s = stall.summarize(times.wait_s, times.compute_s)
    assert s["steps"] == 11  # the first step is start-up, reported apart
    assert s["stall_fraction"] == pytest.approx(20 / (20 + 30), abs=0.1)
    # sleep never returns early: lower bounds are exact, upper ones would only measure load
    assert s["wait_ms_p50"] >= 19.5
    assert s["compute_ms_mean"] >= 29.5


def test_prefetch_faster_than_step_hides_the_load():
    times = stall.time_steps(prefetching_loader(10, 12), stall.simulated_step(30), steps=12)
    assert stall.summarize(times.wait_s, times.compute_s)["stall_fraction"] < 0.15


def test_prefetch_slower_than_step_waits_the_difference():
    # Producer 40 ms per batch, step 10 ms: each step waits ~30 ms -> stall 30 / 40.
    times = stall.time_steps(prefetching_loader(40, 12), stall.simulated_step(10), steps=12)
    s = stall.summarize(times.wait_s, times.compute_s)
    assert s["stall_fraction"] == pytest.approx(0.75, abs=0.12)
    assert s["wait_ms_p50"] >= 20  # ~30 ms minus scheduling slack; never near 0


def test_time_to_first_batch_is_reported_apart():
    def slow_start():
        time.sleep(0.2)
        yield from sleeping_loader(0, 5)

    times = stall.time_steps(slow_start(), stall.simulated_step(1), steps=5)
    assert times.first_batch_s >= 0.19
    assert max(times.wait_s) < times.first_batch_s  # the slow start is not in the per-step waits


def test_loader_only_rate():
    first, batches_per_s, memory = stall.time_loader(sleeping_loader(10, 11), steps=11)
    assert 0 < batches_per_s <= 101  # 10 ms sleeps: never faster than 100 batches/s
    assert memory["main_rss_mb"] > 0


def test_loader_rate_skips_the_workers_first_reads():
    """Batches 1-4 stand for workers starting up (50 ms each); the steady rate leaves them out."""
    def start_then_fast():
        for i in range(12):
            time.sleep(0.05 if i < 4 else 0)
            yield None

    _, with_start, _ = stall.time_loader(start_then_fast(), steps=12)  # times batches 2-12
    assert with_start <= 11 / 0.15  # three 50 ms sleeps are inside the timed span
    _, steady, _ = stall.time_loader(start_then_fast(), steps=12, warmup=4)  # times batches 5-12
    assert steady > with_start


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=50))
def test_summary_invariants(pairs):
    waits, computes = [p[0] for p in pairs], [p[1] for p in pairs]
    s = stall.summarize(waits, computes)
    total = sum(waits) + sum(computes)
    assert 0.0 <= s["stall_fraction"] <= 1.0
    if total > 0:
        assert s["stall_fraction"] == pytest.approx(sum(waits) / total)
    assert s["wait_ms_p50"] <= s["wait_ms_p95"] + 1e-9 <= s["wait_ms_p99"] + 2e-9 <= s["wait_ms_max"] + 3e-9


def _fs_type(path: Path) -> str:
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        if str(path).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not Path("/proc/mounts").exists(), reason="Linux only")
def test_evict_empties_the_page_cache(tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in RAM ({_fs_type(tmp_path)}): there is no page cache to drop")
    f = tmp_path / "shard.bin"
    f.write_bytes(os.urandom(4 << 20))
    f.read_bytes()
    assert cache.resident_fraction([f]) > 0.9
    assert cache.evict(cache.format_files(tmp_path)) == 4 << 20
    assert cache.resident_fraction([f]) < 0.1
