"""What a run says about itself: both losses named, the real model size, a warm-up that never
ends, and a --grad-accum too large for the split refused before the first step (issues 29, 30)."""

from __future__ import annotations

import json

import pytest

from lmdata.config import TrainConfig
from lmdata.errors import LmdataError
from lmdata.train.loop import train


def cfg(store, out, **kw) -> TrainConfig:
    base = dict(store=str(store), out=str(out), batch_size=4, steps=6, warmup=2, eval_every=0, eval_batches=1,
                ckpt_every=0, log_every=3, val_split="none", progress=False)
    return TrainConfig(**{**base, **kw})


def test_summary_names_the_last_step_loss_and_the_logged_mean(sample_store, tmp_path):
    lines = []
    result = train(cfg(sample_store, tmp_path / "run"), log=lines.append)
    logged = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    summary = result.summary()
    assert f"last-step loss {result.losses[-1]:.4f}" in summary
    assert f"mean loss of the last 3 steps {logged['loss']:.4f}" in summary
    assert any("loss = mean of the last 3 steps" in line for line in lines)


def test_log_line_shows_size_flags_and_warns_of_a_warmup_longer_than_the_run(sample_store, tmp_path):
    lines = []
    train(cfg(sample_store, tmp_path / "run", layers=1, d_model=64, warmup=50), log=lines.append)
    assert any(line.startswith("model tiny (d_model 64, num_layers 1):") for line in lines), lines[:2]
    assert any(line.startswith("warning: --warmup 50 is not shorter than the run (6 steps)") for line in lines)


def test_huge_grad_accum_is_refused_before_training(sample_store, tmp_path):
    with pytest.raises(LmdataError, match=r"^--grad-accum 1000000000: a step would read 4 x 1000000000 .*use --grad-accum <= \d+$"):
        train(cfg(sample_store, tmp_path / "run", grad_accum=1_000_000_000))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_keeping_the_last_good_checkpoint(sample_store, tmp_path):
    """Issues 29 (smaller) and 30.10: --lr 1e30 trained on to a NaN loss; the error then said
    'use --precision fp32' to a run that already was fp32."""
    out = tmp_path / "run"
    with pytest.raises(LmdataError) as err:
        train(cfg(sample_store, out, lr=1e30, warmup=0, steps=20, ckpt_every=1, precision="fp32"))
    msg = str(err.value)
    assert msg.startswith("step ") and "loss is " in msg and "--lr" in msg and "--precision" not in msg, msg
    bad = int(msg.split()[1].rstrip(":"))
    kept = sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.pt"))
    assert kept and kept[-1] == f"ckpt-{bad - 1:08d}.pt" and kept[-1] in msg, (kept, msg)
