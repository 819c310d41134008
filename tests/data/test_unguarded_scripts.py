"""The README's Python API example, and an ingest, as plain scripts without a main guard.

spawn/forkserver workers re-run an unguarded ``__main__``; the loader then forks or reads in
threads, the ingest pool forks (Linux) or uses threads (``lmdata._mp``). The scripts print a
line at top level: it must appear once (no worker re-ran the script).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from formats import FORMATS
from samples import SAMPLE

REPO = Path(__file__).resolve().parents[2]

API_EXAMPLE = '''
import sys
from lmdata.store import open_store
from lmdata.data import make_loader

print("top level ran", flush=True)
store = open_store(sys.argv[1])
ds = store.dataset("train", seq_len=256, format=sys.argv[2])
loader = make_loader(ds, batch_size=8, num_workers=2, seed=0)
for step, (inputs, targets) in enumerate(loader):
    if step == 2:
        state = loader.state_dict()
        break
reference = make_loader(ds, batch_size=8, num_workers=0, seed=0)
for step, (want, _) in enumerate(reference):
    if step == 2:
        break
assert (want == inputs).all() and state["batch"] == 3
print("ok", store.tokenizer().decode(inputs[0, :12].tolist())[:5], flush=True)
'''

INGEST = '''
import sys
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec

print("top level ran", flush=True)
ingest({"train": SourceSpec((sys.argv[1],))}, sys.argv[2], sys.argv[3], formats=["memmap", "lance"], workers=2,
       progress=False, log=None)
print("ok", flush=True)
'''


def _run_script(tmp_path: Path, code: str, *args: str) -> str:
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("top level ran") == 1, proc.stdout
    return proc.stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_readme_api_example_unguarded_with_two_workers(sample_store, tmp_path, fmt):
    assert "ok " in _run_script(tmp_path, API_EXAMPLE, str(sample_store), fmt)


def test_unguarded_ingest_script(tmp_path, tokenizer_dir):
    from lmdata.store import verify_store

    _run_script(tmp_path, INGEST, str(SAMPLE), str(tokenizer_dir), str(tmp_path / "store"))
    assert verify_store(tmp_path / "store").ok


def test_guard_detection(tmp_path):
    code = ("import sys\nfrom lmdata._mp import reimports_unguarded_main as r\n"
            "print('top level ran', r('spawn'), r('fork'))\nif __name__ == '__main__':\n    print(r('spawn'))\n")
    assert _run_script(tmp_path, code).split() == ["top", "level", "ran", "True", "False", "False"]


INGEST_THEN_READ = '''
import sys
from lmdata.data import make_loader
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.store import open_store

print("top level ran", flush=True)
ingest({"train": SourceSpec((sys.argv[1],))}, sys.argv[2], sys.argv[3], formats=["lance"], workers=2,
       progress=False, log=None)
ds = open_store(sys.argv[3]).dataset("train", seq_len=256, format="lance")
inputs, _ = next(iter(make_loader(ds, batch_size=8, num_workers=2, seed=0)))
want, _ = next(iter(make_loader(ds, batch_size=8, num_workers=0, seed=0)))
assert (want == inputs).all()
print("ok", flush=True)
'''


def test_unguarded_script_reads_the_lance_store_it_just_wrote_with_two_workers(tmp_path, tokenizer_dir):
    """Lance's runtime runs in this process after the ingest, so the workers may not be forked, and
    unguarded they may not be spawned either: the reads go to threads (``ThreadReads``)."""
    assert "ok" in _run_script(tmp_path, INGEST_THEN_READ, str(SAMPLE), str(tokenizer_dir), str(tmp_path / "store"))
