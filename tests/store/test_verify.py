"""verify_store: passes on a sound store, names the first bad shard otherwise."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import verify_store
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums
from lmdata.store.checksum import digest_file

from formats import FORMATS


def test_sound_store_verifies(make_store):
    syn = make_store(FORMATS)
    report = verify_store(syn.path)
    assert report.ok, report.problems
    assert report.tokens["train"] == len(syn.stream)
    assert report.files >= 3 * 4
    report.raise_if_bad()


def _rewrite(syn, manifest, shard, victim, tokens):
    """A writer bug, not a bit flip: new tokens with matching checksums (file checksum and block sidecar)."""
    tokens.tofile(victim)
    shard["files"][0]["xxh128"] = digest_file(victim)
    for f in shard["files"][1:]:
        if f["path"] == shard["files"][0]["path"] + SIDECAR_SUFFIX:
            sidecar = victim.with_name(f["path"])
            sidecar.write_bytes(BlockSums.of(victim.read_bytes()).encode())
            f["xxh128"] = digest_file(sidecar)
    (syn.path / "manifest.json").write_text(json.dumps(manifest))


def _shard_file(syn, fmt, index):
    manifest = json.loads((syn.path / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["formats"][fmt]["shards"][index]
    return manifest, shard, syn.path / "train" / fmt / shard["files"][0]["path"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_flip_is_named(make_store, fmt):
    syn = make_store(FORMATS)
    _, shard, victim = _shard_file(syn, fmt, -1)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    report = verify_store(syn.path)
    assert not report.ok
    assert f"format '{fmt}' shard {shard['name']}" in report.problems[0]
    assert "xxh128 checksum" in report.problems[0]
    with pytest.raises(LmdataError, match=f"shard {shard['name']}"):
        report.raise_if_bad()
    # one problem per damaged file: a memmap shard's CRC sidecar names the block in it, not in a second line
    # telling the user to run the verify they are running
    assert not [p for p in report.problems if "run `lmdata verify`" in p], report.problems
    if fmt == "memmap":
        block = (len(data) // 2) // 4096
        assert [p for p in report.problems if shard["name"] in p and victim.name in p] == [
            f"split 'train' format 'memmap' shard {shard['name']}: {victim} fails its xxh128 checksum (the file is "
            f"corrupt: block {block}, bytes {block * 4096}..{(block + 1) * 4096}, differs from its CRC-32)"]


def test_truncated_file_is_named(make_store):
    syn = make_store(["memmap"])
    _, shard, victim = _shard_file(syn, "memmap", 1)
    victim.write_bytes(victim.read_bytes()[:-2])
    report = verify_store(syn.path)
    assert "shard 00001" in report.problems[0] and "bytes" in report.problems[0]


def test_streams_that_differ_across_formats_are_named(make_store):
    """A token changed in one format, its checksum "fixed" in the manifest: the stream check finds it."""
    syn = make_store(["memmap", "parquet"])
    manifest, shard, victim = _shard_file(syn, "memmap", 1)
    tokens = np.fromfile(victim, dtype=np.uint16)
    tokens[10] = (tokens[10] + 1) % 1000
    _rewrite(syn, manifest, shard, victim, tokens)
    problems = verify_store(syn.path).problems
    assert len(problems) == 1
    assert "format 'parquet'" in problems[0] or "format 'memmap'" in problems[0]
    assert "shard 00001" in problems[0] and f"token {shard['first_token'] + 10}" in problems[0]


def test_missing_end_of_text_is_named(make_store):
    """A shard whose last document lost its eot (consistently in its only format)."""
    syn = make_store(["memmap"])
    manifest, shard, victim = _shard_file(syn, "memmap", 0)
    tokens = np.fromfile(victim, dtype=np.uint16)
    tokens[-1] = 7
    _rewrite(syn, manifest, shard, victim, tokens)
    problems = verify_store(syn.path).problems
    assert problems and "shard 00000" in problems[0] and "end-of-text" in problems[0]


def test_lance_token_bytes_that_disagree_with_tokens_are_named(store_builder, tmp_path, earlier_lance_layout):
    """A store an earlier lmdata wrote: its loader reads ``token_bytes``, DuckDB reads ``tokens``, so
    verify reads both and compares them."""

    def one_token_off(data):  # an ingest bug: token 10 of each shard differs in token_bytes alone
        data[20] ^= 1

    earlier_lance_layout(damage=one_token_off)
    syn = store_builder(tmp_path / "lance-only", ["lance"])
    (problem,) = verify_store(syn.path).problems  # two encodings, no third to ask: both named
    assert re.search(r"format 'lance' shard 00000\S*: its encodings disagree at token 10: 'lance \(tokens column\)' has", problem)
    for order in (["memmap", "lance"], ["lance", "memmap"]):  # memmap is the reference either way
        syn = store_builder(tmp_path / "-".join(order), order)
        (problem,) = verify_store(syn.path).problems
        assert re.match(r"split 'train' format 'lance' shard 00000\S*: token 10 is", problem)
        assert problem.endswith(f"format 'memmap' has {syn.stream[10]}")
    earlier_lance_layout()
    sound = store_builder(tmp_path / "sound", ["lance"])
    assert verify_store(sound.path).ok


@pytest.mark.parametrize("order", [["lance", "memmap"], ["memmap", "lance"]])
def test_a_lance_dataset_that_cannot_be_opened_is_named_once_and_the_rest_compared(store_builder, tmp_path, order):
    import shutil

    syn = store_builder(tmp_path / "store", order)
    shutil.rmtree(syn.path / "train" / "lance" / "_versions")  # no committed version: Lance cannot open it
    report = verify_store(syn.path)
    assert len(report.problems) == 1 and "format 'lance'" in report.problems[0] and "cannot be opened" in report.problems[0]
    assert report.tokens["train"] == len(syn.stream)  # memmap was still read through


def test_provenance_and_the_tokenizer_copy_are_verified(sample_store, tmp_path):
    """`verify` had passed a store whose provenance failed its checksum (and `inspect`, `sql` and `show`
    then said to run `verify`), and one without its tokenizer's vocab.json."""
    import shutil

    store = tmp_path / "s"
    shutil.copytree(sample_store, store)
    assert verify_store(store).ok
    origins = sorted((store / "train" / "_provenance").glob("*.npy"))[1]
    clean = origins.read_bytes()
    origins.write_bytes(clean[:-16] + bytes(16))
    report = verify_store(store)
    assert any("provenance shard" in p and origins.name in p and "xxh128" in p for p in report.problems), report.problems
    origins.write_bytes(clean)
    (store / "tokenizer" / "vocab.json").unlink()
    report = verify_store(store)
    assert report.problems and report.problems[-1].startswith("tokenizer: ") and "vocab.json" in report.problems[-1]
    shutil.rmtree(store / "tokenizer")  # an ingest's store (it has a plan) without the copy: not a valid store
    assert verify_store(store).problems[-1] == (f"tokenizer: {store / 'tokenizer'} is missing (lmdata ingest wrote it; "
                                                "`show`, `sample` and training decode with it): copy back the "
                                                "tokenizer the store was made with")


def _copies(cache) -> list:
    """Decoded copies (and their CRC sidecars) in the machine's cache."""
    return sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.startswith("."))


def test_verify_reads_the_store_not_the_machines_copies(make_store, tmp_path, monkeypatch):
    """Verify reads each shard once, from the store's files: it had filled the machine's cache with a
    store's worth of copies (464 MB at 1,160 shards), and it read the copies that were there, so a copy
    damaged in place was reported as the store's damage ("re-ingest")."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(cache))
    syn = make_store(FORMATS)
    report = verify_store(syn.path)
    assert report.ok and report.tokens["train"] == len(syn.stream), report.problems
    assert _copies(cache) == []  # nothing written
    # another process's reads make the copies (this one would hold their descriptors, and skip them)
    script = ("import sys, numpy as np; from lmdata.store import open_store; st = open_store(sys.argv[1])\n"
              "for fmt in ('parquet', 'lance'): st.reader('train', fmt).windows(np.array([0]), int(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", script, str(syn.path), str(len(syn.stream))], check=True)
    made = [p for p in _copies(cache) if p.suffix == ".bin"]
    assert len(made) >= 2
    for copy in made:  # every copy damaged in place, its CRC sidecar left as it was
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0x01
        copy.write_bytes(bytes(data))
    stamps = {p: (p.stat().st_ino, p.stat().st_size) for p in _copies(cache)}
    report = verify_store(syn.path)
    assert report.ok, report.problems  # the store is sound: the copies are not the store
    assert {p: (p.stat().st_ino, p.stat().st_size) for p in _copies(cache)} == stamps  # nor made again


@pytest.mark.parametrize("fmt", ["memmap", "parquet", "lance"])
def test_a_reader_without_the_cache_reads_the_same_tokens_and_holds_little(make_store, tmp_path, monkeypatch, fmt):
    from lmdata.store import open_store
    from lmdata.store.formats.shard_copies import READ_ONCE_BYTES

    cache = tmp_path / "cache"
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(cache))
    syn = make_store([fmt])
    reader = open_store(syn.path).reader("train", fmt, use_cache=False)
    starts = np.arange(0, len(syn.stream) - 64, 37)
    got = reader.windows(starts, 64)
    assert np.array_equal(got, np.lib.stride_tricks.sliding_window_view(syn.stream, 64)[starts])
    assert _copies(cache) == []
    held = reader._chunks if fmt == "lance" else reader  # (memmap: remote shards' budget; its default had won)
    assert held is None or held.cache_bytes <= READ_ONCE_BYTES


def test_verify_takes_the_size_option_from_a_plugin_reader_that_takes_any_options(monkeypatch):
    """A plug-in reader taking ``**options`` is given ``verify="size"`` alone, as before: a built-in option
    it does not know (``use_cache``) had failed its verify with a TypeError."""
    from lmdata.store import verify as verify_module

    class Reader:
        def __init__(self, format_dir, shards, dtype, **options):
            pass

    class Format:
        reader = Reader

    monkeypatch.setattr(verify_module, "get_format", lambda fmt: Format)
    assert verify_module._read_once_options("toy") == {"verify": "size"}
