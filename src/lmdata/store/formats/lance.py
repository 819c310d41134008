"""The Lance format: one Lance dataset per split, in few large fragments.

On disk, per split (``<store>/<split>/lance/``, a Lance dataset in file format 2.0)::

    data/<uuid>.lance      fragments: rows (doc_id int64, token_offset int64,
                           tokens list<uint16|uint32>, uncompressed), documents
                           cut into pieces of at most 1,024 tokens; each fragment holds a run
                           of whole ingest shards, up to 32 Mi tokens (``lance_fragments``)
    _versions/, _transactions/   Lance's own commit log (written once per ingest, in ``finish``)
    rows-00000.npy         int64 [3, n_rows + 1], a shard's row index: each row's first token
                           within it (then n_tokens), each row's document (then n_docs) and
                           each row's CRC-32 of its tokens' little-endian bytes (then 0);
                           a store written before row checksums has only the first two
    index-<name>.npy       the same for a fragment of several shards
    _shards/00000.json     while ingesting: a shard's record; its ``extra["fragment"]`` is its
                           uncommitted staging fragment's ``FragmentMetadata`` JSON
    _fragments/<name>.json record of a fragment of several shards (``lance_fragments``)

The manifest's Lance shards are the committed fragments, so they are fewer than the other
formats' shards (names like ``00000-00255``). The local engine streams each shard into its
fragment as it comes (``lance_stream``); the Ray engine's tasks write staging fragments, which
``finish`` groups and commits (``LanceOperation.Overwrite``, in stream order: dataset row ``r``
is the stream's ``r``-th); ``cleanup_partial`` deletes data files no record references.

Stores an earlier lmdata wrote also hold ``token_bytes`` (the tokens again; takes read it, ``lmdata
verify`` checks it): no longer written (2 bytes a token, 2/3 of Lance's writing; windows come from copies).

Reader: the dataset opens lazily in each process, and not in one forked after Lance ran in its parent (Lance is
not fork-safe: ``lance_fork``); its committed row count is checked. Local windows come from raw copies of the
ingest shards, each decoded once per machine with one take (``lance_chunks``; ``LMDATA_LANCE_CACHE_BYTES=0``: a
take per batch). On Linux it opens through Lance's io_uring reader (``file+uring://``, ``open_uring``; a take:
-1/3 wall time, -1/2 CPU, bench/README.md "Lance layout"); ``io="file"`` or ``LMDATA_LANCE_IO=file`` reads plain
files, and a machine without io_uring falls back to them with a warning. A batch of windows reads the rows
covering them with **one take** (rows located with the ``rows-*.npy`` index of each fragment the batch touches,
loaded on first touch: kept out of the manifest, which would otherwise grow by ~n_tokens / 700 entries). Lance
files carry no checksums of their own, so the row index holds a CRC-32 per row (``blocks.row_checksums``),
checked on every row a take returns: a flipped bit is refused naming the shard and row. On the first touch of a
fragment its row index is checked against its checksum in the manifest (so the CRCs are trusted) and the data file
only by size. A store without row CRCs falls back to a whole-file checksum on first touch (``verify``: first-use
or size, see ``checksum.verify_shard``); with ``verify="size"`` no checksum is checked and a flipped bit may
decode as a wrong token. A decode error is an ``LmdataError`` naming the fragment. ``doc_starts`` reads only the
row index; ``arrow_rows`` (``lmdata sql``): a fragment scan per shard. Remote: the same copies, each made by one
remote take (budget 0: a take per batch).
"""

from __future__ import annotations

import json
import os
import re
import threading
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.io import atomic
from lmdata.errors import LmdataError
from lmdata.store.blocks import row_checksums
from lmdata.io.process_local import per_process
from lmdata.io.s3 import EndpointError, within_timeout
from lmdata.store.formats import base, lance_fragments
from lmdata.store.formats.lance_fragments import LAYOUT, current_layout, lance_schema
from lmdata.store.formats.lance_stream import FragmentStream
from lmdata.store.formats.lance_fork import lance_runtime_started, refuse_if_forked_after_lance
from lmdata.store.formats.lance_chunks import LanceChunks
from lmdata.store.formats.lance_uring import IO_ENV, check_io_mode, open_uring
from lmdata.store.checksum import (
    DEFAULT_VERIFY,
    file_info,
    write_shard_parts,
    read_error,
    shard_file_path,
    verify_shard,
)
from lmdata.store.formats.parquet import pieces, row_doc_starts, rows_table
from lmdata.store.formats.rows import ROW_COLUMNS, RowUnit, VerifiedRows, member_units
from lmdata.store.manifest import FILE_SPEC, Many
from lmdata.store.npy import int64_array
from lmdata.store.protocol import ShardInfo
from lmdata.store.windows import concat_ranges, sorted_unique

class LanceWriter(base.RecordedShardWriter):
    """A staging fragment per shard; ``finish`` groups them into large fragments and commits once."""
    vouching_record = staticmethod(lance_fragments.vouching_record)  # a fragment's member: the fragment's record

    OWNED = re.compile(r"data|_versions|_transactions|_indices|_deletions|_refs|_shards|_fragments"
                       r"|rows-\d{5,}\.npy|index-[0-9-]+\.npy")

    def __init__(self, format_dir: Path, dtype: np.dtype, *, fragment_tokens: int | None = None) -> None:
        super().__init__(format_dir, dtype)
        self.fragment_tokens = fragment_tokens or lance_fragments.FRAGMENT_TOKENS
        self._in_order, self._stream, self._streamed = False, None, []  # lance_stream.py

    @classmethod
    def prepare(cls, dtype: np.dtype) -> None:
        import lance.fragment  # noqa: F401 -- with pyarrow.dataset and pandas: ~0.4 CPU s

    def write_in_order(self) -> None:
        """Shards come in order from one thread: each goes straight into its fragment (``lance_stream``)."""
        self._in_order = True

    def abandon(self) -> None:
        if self._stream is not None:
            self._stream.abandon()
            self._stream = None

    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo:
        from lance.fragment import LanceFragment

        tokens, doc_starts = self.shard_arrays(tokens, doc_starts)
        cut = pieces(doc_starts)  # once for the table and the row index
        table = rows_table(tokens, doc_starts, first_doc, first_token, cut).cast(lance_schema(self.dtype))
        stale = base.forget(self.format_dir, index)
        rows = lance_fragments.shard_rows(tokens, doc_starts, cut)
        shard = ShardInfo(name=f"{index:05d}", n_docs=len(doc_starts) - 1, n_tokens=len(tokens), first_doc=first_doc,
                          first_token=first_token, files=[], extra={"rows": rows.shape[1] - 1})
        if self._in_order:
            return self._stream_shard(shard, table, rows, tokens.nbytes)
        with atomic.space_for(self.format_dir, tokens.nbytes):
            frag = LanceFragment.create(
                str(self.format_dir), table, fragment_id=index, schema=lance_schema(self.dtype),
                data_storage_version=lance_fragments.STORAGE_VERSION,
            )
        return self._record_staged(shard, frag.to_json(), rows, stale)

    def _record_staged(self, shard: ShardInfo, meta: dict, rows: np.ndarray, stale: ShardInfo | None) -> ShardInfo:
        """A shard's own fragment (``meta``) made durable: data, row index ``rows-NNNNN.npy``, record."""
        data_files = [f"data/{f['path']}" for f in meta["files"]]
        for rel in data_files:  # fresh uuid names: a lost name means a redone shard, so no dir fsync here
            atomic.fsync_path(self.format_dir / rel)
        rows_name = f"rows-{shard.name}.npy"
        replaced, rows_info = write_shard_parts(self.format_dir, rows_name, [base.npy_bytes(rows)])
        shard = ShardInfo(name=shard.name, n_docs=shard.n_docs, n_tokens=shard.n_tokens, first_doc=shard.first_doc,
                          first_token=shard.first_token,
                          files=[*(file_info(self.format_dir, rel) for rel in data_files), rows_info],
                          extra={"rows": shard.extra["rows"], "fragment": meta, **LAYOUT, "row_crc": True})
        base.write_record(self.format_dir, int(shard.name), shard, sync_dirs=[self.format_dir] if replaced else [])
        for old in stale.files if stale else []:  # a rewritten shard's old fragment (uncommitted)
            if old.path.startswith("data/") and old.path not in data_files:
                (self.format_dir / old.path).unlink(missing_ok=True)
        return shard

    def _stream_shard(self, shard: ShardInfo, table: Any, rows: np.ndarray, nbytes: int) -> ShardInfo:
        """``shard`` into the open fragment, or a new one where ``plan_fragments`` starts one."""
        index = int(shard.name)
        with atomic.space_for(self.format_dir, nbytes):
            if self._stream is not None and (self._stream.n_tokens + shard.n_tokens > self.fragment_tokens
                                             or int(self._stream.members[-1].name) + 1 != index):
                self._close_stream()
            if self._stream is None:
                self._stream = FragmentStream(self.format_dir, lance_schema(self.dtype),
                                             lance_fragments.STORAGE_VERSION, index)
            self._stream.add(shard, table, rows, nbytes)
        return shard

    def _close_stream(self) -> None:
        """The open fragment, recorded as the staging path would have it (a lone shard: as its own staged
        fragment; several: as ``write_fragment``'s), so both engines write the same store."""
        stream = self._stream  # still ours until Lance is done: an interrupted wait leaves it to ``abandon``
        if len(stream.members) > 1:
            self._streamed.append(stream.close())
        else:  # a lone shard's fragment index is its own row index
            self._streamed.append(self._record_staged(stream.members[0], stream.end(), stream.index_rows(), None))
        self._stream = None

    def completed(self) -> dict[int, ShardInfo]:
        """Staged shards, and the shards held by intact fragment records (those win: they outlive staging).

        Records of another layout (an ingest started by an older lmdata) are not complete: their
        shards are written again, so every fragment has the same columns (``current_layout``).
        """
        done = {i: s for i, s in base.completed(self.format_dir).items() if current_layout(s)}
        for fragment in lance_fragments.read_fragments(self.format_dir).values():
            if current_layout(fragment):
                done.update(lance_fragments.members(fragment))
        return dict(sorted(done.items()))

    def finish(self, shards: list[ShardInfo]) -> list[ShardInfo]:
        """Group ``shards`` into fragments, commit them in order; returns the fragments (the manifest's shards)."""
        import lance
        from lance.fragment import FragmentMetadata

        if self._stream is not None:
            self._close_stream()
        held = {m.name: m for f in self._streamed
                for m in (lance_fragments.members(f).values() if "members" in f.extra else [f])}
        shards = [held.get(s.name, s) for s in shards]  # streamed shards: where their fragment holds them
        recorded = lance_fragments.read_fragments(self.format_dir)
        fragments = []
        for run in lance_fragments.plan_fragments(shards, self.fragment_tokens):
            fragment = lance_fragments.reusable(run, recorded)
            if fragment is None and len(run) == 1 and "fragment" in run[0].extra:
                fragment = run[0]  # a lone staged shard is its own fragment: nothing to rewrite
            if fragment is None:
                with atomic.space_for(self.format_dir, sum(s.n_tokens for s in run) * self.dtype.itemsize):
                    fragment = lance_fragments.write_fragment(self.format_dir, run, lance_schema(self.dtype),
                                                               lance_fragments.STORAGE_VERSION)
            fragments.append(fragment)
        frags = [FragmentMetadata.from_json(json.dumps(s.extra["fragment"])) for s in fragments]
        # the fragments' and row indexes' names (fsynced per directory here, not per shard) before the commit names them
        base.sync_dirs(self.format_dir / "data", self.format_dir, self.format_dir / base.RECORD_DIR,
                        self.format_dir / lance_fragments.GROUP_DIR)
        with atomic.space_for(self.format_dir):
            lance.LanceDataset.commit(str(self.format_dir), lance.LanceOperation.Overwrite(lance_schema(self.dtype), frags))
        for sub in ("_versions", "_transactions"):
            d = self.format_dir / sub
            if d.is_dir():
                for p in d.iterdir():
                    if p.is_file():
                        atomic.fsync_path(p)
                atomic.fsync_dir(d)
        atomic.fsync_dir(self.format_dir)
        lance_fragments.remove_unused(self.format_dir, fragments)
        return fragments

    def cleanup_partial(self) -> None:
        """Remove temp files and data files that no staged shard or fragment record references."""
        base.remove_temporaries(self.format_dir)
        # every intact record's files, not only ``completed``'s choice: a shard rewritten by this
        # run (Ray cleans up after its writes) has a staging record and an older fragment record
        records = [*base.completed(self.format_dir).values(), *lance_fragments.read_fragments(self.format_dir).values()]
        keep = {f.path for s in records for f in s.files}
        data = self.format_dir / "data"
        if data.is_dir():
            for p in data.iterdir():
                if f"data/{p.name}" not in keep:
                    p.unlink()


class LanceReader(base.ShardReader):
    """The rows covering a batch's windows, with one ``take`` per batch; opens the dataset per process."""

    @property
    def fork_safe(self) -> bool:
        """Whether a worker may be forked from this process: Lance's runtime, once started here
        (its threads are running), crashes or hangs forked children, and the loader then forks
        from a clean forkserver instead (~2 s more to the first batch, torch imported again)."""
        return not lance_runtime_started()
    MANIFEST_SHARD = {"files": Many(FILE_SPEC, 2), "extra": {"rows": int}}  # data file ... row index last

    def __init__(
        self, format_dir: Path, shards: list[ShardInfo], dtype: np.dtype, *, verify: str = DEFAULT_VERIFY,
        io: str | None = None, column: str | None = None, use_cache: bool = True,
    ) -> None:  # use_cache=False: never the machine's decoded copies, each chunk taken into memory (lance_chunks)
        super().__init__(format_dir, shards, dtype, verify=verify)
        self.use_cache = use_cache
        self.io = check_io_mode(os.environ.get(IO_ENV, "auto") if io is None else io, from_env=io is None)
        if column not in (None, "tokens"):
            raise LmdataError(f"Lance column {column!r}: only 'tokens' can be asked for (None: the loader's own)")
        self.column = column
        self._row_base = np.cumsum([0] + [int(s.extra.get("rows", 0)) for s in self.shards])

    _ds = per_process(lambda self: None)  # the open dataset (``_open``)
    _fragments = per_process(lambda self: [])
    _chunks = per_process(lambda self: False)  # local: the decoded copies windows are read from (``lance_chunks``)
    _column = per_process(lambda self: "tokens")  # "token_bytes" in a store an earlier lmdata wrote with it
    _row_bounds = per_process(lambda self: {})  # fragment -> ``_index``
    _indexing = per_process(lambda self: threading.Lock())  # one thread loads a row index, the rest wait
    _checked = per_process(lambda self: np.zeros(int(self._row_base[-1]), dtype=bool))  # row -> CRC checked here

    def _rows(self, i: int, sidecar_only: bool = False) -> np.ndarray:
        """Fragment ``i``'s row index: [row token starts + n_tokens, row documents + n_docs]."""
        shard = self.shards[i]
        # the row index, checked against the manifest (remote: one GET; never a download of the data file)
        path, raw = self._small_file(shard, shard.files[-1])
        if not self.remote and not sidecar_only:
            # first touch of the fragment's data: with row CRCs only its size; else its whole checksum
            verify_shard(self.format_dir, shard, "size" if shard.extra.get("row_crc") else self.verify,
                         shard.files[:-1])
        try:
            rows = int64_array(raw)
        except (OSError, ValueError) as exc:
            raise read_error(path, shard, exc) from exc
        if rows.shape != (3 if shard.extra.get("row_crc") else 2, shard.extra["rows"] + 1) \
                or rows[0, -1] != shard.n_tokens:
            raise LmdataError(f"{path}: shard {shard.name} row index does not match the manifest; run `lmdata verify`")
        return rows

    def _bounds(self, i: int) -> np.ndarray:
        return self._index(i)[0]

    def _index(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Fragment ``i``'s rows: global first token of each (then its end), document within it (then
        n_docs), and each row's CRC-32 (None in a store written without them)."""
        index = self._row_bounds.get(i)
        if index is None:
            # a remote first batch's 8 fetches and 4 background ones all start here: each had been
            # GETting the same 7 MB index (188 M tokens; ~0.55 s of a 3.7 s first batch on s3rver)
            with self._indexing:
                index = self._row_bounds.get(i)
                if index is None:
                    rows = self._rows(i)
                    crcs = rows[2, :-1].astype(np.uint32) if len(rows) == 3 else None
                    index = self._row_bounds[i] = (rows[0] + self._shard_bounds[i], rows[1], crcs)
        return index

    def _data_path(self, shard: ShardInfo) -> Any:
        if self.remote:
            return self.format_dir / shard.files[0].path
        return shard_file_path(self.format_dir, shard, shard.files[0])

    def _check_rows(self, rows: np.ndarray, values: np.ndarray, offsets: np.ndarray, every: bool = False) -> None:
        """Refuse the take unless every row's tokens match the CRC-32 its row index records; a row
        checked once in this process is not checked again (``_checked``) unless ``every`` (a take
        that makes a decoded copy: a copy made again must not trust an earlier read)."""
        if self.verify == "size":
            return
        todo = np.arange(len(rows)) if every else np.flatnonzero(~self._checked[rows])
        if not len(todo):
            return
        frag = np.searchsorted(self._row_base, rows[todo], side="right") - 1
        expected = np.zeros(len(todo), dtype=np.uint32)
        has_crc = np.ones(len(todo), dtype=bool)
        for f, at in _by_fragment(frag):
            crcs = self._index(f)[2]
            if crcs is None:
                has_crc[at] = False  # an older store: its data file was hashed whole on first touch
            else:
                expected[at] = crcs[rows[todo][at] - self._row_base[f]]
        bad = np.flatnonzero((row_checksums(values, offsets, todo) != expected) & has_crc)
        if len(bad):
            k = int(bad[0])
            row, shard = int(rows[todo[k]]), self.shards[int(frag[k])]
            raise LmdataError(
                f"{self._data_path(shard)}: shard {shard.name} row {row - int(self._row_base[frag[k]])} fails "
                f"its CRC-32 checksum{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}: the shard is "
                "corrupt; run `lmdata verify` and re-ingest with --overwrite"
            )
        self._checked[rows[todo]] = True

    def _open(self) -> Any:
        if self._ds is None:
            refuse_if_forked_after_lance(self.format_dir)
            self.check()
            try:
                ds = lance_fragments.open_dataset(self.format_dir, self.remote)
            except EndpointError:
                raise
            except Exception as exc:
                raise lance_fragments.open_error(exc, self.format_dir, self.remote) from exc
            self._column = self.column or ("token_bytes" if "token_bytes" in ds.schema.names else "tokens")
            self._use(ds if self.remote else (open_uring(self.format_dir, ds, self._column, self.io) or ds))
        return self._ds

    def _use(self, ds: Any) -> None:
        """Read through ``ds`` (the store's dataset) if it is the manifest's."""
        fragments = ds.get_fragments()  # committed in stream order: the manifest's shards
        committed = [f"data/{f.metadata.files[0].path}" if len(f.metadata.files) == 1 else None for f in fragments]
        if committed != [s.files[0].path for s in self.shards]:
            raise LmdataError(
                f"{self.format_dir}: the committed Lance fragments are not the manifest's (an ingest was "
                "interrupted after its commit); re-run the ingest with --resume or --overwrite"
            )
        if ds.count_rows() != self._row_base[-1]:  # same files, so the same fragment count
            raise LmdataError(
                f"{self.format_dir}: Lance dataset has {ds.count_rows()} rows, the manifest says "
                f"{self._row_base[-1]}; re-run the ingest with --resume or --overwrite"
            )
        self._ds, self._fragments = ds, fragments

    def _take(self, rows: np.ndarray, sizes: np.ndarray, every: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of the dataset rows ``rows`` (sorted, unique) and each row's offset into them, sizes checked.

        One take for the whole batch (``LanceFragment.take`` when the rows are in one fragment,
        else ``LanceDataset.take``, which reads the fragments concurrently): a take's fixed
        cost is paid once, not per fragment. (A ``LanceFragment.open_session`` per fragment was ~10%
        cheaper in a micro-bench but holds a file open per fragment touched, without bound.)
        """
        import pyarrow as pa

        ds = self._open()
        if not len(rows):
            return np.zeros(0, dtype=self.dtype), np.zeros(1, dtype=np.int64)
        first, last = np.searchsorted(self._row_base, rows[[0, -1]], side="right") - 1
        columns = [self._column]
        try:
            if first == last:  # one fragment (the common case): its own take skips ~0.15 ms of planning
                take = partial(self._fragments[first].take, rows - self._row_base[first], columns=columns)
            else:
                take = partial(ds.take, pa.array(rows, type=pa.int64()), columns=columns)
            table = within_timeout(take, str(self._data_path(self.shards[first]))) if self.remote else take()
            column = table.column(0)
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # no copy of one chunk
        except Exception as exc:  # pyarrow / Lance decode errors are bare OSErrors: name the fragment
            shard = self.shards[first]  # (remote: an endpoint's failure stays one, see read_error)
            raise read_error(self._data_path(shard), shard, exc) from exc
        odd = 0
        if self._column == "token_bytes":  # byte offsets: whole tokens, values viewed in place
            _, byte_offsets, data = column.buffers()
            byte_offsets = np.frombuffer(byte_offsets, dtype=np.int64)[column.offset:column.offset + len(column) + 1]
            width = self.dtype.itemsize
            whole = len(data) // width if data else 0  # a padded buffer's tail is never indexed
            values = np.frombuffer(data, dtype=self.dtype.newbyteorder("<"), count=whole) if whole else np.zeros(0, self.dtype)
            odd, offsets = byte_offsets % width, byte_offsets // width
        else:
            offsets, values = column.offsets.to_numpy(), column.values.to_numpy(zero_copy_only=False)
        held = np.diff(offsets)
        if len(held) != len(rows) or (held != sizes).any() or np.any(odd) or offsets[-1] > len(values):
            k = int(np.argmax(held != sizes)) if len(held) == len(rows) else 0
            shard = self.shards[int(np.searchsorted(self._row_base, rows[k], side="right")) - 1]
            raise LmdataError(
                f"{self.format_dir}: shard {shard.name} row {rows[k]} does not hold the {sizes[k]} tokens "
                "its index says; run `lmdata verify`"
            )
        self._check_rows(rows, values, offsets, every)
        return values, offsets

    def check_ahead(self, starts: np.ndarray, length: int) -> int:  # the decoded copies (made by a read)
        return self._chunks.check_ahead(starts, length) if self._chunks not in (False, None) else 0

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """From the machine's decoded copies (``lance_chunks``); else one take of every row the windows
        touch, then one strided gather: a window's rows are consecutive dataset rows (across a fragment
        bound too) and the take returns them in order, so each window is one slice of its values.
        """
        if self._chunks is False:
            self._chunks = LanceChunks.of(self)
        if self._chunks is not None:  # the machine's decoded copies (Lance opens only to make one)
            return self._chunks._raw_windows(starts, length)
        self._open()
        if not len(starts):
            return np.empty((0, length), dtype=self.dtype)
        n = len(starts)
        row, first = self._locate(np.concatenate([starts, starts + (length - 1)]))  # first and last token
        r0, first_token = row[:n], first[:n]
        rows = sorted_unique(concat_ranges(r0, row[n:] - r0 + 1))
        values, offsets = self._take(rows, self._row_sizes(rows))
        src = offsets[np.searchsorted(rows, r0)] + (starts - first_token)
        return np.lib.stride_tricks.sliding_window_view(values, length)[src]

    def _locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The dataset row holding each token offset, and that row's first token."""
        row, first = np.empty_like(offsets), np.empty_like(offsets)
        for f, at in _by_fragment(np.searchsorted(self._shard_bounds, offsets, side="right") - 1):
            b = self._bounds(f)
            local = np.searchsorted(b, offsets[at], side="right") - 1
            row[at], first[at] = local + self._row_base[f], b[local]
        return row, first

    def _row_sizes(self, rows: np.ndarray) -> np.ndarray:
        """Token count of each of the (sorted) dataset ``rows``, from the row index."""
        size = np.empty_like(rows)
        for f, at in _by_fragment(np.searchsorted(self._row_base, rows, side="right") - 1):
            b, local = self._bounds(f), rows[at] - self._row_base[f]
            size[at] = b[local + 1] - b[local]
        return size

    def alternates(self) -> dict[str, LanceReader]:
        """Readers of the same stream through other columns, for ``lmdata verify`` to compare.

        A store an earlier lmdata wrote holds ``token_bytes`` beside ``tokens``, and its loader reads
        the former; both are covered by the files' checksums, but only a read of each shows they agree.
        """
        self._open()
        if self._column != "token_bytes":
            return {}
        return {"tokens column": LanceReader(self.format_dir, self.shards, self.dtype, verify=self.verify,
                                             io=self.io, column="tokens")}

    def _document(self, i: int, k: int) -> np.ndarray:
        """A ``take`` of the document's rows."""
        self._open()
        local = np.flatnonzero(self._index(i)[1][:-1] == k)
        rows = (local + self._row_base[i]).astype(np.int64)
        values, offsets = self._take(rows, self._row_sizes(rows))
        return values[offsets[0]:offsets[-1]].copy()

    def doc_starts(self, i: int) -> np.ndarray:
        """Fragment ``i``'s document starts (within it), then its length: from the row index alone."""
        shard, rows = self.shards[i], self._rows(i, sidecar_only=True)
        starts = row_doc_starts(rows[1, :-1], rows[0, :-1], shard.n_tokens)
        if len(starts) != shard.n_docs + 1:
            raise LmdataError(f"{self.format_dir}: shard {shard.name} row index holds {len(starts) - 1} documents, "
                              f"the manifest says {shard.n_docs}; run `lmdata verify`")
        return starts

    def arrow_rows(self) -> VerifiedRows:
        """``lmdata sql``'s rows: an ingest shard's rows of its fragment per scan, the fragment verified first
        (a registered Lance dataset would need DuckDB's lance extension; an Arrow dataset of it fails on WHERE)."""
        def scan(unit: RowUnit) -> Any:
            self._open()
            return self._fragments[unit.shard].to_batches(columns=list(ROW_COLUMNS), batch_size=4096,
                                                          offset=unit.row, limit=unit.rows)
        return VerifiedRows(self, scan, member_units(self.shards))


def _by_fragment(frag: np.ndarray) -> list[tuple[int, Any]]:
    """``(fragment, selector)`` per fragment in ``frag``; the usual case, one fragment, needs no mask."""
    if not len(frag):
        return []
    lo, hi = int(frag.min()), int(frag.max())
    if lo == hi:
        return [(lo, slice(None))]
    return [(f, frag == f) for f in sorted_unique(frag).tolist()]
