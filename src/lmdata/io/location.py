"""Where a store, an input or an output lives: one type for local paths and ``s3://`` objects.

    loc = location("s3://bucket/runs/store")   # Location('s3://bucket/runs/store')
    loc.remote, loc.fs_path                    # True, 'bucket/runs/store'
    (loc / "train" / "memmap").uri             # 's3://bucket/runs/store/train/memmap'
    loc.read_bytes(), loc.size(), loc.list()   # the same calls for a local path
    location("runs/store").local_path          # PosixPath('runs/store')
    location("file:///abs/store")              # the local path /abs/store
    location("gs://b/x")                       # LmdataError: unknown scheme (never a dir 'gs:')

A local location is the ``file`` scheme: it joins, lists, reads and writes like a remote
one (local writes are tmp + fsync + rename: ``atomic``), so callers branch on ``remote``
only where the two truly differ (a memmap needs a local file). A ``Location`` holds strings
only: it pickles small to loader workers and carries the AWS settings it was made under.
Bytes are stored and read as they are: nothing here compresses or decompresses by file
extension (pyarrow would by default); ``streams`` decompresses inputs, once.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from lmdata.errors import LmdataError
from lmdata.io.read_ahead import ReadAhead
from lmdata.io.s3 import apply_aws_environment, aws_environment, is_missing, lance_storage_options, remote_error, \
    s3_filesystem

SCHEMES = ("s3",)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_ALMOST_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/?(?!/)")  # s3:/b/x, s3:b/x: a slash short of a URI
STREAM_BUFFER = 1 << 20


def is_uri(text: str | os.PathLike) -> bool:
    """Whether ``text`` names a URI (any ``scheme://``, known or not)."""
    return isinstance(text, str) and _URI.match(text) is not None


def location(where: "str | os.PathLike | Location", *, flag: str = "path") -> "Location":
    """``where`` as a ``Location``; an unknown ``scheme://`` is an error naming ``flag``.

    ``file://PATH`` is the local ``PATH``.
    """
    if isinstance(where, Location):
        return where
    if not isinstance(where, str):
        return Location("file", os.fspath(where))
    m = _URI.match(where)
    if m is None:
        almost = _ALMOST_URI.match(where)
        if almost and almost.group(1).lower() in SCHEMES + ("file",):
            raise LmdataError(f"{flag} {where!r}: looks like a URI with a slash missing; write "
                              f"{almost.group(1)}://..., or ./{where} for a local directory of that name")
        return Location("file", where)
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        return Location("file", rest)
    if scheme not in SCHEMES:
        raise LmdataError(
            f"{flag} {where!r}: unknown URI scheme {scheme!r}; use a local path or s3://bucket/prefix"
        )
    if rest.startswith("/") or not rest.strip("/"):  # s3:///x had become bucket "x"
        raise LmdataError(f"{flag} {where!r}: no bucket; write s3://bucket/prefix")
    rest = rest.strip("/")
    return Location(scheme, re.sub(r"/+", "/", rest))


def local_dir(where: "str | os.PathLike", *, flag: str = "--out", what: str = "this command's output") -> Path:
    """An output that only a local directory can hold: ``file:///ABS`` is ``/ABS``; ``s3://``
    (or ``s3:/x``, a slash short) is an error naming ``flag``, never a local tree named after it."""
    loc = location(where, flag=flag)
    if loc.remote:
        raise LmdataError(f"{flag} {where!r}: {what} is written to local disk only; give a local path "
                          "(a store on object storage is written by `lmdata ingest --out s3://...`)")
    return Path(loc.path)


class Listed(NamedTuple):
    """One file found by ``Location.list``: where it is, its key below the listed prefix, its size."""

    loc: "Location"
    key: str
    size: int


class Location:
    """A local path or an object-storage URI: joins like a path, reads and writes whole objects."""

    __slots__ = ("scheme", "path")

    def __init__(self, scheme: str, path: str) -> None:
        self.scheme, self.path = scheme, path

    # -- naming -------------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        return self.scheme != "file"

    @property
    def uri(self) -> str:
        """What the user wrote: ``s3://bucket/key`` or the local path."""
        return f"{self.scheme}://{self.path}" if self.remote else self.path

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> "Location":
        if not self.remote:
            return Location("file", str(Path(self.path).parent))
        return Location(self.scheme, self.path.rsplit("/", 1)[0] if "/" in self.path else self.path)

    @property
    def local_path(self) -> Path:
        if self.remote:
            raise AssertionError(f"{self.uri} is not a local path")
        return Path(self.path)

    @property
    def fs_path(self) -> str:
        """The path the filesystem takes: ``bucket/key``, or the local absolute path."""
        return self.path if self.remote else os.path.abspath(self.path)

    def __truediv__(self, part: str) -> "Location":
        if not self.remote:
            return Location("file", os.path.join(self.path, part))
        return Location(self.scheme, f"{self.path}/{str(part).strip('/')}")

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:  # only local locations are paths
        return str(self.local_path)

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.scheme, self.path) == (other.scheme, other.path)

    def __hash__(self) -> int:
        return hash((self.scheme, self.path))

    def __getstate__(self) -> tuple:
        # A remote location carries the AWS settings it was made under, so a loader worker
        # (a forkserver child started before the caller set them) reads the same endpoint.
        return (self.scheme, self.path, aws_environment() if self.remote else {})

    def __setstate__(self, state: tuple) -> None:
        self.scheme, self.path = state[0], state[1]
        apply_aws_environment(state[2] if len(state) > 2 else {})

    # -- the filesystem ---------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The pyarrow filesystem ``fs_path`` belongs to (what pyarrow datasets and Lance take)."""
        if not self.remote:
            import pyarrow.fs as pafs

            return pafs.LocalFileSystem()
        return s3_filesystem()

    def storage_options(self) -> dict[str, str]:
        """Lance's ``storage_options`` for this location (empty for a local path)."""
        return lance_storage_options() if self.remote else {}

    def _failed(self, exc: BaseException) -> Exception:
        """A library's failure here: ``FileNotFoundError`` for a missing object, else one line naming it."""
        if is_missing(exc):
            return FileNotFoundError(f"{self.uri}: no such object" if self.remote else self.uri)
        return remote_error(exc, self.uri) if self.remote else exc

    def size(self) -> int | None:
        """Bytes of the file or object, or None when there is none (or it is a directory)."""
        if not self.remote:
            try:
                st = os.stat(self.path)
            except (FileNotFoundError, NotADirectoryError):
                return None
            return st.st_size if os.path.isfile(self.path) else None
        import pyarrow.fs as pafs

        try:
            info = self.fs.get_file_info(self.fs_path)
        except OSError as exc:
            raise remote_error(exc, self.uri) from None
        return info.size if info.type == pafs.FileType.File else None

    def is_file(self) -> bool:
        return self.size() is not None

    def check_bucket(self) -> None:
        """Raise the one-line "the bucket does not exist" error naming this URI when its bucket is
        missing (a local path: nothing): said instead of "no such object" or "not a store"."""
        if self.remote and not Location(self.scheme, self.bucket).exists():
            raise remote_error(OSError("NoSuchBucket"), self.uri)

    def exists(self) -> bool:
        """A file, a directory, a bucket or a prefix holding objects is here."""
        if not self.remote:
            return os.path.exists(self.path)
        import pyarrow.fs as pafs

        try:
            return self.fs.get_file_info(self.fs_path).type != pafs.FileType.NotFound
        except OSError as exc:
            raise remote_error(exc, self.uri) from None

    def read_bytes(self) -> bytes:
        """The whole file or object (a HEAD, then one GET); a missing one is ``FileNotFoundError``.

        Not a stream's ``read()``: pyarrow reads a stream in 256 KiB GETs one after another, so a
        7 MB Lance row index was 28 round trips and a 2.9 MB manifest 12 (on s3rver behind a 20 ms
        proxy, 1.0 s of a remote Lance first batch)."""
        if not self.remote:
            return self.local_path.read_bytes()
        with self.open_input() as fh:
            try:
                return fh.read_at(fh.size(), 0)
            except OSError as exc:
                raise self._failed(exc) from None

    def open_stream(self) -> Any:
        """A buffered binary stream of the stored bytes, read front to back (never decompressed here);
        remote: a HEAD, then parts fetched ahead of the reader (``read_ahead``: a GET at a time had
        read at a part per round trip)."""
        if not self.remote:
            return open(self.path, "rb", buffering=STREAM_BUFFER)
        return io.BufferedReader(ReadAhead(self.open_input(), self.uri), STREAM_BUFFER)

    def open_input(self) -> Any:
        """A random-access pyarrow file (``read_at`` is safe from many threads); remote: one HEAD.

        Open once per process and keep it: pyarrow's Python API takes no size to skip the HEAD.
        """
        try:
            return self.fs.open_input_file(self.fs_path)
        except OSError as exc:
            raise self._failed(exc) from None

    def write_bytes(self, data: bytes) -> None:
        """Replace the object with ``data``: one PUT, all or nothing (a local path: tmp + fsync + rename)."""
        if not self.remote:
            from lmdata.io import atomic

            self.local_path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_bytes(self.local_path, data)
            return
        try:
            with self.fs.open_output_stream(self.fs_path, compression=None) as fh:
                fh.write(data)
        except OSError as exc:
            raise remote_error(exc, self.uri) from None

    def upload(self, local: Path) -> None:
        """Copy a local file here, byte for byte (multipart for large files: pyarrow's)."""
        import pyarrow.fs as pafs

        try:
            pafs.copy_files(os.path.abspath(local), self.fs_path, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.fs)
        except OSError as exc:
            raise remote_error(exc, self.uri) from None

    def delete(self) -> None:
        """Remove the file or object if it exists."""
        try:
            self.fs.delete_file(self.fs_path)
        except OSError as exc:
            if not is_missing(exc):
                raise remote_error(exc, self.uri) from None

    def delete_tree(self) -> None:
        """Remove every object under this prefix."""
        try:
            self.fs.delete_dir_contents(self.fs_path, missing_dir_ok=True)
        except OSError as exc:
            raise remote_error(exc, self.uri) from None

    def list(self, recursive: bool = False) -> list[Listed]:
        """Files under this prefix with their sizes, sorted by key (empty when there are none): one LIST."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.fs_path, allow_not_found=True, recursive=recursive))
        except OSError as exc:
            raise remote_error(exc, self.uri) from None
        n = len(self.fs_path.rstrip("/")) + 1
        found = [Listed(self / info.path[n:], info.path[n:], info.size)
                 for info in infos if info.type == pafs.FileType.File]
        return sorted(found, key=lambda x: x.key)


def glob(pattern: str, *, flag: str = "--input") -> list[Location]:
    """The objects matching an ``s3://bucket/prefix/*.txt`` pattern (``*``, ``?``, ``[...]``; ``**`` spans /)."""
    loc = location(pattern, flag=flag)
    assert loc.remote, "local globs are the caller's (the glob module)"
    parts = loc.path.split("/")
    fixed = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    if fixed == len(parts):
        return [loc] if loc.is_file() else []
    base = Location(loc.scheme, "/".join(parts[:fixed]))
    regex = re.compile(_glob_regex("/".join(parts[fixed:])))
    return [m.loc for m in base.list(recursive=True) if regex.fullmatch(m.key)]


def _glob_regex(pattern: str) -> str:
    """Shell glob -> regex: ``*`` and ``?`` stay inside one path segment, ``**`` spans segments."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = pattern[i]
        end = pattern.find("]", i + 1) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif end > i + 1:
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


