"""Every registered format: windows, documents and damage, against the stream it was given."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.store.registry import get_format

from formats import FORMATS
DTYPES = [np.uint16, np.uint32]


@pytest.fixture(scope="module", params=DTYPES, ids=lambda d: np.dtype(d).name)
def synthetic(request, tmp_path_factory, store_builder):
    """One store per dtype holding every format (written once, read by many tests)."""
    return store_builder(tmp_path_factory.mktemp("store"), FORMATS, dtype=request.param)


def reader(syn, fmt):
    return open_store(syn.path).reader("train", fmt)


def boundary_offsets(store, fmt, length):
    """Window starts that straddle every shard boundary, plus the first and the last window."""
    shards = store.manifest.splits["train"].formats[fmt]
    n = store.n_tokens("train")
    edges = [s.first_token for s in shards[1:]]
    starts = [0, n - length] + [max(0, e - length // 2) for e in edges] + [max(0, e - 1) for e in edges]
    return np.array([min(s, n - length) for s in starts])


@pytest.mark.parametrize("fmt", FORMATS)
def test_windows_equal_slices_of_the_stream(synthetic, fmt):
    store = open_store(synthetic.path)
    r = store.reader("train", fmt)
    assert r.n_tokens == len(synthetic.stream)
    rng = np.random.default_rng(1)
    for length in (1, 7, 1025, 3000):
        starts = np.concatenate(
            [boundary_offsets(store, fmt, length), rng.integers(0, r.n_tokens - length + 1, size=32)]
        )
        got = r.windows(starts, length)
        assert got.dtype == store.dtype and got.shape == (len(starts), length)
        want = synthetic.stream[starts[:, None] + np.arange(length)]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_windows_property(synthetic, fmt, data):
    r = reader(synthetic, fmt)
    n = r.n_tokens
    length = data.draw(st.integers(1, 2500))
    starts = np.array(data.draw(st.lists(st.integers(0, n - length), min_size=0, max_size=16)), dtype=np.int64)
    got = r.windows(starts, length)
    np.testing.assert_array_equal(got, synthetic.stream[starts[:, None] + np.arange(length)].reshape(-1, length))


@pytest.mark.parametrize("fmt", FORMATS)
def test_windows_outside_the_stream_are_refused(synthetic, fmt):
    r = reader(synthetic, fmt)
    with pytest.raises(IndexError):
        r.windows(np.array([r.n_tokens - 5]), 10)
    with pytest.raises(IndexError):
        r.windows(np.array([-1]), 10)


@pytest.mark.parametrize("fmt", FORMATS)
def test_documents(synthetic, fmt):
    store = open_store(synthetic.path)
    n_docs = len(synthetic.doc_starts) - 1
    shards = store.manifest.splits["train"].formats[fmt]
    picks = {0, n_docs - 1, n_docs // 2} | {s.first_doc for s in shards} | {s.first_doc - 1 for s in shards[1:]}
    lengths = np.diff(synthetic.doc_starts)
    picks.add(int(np.argmax(lengths)))  # a document cut into several rows
    for k in sorted(picks):
        doc = store.document("train", k, format=fmt)
        want = synthetic.stream[synthetic.doc_starts[k] : synthetic.doc_starts[k + 1]]
        np.testing.assert_array_equal(doc, want)
        assert doc[-1] == synthetic.eot
    with pytest.raises(LmdataError, match=r"document \d+: split .* has documents 0\.\."):
        store.document("train", n_docs, format=fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_doc_starts_index_every_document(synthetic, fmt):
    """The per-document index (``doc_starts``, every format) and the rows (``arrow_rows``, optional)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    r = reader(synthetic, fmt)
    shards = open_store(synthetic.path).manifest.splits["train"].formats[fmt]
    starts = [r.doc_starts(i)[:-1] + s.first_token for i, s in enumerate(shards)] + [[len(synthetic.stream)]]
    np.testing.assert_array_equal(np.concatenate(starts), synthetic.doc_starts)
    if not hasattr(r, "arrow_rows"):
        return
    rows = r.arrow_rows()
    for _ in range(2):  # scannable again
        table = rows.to_table() if isinstance(rows, pads.Dataset) else pa_table(rows)
        np.testing.assert_array_equal(pc.list_flatten(table.column("tokens")).to_numpy(), synthetic.stream)
        assert table.column("doc_id").to_pylist() == sorted(table.column("doc_id").to_pylist())


def pa_table(stream_source):
    import pyarrow as pa

    return pa.RecordBatchReader.from_stream(stream_source).read_all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_pickles_small_and_reads_after_unpickling(synthetic, fmt):
    import pickle

    r = reader(synthetic, fmt)
    r.windows(np.array([0, 100]), 50)  # opens files: they must not travel
    blob = pickle.dumps(r)
    assert len(blob) < 20_000
    r2 = pickle.loads(blob)
    np.testing.assert_array_equal(r2.windows(np.array([5]), 20)[0], synthetic.stream[5:25])


def _read_in_child(r, start, length, queue):
    try:
        queue.put(r.windows(np.array([start]), length)[0].tolist())
    except LmdataError as exc:
        queue.put(str(exc))


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_in_a_child_process(synthetic, fmt, method):
    """Opened in the parent, read in a child; Lance, not fork-safe, refuses a fork (test_lance_reader.py)."""
    import multiprocessing as mp

    r = reader(synthetic, fmt)
    r.windows(np.array([0]), 10)  # opened in the parent before the child starts
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    start = len(synthetic.stream) - 2000
    proc = ctx.Process(target=_read_in_child, args=(r, start, 1500, queue), daemon=True)
    proc.start()
    try:
        got = queue.get(timeout=60)
        proc.join(timeout=60)
    finally:
        proc.kill()  # a hung child must not hang the suite's exit too
    if fmt == "lance" and method == "fork":
        assert "forked after Lance ran in its parent" in got
        return
    assert proc.exitcode == 0
    assert got == synthetic.stream[start : start + 1500].tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_shard_is_refused_naming_the_file(make_store, fmt):
    syn = make_store([fmt])
    shard = open_store(syn.path).manifest.splits["train"].formats[fmt][1]
    victim = syn.path / "train" / fmt / shard.files[0].path
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size - 2)
    reader = open_store(syn.path).reader("train", fmt)  # made without a stat of every file (100,000 shards: 1 s)
    with pytest.raises(LmdataError, match=re.escape(shard.files[0].path)):  # refused where it is first read
        reader.windows(np.array([shard.first_token]), 8)
    from lmdata.store.manifest import read_manifest

    m = read_manifest(syn.path)
    r = get_format(fmt).reader(syn.path / "train" / fmt, m.splits["train"].formats[fmt], np.dtype(m.dtype))
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        r.check()


@pytest.mark.parametrize("fmt", FORMATS)
def test_completed_shards_are_reported_for_resume(make_store, fmt):
    syn = make_store(sorted({fmt, "memmap"}))
    formats = open_store(syn.path).manifest.splits["train"].formats
    writer = get_format(fmt).writer(syn.path / "train" / fmt, np.dtype(np.uint16))
    done = writer.completed()
    assert sorted(done) == list(range(len(formats["memmap"])))  # the ingest's shards, whatever the layout
    counts = [(s.name, s.n_docs, s.n_tokens, s.first_doc, s.first_token) for s in formats["memmap"]]
    assert [(d.name, d.n_docs, d.n_tokens, d.first_doc, d.first_token) for d in done.values()] == counts
    if fmt != "lance":  # Lance's manifest shards are fragments of several shards
        assert [done[i].to_json() for i in sorted(done)] == [s.to_json() for s in formats[fmt]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cleanup_partial_removes_leftovers(make_store, fmt):
    syn = make_store([fmt])
    fdir = syn.path / "train" / fmt
    leftover = fdir / ".shard-00009.tmp-4242"
    leftover.write_bytes(b"half a shard")
    writer = get_format(fmt).writer(fdir, np.dtype(np.uint16))
    writer.cleanup_partial()
    assert not leftover.exists()
    # the completed store is untouched
    r = open_store(syn.path).reader("train", fmt)
    np.testing.assert_array_equal(r.windows(np.array([0]), 100)[0], syn.stream[:100])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_shard_damaged_after_open_is_refused_on_first_read(make_store, fmt):
    syn = make_store([fmt])
    store = open_store(syn.path)
    r = store.reader("train", fmt)
    shard = store.manifest.splits["train"].formats[fmt][-1]
    victim = syn.path / "train" / fmt / shard.files[0].path
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size // 2)
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        r.windows(np.array([len(syn.stream) - 100]), 100)


@pytest.mark.parametrize("fmt", FORMATS)
def test_finish_drops_shards_of_an_interrupted_longer_run(tmp_path, fmt):
    fdir = tmp_path / "train" / fmt
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 100, size=n).astype(np.uint16) for n in (500, 600, 700)]
    offsets = [0, 500, 1100]
    first = get_format(fmt).writer(fdir, np.dtype(np.uint16))
    infos = [first.write_shard(i, t, np.array([0, len(t)]), i, offsets[i]) for i, t in enumerate(tokens)]
    second = get_format(fmt).writer(fdir, np.dtype(np.uint16))
    second.cleanup_partial()
    shards = second.finish(infos[:2]) or infos[:2]
    assert sorted(second.completed()) == [0, 1]
    for f in infos[2].files:
        assert not (fdir / f.path).exists()
    r = get_format(fmt).reader(fdir, shards, np.dtype(np.uint16))
    np.testing.assert_array_equal(r.windows(np.array([400]), 500)[0], np.concatenate(tokens[:2])[400:900])
