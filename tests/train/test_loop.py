"""`train` end to end on the sample store: learning, exact resume, refusals, outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.train.checkpoint import list_checkpoints, read_checkpoint
from lmdata.config import TrainConfig
from lmdata.train.loop import train


def cfg(store: Path, out: Path, **kw) -> TrainConfig:
    base = dict(store=str(store), out=str(out), batch_size=8, steps=20, warmup=5, eval_every=10, eval_batches=2,
                ckpt_every=10, log_every=5, progress=False)
    return TrainConfig(**{**base, **kw})


def entropies(tokens: np.ndarray) -> tuple[float, float]:
    """Unigram entropy and bigram conditional entropy H(x_t | x_t-1), nats/token."""
    counts = np.bincount(tokens)
    p = counts[counts > 0] / counts.sum()
    h1 = float(-(p * np.log(p)).sum())
    V = int(tokens.max()) + 1
    pairs = np.bincount(tokens[:-1].astype(np.int64) * V + tokens[1:], minlength=V * V).reshape(V, V)
    prev = pairs.sum(axis=1, keepdims=True)
    nz = pairs > 0
    h2 = float(-(pairs[nz] * np.log((pairs / np.maximum(prev, 1))[nz])).sum() / pairs.sum())
    return h1, h2


def test_tiny_model_learns_beyond_unigram_statistics(sample_store, tmp_path):
    store = open_store(sample_store)
    tokens = store.reader("train").windows(np.array([0]), store.n_tokens("train"))[0]
    h1, h2 = entropies(tokens)
    # A model that learned nothing but token frequencies scores h1; knowing the previous
    # token is worth h1 - h2. Demand at least half of that on held-out text.
    margin = (h1 - h2) / 2
    assert margin > 0.1
    result = train(cfg(sample_store, tmp_path / "run", steps=200, batch_size=16, warmup=20, eval_every=200,
                       ckpt_every=200, log_every=50, lr=3e-3))  # ~10 s alone on 2 cores
    assert result.val_loss is not None
    assert result.val_loss < h1 - margin, (result.val_loss, h1, h2)
    assert np.mean(result.losses[-20:]) < h1 - margin
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [50, 100, 150, 200]
    assert [r["step"] for r in records if r["split"] == "validation"] == [200]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "data_wait"} <= set(records[0])
    assert 0 <= records[0]["data_wait"] < 1
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


class Crash(Exception):
    pass


def crash_at(step: int):
    def log(msg: str) -> None:
        if msg.startswith(f"step {step:>6}"):
            raise Crash(msg)
    return log


@pytest.mark.parametrize("workers,doc_mask", [(0, False), (1, True)])
def test_resume_continues_exactly(sample_store, tmp_path, workers, doc_mask):
    kw = dict(steps=30, workers=workers, doc_mask=doc_mask, keep=2)
    full = train(cfg(sample_store, tmp_path / "full", **kw))
    with pytest.raises(Crash):  # dies after step 25; the newest checkpoint is step 20
        train(cfg(sample_store, tmp_path / "cut", **kw), log=crash_at(25))
    assert [p.name for p in list_checkpoints(tmp_path / "cut" / "checkpoints")] == ["ckpt-00000010.pt", "ckpt-00000020.pt"]
    resumed = train(cfg(sample_store, tmp_path / "cut", resume=True, **kw))
    assert resumed.start_step == 20
    assert resumed.losses == full.losses[20:]  # bit for bit
    assert resumed.val_loss == full.val_loss
    metrics = [(tmp_path / d / "metrics.jsonl").read_text() for d in ("full", "cut")]
    strip = [[{k: v for k, v in json.loads(l).items() if k in ("step", "split", "loss")} for l in m.splitlines()] for m in metrics]
    assert strip[0] == strip[1]
    assert [p.name for p in list_checkpoints(tmp_path / "cut" / "checkpoints")] == ["ckpt-00000020.pt", "ckpt-00000030.pt"]


def test_batches_per_read_changes_how_batches_are_read_not_what_is_learned(sample_store, tmp_path, monkeypatch):
    from lmdata.data import loader as loader_module

    asked = []
    real = loader_module.make_loader
    monkeypatch.setattr(loader_module, "make_loader", lambda *a, **kw: asked.append(kw.get("batches_per_read")) or real(*a, **kw))
    one = train(cfg(sample_store, tmp_path / "one", steps=12, batches_per_read=1, eval_every=0, ckpt_every=0))
    three = train(cfg(sample_store, tmp_path / "three", steps=12, batches_per_read=3, eval_every=0, ckpt_every=0))
    assert one.losses == three.losses and one.val_loss == three.val_loss
    assert 1 in asked and 3 in asked  # the training loaders were built with each value


def test_batches_per_read_defaults_agree():
    from lmdata.cli.bench import bench
    from lmdata.config import BenchConfig
    from lmdata.data.loader import BATCHES_PER_READ

    cli_default = next(p.default for p in bench.params if p.name == "batches_per_read")
    assert TrainConfig().batches_per_read == BenchConfig(store=".").batches_per_read == BenchConfig().batches_per_read \
        == cli_default == BATCHES_PER_READ


def test_checkpoint_contents_load_weights_only(sample_store, tmp_path):
    train(cfg(sample_store, tmp_path / "run", steps=10))
    payload = read_checkpoint(tmp_path / "run" / "checkpoints" / "ckpt-00000010.pt")
    assert payload["step"] == 10 and payload["loader"][0]["batch"] == 10
    assert payload["meta"]["tokenizer_hash"] == open_store(sample_store).manifest.tokenizer_hash
    assert {"python", "numpy", "torch", "cuda"} <= set(payload["rng"])
    assert "layers.0.attn.q_proj.weight" in payload["model"]


def test_a_log_line_whose_window_spans_the_checkpoint_logs_the_same_mean_after_resume(sample_store, tmp_path):
    """With --log-every 3 and a checkpoint at step 20, the line at step 21 averages steps 19-21: after a
    resume it had averaged 21 alone (the window's first steps were in the killed process)."""
    kw = dict(steps=24, log_every=3)
    train(cfg(sample_store, tmp_path / "full", **kw))
    with pytest.raises(Crash):
        train(cfg(sample_store, tmp_path / "cut", **kw), log=crash_at(24))
    train(cfg(sample_store, tmp_path / "cut", resume=True, **kw))
    lines = [[json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
             for d in ("full", "cut")]
    train_loss = [[(r["step"], r["loss"]) for r in m if r["split"] == "train"] for m in lines]
    assert (21, train_loss[0][6][1]) == train_loss[0][6] and train_loss[0] == train_loss[1]


def test_resume_refuses_a_store_with_another_tokenizer(sample_store, tmp_path):
    train(cfg(sample_store, tmp_path / "run", steps=10))
    other = tmp_path / "other"
    shutil.copytree(sample_store, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"]["hash"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LmdataError, match="tokenizer"):
        train(cfg(other, tmp_path / "run", steps=20, resume=True))


def test_truncated_checkpoint_is_a_clear_error(sample_store, tmp_path):
    train(cfg(sample_store, tmp_path / "run", steps=10))
    ckpt = tmp_path / "run" / "checkpoints" / "ckpt-00000010.pt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    with pytest.raises(LmdataError, match="ckpt-00000010.pt.*truncated"):
        train(cfg(sample_store, tmp_path / "run", steps=20, resume=True))


def test_resume_with_another_seed_is_refused(sample_store, tmp_path):
    """It had been ignored silently: the state's seed wins, so --seed 5 changed nothing."""
    train(cfg(sample_store, tmp_path / "run", steps=10))
    with pytest.raises(LmdataError, match="has seed 0 but this run has --seed 5; resume with --seed 0"):
        train(cfg(sample_store, tmp_path / "run", steps=20, resume=True, seed=5))


def test_existing_run_needs_resume(sample_store, tmp_path):
    train(cfg(sample_store, tmp_path / "run", steps=10))
    with pytest.raises(LmdataError, match="--resume"):
        train(cfg(sample_store, tmp_path / "run", steps=20))


@pytest.mark.parametrize("change,match", [
    (dict(model="huge"), "--model 'huge': unknown preset; choose one of tiny, small, gpt2-small"),
    (dict(seq_len=65), "--seq-len 65 is longer than the context_length of model 'tiny', 64"),
    (dict(batch_size=100_000), "--batch-size 100000 is larger than a rank's share"),
    (dict(split="nope"), "no split 'nope'; splits: train, validation"),
    (dict(val_split="nope"), "--val-split: .* no split 'nope'"),
    (dict(device="tpu"), "--device: 'tpu'"),
    (dict(batches_per_read=0), "--batches-per-read: must be >= 1"),
    (dict(steps=0), r"--steps: must be >= 1, got 0 \(or give --tokens\)"),
])
def test_bad_input(sample_store, tmp_path, change, match):
    with pytest.raises(LmdataError, match=match):
        train(cfg(sample_store, tmp_path / "run", **change))


def test_fast_bf16_path_trains(sample_store, tmp_path):
    result = train(cfg(sample_store, tmp_path / "run", steps=10, fast=True, precision="bf16", eval_every=0))
    assert all(np.isfinite(result.losses)) and result.losses[-1] < result.losses[0]
