"""Does the loader keep up? A verdict from repeated steady-state runs, or an honest "too noisy".

One short run is decided by its start-up and by one slow read: two identical runs of the
sample bench stalled 10.5% and 32.1% (issue 30). So each cell is run ``--repeats`` times;
each repeat's first ``warmup`` steps are left out of its steady-state stall (reported apart
as the warm-up stall), and the verdict looks at the spread of the repeats:

- every repeat stalls under ``KEEP_UP_STALL``: the loader keeps up;
- every repeat stalls at or over it: it does not;
- the repeats fall on both sides: too noisy to decide (more steps, more repeats or a
  quieter machine may decide it).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lmdata.bench import stall

KEEP_UP_STALL = 0.05  # a loader "keeps up" when the step waits on it less than 5% of the time
KEEPS_UP, DOES_NOT, TOO_NOISY = "keeps up", "does not", "too noisy"
SHOWN = {KEEPS_UP: "yes", DOES_NOT: "NO", TOO_NOISY: "too noisy"}  # the table's "keeps up" column


def verdict(stalls: Sequence[float], threshold: float = KEEP_UP_STALL) -> str:
    """``KEEPS_UP``, ``DOES_NOT`` or ``TOO_NOISY`` from the steady-state stall of each repeat."""
    if not stalls:
        raise ValueError("verdict of no repeats")
    if max(stalls) < threshold:
        return KEEPS_UP
    if min(stalls) >= threshold:
        return DOES_NOT
    return TOO_NOISY


def auto_warmup(workers: int, prefetch: int, batches_per_read: int) -> int:
    """Warm-up steps after the first: the batches the loader has in flight when it starts.

    Every worker's first reads (opening files, Lance's dataset) land in them; after them each
    batch taken starts one read, the steady state a long training run lives in.
    """
    return (workers * prefetch or 1) * batches_per_read


def repeat_figures(times: stall.LoopTimes, synthetic_step_ms: float, resident: float | None) -> dict[str, Any]:
    """One repeat's figures for bench.json: the steady-state summary and per-step times, warm-up apart.

    ``synthetic_step_ms``: the step over a batch already on the device (the A/B baseline).
    """
    summary = stall.summarize(times.wait_s, times.compute_s)
    warm = stall.summarize(times.warmup_wait_s, times.warmup_compute_s)
    ab = 1.0 - synthetic_step_ms / summary["step_ms_mean"] if summary.get("step_ms_mean") else None
    return {**summary, "stall_ab": ab, "resident_before": resident, "first_batch_ms": times.first_batch_s * 1e3,
            "warmup_stall_fraction": warm["stall_fraction"] if times.warmup_wait_s else None,
            "wait_ms": _ms(times.wait_s), "compute_ms": _ms(times.compute_s), "warmup_wait_ms": _ms(times.warmup_wait_s)}


def _ms(seconds: list[float]) -> list[float]:
    return [round(x * 1e3, 4) for x in seconds]


def combine(repeats: list[dict[str, Any]], threshold: float = KEEP_UP_STALL) -> dict[str, Any]:
    """One table row from per-repeat figures (each with ``wait_ms``, ``compute_ms`` per steady step).

    Stall, A/B stall, warm-up stall and first batch: the median over repeats, with the
    stall's min and max; the wait percentiles pool every repeat's steady-state steps; the
    repeats themselves are kept (bench.json).
    """
    stalls = [r["stall_fraction"] for r in repeats]
    waits = [w / 1e3 for r in repeats for w in r["wait_ms"]]
    computes = [c / 1e3 for r in repeats for c in r["compute_ms"]]
    pooled = stall.summarize(waits, computes)
    pooled.pop("stall_fraction")
    pooled["steps"] = repeats[0]["steps"]  # per repeat
    call = verdict(stalls, threshold)

    def median(key: str) -> float | None:
        values = [r[key] for r in repeats if r.get(key) is not None]
        return float(np.median(values)) if values else None

    return {**pooled, "stall_fraction": float(np.median(stalls)), "stall_min": min(stalls), "stall_max": max(stalls),
            "verdict": call, "keeps_up": {KEEPS_UP: True, DOES_NOT: False}.get(call),
            "stall_ab": median("stall_ab"), "warmup_stall_fraction": median("warmup_stall_fraction"),
            "first_batch_ms": median("first_batch_ms"), "resident_before": median("resident_before"),
            "wait_ms": _ms(waits), "repeats": repeats}
