"""Which format on object storage: loader throughput from s3:// with 0/5/20 ms per request.

    .venv/bin/python bench/remote.py --corpus data/sample.txt --batches 24 --seq 512 \
        --json bench/results/remote-cpu/bench.json --png bench/results/remote-cpu/remote.png
    .venv/bin/python bench/remote.py --from-json bench/results/remote-cpu/bench.json --png X.png  # redraw only

Starts a moto S3 server on loopback, ingests ``--corpus`` into a local store and into
``s3://bench/store`` (every format), and for each added latency starts a delay proxy
(``lmdata.bench.delay_proxy``, its own process) in front of the server. Per format, latency
and worker count it times ``open_store`` + the first batch (start-up) and then ``--batches``
batches of ``--batch x --seq`` tokens, each followed by a simulated H100 step of
``batch * seq / --rate`` seconds (the measured H100 ``small`` rate, 3.5 M tok/s), so stall =
wait / (wait + step). The naive remote reader is one GET per window, one after another.
Also: memmap by ranges at the highest latency with the range cache on, epoch 1 vs epoch 2.
Each remote cell starts with an empty ``LMDATA_CACHE_DIR`` (a fresh machine): memmap, Parquet
and Lance then fetch or copy the shards they read (README, "Which format on object storage").

CPU-only numbers on this box (2 shared cores, loopback server): the server is moto (Python;
it reads a whole object for each ranged GET), so absolute rates are low next to S3; the
ratios between readers at one latency are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("memmap", "parquet", "lance")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{url}: server exited")
            time.sleep(0.1)
    raise SystemExit(f"{url}: server did not start")


def start_moto() -> tuple[str, subprocess.Popen]:
    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/", proc)
    urllib.request.urlopen(urllib.request.Request(url + "/bench", method="PUT")).read()
    return url, proc


S3RVER = "s3rver@3.7.1"


def start_s3rver(work: Path) -> tuple[str, subprocess.Popen]:
    """s3rver (npm), a filesystem-backed S3 server with bucket ``bench``: it answers a ranged GET by
    reading that range of its file, where moto reads the whole object for each one (0.24-0.52 s for
    a ~400 MB Lance fragment, whatever the range). Installed once under ``work/s3rver`` (needs
    node and npm); its objects live in a fresh directory under ``work``, removed by the caller."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise SystemExit("--server s3rver: needs node and npm on PATH (e.g. apt install nodejs npm); or --server moto")
    prefix = work / "s3rver"
    script = prefix / "node_modules" / "s3rver" / "bin" / "s3rver.js"
    if not script.is_file():
        subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", S3RVER], check=True,
                       stdout=subprocess.DEVNULL)
    data = tempfile.mkdtemp(prefix="s3rver-objects-", dir=work)
    port = _free_port()
    proc = subprocess.Popen([node, str(script), "-d", data, "-a", "127.0.0.1", "-p", str(port), "-s",
                             "--allow-mismatched-signatures", "--configure-bucket", "bench"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.objects = data  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/", proc)
    return url, proc


def start_proxy(upstream: str, delay_ms: float) -> tuple[str, subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "lmdata.bench.delay_proxy", upstream, str(delay_ms)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc.stdout.readline().strip(), proc


def run_loader(store: str, fmt: str, workers: int, args: argparse.Namespace) -> dict:
    """Start-up (open + first batch), then tokens/s and stall over ``args.batches`` batches."""
    from lmdata.data import make_loader
    from lmdata.store import open_store

    step = args.batch * args.seq / args.rate
    t0 = time.perf_counter()
    ds = open_store(store).dataset("train", args.seq, fmt)
    it = iter(make_loader(ds, args.batch, num_workers=workers, seed=1, timeout=120))
    next(it)
    startup = time.perf_counter() - t0
    wait = 0.0
    t1 = time.perf_counter()
    for _ in range(args.batches):
        t = time.perf_counter()
        next(it)
        wait += time.perf_counter() - t
        time.sleep(step)  # the simulated H100 step
    total = time.perf_counter() - t1
    loader_rate = args.batches * args.batch * args.seq / max(wait, 1e-9)
    del it
    return {"startup_s": startup, "stall": wait / total, "tok_s": args.batches * args.batch * args.seq / total,
            "loader_tok_s": loader_rate}


def run_naive(store: str, args: argparse.Namespace) -> dict:
    """One GET per window (memmap token shard byte range), one after another: no coalescing, no overlap."""
    from lmdata.store import open_store

    st = open_store(store)
    shards = st.manifest.splits["train"].formats["memmap"]
    item = st.dtype.itemsize
    handles = {}
    bounds = np.cumsum([0] + [s.n_tokens for s in shards])
    rng = np.random.default_rng(1)
    n_windows = (int(bounds[-1]) - 1) // args.seq
    t0, got = time.perf_counter(), 0
    for k in rng.permutation(n_windows)[: args.batches * args.batch // 4]:  # a quarter: it is slow
        start = int(k) * args.seq
        i = int(np.searchsorted(bounds, start, side="right") - 1)
        lo, hi = start - int(bounds[i]), min(start - int(bounds[i]) + args.seq + 1, shards[i].n_tokens)
        if i not in handles:
            handles[i] = (st.format_dir("train", "memmap") / shards[i].files[0].path).open_input()
        got += len(handles[i].read_at((hi - lo) * item, lo * item)) // item
    elapsed = time.perf_counter() - t0
    return {"loader_tok_s": got / elapsed, "tok_s": got / elapsed, "stall": float("nan"), "startup_s": float("nan")}


def cache_epochs(store: str, args: argparse.Namespace) -> tuple[float, float, int]:
    """memmap with the local cache on: seconds for the same batches in epoch 1 and epoch 2."""
    from lmdata.store import open_store

    os.environ["LMDATA_REMOTE_CACHE_BYTES"] = str(256 << 20)
    os.environ["LMDATA_MEMMAP_CACHE_BYTES"] = "0"  # by ranges, through the range cache (not whole copies)
    try:
        times = []
        for _ in range(2):
            ds = open_store(store).dataset("train", args.seq, "memmap")
            rng = np.random.default_rng(2)
            order = rng.permutation(len(ds))[: args.batches * args.batch]
            t = time.perf_counter()
            for b in range(args.batches):
                ds.__getitems__(order[b * args.batch:(b + 1) * args.batch].tolist())
            times.append(time.perf_counter() - t)
        requests = ds.reader.blocks.files.requests if hasattr(ds, "reader") else -1
        return times[0], times[1], requests
    finally:
        del os.environ["LMDATA_REMOTE_CACHE_BYTES"], os.environ["LMDATA_MEMMAP_CACHE_BYTES"]


def _no_nan(value):
    """``value`` with NaN as null: a bare NaN is not JSON (a failed cell's stall and start-up are NaN)."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, default=REPO / "data" / "sample.txt")
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--rate", type=float, default=3.5e6, help="tokens/s of the simulated step (H100, small)")
    p.add_argument("--delays", default="0,5,20")
    p.add_argument("--workers", default="0,2")
    p.add_argument("--json", type=Path)
    p.add_argument("--png", type=Path, help="also draw the table: loader M tok/s per reader and latency")
    p.add_argument("--from-json", type=Path, help="redraw --png (and print the table) from an earlier --json; "
                   "runs nothing")
    args = p.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        args = argparse.Namespace(**{**saved["args"], "png": args.png})
        print(table(saved["rows"], args))
        if args.png:
            plot(saved["rows"], args, args.png)
        return

    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.tokenizer import Tokenizer, train_bpe

    work = Path(tempfile.mkdtemp(prefix="lmdata-remote-bench-"))
    os.environ["LMDATA_CACHE_DIR"] = str(work / "cache")
    moto_url, moto = start_moto()
    env = {"AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_REGION": "us-east-1", "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
           "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED", "AWS_EC2_METADATA_DISABLED": "true"}
    os.environ.update(env)
    rows, proxies = [], []
    try:
        vocab, merges = train_bpe(str(args.corpus), args.vocab_size, ["<|endoftext|>"], workers=1)
        Tokenizer(vocab, merges, ["<|endoftext|>"]).save(work / "tok")
        spec = {"train": SourceSpec((str(args.corpus),))}
        local, remote = str(work / "store"), "s3://bench/store"
        for out in (local, remote):
            ingest(spec, work / "tok", out, shard_tokens=1 << 17, workers=1, progress=False, log=None)
        workers = [int(w) for w in args.workers.split(",")]
        for fmt in FORMATS:
            for w in workers:
                rows.append({"format": fmt, "where": "local", "delay_ms": 0, "workers": w,
                             **run_loader(local, fmt, w, args)})
                print(json.dumps(rows[-1]), flush=True)
        cache = None
        for delay in [float(d) for d in args.delays.split(",")]:
            url, proxy = start_proxy(moto_url.split("://")[1], delay)
            proxies.append(proxy)
            os.environ["AWS_ENDPOINT_URL"] = url
            rows.append({"format": "naive (GET per window)", "where": "s3", "delay_ms": delay, "workers": 0,
                         **run_naive(remote, args)})
            print(json.dumps(rows[-1]), flush=True)
            for fmt in FORMATS:
                for w in workers:  # a fresh machine each: an empty cache (no copies of earlier cells)
                    os.environ["LMDATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache-", dir=work)
                    rows.append({"format": fmt, "where": "s3", "delay_ms": delay, "workers": w,
                                 **run_loader(remote, fmt, w, args)})
                    print(json.dumps(rows[-1]), flush=True)
            if delay == max(float(d) for d in args.delays.split(",")):
                cache = (delay, *cache_epochs(remote, args))
            proxy.kill()
            os.environ["AWS_ENDPOINT_URL"] = moto_url
        print(table(rows, args))
        if cache:
            d, e1, e2, _ = cache
            print(f"\nmemmap from s3 at {d:g} ms with the local cache (LMDATA_REMOTE_CACHE_BYTES): "
                  f"epoch 1 {e1:.2f} s, epoch 2 {e2:.2f} s for the same {args.batches} batches ({e1 / e2:.1f}x)")
        if args.png:
            plot(rows, args, args.png)
        if args.json:
            args.json.write_text(json.dumps(_no_nan({"rows": rows, "cache": cache, "args": vars(args) | {
                "corpus": str(args.corpus), "json": str(args.json), "png": str(args.png)}}), indent=1))
    finally:
        for proc in proxies + [moto]:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def table(rows: list[dict], args: argparse.Namespace) -> str:
    naive = {r["delay_ms"]: r["loader_tok_s"] for r in rows if r["format"].startswith("naive")}
    local = {(r["format"], r["workers"]): r["loader_tok_s"] for r in rows if r["where"] == "local"}
    out = [f"loader from s3:// via delay proxy (moto on loopback), batch {args.batch} x {args.seq}, "
           f"simulated step at {args.rate / 1e6:g} M tok/s; CPU-only, 2 shared cores",
           "| format | where | +ms/request | workers | loader M tok/s | x naive | x local | step-loop M tok/s "
           "| stall | start-up s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        n = naive.get(r["delay_ms"])
        loc = local.get((r["format"], r["workers"]))
        out.append(
            f"| {r['format']} | {r['where']} | {r['delay_ms']:g} | {r['workers']} | {r['loader_tok_s'] / 1e6:.2f} | "
            f"{r['loader_tok_s'] / n:.1f} | " if n and r["where"] == "s3" else
            f"| {r['format']} | {r['where']} | {r['delay_ms']:g} | {r['workers']} | {r['loader_tok_s'] / 1e6:.2f} | - | "
        )
        out[-1] += (f"{r['loader_tok_s'] / loc:.2f} | " if loc and r["where"] == "s3" else "- | ")
        out[-1] += (f"{r['tok_s'] / 1e6:.2f} | " + ("-" if r["stall"] is None or np.isnan(r["stall"]) else f"{r['stall']:.0%}") + " | "
                    + ("-" if r["startup_s"] is None or np.isnan(r["startup_s"]) else f"{r['startup_s']:.2f}") + " |")
    return "\n".join(out)


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    """Grouped bars, log scale: loader M tok/s of each reader (local, then s3 at each latency),
    workers 0 and 2, against the H100 ``small`` rate the simulated step consumes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("local", 0)] + sorted({("s3", r["delay_ms"]) for r in rows if r["where"] == "s3"}, key=lambda g: g[1])
    readers = [(f, w) for f in FORMATS for w in sorted({r["workers"] for r in rows})] + [("naive (GET per window)", 0)]
    value = {(r["format"], r["workers"], r["where"], r["delay_ms"]): r["loader_tok_s"] / 1e6 for r in rows}
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(readers)
    for k, (fmt, w) in enumerate(readers):
        xs, ys = [], []
        for g, (where, delay) in enumerate(groups):
            v = value.get((fmt, w, where, delay))
            if v is not None:
                xs.append(g + (k - (len(readers) - 1) / 2) * width)
                ys.append(v)
        label = fmt if fmt.startswith("naive") else f"{fmt}, {w} workers"
        ax.bar(xs, ys, width, label=label)
    ax.axhline(args.rate / 1e6, color="black", linestyle="--", linewidth=1)
    ax.text(-0.45, args.rate / 1e6 * 1.12, f"H100 small {args.rate / 1e6:g} M tok/s", ha="left", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), ["local disk" if w == "local" else f"s3 +{d:g} ms/request" for w, d in groups])
    ax.set_ylabel("loader M tokens/s (log)")
    ax.set_title(f"Loader from object storage (moto on loopback, delay proxy), batch {args.batch} x {args.seq}; "
                 "CPU-only, 2 shared cores", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
