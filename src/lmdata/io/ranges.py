"""Byte ranges of remote files: few requests, many in flight, each range checked.

    files = RangeFiles([FileRef(loc, size, check, "shard 00003"), ...], cache=ByteCache.from_env())
    chunks = files.read([(file_index, start, stop), ...])   # bytes of each range, in order

``read`` widens each range to the file's ``align`` (its checksum block), merges ranges of
one file that lie within ``GAP_BYTES`` of each other (one GET per merged range: a 20 ms
request costs as much as ~25 MB at 10 Gb/s, so reading a gap beats a second request),
issues the merged ranges ``IN_FLIGHT`` at a time on a thread pool (pyarrow's ``read_at``
releases the GIL), hands every answer to the file's ``check(offset, data, where)`` (the
store's block CRCs: pluggable, so this module knows no store format) and slices the
answers back out. A file is opened once per process (its one HEAD). With a ``ByteCache``
ranges are read in cache chunks, and a cached chunk is checked again when read.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from threading import Lock
from typing import Any, Callable

from lmdata.errors import LmdataError
from lmdata.io.cache import CHUNK_BYTES, ByteCache
from lmdata.io.location import Location
from lmdata.io.process_local import per_process
from lmdata.io.s3 import remote_error

GAP_BYTES = 1 << 20
IN_FLIGHT = 16

Check = Callable[[int, Any, str], None]  # (offset, data, where): raises when data is not what was written


@dataclass
class FileRef:
    """One remote file: where it is, its size (the manifest's), how to check what is read of it."""

    loc: Location
    size: int
    check: Check | None = None
    name: str = ""  # what errors call it: "shard 00003"
    align: int = 1  # reads start and end on multiples of this (the check's block size)


class RangeFiles:
    """Reads byte ranges of a list of remote files (see the module docstring)."""

    def __init__(self, files: list[FileRef], *, cache: ByteCache | None = None, in_flight: int = IN_FLIGHT,
                 gap_bytes: int = GAP_BYTES) -> None:
        self.files = files
        self.cache = cache
        self.in_flight = in_flight
        self.gap_bytes = gap_bytes
        self.requests = 0

    _handles = per_process(lambda self: {})
    _lock = per_process(lambda self: Lock())
    _pool = per_process(lambda self: ThreadPoolExecutor(self.in_flight, thread_name_prefix="lmdata-range"))

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The threads ranges are fetched on (``in_flight`` of them), for a caller's own small GETs."""
        return self._pool

    def _handle(self, i: int) -> Any:
        with self._lock:
            h = self._handles.get(i)
            if h is None:
                h = self._handles[i] = self.files[i].loc.open_input()
            return h

    def read(self, ranges: list[tuple[int, int, int]]) -> list[memoryview]:
        """The bytes ``[start, stop)`` of file ``i`` for each ``(i, start, stop)``, checked."""
        plan: dict[int, list[list[int]]] = {}
        for i, start, stop in sorted(set(ranges)):
            align = CHUNK_BYTES if self.cache is not None else self.files[i].align
            a = start // align * align
            b = min(-(-stop // align) * align, self.files[i].size)
            runs = plan.setdefault(i, [])
            if runs and a <= runs[-1][1] + (0 if self.cache else self.gap_bytes):
                runs[-1][1] = max(runs[-1][1], b)
            else:
                runs.append([a, b])
        jobs = [(i, a, b) for i, runs in plan.items() for a, b in runs]
        fetched = dict(zip(jobs, self._pool.map(lambda job: self._fetch(*job), jobs)))
        by_file: dict[int, list[tuple[int, int, memoryview]]] = {}
        for (i, a, b), data in fetched.items():
            by_file.setdefault(i, []).append((a, b, data))
        out = []
        for i, start, stop in ranges:
            a, _, data = next(run for run in by_file[i] if run[0] <= start and stop <= run[1])
            out.append(data[start - a : stop - a])
        return out

    def _fetch(self, i: int, a: int, b: int) -> memoryview:
        if self.cache is not None:
            return memoryview(b"".join(self._chunk(i, c) for c in range(a // CHUNK_BYTES, -(-b // CHUNK_BYTES))))
        return memoryview(self._get(i, a, b))

    def _get(self, i: int, a: int, b: int) -> bytes:
        ref = self.files[i]
        try:
            data = self._handle(i).read_at(b - a, a)
        except OSError as exc:
            raise remote_error(exc, ref.loc.uri) from None
        self.requests += 1
        if len(data) != b - a:
            raise LmdataError(f"{ref.loc.uri}: {ref.name} returned {len(data)} bytes at {a}, expected {b - a}; "
                              "the object is shorter than the manifest says (run `lmdata verify`)")
        if ref.check is not None:
            ref.check(a, data, f"{ref.loc.uri}: {ref.name}")
        return data

    def _chunk(self, i: int, c: int) -> bytes:
        ref, cache = self.files[i], self.cache
        assert cache is not None
        a, b = c * CHUNK_BYTES, min((c + 1) * CHUNK_BYTES, ref.size)
        data = cache.get(ref.loc.uri, c)
        if data is not None and len(data) == b - a:
            if ref.check is not None:
                ref.check(a, data, f"{ref.loc.uri}: {ref.name} (cached copy in {cache.directory})")
            return data
        data = self._get(i, a, b)
        cache.put(ref.loc.uri, c, data)
        return data
