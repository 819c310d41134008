"""Byte ranges of remote shard files: few requests, many in flight, each block verified.

    files = RangeFiles([FileRef(loc, size, sums), ...], cache=ByteCache(dir, max_bytes))
    chunks = files.read([(file_index, start, stop), ...])   # bytes of each range, in order

A batch's windows become byte ranges; ``read`` widens them to checksum blocks, merges
ranges of one file that lie within ``GAP_BYTES`` of each other (one GET per merged range:
a 20 ms request costs as much as ~25 MB at 10 Gb/s, so reading a gap beats a second
request), issues the merged ranges ``IN_FLIGHT`` at a time on a thread pool (pyarrow's
``read_at`` releases the GIL), checks every block against the file's ``BlockSums`` and
slices the answers back out. A file is opened once per process (its one HEAD).

``ByteCache`` (optional, off by default): block-aligned chunks of ``CACHE_CHUNK`` bytes on
local disk, written tmp + rename so workers and ranks on one machine share it safely
(a reader sees a whole chunk or none), bounded in bytes by evicting the least recently
used chunks; a cached chunk is verified again when read, like a fetched one.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdata.store.blocks import BlockSums
from lmdata.store.uri import Location, remote_error

GAP_BYTES = 1 << 20
IN_FLIGHT = 16
CACHE_CHUNK = 1 << 20


@dataclass
class FileRef:
    """One remote file: where it is, its size (the manifest's), its block checksums (or None)."""

    loc: Location
    size: int
    sums: BlockSums | None
    name: str  # what errors call it: "shard 00003"


class ByteCache:
    """Chunks of remote files on local disk, bounded by ``max_bytes``, shared by processes."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self._added = 0
        self.hits = self.misses = 0

    def _path(self, loc: Location, chunk: int) -> Path:
        key = hashlib.sha1(loc.uri.encode()).hexdigest()[:20]
        return self.directory / key[:2] / f"{key}-{chunk:08d}"

    def get(self, loc: Location, chunk: int) -> bytes | None:
        path = self._path(loc, chunk)
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

    def put(self, loc: Location, chunk: int, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        path = self._path(loc, chunk)
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
        entries = []
        for path in self.directory.glob("*/*"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if not path.name.startswith("."):
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.directory.glob("*/*") if not p.name.startswith("."))


class RangeFiles:
    """Reads byte ranges of a list of remote files (see the module docstring)."""

    def __init__(self, files: list[FileRef], *, cache: ByteCache | None = None, in_flight: int = IN_FLIGHT,
                 gap_bytes: int = GAP_BYTES) -> None:
        self.files = files
        self.cache = cache
        self.in_flight = in_flight
        self.gap_bytes = gap_bytes
        self.requests = 0
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"] = -1  # open files and the pool are per process
        for key in ("_handles", "_pool"):
            state.pop(key, None)
        return state

    def _reset(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._handles: dict[int, Any] = {}
            self._lock = threading.Lock()
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="lmdata-range")

    def _handle(self, i: int) -> Any:
        with self._lock:
            h = self._handles.get(i)
            if h is None:
                h = self._handles[i] = self.files[i].loc.open_input()
            return h

    def _align(self, i: int) -> int:
        sums = self.files[i].sums
        if self.cache is not None:
            return CACHE_CHUNK
        return sums.block_bytes if sums is not None else 1

    def read(self, ranges: list[tuple[int, int, int]]) -> list[bytes]:
        """The bytes ``[start, stop)`` of file ``i`` for each ``(i, start, stop)``, verified."""
        self._reset()
        plan: dict[int, list[list[int]]] = {}
        for i, start, stop in sorted(set(ranges)):
            align = self._align(i)
            a = start // align * align
            b = min(-(-stop // align) * align, self.files[i].size)
            runs = plan.setdefault(i, [])
            if runs and a <= runs[-1][1] + (0 if self.cache else self.gap_bytes):
                runs[-1][1] = max(runs[-1][1], b)
            else:
                runs.append([a, b])
        jobs = [(i, a, b) for i, runs in plan.items() for a, b in runs]
        fetched = dict(zip(jobs, self._pool.map(lambda job: self._fetch(*job), jobs)))
        out = []
        for i, start, stop in ranges:
            for (j, a, b), data in fetched.items():
                if j == i and a <= start and stop <= b:
                    out.append(data[start - a : stop - a])
                    break
            else:  # pragma: no cover - the plan covers every range
                raise AssertionError((i, start, stop))
        return out

    def _fetch(self, i: int, a: int, b: int) -> memoryview:
        if self.cache is not None:
            return memoryview(b"".join(self._chunk(i, c) for c in range(a // CACHE_CHUNK, -(-b // CACHE_CHUNK))))
        return memoryview(self._get(i, a, b))

    def _get(self, i: int, a: int, b: int) -> bytes:
        ref = self.files[i]
        try:
            data = self._handle(i).read_at(b - a, a)
        except OSError as exc:
            raise remote_error(exc, ref.loc) from None
        self.requests += 1
        if len(data) != b - a:
            from lmdata.errors import LmdataError

            raise LmdataError(f"{ref.loc.uri}: {ref.name} returned {len(data)} bytes at {a}, expected {b - a}; "
                              "the object is shorter than the manifest says (run `lmdata verify`)")
        if ref.sums is not None:
            ref.sums.check(a, data, f"{ref.loc.uri}: {ref.name}")
        return data

    def _chunk(self, i: int, c: int) -> bytes:
        ref, cache = self.files[i], self.cache
        assert cache is not None
        a, b = c * CACHE_CHUNK, min((c + 1) * CACHE_CHUNK, ref.size)
        data = cache.get(ref.loc, c)
        if data is not None and len(data) == b - a:
            if ref.sums is not None:
                ref.sums.check(a, data, f"{ref.loc.uri}: {ref.name} (cached copy in {cache.directory})")
            return data
        data = self._get(i, a, b)
        cache.put(ref.loc, c, data)
        return data
