"""The ingest job: checks, plan, lock, an engine by name, the manifest (last).

    sources ──checks (files, documents, names)──▶ plan + lock (``output``)
        ──engine.ingest_split per split (``local`` | ``ray``)──▶ shards in every format
        ──▶ manifest (last)

- Before any tokenizing, every source file is hashed once for the manifest and the plan
  (a read at disk speed, small next to tokenizing at a few MB/s per core), and each split
  is checked to hold a document, so bad inputs fail before the store is touched.
- An engine is named in ``ENGINES`` and imported only when chosen; engines share the core
  (``encode``, ``shards``) and never import each other or this module. The interface:

      engine = Engine(tokenizer_dir, workers, address)   # before the store is touched
      Engine.check_installed()                             # before any work
      engine.start(store_tokenizer_dir, tok)               # the store's copy exists (tok: it, loaded)
      engine.ingest_split(name, source, writers, eot, dtype, shard_tokens, progress, provenance=p)
          -> ({format: [ShardInfo]}, SplitReport)         # p: a ProvenanceWriter for the core's cutter
      engine.stop()                                        # idempotent

- ``resume`` and the refusals: see ``output``; shard cutting and prefix reuse: ``shards``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lmdata import __version__
from lmdata.io.atomic import NoSpaceError
from lmdata.errors import LmdataError
from lmdata.ingest import output
from lmdata.ingest.shards import SplitReport
from lmdata.ingest.splits import SplitSource, plan_splits, warn_repeated_inputs
from lmdata.sources import SourceSpec, expand, iter_documents
from lmdata.store.layout import PLAN_NAME
from lmdata.store.manifest import Manifest, SplitInfo, check_split_name, write_manifest
from lmdata.store.provenance import ProvenanceWriter
from lmdata.store.registry import BUILTIN_FORMATS
from lmdata.io.location import location

ENGINES = {"local": "lmdata.ingest.local:LocalEngine", "ray": "lmdata.ingest.ray:RayEngine"}


@dataclass
class IngestResult:
    """What ``ingest`` wrote: the manifest and each split's summary."""

    manifest: Manifest
    splits: dict[str, SplitReport] = field(default_factory=dict)


def engine_class(name: str) -> Any:
    """The engine called ``name`` (imported now); an error naming the choices otherwise."""
    if name not in ENGINES:
        raise LmdataError(f"--engine {name!r}: choose {' or '.join(ENGINES)}")
    module, attr = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), attr)



def _load_tokenizer(tokenizer_dir: Path) -> Any:
    from lmdata.tokenizer import Tokenizer

    if Path(tokenizer_dir).is_file():
        raise LmdataError(f"tokenizer {tokenizer_dir}: a file, not a tokenizer directory; give the directory that "
                          "holds it (`lmdata tokenizer train --out DIR` writes one)")
    if not Path(tokenizer_dir).is_dir():
        raise LmdataError(f"tokenizer {tokenizer_dir}: no such directory; train one with `lmdata tokenizer train`")
    return Tokenizer.load(tokenizer_dir)


def _vocab_size(tok: Any) -> tuple[int, int]:
    """(number of ids, largest id + 1): the dtype must hold the largest id, not just the count."""
    size = int(tok.vocab_size)
    return size, max(size, max(tok.vocab) + 1 if tok.vocab else 0)


def _dtype(tok: Any) -> str:
    return "uint16" if _vocab_size(tok)[1] <= 1 << 16 else "uint32"


def _formats(formats: Iterable[str] | None) -> list[str]:
    """``--format``'s names in order, once each; the built-ins when none is given (never plug-ins)."""
    return list(dict.fromkeys(BUILTIN_FORMATS if formats is None else formats))


def requested_plan(splits: dict[str, SourceSpec], tokenizer_dir: str | Path, formats: Iterable[str] | None,
                   shard_tokens: int, holdout: tuple[str, str, int] | None) -> dict[str, Any]:
    """The plan an ingest of these arguments would write, every input hashed here: what a finished
    store's own plan is compared to before ``--resume`` leaves it as it is (``publish.ingest_remote``)."""
    names = _formats(formats)
    _writer_classes(names)  # an unknown format name is its own error, not "different settings"
    tok = _load_tokenizer(Path(tokenizer_dir))
    return output.make_plan(plan_splits(splits, holdout), tok.hash, _dtype(tok), shard_tokens, names)


def _writer_classes(formats: Iterable[str]) -> dict[str, Any]:
    from lmdata.store.registry import get_format

    return {fmt: get_format(fmt).writer for fmt in formats}


def _expecting(source: SplitSource, described: list[dict[str, Any]]) -> SplitSource:
    """``source`` whose reads check each file against its manifest record (``SourceSpec.expect``)."""
    expect = tuple((str(d["path"]), int(d["bytes"])) for d in described)
    return replace(source, spec=replace(source.spec, expect=expect))


def ingest(splits: dict[str, SourceSpec], tokenizer_dir: str | Path, out: str | Path, *,
           formats: Iterable[str] | None = None, shard_tokens: int = 1 << 20, workers: int = 0,
           resume: bool = False, overwrite: bool = False, holdout: tuple[str, str, int] | None = None,
           progress: bool = True, log: Callable[[str], None] | None = print, engine: str = "local",
           ray_address: str | None = None, write_to: str | None = None) -> IngestResult:
    """Tokenize ``splits`` into a store at ``out`` in every format of ``formats``; manifest last.

    ``formats`` defaults to the built-ins (``BUILTIN_FORMATS``), never to plug-ins.
    ``engine="ray"`` runs the same job on Ray (``lmdata.ingest.ray``, at ``ray_address``);
    the store is the same. On bad input found mid-stream, a store this run started from
    nothing is removed again (see ``lmdata.ingest.output``). ``write_to`` (set by ``publish.ingest_remote``
    for the Ray engine): ``out`` is the staging directory of the store at ``write_to``, into which the
    engine's tasks write the shards themselves (``lmdata.ingest.ray_store``).
    """
    out_loc = location(out, flag="--out")
    if out_loc.remote:  # object storage: build in a local staging directory, upload, manifest last
        from lmdata.ingest.publish import ingest_remote

        for spec in splits.values():  # a missing input before the bucket is touched (the write probe leaves a
            expand(spec.paths)        # 0-byte "prefix/" marker behind: a refused run writes nothing there)

        def plan_of() -> dict[str, Any]:
            return requested_plan(splits, tokenizer_dir, formats, shard_tokens, holdout)

        return ingest_remote(ingest, out_loc.uri, resume=resume, overwrite=overwrite, log=log, plan_of=plan_of,
                             splits=splits,
                             tokenizer_dir=tokenizer_dir, formats=formats, shard_tokens=shard_tokens,
                             workers=workers, holdout=holdout, progress=progress, engine=engine,
                             ray_address=ray_address)
    out = out_loc.local_path  # file://PATH is PATH
    engine_cls = engine_class(engine)
    if write_to is not None and engine == "ray":
        from lmdata.ingest.ray_store import RayStoreEngine as engine_cls
    engine_cls.check_installed()  # before any work: a missing Ray is an install hint, not a half store
    formats = _formats(formats)
    if not formats:
        raise LmdataError("--format names no format; pass e.g. --format memmap,parquet,lance")
    writer_classes = _writer_classes(formats)  # unknown format names fail before any work
    if shard_tokens < 1:
        raise LmdataError(f"--shard-tokens must be positive, got {shard_tokens}")
    if resume and overwrite:  # before --out is made (prepare says the same for a remote store)
        raise LmdataError("--resume and --overwrite exclude each other; pick one")
    if not splits:
        raise LmdataError("no input given; pass --input PATH or --split NAME=PATH")
    for name in [*splits, *([holdout[1]] if holdout else [])]:  # a split is a directory of the store
        check_split_name(name, "--split" if name in splits else "--holdout split")
    files = {name: expand(spec.paths) for name, spec in splits.items()}  # missing files, empty globs: first
    for name, spec in splits.items():
        if next(iter_documents(spec, files=files[name]), None) is None:
            raise LmdataError(f"split {name!r}: the input holds no documents ({', '.join(spec.paths)})")
    warn_repeated_inputs(files)
    plan = plan_splits(splits, holdout)
    hashes = output.BackgroundHashes(plan) if getattr(engine_cls, "describe_all", None) is None else None
    runner = None
    try:
        tokenizer_dir = Path(tokenizer_dir)
        tok = _load_tokenizer(tokenizer_dir)
        if tok.eot_id is None:
            raise LmdataError(f"tokenizer {tokenizer_dir} has no {tok.eot_token} special token to end documents with; "
                              + (f"import it again with --eot-token NAME, one of {', '.join(tok.special_tokens)}"
                                 if tok.special_tokens else "train or import it with one"))
        vocab_size, eot, dtype = _vocab_size(tok)[0], int(tok.eot_id), _dtype(tok)
        workers = workers or os.cpu_count() or 1
        tok_files = output.read_tokenizer_files(tokenizer_dir)
        # connect before the store is touched: a bad --ray-address leaves nothing behind
        runner = engine_cls(tokenizer_dir, workers, ray_address)
        created = output.missing_root(Path(out))
        out = output.open_output(Path(out))
        if write_to is not None and hasattr(runner, "write_to"):
            runner.write_to(out, location(write_to))
        lock = output.claim(out, resume=resume, overwrite=overwrite)
        fresh = writing = False
        try:
            fresh = output.is_empty(out)  # started from nothing: a failure on bad input undoes it all

            def build(describe_all: Callable) -> dict[str, Any]:
                return output.make_plan(plan, tok.hash, dtype, shard_tokens, formats, describe_all)

            # the plan first, before anything else is written there: it is what makes the folder a store
            # being ingested, which --resume continues and --overwrite may delete (a Ctrl-C while the
            # tokenizer was copied or pyarrow imported had left a folder both refused). A fresh store's
            # plan is written pending (no checksums yet) and completed as the hashes come in.
            pending = hashes is not None and not (out / PLAN_NAME).exists()
            plan_json = build(output.pending_records if pending
                              else getattr(runner, "describe_all", None) or hashes.describe_all)
            have_tok = output.check_tokenizer(out, tokenizer_dir, tok.hash, type(tok).load)
            output.check_plan(out, plan_json)
            if pending:
                hashes.write_plan_when_hashed(out, build)
            store_tok = output.install_tokenizer(out, tok_files, present=have_tok)
            for cls in writer_classes.values() if hashes is not None else ():  # while this process hashes the inputs
                getattr(cls, "prepare", lambda dtype: None)(np.dtype(dtype))  # RecordedShardWriter.prepare
            manifest = Manifest(tok.hash, vocab_size, dtype, eot, shard_tokens, lmdata_version=__version__)
            result = IngestResult(manifest)
            runner.start(store_tok, tok)  # the store's copy is tok's files (or has its hash)
            writing = True
            for name, source in plan.items():
                writers = {fmt: cls(out / name / fmt, np.dtype(dtype)) for fmt, cls in writer_classes.items()}
                sources = plan_json["splits"][name]["sources"]
                source = _expecting(source, sources)  # each file's read ends by checking it is still this one
                origins = ProvenanceWriter(out / name)
                shards, report = runner.ingest_split(name, source, writers, eot, dtype, shard_tokens, progress,
                                                     provenance=origins)
                manifest.splits[name] = SplitInfo(report.documents, report.tokens, sources, shards,
                                                  origins.finish(report.documents, report.tokens))
                result.splits[name] = report
                if log:
                    log(report.line())
            manifest.extra["splits"] = {
                n: {"text_bytes": r.text_bytes, "replaced": r.replaced} for n, r in result.splits.items()
            }
            if pending:  # the manifest records each input's checksum: the plan that has them is written first
                final = hashes.final_plan()
                for name, info in manifest.splits.items():
                    info.sources = final["splits"][name]["sources"]
            write_manifest(out, manifest)
            return result
        except LmdataError as exc:
            if isinstance(exc, NoSpaceError):  # what is written is sound: keep it for --resume
                raise output.ResumableError(
                    f"{exc}; the partial store {out} (no manifest: not a store yet) is kept: free space and rerun "
                    "with --resume, or delete it"
                ) from None
            if isinstance(exc, output.ResumableError) or not (fresh or writing):
                raise
            if fresh:
                runner.stop()  # its workers read the store's tokenizer copy
                if hashes is not None:
                    hashes.stop()  # no plan written into what is removed
                output.remove_output(out, created)
                raise
            raise LmdataError(f"{exc}; then rerun with --overwrite: {out} was started from this input, "
                              "so --resume cannot continue it once the input is fixed") from None
        finally:
            lock.close()
    finally:
        if hashes is not None:
            hashes.stop()
        if runner is not None:
            runner.stop()
