"""The run's records: metrics.jsonl (one JSON object per logged step, written by train/trackers.py) and loss.png."""

from __future__ import annotations

import json
from pathlib import Path

METRICS = "metrics.jsonl"


def truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop records past the checkpoint's step (they will be logged again)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))


def plot_losses(metrics_path: Path, png_path: Path) -> None:
    """Train and validation loss by step, from metrics.jsonl (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(7, 4))
    for split, style in (("train", "-"), ("validation", "o-")):
        pts = [(r["step"], r["loss"]) for r in records if r["split"] == split]
        if pts:
            ax.plot(*zip(*pts), style, label=split)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
