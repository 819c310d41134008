"""What the bench scripts share: where the corpus is, a cached tokenizer, their README sections."""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

# The workspace's corpora sit beside the checkout (../shared/corpus); scripts take --corpus too.
SHARED_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
CORPUS = SHARED_CORPUS / "english-prose.txt"
TRAIN_CORPUS = SHARED_CORPUS / "english-prose-5mb.txt"


CACHED_TOKENIZER = Path(tempfile.gettempdir()) / "lmdata-bench-tokenizer-8192"


def add_ingest_args(parser: argparse.ArgumentParser) -> None:
    """The flags both ingest benches take: corpus, cached tokenizer, its vocab size, workers."""
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)


def add_store_args(parser: argparse.ArgumentParser, work: str | Path = "/tmp/lmdata-scale") -> None:
    """The flags of the benches that read tiled stores: corpus, cached tokenizer, the stores' folder."""
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    parser.add_argument("--work", type=Path, default=Path(work))


def steady_seconds(batches: "Iterator[Any]", warmup: int, timed: int) -> float:
    """Seconds for ``timed`` batches of ``batches`` after ``warmup`` untimed ones (the cells' steady rate)."""
    import time

    for _ in range(warmup):
        next(batches)
    start = time.perf_counter()
    for _ in range(timed):
        next(batches)
    return time.perf_counter() - start


def compile_lmdata() -> None:
    """Write lmdata's bytecode before any cell runs, as pip does for a package it installs.

    A first batch counts from a fresh process's start. The peers run from the bytecode pip
    wrote; lmdata, installed editable, has bytecode only once a run wrote it, and a shell with
    ``PYTHONDONTWRITEBYTECODE`` set (this VM's) never does: every cell then compiled lmdata's
    modules from source, +0.06-0.08 s of its first batch (Lance, 2 workers, 182 shards)."""
    import compileall

    import lmdata

    compileall.compile_dir(Path(lmdata.__file__).parent, quiet=1)


def ensure_tokenizer(path: Path, vocab_size: int = 8192, corpus: Path = TRAIN_CORPUS) -> Path:
    """A BPE tokenizer trained once on ``corpus`` and cached at ``path``."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        from lmdata.tokenizer import Tokenizer, train_bpe

        vocab, merges = train_bpe(str(corpus), vocab_size, ["<|endoftext|>"])
        Tokenizer(vocab, merges, ["<|endoftext|>"]).save(path)
    return path


def run_child(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``; a failed child is one line with its own last
    error line (a bare CalledProcessError had hidden it: a store too small for the batches, say)."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "(no message)")
        what = "a measuring process" if len(cmd) < 2 or cmd[1] == "-c" else Path(cmd[1]).name
        raise SystemExit(f"{what} failed (exit {done.returncode}): {last}")
    return done


RESULTS = Path(__file__).resolve().parent / "results"  # the JSON the recorded tables were made from


def add_results_arg(parser: argparse.ArgumentParser) -> None:
    """``--results DIR``: where the run's JSON goes (default bench/results, whose files the README's tables
    came from: a trial run elsewhere leaves them alone)."""
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="directory for the JSON results (default: bench/results, the recorded ones)")


HAND_WRITTEN = "<!-- written by hand from here on: kept when the tables above are generated again -->"


def replace_section(path: Path, body: str, first: str, last: str | None = None) -> None:
    """Put ``body`` (which starts with ``## first``) in place of the ``## first`` .. ``## last``
    block of ``path`` (up to the next ``## `` heading after ``## last``), or append it. What the
    old block holds from a ``HAND_WRITTEN`` line on (the analysis of its tables) is kept after the
    new body: a rerun with ``--readme`` had dropped it with the tables."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n" + body.strip() + "\n"
    start = text.find(f"\n## {first}\n")
    if start < 0:
        text = text.rstrip("\n") + "\n" + block
    else:
        tail_from = text.find(f"\n## {last}\n", start) if last else -1
        end = text.find("\n## ", (tail_from if tail_from >= 0 else start) + 1)
        old = text[start:end] if end >= 0 else text[start:]
        kept = old.find(f"\n{HAND_WRITTEN}\n")
        if kept >= 0 and HAND_WRITTEN not in block:
            block += "\n" + old[kept + 1:].strip("\n") + "\n"
        text = text[:start] + block + (text[end:] if end >= 0 else "")
    path.write_text(text)


def tiled_corpus(work: Path, corpus: Path, tiles: int) -> Path:
    """``corpus`` repeated ``tiles`` times under ``work`` (written once, atomically): a store as
    large as users have from the text we may use; the token stream repeats, the store grows."""
    if tiles == 1:
        return corpus
    out = work / f"{corpus.stem}-x{tiles}.txt"
    if not out.is_file() or out.stat().st_size != tiles * corpus.stat().st_size:
        data = corpus.read_bytes()
        tmp = out.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.writelines(data for _ in range(tiles))
        os.replace(tmp, out)
    return out


def tree_pss_mb(pid: int | None = None, field: str = "Pss") -> float:
    """PSS (MB) of process ``pid`` (this one by default) and every process below it: a loader's main
    process and its workers (a forkserver's workers are its grandchildren), shared pages counted
    once. ``field``: another line of ``smaps_rollup`` (``Pss_Anon``, ``Pss_File``)."""
    pid = os.getpid() if pid is None else pid

    def pss(p: int | str) -> float:
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                return sum(int(line.split()[1]) for line in fh if line.startswith(f"{field}:")) / 1024
        except OSError:
            return 0.0

    def parent(p: str) -> int | None:
        try:
            with open(f"/proc/{p}/stat") as fh:
                return int(fh.read().split(") ")[-1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while we listed
            return None

    children: dict[int, list[str]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit() and (up := parent(p)) is not None:
            children.setdefault(up, []).append(p)
    tree, todo = [], [str(pid)]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(int(p), []))
    return sum(pss(p) for p in tree)
