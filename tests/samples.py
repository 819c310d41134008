"""Constants and helpers shared by the ingest tests (imported as a plain module)."""

from __future__ import annotations

import json
from pathlib import Path

from lmdata.io import digests

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample.txt"
from formats import FORMATS  # noqa: F401  (re-exported for the ingest tests)
SAMPLE_SHARD_TOKENS = 30_000  # the sample's ~434k tokens (vocab 512) span ~15 shards
HOLDOUT = 6


def fingerprint(store: Path) -> dict:
    """The manifest without file names (Lance names its data files with random UUIDs):
    counts, cut points and every file's checksum -- equal iff the stores hold the same bytes."""

    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k != "path"}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    manifest = json.loads((Path(store) / "manifest.json").read_text())
    for split in manifest["splits"].values():
        split["sources"] = [digests.recorded(s)[1] for s in split["sources"]]
        split["formats"] = strip(split["formats"])
    return manifest


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the ``lmdata`` CLI in this process; (exit code, stdout, stderr)."""
    from lmdata.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def put_object(uri: str, data: bytes) -> str:
    """Upload ``data`` to ``s3://bucket/key`` with boto3 (as `aws s3 cp` would: the bytes as given),
    at the endpoint the AWS environment names; returns ``uri``."""
    import os

    import boto3

    bucket, key = uri[len("s3://"):].split("/", 1)
    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).put_object(Bucket=bucket, Key=key, Body=data)
    return uri


def small_tokenizer(corpus: Path, dest: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE tokenizer trained on ``corpus`` with ``<|endoftext|>``, saved at ``dest``."""
    from lmdata.tokenizer import Tokenizer, train_bpe

    vocab, merges = train_bpe(str(corpus), vocab_size, ["<|endoftext|>"])
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(dest)
    return dest
