"""Tokenizer training from .gz and .zst files and quoted local globs: the same merges as the plain text."""

from __future__ import annotations

import gzip

import pytest
import zstandard
from samples import SAMPLE, run_cli

from lmdata.errors import LmdataError
from lmdata.tokenizer import train_bpe
from lmdata.tokenizer.train import train_bpe_stats

EOT = "<|endoftext|>"
TEXT = SAMPLE.read_bytes()[:60_000].rsplit(b"\n", 1)[0] + b"\n"


def _zst_two_frames(data: bytes) -> bytes:
    """Two zstd frames back to back, as `cat a.zst b.zst` makes them."""
    half = len(data) // 2
    zc = zstandard.ZstdCompressor()
    return zc.compress(data[:half]) + zc.compress(data[half:])


COMPRESS = {".gz": gzip.compress, ".zst": _zst_two_frames}


@pytest.mark.parametrize("ext", sorted(COMPRESS))
@pytest.mark.parametrize("block_bytes", [None, 4096])
def test_a_compressed_file_trains_like_the_plain_one(trainer, tmp_path, ext, block_bytes):
    plain, packed = tmp_path / "in.txt", tmp_path / f"in.txt{ext}"
    plain.write_bytes(TEXT)
    packed.write_bytes(COMPRESS[ext](TEXT))
    vocab, merges, stats = train_bpe_stats(packed, 400, [EOT], workers=2, block_bytes=block_bytes)
    assert (vocab, merges) == train_bpe(plain, 400, [EOT], workers=1, block_bytes=block_bytes)
    assert stats.bytes == len(TEXT)


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_over_a_compressed_input(trainer, tmp_path, capsys, monkeypatch, terminal):
    """The text's size is unknown up front: the bar counts text bytes with no total, and training finishes."""
    monkeypatch.setattr("lmdata._progress.is_terminal", lambda stream=None: terminal)
    monkeypatch.setenv("LMDATA_PROGRESS_SECONDS", "0")
    (tmp_path / "in.txt.gz").write_bytes(gzip.compress(TEXT))
    _, merges, stats = train_bpe_stats(tmp_path / "in.txt.gz", 300, [EOT], workers=1, progress=True,
                                       block_bytes=4096)
    assert len(merges) == 300 - 257 and stats.bytes == len(TEXT)
    assert "pre-tokenize" in capsys.readouterr().err


def test_cli_expands_a_quoted_local_glob(trainer, tmp_path, capsys):
    """`lmdata tokenizer train 'parts/*.txt*'` reads what `lmdata ingest --input 'parts/*.txt*'` would."""
    from lmdata.tokenizer import Tokenizer

    parts, plain = tmp_path / "parts", tmp_path / "plain"
    parts.mkdir()
    plain.mkdir()
    (parts / "a.txt").write_bytes(TEXT[:30_000])
    (parts / "b.txt.zst").write_bytes(_zst_two_frames(TEXT[30_000:]))
    (parts / "skip.md").write_bytes(b"not matched")
    (plain / "b.txt").write_bytes(TEXT[30_000:])
    code, _, err = run_cli(["tokenizer", "train", str(parts / "*.txt*"), "--vocab-size", "300",
                            "--out", str(tmp_path / "tok"), "--workers", "1", "--no-progress"], capsys)
    assert code == 0, err
    _, merges = train_bpe([parts / "a.txt", plain / "b.txt"], 300, [EOT], workers=1)
    assert Tokenizer.load(tmp_path / "tok").merges == merges


def test_a_file_uri_is_the_local_file(tmp_path):
    (tmp_path / "in.txt").write_bytes(TEXT)
    assert train_bpe(f"file://{tmp_path / 'in.txt'}", 300, [EOT], workers=1) == \
        train_bpe(tmp_path / "in.txt", 300, [EOT], workers=1)


# ---------------------------------------------------------------------------- errors


def _fails(tmp_path, name: str, data: bytes, *words: str) -> str:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(LmdataError) as info:
        train_bpe(tmp_path / name, 300, [EOT], workers=1, block_bytes=4096)
    line = str(info.value)
    assert "\n" not in line and name in line and all(w in line for w in words), line
    return line


def test_invalid_utf8_in_a_zst_names_the_decompressed_offset(tmp_path):
    _fails(tmp_path, "bad.txt.zst", _zst_two_frames(b"hello world " * 1000 + b"\xff oops " + b"x " * 10),
           "byte offset 12000 of the decompressed stream", "--errors replace")


def test_invalid_utf8_in_a_plain_file_says_no_decompressed_stream(tmp_path):
    line = _fails(tmp_path, "bad.txt", b"hello world " * 10 + b"\xff", "byte offset 120")
    assert "decompressed" not in line


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_a_truncated_compressed_file_is_one_line(tmp_path, ext):
    _fails(tmp_path, f"cut.txt{ext}", COMPRESS[ext](TEXT)[:-300], "cannot read")


def test_a_file_that_is_not_gzip_is_one_line(tmp_path):
    _fails(tmp_path, "fake.txt.gz", TEXT, "cannot read", "gzip")


def test_a_compressed_empty_text_is_empty(tmp_path):
    _fails(tmp_path, "empty.txt.gz", gzip.compress(b""), "is empty")


def test_cli_errors_on_a_truncated_file_exit_1_in_one_line(tmp_path, capsys):
    (tmp_path / "cut.txt.zst").write_bytes(_zst_two_frames(TEXT)[:-100])
    code, _, err = run_cli(["tokenizer", "train", str(tmp_path / "cut.txt.zst"), "--vocab-size", "300", "--out",
                            str(tmp_path / "tok"), "--no-progress"], capsys)
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1 and "cut.txt.zst" in err, err
    assert not (tmp_path / "tok").exists()
