"""``lmdata bench`` as a library call: every format x worker count x cache state.

Each (format, workers) cell runs in a fresh spawned process, like a new training job (no
state carries over; Lance, once opened in a process, is not fork-safe). In it, over the
same seeded batches:
1. synthetic: the step loop over one fixed batch already on the device -- the step time
   with no data cost (nanoGPT's A/B: ``stall_ab = 1 - synthetic step / real step``);
2. per cache state: the format's files are read once (warm) or evicted (cold), then the
   loader alone with no compute (its tokens/s), then, evicted or warmed again, the training
   steps (stall fraction, wait distribution, time to first batch, worker memory).

The keep-up column compares the loader's rate with the rate the trainer consumes: with real
model steps, the measured one; with simulated steps, the named accelerator's (``--gpu``,
``--mfu``; see ``flops.py``) when given, else the simulated step's.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lmdata.bench import cache, flops, stall
from lmdata.errors import LmdataError
from lmdata.store.uri import is_uri

COMPUTE = ("simulated", "model")
CACHE = ("warm", "cold")


@dataclass
class BenchConfig:
    """One bench invocation; the CLI flags of ``lmdata bench`` map 1:1 onto these fields."""

    store: Path
    split: str = "train"
    formats: list[str] = field(default_factory=list)  # empty: every format the split has
    workers: list[int] = field(default_factory=lambda: [0, 1, 2])
    batch_size: int = 32
    seq_len: int = 256
    steps: int = 100
    compute: str = "simulated"
    step_ms: float | None = None  # simulated step; derived from model + gpu when None
    model: str = "small"
    gpu: str | None = None
    mfu: float = flops.DEFAULT_MFU
    cache: list[str] = field(default_factory=lambda: ["warm"])
    device: str = "auto"
    prefetch: int = 2
    batches_per_read: int = 4  # make_loader's BATCHES_PER_READ (not imported: that imports torch)
    seed: int = 0

    def __post_init__(self) -> None:
        if not is_uri(str(self.store)):  # s3://bucket/store stays a URI (Path would fold its //)
            self.store = Path(self.store)
        if isinstance(self.cache, str):
            self.cache = [self.cache]
        if "both" in self.cache:  # the CLI's --cache both, also accepted from a pipeline's [bench]
            self.cache = ["warm", "cold"]

    def check(self) -> None:
        """Reject flag values that cannot run, naming the flag."""
        if self.compute not in COMPUTE:
            raise LmdataError(f"--compute {self.compute!r}: choose one of {', '.join(COMPUTE)}")
        if bad := [c for c in self.cache if c not in CACHE]:
            raise LmdataError(f"--cache {bad[0]!r}: choose warm, cold or both")
        if not self.workers or min(self.workers) < 0:
            raise LmdataError(f"--workers {self.workers}: give worker counts >= 0, e.g. 0,1,2")
        if self.steps < 2:
            raise LmdataError(f"--steps {self.steps}: need at least 2 (the first step is start-up)")
        if self.batch_size < 1 or self.seq_len < 1:
            raise LmdataError(f"--batch-size {self.batch_size} / --seq-len {self.seq_len}: must be >= 1")
        if self.compute == "simulated" and self.step_ms is None and self.gpu is None:
            raise LmdataError("--compute simulated needs --step-ms X, or --gpu NAME to derive it from --model")
        if self.step_ms is not None and self.step_ms < 0:
            raise LmdataError(f"--step-ms {self.step_ms}: must be >= 0")
        if self.prefetch < 1:
            raise LmdataError(f"--prefetch {self.prefetch}: must be >= 1 (reads each worker does ahead)")
        if self.batches_per_read < 1:
            raise LmdataError(f"--batches-per-read {self.batches_per_read}: must be >= 1 (batches read with one call)")
        if self.compute == "model" or self.gpu:
            flops.preset(self.model)  # an unknown --model fails here, not inside a cell


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LmdataError(f"--device {device}: torch sees no CUDA device; use --device cpu")
    return device


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Measure every (cache, format, workers) cell; returns the JSON-ready result.

    Each (format, workers) pair runs in a fresh spawned process, like a new training job:
    no state carries over between cells (Lance, once opened, is not fork-safe, so a process
    that read Lance in-process must not fork loader workers afterwards).
    """
    from lmdata.store import open_store

    cfg.check()
    load = os.getloadavg()[0]
    store = open_store(cfg.store)
    if cfg.split not in store.splits:
        raise LmdataError(f"--split {cfg.split!r}: not in {cfg.store}; it has {', '.join(store.splits)}")
    have = store.formats(cfg.split)
    formats = cfg.formats or have
    if missing := [f for f in formats if f not in have]:
        raise LmdataError(f"--format {missing[0]!r}: split {cfg.split!r} of {cfg.store} has only {', '.join(have)}")
    device = resolve_device(cfg.device)
    vocab = store.manifest.vocab_size
    tokens_per_step = cfg.batch_size * cfg.seq_len
    need = flops.plan(cfg.model, cfg.gpu, cfg.batch_size, cfg.seq_len, vocab, cfg.mfu) if cfg.gpu else None
    step_ms = cfg.step_ms if cfg.step_ms is not None else (need.step_ms if need else None)

    n_batches = len(store.dataset(cfg.split, cfg.seq_len, format=formats[0])) // cfg.batch_size
    if n_batches < 2:
        raise LmdataError(
            f"--batch-size {cfg.batch_size} x --seq-len {cfg.seq_len}: split {cfg.split!r} has fewer than 2 "
            "batches of samples; use smaller values"
        )
    steps = min(cfg.steps, n_batches)
    if steps < cfg.steps:
        progress(f"--steps {cfg.steps} capped at {steps}: one epoch of this split")

    runs = []
    for fmt, workers in itertools.product(formats, cfg.workers):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = pool.submit(_fresh_cell, cfg, fmt, workers, steps, step_ms, vocab, device).result()
        for row in rows:
            rate = row["loader_tokens_per_s"]
            measured = tokens_per_step / (row["synthetic"]["compute_ms_mean"] / 1e3)
            consume = need.tokens_per_s_needed if need and cfg.compute == "simulated" else measured
            row.update(consume_tokens_per_s=consume, headroom=rate / consume, keeps_up=rate >= consume)
            progress(f"{row['cache']:4} {fmt:8} workers={workers}: stall {row['stall_fraction']:.1%}, "
                     f"loader {rate:,.0f} tok/s (x{row['headroom']:.2f})")
        runs += rows
    order = {m: i for i, m in enumerate(cfg.cache)}
    runs.sort(key=lambda r: order[r["cache"]])  # stable: format, then workers, within each cache state

    return {
        "config": {**asdict(cfg), "store": str(cfg.store), "formats": formats, "steps_run": steps,
                   "step_ms": step_ms, "device": device, "tokens_per_step": tokens_per_step},
        "machine": _machine(device, load),
        "plan": need.to_json() if need else None,
        "consume_tokens_per_s": float(np.median([r["consume_tokens_per_s"] for r in runs])),
        "consume_source": "plan" if need and cfg.compute == "simulated" else "measured compute step",
        "runs": runs,
    }


def make_step(cfg: BenchConfig, step_ms: float | None, vocab: int, device: str) -> stall.StepFn:
    """The compute of one step: the real model's, or a fixed-duration simulated one."""
    if cfg.compute == "model":
        return stall.model_step(flops.model_kwargs(cfg.model, vocab, cfg.seq_len), device)
    assert step_ms is not None  # BenchConfig.check: --step-ms or --gpu
    return stall.simulated_step(step_ms)


def _fresh_cell(*args: Any) -> list[dict[str, Any]]:
    """``measure_cell`` in a spawned process, with the start method a shell-started job has."""
    # A spawned process inherits "spawn" as its default start method; a training job started
    # from the shell has the platform default (fork on Linux), so restore that for the loader.
    multiprocessing.set_start_method(None, force=True)
    return measure_cell(*args)


def measure_cell(cfg: BenchConfig, fmt: str, workers: int, steps: int, step_ms: float | None, vocab: int,
                 device: str) -> list[dict[str, Any]]:
    """One format at one worker count, in every cache state (runs in its own process)."""
    import torch

    from lmdata.data import make_loader
    from lmdata.store import open_store

    store = open_store(cfg.store)
    step, move = make_step(cfg, step_ms, vocab, device), stall.device_move(device)
    fixed = move(*torch.randint(0, vocab, (2, cfg.batch_size, cfg.seq_len), generator=torch.Generator().manual_seed(0)))
    if cfg.compute == "model":  # allocator, kernels, autotuning: before anything is timed
        stall.time_steps(itertools.repeat(fixed), step, 3)
    # Synthetic A/B baseline: the same loop over one fixed batch already on the device.
    synth = stall.time_steps(itertools.repeat(fixed), step, steps)
    synth_sum = stall.summarize(synth.wait_s, synth.compute_s)

    def loader() -> Any:
        # verify="size": bench measures the format's reads; the first-touch sha256 a training
        # run pays once per shard and process would read whole shards and warm a cold cache.
        ds = store.dataset(cfg.split, cfg.seq_len, format=fmt, verify="size")
        return make_loader(ds, cfg.batch_size, num_workers=workers, prefetch=cfg.prefetch,
                           batches_per_read=cfg.batches_per_read,
                           pin_memory=device.startswith("cuda"), seed=cfg.seed, rank=0, world_size=1)

    rows = []
    # page-cache control is for local files; a remote store has none to warm or drop
    files = [] if is_uri(str(cfg.store)) else cache.format_files(Path(cfg.store) / cfg.split / fmt)
    for mode in cfg.cache:
        _prepare(mode, files)
        # every worker's first read (Lance: opening the dataset) before the rate is timed
        warmup = max(1, workers * cfg.batches_per_read)
        ttfb_loader, batches_per_s, _ = stall.time_loader(loader(), steps, warmup=warmup)
        gc.collect()  # the loader's workers exit, its memmaps unmap
        resident = _prepare(mode, files)  # as the training steps start
        times = stall.time_steps(loader(), step, steps, move)
        gc.collect()
        summary = stall.summarize(times.wait_s, times.compute_s)
        rows.append({
            "format": fmt, "workers": workers, "cache": mode, "resident_before": resident, **summary,
            "stall_ab": 1.0 - synth_sum["step_ms_mean"] / summary["step_ms_mean"], "synthetic": synth_sum,
            "first_batch_ms": times.first_batch_s * 1e3, "loader_first_batch_ms": ttfb_loader * 1e3,
            "loader_tokens_per_s": batches_per_s * cfg.batch_size * cfg.seq_len,
            "memory": times.memory, "wait_ms": [round(x * 1e3, 4) for x in times.wait_s],
        })
    return rows


def _prepare(mode: str, files: list[Path]) -> float | None:
    """Warm: read every file once. Cold: evict them. Returns the resident fraction after."""
    if mode == "cold":
        cache.evict(files)
    else:
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(1 << 22):
                    pass
    return cache.resident_fraction(files)


def _machine(device: str, load: float) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "device": device, "gpu": gpu,
            "loadavg_1m_at_start": load,  # other processes on the machine skew the timings
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
