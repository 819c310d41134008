"""The package as a user installs it: the sdist and the manylinux wheel that scripts/build.sh
makes, and the data side (everything that needs no torch) on every supported Python.

The wheel must carry a manylinux tag (a package index refuses plain ``linux_x86_64``) and
the LICENSE, not the tests; the sdist must carry what its own tests and the README's
commands need. Each supported Python gets a fresh venv with the sdist installed (its C
accelerator compiled there) and runs tokenizer train, ingest into all three formats,
verify, inspect, sql and show on the shipped sample. torch is never installed in those
venvs: the CPU wheel exists only for 3.11, and the data side must not need it.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHONS = ("3.10", "3.12", "3.13")
pytestmark = pytest.mark.slow


def find_python(version: str) -> str | None:
    """``pythonX.Y`` from PATH or pyenv; None when this machine lacks it."""
    for candidate in [f"python{version}", *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python3")))]:
        try:
            out = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    return None


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = os.environ | {"DIST": str(out), "PYTHON": sys.executable}
    subprocess.run(["bash", str(REPO / "scripts" / "build.sh")], check=True, env=env, cwd=REPO,
                   capture_output=True, timeout=600)
    return out


def test_wheel_is_manylinux_with_license_and_no_tests(dist):
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1 and "manylinux" in wheels[0].name, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert any("_fastbpe" in n and n.endswith(".so") for n in names)
    assert any("io/_preads" in n and n.endswith(".so") for n in names)  # the loader's batched reads
    assert any("data/_permute" in n and n.endswith(".so") for n in names)  # the shuffle's bijection
    assert not any(n.startswith("tests/") or n.endswith(".c") for n in names)


def test_sdist_carries_tests_data_and_scripts(dist):
    (sdist,) = dist.glob("*.tar.gz")
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for needed in ("LICENSE", "README.md", "data/sample.txt", "pipelines/sample.toml", "scripts/test.sh",
                   "scripts/setup.sh", "bench/loader.py", "tests/tokenizer/bpe_reference.py",
                   "src/lmdata/tokenizer/_fastbpe.c", "src/lmdata/tokenizer/_fastbpe_regex.c", "src/lmdata/io/_preads.c",
                   "src/lmdata/data/_permute.c", "setup.py"):
        assert needed in names, needed
    assert not any("__pycache__" in n for n in names)


@pytest.mark.parametrize("version", PYTHONS)
def test_data_side_on_python(version, dist, tmp_path):
    python = find_python(version)
    if python is None:
        pytest.skip(f"Python {version} is not installed here (pyenv install {version})")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    (sdist,) = dist.glob("*.tar.gz")
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(sdist)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                            "print(u.find_spec('torch') is None)"], capture_output=True, text=True)
    assert probe.stdout.strip() == "True", "the data side must not pull torch"
    lmdata = str(venv / "bin" / "lmdata")
    sample = str(REPO / "data" / "sample.txt")
    tok, store = str(tmp_path / "tok"), str(tmp_path / "store")
    steps = [
        ["tokenizer", "train", sample, "--vocab-size", "400", "--out", tok, "--workers", "1", "--no-progress"],
        ["ingest", "--input", sample, "--tokenizer", tok, "--out", store, "--holdout", "6", "--workers", "1",
         "--no-progress"],
        ["verify", store],
        ["inspect", store],
        ["sql", store, "SELECT split, count(*) AS docs FROM docs GROUP BY split ORDER BY split"],
        ["show", store, "--split", "validation", "--doc", "0"],
    ]
    for args in steps:
        run = subprocess.run([lmdata, *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert run.returncode == 0, f"lmdata {' '.join(args)} on Python {version}: {run.stderr[-2000:]}"
    assert "validation" in run.stdout or run.stdout.strip()  # show printed the document
    version_line = subprocess.run([lmdata, "--version"], capture_output=True, text=True).stdout
    assert "0.1.0" in version_line
