"""The package itself: light import, console script, `python -m lmdata`."""

import subprocess
import sys

import lmdata

HEAVY = ("pyarrow", "lance", "duckdb", "polars", "ray", "torch", "datasets")


def test_import_lmdata_stays_light():
    code = (
        "import sys, lmdata, lmdata.cli, lmdata.errors;"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import lmdata pulled in: {out.stdout.strip()}"


def test_version_and_help():
    out = subprocess.run([sys.executable, "-m", "lmdata", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert lmdata.__version__ in out.stdout
    out = subprocess.run([sys.executable, "-m", "lmdata", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "tokenizer" in out.stdout


def test_every_registered_command_imports_and_has_help():
    from lmdata.cli import COMMANDS

    for name in COMMANDS:
        out = subprocess.run([sys.executable, "-m", "lmdata", name, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, f"lmdata {name} --help failed: {out.stderr[-500:]}"
        assert "Usage" in out.stdout


def test_unknown_command_is_a_clean_error():
    out = subprocess.run([sys.executable, "-m", "lmdata", "no-such-command"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
