"""A bit-flipped shard is refused by readers on first touch, naming the shard file; others still read."""

from __future__ import annotations

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store, verify_store

from formats import FORMATS
from lance_bytes import flip_stored_token


def flip(path, where=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x10
    path.write_bytes(bytes(data))


def flip_middle(syn, fmt, shard, path):
    """Flip a bit in the middle of ``shard``'s data. Lance's ``tokens`` are stored raw
    little-endian: flip the token there, so the bytes a reader serves are the damaged ones (a
    flip elsewhere in the file is ``lmdata verify``'s: its checksum pass)."""
    if fmt != "lance":
        return flip(path)
    data = bytearray(path.read_bytes())
    flip_stored_token(data, syn.stream, shard.first_token + shard.n_tokens // 2)
    path.write_bytes(bytes(data))


def victim(syn, fmt, index=1):
    shard = open_store(syn.path).manifest.splits["train"].formats[fmt][index]
    return shard, syn.path / "train" / fmt / shard.files[0].path


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_flip_is_refused_on_first_touch_naming_the_shard(make_store, fmt):
    syn = make_store([fmt], n_tokens=70_000)  # Lance: 3 fragments at least
    shard, path = victim(syn, fmt)
    flip_middle(syn, fmt, shard, path)
    store = open_store(syn.path)  # sizes still match: opening stays cheap and succeeds
    r = store.reader("train", fmt)
    np.testing.assert_array_equal(r.windows(np.array([5]), 100)[0], syn.stream[5:105])  # shard 0 untouched
    # readers check what they read (memmap: the 4 KiB blocks under a window): read across the flip
    flipped = shard.first_token + shard.n_tokens // 2
    start = flipped - 20
    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(LmdataError, match=shard.files[0].path) as err:
            r.windows(np.array([7, start]), 100)
        assert f"shard {shard.name}" in str(err.value) and str(start) in str(err.value)
    last = store.manifest.splits["train"].formats[fmt][-1]
    n = len(syn.stream)
    np.testing.assert_array_equal(r.windows(np.array([n - 50]), 50)[0], syn.stream[-50:])
    assert last.name != shard.name
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        store.dataset("train", 99, fmt)[flipped // 99]
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        r.document(int(np.searchsorted(syn.doc_starts, flipped, side="right") - 1))
    assert not verify_store(syn.path).ok


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_rewritten_after_it_was_verified_is_hashed_again(make_store, fmt):
    syn = make_store([fmt])
    shard, path = victim(syn, fmt)
    start = np.array([shard.first_token + shard.n_tokens // 2 - 20])  # across the flip below
    np.testing.assert_array_equal(open_store(syn.path).reader("train", fmt).windows(start, 64)[0],
                                  syn.stream[start[0] : start[0] + 64])
    flip_middle(syn, fmt, shard, path)
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        open_store(syn.path).reader("train", fmt).windows(start, 64)


def test_size_mode_skips_the_hash_but_parquet_pages_still_carry_checksums(make_store):
    syn = make_store(["memmap", "parquet"])
    for fmt in ("memmap", "parquet"):
        flip(victim(syn, fmt)[1])
    store = open_store(syn.path)
    shard = store.manifest.splits["train"].formats["parquet"][1]
    whole = np.array([shard.first_token])
    # memmap with sizes only: the flipped token is served (why "first-use" is the default)
    got = store.reader("train", "memmap", verify="size").windows(whole, shard.n_tokens)[0]
    assert (got != syn.stream[whole[0] : whole[0] + shard.n_tokens]).sum() == 1
    # Parquet: the page CRC refuses it, as an LmdataError naming the file (not pyarrow's bare OSError)
    with pytest.raises(LmdataError, match=shard.files[0].path):
        store.reader("train", "parquet", verify="size").windows(whole, shard.n_tokens)


def test_verify_mode_is_checked(make_store):
    syn = make_store(["memmap"])
    with pytest.raises(LmdataError, match="verify='always'"):
        open_store(syn.path).reader("train", verify="always")
    ds = open_store(syn.path).dataset("train", 16, verify="size")
    np.testing.assert_array_equal(ds[0], syn.stream[:17])


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_decode_error_names_the_shard_even_without_hashing(make_store, fmt):
    """verify="size": the format library's own failure (a damaged footer) becomes an LmdataError naming the file."""
    syn = make_store([fmt])
    shard, path = victim(syn, fmt)
    flip(path, where=0.9999)  # the footer's last bytes (magic / metadata)
    r = open_store(syn.path).reader("train", fmt, verify="size")
    np.testing.assert_array_equal(r.windows(np.array([0]), 64)[0], syn.stream[:64])
    with pytest.raises(LmdataError, match=shard.files[0].path):
        r.windows(np.array([shard.first_token + 3]), 64)


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_flips_in_two_shards_met_in_one_batch_of_many_are_both_refused(make_store, fmt):
    """The flat first-touch check of a batch spanning many shards: every damaged shard is named,
    once per read, and the sound shards of the same batch read afterwards."""
    syn = make_store([fmt], n_tokens=60_000, shard_tokens=3_000)
    shards = open_store(syn.path).manifest.splits["train"].formats[fmt]
    assert len(shards) >= 15
    bad = [shards[3], shards[11]]
    for shard in bad:
        flip(syn.path / "train" / fmt / shard.files[0].path)
    r = open_store(syn.path).reader("train", fmt)
    sound = np.array([s.first_token + 10 for s in shards if s not in bad and s.n_tokens > 200])
    # Parquet flips land in compressed pages: its page CRCs refuse them at decode (same names)
    flipped = [s.first_token + s.n_tokens // 2 - 20 for s in bad] if fmt == "memmap" else [s.first_token for s in bad]
    for victim_start, shard in zip(flipped, bad):
        with pytest.raises(LmdataError, match=f"shard {shard.name}"):
            r.windows(np.concatenate([sound, [victim_start]]), 64)
    got = r.windows(sound, 64)
    np.testing.assert_array_equal(got, np.stack([syn.stream[s:s + 64] for s in sound]))
    with pytest.raises(LmdataError, match=f"shard {bad[0].name}"):  # still refused after the sound reads
        r.windows(np.array([flipped[0]]), 64)
