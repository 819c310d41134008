"""Documents out of raw files, streamed: never a whole file in memory.

A *source* is a list of paths or globs plus how to cut them into documents:

    kind="text"     documents separated by a line holding only ``separator``
                    (default ``<|endoftext|>``, the TinyStories convention)
    kind="lines"    one document per line (empty lines skipped)
    kind="jsonl"    JSON Lines, the document in ``text_field``
    kind="parquet"  a Parquet file, the document in column ``text_field`` (read batch-wise)
    kind="auto"     pick by extension: .jsonl/.ndjson/.json -> jsonl, .parquet -> parquet,
                    anything else -> text

Every kind also reads ``.gz`` and ``.zst`` files. A document's text is exactly the bytes
between two separator lines minus the line break that ends it, so ``"a\\nb\\n<|endoftext|>\\n"``
yields ``"a\\nb"``. Empty documents are skipped.

A split is a source's document stream, or a slice of it: ``plan_splits`` implements the
holdout (the last N documents of one split become another, e.g. ``validation``; counting
them costs one read of the input, no tokenizing).

A path or glob may be an object on object storage, ``s3://bucket/prefix/*.jsonl.gz``
(``*``/``?``/``[...]`` within a key segment, ``**`` across them; one LIST per glob), read
as a stream through pyarrow's S3 filesystem with the standard AWS environment
(``lmdata.store.uri``); ``expand`` returns ``Location`` objects for those, ``Path`` for the
rest, and every reader here takes either.

Invalid UTF-8 is an ``LmdataError`` naming the file and byte offset (of the decompressed
stream); with ``errors="replace"`` each bad sequence becomes U+FFFD and is counted in
``SourceStats.replaced``.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from lmdata.errors import LmdataError
from lmdata.store.uri import is_uri

KINDS = ("auto", "text", "lines", "jsonl", "parquet")
ERRORS = ("strict", "replace")
DEFAULT_SEPARATOR = "<|endoftext|>"


@dataclass(frozen=True)
class SourceSpec:
    """Where documents come from and how to cut them; plain values, no config tree."""

    paths: tuple[str, ...]
    kind: str = "auto"
    separator: str = DEFAULT_SEPARATOR
    text_field: str = "text"
    errors: str = "strict"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LmdataError(f"source kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.errors not in ERRORS:
            raise LmdataError(f"--errors {self.errors!r} is not one of {', '.join(ERRORS)}")
        if not self.paths:
            raise LmdataError("no input given; pass --input PATH (or sources = [...] in the pipeline)")


class Document(NamedTuple):
    text: str
    raw_bytes: int  # bytes of the (decompressed) input this document consumed, separators included


@dataclass
class SourceStats:
    """What reading cost: counted as documents stream by."""

    documents: int = 0
    replaced: int = 0
    files: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- files


def expand(patterns: tuple[str, ...] | list[str]) -> list[Any]:
    """Paths and globs -> sorted files (``Path``, or ``Location`` for ``s3://``); a missing path
    or a glob matching nothing is an error."""
    files: list[Any] = []
    for pattern in patterns:
        if is_uri(pattern):
            files.extend(_expand_remote(pattern))
        elif glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise LmdataError(f"input glob {pattern!r} matches no files; check the pattern and working directory")
            files.extend(Path(m) for m in matches)
        else:
            path = Path(pattern)
            if not path.exists():
                raise LmdataError(f"input {pattern}: no such file")
            if path.is_dir():
                raise LmdataError(f"input {pattern} is a directory; pass a glob such as '{pattern}/*.txt'")
            files.append(path)
    return files


def _expand_remote(pattern: str) -> list[Any]:
    from lmdata.store import uri

    matches = uri.glob(pattern, flag="input")
    if not matches:
        if glob.has_magic(pattern):
            raise LmdataError(f"input glob {pattern!r} matches no objects; check the pattern and the bucket")
        raise LmdataError(f"input {pattern}: no such object")
    return sorted(matches, key=lambda m: m.path)


def input_file(text: str) -> Any:
    """An input named by ``str(path)`` again (``expand``'s ``Path`` or ``Location``)."""
    if is_uri(text):
        from lmdata.store.uri import location

        return location(text, flag="input")
    return Path(text)


def file_size(path: Any) -> int:
    """Bytes of an input file or object."""
    return path.size() if _remote(path) else Path(path).stat().st_size


def _remote(path: Any) -> bool:
    return bool(getattr(path, "remote", False))


def _open_raw(path: Any, seekable: bool = False) -> Any:
    """The file's stored bytes: a local file, or an object's stream (random access if ``seekable``)."""
    if not _remote(path):
        return open(path, "rb", buffering=1 << 20)
    from lmdata.store.uri import remote_error

    try:
        if seekable:
            return path.fs.open_input_file(path.fs_path)
        return io.BufferedReader(_ArrowRaw(path.fs.open_input_stream(path.fs_path)), 1 << 20)
    except OSError as exc:
        raise remote_error(exc, path) from None


class _ArrowRaw(io.RawIOBase):
    """A pyarrow input stream as a raw Python stream (so gzip, zstd and line iteration work on it)."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        data = self._native.read(len(out))
        out[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._native.close()
        super().close()


def describe(path: Any) -> dict[str, object]:
    """The manifest's record of a source file: path (or URI) as given, size, sha256."""
    digest = hashlib.sha256()
    with _open_raw(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path), "bytes": file_size(path), "sha256": digest.hexdigest()}


def strip_compression(path: Path) -> tuple[str, str | None]:
    name = path.name.lower()
    for ext in (".gz", ".zst"):
        if name.endswith(ext):
            return name[: -len(ext)], ext
    return name, None


def kind_of(path: Path, kind: str) -> str:
    if kind != "auto":
        return kind
    name, _ = strip_compression(path)
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def open_binary(path: Path) -> IO[bytes]:
    """A buffered binary stream of the file's (decompressed) bytes."""
    _, comp = strip_compression(path)
    try:
        if comp == ".gz":
            return gzip.open(path, "rb") if not _remote(path) else _OwningGzip(_open_raw(path))
        if comp == ".zst":
            return io.BufferedReader(_ZstdReader(_open_raw(path)), 1 << 20)
        return _open_raw(path)
    except OSError as exc:
        raise LmdataError(f"input {path}: cannot open ({exc.strerror})") from exc


class _OwningGzip(gzip.GzipFile):
    """A ``GzipFile`` over a stream it closes with itself (``gzip.open`` leaves a passed stream open)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        super().__init__(fileobj=raw, mode="rb")

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class _ZstdReader(io.RawIOBase):
    """Decompressed bytes of a (multi-frame) .zst stream; a truncated frame is an EOFError.

    (zstandard's own ``stream_reader`` ends quietly at a truncated frame: a cut-off file
    would pass for a shorter corpus.)
    """

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self._zstd, self._raw = zstandard, raw
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._buf, self._pos, self._fed = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        while self._pos >= len(self._buf):
            chunk = b""
            if self._dobj.eof:  # a frame ended: the next one starts with what it left over
                chunk = self._dobj.unused_data
                self._dobj, self._fed = self._zstd.ZstdDecompressor().decompressobj(), False
            chunk = chunk or self._raw.read(1 << 20)
            if not chunk:
                if self._fed and not self._dobj.eof:
                    raise EOFError("the stream ends inside a zstd frame (truncated file)")
                return 0
            self._fed = True
            try:
                self._buf, self._pos = self._dobj.decompress(chunk), 0
            except self._zstd.ZstdError as exc:
                raise OSError(f"corrupt zstd data ({exc})") from None
        n = min(len(out), len(self._buf) - self._pos)
        out[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


# ---------------------------------------------------------------------------- decoding


def decode(data: bytes, errors: str, where: str, offset: int, stats: SourceStats) -> str:
    """UTF-8 -> str; strict names file and byte offset, replace counts each bad sequence."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if errors == "strict":
            raise LmdataError(
                f"{where}: invalid UTF-8 at byte {offset + exc.start}; fix the file or pass --errors replace"
            ) from None
    parts, pos = [], 0
    while True:  # same result as errors="replace", but counted
        try:
            parts.append(data[pos:].decode("utf-8"))
            return "".join(parts)
        except UnicodeDecodeError as exc:
            parts.append(data[pos : pos + exc.start].decode("utf-8"))
            parts.append("\ufffd")
            stats.replaced += 1
            pos += exc.end


def _read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) with line breaks kept; read errors of compressed files named."""
    offset = 0
    with open_binary(path) as fh:
        try:
            for line in fh:
                yield offset, line
                offset += len(line)
        except (OSError, EOFError) as exc:  # gzip and _ZstdReader report damage this way
            raise LmdataError(f"input {path}: corrupt or truncated compressed data near byte {offset} ({exc})") from None


def _text_documents(path: Path, spec: SourceSpec, stats: SourceStats) -> Iterator[Document]:
    sep = spec.separator.encode("utf-8")
    lines: list[bytes] = []
    start = consumed = 0
    for offset, line in _read_lines(path):
        consumed += len(line)
        if line.rstrip(b"\r\n") == sep:
            yield from _emit(path, b"".join(lines), spec, stats, start, consumed)
            lines, consumed = [], 0
            start = offset + len(line)
        else:
            lines.append(line)
    yield from _emit(path, b"".join(lines), spec, stats, start, consumed)


def _emit(path: Path, data: bytes, spec: SourceSpec, stats: SourceStats, offset: int, consumed: int) -> Iterator[Document]:
    if data.endswith(b"\n"):  # the line break before the separator belongs to the separator
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    if data:
        yield Document(decode(data, spec.errors, str(path), offset, stats), consumed)


def _line_documents(path: Path, spec: SourceSpec, stats: SourceStats) -> Iterator[Document]:
    for offset, line in _read_lines(path):
        data = line.rstrip(b"\r\n")
        if data:
            yield Document(decode(data, spec.errors, str(path), offset, stats), len(line))


def _jsonl_documents(path: Path, spec: SourceSpec, stats: SourceStats) -> Iterator[Document]:
    for lineno, (offset, line) in enumerate(_read_lines(path), start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            continue
        text = decode(line, spec.errors, where, offset, stats)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LmdataError(f"{where}: not valid JSON ({exc.msg}); fix the line or remove it") from None
        if not isinstance(obj, dict) or spec.text_field not in obj:
            raise LmdataError(f"{where}: no field {spec.text_field!r}; set text_field (--text-field) to the field holding the text")
        value = obj[spec.text_field]
        if not isinstance(value, str):
            raise LmdataError(f"{where}: field {spec.text_field!r} is {type(value).__name__}, not a string")
        if value:
            yield Document(value, len(line))


def _parquet_documents(path: Path, spec: SourceSpec, stats: SourceStats) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, comp = strip_compression(path)
    with tempfile.TemporaryFile() if comp else _open_raw(path, seekable=True) as fh:
        try:
            if comp:  # Parquet needs seeks (footer first): decompress to a temporary file, not to memory
                with open_binary(path) as src:
                    shutil.copyfileobj(src, fh, 1 << 20)
                fh.seek(0)
            pf = pq.ParquetFile(fh)
            if spec.text_field not in pf.schema_arrow.names:
                raise LmdataError(
                    f"input {path}: no column {spec.text_field!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                    "set text_field (--text-field)"
                )
            row = 0
            for batch in pf.iter_batches(batch_size=1024, columns=[spec.text_field]):
                column = batch.column(0)
                is_binary = pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
                for value in column.to_pylist():
                    row += 1
                    if value is None:
                        continue
                    text = decode(value, spec.errors, f"{path} row {row - 1}", 0, stats) if is_binary else value
                    if text:
                        yield Document(text, len(value) if is_binary else len(text.encode("utf-8")))
        except (pa.ArrowException, OSError, EOFError) as exc:
            raise LmdataError(f"input {path}: not a readable Parquet file ({exc})") from None


_READERS = {"text": _text_documents, "lines": _line_documents, "jsonl": _jsonl_documents, "parquet": _parquet_documents}


def iter_documents(spec: SourceSpec, stats: SourceStats | None = None, files: list[Path] | None = None) -> Iterator[Document]:
    """Every document of every file of ``spec``, in order (files sorted within each glob)."""
    stats = stats if stats is not None else SourceStats()
    for path in files if files is not None else expand(spec.paths):
        stats.files.append(str(path))
        for doc in _READERS[kind_of(path, spec.kind)](path, spec, stats):
            stats.documents += 1
            yield doc


# ---------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class SplitSource:
    """A split's documents: the documents ``[start, stop)`` of ``spec``'s stream."""

    spec: SourceSpec
    start: int = 0
    stop: int | None = None


def _count_documents(spec: SourceSpec) -> int:
    return sum(1 for _ in iter_documents(spec))


def plan_splits(splits: dict[str, SourceSpec], holdout: tuple[str, str, int] | None = None) -> dict[str, SplitSource]:
    """Split specs (+ an optional holdout: the last N documents of one split form another)."""
    plan = {name: SplitSource(spec) for name, spec in splits.items()}
    if holdout is None:
        return plan
    src, dst, n = holdout
    if src not in plan:
        raise LmdataError(f"--holdout takes documents from split {src!r}, which is not among {', '.join(plan)}")
    if dst in plan:
        raise LmdataError(f"--holdout split {dst!r} already has its own inputs; name another split")
    total = _count_documents(splits[src])
    if not 0 < n < total:
        raise LmdataError(f"--holdout {n}: split {src!r} has {total} documents; hold out between 1 and {total - 1}")
    plan[src] = SplitSource(splits[src], 0, total - n)
    plan[dst] = SplitSource(splits[src], total - n, total)
    return plan
