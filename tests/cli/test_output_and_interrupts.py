"""Output that fits where it goes, and Ctrl-C: as a user's shell runs the commands.

- ``lmdata train ... > log 2>&1`` holds one whole line per log step (no ``\\r`` bar updates);
- ``--quiet`` prints only the summary;
- SIGINT to the process group (what Ctrl-C sends) during ingest, train and bench: exit 130,
  one line on stderr, no traceback (workers' included), and ``--resume`` completes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmdata.store import verify_store

from samples import SAMPLE, fingerprint

REPO = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"^step +\d+ +loss ")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """The sample, vocabulary 512, memmap, 6 documents held out (as tests/train/conftest.py's)."""
    from lmdata.cli import main

    root = tmp_path_factory.mktemp("cli-out")
    tok, store = root / "tokenizer", root / "store"
    main(["tokenizer", "train", str(SAMPLE), "--vocab-size", "512", "--out", str(tok), "--workers", "1", "-q"])
    main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tok), "--out", str(store), "--format", "memmap",
          "--holdout", "6", "--workers", "1", "-q"])
    return store


SHOW_PARQUET = ["show", "--doc", "0", "--format", "parquet"]  # makes a decoded copy (verify makes none)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), **extra}


def _start(args: list[str], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **env: str) -> subprocess.Popen:
    # a session of its own: the SIGINT below goes to the whole process group, workers included, like Ctrl-C
    # and Ctrl-C's default disposition, as a shell gives it: a child inherits an ignored SIGINT, and
    # Python then installs no KeyboardInterrupt handler (a test earlier in the same pytest process can
    # leave SIGINT ignored; the full suite met that on this machine)
    return subprocess.Popen([sys.executable, "-m", "lmdata", *args], stdout=stdout, stderr=stderr, text=True,
                            env=_env(**env), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _ctrl_c(proc: subprocess.Popen, ready, what: str) -> tuple[str, str]:
    deadline = time.monotonic() + 300
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"{what} ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    return out, err


TRAIN = ["train", "--batch-size", "2", "--seq-len", "16", "--warmup", "1", "--eval-batches", "1", "--log-every", "1"]


def test_train_log_piped_to_a_file_has_one_line_per_step(small_store, tmp_path):
    log = tmp_path / "train.log"
    with open(log, "w") as fh:  # `lmdata train ... > train.log 2>&1`, progress on (the default)
        proc = _start([*TRAIN, "--store", str(small_store), "--out", str(tmp_path / "run"), "--steps", "6"],
                      stdout=fh, stderr=subprocess.STDOUT, LMDATA_PROGRESS_SECONDS="0")
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "\r" not in text
    assert [int(line.split()[1]) for line in text.splitlines() if STEP_LINE.match(line)] == [1, 2, 3, 4, 5, 6]
    assert any(line.startswith("train: ") for line in text.splitlines())  # the plain progress lines, whole


def test_quiet_prints_only_the_summary(small_store, tmp_path):
    proc = _start([*TRAIN, "--store", str(small_store), "--out", str(tmp_path / "run"), "--steps", "3", "--quiet"])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert err == "" and len(out.splitlines()) == 1 and out.startswith("trained steps 0-3; last-step loss ")
    proc = _start(["ingest", "--input", str(SAMPLE), "--tokenizer", str(small_store / "tokenizer"), "--out",
                   str(tmp_path / "s"), "--format", "memmap", "--holdout", "6", "--quiet"])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and err == "", err
    assert [line.split(":")[0] for line in out.splitlines()] == ["train", "validation"]  # a summary line per split


def test_ctrl_c_during_train_keeps_the_last_checkpoint_and_resumes(small_store, tmp_path):
    out_dir = tmp_path / "run"
    args = [*TRAIN, "--store", str(small_store), "--out", str(out_dir), "--ckpt-every", "2", "--keep", "0"]
    proc = _start([*args, "--steps", "100000"])
    _, err = _ctrl_c(proc, lambda: len(list((out_dir / "checkpoints").glob("ckpt-*.pt"))) >= 2, "training")
    assert err.strip().splitlines()[-1] == "interrupted: rerun with --resume to continue from the last checkpoint"
    last = max(int(p.stem.split("-")[1]) for p in (out_dir / "checkpoints").glob("ckpt-*.pt"))
    resumed = _start([*args, "--steps", str(last + 2), "--resume", "--quiet"])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert out.startswith(f"trained steps {last}-{last + 2}")


def test_ctrl_c_during_ingest_then_resume_equals_an_uninterrupted_run(small_store, tmp_path):
    tok = small_store / "tokenizer"
    args = ["ingest", "--input", str(SAMPLE), "--tokenizer", str(tok), "--shard-tokens", "20000", "--workers", "2",
            "--no-progress"]
    out = tmp_path / "interrupted"
    proc = _start([*args, "--out", str(out)])
    records = out / "train" / "memmap" / "_shards"  # (Lance records a fragment only when it closes)
    _, err = _ctrl_c(proc, lambda: len(list(records.glob("*.json"))) >= 2, "the ingest")
    assert err.splitlines() == ["interrupted: rerun with --resume to continue from the completed shards"]  # no blank
    assert not (out / "manifest.json").exists()
    resumed = _start([*args, "--out", str(out), "--resume", "--quiet"])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    whole = _start([*args, "--out", str(tmp_path / "whole"), "--quiet"])
    assert whole.wait(timeout=300) == 0, whole.stderr.read()
    assert fingerprint(out) == fingerprint(tmp_path / "whole") and verify_store(out).ok


def test_ctrl_c_before_an_ingest_wrote_anything_offers_no_resume(small_store, tmp_path, monkeypatch, capsys):
    """Nothing to resume: the hint would send the user to --resume on a store that does not exist."""
    import lmdata.ingest
    from lmdata.cli import main

    def interrupted(*args, out_dir=None, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmdata.ingest, "ingest", interrupted)
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(small_store / "tokenizer"), "--out", str(out), "-q"])
    assert e.value.code == 130 and capsys.readouterr().err.splitlines() == ["interrupted"] and not out.exists()


def test_ctrl_c_before_a_first_checkpoint_offers_no_resume(small_store, tmp_path, monkeypatch, capsys):
    import lmdata.train.loop
    from lmdata.cli import main

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmdata.train.loop, "train", interrupted)
    with pytest.raises(SystemExit) as e:
        main(["train", "--store", str(small_store), "--out", str(tmp_path / "t"), "-q"])
    assert e.value.code == 130 and capsys.readouterr().err.splitlines() == ["interrupted"]


def test_ctrl_c_during_bench(small_store, tmp_path):
    args = ["bench", "--store", str(small_store), "--out", str(tmp_path / "b"), "--format", "memmap",
            "--loader-workers", "1", "--batch-size", "2", "--seq-len", "16", "--compute", "simulated",
            "--step-ms", "20", "--steps", "100000", "--gpu", ""]
    proc = _start(args)
    started = time.monotonic()
    _, err = _ctrl_c(proc, lambda: time.monotonic() - started > 8, "the bench")  # mid-cell: cells run minutes
    assert err.strip().splitlines()[-1] == "interrupted"
    assert not (tmp_path / "b" / "bench.json").exists()
    done = _start([*args[:-4], "--steps", "4", "--quiet"])
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert (tmp_path / "b" / "bench.json").is_file() and err == ""


def test_a_warning_is_one_line(sample_store, tmp_path):
    """A warning reaches the user as one `warning:` line, not Python's file, line and source line (the
    nearly-full-disk warning had printed `tokens = self._ensure_copy(i)` after it)."""
    proc = subprocess.run([sys.executable, "-m", "lmdata", "show", str(sample_store), *SHOW_PARQUET[1:]],
                          capture_output=True,
                          text=True, env=_env(LMDATA_CACHE_DIR=str(tmp_path / "cache"), LMDATA_CACHE_KEEP_FREE="0.999"))
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "nearly full" in line]
    assert warned and all(line.startswith("warning: ") for line in warned), proc.stderr
    assert "_ensure_copy" not in proc.stderr and "RuntimeWarning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("setting, command", [("LMDATA_CACHE_KEEP_FREE=1", SHOW_PARQUET),
                                              ("LMDATA_PARQUET_CACHE_BYTES=abc", ["verify"]),
                                              ("LMDATA_MAP_SHARDS=2", ["verify"]), ("LMDATA_LANCE_IO=zz", ["verify"])])
def test_a_bad_setting_is_not_reported_as_a_damaged_store(sample_store, tmp_path, setting, command):
    """`lmdata verify` had listed an out-of-range LMDATA_CACHE_KEEP_FREE among the store's problems, with
    "re-ingest with --overwrite" (and the window offsets it was reading)."""
    name, value = setting.split("=")
    argv = [command[0], str(sample_store), *command[1:]]
    proc = subprocess.run([sys.executable, "-m", "lmdata", *argv], capture_output=True,
                          text=True, env=_env(LMDATA_CACHE_DIR=str(tmp_path / "cache"), **{name: value}))
    assert proc.returncode == 1 and ("error: " + name in proc.stderr or "$" + name in proc.stderr), proc.stderr
    assert "re-ingest" not in proc.stderr and "offsets" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_ctrl_c_while_the_cli_is_still_imported_is_one_line():
    """A Ctrl-C in a command's first ~50 ms lands inside an import, before the CLI can catch it: it had
    printed an import traceback."""
    code = ("import builtins\nreal = builtins.__import__\n"
            "def guarded(name, *args, **kw):\n"
            "    if name == 'lmdata.cli':\n        raise KeyboardInterrupt\n    return real(name, *args, **kw)\n"
            "builtins.__import__ = guarded\nfrom lmdata._console import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n")
