"""`lmdata train --log jsonl,tensorboard,wandb`: the TensorBoard event files and the offline W&B
run hold the same scalars as metrics.jsonl, read back with each tool's own reader."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from samples import run_cli

FLAGS = ["--batch-size", "4", "--warmup", "2", "--eval-batches", "1", "--log-every", "2", "--eval-every", "2",
         "--no-progress", "--gpu", "h100"]  # --gpu: an MFU to log on CPU
NAMES = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "perf/tokens_per_s",
         "mfu": "perf/mfu", "data_wait": "perf/data_wait"}


def expected(out: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as {tracker name: {step: value}}."""
    want: dict[str, dict[int, float]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["split"] == "validation":
            want.setdefault("val/loss", {})[rec["step"]] = rec["loss"]
        else:
            for key, name in NAMES.items():
                want.setdefault(name, {})[rec["step"]] = rec[key]
    return want


def tensorboard_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for tag, events in got.items():  # one value per step: a resumed run's steps replace the killed run's
        assert len({step for step, _ in events}) == len(events), (tag, events)
    return {tag: dict(events) for tag, events in got.items()}


def wandb_records(path: Path) -> list:
    """The protobuf records of a .wandb file (W&B's LevelDB-style log: a 7-byte header, 32 KiB blocks
    of chunks, each with a 7-byte header: CRC32, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> dict[str, dict[int, float]]:
    history: dict[str, dict[int, float]] = {}
    for record in wandb_records(next(run_dir.glob("run-*.wandb"))):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    history.setdefault(key, {})[record.history.step.num] = json.loads(item.value_json)
    return history


def check_same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]], what: str) -> None:
    for name, by_step in want.items():
        assert name in got, f"{what} has no {name}: {sorted(got)}"
        assert sorted(got[name]) == sorted(by_step), (what, name)
        for step, value in by_step.items():
            assert got[name][step] == pytest.approx(value, rel=1e-6), (what, name, step)


def test_tensorboard_and_offline_wandb_hold_the_metrics(sample_store, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "--store", str(sample_store), "--out", str(out), "--steps", "4",
                            "--log", "jsonl,tensorboard,wandb", *FLAGS], capsys)
    assert code == 0, err
    want = expected(out)
    assert sorted(want["train/loss"]) == [2, 4] and sorted(want["val/loss"]) == [2, 4]
    assert all(v > 0 for v in want["perf/mfu"].values())
    check_same(tensorboard_scalars(out / "tensorboard"), want, "TensorBoard")
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs  # offline: nothing sent, the run stays in --out
    check_same(wandb_history(runs[0]), want, "W&B")


def test_resume_continues_the_tensorboard_run(sample_store, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--store", str(sample_store), "--out", str(out), "--log", "tensorboard", *FLAGS]
    assert run_cli(base + ["--steps", "4", "--ckpt-every", "2"], capsys)[0] == 0
    (out / "checkpoints" / "ckpt-00000004.pt").unlink()  # as if killed after step 4's log, before its checkpoint
    code, _, err = run_cli(base + ["--steps", "6", "--resume"], capsys)
    assert code == 0, err
    got, want = tensorboard_scalars(out / "tensorboard"), expected(out)
    assert sorted(want["train/loss"]) == [2, 4, 6]
    check_same(got, want, "TensorBoard")  # step 4 once: the resumed run's value, not the killed one's


@pytest.mark.parametrize("value,message", [
    ("jsonl,mlflow", "--log 'mlflow': not a tracker; choose from jsonl, tensorboard, wandb"),
])
def test_unknown_tracker_is_one_line(sample_store, tmp_path, capsys, value, message):
    code, _, err = run_cli(["train", "--store", str(sample_store), "--out", str(tmp_path / "r"), "--log", value], capsys)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_missing_package_names_the_extra(sample_store, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb sees: ImportError
    code, _, err = run_cli(["train", "--store", str(sample_store), "--out", str(tmp_path / "r"), "--log", "wandb"],
                           capsys)
    assert code == 1 and "pip install 'lmdata[track]'" in err and len(err.strip().splitlines()) == 1, err


def test_wandb_without_a_login_is_one_line_and_leaves_no_run(sample_store, tmp_path):
    """W&B online with no API key anywhere (no WANDB_API_KEY, no netrc, no terminal to ask on): W&B raises
    its UsageError at ``wandb.init``, after the run directory was made; the user gets one line saying
    what to do, and the directory this run created is gone. A fresh process: W&B keeps global state
    from an earlier ``wandb.init`` in the same interpreter (the offline test's)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
               NETRC=str(tmp_path / "home" / ".netrc"))
    out = tmp_path / "r"
    done = subprocess.run([sys.executable, "-m", "lmdata", "train", "--store", str(sample_store), "--out", str(out),
                           "--steps", "2", "--log", "wandb", "--no-progress", *FLAGS],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "--log wandb: W&B did not start" in last and "wandb login" in last and "WANDB_MODE=offline" in last, last
    assert "Traceback" not in done.stderr and not out.exists()
