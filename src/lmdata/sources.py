"""Documents out of raw files, streamed: never a whole file in memory.

A *source* is a list of paths or globs plus how to cut them into documents:

    kind="text"     documents separated by a line holding only ``separator``
                    (default ``<|endoftext|>``, the TinyStories convention)
    kind="lines"    one document per line (empty lines skipped)
    kind="jsonl"    JSON Lines, the document in ``text_field``
    kind="parquet"  a Parquet file, the document in column ``text_field`` (read batch-wise)
    kind="arrow"    an Arrow IPC file or stream (Feather v2, ``.arrow``), column ``text_field``;
                    a Hugging Face ``datasets.save_to_disk`` directory (its ``state.json``
                    lists the ``.arrow`` files) is given as the directory itself
    kind="auto"     pick by extension: .jsonl/.ndjson/.json -> jsonl, .parquet -> parquet,
                    .arrow/.feather/.ipc -> arrow, anything else -> text

Every kind also reads ``.gz`` and ``.zst`` files. A document's text is exactly the bytes
between two separator lines minus the line break that ends it, so ``"a\\nb\\n<|endoftext|>\\n"``
yields ``"a\\nb"``. Empty documents are skipped.

A split is a source's document stream, or a slice of it: ``ingest.splits.plan_splits``
implements the holdout (the last N documents of one split become another, e.g.
``validation``; counting them costs one read of the input, no tokenizing).

A text source (text, lines, jsonl) that is binary -- a NUL byte, mostly invalid UTF-8 at its
start, an Arrow or Parquet file -- is refused whatever ``errors`` says.

A path or glob may be an object on object storage, ``s3://bucket/prefix/*.jsonl.gz``
(``*``/``?``/``[...]`` within a key segment, ``**`` across them; one LIST per glob), read
as a stream through pyarrow's S3 filesystem with the standard AWS environment
(``lmdata.io``); ``expand`` returns a ``Location`` for every file, local or remote, and the
readers here read through it.

Invalid UTF-8 is an ``LmdataError`` naming the file and byte offset (of the decompressed
stream); with ``errors="replace"`` each bad sequence becomes U+FFFD and is counted in
``SourceStats.replaced``.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from lmdata._eot import EOT
from lmdata.errors import LmdataError
from lmdata.io.location import Location, glob as remote_glob, location
from lmdata.io.streams import fetch_hint, open_binary, open_seekable, strip_compression
from lmdata.io import digests
from lmdata.text_sniff import SNIFF_BYTES, STRIP_NUL, check_text

KINDS = ("auto", "text", "lines", "jsonl", "parquet", "arrow")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
TEXT_BLOCK_BYTES = 1 << 20  # what the text reader searches at a time
ERRORS = ("strict", "replace")
DEFAULT_SEPARATOR = EOT
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark


@dataclass(frozen=True)
class SourceSpec:
    """Where documents come from and how to cut them; plain values, no config tree."""

    paths: tuple[str, ...]
    kind: str = "auto"
    separator: str = DEFAULT_SEPARATOR
    text_field: str = "text"
    errors: str = "strict"
    # (path, bytes) of each file as hashed for the manifest: each file's read ends by checking that it
    # still has that size and was not modified while read (``check_unchanged``); empty: no record
    expect: tuple[tuple[str, int], ...] = ()

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
    source: int = 0  # index of its file among the split's files (``expand`` order): its provenance
    offset: int = 0  # where it starts in that file: byte (text, lines, jsonl; decompressed) or row


@dataclass
class SourceStats:
    """What reading cost: counted as documents stream by."""

    documents: int = 0
    replaced: int = 0
    files: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- files


def _link_trouble(path: Path) -> str:
    """Why a symbolic link leads nowhere: its target is missing, or it loops."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 names a loop so
        return "it loops"
    except OSError as exc:
        return "it loops" if exc.errno == errno.ELOOP else f"its target {os.readlink(path)} is missing"
    return "unreadable"


def expand(patterns: tuple[str, ...] | list[str]) -> list[Location]:
    """Paths, URIs and globs -> the files they name, each glob's sorted; a missing path or a glob
    matching nothing is an error naming it. ``file://PATH`` is the local ``PATH``."""
    files: list[Location] = []
    for pattern in patterns:
        loc = location(pattern, flag="input")
        if loc.remote:
            files.extend(_expand_remote(loc.uri))
        elif glob.has_magic(loc.path):
            matches = sorted(p for p in glob.glob(loc.path, recursive=True) if os.path.isfile(p))
            if not matches:
                raise LmdataError(f"input glob {pattern!r} matches no files; check the pattern and working directory")
            files.extend(location(m) for m in matches)
        else:
            path = loc.local_path
            if not path.exists():
                if path.is_symlink():  # exists() follows links: a dangling one, or a loop
                    raise LmdataError(f"input {pattern}: a symbolic link to nothing readable ({_link_trouble(path)}); "
                                      "point it at the file or give the file itself")
                raise LmdataError(f"input {pattern}: no such file{fetch_hint(path)}")
            if path.is_dir() and (path / "state.json").is_file():
                files.extend(location(p) for p in saved_dataset_files(path))
                continue
            if path.is_dir() and (path / "dataset_dict.json").is_file():  # datasets.DatasetDict.save_to_disk
                names = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
                hint = " ".join(f"--split {n}={pattern.rstrip('/')}/{n}" for n in names) or "--split NAME=DIR/NAME"
                raise LmdataError(f"input {pattern} is a Hugging Face DatasetDict (splits {', '.join(names)}); "
                                  f"give each split its own: {hint}")
            if path.is_dir():
                raise LmdataError(f"input {pattern} is a directory; pass a glob such as '{pattern.rstrip('/')}/*.txt'")
            if not path.is_file():  # /dev/stdin, <(...), a FIFO: a traceback and a half store had followed
                raise LmdataError(f"input {pattern}: not a regular file (a pipe or a device); ingest reads an input "
                                  "more than once (its checksum, its documents, a resume): write it to a file first")
            files.append(loc)
    return files


def _expand_remote(pattern: str) -> list[Location]:
    """The objects an ``s3://`` path or glob names (one LIST); none is an error naming it."""
    matches = remote_glob(pattern, flag="input")
    if not matches:
        location(pattern, flag="input").check_bucket()
        if glob.has_magic(pattern):
            raise LmdataError(f"input glob {pattern!r} matches no objects; check the pattern and the bucket")
        raise LmdataError(f"input {pattern}: no such object")
    return sorted(matches, key=lambda m: m.path)


def saved_dataset_files(path: Path) -> list[Path]:
    """The ``.arrow`` files of a ``datasets.save_to_disk`` directory, in its ``state.json`` order."""
    try:
        names = [f["filename"] for f in json.loads((path / "state.json").read_text(encoding="utf-8"))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LmdataError(f"input {path}: state.json does not list the dataset's files ({exc}); "
                          "give the .arrow files themselves") from None
    if not names or any((path / n).suffix not in ARROW_SUFFIXES or not (path / n).is_file() for n in names):
        raise LmdataError(f"input {path}: state.json lists {names}, not existing .arrow files; give them directly")
    return [path / n for n in names]


def describe(path: Location, stop: Any = None, algo: str = digests.WRITE_ALGO) -> dict[str, object]:
    """The manifest's record of a source file: path (or URI) as given, size, checksum (``{}`` once ``stop`` is set)."""
    digest = digests.new(algo)
    with path.open_stream() as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            if stop is not None and stop.is_set():
                return {}
            digest.update(block)
    return {"path": str(path), "bytes": path.size(), algo: digest.hexdigest()}


def kind_of(path: Location, kind: str) -> str:
    if kind != "auto":
        return kind
    name, _ = strip_compression(path)
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    return "text"


_SURROGATE = re.compile("[\ud800-\udfff]")


def no_surrogates(text: str, errors: str, where: str, stats: SourceStats) -> str:
    """``text`` if it is valid Unicode; a lone UTF-16 surrogate (JSON's ``"\\ud800"`` escape of half
    a character, which no UTF-8 encoder, tokenizer or Arrow string can hold) is an error naming
    where it is, or with ``errors="replace"`` becomes U+FFFD and is counted like bad UTF-8."""
    found = _SURROGATE.search(text)
    if found is None:
        return text
    if errors == "strict":
        raise LmdataError(
            f"{where}: lone UTF-16 surrogate {found.group()!r} at character {found.start()} (a JSON escape of half "
            "a character, not text); fix the line or pass --errors replace"
        )
    fixed, n = _SURROGATE.subn("\ufffd", text)
    stats.replaced += n
    return fixed


def decode(data: bytes, errors: str, where: object, offset: int, stats: SourceStats) -> str:
    """UTF-8 -> str; strict names ``where`` (a path, formatted on error) and byte offset; NUL is binary."""
    nul = data.find(0)
    if nul >= 0:
        raise LmdataError(f"{where}: a NUL byte at byte {offset + nul}: binary data, not text; give a text file "
                          f"(or kind arrow/parquet for those files); {STRIP_NUL}")
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


def _damaged(path: Location, text_bytes: int, exc: BaseException) -> LmdataError:
    """A compressed input that does not decompress (where, past a block's start: "near byte 0" had been every file)."""
    where = f" after {text_bytes:,} bytes of its text" if text_bytes else ""
    return LmdataError(f"input {path}: corrupt or truncated compressed data{where} ({exc}); compress or download it "
                       "again")


def _read_lines(path: Location) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) with line breaks kept; read errors of compressed files named."""
    offset = 0
    with open_binary(path) as fh:
        try:
            check_text(path, fh.peek(SNIFF_BYTES)[:SNIFF_BYTES])
            for line in fh:
                yield offset, line
                offset += len(line)
        except (OSError, EOFError) as exc:  # gzip and _ZstdReader report damage this way
            raise _damaged(path, offset, exc) from None


def _text_documents(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    """Documents between separator lines, found with ``bytes.find`` in 1 MiB blocks (a loop over
    lines read 23 MB in ~0.7 s on the ingest's main thread, which also feeds the encoders)."""
    sep = spec.separator.encode("utf-8")
    if not sep or b"\n" in sep or b"\r" in sep:
        yield from _text_documents_by_line(path, spec, stats, source)
        return
    buf, base, doc, search = bytearray(), 0, 0, 0  # buf[0]: byte ``base`` of the stream, a line's start
    with open_binary(path) as fh:
        try:
            check_text(path, fh.peek(SNIFF_BYTES)[:SNIFF_BYTES])
            while block := fh.read(TEXT_BLOCK_BYTES):
                buf += block
                while (j := buf.find(sep, search)) >= 0:
                    end = buf.find(b"\n", j + len(sep))
                    if end < 0:  # the candidate's line goes on in the next block
                        break
                    search = end + 1
                    if _whole_line(buf, j, len(sep), end):
                        yield from _emit_span(path, buf, doc, j, spec, stats, base + doc, end + 1 - doc, source)
                        doc = end + 1
                else:
                    search = max(search, len(buf) - len(sep) + 1)  # a candidate cut by the block's end
                del buf[:doc]
                base, search, doc = base + doc, search - doc, 0
        except (OSError, EOFError) as exc:  # gzip and _ZstdReader report damage this way
            raise _damaged(path, base + len(buf), exc) from None
    j = buf.find(sep, search)  # the last line, without a line break
    if j >= 0 and _whole_line(buf, j, len(sep), len(buf)):
        yield from _emit(path, bytes(buf[:j]), spec, stats, base, len(buf), source)
    else:
        yield from _emit(path, bytes(buf), spec, stats, base, len(buf), source)


def _whole_line(buf: bytearray, j: int, n: int, end: int) -> bool:
    """Whether the ``n`` bytes at ``j`` are a line of their own: at a line's start (``buf`` starts
    one), followed by nothing but ``\r`` up to ``end`` (the line break or the end of the input)."""
    return (j == 0 or buf[j - 1] == 10) and not buf[j + n:end].strip(b"\r")


def _text_documents_by_line(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    """The reference reader (and the one for an empty separator): a line at a time."""
    sep = spec.separator.encode("utf-8")
    lines: list[bytes] = []
    start = consumed = 0
    for offset, line in _read_lines(path):
        consumed += len(line)
        if line.rstrip(b"\r\n") == sep:
            yield from _emit(path, b"".join(lines), spec, stats, start, consumed, source)
            lines, consumed = [], 0
            start = offset + len(line)
        else:
            lines.append(line)
    yield from _emit(path, b"".join(lines), spec, stats, start, consumed, source)


def _no_bom(data: bytes, offset: int) -> bytes:
    """A UTF-8 byte-order mark opening the file (Windows tools write one) is not text: not in document 0."""
    return data[len(BOM):] if offset == 0 and data.startswith(BOM) else data


def _emit(path: Location, data: bytes, spec: SourceSpec, stats: SourceStats, offset: int, consumed: int,
          source: int) -> tuple[Document, ...]:
    """The document (none if empty) as a tuple: no generator made per document on the main thread."""
    data = _no_bom(data, offset)
    if data.endswith(b"\n"):  # the line break before the separator belongs to the separator
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    return (Document(decode(data, spec.errors, path, offset, stats), consumed, source, offset),) if data else ()


def _emit_span(path: Location, buf: bytearray, start: int, stop: int, spec: SourceSpec, stats: SourceStats,
               offset: int, consumed: int, source: int) -> tuple[Document, ...]:
    """``_emit(bytes(buf[start:stop]), ...)``, decoded from the buffer itself: the document was copied
    three times before its decode (a bytearray slice, bytes of it, the line break cut off); reading
    503 MB took 0.87-0.89 CPU s that way, 0.70-0.75 this way. A file's first document (a BOM), a NUL
    and invalid UTF-8 go through ``_emit``, for its errors and replacements."""
    end = stop
    if end > start and buf[end - 1] == 10:  # the line break before the separator belongs to the separator
        end -= 2 if end - 2 >= start and buf[end - 2] == 13 else 1
    if offset != 0 and buf.find(0, start, end) < 0:
        try:
            with memoryview(buf) as view:  # released before the caller resizes buf
                text = str(view[start:end], "utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return (Document(text, consumed, source, offset),) if text else ()
    return _emit(path, bytes(buf[start:stop]), spec, stats, offset, consumed, source)


def _line_documents(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    for offset, line in _read_lines(path):
        data = _no_bom(line, offset).rstrip(b"\r\n")
        if data:
            yield Document(decode(data, spec.errors, path, offset, stats), len(line), source, offset)


def _jsonl_documents(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    for lineno, (offset, line) in enumerate(_read_lines(path), start=1):
        where = f"{path}:{lineno}"
        data = _no_bom(line, offset)
        if not data.strip():
            continue
        text = decode(data, spec.errors, where, offset, stats)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LmdataError(f"{where}: not valid JSON ({exc.msg}); fix the line or remove it") from None
        if not isinstance(obj, dict):  # (a bare string or list had been "no field 'text'")
            raise LmdataError(f"{where}: a JSON {type(obj).__name__}, not an object; JSON Lines input holds one object "
                              f"a line, its text in a field ({spec.text_field!r})")
        if spec.text_field not in obj:
            raise LmdataError(f"{where}: no field {spec.text_field!r}; set text_field (--text-field) to the field holding the text")
        value = obj[spec.text_field]
        if value is None:  # no document, as a null Parquet or Arrow row and an empty text are none
            continue
        if not isinstance(value, str):
            raise LmdataError(f"{where}: field {spec.text_field!r} is {type(value).__name__}, not a string; fix the line, "
                              "or set text_field (--text-field) to the field holding the text")
        if value:
            yield Document(no_surrogates(value, spec.errors, f"{where}: field {spec.text_field!r}", stats), len(line),
                           source, offset)


def _parquet_documents(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, comp = strip_compression(path)
    with tempfile.TemporaryFile() if comp else open_seekable(path) as fh:
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
            yield from _column_documents(path, pf.iter_batches(batch_size=1024, columns=[spec.text_field]), spec, stats,
                                         source)
        except (pa.ArrowException, OSError, EOFError) as exc:
            raise LmdataError(f"input {path}: not a readable Parquet file ({exc})") from None


def _arrow_documents(path: Location, spec: SourceSpec, stats: SourceStats, source: int = 0) -> Iterator[Document]:
    import pyarrow as pa

    try:
        with pa.memory_map(os.fspath(path)) as mapped:
            try:  # the file format (Feather v2) first, then the stream format (what `datasets` writes)
                f = pa.ipc.open_file(mapped)
                schema, batches = f.schema, (f.get_batch(i) for i in range(f.num_record_batches))
            except pa.ArrowInvalid:
                mapped.seek(0)
                stream = pa.ipc.open_stream(mapped)
                schema, batches = stream.schema, iter(stream)
            if spec.text_field not in schema.names:
                raise LmdataError(f"input {path}: no column {spec.text_field!r} (columns: {', '.join(schema.names)}); "
                                  "set text_field (--text-field)")
            yield from _column_documents(path, (b.select([spec.text_field]) for b in batches), spec, stats, source)
    except (pa.ArrowException, OSError, EOFError) as exc:
        raise LmdataError(f"input {path}: not a readable Arrow IPC file ({exc})") from None


def _column_documents(path: Location, batches: Iterator[Any], spec: SourceSpec, stats: SourceStats,
                      source: int) -> Iterator[Document]:
    """Documents of one-column record batches (string or binary: binary is decoded as UTF-8)."""
    import pyarrow as pa

    row = 0
    for batch in batches:
        column = batch.column(0)
        if pa.types.is_dictionary(column.type):  # dictionary-encoded text (pandas' category, Parquet's dict pages)
            column = column.dictionary_decode()
        is_binary = pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
        if not (is_binary or pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise LmdataError(f"input {path}: column {spec.text_field!r} holds {column.type}, not text; "
                              "set text_field (--text-field) to the text column")
        for value in column.to_pylist():
            row += 1
            if value is None:
                continue
            text = decode(value, spec.errors, f"{path} row {row - 1}", 0, stats) if is_binary else value
            if text:
                yield Document(text, len(value) if is_binary else len(text.encode("utf-8")), source, row - 1)


_READERS = {"text": _text_documents, "lines": _line_documents, "jsonl": _jsonl_documents,
            "parquet": _parquet_documents, "arrow": _arrow_documents}


def iter_documents(spec: SourceSpec, stats: SourceStats | None = None, files: list[Location] | None = None,
                   first_source: int = 0) -> Iterator[Document]:
    """Every document of every file of ``spec``, in order (files sorted within each glob); each
    carries its file's index (from ``first_source``: a task given one file of many passes its
    index) and its offset there. A file that changed while it was read is an error at its end."""
    stats = stats if stats is not None else SourceStats()
    expect = dict(spec.expect)
    for i, path in enumerate(files if files is not None else expand(spec.paths), start=first_source):
        stats.files.append(str(path))
        before = identity(path)
        for doc in _READERS[kind_of(path, spec.kind)](path, spec, stats, i):
            stats.documents += 1
            yield doc
        check_unchanged(path, before, expect.get(str(path)))


def identity(path: Location) -> tuple[int | None, int | None]:
    """(size, mtime in ns) of a file now: what ``check_unchanged`` compares (an object: size only)."""
    if path.remote:
        return path.size(), None
    try:
        st = os.stat(path.path)
    except OSError:
        return None, None
    return st.st_size, st.st_mtime_ns


def check_unchanged(path: Location, before: tuple[int | None, int | None], recorded: int | None) -> None:
    """At the end of a file's read: it must still be the file the manifest records (``recorded``
    bytes) and unchanged since its read began, else the store would hold part of one file under
    another's size and checksum (a file truncated or rewritten while being ingested)."""
    now = identity(path)
    if recorded is not None and now[0] != recorded:
        what = f"now {now[0]:,} bytes" if now[0] is not None else "now missing"
        raise LmdataError(f"input {path} changed while it was ingested: {recorded:,} bytes when hashed for the "
                          f"manifest, {what}; stop whatever writes it and rerun the ingest")
    if now != before:
        raise LmdataError(f"input {path} changed while it was ingested (size or modification time differ from "
                          "the start of its read); stop whatever writes it and rerun the ingest")
