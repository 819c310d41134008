"""What an ingest's written shards cost the page cache: files written and fsynced, kept or dropped.

    .venv/bin/python bench/page_cache.py                    # 400 files of 4 MiB, both ways, 3 rounds
    .venv/bin/python bench/page_cache.py --files 1000 --tmp /data/scratch

Each round writes ``--files`` files of ``--mib`` MiB (random bytes, one write each), fsyncs each,
and either keeps its pages cached (what a plain write does) or drops them after the fsync
(``posix_fadvise(DONTNEED)``, what lmdata's ingest does: ``io.atomic.drop_cached``). Reported:
system and user CPU seconds of the writing process and wall seconds, best of ``--repeat``
interleaved rounds. The files are removed between rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path


def write_files(where: Path, files: int, data: bytes, drop: bool) -> dict[str, float]:
    """Write and fsync ``files`` files; returns system, user and wall seconds."""
    where.mkdir(parents=True, exist_ok=True)
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(files):
        fd = os.open(where / f"f{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"sys": after.ru_stime - before.ru_stime, "user": after.ru_utime - before.ru_utime,
            "wall": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=400)
    p.add_argument("--mib", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tmp", default=None, help="Where the files are written (default: the system temp dir).")
    args = p.parse_args()
    data = os.urandom(args.mib << 20)
    root = Path(tempfile.mkdtemp(prefix="lmdata-page-cache-", dir=args.tmp))
    best: dict[str, dict[str, float]] = {}
    try:
        for _ in range(args.repeat):
            for mode in ("kept", "dropped"):
                got = write_files(root / mode, args.files, data, mode == "dropped")
                shutil.rmtree(root / mode)
                best[mode] = {k: min(v, best.get(mode, got)[k]) for k, v in got.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gib = args.files * args.mib / 1024
    print(f"{args.files} files x {args.mib} MiB ({gib:.2f} GiB) on {platform.node() or 'this machine'}, "
          f"{os.cpu_count()} CPUs, best of {args.repeat}")
    print("| pages after fsync | system CPU s | user CPU s | wall s |\n|---|---:|---:|---:|")
    for mode, r in best.items():
        print(f"| {mode} | {r['sys']:.2f} | {r['user']:.2f} | {r['wall']:.2f} |")
    def ratio(key: str) -> str:  # "-" below the timer's resolution (a 0.00 s divisor had printed 1056000.0x)
        return "-" if best["dropped"][key] < 0.01 else f"{best['kept'][key] / best['dropped'][key]:.1f}x"

    print(f"kept / dropped: {ratio('sys')} system CPU, {ratio('wall')} wall")


main()
