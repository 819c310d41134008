"""parquet_encode writes the file pq.write_table wrote for a shard's rows: the same rows, schema,
footer (field for field, but sizes, offsets and created_by) and statistics, read alike by
pyarrow, DuckDB and Polars, and every page checked against its CRC."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.store.formats.parquet import PIECE_TOKENS, ROW_GROUP_ROWS, encode_shard, rows_table

DTYPES = [np.uint16, np.uint32]
FIRST_DOC, FIRST_TOKEN = 70, 123_456_789_000  # token offsets past 2**32


def pyarrow_file(tokens, doc_starts):
    """The file as pq.write_table wrote it before parquet_encode (the format's options then)."""
    sink = pa.BufferOutputStream()
    pq.write_table(rows_table(tokens, doc_starts, FIRST_DOC, FIRST_TOKEN), sink, row_group_size=ROW_GROUP_ROWS,
                   compression="zstd", use_dictionary=False, use_byte_stream_split=["tokens.list.element"],
                   write_statistics=["doc_id", "token_offset"], write_page_checksum=True)
    return sink.getvalue().to_pybytes()


def shard(lengths, dtype, seed=0, high=None):
    """Tokens (random ids, near the dtype's max when ``high``) and document starts for docs of ``lengths``."""
    rng = np.random.default_rng(seed)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    top = np.iinfo(dtype).max
    tokens = rng.integers(top - 300 if high else 0, top, int(doc_starts[-1]), endpoint=True).astype(dtype)
    return tokens, doc_starts


# ----------------------------------------------------------------- Thrift compact, read back


def _thrift(data: bytes, at: int):
    """A compact-protocol struct at ``at`` as {field id: (type, value)}, and where it ends."""

    def varint():
        nonlocal at
        n = shift = 0
        while True:
            byte = data[at]
            at += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return n

    def value(kind):
        nonlocal at
        if kind in (1, 2):
            return kind == 1
        if kind == 3:
            at += 1
            return data[at - 1]
        if kind in (4, 5, 6):
            n = varint()
            return (n >> 1) ^ -(n & 1)
        if kind == 8:
            n = varint()
            at += n
            return data[at - n:at]
        if kind == 9:
            head = data[at]
            at += 1
            n = head >> 4 if head >> 4 != 15 else varint()
            return [value(head & 15) for _ in range(n)]
        assert kind == 12, kind
        return fields()

    def fields():
        nonlocal at
        out, last = {}, 0
        while data[at]:
            head = data[at]
            at += 1
            fid = last + (head >> 4) if head >> 4 else value(4)
            out[fid] = (head & 15, value(head & 15))
            last = fid
        at += 1
        return out

    return fields(), at


def footer(data: bytes) -> dict:
    (size,) = struct.unpack_from("<I", data, len(data) - 8)
    return _thrift(data, len(data) - 8 - size)[0]


VARIES = {"row group": (2, 5, 6), "column": (6, 7, 9), "page": (2, 3, 4)}  # sizes, offsets, CRCs


def without_sizes(meta: dict, where: str) -> dict:
    """``meta`` with the fields that vary blanked (their presence and type kept)."""
    return {k: (v[0], None) if k in VARIES[where] else v for k, v in meta.items()}


def assert_same_footer(ours: bytes, theirs: bytes) -> None:
    """Every footer field and page header equal, thrift types included, but sizes, offsets, CRCs and created_by."""
    a, b = footer(ours), footer(theirs)
    assert a.pop(6)[1].startswith(b"lmdata version ") and b.pop(6)[1].startswith(b"parquet-cpp-arrow")
    groups_a, groups_b = a.pop(4)[1], b.pop(4)[1]
    assert a == b and len(groups_a) == len(groups_b)
    for ga, gb in zip(groups_a, groups_b):
        columns_a, columns_b = ga.pop(1)[1], gb.pop(1)[1]
        assert without_sizes(ga, "row group") == without_sizes(gb, "row group")
        for ca, cb in zip(columns_a, columns_b):
            meta_a, meta_b = ca[3][1], cb[3][1]
            assert without_sizes(meta_a, "column") == without_sizes(meta_b, "column")
            page_a, page_b = (_thrift(data, meta[9][1])[0] for data, meta in ((ours, meta_a), (theirs, meta_b)))
            assert without_sizes(page_a, "page") == without_sizes(page_b, "page")


# ----------------------------------------------------------------- the tests


def encoded(tokens, doc_starts) -> bytes:
    return b"".join(encode_shard(tokens, doc_starts, FIRST_DOC, FIRST_TOKEN))


def assert_as_pyarrow_wrote(tokens, doc_starts) -> bytes:
    data, theirs = encoded(tokens, doc_starts), pyarrow_file(tokens, doc_starts)
    ours_pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    theirs_pf = pq.ParquetFile(pa.BufferReader(theirs))
    want = rows_table(tokens, doc_starts, FIRST_DOC, FIRST_TOKEN)
    got = ours_pf.read()
    assert got.schema == theirs_pf.schema_arrow and got.schema.equals(want.schema, check_metadata=False)
    assert got.equals(want)
    assert ours_pf.metadata.num_row_groups == theirs_pf.metadata.num_row_groups
    for i in range(ours_pf.metadata.num_row_groups):
        for j in range(3):
            ours, theirs_col = ours_pf.metadata.row_group(i).column(j), theirs_pf.metadata.row_group(i).column(j)
            assert ours.statistics == theirs_col.statistics and ours.is_stats_set == theirs_col.is_stats_set
            assert (ours.encodings, ours.compression, ours.num_values) == (
                theirs_col.encodings, theirs_col.compression, theirs_col.num_values)
    assert_same_footer(data, theirs)
    return data


SHAPES = {
    "one row": [5],
    "one token": [1],
    "exactly one row group": [7] * ROW_GROUP_ROWS,
    "one row past a row group": [3] * (ROW_GROUP_ROWS + 1),
    "long documents cut into rows, the last shorter": [3 * PIECE_TOKENS + 17, 1, 2 * PIECE_TOKENS, PIECE_TOKENS + 1],
    "many row groups": [1, 900, 2, 40, 1500] * 60,
    "empty documents": [0, 4, 0, 0, 3, 0],
    "only empty documents, two row groups": [0] * (ROW_GROUP_ROWS + 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_file_is_the_one_pyarrow_wrote(shape, dtype):
    tokens, doc_starts = shard(SHAPES[shape], dtype)
    assert_as_pyarrow_wrote(tokens, doc_starts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_ids_near_the_dtype_max(dtype):
    tokens, doc_starts = shard([2500, 10, 300] * 50, dtype, high=True)
    tokens[::97] = np.iinfo(dtype).max
    assert_as_pyarrow_wrote(tokens, doc_starts)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 3 * PIECE_TOKENS), min_size=1, max_size=300),
       st.integers(0, 2**32 - 1))
def test_random_shards_are_the_files_pyarrow_wrote(dtype, lengths, seed):
    tokens, doc_starts = shard(lengths, dtype, seed=seed, high=seed % 2)
    assert_as_pyarrow_wrote(tokens, doc_starts)


def test_no_rows_is_a_file_of_no_row_groups():
    """pyarrow wrote one empty row group; no row group reads the same (an ingest never writes it)."""
    data = encoded(np.zeros(0, np.uint16), np.array([0]))
    pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    assert pf.metadata.num_row_groups == 0
    assert pf.read().equals(rows_table(np.zeros(0, np.uint16), np.array([0]), FIRST_DOC, FIRST_TOKEN))


@pytest.mark.parametrize("dtype", DTYPES)
def test_duckdb_and_polars_read_the_same_rows(tmp_path, dtype):
    import duckdb
    import polars as pl

    tokens, doc_starts = shard([1, 2 * PIECE_TOKENS + 5, 0, 77] * 40, dtype, high=True)
    path = tmp_path / "shard.parquet"
    path.write_bytes(encoded(tokens, doc_starts))
    want = rows_table(tokens, doc_starts, FIRST_DOC, FIRST_TOKEN).to_pylist()
    rows = duckdb.sql(f"SELECT doc_id, token_offset, tokens FROM read_parquet('{path}') ORDER BY token_offset, doc_id")
    assert [dict(zip(("doc_id", "token_offset", "tokens"), r)) for r in rows.fetchall()] == want
    assert pl.read_parquet(path).to_dicts() == want


@pytest.mark.parametrize("column", [0, 1, 2])
def test_a_flipped_byte_in_any_page_is_refused(column):
    tokens, doc_starts = shard([300, 2000, 5] * 100, np.uint16)
    data = encoded(tokens, doc_starts)
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    for group in (0, meta.num_row_groups - 1):
        chunk = meta.row_group(group).column(column)
        header, end = _thrift(data, chunk.data_page_offset)
        for at in (end, end + header[3][1] // 2, end + header[3][1] - 1):  # the page's first, middle, last byte
            damaged = bytearray(data)
            damaged[at] ^= 0x10
            with pytest.raises(OSError, match="CRC"):
                pq.ParquetFile(pa.BufferReader(bytes(damaged)), page_checksum_verification=True).read()


def test_shards_encoded_on_several_threads_at_once_are_the_files_one_thread_writes():
    """Tokens pages go through a zstd context per thread (``parquet_encode._pages_zstd``): shards
    encoded concurrently (a writer thread per split, Ray tasks' threads) come out byte for byte as
    one at a time, each one pyarrow's rows."""
    from concurrent.futures import ThreadPoolExecutor

    shards = [shard([1, 2 * PIECE_TOKENS + 5, 0, 900] * 30 + [seed + 1], np.uint16, seed=seed, high=seed % 2)
              for seed in range(8)]
    alone = [encoded(*s) for s in shards]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda s: encoded(*s), shards * 3))
    assert together == alone * 3
    for (tokens, doc_starts), data in zip(shards, alone):
        got = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True).read()
        assert got.equals(rows_table(tokens, doc_starts, FIRST_DOC, FIRST_TOKEN))
