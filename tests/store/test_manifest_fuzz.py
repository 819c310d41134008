"""Manifest fuzzer (issue 19, case 5): every field of a real manifest, given a wrong type or an
impossible value, is refused by every consumer -- open_store, verify, inspect, sql, the loader --
with one ``LmdataError`` line, never a TypeError/ValueError/KeyError traceback.

Each distinct field (list items collapsed to their first) is mutated to each of ``BAD_VALUES``
and deleted; a consumer may also accept a mutation (an unknown or optional value), but then it
must run to the end.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from lmdata.errors import LmdataError
from lmdata.store.manifest import MANIFEST_NAME, check_schema, SCHEMA

BAD_VALUES = [None, "many", -1, 1.5, True, [], {}, 2**70, ""]
DELETE = object()


OPAQUE = {"sources", "fragment"}  # free-form objects no reader looks inside: mutated whole, not field by field


def _fields(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every field path of ``obj``, a list's items collapsed to its first."""
    if path and path[-1] in OPAQUE:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield path + (key,)
            yield from _fields(value, path + (key,))
    elif isinstance(obj, list) and obj:
        yield path + (0,)
        yield from _fields(obj[0], path + (0,))


def _mutate(obj: Any, path: tuple, value: Any) -> Any:
    out = copy.deepcopy(obj)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


def _consumers(store: Path) -> dict[str, Any]:
    from lmdata import inspect as lm_inspect
    from lmdata.data import make_loader
    from lmdata.store import open_store
    from lmdata.store.verify import verify_store

    def loader() -> None:
        ds = open_store(store).dataset("train", seq_len=64)
        next(iter(make_loader(ds, 4, num_workers=0)))

    return {
        "open_store": lambda: open_store(store),
        "verify": lambda: verify_store(store).raise_if_bad(),
        "inspect": lambda: lm_inspect.inspect(store),
        "sql": lambda: lm_inspect.sql(store, "SELECT count(*), sum(n_tokens) FROM docs"),
        "sql_tokens": lambda: lm_inspect.sql(store, "SELECT sum(len(tokens)) FROM tokens"),
        "loader": loader,
    }


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, store_builder):
    from lmdata.store.formats import lance_fragments

    old, lance_fragments.FRAGMENT_TOKENS = lance_fragments.FRAGMENT_TOKENS, 30_000
    try:
        syn = store_builder(tmp_path_factory.mktemp("fuzz") / "store", ["memmap", "parquet", "lance"],
                            n_tokens=20_000, shard_tokens=8_000)
    finally:
        lance_fragments.FRAGMENT_TOKENS = old
    return syn.path, json.loads((syn.path / MANIFEST_NAME).read_text())


def test_pristine_manifest_matches_schema(pristine):
    path, obj = pristine
    check_schema(obj, SCHEMA, "manifest.json")
    for name, run in _consumers(path).items():
        run()


def _mutations(obj: dict) -> list[tuple[tuple, Any]]:
    return [(path, value) for path in _fields(obj) for value in [*BAD_VALUES, DELETE]]


def test_every_mutated_field_is_refused_in_one_line(pristine):
    path, obj = pristine
    original = (path / MANIFEST_NAME).read_bytes()
    consumers = _consumers(path)
    failures: list[str] = []
    checked = 0
    try:
        for field, value in _mutations(obj):
            (path / MANIFEST_NAME).write_text(json.dumps(_mutate(obj, field, value)))
            shown = "deleted" if value is DELETE else repr(value)
            refused_by_store = False
            for name, run in consumers.items():
                if refused_by_store and name != "verify":
                    continue  # same read_manifest path as open_store: refused the same way
                try:
                    run()
                except LmdataError as exc:
                    if "\n" in str(exc):
                        failures.append(f"{name}: {field} = {shown}: multi-line error {str(exc)!r}")
                    if name == "open_store":
                        refused_by_store = True
                except Exception as exc:  # noqa: BLE001 - any other exception is the bug being hunted
                    failures.append(f"{name}: {field} = {shown}: {type(exc).__name__}: {exc}")
                checked += 1
    finally:
        (path / MANIFEST_NAME).write_bytes(original)
    assert checked > 300
    assert not failures, "\n".join(failures[:30]) + f"\n({len(failures)} in all)"


def test_error_names_the_field(pristine, tmp_path):
    path, obj = pristine
    from lmdata.store import open_store

    bad = _mutate(obj, ("splits", "train", "formats", "memmap", "shards", 0, "files", 0, "path"), None)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(bad))
    with pytest.raises(LmdataError, match=r"field splits\.train\.formats\.memmap\.shards\[0\]\.files\[0\]\.path "
                                          r"is null, expected a string"):
        open_store(tmp_path).reader("train", "memmap")  # a table's shards: checked when it is first read
    bad = _mutate(obj, ("splits", "train", "formats", "parquet", "shards", 0, "extra", "rows"), "many")
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(bad))
    store = open_store(tmp_path)
    store.reader("train", "memmap")  # another format's table is not read
    with pytest.raises(LmdataError, match=r"field splits\.train\.formats\.parquet\.shards\[0\]\.extra\.rows is a "
                                          r"string \(\"many\"\), expected an integer"):
        store.reader("train", "parquet")


def _checked_parts(obj: Any) -> Iterator[tuple[Any, Any]]:
    """(spec, value) pairs the manifest is checked as: the whole against SCHEMA, and each table's shards
    (a format's, provenance's) against its own spec when the table is read (``ShardTable``)."""
    from lmdata.store.manifest import SHARDS, shards_spec

    yield SCHEMA, obj
    splits = obj.get("splits") if isinstance(obj, dict) else None
    for info in (splits.values() if isinstance(splits, dict) else []):
        if not isinstance(info, dict):
            continue
        formats = info.get("formats")
        for fmt, entry in (formats.items() if isinstance(formats, dict) else []):
            if isinstance(entry, dict) and isinstance(entry.get("shards"), list):
                yield shards_spec(fmt), entry["shards"]
        prov = info.get("provenance")
        if isinstance(prov, dict) and isinstance(prov.get("shards"), list):
            yield SHARDS, prov["shards"]


def test_the_fast_match_and_the_explaining_walk_agree_on_every_mutation(pristine):
    """check_schema asks a path-free matcher first and walks with field paths only when it says no:
    the two must refuse exactly the same manifests, or a bad one would pass unnamed."""
    from lmdata.store.manifest import _explain, _matcher

    _, obj = pristine
    for spec, value in _checked_parts(obj):
        assert _matcher(spec)(value)
    refused = 0
    for field, value in _mutations(obj):
        bad = _mutate(obj, field, value)
        for spec, part in _checked_parts(bad):
            try:
                _explain(part, spec, "manifest.json")
                explained = None
            except LmdataError as exc:
                explained = str(exc)
            assert _matcher(spec)(part) == (explained is None), (field, value, explained)
            refused += explained is not None
    assert refused > 300
