"""Checksums and size checks of shard files: what the manifest promises about each file.

``file_info`` records a file as the manifest stores it (relative path, bytes, checksum:
``digests.py``);
``check_sizes`` (per shard where a reader first opens it; a reader's ``check()`` for all)
is the cheap check before a shard is served (a short file is an error naming it, never fewer
tokens); ``digest_file`` is the full pass of ``lmdata verify``.

``verify_shard`` is what a reader runs the first time a process touches a shard of a store
without block checksums: with ``verify="first-use"`` (the default) its files are hashed against the manifest
once per process, so a bit flip is refused naming the shard; ``"size"`` checks sizes
only. Results are memoized per process by file identity (device, inode, size, mtime),
so a replaced or rewritten file is hashed again and ``lmdata verify``'s pass counts.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from stat import S_ISLNK
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io import atomic
from lmdata.io.descriptors import descriptors
from lmdata.io.s3 import EndpointError, library_text, remote_error
from lmdata.io import digests
from lmdata.store.manifest import format_dir_inside, plain_name, resolve_inside
from lmdata.store.protocol import FileInfo, ShardInfo

# "first-use" hashes a whole shard file only where a store has no block or row checksums
# (memmap stores of format version 1, Lance stores before row CRCs, small files: document
# starts, row indexes, sidecars): a process pays one pass over the files it touches, never
# all at open. A user who already ran `lmdata verify` can pass verify="size" to skip it.
# Without hashing a bit flip in a memmap shard would be served as a wrong token, silently.
VERIFY_MODES = ("first-use", "size")
DEFAULT_VERIFY = "first-use"

_verified: dict[tuple, str | None] = {}  # file identity -> None (sound) or the error message


digest_file = digests.of_file  # a file's checksum by the algorithm its entry records: ``lmdata verify``'s pass


def sha256_file(path: Path) -> str:
    """Deprecated (the manifest's checksum before store format 3): the file's sha256."""
    import warnings

    warnings.warn("sha256_file is deprecated: digest_file(path, algo) hashes by the entry's algorithm",
                  DeprecationWarning, stacklevel=2)
    return digests.of_file(path, "sha256")


def file_info(format_dir: Path, relpath: str) -> FileInfo:
    """``FileInfo`` of ``format_dir / relpath`` (size and checksum read from disk)."""
    full = Path(format_dir) / relpath
    return FileInfo(relpath, full.stat().st_size, digest_file(full))


def write_shard_parts(format_dir: Path, relpath: str, parts: Sequence[Any]) -> tuple[bool, FileInfo]:
    """A shard file written durably from buffers in memory (arrays, bytes, Arrow buffers), the directory
    left to the caller (``atomic.write_file``), and its ``FileInfo``. Returns (an older file was
    replaced, info). Its pages leave the page cache once synced (an ingest does not read its shards
    back: ``atomic.drop_cached``). Hashed as the buffers are written, not read back from the file
    (a 2 MiB shard: ~4.5 -> ~2.6 CPU ms with its fsync; the read back hashed the page cache's copy of
    the same bytes, no more proof that they reached the disk; xxh128, not sha256: 4.1-4.4 -> 2.2-2.3 CPU ms a memmap shard)."""
    views = [memoryview(p).cast("B") for p in parts]
    size = sum(v.nbytes for v in views)
    infos: list[FileInfo] = []

    def write_and_hash(tmp: Path) -> None:
        digest = digests.new()
        with open(tmp, "wb") as fh:
            for view in views:
                fh.write(view)
                digest.update(view)
        if os.path.getsize(tmp) != size:  # pragma: no cover - a short write raises first
            raise LmdataError(f"{Path(format_dir) / relpath}: wrote {os.path.getsize(tmp)} of {size} bytes")
        infos.append(FileInfo(relpath, size, digest.hexdigest()))

    replaced = atomic.write_file(Path(format_dir) / relpath, write_and_hash, sync_dir=False, needed=size,
                                 drop_cache=True)
    return replaced, infos[-1]


def shard_file_path(format_dir: Path, shard: ShardInfo, info: FileInfo) -> Path:
    """The path of one shard file, refusing paths that leave the store (absolute, ``..``, symlinks).

    A plain file name that is no symlink, in a format directory already found inside the store,
    needs no ``realpath`` (~0.2 ms each: a reader opens thousands of shards).
    """
    format_dir = Path(format_dir)
    plain = plain_path(format_dir, info)
    if plain is not None and not os.path.islink(plain):
        return Path(plain)
    # format_dir = <store>/<split>/<format>: the store is two levels up.
    return resolve_inside(format_dir.parent.parent, format_dir, info.path)


_dirs_inside: dict[str, bool] = {}  # format directory -> it resolves inside its store


def plain_path(format_dir: Path | str, info: FileInfo) -> str | None:
    """The file's path by a join alone (a plain name in a format directory inside the store), or None
    where it must be resolved and checked (``resolve_inside``). A symlink is still the caller's to refuse."""
    if plain_name(info.path) and inside_store(format_dir):
        return os.path.join(format_dir, info.path)
    return None


def inside_store(format_dir: Path | str) -> bool:
    """Whether the format directory resolves inside its store (one ``realpath`` each, then remembered)."""
    key = str(format_dir)
    inside = _dirs_inside.get(key)
    if inside is None:
        inside = _dirs_inside[key] = format_dir_inside(format_dir)
    return inside


def check_sizes(format_dir: Path, shards: list[ShardInfo]) -> None:
    """Every shard file exists with the size the manifest records, else an error naming it; a file
    that is a symlink resolves inside the store (``stat_shard_file``: one ``lstat`` a plain file)."""
    root = str(format_dir)
    if not inside_store(root):
        for shard in shards:
            for info in shard.files:
                stat_shard_file(format_dir, shard, info)
        return
    prefix, lstat = root + os.sep, os.lstat  # the loop open_store runs over every file of a store, inline
    for shard in shards:  # (11,761 shards in 3 formats: 187-189 -> 133-138 ms, most of it the lstats)
        for info in shard.files:
            name = info.path
            if not plain_name(name):
                stat_shard_file(format_dir, shard, info)  # resolved and checked inside the store
                continue
            try:
                st = lstat(prefix + name)
            except FileNotFoundError:
                st = None
            if st is None or st.st_size != info.bytes or S_ISLNK(st.st_mode):
                stat_shard_file(format_dir, shard, info)  # names what is wrong, or follows a symlink inside


def stat_shard_file(format_dir: Path | str, shard: ShardInfo, info: FileInfo) -> tuple[str, os.stat_result]:
    """One shard file's path and ``os.stat``, its size checked against the manifest (the error names it).

    A plain name in a format directory inside the store costs one ``lstat`` (which also tells it
    is no symlink): a reader's first touch of each of thousands of shards pays this.
    """
    path = plain_path(format_dir, info)
    if path is not None:
        st = _stat(os.lstat, path, shard)
        if not S_ISLNK(st.st_mode):
            return path, _sized(path, shard, info, st)
    path = str(shard_file_path(Path(format_dir), shard, info))
    return path, _sized(path, shard, info, _stat(os.stat, path, shard))


def open_shard_file(format_dir: str, shard: ShardInfo, info: FileInfo) -> tuple[str, int]:
    """One shard file's path and a descriptor from this thread's pool, its size checked (``stat_shard_file``).

    A plain name in a format directory inside the store costs one ``open`` (``O_NOFOLLOW``:
    a symlink takes the resolving path) and one ``fstat``, against an ``lstat``'s path walk
    and then an ``open``'s: ~5 us less of a reader's first touch of each shard."""
    pool, path = descriptors(), plain_path(format_dir, info)
    if path is not None:
        try:
            fd = pool.get(path, nofollow=True)
        except FileNotFoundError:
            _stat(os.lstat, path, shard)  # raises, naming the shard
            raise
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        else:
            try:
                _sized(path, shard, info, os.fstat(fd))
            except LmdataError:
                pool.forget(path)
                raise
            return path, fd
    path, _ = stat_shard_file(format_dir, shard, info)
    return path, pool.get(path)


def _stat(stat: Any, path: str, shard: ShardInfo) -> os.stat_result:
    try:
        return stat(path)
    except FileNotFoundError:
        raise LmdataError(
            f"{path}: shard {shard.name} file is missing; run `lmdata verify` and re-ingest (--overwrite)"
        ) from None


def _sized(path: str, shard: ShardInfo, info: FileInfo, st: os.stat_result) -> os.stat_result:
    if st.st_size != info.bytes:
        raise LmdataError(
            f"{path}: shard {shard.name} file has {st.st_size} bytes, the manifest says {info.bytes}; "
            "the store is damaged (run `lmdata verify`; re-ingest with --overwrite)"
        )
    return st


def check_verify_mode(verify: str) -> str:
    if verify not in VERIFY_MODES:
        raise LmdataError(f"verify={verify!r}: choose one of {', '.join(map(repr, VERIFY_MODES))}")
    return verify


def _identity(path: Path, info: FileInfo) -> tuple:
    st = os.stat(path)
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, info.digest)


def mark_verified(path: Path, info: FileInfo) -> None:
    """Record that ``path`` was hashed and matched ``info`` (``lmdata verify`` calls this)."""
    _verified[_identity(path, info)] = None


def verify_shard(format_dir: Path, shard: ShardInfo, verify: str, infos: list[FileInfo] | None = None) -> None:
    """Size-check (always) and, with ``verify="first-use"``, hash ``shard``'s files once per process."""
    check_sizes(format_dir, [shard])
    if verify != "first-use":
        return
    for info in shard.files if infos is None else infos:
        path = shard_file_path(format_dir, shard, info)
        _check_once(_identity(path, info), path, shard, info, lambda: digest_file(path, info.algo))


def _check_once(key: tuple, path: Any, shard: ShardInfo, info: FileInfo, digest: Callable[[], str]) -> None:
    """The file at ``path`` (identity ``key``) against its checksum, hashed once per process and identity:
    its error, remembered, is raised again."""
    if key not in _verified:
        _verified[key] = None if digest() == info.digest else (
            f"{path}: shard {shard.name} fails its {info.algo} checksum (the file is corrupt); "
            "run `lmdata verify` and re-ingest with --overwrite")
    if _verified[key] is not None:
        raise LmdataError(_verified[key])


def read_small_file(format_dir: Path | str, shard: ShardInfo, info: FileInfo, verify: str) -> tuple[str, bytes]:
    """A small shard file (document starts, a row index) read whole and once: its size checked and, with
    ``verify="first-use"``, its bytes hashed against the manifest once per process and file identity,
    taken from the descriptor the bytes were read through. ``verify_shard`` had hashed the file and
    ``np.load`` then read it again: with the path resolved twice, ~0.2 ms a shard, 2.2 s of
    ``lmdata inspect`` over 11,761 shards."""
    path, _ = stat_shard_file(format_dir, shard, info)
    st, raw = read_whole(path, info.bytes + 1)
    if len(raw) != info.bytes:  # changed since the stat: named as a wrong size all the same
        _sized(path, shard, info, os.stat_result((*st[:6], len(raw), *st[7:])))
    if verify == "first-use":
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, info.digest)
        _check_once(key, path, shard, info, lambda: digests.of(raw, info.algo))
    return path, raw


def read_whole(path: str, limit: int | None = None) -> tuple[os.stat_result, bytes]:
    """``fstat`` of the file at ``path`` and its bytes (at most ``limit``), read until its end: a read
    may return less (a network filesystem, or 2 GiB and more). ``O_NONBLOCK``: a FIFO is not waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        n = st.st_size + 1 if limit is None else limit
        parts, got = [], 0
        while got < n:
            part = os.read(fd, min(n - got, 1 << 30))
            if not part:
                break
            parts.append(part)
            got += len(part)
    finally:
        os.close(fd)
    return st, parts[0] if len(parts) == 1 else b"".join(parts)


def read_error(path: Path, shard: ShardInfo, exc: BaseException) -> LmdataError:
    """A format library's failure reading a shard (e.g. pyarrow's bare OSError) as an error naming it."""
    if isinstance(exc, LmdataError):
        return exc
    if getattr(path, "remote", False) and isinstance(err := remote_error(exc, str(path)), EndpointError):
        return err  # the endpoint failed (no answer, unreachable), not the shard
    return LmdataError(
        f"{path}: shard {shard.name} could not be read ({type(exc).__name__}: {library_text(exc)}); the store is damaged "
        "(run `lmdata verify`; re-ingest with --overwrite)"
    )


def at_offsets(exc: LmdataError, starts: Any, length: int) -> LmdataError:
    """``exc`` with the global window offsets that were being read appended."""
    offsets = np.asarray(starts).reshape(-1).tolist()
    shown, more = offsets[:8], "..." if len(offsets) > 8 else ""
    kind = EndpointError if isinstance(exc, EndpointError) else LmdataError  # the endpoint's failure stays one
    return kind(f"{exc} [reading windows of {length} tokens at offsets {shown}{more}]")
