"""What default verification costs at steady state: ``verify="first-use"`` against ``"size"``, interleaved.

    .venv/bin/python bench/integrity.py                      # the 6-shard and 114-shard stores
    .venv/bin/python bench/integrity.py --readme bench/README.md

Per store (``--corpus`` tiled ``--tiles`` times, 1 Mi-token shards; the stores of ``bench/scale.py``,
cached under ``--work``) and format, one fresh process reads the split through both modes side by
side (``interleaved.py``: every block checked first, then ``--rounds`` rounds of ``--batches``
shuffled batches of 32 x 1,025 tokens through each mode, the mode that goes first alternating),
at two levels: the reader alone (``reader.windows``) and a 0-worker ``make_loader``. A 0.1 s loader
cell in a fresh process (``scale.py --shards``) moves by 10-20% between runs of this VM; rounds of
the two modes side by side in one process move together. And the first ``--first-batches`` (50)
batches of a reader made fresh in that process (no block checked, no shard opened or mapped yet),
``2 * rounds + 1`` pairs, each pair the same windows in both modes.

Columns: each mode's best round, then default's time over size's: of the best rounds, and the
median of the rounds' pairwise ratios. Issue 25's targets: <= 1.1x once the blocks a process reads
have been checked, <= 1.3x on the first 50 batches of a store 20x larger.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from common import add_results_arg, add_store_args, ensure_tokenizer, replace_section
from interleaved import ratios
from scale import FORMATS, ensure_store, n_shards, n_tokens, read_side_by_side

MODES = ("first-use", "size")  # variant 0 is the default


def cost(rates: list[list[float]]) -> tuple[float, float]:
    """Default's time over size's: of each mode's best round, and the median of the rounds' pairs."""
    return ratios(rates, 1, 0)


def table(rows: list[dict]) -> list[str]:
    lines = ["| store | format | level | size, M tok/s | default, M tok/s | default / size, best rounds | "
             "default / size, median pair |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        for level in [lv for lv in ("reader", "loader", "first") if lv in r]:
            rates = r[level]
            best, median = cost(rates)
            name = f"first {r['first_batches']} batches" if level == "first" else level
            lines.append(f"| {r['tokens'] / 1e6:.1f} M, {r['shards']:,} shards | {r['format']} | {name} | "
                         f"{max(rates[1]) / 1e6:.0f} | {max(rates[0]) / 1e6:.0f} | {best:.2f}x | "
                         f"{median:.2f}x |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_store_args(ap)
    ap.add_argument("--tiles", default="1,20", help="stores of these many copies of the corpus (1: 6 shards)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--batches", type=int, default=2000, help="batches a round, per mode")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--first-batches", type=int, default=50, help="batches of a reader made fresh (no block checked)")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Integrity' section")
    add_results_arg(ap)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = ensure_tokenizer(args.tokenizer)
    load = os.getloadavg()[0]
    rows = []
    for tiles in [int(t) for t in args.tiles.split(",")]:
        store, _ = ensure_store(args.work, args.corpus, tokenizer, tiles, 1 << 20)
        for fmt in args.formats.split(","):
            rates = read_side_by_side(args.work, [store], fmt, MODES, batches=args.batches, rounds=args.rounds,
                                      first_batches=args.first_batches)
            rows.append({"tokens": n_tokens(store), "shards": n_shards(store), "format": fmt,
                         "first_batches": args.first_batches, **rates})
            print(*table(rows[-1:])[2:], sep="\n", flush=True)
    body = (f"## Integrity\n\n`python bench/integrity.py {' '.join(sys.argv[1:])}` ({os.cpu_count()} cores, load "
            f"average {load:.1f} at start, {time.strftime('%Y-%m-%d')}; {args.corpus.name} tiled, 1 Mi-token shards; "
            f"{args.rounds} rounds of {args.batches} batches of 32 x 1,025 tokens per mode):\n\n"
            + "\n".join(table(rows)) + "\n")
    print(body)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "integrity.json").write_text(json.dumps(rows, indent=1))
    if args.readme:
        replace_section(args.readme, body, "Integrity")


if __name__ == "__main__":
    main()
