"""The same work from stores of every size: a fresh process reads --tokens tokens, in whole epochs.

    .venv/bin/python bench/same_tokens.py                       # 1 G tokens from the 12 M, 106 M, 1 G stores
    .venv/bin/python bench/same_tokens.py --tokens 200M --readme bench/README.md

What a training run with a token budget sees. From the 12 M-token store a fresh process reads
its tokens 85 times over (epochs of a store that stays in the CPU's caches, every block checked
after the first); from the 1 G-token store once, a first epoch in which every window meets
blocks to check and pages to map for the first time. Unlike ``scale.py``'s 200-batch cells,
whose first pass over a large store is set against a small store read 5 times over, each cell
here does the same work; unlike its side-by-side table, first touches are in. Per format and
store: 0 workers, 0 workers with ``LMDATA_CHECK_AHEAD=0`` (the training thread checks and reads every
block itself) and 2 workers, each a fresh process timed from its first batch to its last
(shuffled B=32 x 1024, default verification, ``--repeat`` runs, the median kept); stores, decoded
copies and the warm page cache as in ``scale.py`` (tiles of english-prose.txt, cached under
``--work``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import add_store_args, compile_lmdata, ensure_tokenizer, replace_section
from scale import (B, L, tiles_for, cache_env, decode_copies, ensure_store, n_shards, n_tokens, parse_size,
                   read_from, warm_page_cache)

FORMATS = ("memmap", "parquet", "lance")
VARIANTS = ((0, "1"), (0, "0"), (2, "1"))  # (workers, LMDATA_CHECK_AHEAD)

_CELL = """
import json, sys, time
t0 = time.perf_counter()
args = json.loads(sys.argv[1])
from lmdata.store import open_store
from lmdata.data import make_loader
ds = open_store(args["store"]).dataset("train", args["L"], format=args["format"])
loader = make_loader(ds, args["B"], num_workers=args["workers"], seed=0)
left = args["tokens"] // (args["B"] * args["L"]) - 1
it = iter(loader)
next(it)
first = time.perf_counter() - t0
t1, epochs = time.perf_counter(), 0
while left > 0:
    for _ in it:
        left -= 1
        if not left:
            break
    else:
        epochs += 1
        it = iter(loader)
seconds = time.perf_counter() - t1
print(json.dumps({"first_batch_s": first, "seconds": seconds, "epochs": epochs,
                  "tokens_per_s": (args["tokens"] // (args["B"] * args["L"]) - 1) * args["B"] * args["L"] / seconds}))
"""


def run_cell(store: Path, fmt: str, workers: int, ahead: str, tokens: int) -> dict[str, Any]:
    """One fresh process reading ``tokens`` tokens of ``store`` after its first batch."""
    args = {"store": str(store), "format": fmt, "workers": workers, "tokens": tokens, "B": B, "L": L}
    env = {**cache_env(store.parent), "LMDATA_CHECK_AHEAD": ahead}
    done = subprocess.run([sys.executable, "-c", _CELL, json.dumps(args)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} w{workers} LMDATA_CHECK_AHEAD={ahead} on {store}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def variant_name(workers: int, ahead: str) -> str:
    return f"{workers}" + ("" if ahead == "1" else ", `LMDATA_CHECK_AHEAD=0`")


def table_lines(rows: list[dict], stores: list[Path]) -> list[str]:
    """One line per format and variant: each store's median M tok/s, and against the first store's."""
    lines = ["| format | workers | " + " | ".join(f"{n_tokens(st) / 1e6:,.0f} M tokens, {n_shards(st):,} shards"
                                               for st in stores) + " |",
             "|---|---|" + "---:|" * len(stores)]
    keys = list(dict.fromkeys((r["format"], r["workers"], r["ahead"]) for r in rows))
    for fmt, workers, ahead in keys:
        mid = [statistics.median(r["tokens_per_s"] for r in rows if (r["format"], r["workers"], r["ahead"], r["store"])
                                 == (fmt, workers, ahead, str(st))) for st in stores]
        cells = [f"{mid[0] / 1e6:.0f}"] + [f"{m / 1e6:.0f} ({m / mid[0]:.2f}x)" for m in mid[1:]]
        lines.append(f"| {fmt} | {variant_name(workers, ahead)} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in s.split(",")], default="10M,100M,1G")
    ap.add_argument("--tokens", type=parse_size, default="1G", help="tokens each cell reads (default: 1G)")
    ap.add_argument("--formats", type=lambda s: s.split(","), default=",".join(FORMATS))
    ap.add_argument("--repeat", type=int, default=5, help="runs of each cell, interleaved; the median kept")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Same tokens' section")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    compile_lmdata()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load, argv = os.getloadavg()[0], " ".join(sys.argv[1:])
    stores = [ensure_store(args.work, args.corpus, tokenizer, tiles, 1 << 20)[0]
              for tiles in tiles_for(args.sizes, args.corpus)]
    rows = []
    for fmt in args.formats:
        for st in stores:
            decode_copies(st, args.work, fmt, keep=True)
        warm_page_cache(*read_from(args.work, fmt, *stores))
        for _ in range(args.repeat):
            for workers, ahead in VARIANTS:
                for st in stores:  # the stores one after another: the same moment of the box
                    rows.append({"format": fmt, "workers": workers, "ahead": ahead, "store": str(st),
                                 "tokens": n_tokens(st), **run_cell(st, fmt, workers, ahead, args.tokens)})
                    print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "same-tokens.json").write_text(json.dumps(rows, indent=1))
    body = (f"## Same tokens\n\n`python bench/same_tokens.py {argv}` ({os.cpu_count()} cores, load average "
            f"{load:.1f} at start, {time.strftime('%Y-%m-%d')}; stores tiled from {args.corpus.name}; "
            f"{args.tokens / 1e6:,.0f} M tokens read per cell, M tok/s from the first batch to the last, median of "
            f"{args.repeat} fresh processes, then against the smallest store):\n\n"
            + "\n".join(table_lines(rows, stores)) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Same tokens")


if __name__ == "__main__":
    main()
