"""`lmdata batch RUN --step N`: the sequences a step trained on, recomputed from the checkpoints,
compared with the batches the trainer really received (captured at train_step)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from samples import run_cli

import lmdata.train.loop as loop
from lmdata.config import TrainConfig
from lmdata.data.loader import make_loader
from lmdata.store import open_store
from lmdata.train.batch_docs import step_batch

BASE = dict(batch_size=4, grad_accum=2, seq_len=64, warmup=2, ckpt_every=2, keep=0, log_every=2,
            val_split="none", progress=False)


def train_capturing(monkeypatch, **kw) -> dict[int, list[np.ndarray]]:
    """Train per ``kw``; each step's micro-batch inputs ``[B, L]`` as train_step received them (step from 1)."""
    seen: dict[int, list[np.ndarray]] = {}
    real = loop.train_step

    def recording(forward, optimizer, micro_batches, *args, **kwargs):
        seen[len(seen) + 1] = [b[0].numpy().copy() for b in micro_batches]
        return real(forward, optimizer, micro_batches, *args, **kwargs)

    monkeypatch.setattr(loop, "train_step", recording)
    loop.train(TrainConfig(**{**BASE, **kw}), log=lambda line: None)
    return seen


def inputs_of(target, step: int, rank: int = 0) -> list[np.ndarray]:
    sb = step_batch(target, step, rank)
    rows = [np.stack([q.tokens[:-1] for q in sb.sequences if q.micro == m]) for m in range(sb.grad_accum)]
    return rows


@pytest.mark.parametrize("workers", [0, 2])
def test_each_step_is_the_batch_the_trainer_saw(sample_store, tmp_path, monkeypatch, workers):
    out = tmp_path / "run"
    seen = train_capturing(monkeypatch, store=str(sample_store), out=str(out), steps=6, workers=workers,
                           format="parquet" if workers else "")
    for step in (1, 2, 3, 5, 6):  # before any checkpoint, on one, between two
        got = inputs_of(out, step)
        assert len(got) == 2 and all(np.array_equal(g, s) for g, s in zip(got, seen[step])), step
    ckpt2 = out / "checkpoints" / "ckpt-00000002.pt"
    assert all(np.array_equal(g, s) for g, s in zip(inputs_of(ckpt2, 6), seen[6]))  # one checkpoint file
    assert all(np.array_equal(g, s) for g, s in zip(inputs_of(ckpt2, 1), seen[1]))  # before it: from the start
    sb = step_batch(out, 5)
    store = open_store(sample_store)
    for q in sb.sequences:  # each window's documents: where the window's first and last token lie
        docs = [d.doc_id for d in q.docs]
        assert docs == list(range(docs[0], docs[-1] + 1))
        assert all(d.source == str(store.manifest.splits["train"].sources[0]["path"]) and d.unit == "byte"
                   and d.offset >= 0 for d in q.docs)
    assert str(sb.checkpoint).endswith("ckpt-00000004.pt") and sb.first_batch == 8


def test_a_mixture_names_each_sequences_source(sample_store, tmp_path, monkeypatch):
    out = tmp_path / "mix"
    mix = [{"store": str(sample_store), "split": "train", "weight": 0.7},
           {"store": str(sample_store), "split": "validation", "weight": 0.3}]
    seen = train_capturing(monkeypatch, mix=mix, out=str(out), steps=3)
    for step in (1, 3):
        assert all(np.array_equal(g, s) for g, s in zip(inputs_of(out, step), seen[step]))
    splits = {q.split for step in (1, 2, 3) for q in step_batch(out, step).sequences}
    assert splits == {"train", "validation"}


def test_unknown_source_and_bad_input(sample_store, tmp_path, capsys):
    old = tmp_path / "old-store"
    shutil.copytree(sample_store, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for split in manifest["splits"].values():
        split.pop("provenance", None)  # as a store written before lmdata recorded sources
    (old / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "run"
    args = ["--batch-size", "4", "--seq-len", "64", "--warmup", "1", "--val-split", "none", "--no-progress", "-q"]
    assert run_cli(["train", "--store", str(old), "--out", str(out), "--steps", "2", *args], capsys)[0] == 0
    code, text, err = run_cli(["batch", str(out), "--step", "2"], capsys)
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0].startswith("step 2, rank 0 of 1: 4 sequences") and lines[1].split()[:3] == ["seq", "micro", "sample"]
    assert len(lines) >= 6 and all("unknown: the store was ingested before" in line for line in lines[2:])
    for argv, message in ((["--step", "0"], "--step 0: steps count from 1"),
                          (["--step", "1", "--rank", "1"], "--rank 1: the run had 1 rank(s)"),
                          (["--step", "3"], "--step 3: the run trains 2 steps; use --step 1..2")):
        code, _, err = run_cli(["batch", str(out), *argv], capsys)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli(["batch", str(tmp_path), "--step", "1"], capsys)
    assert code == 1 and "no checkpoints" in err


def test_upcoming_follows_the_loader_across_epochs(sample_store):
    ds = open_store(sample_store).dataset("validation", 64)
    loader = make_loader(ds, 3, seed=5, batches_per_read=2)
    per_epoch = len(loader)
    handed = [b[0].numpy() for _ in range(3) for b in loader]  # three epochs, as iterated
    fresh = make_loader(ds, 3, seed=5)
    for skip in (0, per_epoch - 1, per_epoch + 1, 2 * per_epoch):
        (_, _, idx), = fresh.upcoming(skip, 1)
        assert np.array_equal(ds.batch(idx)[:, :-1], handed[skip]), skip
    resumed = make_loader(ds, 3, seed=5)
    it = iter(resumed)
    next(it)
    next(it)
    resumed_state = resumed.state_dict()
    again = make_loader(ds, 3, seed=5)
    again.load_state_dict(resumed_state)
    (_, _, idx), = again.upcoming(-1, 1)  # back within the epoch
    assert np.array_equal(ds.batch(idx)[:, :-1], handed[1])


CAPTURE = """
import os, sys
import numpy as np
import lmdata.train.loop as loop
from lmdata.config import TrainConfig

store, out, dump = sys.argv[1:4]
real, seen = loop.train_step, []

def recording(forward, optimizer, micro_batches, *args, **kwargs):
    seen.append(np.stack([b[0].numpy() for b in micro_batches]))
    return real(forward, optimizer, micro_batches, *args, **kwargs)

loop.train_step = recording
loop.train(TrainConfig(store=store, out=out, steps=4, batch_size=4, seq_len=64, warmup=1, ckpt_every=2, keep=0,
                       log_every=1, val_split="none", progress=False, log=["jsonl", "tensorboard"]), log=lambda l: None)
np.save(f"{dump}-{os.environ['RANK']}.npy", np.stack(seen))
"""


def test_torchrun_ranks_and_rank_zero_logs_alone(sample_store, tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    script, out, dump = tmp_path / "capture.py", tmp_path / "ddp", tmp_path / "seen"
    script.write_text(CAPTURE)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(sample_store),
                           str(out), str(dump)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        seen = np.load(f"{dump}-{rank}.npy")  # [steps, grad_accum, B, L]
        for step in (1, 3, 4):
            assert np.array_equal(np.stack(inputs_of(out, step, rank)), seen[step - 1]), (rank, step)
    assert not np.array_equal(np.load(f"{dump}-0.npy"), np.load(f"{dump}-1.npy"))
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1  # rank 0 alone writes
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4
    # elastic: killed after step 4's checkpoint was lost, resumed on one rank (--grad-accum 1 -> 2)
    (out / "checkpoints" / "ckpt-00000004.pt").unlink()
    resumed = train_capturing(monkeypatch, store=str(sample_store), out=str(out), steps=6, grad_accum=1,
                              resume=True, log_every=1)
    for k, step in enumerate((3, 4, 5, 6), start=1):
        got = inputs_of(out, step)
        assert len(got) == 2 and all(np.array_equal(g, r) for g, r in zip(got, resumed[k])), step
