"""Training on JSONL, Parquet and Arrow inputs reads their documents' text, as ingest does (a JSONL file
read raw had taught the tokenizer `'":'` and `\\n` escapes; a Parquet file its binary pages)."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from samples import SAMPLE, run_cli

from lmdata.sources import SourceSpec, iter_documents
from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.train import train_bpe_stats

EOT = "<|endoftext|>"
DOCS = [d.text for d in iter_documents(SourceSpec((str(SAMPLE),)))][:20]


def _as_text(tmp_path, sep: str = EOT):
    """The documents as the text file they train like: each followed by the separator."""
    path = tmp_path / "docs.txt"
    path.write_text("".join(d + sep for d in DOCS), encoding="utf-8")
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_jsonl_parquet_and_arrow_train_like_their_documents_text(trainer, tmp_path, workers):
    expected = train_bpe(_as_text(tmp_path), 400, [EOT], workers=1)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS)))
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress((tmp_path / "d.jsonl").read_bytes()))
    pq.write_table(pa.table({"body": DOCS}), tmp_path / "d.parquet")
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("body", pa.string())])) as w:
        w.write_table(pa.table({"body": DOCS}))
    for name in ("d.jsonl", "d.jsonl.gz", "d.parquet", "d.arrow"):
        vocab, merges, stats = train_bpe_stats(tmp_path / name, 400, [EOT], workers=workers, text_field="body")
        assert (vocab, merges) == expected, name
    # and a document-per-line file read as documents too
    (tmp_path / "d.lines").write_text("".join(d.replace("\n", " ") + "\n" for d in DOCS))
    lines = train_bpe_stats(tmp_path / "d.lines", 400, [EOT], workers=1, kind="lines")[:2]
    flat = tmp_path / "flat.txt"
    flat.write_text("".join(d.replace("\n", " ") + EOT for d in DOCS))
    assert lines == train_bpe(flat, 400, [EOT], workers=1)


def test_a_custom_pattern_trains_on_documents_too(tmp_path):
    """A custom regex counts in processes: the documents input travels to them."""
    pattern = r"\s?\w+|\s+|[^\w\s]+"
    expected = train_bpe_stats(_as_text(tmp_path), 300, [EOT], workers=1, pattern=pattern)[:2]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    assert train_bpe_stats(tmp_path / "d.jsonl", 300, [EOT], workers=2, pattern=pattern)[:2] == expected


def test_cli_takes_kind_and_text_field(trainer, tmp_path, capsys):
    pq.write_table(pa.table({"content": DOCS}), tmp_path / "d.parquet")
    code, _, err = run_cli(["tokenizer", "train", str(tmp_path / "d.parquet"), "--text-field", "content",
                            "--vocab-size", "400", "--out", str(tmp_path / "tok"), "--workers", "1", "--no-progress"],
                           capsys)
    assert code == 0, err
    assert Tokenizer.load(tmp_path / "tok").merges == train_bpe(_as_text(tmp_path), 400, [EOT], workers=1)[1]
    code, _, err = run_cli(["tokenizer", "train", str(tmp_path / "d.parquet"), "--vocab-size", "400",
                            "--out", str(tmp_path / "tok2"), "--workers", "1", "--no-progress"], capsys)
    assert code == 1 and err.startswith("error: ") and "text" in err and len(err.splitlines()) == 1, err


def test_a_pipeline_trains_on_its_splits_text_field(tmp_path):
    """[tokenizer] train_files of JSONL take the [ingest] splits' text_field (it had read field 'text')."""
    from lmdata.config import IngestConfig, SplitConfig, TokenizerConfig
    from lmdata.pipeline import ensure_tokenizer

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": d, "text": "x"}) + "\n" for d in DOCS))
    cfg = TokenizerConfig(dir=str(tmp_path / "tok"), train_files=[str(tmp_path / "d.jsonl")], vocab_size=400,
                          special_tokens=[EOT])
    ingest = IngestConfig(out=str(tmp_path / "store"), splits={"train": SplitConfig([str(tmp_path / "d.jsonl")],
                                                                                    text_field="body")})
    ensure_tokenizer(cfg, progress=False, log=lambda line: None, ingest=ingest)
    assert Tokenizer.load(tmp_path / "tok").merges == train_bpe(_as_text(tmp_path), 400, [EOT], workers=1)[1]


def test_a_document_longer_than_a_read_and_replaced_utf8_are_counted(tmp_path):
    """A document is served in 1 MiB reads (through a view, not by copying what is left); invalid UTF-8
    replaced while the documents are read is counted in the training's stats."""
    big = " ".join(DOCS) * 12
    assert len(big.encode()) > 3 << 20
    (tmp_path / "big.jsonl").write_text(json.dumps({"text": big}) + "\n")
    (tmp_path / "big.txt").write_text(big + EOT)
    assert train_bpe_stats(tmp_path / "big.jsonl", 300, [EOT], workers=1)[:2] == train_bpe(tmp_path / "big.txt", 300, [EOT], workers=1)
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "bro\xffken"}\n')
    stats = train_bpe_stats(tmp_path / "bad.jsonl", 270, [EOT], workers=1, errors="replace")[2]
    assert stats.replacements == 1
