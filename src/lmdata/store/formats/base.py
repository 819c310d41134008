"""What formats share: crash-safe shard files (writers) and the readers' base (``ShardReader``).

Readers hold no file descriptor per shard (memmap and decoded Parquet shards are read through
one bounded pool of descriptors: ``raw_windows``, ``io.descriptors``), so a store of many more
shards than ``ulimit -n`` reads like any other.

Writers: crash-safe shard files -- temporary names, fsync, rename, and completion records.

Every writer produces a shard's files under a temporary name (``.NAME.tmp-PID``),
fsyncs them and renames them into place; only then does it write the shard's completion
record ``<format_dir>/_shards/NNNNN.json`` (the ``ShardInfo`` as JSON, fsynced and
renamed). ``completed`` trusts a record only if every file it lists is on disk with the
recorded size, so a resumed ingest reuses exactly the shards that were finished.
``remove_temporaries`` deletes what an interrupted write left behind.

Directory fsyncs, and why there are so few (3 fsyncs per memmap shard, 2 Parquet, 3
Lance, where there were 5, 4 and 6): the invariant is "a record on disk implies its
files hold what it says". A file's data is fsynced before its rename, so if a crash
loses the rename, the name is simply missing and ``completed`` redoes the shard. The
only danger is a name that already held an older file of the same size: then the
writer fsyncs the file's directory before the record (``write_record(sync_dirs=...)``,
the rare rewrite path of a resumed ingest), and ``forget`` durably removes an old
record before its shard is rewritten. A lost record's rename costs a redone shard,
never a wrong one, so record directories are fsynced once, in the writer's ``finish``
(``sync_dirs``), which runs before the manifest is written.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from lmdata.io import atomic
from lmdata.io.atomic import TMP_MARK, fsync_dir
from lmdata.io.location import location
from lmdata.io.process_local import per_process
from lmdata.errors import LmdataError, SettingError
from lmdata.store.checksum import at_offsets, check_sizes, check_verify_mode, digest_file, read_small_file
from lmdata.store.layout import RECORD_DIR
from lmdata.store.protocol import FileInfo, ShardInfo
from lmdata.store.windows import check_windows, shard_bounds

def sync_dirs(*dirs: Path) -> None:
    """fsync each existing directory once (a writer's ``finish``, before the manifest)."""
    for d in dict.fromkeys(Path(d) for d in dirs):
        if d.is_dir():
            fsync_dir(d)


def record_path(format_dir: Path, index: int) -> Path:
    return Path(format_dir) / RECORD_DIR / f"{index:05d}.json"


def write_record(format_dir: Path, index: int, shard: ShardInfo, *, sync_dirs: Iterable[Path] = ()) -> None:
    """Mark shard ``index`` complete, after its files' data is fsynced.

    ``sync_dirs``: directories to fsync first, those where a shard file replaced an older
    file of the same name (see the module docstring); empty for a fresh shard.
    """
    write_record_file(record_path(format_dir, index), shard, sync_dirs=sync_dirs)


def write_record_file(path: Path, shard: ShardInfo, *, sync_dirs: Iterable[Path] = ()) -> None:
    """``write_record`` to any record path (a format may keep records of its own, e.g. Lance fragments)."""
    for d in dict.fromkeys(sync_dirs):
        fsync_dir(Path(d))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(shard.to_json(), sort_keys=True).encode()
    atomic.write_file(path, lambda p: p.write_bytes(data), sync_dir=False, needed=len(data))


def forget(format_dir: Path, index: int) -> ShardInfo | None:
    """Durably remove shard ``index``'s record before the shard is rewritten; returns the old record.

    Without this, a crash mid-rewrite could leave the old record naming new files of the same size.
    """
    return forget_file(format_dir, record_path(format_dir, index))


def forget_file(format_dir: Path, path: Path) -> ShardInfo | None:
    """``forget`` for any record path."""
    path = Path(path)
    if not path.exists():
        return None
    old = read_record_file(format_dir, path)
    path.unlink()
    fsync_dir(path.parent)
    return old


def read_record(format_dir: Path, index: int) -> ShardInfo | None:
    """Shard ``index``'s completion record if it exists, is readable and its files have the recorded sizes."""
    return read_record_file(format_dir, record_path(format_dir, index))


def read_record_file(format_dir: Path, path: Path) -> ShardInfo | None:
    """The record at ``path`` if it is readable and its files (relative to ``format_dir``) have the recorded sizes."""
    try:
        shard = ShardInfo.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no record, or one we cannot read: a shard to redo
    if all(_has_size(Path(format_dir) / f.path, f.bytes) for f in shard.files):
        return shard
    return None


def completed(format_dir: Path) -> dict[int, ShardInfo]:
    """Shards whose completion record exists and whose files all have the recorded size."""
    record_dir = Path(format_dir) / RECORD_DIR
    if not record_dir.is_dir():
        return {}
    found = {int(rec.stem): read_record(format_dir, int(rec.stem)) for rec in sorted(record_dir.glob("[0-9]*.json"))}
    return {i: shard for i, shard in found.items() if shard is not None}


def intact(format_dir: Path, done: dict[int, ShardInfo],
           record_of: Callable[[int, ShardInfo], Path]) -> dict[int, ShardInfo]:
    """The shards of ``done`` whose files still hash to their records' checksums (a file shared by several,
    a Lance fragment's, hashed once; files on threads: hashing releases the GIL). A shard whose files do
    not loses its record (``record_of``), durably, so the resume writes it again: sizes alone let a byte
    flipped since the record through."""
    from concurrent.futures import ThreadPoolExecutor

    def digest_of(file: tuple[str, str]) -> str | None:
        try:
            return digest_file(Path(format_dir) / file[0], file[1])
        except OSError:
            return None

    files = sorted({(f.path, f.algo) for shard in done.values() for f in shard.files})
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sums = dict(zip(files, pool.map(digest_of, files)))
    kept = {}
    for index, shard in done.items():
        if all(sums[f.path, f.algo] == f.digest for f in shard.files):
            kept[index] = shard
        else:
            forget_file(format_dir, record_of(index, shard))
    return kept


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` as the bytes of a ``.npy`` file (written with ``checksum.write_shard_parts``)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def prune(format_dir: Path, shards: list[ShardInfo]) -> None:
    """Delete completion records, and their files, of shards that are not in ``shards``.

    A resumed ingest that ends with fewer shards than the interrupted one (its input
    changed) would otherwise leave the extra shards' files behind.
    """
    keep_names = {s.name for s in shards}
    keep_files = {f.path for s in shards for f in s.files}
    for index, shard in completed(format_dir).items():
        if shard.name in keep_names:
            continue
        for f in shard.files:
            if f.path not in keep_files and ".." not in Path(f.path).parts:
                (Path(format_dir) / f.path).unlink(missing_ok=True)
        record_path(format_dir, index).unlink(missing_ok=True)


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size and ".." not in Path(path).parts
    except FileNotFoundError:
        return False


def remove_temporaries(directory: Path) -> list[Path]:
    """Delete ``.*.tmp-*`` files under ``directory`` (an interrupted write's leftovers)."""
    removed = []
    if not Path(directory).is_dir():
        return removed
    for path in Path(directory).rglob(f".*{TMP_MARK}*"):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed


class RecordedShardWriter:
    """What the built-in writers share: a format directory of shards with completion records.

    Subclasses write ``write_shard``; ``finish`` makes names and records durable and drops
    shards of an interrupted longer run; ``cleanup_partial`` removes temporaries.
    ``OWNED`` matches every name a writer may create in its format directory: an
    ``--overwrite`` deletes those and refuses when anything else is there.
    """

    OWNED: re.Pattern[str] = re.compile(RECORD_DIR)

    def __init__(self, format_dir: Path, dtype: np.dtype) -> None:
        self.format_dir = Path(format_dir)
        self.dtype = np.dtype(dtype).newbyteorder("<")  # shards are little-endian on every host
        self.format_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def prepare(cls, dtype: np.dtype) -> None:
        """Load what writing a ``dtype`` shard needs (imports, constants) now. An ingest calls it while
        its inputs are hashed: in the first shard's write, on the writer's thread, Parquet's and Lance's
        imports took ~1.6 s of wall under the GIL beside the encoders, and the main thread waited on the
        writer's full queue (py-spy, all three formats, 503 MB)."""

    def completed(self) -> dict[int, ShardInfo]:
        return completed(self.format_dir)

    def drop_damaged(self, done: dict[int, ShardInfo]) -> dict[int, ShardInfo]:
        """``intact`` over this format's completed shards ``done``: what a resume may build on."""
        return intact(self.format_dir, done, lambda index, shard: self.vouching_record(self.format_dir, index, shard))

    @staticmethod
    def vouching_record(format_dir: Path, index: int, shard: ShardInfo) -> Path:
        """The record that vouches for completed shard ``index`` of ``format_dir``."""
        return record_path(format_dir, index)

    def shard_arrays(self, tokens: np.ndarray, doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A shard's tokens in the store's dtype (contiguous) and its int64 document starts."""
        return np.ascontiguousarray(tokens, dtype=self.dtype), np.asarray(doc_starts, dtype=np.int64)

    def write_in_order(self) -> None:
        """The engine promises ``write_shard`` calls in shard order from one thread of this process
        (the local engine), so a writer may keep state from shard to shard (Lance does)."""

    def abandon(self) -> None:
        """The split failed before ``finish``: stop whatever the writer runs in the background."""

    def finish(self, shards: list[ShardInfo]) -> None:
        """Drop shards not in ``shards``; make the shards' names and records durable (one fsync per directory)."""
        prune(self.format_dir, shards)
        sync_dirs(self.format_dir, self.format_dir / RECORD_DIR)

    def cleanup_partial(self) -> None:
        remove_temporaries(self.format_dir)


class ShardReader:
    """What every reader shares, so a format fills in only how it reads its shards.

    The protocol (``protocol.py``) is "how many tokens; the windows at these offsets";
    this base owns the rest: the stream's shard and document bounds, the size check, the
    document-bounds error and the offset-annotated read errors. A format implements
    ``_windows(starts, length)``, ``_document(shard, k)`` and ``doc_starts(shard)``; its
    open files and caches are ``per_process`` attributes (``lmdata.io.process_local``), so
    they are built in each process and never pickled to a worker or inherited by a fork.

    ``format_dir`` is a ``Location``: local, or on object storage (``remote``): then the
    size check is the one LIST ``open_store`` did, and small per-shard files are fetched
    whole and checked against their checksums (``_small_file``).
    """

    def __init__(self, format_dir: Any, shards: list[ShardInfo], dtype: np.dtype, *, verify: str) -> None:
        self.format_dir = location(format_dir)
        self.remote = self.format_dir.remote
        self.shards = list(shards)
        self.dtype = np.dtype(dtype).newbyteorder("<")  # shards are little-endian on every host
        self.verify = check_verify_mode(verify)
        self._shard_bounds = shard_bounds(self.shards)
        self.n_tokens = int(self._shard_bounds[-1])
        self._doc_bounds = np.cumsum([0] + [s.n_docs for s in self.shards])

    _dir = per_process(lambda self: os.fspath(self.format_dir))  # local: a str (a Location's fspath makes a Path)

    def check(self) -> None:
        """Every shard file has the size the manifest says (cheap: no data read)."""
        if not self.remote:  # a remote object is checked when first read (``open_store``)
            check_sizes(self.format_dir, self.shards)

    def _small_file(self, shard: ShardInfo, info: FileInfo) -> tuple[Any, bytes]:
        """(name for errors, bytes) of a small shard file, verified as ``verify`` says: remote it is
        one GET whose checksum is checked against the manifest, local ``checksum.read_small_file``."""
        if not self.remote:
            return read_small_file(self._dir, shard, info, self.verify)
        path = self.format_dir / info.path
        raw = path.read_bytes()
        if self.verify != "size" and not info.matches(raw):
            raise LmdataError(f"{path}: shard {shard.name} {info.path} fails its {info.algo} checksum; "
                              "run `lmdata verify` and re-ingest with --overwrite")
        return path, raw

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """[len(starts), length] in the store dtype: the stream's slices ``[s, s + length)``."""
        starts = check_windows(starts, length, self.n_tokens)
        try:
            return self._windows(starts, length)
        except SettingError:  # the user's setting, not the windows': no offsets, and its own type
            raise
        except LmdataError as exc:
            raise at_offsets(exc, starts, length) from exc
        except FileNotFoundError as exc:  # a shard file or object gone since the manifest was written
            raise at_offsets(LmdataError(f"{exc}; the store is damaged (run `lmdata verify`; re-ingest with "
                                         "--overwrite)"), starts, length) from exc

    def check_ahead(self, starts: np.ndarray, length: int) -> int:
        """Start getting the windows a later ``windows`` call reads ready on another thread (blocks checked,
        pages mapped, the windows read); returns the work the thread finished since the last call (0:
        nothing to do, -1: not known yet). Readers of raw token files do (``MappedWindows``); others need
        not."""
        return 0

    def document(self, doc_id: int) -> np.ndarray:
        """One document's tokens (its end-of-text included)."""
        if not 0 <= doc_id < self._doc_bounds[-1]:
            raise LmdataError(f"document {doc_id} does not exist; the split has {self._doc_bounds[-1]} documents")
        i = int(np.searchsorted(self._doc_bounds, doc_id, side="right") - 1)
        return self._document(i, doc_id - int(self._doc_bounds[i]))

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        raise NotImplementedError

    def _document(self, shard: int, k: int) -> np.ndarray:
        """Document ``k`` of shard ``shard``."""
        raise NotImplementedError
