"""Refusals on object storage leave the bucket exactly as it was (issue 29: no marker objects)."""

from __future__ import annotations

import pytest
from samples import SAMPLE

from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.io.location import location
from lmdata.sources import SourceSpec


def _keys(s3) -> list[str]:
    """Every object in the bucket, as boto3 lists it (directory markers included)."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_a_refused_overwrite_on_s3_creates_no_object(s3, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    spec, opts = {"train": SourceSpec((str(SAMPLE),))}, dict(formats=["memmap"], workers=1, progress=False, log=None)
    location(s3.uri("theirs", "deep", "notes.txt")).write_bytes(b"a user's object")
    before = _keys(s3)
    for uri in (s3.uri("theirs"), s3.uri("theirs", "deep")):
        for flags in ({"overwrite": True}, {"resume": True}, {}):
            with pytest.raises(LmdataError):
                ingest(spec, tokenizer_dir, uri, **flags, **opts)
            assert _keys(s3) == before, (uri, flags)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.json"))


def test_a_fresh_ingest_on_s3_leaves_no_probe_object(s3, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    spec, opts = {"train": SourceSpec((str(SAMPLE),))}, dict(formats=["memmap"], workers=1, progress=False, log=None)
    ingest(spec, tokenizer_dir, s3.uri("runs", "store"), **opts)
    keys = [k for k in _keys(s3) if not k.endswith("/")]  # pyarrow's directory markers aside (see publish.check_bucket)
    assert keys and all(k.startswith("runs/store/") and "probe" not in k for k in keys), keys
