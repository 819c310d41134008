"""The peers benches' tables when --tools names no peer: "—" for "vs best peer", not a failure or "nanx"."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
import peers_remote  # noqa: E402


def test_the_remote_table_without_a_peer_at_one_latency():
    rows = [{"tool": "memmap", "workers": 0, "delay_ms": 0.0, "tokens_per_s": 1.4e8, "first_batch_s": 1.9},
            {"tool": "memmap", "workers": 0, "delay_ms": 20.0, "tokens_per_s": 1e8, "first_batch_s": 2.0},
            {"tool": "litdata", "workers": 0, "delay_ms": 20.0, "tokens_per_s": 5e7, "first_batch_s": 3.0}]
    text = peers_remote.table(rows, [0.0, 20.0])
    assert "| lmdata memmap | 0 | 140.00 | — | 1.9 s | 100.00 | 2.00x | 2.0 s |" in text
    assert "nan" not in text


def test_the_local_table_without_a_peer():
    row = {"tool": "memmap", "workers": 0, "tokens_per_s": 1.4e8, "first_batch_s": 1.44, "pss_mb": 482,
           "bytes_per_token": 2.01, "conversion_s": 10, "resume": True}
    assert "| lmdata memmap | 0 | 140.0 | — | 1.44 s | 482 | 2.01 | 10 s | yes |" in peers.table([row])
