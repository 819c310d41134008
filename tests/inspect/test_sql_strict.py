"""Every path that serves tokens is as strict as the loader (issue 19, case 1).

Before: ``lmdata sql`` over a store whose Lance data file was tampered with (same size, other
bytes) served other totals with exit 0, while the loader and ``verify`` refused the store.
Now the rows views verify each shard before serving it, so the query refuses in one line
naming the shard, as the loader does -- for each format that offers rows.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from lmdata.cli import main
from lmdata.errors import LmdataError
from lmdata.inspect import sql
from lmdata.store import open_store
from lmdata.store.manifest import read_manifest, write_manifest

QUERY = "SELECT split, sum(len(tokens)) FROM tokens GROUP BY split ORDER BY split"


@pytest.mark.parametrize("fmt", ["lance", "parquet"])
def test_tampered_rows_are_refused_by_sql_like_the_loader(sample_store, tmp_path, capsys, fmt):
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    manifest = read_manifest(store)
    for info in manifest.splits.values():  # the tokens view reads this format
        info.formats = {f: s for f, s in info.formats.items() if f in ("memmap", fmt)}
    write_manifest(store, manifest)
    pristine = sql(store, QUERY)[1]
    shard = manifest.splits["train"].formats[fmt][0]
    path = store / "train" / fmt / shard.files[0].path
    data = bytearray(path.read_bytes())
    for k in range(len(data) // 3, len(data) // 3 + 64):  # same size, other bytes
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    # the loader refuses what it reads (Parquet's page CRC-32s, Lance's row CRC-32s); SQL reads other
    # columns too (doc_id, ...), which those do not cover -- so SQL verifies each shard whole below
    starts = np.arange(0, shard.n_tokens - 1024, 1024)  # every window of the shard: the damage is among them
    with pytest.raises(LmdataError, match=f"shard {shard.name}"):
        open_store(store).reader("train", fmt).windows(starts, 1024)
    with pytest.raises(LmdataError, match=f"^sql: {path}: shard {shard.name} fails its xxh128") as err:
        sql(store, QUERY)
    assert "\n" not in str(err.value) and pristine
    with pytest.raises(SystemExit) as exit_:
        main(["sql", str(store), QUERY])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(lines) == 1 and "xxh128" in lines[0]
