"""What the Ray driver holds and receives while its tasks write an s3:// store (issue 26, item 1).

    .venv/bin/python bench/ray_driver.py --sizes 100M,1G                 # table on stdout
    .venv/bin/python bench/ray_driver.py --sizes 100M,1G --readme bench/README.md

One ``ray.cluster_utils.Cluster`` of two nodes (``--node-cpus`` each, each its own
``LMDATA_CACHE_DIR``) and one ``moto_server`` on loopback serve every case. A size is the
corpus uploaded as whole copies, one object per copy (``ceil(size / corpus)`` of them: moto
reads a whole object per ranged GET, so objects stay corpus-sized). Each case is a fresh
driver process joining the cluster and running ``lmdata.ingest.ingest(..., engine="ray")``
into ``s3://bench/<case>``; it reports:

- *peak RSS*: the driver's ``ru_maxrss``; *RSS before*: after imports and ``ray.init``.
- *from tasks*: ``ray_store.RECEIVED``, the pickled bytes of what the driver fetched from
  tasks (per-batch counts and origins, per-shard records).
- *driver S3 in / out*: the bytes of the driver's own S3 traffic (responses it received,
  requests it sent), counted by a TCP proxy in the driver process that only the driver's
  S3 client uses (the tasks are given moto's own endpoint).

``--staged SIZES`` adds cases through the path every plug-in format still takes (shards
written in the driver's staging directory and uploaded by the driver) for contrast.
Needs the ``ray`` and ``dev`` extras (Ray, moto[server]).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from common import CORPUS, ensure_tokenizer, replace_section  # bench/ is on sys.path when a script runs

SECTION = "Ray driver"  # (tasks write an s3:// store): the README's heading
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
       "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED", "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
       "AWS_EC2_METADATA_DISABLED": "true"}


def parse_size(text: str) -> int:
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


class CountingProxy:
    """127.0.0.1:port -> ``upstream``, counting the bytes each way (threads, in this process)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream, self.received, self.sent = upstream, 0, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.server.accept()
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, "received"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while data := src.recv(1 << 16):
                setattr(self, counter, getattr(self, counter) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def count_driver_s3() -> CountingProxy:
    """Route this process's S3 client through a ``CountingProxy``; tasks keep moto's endpoint."""
    from lmdata.ingest import ray as ray_engine, ray_store
    from lmdata.io import s3

    real = s3.aws_environment()
    host, port = real["AWS_ENDPOINT_URL"].removeprefix("http://").rsplit(":", 1)
    proxy = CountingProxy((host, int(port)))
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
    ray_engine.aws_environment = ray_store.aws_environment = lambda: dict(real)  # what tasks are sent
    return proxy


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def driver(args: argparse.Namespace) -> None:
    """One case in this fresh process: join the cluster, ingest, print one JSON line."""
    import ray

    from lmdata.ingest import ingest, publish, ray_store
    from lmdata.sources import SourceSpec

    if args.case.startswith("staged"):
        publish._tasks_write = lambda kwargs: False  # the driver-staged path plug-in formats take
    ray.init(address=args.address, log_to_driver=False)
    proxy = count_driver_s3()
    before, t0 = rss_mb(), time.perf_counter()
    res = ingest({"train": SourceSpec((args.inputs,))}, args.tokenizer, f"s3://bench/{args.case}",
                 formats=args.formats.split(","), workers=args.workers, progress=False, log=None, engine="ray")
    seconds = time.perf_counter() - t0
    r = res.splits["train"]
    print(json.dumps({"case": args.case, "seconds": seconds, "text_bytes": r.text_bytes, "tokens": r.tokens,
                      "shards": r.shards, "documents": r.documents, "rss_before_mb": before, "peak_rss_mb": rss_mb(),
                      "from_tasks": ray_store.RECEIVED["bytes"], "s3_in": proxy.received, "s3_out": proxy.sent}))


def start_moto(log: Path) -> tuple[str, subprocess.Popen]:
    exe = Path(sys.executable).with_name("moto_server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe) if exe.exists() else "moto_server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    endpoint, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/", timeout=1).read()
            return endpoint, proc
        except urllib.error.HTTPError:
            return endpoint, proc
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"moto_server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)


def upload_copies(corpus: Path, size: int) -> tuple[str, int]:
    """``ceil(size / corpus)`` copies of the corpus as objects of bucket ``bench``; (glob, bytes)."""
    from lmdata.io.location import location

    copies = max(1, math.ceil(size / corpus.stat().st_size))
    data = corpus.read_bytes()
    for i in range(copies):
        obj = location(f"s3://bench/in-{copies}/part-{i:04d}.txt")
        if obj.size() != len(data):
            obj.write_bytes(data)
    return f"s3://bench/in-{copies}/part-*.txt", copies * len(data)


def measure(case: str, inputs: str, address: str, args: argparse.Namespace, tokenizer: Path) -> dict:
    cmd = [sys.executable, __file__, "--case", case, "--inputs", inputs, "--address", address, "--tokenizer",
           str(tokenizer), "--formats", args.formats, "--workers", str(args.workers)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict], args: argparse.Namespace, load: str) -> str:
    lines = [
        f"Corpus `{args.corpus.name}` ({args.corpus.stat().st_size / 1e6:.1f} MB) uploaded as whole copies to "
        f"`moto_server` on loopback, formats {args.formats}, a two-node `ray.cluster_utils.Cluster` "
        f"({args.node_cpus} CPU per node), {platform.machine()} with {os.cpu_count()} cores, one fresh driver "
        f"process per case (load average {load}); `.venv/bin/python bench/ray_driver.py --sizes {args.sizes}"
        f"{f' --staged {args.staged}' if args.staged else ''} --formats {args.formats}`.",
        "",
        "| case | text MB | tokens | shards | wall s | RSS before MB | peak RSS MB | from tasks KB | from tasks B/doc "
        "| driver S3 in MB | driver S3 out MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['text_bytes'] / 1e6:,.0f} | {r['tokens']:,} | {r['shards']} | "
                     f"{r['seconds']:.0f} | {r['rss_before_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
                     f"{received(r)} | "
                     f"{r['s3_in'] / 1e6:,.2f} | {r['s3_out'] / 1e6:,.2f} |")
    return "\n".join(lines)


def received(r: dict) -> str:
    """The from-tasks cells: the staged path's engine receives every token (Ray Data batches, not counted)."""
    if r["case"].startswith("staged"):
        return f"every token (>= {r['tokens'] * 2 / 1e3:,.0f}) | -"
    return f"{r['from_tasks'] / 1e3:,.0f} | {r['from_tasks'] / max(1, r['documents']):.1f}"


def run_all(args: argparse.Namespace, work: Path) -> list[dict]:
    from ray.cluster_utils import Cluster

    endpoint, moto = start_moto(work / "moto.log")
    os.environ.update(AWS, AWS_ENDPOINT_URL=endpoint, LMDATA_CACHE_DIR=str(work / "driver"))
    cluster = Cluster()
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint + "/bench", method="PUT")).read()
        for i in range(2):
            cluster.add_node(num_cpus=args.node_cpus, object_store_memory=args.object_store_mb << 20,
                             env_vars={"LMDATA_CACHE_DIR": str(work / f"node{i}")}, include_dashboard=False)
        cluster.wait_for_nodes()
        tokenizer = ensure_tokenizer(args.tokenizer, args.vocab_size)
        rows = []
        for size in args.sizes.split(","):
            inputs, _ = upload_copies(args.corpus, parse_size(size))
            for kind in ("tasks", "staged") if size in args.staged.split(",") else ("tasks",):
                rows.append(measure(f"{kind}-{size}", inputs, cluster.address, args, tokenizer))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        return rows
    finally:
        cluster.shutdown()
        os.killpg(moto.pid, signal.SIGTERM)
        moto.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--sizes", default="100M,1G", help="Comma-separated text sizes (K, M, G: powers of 1000).")
    p.add_argument("--formats", default="memmap,parquet,lance")
    p.add_argument("--staged", default="", help="Sizes to measure the driver-staged path at too, for contrast.")
    p.add_argument("--node-cpus", type=int, default=1)
    p.add_argument("--object-store-mb", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tokenizer", type=Path, default=Path(tempfile.gettempdir()) / "lmdata-bench-tokenizer-8192")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--readme", type=Path, help=f"Rewrite (or add) the '## {SECTION}' table in this file.")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--inputs", help=argparse.SUPPRESS)
    p.add_argument("--address", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        return driver(args)
    work = Path(tempfile.mkdtemp(prefix="lmdata-ray-driver-"))
    try:
        rows = run_all(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = table(rows, args, " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(body)
    if args.readme:
        replace_section(args.readme, f"## {SECTION}\n\n{body}\n", SECTION)


if __name__ == "__main__":
    main()
