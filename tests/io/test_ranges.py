"""Remote byte ranges: coalesced, verified, optionally cached -- against the moto server."""

from __future__ import annotations

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store.blocks import BlockSums
from lmdata.io.cache import ByteCache
from lmdata.io.ranges import FileRef, RangeFiles
from lmdata.io.location import location


def _files(s3, n_files=2, size=50_000):
    rng = np.random.default_rng(0)
    blobs, refs = [], []
    for i in range(n_files):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        loc = location(s3.uri("r", f"f{i}.bin"))
        loc.write_bytes(data)
        blobs.append(data)
        refs.append(FileRef(loc, size, BlockSums.of(data, 4096).check, f"shard {i:05d}", align=4096))
    return blobs, refs


def test_ranges_are_coalesced_and_exact(s3):
    blobs, refs = _files(s3)
    files = RangeFiles(refs)
    ranges = [(0, 10, 2000), (1, 49_000, 50_000), (0, 30_000, 30_001), (0, 5, 15)]
    assert files.read(ranges) == [blobs[i][a:b] for i, a, b in ranges]
    assert files.requests == 2  # one per file: the gaps are smaller than GAP_BYTES
    files = RangeFiles(refs, gap_bytes=0)
    assert files.read(ranges) == [blobs[i][a:b] for i, a, b in ranges] and files.requests == 3


def test_a_flipped_bit_is_refused_naming_the_object(s3):
    blobs, refs = _files(s3, n_files=1)
    bad = bytearray(blobs[0])
    bad[20_000] ^= 0x10
    refs[0].loc.write_bytes(bytes(bad))
    files = RangeFiles(refs, gap_bytes=0)
    assert files.read([(0, 0, 100)]) == [blobs[0][:100]]  # blocks the read does not touch are not checked
    with pytest.raises(LmdataError, match=r"f0.bin: shard 00000: block 4 .*CRC-32"):
        files.read([(0, 19_990, 20_010)])


def test_cache_serves_a_second_read_without_requests(s3, tmp_path):
    blobs, refs = _files(s3, size=3 << 20)
    cache = ByteCache(tmp_path / "cache", max_bytes=5 << 20)
    files = RangeFiles(refs, cache=cache)
    ranges = [(0, 100, 200), (1, 2_500_000, 2_600_000)]
    assert files.read(ranges) == [blobs[i][a:b] for i, a, b in ranges]
    first = files.requests
    again = RangeFiles(refs, cache=ByteCache(tmp_path / "cache", max_bytes=5 << 20))  # another process's reader
    assert again.read(ranges) == [blobs[i][a:b] for i, a, b in ranges] and again.requests == 0 and first == 2
    files.read([(0, 1_100_000, 3_000_000), (1, 0, 10)])  # 4 more chunks: over the bound
    cache.evict()
    assert cache.size() <= 5 << 20
