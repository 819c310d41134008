"""Lance fragments: the ingest's shards grouped into few large fragments when a split is finished.

Why: a Lance ``take`` pays a fixed cost for every fragment it touches (~0.05 ms per take
here, on top of ~1.2 ms for four batches of 32 x 1,025 tokens), so a store of 1 Mi-token
fragments (one per ingest shard) read 2-3x slower than the same rows in one fragment (bench/README.md,
"Lance layout"). The local engine writes each run of consecutive shards, up to
``FRAGMENT_TOKENS`` tokens, straight into its fragment (``lance_stream``). Where shards come
out of order (Ray's tasks), each is an uncommitted *staging* fragment, resumable shard by
shard, and ``finish`` streams each run into one fragment (``write_fragment``); either way
``finish`` commits the fragments. The
manifest's Lance shards are these fragments (named ``00000-00255`` after the ingest shards
they hold; a fragment of one shard keeps that shard's staging files and name).

Crash safety: a rebuilt fragment's old record is removed first; the new fragment's file and
row index (``index-<name>.npy``) are fsynced, then its record
``_fragments/<name>.json`` (the fragment's ``ShardInfo``, whose ``extra["members"]`` lists
the shards it holds) is written; staging files are deleted only after the commit.
``LanceWriter.completed`` reports the members of every intact fragment record, so a
resumed ingest reuses them; a fragment whose members changed is rebuilt from wherever each
member's rows are (its staging fragment or its rows inside an older fragment).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io import atomic
from lmdata.io.s3 import library_text, remote_error, within_timeout
from lmdata.store.formats import base
from lmdata.store.blocks import row_checksums
from lmdata.store.checksum import file_info, write_shard_parts
from lmdata.store.formats.parquet import pieces
from lmdata.store.protocol import FileInfo, ShardInfo

# 32 Mi tokens per fragment, at most (a larger shard: alone); ~64 MB of Lance file, the object
# size LitData (50 MB chunks) and Mosaic (64 MiB shards) write too. The loader reads decoded
# copies of the ingest shards (one take each), not a take per batch, so a fragment's size no
# longer sets its speed. Smaller fragments cost nothing measurable to write (all three formats,
# 503 MB of text: 7.5-8.8 s against 7.6-8.4 at 256 Mi), redo less after a crash, and on a
# server that reads the whole object for a ranged GET (moto) a fresh machine's first Lance batch
# of a 188 M-token store came after 4.2-5.5 s instead of 19.6-28.2 (bench/README.md, "Peers
# (remote)"). A take per batch (``LMDATA_LANCE_CACHE_BYTES=0``) pays ~14 us for each fragment its
# windows touch: at most one per window.
FRAGMENT_TOKENS = 1 << 25
GROUP_DIR = "_fragments"
# Lance file format, pinned (a newer pylance default must not change what we write). 2.0 rather
# than 2.1: the reader never takes a few rows per batch (it reads decoded copies, ``lance_chunks``),
# and on what it does 2.0 is the faster one (32 real 1 Mi-token shards, pylance 14.0.2: write
# 5.0-8.1 -> 1.9-2.5 CPU ms a shard, a shard's take for its copy 3.6-7.7 -> 1.4-1.7 ms, a full
# scan 3-4x faster, files 5% smaller; a 32-row random take 0.90 -> 0.97-1.06 ms). 503 MB ingest
# to all three formats: Lance's threads 1.42 -> 0.83-0.88 CPU s.
STORAGE_VERSION = "2.0"


def lance_schema(dtype: np.dtype) -> Any:
    """The rows' schema: the contract's columns, ``tokens`` uncompressed (Lance's default bit-packing
    took 11.3 of the 12.5 ms a 1 Mi-token shard cost to write, uncompressed 4.6 ms, for 20% more bytes
    in that column: 1.87 -> 2.24 MB). A store written by an earlier lmdata also holds ``token_bytes`` (each
    row's tokens again as bytes, which its takes read); ingest no longer writes it: it cost 6 of a
    shard's 9 CPU ms of Lance writing, and the loader reads windows from decoded copies
    (``lance_chunks``), made once per machine by one take a shard, not by a take per batch."""
    import pyarrow as pa

    token = pa.field("item", pa.from_numpy_dtype(np.dtype(dtype)), metadata={"lance-encoding:compression": "none"})
    return pa.schema([("doc_id", pa.int64()), ("token_offset", pa.int64()), ("tokens", pa.list_(token))])


# A record of this layout says which columns its fragment holds: resuming an ingest that an older
# lmdata started writes again the shards it recorded in another layout (a commit needs one schema).
LAYOUT = {"columns": ["doc_id", "token_offset", "tokens"]}


def current_layout(shard: ShardInfo) -> bool:
    """The record was written in this lmdata's layout (``LAYOUT``) and Lance file format
    (``STORAGE_VERSION``, read from its fragment's files): a commit refuses data files of two versions."""
    files = (shard.extra.get("fragment") or {}).get("files") or []
    return shard.extra.get("columns") == LAYOUT["columns"] and bool(files) and all(
        f"{f.get('file_major_version')}.{f.get('file_minor_version')}" == STORAGE_VERSION for f in files)


def shard_rows(tokens: np.ndarray, doc_starts: np.ndarray, rows: tuple[np.ndarray, np.ndarray] | None = None
               ) -> np.ndarray:
    """A shard's row index, int64 [3, n_rows + 1]: each row's first token (then n_tokens), its
    document (then n_docs) and the CRC-32 of its tokens' little-endian bytes (then 0). ``rows``:
    ``pieces(doc_starts)``, when the caller has it already."""
    row_starts, doc_of_row = rows if rows is not None else pieces(doc_starts)
    crcs = np.append(row_checksums(tokens, row_starts), 0).astype(np.int64)
    return np.stack([row_starts, np.append(doc_of_row, len(doc_starts) - 1), crcs]).astype(np.int64)


def fragment_name(members: list[ShardInfo]) -> str:
    first, last = members[0].name, members[-1].name
    return first if first == last else f"{first}-{last}"


def plan_fragments(shards: list[ShardInfo], limit: int) -> list[list[ShardInfo]]:
    """Consecutive runs of shards holding at most ``limit`` tokens each (a bigger shard is its own run)."""
    runs: list[list[ShardInfo]] = []
    size = 0
    for s in shards:
        if not runs or size + s.n_tokens > limit:
            runs.append([])
            size = 0
        runs[-1].append(s)
        size += s.n_tokens
    return runs


def record_path(format_dir: Path, name: str) -> Path:
    return Path(format_dir) / GROUP_DIR / f"{name}.json"


def vouching_record(format_dir: Path, index: int, shard: ShardInfo) -> Path:
    """The record of completed shard ``index``: its fragment's for a fragment's member, else its own."""
    if "fragment_of" in shard.extra:
        return record_path(format_dir, shard.extra["fragment_of"])
    return base.record_path(format_dir, index)


def read_fragments(format_dir: Path) -> dict[str, ShardInfo]:
    """Fragment records whose files are all on disk with the recorded sizes, by name."""
    found = (base.read_record_file(format_dir, p) for p in sorted((Path(format_dir) / GROUP_DIR).glob("*.json")))
    return {shard.name: shard for shard in found if shard is not None}


def members(fragment: ShardInfo) -> dict[int, ShardInfo]:
    """The ingest shards a fragment holds, as completed shards: counts, and where their rows are."""
    out, doc, token, row = {}, fragment.first_doc, fragment.first_token, 0
    for m in fragment.extra["members"]:
        out[int(m["name"])] = ShardInfo(
            name=m["name"], n_docs=m["n_docs"], n_tokens=m["n_tokens"], first_doc=doc, first_token=token,
            files=fragment.files, extra={"rows": m["rows"], "fragment_of": fragment.name, "row": row},
        )
        doc, token, row = doc + m["n_docs"], token + m["n_tokens"], row + m["rows"]
    return out


def reusable(run: list[ShardInfo], fragments: dict[str, ShardInfo]) -> ShardInfo | None:
    """The recorded fragment holding exactly ``run``, when every shard of the run came from it."""
    name = fragment_name(run)
    fragment = fragments.get(name)
    if fragment is None or any(s.extra.get("fragment_of") != name for s in run):
        return None
    held = members(fragment)
    if [(s.name, s.n_docs, s.n_tokens, s.first_token) for s in run] != [
            (m.name, m.n_docs, m.n_tokens, m.first_token) for m in held.values()]:
        return None
    return fragment


def _member_batches(format_dir: Path, shard: ShardInfo, columns: list[str]) -> Iterator[Any]:
    """A completed shard's rows, from its staging fragment or from the fragment that holds it."""
    from lance.file import LanceFileReader

    path = Path(format_dir) / shard.files[0].path
    try:
        reader = LanceFileReader(str(path), columns=columns)
        start = int(shard.extra.get("row", 0))
        if start + shard.extra["rows"] > reader.metadata().num_rows:
            raise LmdataError(f"{path}: shard {shard.name} rows are missing; rerun the ingest with --overwrite")
        yield from reader.read_range(start, shard.extra["rows"]).to_table().combine_chunks().to_batches()
    except LmdataError:
        raise
    except Exception as exc:
        raise LmdataError(f"{path}: shard {shard.name} could not be read ({library_text(exc)}); "
                          "rerun the ingest with --overwrite") from exc


def _row_info(batch: Any, first_token: int, first_doc: int) -> tuple[np.ndarray, ...]:
    """A batch's rows: first token and document (within the fragment), size, CRC-32 of the tokens
    (the reader checks each row it takes). ``.values`` ignores a slice; ``.offsets`` index into it."""
    import pyarrow.compute as pc

    tokens = batch.column("tokens")
    return (batch.column("token_offset").to_numpy() - first_token, batch.column("doc_id").to_numpy() - first_doc,
            pc.list_value_length(tokens).to_numpy(),
            row_checksums(tokens.values.to_numpy(zero_copy_only=False), tokens.offsets.to_numpy()))


def write_fragment(format_dir: Path, run: list[ShardInfo], schema: Any, storage_version: str) -> ShardInfo:
    """Stream ``run``'s rows into one uncommitted fragment; write its row index and record."""
    import pyarrow as pa
    from lance.fragment import LanceFragment

    format_dir = Path(format_dir)
    name = fragment_name(run)
    first_doc, first_token = run[0].first_doc, run[0].first_token
    per_batch: list[tuple[np.ndarray, ...]] = []  # (row first tokens, documents, sizes, CRC-32s) per batch

    failed: list[BaseException] = []

    def batches() -> Iterator[Any]:
        try:
            for shard in run:
                for batch in _member_batches(format_dir, shard, schema.names):
                    per_batch.append(_row_info(batch, first_token, first_doc))
                    yield batch
        except BaseException as exc:  # Lance would turn it into a bare error without our message
            failed.append(exc)
            raise

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    try:
        meta = LanceFragment.create(str(format_dir), reader, fragment_id=int(run[0].name), schema=schema,
                                    data_storage_version=storage_version).to_json()
    except Exception:
        if failed:
            raise failed[0] from None
        raise
    n_docs, n_tokens = sum(s.n_docs for s in run), sum(s.n_tokens for s in run)
    cols = [[b[k] for b in per_batch] for k in range(4)]
    rows = np.stack([np.concatenate(cols[0] + [[n_tokens]]), np.concatenate(cols[1] + [[n_docs]]),
                     np.concatenate(cols[3] + [[0]]).astype(np.int64)])
    sizes = np.concatenate(cols[2]) if per_batch else np.zeros(0, np.int64)
    if (len(meta["files"]) != 1 or rows.shape[1] - 1 != sum(s.extra["rows"] for s in run)
            or not np.array_equal(np.diff(rows[0]), sizes)):
        raise LmdataError(f"{format_dir}: fragment {name} does not hold its shards' rows in order (the staging "
                          "fragments are damaged); rerun the ingest with --overwrite")
    return record_fragment(format_dir, run, meta, rows)


def record_fragment(format_dir: Path, run: list[ShardInfo], meta: dict, rows: np.ndarray,
                    data: FileInfo | None = None) -> ShardInfo:
    """Make a written fragment of ``run`` durable: its data file (``data``: already durable, with
    its checksum), its row index ``rows`` (each row's first token and document within the
    fragment, CRC-32; then the totals), then its record."""
    format_dir = Path(format_dir)
    name = fragment_name(run)
    first_doc, first_token = run[0].first_doc, run[0].first_token
    n_docs, n_tokens = sum(s.n_docs for s in run), sum(s.n_tokens for s in run)
    data_file = f"data/{meta['files'][0]['path']}"
    if data is None:
        atomic.fsync_path(format_dir / data_file)
    path = record_path(format_dir, name)
    base.forget_file(format_dir, path)  # a rebuilt fragment's old record must not pair old data with the new index
    rows_name = f"index-{name}.npy"  # never a staging shard's ``rows-NNNNN.npy``
    rows = np.asarray(rows, np.int64)
    replaced, rows_info = write_shard_parts(format_dir, rows_name, [base.npy_bytes(rows)])
    fragment = ShardInfo(
        name=name, n_docs=n_docs, n_tokens=n_tokens, first_doc=first_doc, first_token=first_token,
        files=[data or file_info(format_dir, data_file), rows_info],
        extra={"rows": int(rows.shape[1] - 1), "fragment": meta, **LAYOUT, "row_crc": True,
               "members": [{"name": s.name, "n_docs": s.n_docs, "n_tokens": s.n_tokens, "rows": s.extra["rows"]}
                           for s in run]},
    )
    base.write_record_file(path, fragment, sync_dirs=[format_dir] if replaced else [])
    return fragment


def remove_unused(format_dir: Path, fragments: list[ShardInfo]) -> None:
    """After the commit: every staging shard, fragment record and file that ``fragments`` does not use."""
    format_dir = Path(format_dir)
    keep_names = {f.name for f in fragments}
    keep_files = {f.path for s in fragments for f in s.files}
    for record in [*(format_dir / base.RECORD_DIR).glob("*.json"), *(format_dir / GROUP_DIR).glob("*.json")]:
        if record.stem not in keep_names:
            record.unlink()
    for pattern in ("data/*.lance", "rows-*.npy", "index-*.npy"):
        for path in format_dir.glob(pattern):
            if path.relative_to(format_dir).as_posix() not in keep_files:
                path.unlink()


def open_dataset(format_dir: Any, remote: bool) -> Any:
    """The store's Lance dataset; remote, opened within ``LMDATA_S3_TIMEOUT`` (an endpoint that stops answering fails)."""
    import lance

    if not remote:
        return lance.dataset(str(format_dir))
    return within_timeout(partial(lance.dataset, format_dir.uri, storage_options=format_dir.storage_options()),
                          format_dir.uri)


def open_error(exc: Exception, format_dir: Any, remote: bool) -> LmdataError:
    """Why a Lance dataset did not open, in a line: on object storage denied / no bucket / unreachable as
    ``remote_error`` says them (a missing credential had been a 2.9 KB Rust debug dump), else Lance's words."""
    if remote and not isinstance(exc, LmdataError):
        said = remote_error(exc, str(format_dir))
        if not str(said).startswith(f"{format_dir}: {type(exc).__name__}: "):
            return said
    return LmdataError(f"{format_dir}: the Lance dataset cannot be opened ({library_text(exc)}); "
                       "`lmdata verify` names the damaged file")
