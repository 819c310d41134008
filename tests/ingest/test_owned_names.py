"""The names each writer creates are its own at every shard count: a store of 100,000+ shards (100 B
tokens at the default 1 Mi tokens a shard) could not be resumed or overwritten while the patterns
read five digits (``tokens-100000.bin`` was "a file lmdata did not write")."""

from __future__ import annotations

import pytest

from lmdata.ingest.output import _owned, foreign_files, foreign_keys
from lmdata.store.formats import memmap, parquet
from lmdata.store.layout import PROVENANCE_DIR
from lmdata.store import provenance

INDICES = [0, 99_999, 100_000, 1_234_567]


def written(index: int) -> dict[str, list[str]]:
    """What each writer names shard ``index``'s files (the writers' own name functions)."""
    return {
        "memmap": [*memmap._names(index), f"{memmap._names(index)[0]}.crc"],
        "parquet": [parquet._names(index)],
        "lance": [f"rows-{index:05d}.npy"],  # LanceWriter.write_shard: rows-<shard name>.npy
        PROVENANCE_DIR: [provenance._name(index)],
    }


@pytest.mark.parametrize("index", INDICES)
def test_every_name_a_writer_makes_is_its_own(index):
    for table, names in written(index).items():
        for name in names:
            assert _owned(table).fullmatch(name), (table, name)


def test_a_store_of_100000_shards_holds_no_foreign_file(tmp_path):
    layout = {"train": {"memmap", "parquet", "lance"}}
    for table, names in [(t, n) for i in INDICES for t, n in written(i).items()]:
        (tmp_path / "train" / table).mkdir(parents=True, exist_ok=True)
        for name in names:
            (tmp_path / "train" / table / name).write_bytes(b"")
    (tmp_path / "train" / "memmap" / "notes-100000.txt").write_bytes(b"mine")
    assert foreign_files(tmp_path, layout) == ["train/memmap/notes-100000.txt"]
    keys = [f"train/{t}/{n}" for i in INDICES for t, names in written(i).items() for n in names]
    assert foreign_keys([*keys, "train/parquet/shard-1000x.parquet"], layout) == ["train/parquet/shard-1000x.parquet"]
