"""Compressed inputs on object storage, uploaded as users' tools upload them (boto3: the bytes as
given), read by every reader exactly as the same local files are: ingest (local and Ray engines)
and tokenizer training; and nothing lmdata writes to object storage is compressed behind its back."""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
import zstandard
from samples import SAMPLE, fingerprint

from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.tokenizer import train_bpe

COMPRESS = {".gz": gzip.compress, ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}


def _docs(n: int = 40) -> list[str]:
    text = SAMPLE.read_text(encoding="utf-8")
    return [d.strip() for d in text.split("<|endoftext|>") if d.strip()][:n]


def _both(s3, tmp_path, name: str, data: bytes) -> tuple[str, str]:
    """The same bytes as a boto3-uploaded object and as a local file."""
    local = tmp_path / "inputs" / name
    local.parent.mkdir(exist_ok=True)
    local.write_bytes(data)
    return s3.put(f"raw/{name}", data), str(local)


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_compressed_text_and_jsonl_objects_ingest_like_the_local_files(s3, tokenizer_dir, tmp_path, ext):
    docs = _docs()
    text = "\n<|endoftext|>\n".join(docs[:20]).encode()
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs[20:]).encode()
    packed = COMPRESS[ext](text)
    remote_txt, local_txt = _both(s3, tmp_path, f"t.txt{ext}", packed)
    remote_jsonl, local_jsonl = _both(s3, tmp_path, f"d.jsonl{ext}", COMPRESS[ext](jsonl))
    assert s3.get(f"raw/t.txt{ext}") == packed  # stored as uploaded
    for name, paths in (("remote", (remote_txt, remote_jsonl)), ("local", (local_txt, local_jsonl))):
        ingest({"train": SourceSpec(paths)}, tokenizer_dir, tmp_path / name, formats=["memmap"], workers=1,
               progress=False, log=None)
    remote, local = fingerprint(tmp_path / "remote"), fingerprint(tmp_path / "local")
    assert remote == local and remote["splits"]["train"]["n_docs"] == len(docs)


def test_tokenizer_training_reads_a_boto3_zst_object_like_the_local_file(s3, tmp_path):
    data = zstandard.ZstdCompressor().compress("\n<|endoftext|>\n".join(_docs()).encode())
    remote, local = _both(s3, tmp_path, "train.txt.zst", data)
    assert train_bpe(remote, 300, ["<|endoftext|>"], workers=1) == train_bpe(local, 300, ["<|endoftext|>"], workers=1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'lmdata[ray]')")
def test_the_ray_engine_reads_a_boto3_gz_object_like_the_local_file(s3, tokenizer_dir, tmp_path):
    data = gzip.compress("\n<|endoftext|>\n".join(_docs()).encode())
    remote, local = _both(s3, tmp_path, "t.txt.gz", data)
    ingest({"train": SourceSpec((remote,))}, tokenizer_dir, tmp_path / "ray", formats=["memmap"], workers=2,
           engine="ray", progress=False, log=None)
    ingest({"train": SourceSpec((local,))}, tokenizer_dir, tmp_path / "local", formats=["memmap"], workers=1,
           progress=False, log=None)
    assert fingerprint(tmp_path / "ray") == fingerprint(tmp_path / "local")


def test_nothing_lmdata_writes_to_object_storage_is_compressed(s3, sample_store, tmp_path, monkeypatch):
    """Every object of an s3:// store holds the bytes of the local store's file of that name."""
    from lmdata.io.location import location

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    ingest({"train": SourceSpec((str(SAMPLE),))}, sample_store / "tokenizer", s3.uri("store"), formats=["memmap"],
           workers=1, progress=False, log=None)
    for obj in location(s3.uri("store")).list(recursive=True):
        assert len(s3.get(f"store/{obj.key}")) == obj.size
    manifest = json.loads(s3.get("store/manifest.json"))  # plain JSON, not gzip
    assert manifest["splits"]["train"]["n_docs"] > 0
