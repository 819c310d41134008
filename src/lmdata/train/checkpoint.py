"""Checkpoints: atomic, keep the last K, everything needed to continue bit-for-bit on CPU.

One file per save, ``<dir>/ckpt-00001200.pt``, written by ``torch.save`` to a temporary
name, fsynced and renamed (a crash leaves the previous checkpoint intact). Contents, all
plain containers and tensors so that ``torch.load(weights_only=True)`` reads them without
running arbitrary pickle code::

    {"version": 1, "step": 1200,
     "model": model.state_dict(), "optimizer": optimizer.state_dict(),
     "loader": [rank 0's loader state, rank 1's, ...],
     "rng": {"python": [...], "numpy": [...], "torch": ByteTensor, "cuda": [ByteTensor, ...]},
     "meta": {"model_config": {...}, "tokenizer_hash": "...", "store": "/abs/path", "split": "train",
              "split_tokens": 212345, "seq_len": 64, "doc_mask": false, ...}}
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from lmdata.io.atomic import space_for
from lmdata.errors import LmdataError

VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


CHECKPOINT_DIR = "checkpoints"
RUN_FILES = frozenset({CHECKPOINT_DIR, "metrics.jsonl", "loss.png", "sample.txt", "tensorboard", "wandb"})  # what a run writes in --out


def _checkpoint_dir_foreign(ckpt_dir: Path) -> list[str]:
    from lmdata._ownership import foreign_entries

    if not ckpt_dir.is_dir():
        return []
    return [f"{CHECKPOINT_DIR}/{n}" for n in
            foreign_entries(ckpt_dir, lambda n: n == "tokenizer" or _NAME.match(n) is not None)]


def check_run_dir(out: str | Path, flag: str = "--out") -> None:
    """Refuse a training ``--out`` that holds anything a run did not write (checkpoints included)."""
    from lmdata._ownership import check_owned_dir, refuse_foreign

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LmdataError(f"{flag} {out}: exists and is not a directory; choose another {flag}")
    if not out.is_dir() or not any(out.iterdir()):
        return
    check_owned_dir(out, "train", RUN_FILES, flag=flag, legacy=lambda d: (d / CHECKPOINT_DIR).is_dir())
    refuse_foreign(out, _checkpoint_dir_foreign(out / CHECKPOINT_DIR), flag, "a training output")


def claim_run_dir(out: str | Path, flag: str = "--out") -> Path:
    """``check_run_dir``, then create ``out`` with its ``lmdata.json`` marker."""
    from lmdata._ownership import mark

    check_run_dir(out, flag)
    return mark(Path(out), "train")


def step_of(path: str | Path) -> int:
    """The step in a checkpoint's name (``ckpt-00000300.pt`` -> 300): the one parser of these names."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise LmdataError(f"{path}: not a checkpoint name (ckpt-NNNNNNNN.pt)")
    return int(m.group(1))


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete checkpoints in ``ckpt_dir``, oldest step first (temporary files are ignored)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_dir)
    return ckpts[-1] if ckpts else None


def non_finite_loss(step: int, loss: float, precision: str, ckpt_dir: Path) -> LmdataError:
    """The error that stops a run at its first NaN/inf loss: the step, the fix that applies to this
    run's precision, and the newest checkpoint (written before that step), which is kept."""
    fix = "lower --lr" if precision == "fp32" else "lower --lr or use --precision fp32"
    kept = latest_checkpoint(ckpt_dir)
    kept = f"{kept} (before this step) is kept" if kept else "no checkpoint was written"
    return LmdataError(f"step {step}: loss is {loss} ({precision}); stopped, {kept}; {fix}")


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states as weights_only-safe values."""
    version, py_state, gauss = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(py_state), gauss],
        "numpy": [name, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def plain(obj: Any) -> Any:
    """numpy scalars/arrays -> Python numbers/tensors, recursively (weights_only can load the result)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def save_checkpoint(
    ckpt_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    *,
    loader_state: Any = None,
    meta: dict[str, Any] | None = None,
    keep: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``<ckpt_dir>/ckpt-<step>.pt`` atomically; then delete all but the newest ``keep`` (0 = keep all).
    ``extra``: more plain entries of the payload (the trainer's open log window)."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": VERSION,
        "step": int(step),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": plain(loader_state),
        "rng": rng_state(),
        "meta": plain(meta or {}),
        **plain(extra or {}),
    }
    path = ckpt_dir / checkpoint_name(step)
    tmp = ckpt_dir / f".{path.name}.tmp-{os.getpid()}"
    then = (f"the previous checkpoint ({latest.name}) is intact" if (latest := latest_checkpoint(ckpt_dir))
            else "no checkpoint was written") + "; free space, or pass another --out and resume from it"
    try:
        with space_for(path, _payload_bytes(payload), then), open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # never a half checkpoint left behind, under any name
        raise
    os.replace(tmp, path)
    fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep > 0:
        for old in list_checkpoints(ckpt_dir)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def _payload_bytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (what ``torch.save`` writes, less a small header)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v) for v in obj)
    return 0


def _refusal_reason(message: str) -> str:
    """The line of torch's weights_only refusal that says what it met (``unsupported GLOBAL posix.system``)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    found = next((ln for ln in lines if "GLOBAL" in ln or "Unsupported" in ln or "unsupported" in ln), None)
    return (found or "content the weights_only unpickler refuses")[:120].rstrip(".")


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint's payload (weights_only load); unreadable/truncated -> LmdataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise LmdataError(f"checkpoint {path}: no such file")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:4] != b"PK\x03\x04" and head[:1] != b"\x80":  # torch.save writes a zip file (a pickle, legacy)
        raise LmdataError(f"checkpoint {path}: not a checkpoint (torch.save writes a zip file; this is neither "
                          "that nor a pickle); give a run directory or its checkpoints/ckpt-*.pt")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # truncated zip, bad pickle opcode, disallowed global, ...
        if "Weights only load failed" in str(exc):  # a blocked GLOBAL, an opcode the safe unpickler refuses, ...
            raise LmdataError(
                f"checkpoint {path}: refused as unsafe -- it holds pickled Python objects or code, not only "
                f"tensors and plain values ({_refusal_reason(str(exc))}); lmdata loads checkpoints with "
                "weights_only and never runs such content: it was not written by lmdata, use a trusted checkpoint"
            ) from None
        raise LmdataError(
            f"checkpoint {path}: unreadable ({type(exc).__name__}); it is truncated or not a checkpoint -- "
            "delete it to resume from an earlier one"
        ) from None
    if not isinstance(payload, dict) or payload.get("version") != VERSION or "model" not in payload:
        raise LmdataError(f"checkpoint {path}: not an lmdata checkpoint (version {VERSION})")
    return payload


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
    map_location: str | torch.device = "cpu",
    check_meta: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Restore ``model``/``optimizer``/RNG from ``path``; returns the payload (step, loader, meta).

    ``check_meta(meta)`` runs before anything is restored, to refuse a checkpoint of
    another store, tokenizer or model with a clear message.
    """
    payload = read_checkpoint(path, map_location)
    if check_meta is not None:
        check_meta(payload.get("meta", {}))
    if model is not None:
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as exc:
            raise LmdataError(
                f"checkpoint {path}: its weights do not fit this model ({str(exc).splitlines()[0][:160]}); "
                "use the same --model and store as the run that wrote it"
            ) from None
    if optimizer is not None:
        optimizer.load_state_dict(payload["optimizer"])
    if restore_rng:
        set_rng_state(payload["rng"])
    return payload
