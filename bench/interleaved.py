"""Several loaders read side by side in one process, in rounds whose order rotates.

A fresh process per cell is how a user meets a store, but this VM moves a 0.1-1 s cell by 10-20%
from one run to the next: two cells that differ by less than that cannot be told apart. Here each
variant (a store and a verification mode) gets its dataset in one process, every block of it is
checked and every shard mapped first, then ``rounds`` rounds each read ``batches`` batches
through every variant, the first variant of a round rotating. Levels: ``reader`` (the reader's
``windows``, shuffled starts drawn the same way over each store's own length), ``loader``
(``make_loader`` with ``workers``; collation and int64 ``x, y`` included). Forked workers start
with none of the parent's checked blocks, opened shards or mapped pages, so with workers each
loader first reads ``warm_epochs`` epochs (a worker reads about half of each). ``first_batches``:
also, per round, each variant's first batches through a reader made fresh, the process's
descriptors closed first (so its first batch opens the split's shards at once, as a fresh
process's does).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

_CELL = """
import json, sys, time
import numpy as np
from lmdata.data import make_loader
from lmdata.io.descriptors import descriptors
from lmdata.store import open_store
spec = json.loads(sys.argv[1])
B, L, fmt, batches, rounds = 32, 1024, spec["fmt"], spec["batches"], spec["rounds"]
variants = spec["variants"]
datasets = [open_store(v["store"]).dataset("train", L, format=fmt, verify=v["verify"]) for v in variants]
for ds in datasets:  # every block checked, every shard mapped
    n = (ds.reader.n_tokens - 1) // L
    for k in range(0, n, 4096):
        ds.reader.windows(np.arange(k, min(n, k + 4096)) * L, L + 1)
u = np.random.default_rng(0).random((batches, B))  # the same draw over each store's own length
orders = [(u * (ds.reader.n_tokens - L - 1)).astype(np.int64) for ds in datasets]

def endless(loader):  # epoch after epoch (a 6-shard store of 5.9 M tokens is ~180 batches)
    while True:
        yield from loader

loaders = [endless(make_loader(ds, B, num_workers=spec["workers"], seed=1)) for ds in datasets] \\
    if "loader" in spec["levels"] else []

def run(level, k):
    t = time.perf_counter()
    if level == "reader":
        read = datasets[k].reader.windows
        for starts in orders[k]:
            read(starts, L + 1)
    else:
        it = loaders[k]
        for _ in range(batches):
            next(it)
    return batches * B * L / (time.perf_counter() - t)

def first(k, seed):  # a reader made now: no block checked, no shard opened or mapped yet
    descriptors().close_all()
    v = variants[k]
    it = iter(make_loader(open_store(v["store"]).dataset("train", L, format=fmt, verify=v["verify"]), B,
                          num_workers=0, seed=seed))
    t = time.perf_counter()
    for _ in range(spec["first_batches"]):
        next(it)
    return spec["first_batches"] * B * L / (time.perf_counter() - t)

def rotated(r):
    return [(r + j) % len(variants) for j in range(len(variants))]

out = {"seen": [[v["store"], ds.reader.verify, int(ds.reader.n_tokens)] for v, ds in zip(variants, datasets)],
       "order": [rotated(r) for r in range(rounds)]}
if spec.get("first_batches"):
    out["first"] = [[] for _ in variants]
    for r in range(2 * rounds + 1):  # the same windows (seed) for every variant in a round
        for k in rotated(r):
            out["first"][k].append(first(k, 100 + r))
for level in spec["levels"]:
    for k in range(len(variants)):  # warm-up: the batches' pages mapped, the loader's buffers and workers made
        if level == "loader" and spec["workers"]:
            epoch = -(-len(datasets[k]) // B)
            for _ in range(spec["warm_epochs"] * epoch):
                next(loaders[k])
        run(level, k)
    rates = [[] for _ in variants]
    for r in range(rounds):
        for k in rotated(r):
            rates[k].append(run(level, k))
    out[level] = rates
print(json.dumps(out))
"""


def side_by_side(variants: list[dict[str, str]], fmt: str, *, workers: int = 0, batches: int = 2000,
                 rounds: int = 7, levels: tuple[str, ...] = ("reader", "loader"), first_batches: int = 0,
                 warm_epochs: int = 3, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Tokens/s per level, per variant (``{"store": path, "verify": mode}``), per round: one fresh process.
    Also ``seen`` (each dataset's store, verification mode and tokens) and ``order`` (each round's)."""
    spec = {"variants": variants, "fmt": fmt, "workers": workers, "batches": batches, "rounds": rounds,
            "levels": list(levels), "first_batches": first_batches, "warm_epochs": warm_epochs}
    done = subprocess.run([sys.executable, "-c", _CELL, json.dumps(spec)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} {[v['store'] for v in variants]}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(rates: list[list[float]], k: int, base: int = 0) -> tuple[float, float]:
    """Variant ``k``'s tokens/s over variant ``base``'s: of each one's best round, and the median of the
    rounds' pairs (a pair: the same round, so the same moment of the box)."""
    return max(rates[k]) / max(rates[base]), statistics.median(a / b for a, b in zip(rates[k], rates[base]))


def vs_first_line(first_cells: list[str], rates: list[list[float]]) -> str:
    """A table row: ``first_cells``, then each variant's best round in M tok/s, every variant after the
    first with its ratio to the first (of the best rounds; the median pair)."""
    cells = [*first_cells, f"{max(rates[0]) / 1e6:.0f}"]
    for k in range(1, len(rates)):
        best, median = ratios(rates, k)
        cells.append(f"{max(rates[k]) / 1e6:.0f} ({best:.2f}x; {median:.2f}x)")
    return "| " + " | ".join(cells) + " |"
