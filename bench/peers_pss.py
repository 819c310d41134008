"""How each loader's memory grows as a run reads: PSS over one whole epoch (issue 25 item 4).

    .venv-peers/bin/python bench/peers_pss.py --readme bench/README.md
    .venv-peers/bin/python bench/peers_pss.py --tools memmap,litdata --workers 0 --at 250,1000

``bench/peers.py`` gives PSS at one point, after its timed batches. A loader that maps its files
(lmdata by default, LitData's ``TokensLoader``) grows with what it has read, one that reads them
(Mosaic, lmdata with ``LMDATA_MAP_SHARDS=0``) does not, so one point says little. Here one fresh
process per loader and worker count reads a whole shuffled epoch of the same store as
``peers.py`` (same tools, settings and store; ``--work`` and ``--store`` alike) and records, after
``--at`` batches and at the epoch's end: the seconds since its first batch, PSS of the loader's
processes (main and every worker), and how much of it is anonymous memory (the heap: what
the machine cannot reclaim) and file pages (mapped shard files and libraries, clean: the kernel
may drop them under pressure and fault them back). ``--map-off`` adds lmdata's rows with
``LMDATA_MAP_SHARDS=0``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import peers
from common import replace_section, tree_pss_mb
from scale import cache_env, decode_copies, n_shards, n_tokens, read_from, warm_page_cache

SECTION = "Peers (local): memory over an epoch"


def curve(spec: dict) -> dict:
    """One fresh process: read an epoch, PSS after each of ``spec['at']`` batches and at its end."""
    loader = peers.Loader(spec["tool"], spec["path"], spec["workers"])
    points, wanted = [], sorted(spec["at"])
    next(loader)
    t0 = time.perf_counter()

    def record() -> None:
        points.append({"batches": loader.read, "seconds": time.perf_counter() - t0, "pss_mb": tree_pss_mb(),
                       "anon_mb": tree_pss_mb(field="Pss_Anon"), "file_mb": tree_pss_mb(field="Pss_File")})

    while True:
        try:
            next(loader)
        except StopIteration:
            break
        if wanted and loader.read == wanted[0]:
            wanted.pop(0)
            record()
    record()  # the epoch's end
    return {"points": points}


def table(rows: list[dict], at: list[int]) -> str:
    head = " | ".join(f"after {n:,}" for n in at)
    lines = [f"| loader | workers | batches in the epoch | {head} | at the epoch's end: anon / file | epoch, s |",
             "|---|---:|---:|" + "---:|" * len(at) + "---:|---:|"]
    for r in rows:
        by = {p["batches"]: p for p in r["points"]}
        cells = " | ".join(f"{by[n]['pss_mb']:,.0f}" if n in by else "—" for n in at)
        end = r["points"][-1]
        lines.append(f"| {r['label']} | {r['workers']} | {end['batches']:,} | {cells} | {end['pss_mb']:,.0f}: "
                     f"{end['anon_mb']:,.0f} / {end['file_mb']:,.0f} | {end['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = peers.store_arguments(__doc__)
    ap.add_argument("--at", type=lambda s: [int(x) for x in s.split(",")], default="250,1000,3000",
                    help="batches after which PSS is read (and at the epoch's end)")
    ap.add_argument("--map-off", action="store_true", help="lmdata's rows again with LMDATA_MAP_SHARDS=0")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a cell may take")
    ap.add_argument("--readme", type=Path, help=f"rewrite this file's '## {SECTION}' section")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    store, _, tiles = peers.the_store(ap, args)
    env = cache_env(args.work)
    print(f"store {store}: {n_tokens(store) / 1e6:.1f} M tokens, {n_shards(store)} shards", flush=True)
    for tool in args.tools:
        if tool in peers.LMDATA:
            decode_copies(store, args.work, tool)
    rows = []
    for tool in args.tools:
        path = store if tool in peers.LMDATA else peers.ensure_peer(tool, store, args.work, env)[0]
        warm_page_cache(*(read_from(args.work, tool, store) if tool in peers.LMDATA else [path]))
        modes = [("", env)]
        if args.map_off and tool in peers.LMDATA:
            modes.append((", `LMDATA_MAP_SHARDS=0`", {**env, "LMDATA_MAP_SHARDS": "0"}))
        for suffix, cell_env in modes:
            for workers in args.workers:
                spec = {"tool": tool, "path": str(path), "workers": workers, "at": args.at}
                r = peers._child(["--curve", json.dumps(spec)], cell_env, f"{tool} w{workers}", args.timeout,
                                  script=__file__)
                rows.append({"tool": tool, "label": peers.LABELS[tool] + suffix, "workers": workers, **r})
                print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_pss.json").write_text(json.dumps(rows, indent=1))
    body = (peers.heading(SECTION, "peers_pss.py", load, store, args.corpus if tiles else None, tiles,
                          "; PSS in MB of the loader's processes, one fresh process a row") + "\n\n"
            + table(rows, args.at) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, SECTION)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--curve":
        print(json.dumps(curve(json.loads(sys.argv[2]))))
    else:
        main()
