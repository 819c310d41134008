"""``lmdata verify``: the full pass over a store that ``open_store`` is too cheap to do.

Checks, per split and format, in this order (each problem names the shard):

1. counts: shards tile the split (first_doc/first_token contiguous) and sum to the
   split's documents and tokens;
2. files: every shard file has the manifest's size and checksum (xxh128, or sha256 in older stores);
3. content, read through the format's own reader in chunks: each shard holds exactly
   ``n_docs`` end-of-text ids and ends with one (only the ingest writes eot ids, so this
   is the document count), and every format of a split holds the identical token stream
   (each chunk compared with the first format that passed 1-2), as does every other
   encoding a reader offers (``alternates``: Lance's ``tokens`` column beside the
   ``token_bytes`` an earlier lmdata wrote, which its loader reads).

``verify_store`` returns a ``VerifyReport``; ``report.raise_if_bad()`` raises an
``LmdataError`` naming the first bad shard (the CLI's exit status).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError, SettingError
from lmdata.io import digests
from lmdata.store.blocks import BLOCK_BYTES, SIDECAR_SUFFIX, BlockSums, block_crcs
from lmdata.store.checksum import mark_verified
from lmdata.store.layout import PLAN_NAME, PROVENANCE_DIR, TOKENIZER_DIR
from lmdata.store.manifest import Manifest, read_manifest
from lmdata.store.protocol import ShardInfo
from lmdata.store.registry import get_format
from lmdata.io.location import Location, location

CHUNK_TOKENS = 1 << 22  # tokens compared per read (32 MiB as int64)


@dataclass
class VerifyReport:
    """What ``verify_store`` checked and every problem it found (the first is the one to fix)."""

    store: Location
    problems: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    tokens: dict[str, int] = field(default_factory=dict)  # split -> tokens compared across formats

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_bad(self) -> None:
        if self.problems:
            rest = len(self.problems) - 1
            more = f" (and {rest} more problem{'s' if rest > 1 else ''})" if rest else ""
            raise LmdataError(f"{self.store}: {self.problems[0]}{more}; re-ingest with --overwrite")


def verify_store(path: str | Path) -> VerifyReport:
    """Check every checksum, count and token of the store at ``path``."""
    path = location(path, flag="store")  # a remote store: every object is downloaded once
    manifest = read_manifest(path)  # an unreadable manifest is an error, not a report
    report = VerifyReport(path)
    for split, info in manifest.splits.items():
        readable = []
        for fmt, shards in info.formats.items():
            where = f"split {split!r} format {fmt!r}"
            before = len(report.problems)
            report.problems += _count_problems(where, shards, info.n_docs, info.n_tokens)
            report.problems += _file_problems(report, path / split / fmt, where, shards)
            if len(report.problems) == before:
                readable.append(fmt)
        report.problems += _stream_problems(report, path, manifest, split, readable)
        if info.provenance is not None:  # each document's source: what inspect, sql and show read
            where = f"split {split!r} provenance"
            report.problems += _count_problems(where, info.provenance, info.n_docs, info.n_tokens)
            report.problems += _file_problems(report, path / split / PROVENANCE_DIR, where, info.provenance)
    report.problems += _tokenizer_problems(path, manifest)
    return report


def _tokenizer_problems(path: Location, manifest: Manifest) -> list[str]:
    """The store's copy of its tokenizer, where it has one: whole, unchanged, and the one the manifest
    names (`show`, `sample` and training decode with it). A store `lmdata ingest` wrote (it has an
    ingest plan) always has one; a store written without one (a plug-in's writer, a test's) has
    nothing here to check."""
    from lmdata.store.store import fetch_tokenizer
    from lmdata.tokenizer.saved import read_dir

    copy = path / TOKENIZER_DIR
    if not (copy.list(recursive=True) if path.remote else copy.exists()):
        if (path / PLAN_NAME).is_file():
            return [f"tokenizer: {copy} is missing (lmdata ingest wrote it; `show`, `sample` and training decode "
                    "with it): copy back the tokenizer the store was made with"]
        return []
    try:
        directory = fetch_tokenizer(path) if path.remote else copy.local_path
        digest = read_dir(directory)[4]
    except LmdataError as exc:
        return [f"tokenizer: {exc}"]
    if digest != manifest.tokenizer_hash:
        return [f"tokenizer: {directory} is tokenizer {digest[:19]}, the manifest names {manifest.tokenizer_hash[:19]}"]
    return []


def _count_problems(where: str, shards: list[ShardInfo], n_docs: int, n_tokens: int) -> list[str]:
    problems, doc, tok = [], 0, 0
    for s in shards:
        if (s.first_doc, s.first_token) != (doc, tok):
            problems.append(f"{where} shard {s.name}: starts at doc {s.first_doc}/token {s.first_token}, "
                            f"expected {doc}/{tok}")
        doc, tok = s.first_doc + s.n_docs, s.first_token + s.n_tokens
    if (doc, tok) != (n_docs, n_tokens):
        problems.append(f"{where}: shards hold {doc} docs/{tok} tokens, the split says {n_docs}/{n_tokens}")
    return problems


def _file_problems(report: VerifyReport, format_dir: Location, where: str, shards: list[ShardInfo]) -> list[str]:
    problems = []
    for s in shards:
        crcs: dict[str, Any] = {}  # data file -> its block CRCs, computed in the same pass as its checksum
        failed: dict[str, int] = {}  # a file that failed its checksum -> its problem's index
        for f in s.files:
            full = format_dir / f.path  # read_manifest refused paths that leave the store
            size = full.size()
            if size is None:
                problems.append(f"{where} shard {s.name}: {full} is missing")
                continue
            report.files += 1
            report.bytes += size
            if size != f.bytes:
                problems.append(f"{where} shard {s.name}: {full} has {size} bytes, the manifest says {f.bytes}")
                continue
            digest, crcs[f.path] = _digest(full, f.algo)
            if digest != f.digest:
                failed[f.path] = len(problems)
                problems.append(f"{where} shard {s.name}: {full} fails its {f.algo} checksum (the file is corrupt)")
            elif not full.remote:
                mark_verified(full.local_path, f)  # the readers of the stream pass below need not hash it again
        for f in s.files:  # a block-checksum sidecar must agree with the data it covers
            data = f.path[: -len(SIDECAR_SUFFIX)]
            if not (f.path.endswith(SIDECAR_SUFFIX) and f.path in crcs and data in crcs) or f.path in failed:
                continue  # (a sidecar that fails its own checksum says nothing about the data)
            try:
                sums = BlockSums.decode((format_dir / f.path).read_bytes(), f.path)
                found = crcs[data] if sums.block_bytes == BLOCK_BYTES else None
                if data in failed and found is not None and len(found) == len(sums.crcs):
                    problems[failed[data]] = _with_blocks(problems[failed[data]], np.flatnonzero(found != sums.crcs))
                elif found is None or not np.array_equal(found, sums.crcs):
                    sums.check(0, (format_dir / data).read_bytes(), str(format_dir / data))
            except LmdataError as exc:
                problems.append(f"{where} shard {s.name}: {exc}")
    return problems


def _with_blocks(problem: str, blocks: np.ndarray) -> str:
    """A data file's failed checksum, with where its CRC-32 sidecar says it changed (one problem, not two)."""
    if not len(blocks):
        return problem
    first = int(blocks[0])
    more = f" and {len(blocks) - 1:,} more" if len(blocks) > 1 else ""
    return problem.replace("(the file is corrupt)", f"(the file is corrupt: block {first}, bytes "
                                                     f"{first * BLOCK_BYTES}..{(first + 1) * BLOCK_BYTES}{more}, "
                                                     "differs from its CRC-32)")


def _digest(full: Location, algo: str) -> tuple[str, Any]:
    """The ``algo`` checksum of a file or object, and the CRC-32 of each ``BLOCK_BYTES`` block, in one streamed pass."""
    digest, crcs = digests.new(algo), []
    with full.open_stream() as fh:
        while chunk := fh.read(256 * BLOCK_BYTES):
            digest.update(chunk)
            crcs.append(block_crcs(chunk, BLOCK_BYTES))
    return digest.hexdigest(), np.concatenate(crcs) if crcs else np.zeros(0, np.uint32)


def _read_once_options(fmt: str) -> dict[str, Any]:
    """The reader options for one pass over the stream: ``verify="size"`` (the file pass above checked
    every byte) and, for a reader that names it (the built-ins), ``use_cache=False``: the tokens come
    from the store's files, decoded in memory, never from the machine's decoded copies (a copy is no
    part of the store, and one damaged in place would be blamed on the store) and into none (a verify
    had filled the cache with a store's worth of copies nobody might read: 1,160 shards, 464 MB)."""
    from lmdata.store.store import reader_options

    try:
        takes = reader_options(get_format(fmt).reader)  # None: any (a plug-in reader may take neither)
    except LmdataError:
        takes = None
    return {name: value for name, value in (("verify", "size"), ("use_cache", False))
            if (name in takes if takes is not None else name == "verify")}


def _open_readers(store: Any, split: str, formats: list[str], problems: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each format's reader and its alternate encodings' ("fmt (label)"), and the format of each."""
    readers: dict[str, Any] = {}  # "fmt" or "fmt (alternate)" -> reader
    fmt_of: dict[str, str] = {}
    for fmt in formats:
        try:
            reader = store.reader(split, fmt, **_read_once_options(fmt))
            alternates = getattr(reader, "alternates", dict)()
        except SettingError:
            raise
        except LmdataError as exc:
            problems.append(f"split {split!r} format {fmt!r}: {exc}")
            continue
        readers[fmt], fmt_of[fmt] = reader, fmt
        for label, alt in alternates.items():
            readers[f"{fmt} ({label})"], fmt_of[f"{fmt} ({label})"] = alt, fmt
    return readers, fmt_of


def _stream_problems(report: VerifyReport, path: Location, manifest: Manifest, split: str, formats: list[str]) -> list[str]:
    """Per-shard eot counts, and chunk-by-chunk equality of every readable format's stream."""
    from lmdata.store.store import Store

    if not formats:
        return []
    info = manifest.splits[split]
    problems: list[str] = []
    readers, fmt_of = _open_readers(Store(path, manifest), split, formats, problems)
    # The reference: a format of one encoding when there is one. A format whose two encodings
    # disagree cannot tell which is wrong; a third reading of the stream can.
    single = [n for n in readers if fmt_of[n] == n and sum(fmt_of[m] == n for m in readers) == 1]
    ref = next(iter(single or readers), None)
    if ref is None:
        return problems
    eot = _EotCount(info.formats[fmt_of[ref]], manifest.eot_id)
    compared = 0
    for start in range(0, info.n_tokens, CHUNK_TOKENS):
        n = min(CHUNK_TOKENS, info.n_tokens - start)
        chunks = {}
        for fmt, reader in list(readers.items()):
            try:
                chunks[fmt] = reader.windows(np.array([start]), n)[0]
            except SettingError:
                raise
            except LmdataError as exc:
                problems.append(f"split {split!r} format {fmt!r}: {exc}")
                del readers[fmt]
        if ref not in chunks:
            break
        for fmt, chunk in chunks.items():
            bad = np.flatnonzero(chunk != chunks[ref])
            if len(bad):
                offset = start + int(bad[0])
                shard = _shard_at(info.formats[fmt_of[fmt]], offset)
                if fmt_of[fmt] == fmt_of[ref]:  # one format's two encodings, nothing else to ask
                    problems.append(f"split {split!r} format {fmt_of[fmt]!r} shard {shard.name}: its encodings "
                                    f"disagree at token {offset}: {fmt!r} has {chunk[bad[0]]}, {ref!r} has "
                                    f"{chunks[ref][bad[0]]}")
                else:
                    problems.append(f"split {split!r} format {fmt!r} shard {shard.name}: token {offset} is "
                                    f"{chunk[bad[0]]}, format {ref!r} has {chunks[ref][bad[0]]}")
                del readers[fmt]
        eot.add(start, chunks[ref])
        compared = start + n
    report.tokens[split] = compared
    if compared == info.n_tokens:
        problems += [f"split {split!r} format {ref!r} {p}" for p in eot.problems()]
    return problems


class _EotCount:
    """Counts end-of-text ids per shard over the stream's chunks; each shard must end with one."""

    def __init__(self, shards: list[ShardInfo], eot: int) -> None:
        self.shards, self.eot = shards, eot
        self.bounds = np.array([s.first_token for s in shards] + [sum(s.n_tokens for s in shards)], dtype=np.int64)
        self.counts = np.zeros(len(shards), dtype=np.int64)
        self.last = np.full(len(shards), -1, dtype=np.int64)

    def add(self, start: int, chunk: np.ndarray) -> None:
        pos = start + np.flatnonzero(chunk == self.eot)
        shard_of = np.searchsorted(self.bounds, pos, side="right") - 1
        self.counts += np.bincount(shard_of, minlength=len(self.shards))
        ends = self.bounds[1:] - 1
        inside = (ends >= start) & (ends < start + len(chunk))
        self.last[inside] = chunk[ends[inside] - start]

    def problems(self) -> list[str]:
        out = []
        for s, count, last in zip(self.shards, self.counts, self.last):
            if count != s.n_docs or (s.n_tokens and last != self.eot):
                out.append(f"shard {s.name}: {count} end-of-text ids (last token {last}), the manifest says "
                           f"{s.n_docs} documents, each ending with {self.eot}")
        return out


def _shard_at(shards: list[ShardInfo], offset: int) -> ShardInfo:
    starts = [s.first_token for s in shards]
    return shards[max(0, int(np.searchsorted(starts, offset, side="right")) - 1)]
