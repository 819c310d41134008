"""A mixture's loader against one store's: what drawing from several stores costs per batch.

    .venv/bin/python bench/mixture.py                                  # memmap, Parquet, Lance; 0 and 2 workers
    .venv/bin/python bench/mixture.py --compare-src /tmp/before/src    # the same cells, lmdata from another checkout

Store A: english-prose.txt tiled x18 (106 M tokens, 1 Mi-token shards); store B: x20 in 100,000-token
shards (118 M tokens, 1,160 shards); the mixture ``MixedDataset([(A, 0.7), (B, 0.3)])`` (224 M tokens,
1,261 shards). Each cell is a fresh process: ``make_loader(ds, 32)`` shuffled B=32 x 1024, default
verification, ``--warmup`` batches then ``--batches`` timed (the loader's epochs repeat as needed),
stores and decoded copies as in ``scale.py`` with a warm page cache. The cells alternate (A, mixture)
``--repeat`` times; the best of each is kept. ``--compare-src`` runs every cell again with lmdata
imported from that directory (a checkout of another commit, its C extensions built in place), so a
change is measured against its parent in one session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import add_store_args, compile_lmdata, ensure_tokenizer, replace_section
from scale import B, L, cache_env, decode_copies, ensure_store, n_shards, n_tokens, read_from, warm_page_cache

FORMATS = ("memmap", "parquet", "lance")
WEIGHTS = (0.7, 0.3)

_CELL = """
import json, sys
args = json.loads(sys.argv[1])
from lmdata.store import open_store
from lmdata.data import MixedDataset, make_loader
sets = [open_store(s).dataset("train", args["L"], format=args["format"]) for s in args["stores"]]
ds = sets[0] if len(sets) == 1 else MixedDataset(list(zip(sets, args["weights"])), seed=1)
loader = make_loader(ds, args["B"], num_workers=args["workers"], seed=0)
def batches():
    while True:
        yield from loader
sys.path.insert(0, args["bench"])
from common import steady_seconds
seconds = steady_seconds(batches(), args["warmup"], args["batches"])
print(json.dumps({"tokens_per_s": args["batches"] * args["B"] * args["L"] / seconds}))
"""


def run_cell(stores: list[Path], fmt: str, workers: int, warmup: int, batches: int, src: Path | None) -> float:
    """Tokens/s of one fresh process reading ``stores`` (one: that store; two: the mixture)."""
    args = {"stores": [str(s) for s in stores], "weights": WEIGHTS, "format": fmt, "workers": workers,
            "warmup": warmup, "batches": batches, "B": B, "L": L,
            "bench": str(Path(__file__).resolve().parent)}
    env = cache_env(stores[0].parent)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run([sys.executable, "-c", _CELL, json.dumps(args)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{fmt} w{workers} {[s.name for s in stores]} (lmdata from {src or 'here'}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]


def describe(src: Path) -> str:
    """The commit lmdata at ``src`` comes from (``-dirty`` with uncommitted changes), else the path."""
    done = subprocess.run(["git", "-C", str(src), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else str(src)


def table_lines(rows: list[dict[str, Any]], builds: list[str]) -> list[str]:
    lines = ["| format | workers | lmdata | store A, M tok/s | mixture A + B, M tok/s | mixture / A |",
             "|---|---:|---|---:|---:|---:|"]
    for fmt in dict.fromkeys(r["format"] for r in rows):
        for workers in dict.fromkeys(r["workers"] for r in rows):
            for build in builds:
                best = {kind: max((r["tokens_per_s"] for r in rows if (r["format"], r["workers"], r["build"], r["kind"])
                                   == (fmt, workers, build, kind)), default=0.0) for kind in ("A", "mixture")}
                if best["A"]:
                    lines.append(f"| {fmt} | {workers} | {build} | {best['A'] / 1e6:.0f} | {best['mixture'] / 1e6:.0f} "
                                 f"| {best['mixture'] / best['A']:.2f}x |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--formats", type=lambda s: s.split(","), default=",".join(FORMATS))
    ap.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default="0,2")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each cell, interleaved; the best kept")
    ap.add_argument("--compare-src", type=Path, help="also run each cell with lmdata imported from this directory")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Mixture' section")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    if args.compare_src is not None and not (args.compare_src / "lmdata" / "__init__.py").is_file():
        ap.error(f"--compare-src {args.compare_src}: no lmdata package there (give a checkout's src directory)")
    compile_lmdata()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load, argv = os.getloadavg()[0], " ".join(sys.argv[1:])
    a = ensure_store(args.work, args.corpus, tokenizer, 18, 1 << 20)[0]
    b = ensure_store(args.work, args.corpus, tokenizer, 20, 100_000)[0]
    here = Path(__file__).resolve().parent.parent / "src"
    builds = {describe(here): None, **({describe(args.compare_src): args.compare_src} if args.compare_src else {})}
    rows = []
    for fmt in args.formats:
        for st in (a, b):
            decode_copies(st, args.work, fmt, keep=True)
        warm_page_cache(*read_from(args.work, fmt, a, b))
        for _ in range(args.repeat):
            for workers in args.workers:
                for build, src in builds.items():
                    for kind, stores in (("A", [a]), ("mixture", [a, b])):
                        rate = run_cell(stores, fmt, workers, args.warmup, args.batches, src)
                        rows.append({"format": fmt, "workers": workers, "build": build, "kind": kind, "tokens_per_s": rate})
                        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mixture.json").write_text(json.dumps(rows, indent=1))
    shards = n_shards(a) + n_shards(b)
    body = (f"## Mixture\n\n`python bench/mixture.py {argv}` ({os.cpu_count()} cores, load average {load:.1f} at start, "
            f"{time.strftime('%Y-%m-%d')}; store A {n_tokens(a) / 1e6:,.0f} M tokens in {n_shards(a):,} shards, B "
            f"{n_tokens(b) / 1e6:,.0f} M in {n_shards(b):,}, both tiled from {args.corpus.name}; the mixture "
            f"A:{WEIGHTS[0]} + B:{WEIGHTS[1]} reads {shards:,} shards; shuffled B={B} x {L}, {args.batches:,} batches "
            f"after {args.warmup}, best of {args.repeat} fresh processes):\n\n" + "\n".join(table_lines(rows, list(builds))) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Mixture")


if __name__ == "__main__":
    main()
