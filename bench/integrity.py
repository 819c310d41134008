"""What default verification costs at steady state: ``verify="first-use"`` against ``"size"``, interleaved.

    .venv/bin/python bench/integrity.py                      # the 6-shard and 114-shard stores
    .venv/bin/python bench/integrity.py --readme bench/README.md

Per store (``--corpus`` tiled ``--tiles`` times, 1 Mi-token shards; the stores of ``bench/scale.py``,
cached under ``--work``) and format, in a fresh process: two readers of the same split, one per
verification mode, each first made to check every block (one pass over the split) and read
``--batches`` batches; then ``--rounds`` rounds that each time ``--batches`` shuffled batches
(32 x 1,025 tokens) through each mode, the mode that goes first alternating. Two levels: the
reader alone (``reader.windows``), and a 0-worker ``make_loader`` (collation and int64 ``x, y``
included). A 0.1 s loader cell in a fresh process (``scale.py --shards``) moves by 10-20% between
runs of this VM; rounds of the two modes side by side in one process move together.

And the first ``--first-batches`` (50) batches of a reader made fresh in the same process, no block
checked, no shard opened or mapped yet (the process's pool of descriptors closed first, so its first
batch opens the split's shards and loads their CRCs in one call, as a fresh process's does),
``2 * rounds + 1`` pairs, each pair the same windows (seed) in both modes.

Columns: each mode's best round, then default's time over size's: of the best rounds, and the
median of the rounds' pairwise ratios. Issue 25's targets: <= 1.1x once the blocks a process reads
have been checked, <= 1.3x on the first 50 batches of a store 20x larger.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import CACHED_TOKENIZER, CORPUS, ensure_tokenizer, replace_section
from scale import FORMATS, cache_env, decode_copies, ensure_store, n_shards, n_tokens, read_from, warm_page_cache

MODES = ("first-use", "size")

_CELL = """
import json, sys, time
import numpy as np
from lmdata.data import make_loader
from lmdata.store import open_store
store, fmt, batches, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
B, L = 32, 1024
st = open_store(store)
datasets = {m: st.dataset("train", L, format=fmt, verify=m) for m in ("first-use", "size")}
for ds in datasets.values():  # every block checked, every shard mapped
    n = (ds.reader.n_tokens - 1) // L
    for k in range(0, n, 4096):
        ds.reader.windows(np.arange(k, min(n, k + 4096)) * L, L + 1)
n = datasets["size"].reader.n_tokens
order = np.random.default_rng(0).integers(0, n - L - 1, (batches, B))
def endless(loader):  # epoch after epoch (the 6-shard store is ~180 batches)
    while True:
        yield from loader
loaders = {m: endless(make_loader(ds, B, num_workers=0, seed=1)) for m, ds in datasets.items()}

def run(level, mode):
    t = time.perf_counter()
    if level == "reader":
        read = datasets[mode].reader.windows
        for starts in order:
            read(starts, L + 1)
    else:
        it = loaders[mode]
        for _ in range(batches):
            next(it)
    return batches * B * L / (time.perf_counter() - t)

from lmdata.io.descriptors import descriptors
def first(mode, seed, first_batches):  # a reader made now: no block checked, no shard opened or mapped yet
    descriptors().close_all()  # the process's pool: a new reader then opens its shards as a fresh process does
    ds = open_store(store).dataset("train", L, format=fmt, verify=mode)
    it = iter(make_loader(ds, B, num_workers=0, seed=seed))
    t = time.perf_counter()
    for _ in range(first_batches):
        next(it)
    return first_batches * B * L / (time.perf_counter() - t)

out = {"first": {m: [] for m in ("first-use", "size")}}
for r in range(2 * rounds + 1):  # the same windows (seed) for both modes, the mode that goes first alternating
    for m in (("first-use", "size") if r % 2 == 0 else ("size", "first-use")):
        out["first"][m].append(first(m, 100 + r, int(sys.argv[5])))
for level in ("reader", "loader"):
    for m in ("first-use", "size"):  # warm-up: the batches' pages mapped, the loader's buffers made
        run(level, m)
    rates = {m: [] for m in ("first-use", "size")}
    for r in range(rounds):
        for m in (("first-use", "size") if r % 2 == 0 else ("size", "first-use")):
            rates[m].append(run(level, m))
    out[level] = rates
print(json.dumps(out))
"""


def cost(rates: dict[str, list[float]]) -> tuple[float, float]:
    """Default's time over size's: of each mode's best round, and the median of the rounds' pairs."""
    best = max(rates["size"]) / max(rates["first-use"])
    pairs = sorted(s / d for s, d in zip(rates["size"], rates["first-use"]))
    return best, pairs[len(pairs) // 2]


def table(rows: list[dict]) -> list[str]:
    lines = ["| store | format | level | size, M tok/s | default, M tok/s | default / size, best rounds | "
             "default / size, median pair |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        for level in ("reader", "loader", "first"):
            rates = r[level]
            best, median = cost(rates)
            name = f"first {r['first_batches']} batches" if level == "first" else level
            lines.append(f"| {r['tokens'] / 1e6:.1f} M, {r['shards']:,} shards | {r['format']} | {name} | "
                         f"{max(rates['size']) / 1e6:.0f} | {max(rates['first-use']) / 1e6:.0f} | {best:.2f}x | "
                         f"{median:.2f}x |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    ap.add_argument("--work", type=Path, default=Path("/tmp/lmdata-scale"))
    ap.add_argument("--tiles", default="1,20", help="stores of these many copies of the corpus (1: 6 shards)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--batches", type=int, default=2000, help="batches a round, per mode")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--first-batches", type=int, default=50, help="batches of a reader made fresh (no block checked)")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Integrity' section")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load = os.getloadavg()[0]
    env = cache_env(args.work)
    rows = []
    for tiles in [int(t) for t in args.tiles.split(",")]:
        store, _ = ensure_store(args.work, args.corpus, tokenizer, tiles, 1 << 20)
        for fmt in args.formats.split(","):
            decode_copies(store, args.work, fmt, keep=True)
            warm_page_cache(*read_from(args.work, fmt, store))
            done = subprocess.run([sys.executable, "-c", _CELL, str(store), fmt, str(args.batches), str(args.rounds),
                                   str(args.first_batches)], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"{store} {fmt}: {done.stderr[-2000:]}")
            rows.append({"tokens": n_tokens(store), "shards": n_shards(store), "format": fmt,
                         "first_batches": args.first_batches,
                         **json.loads(done.stdout.strip().splitlines()[-1])})
            print(*table(rows[-1:])[2:], sep="\n", flush=True)
    body = (f"## Integrity\n\n`python bench/integrity.py {' '.join(sys.argv[1:])}` ({os.cpu_count()} cores, load "
            f"average {load:.1f} at start, {time.strftime('%Y-%m-%d')}; {args.corpus.name} tiled, 1 Mi-token shards; "
            f"{args.rounds} rounds of {args.batches} batches of 32 x 1,025 tokens per mode):\n\n"
            + "\n".join(table(rows)) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Integrity")


if __name__ == "__main__":
    main()
