"""The bench's verdict (issue 30.6): steady state with the warm-up apart, repeats, and "too noisy".

Two identical runs of the sample bench stalled 10.5% and 32.1% and every row said NO: a short
run's start-up and one slow read decided it. The verdict here is computed from synthetic
per-step figures, so every expected value follows from arithmetic, not from this machine's speed.
"""

from __future__ import annotations

import json
import time

import pytest

from lmdata.bench import report, stall, verdict
from lmdata.bench.verdict import DOES_NOT, KEEP_UP_STALL, KEEPS_UP, TOO_NOISY


def loop_times(wait_ms: float, compute_ms: float = 10.0, steps: int = 20, warmup_wait_ms: float = 500.0,
               warmup: int = 4, first_ms: float = 2000.0) -> stall.LoopTimes:
    """One repeat's per-step figures: ``steps`` steady steps, a slow warm-up and a slower first batch."""
    return stall.LoopTimes(wait_s=[wait_ms / 1e3] * steps, compute_s=[compute_ms / 1e3] * steps,
                           first_batch_s=first_ms / 1e3, wall_s=0.0,
                           warmup_wait_s=[warmup_wait_ms / 1e3] * warmup, warmup_compute_s=[compute_ms / 1e3] * warmup)


def row(*wait_ms: float) -> dict:
    """A cell's row from repeats that wait ``wait_ms`` per 10 ms step (stall = w / (w + 10))."""
    return verdict.combine([verdict.repeat_figures(loop_times(w), 10.0, 1.0) for w in wait_ms])


def test_clear_yes_clear_no_and_straddling_is_too_noisy():
    yes = row(0.1, 0.2, 0.3)  # 1-3% stall, every repeat under 5%
    assert yes["verdict"] == KEEPS_UP and yes["keeps_up"] is True
    no = row(2.0, 3.0, 1.0)  # 9-23%
    assert no["verdict"] == DOES_NOT and no["keeps_up"] is False
    assert no["stall_fraction"] == pytest.approx(2 / 12) and no["stall_min"] == pytest.approx(1 / 11)
    assert no["stall_max"] == pytest.approx(3 / 13)
    # 1%, 1%, 23%: the median says yes, one slow repeat says no -- the figure cannot decide
    noisy = row(0.1, 0.1, 3.0)
    assert noisy["verdict"] == TOO_NOISY and noisy["keeps_up"] is None
    assert noisy["stall_fraction"] < KEEP_UP_STALL < noisy["stall_max"]


def test_the_threshold_itself_does_not_keep_up():
    assert verdict.verdict([KEEP_UP_STALL]) == DOES_NOT
    assert verdict.verdict([KEEP_UP_STALL * 0.99]) == KEEPS_UP
    assert verdict.verdict([0.01, 0.5], threshold=0.6) == KEEPS_UP
    with pytest.raises(ValueError):
        verdict.verdict([])


def test_warm_up_and_first_batch_are_reported_apart_from_the_steady_stall():
    r = row(0.1, 0.1, 0.1)  # warm-up waits 500 ms per 10 ms step, the first batch 2 s
    assert r["stall_fraction"] == pytest.approx(0.1 / 10.1)
    assert r["warmup_stall_fraction"] == pytest.approx(500 / 510)
    assert r["first_batch_ms"] == pytest.approx(2000.0)
    assert r["wait_ms_max"] == pytest.approx(0.1) and r["steps"] == 20  # the warm-up is in no percentile
    assert len(r["wait_ms"]) == 3 * 20  # the CDF plot pools every repeat's steady steps


def slow_start(n: int, slow: int, slow_ms: float):
    """A loader whose first ``slow`` batches take ``slow_ms`` each, the rest nothing (a cold start)."""
    for i in range(n):
        if i < slow:
            time.sleep(slow_ms / 1e3)
        yield i, i


def test_time_steps_leaves_the_warm_up_out_of_the_steady_state():
    seen = []

    def step(x, y) -> float:  # a fixed 10 ms "compute", reported without sleeping
        seen.append(x)
        return 0.010

    times = stall.time_steps(slow_start(30, 5, 50.0), step, steps=30, warmup=4)
    assert seen == list(range(30))
    assert len(times.warmup_wait_s) == 4 and len(times.wait_s) == 25 and times.first_batch_s >= 0.049
    assert min(times.warmup_wait_s) >= 0.049  # sleeps never return early: the slow batches 1-4
    steady = stall.summarize(times.wait_s, times.compute_s)["stall_fraction"]
    warm = stall.summarize(times.warmup_wait_s, times.warmup_compute_s)["stall_fraction"]
    assert warm >= 50 / 60 - 1e-6 and steady < warm  # without the warm-up the slow start would dominate
    assert len(stall.time_steps(slow_start(6, 0, 0), step, steps=6).wait_s) == 5  # warmup=0: first step only


def test_the_warm_up_goes_on_while_the_reader_settles_by_at_most_spare_steps():
    """``settle`` (a reader still opening its split behind the first batch) extends the warm-up; the
    steady state keeps its step count, and ``spare`` bounds the extension (the split's batches)."""
    def step(x, y) -> float:
        return 0.010

    calls = iter([True] * 3 + [False] * 100)
    times = stall.time_steps(slow_start(40, 0, 0), step, steps=20, warmup=4, settle=lambda: next(calls), spare=10)
    assert len(times.warmup_wait_s) == 4 + 3 and len(times.wait_s) == 20 - 1 - 4
    capped = stall.time_steps(slow_start(40, 0, 0), step, steps=20, warmup=4, settle=lambda: True, spare=2)
    assert len(capped.warmup_wait_s) == 4 + 2 and len(capped.wait_s) == 20 - 1 - 4
    drawn = []
    stall.time_loader((drawn.append(i) or (i, i) for i in range(40)), 20, warmup=5, settle=lambda: True, spare=6)
    assert len(drawn) == 20 + 6  # the loader's rate is timed after the extra batches


def _result(rows: list[dict], repeats: int) -> dict:
    for r in rows:
        r.update(cache="warm", format="memmap", workers=0, warmup_steps=4, loader_tokens_per_s=1e6, headroom=2.0,
                 memory={})
    config = {"store": "/x/store", "split": "train", "batch_size": 16, "seq_len": 256, "steps_run": 20,
              "compute": "simulated", "step_ms": 10.0, "prefetch": 2, "model": "small", "device": "cpu",
              "repeats": repeats, "keep_up_stall": KEEP_UP_STALL}
    return {"config": config, "runs": rows, "machine": {"cpus": 2, "loadavg_1m_at_start": 1.0},
            "consume_tokens_per_s": 5e5}


def test_table_shows_median_spread_and_the_three_verdicts(tmp_path):
    result = _result([row(0.1, 0.2, 0.3), row(2.0, 3.0, 1.0), row(0.1, 0.1, 3.0)], repeats=3)
    text = report.table(result)
    head, *lines = text.splitlines()
    assert "spread" in head and "warm-up stall" in head
    assert " yes " in f" {lines[0]} "
    assert " NO " in lines[1] and " too noisy " in lines[2]
    assert "9.1%-23.1%" in lines[1] and "16.7%" in lines[1]  # min-max and median of 1/11, 2/12, 3/13
    legend = " ".join(report.notes(result))
    assert "5%" in legend and "too noisy" in legend and "median over 3 repeats" in legend
    paths = report.write_all(result, tmp_path / "out")  # plots take the spread too
    saved = json.loads(paths["json"].read_text())
    assert [len(r["repeats"]) for r in saved["runs"]] == [3, 3, 3]
    assert [r["stall_fraction"] for r in saved["runs"][1]["repeats"]] == pytest.approx([2 / 12, 3 / 13, 1 / 11])


def test_one_repeat_says_it_has_no_spread():
    assert "1 repeat (no spread" in " ".join(report.notes(_result([row(0.1)], repeats=1)))
