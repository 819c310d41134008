"""Ray ingest against the local engine: same corpus, tokenizer, formats and cores.

    .venv/bin/python bench/ingest_ray.py                        # table on stdout
    .venv/bin/python bench/ingest_ray.py --readme bench/README.md   # and rewrite its "## Ray ingest" section

Each case runs in its own process (cold Python). ``local`` is ``lmdata.ingest.ingest``
with ``--workers W``; ``ray`` starts a local Ray with W CPUs inside the timed region (what
``lmdata ingest --engine ray`` costs on one machine); ``ray-warm`` starts Ray first and
times only the ingest (what a job on an already running cluster pays); ``ray-2nd`` times
a second ingest in the same job (worker processes already started). Every store is
checked against the local one: the manifests' counts and checksums must be identical.
Needs the ``ray`` extra (``pip install 'lmdata[ray]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import add_ingest_args, ensure_tokenizer, replace_section  # bench/ is on sys.path when a script runs

CASES = ["local", "ray", "ray-warm", "ray-2nd"]
SECTION = "## Ray ingest"

SCALING = """\
`ray` pays Ray's start-up inside the timed region; `ray-warm` joins a running Ray and
pays the job's start (Ray starts fresh worker processes for each job: each imports
lmdata, pyarrow and Ray Data, then fetches the tokenizer once); `ray-2nd` is a second
ingest in the same job, workers already up: the per-byte cost without the fixed costs,
i.e. the ratio a multi-GB ingest converges to. "split s" is the time inside the split
(no start-up, no manifest). On 2 cores there is nothing to gain from Ray: parity is the
expected result, and the fixed start-up is the overhead.

How it scales with nodes. Parallel, on every CPU of the cluster: encoding (one Ray Data
task per ~1 MB of text; the dominant cost, ~6 MB/s of text per core, `encode-1` in the
Ingest table), reading (one streaming task per input file, ~100 MB/s each, one reader per
16 CPUs at a time) and writing (one task per shard and format: Parquet and zstd, the Lance
fragment, the memmap file, their checksum and fsync). Serial, in the driver: receiving
every token once (2 bytes per token with at most 65,536 ids: about half the input's
bytes), cutting shards at document boundaries (NumPy), one `ray.put` per shard, the count
checks and one document read back per shard and format, then the Lance commit (one
transaction listing every fragment: metadata only) and the manifest (one small JSON
file): the commit and the manifest cost O(shards), not O(data). So throughput grows with
encoding cores until one of three limits: a single input file is read by one task
(~100 MB/s, i.e. ~16 cores' worth: split big corpora into several files), the driver's
network intake (about twice its NIC bandwidth in text), or the shared filesystem's write
bandwidth. Every node must see the inputs and the store at the same paths.
"""


def run_case(case: str, corpus: Path, tokenizer_dir: Path, out: Path, workers: int, formats: list[str]) -> dict:
    """One case in this process: seconds from start to manifest, and what was written."""
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec

    splits = {"train": SourceSpec((str(corpus),))}
    engine = "local" if case == "local" else "ray"
    t0 = time.perf_counter()
    if case in ("ray-warm", "ray-2nd"):
        import ray

        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False)
        if case == "ray-2nd":  # a first, untimed ingest starts the worker processes
            ingest(splits, tokenizer_dir, out.with_name(out.name + "-1st"), formats=formats, workers=workers,
                   overwrite=True, progress=False, log=None, engine=engine)
        t0 = time.perf_counter()
    res = ingest(splits, tokenizer_dir, out, formats=formats, workers=workers, progress=False, log=None,
                 engine=engine)
    seconds = time.perf_counter() - t0
    r = res.splits["train"]
    return {"seconds": seconds, "split_seconds": r.seconds, "text_bytes": r.text_bytes, "tokens": r.tokens}


def measure(case: str, args: argparse.Namespace, tokenizer_dir: Path, work: Path) -> dict:
    cmd = [sys.executable, __file__, "--case", case, "--corpus", str(args.corpus), "--tokenizer", str(tokenizer_dir),
           "--workers", str(args.workers), "--formats", args.formats, "--work", str(work / case)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fingerprint(store: Path) -> dict:
    """Manifest counts and checksums without file names (Lance names data files by UUID)."""
    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k != "path"}
        return [strip(v) for v in obj] if isinstance(obj, list) else obj

    m = json.loads((store / "manifest.json").read_text())
    return {name: strip(s["formats"]) for name, s in m["splits"].items()}




def median(runs: list[dict], key: str) -> float:
    values = sorted(r[key] for r in runs)
    return values[len(values) // 2]


def table(rows: dict[str, list[dict]], args: argparse.Namespace, load: str) -> str:
    """Median of the repeats; "split" is the time inside the split (no start-up, no manifest)."""
    base = median(rows["local"], "seconds")
    lines = [
        f"Corpus `{args.corpus.name}` ({args.corpus.stat().st_size / 1e6:.1f} MB), formats {args.formats}, "
        f"`--workers {args.workers}`, {platform.machine()} with {os.cpu_count()} cores, median of "
        f"{args.repeat} runs per case (load average {load}); "
        f"`.venv/bin/python bench/ingest_ray.py --workers {args.workers} --repeat {args.repeat}`.",
        "",
        "| engine | seconds | split s | MB/s | tokens/s | time vs local | store vs local |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for case, runs in rows.items():
        sec = median(runs, "seconds")
        r = runs[0]
        same = "reference" if case == "local" else ("identical" if all(x["same"] for x in runs) else "DIFFERENT")
        lines.append(f"| {case} | {sec:.1f} | {median(runs, 'split_seconds'):.1f} | {r['text_bytes'] / 1e6 / sec:.2f} | "
                     f"{r['tokens'] / sec:,.0f} | {sec / base:.2f}x | {same} |")
    return "\n".join(lines)




def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ingest_args(p)
    p.add_argument("--formats", default="memmap,parquet,lance")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=3, help="Runs per case, round robin; the table shows medians.")
    p.add_argument("--readme", type=Path, help="Rewrite (or add) the '## Ray ingest' table in this file.")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        r = run_case(args.case, args.corpus, args.tokenizer, args.work, args.workers, args.formats.split(","))
        print(json.dumps(r))
        return
    tok = ensure_tokenizer(args.tokenizer, args.vocab_size)
    work = Path(tempfile.mkdtemp(prefix="lmdata-bench-ray-"))
    try:
        cases = ["local"] + [c for c in args.cases.split(",") if c != "local"]
        rows: dict[str, list[dict]] = {c: [] for c in cases}
        loads = [os.getloadavg()[0]]
        for _ in range(args.repeat):
            for case in cases:
                shutil.rmtree(work / case, ignore_errors=True)
                r = measure(case, args, tok, work)
                if case == "local":
                    reference = fingerprint(work / case)
                r["same"] = fingerprint(work / case) == reference
                if not r["same"]:  # keep both manifests to look at
                    keep = Path(tempfile.mkdtemp(prefix=f"lmdata-bench-ray-{case}-differs-"))
                    for c in ("local", case):
                        shutil.copy(work / c / "manifest.json", keep / f"{c}-manifest.json")
                    print(f"{case}: store differs from local; manifests kept in {keep}", file=sys.stderr)
                rows[case].append(r)
                print(f"{case}: {r}", file=sys.stderr)
        loads.append(os.getloadavg()[0])
        body = table(rows, args, f"{loads[0]:.1f} before, {loads[1]:.1f} after") + "\n\n" + SCALING
        print(body)
        if args.readme:
            replace_section(args.readme, SECTION + "\n\n" + body, SECTION.removeprefix("## "))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
