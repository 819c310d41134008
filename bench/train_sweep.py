"""The sweep behind lmdata.train.defaults: final validation loss of a preset over lr x warm-up x batch.

    .venv/bin/lmdata ingest pipelines/sample.toml      # the demo's store (runs/sample-store)
    .venv/bin/python bench/train_sweep.py runs/sample-store --model tiny --steps 300 \\
        --lr 1e-3,3e-3,1e-2,2e-2,3e-2 --warmup 20 --batch-size 16
    (then --batch-size 32, --warmup 5,50 around the best lr; bench/README.md has the table)

Every run is ``lmdata.train.loop.train`` with the demo's [train] settings but the swept
values, on one torch thread (the development machine has 2 shared cores). The table shows
the unigram entropy of the train split (a model knowing only token frequencies scores it)
and each run's last validation loss and its margin under that entropy. CPU-only timings.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lmdata.store import open_store
from lmdata.config import TrainConfig
from lmdata.train.loop import train


def unigram_entropy(store_path: str, split: str = "train") -> float:
    """H(p) of the split's token frequencies, nats/token."""
    store = open_store(store_path)
    tokens = store.reader(split).windows(np.array([0]), store.n_tokens(split))[0]
    counts = np.bincount(tokens)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=_floats, default=[1e-3, 3e-3, 1e-2])
    ap.add_argument("--warmup", type=_ints, default=[20])
    ap.add_argument("--batch-size", type=_ints, default=[16])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    h1 = unigram_entropy(args.store)
    print(f"# {args.model}, {args.steps} steps on {args.store}; unigram entropy of train {h1:.3f} nats/token")
    print(f"{'lr':>8} {'warmup':>6} {'batch':>5} {'val loss':>8} {'H1 - val':>8} {'s':>5}")
    for lr, warmup, batch in itertools.product(args.lr, args.warmup, args.batch_size):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            cfg = TrainConfig(store=args.store, model=args.model, steps=args.steps, lr=lr, warmup=warmup,
                              batch_size=batch, eval_every=0, eval_batches=10, ckpt_every=0, keep=1,
                              fast=True, seed=args.seed, out=str(Path(out) / "run"), progress=False)
            res = train(cfg, log=lambda msg: None)
            dt = time.perf_counter() - t0
        print(f"{lr:>8.0e} {warmup:>6} {batch:>5} {res.val_loss:>8.3f} {h1 - res.val_loss:>8.3f} {dt:>5.0f}", flush=True)


if __name__ == "__main__":
    main()
