"""The main job end to end, as a newcomer runs it: `lmdata run pipelines/sample.toml`.

The shipped pipeline is copied with its paths pointed into tmp_path and a smaller bench,
then run through the real CLI in a subprocess (fewer training steps via --steps). Each
artifact is checked by the component that owns it: verify passes, the checkpoint loads
with ``load_checkpoint``, bench.json holds every format, the loss curve is a PNG. A second
run with more steps reuses the tokenizer and bench, resumes the training run, and resumes
an ingest whose manifest is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = 20


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def dump_toml(doc: dict, prefix: str = "") -> str:
    """A tiny TOML writer for pipeline files (scalars, lists, nested tables)."""
    scalars = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    text = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(line + "\n" for line in scalars)
    for key, value in doc.items():
        if isinstance(value, dict):
            text += "\n" + dump_toml(value, f"{prefix}.{key}" if prefix else key)
    return text


def sample_pipeline(tmp: Path) -> Path:
    """pipelines/sample.toml with its inputs read from the repo and its outputs in ``tmp``."""
    doc = tomllib.loads((REPO / "pipelines" / "sample.toml").read_text())
    doc["tokenizer"]["dir"] = str(tmp / "tokenizer")
    doc["tokenizer"]["train_files"] = [str((REPO / "pipelines" / p).resolve()) for p in doc["tokenizer"]["train_files"]]
    doc["ingest"]["out"] = str(tmp / "store")
    for split in doc["ingest"]["splits"].values():
        split["sources"] = [str((REPO / "pipelines" / p).resolve()) for p in split["sources"]]
    doc["train"]["out"] = str(tmp / "train")
    doc["bench"].update(out=str(tmp / "bench"), workers=[0], steps=4, batch_size=8, seq_len=64)
    doc["sample"]["max_tokens"] = 20
    path = tmp / "pipeline.toml"
    path.write_text(dump_toml(doc))
    return path


def lmdata_run(pipeline: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "lmdata", "run", str(pipeline), "--no-progress", *args],
                          cwd=pipeline.parent, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_sample_pipeline_end_to_end(tmp_path: Path) -> None:
    import torch

    from lmdata.model.transformer import TransformerLM
    from lmdata.store import open_store, verify_store
    from lmdata.train.checkpoint import load_checkpoint, read_checkpoint

    pipeline = sample_pipeline(tmp_path)
    out = lmdata_run(pipeline, "--steps", str(STEPS))

    store = open_store(tmp_path / "store")
    assert set(store.splits) == {"train", "validation"}
    assert verify_store(store.path).ok

    ckpt = tmp_path / "train" / "checkpoints" / f"ckpt-{STEPS:08d}.pt"
    meta = read_checkpoint(ckpt)["meta"]
    model = TransformerLM(**meta["model_config"])
    payload = load_checkpoint(ckpt, model)
    assert payload["step"] == STEPS and meta["tokenizer_hash"] == store.manifest.tokenizer_hash
    with torch.no_grad():
        assert torch.isfinite(model(torch.zeros(1, 8, dtype=torch.long))).all()

    metrics = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in metrics} == {"train", "validation"}
    assert (tmp_path / "train" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "train" / "sample.txt").read_text().startswith("Once upon a time")

    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert {r["format"] for r in bench["runs"]} == set(store.formats("train")) == {"memmap", "parquet", "lance"}
    for name in ("stall.png", "waits.png", "table.txt"):
        assert (tmp_path / "bench" / name).is_file()

    for artifact in (store.path, ckpt, tmp_path / "train" / "loss.png", tmp_path / "bench" / "bench.json"):
        assert str(artifact) in out  # the closing summary says where everything is

    # Rerun with more steps: tokenizer and bench are reused, training resumes at STEPS, and
    # a store whose manifest is gone (as after an interrupted ingest) is resumed, not redone.
    manifest = json.loads((store.path.local_path / "manifest.json").read_text())
    (store.path.local_path / "manifest.json").unlink()
    again = lmdata_run(pipeline, "--steps", str(STEPS + 5))
    assert "tokenizer: reusing" in again and "bench: reusing" in again
    assert "holds an interrupted ingest; resuming it" in again and "shards reused" in again
    assert json.loads((store.path.local_path / "manifest.json").read_text())["splits"] == manifest["splits"]
    assert f"resuming {ckpt}" in again
    assert (tmp_path / "train" / "checkpoints" / f"ckpt-{STEPS + 5:08d}.pt").is_file()
    assert "reused: tokenizer, bench" in again


def test_bad_pipeline_section_is_one_line_naming_the_key(tmp_path: Path) -> None:
    doc = tomllib.loads((REPO / "pipelines" / "sample.toml").read_text())
    doc["bench"]["worker"] = [0]  # a typo of `workers`
    path = tmp_path / "bad.toml"
    path.write_text(dump_toml(doc))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "lmdata", "run", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line, no traceback
    assert "[bench]: unknown key 'worker'" in proc.stderr and not (tmp_path / "runs").exists()


def test_the_jsonl_example_trains_its_tokenizer_on_text_then_ingests_jsonl(tmp_path: Path) -> None:
    """On a fresh clone its tokenizer step had read data/sample.txt as JSON Lines (the split's kind) and
    failed; and its tokenizer was the demo's folder, which its --fresh then deleted."""
    from lmdata.store import open_store

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "data").symlink_to(REPO / "data")
    pipeline = tmp_path / "pipelines" / "jsonl-example.toml"
    pipeline.write_text((REPO / "pipelines" / "jsonl-example.toml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "lmdata", "ingest", str(pipeline), "--no-progress"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = open_store(tmp_path / "runs" / "jsonl-store")
    assert store.manifest.splits["train"].n_docs + store.manifest.splits["validation"].n_docs == 10
    assert (tmp_path / "runs" / "jsonl-tokenizer" / "vocab.json").is_file()
    assert not (tmp_path / "runs" / "sample-tokenizer").exists()
