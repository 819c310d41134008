"""Lance layouts and readers, windows only (no loader): CPU and wall ms per batch of 32 x 1,025 windows.

    .venv/bin/python bench/lance_layout.py               # after bench/loader.py made its stores

Reads the x1 and x10 stores that ``bench/loader.py`` ingests (``--work``, the same
default) and writes the same token stream in other Lance layouts under
``<work>/layouts-x<N>/`` (once). Every row reads the same random batches (``np.random``
seed 1; windows at any offset), each checked against the memmap store's windows, then
timed over ``--batches`` batches per round, best of ``--rounds`` interleaved rounds, once
with one batch per read and once with four (``make_loader``'s default ``batches_per_read``):

- ``lmdata:lance``       the store's reader: rows of <= 1,024 tokens cut at documents, read
                         from ``tokens`` (``token_bytes`` in stores before), fragments of whole shards up to
                         ``FRAGMENT_TOKENS``, one ``take`` per read, through Lance's io_uring reader
- ``lmdata:lance (file)`` the same reader on Lance's default local reader (``io="file"``)
- ``naive-lance``        documents as rows (bench/loader.py's), one ``take`` of the covering docs
- ``naive-lance (io_uring)`` the same through ``file+uring://``
- ``per-shard``          lmdata's rows, but a fragment per 1 Mi-token ingest shard (the layout
                         before fragments were grouped), one ``take`` per batch; also through
                         io_uring (many fragments: ``LanceDataset.take``'s path)
- ``fixed``              rows of exactly 1,024 tokens whatever the documents, one fragment, one ``take``
- ``fixed+raw``          ``fixed`` plus a ``large_binary`` copy of each row, read alone with
                         ``LanceFileReader.take_rows`` (2 more bytes per token on disk)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

B, L, PIECE = 32, 1025, 1024


def stream_and_docs(store: Any) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The split's tokens, global document starts (then n_tokens) and the ingest shards' bounds."""
    reader = store.reader("train", "memmap")
    bounds = reader.segments.bounds
    tokens = reader.windows(np.array([0]), int(bounds[-1]))[0].astype(store.dtype)
    docs = [reader.doc_starts(i)[:-1] + bounds[i] for i in range(len(bounds) - 1)]
    return tokens, np.concatenate(docs + [bounds[-1:]]), bounds.tolist()


def list_column(tokens: np.ndarray, starts: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(tokens))


def raw_column(tokens: np.ndarray, starts: np.ndarray) -> Any:
    import pyarrow as pa

    offsets = pa.array(starts.astype(np.int64) * tokens.itemsize)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts) - 1,
                                            [None, offsets.buffers()[1], pa.py_buffer(tokens.tobytes())])


def build_layouts(store: Any, out: Path) -> dict[str, tuple[Path, np.ndarray]]:
    """Each layout's dataset and its rows' global token starts (then n_tokens)."""
    import lance
    import pyarrow as pa

    from lmdata.store.formats.parquet import pieces

    tokens, docs, shard_bounds = stream_and_docs(store)
    n = len(tokens)
    cut, _ = pieces(docs)
    fixed = np.unique(np.minimum(np.arange(0, n + PIECE, PIECE), n))
    layouts = {"per-shard": (out / "per-shard", cut), "fixed": (out / "fixed", fixed),
               "fixed+raw": (out / "fixed-raw", fixed)}
    if (out / "done").is_file():
        return layouts
    shutil.rmtree(out, ignore_errors=True)  # a half-built run: Lance would append to it
    out.mkdir(parents=True)
    for lo, hi in zip(shard_bounds[:-1], shard_bounds[1:]):  # one fragment per ingest shard
        rows = cut[(cut >= lo) & (cut <= hi)]
        lance.write_dataset(pa.table({"tokens": list_column(tokens[lo:hi], rows - lo)}), out / "per-shard",
                            mode="append", data_storage_version="2.1")
    lance.write_dataset(pa.table({"tokens": list_column(tokens, fixed)}), out / "fixed",
                        data_storage_version="2.1", max_rows_per_file=1 << 30)
    lance.write_dataset(pa.table({"tokens": list_column(tokens, fixed), "raw": raw_column(tokens, fixed)}),
                        out / "fixed-raw", data_storage_version="2.1", max_rows_per_file=1 << 30)
    (out / "done").write_text("ok\n")
    return layouts


def row_reader(path: Path, row_starts: np.ndarray, raw: bool = False, uring: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """Windows from a Lance dataset whose row r holds tokens [row_starts[r], row_starts[r + 1])."""
    import lance
    import pyarrow as pa
    from lance.file import LanceFileReader

    from lmdata.store.formats.lance_uring import uring_uri
    from lmdata.store.windows import concat_ranges

    ds = lance.dataset(uring_uri(path) if uring else str(path))
    if raw:
        data_files = sorted((path / "data").iterdir())
        assert len(data_files) == 1, "the raw layout is one fragment"
        file = LanceFileReader(str(data_files[0]), columns=["raw"])

    def windows(starts: np.ndarray) -> np.ndarray:
        first = np.searchsorted(row_starts, starts, side="right") - 1
        last = np.searchsorted(row_starts, starts + L - 1, side="right") - 1
        rows = np.unique(concat_ranges(first, last - first + 1))
        if raw:
            col = file.take_rows(rows.tolist()).to_table().column(0).combine_chunks()
            values = np.frombuffer(col.buffers()[2], dtype=np.uint16)
            offsets = np.frombuffer(col.buffers()[1], dtype=np.int64)[col.offset:col.offset + len(col) + 1] // 2
        else:
            col = ds.take(pa.array(rows), columns=["tokens"]).column(0).combine_chunks()
            values, offsets = col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy()
        at = offsets[np.searchsorted(rows, first)] + (starts - row_starts[first])
        return values[at[:, None] + np.arange(L)].astype(np.int64)

    return windows


def time_rounds(readers: dict[str, Callable], batches: list[np.ndarray], rounds: int) -> dict[str, tuple[float, float]]:
    """Best (CPU ms, wall ms) per batch of each reader over interleaved rounds."""
    best = {name: (np.inf, np.inf) for name in readers}
    for _ in range(rounds):
        for name, read in readers.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for starts in batches:
                read(starts)
            cpu, wall = (time.process_time() - c0) * 1e3 / len(batches), (time.perf_counter() - w0) * 1e3 / len(batches)
            best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lmdata-bench-loader")
    ap.add_argument("--tiles", default="1,10")
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-read", default="1,4", help="Batches read per call (make_loader's batches_per_read).")
    args = ap.parse_args()

    import lance
    from loader import NaiveLanceReader  # bench/ is on sys.path when a script runs

    from lmdata.store import open_store

    print("| reader | x | batches/read | fragments | CPU ms/batch | wall ms/batch | vs naive (wall) |\n"
          "|---|---|---|---|---|---|---|")
    for tiles in (int(t) for t in args.tiles.split(",")):
        path = args.work / f"prose-x{tiles}"
        if not (path / "manifest.json").is_file():
            sys.exit(f"error: {path} is missing; run bench/loader.py first (it ingests the stores)")
        store = open_store(path)
        memmap, ours = store.reader("train", "memmap"), store.reader("train", "lance", verify="size")
        _, docs, _ = stream_and_docs(store)
        naive = NaiveLanceReader(args.work / f"naive-x{tiles}" / "naive-lance", docs, store.dtype)
        layouts = build_layouts(store, args.work / f"layouts-x{tiles}")
        plain = store.reader("train", "lance", verify="size", io="file")
        naive_uring = NaiveLanceReader(args.work / f"naive-x{tiles}" / "naive-lance", docs, store.dtype, uring=True)
        readers = {"lmdata:lance": lambda s, r=ours: r.windows(s, L), "lmdata:lance (file)": lambda s, r=plain: r.windows(s, L),
                   "naive-lance": lambda s, r=naive: r.windows(s, L),
                   "naive-lance (io_uring)": lambda s, r=naive_uring: r.windows(s, L)}
        for name, (where, rows) in layouts.items():
            readers[name] = row_reader(where, rows, raw=name.endswith("raw"))
        readers["per-shard (io_uring)"] = row_reader(layouts["per-shard"][0], layouts["per-shard"][1], uring=True)
        fragments = {"lmdata:lance": len(ours.shards), "lmdata:lance (file)": len(ours.shards)}
        for per_read in (int(k) for k in args.per_read.split(",")):  # make_loader's batches_per_read
            rng = np.random.default_rng(1)
            batches = [rng.integers(0, ours.n_tokens - L, B * per_read) for _ in range(max(10, args.batches // per_read))]
            for name, read in readers.items():  # every reader gives the store's windows
                assert np.array_equal(read(batches[0]), memmap.windows(batches[0], L)), name
            best = time_rounds(readers, batches, args.rounds)
            for name, (cpu, wall) in best.items():
                where = layouts[name.split(" (")[0]][0] if name.split(" (")[0] in layouts else naive.path
                frags = fragments.get(name) or len(lance.dataset(str(where)).get_fragments())
                cpu, wall = cpu / per_read, wall / per_read  # per batch of B windows
                print(f"| {name} | x{tiles} | {per_read} | {frags} | {cpu:.2f} | {wall:.2f} | "
                      f"{best['naive-lance'][1] / per_read / wall:.2f}x |")


if __name__ == "__main__":
    main()
