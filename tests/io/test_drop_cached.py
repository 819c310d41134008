"""Shard files leave the page cache once written and synced (``io.atomic.drop_cached``).

Residency is read with ``mincore(2)`` on a mapping of the file (Linux). A filesystem that keeps
every page in memory (tmpfs) cannot drop them: the tests skip there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from lmdata.io import atomic
import pyarrow as pa

from lmdata.store.checksum import file_info, write_shard_parts

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) and fadvise: Linux")


def resident_pages(path: Path) -> int:
    """How many of ``path``'s pages are in the page cache now (a read-only mapping: faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                               ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as fh:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
        finally:
            libc.munmap(addr, size)
    return sum(v & 1 for v in vec)


def _in_memory_fs(path: Path) -> bool:
    """Whether ``path`` lives on a filesystem whose pages cannot be dropped (tmpfs, ramfs)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount, fstype = line.split()[:3]
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fstype
    return kind in ("tmpfs", "ramfs")


def _skip_unless_pages_can_be_dropped(where: Path) -> None:
    """Skip where the filesystem cannot drop a file's pages at all (tmpfs; an overlay that does not pass
    the advice on), probed with plain os calls, none of lmdata's: only then is the test's premise there."""
    if _in_memory_fs(where):
        pytest.skip(f"{where} is on an in-memory filesystem: its pages cannot leave the cache")
    probe = where / ".drop-probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, os.urandom(1 << 20))
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    kept = resident_pages(probe)
    probe.unlink()
    if kept > (1 << 20) // mmap.PAGESIZE // 2:
        pytest.skip(f"{where}: this filesystem keeps a file's pages after fadvise(DONTNEED)")


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    _skip_unless_pages_can_be_dropped(tmp_path)
    return tmp_path


def test_a_written_file_stays_cached_without_the_flag_and_leaves_with_it(disk_dir):
    data = os.urandom(4 << 20)
    atomic.write_file(disk_dir / "kept.bin", lambda p: p.write_bytes(data))
    atomic.write_file(disk_dir / "dropped.bin", lambda p: p.write_bytes(data), drop_cache=True)
    pages = len(data) // mmap.PAGESIZE
    assert resident_pages(disk_dir / "kept.bin") > pages // 2  # the premise: a plain write stays cached
    assert resident_pages(disk_dir / "dropped.bin") < pages // 10
    assert (disk_dir / "dropped.bin").read_bytes() == data  # read back from the disk, whole


def test_write_shard_parts_records_what_file_info_reads(disk_dir):
    tokens = np.arange(1 << 20, dtype=np.uint16)
    parts = [b"head", tokens, pa.py_buffer(b"arrow buffer"), memoryview(b"tail")]
    replaced, info = write_shard_parts(disk_dir, "tokens-00000.bin", parts)
    assert resident_pages(disk_dir / "tokens-00000.bin") < tokens.nbytes // mmap.PAGESIZE // 10  # never read back
    assert not replaced and info == file_info(disk_dir, "tokens-00000.bin")  # hashed in memory = read from disk
    assert (disk_dir / "tokens-00000.bin").read_bytes() == b"head" + tokens.tobytes() + b"arrow buffertail"
    replaced, _ = write_shard_parts(disk_dir, "tokens-00000.bin", [tokens])
    assert replaced and sorted(p.name for p in disk_dir.iterdir()) == ["tokens-00000.bin"]  # no temporary left


def test_drop_cached_is_advice_only():
    r, w = os.pipe()  # fadvise on a pipe fails with ESPIPE: nothing raised, nothing changed
    try:
        atomic.drop_cached(r)
    finally:
        os.close(r)
        os.close(w)


def test_an_ingest_leaves_its_shards_out_of_the_page_cache(tmp_path_factory, tokenizer_dir):
    from samples import FORMATS, SAMPLE

    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec

    out = tmp_path_factory.mktemp("dropped") / "store"
    _skip_unless_pages_can_be_dropped(out.parent)
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=FORMATS, shard_tokens=20_000,
           workers=1, progress=False, log=None)
    shards = [p for fmt in ("memmap", "parquet") for p in (out / "train" / fmt).iterdir() if p.suffix in (".bin", ".parquet")]
    shards += list((out / "train" / "lance" / "data").iterdir())
    assert len(shards) >= 3
    resident = {p.name: resident_pages(p) for p in shards}
    assert all(n <= 1 for n in resident.values()), resident  # at most a page the last append touched
