"""What a Lance fragment costs a read: our reader over one corpus ingested with several fragment sizes.

    .venv/bin/python bench/lance_fragments.py                          # x10 corpus, 1/4/16/64 Mi
    .venv/bin/python bench/lance_fragments.py --tiles 50 --fragments 16,64,256

The corpus (``--corpus``, tiled ``--tiles`` times) is ingested once per fragment size
(``lance_fragments.FRAGMENT_TOKENS``, in Mi tokens) into ``<work>/fragments-x<N>-f<M>/``,
Lance only, with the ingest's wall time and peak RSS. Then the same random batches (seed 1,
four batches of 32 x 1,025 tokens per read, as ``make_loader`` reads) go through each store's
reader; ms per batch of 32, best of 3 interleaved rounds. A take pays for every fragment its
windows touch, so the cost grows with the fragment count.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import (  # bench/ is on sys.path when a script runs
    CACHED_TOKENIZER,
    CORPUS,
    ensure_tokenizer,
    run_child,
    tiled_corpus,
)

B, L, PER_READ = 32, 1025, 4

INGEST = """
import resource, sys, time
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.store.formats import lance_fragments

def main():
    lance_fragments.FRAGMENT_TOKENS = int(sys.argv[3]) << 20
    t = time.perf_counter()
    ingest({"train": SourceSpec((sys.argv[1],))}, sys.argv[2], sys.argv[4], formats=["lance"], overwrite=True,
           progress=False, log=None)
    print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

if __name__ == "__main__":
    main()
"""


def ensure(text: Path, tokenizer: Path, mi: int, out: Path) -> tuple[float | None, float | None]:
    """Ingest ``text`` with fragments of ``mi`` Mi tokens (in a fresh process); (seconds, peak RSS MB) or cached."""
    if (out / "manifest.json").is_file():
        return None, None
    script = out.parent / "_ingest_fragments.py"
    script.write_text(INGEST)
    res = run_child([sys.executable, str(script), str(text), str(tokenizer), str(mi), str(out)])
    seconds, rss = res.stdout.split()
    return float(seconds), float(rss)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "lmdata-bench-loader")
    ap.add_argument("--tiles", type=int, default=10)
    ap.add_argument("--fragments", default="1,4,16,64", help="Fragment sizes, Mi tokens.")
    ap.add_argument("--batches", type=int, default=80, help="Reads per round (of four batches each).")
    args = ap.parse_args()

    from lmdata.store import open_store

    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    text = tiled_corpus(args.work, args.corpus, args.tiles)
    readers, ingests = {}, {}
    for mi in (int(m) for m in args.fragments.split(",")):
        out = args.work / f"fragments-x{args.tiles}-f{mi}"
        ingests[mi] = ensure(text, tokenizer, mi, out)
        readers[mi] = open_store(out).reader("train", "lance", verify="size")
    n = min(r.n_tokens for r in readers.values()) - L
    rng = np.random.default_rng(1)
    reads = [rng.integers(0, n, B * PER_READ) for _ in range(args.batches)]
    for r in readers.values():
        r.windows(reads[0], L)  # opened, row indexes loaded
    best = dict.fromkeys(readers, np.inf)
    for _ in range(3):
        for mi, r in readers.items():
            t = time.perf_counter()
            for starts in reads:
                r.windows(starts, L)
            best[mi] = min(best[mi], (time.perf_counter() - t) * 1e3 / len(reads) / PER_READ)
    print(f"{text.name}: {n + L:,} tokens; peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB\n")
    print("| fragment size | fragments | ms per batch of 32 | ingest s | ingest peak RSS MB |\n|---|---|---|---|---|")
    for mi, r in readers.items():
        s, rss = ingests[mi]
        print(f"| {mi} Mi tokens | {len(r.shards)} | {best[mi]:.2f} | {'' if s is None else f'{s:.1f}'} | "
              f"{'' if rss is None else f'{rss:.0f}'} |")


if __name__ == "__main__":
    main()
