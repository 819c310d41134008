"""bench/integrity.py: its ratios, its table, and its cell run on a real store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import integrity  # noqa: E402


def test_cost_is_default_time_over_size_time():
    rates = {"first-use": [80.0, 100.0, 90.0], "size": [110.0, 105.0, 120.0]}
    best, median = integrity.cost(rates)
    assert best == pytest.approx(120 / 100)
    assert median == pytest.approx(sorted([110 / 80, 105 / 100, 120 / 90])[1])


def test_table_has_a_line_per_level():
    rates = {"first-use": [1e8], "size": [1.2e8]}
    row = {"tokens": 5.9e6, "shards": 6, "format": "memmap", "first_batches": 50,
           "reader": rates, "loader": rates, "first": rates}
    lines = integrity.table([row])
    assert lines[2:] == [f"| 5.9 M, 6 shards | memmap | {level} | 120 | 100 | 1.20x | 1.20x |"
                         for level in ("reader", "loader", "first 50 batches")]


@pytest.mark.parametrize("fmt", ["memmap", "parquet", "lance"])
def test_the_cell_reads_both_modes(sample_store, fmt, tmp_path):
    env = {**__import__("os").environ, "LMDATA_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", integrity._CELL, str(sample_store), fmt, "3", "1", "2"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out) == {"first", "reader", "loader"}
    assert len(out["first"]["size"]) == len(out["first"]["first-use"]) == 3
    assert all(r > 0 for level in out.values() for rates in level.values() for r in rates)
