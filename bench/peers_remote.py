"""bench/peers.py's table on s3://: each tool reading its own copy from object storage.

    .venv-peers/bin/python bench/peers_remote.py --readme bench/README.md
    .venv-peers/bin/python bench/peers_remote.py --tiles 2 --delays 0,20 --batches 100

``--server s3rver`` runs the same cells on s3rver (npm, installed once under ``--work``), which
reads a ranged GET's range from its file; moto reads the whole object for each, so a first
batch of Lance's takes from a ~400 MB fragment pays that ~32 times.

A moto S3 server on loopback (``bench/remote.py``'s ``start_moto``) holds the lmdata store
(``--corpus`` tiled ``--tiles`` times, all three formats: the local store's files uploaded as
they are), LitData's optimized copy and Mosaic's MDS copy (``bench/peers.py``'s conversions of
the same ids). For each ``--delays`` value a delay proxy (``lmdata.bench.delay_proxy``) adds
that many ms to every request. Every cell is a fresh process with an empty cache (a new
training node's first epoch): lmdata reads ``s3://`` its own way (``LMDATA_CACHE_DIR``
empty: memmap fetches the shards it touches whole, Parquet decodes them; ``--shard-tokens
100000 --tiles 20`` makes a 1,160-shard store for the shard-count comparison); LitData streams with
``StreamingDataset(input_dir="s3://...", cache_dir=..., storage_options={"endpoint_url": ...})``
(its downloader: whole 50 MB chunks, ``max_pre_download=2``); Mosaic with
``StreamingDataset(remote="s3://...", local=...)`` (whole 64 MiB shards, ``S3_ENDPOINT_URL``).
Same cells as the local table: first batch from the process's start, steady tokens/s after
``--warmup`` batches, PSS. moto is a Python server on the same 2 shared cores, so absolute
rates are low next to S3; the ratios at one latency are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from common import add_results_arg, CACHED_TOKENIZER, CORPUS, compile_lmdata, ensure_tokenizer, replace_section
from peers import LABELS, LMDATA, PEERS, ensure_peer, heading, run_cell
from remote import start_moto, start_proxy, start_s3rver
from scale import cache_env, ensure_store


NOTES = (
    "Each tool reads its own copy: lmdata the store's files as uploaded (memmap: each shard touched fetched whole into the "
    "empty LMDATA_CACHE_DIR, its default when the split fits LMDATA_MEMMAP_CACHE_BYTES; Parquet: each shard touched is fetched and decoded whole into the empty "
    "LMDATA_CACHE_DIR; Lance: each ingest shard touched decoded by one remote take into the empty LMDATA_CACHE_DIR); LitData `StreamingDataset(input_dir='s3://...', "
    "cache_dir=..., storage_options={'endpoint_url': ...})` downloads whole 50 MB chunks (obstore, told "
    "`allow_http` for the loopback endpoint: the one change to its defaults); Mosaic `StreamingDataset(remote="
    "'s3://...', local=...)` downloads whole 64 MiB shards (boto3, `S3_ENDPOINT_URL`). \"vs best peer\": over the "
    "faster of LitData and Mosaic at the same latency and worker count. Not measured here: resume from s3://."
)


def upload(client: object, root: Path, bucket: str, prefix: str) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".lock":
            client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(root)}")


def last_error(text: str) -> str:
    """The exception line of a child's traceback (its last line naming an Error), shortened."""
    lines = [ln.strip() for ln in text.splitlines() if "Error" in ln or "Exception" in ln] or [text.strip()]
    return lines[-1][:300].replace("|", "/")


KEY = "S3RVER"  # access key id and secret: s3rver's only one (moto takes any)


def s3_env(endpoint: str, cache: Path) -> dict[str, str]:
    """What a user exports for a custom S3 endpoint (AWS_* for lmdata and LitData's boto3,
    S3_ENDPOINT_URL for Mosaic), plus this cell's empty caches."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": KEY, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED", "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_ALLOW_HTTP": "true",
            "LMDATA_CACHE_DIR": str(cache / "lmdata"), "PEERS_CACHE": str(cache)}


def table(rows: list[dict], delays: list[float]) -> str:
    best = {}
    for r in rows:
        if r["tool"] in PEERS and "error" not in r:
            key = (r["delay_ms"], r["workers"])
            best[key] = max(best.get(key, 0.0), r["tokens_per_s"])
    cells = {(r["tool"], r["workers"], r["delay_ms"]): r for r in rows}
    head = "| loader | workers | " + " | ".join(f"+{d:g} ms: M tok/s | vs best peer | first batch" for d in delays)
    lines = [head + " |", "|---|---:|" + "---:|---:|---:|" * len(delays)]
    for tool, workers in dict.fromkeys((r["tool"], r["workers"]) for r in rows):
        parts = []
        for d in delays:
            r = cells.get((tool, workers, d))
            if r is None or "error" in r:
                parts.append("failed | | " if r else " | | ")
                continue
            peer = best.get((d, workers))  # none: no peer in --tools, as peers.table prints it
            ratio = f"{r['tokens_per_s'] / peer:.2f}x" if peer else "—"
            parts.append(f"{r['tokens_per_s'] / 1e6:.2f} | {ratio} | {r['first_batch_s']:.1f} s")
        lines.append(f"| {LABELS[tool]} | {workers} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    ap.add_argument("--work", type=Path, default=Path("/tmp/lmdata-peers-remote"))
    ap.add_argument("--tiles", type=int, default=4, help="copies of --corpus in the store (moto holds it in memory)")
    ap.add_argument("--shard-tokens", type=int, default=1 << 20, help="tokens per shard of the lmdata store")
    ap.add_argument("--tools", type=lambda s: s.split(","), default=",".join(LMDATA + PEERS))
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default="0,2")
    ap.add_argument("--delays", type=lambda s: [float(x) for x in s.split(",")], default="0,20")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--cell-timeout", type=float, default=150, help="seconds a cell may take (moto is slow)")
    ap.add_argument("--server", choices=("moto", "s3rver"), default="moto",
                    help="the S3 server: moto (pip), or s3rver (npm; a ranged GET reads only its range)")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Peers (remote)' section "
                                                "('## Peers (remote): s3rver' with --server s3rver)")
    add_results_arg(ap)
    args = ap.parse_args()
    compile_lmdata()  # the cells' first batches run from bytecode, as the peers' do
    args.work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    store, _ = ensure_store(args.work, args.corpus, ensure_tokenizer(args.tokenizer), args.tiles, args.shard_tokens)
    peers = [t for t in PEERS if t in args.tools]
    local = {t: store for t in LMDATA} | {t: ensure_peer(t, store, args.work, cache_env(args.work))[0] for t in peers}
    server_url, server = start_moto() if args.server == "moto" else start_s3rver(args.work)
    procs, rows = [server], []
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=server_url, aws_access_key_id=KEY, aws_secret_access_key=KEY,
                              region_name="us-east-1")
        upload(client, store, "bench", "store")
        for t in peers:
            upload(client, local[t], "bench", t)
        remote = {t: "s3://bench/store" for t in LMDATA} | {t: f"s3://bench/{t}" for t in peers}
        for delay in args.delays:
            url, proxy = start_proxy(server_url.split("://")[1], delay)
            procs.append(proxy)
            for tool in args.tools:
                for workers in args.workers:
                    cache = Path(tempfile.mkdtemp(prefix="cell-", dir=args.work))
                    row = {"tool": tool, "workers": workers, "delay_ms": delay}
                    try:
                        row |= run_cell(tool, remote[tool], workers, s3_env(url, cache), 1, mode="speed",
                                        warmup=args.warmup, batches=args.batches, timeout=args.cell_timeout)
                    except RuntimeError as exc:  # a peer that cannot read this endpoint: recorded, not fatal
                        row["error"] = last_error(str(exc))
                    shutil.rmtree(cache, ignore_errors=True)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            proxy.kill()
    finally:
        for proc in procs:
            proc.kill()
        if hasattr(server, "objects"):  # s3rver's files
            shutil.rmtree(server.objects, ignore_errors=True)
    out = args.results
    out.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.shard_tokens == 1 << 20 else f"-x{args.tiles}-s{args.shard_tokens}") + (
        "-s3rver" if args.server == "s3rver" else "")
    section = "Peers (remote)" + (": s3rver" if args.server == "s3rver" else "")
    (out / f"peers-remote{suffix}.json").write_text(json.dumps(rows, indent=1))
    body = (heading(section, "peers_remote.py", load, store, args.corpus, args.tiles,
                    f"; {args.server} on loopback behind the delay proxy, {args.warmup} warm-up + {args.batches} "
                    "timed batches; every cell a fresh process with empty caches") + "\n\n"
            + table(rows, args.delays) + "\n\n" + "\n".join(f"- {LABELS[r['tool']]} w{r['workers']} "
                                                           f"+{r['delay_ms']:g} ms failed: `{r['error']}`"
                                                           for r in rows if "error" in r) + "\n" + NOTES + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, section)


if __name__ == "__main__":
    main()
