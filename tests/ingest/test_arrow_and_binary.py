"""Arrow IPC / Feather files and a ``datasets.save_to_disk`` directory as sources; binary files given as text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec, iter_documents
from lmdata.store import open_store

DOCS = ["Once upon a time there was a cat.", "second <|endoftext|> inline is text", "", "third\nwith lines", "é ü 中文"]
KEPT = [d for d in DOCS if d]  # empty documents are skipped by every kind


def _jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)), encoding="utf-8")
    return path


def _table() -> pa.Table:
    return pa.table({"id": list(range(len(DOCS))), "text": DOCS})


def _save_to_disk_layout(path: Path) -> Path:
    """What ``datasets.Dataset.save_to_disk`` writes: Arrow *stream* files listed in state.json (two shards)."""
    path.mkdir()
    table = _table()
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for name, part in zip(names, (table.slice(0, 2), table.slice(2))):
        with pa.OSFile(str(path / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part, max_chunksize=1)
    (path / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                 "_fingerprint": "0", "_split": None}))
    (path / "dataset_info.json").write_text(json.dumps({"features": {"id": {}, "text": {}}}))
    return path


def _arrow_file(tmp_path: Path) -> Path:
    path = tmp_path / "docs.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, _table().schema) as writer:
        writer.write_table(_table(), max_chunksize=2)
    return path


def _feather(tmp_path: Path) -> Path:
    path = tmp_path / "docs.feather"
    feather.write_feather(_table(), str(path))
    return path


def _tokens(store: Path) -> np.ndarray:
    st = open_store(store)
    return np.concatenate([st.document("train", i, "memmap") for i in range(st.manifest.splits["train"].n_docs)])


@pytest.mark.parametrize("make", [_arrow_file, _feather, lambda p: _save_to_disk_layout(p / "saved")],
                         ids=["arrow-file", "feather", "save_to_disk"])
def test_arrow_sources_ingest_to_the_jsonl_token_stream(tmp_path, tokenizer_dir, make):
    source = make(tmp_path)
    assert [d.text for d in iter_documents(SourceSpec((str(source),)))] == KEPT  # kind auto: by name / state.json
    ingest({"train": SourceSpec((str(_jsonl(tmp_path)),))}, tokenizer_dir, tmp_path / "from-jsonl",
           formats=["memmap"], workers=1, progress=False, log=None)
    ingest({"train": SourceSpec((str(source),), "arrow")}, tokenizer_dir, tmp_path / "from-arrow",
           formats=["memmap"], workers=1, progress=False, log=None)
    assert np.array_equal(_tokens(tmp_path / "from-arrow"), _tokens(tmp_path / "from-jsonl"))


def test_arrow_source_errors_name_the_column(tmp_path):
    with pytest.raises(LmdataError, match="no column 'body'.*--text-field"):
        list(iter_documents(SourceSpec((str(_arrow_file(tmp_path)),), text_field="body")))
    with pytest.raises(LmdataError, match="holds int64, not text"):
        list(iter_documents(SourceSpec((str(_arrow_file(tmp_path)),), text_field="id")))


@pytest.mark.parametrize("errors", ["strict", "replace"])
@pytest.mark.parametrize("kind", ["text", "lines", "jsonl"])
def test_binary_file_given_as_text_is_refused(tmp_path, kind, errors):
    arrow = _save_to_disk_layout(tmp_path / "saved") / "data-00000-of-00002.arrow"
    noise = tmp_path / "noise.txt"
    noise.write_bytes(np.random.default_rng(0).integers(128, 256, 20_000, dtype=np.uint8).tobytes())
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"looks like text\n" * 100 + b"\0\0\0\1\2")
    for path, why in [(arrow, "an Arrow IPC file; pass kind arrow"), (noise, "invalid UTF-8"), (nul, "NUL byte")]:
        with pytest.raises(LmdataError, match=why) as info:
            list(iter_documents(SourceSpec((str(path),), kind, errors=errors)))
        assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_binary_file_is_refused_by_the_cli_with_errors_replace(tmp_path, tokenizer_dir):
    from click.testing import CliRunner

    from lmdata.cli import cli

    arrow = _save_to_disk_layout(tmp_path / "saved") / "data-00000-of-00002.arrow"
    res = CliRunner().invoke(cli, ["ingest", "--input", str(arrow), "--kind", "text", "--errors", "replace",
                                   "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "s"), "-q"])
    assert res.exit_code != 0 and "Arrow IPC file" in str(res.exception)
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_a_text_file_with_some_latin1_is_still_text(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(("plain English text with a few accents: caf" + "\xe9 " * 3).encode("latin-1") * 50)
    docs = list(iter_documents(SourceSpec((str(path),), "text", errors="replace")))
    assert len(docs) == 1 and "\ufffd" in docs[0].text


@pytest.mark.parametrize("where", [10, 200_000])  # in the sniffed head, and past it
def test_a_stray_nul_byte_in_a_text_file_says_how_to_go_on(tmp_path, where):
    """Issue 29 (smaller): one stray NUL refused the whole file with no way forward."""
    path = tmp_path / "nearly.txt"
    data = bytearray(b"plain text line\n" * 20_000)
    data[where] = 0
    path.write_bytes(bytes(data))
    with pytest.raises(LmdataError, match=rf"NUL byte at byte {where}\b.*" + re.escape("remove them first: tr -d '\\000' < IN > OUT")):
        list(iter_documents(SourceSpec((str(path),), "text")))
    cleaned = tmp_path / "clean.txt"
    cleaned.write_bytes(bytes(data).replace(b"\0", b""))  # what that command writes
    assert len(list(iter_documents(SourceSpec((str(cleaned),), "text")))) == 1
