"""Show a bench result: a terminal (or Markdown) table, the JSON file, two PNG plots.

Output files are written under temporary names and renamed, so a crashed bench never
leaves a half-written ``bench.json`` that looks valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmdata.bench import verdict
from lmdata.io import atomic

COLUMNS = [
    # header, key, format
    ("cache", "cache", "{}"),
    ("cached", "resident_before", "{}"),
    ("format", "format", "{}"),
    ("workers", "workers", "{}"),
    ("stall", "stall_fraction", "{:.1%}"),  # median over the repeats, steady state
    ("spread", "stall_spread", "{}"),  # min-max over the repeats
    ("warm-up stall", "warmup_stall_fraction", "{:.1%}"),
    ("stall A/B", "stall_ab", "{:.1%}"),
    ("wait p50 ms", "wait_ms_p50", "{:.2f}"),
    ("p95", "wait_ms_p95", "{:.2f}"),
    ("p99", "wait_ms_p99", "{:.2f}"),
    ("max", "wait_ms_max", "{:.1f}"),
    ("1st batch ms", "first_batch_ms", "{:.0f}"),
    ("loader tok/s", "loader_tokens_per_s", "{:,.0f}"),
    ("headroom", "headroom", "x{:.2f}"),
    ("keeps up", "verdict", "{}"),  # every repeat's stall under KEEP_UP_STALL (5%): verdict.py
    ("workers RSS MB", "workers_rss_mb", "{:.0f}"),
    ("USS MB", "workers_uss_mb", "{:.0f}"),
]


NOTES = {
    "stall": "stall: median over {repeats} of the steady-state stall; spread: their min-max; warm-up stall: "
             "the {warmup} steps after the first, left out of it (the first step is 1st batch ms)",
    "keeps up": "keeps up: yes when every repeat stalls under {threshold:.0%}, NO when every one stalls "
                "{threshold:.0%} or more, too noisy when they fall on both sides (more --steps or --repeats, or a "
                "quieter machine, may decide it); the loader's rate against the need is the headroom column",
    "stall A/B": "stall A/B: 1 - synthetic-batch step / real step (nanoGPT's A/B); '-' where the real steps ran "
                 "faster than the synthetic ones: timing noise on a shared machine, no data cost measurable",
}


def columns(runs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """COLUMNS less those whose optional package was missing (USS needs psutil)."""
    has_uss = any("workers_uss_mb" in r.get("memory", {}) for r in runs)
    return [c for c in COLUMNS if c[1] != "workers_uss_mb" or has_uss]


def _cells(run: dict[str, Any], cols: list[tuple[str, str, str]]) -> list[str]:
    mem = run.get("memory", {})
    # a bench.json from before the repeats has keeps_up only, and no spread
    call = run.get("verdict") or (verdict.KEEPS_UP if run["keeps_up"] else verdict.DOES_NOT)
    lo, hi = run.get("stall_min"), run.get("stall_max")
    row = {**run, "workers_rss_mb": mem.get("workers_rss_mb", 0.0), "workers_uss_mb": mem.get("workers_uss_mb", 0.0),
           "verdict": verdict.SHOWN[call], "stall_spread": "-" if lo is None else f"{lo:.1%}-{hi:.1%}",
           "resident_before": "?" if run.get("resident_before") is None else f"{run['resident_before']:.0%}"}
    cells = []
    for _, key, fmt in cols:
        value = row.get(key)
        hidden = value is None or (key == "stall_ab" and value < 0)
        cells.append("-" if hidden else fmt.format(value))
    return cells


def notes(result: dict[str, Any]) -> list[str]:
    """One line per column that needs reading instructions."""
    runs, repeats = result["runs"], result["config"].get("repeats", 1)
    warm = sorted({r.get("warmup_steps", 0) for r in runs})
    warmup = str(warm[0]) if len(warm) == 1 else f"{warm[0]}-{warm[-1]}"
    threshold = result["config"].get("keep_up_stall", verdict.KEEP_UP_STALL)
    once = "1 repeat (no spread: never too noisy)" if repeats == 1 else f"{repeats} repeats"
    return [text.format(threshold=threshold, repeats=once, warmup=warmup) for text in NOTES.values()]


def _load(load: float | None) -> str:
    return "load avg unknown (no os.getloadavg here)" if load is None else f"load avg {load:.1f} at start"


def header_lines(result: dict[str, Any]) -> list[str]:
    """What was measured and against what rate, in two or three lines."""
    c = result["config"]
    compute = (f"simulated {c['step_ms']:.3g} ms/step" if c["compute"] == "simulated"
               else f"model {c['model']} on {c['device']}")
    lines = [f"store {c['store']} split {c['split']}: batch {c['batch_size']} x seq_len {c['seq_len']}, "
             f"{c['steps_run']} steady steps x {c.get('repeats', 1)} repeats, compute {compute}, prefetch {c['prefetch']}"
             + (f" reads of {c['batches_per_read']} batches" if "batches_per_read" in c else "") + "; "
             f"{result['machine']['cpus']} CPUs, " + _load(result['machine'].get('loadavg_1m_at_start'))]
    rate = f"{result['consume_tokens_per_s']:,.0f} tokens/s"
    if p := result.get("plan"):
        model = (f"{p['preset']} ({p['params']:,} params, {p['flops_per_token']:.3g} FLOPs/token) on {p['gpu']} "
                 f"at {p['mfu']:.0%} MFU needs {p['tokens_per_s_needed']:,.0f} tokens/s")
        lines.append(model if result["consume_source"] == "plan" else model + "; the measured step consumes " + rate)
    else:
        lines.append(f"the measured compute step consumes {rate} (median over cells)")
    return lines


def table(result: dict[str, Any], markdown: bool = False) -> str:
    """The result as an aligned text table, or a Markdown table."""
    cols = columns(result["runs"])
    heads = [h for h, _, _ in cols]
    rows = [_cells(r, cols) for r in result["runs"]]
    if markdown:
        out = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: Path) -> None:
    atomic.write_file(Path(path), lambda p: p.write_text(json.dumps(result, indent=1) + "\n"))


def plot_title(what: str, result: dict[str, Any]) -> str:
    """A short title: what the plot shows, then batch, compute and store name (the table has the rest)."""
    c = result["config"]
    compute = (f"simulated {c['step_ms']:.3g} ms steps" if c["compute"] == "simulated"
               else f"{c['model']} steps on {c['device']}")
    if p := result.get("plan"):
        compute += f" ({p['preset']} on {p['gpu']} at {p['mfu']:.0%} MFU)"
    return f"{what}\nbatch {c['batch_size']} x {c['seq_len']}, {compute}, store {'/'.join(Path(str(c['store'])).parts[-2:])}"


def _title(fig: Any, what: str, result: dict[str, Any]) -> None:
    """The title wrapped to the figure's width, so neither edge is cut."""
    import textwrap

    width_chars = int(fig.get_figwidth() * 12)  # ~12 characters per inch at 9 pt
    lines = [w for line in plot_title(what, result).splitlines() for w in textwrap.wrap(line, width_chars)]
    fig.suptitle("\n".join(lines), fontsize=9)
    fig.tight_layout()  # (matplotlib >= 3.3 makes room for the suptitle itself)


def plot_stall(result: dict[str, Any], path: Path) -> None:
    """Bars: median stall per format (min-max of the repeats), grouped by worker count; one panel per cache state."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = result["runs"]
    modes = list(dict.fromkeys(r["cache"] for r in runs))
    formats = list(dict.fromkeys(r["format"] for r in runs))
    workers = list(dict.fromkeys(r["workers"] for r in runs))
    threshold = result["config"].get("keep_up_stall", verdict.KEEP_UP_STALL)
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False, sharey=True)
    width = 0.8 / len(formats)
    for ax, mode in zip(axes[0], modes):
        for i, fmt in enumerate(formats):
            cells = [next((r for r in runs if (r["cache"], r["format"], r["workers"]) == (mode, fmt, w)), {})
                     for w in workers]
            vals = np.array([c.get("stall_fraction", np.nan) for c in cells]) * 100
            lo = np.array([c.get("stall_min", c.get("stall_fraction", np.nan)) for c in cells]) * 100
            hi = np.array([c.get("stall_max", c.get("stall_fraction", np.nan)) for c in cells]) * 100
            ax.bar(np.arange(len(workers)) + (i - (len(formats) - 1) / 2) * width, vals, width, label=fmt,
                   yerr=[vals - lo, hi - vals], capsize=2, error_kw={"elinewidth": 0.8})
        ax.axhline(threshold * 100, color="0.3", linestyle="--", linewidth=0.8, label=f"{threshold:.0%}")
        ax.set_xticks(np.arange(len(workers)), [str(w) for w in workers])
        ax.set_xlabel("loader workers")
        ax.set_title(f"{mode} page cache")
        ax.grid(axis="y", alpha=0.3)
    top = max(max(r.get("stall_max", r["stall_fraction"]), threshold) for r in runs) * 100
    axes[0][0].set_ylim(0, top * 1.3 + 1)  # room for the legend above the bars
    axes[0][0].set_ylabel("stall (%): median, min-max")
    axes[0][0].legend(loc="upper center", ncol=len(formats) + 1, fontsize=8)
    _title(fig, "Stall fraction per format and loader workers", result)
    atomic.write_file(Path(path), lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)


def plot_waits(result: dict[str, Any], path: Path) -> None:
    """Wait-time distribution: the empirical CDF of per-step wait per format and worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    runs = result["runs"]
    modes = list(dict.fromkeys(r["cache"] for r in runs))
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False, sharey=True)
    formats = list(dict.fromkeys(r["format"] for r in runs))
    workers = list(dict.fromkeys(r["workers"] for r in runs))
    styles = ["-", "--", ":", "-."]
    for ax, mode in zip(axes[0], modes):
        for r in (r for r in runs if r["cache"] == mode):
            w = np.sort(np.maximum(np.asarray(r["wait_ms"], dtype=float), 1e-3))
            ax.step(w, np.arange(1, w.size + 1) / w.size, where="post", label=f"{r['format']} w={r['workers']}",
                    color=f"C{formats.index(r['format'])}", linestyle=styles[workers.index(r["workers"]) % 4])
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlapped the major ones
        ax.set_xlabel("wait per step (ms, log)")
        ax.set_title(f"{mode} page cache")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of steps")
    axes[0][-1].legend(fontsize=7)
    _title(fig, "Loader wait per step (CDF)", result)
    atomic.write_file(Path(path), lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)


OUT_FILES = ("bench.json", "table.txt", "stall.png", "waits.png")


def _legacy_bench_dir(out: Path) -> bool:
    """A bench directory written before the ``lmdata.json`` marker: its bench.json is ours."""
    try:
        result = json.loads((Path(out) / "bench.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and isinstance(result.get("runs"), list) and "config" in result


def check_out(out: Path, flag: str = "--out") -> None:
    """Refuse a bench ``out`` that holds files a bench did not write, or is a file (missing or empty is
    fine); nothing is created: the directory is made when the results are written (``write_all``)."""
    from lmdata._ownership import check_output_dir

    check_output_dir(Path(out), "bench", frozenset(OUT_FILES), flag=flag, legacy=_legacy_bench_dir)


def claim_out(out: Path, flag: str = "--out") -> Path:
    """Make ``out`` a bench output directory, refusing one that holds files lmdata did not write."""
    from lmdata._ownership import claim_output_dir

    return claim_output_dir(Path(out), "bench", frozenset(OUT_FILES), flag=flag, legacy=_legacy_bench_dir)


def write_all(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """bench.json, stall.png, waits.png and table.txt under ``out``; returns their paths."""
    out = claim_out(out)
    paths = {"json": out / "bench.json", "table": out / "table.txt",
             "stall_png": out / "stall.png", "waits_png": out / "waits.png"}
    text = "\n".join(header_lines(result)) + "\n\n" + table(result) + "\n\n" + "\n".join(notes(result)) + "\n"
    atomic.write_file(paths["table"], lambda p: p.write_text(text))
    plot_stall(result, paths["stall_png"])
    plot_waits(result, paths["waits_png"])
    write_json(result, paths["json"])  # last: its presence means the run finished
    return paths
