"""Synthetic stores written with the real writers: random documents ending in eot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lmdata.store.formats import open_behind as _open_behind
from lmdata.store.formats import raw_windows as _raw_windows
from lmdata.store.manifest import Manifest, SplitInfo, write_manifest
from lmdata.store.registry import get_format

VOCAB = {np.dtype(np.uint16): 50257, np.dtype(np.uint32): 100_000}


@dataclass
class Synthetic:
    path: Path
    stream: np.ndarray  # the split's tokens, concatenated
    doc_starts: np.ndarray  # global document starts, then len(stream)
    eot: int


def random_docs(rng: np.random.Generator, n_tokens: int, eot: int, max_len: int = 3000) -> list[np.ndarray]:
    docs, total = [], 0
    while total < n_tokens:
        n = int(rng.integers(1, max_len))
        doc = rng.integers(0, eot, size=n).astype(np.int64)
        doc[-1] = eot
        docs.append(doc)
        total += n
    return docs


def write_split(store: Path, split: str, fmt: str, docs: list[np.ndarray], dtype: np.dtype, shard_tokens: int):
    """Cut ``docs`` into shards at document boundaries and write them with ``fmt``'s writer."""
    writer = get_format(fmt).writer(store / split / fmt, dtype)
    shards, cur, first_doc, first_token = [], [], 0, 0

    def flush() -> None:
        nonlocal cur, first_doc, first_token
        tokens = np.concatenate(cur).astype(dtype)
        starts = np.concatenate([[0], np.cumsum([len(d) for d in cur])])
        shards.append(writer.write_shard(len(shards), tokens, starts, first_doc, first_token))
        first_doc += len(cur)
        first_token += len(tokens)
        cur = []

    for doc in docs:
        cur.append(doc)
        if sum(len(d) for d in cur) >= shard_tokens:
            flush()
    if cur:
        flush()
    return writer.finish(shards) or shards  # Lance regroups shards into fragments


def build_store(
    path: Path, formats: list[str], dtype=np.uint16, n_tokens: int = 40_000, shard_tokens: int = 12_000, seed: int = 0
) -> Synthetic:
    dtype = np.dtype(dtype)
    eot = VOCAB[dtype] - 1
    docs = random_docs(np.random.default_rng(seed), n_tokens, eot)
    stream = np.concatenate(docs)
    info = SplitInfo(n_docs=len(docs), n_tokens=len(stream))
    for fmt in formats:
        info.formats[fmt] = write_split(path, "train", fmt, docs, dtype, shard_tokens)
    manifest = Manifest(
        tokenizer_hash="0" * 64, vocab_size=VOCAB[dtype], dtype=dtype.name, eot_id=eot,
        shard_tokens=shard_tokens, splits={"train": info},
    )
    write_manifest(path, manifest)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    return Synthetic(path, stream, starts, eot)


@pytest.fixture(autouse=True)
def small_lance_fragments(monkeypatch):
    """Lance fragments of ~2 shards (not one 256 Mi-token fragment), so reads cross fragments."""
    from lmdata.store.formats import lance_fragments

    monkeypatch.setattr(lance_fragments, "FRAGMENT_TOKENS", 30_000)


@pytest.fixture
def make_store(tmp_path):
    def make(formats, **kw) -> Synthetic:
        return build_store(tmp_path / "store", list(formats), **kw)

    return make


@pytest.fixture(scope="session")
def store_builder():
    """``build_store`` for module-scoped fixtures (test modules here are not a package)."""
    return build_store


@pytest.fixture
def earlier_lance_layout(monkeypatch):
    """Make the Lance writer write what an earlier lmdata wrote: each row's tokens again as
    ``token_bytes`` (little-endian bytes), records marked ``"token_bytes": True``. ``damage``,
    if given, edits the ``token_bytes`` bytes of each shard (an ingest bug in that column alone);
    ``patch``: a ``monkeypatch.context()`` to end it early (default: the test's)."""
    import pyarrow as pa

    from lmdata.store.formats import lance as lance_format
    from lmdata.store.formats import lance_fragments

    rows_table, schema = lance_format.rows_table, lance_format.lance_schema

    def use(damage=None, patch=monkeypatch):
        def with_token_bytes(*args):
            table = rows_table(*args)
            tokens = table.column("tokens").combine_chunks()
            width = tokens.values.type.bit_width // 8
            offsets = tokens.offsets.to_numpy().astype(np.int64) * width
            data = bytearray(tokens.values.buffers()[1].to_pybytes()[:len(tokens.values) * width])
            if damage is not None:
                damage(data)
            raw = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(tokens),
                                                   [None, pa.py_buffer(offsets), pa.py_buffer(bytes(data))])
            return table.append_column("token_bytes", raw)

        patch.setattr(lance_format, "rows_table", with_token_bytes)
        patch.setattr(lance_format, "lance_schema",
                      lambda dtype: schema(dtype).append(pa.field("token_bytes", pa.large_binary())))
        for module in (lance_format, lance_fragments):
            patch.setattr(module, "LAYOUT", {"token_bytes": True})

    return use


@pytest.fixture
def behind(monkeypatch):
    """Every split of more than 4 shards opened behind its first batch, one shard a chunk (the most
    interleaving of the thread's and the batches' first touches); records, in order, each shard's
    openings: in one call (``_opened``) or one by one (``_source``)."""
    monkeypatch.setattr(_open_behind, "OPEN_BEHIND_FROM", 4)
    monkeypatch.setattr(_open_behind, "CHUNK", 1)
    opened: Counter = Counter()
    in_one_call, one_by_one = _raw_windows.RawWindows._opened, _raw_windows.RawWindows._source

    def counting(self, shards, files, crcs_loaded):
        opened.update(shards)
        in_one_call(self, shards, files, crcs_loaded)

    def source(self, i):
        with self._touch_lock:  # (re-entered by the real one)
            new = self._sources[i] is None
            got = one_by_one(self, i)
            if new:
                opened.update([i])
            return got

    monkeypatch.setattr(_raw_windows.RawWindows, "_opened", counting)
    monkeypatch.setattr(_raw_windows.RawWindows, "_source", source)
    return opened
