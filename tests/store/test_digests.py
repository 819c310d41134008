"""Whole-file checksums: xxh128 in stores written now, sha256 in stores written before 2026-12-07;
each file is checked by the algorithm its manifest entry records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.store import open_store, verify_store
from lmdata.store.layout import PROVENANCE_DIR
from lmdata.store.provenance import origins

from samples import FORMATS, SAMPLE, SAMPLE_SHARD_TOKENS


@pytest.fixture(scope="module")
def new_store(tmp_path_factory, tokenizer_dir) -> Path:
    out = tmp_path_factory.mktemp("digests") / "store"
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=FORMATS, workers=1,
           shard_tokens=SAMPLE_SHARD_TOKENS, progress=False, log=None)
    return out


def _tables(manifest: dict, store: Path):
    """(directory its file paths are relative to, file entries) of every shard table in the manifest."""
    for name, split in manifest["splits"].items():
        for fmt, table in split.get("formats", {}).items():
            yield store / name / fmt, [f for shard in table["shards"] for f in shard["files"]]
        if "provenance" in split:
            yield store / name / PROVENANCE_DIR, [f for shard in split["provenance"]["shards"] for f in shard["files"]]


def _as_written_before(src: Path, dst: Path) -> Path:
    """``src`` copied as an lmdata of format version 2 wrote it: every checksum a sha256."""
    import shutil

    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for folder, files in _tables(manifest, dst):
        for f in files:
            del f["xxh128"]
            f["sha256"] = hashlib.sha256((folder / f["path"]).read_bytes()).hexdigest()
    for split in manifest["splits"].values():
        for source in split["sources"]:
            del source["xxh128"]
            source["sha256"] = hashlib.sha256(Path(source["path"]).read_bytes()).hexdigest()
    manifest["format_version"] = 2
    (dst / "manifest.json").write_text(json.dumps(manifest))
    plan = json.loads((dst / "ingest-plan.json").read_text())
    for name, split in plan["splits"].items():
        split["sources"] = manifest["splits"][name]["sources"]
    (dst / "ingest-plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    return dst


def test_a_new_store_records_what_xxhash_computes(new_store):
    manifest = json.loads((new_store / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    entries = 0
    for folder, files in _tables(manifest, new_store):
        for f in files:
            assert set(f) == {"path", "bytes", "xxh128"}  # one checksum, no sha256 beside it
            assert f["xxh128"] == xxhash.xxh3_128((folder / f["path"]).read_bytes()).hexdigest()  # = xxh128sum's
            entries += 1
    assert entries >= 4 * len(FORMATS)
    assert manifest["splits"]["train"]["sources"] == [
        {"path": str(SAMPLE), "bytes": SAMPLE.stat().st_size, "xxh128": xxhash.xxh3_128(SAMPLE.read_bytes()).hexdigest()}]


def test_a_store_written_with_sha256_reads_and_verifies(new_store, tmp_path):
    old = _as_written_before(new_store, tmp_path / "old")
    assert verify_store(old).ok, verify_store(old).problems
    new, before = open_store(new_store), open_store(old)
    for fmt in FORMATS:
        ours, theirs = new.dataset("train", 64, format=fmt), before.dataset("train", 64, format=fmt, verify="first-use")
        picks = np.arange(len(ours))
        assert np.array_equal(theirs.__getitems__(picks), ours.__getitems__(picks))
        assert np.array_equal(before.document("train", 3, format=fmt), new.document("train", 3, format=fmt))
    assert origins(before, "train").of(5) == origins(new, "train").of(5)  # provenance files: sha256-checked


@pytest.mark.parametrize("fmt", ["parquet", "provenance"])
def test_a_sha256_store_names_sha256_when_a_file_fails_it(new_store, tmp_path, fmt):
    """Parquet's shards and the provenance files are read whole and checked against the manifest's checksum."""
    old = _as_written_before(new_store, tmp_path / "old")
    folder = old / "train" / (PROVENANCE_DIR if fmt == "provenance" else fmt)
    victim = sorted(p for p in folder.iterdir() if p.is_file())[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x04
    victim.write_bytes(bytes(data))
    report = verify_store(old)
    assert not report.ok and any(victim.name in p and "fails its sha256 checksum" in p for p in report.problems)
    store = open_store(old)
    with pytest.raises(LmdataError, match=f"{victim.name}.*fails its sha256 checksum"):
        if fmt == "provenance":
            origins(store, "train").of(0)
        else:
            ds = store.dataset("train", 64, format="parquet")
            ds.__getitems__(np.arange(len(ds)))


def test_a_file_entry_without_a_checksum_is_one_error(new_store, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(new_store, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    del manifest["splits"]["train"]["formats"]["memmap"]["shards"][0]["files"][0]["xxh128"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LmdataError, match=r"splits\.train\.formats\.memmap\.shards: a shard file records no checksum "
                                          r"\(xxh128 or sha256\); the manifest is corrupt"):
        open_store(broken).dataset("train", 64, format="memmap")[0]


def test_a_sha256_store_uploaded_with_boto3_reads_from_s3(new_store, tmp_path, s3):
    """Remote reads check whole files too (memmap's fetched copies, Parquet's decoded ones, provenance):
    each against the algorithm its entry records."""
    old = _as_written_before(new_store, tmp_path / "old")
    for path in sorted(p for p in old.rglob("*") if p.is_file()):
        s3.put("old/" + path.relative_to(old).as_posix(), path.read_bytes())
    remote, local = open_store(s3.uri("old")), open_store(new_store)
    for fmt in FORMATS:
        ds = remote.dataset("train", 64, format=fmt)
        picks = np.arange(len(ds))
        assert np.array_equal(ds.__getitems__(picks), local.dataset("train", 64, format=fmt).__getitems__(picks))
    assert origins(remote, "train").of(5)[1] == origins(local, "train").of(5)[1]
    assert verify_store(s3.uri("old")).ok


def test_a_finished_sha256_store_resumes_as_a_check(new_store, tmp_path, tokenizer_dir):
    """`--resume` of a finished store re-checks it: an earlier lmdata's plan (its inputs' sha256) is compared by
    hashing the inputs with sha256 again."""
    old = _as_written_before(new_store, tmp_path / "old")
    before = (old / "manifest.json").read_bytes()
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, old, formats=FORMATS, workers=1,
           shard_tokens=SAMPLE_SHARD_TOKENS, progress=False, log=None, resume=True)
    assert verify_store(old).ok and json.loads((old / "manifest.json").read_bytes())["splits"]["train"]["n_tokens"] \
        == json.loads(before)["splits"]["train"]["n_tokens"]


def test_a_file_entry_with_two_checksums_is_one_error(new_store, tmp_path):
    """One would be checked and the other believed: refused like an entry with none."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(new_store, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["splits"]["train"]["formats"]["memmap"]["shards"][0]["files"][0]["sha256"] = "0" * 64
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LmdataError, match=r"a shard file records two checksums \(xxh128 and sha256\); the manifest "
                                          r"is corrupt"):
        open_store(broken).dataset("train", 64, format="memmap")[0]


def test_the_sha256_names_of_earlier_plug_in_formats_still_work_with_a_warning(tmp_path):
    from lmdata.store.checksum import file_info, sha256_file
    from lmdata.store.protocol import FileInfo

    path = tmp_path / "f.bin"
    path.write_bytes(b"token bytes")
    with pytest.warns(DeprecationWarning, match="digest_file"):
        sha = sha256_file(path)
    with pytest.warns(DeprecationWarning, match=r"pass digest=HEX, algo='sha256'"):
        info = FileInfo("f.bin", 11, sha256=sha)
    assert (info.digest, info.algo) == (hashlib.sha256(b"token bytes").hexdigest(), "sha256") and info.matches(b"token bytes")
    with pytest.warns(DeprecationWarning):
        assert info.sha256 == sha
    with pytest.raises(AttributeError, match="records an xxh128 checksum, not a sha256"):
        file_info(tmp_path, "f.bin").sha256
