"""Block checksums: integrity that costs what a read costs.

A whole-shard hash makes every process of every rank read the whole dataset once before it
trusts it (on object storage: a full download per process). Instead the writer records a
CRC-32 of every small block of a file, and a reader checks only the blocks a read touches.
``lmdata verify`` still hashes whole files (xxh128, or sha256 in older stores, in the manifest).

Byte blocks (the memmap token shards) live in a sidecar file beside the data file,
``tokens-00000.bin`` -> ``tokens-00000.bin.crc``; the sidecar is itself a shard file in the
manifest (size + checksum). Its layout, little-endian::

    offset  size  field
    0       8     magic b"LMDCRC1\\0"
    8       4     block_bytes (u32)        e.g. 4096
    12      4     reserved, 0
    16      8     data_bytes (u64)         size of the data file it covers
    24      4*n   crc32 of each block (u32), n = ceil(data_bytes / block_bytes);
                  the last block may be short

    >>> sums = BlockSums.of(b"x" * 10000, block_bytes=4096)
    >>> sums.n_blocks, sums.aligned(5000, 5100)
    (3, (4096, 8192))
    >>> BlockSums.decode(sums.encode(), "f").crcs.tolist() == sums.crcs.tolist()
    True

Lance rows carry a CRC-32 of their tokens' little-endian bytes (``row_checksums``) as the
third row of the fragment's row index (``rows-*.npy`` / ``index-*.npy``, itself checked
against the manifest), checked on every row a take returns. Parquet needs none of its own:
every page carries a CRC-32 that pyarrow checks on read.

Cost (this box, 2 shared cores): CRC-32 runs at ~7 GB/s on 4 KiB blocks through ISA-L
(the ``isal`` package, a dependency where it has wheels) and ~1.4 GB/s through zlib; a
memmap window of 1,025 uint16 tokens touches ~1.5 blocks, ~1 us to check the first time.
A reader remembers the blocks (Lance: the rows) this process checked, so it never pays twice.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

try:  # ISA-L's CRC-32 (the same polynomial as zlib's), ~5x faster here
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - a platform without isal wheels
    _crc32 = zlib.crc32

from lmdata.errors import LmdataError
from lmdata.io.descriptors import block_crcs as _c_block_crcs  # through ISA-L's CRC where descriptors found it
from lmdata.io.descriptors import span_crcs as _c_span_crcs

raw_crc32 = _crc32  # a buffer in, its CRC-32 out (unsigned): the call for hot loops

MAGIC = b"LMDCRC1\0"
HEADER_BYTES = 24
BLOCK_BYTES = 4096
SIDECAR_SUFFIX = ".crc"


def crc32(data: bytes | memoryview | np.ndarray) -> int:
    """CRC-32 of a buffer (an array's raw bytes, as stored)."""
    return _crc32(memoryview(data).cast("B") if isinstance(data, np.ndarray) else data) & 0xFFFFFFFF


def block_crcs(data: bytes | memoryview | np.ndarray, block_bytes: int) -> np.ndarray:
    """uint32 CRC-32 of each ``block_bytes`` block of ``data`` (the last one may be short): one C
    call without the GIL where the extension is built (a 2 MiB shard: ~0.1 ms, against ~0.8 ms
    for the loop below, which remains for installs without a compiler)."""
    view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
    if _c_block_crcs is not None and block_bytes > 0:
        out = np.empty(-(-len(view) // block_bytes), np.uint32)
        _c_block_crcs(view, block_bytes, out)
        return out
    return np.fromiter((_crc32(view[i:i + block_bytes]) for i in range(0, len(view), block_bytes)),
                       dtype=np.uint32, count=-(-len(view) // block_bytes))


@dataclass
class BlockSums:
    """The checksums of one data file: its size, the block size and one CRC per block."""

    block_bytes: int
    data_bytes: int
    crcs: np.ndarray  # uint32, one per block

    @classmethod
    def of(cls, data: bytes | memoryview | np.ndarray, block_bytes: int = BLOCK_BYTES) -> "BlockSums":
        view = memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")
        return cls(block_bytes, len(view), block_crcs(view, block_bytes))

    @property
    def n_blocks(self) -> int:
        return len(self.crcs)

    def encode(self) -> bytes:
        header = MAGIC + np.array([self.block_bytes, 0], "<u4").tobytes() + np.array([self.data_bytes], "<u8").tobytes()
        return header + self.crcs.astype("<u4").tobytes()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> "BlockSums":
        """Parse a sidecar; a damaged one is an error naming ``where``."""
        if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
            raise LmdataError(f"{where}: not a block-checksum file (bad header); re-ingest with --overwrite")
        block_bytes, _, data_bytes = struct.unpack_from("<IIQ", raw, 8)
        n = -(-data_bytes // block_bytes) if block_bytes else -1
        if block_bytes <= 0 or len(raw) != sidecar_bytes(data_bytes, block_bytes):
            raise LmdataError(f"{where}: block-checksum file is truncated or corrupt; re-ingest with --overwrite")
        crcs = np.frombuffer(raw, "<u4", n, HEADER_BYTES)  # read-only, over ``raw``: a reader's first touch pays this
        return cls(block_bytes, data_bytes, crcs if crcs.dtype == np.uint32 else crcs.astype(np.uint32))

    def aligned(self, start: int, stop: int) -> tuple[int, int]:
        """The block-aligned byte range ``[a, b)`` covering ``[start, stop)`` (clipped to the file)."""
        bb = self.block_bytes
        return (start // bb) * bb, min(-(-stop // bb) * bb, self.data_bytes)

    def bad_blocks(self, offset: int, data: bytes | memoryview | np.ndarray) -> list[int]:
        """Indices of the blocks of ``data`` (read at the block-aligned ``offset``) whose CRC differs."""
        assert offset % self.block_bytes == 0, "reads to verify start on a block boundary"
        first = offset // self.block_bytes
        found = block_crcs(data, self.block_bytes)
        expected = self.crcs[first:first + len(found)]
        if len(expected) != len(found):
            return list(range(first + len(expected), first + len(found)))
        return (np.flatnonzero(found != expected) + first).tolist()

    def check(self, offset: int, data: bytes | memoryview | np.ndarray, where: str) -> None:
        """Refuse ``data`` (read at the aligned ``offset``) unless every block matches, naming ``where``."""
        self._refuse(self.bad_blocks(offset, data), where)

    def check_blocks(self, data: np.ndarray, blocks: np.ndarray, where: str) -> None:
        """Refuse unless each of ``blocks`` (indices) of the whole file ``data`` matches, naming ``where``."""
        view, bb = memoryview(data).cast("B"), self.block_bytes
        if len(view) != self.data_bytes:
            self._refuse([min(len(view), self.data_bytes) // bb], where)
        found = np.fromiter((_crc32(view[b * bb:b * bb + bb]) for b in blocks.tolist()), np.uint32, len(blocks))
        self._refuse(blocks[found != self.crcs[blocks]].tolist(), where)

    def _refuse(self, bad: list[int], where: str) -> None:
        if bad:
            at = bad[0] * self.block_bytes
            raise LmdataError(
                f"{where}: block {bad[0]} (bytes {at}..{at + self.block_bytes}) fails its CRC-32 checksum"
                f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}: the shard is corrupt; "
                "run `lmdata verify` and re-ingest with --overwrite"
            )


def sidecar_bytes(data_bytes: int, block_bytes: int = BLOCK_BYTES) -> int:
    """The size of the sidecar of a ``data_bytes`` file."""
    return HEADER_BYTES + 4 * -(-data_bytes // block_bytes)


def row_checksums(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """uint32 CRC-32 of each row ``values[offsets[i]:offsets[i+1]]`` (little-endian bytes), of the
    rows ``rows`` only when given."""
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    raw = memoryview(values).cast("B")
    bounds = np.asarray(offsets, dtype=np.int64) * values.dtype.itemsize
    lo, hi = (bounds[:-1], bounds[1:]) if rows is None else (bounds[rows], bounds[np.asarray(rows) + 1])
    if _c_span_crcs is not None:  # one C call without the GIL (1,600 rows a shard: ~1.8 ms of Python before)
        out = np.empty(len(lo), dtype=np.uint32)
        _c_span_crcs(raw, np.ascontiguousarray(lo), np.ascontiguousarray(hi), out)
        return out
    return np.fromiter((_crc32(raw[a:b]) for a, b in zip(lo.tolist(), hi.tolist())), dtype=np.uint32, count=len(lo))
