"""Parquet shards decoded once per machine into raw token files, then read like memmap shards.

A window read straight from Parquet decodes the row groups under it -- 16 K tokens for the
1,025 it needs -- and a process that keeps decoded groups in memory holds the store again
per worker. Instead the first process on a machine to read a shard decodes it whole, once:

1. it reads the shard file's bytes (local or one GET) and checks them against the
   manifest's checksum: a check that does not travel with the file, as page CRCs do (a
   shard replaced by another valid Parquet file of the same size is refused here);
2. decodes the ``tokens`` column (every page's CRC-32 checked as it is decoded);
3. writes ``<cache>/parquet/<ab>/<key>.bin`` (the raw tokens) and its block CRCs
   ``.bin.crc`` (``store/blocks.py``), each tmp + rename, the sidecar first.

Every process then reads the copy (``raw_windows``: one ``pread`` per window, blocks checked
on first read, shared by workers through the page cache). The key is the shard's checksum in
the manifest and the identity of the file it was decoded from (path, inode, size, mtime;
an object's URI and size), so a re-ingested store never meets a stale copy, and a shard
file rewritten after its copy was made is decoded -- and checked -- again. The cache is bounded by ``LMDATA_PARQUET_CACHE_BYTES``
(default 64 GiB; least recently opened copies go first); ``0`` turns it off, and then each
process keeps decoded shards in memory instead (up to the reader's ``cache_bytes``).
Its root is ``LMDATA_CACHE_DIR`` (``lmdata.io.cache``); a cache that cannot be written
(a read-only home, a full disk) is the in-memory path, with one warning.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import time
import warnings
from pathlib import Path
from typing import ContextManager

import numpy as np

from lmdata.errors import SettingError
from lmdata.io.atomic import TMP_MARK, temp_path
from lmdata.io.cache import by_age, bytes_short, cache_root, evict_oldest, held_lock, keep_free
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums

DEFAULT_CACHE_BYTES = 64 << 30
FOR_GOOD = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOSPC, errno.EDQUOT}  # not worth trying again
LEFTOVER_AGE_S = 3600.0  # a temporary file or lone sidecar untouched this long was left by a writer that died
NO_ROOM_RETRY_S = 30.0  # after evicting every copy could not make room, the copies are listed again only this late


def cache_bytes_env(kind: str) -> str:
    """The variable bounding the machine's copies of one kind of shard: LMDATA_PARQUET_CACHE_BYTES, ..."""
    return f"LMDATA_{kind.upper()}_CACHE_BYTES"


def cache_budget(kind: str) -> int:
    """``LMDATA_<KIND>_CACHE_BYTES`` (default 64 GiB; 0: no copies), or an error naming it."""
    name = cache_bytes_env(kind)
    limit = os.environ.get(name)
    try:
        return DEFAULT_CACHE_BYTES if limit in (None, "") else int(limit)
    except ValueError:
        raise SettingError(f"{name}={limit!r}: give a number of bytes (0 turns the cache off)") from None


def copy_key(digest: str, source: str) -> str:
    """The cache key of a shard whose manifest checksum is ``digest``, decoded from ``source`` (its identity)."""
    return f"{digest}-{hashlib.sha1(source.encode()).hexdigest()[:12]}"


def file_identity(real_path: str, st: os.stat_result) -> str:
    """A local file's identity for ``copy_key``: a file rewritten or replaced at the same path differs."""
    return f"{real_path}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class DecodedShards:
    """The machine's decoded copies of Parquet shards (see the module docstring)."""

    def __init__(self, root: Path, max_bytes: int, kind: str = "parquet") -> None:
        self.root, self.max_bytes, self.kind = Path(root), int(max_bytes), kind
        self._root = os.fspath(self.root)
        self._added = 0
        self.writable = True  # False once a copy could not be written here: this process stops trying
        self.readable = True  # False: no copy is found either (``bypassed``)
        self._warned = False  # ``_warn`` has warned
        self._no_room_at = -NO_ROOM_RETRY_S  # when evicting every copy last could not make room

    @classmethod
    def from_env(cls, kind: str = "parquet", subdir: str | None = None) -> "DecodedShards | None":
        """The copies of one ``kind`` of shard under ``cache_root()/kind`` (or ``/subdir``), bounded by
        ``LMDATA_<KIND>_CACHE_BYTES`` (default 64 GiB; 0: off)."""
        limit_bytes = cache_budget(kind)
        return cls(cache_root() / (subdir or kind), limit_bytes, kind) if limit_bytes > 0 else None

    def bypassed(self) -> None:
        """These copies neither found nor made: a reader that takes its tokens from the store's files
        (``use_cache=False``) still fetches a batch's shards at once, into its memory."""
        self.readable = self.writable = False

    def path(self, key: str, dtype: np.dtype) -> Path:
        return Path(self.path_of(key, dtype))

    def making(self, key: str, dtype: np.dtype) -> ContextManager[None]:
        """Held while one process makes a copy (``io.cache.held_lock`` on ``<copy>.lock``): a worker or
        rank that needs the same shard meanwhile waits for it instead of fetching it again (8 ranks of
        a node would download the store 8 times)."""
        return held_lock(Path(self.path_of(key, dtype) + ".lock"))

    def path_of(self, key: str, dtype: np.dtype) -> str:
        """The copy's path as a plain string: a reader's first touch of each of a thousand shards pays this."""
        return f"{self._root}/{key[:2]}/{key}-{np.dtype(dtype).str.lstrip('<>|=')}.bin"

    def used(self, path: str) -> None:
        """Record a use of the copy at ``path`` (eviction takes the least recently used first)."""
        try:
            os.utime(path)
        except OSError:
            pass

    def get(self, key: str, dtype: np.dtype, n_bytes: int) -> str | None:
        """The copy of the shard with this key, if it is here whole (its use recorded for eviction)."""
        if not self.readable:
            return None
        path = self.path_of(key, dtype)
        try:
            if os.stat(path).st_size != n_bytes or not os.path.exists(path + SIDECAR_SUFFIX):
                return None
            os.utime(path)
        except OSError:
            return None
        return path

    def put(self, key: str, dtype: np.dtype, tokens: np.ndarray) -> Path | None:
        """Write the copy (sidecar first, then the tokens: a copy with tokens always has its CRCs);
        None when it is not written (the caller keeps the tokens in memory).

        The disk's free part (``keep_free``) is kept as copies are written: one that would eat into it
        first evicts the least recently used copies to make room (the budget alone does not: other
        processes write copies, and other files fill the disk), and is not written where that cannot
        make room (copies still open elsewhere free nothing until closed). A full disk (ENOSPC)
        evicts half the copies and tries once more. A cache that cannot be written for good (read-only,
        not a directory, no permission, still full) turns ``writable`` off: one warning, and this
        process fetches no more copies to keep none; other errors (EIO, too many open files) skip
        this copy alone."""
        path = self.path(key, dtype)
        tokens = np.ascontiguousarray(tokens, dtype=np.dtype(dtype).newbyteorder("<"))
        try:
            if not self._make_room(tokens.nbytes):
                self._warn(f"{self.root}: the disk is nearly full (LMDATA_CACHE_KEEP_FREE keeps {keep_free():g} "
                           f"of it free); reading {self.kind} shards into memory instead of keeping copies")
                return None
            try:
                self._write(path, tokens)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                copies = self._by_age()
                evict_oldest(copies, sum(size for _, size, _ in copies) // 2, self.drop)
                self._write(path, tokens)
        except OSError as exc:
            if exc.errno in FOR_GOOD:
                self.writable = False
            self._warn(f"{self.root}: cannot keep copies of {self.kind} shards here ({exc}); reading them into "
                       f"memory instead (set LMDATA_CACHE_DIR, or {cache_bytes_env(self.kind)}=0 to silence this)")
            return None
        self._added += tokens.nbytes
        if self._added > self.max_bytes // 16:
            self._added = 0
            self.evict()
        return path

    def _warn(self, message: str) -> None:
        """One warning per process and cache, whichever copy met the trouble first (the batch's own and
        the background fetches' writes fail together, each naming another file)."""
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _write(self, path: Path, tokens: np.ndarray) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, write in ((Path(str(path) + SIDECAR_SUFFIX), BlockSums.of(tokens).encode()), (path, tokens)):
            tmp = temp_path(target)
            try:
                with open(tmp, "wb") as fh:
                    fh.write(write if isinstance(write, bytes) else memoryview(write).cast("B"))
                os.replace(tmp, target)  # another process may write the same copy: same bytes, either wins
            finally:
                tmp.unlink(missing_ok=True)

    def _make_room(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit with ``keep_free()`` of the disk left free, once the least recently
        used copies are evicted if need be (one ``statvfs`` a copy; the copies are listed only when the
        disk is that full). Nothing is evicted where evicting every copy would not make the room, and
        the copies are not listed again for ``NO_ROOM_RETRY_S``; an eviction takes a sixteenth of the
        cache more than it must. Listing every copy for each new one had made ``lmdata verify`` of an
        11,761-shard store on a nearly full disk take 323 s (~23,000 copies listed 23,000 times)."""
        short = bytes_short(self.root, nbytes)
        if short <= 0:
            return True
        if time.monotonic() - self._no_room_at < NO_ROOM_RETRY_S:
            return False
        copies = self._by_age()
        held = sum(size for _, size, _ in copies)
        if held < short:
            self._no_room_at = time.monotonic()
            return False
        evict_oldest(copies, max(0, held - int(short) - held // 16), self.drop)
        return bytes_short(self.root, nbytes) <= 0  # a copy open in a process frees its space when closed

    def size(self) -> int:
        """Bytes of the copies here (their sidecars not counted, as the budget does not)."""
        return sum(size for _, size, _ in self._by_age())

    def _by_age(self) -> list[tuple[float, int, Path]]:
        """The copies here (not their sidecars), least recently used first (``io.cache.by_age``)."""
        return by_age(self.root.glob("*/*.bin"))

    def sums(self, path: str | Path) -> BlockSums:
        sidecar = os.fspath(path) + SIDECAR_SUFFIX
        with open(sidecar, "rb") as fh:
            return BlockSums.decode(fh.read(), sidecar)

    def drop(self, path: Path) -> None:
        """Remove a copy found damaged (it is decoded again from the shard)."""
        for p in (path, Path(str(path) + SIDECAR_SUFFIX)):
            p.unlink(missing_ok=True)

    def evict(self) -> None:
        """Delete what writers killed mid-copy left (``remove_leftovers``), then the least recently opened
        copies until the cache holds at most ``max_bytes``."""
        self.remove_leftovers()
        evict_oldest(self._by_age(), self.max_bytes, self.drop)

    def remove_leftovers(self, age_s: float = LEFTOVER_AGE_S) -> None:
        """Temporary files (a DataLoader worker ends by ``os._exit``, maybe mid-``put``; a process killed)
        and sidecars whose copy was never renamed into place, untouched for ``age_s``: a copy is written
        in well under a second, so nothing that old is being written. Uncounted by the budget, they
        would pile up run after run."""
        now = time.time()
        temps = self.root.glob(f"*/.*{TMP_MARK}*")
        orphans = (p for p in self.root.glob(f"*/*{SIDECAR_SUFFIX}")  # its copy's write failed, or it was evicted
                   if not Path(str(p)[:-len(SIDECAR_SUFFIX)]).exists())
        for path in itertools.chain(temps, orphans):
            try:
                if now - path.stat().st_mtime > age_s:
                    path.unlink()
            except FileNotFoundError:  # another process's cleaning, or the write finished meanwhile
                pass
