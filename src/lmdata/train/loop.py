"""The training loop: store -> loader -> TransformerLM -> AdamW, with eval, logs, checkpoints.

``train(cfg)`` is what ``lmdata train`` calls. Under ``torchrun`` (``WORLD_SIZE`` > 1) it
runs DDP (gloo on CPU, nccl on CUDA); each rank reads its own share of every epoch from
the loader, and rank 0 alone logs and writes. What a step measures (DESIGN.md's stall):
``t_wait`` = blocked in ``next(loader)`` + host->device copy; data-wait = Σ t_wait / Σ step time.

Resume is exact on CPU: a checkpoint holds the model, AdamW moments, step, every rank's loader
position, the RNG states and the open log window (a log line's mean spans a checkpoint), so the losses
after ``--resume`` equal an uninterrupted run's bit for bit (tests/train/test_loop.py), with
``--grad-accum`` and ``--mix`` too (checkpoints fall on step boundaries).

A step with ``--grad-accum N`` runs N micro-batches, each loss scaled by 1/N before its
backward, so the gradient is that of the mean loss over all N micro-batches: one batch N
times as large (tests/train/test_accum.py). MFU = tokens/s x FLOPs/token (the count of
``lmdata plan``, lmdata.model.flops.model_cost) / the accelerator's peak (``--gpu``).
"""

from __future__ import annotations

import contextlib
import gc
import dataclasses
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from lmdata.config import TrainConfig
from lmdata.errors import LmdataError
from lmdata.model.transformer import TransformerLM
from lmdata.train.checkpoint import (
    CHECKPOINT_DIR,
    check_run_dir,
    claim_run_dir,
    latest_checkpoint,
    load_checkpoint,
    non_finite_loss,
    save_checkpoint,
)
from lmdata.train.defaults import build_model_config, model_overrides, resolve
from lmdata.train.device import (
    Dist,
    allreduce_mean,
    guess_gpu,
    init_distributed,
    resolve_device,
)
from lmdata.train.metrics import METRICS, plot_losses, truncate_metrics
from lmdata.train.step import loss_fn, train_step
from lmdata.train.optim import AdamW
from lmdata.train.schedule import cosine_lr
from lmdata.train.trackers import check_installed, start_trackers


@dataclass
class TrainResult:
    """What a call to ``train`` did (rank-local losses; rank 0's metrics are in the files)."""

    out: Path
    start_step: int
    steps: int
    losses: list[float] = field(default_factory=list)  # one per step run by this call
    val_loss: float | None = None
    checkpoint: Path | None = None
    logged_loss: tuple[float, int] | None = None  # the last log line's loss: (mean, over how many steps)

    def summary(self) -> str:
        """One line: steps run, last loss, validation loss, checkpoint (what ``--quiet`` prints).

        The last step's loss and the log line's (a mean over the last ``--log-every`` steps,
        all ranks) differ; both are named.
        """
        parts = [f"trained steps {self.start_step}-{self.steps}" if self.losses else f"nothing to train (step {self.steps})"]
        if self.losses:
            parts.append(f"last-step loss {self.losses[-1]:.4f}")
        if self.losses and self.logged_loss is not None and self.logged_loss[1] > 1:
            parts.append(f"mean loss of the last {self.logged_loss[1]} steps {self.logged_loss[0]:.4f}")
        if self.val_loss is not None:
            parts.append(f"val loss {self.val_loss:.4f}")
        return "; ".join(parts + [f"checkpoint: {self.checkpoint or 'none'}"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def forever(loader: Any) -> Iterator[tuple[torch.Tensor, ...]]:
    """The loader's batches across epochs (each pass over it is one epoch)."""
    while True:
        yield from loader


def _store_name(store: str) -> str:
    """The store as the run's meta records it: an absolute path, or the ``s3://`` URI as given."""
    from lmdata.io.location import location

    loc = location(store, flag="--store")
    return loc.uri if loc.remote else str(loc.local_path.resolve())


class TrainingRun:
    """The state of one training run: store, datasets, model, optimizer, loader, output files."""

    def __init__(self, cfg: TrainConfig, dist: Dist, log: Callable[[str], None]) -> None:
        from lmdata.data.loader import make_loader
        from lmdata.store import open_store

        self.device = resolve_device(cfg.device, dist.local_rank)
        cfg = resolve(cfg, self.device.type)
        self.cfg, self.dist, self.log = cfg, dist, log
        self.mix = None
        if cfg.mix:
            from lmdata.data.mixed import open_mix_stores

            self.mix = open_mix_stores(cfg.mix)
            cfg = self.cfg = dataclasses.replace(cfg, store=cfg.store or self.mix[0]["store"])
        self.store = open_store(cfg.store)
        manifest = self.store.manifest
        if self.mix is None and cfg.split not in manifest.splits:
            raise LmdataError(f"--split: store {cfg.store} has no split {cfg.split!r}; splits: {', '.join(manifest.splits)}")
        if self.mix is not None and self.mix[0]["tokenizer_hash"] != manifest.tokenizer_hash:
            raise LmdataError(f"--store {cfg.store} (validation) has another tokenizer than the --mix stores; "
                              "drop --store or pass one ingested with the same tokenizer")
        self.mcfg = build_model_config(cfg, manifest.vocab_size)
        self.seq_len = cfg.seq_len or self.mcfg["context_length"]
        if self.seq_len > self.mcfg["context_length"]:
            raise LmdataError(
                f"--seq-len {self.seq_len} is longer than the context_length of model {cfg.model!r}, "
                f"{self.mcfg['context_length']}; use --seq-len <= {self.mcfg['context_length']} or a larger preset"
            )
        fmt = cfg.format or None
        doc_kw = dict(doc_info="positions", eot_id=self.store.eot_id) if cfg.doc_mask else {}
        self.train_ds = self._train_dataset(fmt, doc_kw)
        self._check_share()
        self.loader = make_loader(
            self.train_ds, cfg.batch_size, num_workers=cfg.workers, prefetch=cfg.prefetch,
            batches_per_read=cfg.batches_per_read, pin_memory=self.device.type == "cuda", seed=cfg.seed, rank=dist.rank, world_size=dist.world_size,
        )
        self.val_ds, self.val_batch = self._val_dataset(fmt, doc_kw)
        self._plan_steps()
        self.gpu = cfg.gpu or guess_gpu(self.device)
        self.flops_per_token = self._flops_per_token()

        seed_everything(cfg.seed)
        self.model = TransformerLM(**self.mcfg, fast=cfg.fast).to(self.device)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
        )
        self.out = Path(cfg.out)
        self.ckpt_dir = self.out / CHECKPOINT_DIR
        self.meta = self._meta(manifest)

    def _check_share(self) -> None:
        """A rank's share of the split must hold one micro-batch, and one step's micro-batches."""
        cfg, dist = self.cfg, self.dist
        share = len(self.train_ds) // dist.world_size
        what = "the mixture" if self.mix else f"split {cfg.split!r}"
        if cfg.batch_size > share:
            raise LmdataError(
                f"--batch-size {cfg.batch_size} is larger than a rank's share of {what} "
                f"({share} samples of {self.seq_len} tokens on each of {dist.world_size} ranks); use --batch-size <= {share}"
            )
        if cfg.batch_size * cfg.grad_accum > share:  # a step would read more than an epoch (and print nothing for ages)
            raise LmdataError(
                f"--grad-accum {cfg.grad_accum}: a step would read {cfg.batch_size} x {cfg.grad_accum} sequences per rank, "
                f"more than a rank's share of {what} ({share}); use --grad-accum <= {max(share // max(cfg.batch_size, 1), 1)}"
            )

    def _plan_steps(self) -> None:
        """Tokens per step (all ranks) and the step count (``--tokens`` wins over ``--steps``)."""
        cfg = self.cfg
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * self.seq_len * self.dist.world_size
        self.steps = math.ceil(cfg.tokens / self.tokens_per_step) if cfg.tokens else cfg.steps

    def _train_dataset(self, fmt: str | None, doc_kw: dict) -> Any:
        """The split's windows, or the weighted mixture of the --mix sources."""
        cfg = self.cfg
        if self.mix is None:
            return self.store.dataset(cfg.split, self.seq_len, format=fmt, **doc_kw)
        from lmdata.data.mixed import MixedDataset

        parts = [(m["open"].dataset(m["split"], self.seq_len, format=fmt, **doc_kw), m["weight"]) for m in self.mix]
        return MixedDataset(parts, seed=cfg.seed)

    def _meta(self, manifest: Any) -> dict[str, Any]:
        """What a checkpoint records about the run, checked again on --resume."""
        cfg, mix = self.cfg, self.mix
        return {
            "model": cfg.model, "model_config": self.mcfg, "store": _store_name(cfg.store),
            "tokenizer_hash": manifest.tokenizer_hash, "eot_id": manifest.eot_id,
            "split": "mix" if mix else cfg.split,
            "split_tokens": ([m["open"].n_tokens(m["split"]) for m in mix] if mix
                             else manifest.splits[cfg.split].n_tokens),
            "mix": [[m["store"], m["split"], m["weight"]] for m in mix] if mix else None,
            "seq_len": self.seq_len, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum,
            "world_size": self.dist.world_size, "doc_mask": cfg.doc_mask, "config": asdict(cfg),
        }

    def _flops_per_token(self) -> float:
        from lmdata.model.flops import model_cost

        return model_cost(self.mcfg, self.seq_len).flops_per_token

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOP/s utilisation against ``--gpu``'s peak (all ranks' tokens, all ranks' peak)."""
        from lmdata.model.flops import accelerator_flops

        if not self.gpu:
            return None
        return tokens_per_s * self.flops_per_token / (accelerator_flops(self.gpu) * self.dist.world_size)

    def _val_dataset(self, fmt: str | None, doc_kw: dict) -> tuple[Any, int]:
        name, splits = self.cfg.val_split, self.store.manifest.splits
        if name in ("none", ""):
            return None, 0
        if name == "auto":
            name = "validation"
            if name not in splits:
                return None, 0
        elif name not in splits:
            raise LmdataError(f"--val-split: store {self.cfg.store} has no split {name!r}; splits: {', '.join(splits)}")
        ds = self.store.dataset(name, self.seq_len, format=fmt, **doc_kw)
        batch = min(self.cfg.batch_size, len(ds) // self.dist.world_size)
        if batch < 1:
            self.log(f"validation split {name!r} is shorter than one sequence per rank; skipping validation")
            return None, 0
        return ds, batch

    def resume(self) -> int:
        """Load the newest checkpoint in --out when --resume; refuse a mismatched one. Returns the start step."""
        ckpt = latest_checkpoint(self.ckpt_dir)
        if ckpt is None:
            if self.cfg.resume:
                self.log(f"--resume: no checkpoint in {self.ckpt_dir}; starting from step 0")
            return 0
        if not self.cfg.resume:
            raise LmdataError(
                f"--out {self.out} already holds checkpoints ({ckpt.name}); pass --resume to continue that run "
                "or choose another --out"
            )
        payload = load_checkpoint(ckpt, self.model, self.optimizer, map_location=self.device,
                                  check_meta=lambda meta: self._check_meta(ckpt, meta))
        states, world = payload["loader"], self.dist.world_size
        # elastic: every new rank loads rank 0's state (the order is global, data/loader.py)
        self.loader.load_state_dict(states[self.dist.rank] if len(states) == world else states[0])
        self.log_window = payload.get("log_window")  # the steps since the last log line (older checkpoints: none)
        self.log(f"resumed from {ckpt} at step {payload['step']}")
        return int(payload["step"])

    def _elastic(self, ckpt: Path, meta: dict) -> None:
        """Resume under another world size: keep the global batch by changing --grad-accum, or refuse.

        A step reads batch_size x grad_accum x world_size sequences, the same global positions
        whatever the split into ranks and micro-batches, so the run continues as it would have.
        """
        cfg, world = self.cfg, self.dist.world_size
        saved_world, saved_accum = int(meta.get("world_size") or 1), int(meta.get("grad_accum") or 1)
        if saved_world == world:
            if cfg.grad_accum != saved_accum:
                raise LmdataError(f"checkpoint {ckpt} has grad_accum={saved_accum} but this run has {cfg.grad_accum}; "
                                  "resume with the same --grad-accum or start a new run with another --out")
            return
        micro = saved_accum * saved_world  # micro-batches of batch_size per step, all ranks together
        if micro % world:
            fits = [w for w in range(1, micro + 1) if micro % w == 0]
            shown = ", ".join(map(str, fits[:12])) + (", ..." if len(fits) > 12 else "")
            raise LmdataError(
                f"checkpoint {ckpt}: a step of {cfg.batch_size} x {saved_accum} micro-batches x {saved_world} ranks "
                f"({cfg.batch_size * micro} sequences) cannot be split over {world} ranks; resume with "
                f"--nproc_per_node in {shown} (--grad-accum then becomes {micro} / ranks)")
        accum = micro // world
        if cfg.grad_accum not in (saved_accum, accum):
            raise LmdataError(f"checkpoint {ckpt}: under {world} ranks the global batch needs --grad-accum {accum}, "
                              f"not {cfg.grad_accum}; drop --grad-accum or pass {accum}")
        self.cfg = dataclasses.replace(cfg, grad_accum=accum)
        self.meta.update(grad_accum=accum, config=asdict(self.cfg))
        self._plan_steps()
        self.log(f"elastic resume: {saved_world} -> {world} ranks, --grad-accum {saved_accum} -> {accum} "
                 f"(global batch kept: {cfg.batch_size * micro} sequences per step)")

    def _check_meta(self, ckpt: Path, meta: dict) -> None:
        mine = self.meta
        if meta.get("tokenizer_hash") != mine["tokenizer_hash"]:
            raise LmdataError(
                f"checkpoint {ckpt} was trained with tokenizer {str(meta.get('tokenizer_hash'))[:12]} "
                f"(store {meta.get('store')}), but store {self.cfg.store} uses tokenizer {mine['tokenizer_hash'][:12]}; "
                "resume with the original store or start a new run with another --out"
            )
        for key, flag in (("split", "--split"), ("split_tokens", "--store"), ("mix", "--mix"),
                          ("model_config", "--model"), ("seq_len", "--seq-len"), ("batch_size", "--batch-size")):
            if meta.get(key) != mine[key]:
                raise LmdataError(
                    f"checkpoint {ckpt} has {key}={meta.get(key)!r} but this run has {mine[key]!r}; "
                    f"resume with the same {flag} (and store) or start a new run with another --out"
                )
        if (seed := meta.get("config", {}).get("seed", self.cfg.seed)) != self.cfg.seed:  # the run's order is its own
            raise LmdataError(f"checkpoint {ckpt} has seed {seed} but this run has --seed {self.cfg.seed}; resume "
                              f"with --seed {seed} (it set the data order being resumed) or start a new run")
        self._elastic(ckpt, meta)

    def save(self, step: int, window: dict) -> Path | None:
        """Every rank's loader state goes into rank 0's checkpoint (ranks resume their own share), with the
        open log window, its loss summed as the ranks' mean (what the log line will average)."""
        window = {**window, "loss": allreduce_mean([window["loss"]], self.dist)[0]}
        states = [self.loader.state_dict()]
        if self.dist.world_size > 1:
            states = [None] * self.dist.world_size
            torch.distributed.all_gather_object(states, self.loader.state_dict())
        path = None
        if self.dist.main:
            path = save_checkpoint(self.ckpt_dir, self.model, self.optimizer, step, loader_state=states,
                                   meta=self.meta, keep=self.cfg.keep, extra={"log_window": window})
        if self.dist.world_size > 1:
            torch.distributed.barrier()
        return path

    def save_tokenizer(self) -> None:
        """A copy of the store's tokenizer/ beside the checkpoints: `lmdata sample` works if the store moves."""
        import shutil

        source, target = self.store.tokenizer_dir(), self.ckpt_dir / "tokenizer"  # s3://: the cached copy
        if target.is_dir():
            return
        if not source.is_dir():
            self.log(f"warning: {source} is missing; `lmdata sample` will need a tokenizer copied to {target}")
            return
        self.store.tokenizer()  # refuses a tokenizer/ that fails the manifest's hash: never copy another one
        tmp = self.ckpt_dir / f".tokenizer.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp)
        os.replace(tmp, target)

    @torch.no_grad()
    def evaluate(self, forward: Callable) -> float | None:
        """Mean loss over the first --eval-batches batches of the validation split (same every time)."""
        from lmdata.data.loader import make_loader

        if self.val_ds is None:
            return None
        loader = make_loader(self.val_ds, self.val_batch, num_workers=0, seed=self.cfg.seed,
                             rank=self.dist.rank, world_size=self.dist.world_size, sampling="sequential")
        self.model.eval()
        losses = []
        for i, batch in enumerate(loader):
            if i == self.cfg.eval_batches:
                break
            losses.append(forward(*(t.to(self.device) for t in batch)).item())
        self.model.train()
        return allreduce_mean([sum(losses) / len(losses)], self.dist)[0]


def train(cfg: TrainConfig, log: Callable[[str], None] | None = None) -> TrainResult:
    """Train per ``cfg`` (see TrainConfig); under torchrun, one call per rank."""
    from lmdata._progress import PlainProgress, progress

    cfg.check()
    check_installed(cfg.log)  # a missing tracker package fails before any work
    check_run_dir(cfg.out)  # every rank: a folder of user files is refused before any rank writes
    dist = init_distributed(cfg.device)
    log = log or print
    say = log if dist.main else (lambda msg: None)
    run = TrainingRun(cfg, dist, say)
    start = run.resume()
    cfg = run.cfg  # the preset's defaults filled in (and --grad-accum of an elastic resume)
    created = dist.main and not run.out.exists()  # removed again if a tracker cannot start
    if dist.main:
        claim_run_dir(run.out)
        truncate_metrics(run.out / METRICS, start)
        run.save_tokenizer()
    sized = ", ".join(f"{k} {v}" for k, v in model_overrides(cfg).items())
    say(f"model {cfg.model}{f' ({sized})' if sized else ''}: {run.model.num_params():,} non-embedding parameters, vocab {run.mcfg['vocab_size']}, "
        f"seq_len {run.seq_len}; {run.steps} steps of {run.tokens_per_step:,} tokens "
        f"({cfg.batch_size} x {cfg.grad_accum} micro-batches) on {run.device} x{dist.world_size} {cfg.precision}; "
        f"lr {cfg.lr:g} -> {cfg.min_lr:g}, warm-up {cfg.warmup}; log lines: loss = mean of the last {cfg.log_every} steps; "
        + (f"MFU against {run.gpu}" if run.gpu else "MFU not shown (no --gpu on this device)"))
    if cfg.warmup >= run.steps > start:
        say(f"warning: --warmup {cfg.warmup} is not shorter than the run ({run.steps} steps): the learning rate "
            f"never reaches --lr {cfg.lr:g}; lower --warmup or train longer")
    if run.mix is not None:
        say("mixture: " + ", ".join(f"{m['store']}:{m['split']} {w:.1%}" for m, w in
                                    zip(run.mix, run.train_ds.fractions())))
    model: torch.nn.Module = run.model
    if dist.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[run.device.index] if run.device.type == "cuda" else None)
    if cfg.compile:
        model = torch.compile(model)
    forward = loss_fn(model, run.device, cfg.precision)
    no_sync = model.no_sync if dist.world_size > 1 else contextlib.nullcontext
    mix_counts = np.zeros(len(run.mix or []), dtype=np.int64)

    result = TrainResult(out=run.out, start_step=start, steps=run.steps)
    batches = forever(run.loader)
    bar = progress(cfg.progress and dist.main, total=run.steps, initial=start, unit="step", desc="train")
    trackers = start_trackers(cfg.log, run.out, start, asdict(cfg), dist.main, created)  # metrics.jsonl, TB, W&B
    if not isinstance(bar, PlainProgress):  # a terminal's bar: log lines go above it
        say = bar.write
    window = {**dict(loss=0.0, wait=0.0, time=0.0, n=0), **(getattr(run, "log_window", None) or {})}
    try:
        for step in range(start, run.steps):
            lr = cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, run.steps)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            micro = []
            for _ in range(cfg.grad_accum):
                micro.append([t.to(run.device, non_blocking=True) for t in next(batches)])
                if run.mix is not None:
                    mix_counts += run.train_ds.sources_of_batch(run.loader)
            if run.device.type == "cuda":  # charge the copy to the wait, as `lmdata bench` does
                torch.cuda.current_stream(run.device).synchronize()
            t_wait = time.perf_counter() - t0
            loss, grad_norm = train_step(forward, run.optimizer, micro, cfg.grad_clip, no_sync)
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise non_finite_loss(step + 1, loss_value, cfg.precision, run.ckpt_dir)
            result.losses.append(loss_value)
            window["loss"] += loss_value
            window["wait"] += t_wait
            window["time"] += time.perf_counter() - t0
            window["n"] += 1
            done = step + 1
            bar.update(1)
            if done % cfg.log_every == 0 or done == run.steps:
                loss_mean, = allreduce_mean([window["loss"] / window["n"]], dist)
                tok_s = window["n"] * run.tokens_per_step / window["time"]
                rec = {"step": done, "split": "train", "loss": loss_mean, "tokens": done * run.tokens_per_step,
                       "lr": lr, "grad_norm": float(grad_norm),
                       "tokens_per_s": tok_s, "data_wait": window["wait"] / window["time"],
                       "model_flops_per_s": tok_s * run.flops_per_token, "mfu": run.mfu(tok_s)}
                mfu = f"MFU {rec['mfu']:.1%}" if rec["mfu"] is not None else f"{rec['model_flops_per_s'] / 1e9:,.1f} GFLOP/s"
                line = (f"step {done:>6}  loss {loss_mean:.4f}  lr {lr:.2e}  gnorm {rec['grad_norm']:.3f}  "
                        f"tok/s {tok_s:,.0f}  {mfu}  data-wait {rec['data_wait']:.1%}")
                if run.mix is not None:
                    shares = mix_counts / max(mix_counts.sum(), 1)
                    rec["mix"] = {f"{m['store']}:{m['split']}": float(f) for m, f in zip(run.mix, shares)}
                    line += "  mix " + "/".join(f"{f:.0%}" for f in shares)
                say(line)
                trackers.log(rec)
                result.logged_loss = (loss_mean, window["n"])
                bar.set_postfix(loss=f"{loss_mean:.3f}")
                window = dict(loss=0.0, wait=0.0, time=0.0, n=0)
            if (cfg.eval_every and done % cfg.eval_every == 0) or done == run.steps:
                val = run.evaluate(forward)
                if val is not None:
                    result.val_loss = val
                    say(f"step {done:>6}  val loss {val:.4f}")
                    trackers.log({"step": done, "split": "validation", "loss": val})
            if (cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == run.steps:
                result.checkpoint = run.save(done, window)
    finally:
        bar.close()
        trackers.close()
    if dist.main and run.steps > start:
        plot_losses(run.out / METRICS, run.out / "loss.png")
    if dist.owns_group:  # leave together, DDP's reducer (gloo work holding tensors) freed while Python is whole:
        del model, forward, no_sync, batches  # ranks were seen aborting at exit ("terminate called without an
        gc.collect()  # active exception") when a cycle kept it until the interpreter's finalization
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return result
