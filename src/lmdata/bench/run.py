"""``lmdata bench`` as a library call: every format x worker count x cache state.

Each (format, workers) cell runs in a fresh spawned process, like a new training job (no
state carries over; Lance, once opened in a process, is not fork-safe). In it, over the
same seeded batches:
1. synthetic: the step loop over one fixed batch already on the device -- the step time
   with no data cost (nanoGPT's A/B: ``stall_ab = 1 - synthetic step / real step``);
2. per cache state: the format's files are read once (warm) or evicted (cold), then the
   loader alone with no compute (its tokens/s), then ``--repeats`` times, evicted or warmed
   again each time, the training steps: the first step (time to first batch), the warm-up
   steps (``--warmup-steps``, their stall reported apart), then ``--steps`` steady-state
   steps (stall fraction, wait distribution, worker memory).

The "keeps up" verdict is the steady-state stall's against ``KEEP_UP_STALL`` over the
repeats, "too noisy" when they fall on both sides (``verdict.py``). The headroom column
compares the loader's rate with the rate the trainer consumes: with real model steps, the
measured one; with simulated steps, the named accelerator's (``--gpu``, ``--mfu``; see
``flops.py``) when given, else the simulated step's.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lmdata._mp import ignore_sigint
from lmdata.bench import cache, stall, verdict
from lmdata.bench.verdict import KEEP_UP_STALL
from lmdata.model import flops
from lmdata.config import BenchConfig
from lmdata.errors import LmdataError
from lmdata.io.location import location
from lmdata.train.device import resolve_device

def _formats(store: Any, cfg: BenchConfig) -> list[str]:
    """The formats to measure: ``--format``'s, each one the split must hold, or all it holds (and the cache
    states asked must be possible there)."""
    have = store.formats(cfg.split)
    formats = cfg.formats or have
    if missing := [f for f in formats if f not in have]:
        raise LmdataError(f"--format {missing[0]!r}: split {cfg.split!r} of {cfg.store} has only {', '.join(have)}")
    if store.remote and "cold" in cfg.cache:  # (nothing local to evict: the row had read "cold 100%")
        raise LmdataError(f"--cache cold: {cfg.store} is on object storage, where there is no page cache of its "
                          "files to evict; bench it warm (the default), or point LMDATA_CACHE_DIR at an empty "
                          "folder for a first read")
    return formats


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Measure every (cache, format, workers) cell; returns the JSON-ready result.

    Each (format, workers) pair runs in a fresh spawned process, like a new training job:
    no state carries over between cells (Lance, once opened, is not fork-safe, so a process
    that read Lance in-process must not fork loader workers afterwards).
    """
    from lmdata.store import open_store

    cfg.check()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # not on Windows
    store = open_store(cfg.store)
    if cfg.split not in store.splits:
        raise LmdataError(f"--split {cfg.split!r}: not in {cfg.store}; it has {', '.join(store.splits)}")
    formats = _formats(store, cfg)
    device = str(resolve_device(cfg.device))
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
    plans = {w: _cell_steps(cfg, w, n_batches, progress) for w in cfg.workers}

    runs = []
    for fmt, workers in itertools.product(formats, cfg.workers):
        warmup, steps = plans[workers]
        spare = n_batches - 1 - warmup - steps if cfg.warmup_steps < 0 else 0  # (auto: until the reader settles)
        rows = _in_fresh_process(_fresh_cell, cfg, fmt, workers, steps, step_ms, vocab, device, warmup, spare)
        for row in rows:
            rate = row["loader_tokens_per_s"]
            measured = tokens_per_step / (row["synthetic"]["compute_ms_mean"] / 1e3)
            consume = need.tokens_per_s_needed if need and cfg.compute == "simulated" else measured
            # "keeps up" is about the step, not the loader's rate: a loader with headroom can still
            # stall the step (bursty waits, the first read); headroom is its own column
            row.update(consume_tokens_per_s=consume, headroom=rate / consume)
            progress(f"{row['cache']:4} {fmt:8} workers={workers}: stall {row['stall_fraction']:.1%} "
                     f"({row['stall_min']:.1%}-{row['stall_max']:.1%} over {cfg.repeats}), {row['verdict']}; "
                     f"loader {rate:,.0f} tok/s (x{row['headroom']:.2f})")
        runs += rows
    order = {m: i for i, m in enumerate(cfg.cache)}
    runs.sort(key=lambda r: order[r["cache"]])  # stable: format, then workers, within each cache state

    return {
        "config": {**asdict(cfg), "store": str(cfg.store), "formats": formats,
                   "steps_run": max(s for _, s in plans.values()), "keep_up_stall": KEEP_UP_STALL,
                   "step_ms": step_ms, "device": device, "tokens_per_step": tokens_per_step},
        "machine": _machine(device, load),
        "plan": need.to_json() if need else None,
        "consume_tokens_per_s": float(np.median([r["consume_tokens_per_s"] for r in runs])),
        "consume_source": "plan" if need and cfg.compute == "simulated" else "measured compute step",
        "runs": runs,
    }


def _cell_steps(cfg: BenchConfig, workers: int, n_batches: int, progress: Callable[[str], None]) -> tuple[int, int]:
    """(warm-up, steady-state steps) at ``workers``: the first step, both, one epoch at most."""
    warmup = (cfg.warmup_steps if cfg.warmup_steps >= 0
              else verdict.auto_warmup(workers, cfg.prefetch, cfg.batches_per_read))
    steps = min(cfg.steps, n_batches - 1 - warmup)
    if steps < 2:
        raise LmdataError(
            f"--warmup-steps {warmup} (workers={workers}): split {cfg.split!r} holds {n_batches} batches of "
            f"{cfg.batch_size} x {cfg.seq_len}, too few for 2 steady-state steps after it; lower --warmup-steps, "
            "--batch-size or --seq-len")
    if steps < cfg.steps:
        progress(f"--steps {cfg.steps} capped at {steps} with workers={workers}: one epoch of this split "
                 f"after the first step and {warmup} warm-up steps")
    return warmup, steps


def make_step(cfg: BenchConfig, step_ms: float | None, vocab: int, device: str) -> stall.StepFn:
    """The compute of one step: the real model's, or a fixed-duration simulated one."""
    if cfg.compute == "model":
        return stall.model_step(flops.model_kwargs(cfg.model, vocab, cfg.seq_len), device)
    assert step_ms is not None  # BenchConfig.check: --step-ms or --gpu
    return stall.simulated_step(step_ms)


def _in_fresh_process(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` in a spawned, non-daemonic process (it starts loader workers); Ctrl-C ends it at once."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=ignore_sigint)
    try:
        return pool.submit(fn, *args).result()
    except BaseException:  # KeyboardInterrupt: the cell ignores SIGINT, so stop it here
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fresh_cell(*args: Any) -> list[dict[str, Any]]:
    """``measure_cell`` in a spawned process, with the start method a shell-started job has."""
    # A spawned process inherits "spawn" as its default start method; a training job started
    # from the shell has the platform default (fork on Linux), so restore that for the loader.
    multiprocessing.set_start_method(None, force=True)
    return measure_cell(*args)


def measure_cell(cfg: BenchConfig, fmt: str, workers: int, steps: int, step_ms: float | None, vocab: int,
                 device: str, warmup: int = 0, spare: int = 0) -> list[dict[str, Any]]:
    """One format at one worker count, in every cache state, ``cfg.repeats`` times each (in its own process).

    ``steps``: steady-state steps per repeat, after the first step and ``warmup`` steps, and up to
    ``spare`` more warm-up steps while this process's reader still opens its split behind the first
    batch (``open_behind.opening()``: start-up work, as a worker's first read is).
    """
    import torch

    from lmdata.data import make_loader
    from lmdata.store import open_store
    from lmdata.store.formats.open_behind import OS_NAME, opening

    def still_opening() -> bool:  # at 0 workers this process's reader, else the workers' (their threads' name)
        return opening() or (workers > 0 and any(stall.has_thread_named(k, OS_NAME)
                                                 for k in stall.descendants(os.getpid())))

    store = open_store(cfg.store)
    step, move = make_step(cfg, step_ms, vocab, device), stall.device_move(device)
    fixed = move(*torch.randint(0, vocab, (2, cfg.batch_size, cfg.seq_len), generator=torch.Generator().manual_seed(0)))
    if cfg.compute == "model":  # allocator, kernels, autotuning: before anything is timed
        stall.time_steps(itertools.repeat(fixed), step, 3)
    # Synthetic A/B baseline: the same loop over one fixed batch already on the device.
    synth = stall.time_steps(itertools.repeat(fixed), step, 1 + steps)
    synth_sum = stall.summarize(synth.wait_s, synth.compute_s)

    def loader() -> Any:
        # verify="size": bench measures the format's reads; the first-touch checksum a training
        # run pays once per shard and process would read whole shards and warm a cold cache.
        ds = store.dataset(cfg.split, cfg.seq_len, format=fmt, verify="size")
        return make_loader(ds, cfg.batch_size, num_workers=workers, prefetch=cfg.prefetch,
                           batches_per_read=cfg.batches_per_read,
                           pin_memory=device.startswith("cuda"), seed=cfg.seed, rank=0, world_size=1)

    rows = []
    # page-cache control is for local files; a remote store has none to warm or drop
    where = location(cfg.store, flag="--store")
    files = [] if where.remote else cache.format_files(where.local_path / cfg.split / fmt)
    for mode in cfg.cache:
        _prepare(mode, files)
        # the first step and the warm-up (every worker's first read; Lance: opening the dataset) untimed
        ttfb_loader, batches_per_s, _ = stall.time_loader(loader(), 1 + warmup + steps, warmup=1 + warmup,
                                                          settle=still_opening, spare=spare)
        gc.collect()  # the loader's workers exit, its memmaps unmap
        repeats, warmed = [], warmup
        for _ in range(cfg.repeats):
            resident = _prepare(mode, files)  # as the training steps start
            times = stall.time_steps(loader(), step, 1 + warmup + steps, move, warmup=warmup, settle=still_opening,
                                     spare=spare)
            gc.collect()
            repeats.append(verdict.repeat_figures(times, synth_sum["step_ms_mean"], resident))
            warmed = max(warmed, len(times.warmup_wait_s))
        rows.append({
            "format": fmt, "workers": workers, "cache": mode, "warmup_steps": warmed,
            **verdict.combine(repeats), "synthetic": synth_sum, "loader_first_batch_ms": ttfb_loader * 1e3,
            "loader_tokens_per_s": batches_per_s * cfg.batch_size * cfg.seq_len,
            "memory": times.memory,
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


def _machine(device: str, load: float | None) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "device": device, "gpu": gpu,
            "loadavg_1m_at_start": load,  # other processes on the machine skew the timings
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
