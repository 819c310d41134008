"""What a store's shard count costs apart from its size: the same tokens as 6, ~114, ~1,160 and ~11,761 shards.

    .venv/bin/python bench/shard_count.py                 # english-prose.txt x20: ~118 M tokens
    .venv/bin/python bench/shard_count.py --readme bench/README.md
    .venv/bin/python bench/shard_count.py --side-by-side --readme bench/README.md

Per store (``--corpus`` tiled ``--tiles`` times, shards of 20 M, 1 Mi, 100,000 and 10,000 tokens; the
stores of ``bench/scale.py``, cached under ``--work``), in a fresh process each, once every
block has been checked (steady state, warm page cache): the memmap reader's own rate on
shuffled 32 x 1,025-token windows (``reader.windows``, no loader), and raw positional reads of
the same windows from the same files (``io._preads.preads`` over one descriptor per file: no
lmdata code), each the median batch of ``--batches``. The raw column is what the kernel charges a
reader by ``pread`` for the number of files; lmdata copies windows out of mappings
(``io/_mapped.c``), which pay none of it (``LMDATA_MAP_SHARDS=0``: lmdata by ``pread`` too).

``--side-by-side``: the same four stores read in one process per format and worker count, side by
side (``interleaved.py``: every block checked and every shard mapped first, then ``--rounds``
rounds of ``--round-batches`` shuffled batches through each store, the first store of a round
rotating), through the reader alone (0 workers) and ``make_loader`` (0 and 2 workers), default
verification: each store's best round against the 6-shard store's, and the median of the
rounds' pairs. Fresh-process cells of ~1,000 batches (``scale.py --shards``) move by 10-20%
between runs of this VM; stores side by side in one process move together.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from common import add_results_arg, add_store_args, run_child, ensure_tokenizer, replace_section
from scale import FORMATS, ensure_store, n_shards, n_tokens, side_by_side_lines, warm_page_cache

SHARD_TOKENS = (20_000_000, 1 << 20, 100_000, 10_000)  # 6 / 114 / 1,160 / 11,761 shards

_CELL = """
import glob, json, os, sys, time
import numpy as np
from lmdata.io.descriptors import preads
from lmdata.store import open_store
store, batches = sys.argv[1], int(sys.argv[2])
B, L = 32, 1024
reader = open_store(store).reader("train", "memmap")
n = (reader.n_tokens - 1) // L
for k in range(0, n, 4096):  # every window once: every block checked
    reader.windows(np.arange(k, min(n, k + 4096)) * L, L + 1)
order = np.random.default_rng(0).permutation(n)[: batches * B].reshape(batches, B)
def median_rate(read):
    times = []
    for b in range(batches):
        starts = np.sort(order[b]) * L
        t = time.perf_counter()
        read(starts)
        times.append(time.perf_counter() - t)
    return B * (L + 1) / float(np.median(times))
lmdata = median_rate(lambda s: reader.windows(s, L + 1))
from lmdata.io.descriptors import descriptors
descriptors().close_all()  # the reader's descriptors: the raw reads open their own, one a file
files = sorted(glob.glob(os.path.join(store, "train", "memmap", "tokens-*.bin")))
fds = np.array([os.open(f, os.O_RDONLY) for f in files], dtype=np.int32)
size = np.array([os.path.getsize(f) for f in files], dtype=np.int64)
bounds = np.concatenate([[0], np.cumsum(size)])
out = np.empty(B * (L + 1) * 2, dtype=np.uint8)
def raw(starts):
    at = starts * 2
    shard = np.searchsorted(bounds, at, side="right") - 1
    off = at - bounds[shard]
    length = np.minimum((L + 1) * 2, size[shard] - off)  # a window's part in its first file
    preads(fds[shard], off, length, out)
print(json.dumps({"lmdata": lmdata, "raw": median_rate(raw)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--tiles", type=int, default=20)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--side-by-side", action="store_true", help="the loader table: stores side by side, per format")
    ap.add_argument("--formats", default=",".join(FORMATS), help="with --side-by-side")
    ap.add_argument("--rounds", type=int, default=7, help="with --side-by-side")
    ap.add_argument("--round-batches", type=int, default=1000, help="with --side-by-side: batches a round, per store")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Shard count' section "
                                                "('## Shard count: side by side' with --side-by-side)")
    add_results_arg(ap)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load = os.getloadavg()[0]
    if args.side_by_side:
        return side_by_side_table(args, tokenizer, load)
    rows = []
    for shard_tokens in SHARD_TOKENS:
        store, _ = ensure_store(args.work, args.corpus, tokenizer, args.tiles, shard_tokens)
        warm_page_cache(store / "train" / "memmap")
        done = run_child([sys.executable, "-c", _CELL, str(store), str(args.batches)])
        rows.append({"shards": n_shards(store), "tokens": n_tokens(store),
                     **json.loads(done.stdout.strip().splitlines()[-1])})
        print(json.dumps(rows[-1]), flush=True)
    first = rows[0]
    lines = ["| shards | tokens | lmdata reader, M tok/s | vs 6 shards | raw preads, M tok/s | vs 6 shards | "
             "lmdata / raw |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shards']:,} | {r['tokens'] / 1e6:.0f} M | {r['lmdata'] / 1e6:.0f} | "
                     f"{r['lmdata'] / first['lmdata']:.2f}x | {r['raw'] / 1e6:.0f} | {r['raw'] / first['raw']:.2f}x | "
                     f"{r['lmdata'] / r['raw']:.2f}x |")
    body = (f"## Shard count\n\n`python bench/shard_count.py {' '.join(sys.argv[1:])}` ({os.cpu_count()} cores, "
            f"load average {load:.1f} at start, {time.strftime('%Y-%m-%d')}; {args.corpus.name} tiled "
            f"x{args.tiles}):\n\n" + "\n".join(lines) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Shard count")


def side_by_side_table(args: argparse.Namespace, tokenizer: Path, load: float) -> None:
    stores = [ensure_store(args.work, args.corpus, tokenizer, args.tiles, t)[0] for t in SHARD_TOKENS]
    table, rows = side_by_side_lines(args.work, stores, args.formats.split(","), [0, 2], batches=args.round_batches,
                                     rounds=args.rounds)
    lines = ["| format | level | workers | " + " | ".join(f"{n_shards(st):,} shards" for st in stores)
             + " |", "|---|---|---:|" + "---:|" * len(stores), *table]
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "shard-count-side-by-side.json").write_text(json.dumps(rows, indent=1))
    body = (f"## Shard count: side by side\n\n`python bench/shard_count.py {' '.join(sys.argv[1:])}` "
            f"({os.cpu_count()} cores, load average {load:.1f} at start, {time.strftime('%Y-%m-%d')}; "
            f"{args.corpus.name} tiled x{args.tiles}, {n_tokens(stores[0]) / 1e6:.0f} M tokens; {args.rounds} rounds "
            f"of {args.round_batches} shuffled batches of 32 x 1,025 tokens per store; M tok/s of the best round, "
            "then (against 6 shards: best rounds; median pair)):\n\n" + "\n".join(lines) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Shard count: side by side")


if __name__ == "__main__":
    main()
