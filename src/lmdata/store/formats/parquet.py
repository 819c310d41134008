"""The Parquet format: documents cut into bounded rows; read through a decoded copy per machine.

On disk, per split (``<store>/<split>/parquet/``)::

    shard-00000.parquet   rows in document order, each a document or a piece of one:
                            doc_id        int64   global document id
                            token_offset  int64   global offset of the row's first token
                            tokens        list<uint16|uint32>, at most PIECE_TOKENS ids
                          row groups of ROW_GROUP_ROWS rows; statistics on doc_id/token_offset
    _shards/00000.json    completion record (see ``base.py``)

``ShardInfo.extra`` is ``{"rows": 1651, "row_groups": 2}``.

Reader: the first process on a machine to read a shard decodes it whole, its bytes checked
against the manifest's checksum and every page against its CRC-32, into a raw token copy in
the local cache (``parquet_cache``); windows are then cut from that copy exactly as from a
memmap shard (``raw_windows``: one ``pread`` per window, blocks checked once per
process). A window therefore never decodes a row group, and workers share the copy through
the page cache. Any decode error is an ``LmdataError`` naming the shard file.
``doc_starts`` reads a shard's doc_id/token_offset columns (no tokens); ``arrow_rows``
(for ``lmdata sql``) scans the shards' rows, each shard verified first.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.process_local import per_process
from lmdata.store.blocks import BlockSums
from lmdata.store.formats import base
from lmdata.store.formats.raw_windows import RawFile, RawWindows
from lmdata.store.formats.rows import ROW_COLUMNS, RowUnit, VerifiedRows
from lmdata.store.formats.shard_copies import CopiedShards
from lmdata.store.formats.parquet_cache import DecodedShards, copy_key, file_identity
from lmdata.store.formats.parquet_encode import Part, encode_rows, prepare as prepare_encoder
from lmdata.store.checksum import DEFAULT_VERIFY, write_shard_parts, \
    read_error, shard_file_path, stat_shard_file, verify_shard
from lmdata.store.manifest import FILE_SPEC, Many
from lmdata.store.protocol import ShardInfo

# A row holds at most this many tokens: documents longer than that are split, so a
# window never forces decoding a whole long document (a trial on
# this box: Lance `take` of ~1,024-token rows ~26M tokens/s, of whole documents 5.5M).
PIECE_TOKENS = 1024

# Row-group size and encoding: the reader decodes a shard whole (never a row group per window),
# so both are chosen for writing and decoding a shard. Measured on this box (one 1 Mi-token
# shard of real uint16 ids, zstd, CPU ms; bench/README.md, "Ingest"): 16-row groups with
# PLAIN int32 values wrote in 33 ms, decoded in 11.8 ms, 1.80 MB; 128-row groups with the
# values BYTE_STREAM_SPLIT (Parquet stores uint16 as int32: the split puts the zero high bytes
# together, which zstd then skips) decode in 7.8 ms, 1.52 MB, and pq.write_table wrote them in
# 14 ms. ``parquet_encode`` writes the same file (one data page per column chunk, page CRCs,
# statistics on doc_id and token_offset; tests/store/test_parquet_encode.py) in 6.8 ms, ~4.1 of
# it zstd (a shard of 1,651 rows: 1,612,172 bytes, pyarrow's 1,613,676). DuckDB and Polars
# read the split encoding (tests/store/test_parquet_rows.py). 1,024-row groups (a page then holds at
# most 1,024 x PIECE_TOKENS ids, 4 MiB of int32) instead of 128: a shard's ~13 column chunks of each
# column become ~2, so ~1/6 of the page headers, statistics and zstd calls (32 real 1 Mi-token shards,
# encode alone: 7.5-8.8 -> 6.6-6.9 CPU ms a shard) and 8% fewer bytes (1.586 -> 1.456 MB a shard).
# Tokens pages compressed with zstd's level-1 search narrowed to 7+-byte matches in a 256-entry
# table (``parquet_encode._pages_zstd``): 10 real shards, encode alone 5.5 -> 3.9 CPU ms a shard,
# 0.3% fewer bytes, pyarrow's decode no slower (4.8 ms a shard either way).
ROW_GROUP_ROWS = 1024

DEFAULT_CACHE_BYTES = 1 << 30  # decoded shards kept in a process's memory when the machine's cache is off


def _names(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def pieces(doc_starts: np.ndarray, piece: int = PIECE_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """Row starts (shard-relative, then the shard length) and each row's document index.

    >>> pieces(np.array([0, 3, 8]), piece=4)     # docs of 3 and 5 tokens
    (array([0, 3, 7, 8]), array([0, 1, 1]))
    """
    doc_starts = np.asarray(doc_starts, dtype=np.int64)
    lengths = np.diff(doc_starts)
    n_pieces = np.maximum(1, -(-lengths // piece))
    doc_of_row = np.repeat(np.arange(len(lengths)), n_pieces)
    first_row = np.cumsum(n_pieces) - n_pieces
    within = np.arange(len(doc_of_row)) - np.repeat(first_row, n_pieces)
    starts = doc_starts[:-1][doc_of_row] + within * piece
    return np.concatenate([starts, doc_starts[-1:]]), doc_of_row


def rows_table(tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int,
               rows: tuple[np.ndarray, np.ndarray] | None = None) -> Any:
    """The Arrow table of a shard's rows (shared with the Lance format); ``rows``: ``pieces(doc_starts)``,
    when the caller has it already."""
    import pyarrow as pa

    if len(tokens) >= 2**31:
        raise LmdataError(f"a shard of {len(tokens)} tokens is too large for list<> offsets; lower --shard-tokens")
    row_starts, doc_of_row = rows if rows is not None else pieces(doc_starts)
    values = pa.array(tokens, type=pa.from_numpy_dtype(tokens.dtype))
    token_lists = pa.ListArray.from_arrays(pa.array(row_starts.astype(np.int32)), values)
    return pa.table(
        {
            "doc_id": pa.array(doc_of_row + first_doc, type=pa.int64()),
            "token_offset": pa.array(row_starts[:-1] + first_token, type=pa.int64()),
            "tokens": token_lists,
        }
    )


def encode_shard(tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int,
                 rows: tuple[np.ndarray, np.ndarray] | None = None) -> list[Part]:
    """A shard's Parquet file (the rows of ``rows_table``), in parts to be written in order.
    ``rows``: ``pieces(doc_starts)``, when the caller has it already."""
    row_starts, doc_of_row = rows if rows is not None else pieces(doc_starts)
    return encode_rows(tokens, row_starts, doc_of_row + first_doc, first_token, ROW_GROUP_ROWS)


def row_doc_starts(row_doc: np.ndarray, row_start: np.ndarray, n_tokens: int) -> np.ndarray:
    """A shard's document starts (then ``n_tokens``) from its rows' documents and starts.

    >>> row_doc_starts(np.array([0, 1, 1]), np.array([0, 3, 7]), 8)     # rows of pieces(...) above
    array([0, 3, 8])
    """
    row_doc, row_start = np.asarray(row_doc), np.asarray(row_start, dtype=np.int64)
    first = np.flatnonzero(np.r_[True, row_doc[1:] != row_doc[:-1]]) if len(row_doc) else np.zeros(0, np.int64)
    return np.append(row_start[first], np.int64(n_tokens))


def flat_tokens(column: Any, dtype: np.dtype) -> np.ndarray:
    """The values of a (chunked) list<int> column as one NumPy array, zero-copy when one chunk."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        chunks = [numpy_values(c.flatten()) for c in column.chunks]
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
    return numpy_values(column.flatten())


def numpy_values(array: Any) -> np.ndarray:
    """A primitive Arrow array's values as a zero-copy NumPy view of its data buffer. pyarrow's
    ``to_numpy`` imports pandas (~0.2 CPU s, in a process's first decode of a shard); an array with
    nulls (never in an lmdata shard) or of another type still goes through it."""
    import pyarrow as pa

    if array.null_count or not pa.types.is_integer(array.type):
        return array.to_numpy(zero_copy_only=False)
    kind = "u" if pa.types.is_unsigned_integer(array.type) else "i"
    values = np.dtype(f"{kind}{array.type.bit_width // 8}")
    if not len(array):  # (an empty array may have no data buffer)
        return np.zeros(0, values)
    return np.frombuffer(array.buffers()[1], dtype=values, count=len(array), offset=array.offset * values.itemsize)




class ParquetWriter(base.RecordedShardWriter):
    """One Parquet file per shard, rows of <= PIECE_TOKENS tokens, small row groups."""

    OWNED = re.compile(r"shard-\d{5,}\.parquet|_shards")

    @classmethod
    def prepare(cls, dtype: np.dtype) -> None:
        prepare_encoder(np.dtype(dtype).name)

    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo:
        tokens, doc_starts = self.shard_arrays(tokens, doc_starts)
        rows = pieces(doc_starts)
        parts = encode_shard(tokens, doc_starts, first_doc, first_token, rows)  # in memory, then written at once
        name = _names(index)
        base.forget(self.format_dir, index)
        replaced, info = write_shard_parts(self.format_dir, name, parts)
        n_rows = len(rows[1])
        extra = {"rows": n_rows, "row_groups": -(-n_rows // ROW_GROUP_ROWS)}
        shard = ShardInfo(
            name=f"{index:05d}", n_docs=len(doc_starts) - 1, n_tokens=len(tokens), first_doc=first_doc,
            first_token=first_token, files=[info], extra=extra,
        )
        base.write_record(self.format_dir, index, shard, sync_dirs=[self.format_dir] if replaced else [])
        return shard


class ParquetReader(CopiedShards, RawWindows, base.ShardReader):
    """Windows from each shard decoded once per machine (``parquet_cache``), read like memmap shards."""

    MANIFEST_SHARD = {"files": Many(FILE_SPEC, 1), "extra": {"rows": int, "row_groups?": int}}

    def __init__(
        self, format_dir: Path, shards: list[ShardInfo], dtype: np.dtype, *, cache_bytes: int = DEFAULT_CACHE_BYTES,
        verify: str = DEFAULT_VERIFY, use_cache: bool = True,
    ) -> None:
        """``use_cache=False``: shards are decoded from the store's files into this process's memory,
        never read from or written to the machine's decoded copies (``lmdata verify``: the store's own
        bytes, each read once; a verify had left a store's worth of copies nobody might read)."""
        super().__init__(format_dir, shards, dtype, verify=verify)
        self.cache_bytes = cache_bytes  # decoded shards kept in memory when the machine's cache is off
        self.copies = DecodedShards.from_env("parquet")
        if not use_cache:
            self._read_once()

    _real_dir = per_process(lambda self: os.path.realpath(self.format_dir))

    def _copy_key(self, i: int) -> str:
        """The decoded copy's key: the manifest's checksum and the identity of the file now at the shard's
        path. Local: the one stat also size-checks the shard file (a damaged store is refused even
        while a copy decoded from the sound file serves its tokens; remote: ``open_store``'s LIST did)."""
        shard = self.shards[i]
        info = shard.files[0]
        if self.remote:
            return copy_key(info.digest, f"{self._path(i).uri}:{info.bytes}")
        path, st = stat_shard_file(self._dir, shard, info)
        for other in shard.files[1:]:
            stat_shard_file(self._dir, shard, other)
        plain = path == os.path.join(self._dir, info.path)  # a plain name, no symlink: no realpath call
        real = f"{self._real_dir}/{info.path}" if plain else os.path.realpath(path)
        return copy_key(info.digest, file_identity(real, st))

    def _path(self, i: int) -> Any:
        shard = self.shards[i]
        if self.remote:
            return self.format_dir / shard.files[0].path
        return shard_file_path(self.format_dir, shard, shard.files[0])

    _remakes_lost_files = True  # another process may evict a decoded copy: decode it again

    def _open_tokens(self, i: int) -> RawFile | np.ndarray:
        """Shard ``i``'s tokens: its decoded copy, decoding it first when the machine has none (in
        memory when the machine's cache is off)."""
        if self.copies is None and not self.remote:
            verify_shard(self.format_dir, self.shards[i], "size")
        return self._copied_tokens(i)

    def _block_sums(self, i: int) -> BlockSums | None:
        return self._copied_sums(i)

    def _where(self, i: int) -> str:
        return f"{self._path(i)}: shard {self.shards[i].name} (decoded copy {self._copy_name(i)})"

    def _fetch(self, i: int) -> np.ndarray:
        return self._decode(i)

    def _decode(self, i: int) -> np.ndarray:
        """Shard ``i``'s tokens, from its bytes checked against the manifest: its checksum, unless verify="size" and
        the tokens stay in this process (a decoded copy is the machine's: every later reader trusts it;
        a copy that could not be written leaves them here too)."""
        shard, path = self.shards[i], self._path(i)
        info = shard.files[0]
        raw = path.read_bytes()
        if len(raw) != info.bytes:
            raise LmdataError(f"{path}: shard {shard.name} has {len(raw)} bytes, the manifest says {info.bytes}; "
                              "the store is damaged (run `lmdata verify`; re-ingest with --overwrite)")
        trusted_later = self.copies is not None and self.copies.writable  # a copy every later reader trusts
        if (self.verify != "size" or trusted_later) and not info.matches(raw):
            raise LmdataError(f"{path}: shard {shard.name} fails its {info.algo} checksum (the file is not the one "
                              "ingested); run `lmdata verify` and re-ingest with --overwrite")
        try:
            tokens = decoded_tokens(raw, self.dtype)
        except Exception as exc:  # pyarrow's bare OSError ("ZSTD decompression failed", a CRC mismatch)
            raise read_error(path, shard, exc) from exc
        if len(tokens) != shard.n_tokens:
            raise LmdataError(f"{path}: shard {shard.name} holds {len(tokens)} tokens, the manifest says "
                              f"{shard.n_tokens}; run `lmdata verify`")
        return tokens  # ``decoded_tokens``': this dtype, contiguous, NumPy's own

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        return self._raw_windows(starts, length)

    def _document(self, i: int, k: int) -> np.ndarray:
        starts = self.doc_starts(i)
        return self._raw_span(i, int(starts[k]), int(starts[k + 1]))

    def _file(self, i: int) -> Any:
        """Shard ``i``'s ParquetFile, opened for one read (no descriptor kept between reads)."""
        import pyarrow.parquet as pq

        shard, path = self.shards[i], self._path(i)
        try:
            return pq.ParquetFile(path.open_input() if self.remote else str(path), page_checksum_verification=True)
        except LmdataError:
            raise
        except Exception as exc:  # pyarrow raises several types for a damaged footer
            raise LmdataError(f"{path}: shard {shard.name} is not a readable Parquet file ({exc})") from exc

    def doc_starts(self, i: int) -> np.ndarray:
        """Shard ``i``'s document starts (within the shard), then its length: its rows' doc_id and
        token_offset columns (no tokens decoded)."""
        shard = self.shards[i]
        path = self._path(i)
        if not self.remote:
            verify_shard(self.format_dir, shard, "size")
        pf = self._file(i)
        try:
            table = pf.read(columns=["doc_id", "token_offset"], use_threads=False)
        except Exception as exc:
            raise read_error(path, shard, exc) from exc
        finally:
            pf.close()
        offsets = table.column("token_offset").to_numpy() - shard.first_token
        starts = row_doc_starts(table.column("doc_id").to_numpy(), offsets, shard.n_tokens)
        if len(starts) != shard.n_docs + 1:
            raise LmdataError(f"{path}: shard {shard.name} holds {len(starts) - 1} documents, the manifest says "
                              f"{shard.n_docs}; run `lmdata verify`")
        return starts

    def arrow_rows(self) -> VerifiedRows:
        """The split's rows for ``lmdata sql``, each shard verified before it is served (``VerifiedRows``)."""
        def scan(unit: RowUnit) -> Any:
            pf = self._file(unit.shard)
            try:
                yield from pf.iter_batches(batch_size=4096, columns=list(ROW_COLUMNS), use_threads=False)
            finally:
                pf.close()

        return VerifiedRows(self, scan)


def decoded_tokens(raw: bytes, dtype: np.dtype) -> np.ndarray:
    """The ``tokens`` values of the Parquet file ``raw`` (page CRCs checked) as one NumPy array that owns
    its memory, decoded through pyarrow's default pool, whose unused memory is then handed back.

    Why this pool, released: pyarrow's default (mimalloc) keeps what a decode freed (a reader that had
    decoded six 20 M-token shards held 1.4-1.9 GB of RSS), and the system allocator maps and unmaps
    each large scratch buffer, faulting its pages in every time (one such shard: 417-451 ms against
    156-171). Six at once on 8 threads: system 1.85-1.89 s, RSS after 353-368 MB; mimalloc released
    after each 0.89-0.93 s, 276-282 MB. The values are copied out first so the pool can let go."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(pa.BufferReader(raw), page_checksum_verification=True)
        column = pf.read(columns=["tokens"], use_threads=False).column(0)
        tokens = flat_tokens(column, dtype)
        if not tokens.flags.owndata or tokens.dtype != dtype:  # a view of Arrow's buffer: NumPy's own copy
            tokens = np.array(tokens, dtype=dtype)
        del column, pf
    finally:
        pa.default_memory_pool().release_unused()
    return tokens
