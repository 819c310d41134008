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


def _pipeline(tmp_path: Path, tokenizer_dir: Path, extra: str) -> Path:
    sample = Path(PIPELINE).parents[1] / "data" / "sample.txt"
    toml = tmp_path / "p.toml"
    toml.write_text(f'[tokenizer]\ndir = "{tokenizer_dir}"\n\n[ingest]\nout = "{tmp_path / "store"}"\nformats = ["memmap"]\n'
                    f'\n[ingest.splits.train]\nsources = ["{sample}"]\n\n{extra}')
    return toml


def test_a_step_s_error_names_the_pipeline_s_keys_not_flags(tmp_path, tokenizer_dir, capsys):
    """The user of `lmdata run` wrote keys: an error raised deep in ingest or train names them, not the flags
    of the commands that share the code (it had read `--holdout 1000000: ...`)."""
    toml = _pipeline(tmp_path, tokenizer_dir, "[ingest.holdout]\nfrom = \"train\"\nto = \"validation\"\n"
                                              "documents = 1000000\n")
    code, _, err = run_cli(["run", str(toml), "--skip-bench"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 1 and line.startswith(f"error: {toml}: [ingest.holdout] documents = 1000000: split 'train' has ")
    assert "--" not in line and not (tmp_path / "store" / "manifest.json").exists()
    toml = _pipeline(tmp_path, tokenizer_dir, "[train]\nsteps = 0\n")
    code, _, err = run_cli(["run", str(toml), "--skip-bench"], capsys)
    assert code == 1 and err.strip().splitlines() == [
        f"error: {toml}: [train] steps: must be >= 1, got 0 (or give [train] tokens)"]
    toml = _pipeline(tmp_path, tokenizer_dir, "[bench]\nsteps = 1\n")  # said before the hours of training
    code, out, err = run_cli(["run", str(toml)], capsys)
    assert code == 1 and "== " not in out and err.strip().splitlines() == [
        f"error: {toml}: [bench] steps = 1: need at least 2 steady-state steps per repeat"]


def test_an_error_without_the_step_s_flags_is_left_as_it_was():
    import pytest

    from lmdata.errors import LmdataError
    from lmdata.pipeline import INGEST_KEYS, in_toml_terms

    for text in ("/x.txt: no such file", "rerun with --overwrite", "--holdouts 3: not a flag of ours",
                 "data/--kind/x.txt: no such file", "finish it with `lmdata ingest ... --format memmap`"):
        error = LmdataError(text)
        with pytest.raises(LmdataError) as raised, in_toml_terms("p.toml", INGEST_KEYS):
            raise error
        assert raised.value is error


def test_ingest_of_a_pipeline_file_names_its_keys_and_the_flags_typed_beside_it(tmp_path, tokenizer_dir, capsys):
    """`lmdata ingest PIPELINE.toml` may mix the file's keys and flags: a deep error names whichever the
    user wrote (the file's key, or the flag typed beside it)."""
    toml = _pipeline(tmp_path, tokenizer_dir, "[ingest.holdout]\nfrom = \"train\"\nto = \"validation\"\n"
                                              "documents = 1000000\n")
    code, _, err = run_cli(["ingest", str(toml)], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 1 and line.startswith(f"error: {toml}: [ingest.holdout] documents = 1000000: split 'train' has ")
    toml = _pipeline(tmp_path, tokenizer_dir, "")
    code, _, err = run_cli(["ingest", str(toml), "--holdout", "1000000"], capsys)
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: --holdout 1000000: split 'train' has ")
    toml.write_text(toml.read_text().replace('formats = ["memmap"]', 'formats = ["memmap"]\nshard_tokens = 0'))
    code, _, err = run_cli(["ingest", str(toml)], capsys)
    assert code == 1 and err.strip().splitlines() == [
        f"error: {toml}: [ingest]: shard_tokens must be positive, got 0"]
    toml = _pipeline(tmp_path, tokenizer_dir, "")
    code, _, err = run_cli(["ingest", str(toml), "--shard-tokens", "-3"], capsys)
    assert code == 1 and err.strip().splitlines()[-1] == "error: ingest: --shard-tokens must be positive, got -3"
    assert not (tmp_path / "store" / "manifest.json").exists()
