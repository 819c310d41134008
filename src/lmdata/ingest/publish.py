"""A store written to object storage: built in a local staging directory, then uploaded.

    ingest(..., out="s3://bucket/runs/store")   # the ingest job calls ingest_remote

Object storage has no rename, so a store cannot be made durable file by file the way a
local one is (tmp + fsync + rename). Instead the ingest runs unchanged into a staging
directory on local disk (``staging_dir``: ``<cache root>/staging/<hash of the URI>``, the
root being ``$LMDATA_CACHE_DIR``, default ``~/.cache/lmdata``: ``lmdata.io.cache``), with its own locks and completion records, and ``publish``
uploads it in the order that keeps the remote store crash-safe:

    0. the ingest plan (``ingest-plan.json``): the prefix is an interrupted ingest of ours
    1. every shard file (tokens, offsets, checksum sidecars, Parquet files, Lance data)
    2. every completion record (``_shards/*.json``) and Lance's version files
    3. the tokenizer
    4. ``manifest.json`` -- last: until it exists the prefix is not a store

``--overwrite`` / ``--resume`` on a prefix that already holds objects apply the local
store's ownership rule (``ingest.output.foreign_keys``): the prefix must carry our manifest
or plan, and every object must be one our layout names; anything else is refused, naming
it, and ``--overwrite`` deletes only the objects it listed, never the whole prefix.

An object appears whole or not at all (a PUT or a completed multipart upload), so a crash
at any point leaves either no manifest (``open_store`` refuses: "not a store") or a complete
store. ``--resume`` continues the staging directory (same machine) and uploads what is
missing: an object already there with the size the staging file has is not sent again,
so a resumed run ends with the same objects as an uninterrupted one. After a successful
upload the staging directory is removed, so ``--resume`` on a finished store finds none: it checks
the store's plan against its own arguments (inputs hashed again) and, when they agree, ingests and
uploads nothing (a store of other settings is refused, as a local one is).

With ``--engine ray`` the tasks write the shards and their records into the store themselves
(``lmdata.ingest.ray_store``, after the plan is uploaded); the staging directory then holds only
the plan, tokenizer, provenance and manifest, which ``publish`` uploads as above, manifest last.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from lmdata._ownership import refuse_foreign
from lmdata.errors import LmdataError
from lmdata.ingest import output
from lmdata.io.atomic import NoSpaceError
from lmdata.io.cache import keyed_dir
from lmdata.io.location import Location, location
from lmdata.store.layout import MANIFEST_NAME, PLAN_NAME, RECORD_DIR, TOKENIZER_DIR

_SKIP_PREFIXES = (".",)  # temporaries (.NAME.tmp-PID), the lock file
_COMMIT_PARTS = (RECORD_DIR, "_fragments", "_versions", "_transactions")  # records, Lance's commit log


def staging_dir(loc: Location) -> Path:
    """Where the store at ``loc`` is built before it is uploaded (stable per URI, for --resume)."""
    return keyed_dir("staging", loc.uri)


def _rank(rel: str) -> int:
    """Upload order: the ingest plan first (it marks the prefix as ours: an interrupted upload is
    then resumable and never mistaken for a user's objects), data, then records and versions,
    then the tokenizer, manifest last."""
    parts = rel.split("/")
    if rel == PLAN_NAME:
        return -1
    if rel == MANIFEST_NAME:
        return 3
    if parts[0] == TOKENIZER_DIR or len(parts) == 1:
        return 2
    if any(p in parts for p in _COMMIT_PARTS):
        return 1
    return 0


def local_files(root: Path) -> list[str]:
    """Relative paths of the files to upload, in upload order."""
    found = []
    for path in Path(root).rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not any(p.startswith(_SKIP_PREFIXES) for p in rel.split("/")):
            found.append(rel)
    return sorted(found, key=lambda rel: (_rank(rel), rel))


def publish(root: Path, loc: Location, log: Callable[[str], None] | None = None, prune: bool = False) -> int:
    """Upload the store staged at ``root`` to ``loc`` (manifest last); returns the objects sent.

    ``prune`` (the staging holds the whole store): then delete what else the prefix holds -- every object
    there is ours (``ingest_remote`` refused any other), and one the new manifest does not name is an earlier
    run's (an interrupted Ray ingest's records, another machine's Lance data file), left behind before."""
    if not (Path(root) / MANIFEST_NAME).is_file():
        raise AssertionError(f"{root} holds no finished store to publish")
    sizes = {x.key: x.size for x in loc.list(recursive=True)}  # one LIST; no HEAD per object
    sent = 0
    staged = local_files(root)
    for rel in staged:
        path = Path(root) / rel
        if _rank(rel) == 0 and sizes.get(rel) == path.stat().st_size:
            continue  # a shard file already uploaded by an interrupted run: same name, same size
        (loc / rel).upload(path)
        sent += 1
    kept = set(staged)
    stray = [key for key in sizes if key not in kept] if prune else []
    if stray:  # only names of this store's layout: anything else (a user's object written meanwhile) stays
        layout = output.layout_from(json.loads((Path(root) / MANIFEST_NAME).read_text()), None) or {}
        foreign = set(output.foreign_keys(stray, layout))
        stray = [key for key in stray if key not in foreign]
    for key in stray:
        (loc / key).delete()
    if log:
        log(f"uploaded {sent} objects to {loc.uri}" + (f", deleted {len(stray)} left by an earlier run" if stray else ""))
    return sent


def remote_manifest(loc: Location) -> dict[str, Any] | None:
    """The parsed manifest at ``loc`` if there is one that is lmdata's, else None."""
    try:
        obj = json.loads((loc / MANIFEST_NAME).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get("format", "lmdata-store") == "lmdata-store" else None


def _remote_json(obj: Location) -> Any:
    try:
        return json.loads(obj.read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def check_bucket(loc: Location, flag: str) -> None:
    """A one-line error now, not a failed upload after the whole ingest, if ``loc`` cannot be written.

    Called only once every refusal has passed: pyarrow's delete of the probe leaves a 0-byte
    directory marker (``<prefix>/``) behind (apache/arrow#36275), which a refused run must not
    leave in a user's prefix."""
    probe = loc / ".lmdata-write-probe"
    probe.write_bytes(b"")
    probe.delete()


def ingest_remote(run: Callable[..., Any], out: str, *, resume: bool, overwrite: bool,
                  log: Callable[[str], None] | None, plan_of: Callable[[], dict[str, Any]], **kwargs: Any) -> Any:
    """Run the ingest ``run`` into ``out``'s staging directory, then ``publish`` it to ``out``.

    ``plan_of()``: the plan these arguments would write (``job.requested_plan``). ``--resume`` on a
    finished store with no staging left (the upload completed) checks the store's plan against it
    and leaves the store as it is: nothing tokenized, nothing uploaded."""
    loc = location(out, flag="--out")
    if loc.is_file():  # (a store had been built under the object's name, as a "directory" beside it)
        raise LmdataError(f"--out {loc.uri}: is an object, not a prefix; give the prefix a store goes under")
    existing = loc.list(recursive=True)
    if existing and not (resume or overwrite):
        raise LmdataError(
            f"--out {loc.uri}: the prefix already holds {len(existing)} objects; pass --resume to finish an "
            "interrupted ingest, --overwrite to replace a store, or choose another prefix"
        )
    if existing and resume and overwrite:
        raise LmdataError("--resume and --overwrite exclude each other; pick one")
    if existing:
        keys = [x.key for x in existing]
        layout = output.layout_from(remote_manifest(loc), _remote_json(loc / PLAN_NAME))
        if layout is None:
            raise LmdataError(
                f"--out {loc.uri}: the prefix holds {len(keys)} objects but no lmdata store (no manifest.json or "
                "ingest-plan.json of lmdata's); refusing to write or delete there -- choose another prefix"
            )
        refuse_foreign(loc.uri, output.foreign_keys(keys, layout), "--out", "a store")  # type: ignore[arg-type]
    staging = staging_dir(loc)
    with _staging_lock(staging, loc):
        return _ingest_staged(run, loc, staging, existing, resume, overwrite, log, plan_of, kwargs)


def _ingest_staged(run: Callable[..., Any], loc: Location, staging: Path, existing: list, resume: bool,
                   overwrite: bool, log: Callable[[str], None] | None, plan_of: Callable[[], dict[str, Any]],
                   kwargs: dict[str, Any]) -> Any:
    """``ingest_remote`` once this machine's staging directory for ``loc`` is ours alone."""
    plan_of = functools.cache(plan_of)  # (it hashes every input: once at most)
    staged_whole = resume and (staging / MANIFEST_NAME).is_file()
    if resume and _finished(loc, plan_of, None if staged_whole else _staged_plan(staging)):
        shutil.rmtree(staging, ignore_errors=True)  # (a store of other settings, or another run's: refused)
        if log:
            log(f"{loc.uri} already holds this finished store; nothing to ingest or upload")
        return None
    if staged_whole:  # staged whole, then stopped in the upload: its plan must be these arguments' (inputs hashed)
        output.same_plan(_staged_plan(staging), plan_of(), loc.uri)
    check_bucket(loc, "--out")  # after the refusals: a refused run writes nothing there
    if existing and overwrite:
        for x in existing:  # only the objects our layout names (checked above); never the whole prefix
            x.loc.delete()
    if not resume and staging.exists():
        shutil.rmtree(staging)  # ours: a previous attempt's staging for this URI
    staging.parent.mkdir(parents=True, exist_ok=True)
    direct = _tasks_write(kwargs)
    if resume and (staging / MANIFEST_NAME).is_file():
        result = None  # the ingest finished before the crash; only the upload is left
    else:
        try:
            result = run(out=staging, resume=resume and staging.exists(), overwrite=False, log=log,
                         **kwargs, **({"write_to": loc.uri} if direct else {}))
        except LmdataError as exc:
            if direct and not existing and not isinstance(exc, (output.ResumableError, NoSpaceError)):
                for x in loc.list(recursive=True):  # bad input in a fresh prefix: the tasks' objects go too
                    x.loc.delete()
            if str(exc).startswith(f"{staging} "):  # about the store as a whole: name the one the user gave
                exc.args = (f"{loc.uri}{str(exc)[len(str(staging)):]}",)
            raise
    publish(staging, loc, log, prune=not direct)
    shutil.rmtree(staging, ignore_errors=True)
    return result


def _finished(loc: Location, plan_of: Callable[[], dict[str, Any]], staged: Any = None) -> bool:
    """Whether ``loc`` holds a finished store of exactly the plan ``plan_of()``. A final plan there of other
    settings -- a finished store's, or an interrupted ingest's from another machine or another run -- is
    refused as a local one is (``output.same_plan``): a resume had built a new staging directory, and the
    upload skipped the objects of the same name and size, leaving another run's shards under this manifest.
    Without a final plan (none uploaded, or inputs never hashed) the caller ingests and uploads what differs.
    ``staged``: this machine's staging plan, to be resumed: the same as the prefix's, the resumed run checks the
    inputs itself (hashing them here too had read them twice, on a Ray resume in the driver)."""
    plan = _remote_json(loc / PLAN_NAME)
    if not isinstance(plan, dict) or output.pending(plan):
        return False
    finished = remote_manifest(loc) is not None
    if plan != staged or finished:
        output.same_plan(plan, plan_of(), loc.uri)
    return finished


def _staged_plan(staging: Path) -> Any:
    try:
        return json.loads((staging / PLAN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextmanager
def _staging_lock(staging: Path, loc: Location) -> Iterator[None]:
    """This machine's lock on ``loc``'s staging directory, held from before it is cleaned to the end of the upload
    (a second ingest to the same URI had deleted the first one's staging, and both failed)."""
    from filelock import FileLock, Timeout

    staging.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(staging.with_name(staging.name + ".lock")), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise LmdataError(f"--out {loc.uri}: another ingest on this machine is writing this store right now; wait "
                          "for it to finish or choose another --out") from None
    try:
        yield
    finally:
        lock.release()


def _tasks_write(kwargs: dict[str, Any]) -> bool:
    """The Ray engine's tasks write the shards into the store themselves (``ray_store``), for the
    built-in formats; the local engine and plug-in formats are staged and uploaded from here."""
    from lmdata.store.registry import BUILTIN_FORMATS

    formats = kwargs.get("formats")
    return kwargs.get("engine") == "ray" and (formats is None or set(formats) <= set(BUILTIN_FORMATS))


def remote_state(out: str) -> tuple[bool, bool]:
    """(a finished store of ours is at ``out``, an interrupted ingest of ours is there): the
    pipeline's reuse-or-resume decision for an ``s3://`` store."""
    loc = location(out, flag="[ingest] out")
    if remote_manifest(loc) is not None:
        return True, False
    return False, output.layout_from(None, _remote_json(loc / PLAN_NAME)) is not None
