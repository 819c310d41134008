"""A store replaced while a training run reads it (issue 19, case 4): the readers' lock.

``lmdata ingest --overwrite`` of a store a loader is reading is refused, naming the reading
pid, and the loader runs to the end on the store it opened -- with 0 and 2 workers, every
format; once the loader is gone the overwrite goes through, and a reader made from the old
``Store`` object refuses to read the new store.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from samples import SAMPLE

from lmdata.data import make_loader
from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.store import open_store

L, B = 32, 4


def _text(path: Path, start: int, n_docs: int) -> Path:
    docs = SAMPLE.read_text().split("\n<|endoftext|>\n")[start:start + n_docs]
    path.write_text("\n<|endoftext|>\n".join(docs))
    return path


def _overwrite_cli(store: Path, tokenizer_dir: Path, text: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmdata", "ingest", "--input", str(text), "--tokenizer",
                           str(tokenizer_dir), "--out", str(store), "--format", "memmap,parquet,lance",
                           "--shard-tokens", "4000", "--overwrite"], capture_output=True, text=True)


def _batches(loader) -> list[np.ndarray]:
    return [inputs.numpy().copy() for inputs, _ in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_overwrite_while_a_loader_reads_is_refused_naming_the_reader(tmp_path, tokenizer_dir, workers):
    old, new = _text(tmp_path / "old.txt", 0, 12), _text(tmp_path / "new.txt", 20, 12)
    store = tmp_path / "store"
    ingest({"train": SourceSpec((str(old),))}, tokenizer_dir, store, formats=["memmap", "parquet", "lance"],
           shard_tokens=4000, workers=1, progress=False, log=None)
    for fmt in ("memmap", "parquet", "lance"):
        ds = open_store(store).dataset("train", L, format=fmt)
        expected = _batches(make_loader(ds, B, num_workers=0, seed=1))
        loader = make_loader(ds, B, num_workers=workers, seed=1, start_method="forkserver" if fmt == "lance" else None)
        it = iter(loader)
        got = [next(it)[0].numpy().copy() for _ in range(3)]  # mid-epoch: workers started, shards mapped
        done = _overwrite_cli(store, tokenizer_dir, new)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "is being read right now by pid" in lines[0] and str(store) in lines[0]
        got += [inputs.numpy().copy() for inputs, _ in it]
        assert all(np.array_equal(a, b) for a, b in zip(got, expected)) and len(got) == len(expected)
        del ds, loader, it
        gc.collect()
    stale = open_store(store)  # opened before the overwrite, read after it
    done = _overwrite_cli(store, tokenizer_dir, new)
    assert done.returncode == 0, done.stderr
    with pytest.raises(LmdataError, match="the store was replaced .* open it again"):
        stale.dataset("train", L)
    assert open_store(store).n_tokens("train") != stale.n_tokens("train")


def test_a_reader_of_a_store_being_written_is_refused(tmp_path, tokenizer_dir):
    import fcntl

    store = tmp_path / "store"
    ingest({"train": SourceSpec((str(_text(tmp_path / "a.txt", 0, 4)),))}, tokenizer_dir, store, formats=["memmap"],
           shard_tokens=4000, workers=1, progress=False, log=None)
    st = open_store(store)
    with open(store / ".lock", "ab") as fh:  # what an ingest holds for its whole run
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        with pytest.raises(LmdataError, match=r"an ingest \(pid \d+\) is writing this store right now"):
            st.dataset("train", L)
