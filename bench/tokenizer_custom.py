"""Encode with a custom pre-tokenizer regex (not gpt2/cl100k/o200k): ours against tiktoken and HF tokenizers.

For each pattern (Llama 3's, a Tekken-like one) a tokenizer of --vocab-size ranks is trained on the
input with that pattern (our C trainer; the custom regex runs in lmdata's C matcher), then each
encoder encodes the documents (split at <|endoftext|>, specials not looked for), on 1 and 2 threads,
each run a fresh process pinned to 1 or 2 cores, best of --repeat:
  ours      Tokenizer.encode_arrays(docs, num_workers=k): what ingest's encoders call
  ours-regex  the same with the pattern kept off the C matcher (the `regex` module, GIL held: the
            path custom patterns took before it; encode_arrays then uses one thread)
  tiktoken  tiktoken.Encoding(pat_str=the pattern, mergeable_ranks=our vocab).encode_ordinary_batch(docs, k)
  hf        tokenizers loading the tokenizer.json our save writes (Split(Regex) + ByteLevel(use_regex=False)),
            encode_batch(docs) with RAYON_NUM_THREADS=k
The table says whether each one's ids equal ours.

    .venv/bin/python bench/tokenizer_custom.py --input ../shared/corpus/english-prose.txt --repeat 3 \\
        --workdir /tmp/lmdata-bench-custom
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EOT = "<|endoftext|>"
PATTERNS = {
    "llama3": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+"),
    "tekken": (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
               r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
TOOLS = ["ours", "ours-regex", "tiktoken", "hf"]


def _docs(path: str) -> list[str]:
    return [d for d in Path(path).read_text(encoding="utf-8").split(EOT) if d]


def _digest(tokens) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(np.asarray(tokens, dtype=np.uint32), "<u4").data).hexdigest()[:12]


def _ours(d: Path, docs: list[str], threads: int, on_c: bool = True):
    from lmdata.tokenizer import Tokenizer, patterns

    if not on_c:
        patterns.Pattern.c_program = property(lambda self: None)  # the regex module's path
    tok = Tokenizer.load(d)
    if tok.gil_free != on_c:
        sys.exit(f"{d}: gil_free is {tok.gil_free}; expected {on_c} (is the pattern on the C matcher?)")
    return lambda: tok.encode_arrays(docs, num_workers=threads).tokens


def _tiktoken(d: Path, docs: list[str], threads: int):
    import tiktoken

    from lmdata.tokenizer import Tokenizer

    tok = Tokenizer.load(d)
    ranks = {b: i for i, b in tok.vocab.items() if i not in tok.special_ids.values()}
    enc = tiktoken.Encoding("lmdata-bench", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens={})
    return lambda: [i for ids in enc.encode_ordinary_batch(docs, num_threads=threads) for i in ids]


def _hf(d: Path, docs: list[str], threads: int):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    return lambda: [i for enc in tok.encode_batch(docs, add_special_tokens=False) for i in enc.ids]


def run_task(args) -> dict:
    """One encoder, one thread count, in this (fresh, pinned) process."""
    threads = args.run_threads
    os.sched_setaffinity(0, set(range(threads)))
    docs = _docs(args.input)
    tools = {"ours": _ours, "ours-regex": lambda *a: _ours(*a, on_c=False), "tiktoken": _tiktoken, "hf": _hf}
    encode = tools[args.tool](Path(args.tokdir), docs, threads)
    start, cpu = time.perf_counter(), time.process_time()
    ids = encode()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu": cpu, "ids": _digest(ids), "n_ids": len(ids)}


def train(args, name: str, workdir: Path) -> Path:
    """Our tokenizer of --vocab-size with the pattern, trained once (kept in --workdir)."""
    from lmdata.tokenizer import Tokenizer
    from lmdata.tokenizer.train import train_bpe_stats

    d = workdir / f"{name}-{args.vocab_size}"
    if not (d / "tokenizer.json").exists():
        start = time.perf_counter()
        vocab, merges, stats = train_bpe_stats(args.input, args.vocab_size, [EOT], pattern=PATTERNS[name], workers=2)
        print(f"trained {name}: {len(vocab)} tokens in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        Tokenizer(vocab, merges, [EOT], pattern=PATTERNS[name]).save(d)
    return d


def measure(args, tool: str, tokdir: Path, threads: int) -> dict:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true" if threads > 1 else "false")
    runs = []
    for _ in range(args.repeat):
        cmd = [sys.executable, __file__, "--tool", tool, "--run-threads", str(threads), "--input", args.input,
               "--tokdir", str(tokdir)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{tool} on {threads} threads failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda r: r["seconds"])


def table(mb: float, results: dict) -> str:
    rows = ["| pattern | encoder | threads | wall s | MB/s | CPU s | ours vs this: wall | ids equal ours |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for (name, tool, threads), r in results.items():
        ours = results[(name, "ours", threads)]
        ratio = "—" if tool == "ours" else f"{r['seconds'] / ours['seconds']:.2f}x"
        same = "—" if tool == "ours" else ("yes" if r["ids"] == ours["ids"] else "NO")
        rows.append(f"| {name} | {tool} | {threads} | {r['seconds']:.2f} | {mb / r['seconds']:.1f} | {r['cpu']:.2f} | "
                    f"{ratio} | {same} |")
    for name in dict.fromkeys(k[0] for k in results):
        one, two = results[(name, "ours", 1)], results[(name, "ours", 2)]
        rows.append(f"| {name} | ours, 2 threads vs 1 | | | {one['seconds'] / two['seconds']:.2f}x | | | |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True)
    p.add_argument("--vocab-size", type=int, default=130072)
    p.add_argument("--patterns", default="llama3,tekken")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workdir", default=None, help="keeps the trained tokenizers between runs")
    p.add_argument("--tool", help=argparse.SUPPRESS)
    p.add_argument("--run-threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tool:
        print(json.dumps(run_task(args)))
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lmdata-bench-custom-"))
    mb = Path(args.input).stat().st_size / 1e6
    before = os.getloadavg()[0]
    results = {}
    for name in args.patterns.split(","):
        tokdir = train(args, name, workdir)
        for threads in (1, 2):
            for tool in TOOLS:  # interleaved: ours, then each peer, at the same load
                results[(name, tool, threads)] = measure(args, tool, tokdir, threads)
                print(name, tool, threads, results[(name, tool, threads)], file=sys.stderr)
    out = table(mb, results)
    head = (f"Input `{args.input}` ({mb:.1f} MB), vocab {args.vocab_size}, best of {args.repeat}, "
            f"{time.strftime('%Y-%m-%d')}; 1-min load average {before:.1f} before, {os.getloadavg()[0]:.1f} after.")
    print(head + "\n\n" + out)  # (put in bench/README.md, "### Custom pre-tokenizer patterns", by hand)


if __name__ == "__main__":
    main()
