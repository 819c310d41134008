"""Where a run's logged scalars go: metrics.jsonl always, TensorBoard and Weights & Biases on ``--log``.

The loop hands every metrics.jsonl record to ``Trackers.log``; each tracker writes it in its
own form. TensorBoard and W&B get the same numbers under the names litgpt and nanoGPT
users look for (``SCALARS``): ``train/loss``, ``val/loss``, ``train/lr``, ``train/grad_norm``,
``perf/tokens_per_s``, ``perf/mfu``, ``perf/data_wait`` (the fraction of step time spent
waiting for data), with the step as the x axis. Both are an optional extra
(``pip install 'lmdata[track]'``), imported only when named. Only rank 0 opens trackers.

Files, all inside ``--out``: ``metrics.jsonl``; ``tensorboard/`` (``tensorboard --logdir
OUT/tensorboard``); ``wandb/`` (the W&B run directory; ``WANDB_MODE=offline`` keeps it
local, ``wandb sync OUT/wandb/offline-run-*`` uploads it later). On ``--resume``,
TensorBoard drops the events past the checkpoint's step (``purge_step``) and W&B continues
the same run id (kept in ``wandb/lmdata-run-id``; W&B ignores a step it already has, so the
steps between the checkpoint and the kill keep the killed run's values there).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from lmdata.errors import LmdataError
from lmdata.train.metrics import METRICS

# metrics.jsonl key of a "train" record -> the tracker's name
SCALARS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens": "train/tokens",
    "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu", "data_wait": "perf/data_wait",
    "model_flops_per_s": "perf/model_flops_per_s",
}
TB_DIR, WANDB_DIR = "tensorboard", "wandb"


def scalars(rec: dict) -> dict[str, float]:
    """A metrics.jsonl record as the trackers' scalars (None values, e.g. MFU without --gpu, left out)."""
    if rec.get("split") == "validation":
        return {"val/loss": float(rec["loss"])}
    out = {name: float(rec[key]) for key, name in SCALARS.items() if rec.get(key) is not None}
    out.update({f"mix/{source}": float(share) for source, share in (rec.get("mix") or {}).items()})
    return out


class Tracker(Protocol):
    def log(self, rec: dict) -> None: ...

    def close(self) -> None: ...


class JsonlTracker:
    """metrics.jsonl: one JSON object per record (loss.png, ``lmdata run`` and resume read it)."""

    def __init__(self, out: Path) -> None:
        self.fh = open(out / METRICS, "a")

    def log(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def _missing(name: str, package: str) -> LmdataError:
    return LmdataError(f"--log {name}: the {package} package is not installed; pip install 'lmdata[track]' "
                       f"(or {package}), or drop {name} from --log")


class TensorBoardTracker:
    """Event files in OUT/tensorboard via torch's SummaryWriter."""

    def __init__(self, out: Path, start: int) -> None:
        try:
            import tensorboard  # noqa: F401  (SummaryWriter needs it; its own error is a long traceback)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "tensorboard") from None
        # purge_step: a resumed run overwrites what the killed one logged after its checkpoint
        self.writer = SummaryWriter(str(out / TB_DIR), purge_step=start + 1 if start else None)

    def log(self, rec: dict) -> None:
        for name, value in scalars(rec).items():
            self.writer.add_scalar(name, value, rec["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in OUT/wandb; project $WANDB_PROJECT or ``lmdata``, name the --out folder's."""

    def __init__(self, out: Path, start: int, config: dict) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "wandb") from None
        root = out / WANDB_DIR
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "lmdata-run-id"
        run_id = id_file.read_text().strip() if start and id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n")
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "lmdata", name=out.resolve().name,
                                  id=run_id, resume="allow", dir=str(out), config=config, settings=settings)
        except wandb.errors.Error as exc:  # no API key, no network, a refused project: one line, no traceback
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LmdataError(f"--log wandb: W&B did not start ({first}); run `wandb login` or set WANDB_API_KEY, "
                              "or set WANDB_MODE=offline to keep the run on this machine") from None

    def log(self, rec: dict) -> None:
        self.run.log(scalars(rec), step=rec["step"])

    def close(self) -> None:
        self.run.finish()


def check_installed(names: list[str]) -> None:
    """Before any training: a tracker whose package is missing is one line naming the extra."""
    import importlib

    for name in names:
        if name in ("tensorboard", "wandb"):
            try:
                importlib.import_module(name)
            except ImportError:
                raise _missing(name, name) from None


class Trackers:
    """The run's trackers: metrics.jsonl first, then those ``--log`` names (none on ranks > 0)."""

    def __init__(self, names: list[str], out: Path, start: int, config: dict, main: bool = True) -> None:
        self.trackers: list[Tracker] = []
        if not main:
            return
        try:
            self.trackers.append(JsonlTracker(out))
            if "tensorboard" in names:
                self.trackers.append(TensorBoardTracker(out, start))
            if "wandb" in names:
                self.trackers.append(WandbTracker(out, start, config))
        except BaseException:
            self.close()
            raise

    def log(self, rec: dict) -> None:
        for tracker in self.trackers:
            tracker.log(rec)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def start_trackers(names: list[str], out: Path, start: int, config: dict, main: bool, created: bool) -> Trackers:
    """The run's ``Trackers``; one that cannot start (W&B without a login) is the run's error, and a run
    directory this run ``created`` is removed again: no half-made run left behind."""
    try:
        return Trackers(names, out, start, config, main=main)
    except LmdataError:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
