"""Loader-only throughput: tokens/s per format x workers x page cache, against the ceilings.

    .venv/bin/python bench/loader.py                              # table on stdout
    .venv/bin/python bench/loader.py --readme bench/README.md     # and rewrite its "## Loader" section

Stores: ../shared/corpus/english-prose.txt ingested with ``lmdata.ingest`` (x1) and a
10x tiled copy of the text ingested the same way (x10), cached under ``--work``. Batches
are 32 x 1024 (inputs; each sample reads 1,025 ids), shuffled windows, a fresh loader per
cell (``start_method="forkserver"``); timing starts after its first batch (workers up).
Page cache: ``warm`` reads every file of the case first; ``cold`` drops them with
``posix_fadvise(DONTNEED)`` after the first batch (pages a worker already mapped stay).

Every row but two goes through the same ``TokenDataset`` + ``make_loader``; only the
reader differs, so the rows compare storage layouts and readers, not loop code:

- ``lmdata:memmap|lance|parquet``  the store's readers (parquet also with a 16 MB
                                   cache, several times smaller than the x10 data)
- ``naive-lance``    documents as rows (``lance.write_dataset`` defaults), one ``take`` of
                     the documents covering the batch, Lance's default local reader; the
                     ``(io_uring)`` row reads the same through ``file+uring://``, as ours does
                     (not a target: it shows how much of our lead is the layout)
- ``naive-parquet``  documents as rows (``pq.write_table`` defaults, one file per shard),
                     every row group a window touches read again for each window
- ``nanogpt``        nanoGPT's ``get_batch`` on one memmap of the whole split: the ceiling
                     (random offsets, main process only)
- ``lance.torch``    Lance's own ``LanceDataset`` over the store's Lance dataset: a
                     sequential scan packed into windows (its fast path; no shuffle)
- ``litdata``        LitData's ``StreamingDataset`` + ``TokensLoader`` (``shuffle=True``:
                     shuffled 16 MB chunks, int32 tokens) through its ``StreamingDataLoader``,
                     batches split into int64 inputs/targets; skipped when litdata is not
                     installed (``pip install litdata --no-deps lightning-utilities boto3``:
                     its torchvision requirement would pull a CUDA torch)
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from common import CACHED_TOKENIZER, CORPUS, ensure_tokenizer, replace_section  # bench/ is on sys.path when a script runs

B, L = 32, 1024
WORKERS = (0, 1, 2)
CACHES = ("warm", "cold")


# ---------------------------------------------------------------------------- stores




def ensure_store(work: Path, tiles: int, tokenizer: Path, corpus: Path = CORPUS) -> Path:
    """The store of ``tiles`` copies of ``corpus`` (ingested once, then reused)."""
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec

    if not corpus.is_file():
        raise SystemExit(f"--corpus {corpus}: no such file (the default is ../shared/corpus/english-prose.txt beside "
                         "the checkout); pass --corpus PATH")
    out = work / f"{corpus.stem}-x{tiles}"
    if (out / "manifest.json").is_file():
        return out
    text = corpus
    if tiles > 1:
        text = work / f"{corpus.stem}-x{tiles}.txt"
        with open(text, "wb") as fh:
            for _ in range(tiles):
                fh.write(corpus.read_bytes())
    ingest({"train": SourceSpec((str(text),))}, tokenizer, out, overwrite=True, progress=False, log=None)
    return out


def stream_parts(store: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tokens, document starts within them) of each memmap shard, in order."""
    reader = store.reader("train", "memmap")
    bounds = reader.segments.bounds
    for i in range(len(bounds) - 1):
        n = int(bounds[i + 1] - bounds[i])
        yield reader.windows(bounds[i:i + 1], n)[0].astype(store.dtype), reader.doc_starts(i)


def ensure_naive(store: Any, base: Path) -> dict[str, Path]:
    """Naive layouts of the same tokens: one .bin, doc-row Parquet files, a doc-row Lance dataset."""
    import lance
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {"bin": base / "train.bin", "parquet": base / "naive-parquet", "lance": base / "naive-lance"}
    if (base / "naive.done").is_file():
        return paths
    paths["parquet"].mkdir(parents=True, exist_ok=True)
    tables = []
    with open(paths["bin"], "wb") as fh:
        for i, (tokens, starts) in enumerate(stream_parts(store)):
            tokens.tofile(fh)
            docs = pa.ListArray.from_arrays(pa.array(starts.astype(np.int32)), pa.array(tokens))
            tables.append(pa.table({"tokens": docs}))
            pq.write_table(tables[-1], paths["parquet"] / f"part-{i:05d}.parquet")
    lance.write_dataset(pa.concat_tables(tables), paths["lance"], mode="overwrite")
    (base / "naive.done").write_text("ok\n")
    return paths


# ---------------------------------------------------------------------------- naive readers


class NaiveLanceReader:
    """Reader protocol over a documents-as-rows Lance dataset: one take of the covering docs.

    Like every reader here it returns the store's dtype (``dtype``), so the loader hands its
    batches over as compactly as ours: the comparison is of the reads alone.
    """

    def __init__(self, path: Path, doc_starts: np.ndarray, dtype: Any, uring: bool = False) -> None:
        from lmdata.store.formats.lance_uring import uring_uri

        self.path, self.doc_starts = str(path), doc_starts  # global doc starts, then n_tokens
        self.uri = uring_uri(path) if uring else self.path
        self.n_tokens, self.dtype = int(doc_starts[-1]), np.dtype(dtype)
        self._ds = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ds": None}

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        import lance

        if self._ds is None:
            self._ds = lance.dataset(self.uri)
        first = np.searchsorted(self.doc_starts, starts, side="right") - 1
        last = np.searchsorted(self.doc_starts, starts + length - 1, side="right") - 1
        rows = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        col = self._ds.take(rows.tolist(), columns=["tokens"]).column(0).combine_chunks()
        flat, offsets = col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy()
        at = offsets[np.searchsorted(rows, first)] + (starts - self.doc_starts[first])
        return flat[at[:, None] + np.arange(length)]


class NaiveParquetReader:
    """Reader protocol over documents-as-rows Parquet: each window reads every row group it touches."""

    def __init__(self, paths: list[Path], doc_starts: np.ndarray, dtype: Any) -> None:
        import pyarrow.parquet as pq

        self.paths, self.n_tokens, self.dtype = [str(p) for p in paths], int(doc_starts[-1]), np.dtype(dtype)
        groups, doc = [], 0  # (global token start, file, row group), from the footers
        for f, p in enumerate(self.paths):
            meta = pq.ParquetFile(p).metadata
            for g in range(meta.num_row_groups):
                groups.append((int(doc_starts[doc]), f, g))
                doc += meta.row_group(g).num_rows
        self.group_starts = np.array([s for s, _, _ in groups] + [self.n_tokens])
        self.groups = [(f, g) for _, f, g in groups]
        self._files: dict = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_files": {}}

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        import pyarrow.parquet as pq

        out = np.empty((len(starts), length), dtype=self.dtype)
        for w, s in enumerate(starts.tolist()):
            lo = int(np.searchsorted(self.group_starts, s, side="right") - 1)
            hi = int(np.searchsorted(self.group_starts, s + length - 1, side="right") - 1)
            parts = []
            for k in range(lo, hi + 1):
                f, g = self.groups[k]
                pf = self._files.get(f) or self._files.setdefault(f, pq.ParquetFile(self.paths[f]))
                parts.append(pf.read_row_group(g, columns=["tokens"]).column(0).combine_chunks().values.to_numpy())
            flat = np.concatenate(parts)
            off = s - int(self.group_starts[lo])
            out[w] = flat[off:off + length]
        return out


# ---------------------------------------------------------------------------- batch sources


def forever(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def loader_batches(reader: Any, workers: int) -> Iterator[Any]:
    from lmdata.data import TokenDataset, make_loader

    loader = make_loader(TokenDataset(reader, L), B, num_workers=workers, seed=0, start_method="forkserver")
    return forever(loader)


def nanogpt_batches(bin_path: Path) -> Iterator[Any]:
    """nanoGPT's train.py get_batch (CPU branch), verbatim in spirit: a fresh memmap per batch."""
    import torch

    while True:
        data = np.memmap(bin_path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - L, (B,))
        x = torch.stack([torch.from_numpy((data[i:i + L]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + L]).astype(np.int64)) for i in ix])
        yield x, y


def _lance_tokens(batch: Any, **_: Any) -> np.ndarray:
    return batch.column("tokens").values.to_numpy(zero_copy_only=False)


def lance_torch_batches(path: Path) -> Iterator[Any]:
    """lance.torch.data.LanceDataset scanning rows, packed into B x (L + 1) windows."""
    import torch
    from lance.torch.data import LanceDataset

    buf = np.zeros(0, dtype=np.int64)
    while True:
        ds = LanceDataset(str(path), batch_size=64, columns=["tokens"], to_tensor_fn=_lance_tokens)
        for flat in ds:
            buf = np.concatenate([buf, flat.astype(np.int64)])
            while len(buf) >= B * (L + 1):
                w = torch.from_numpy(buf[:B * (L + 1)].reshape(B, L + 1))
                buf = buf[B * (L + 1):]
                yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _litdata_shard(args: tuple[str, int]) -> Iterator[Any]:
    """One memmap shard of the store as one int32 tensor (LitData's TokensLoader concatenates items)."""
    import torch

    from lmdata.store import open_store

    reader = open_store(args[0]).reader("train", "memmap")
    b = reader.segments.bounds
    yield torch.from_numpy(reader.windows(b[args[1]:args[1] + 1], int(b[args[1] + 1] - b[args[1]]))[0].astype(np.int32))


def ensure_litdata(store_path: Path, base: Path) -> Path | None:
    """The same tokens as a LitData optimized dataset (None when litdata is not installed)."""
    try:
        from litdata import TokensLoader, optimize
    except ImportError:
        return None
    out = base / "litdata"
    if not (base / "litdata.done").is_file():
        from lmdata.store import open_store

        n = len(open_store(store_path).reader("train", "memmap").shards)
        optimize(fn=_litdata_shard, inputs=[(str(store_path), i) for i in range(n)], output_dir=str(out),
                 chunk_bytes="16MB", item_loader=TokensLoader(), num_workers=1)
        (base / "litdata.done").write_text("ok\n")
    return out


def litdata_batches(path: Path, workers: int) -> Iterator[Any]:
    """LitData StreamingDataset + TokensLoader (shuffled chunks), split into int64 inputs/targets."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(input_dir=str(path), item_loader=TokensLoader(block_size=L + 1), shuffle=True, seed=0)
    loader = StreamingDataLoader(ds, batch_size=B, num_workers=workers)
    for w in forever(loader):
        yield w[:, :-1].long(), w[:, 1:].long()


# ---------------------------------------------------------------------------- measuring


def files_under(path: Path) -> list[Path]:
    return [p for p in Path(path).rglob("*") if p.is_file()] if Path(path).is_dir() else [Path(path)]


def set_cache(files: list[Path], cache: str) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            if cache == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 1 << 24):
                    pass
        finally:
            os.close(fd)


def measure(make: Callable[[], Iterator[Any]], files: list[Path], cache: str, seconds: float) -> tuple[float, float]:
    """(M tokens/s, main-process CPU ms per batch) of ``make()``'s batches after its first, for ~``seconds``.

    The main process's CPU time is what a training step pays for the loader when workers
    read in parallel with the step (the rest of the wall time can overlap compute).
    """
    it = make()
    next(it)  # workers started, files opened
    set_cache(files, cache)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while n < 3 or time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    del it
    return n * B * L / dt / 1e6, cpu / n * 1e3


def cases(store_path: Path, work: Path) -> list[tuple[str, tuple[int, ...], Callable[[int], Iterator], list[Path]]]:
    """(name, worker counts, batch-source factory, files the case reads) for one store."""
    from lmdata.store import open_store

    store = open_store(store_path)
    naive = ensure_naive(store, work)
    r = store.reader("train", "memmap")
    doc_starts = np.concatenate([np.asarray(r.doc_starts(i)[:-1]) + r.segments.bounds[i] for i in range(len(r.shards))]
                                + [[r.n_tokens]])
    fmt_dir = lambda f: store_path / "train" / f  # noqa: E731
    naive_pq = sorted(naive["parquet"].glob("*.parquet"))
    lit = ensure_litdata(store_path, work)
    rows = [
        ("nanogpt get_batch (ceiling)", (0,), lambda w: nanogpt_batches(naive["bin"]), [naive["bin"]]),
        ("lmdata:memmap", WORKERS, lambda w: loader_batches(store.reader("train", "memmap", verify="size"), w), files_under(fmt_dir("memmap"))),
        ("lmdata:lance", WORKERS, lambda w: loader_batches(store.reader("train", "lance", verify="size"), w), files_under(fmt_dir("lance"))),
        ("naive-lance", WORKERS, lambda w: loader_batches(NaiveLanceReader(naive["lance"], doc_starts, store.dtype), w),
         files_under(naive["lance"])),
        ("naive-lance (io_uring)", WORKERS,
         lambda w: loader_batches(NaiveLanceReader(naive["lance"], doc_starts, store.dtype, uring=True), w),
         files_under(naive["lance"])),
        ("lance.torch LanceDataset (scan)", (0,), lambda w: lance_torch_batches(fmt_dir("lance")), files_under(fmt_dir("lance"))),
        ("lmdata:parquet", WORKERS, lambda w: loader_batches(store.reader("train", "parquet", verify="size"), w), files_under(fmt_dir("parquet"))),
        ("lmdata:parquet (16 MB cache)", WORKERS,
         lambda w: loader_batches(store.reader("train", "parquet", verify="size", cache_bytes=16 << 20), w), files_under(fmt_dir("parquet"))),
        ("naive-parquet", WORKERS, lambda w: loader_batches(NaiveParquetReader(naive_pq, doc_starts, store.dtype), w), naive_pq),
    ]
    if lit is not None:
        rows.append(("litdata StreamingDataset+TokensLoader", WORKERS, lambda w: litdata_batches(lit, w), files_under(lit)))
    return rows


def run(args: argparse.Namespace) -> tuple[dict, dict]:
    """{(case, workers): {(store, cache): M tokens/s}}, and each store's token count."""
    tokenizer = ensure_tokenizer(args.tokenizer)
    results: dict = {}
    sizes = {}
    for tiles in args.tiles:
        name = f"x{tiles}"
        path = ensure_store(args.work, tiles, tokenizer, args.corpus)
        work = args.work / f"naive-x{tiles}"
        work.mkdir(parents=True, exist_ok=True)
        from lmdata.store import open_store

        sizes[name] = open_store(path).n_tokens("train")
        for case, workers, make, files in cases(path, work):
            if args.only and not re.search(args.only, case):
                continue
            for w in workers:
                for cache in CACHES:  # best of --repeat: the box is shared, contention only slows
                    value = max(measure(lambda: make(w), files, cache, args.seconds) for _ in range(args.repeat))
                    results.setdefault((case, w), {})[(name, cache)] = value
                    print(f"{name} {case} workers={w} {cache}: {value[0]:.2f} M tokens/s, "
                          f"main CPU {value[1]:.2f} ms/batch", file=sys.stderr, flush=True)
    return results, sizes


# ---------------------------------------------------------------------------- report


def table(results: dict, sizes: dict, args: argparse.Namespace) -> str:
    cols = [(s, c) for s in sizes for c in CACHES]
    head = ("| reader | workers | " + " | ".join(f"{s} {c}" for s, c in cols)
            + f" | main CPU ms/batch (warm {' / '.join(sizes)}) |")
    lines = [head, "|" + "---|" * (len(cols) + 3)]
    for (case, w), row in results.items():
        cells = " | ".join(f"{row[c][0]:.2f}" if c in row else "" for c in cols)
        cpu = " / ".join(f"{row[(s, 'warm')][1]:.2f}" for s in sizes if (s, "warm") in row)
        lines.append(f"| {case} | {w} | {cells} | {cpu} |")
    ratios = [("lmdata:memmap", "nanogpt get_batch (ceiling)", 0, 0.8),
              ("lmdata:lance", "naive-lance", None, 2.5),
              ("lmdata:lance", "naive-lance (io_uring)", None, None),
              ("lmdata:parquet", "naive-parquet", None, 10.0),
              ("lmdata:parquet (16 MB cache)", "naive-parquet", None, 10.0)]
    out = ["Ratios (warm cache; same worker count unless the ceiling, which runs in the main process):", "",
           "| ratio | target | workers | " + " | ".join(sizes) + " |", "|" + "---|" * (len(sizes) + 3)]
    for ours, base, base_w, target in ratios:
        for w in WORKERS:
            a, b = results.get((ours, w)), results.get((base, w if base_w is None else base_w))
            if a and b:
                cells = " | ".join(f"{a[(s, 'warm')][0] / b[(s, 'warm')][0]:.1f}x" for s in sizes)
                out.append(f"| {ours} / {base} | {f'>= {target}x' if target else '(none)'} | {w} | {cells} |")
    host = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    store_desc = ", ".join(f"{k}: {v / 1e6:.1f} M tokens" for k, v in sizes.items())
    cmd = "python bench/loader.py " + " ".join(sys.argv[1:])
    notes = [
        "", "Reading it: every row but `nanogpt`, `lance.torch` and `litdata` is our `TokenDataset` +"
        " `make_loader` over a different reader, shuffled windows; `nanogpt` draws random offsets, `lance.torch`"
        " scans in order (no shuffle) and `litdata` shuffles 16 MB chunks, so those three are"
        " reference points, not like-for-like. \"main CPU\" is the main process's CPU time per"
        " batch: with workers it is the cost of receiving a batch (a pickled array in the store's dtype,"
        " widened to int64 in the main process),"
        " which is what a training step pays when the reads overlap compute. On this 2-core box,"
        " shared with other jobs, workers compete with the main process for the same cores;"
        " see the script's docstring for the method.",
    ]
    return "\n".join([f"Command: `{cmd}` ({host}; {store_desc}; batch {B} x {L}; "
                      f"~{args.seconds:g} s per cell, best of {args.repeat}; load average at the end "
                      f"{os.getloadavg()[0]:.1f}). Loader-only M tokens/s (input tokens):", "",
                      *lines, "", *out, *notes])


def write_readme(readme: Path, body: str) -> None:
    """Replace (or append) the ``## Loader`` section; other sections belong to other benches."""
    replace_section(readme, f"## Loader\n\n{body}", "Loader")

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lmdata-bench-loader")
    p.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    p.add_argument("--corpus", type=Path, default=CORPUS, help="Text tiled into the stores (default: english-prose.txt).")
    p.add_argument("--tiles", type=int, nargs="+", default=[1, 10], help="Stores: corpus copies (1 and 10).")
    p.add_argument("--seconds", type=float, default=2.0, help="Timed seconds per cell.")
    p.add_argument("--repeat", type=int, default=2, help="Runs per cell; the best is reported.")
    p.add_argument("--only", help="Regex: run only the readers it matches.")
    p.add_argument("--readme", type=Path, help="Rewrite the '## Loader' section of this file.")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results, sizes = run(args)
    body = table(results, sizes, args)
    print(body)
    if args.readme:
        write_readme(args.readme, body)


if __name__ == "__main__":
    main()
