"""Record the `## Stall` tables of bench/README.md: every format x workers, warm and cold.

    .venv/bin/python bench/stall.py --gpu h100,l4 --readme bench/README.md

Steps (each an `lmdata` command, printed before it runs and quoted in the README):
1. train a byte-level BPE tokenizer (vocab 10000, the `small` preset's) on the 5 MB slice
   of the corpus, unless runs/bench/tokenizer exists;
2. ingest ../shared/corpus/english-prose.txt into runs/bench/english-prose in every
   format, unless that store exists;
3. per `--gpu`: `lmdata bench` with a simulated step as long as that GPU at 40% MFU takes
   for one step of the `small` preset, cold and warm cache, into
   bench/results/stall-cpu-<gpu>/ (bench.json, table.txt, table.md, stall.png, waits.png).
With `--readme`, the `## Method` and `## Stall` sections of that file are rewritten (the
other sections are left alone).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from common import SHARED_CORPUS, replace_section  # bench/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
CORPUS = SHARED_CORPUS / "english-prose.txt"
TOKENIZER_TEXT = SHARED_CORPUS / "english-prose-5mb.txt"


def shown(args: tuple[str, ...]) -> str:
    return "lmdata " + " ".join(shlex.quote(a) for a in args)


def lmdata(*args: str) -> str:
    """Run one `lmdata` command (the console script a user runs) from the repo root; returns it."""
    print("$ " + shown(args), flush=True)
    subprocess.run([sys.executable, "-m", "lmdata", *args], check=True, cwd=ROOT)
    return shown(args)


METHOD = """\
## Method

`lmdata bench` (src/lmdata/bench/) answers "is the accelerator waiting on the data?" the
way a training loop sees it. One step is `next(loader)` plus the host->device copy
(`t_wait`, the accelerator idles) followed by the step's compute (`t_compute`):

    stall fraction = sum(t_wait) / sum(t_wait + t_compute)

- **Compute.** `--compute model` runs real steps of a preset (forward, cross-entropy,
  backward, gradient clipping, AdamW: the modules `lmdata train` uses), timed with CUDA
  events on a GPU (bf16 autocast, fused attention) and the wall clock on a CPU.
  `--compute simulated` is a device step of fixed length that releases the GIL
  (`time.sleep`, as a host thread waiting on a GPU does); its length comes from
  `--step-ms`, or from `--model` and `--gpu`: the time that accelerator takes for one
  step at `--mfu` (default 40%) of its peak dense bf16 FLOP/s.
- **FLOPs.** Per token, `6 * N_matmul + 12 * layers * seq_len * d_model` (every matmul,
  backward = 2x forward; `N_matmul` leaves out the embedding lookup and the norm gains).
  A test checks this against `torch.utils.flop_counter` on a real forward+backward,
  exactly; `lmdata plan` prints it with the parameter count (also tested equal to the
  model's own) and a memory estimate.
- **A cell** is one format at one worker count, in a fresh spawned process (a new
  training job: no state carries over; DataLoader workers use the platform default, fork).
  In it: (1) a *synthetic* run, the same loop over one fixed batch already on the device:
  the step time with no data cost, so `stall A/B = 1 - synthetic step / real step` is a
  second, independent estimate (nanoGPT's A/B); it also counts what loading steals from
  compute when both share the CPU; (2) per cache state, the loader alone for the same
  number of batches (its tokens/s, after the first batch and the warm-up) and then, `--repeats`
  times (default 3, each with a new loader), the training steps.
- **Cache.** *warm*: the format's files are read once before each run; *cold*: they are
  evicted with `posix_fadvise(POSIX_FADV_DONTNEED)` (no root needed) before each run; the
  `cached` column is the share of their pages resident just before the run (`mincore`).
  Readers run with `verify="size"`: the whole-file checksum a reader does by default on its first
  touch of a shard (once per process) would read whole shards and warm a cold cache;
  check stores with `lmdata verify` instead.
- **Steady state.** Each repeat's first step (time to first batch: worker start-up) and
  the `--warmup-steps` after it (default: the batches in flight at start, workers x
  prefetch x batches_per_read, where every worker's first reads land) are left out of
  its stall and reported apart (warm-up stall); `--steps` counts the steady-state steps.
- **Reported per cell:** stall fraction, the median over the repeats, and its spread
  (min-max); warm-up stall; wait per step p50/p95/p99/max (every repeat's steady steps);
  time to first batch; loader-only tokens/s; headroom = loader tokens/s / tokens/s the
  trainer consumes (with simulated steps the `--gpu` rate, with real steps the measured
  one); "keeps up": yes when every repeat stalls under 5%, NO when every one stalls 5% or
  more, "too noisy" when they fall on both sides (one short run was decided by its
  start-up or one slow read: two identical runs stalled 10.5% and 32.1%); RSS and USS of
  the worker processes (RSS counts pages shared with the parent after fork, USS only their
  own). Headroom is necessary, not sufficient: with 0 workers the loading is serial with
  the step, so every millisecond of it is stall.
- The 1-minute load average at the start is printed with each table: on a shared machine
  other jobs' processes take the same cores, and every wait here grows with them.
- Same seed, same batches in every cell, format and repeat. `bench.json` keeps each
  repeat's figures and every per-step wait; `stall.png` and `waits.png` plot the fraction and the wait distribution.
"""


def write_readme(path: Path, body: str) -> None:
    """Replace (or append) the ``## Method`` + ``## Stall`` block of ``path``, leaving the rest alone."""
    replace_section(path, body, "Method", "Stall")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tokenizer-text", type=Path, default=TOKENIZER_TEXT)
    ap.add_argument("--work", default="runs/bench", help="Tokenizer and store go here (relative to the repo).")
    ap.add_argument("--results", default="bench/results", help="Each run writes <results>/stall-cpu-<gpu>/.")
    ap.add_argument("--gpu", default="h100", help="Comma-separated accelerators: one bench run each.")
    ap.add_argument("--steps", default="300")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--batch-size", default="32")
    ap.add_argument("--compute", default="simulated", choices=["simulated", "model"],
                    help="model: real steps of `small` on this machine's GPU (results in stall-gpu-<gpu>/).")
    ap.add_argument("--no-run", action="store_true", help="Only rebuild --readme from the recorded results.")
    ap.add_argument("--readme", type=Path, help="Rewrite the '## Method' and '## Stall' sections of this file.")
    args = ap.parse_args()

    tok, store = f"{args.work}/tokenizer", f"{args.work}/{args.corpus.stem}"
    train_tok = ("tokenizer", "train", str(args.tokenizer_text), "--vocab-size", "10000", "--out", tok, "--no-progress")
    ingest = ("ingest", "--input", str(args.corpus), "--tokenizer", tok, "--out", store,
              "--format", "memmap,parquet,lance", "--no-progress")
    if not (ROOT / tok / "tokenizer.json").exists() and not args.no_run:
        lmdata(*train_tok)
    if not (ROOT / store / "manifest.json").exists() and not args.no_run:
        lmdata(*ingest)
    setup = [shown(train_tok), shown(ingest)]

    from lmdata.bench import report

    for gpu in [] if args.no_run else args.gpu.split(","):
        out = f"{args.results}/stall-{'cpu' if args.compute == 'simulated' else 'gpu'}-{gpu}"
        out += "" if args.batch_size == "32" else f"-b{args.batch_size}"
        # this script's own files beside the bench's: `lmdata bench` replaces only what it writes (a rerun had
        # been refused: "holds files lmdata did not write"), so they step aside, and come back if it fails
        own = {p: p.read_bytes() for p in (ROOT / out / "table.md", ROOT / out / "section.md") if p.exists()}
        for p in own:
            p.unlink()
        try:
            cmd = lmdata("bench", "--store", store, "--format", "all", "--loader-workers", args.workers,
                         "--batch-size", args.batch_size, "--seq-len", "256", "--steps", args.steps,
                         "--compute", args.compute, "--model", "small", "--gpu", gpu, "--cache", "both", "--out", out)
        except BaseException:
            for p, data in own.items():
                p.write_bytes(data)
            raise
        result = json.loads((ROOT / out / "bench.json").read_text())
        table = "\n".join(report.header_lines(result)) + "\n\n" + report.table(result, markdown=True) + "\n"
        (ROOT / out / "table.md").write_text(table)
        print(table)
        rel = Path(out).relative_to("bench") if out.startswith("bench/") else Path(out)
        what = ("simulated steps on this CPU machine" if args.compute == "simulated"
                else f"real steps on {result['machine']['gpu'] or result['config']['device']}")
        (ROOT / out / "section.md").write_text(
            f"### `small` at {gpu} speed, batch {args.batch_size}: {what}\n\n```\n{cmd}\n```\n\n{table}\n"
            f"![stall fraction]({rel}/stall.png)\n![wait distribution]({rel}/waits.png)\n")
    if args.readme:  # every recorded run, this one and earlier ones (CPU first, then GPU)
        parts = [p.read_text() for p in sorted((ROOT / args.results).glob("stall-*/section.md"))]
        notes = ROOT / args.results / "stall-notes.md"  # findings, written by hand after looking
        parts += [notes.read_text()] if notes.exists() else []
        stall = ("## Stall\n\nRecorded with `.venv/bin/python bench/stall.py --gpu h100,l4 --readme bench/README.md` "
                 "and `... --gpu h100 --batch-size 256 ...`; each table gives its `lmdata bench` command. "
                 "The store, made once:\n\n"
                 "```\n" + "\n".join(setup) + "\n```\n\n" + "\n".join(parts))
        write_readme(args.readme, METHOD + "\n" + stall)

if __name__ == "__main__":
    main()
