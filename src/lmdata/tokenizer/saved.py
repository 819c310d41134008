"""A saved tokenizer directory, written atomically and checked on load.

    <dir>/vocab.json             GPT-2 form: {"Ġthe": 262, ...}, every id incl. special tokens
    <dir>/merges.txt             GPT-2 form: "#version: 0.2", then "Ġ t" per merge, in rank order
    <dir>/lmdata_tokenizer.json  ours: {"format": "lmdata-bpe", "version": 2, "pattern": <regex>,
                                 "special_tokens": ["<|endoftext|>"], "vocab_size": 10000,
                                 "files": {"vocab.json": <sha256>, "merges.txt": <sha256>},
                                 "hash": "sha256:<hex>"}
                                 (+ "bpe": "ranks" for tiktoken's BPE over ranks, ``Tokenizer(ranked=True)``,
                                 or "words" for Hugging Face's ignore_merges; + "special_flags":
                                 {"<mask>": ["lstrip"]} for Hugging Face's added-token flags, in the hash;
                                 + "eot_token": "<|end_of_text|>" when documents end with another token
                                 than <|endoftext|>, in the hash)
    <dir>/tokenizer.json         Hugging Face's format, derived from the above (``hf.py``), so
    <dir>/tokenizer_config.json  ``AutoTokenizer.from_pretrained(dir)`` loads the directory

Version 1 directories kept our metadata in ``tokenizer.json`` (GPT-2 pattern only); they
still load.  ``hash`` identifies the tokenizer in store manifests: a sha256 over the hash
version, the pattern, the special tokens and the two files' digests, so equal content
gives an equal hash wherever it is saved, and a GPT-2-pattern tokenizer keeps the hash it
had under version 1.  The Hugging Face files are not part of it (they follow from it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from lmdata._ownership import describe_foreign, foreign_entries, refuse_foreign
from lmdata.errors import LmdataError
from lmdata.io import atomic
from lmdata.tokenizer.patterns import GPT2_PATTERN

FORMAT = "lmdata-bpe"
VERSION = 2
VERSIONS = (1, 2)  # what this lmdata reads
HASH_VERSION = 1  # the version inside the hash: unchanged, so stores keep their tokenizer hash
METADATA = "lmdata_tokenizer.json"
LEGACY_METADATA = "tokenizer.json"  # version 1's metadata, under the name Hugging Face's file has now
HF_FILES = ("tokenizer.json", "tokenizer_config.json")
Text = str | Iterable[str]  # a file's text, whole or in pieces
FILES = ("vocab.json", "merges.txt", METADATA, *HF_FILES)  # what ``write_dir`` writes


def content_hash(
    vocab_text: str, merges_text: str, special_tokens: list[str], pattern: str = GPT2_PATTERN, bpe: str = "merges",
    flags: dict | None = None, eot_token: str | None = None,
) -> tuple[str, dict[str, str]]:
    """The tokenizer's hash and the per-file digests it is made of (``bpe``, the special tokens' ``flags`` and
    ``eot_token`` count only when not "merges" / not empty / not None, so every other tokenizer keeps its hash)."""
    files = {
        "vocab.json": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
        "merges.txt": hashlib.sha256(merges_text.encode("utf-8")).hexdigest(),
    }
    return _digest(files, special_tokens, pattern, bpe, flags, eot_token), files


def _digest(files: dict[str, str], special_tokens: list[str], pattern: str, bpe: str, flags: dict | None,
            eot_token: str | None = None) -> str:
    """``content_hash`` of the files' digests."""
    header = json.dumps([FORMAT, HASH_VERSION, pattern, special_tokens, files] + ([f"bpe:{bpe}"] if bpe != "merges" else [])
                        + ([{"special_flags": {t: list(f) for t, f in flags.items()}}] if flags else [])
                        + ([{"eot_token": eot_token}] if eot_token is not None else []),
                        sort_keys=True)
    return "sha256:" + hashlib.sha256(header.encode("utf-8")).hexdigest()


def _read_meta(path: Path) -> tuple[Path, dict] | None:
    """(metadata file, its content) of an lmdata tokenizer directory, or None if it is not one."""
    for name, versions in ((METADATA, VERSIONS), (LEGACY_METADATA, (1,))):
        file = Path(path) / name
        try:
            meta = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("version") in versions:
            return file, meta
    return None


def _why_not_ours(file: Path) -> str:
    """Why a metadata file that is there did not read as ours: unreadable, not JSON, or another format."""
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"cannot be read ({exc.strerror}); check the file's permissions"
    except (ValueError, RecursionError) as exc:
        return f"not valid JSON ({exc}); the tokenizer directory is damaged, save or train it again"
    return f"not an lmdata tokenizer (format {FORMAT!r}, version 1 or 2 expected)"


def is_lmdata_tokenizer_dir(path: str | Path) -> bool:
    """Whether ``path`` holds our metadata file (either name), parsed, with our format and a known version."""
    return Path(path).is_dir() and _read_meta(Path(path)) is not None


def check_replaceable(out: Path, flag: str = "--out") -> None:
    """Refuse ``out`` unless it is missing, empty, or an lmdata tokenizer holding only our files."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LmdataError(f"{flag} {out}: exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not is_lmdata_tokenizer_dir(out):
        raise LmdataError(
            f"{flag} {out}: is a non-empty directory that is not an lmdata tokenizer (it holds "
            f"{describe_foreign(out, sorted(p.name for p in out.iterdir()))}); lmdata never replaces "
            f"another tool's files -- choose another {flag}"
        )
    refuse_foreign(out, foreign_entries(out, set(FILES).__contains__), flag, "a tokenizer directory")


def write_dir(out: Path, vocab_text: Text, merges_text: Text, special_tokens: list[str], vocab_size: int,
              pattern: str = GPT2_PATTERN, extra: dict[str, Text] | None = None, bpe: str = "merges",
              flags: dict | None = None, eot_token: str | None = None) -> str:
    """Write the files (``extra``: name -> text, the Hugging Face ones) into a temp dir beside
    ``out``, then rename it into place.  A text is a str or an iterable of pieces, written (and
    hashed) as they come, so no file is held whole.

    An lmdata tokenizer directory at ``out`` holding only our files is replaced; any
    other non-empty directory is left alone and reported (``check_replaceable``).  Returns the hash.
    """
    out = Path(out)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_dir(out)
    try:
        files = {name: _write(tmp / name, text) for name, text in (("vocab.json", vocab_text),
                                                                   ("merges.txt", merges_text))}
        digest = _digest(files, special_tokens, pattern, bpe, flags, eot_token)
        _write(tmp / METADATA, json.dumps(_meta(files, digest, special_tokens, vocab_size, pattern, bpe, flags) |
                                          ({"eot_token": eot_token} if eot_token is not None else {}),
                                          indent=2, ensure_ascii=False) + "\n")
        for name, text in (extra or {}).items():
            _write(tmp / name, text)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return digest


def _write(path: Path, text: Text) -> str:
    """Write ``text`` (a str or pieces) as UTF-8, fsynced; returns its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        def put(pieces: list[str]) -> None:
            data = "".join(pieces).encode("utf-8")
            digest.update(data)
            f.write(data)

        pending: list[str] = []
        size = 0
        for piece in [text] if isinstance(text, str) else text:
            pending.append(piece)
            size += len(piece)
            if size >= 1 << 20:  # ~1 MB at a time
                put(pending)
                pending, size = [], 0
        put(pending)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def _meta(files: dict[str, str], digest: str, special_tokens: list[str], vocab_size: int, pattern: str, bpe: str,
          flags: dict | None) -> dict:
    """The content of ``lmdata_tokenizer.json``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "pattern": pattern,
        "special_tokens": special_tokens,
        "vocab_size": vocab_size,
        "files": files,
        "hash": digest,
    } | ({"bpe": bpe} if bpe != "merges" else {}) | ({"special_flags": {t: list(f) for t, f in flags.items()}}
                                                      if flags else {})


def read_dir(path: Path) -> tuple[str, str, list[str], str, str, str, dict, str | None]:
    """Read and check a saved tokenizer: (vocab text, merges text, special tokens, pattern, hash, bpe,
    special-token flags, the eot token if chosen)."""
    path = Path(path)
    if not path.is_dir() or not any((path / name).exists() for name in (*FILES[:3], "tokenizer.json")):
        raise LmdataError(f"{path}: not a tokenizer directory (expected {', '.join(FILES[:3])})")
    found = _read_meta(path)
    if found is None:
        if not (path / METADATA).is_file():
            raise LmdataError(f"{path / METADATA}: missing; the tokenizer directory is incomplete, save or train it "
                              "again (a Hugging Face tokenizer.json is brought in with `lmdata tokenizer import`)")
        raise LmdataError(f"{path / METADATA}: {_why_not_ours(path / METADATA)}")
    meta_file, meta = found
    for name in FILES[:2]:
        if not (path / name).is_file():
            raise LmdataError(f"{path / name}: missing; the tokenizer directory is incomplete, save or train it again")
    try:
        texts = {name: (path / name).read_text(encoding="utf-8") for name in ("vocab.json", "merges.txt")}
    except (OSError, ValueError) as exc:
        raise LmdataError(f"{path}: cannot read tokenizer files ({exc})") from exc
    pattern = meta.get("pattern")
    if not isinstance(pattern, str) or (meta.get("version") == 1 and pattern != GPT2_PATTERN):
        raise LmdataError(f"{meta_file}: unsupported pre-tokenization pattern")
    specials = meta.get("special_tokens")
    if not isinstance(specials, list) or not all(isinstance(t, str) for t in specials):
        raise LmdataError(f"{meta_file}: special_tokens must be a list of strings")
    bpe = meta.get("bpe", "merges")
    if bpe not in ("merges", "ranks", "words"):
        raise LmdataError(f"{meta_file}: \"bpe\" must be \"merges\", \"ranks\" or \"words\", not {bpe!r}")
    flags = meta.get("special_flags") or {}
    if not isinstance(flags, dict):
        raise LmdataError(f"{meta_file}: \"special_flags\" must be an object {{token: [flags]}}")
    eot = meta.get("eot_token")
    if eot is not None and eot not in specials:
        raise LmdataError(f"{meta_file}: \"eot_token\" {eot!r} is not one of its special_tokens")
    digest, files = content_hash(texts["vocab.json"], texts["merges.txt"], specials, pattern, bpe, flags, eot)
    recorded = meta.get("files") or {}
    for name, sha in files.items():
        if recorded.get(name) != sha:
            raise LmdataError(f"{path / name}: content does not match the hash in {meta_file.name}; the file was changed")
    if meta.get("hash") != digest:
        raise LmdataError(f"{meta_file}: recorded hash does not match the content; the file was changed")
    return texts["vocab.json"], texts["merges.txt"], specials, pattern, digest, bpe, flags, eot
