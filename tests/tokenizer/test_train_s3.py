"""Tokenizer training from s3:// objects and globs (a real S3 server on loopback, moto).

Every input is a slice of data/sample.txt (moto keeps objects in memory), and every result
is compared with training on the same bytes from a local file, on the C and the
pure-Python path.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from samples import SAMPLE, put_object, run_cli

from lmdata.io.location import location
from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.pretokenize import ReadStats, iter_text_blocks
from lmdata.tokenizer.train import train_bpe_stats

EOT = "<|endoftext|>"


def _slice(start: int, size: int) -> bytes:
    """Whole lines of the sample from ``start`` on, about ``size`` bytes."""
    data = SAMPLE.read_bytes()
    begin = data.index(b"\n", start) + 1 if start else 0
    return data[begin : data.rindex(b"\n", begin, begin + size) + 1]


TEXT_A, TEXT_B = _slice(0, 40_000), _slice(500_000, 30_000)


_put = put_object  # boto3: the bytes as a user's tool uploads them


def _local(tmp_path: Path, name: str, data: bytes) -> Path:
    out = tmp_path / name
    out.write_bytes(data)
    return out


def _compress(data: bytes, ext: str) -> bytes:
    if ext == ".gz":
        return gzip.compress(data)
    if ext == ".zst":
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    return data


@pytest.mark.parametrize("ext", ["", ".gz", ".zst"])
def test_an_object_trains_like_the_local_file(trainer, s3, tmp_path, ext):
    uri = _put(s3.uri(f"raw/a.txt{ext}"), _compress(TEXT_A, ext))
    vocab, merges, stats = train_bpe_stats(uri, 400, [EOT], workers=1, block_bytes=4096)
    assert (vocab, merges) == train_bpe(_local(tmp_path, "a.txt", TEXT_A), 400, [EOT], workers=1)
    assert stats.bytes == len(TEXT_A)  # the text's bytes, not the compressed ones


def test_a_glob_of_two_objects_trains_like_the_two_local_files(trainer, s3, tmp_path):
    _put(s3.uri("raw/part-1.txt"), TEXT_A)
    _put(s3.uri("raw/part-2.txt.gz"), gzip.compress(TEXT_B))
    _put(s3.uri("raw/notes.md"), b"not matched " * 10)
    got = train_bpe(s3.uri("raw/part-*"), 420, [EOT], workers=2, block_bytes=1 << 14)
    local = [_local(tmp_path, "1.txt", TEXT_A), _local(tmp_path, "2.txt", TEXT_B)]
    assert got == train_bpe(local, 420, [EOT], workers=1)


def test_an_object_streams_in_blocks(s3):
    """The object is read a block at a time (never whole); the blocks rejoin to its text."""
    uri = _put(s3.uri("raw/a.txt.zst"), _compress(TEXT_A, ".zst"))
    blocks = list(iter_text_blocks(location(uri), [EOT], ReadStats(), block_bytes=2048))
    assert len(blocks) > 10 and max(len(b) for b in blocks) < 3 * 2048
    assert "".join(blocks).encode() == TEXT_A


def test_cli_trains_from_an_s3_uri(trainer, s3, tmp_path, capsys):
    uri = _put(s3.uri("raw/a.txt"), TEXT_A)
    code, out, err = run_cli(["tokenizer", "train", uri, "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                              "--workers", "1", "--no-progress"], capsys)
    assert code == 0, err
    assert "wrote" in out and f"{len(TEXT_A) / 1e6:.1f} MB" in out
    tok = Tokenizer.load(tmp_path / "tok")
    vocab, merges = train_bpe(_local(tmp_path, "a.txt", TEXT_A), 300, [EOT], workers=1)
    assert tok.vocab_size == 300 and tok.encode(TEXT_A[:500].decode()) == Tokenizer(vocab, merges, [EOT]).encode(
        TEXT_A[:500].decode())


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # the Python path may fork; lance may be imported
def test_pipeline_trains_its_tokenizer_from_s3(trainer, s3, tmp_path):
    from click.testing import CliRunner

    from lmdata.cli import cli
    from lmdata.store import open_store

    _put(s3.uri("raw/part-1.txt"), TEXT_A)
    _put(s3.uri("raw/part-2.txt"), TEXT_B)
    toml = tmp_path / "p.toml"
    toml.write_text(f"""
[tokenizer]
dir = "tok"
train_files = ["{s3.uri('raw/*.txt')}"]
vocab_size = 300
[ingest]
out = "store"
formats = ["memmap"]
workers = 1
[ingest.splits.train]
sources = ["{s3.uri('raw/*.txt')}"]
""")
    result = CliRunner().invoke(cli, ["ingest", str(toml), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    local = [_local(tmp_path, "1.txt", TEXT_A), _local(tmp_path, "2.txt", TEXT_B)]
    assert Tokenizer.load(tmp_path / "tok").merges == train_bpe(local, 300, [EOT], workers=1)[1]
    assert open_store(tmp_path / "store").manifest.vocab_size == 300


# ---------------------------------------------------------------------------- errors


def _train_fails(argv, capsys, tmp_path, *words):
    code, _, err = run_cli(["tokenizer", "train", *argv, "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                            "--no-progress"], capsys)
    line = err.strip()
    assert code == 1 and line.startswith("error: ") and "\n" not in line, err
    assert all(w in line for w in words), line
    assert not (tmp_path / "tok").exists()


def test_a_missing_object_is_one_line(s3, tmp_path, capsys):
    _train_fails([s3.uri("raw/nope.txt")], capsys, tmp_path, s3.uri("raw/nope.txt"), "no such object")


def test_a_glob_matching_nothing_is_one_line(s3, tmp_path, capsys):
    _put(s3.uri("raw/a.txt"), TEXT_A)
    _train_fails([s3.uri("raw/*.jsonl")], capsys, tmp_path, s3.uri("raw/*.jsonl"), "matches no objects")


def test_a_missing_bucket_is_one_line(s3, tmp_path, capsys):
    uri = f"s3://{s3.bucket}-gone/raw/a.txt"
    _train_fails([uri], capsys, tmp_path, uri, "the bucket does not exist")  # what ingest says of it too


def test_a_wrong_endpoint_is_one_line(s3, tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    _train_fails([s3.uri("raw/a.txt")], capsys, tmp_path, s3.uri("raw/a.txt"), "cannot reach", str(port))


def test_invalid_utf8_in_a_compressed_object_names_it_and_the_offset(s3, tmp_path, capsys):
    uri = _put(s3.uri("raw/bad.txt.gz"), gzip.compress(b"hello world " * 1000 + b"\xff oops"))
    _train_fails([uri], capsys, tmp_path, uri, "byte offset 12000 of the decompressed stream", "--errors replace")


def test_a_truncated_compressed_object_is_one_line(s3, tmp_path, capsys):
    uri = _put(s3.uri("raw/cut.txt.gz"), gzip.compress(TEXT_A)[:-200])
    _train_fails([uri], capsys, tmp_path, uri, "cannot read")
