"""`--out` given as a URI: `file:///ABS` is the local ABS for every command; `s3:/b/x` (a slash short) and,
where a command writes only locally, `s3://...` are one line, exit 1, and nothing written anywhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmdata.cli import main
from lmdata.store import open_store
from lmdata.store.verify import verify_store

from formats import FORMATS

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"


def _fails(argv: list[str], capsys, *words: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert all(w in err for w in words), err
    return err


def test_ingest_out_file_uri_writes_the_local_store(tokenizer_dir, tmp_path, monkeypatch):
    """`--out file:///ABS` failed on Lance with "no such object" and left ingest-plan.json."""
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "store"
    main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", f"file://{store}",
          "--format", ",".join(FORMATS), "--no-progress", "-q"])
    assert sorted(os.listdir(tmp_path)) == ["store"]  # no local tree named 'file:'
    s = open_store(f"file://{store}")
    assert set(s.formats("train")) == set(FORMATS) and len(s.dataset("train", 16)) > 0
    assert verify_store(str(store)).ok


@pytest.mark.parametrize("command", ["ingest", "tokenizer-train", "train", "bench", "tokenizer-import"])
def test_out_a_slash_short_of_s3_is_one_line_and_writes_nothing(command, tokenizer_dir, sample_store, tmp_path,
                                                                monkeypatch, capsys):
    """`--out s3:/b/x` was a pyarrow traceback (ingest) or a local `s3:/b/x/` tree (the rest)."""
    monkeypatch.chdir(tmp_path)
    argv = {
        "ingest": ["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir)],
        "tokenizer-train": ["tokenizer", "train", str(SAMPLE), "--vocab-size", "300"],
        "tokenizer-import": ["tokenizer", "import", str(tokenizer_dir / "tokenizer.json")],
        "train": ["train", "--store", str(sample_store), "--steps", "1", "--no-progress"],
        "bench": ["bench", "--store", str(sample_store), "--steps", "2", "--step-ms", "1"],
    }[command]
    _fails(argv + ["--out", "s3:/b/x"], capsys, "--out 's3:/b/x'", "slash missing")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["tokenizer-train", "train", "bench"])
def test_local_only_outputs_refuse_s3_and_take_file_uris(command, sample_store, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = {
        "tokenizer-train": ["tokenizer", "train", str(SAMPLE), "--vocab-size", "300"],
        "train": ["train", "--store", str(sample_store), "--steps", "1", "--no-progress", "-q", "--eval-every", "0"],
        "bench": ["bench", "--store", str(sample_store), "--steps", "2", "--step-ms", "1", "--loader-workers", "0",
                  "--format", "memmap", "--no-progress", "-q"],
    }[command]
    _fails(argv + ["--out", "s3://b/x"], capsys, "--out 's3://b/x'", "local disk only")
    assert os.listdir(tmp_path) == []
    main(argv + ["--out", f"file://{tmp_path}/out"])
    assert os.listdir(tmp_path) == ["out"] and os.listdir(tmp_path / "out")


@pytest.mark.parametrize("bad,words", [
    (["--store", "{tmp}/nope-store"], ("nope-store", "no such store")),
    (["--store", "{store}", "--format", "feather"], ("--format 'feather'",)),
    (["--store", "{store}", "--batch-size", "100000"], ("--batch-size 100000", "fewer than 2 batches")),
])
def test_bench_with_a_bad_input_leaves_no_out(sample_store, tmp_path, capsys, bad, words):
    """The inputs are checked before `--out` is made: a bad one left `--out/lmdata.json` behind."""
    out = tmp_path / "bench-out"
    argv = ["bench", *[a.format(tmp=tmp_path, store=sample_store) for a in bad], "--out", str(out), "--steps", "2",
            "--step-ms", "1", "--loader-workers", "0"]
    _fails(argv, capsys, *words)
    assert not out.exists()
