"""Benchmark our BPE against rustbpe, Hugging Face `tokenizers`, tokie and tiktoken, on one input, in one run.

Each measurement runs in its own fresh process, so peak RSS is that tool's alone:
  train/ours      lmdata.tokenizer.train_bpe with --threads counting threads (C trainer)
  train/rustbpe   rustbpe (nanochat's Rust trainer), RAYON_NUM_THREADS=--threads, lines of the file
  train/hf        tokenizers' BpeTrainer (byte-level, GPT-2 regex) with RAYON_NUM_THREADS=--threads
  encode/ours     Tokenizer.encode of the whole input with a fresh encoder (cold cache), one
                  pinned core; then the same text again (warm), and the 2nd half after a fresh
                  tokenizer saw the 1st; with the C accelerator (the run fails if it is not built)
  encode/ours-batch     encode_batch over the documents (split at <|endoftext|>), one pinned core,
                        fresh encoder
  encode/ours-2threads  the same on 2 threads (2 cores)
  encode/ours-arrays    encode_arrays over the documents (one uint32 array, no int objects: what
                        ingest's encoders call), one pinned core, fresh encoder
  encode/ours-arrays-2threads  the same on 2 threads (2 cores)
  encode/ours-python  the same cold encode on the pure-Python path (LMDATA_PURE_PYTHON=1)
  encode/tokie    tokie loading OUR tokenizer.json, one pinned core
  encode/tiktoken tiktoken.Encoding built from OUR vocab (mergeable_ranks) and the GPT-2 pattern
  encode/hf       tokenizers' BPE model loaded from OUR vocab.json/merges.txt, one thread,
                  encode_batch over the documents (split at <|endoftext|>)
All encoders use our trained tokenizer, and the table says whether their ids equal ours.

    .venv/bin/python bench/tokenizer.py --input ../shared/corpus/english-prose.txt --vocab-size 10000 \\
        --repeat 3 --readme bench/README.md      # and put its table in the "## Tokenizer" section
    .venv/bin/python bench/tokenizer.py --input ../shared/corpus/english-prose.txt --tile-mb 500 \\
        --skip encode/hf,encode/ours-python --readme bench/README.md   # the ~0.5 GB table beside it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from common import replace_section  # bench/ is on sys.path when a script runs

EOT = "<|endoftext|>"
TASKS = ["train/ours", "train/rustbpe", "train/hf", "encode/ours", "encode/ours-batch", "encode/ours-2threads",
         "encode/ours-arrays",
         "encode/ours-arrays-2threads", "encode/ours-python", "encode/tokie", "encode/tiktoken", "encode/hf"]
TWO_CORES = ("encode/ours-2threads", "encode/ours-arrays-2threads")


def _ids_digest(ids) -> str:
    from array import array

    return hashlib.sha256(array("I", ids).tobytes()).hexdigest()[:12]


def _train_ours(args) -> dict:
    from lmdata.tokenizer import Tokenizer

    from lmdata.tokenizer.train import train_bpe_stats

    vocab, merges, stats = train_bpe_stats(args.input, args.vocab_size, [EOT], workers=args.threads)
    if not (Path(args.workdir) / "ours").exists():
        Tokenizer(vocab, merges, [EOT]).save(Path(args.workdir) / "ours")
    return {"ids": hashlib.sha256(repr(merges).encode()).hexdigest()[:12]}


def _train_rustbpe(args) -> dict:
    import rustbpe

    from lmdata.tokenizer.patterns import GPT2_PATTERN

    def lines():
        with open(args.input, encoding="utf-8") as f:
            yield from f

    rustbpe.Tokenizer().train_from_iterator(lines(), args.vocab_size, pattern=GPT2_PATTERN)
    return {}


def _encode_tokie(args, text: str) -> dict:
    import tokie

    tok = tokie.Tokenizer.from_json(str(Path(args.workdir) / "ours" / "tokenizer.json"))
    start, cpu = time.perf_counter(), time.process_time()
    ids = list(tok.encode(text, add_special_tokens=False).ids)
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "ids": _ids_digest(ids),
            "n_ids": len(ids)}


def _encode_ours_threads(args, text: str) -> dict:
    """encode_batch over the documents on 1 or 2 threads (the C encoder releases the GIL)."""
    from lmdata.tokenizer import Tokenizer

    tok = Tokenizer.load(Path(args.workdir) / "ours")
    docs = [d for d in re.split(f"({re.escape(EOT)})", text) if d]
    start, cpu = time.perf_counter(), time.process_time()
    parts = tok.encode_batch(docs, 2 if args.task in TWO_CORES else 1)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ids = [i for part in parts for i in part]  # (flattened outside the timing: a Python loop over every id)
    return {"seconds": seconds, "cpu": cpu, "ids": _ids_digest(ids), "n_ids": len(ids)}


def _encode_ours_arrays(args, text: str) -> dict:
    """encode_arrays over the documents, on 1 thread or 2 (``--task`` says)."""
    import numpy as np  # imported before the clock starts, as the tokenizer's load is

    from lmdata.tokenizer import Tokenizer

    tok = Tokenizer.load(Path(args.workdir) / "ours")
    docs = [d for d in re.split(f"({re.escape(EOT)})", text) if d]
    start, cpu = time.perf_counter(), time.process_time()
    batch = tok.encode_arrays(docs, dtype="uint32", num_workers=2 if args.task in TWO_CORES else 1)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    digest = hashlib.sha256(np.ascontiguousarray(batch.tokens, "<u4").data).hexdigest()[:12]  # = _ids_digest's
    return {"seconds": seconds, "cpu": cpu, "ids": digest, "n_ids": len(batch.tokens)}


def _train_hf(args) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([args.input], trainer)
    return {}


def _encode_ours(args, text: str) -> dict:
    from lmdata.tokenizer import Tokenizer

    def timed(tok, part: str) -> tuple[list[int], float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        ids = tok.encode(part)
        return ids, time.perf_counter() - start, time.process_time() - cpu

    tok = Tokenizer.load(Path(args.workdir) / "ours")
    if tok.accelerated != (args.task == "encode/ours"):
        sys.exit(f"{args.task}: Tokenizer.accelerated is {tok.accelerated}; build the C accelerator (pip install -e .)")
    ids, cold, cold_cpu = timed(tok, text)
    digest, n_ids = _ids_digest(ids), len(ids)
    del ids  # keep peak RSS that of one encode
    if not tok.accelerated:
        return {"seconds": cold, "cpu": cold_cpu, "ids": digest, "n_ids": n_ids}
    _, warm, warm_cpu = timed(tok, text)
    del tok
    half = text.find(EOT, len(text) // 2)  # steady state: the 2nd half after the cache saw the 1st
    fresh = Tokenizer.load(Path(args.workdir) / "ours")
    fresh.encode(text[:half])
    _, second, second_cpu = timed(fresh, text[half:])
    mb = len(text.encode("utf-8")) / 1e6
    extra = [("encode/ours, same text again (warm cache)", warm, warm_cpu, mb),
             ("encode/ours, 2nd half after the 1st", second, second_cpu, len(text[half:].encode("utf-8")) / 1e6)]
    return {"seconds": cold, "cpu": cold_cpu, "extra": extra, "ids": digest, "n_ids": n_ids}


def _encode_tiktoken(args, text: str) -> dict:
    import tiktoken

    from lmdata.tokenizer import Tokenizer
    from lmdata.tokenizer.pretokenize import GPT2_PATTERN

    tok = Tokenizer.load(Path(args.workdir) / "ours")
    ranks = {b: i for i, b in sorted(tok.vocab.items(), reverse=True) if i not in tok.special_ids.values()}
    enc = tiktoken.Encoding("lmdata-bench", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens=tok.special_ids)
    start, cpu = time.perf_counter(), time.process_time()
    ids = enc.encode(text, allowed_special="all")
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "ids": _ids_digest(ids),
            "n_ids": len(ids)}


def _encode_hf(args, text: str) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = Path(args.workdir) / "ours"
    tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens([EOT])
    # one call per document: a single 23 MB string takes tokenizers ~10x longer and ~3 GB
    docs = [d for d in re.split(f"({re.escape(EOT)})", text) if d]
    start, cpu = time.perf_counter(), time.process_time()
    ids = [i for enc in tok.encode_batch(docs) for i in enc.ids]
    return {"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu, "ids": _ids_digest(ids),
            "n_ids": len(ids)}


def run_task(args) -> dict:
    """Run one task in this process and return its measurements."""
    if args.task.startswith("train/"):
        start = time.perf_counter()
        out = {"train/ours": _train_ours, "train/rustbpe": _train_rustbpe, "train/hf": _train_hf}[args.task](args)
        out["seconds"] = time.perf_counter() - start
    else:
        os.sched_setaffinity(0, {0, 1} if args.task in TWO_CORES else {0})  # one pinned core
        text = Path(args.input).read_text(encoding="utf-8")
        out = {"encode/ours": _encode_ours, "encode/ours-python": _encode_ours, "encode/tiktoken": _encode_tiktoken,
               "encode/hf": _encode_hf, "encode/tokie": _encode_tokie, "encode/ours-2threads": _encode_ours_threads,
               "encode/ours-batch": _encode_ours_threads,
               "encode/ours-arrays": _encode_ours_arrays, "encode/ours-arrays-2threads": _encode_ours_arrays}[
            args.task](args, text)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["rss_mb"] = me.ru_maxrss / 1024
    out["worker_rss_mb"] = kids.ru_maxrss / 1024
    # CPU seconds of the timed part (training: the whole process and its workers)
    out["cpu_seconds"] = out.pop("cpu", me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime)
    return out


def measure(args, task: str) -> dict:
    """Best (least wall time) of ``--repeat`` fresh-process runs of ``task``."""
    threads = str(args.threads if task.startswith("train/") else 1)
    env = dict(os.environ, RAYON_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="true" if threads != "1" else "false")
    env["LMDATA_PURE_PYTHON"] = "1" if task == "encode/ours-python" else "0"
    runs = []
    for _ in range(args.repeat):
        cmd = [sys.executable, __file__, "--task", task, "--input", args.input, "--vocab-size", str(args.vocab_size),
               "--threads", str(args.threads), "--workdir", args.workdir]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{task} failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda r: r["seconds"])


def table(args, results: dict[str, dict]) -> str:
    """A markdown table: wall time, MB/s, peak RSS, and ratios to each peer."""
    mb = args.input_mb
    ours_ids = results.get("encode/ours", {}).get("ids")
    rows = ["| task | wall s | MB/s | CPU s | peak RSS MB | ours vs this: wall | CPU | ids equal ours |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for task, r in results.items():
        kind = task.split("/")[0]
        ours = results[f"{kind}/ours"]
        ratio = "—" if task.endswith("/ours") else f"{r['seconds'] / ours['seconds']:.2f}x"
        cpu_ratio = "—" if task.endswith("/ours") else f"{r['cpu_seconds'] / ours['cpu_seconds']:.2f}x"
        rss = f"{r['rss_mb']:.0f}" + (f" + {r['worker_rss_mb']:.0f} per worker" if r["worker_rss_mb"] > 0 else "")
        same = "—" if "ids" not in r or task.endswith("/ours") else ("yes" if r["ids"] == ours_ids else "NO")
        rows.append(f"| {task} | {r['seconds']:.2f} | {mb / r['seconds']:.1f} | {r['cpu_seconds']:.2f} | {rss} | "
                    f"{ratio} | {cpu_ratio} | {same} |")
        for label, seconds, cpu, size in r.get("extra", []):
            rows.append(f"| {label} | {seconds:.2f} | {size / seconds:.1f} | {cpu:.2f} | | | | |")
    return "\n".join(rows)


INTRO = """\
Our byte-level BPE (`lmdata.tokenizer`; training and encoding loops in our C extension
`src/lmdata/tokenizer/_fastbpe.c` + `_fastbpe_train.c`; `encode/ours-python` is the
pure-Python fallback) against `rustbpe` (nanochat's Rust trainer) and Hugging Face
`tokenizers` for training (2 threads each, vocab 10,000, GPT-2 pattern), and against `tokie`,
`tiktoken` and `tokenizers` for encoding with OUR trained tokenizer (tokie and tokenizers load
the `tokenizer.json` our save writes; tiktoken gets our ranks and pattern), each pinned to one
core with a fresh encoder. `encode/ours-batch` and `encode/ours-2threads` are `encode_batch`
over the documents (lists of ints) on 1 and 2 threads; `encode/ours-arrays` and
`encode/ours-arrays-2threads` are `encode_arrays` (one token array, no int objects: what
ingest's encoders call) on 1 and 2 threads (the C encoder releases the GIL and its threads
share one chunk cache; each 2-thread row is held to 1.8x its own 1-thread row). Every
row is a fresh process, so peak RSS is that tool's own; CPU s is the timed part's (training:
the whole process)."""

NOTES = """\
- Training (C): the main thread reads and decodes 256 KB blocks cut where tokenization is
  unaffected; threads count the distinct *chunks* of each block (the encoder's own chunk
  cutting: before each space that precedes a non-space) into one C table each, GIL released;
  the tables are added, each distinct chunk is pre-tokenized once, and the merge loop runs in C
  over the distinct pre-tokens (pair counts updated only around each merge, a lazily updated
  max-heap, ties to the greater byte pair). Memory grows with the distinct chunks, not the input.
- Encoding (C): chunks are cut in C and looked up in one shared hash table of code points ->
  ids (16 slots prefetched at a time); a miss is pre-tokenized in C (the `regex` module's
  character classes) and each pre-token gets BPE (arrays up to 32 bytes, a heap beyond).
  Special tokens are split in C too."""


def verdicts(results: dict[str, dict]) -> list[str]:
    """The issue-16 targets, met or not, from one run's results."""
    out = []
    ours, rust, hf = (results.get(t) for t in ("train/ours", "train/rustbpe", "train/hf"))
    if ours and rust and hf:
        met = ours["seconds"] <= rust["seconds"] and ours["rss_mb"] + ours["worker_rss_mb"] <= 2 * hf["rss_mb"]
        out.append(f"- Training: ours {ours['seconds']:.2f} s wall / {ours['cpu_seconds']:.2f} CPU s vs rustbpe "
                   f"{rust['seconds']:.2f} / {rust['cpu_seconds']:.2f} ({ours['seconds'] / rust['seconds']:.2f}x its "
                   f"time), peak RSS {ours['rss_mb']:.0f} MB vs HF tokenizers' {hf['rss_mb']:.0f} MB "
                   f"({ours['rss_mb'] / hf['rss_mb']:.2f}x); target <= 1.0x rustbpe's time and <= 2x HF's RSS: "
                   f"**{'met' if met else 'NOT met'}**.")
    enc, tokie = results.get("encode/ours"), results.get("encode/tokie")
    if enc and tokie:
        speed = tokie["cpu_seconds"] / enc["cpu_seconds"]
        out.append(f"- Encoding, one core: ours {enc['cpu_seconds']:.2f} CPU s ({enc['seconds']:.2f} wall) vs tokie "
                   f"{tokie['cpu_seconds']:.2f} ({tokie['seconds']:.2f}): {speed:.2f}x tokie's speed by CPU, "
                   f"{tokie['seconds'] / enc['seconds']:.2f}x by wall; target >= 1.0x: "
                   f"**{'met' if speed >= 1.0 else 'NOT met'}**.")
    for one_name, two_name, what in (("encode/ours-batch", "encode/ours-2threads", "encode_batch (lists)"),
                                      ("encode/ours-arrays", "encode/ours-arrays-2threads", "encode_arrays")):
        one, two = results.get(one_name), results.get(two_name)
        if one and two:
            wall = one["seconds"] / two["seconds"]
            out.append(f"- Encoding, 2 threads, {what}: {two['seconds']:.2f} s wall / {two['cpu_seconds']:.2f} CPU s "
                       f"vs {one['seconds']:.2f} / {one['cpu_seconds']:.2f} on one core ({one_name}): {wall:.2f}x by "
                       f"wall (target >= 1.8x: **{'met' if wall >= 1.8 else 'NOT met'}** on this machine); the 2 "
                       f"threads did {two['cpu_seconds'] / one['cpu_seconds']:.2f}x the CPU work of one.")
    return out


def block(args, results: dict[str, dict], header: str, cmd: str) -> str:
    """One input's part of the README section: heading, command, load, table, verdicts."""
    name = f"### {Path(args.input).name} ({args.input_mb:.0f} MB)"
    return "\n\n".join([name, "    " + cmd, header, table(args, results),
                         "Ratios > 1 mean ours is faster.", "\n".join(verdicts(results))])


def readme_section(path: Path, args, results: dict[str, dict], header: str) -> None:
    """Rewrite bench/README.md's "## Tokenizer": the intro, then one block per input size (this
    run's replaces the block of the same input name; others are kept), then the notes."""
    cmd = (f".venv/bin/python bench/tokenizer.py --input {args.orig_input} --vocab-size {args.vocab_size} "
           f"--threads {args.threads} --repeat {args.repeat}" + (f" --tile-mb {args.tile_mb}" if args.tile_mb else "")
           + (f" --skip {args.skip}" if args.skip else "") + " --readme bench/README.md")
    text = path.read_text() if path.exists() else ""
    start = text.find("\n## Tokenizer\n")
    old = text[start:text.find("\n## ", start + 1)] if start >= 0 else ""
    blocks, others = {}, []
    for part in old.split("\n### ")[1:]:
        name = part.split("\n", 1)[0]
        if "MB)" in name:
            body = part.split("\n- Training (C):", 1)[0].rstrip()
            blocks[name.split(" (")[0]] = "### " + body
        else:  # another script's subsection (tokenizer_custom.py's patterns): kept, after the notes
            others.append("### " + part.strip("\n"))
    blocks[Path(args.input).name] = block(args, results, header, cmd)
    order = sorted(blocks, key=lambda n: ("tiled" in n, n))
    replace_section(path, "\n\n".join(["## Tokenizer", INTRO] + [blocks[n] for n in order] + [NOTES] + others),
                    "Tokenizer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True)
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--threads", type=int, default=2, help="threads/processes for training (encoding uses 1)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per task; the fastest is reported")
    parser.add_argument("--readme", type=Path, help="rewrite the '## Tokenizer' section of this file")
    parser.add_argument("--tile-mb", type=int, default=0, help="repeat the input to about this many MB first")
    parser.add_argument("--skip", default="", help="comma-separated tasks to leave out (e.g. encode/ours-python)")
    parser.add_argument("--task", choices=TASKS, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.task:
        print(json.dumps(run_task(args)))
        return
    load_before = os.getloadavg()[0]
    args.orig_input = args.input
    with tempfile.TemporaryDirectory(prefix="lmdata-bench-") as workdir:
        args.workdir = workdir
        if args.tile_mb:
            data = Path(args.input).read_bytes()
            tiled = Path(workdir) / f"tiled-{args.tile_mb}mb.txt"
            with open(tiled, "wb") as f:
                for _ in range(max(1, args.tile_mb * 1_000_000 // len(data))):
                    f.write(data)
            args.input = str(tiled)
        args.input_mb = Path(args.input).stat().st_size / 1e6
        results = {}
        for task in [t for t in TASKS if t not in args.skip.split(",")]:
            results[task] = measure(args, task)
            print(f"{task}: {results[task]['seconds']:.2f} s", file=sys.stderr, flush=True)
        size = args.input_mb
        header = (f"Input `{args.input}` ({size:.1f} MB), vocab {args.vocab_size}, best of {args.repeat}, "
                  f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; 1-min load average {load_before:.1f} before, "
                  f"{os.getloadavg()[0]:.1f} after (other jobs share these cores: wall times are noisy, CPU s less so).")
        print(header + "\n\n" + table(args, results))
        if args.readme:
            readme_section(args.readme, args, results, header)


if __name__ == "__main__":
    main()
