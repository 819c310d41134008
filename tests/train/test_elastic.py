"""Elastic resume under torchrun (gloo, CPU): a 2-rank run killed after a checkpoint resumes
with 1 and with 3 ranks, keeping the global batch (--grad-accum 3 -> 6 and 2), and trains on
what the uninterrupted run trained on: the same tokens, the same losses step by step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmdata.train.checkpoint import list_checkpoints, read_checkpoint, step_of

STEPS, CUT = 8, 4
FLAGS = ["--batch-size", "2", "--seq-len", "32", "--warmup", "2", "--val-split", "none", "--log-every", "1",
         "--ckpt-every", "2", "--keep", "0", "--no-progress"]


def torchrun(ranks: int, store: Path, out: Path, *extra: str, wait: bool = True):
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", str(ranks),
           "-m", "lmdata", "train", "--store", str(store), "--out", str(out), "--steps", str(STEPS), *FLAGS, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, ... (torchrun starts its workers in sessions of their own)."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            kids = [int(c) for c in task.read_text().split()]
            out += kids
            todo += kids
    return out


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every worker at once, as a lost node or a scheduler's kill does."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def train_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == "train"]


@pytest.mark.slow
def test_two_rank_run_killed_resumes_with_one_and_three_ranks(sample_store, tmp_path):
    ref = torchrun(2, sample_store, tmp_path / "ref", "--grad-accum", "3")
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-2000:]
    cut = tmp_path / "cut"
    proc = torchrun(2, sample_store, cut, "--grad-accum", "3", wait=False)
    deadline = time.monotonic() + 240
    while not (cut / "checkpoints" / f"ckpt-{CUT:08d}.pt").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    kill_job(proc)
    for ckpt in list_checkpoints(cut / "checkpoints"):  # resume from step CUT whenever the kill landed
        if step_of(ckpt) > CUT:
            ckpt.unlink()
    reference = train_records(tmp_path / "ref")
    final_ref = read_checkpoint(tmp_path / "ref" / "checkpoints" / f"ckpt-{STEPS:08d}.pt")
    for ranks, accum in ((1, 6), (3, 2)):
        out = tmp_path / f"resumed-{ranks}"
        shutil.copytree(cut, out)
        run = torchrun(ranks, sample_store, out, "--grad-accum", "3", "--resume")
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert f"2 -> {ranks} ranks, --grad-accum 3 -> {accum}" in run.stdout
        got = train_records(out)
        assert [r["step"] for r in got] == list(range(1, STEPS + 1))
        assert [r["tokens"] for r in got] == [r["tokens"] for r in reference]  # 2 x 3 x 2 x 32 tokens a step
        for mine, theirs in zip(got[CUT:], reference[CUT:]):  # the same sequences in every step
            assert mine["loss"] == pytest.approx(theirs["loss"], abs=2e-4), (ranks, mine["step"])
        final = read_checkpoint(out / "checkpoints" / f"ckpt-{STEPS:08d}.pt")
        assert len(final["loader"]) == ranks and final["meta"]["grad_accum"] == accum
        assert {s["position"] for s in final["loader"]} == {s["position"] for s in final_ref["loader"]}


@pytest.mark.slow
def test_a_global_batch_that_does_not_split_is_refused_naming_what_works(sample_store, tmp_path):
    out = tmp_path / "one"
    first = subprocess.run([sys.executable, "-m", "lmdata", "train", "--store", str(sample_store), "--out", str(out),
                            "--steps", "2", *FLAGS, "--grad-accum", "3"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    run = torchrun(2, sample_store, out, "--grad-accum", "3", "--resume")
    assert run.returncode != 0
    assert "cannot be split over 2 ranks; resume with --nproc_per_node in 1, 3" in run.stdout + run.stderr
