"""The measurement loop: how long a training step waits on the loader, and how long it computes.

One step is ``next(loader)`` + host->device copy (``t_wait``: the accelerator has nothing to
do) followed by the step's compute (``t_compute``). Stall fraction is
``sum(t_wait) / sum(t_wait + t_compute)`` (DESIGN.md, "Stall time"). The first step is not
counted: it pays for worker start-up and is reported on its own as time to first batch;
the ``warmup`` steps after it (the loader's first reads in flight) are timed apart too, so
the stall is the steady state's.

Compute is one of
- a real model step (forward, loss, backward, AdamW) timed with CUDA events on a GPU, or
  with the wall clock on a CPU;
- a simulated device step of fixed duration (``time.sleep``: it releases the GIL, as a GPU
  kernel launch-and-wait does), for machines without a GPU.

The same loop also runs over a fixed in-memory batch (the synthetic path, nanoGPT's A/B):
``1 - step_time(synthetic) / step_time(real)`` is a second, independent stall estimate.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

Batch = tuple[Any, Any]
StepFn = Callable[[Any, Any], float]  # (inputs, targets) on device -> compute seconds
MoveFn = Callable[[Any, Any], Batch]  # host batch -> device batch (blocking)


@dataclass
class LoopTimes:
    """Per-step times of one run of the measurement loop: steady state, warm-up and first step apart."""

    wait_s: list[float]
    compute_s: list[float]
    first_batch_s: float
    wall_s: float
    memory: dict[str, float] = field(default_factory=dict)
    warmup_wait_s: list[float] = field(default_factory=list)
    warmup_compute_s: list[float] = field(default_factory=list)


def time_steps(batches: Iterable[Batch], step: StepFn, steps: int, move: MoveFn | None = None,
               warmup: int = 0, settle: Callable[[], bool] | None = None, spare: int = 0) -> LoopTimes:
    """Run ``steps`` training steps over ``batches``, timing the wait and the compute of each.

    ``steps`` counts every step: the first (start-up) one, then ``warmup`` steps, then the
    steady state; the first two are reported apart. ``wall_s`` is the steady state's.
    ``settle``: the warm-up goes on while it returns True (a reader still opening its split
    behind the first batch, ``store/formats/open_behind.py``), by at most ``spare`` more steps.
    Memory of the loader's processes is sampled while the iterator is still alive.
    """
    move = move or (lambda x, y: (x, y))
    it = iter(batches)
    t_start = time.perf_counter()
    waits: list[float] = []
    computes: list[float] = []
    warm_waits: list[float] = []
    warm_computes: list[float] = []
    first = 0.0
    t_measured = t_start
    i = 0
    while i < steps:
        t0 = time.perf_counter()
        x, y = move(*next(it))
        t1 = time.perf_counter()
        c = step(x, y)
        if i == 0:
            first = t1 - t_start
        elif i <= warmup:
            warm_waits.append(t1 - t0)
            warm_computes.append(c)
        else:
            waits.append(t1 - t0)
            computes.append(c)
        if i == warmup and spare > 0 and settle is not None and settle():
            warmup, steps, spare = warmup + 1, steps + 1, spare - 1  # (this step was warm-up; one more)
        elif i == min(warmup, steps - 1):
            t_measured = time.perf_counter()
        i += 1
    wall = time.perf_counter() - t_measured
    memory = process_memory()
    del it
    return LoopTimes(waits, computes, first, wall, memory, warm_waits, warm_computes)


def time_loader(batches: Iterable[Batch], steps: int, warmup: int = 1, settle: Callable[[], bool] | None = None,
                spare: int = 0) -> tuple[float, float, dict[str, float]]:
    """Loader alone, no compute: (time to first batch s, batches/s after ``warmup`` batches, memory).

    ``warmup``: batches to let pass before the rate is timed, so that every worker has
    delivered its first read (its start-up is the time to first batch's business, not the
    steady rate's); at most ``steps - 1``. ``settle`` and ``spare``: as ``time_steps``'.
    """
    it: Iterator[Batch] = iter(batches)
    t0 = time.perf_counter()
    next(it)
    t1 = time.perf_counter()
    warmup = min(max(warmup, 1), max(steps - 1, 1))
    for _ in range(warmup - 1):
        next(it)
    while spare > 0 and settle is not None and settle():
        next(it)
        spare -= 1
    tw = time.perf_counter()
    for _ in range(steps - warmup):
        next(it)
    t2 = time.perf_counter()
    memory = process_memory()
    del it
    rate = (steps - warmup) / (t2 - tw) if steps > warmup and t2 > tw else 1.0 / max(t1 - t0, 1e-9)
    return t1 - t0, rate, memory


def summarize(wait_s: list[float], compute_s: list[float]) -> dict[str, float]:
    """Stall fraction and the wait-time distribution (milliseconds) of one run."""
    w = np.asarray(wait_s, dtype=np.float64)
    c = np.asarray(compute_s, dtype=np.float64)
    total = float(w.sum() + c.sum())
    out = {"stall_fraction": float(w.sum()) / total if total > 0 else 0.0, "steps": int(w.size)}
    if w.size:
        ms = w * 1e3
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        out.update(wait_ms_mean=float(ms.mean()), wait_ms_p50=float(p50), wait_ms_p95=float(p95),
                   wait_ms_p99=float(p99), wait_ms_max=float(ms.max()),
                   compute_ms_mean=float(c.mean() * 1e3), step_ms_mean=float((ms + c * 1e3).mean()))
    return out


# --- compute steps -------------------------------------------------------------------------------


def simulated_step(step_ms: float) -> StepFn:
    """A device step of fixed duration that releases the GIL (the host just waits, as on a GPU)."""
    seconds = step_ms / 1e3

    def step(x: Any, y: Any) -> float:
        t0 = time.perf_counter()
        time.sleep(seconds)
        return time.perf_counter() - t0

    return step


def model_step(model_kw: dict[str, Any], device: str, lr: float = 1e-3, grad_clip: float = 1.0) -> StepFn:
    """A real training step of ``TransformerLM(**model_kw)``, the one ``lmdata train`` takes.

    ``lmdata.train.loop.train_step`` itself (forward, ``cross_entropy``, backward,
    ``clip_gradients``, ``AdamW.step``), so bench never copies the train loop. On CUDA: bf16 autocast and the fused attention path
    (what a GPU run would use), and the compute is timed with CUDA events.
    """
    import torch

    from lmdata.model import TransformerLM
    from lmdata.train.loop import loss_fn, train_step
    from lmdata.train.optim import AdamW

    torch.manual_seed(0)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    model = TransformerLM(**model_kw, fast=cuda).to(dev)
    opt = AdamW(model.parameters(), lr=lr)
    forward = loss_fn(model, dev, "bf16" if cuda else "fp32")

    def run(x: Any, y: Any) -> None:
        train_step(forward, opt, [[x, y]], grad_clip)

    def step(x: Any, y: Any) -> float:
        if not cuda:
            t0 = time.perf_counter()
            run(x, y)
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(x, y)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return step


def device_move(device: str) -> MoveFn:
    """Host->device copy that finishes before returning, so it is charged to ``t_wait``."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return lambda x, y: (x, y)

    def move(x: Any, y: Any) -> Batch:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        torch.cuda.current_stream(dev).synchronize()
        return x, y

    return move


# --- memory of the loader's processes --------------------------------------------------------------


def process_memory() -> dict[str, float]:
    """RSS (MiB) of this process and, summed, of its child processes (the loader's workers).

    RSS counts pages shared with the parent after fork, so the worker sum overstates what
    workers add; USS (pages only that process holds) is given too where psutil can read it.
    """
    try:
        import psutil
    except ImportError:
        return _proc_memory()
    me = psutil.Process()
    kids = me.children(recursive=True)
    out = {"main_rss_mb": me.memory_info().rss / 2**20, "workers": float(len(kids)),
           "workers_rss_mb": 0.0, "workers_uss_mb": 0.0}
    for k in kids:
        try:
            info = k.memory_full_info()
            out["workers_rss_mb"] += info.rss / 2**20
            out["workers_uss_mb"] += info.uss / 2**20
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``: a loader's workers, a forkserver's too (Linux
    ``/proc/*/task/*/children``; none where it is missing)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return kids + [g for k in kids for g in descendants(k)]


def has_thread_named(pid: int, name: bytes) -> bool:
    """Whether a thread of process ``pid`` has ``name`` for the kernel (its ``comm``)."""
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            if comm.read_bytes().strip() == name:
                return True
        except OSError:
            continue
    return False


def _proc_memory() -> dict[str, float]:
    """``process_memory`` from /proc when psutil is not installed (Linux; RSS only)."""

    def rss(pid: int) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    kids = descendants(os.getpid())
    return {"main_rss_mb": rss(os.getpid()), "workers": float(len(kids)),
            "workers_rss_mb": sum(rss(k) for k in kids)}
