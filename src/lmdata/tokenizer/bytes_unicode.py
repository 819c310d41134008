"""GPT-2 file formats: the byte<->unicode table, ``vocab.json`` and ``merges.txt``.

GPT-2 shows every byte as a printable unicode character so that vocab and merges are
plain text: printable Latin-1 bytes stand for themselves, the other 68 bytes map to
U+0100 onwards, e.g. ``b" "`` -> ``"Ġ"`` and ``b"\\n"`` -> ``"Ċ"``.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

from lmdata.errors import LmdataError


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: byte value -> printable character, e.g. ``32 -> "Ġ"``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of ``bytes_to_unicode``: ``"Ġ" -> 32``."""
    return {ch: b for b, ch in bytes_to_unicode().items()}


def token_to_str(token: bytes) -> str:
    """Show a token's bytes in GPT-2 form: ``b" the" -> "Ġthe"``."""
    return codecs.charmap_decode(token, "strict", _byte_chars())[0]  # in C: a 20 MB token took 20 M Python steps


@lru_cache(maxsize=1)
def _byte_chars() -> str:
    """``bytes_to_unicode`` as a 256-character string, a ``str.translate`` table."""
    return "".join(bytes_to_unicode()[b] for b in range(256))


@lru_cache(maxsize=1)
def _char_bytes():
    """The inverse table, for ``codecs.charmap_encode``."""
    return codecs.charmap_build(_byte_chars())


def str_to_token(text: str, where: str) -> bytes:
    """Inverse of ``token_to_str``; ``where`` names the file for the error message."""
    try:
        return codecs.charmap_encode(text, "strict", _char_bytes())[0]
    except UnicodeEncodeError:
        raise LmdataError(f"{where}: {text[:60]!r} is not in GPT-2 byte-to-unicode form") from None


def vocab_json(vocab: dict[int, bytes]) -> str:
    """The text of ``vocab.json``: GPT-2 token string -> id, in id order."""
    return "".join(vocab_pieces(vocab))


def vocab_pieces(vocab: dict[int, bytes]) -> Iterator[str]:
    """``vocab_json`` a token at a time, to be written as made: a 20 MB run of spaces trains tokens of
    up to 16 M bytes, whose files held whole took 2.5 GB to save."""
    if len(set(vocab.values())) != len(vocab):  # two ids of one token: the dict keeps the last id (as json)
        data = {token_to_str(tok): i for i, tok in sorted(vocab.items())}
        yield json.dumps(data, ensure_ascii=False, indent=0) + "\n"
        return
    yield from json_object((token_to_str(tok), i) for i, tok in sorted(vocab.items()))
    yield "\n"


def json_object(items: Iterable[tuple[str, object]], indent: str = "") -> Iterator[str]:
    """``json.dumps(dict(items), ensure_ascii=False, indent=len(indent))`` in pieces, for an object nested
    under ``indent`` (its keys one space deeper unless ``indent`` is empty, json's indent=0)."""
    inner = indent + " " if indent else ""
    sep = "{\n" + inner
    for key, value in items:
        yield sep + json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
        sep = ",\n" + inner
    yield "{}" if sep.startswith("{") else "\n" + indent + "}"


def json_array(items: Iterable[object], indent: str) -> Iterator[str]:
    """``json_object``'s list: a JSON array nested under ``indent``, in pieces."""
    sep = "[\n" + indent + " "
    for value in items:
        yield sep + json.dumps(value, ensure_ascii=False)
        sep = ",\n" + indent + " "
    yield "[]" if sep.startswith("[") else "\n" + indent + "]"


def read_vocab(path: Path) -> dict[int, bytes]:
    """Read ``vocab.json`` written by us or by GPT-2/HF: id -> bytes."""
    return parse_vocab(_read_text(path), str(path))


def parse_vocab(text: str, where: str) -> dict[int, bytes]:
    """Parse the text of a ``vocab.json``; ``where`` names the file in errors."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LmdataError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise LmdataError(f"{where}: expected a JSON object mapping token strings to integer ids")
    return {i: str_to_token(s, where) for s, i in data.items()}


def merges_txt(merges: list[tuple[bytes, bytes]]) -> str:
    """The text of ``merges.txt``: a version header, then one ``a b`` pair per line in rank order."""
    return "".join(merges_pieces(merges))


def merges_pieces(merges: list[tuple[bytes, bytes]]) -> Iterator[str]:
    """``merges_txt`` a merge at a time."""
    yield "#version: 0.2\n"
    for a, b in merges:
        yield f"{token_to_str(a)} {token_to_str(b)}\n"


def read_merges(path: Path) -> list[tuple[bytes, bytes]]:
    """Read ``merges.txt`` (GPT-2 form; a ``#version`` first line is skipped)."""
    return parse_merges(_read_text(path), str(path))


def parse_merges(text: str, where: str) -> list[tuple[bytes, bytes]]:
    """Parse the text of a ``merges.txt``; ``where`` names the file in errors."""
    merges = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise LmdataError(f"{where}:{lineno}: expected two space-separated tokens, got {line!r}")
        merges.append((str_to_token(parts[0], where), str_to_token(parts[1], where)))
    return merges


def _read_text(path: Path) -> str:
    """A UTF-8 file's text, or an error naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LmdataError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise LmdataError(f"{path}: cannot read ({exc})") from None
