"""`lmdata bench` and `lmdata plan` end to end, on a store ingested from the shipped sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def lmdata(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "lmdata", *args], capture_output=True, text=True, cwd=ROOT)
    if check and out.returncode != 0:
        raise AssertionError(f"lmdata {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out


def test_bench_every_format_writes_table_json_and_plots(sample_store, tmp_path):
    from lmdata.store import open_store

    formats = open_store(sample_store).formats("train")
    assert {"memmap", "parquet", "lance"} <= set(formats)
    out = tmp_path / "out"
    # One worker: the path a trainer takes (forked readers); workers=0 runs in the model test.
    res = lmdata("bench", "--store", str(sample_store), "--format", "all", "--loader-workers", "1",
                 "--batch-size", "4", "--seq-len", "64", "--steps", "6", "--step-ms", "2",
                 "--gpu", "h100", "--model", "tiny", "--cache", "both", "--repeats", "1", "--out", str(out))
    result = json.loads((out / "bench.json").read_text())
    cells = {(r["cache"], r["format"], r["workers"]) for r in result["runs"]}
    assert cells == {(c, f, 1) for c in ("warm", "cold") for f in formats}
    for r in result["runs"]:
        assert 0.0 <= r["stall_fraction"] <= 1.0 and r["steps"] == 6 and r["warmup_steps"] == 1 * 2 * 4  # auto
        assert r["wait_ms_p50"] <= r["wait_ms_p95"] <= r["wait_ms_p99"] <= r["wait_ms_max"]
        assert r["loader_tokens_per_s"] > 0 and r["keeps_up"] == (r["stall_fraction"] < 0.05)  # 1 repeat: yes/no
        if r["cache"] == "cold" and r["resident_before"] is not None:
            assert r["resident_before"] < 0.5, "eviction left the shard files cached"
    assert result["runs"][-1]["memory"]["workers"] >= 1  # workers=1 runs had a worker process
    for name in ("stall.png", "waits.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "table.txt").read_text()
    assert all(f in table and f in res.stdout for f in formats)
    assert "on h100 at 40% MFU needs" in res.stdout


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """`lmdata ARGS` in this process (no interpreter start-up): exit code, stdout, stderr."""
    from lmdata.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_json_keeps_every_repeat_and_the_table_its_spread(sample_store, tmp_path, capsys):
    """Issue 30.6: the verdict comes from repeats of the steady state, the warm-up apart."""
    import numpy as np

    out = tmp_path / "out"
    code, stdout, err = run_main(capsys, "bench", "--store", str(sample_store), "--format", "memmap",
                                 "--loader-workers", "0", "--batch-size", "4", "--seq-len", "64", "--steps", "4",
                                 "--warmup-steps", "3", "--repeats", "2", "--step-ms", "2", "--gpu", "",
                                 "--out", str(out), "--no-progress")
    assert code == 0, err
    result = json.loads((out / "bench.json").read_text())
    assert result["config"]["repeats"] == 2 and result["config"]["keep_up_stall"] == 0.05
    (r,) = result["runs"]
    assert r["warmup_steps"] == 3 and r["steps"] == 4 and len(r["repeats"]) == 2
    for rep in r["repeats"]:
        assert len(rep["wait_ms"]) == len(rep["compute_ms"]) == 4 and len(rep["warmup_wait_ms"]) == 3
        assert rep["first_batch_ms"] > 0 and 0.0 <= rep["warmup_stall_fraction"] <= 1.0
    stalls = [rep["stall_fraction"] for rep in r["repeats"]]
    assert r["stall_fraction"] == np.median(stalls) and (r["stall_min"], r["stall_max"]) == (min(stalls), max(stalls))
    assert r["verdict"] == ("keeps up" if max(stalls) < 0.05 else "does not" if min(stalls) >= 0.05 else "too noisy")
    assert len(r["wait_ms"]) == 8  # the CDF plot pools both repeats' steady steps
    table = (out / "table.txt").read_text()
    assert "spread" in table and "median over 2 repeats" in table and "under 5%" in table
    assert f"{min(stalls):.1%}-{max(stalls):.1%}" in stdout


def test_real_model_steps_are_timed(sample_store):
    # One cell in this process (the CLI runs it in a spawned one, as the test above shows).
    from lmdata.bench.run import measure_cell
    from lmdata.config import BenchConfig
    from lmdata.store import open_store

    vocab = open_store(sample_store).manifest.vocab_size
    cfg = BenchConfig(store=sample_store, workers=[0], batch_size=2, seq_len=32, steps=3, compute="model",
                      model="tiny", cache=["warm"], device="cpu", repeats=1)
    (row,) = measure_cell(cfg, "memmap", 0, 3, None, vocab, "cpu")
    one = BenchConfig(store=sample_store, workers=[0], batch_size=2, seq_len=32, steps=3, compute="simulated",
                      step_ms=1.0, cache=["warm"], device="cpu", batches_per_read=1, repeats=1)
    import lmdata.data

    asked = []
    real = lmdata.data.make_loader
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmdata.data, "make_loader", lambda *a, **kw: asked.append(kw["batches_per_read"]) or real(*a, **kw))
        (single,) = measure_cell(one, "lance", 0, 3, 1.0, vocab, "cpu")  # one batch per read works too
    assert single["steps"] == 3 and single["loader_tokens_per_s"] > 0 and asked and set(asked) == {1}
    assert row["steps"] == 3 and row["compute_ms_mean"] > 0 and row["synthetic"]["compute_ms_mean"] > 0
    assert 0.0 <= row["stall_fraction"] < 1.0


def test_bench_errors_are_one_line(sample_store, tmp_path, capsys):
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--format", "zarr", "--step-ms", "1")
    assert code == 1 and "--format 'zarr'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--gpu", "tpu9")  # unknown accelerator
    assert code == 1 and "tpu9" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--step-ms", "1", "--batches-per-read", "0")
    assert code == 1 and "--batches-per-read 0" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(tmp_path / "nope"), "--step-ms", "1")
    assert code == 1 and "nope" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--step-ms", "1", "--repeats", "0")
    assert code == 1 and "--repeats 0" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--step-ms", "1", "--warmup-steps", "-2")
    assert code == 1 and "--warmup-steps -2" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--step-ms", "1", "--loader-workers", "0",
                            "--warmup-steps", "100000")  # more than the split's batches
    assert code == 1 and "--warmup-steps 100000" in err and len(err.strip().splitlines()) == 1
    for value in ("nan", "inf"):  # they passed the ">= 0" check: a traceback from the timer
        code, _, err = run_main(capsys, "bench", "--store", str(sample_store), "--step-ms", value)
        assert code == 1 and err.strip() == f"error: --step-ms {value}: give a finite number", err
    code, _, err = run_main(capsys, "train", "--store", str(sample_store), "--lr", "nan", "--out", str(tmp_path / "t"))
    assert code == 1 and err.strip() == "error: --lr nan: give a finite number", err


def test_plan_prints_the_models_own_parameter_count(capsys):
    import torch

    from lmdata.model import PRESETS, TransformerLM

    kw = PRESETS["small"]
    with torch.device("meta"):
        n = sum(p.numel() for p in TransformerLM(**kw).parameters())
    code, out, _ = run_main(capsys, "plan", "--model", "small", "--gpu", "h100", "--batch-size", "32", "--json")
    p = json.loads(out)
    assert p["params"] == n and p["vocab_size"] == kw["vocab_size"] and p["seq_len"] == kw["context_length"]
    assert p["tokens_per_s_needed"] > 0
    code, out, _ = run_main(capsys, "plan", "--model", "small", "--gpu", "h100")
    assert code == 0 and f"{n:,}" in out and "tokens/s needed" in out


def test_plan_sizes_the_model_as_train_does_from_the_store_and_the_size_flags(sample_store, capsys):
    """Issue 30.5: plan said 22,696,448 parameters (its default 10,000 ids) where bench on the store
    said 16,650,752 (the store's vocabulary), and refused --layers."""
    import types

    import torch

    from lmdata.model import TransformerLM
    from lmdata.store import open_store
    from lmdata.train.defaults import build_model_config

    vocab = open_store(sample_store).manifest.vocab_size
    for flags, sizes in (([], {}), (["--layers", "1", "--d-model", "64"], {"layers": 1, "d_model": 64})):
        cfg = types.SimpleNamespace(model="small", context=0, **{"d_model": 0, "layers": 0, "heads": 0, "d_ff": 0,
                                                                   **sizes})
        with torch.device("meta"):
            n = sum(p.numel() for p in TransformerLM(**build_model_config(cfg, vocab)).parameters())
        code, out, err = run_main(capsys, "plan", "--model", "small", "--store", str(sample_store), *flags, "--json")
        p = json.loads(out)
        assert code == 0 and p["params"] == n and p["vocab_size"] == vocab, err
    assert p["preset"] == "small (d_model 64, num_layers 1)"
    code, _, err = run_main(capsys, "plan", "--layers", "-1")
    assert code == 1 and "--layers -1" in err and len(err.strip().splitlines()) == 1


def test_a_repeated_format_or_worker_count_is_measured_once():
    """--format memmap,memmap --loader-workers 0,0 had measured four identical cells."""
    from lmdata.config import BenchConfig

    cfg = BenchConfig(store="x", formats=["memmap", "lance", "memmap"], workers=[0, 0, 2], step_ms=1.0)
    cfg.check()
    assert (cfg.formats, cfg.workers) == (["memmap", "lance"], [0, 2])
