"""The loader at the sizes users have: how each cost grows with the store.

    .venv/bin/python bench/scale.py                                   # 10 M, 100 M, 1 G tokens
    .venv/bin/python bench/scale.py --sizes 10M,100M --readme bench/README.md
    .venv/bin/python bench/scale.py --shards                          # 6 vs 114 vs 1,160 vs 11,761 shards
    .venv/bin/python bench/scale.py --side-by-side                    # the --sizes stores in one process

Stores are ``--corpus`` (../shared/corpus/english-prose.txt, ~5.7 M tokens at vocab 8,192)
tiled N times and ingested into memmap, Parquet and Lance in one pass, cached under
``--work``: tiling repeats the text, so the token stream repeats too (a window's content is
real prose; what grows is the store: bytes, shards, blocks to check). Per store: ingest
wall time, MB/s of text and peak RSS (a fresh process); then per format and worker count,
each in a fresh process: open (``open_store`` + ``dataset``), first batch (from the
process's start, imports included: what a training script waits), steady tokens/s
(shuffled B=32 x 1024 windows, ``--warmup`` batches excluded, then ``--batches`` timed: on a
large store these are a first pass, nearly every window a block and many a shard the process
meets for the first time), the PSS of the loader's processes at the end, and with 0 workers
"after one pass": the same process reads every window of the store once, then times
the best of 5 rounds of 1,000 batches, a small store's epochs in turn (what every later epoch of a run reads at); a format's files are read once before its cells
(a warm page cache). Parquet is first decoded whole into the
bench's own empty ``LMDATA_CACHE_DIR`` (``--work``/cache) by a fresh process, timed ("one-time
decode": what the first epoch on a machine pays once), so its cells read the decoded copies
as every later run does. ``--shards`` compares, on the same corpus,
a 6-shard store (x1, 5.9 M tokens) and a 6-shard store of the same 118 M tokens (x20,
``--shard-tokens 20000000``) with 114- and 1,160-shard stores (x20, default and
``--shard-tokens 100000``), and the default verification with ``verify="size"``: steady on
the small store, and the first 50 batches of the large one; its store columns are the median of
``--repeat`` fresh processes run in turn across the stores, each reading on for 2,000 more batches
(timed apart: what the same process reads once most shards have been met). ``--side-by-side`` reads the
``--sizes`` stores in one process per format and worker count, rounds of ``--round-batches``
batches through each, every shard touched first (``interleaved.py``); with ``--linked-copies K``
also a memmap store K times the largest, its shards hard links to that one's (``linked_store.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import add_store_args, compile_lmdata, ensure_tokenizer, replace_section, run_child, tiled_corpus
from interleaved import side_by_side, vs_first_line
from linked_store import linked_store
from lmdata.store.formats.lance_chunks import CACHE_SUBDIR as LANCE_COPIES

FORMATS = ("memmap", "parquet", "lance")
WORKERS = (0, 2)
B, L = 32, 1024
BYTES_PER_TOKEN = 4.01  # english-prose.txt at vocab 8,192 (5.7 M tokens a copy): what sizes a corpus by its length


def tokens_per_tile(corpus: Path) -> float:
    """About how many tokens one copy of ``corpus`` makes (english text at vocab 8,192: ~4 bytes a token)."""
    return Path(corpus).stat().st_size / BYTES_PER_TOKEN


def tiles_for(sizes: list[int], corpus: Path) -> list[int]:
    """The corpus copies of each store of ``sizes`` tokens; sizes that would be the same store are refused (a
    300K and a 1M store of a 1 MB corpus had been one store, measured twice and compared with itself)."""
    per = tokens_per_tile(corpus)
    tiles = [max(1, round(size / per)) for size in sizes]
    for k in range(1, len(tiles)):
        if tiles[k] in tiles[:k]:
            raise SystemExit(f"--sizes {sizes[tiles.index(tiles[k])]:,} and {sizes[k]:,} tokens are the same store "
                             f"({tiles[k]} copies of {corpus}, ~{per:,.0f} tokens each); give sizes at least a copy apart")
    return tiles


def parse_size(text: str) -> int:
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


# ---------------------------------------------------------------------------- ingest

_INGEST = """
import json, resource, sys, time
t0 = time.perf_counter()
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
args = json.loads(sys.argv[1])
ingest({"train": SourceSpec((args["text"],))}, args["tokenizer"], args["out"], shard_tokens=args["shard_tokens"],
       overwrite=True, progress=False, log=None)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def ensure_store(work: Path, corpus: Path, tokenizer: Path, tiles: int, shard_tokens: int) -> tuple[Path, dict]:
    """The store of ``tiles`` copies of ``corpus`` (ingested once; its ingest figures kept beside it)."""
    out = work / f"x{tiles}-s{shard_tokens}"
    facts = out.with_suffix(".ingest.json")
    if (out / "manifest.json").is_file() and facts.is_file() and _current(out):
        return out, json.loads(facts.read_text())
    shutil.rmtree(out, ignore_errors=True)  # none, unfinished, or written by an earlier lmdata
    text = tiled_corpus(work, corpus, tiles)
    args = {"text": str(text), "tokenizer": str(tokenizer), "out": str(out), "shard_tokens": shard_tokens}
    done = run_child([sys.executable, "-c", _INGEST, json.dumps(args)])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["text_mb"] = text.stat().st_size / 1e6
    result["mb_per_s"] = result["text_mb"] / result["seconds"]
    facts.write_text(json.dumps(result))
    return out, result


def _current(store: Path) -> bool:
    """The cached store is in this lmdata's layout (an earlier one's Lance rows held ``token_bytes``)."""
    from lmdata.store.formats.lance_fragments import current_layout
    from lmdata.store.manifest import read_manifest

    return all(current_layout(s) for s in read_manifest(store).splits["train"].formats["lance"])


# ---------------------------------------------------------------------------- one loader cell

AFTER_ROUNDS, AFTER_BATCHES = 5, 1000  # "after one pass": best of 5 rounds of 1,000 batches (200 had been ~10 ms)

_CELL = f"AFTER_ROUNDS, AFTER_BATCHES = {AFTER_ROUNDS}, {AFTER_BATCHES}" + """
import json, os, sys, time
t0 = time.perf_counter()
args = json.loads(sys.argv[1])
from lmdata.store import open_store
from lmdata.data import make_loader
store = open_store(args["store"])
ds = store.dataset("train", args["L"], format=args["format"], verify=args["verify"])
t_open = time.perf_counter() - t0
touch_us = None
if args.get("touch_first"):  # each shard's one-time first touch in this process, timed, before the loader
    import numpy as np
    shards = store.manifest.splits["train"].formats[args["format"]]
    if args["format"] == "lance":  # its reader's shards are the ingest shards within each fragment
        from lmdata.store.formats.lance_chunks import chunks_of
        shards = chunks_of(shards)[0]
    firsts = np.array([s.first_token for s in shards])
    t2 = time.perf_counter()
    for k in range(0, len(firsts), args["B"]):
        ds.reader.windows(firsts[k:k + args["B"]], 1)
    touch_us = (time.perf_counter() - t2) / len(firsts) * 1e6
loader = make_loader(ds, args["B"], num_workers=args["workers"], seed=args["seed"])
batches = min(args["batches"], len(loader) - args["warmup"] - 1)  # one epoch: a small store has few batches
later = min(args.get("later", 0), len(loader) - args["warmup"] - 1 - batches)
it = iter(loader)
next(it)
t_first = time.perf_counter() - t0
for _ in range(args["warmup"]):
    next(it)
t1 = time.perf_counter()
for _ in range(batches):
    next(it)
dt = time.perf_counter() - t1
later_rate = None
if later > 0:  # the same process reading on: most shards met, their pages mapped, their blocks checked
    t1 = time.perf_counter()
    for _ in range(later):
        next(it)
    later_rate = later * args["B"] * args["L"] / (time.perf_counter() - t1)
sys.path.insert(0, args["bench"])
from common import tree_pss_mb  # after the timing: what the loader costs, not the bench
pss = tree_pss_mb()
after = None
if args["after_pass"] and args["workers"] == 0:  # the same process once it has read every window: steady state
    import numpy as np
    for k in range(0, len(ds), 4096):
        ds.read(np.arange(k, min(len(ds), k + 4096)) * args["L"])
    import itertools
    def epochs(seed):  # epoch after epoch, each in another order, as a run reads a small store
        for e in itertools.count():
            yield from make_loader(ds, args["B"], num_workers=0, seed=seed + e)
    rates = []
    for r in range(AFTER_ROUNDS):  # the same number of batches whatever the store's size; the best round
        it = epochs(args["seed"] + 1 + 1000 * r)
        for _ in range(args["warmup"]):
            next(it)
        t2 = time.perf_counter()
        for _ in range(AFTER_BATCHES):
            next(it)
        rates.append(AFTER_BATCHES * args["B"] * args["L"] / (time.perf_counter() - t2))
    after = max(rates)
print(json.dumps({"open_s": t_open, "first_batch_s": t_first, "tokens_per_s": batches * args["B"] * args["L"] / dt,
                  "pss_mb": pss, "after_pass": after, "touch_us": touch_us, "later": later_rate}))
"""


_DECODE = """
import json, sys, time
import numpy as np
from lmdata.store import open_store
from lmdata.store.windows import shard_bounds
t0 = time.perf_counter()
reader = open_store(sys.argv[1]).reader("train", sys.argv[2])
if sys.argv[2] == "lance":  # its copies are of the ingest shards within each fragment
    from lmdata.store.formats.lance_chunks import chunks_of
    bounds = shard_bounds(chunks_of(reader.shards)[0])
else:
    bounds = reader._shard_bounds
reader.windows(bounds[:-1][np.diff(bounds) > 0], 1)  # one token of every shard: each decoded once
print(json.dumps({"decode_s": time.perf_counter() - t0}))
"""

COPIES = {"parquet": "parquet", "lance": LANCE_COPIES}  # format -> its decoded copies under the cache


def cache_env(work: Path) -> dict[str, str]:
    """The cells' environment: the bench's own LMDATA_CACHE_DIR (Parquet's decoded copies), not the user's."""
    return {**os.environ, "LMDATA_CACHE_DIR": str(work / "cache")}


def decode_copies(store: Path, work: Path, fmt: str, keep: bool = False) -> float | None:
    """Seconds for a fresh process to decode every shard of ``store``'s ``fmt`` into an empty cache (the
    one-time cost per machine a first epoch pays; later reads use the copies); None for memmap.
    ``keep``: add to the copies already there (other stores')."""
    import shutil

    if fmt not in COPIES:
        return None
    if not keep:
        shutil.rmtree(work / "cache" / COPIES[fmt], ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _DECODE, str(store), fmt], capture_output=True, text=True,
                          env=cache_env(work))
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} decode of {store}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["decode_s"]


def read_from(work: Path, fmt: str, *stores: Path) -> list[Path]:
    """What ``fmt``'s windows are read from once decoded, to warm in the page cache: its decoded copies
    (Parquet, Lance: their store files are read only to decode), else the stores' format directories.
    This VM keeps ~2 GB of page cache: warming files no window reads pushed out ones that are read."""
    return [work / "cache" / COPIES[fmt]] if fmt in COPIES else [st / "train" / fmt for st in stores]


def warm_page_cache(*dirs: Path) -> None:
    """Read every file under ``dirs`` once, after dropping its cached pages: the cells measure a warm
    page cache (the issue's setting), in the same state for every store. The kernel keeps a file's
    pages in folios whose size follows how they came in: the same 6-shard store's files read by
    ``pread`` at 2.0 us a window as the ingest and earlier runs left them, and 1.4 us once dropped and
    read again in order (``posix_fadvise(DONTNEED)``, then a sequential read)."""
    seen = set()  # (device, inode): a hard-linked store's copies of a file are read once (linked_store.py)
    for d in dirs:
        for path in sorted(p for p in d.rglob("*") if p.is_file()):
            st = path.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with open(path, "rb") as fh:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                while fh.read(8 << 20):
                    pass


REPEAT = 1  # --repeat: each cell runs this many times (fresh processes), its best kept
LATER = 2000  # --shards: the batches each cell's process reads on after its timed ones, timed apart


def run_cell(store: Path, fmt: str, workers: int, *, verify: str = "first-use", warmup: int = 20,
             batches: int = 200, seed: int = 0, after_pass: bool = False, touch_first: bool = False) -> dict[str, Any]:
    """The cell's best of ``REPEAT`` fresh processes: on a shared box, load only ever slows a run,
    so the fastest run is the closest to the loader's own cost (each figure separately).
    ``after_pass`` (0 workers): also the rate once the process has read the whole store;
    ``touch_first`` (0 workers): first touch every shard (one window each, timed: ``touch_us`` a
    shard), then the cell as usual (its blocks are still checked as they come)."""
    if (have := n_tokens(store) // (L + 1) // B) < warmup + batches:  # (a bare StopIteration from the child)
        raise SystemExit(f"{store}: {n_tokens(store):,} tokens hold {have} batches of {B} x {L}, fewer than the "
                         f"{warmup} + {batches} asked; give larger --sizes (or --tiles), or fewer --batches/--warmup")
    runs = [_run_cell(store, fmt, workers, verify=verify, warmup=warmup, batches=batches, seed=seed,
                      after_pass=after_pass, touch_first=touch_first) for _ in range(REPEAT)]

    def best(key: str, pick: Any = max) -> float | None:
        got = [r[key] for r in runs if r.get(key)]
        return pick(got) if got else None

    return {"open_s": best("open_s", min), "first_batch_s": best("first_batch_s", min),
            "tokens_per_s": best("tokens_per_s"), "pss_mb": best("pss_mb", min), "after_pass": best("after_pass"),
            "touch_us": best("touch_us", min)}


def _run_cell(store: Path, fmt: str, workers: int, *, verify: str, warmup: int, batches: int,
              seed: int, after_pass: bool = False, touch_first: bool = False, later: int = 0) -> dict[str, Any]:
    args = {"store": str(store), "format": fmt, "workers": workers, "verify": verify, "warmup": warmup,
            "batches": batches, "B": B, "L": L, "seed": seed, "after_pass": after_pass, "touch_first": touch_first,
            "later": later, "bench": str(Path(__file__).resolve().parent)}
    done = subprocess.run([sys.executable, "-c", _CELL, json.dumps(args)], capture_output=True, text=True,
                          env=cache_env(store.parent))
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} w{workers} on {store}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def n_shards(store: Path, fmt: str = "memmap") -> int:
    manifest = json.loads((store / "manifest.json").read_text())
    return len(manifest["splits"]["train"]["formats"][fmt]["shards"])


def n_tokens(store: Path) -> int:
    return json.loads((store / "manifest.json").read_text())["splits"]["train"]["n_tokens"]


# ---------------------------------------------------------------------------- tables


def scale_table(args: argparse.Namespace, tokenizer: Path) -> tuple[str, list[dict]]:
    rows = []
    for tiles in tiles_for(args.sizes, args.corpus):
        store, ingest = ensure_store(args.work, args.corpus, tokenizer, tiles, 1 << 20)
        for fmt in args.formats:
            decode_s = decode_copies(store, args.work, fmt)
            warm_page_cache(*read_from(args.work, fmt, store))
            for workers in args.workers:
                cell = run_cell(store, fmt, workers, warmup=args.warmup, batches=args.batches, after_pass=True)
                rows.append({"tokens": n_tokens(store), "shards": n_shards(store), "format": fmt, "workers": workers,
                             **cell, "ingest_mb_per_s": ingest["mb_per_s"], "ingest_rss_mb": ingest["peak_rss_mb"],
                             "decode_s": decode_s})
                print(json.dumps(rows[-1]), flush=True)
    first_pass = f"batches {args.warmup + 1}-{args.warmup + args.batches} (a first pass), M tok/s"
    lines = ["| tokens | shards | ingest MB/s | ingest peak RSS | format | workers | open | first batch | "
             f"{first_pass} | vs smallest | steady: after one pass, M tok/s | vs smallest | PSS MB | "
             "one-time decode |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    first = [r for r in rows if r["tokens"] == rows[0]["tokens"]]
    base = {(r["format"], r["workers"]): r["tokens_per_s"] for r in first}
    base_after = {(r["format"], r["workers"]): r["after_pass"] for r in first}
    for r in rows:
        decode = "" if r["decode_s"] is None else f"{r['decode_s']:.1f} s"
        ref = base_after[(r["format"], r["workers"])]
        after = (f"{r['after_pass'] / 1e6:.1f} | {r['after_pass'] / ref:.2f}x" if r["after_pass"] and ref
                 else "— | —")
        lines.append(f"| {r['tokens'] / 1e6:,.0f} M | {r['shards']:,} | {r['ingest_mb_per_s']:.1f} | "
                     f"{r['ingest_rss_mb']:,.0f} MB | {r['format']} | {r['workers']} | {r['open_s']:.2f} s | "
                     f"{r['first_batch_s']:.2f} s | {r['tokens_per_s'] / 1e6:.1f} | "
                     f"{r['tokens_per_s'] / base[(r['format'], r['workers'])]:.2f}x | {after} | {r['pss_mb']:,.0f} | "
                     f"{decode} |")
    return "\n".join(lines), rows


def read_side_by_side(work: Path, stores: list[Path], fmt: str, modes: tuple[str, ...] = ("first-use",),
                      **kw: Any) -> dict[str, Any]:
    """``interleaved.side_by_side`` over ``stores`` in ``fmt``, each in each verification mode of ``modes``
    (store by store), after their decoded copies are made and what their windows read is warmed."""
    for st in stores:
        decode_copies(st, work, fmt, keep=True)
    warm_page_cache(*read_from(work, fmt, *stores))
    return side_by_side([{"store": str(st), "verify": m} for st in stores for m in modes], fmt,
                        env=cache_env(work), **kw)


def side_by_side_table(args: argparse.Namespace, tokenizer: Path) -> tuple[str, list[dict]]:
    """Each format's stores of ``--sizes`` in one process, every shard touched first (``interleaved.py``):
    what a run reads once its first pass is done."""
    stores = [ensure_store(args.work, args.corpus, tokenizer, tiles, 1 << 20)[0]
              for tiles in tiles_for(args.sizes, args.corpus)]
    if args.linked_copies > 1:  # memmap only (linked_store.py): the other formats' rows leave its column out
        stores.append(linked_store(stores[-1], args.linked_copies))
    lines, rows = side_by_side_lines(args.work, stores, args.formats, args.workers, batches=args.round_batches,
                                     rounds=args.rounds, linked=args.linked_copies > 1)
    head = ["| format | level | workers | " + " | ".join(f"{n_tokens(st) / 1e6:,.0f} M tokens, {n_shards(st):,} "
                                                       "shards" + (" (hard links)" if "-linked-" in st.name else "")
                                                       for st in stores) + " |",
            "|---|---|---:|" + "---:|" * len(stores)]
    return ("M tok/s of each store's best round, then (against the smallest store: best rounds; median pair):\n\n"
            + "\n".join(head + lines)), rows


def side_by_side_lines(work: Path, stores: list[Path], formats: list[str], workers: list[int], linked: bool = False,
                       **kw: Any) -> tuple[list[str], list[dict]]:
    """Per format and worker count, ``read_side_by_side`` of ``stores`` (the reader alone at 0 workers, and
    the loader): a table line against the first store (printed as it comes) and a row of rates each.
    ``linked``: the last store is ``linked_store``'s, read in memmap only."""
    lines, rows = [], []
    for fmt in formats:
        for count in workers:
            levels = ("reader", "loader") if count == 0 else ("loader",)
            these = stores[:-1] if linked and fmt != "memmap" else stores
            rates = read_side_by_side(work, these, fmt, workers=count, levels=levels, **kw)
            for level in levels:
                rows.append({"format": fmt, "level": level, "workers": count, "rates": rates[level]})
                lines.append(vs_first_line([fmt, level, str(count)], rates[level]))
                print(lines[-1], flush=True)
    return lines, rows


def shards_table(args: argparse.Namespace, tokenizer: Path) -> tuple[str, list[dict]]:
    small, _ = ensure_store(args.work, args.corpus, tokenizer, 1, 1 << 20)
    few, _ = ensure_store(args.work, args.corpus, tokenizer, 20, 20_000_000)  # the same tokens as big and many
    big, _ = ensure_store(args.work, args.corpus, tokenizer, 20, 1 << 20)
    many, _ = ensure_store(args.work, args.corpus, tokenizer, 20, 100_000)
    huge, _ = ensure_store(args.work, args.corpus, tokenizer, 20, 10_000)  # the shard count of a 10 B-token run
    stores = (("small", small), ("few", few), ("big", big), ("many", many), ("huge", huge))
    rows = []
    for fmt in args.formats:
        # this box keeps ~2 GB of page cache: the four stores of one format (and Parquet's decoded
        # copies), warmed before its cells, stay in it; all formats of all four do not
        for k, (_, st) in enumerate(stores):  # the steady state: every shard already decoded
            decode_copies(st, args.work, fmt, keep=k > 0)
        warm_page_cache(*read_from(args.work, fmt, *(st for _, st in stores)))
        # a run's first cell read 0.6x its later ones (memmap's small store, 304 against 505 M tok/s,
        # 2026-12-06), which made its "default / size" 1.93x: one cell first, not kept
        run_cell(small, fmt, args.workers[0], warmup=args.warmup, batches=args.batches)
        for workers in args.workers:
            row = {"format": fmt, "workers": workers}
            runs: dict[str, list[dict]] = {name: [] for name, _ in stores}
            for _ in range(REPEAT):  # interleaved: a slow spell of this shared box lands on every store alike
                for name, store in stores:
                    runs[name].append(_run_cell(store, fmt, workers, verify="first-use", warmup=args.warmup,
                                                batches=args.batches, seed=0, later=LATER))
            for name, got in runs.items():  # the median: these cells spread by more than the shard count
                row[name] = statistics.median(r["tokens_per_s"] for r in got)
                row[f"{name}_runs"] = [r["tokens_per_s"] for r in got]
                if all(r["later"] for r in got):
                    row[f"{name}_later"] = statistics.median(r["later"] for r in got)
            for name, store in stores:
                if workers == 0:
                    cell = run_cell(store, fmt, workers, warmup=args.warmup, batches=args.batches, touch_first=True)
                    row[f"{name}_touched"], row[f"{name}_touch_us"] = cell["tokens_per_s"], cell["touch_us"]
            row["size_small"] = run_cell(small, fmt, workers, verify="size", warmup=args.warmup,
                                         batches=args.batches)["tokens_per_s"]
            row["first50"] = run_cell(big, fmt, workers, warmup=0, batches=50, seed=1)["tokens_per_s"]
            row["first50_size"] = run_cell(big, fmt, workers, verify="size", warmup=0, batches=50, seed=1)["tokens_per_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    head = (f"| format | workers | {n_shards(small)} shards, {n_tokens(small) / 1e6:.1f} M | "
            f"{n_shards(few)} shards, {n_tokens(few) / 1e6:.0f} M | "
            f"{n_shards(big)} shards, {n_tokens(big) / 1e6:.0f} M | {n_shards(many):,} shards, {n_tokens(many) / 1e6:.0f} M | "
            f"{n_shards(huge):,} shards, {n_tokens(huge) / 1e6:.0f} M | "
            "default / size, steady (small) | default / size, first 50 batches (big) | "
            "after each shard's first touch: few / big / many / huge | a shard's first touch, us: few / big / many / huge | "
            f"reading on, the next {LATER:,} batches: few / big / many / huge |")
    lines = [f"Each store column: the median of {REPEAT} fresh processes, interleaved across the stores (a store's "
             f"runs in M tok/s in `bench/results/shards.json`); the last column, the same processes reading on.", "",
             head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def vs(r: dict, name: str) -> str:  # against the 6 shards of the same tokens, then the small store
        return f"{r[name] / 1e6:.1f} ({r[name] / r['few']:.2f}x; {r[name] / r['small']:.2f}x)"

    for r in rows:
        if r.get("few_touched"):
            touched = f"{r['few_touched'] / 1e6:.1f}" + "".join(
                f" / {r[f'{n}_touched'] / 1e6:.1f} ({r[f'{n}_touched'] / r['few_touched']:.2f}x)"
                for n in ("big", "many", "huge"))
            touch = " / ".join(f"{r[f'{n}_touch_us']:.0f}" for n in ("few", "big", "many", "huge"))
        else:
            touched = touch = "— (0 workers only)"
        on = " / ".join(f"{r[f'{n}_later'] / 1e6:.1f}" + (f" ({r[f'{n}_later'] / r['few_later']:.2f}x)" if n != "few" else "")
                        for n in ("few", "big", "many", "huge")) if r.get("few_later") else "—"
        lines.append(f"| {r['format']} | {r['workers']} | {r['small'] / 1e6:.1f} M tok/s | {r['few'] / 1e6:.1f} | "
                     f"{vs(r, 'big')} | {vs(r, 'many')} | {vs(r, 'huge')} | "
                     f"{r['size_small'] / r['small']:.2f}x | {r['first50_size'] / r['first50']:.2f}x | {touched} | {touch} | {on} |")
    return "\n".join(lines), rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for fmt in dict.fromkeys(r["format"] for r in rows):
        for workers in dict.fromkeys(r["workers"] for r in rows):
            cells = [r for r in rows if r["format"] == fmt and r["workers"] == workers]
            line, = ax.plot([r["tokens"] for r in cells], [r["tokens_per_s"] / 1e6 for r in cells], marker="o",
                            label=f"{fmt}, {workers} workers")
            after = [(r["tokens"], r["after_pass"] / 1e6) for r in cells if r.get("after_pass")]
            if after:
                ax.plot(*zip(*after), marker="x", linestyle="--", color=line.get_color(),
                        label=f"{fmt}, {workers} workers, after one pass")
    ax.set_xscale("log")
    ax.set_xlabel("store size (tokens)")
    ax.set_ylabel("M tokens/s (solid: a fresh process's first pass)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6.5, loc="lower left", ncol=2)
    ax.set_title("lmdata loader vs store size (shuffled 32 x 1024)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default="10M,100M,1G")
    ap.add_argument("--formats", type=lambda s: s.split(","), default=",".join(FORMATS))
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default="0,2")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each cell N times, keep its best (a shared box); --shards' store columns: "
                         "the median, the runs interleaved across the stores")
    table = ap.add_mutually_exclusive_group()
    table.add_argument("--shards", action="store_true",
                       help="the 6 / 114 / 1,160 / 11,761-shard table instead of the scale curve")
    table.add_argument("--side-by-side", action="store_true",
                       help="the --sizes stores read side by side in one process (interleaved.py): --formats, "
                            "--workers, --rounds, --round-batches (--warmup, --batches, --repeat do not apply)")
    ap.add_argument("--rounds", type=int, default=7, help="with --side-by-side")
    ap.add_argument("--round-batches", type=int, default=1000, help="with --side-by-side: batches a round, per store")
    ap.add_argument("--linked-copies", type=int, default=0,
                    help="with --side-by-side: also a memmap store of K x the largest one, its shards hard links "
                         "(linked_store.py: 10 -> 10 B tokens)")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Scale', '## Store size' or "
                                                "'## Scale: side by side' section")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    compile_lmdata()  # the cells' first batches run from bytecode, as the peers' do
    global REPEAT
    REPEAT = args.repeat
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load = os.getloadavg()[0]
    argv = " ".join(sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    if args.side_by_side:
        table, rows = side_by_side_table(args, tokenizer)
        title, name = "Scale: side by side", "scale-side-by-side"
    elif args.shards:
        table, rows = shards_table(args, tokenizer)
        title, name = "Store size", "shards"
    else:
        table, rows = scale_table(args, tokenizer)
        title, name = "Scale", "scale"
        args.out.mkdir(parents=True, exist_ok=True)
        plot(rows, args.out / "scale.png")
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    body = (f"## {title}\n\n`python bench/scale.py {argv}` ({os.cpu_count()} cores, load average {load:.1f} at "
            f"start, {time.strftime('%Y-%m-%d')}; stores tiled from {args.corpus.name}):\n\n{table}\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, title)


if __name__ == "__main__":
    main()
