"""Bad input: one-line errors naming the file/flag, a non-zero exit, no partial output."""

import io
import json
import sys

import pytest
from samples import run_cli

from lmdata.cli import main
from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.saved import FILES

EOT = "<|endoftext|>"


def run(argv, capsys, stdin: bytes = b"", monkeypatch=None):
    """Run the CLI; return (exit code, stdout, stderr)."""
    if monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return run_cli(argv, capsys)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text(("the quick brown fox jumps over the lazy dog\n" + EOT + "\n") * 20)
    return path


def _train_fails(argv, capsys, tmp_path, *words):
    code, _, err = run(["tokenizer", "train", *argv, "--out", str(tmp_path / "tok"), "--no-progress"], capsys)
    line = err.strip()
    assert code != 0 and line.startswith("error: ") and "\n" not in line, err
    assert all(w in line for w in words), line
    assert not (tmp_path / "tok").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tok")]  # no temp dir left either


def test_train_cli_writes_a_loadable_tokenizer(corpus, tmp_path, capsys):
    code, out, _ = run(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                        "--workers", "1", "--no-progress"], capsys)
    assert code == 0 and "distinct pre-tokens" in out and "merges" in out
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == sorted(FILES)
    tok = Tokenizer.load(tmp_path / "tok")
    assert tok.eot_id == tok.vocab_size - 1


def test_missing_input(tmp_path, capsys):
    _train_fails([str(tmp_path / "nope.txt"), "--vocab-size", "300"], capsys, tmp_path, "nope.txt", "no such file")


def test_empty_input(tmp_path, capsys):
    (tmp_path / "empty.txt").write_bytes(b"")
    _train_fails([str(tmp_path / "empty.txt"), "--vocab-size", "300"], capsys, tmp_path, "empty.txt", "empty")


def test_directory_as_input(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    _train_fails([str(tmp_path / "adir"), "--vocab-size", "300"], capsys, tmp_path, "adir", "directory")


def test_unreadable_input(tmp_path, capsys):
    import os

    path = tmp_path / "secret.txt"
    path.write_text("hello")
    path.chmod(0)
    if os.access(path, os.R_OK):
        pytest.skip("running as root: permissions do not stop reads")
    _train_fails([str(path), "--vocab-size", "300"], capsys, tmp_path, "secret.txt", "cannot read")


def test_input_path_through_a_file(tmp_path, capsys):
    """Opening fails with an OSError even as root: the path runs through a regular file."""
    (tmp_path / "file.txt").write_text("x")
    _train_fails([str(tmp_path / "file.txt" / "sub"), "--vocab-size", "300"], capsys, tmp_path, "sub")


def test_invalid_utf8_names_file_and_offset(tmp_path, capsys):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello world " * 1000 + b"\xff\xfe oops " + b"more text " * 10)
    _train_fails([str(path), "--vocab-size", "300"], capsys, tmp_path, "bad.txt", "byte offset 12000", "--errors replace")


def test_invalid_utf8_offset_across_blocks(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes("é".encode() * 5000 + b"\xc3(" + b" tail")
    with pytest.raises(LmdataError, match="byte offset 10000"):
        train_bpe(path, 300, [EOT], workers=1, block_bytes=333)


def test_a_binary_file_is_refused_even_with_errors_replace(tmp_path, capsys):
    """As ingest refuses it: a PNG had been 'trained' on, 12,786 invalid sequences replaced."""
    import random

    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + random.Random(0).randbytes(5000))
    code, _, err = run(["tokenizer", "train", str(path), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                        "--errors", "replace", "--workers", "1", "--no-progress"], capsys)
    assert code == 1 and f"input {path}: binary data (" in err and "--errors replace does not apply" in err
    assert not (tmp_path / "tok").exists()


def test_errors_replace_counts_replacements(tmp_path, capsys):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello \xff world \xc3( and \xe2\x82 end")
    code, out, _ = run(["tokenizer", "train", str(path), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                        "--errors", "replace", "--workers", "1", "--no-progress"], capsys)
    assert code == 0 and "3 invalid UTF-8 sequences replaced" in out


@pytest.mark.parametrize("size", ["256", "100"])
def test_vocab_size_too_small(corpus, tmp_path, capsys, size):
    _train_fails([str(corpus), "--vocab-size", size], capsys, tmp_path, "--vocab-size", "257")


def test_empty_special_token(corpus, tmp_path, capsys):
    _train_fails([str(corpus), "--vocab-size", "300", "--special-token", ""], capsys, tmp_path, "--special-token")


def test_duplicate_special_token(corpus, tmp_path, capsys):
    _train_fails([str(corpus), "--vocab-size", "300", "--special-token", EOT, "--special-token", EOT],
                 capsys, tmp_path, "--special-token", "more than once")


@pytest.fixture
def saved(corpus, tmp_path):
    vocab, merges = train_bpe(corpus, 300, [EOT], workers=1)
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "saved")
    return tmp_path / "saved"


def test_encode_decode_cli_round_trip(saved, capsys, monkeypatch):
    text = "the lazy fox\r\n" + EOT + " über\n"
    code, out, _ = run(["tokenizer", "encode", str(saved)], capsys, text.encode(), monkeypatch)
    assert code == 0 and out.endswith("\n")
    assert [int(x) for x in out.split()] == Tokenizer.load(saved).encode(text)
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(out.encode())))
    main(["tokenizer", "decode", str(saved)])
    sys.stdout.flush()
    assert sys.stdout.buffer.getvalue().decode() == text


def test_decode_unknown_id(saved, capsys, monkeypatch):
    code, _, err = run(["tokenizer", "decode", str(saved)], capsys, b"1 2 99999\n", monkeypatch)
    assert code == 1 and "unknown token id 99999" in err and err.count("\n") == 1


def test_decode_not_an_id(saved, capsys, monkeypatch):
    code, _, err = run(["tokenizer", "decode", str(saved)], capsys, b"1 x2\n", monkeypatch)
    assert code == 1 and "'x2' is not a token id" in err


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt", "lmdata_tokenizer.json"])
def test_tokenizer_dir_missing_a_file(saved, capsys, monkeypatch, name):
    (saved / name).unlink()
    code, _, err = run(["tokenizer", "encode", str(saved)], capsys, b"hi", monkeypatch)
    assert code == 1 and name in err and "missing" in err


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt"])
def test_tokenizer_dir_content_changed(saved, capsys, monkeypatch, name):
    path = saved / name
    path.write_text(path.read_text().replace("Ġ", "Ċ", 1))
    code, _, err = run(["tokenizer", "decode", str(saved)], capsys, b"1", monkeypatch)
    assert code == 1 and name in err and "does not match" in err


def test_a_damaged_or_unreadable_metadata_file_says_which(saved):
    """Both had read "not an lmdata tokenizer (format 'lmdata-bpe', version 1 or 2 expected)"."""
    import os

    meta = saved / "lmdata_tokenizer.json"
    good = meta.read_text()
    meta.write_text(good[: len(good) // 2])
    with pytest.raises(LmdataError, match=r"lmdata_tokenizer.json: not valid JSON \(.*\); the tokenizer directory "
                                          "is damaged, save or train it again"):
        Tokenizer.load(saved)
    meta.write_text(good)
    meta.chmod(0)
    try:
        if os.access(meta, os.R_OK):
            pytest.skip("running as root: permissions do not stop reads")
        with pytest.raises(LmdataError, match=r"lmdata_tokenizer.json: cannot be read \(Permission denied\)"):
            Tokenizer.load(saved)
    finally:
        meta.chmod(0o644)


def test_metadata_hash_changed(saved):
    meta = json.loads((saved / "lmdata_tokenizer.json").read_text())
    meta["special_tokens"] = ["<|other|>"]
    (saved / "lmdata_tokenizer.json").write_text(json.dumps(meta))
    with pytest.raises(LmdataError, match="lmdata_tokenizer.json"):
        Tokenizer.load(saved)


def test_out_is_a_non_tokenizer_directory(corpus, tmp_path, capsys):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "keep.txt").write_text("mine")
    code, _, err = run(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                        "--no-progress"], capsys)
    assert code == 1 and "--out" in err and (tmp_path / "tok" / "keep.txt").exists()


def test_encode_invalid_utf8_on_stdin(saved, capsys, monkeypatch):
    code, _, err = run(["tokenizer", "encode", str(saved)], capsys, b"ok \xff bad", monkeypatch)
    assert code == 1 and "stdin" in err and "UTF-8" in err and err.count("\n") == 1


def test_cli_processes_end_to_end(corpus, tmp_path):
    """The real entry point in subprocesses: train, encode | decode, and a failing call."""
    import subprocess

    lmdata = [sys.executable, "-m", "lmdata", "tokenizer"]
    out = tmp_path / "tok"
    subprocess.run([*lmdata, "train", str(corpus), "--vocab-size", "280", "--out", str(out), "--no-progress"],
                   check=True, capture_output=True)
    text = "the lazy dog " + EOT + " jumps\n"
    ids = subprocess.run([*lmdata, "encode", str(out)], input=text.encode(), check=True, capture_output=True).stdout
    back = subprocess.run([*lmdata, "decode", str(out)], input=ids, check=True, capture_output=True).stdout
    assert back.decode() == text
    bad = subprocess.run([*lmdata, "decode", str(out)], input=b"5 123456", capture_output=True)
    assert bad.returncode == 1 and bad.stderr.decode().count("\n") == 1 and "123456" in bad.stderr.decode()


def test_decode_and_encode_batch_name_what_they_were_given(saved):
    """decode(tensor) had said 'unknown token id tensor(100)' for a valid id; encode_batch('abc') had
    encoded three one-character texts."""
    import numpy as np
    import torch

    tok = Tokenizer.load(saved)
    ids = tok.encode("hello world")
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == tok.decode(tuple(ids)) == "hello world"
    with pytest.raises(LmdataError, match=r"not a token id \(give a flat sequence of ints\): \[\d+, \d+\]"):
        tok.decode(torch.tensor([ids[:2]]))
    with pytest.raises(LmdataError, match="not a sequence of token ids: 5; give a list of ints"):
        tok.decode(5)
    with pytest.raises(LmdataError, match="encode_batch takes a list of texts, not one str; use encode"):
        tok.encode_batch("abc")
    with pytest.raises(LmdataError, match=r"encode_batch num_workers=-1: give a whole number >= 1"):
        tok.encode_batch(["abc"], num_workers=-1)
