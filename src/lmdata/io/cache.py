"""lmdata's local cache: its root (``LMDATA_CACHE_DIR``) and the byte cache of remote files.

    cache_root()                       # $LMDATA_CACHE_DIR, default ~/.cache/lmdata
      staging/<hash of URI>/           #   an s3:// ingest built before upload (ingest.publish)
      tokenizers/<hash of URI>/        #   a remote store's tokenizer (store.store)
      ranges/                          #   ByteCache chunks of remote shard files

``ByteCache`` (optional, off by default): block-aligned chunks of ``CHUNK_BYTES`` bytes on
local disk, written tmp + rename so workers and ranks on one machine share it safely
(a reader sees a whole chunk or none), bounded in bytes by evicting the least recently
used chunks. A chunk read back is checked again by whoever reads it (``ranges``).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from lmdata.io.env import env_number

CHUNK_BYTES = 1 << 20
CACHE_DIR_ENV = "LMDATA_CACHE_DIR"
CACHE_BYTES_ENV = "LMDATA_REMOTE_CACHE_BYTES"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "lmdata")


def keyed_dir(kind: str, uri: str) -> Path:
    """``<cache root>/<kind>/<hash of uri>``: a stable local directory for one remote thing."""
    return cache_root() / kind / hashlib.sha1(uri.encode()).hexdigest()[:16]


class ByteCache:
    """Chunks of remote files on local disk, bounded by ``max_bytes``, shared by processes."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self._added = 0
        self.hits = self.misses = 0

    @classmethod
    def from_env(cls) -> "ByteCache | None":
        """``LMDATA_REMOTE_CACHE_BYTES`` > 0 turns the cache on (under ``cache_root()/ranges``)."""
        limit = int(env_number(CACHE_BYTES_ENV, 0, lambda v: 0 <= v < math.inf and v == int(v),
                               "give the cache's budget in bytes, a whole number >= 0 (0: no cache)"))
        return cls(cache_root() / "ranges", limit) if limit > 0 else None

    def _path(self, uri: str, chunk: int) -> Path:
        key = hashlib.sha1(uri.encode()).hexdigest()[:20]
        return self.directory / key[:2] / f"{key}-{chunk:08d}"

    def get(self, uri: str, chunk: int) -> bytes | None:
        path = self._path(uri, chunk)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        self.hits += 1
        try:
            os.utime(path)  # recently used
        except OSError:
            pass
        return data

    def put(self, uri: str, chunk: int, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        path = self._path(uri, chunk)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # another process may write the same chunk: same bytes, either wins
        self._added += len(data)
        if self._added > self.max_bytes // 8:
            self._added = 0
            self.evict()

    def evict(self) -> None:
        """Delete least recently used chunks until the cache holds at most ``max_bytes``."""
        evict_oldest(self._by_age(), self.max_bytes, lambda path: path.unlink(missing_ok=True))

    def size(self) -> int:
        return sum(size for _, size, _ in self._by_age())

    def _by_age(self) -> list[tuple[float, int, Path]]:
        return by_age(p for p in self.directory.glob("*/*") if not p.name.startswith("."))


def evict_oldest(entries: list[tuple[float, int, Path]], max_bytes: int, remove: Callable[[Path], None]) -> None:
    """``remove`` the least recently modified of ``entries`` (``by_age``'s listing) until the rest hold
    at most ``max_bytes``."""
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= max_bytes:
            break
        remove(path)
        total -= size


def by_age(paths: Iterable[Path]) -> list[tuple[float, int, Path]]:
    """``(mtime, size, path)`` of each of ``paths`` still there (a file gone meanwhile, removed by another
    process, is left out), the least recently modified first."""
    entries = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    return sorted(entries)


KEEP_FREE = 0.10  # of the disk this user can reach: what copies of remote data never take
KEEP_FREE_ENV = "LMDATA_CACHE_KEEP_FREE"


def keep_free() -> float:
    """The fraction of the disk copies leave free: ``LMDATA_CACHE_KEEP_FREE`` (0 <= f < 1), default a tenth."""
    return env_number(KEEP_FREE_ENV, KEEP_FREE, lambda v: 0 <= v < 1, "give the fraction of the cache's disk "
                      f"that copies of remote shards leave free, a number from 0 to below 1 (default {KEEP_FREE:g})")


def fits_on_disk(directory: Path, nbytes: int) -> bool:
    """Whether ``nbytes`` more under ``directory`` (made or not) still leave ``keep_free()`` of its disk free,
    counting what ``directory`` already holds as reusable: copies of a remote store must not fill the
    disk that checkpoints and logs are written to."""
    short = bytes_short(directory, nbytes)
    return short <= 0 or tree_bytes(directory) >= short


def bytes_short(directory: Path, nbytes: int) -> float:
    """How far ``nbytes`` more under ``directory`` would eat into the ``keep_free()`` part of its disk
    (<= 0: not at all). The disk is what this user can reach (used + available): blocks reserved for
    root are no space of ours, and a filesystem that reserves most of itself (seen: 252 GB, 24 GB
    available, 78 GB used) must not read as full with 24 GB free."""
    probe = Path(directory)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return keep_free() * (usage.used + usage.free) - (usage.free - nbytes)


def tree_bytes(directory: Path) -> int:
    """Bytes of the files under ``directory`` (0 when it does not exist)."""
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())


LOCK_WAIT_S = 900.0  # a copy's maker holding its lock longer than this is taken for stuck


@contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """Hold the lock file ``path`` (``filelock``: flock on POSIX, released by the OS if the process dies)
    while one process makes a copy the others would otherwise make too; they wait for it. A lock
    that cannot be taken (a read-only cache), or not within ``LOCK_WAIT_S`` (its holder stuck, alive),
    is no lock: the copy is then made without it (written to a temporary name and renamed: the same
    bytes whoever wins), rather than waiting for ever."""
    from filelock import FileLock, Timeout

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        lock.acquire(timeout=LOCK_WAIT_S)  # waits without the GIL
    except (OSError, Timeout):
        yield
        return
    try:
        yield
    finally:
        lock.release()
