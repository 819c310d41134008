"""A shard's rows encoded as a Parquet file in memory, by hand rather than by ``pq.write_table``.

The file is, field for field, the one pyarrow writes for ``parquet.rows_table`` with the options
the format has always used: row groups of ``group_rows`` rows, one data page (v1) per column
chunk, zstd (level 1; tokens pages: ``_pages_zstd``), a CRC-32 in each page header, doc_id and
token_offset PLAIN int64 with min/max statistics, the token values BYTE_STREAM_SPLIT (stored as INT32),
pyarrow's schema, size statistics and ``ARROW:schema`` metadata. Only ``created_by`` names
this writer, and the levels are RLE runs where pyarrow bit-packs short ones (same values).

Why: pq.write_table takes ~13.9 CPU ms per 1 Mi-token shard, ~9.5 even uncompressed (its generic
list<> level code). Here a row's levels are at most two RLE runs (repetition 0 then 1s; definition 3s,
an empty row a 1), encoded for the whole shard in a few NumPy calls, and the values are split
by NumPy casts: ~3.9 ms a shard, ~2.7 of it zstd (figures in ``parquet.py``).

Field ids and enums: parquet-format's ``parquet.thrift``, written in Thrift's compact protocol.
"""

from __future__ import annotations

import functools
import struct
import threading
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store.blocks import raw_crc32

if TYPE_CHECKING:
    import pyarrow as pa

Part = Union[bytes, "pa.Buffer"]  # a piece of an encoded file

# Thrift compact-protocol types (a field header's low nibble)
_TRUE, _FALSE, _I8, _I16, _I32, _I64, _BINARY, _LIST, _STRUCT = 1, 2, 3, 4, 5, 6, 8, 9, 12
# parquet.thrift enums
_INT32, _INT64 = 1, 2  # Type
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2  # FieldRepetitionType
_LIST_CT, _UINT_16, _UINT_32 = 3, 12, 13  # ConvertedType
_PLAIN, _RLE, _BYTE_STREAM_SPLIT = 0, 3, 9  # Encoding
_ZSTD, _DATA_PAGE = 6, 0  # CompressionCodec, PageType
_INTS = frozenset((_I16, _I32, _I64))
_MAX_DEF = 3  # tokens: the list present (1), an element in it (2), the element present (3)


_BYTES = [bytes([i]) for i in range(256)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _value(kind: int, value: object) -> bytes:
    if kind in _INTS:
        return _varint((value << 1) ^ (value >> 63))  # zigzag
    if kind == _BINARY:
        return _varint(len(value)) + value
    if kind == _I8:
        return _BYTES[value & 0xFF]
    return value if kind in (_STRUCT, _LIST) else b""  # encoded already; a boolean lives in its header


def _struct(*fields: tuple[int, int, object]) -> bytes:
    """A compact-protocol struct from (field id, type, value) in id order, None values left out.
    A struct or list value comes encoded (``_struct``, ``_list``); a boolean's type is _TRUE.
    (Integers are inlined: a shard's footer and page headers are a few hundred structs.)"""
    out, last = bytearray(), 0
    for fid, kind, value in fields:
        if value is None:
            continue
        if kind == _TRUE and not value:
            kind = _FALSE
        delta, last = fid - last, fid
        out += _BYTES[delta << 4 | kind] if 0 < delta <= 15 else _BYTES[kind] + _value(_I16, fid)
        if kind in _INTS:
            n = (value << 1) ^ (value >> 63)
            out += _BYTES[n] if n < 0x80 else _varint(n)
        else:
            out += _value(kind, value)
    out.append(0)
    return bytes(out)


def _list(elem: int, items: list) -> bytes:
    head = _BYTES[len(items) << 4 | elem] if len(items) < 15 else _BYTES[0xF0 | elem] + _varint(len(items))
    return head + b"".join([_value(elem, item) for item in items])


@functools.cache
def _file_constants(dtype: str) -> tuple[bytes, bytes, bytes]:
    """The schema elements, ``ARROW:schema`` key/values and column orders of a ``dtype`` shard.
    ``ARROW:schema`` is what pq.write_table stores (the schema's IPC message, base64), so pyarrow reads
    back its own schema. Serialized here rather than taken from pq.write_table writing an empty table,
    which imports pandas (~0.2 CPU s in every process that writes Parquet)."""
    import base64

    import pyarrow as pa

    tokens = pa.list_(pa.from_numpy_dtype(dtype))
    arrow = pa.schema([("doc_id", pa.int64()), ("token_offset", pa.int64()), ("tokens", tokens)])
    pairs = {b"ARROW:schema": base64.b64encode(arrow.serialize().to_pybytes())}
    bits, converted = (16, _UINT_16) if dtype == "uint16" else (32, _UINT_32)
    element = _struct((1, _I32, _INT32), (3, _I32, _OPTIONAL), (4, _BINARY, b"element"), (6, _I32, converted),
                      (10, _STRUCT, _struct((10, _STRUCT, _struct((1, _I8, bits), (2, _TRUE, False))))))
    schema = [
        _struct((3, _I32, _REQUIRED), (4, _BINARY, b"schema"), (5, _I32, 3)),
        _struct((1, _I32, _INT64), (3, _I32, _OPTIONAL), (4, _BINARY, b"doc_id")),
        _struct((1, _I32, _INT64), (3, _I32, _OPTIONAL), (4, _BINARY, b"token_offset")),
        _struct((3, _I32, _OPTIONAL), (4, _BINARY, b"tokens"), (5, _I32, 1), (6, _I32, _LIST_CT),
                (10, _STRUCT, _struct((3, _STRUCT, _struct())))),
        _struct((3, _I32, _REPEATED), (4, _BINARY, b"list"), (5, _I32, 1)),
        element,
    ]
    key_values = [_struct((1, _BINARY, k), (2, _BINARY, v)) for k, v in pairs.items()]
    orders = [_struct((1, _STRUCT, _struct()))] * 3  # TypeDefinedOrder for each column
    return _list(_STRUCT, schema), _list(_STRUCT, key_values), _list(_STRUCT, orders)


def _rle_streams(counts: np.ndarray, values: np.ndarray, group: np.ndarray, n_groups: int) -> list[bytes]:
    """Each group's level stream from its RLE runs (count, value) in order, runs sorted by group: the
    hybrid encoding's runs (a varint of count << 1, then one value byte: bit width <= 8), 4-byte length first."""
    head = counts.astype(np.uint64) << np.uint64(1)
    size = 1 + sum((head >= np.uint64(1 << 7 * k)).astype(np.int64) for k in range(1, 5))  # varint bytes
    end = np.cumsum(size + 1)
    out = np.empty(int(end[-1]) if len(end) else 0, np.uint8)
    at = end - size - 1
    for k in range(int(size.max()) if len(size) else 0):
        more = size > k
        seven = (head[more] >> np.uint64(7 * k)) & np.uint64(0x7F)
        out[at[more] + k] = seven | (size[more] > k + 1).astype(np.uint64) << np.uint64(7)
    out[end - 1] = values
    bounds = np.r_[0, end][np.searchsorted(group, np.arange(n_groups + 1))].tolist()
    return [struct.pack("<I", b - a) + out[a:b].tobytes() for a, b in zip(bounds, bounds[1:])]


def _levels(lengths: np.ndarray, group_rows: int) -> tuple[list[bytes], list[bytes]]:
    """Each row group's repetition and definition levels of the tokens column. A row of n > 0 tokens:
    repetition 0 then n - 1 ones, definition 3 n times (merged with its neighbours'); an empty row:
    one entry, repetition 0, definition 1 (an empty list)."""
    n_rows = len(lengths)
    n_groups = -(-n_rows // group_rows)
    row_group = np.arange(n_rows) // group_rows
    rep_counts = np.stack([np.ones(n_rows, np.int64), lengths - 1], axis=1).ravel()
    keep = rep_counts > 0
    rep = _rle_streams(rep_counts[keep], np.tile(np.array([0, 1], np.uint8), n_rows)[keep],
                       np.repeat(row_group, 2)[keep], n_groups)
    value = np.where(lengths > 0, _MAX_DEF, 1).astype(np.uint8)
    new_run = np.ones(n_rows, bool)
    new_run[1:] = (value[1:] != value[:-1]) | (row_group[1:] != row_group[:-1])
    first = np.flatnonzero(new_run)
    counts = np.add.reduceat(np.maximum(lengths, 1), first) if n_rows else np.zeros(0, np.int64)
    return rep, _rle_streams(counts, value[first], row_group[first], n_groups)


def _int64_stats(lo: int, hi: int) -> bytes:
    """min/max (and the deprecated min/max pyarrow also writes for signed types), no nulls, exact."""
    low, high = struct.pack("<q", lo), struct.pack("<q", hi)
    return _struct((1, _BINARY, high), (2, _BINARY, low), (3, _I64, 0), (5, _BINARY, high), (6, _BINARY, low),
                   (7, _TRUE, True), (8, _TRUE, True))


# Each column chunk's leading ColumnMetaData fields: type, encodings, path in the schema
_DOC_ID = ((1, _I32, _INT64), (2, _LIST, _list(_I32, [_RLE, _PLAIN])), (3, _LIST, _list(_BINARY, [b"doc_id"])))
_OFFSET = ((1, _I32, _INT64), (2, _LIST, _list(_I32, [_RLE, _PLAIN])), (3, _LIST, _list(_BINARY, [b"token_offset"])))
_TOKENS = ((1, _I32, _INT32), (2, _LIST, _list(_I32, [_RLE, _BYTE_STREAM_SPLIT])),
           (3, _LIST, _list(_BINARY, [b"tokens", b"list", b"element"])))
_ONE_PAGE = {e: _list(_STRUCT, [_struct((1, _I32, _DATA_PAGE), (2, _I32, e), (3, _I32, 1))])  # encoding_stats
             for e in (_PLAIN, _BYTE_STREAM_SPLIT)}


class _File:
    """The file's parts as they are appended (the magic first), where the next one starts, and
    scratch space for the largest tokens page."""

    def __init__(self, page_bytes: int, page_values: int, dtype: np.dtype) -> None:
        import zstandard

        self.parts: list[Part] = [b"PAR1"]
        self.at = 4
        self.page, self.shifted = _scratch(page_bytes, page_values, dtype)
        self.small = zstandard.ZstdCompressor(level=1)

    def compress(self, page: bytes | np.ndarray) -> Part:
        """zstd: a small page at level 1 (one context for the file), a tokens page with ``_pages_zstd``'s
        parameters (one context per thread)."""
        if len(page) < 1 << 16:
            return self.small.compress(page)
        return _pages_zstd().compress(page)

    def chunk(self, page: bytes | np.ndarray, meta: tuple, num_values: int, encoding: int, stats: bytes | None,
              sizes: bytes) -> tuple[bytes, int, int]:
        """Appends a column chunk of one data page, compressed, its CRC-32 in its header. ``meta``: the
        chunk's leading fields; ``sizes``: its SizeStatistics. Returns its ColumnChunk and its sizes
        uncompressed and stored (headers included)."""
        compressed = self.compress(page)
        crc = raw_crc32(compressed)
        n_raw, n_stored = len(page), memoryview(compressed).nbytes  # (a Buffer's len(memoryview) is its capacity)
        page_header = _struct((1, _I32, num_values), (2, _I32, encoding), (3, _I32, _RLE), (4, _I32, _RLE),
                              (5, _STRUCT, stats or b"\x00"))  # pyarrow writes empty page statistics
        header = _struct((1, _I32, _DATA_PAGE), (2, _I32, n_raw), (3, _I32, n_stored),
                         (4, _I32, crc - ((crc >> 31) << 32)), (5, _STRUCT, page_header))
        offset, raw, stored = self.at, len(header) + n_raw, len(header) + n_stored
        self.parts += [header, compressed]
        self.at += stored
        meta_data = _struct(*meta, (4, _I32, _ZSTD), (5, _I64, num_values), (6, _I64, raw), (7, _I64, stored),
                            (9, _I64, offset), (12, _STRUCT, stats), (13, _LIST, _ONE_PAGE[encoding]),
                            (16, _STRUCT, sizes))
        return _struct((2, _I64, 0), (3, _STRUCT, meta_data)), raw, stored


def prepare(dtype: str) -> None:
    """pyarrow imported and a ``dtype`` file's constants built before the first shard (``ParquetWriter.prepare``)."""
    _file_constants(dtype)


_THREAD = threading.local()


def _scratch(page_bytes: int, page_values: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """This thread's space for a tokens page before compression and for its values shifted
    (``_split_values``), kept from file to file: allocated per file, its ~6 MB were fresh pages
    every shard (page faults, zeroing, then unmapping them: ~1 ms a 1 Mi-token shard)."""
    page, shifted = getattr(_THREAD, "scratch", (None, None))
    if page is None or len(page) < page_bytes:
        page = np.empty(page_bytes, np.uint8)
    if shifted is None or len(shifted) < page_values or shifted.dtype != dtype:
        shifted = np.empty(page_values, dtype)
    _THREAD.scratch = page, shifted
    return page, shifted


def _pages_zstd() -> Any:
    """This thread's compressor for tokens pages: zstd's fast strategy as at level 1 (window 2^19),
    but matches of 7+ bytes found through a 256-entry hash table (level 1: 6+, 2^13 entries). A
    BYTE_STREAM_SPLIT page's high-byte stream (ids < 8,192: 5 bits a byte) is full of short matches
    that level 1 finds and that pay less than Huffman-coding those bytes as literals. 10 real 1 Mi-token
    shards' pages, 5 rounds: level 1 4.33 CPU ms a shard at best (median 5.65), this 2.77 (3.80), at
    1.366 -> 1.361 bytes a token; 50,257-id shards 3.32 -> 2.46 ms at 1.483 -> 1.482; uint32 ids
    4.1-4.2 ms and the same size either way. Any zstd reader reads it (only the search differs)."""
    compressor = getattr(_THREAD, "zstd", None)
    if compressor is None:
        import zstandard

        params = zstandard.ZstdCompressionParameters(strategy=zstandard.STRATEGY_FAST, window_log=19, hash_log=8,
                                                     min_match=7, target_length=0)
        compressor = _THREAD.zstd = zstandard.ZstdCompressor(compression_params=params)
    return compressor


def _split_values(page: np.ndarray, shifted: np.ndarray, levels: bytes, values: np.ndarray) -> np.ndarray:
    """A tokens page before compression, in ``page`` (scratch space, as ``shifted``): its levels, then
    the values BYTE_STREAM_SPLIT as INT32 (stream k holds each value's byte k; a uint16's two high
    streams are zeros). Byte k is a truncating cast of the values shifted by 8k bits: NumPy
    vectorizes that, not a strided copy of every other byte (~3x slower)."""
    n, width = len(values), values.itemsize
    page = page[:len(levels) + 4 * n]
    page[:len(levels)] = np.frombuffer(levels, np.uint8)
    streams = page[len(levels):].reshape(4, n)
    np.copyto(streams[0], values, casting="unsafe")
    for k in range(1, width):
        np.copyto(streams[k], np.right_shift(values, 8 * k, out=shifted[:n]), casting="unsafe")
    streams[width:] = 0
    return page


def _row_group(file: _File, int64s: list[tuple[tuple, np.ndarray, int, int]], lengths: np.ndarray,
               levels: bytes, values: np.ndarray) -> bytes:
    """Appends a row group's three column chunks; returns its RowGroup. ``int64s``: doc_id's and
    token_offset's (metadata, values, min, max); ``lengths``: its rows' token counts."""
    rows, n, start = len(lengths), len(values), file.at
    empty = rows - int(np.count_nonzero(lengths))
    run = _varint(rows << 1) + b"\x01"  # definition level 1 (present) for every row: one RLE run
    present = struct.pack("<I", len(run)) + run
    sizes = _struct((2, _LIST, _list(_I64, [])), (3, _LIST, _list(_I64, [0, rows])))  # level histograms
    chunks = [file.chunk(present + column.tobytes(), meta, rows, _PLAIN, _int64_stats(lo, hi), sizes)
              for meta, column, lo, hi in int64s]
    entries = n + empty  # an empty row is one level entry and no value
    sizes = _struct((2, _LIST, _list(_I64, [rows, entries - rows])), (3, _LIST, _list(_I64, [0, empty, 0, n])))
    page = _split_values(file.page, file.shifted, levels, values)
    chunks.append(file.chunk(page, _TOKENS, entries, _BYTE_STREAM_SPLIT, None, sizes))
    return _struct((1, _LIST, _list(_STRUCT, [c[0] for c in chunks])), (2, _I64, sum(c[1] for c in chunks)),
                   (3, _I64, rows), (5, _I64, start), (6, _I64, sum(c[2] for c in chunks)))


def encode_rows(tokens: np.ndarray, row_starts: np.ndarray, row_docs: np.ndarray, first_token: int,
                group_rows: int) -> list[Part]:
    """The Parquet file of rows ``(doc_id, token_offset, tokens)`` = ``(row_docs[i], first_token +
    row_starts[i], tokens[row_starts[i]:row_starts[i + 1]])`` in row groups of ``group_rows`` rows:
    ``tokens`` uint16 or uint32, ``row_starts`` ascending from 0 to ``len(tokens)``. The file comes
    in parts, to be written in order (``writelines``): joining them would cost ~0.8 ms a shard."""
    if tokens.dtype.name not in ("uint16", "uint32"):
        raise LmdataError(f"a Parquet shard holds uint16 or uint32 tokens, not {tokens.dtype}")
    if len(tokens) >= 2**31:
        raise LmdataError(f"a shard of {len(tokens)} tokens is too large for list<> offsets; lower --shard-tokens")
    tokens = np.ascontiguousarray(tokens, tokens.dtype.newbyteorder("<"))
    row_starts = np.asarray(row_starts, np.int64)
    docs, offsets = np.asarray(row_docs, "<i8"), (row_starts[:-1] + np.int64(first_token)).astype("<i8")
    lengths = np.diff(row_starts)
    reps, defs = _levels(lengths, group_rows)
    firsts = np.arange(0, len(lengths), group_rows)
    lows = [np.minimum.reduceat(c, firsts).tolist() if len(c) else [] for c in (docs, offsets)]
    highs = [np.maximum.reduceat(c, firsts).tolist() if len(c) else [] for c in (docs, offsets)]
    levels = [rep + defined for rep, defined in zip(reps, defs)]
    per_group = np.diff(row_starts[np.r_[firsts, len(lengths)]]).tolist() if len(lengths) else []
    page_bytes = max((len(lv) + 4 * n for lv, n in zip(levels, per_group)), default=0)
    file, groups = _File(page_bytes, max(per_group, default=0), tokens.dtype), []
    for g, r0 in enumerate(firsts.tolist()):
        r1 = min(r0 + group_rows, len(lengths))
        int64s = [(meta, c[r0:r1], lo[g], hi[g])
                  for meta, c, lo, hi in zip((_DOC_ID, _OFFSET), (docs, offsets), lows, highs)]
        values = tokens[row_starts[r0]:row_starts[r1]]
        groups.append(_row_group(file, int64s, lengths[r0:r1], levels[g], values))
    return _finish(file, groups, len(lengths), tokens.dtype.name)


def _finish(file: _File, groups: list[bytes], n_rows: int, dtype: str) -> list[Part]:
    """The whole file: its column chunks, then the footer (FileMetaData), the footer's length, the magic."""
    from lmdata import __version__

    schema, key_values, orders = _file_constants(dtype)
    created_by = f"lmdata version {__version__}".encode()  # not pyarrow's name: readers key workarounds on it
    footer = _struct((1, _I32, 2), (2, _LIST, schema), (3, _I64, n_rows), (4, _LIST, _list(_STRUCT, groups)),
                     (5, _LIST, key_values), (6, _BINARY, created_by), (7, _LIST, orders))
    return [*file.parts, footer, struct.pack("<I", len(footer)), b"PAR1"]
