"""A Lance fragment written from the ingest's shards as they come, in one pass.

Why: staging a fragment per shard and streaming runs of them into large fragments at the
end (``lance_fragments.write_fragment``) encodes every token twice and reads it back once;
on 500 MB of text that was half of Lance's writing cost (bench/README.md, "Ingest"). When the
engine writes shards in order from one thread (the local engine), ``LanceWriter`` instead
feeds each shard's rows to an open ``LanceFragment.create`` running on a thread of its own,
and closes the fragment where ``plan_fragments`` would end the run, so ``finish`` finds the
fragments it plans already recorded and commits them as they are.

Crash safety is the fragment's, not the shard's: a fragment becomes durable and recorded
(``record_fragment``) when it closes; the shards of a fragment still open when the process
dies have no record, so a resumed ingest writes them again (up to ``FRAGMENT_TOKENS`` tokens
of work), and ``cleanup_partial`` removes the unfinished data file.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io import atomic
from lmdata.io import digests
from lmdata.store.formats.lance_fragments import record_fragment
from lmdata.store.protocol import FileInfo, ShardInfo

_END = object()
SYNC_BYTES = 64 << 20  # the growing data file is flushed to disk every this many bytes


class _Follower:
    """Hashes the data file while Lance appends to it, and flushes it to disk as it grows: closing
    a fragment then costs neither a second read nor one long fsync (500 MB of text: 0.37 s of
    sha256, as it was then, and a 0.43 s fsync at the end of the split). What is hashed and synced leaves the
    page cache (``atomic.drop_cached``), as every shard file of an ingest does. Lance writes ``data/.tmpXXXX`` and renames
    it when done; the open descriptor follows the rename, and ``info`` checks it is the same file."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.before = set(os.listdir(data_dir)) if data_dir.is_dir() else set()
        self.fd: int | None = None
        self.hashed = self.synced = 0
        self.digest = digests.new()

    def step(self) -> None:
        """Hash what Lance has written so far (bytes below the file's size are written: it only appends)."""
        if self.fd is None:
            new = [n for n in os.listdir(self.data_dir) if n not in self.before] if self.data_dir.is_dir() else []
            if len(new) != 1:
                return  # not there yet (or not ours alone: ``info`` then leaves it to ``file_info``)
            try:
                self.fd = os.open(self.data_dir / new[0], os.O_RDONLY)
            except FileNotFoundError:  # renamed in between: the fragment is done, ``info`` reads it whole
                return
        size = os.fstat(self.fd).st_size
        while self.hashed < size:
            chunk = os.pread(self.fd, min(8 << 20, size - self.hashed), self.hashed)
            self.digest.update(chunk)
            self.hashed += len(chunk)
        if self.hashed - self.synced >= SYNC_BYTES:
            os.fdatasync(self.fd)
            atomic.drop_cached(self.fd, 0, self.hashed)  # hashed and synced: out of the page cache
            self.synced = self.hashed

    def info(self, format_dir: Path, relpath: str) -> FileInfo | None:
        """The finished file's ``FileInfo``, durable, when it is the file followed; else None."""
        if self.fd is None:
            return None
        try:
            if os.fstat(self.fd).st_ino != os.stat(Path(format_dir) / relpath).st_ino:
                return None
            self.step()
            os.fdatasync(self.fd)
            atomic.drop_cached(self.fd)
            return FileInfo(relpath, self.hashed, self.digest.hexdigest())
        finally:
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class FragmentStream:
    """One open fragment: ``add`` each shard's table in order, then ``close`` for its record."""

    def __init__(self, format_dir: Path, schema: Any, storage_version: str, fragment_id: int) -> None:
        self.format_dir, self.schema = Path(format_dir), schema
        self.members: list[ShardInfo] = []
        self.rows: list[np.ndarray] = []  # per shard: [3, rows] first token and document within the fragment, CRC
        self.n_tokens = self.n_docs = self.n_bytes = 0
        self._tables: queue.Queue = queue.Queue(maxsize=1)  # memory: one shard waiting for Lance
        self._meta: dict | None = None
        self._error: BaseException | None = None
        self._follower = _Follower(self.format_dir / "data")
        self._thread = threading.Thread(target=self._write, args=(storage_version, fragment_id),
                                        name="lmdata-lance-fragment", daemon=True)
        self._thread.start()

    def _batches(self) -> Iterator[Any]:
        while (table := self._tables.get()) is not _END:
            yield from table.to_batches()

    def _write(self, storage_version: str, fragment_id: int) -> None:
        import pyarrow as pa
        from lance.fragment import LanceFragment

        try:
            reader = pa.RecordBatchReader.from_batches(self.schema, self._batches())
            self._meta = LanceFragment.create(str(self.format_dir), reader, fragment_id=fragment_id,
                                              schema=self.schema, data_storage_version=storage_version).to_json()
        except BaseException as exc:  # surfaces in the writer's thread, at its next add or close
            self._error = exc

    def _put(self, item: Any) -> None:
        """Queue ``item`` unless the writing thread has stopped (then its error, if any, is raised)."""
        while self._thread.is_alive():
            try:
                self._tables.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def add(self, shard: ShardInfo, table: Any, rows: np.ndarray, nbytes: int) -> None:
        """Queue ``shard``'s rows (``table``; ``rows``: its ``shard_rows``, of ``nbytes`` of tokens)."""
        self.rows.append(rows[:, :-1] + np.array([[self.n_tokens], [self.n_docs], [0]], np.int64))
        self._put(table)
        self._raise_failure()
        if not self._thread.is_alive():
            self._raise_failure()  # it may have failed since the check above
            raise LmdataError(f"{self.format_dir}: the Lance fragment writer stopped early; rerun with --resume")
        self._follower.step()
        self.members.append(shard)
        self.n_tokens += shard.n_tokens
        self.n_bytes += nbytes
        self.n_docs += shard.n_docs

    def index_rows(self) -> np.ndarray:
        """The fragment's row index: its shards' rows, positions within the fragment, then the totals."""
        return np.concatenate(self.rows + [np.array([[self.n_tokens], [self.n_docs], [0]], np.int64)], axis=1)

    def wait(self) -> dict:
        """End the fragment; its ``FragmentMetadata`` JSON once Lance has written it (failed: the follower's
        descriptor closed too)."""
        try:
            with atomic.space_for(self.format_dir, self.n_bytes):
                self._put(_END)
                self._thread.join()
                self._raise_failure()
            if self._meta is None or len(self._meta["files"]) != 1:
                raise LmdataError(f"{self.format_dir}: Lance wrote fragment {self.members[0].name} as "
                                  f"{len(self._meta['files']) if self._meta else 0} files, not one; rerun with "
                                  "--overwrite")
        except BaseException:
            self._follower.close()
            raise
        return self._meta

    def close(self) -> ShardInfo:
        """End the fragment and make it durable and recorded (``record_fragment``)."""
        meta = self.wait()
        data = self._follower.info(self.format_dir, f"data/{meta['files'][0]['path']}")
        return record_fragment(self.format_dir, self.members, meta, self.index_rows(), data)

    def end(self) -> dict:
        """End the fragment (``wait``) and stop following its file, whose record hashes it whole instead
        (a fragment of one shard, recorded as a staged one): its descriptor had stayed open."""
        meta = self.wait()
        self._follower.close()
        return meta

    def abandon(self) -> None:
        """Stop the writing thread (an error elsewhere); the unfinished data file is ``cleanup_partial``'s."""
        self._put(_END)
        self._thread.join()
        self._follower.close()

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, OSError | RuntimeError):
                raise error
            raise LmdataError(f"{self.format_dir}: writing Lance fragment {self.members[0].name if self.members else ''}"
                              f" failed ({error})") from error
