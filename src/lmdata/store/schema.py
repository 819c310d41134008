"""The manifest's validator: one spec language, compiled to plain Python once per spec.

One validator for every manifest field, run before the field is used (a table of shards when it is
first read: ``manifest.ShardTable``): a wrong type or an
impossible value is one LmdataError naming the field's path (``splits.train.formats.memmap
.shards[3].files[0].path``), never a TypeError/ValueError deep in a reader, inspect or SQL.
A spec is a Python type for a leaf (``int`` means a JSON integer in [0, 2**62): bool and
float are refused, and no count or offset is negative or overflows int64 arithmetic), a
``dict`` of field specs (keys ending in ``?`` are optional; unknown keys are kept, for
fields a later version adds), a ``[spec]`` for a list, and ``Each(spec)`` for a mapping
of user-chosen keys (split and format names) to values of one spec.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from lmdata.errors import LmdataError

_MAX_INT = 1 << 62


@dataclass(frozen=True)
class Each:
    """A JSON object whose keys are names (splits, formats) and whose values all match ``spec``."""

    spec: Any


@dataclass(frozen=True)
class Many:
    """A list of at least ``at_least`` items, each matching ``spec`` (``[spec]`` is ``Many(spec)``)."""

    spec: Any
    at_least: int = 0


@dataclass(frozen=True)
class Text:
    """A string matching ``pattern`` (by default any non-empty one)."""

    pattern: str = r".+"


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _leaf_problem(value: Any, spec: Any) -> str | None:
    """Why ``value`` does not match the leaf ``spec`` (None when it does)."""
    if isinstance(spec, tuple):
        problems = [_leaf_problem(value, s) for s in spec]
        return None if None in problems else problems[0]
    if isinstance(spec, Text):
        if not isinstance(value, str):
            return f"is {_json_type(value)}, expected a string"
        return None if re.fullmatch(spec.pattern, value) else f"is {value[:40]!r}, expected a string matching {spec.pattern}"
    if spec is int:
        if type(value) is not int:
            return f"is {_json_type(value)} ({json.dumps(value)[:40]}), expected an integer"
        return None if 0 <= value < _MAX_INT else f"is {value}, expected an integer in [0, 2**62)"
    names = {str: "a string", bool: "a boolean", dict: "an object", list: "a list", type(None): "null"}
    return None if type(value) is spec else f"is {_json_type(value)}, expected {names.get(spec, spec.__name__)}"


def _matcher(spec: Any) -> Callable[[Any], bool]:
    """``spec`` compiled to one Python function that only says whether a value matches: straight-line
    checks and ``for`` loops, no field paths, no messages (``check_schema`` re-walks with those only
    when it says no). A closure per node had cost 0.45 of an 11,761-shard manifest's 1.3 s
    ``from_json`` (a call per field of every shard); the walk that built a path string per value,
    before that, 0.11 of a 1,160-shard manifest's 0.18 s."""
    lines: list[str] = ["def match(v0):"]
    consts: dict[str, Any] = {"_MISSING": _MISSING, "_MAX_INT": _MAX_INT, "_leaf_problem": _leaf_problem}
    _emit(spec, "v0", 1, lines, consts, [0])
    lines.append("    return True")
    exec(compile("\n".join(lines), "<manifest schema>", "exec"), consts)  # noqa: S102 - our own specs only
    return consts["match"]


_MISSING = object()
# Text patterns as plain string tests, each equal to ``re.fullmatch(pattern, s)`` (``.`` is any character but
# a newline): 0.1 s of an 11,761-shard manifest's ~250,000 names, paths and checksums.
_PLAIN_TESTS = {r".+": '{0} and "\\n" not in {0}', r"[0-9a-f]{64}": 'len({0}) == 64 and not {0}.strip("0123456789abcdef")',
                r"[0-9a-f]{32}": 'len({0}) == 32 and not {0}.strip("0123456789abcdef")'}


def _emit(spec: Any, var: str, depth: int, lines: list[str], consts: dict[str, Any], names: list[int]) -> None:
    """Lines that ``return False`` unless ``var`` matches ``spec`` (``names``: a counter for fresh names)."""
    pad = "    " * depth

    def fresh(prefix: str) -> str:
        names[0] += 1
        return f"{prefix}{names[0]}"

    if isinstance(spec, dict):
        lines.append(f"{pad}if not isinstance({var}, dict): return False")
        for key, sub in spec.items():
            name, optional, item = key.rstrip("?"), key.endswith("?"), fresh("v")
            lines.append(f"{pad}{item} = {var}.get({name!r}, _MISSING)")
            if optional:
                lines.append(f"{pad}if {item} is not _MISSING:")
                _emit(sub, item, depth + 1, lines, consts, names)
            else:
                lines.append(f"{pad}if {item} is _MISSING: return False")
                _emit(sub, item, depth, lines, consts, names)
    elif isinstance(spec, (list, Many)):
        many = spec if isinstance(spec, Many) else Many(spec[0])
        item = fresh("v")
        lines.append(f"{pad}if not isinstance({var}, list) or len({var}) < {many.at_least}: return False")
        lines.append(f"{pad}for {item} in {var}:")
        _emit(many.spec, item, depth + 1, lines, consts, names)
    elif isinstance(spec, Each):
        item = fresh("v")
        lines.append(f"{pad}if not isinstance({var}, dict): return False")
        lines.append(f"{pad}for {item} in {var}.values():")
        _emit(spec.spec, item, depth + 1, lines, consts, names)
    elif spec is int:  # a JSON integer in [0, 2**62): not bool, not float
        lines.append(f"{pad}if type({var}) is not int or not 0 <= {var} < _MAX_INT: return False")
    elif isinstance(spec, Text) and spec.pattern in _PLAIN_TESTS:  # the common patterns without a regex
        lines.append(f"{pad}if not isinstance({var}, str) or not ({_PLAIN_TESTS[spec.pattern].format(var)}): return False")
    elif isinstance(spec, Text):
        pattern = fresh("p")
        consts[pattern] = re.compile(spec.pattern).fullmatch
        lines.append(f"{pad}if not isinstance({var}, str) or {pattern}({var}) is None: return False")
    else:
        leaf = fresh("s")
        consts[leaf] = spec
        lines.append(f"{pad}if _leaf_problem({var}, {leaf}) is not None: return False")
    if lines[-1].endswith(":"):  # a loop or an optional field with nothing to check
        lines.append(f"{pad}    pass")


_MATCHERS: dict[int, tuple[Any, Callable[[Any], bool]]] = {}  # id(spec) -> (spec, its matcher): specs live on


def check_schema(value: Any, spec: Any, where: str, field: str = "") -> None:
    """Raise an ``LmdataError`` naming the first field of ``value`` that does not match ``spec``."""
    known = _MATCHERS.get(id(spec))
    if known is None or known[0] is not spec:
        if len(_MATCHERS) > 64:  # a caller's spec built per call ([spec]) must not pile up
            _MATCHERS.clear()
        known = _MATCHERS[id(spec)] = (spec, _matcher(spec))
    if known[1](value):
        return
    _explain(value, spec, where, field)


def _explain(value: Any, spec: Any, where: str, field: str = "") -> None:
    """``check_schema``'s walk with field paths, for a value its matcher refused."""
    def fail(problem: str) -> LmdataError:
        return LmdataError(f"{where}: field {field or '(top level)'} {problem}; the manifest is corrupt "
                           "(re-run the ingest with --overwrite)")

    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise fail(f"is {_json_type(value)}, expected an object")
        for key, sub in spec.items():
            name, optional = key.rstrip("?"), key.endswith("?")
            path = f"{field}.{name}" if field else name
            if name not in value:
                if optional:
                    continue
                raise LmdataError(f"{where}: field {path} is missing; the manifest is corrupt "
                                  "(re-run the ingest with --overwrite)")
            _explain(value[name], sub, where, path)
    elif isinstance(spec, (list, Many)):
        spec = spec if isinstance(spec, Many) else Many(spec[0])
        if not isinstance(value, list):
            raise fail(f"is {_json_type(value)}, expected a list")
        if len(value) < spec.at_least:
            raise fail(f"holds {len(value)} items, expected at least {spec.at_least}")
        for i, item in enumerate(value):
            _explain(item, spec.spec, where, f"{field}[{i}]")
    elif isinstance(spec, Each):
        if not isinstance(value, dict):
            raise fail(f"is {_json_type(value)}, expected an object")
        for key, item in value.items():
            _explain(item, spec.spec, where, f"{field}.{key}")
    else:
        problem = _leaf_problem(value, spec)
        if problem is not None:
            raise fail(problem)
