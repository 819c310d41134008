"""bench/ingest.py: its table without the encode-only baseline, and the stores it keeps until the end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import ingest as ingest_bench  # noqa: E402

ROW = {"seconds": 5.0, "mb_s": 100.0, "tokens_s": 2.5e7, "cpu_s": 8.0, "peak_rss_mb": 320.0}


def test_a_table_without_encode_has_no_ratios():
    rows = [{"case": "ingest:lance", **ROW}, {"case": "ingest:memmap+parquet+lance", **ROW, "seconds": 7.5}]
    text = ingest_bench.table(rows, argparse.Namespace()) + ingest_bench.reading(rows)
    assert "| ingest:lance | 5.0 | 100.00 | 25,000,000 | — | 8.0 | — | 320 |" in text
    assert "all three formats take 1.50x memmap's" not in text  # no memmap row either


def test_a_table_with_encode_has_its_ratios():
    rows = [{"case": "encode", **ROW}, {"case": "ingest:memmap", **ROW, "mb_s": 80.0, "cpu_s": 10.0}]
    text = ingest_bench.table(rows, argparse.Namespace())
    assert "| ingest:memmap | 5.0 | 80.00 | 25,000,000 | 80% | 10.0 | 125% | 320 |" in text


def test_kept_stores_go_only_when_the_disk_is_short(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"x" * 1000)
    kept = [tmp_path / "a", tmp_path / "b"]
    for d in kept:
        d.mkdir()
    usage = ingest_bench.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(ingest_bench.shutil, "disk_usage", lambda p: usage._replace(free=10_000))
    ingest_bench.make_room(kept, corpus)  # 10 corpora free: kept
    assert len(kept) == 2 and (tmp_path / "a").is_dir()
    monkeypatch.setattr(ingest_bench.shutil, "disk_usage", lambda p: usage._replace(free=3_000))
    ingest_bench.make_room(kept, corpus)  # 3 corpora free: room made
    assert kept == [] and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
