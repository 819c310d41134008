"""What a bounded mapped PSS would cost: the pages of every shard's mapping let go every K batches.

    .venv/bin/python bench/pss_drop.py --store /tmp/lmdata-scale/x20-s1048576 --every 0,64,16,4,1

A mapped shard's pages count in the reader's PSS once touched (bench/README.md, "Peers (local)").
``madvise(MADV_DONTNEED)`` over each mapping makes the process's page tables forget them (the
pages stay in the page cache) and bounds the PSS; each window whose page was let go then faults it
back. One fresh process per K (0: never, the default), memmap, 0 workers, ``--batches`` timed after
20: tokens/s and the process's PSS at the end. Tried and not kept (the table in bench/README.md).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

MADV_DONTNEED = 4
B, L = 32, 1024


def one(store: str, every: int, batches: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import tree_pss_mb

    from lmdata.data.loader import make_loader
    from lmdata.store import open_store

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ds = open_store(store).dataset("train", L, "memmap")
    it = iter(make_loader(ds, B, num_workers=0))
    for _ in range(20):
        next(it)
    t0 = time.perf_counter()
    for b in range(batches):
        next(it)
        if every and (b + 1) % every == 0:
            maps = ds.reader._mappings
            for base, size in zip(maps.bases.tolist(), maps.sizes.tolist()):
                if base:
                    libc.madvise(base, size, MADV_DONTNEED)
    seconds = time.perf_counter() - t0
    return {"every": every, "tokens_per_s": batches * B * (L + 1) / seconds, "pss_mb": tree_pss_mb()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--every", default="0,64,16,4,1")
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.store, args.one, args.batches)))
        return
    print("| K | M tok/s | PSS MB |\n|---:|---:|---:|")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import run_child

    for k in (int(x) for x in args.every.split(",")):
        out = run_child([sys.executable, __file__, "--store", args.store, "--one", str(k), "--batches",
                         str(args.batches)]).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {'never' if not k else k} | {r['tokens_per_s'] / 1e6:,.0f} | {r['pss_mb']:,.0f} |")


if __name__ == "__main__":
    main()
