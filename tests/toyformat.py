"""A toy format for the data tests: one .npy token file, read through a lazy memmap.

``NpyReader`` implements the reader protocol (``n_tokens``, ``windows``, ``check``,
``document``) and holds only a path, like the real readers, so it exercises pickling to
spawn/forkserver workers. ``FailingReader`` raises (or kills its process) on chosen
offsets, to test error reporting.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from lmdata.errors import LmdataError

EOT = 99


class NpyReader:
    """Reader protocol over ``tokens.npy``: opens the file lazily in each process."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.n_tokens = int(np.load(self.path, mmap_mode="r").shape[0])
        self._tokens = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "n_tokens": self.n_tokens, "_tokens": None}

    def _open(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.load(self.path, mmap_mode="r")
        return self._tokens

    def check(self) -> None:
        if not Path(self.path).is_file():
            raise LmdataError(f"{self.path}: missing")

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        starts = np.asarray(starts, dtype=np.int64)
        if len(starts) and (starts.min() < 0 or starts.max() + length > self.n_tokens):
            raise IndexError(f"window outside [0, {self.n_tokens})")
        return self._open()[starts[:, None] + np.arange(length)].astype(np.int64)

    def document(self, doc_id: int) -> np.ndarray:
        tokens = np.asarray(self._open())
        ends = np.flatnonzero(tokens == EOT) + 1
        starts = np.concatenate([[0], ends[:-1]])
        return tokens[starts[doc_id]:ends[doc_id]].astype(np.int64)

    def __repr__(self) -> str:
        return f"NpyReader({self.path})"


class FailingReader(NpyReader):
    """Fails windows covering token ``bad``: raises, or with ``die=True`` exits the process."""

    def __init__(self, path: Path, bad: int, die: bool = False) -> None:
        super().__init__(path)
        self.bad, self.die = bad, die

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "bad": self.bad, "die": self.die}

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        starts = np.asarray(starts, dtype=np.int64)
        if np.any((starts <= self.bad) & (self.bad < starts + length)):
            if self.die:  # give the main process time to block in next(), then die hard
                time.sleep(2.0)
                os._exit(3)
            raise LmdataError(f"shard tokens-00000.bin: checksum mismatch at token {self.bad}")
        return super().windows(starts, length)


class ForkUnsafeReader(NpyReader):
    """A reader whose (pretend) library breaks in forked children, like Lance's."""

    fork_safe = False


def make_tokens(n_tokens: int, seed: int = 0, vocab: int = 98) -> np.ndarray:
    """Random ids below ``vocab`` with an EOT roughly every 50 tokens; the last is EOT."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=n_tokens).astype(np.uint16)
    tokens[rng.random(n_tokens) < 0.02] = EOT
    tokens[-1] = EOT
    return tokens


def write_tokens(path: Path, tokens: np.ndarray) -> NpyReader:
    np.save(path, tokens)
    return NpyReader(path)




def rank_main(rank: int, world_size: int, path: str, init_file: str, seq_len: int, batch_size: int, out: str) -> None:
    """One rank of a 2-process test: joins a gloo group, lets make_loader find rank/world.

    Writes the sample ids it saw (first token // seq_len with index tokens) to ``out``.
    """
    import json

    import torch.distributed as dist

    from lmdata.data import TokenDataset, make_loader

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        loader = make_loader(TokenDataset(NpyReader(Path(path)), seq_len), batch_size, seed=4)
        assert loader.state_dict()["rank"] == rank and loader.state_dict()["world_size"] == world_size
        ids = [int(x) // seq_len for inputs, _ in loader for x in inputs[:, 0]]
        Path(out).write_text(json.dumps(ids))
    finally:
        dist.destroy_process_group()


class ToyWriter:
    """The toy format's writer: one ``toy-XXXXX.npy`` per shard (registered from the tests)."""

    def __init__(self, format_dir: Path, dtype: np.dtype) -> None:
        self.format_dir, self.dtype = Path(format_dir), np.dtype(dtype)
        self.format_dir.mkdir(parents=True, exist_ok=True)

    def completed(self) -> dict:
        return {}

    def write_shard(self, index, tokens, doc_starts, first_doc, first_token):
        from lmdata.store.checksum import file_info
        from lmdata.store.protocol import ShardInfo

        name = f"toy-{index:05d}.npy"
        np.save(self.format_dir / name, np.asarray(tokens, dtype=self.dtype))
        return ShardInfo(name=f"{index:05d}", n_docs=len(doc_starts) - 1, n_tokens=len(tokens),
                         first_doc=first_doc, first_token=first_token, files=[file_info(self.format_dir, name)])

    def finish(self, shards) -> None:
        pass

    def cleanup_partial(self) -> None:
        pass


class ToyReader(NpyReader):
    """The toy format's reader: the shards concatenated once per process, on first use."""

    def __init__(self, format_dir: Path, shards: list, dtype: np.dtype) -> None:
        self.paths = [str(Path(format_dir) / s.files[0].path) for s in shards]
        self.path = self.paths[0]
        self.n_tokens = sum(s.n_tokens for s in shards)
        self._tokens = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}

    def _open(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.concatenate([np.load(p, mmap_mode="r") for p in self.paths])
        return self._tokens


def build_store(path: Path, formats: list[str], n_tokens: int = 30_000, shard_tokens: int = 9_000,
                eot: int = 50_256, seed: int = 0) -> np.ndarray:
    """A one-split store written with each format's writer; returns the token stream."""
    from lmdata.store.manifest import Manifest, SplitInfo, write_manifest
    from lmdata.store.registry import get_format

    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < n_tokens:
        doc = rng.integers(0, eot, size=int(rng.integers(1, 700)))
        doc[-1] = eot
        docs.append(doc.astype(np.uint16))
        total += len(doc)
    groups, cur = [], []
    for doc in docs:  # shards end at document boundaries
        cur.append(doc)
        if sum(map(len, cur)) >= shard_tokens:
            groups, cur = groups + [cur], []
    groups += [cur] if cur else []
    info = SplitInfo(n_docs=len(docs), n_tokens=total)
    for fmt in formats:
        options = {"fragment_tokens": 2 * shard_tokens + 2_000} if fmt == "lance" else {}  # fragments of 2 shards
        writer = get_format(fmt).writer(path / "train" / fmt, np.dtype(np.uint16), **options)
        shards, first_doc, first_token = [], 0, 0
        for i, group in enumerate(groups):
            tokens = np.concatenate(group)
            starts = np.concatenate([[0], np.cumsum([len(d) for d in group])]).astype(np.int64)
            shards.append(writer.write_shard(i, tokens, starts, first_doc, first_token))
            first_doc, first_token = first_doc + len(group), first_token + len(tokens)
        info.formats[fmt] = writer.finish(shards) or shards  # Lance regroups shards into fragments
    write_manifest(path, Manifest(tokenizer_hash="0" * 64, vocab_size=eot + 1, dtype="uint16", eot_id=eot,
                                  shard_tokens=shard_tokens, splits={"train": info}))
    return np.concatenate(docs).astype(np.int64)


class SiblingKillerReader(NpyReader):
    """Issue 19: worker 1 stalls in its first read; worker 0, on the token ``trigger``, SIGKILLs it.

    So worker 1 dies mid-read with a further read queued for it (what the OOM killer does to
    a worker whose reads are prefetched); each worker records its pid under ``pid_dir``.
    """

    def __init__(self, path: Path, trigger: int, pid_dir: Path) -> None:
        super().__init__(path)
        self.trigger, self.pid_dir = trigger, str(pid_dir)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "trigger": self.trigger, "pid_dir": self.pid_dir}

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        import signal

        import torch

        worker = torch.utils.data.get_worker_info().id
        mine = Path(self.pid_dir) / f"worker-{worker}"
        first = not mine.exists()
        mine.write_text(str(os.getpid()))
        starts = np.asarray(starts, dtype=np.int64)
        if worker == 1 and first:
            time.sleep(30.0)  # killed long before this ends
        if worker == 0 and np.any((starts <= self.trigger) & (self.trigger < starts + length)):
            other = Path(self.pid_dir) / "worker-1"
            for _ in range(200):
                if other.exists():
                    break
                time.sleep(0.05)
            time.sleep(0.3)  # worker 1 is inside its stalled read now
            os.kill(int(other.read_text()), signal.SIGKILL)
            time.sleep(2.0)
        return super().windows(starts, length)


class FreezeRecordingReader(NpyReader):
    """Records, per reading process, how many objects its cyclic GC has frozen (``gc.freeze``)."""

    def __init__(self, path: Path, out_dir: Path) -> None:
        super().__init__(path)
        self.out_dir = str(out_dir)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "out_dir": self.out_dir}

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        import gc

        (Path(self.out_dir) / str(os.getpid())).write_text(str(gc.get_freeze_count()))
        return super().windows(starts, length)
