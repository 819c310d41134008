"""bench/same_tokens.py: a real cell on the shipped sample's store, and the table's lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

import same_tokens  # noqa: E402


def _store(path: Path, tokens: int, shards: int) -> Path:
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps(
        {"splits": {"train": {"n_tokens": tokens, "formats": {"memmap": {"shards": [{}] * shards}}}}}))
    return path


def test_each_line_is_a_variant_with_each_stores_median_and_its_ratio(tmp_path):
    small, big = _store(tmp_path / "s", 12_000_000, 12), _store(tmp_path / "b", 1_029_000_000, 992)
    rows = [{"format": "memmap", "workers": w, "ahead": a, "store": str(st), "tokens_per_s": rate}
            for w, a, st, rate in [(0, "1", small, 5e8), (0, "1", small, 4e8), (0, "1", small, 9e8),
                                   (0, "1", big, 4.5e8),
                                   (0, "0", small, 5e8), (0, "0", big, 3e8), (2, "1", small, 2e8), (2, "1", big, 2.2e8)]]
    lines = same_tokens.table_lines(rows, [small, big])
    assert lines[0] == "| format | workers | 12 M tokens, 12 shards | 1,029 M tokens, 992 shards |"
    assert lines[2:] == ["| memmap | 0 | 500 | 450 (0.90x) |",
                         "| memmap | 0, `LMDATA_CHECK_AHEAD=0` | 500 | 300 (0.60x) |",
                         "| memmap | 2 | 200 | 220 (1.10x) |"]


@pytest.mark.parametrize("workers, ahead", [(0, "1"), (0, "0")])
def test_a_cell_reads_the_tokens_asked_for_in_whole_epochs(sample_store, workers, ahead):
    tokens = 40 * same_tokens.B * same_tokens.L
    got = same_tokens.run_cell(Path(sample_store), "memmap", workers, ahead, tokens)
    per_epoch = json.loads((Path(sample_store) / "manifest.json").read_text())["splits"]["train"]["n_tokens"] // (
        same_tokens.B * same_tokens.L)
    assert got["epochs"] == 39 // per_epoch  # 39 batches after the first, in epochs of per_epoch
    assert got["tokens_per_s"] == pytest.approx(39 * same_tokens.B * same_tokens.L / got["seconds"])


def test_a_failed_cell_names_its_variant_and_store(tmp_path):
    with pytest.raises(RuntimeError, match=r"memmap w0 LMDATA_CHECK_AHEAD=0 on .*nowhere"):
        same_tokens.run_cell(tmp_path / "nowhere", "memmap", 0, "0", 10 ** 6)
