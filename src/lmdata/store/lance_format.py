"""The Lance format: one Lance dataset per split, one fragment per shard.

On disk, per split (``<store>/<split>/lance/``, a Lance dataset pinned to file format 2.1)::

    data/<uuid>.lance      the shard's fragment: rows as in the Parquet format
                           (doc_id int64, token_offset int64, tokens list<uint16|uint32>,
                           documents cut into pieces of at most 1,024 tokens)
    _versions/, _transactions/   Lance's own commit log (written once, in ``finish``)
    rows-00000.npy         int64 [2, n_rows + 1]: each row's first token within the shard
                           (then n_tokens) and each row's document within the shard (then n_docs)
    _shards/00000.json     completion record, whose ``extra["fragment"]`` is the fragment's
                           ``FragmentMetadata`` JSON, so a resumed ingest reuses the fragment

A shard is written as an uncommitted fragment; ``finish`` commits all of them at once
(``LanceOperation.Overwrite``, fragments in shard order, so dataset row ``r`` is the
``r``-th row of the stream). ``cleanup_partial`` deletes data files no completed shard
references: what an interrupted shard or commit left behind.

Reader: the dataset opens lazily in each process (Lance is not fork-safe once open) to
check its committed row count; a batch of windows reads the rows covering them with one
``take_rows`` per shard it touches on the fragment's file (see ``LanceReader._take``),
rows located with the ``rows-*.npy`` sidecar of each shard a batch touches (loaded on first touch; kept out of
the manifest, which would otherwise grow by ~n_tokens / 700 entries). On that first touch
the shard's files (fragment and sidecar) are checked against the manifest (``verify``:
sha256 or size, see ``checksum.verify_shard``); Lance 2.1 files carry no checksums of
their own, so with ``verify="size"`` a flipped bit may decode as a wrong token. A decode
error is an ``LmdataError`` naming the shard. ``doc_starts`` reads only the sidecar;
``arrow_rows`` (for ``lmdata sql``) is a fresh dataset scanner per scan.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store import files
from lmdata.store.checksum import DEFAULT_VERIFY, at_offsets, check_sizes, check_verify_mode, file_info, \
    read_error, shard_file_path, verify_shard
from lmdata.store.parquet import pieces, row_doc_starts, rows_table
from lmdata.store.protocol import ShardInfo
from lmdata.store.windows import check_windows, plan, shard_bounds

STORAGE_VERSION = "2.1"  # pinned: a newer pylance default must not change what we write
# Fragment file readers kept open per process (each holds its file's page table; opening
# one costs ~0.4 ms here, so a store of many shards re-opens some instead of growing).
MAX_OPEN_FILES = 256


def _schema(dtype: np.dtype) -> Any:
    import pyarrow as pa

    token = pa.from_numpy_dtype(np.dtype(dtype))
    return pa.schema([("doc_id", pa.int64()), ("token_offset", pa.int64()), ("tokens", pa.list_(token))])


class LanceWriter(files.RecordedShardWriter):
    """Uncommitted fragments per shard, one commit in ``finish``."""

    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo:
        from lance.fragment import LanceFragment

        tokens, doc_starts = self.shard_arrays(tokens, doc_starts)
        table = rows_table(tokens, doc_starts, first_doc, first_token)
        stale = files.forget(self.format_dir, index)
        frag = LanceFragment.create(
            str(self.format_dir), table, fragment_id=index, schema=_schema(self.dtype),
            data_storage_version=STORAGE_VERSION,
        )
        meta = frag.to_json()
        data_files = [f"data/{f['path']}" for f in meta["files"]]
        for rel in data_files:  # fresh uuid names: a lost name means a redone shard, so no dir fsync here
            files.fsync_file(self.format_dir / rel)
        row_starts, doc_of_row = pieces(doc_starts)
        rows = np.stack([row_starts, np.append(doc_of_row, len(doc_starts) - 1)])
        rows_name = f"rows-{index:05d}.npy"
        replaced = files.write_atomic(self.format_dir / rows_name, lambda p: files.save_npy(p, rows))
        shard = ShardInfo(
            name=f"{index:05d}", n_docs=len(doc_starts) - 1, n_tokens=len(tokens), first_doc=first_doc,
            first_token=first_token, files=[file_info(self.format_dir, rel) for rel in data_files + [rows_name]],
            extra={"rows": int(len(doc_of_row)), "fragment": meta},
        )
        files.write_record(self.format_dir, index, shard, sync_dirs=[self.format_dir] if replaced else [])
        for old in stale.files if stale else []:  # a rewritten shard's old fragment (uncommitted)
            if old.path.startswith("data/") and old.path not in data_files:
                (self.format_dir / old.path).unlink(missing_ok=True)
        return shard

    def finish(self, shards: list[ShardInfo]) -> None:
        """Commit every shard's fragment, in shard order, as the dataset's new version."""
        import lance
        from lance.fragment import FragmentMetadata

        frags = [FragmentMetadata.from_json(json.dumps(s.extra["fragment"])) for s in shards]
        # the fragments' and sidecars' names (fsynced per directory here, not per shard) before the commit names them
        files.sync_dirs(self.format_dir / "data", self.format_dir, self.format_dir / files.RECORD_DIR)
        lance.LanceDataset.commit(str(self.format_dir), lance.LanceOperation.Overwrite(_schema(self.dtype), frags))
        for sub in ("_versions", "_transactions"):
            d = self.format_dir / sub
            if d.is_dir():
                for p in d.iterdir():
                    if p.is_file():
                        files.fsync_file(p)
                files.fsync_dir(d)
        files.fsync_dir(self.format_dir)
        files.prune(self.format_dir, shards)

    def cleanup_partial(self) -> None:
        """Remove temp files and data files that no completed shard references."""
        files.remove_temporaries(self.format_dir)
        keep = {f.path for s in self.completed().values() for f in s.files}
        data = self.format_dir / "data"
        if data.is_dir():
            for p in data.iterdir():
                if f"data/{p.name}" not in keep:
                    p.unlink()


class LanceReader:
    """The rows covering a batch's windows, one ``take_rows`` per touched fragment; opens files per process."""

    # Lance's runtime, once started in a process, crashes forked children (pylance warns
    # "lance is not fork-safe"); the loader then forks from a clean forkserver instead.
    fork_safe = False
    direct = True  # read fragment files directly (see ``_take``); False: ``LanceDataset.take``

    def __init__(
        self, format_dir: Path, shards: list[ShardInfo], dtype: np.dtype, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.format_dir = Path(format_dir)
        self.shards = list(shards)
        self.dtype = np.dtype(dtype)
        self.verify = check_verify_mode(verify)
        self._shard_bounds = shard_bounds(self.shards).tolist()
        self.n_tokens = self._shard_bounds[-1]
        self._doc_bounds = np.cumsum([0] + [s.n_docs for s in self.shards])
        self._row_base = np.cumsum([0] + [int(s.extra.get("rows", 0)) for s in self.shards]).tolist()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._ds: Any = None
        self._row_bounds: dict[int, list[int]] = {}  # shard -> global first token of each row, then its end
        self._files: OrderedDict[int, Any] = OrderedDict()  # shard -> its fragment's LanceFileReader (LRU)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_ds=None, _row_bounds={}, _files=OrderedDict(), _pid=-1)
        return state

    def check(self) -> None:
        check_sizes(self.format_dir, self.shards)

    def _rows(self, i: int, sidecar_only: bool = False) -> np.ndarray:
        """Shard ``i``'s sidecar: [row token starts + n_tokens, row documents + n_docs]."""
        shard = self.shards[i]
        # first touch of the shard: its fragment and sidecar (only the sidecar for the document index)
        verify_shard(self.format_dir, shard, self.verify, shard.files[-1:] if sidecar_only else None)
        path = shard_file_path(self.format_dir, shard, shard.files[-1])
        try:
            rows = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise read_error(path, shard, exc) from exc
        if rows.shape != (2, shard.extra["rows"] + 1) or rows[0, -1] != shard.n_tokens:
            raise LmdataError(f"{path}: shard {shard.name} row index does not match the manifest; run `lmdata verify`")
        return rows

    def _bounds(self, i: int) -> list[int]:
        bounds = self._row_bounds.get(i)
        if bounds is None:
            bounds = self._row_bounds[i] = (self._rows(i)[0] + self._shard_bounds[i]).tolist()
        return bounds

    def _open(self) -> Any:
        if self._pid != os.getpid():
            self._reset()
        if self._ds is None:
            import lance

            self.check()
            try:
                self._ds = lance.dataset(str(self.format_dir))
            except Exception as exc:
                raise LmdataError(
                    f"{self.format_dir}: the Lance dataset cannot be opened ({exc}); run `lmdata verify`"
                ) from exc
            if self._ds.count_rows() != self._row_base[-1]:
                raise LmdataError(
                    f"{self.format_dir}: Lance dataset has {self._ds.count_rows()} rows, the manifest says "
                    f"{self._row_base[-1]}; re-run the ingest with --resume or --overwrite"
                )
        return self._ds

    def _file(self, i: int) -> Any:
        """Shard ``i``'s fragment file opened for ``take_rows`` (None if the fragment is not one file)."""
        if i in self._files:
            self._files.move_to_end(i)
            return self._files[i]
        from lance.file import LanceFileReader

        shard = self.shards[i]
        reader = None
        if len(shard.files) == 2 and self.direct:  # else several data files in the fragment: dataset take
            path = shard_file_path(self.format_dir, shard, shard.files[0])
            try:
                reader = LanceFileReader(str(path), columns=["tokens"])
                n_rows = reader.metadata().num_rows
            except Exception as exc:
                raise read_error(path, shard, exc) from exc
            if n_rows != shard.extra["rows"]:
                raise LmdataError(f"{path}: shard {shard.name} holds {n_rows} rows, the manifest says "
                                  f"{shard.extra['rows']}; run `lmdata verify`")
        self._files[i] = reader
        if len(self._files) > MAX_OPEN_FILES:
            self._files.popitem(last=False)
        return reader

    def _take(self, rows: list[int], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of the global ``rows`` (sorted) and each row's offset into them, sizes checked.

        Rows are read per shard from the fragment's file (``LanceFileReader.take_rows``), not
        with ``LanceDataset.take``: batch 32 x 1,025 on english-prose (5.7M tokens) took
        ~1.0 vs ~1.4 ms per batch in 6 fragments and ~1.5 vs ~2.3 ms in 21 (readahead 1:
        ~84 rows need no pipelining). The dataset is still opened once per process to check
        its committed row count against the manifest.
        """
        import pyarrow as pa

        ds = self._open()
        chunks: list[Any] = []
        k = 0
        while k < len(rows):
            i = bisect_right(self._row_base, rows[k]) - 1
            end = bisect_right(rows, self._row_base[i + 1] - 1, k)
            local = [r - self._row_base[i] for r in rows[k:end]]
            reader = self._file(i)
            try:
                if reader is None:
                    table = ds.take(pa.array(rows[k:end], type=pa.int64()), columns=["tokens"])
                else:
                    table = reader.take_rows(local, batch_readahead=1).to_table()
            except Exception as exc:  # pyarrow / Lance decode errors are bare OSErrors: name the shard
                shard = self.shards[i]
                raise read_error(shard_file_path(self.format_dir, shard, shard.files[0]), shard, exc) from exc
            chunks += table.column(0).chunks
            k = end
        column = pa.chunked_array(chunks, type=pa.list_(pa.from_numpy_dtype(self.dtype))).combine_chunks()
        offsets = column.offsets.to_numpy()
        if not np.array_equal(np.diff(offsets), sizes):
            k = int(np.flatnonzero(np.diff(offsets) != sizes)[0])
            shard = self.shards[bisect_right(self._row_base, rows[k]) - 1]
            raise LmdataError(
                f"{self.format_dir}: shard {shard.name} row {rows[k]} holds {offsets[k + 1] - offsets[k]} tokens, "
                f"its index says {sizes[k]}; run `lmdata verify`"
            )
        return column.values.to_numpy(zero_copy_only=False), offsets

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """int64 [len(starts), length]: the stream's slices ``[s, s + length)``."""
        self._open()
        starts = check_windows(starts, length, self.n_tokens)
        try:
            return self._windows(starts, length)
        except LmdataError as exc:
            raise at_offsets(exc, starts, length) from exc

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        pieces = plan(starts, length, self._shard_bounds, self._bounds)
        rows = sorted({(self._row_base[p.shard] + p.seg, p.shard, p.seg) for p in pieces})
        sizes = [self._row_bounds[i][g + 1] - self._row_bounds[i][g] for _, i, g in rows]
        values, offsets = self._take([r for r, _, _ in rows], sizes)
        where = {r: int(offsets[k]) for k, (r, _, _) in enumerate(rows)}
        out = np.empty((len(starts), length), dtype=np.int64)
        for p in pieces:
            at = where[self._row_base[p.shard] + p.seg] + p.lo
            out[p.window, p.out : p.out + p.n] = values[at : at + p.n]
        return out

    def document(self, doc_id: int) -> np.ndarray:
        """One document's tokens: a ``take`` of its rows."""
        if not 0 <= doc_id < self._doc_bounds[-1]:
            raise LmdataError(f"document {doc_id} does not exist; the split has {self._doc_bounds[-1]} documents")
        self._open()
        i = int(np.searchsorted(self._doc_bounds, doc_id, side="right") - 1)
        rows = self._rows(i)
        local = np.flatnonzero(rows[1, :-1] == doc_id - self._doc_bounds[i])
        values, _ = self._take((local + self._row_base[i]).tolist(), np.diff(rows[0])[local].tolist())
        return values.copy()

    def doc_starts(self, i: int) -> np.ndarray:
        """Shard ``i``'s document starts (within the shard), then its length: from the sidecar alone."""
        shard, rows = self.shards[i], self._rows(i, sidecar_only=True)
        starts = row_doc_starts(rows[1, :-1], rows[0, :-1], shard.n_tokens)
        if len(starts) != shard.n_docs + 1:
            raise LmdataError(f"{self.format_dir}: shard {shard.name} row index holds {len(starts) - 1} documents, "
                              f"the manifest says {shard.n_docs}; run `lmdata verify`")
        return starts

    def arrow_rows(self) -> "_Rows":
        """The split's rows for DuckDB: a fresh scanner per scan (a registered Lance dataset would
        need DuckDB's lance extension, and a plain Arrow dataset of it fails on WHERE)."""
        return _Rows(self)


class _Rows:
    """An Arrow stream DuckDB can scan any number of times: a fresh Lance scanner each time."""

    def __init__(self, reader: LanceReader) -> None:
        self.reader = reader

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        scanner = self.reader._open().scanner(columns=["doc_id", "token_offset", "tokens"])
        return scanner.to_reader().__arrow_c_stream__(requested_schema)
