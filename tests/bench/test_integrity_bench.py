"""bench/integrity.py and bench/interleaved.py: ratios, the table, and side-by-side reads of a real store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import integrity  # noqa: E402
import interleaved  # noqa: E402


def test_cost_is_default_time_over_size_time():
    rates = [[80.0, 100.0, 90.0], [110.0, 105.0, 120.0]]  # integrity.MODES: default, then size
    best, median = integrity.cost(rates)
    assert best == pytest.approx(120 / 100)
    assert median == pytest.approx(sorted([110 / 80, 105 / 100, 120 / 90])[1])
    assert integrity.cost([[100.0, 100.0], [110.0, 130.0]])[1] == pytest.approx(1.2)  # an even count: the mean of the middle two


def test_table_has_a_line_per_level():
    rates = [[1e8], [1.2e8]]
    row = {"tokens": 5.9e6, "shards": 6, "format": "memmap", "first_batches": 50,
           "reader": rates, "loader": rates, "first": rates}
    lines = integrity.table([row])
    assert lines[2:] == [f"| 5.9 M, 6 shards | memmap | {level} | 120 | 100 | 1.20x | 1.20x |"
                         for level in ("reader", "loader", "first 50 batches")]


@pytest.mark.parametrize("fmt,workers", [("memmap", 0), ("parquet", 0), ("lance", 0), ("memmap", 2)])
def test_side_by_side_reads_every_variant(sample_store, fmt, workers, tmp_path):
    env = {**os.environ, "LMDATA_CACHE_DIR": str(tmp_path / "cache")}
    variants = [{"store": str(sample_store), "verify": m} for m in integrity.MODES]
    out = interleaved.side_by_side(variants, fmt, workers=workers, batches=3, rounds=3, first_batches=2,
                                   warm_epochs=1, env=env)
    assert [s[:2] for s in out["seen"]] == [[str(sample_store), m] for m in integrity.MODES]
    assert out["order"] == [[0, 1], [1, 0], [0, 1]]  # the first variant of a round alternates
    assert set(out) == {"seen", "order", "first", "reader", "loader"}
    assert [len(r) for r in out["first"]] == [7, 7] and [len(r) for r in out["loader"]] == [3, 3]
    assert [len(r) for r in out["reader"]] == [3, 3]
    assert all(r > 0 for level in ("first", "reader", "loader") for rates in out[level] for r in rates)


def test_a_failed_cell_names_its_stores(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)nowhere.*no such store directory"):
        interleaved.side_by_side([{"store": str(tmp_path / "nowhere"), "verify": "size"}], "memmap", batches=1,
                                 rounds=1)


def test_integrity_table_without_first_batches():
    rates = [[1e8], [1.1e8]]
    row = {"tokens": 5.9e6, "shards": 6, "format": "lance", "first_batches": 0, "reader": rates, "loader": rates}
    assert len(integrity.table([row])) == 4


def test_the_side_by_side_line_compares_every_store_with_the_first():
    rates = [[100e6, 110e6], [90e6, 99e6], [80e6, 120e6]]
    assert interleaved.vs_first_line(["memmap", "loader", "2"], rates) == \
        "| memmap | loader | 2 | 110 | 99 (0.90x; 0.90x) | 120 (1.09x; 0.95x) |"
