"""`lmdata run`: refused under torchrun (each rank would run the whole job), and --resume accepted (issue 30.9)."""

from __future__ import annotations

from pathlib import Path

from samples import run_cli

PIPELINE = str(Path(__file__).resolve().parents[2] / "pipelines" / "sample.toml")


def test_run_under_torchrun_is_refused_before_any_step(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, out, err = run_cli(["run", PIPELINE, "--skip-bench"], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: lmdata run ") and "WORLD_SIZE=2" in err and "-m lmdata train" in err
    assert len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing tokenized or ingested


def test_run_accepts_resume(capsys):
    code, out, _ = run_cli(["run", "--help"], capsys)
    assert code == 0 and "--resume" in out
    code, _, err = run_cli(["run", PIPELINE, "--resume", "--fresh"], capsys)
    assert code == 1 and "--resume and --fresh" in err
