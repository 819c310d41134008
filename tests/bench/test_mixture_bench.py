"""bench/mixture.py: a real cell (one store, and a mixture of two) on the shipped sample's store, and the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import mixture  # noqa: E402


def test_each_line_is_one_build_with_the_best_of_each_kind_and_their_ratio():
    rows = [{"format": "memmap", "workers": w, "build": b, "kind": k, "tokens_per_s": rate}
            for w, b, k, rate in [(0, "new", "A", 5e8), (0, "new", "A", 4e8), (0, "new", "mixture", 3e8),
                                  (0, "old", "A", 5e8), (0, "old", "mixture", 1.5e8),
                                  (2, "new", "A", 2e8), (2, "new", "mixture", 1.6e8)]]
    assert mixture.table_lines(rows, ["new", "old"])[2:] == [
        "| memmap | 0 | new | 500 | 300 | 0.60x |",
        "| memmap | 0 | old | 500 | 150 | 0.30x |",
        "| memmap | 2 | new | 200 | 160 | 0.80x |",  # no "old" cells at 2 workers: no line
    ]


@pytest.mark.parametrize("stores", [1, 2])
def test_a_cell_reads_a_store_or_a_mixture(sample_store, stores):
    rate = mixture.run_cell([Path(sample_store)] * stores, "memmap", 0, warmup=2, batches=3, src=None)
    assert rate > 0


def test_a_failed_cell_names_its_stores_and_build(tmp_path):
    with pytest.raises(RuntimeError, match=r"memmap w0 \['nowhere'\] \(lmdata from here\)"):
        mixture.run_cell([tmp_path / "nowhere"], "memmap", 0, warmup=1, batches=1, src=None)
