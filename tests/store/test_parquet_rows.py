"""Row layout shared by Parquet and Lance, and the Parquet reader with its machine cache off."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.store import open_store
from lmdata.store.formats.parquet import PIECE_TOKENS, ROW_GROUP_ROWS, pieces


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 3 * PIECE_TOKENS), min_size=1, max_size=30))
def test_pieces_cover_each_document_in_bounded_rows(lengths):
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])
    row_starts, doc_of_row = pieces(doc_starts)
    sizes = np.diff(row_starts)
    assert row_starts[0] == 0 and row_starts[-1] == doc_starts[-1]
    assert np.all((sizes > 0) & (sizes <= PIECE_TOKENS))
    assert np.array_equal(np.bincount(doc_of_row, weights=sizes, minlength=len(lengths)), lengths)
    assert np.all(np.diff(doc_of_row) >= 0)
    assert set(doc_starts[:-1]) <= set(row_starts)  # a row never spans two documents


def test_parquet_file_layout_and_a_tiny_memory_budget(make_store, monkeypatch):
    syn = make_store(["parquet"])
    store = open_store(syn.path)
    shard = store.manifest.splits["train"].formats["parquet"][0]
    pf = pq.ParquetFile(syn.path / "train" / "parquet" / shard.files[0].path)
    assert pf.schema_arrow.names == ["doc_id", "token_offset", "tokens"]
    assert pf.metadata.row_group(0).num_rows == min(ROW_GROUP_ROWS, pf.metadata.num_rows)
    table = pf.read()
    doc_of_token = np.searchsorted(syn.doc_starts, np.arange(len(syn.stream)), side="right") - 1
    for doc_id, offset, tokens in zip(*(table.column(c).to_pylist() for c in ("doc_id", "token_offset", "tokens"))):
        assert tokens == syn.stream[offset : offset + len(tokens)].tolist()
        assert set(doc_of_token[offset : offset + len(tokens)]) == {doc_id}
    monkeypatch.setenv("LMDATA_PARQUET_CACHE_BYTES", "0")  # decoded into memory, every shard forgotten at once
    reader = store.reader("train", "parquet", cache_bytes=1)
    rng = np.random.default_rng(3)
    starts = rng.integers(0, len(syn.stream) - 1025, size=64)
    np.testing.assert_array_equal(reader.windows(starts, 1025), syn.stream[starts[:, None] + np.arange(1025)])
    assert reader._n_sources <= 2  # the last shard, and a straddled one


def test_other_tools_read_the_split_token_values(make_store):
    """The token values are BYTE_STREAM_SPLIT-encoded (cheaper to write and decode): DuckDB and
    Polars, as users run them on the shards, read the same ids."""
    import duckdb
    import polars as pl

    syn = make_store(["parquet"])
    files = sorted(str(p) for p in (syn.path / "train" / "parquet").glob("shard-*.parquet"))
    encodings = pq.ParquetFile(files[0]).metadata.row_group(0).column(2).encodings
    assert "BYTE_STREAM_SPLIT" in encodings
    by_duckdb = duckdb.sql(f"SELECT tokens FROM read_parquet({files!r}) ORDER BY token_offset").fetchall()
    assert np.array_equal(np.concatenate([np.array(t, np.int64) for (t,) in by_duckdb]), syn.stream)
    by_polars = pl.read_parquet(files).sort("token_offset")["tokens"].explode().to_numpy()
    assert np.array_equal(by_polars.astype(np.int64), syn.stream)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["uint16", "uint32", "int64", "int8"]), st.lists(st.integers(0, 40), max_size=12),
       st.integers(0, 5), st.integers(0, 5), st.booleans())
def test_decoded_values_are_what_to_numpy_gives(dtype, lengths, cut_front, cut_back, with_null):
    """``numpy_values`` (the data buffer, read without pyarrow's ``to_numpy``, which imports pandas)
    gives ``to_numpy``'s values for sliced list columns of every chunking, and falls back to it for
    an array with nulls."""
    import pyarrow as pa

    from lmdata.store.formats.parquet import flat_tokens, numpy_values

    n = sum(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(np.arange(n) % 100, type=pa.from_numpy_dtype(np.dtype(dtype)))
    lists = pa.ListArray.from_arrays(pa.array(offsets), values)
    lists = lists.slice(min(cut_front, len(lists)), max(0, len(lists) - cut_front - cut_back))
    want = lists.flatten().to_numpy(zero_copy_only=False)
    assert np.array_equal(numpy_values(lists.flatten()), want) and numpy_values(lists.flatten()).dtype == want.dtype
    half = len(lists) // 2
    chunked = pa.chunked_array([lists.slice(0, half), lists.slice(half)], type=lists.type)
    assert np.array_equal(flat_tokens(chunked, np.dtype(dtype)), want)
    if with_null:
        nullable = pa.array([1, None, 3], type=pa.from_numpy_dtype(np.dtype(dtype)))
        assert np.array_equal(numpy_values(nullable), nullable.to_numpy(zero_copy_only=False), equal_nan=True)
