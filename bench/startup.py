"""A fresh process's first batch at 10,000 and 100,000 shards, lmdata beside LitData (issue 25 item 3).

    bash scripts/setup-peers.sh
    .venv-peers/bin/python bench/startup.py --store /tmp/lmdata-scale/x20-s10000 --copies 9 --rounds 4

``--store``: an lmdata store of many small shards (``bench/scale.py``'s x20-s10000: english-prose
tiled 20 times, ``--shard-tokens 10000``, 11,761 shards, 118 M tokens). Its memmap shards are
converted once into LitData's format with one chunk per shard (``optimize(chunk_bytes="40kB",
item_loader=TokensLoader())`` of int32 ids: 11,761 chunks), and both are made ``--copies`` times
larger by hard links (``linked_store.py``; LitData's index lists each chunk ``--copies`` times),
so the 100,000-shard case needs no 10 GB of text. Each cell is ``peers.py --cell`` in a fresh
process: its first batch from the process's start (imports included), then 200 batches after 20;
the table gives the first batch and the end of batch 221 (what opening shards behind the first
batch, ``store/formats/open_behind.py``, moves, and what it costs the batches after it).
``--old PATH``: also run an lmdata source tree at PATH (e.g. a ``git worktree`` of an earlier
commit, its C extension built), alternating which goes first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIT_CHUNK = "40kB"


def _lit_fn(path: str):  # LitData's fn: one shard's ids as int32 (litgpt's dtype)
    import numpy as np
    import torch

    yield torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int32))


def litdata_copy(store: Path, out: Path) -> Path:
    """``out``: the store's memmap shards as LitData chunks, one a shard (made once)."""
    if not (out / "index.json").is_file():
        from litdata import TokensLoader, optimize

        files = sorted(str(p) for p in (store / "train" / "memmap").glob("tokens-*.bin"))
        optimize(fn=_lit_fn, inputs=files, output_dir=str(out), chunk_bytes=LIT_CHUNK, item_loader=TokensLoader(),
                 num_workers=1, verbose=False)
    return out


def litdata_linked(base: Path, k: int) -> Path:
    """``base``'s chunks ``k`` times over as hard links, its index listing each copy (made once)."""
    out = base.with_name(f"{base.name}-linked-x{k}")
    if (out / "index.json").is_file():
        return out
    index = json.loads((base / "index.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    chunks = []
    for copy in range(k):
        for entry in index["chunks"]:
            name = f"chunk-{copy}-{entry['filename'].split('-', 2)[2]}"
            if not (out / name).exists():
                os.link(base / entry["filename"], out / name)
            chunks.append({**entry, "filename": name})
    (out / "index.json").write_text(json.dumps({**index, "chunks": chunks}))
    return out


def cell(tool: str, path: Path, workers: int, src: str | None) -> dict:
    env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
    spec = {"tool": tool, "path": str(path), "workers": workers, "mode": "speed", "warmup": 20, "batches": 200}
    from common import run_child  # (bench/ is on sys.path: main put it there)

    done = run_child([sys.executable, str(HERE / "peers.py"), "--cell", json.dumps(spec)], env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--copies", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--formats", default="memmap,parquet,lance", help="read at the store's own size (memmap alone linked)")
    ap.add_argument("--old", help="an earlier lmdata source tree (its src/), run beside this one")
    ap.add_argument("--lit-dir", type=Path, default=Path("/tmp/lmdata-startup-litdata"))
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from linked_store import linked_store

    lit = litdata_copy(args.store, args.lit_dir)
    cases = [(fmt, args.store, lit) for fmt in args.formats.split(",")]
    if args.copies > 1:
        cases.append(("memmap", linked_store(args.store, args.copies), litdata_linked(lit, args.copies)))
    versions = [("this", None)] + ([("old", args.old)] if args.old else [])
    runs: dict[tuple, list[float]] = {}
    for r in range(args.rounds):
        for w in [int(x) for x in args.workers.split(",")]:
            for fmt, store, lit_store in cases:
                for name, src in (versions if r % 2 else versions[::-1]):
                    runs.setdefault((store.name, fmt, w, name), []).append(cell(fmt, store, w, src))
                runs.setdefault((store.name, "litdata", w, "LitData 0.2.76"), []).append(cell("litdata", lit_store, w, None))
    print("| store | reader | workers | first batch, best / median (s) | batch 221, best / median (s) |\n"
          "|---|---|---:|---:|---:|")
    for (store, fmt, w, name), got in runs.items():
        label = fmt if fmt == "litdata" else f"lmdata {fmt} ({name})"
        first, through = [r["first_batch_s"] for r in got], [r["through_s"] for r in got]
        print(f"| {store} | {label} | {w} | {min(first):.2f} / {statistics.median(first):.2f} | "
              f"{min(through):.2f} / {statistics.median(through):.2f} |")


if __name__ == "__main__":
    main()
