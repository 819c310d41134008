"""A saved tokenizer directory, written atomically and checked on load.

    <dir>/vocab.json      GPT-2 form: {"Ġthe": 262, ...}, every id incl. special tokens
    <dir>/merges.txt      GPT-2 form: "#version: 0.2", then "Ġ t" per merge, in rank order
    <dir>/tokenizer.json  {"format": "lmdata-bpe", "version": 1, "pattern": <GPT-2 regex>,
                           "special_tokens": ["<|endoftext|>"], "vocab_size": 10000,
                           "files": {"vocab.json": <sha256>, "merges.txt": <sha256>},
                           "hash": "sha256:<hex>"}

``hash`` identifies the tokenizer in store manifests: a sha256 over the format version,
the pattern, the special tokens and the two files' digests, so equal content gives an
equal hash wherever it is saved.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from lmdata._ownership import describe_foreign, foreign_entries, refuse_foreign
from lmdata.errors import LmdataError
from lmdata.tokenizer.pretokenize import GPT2_PATTERN

FORMAT = "lmdata-bpe"
VERSION = 1
FILES = ("vocab.json", "merges.txt", "tokenizer.json")


def content_hash(vocab_text: str, merges_text: str, special_tokens: list[str]) -> tuple[str, dict[str, str]]:
    """The tokenizer's hash and the per-file digests it is made of."""
    files = {
        "vocab.json": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
        "merges.txt": hashlib.sha256(merges_text.encode("utf-8")).hexdigest(),
    }
    header = json.dumps([FORMAT, VERSION, GPT2_PATTERN, special_tokens, files], sort_keys=True)
    return "sha256:" + hashlib.sha256(header.encode("utf-8")).hexdigest(), files


def is_lmdata_tokenizer_dir(path: Path) -> bool:
    """Whether ``path`` holds our metadata file, parsing, with our format and version fields (a
    Hugging Face folder's ``tokenizer.json`` is not ours: only these fields make a directory ours)."""
    try:
        meta = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT and isinstance(meta.get("version"), int)


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


def write_dir(out: Path, vocab_text: str, merges_text: str, special_tokens: list[str], vocab_size: int) -> str:
    """Write the three files into a temp dir beside ``out``, then rename it into place.

    An lmdata tokenizer directory at ``out`` holding only our files is replaced; any
    other non-empty directory is left alone and reported (``check_replaceable``).  Returns the hash.
    """
    out = Path(out)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    digest, files = content_hash(vocab_text, merges_text, special_tokens)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "pattern": GPT2_PATTERN,
        "special_tokens": special_tokens,
        "vocab_size": vocab_size,
        "files": files,
        "hash": digest,
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name, text in (("vocab.json", vocab_text), ("merges.txt", merges_text),
                           ("tokenizer.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")):
            with open(tmp / name, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
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


def read_dir(path: Path) -> tuple[str, str, list[str], str]:
    """Read and check a saved tokenizer: (vocab text, merges text, special tokens, hash)."""
    path = Path(path)
    if not path.is_dir():
        raise LmdataError(f"{path}: not a tokenizer directory (expected {', '.join(FILES)})")
    for name in FILES:
        if not (path / name).is_file():
            raise LmdataError(f"{path / name}: missing; the tokenizer directory is incomplete, save or train it again")
    try:
        meta = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        texts = {name: (path / name).read_text(encoding="utf-8") for name in ("vocab.json", "merges.txt")}
    except (OSError, ValueError) as exc:
        raise LmdataError(f"{path}: cannot read tokenizer files ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise LmdataError(f"{path / 'tokenizer.json'}: not an lmdata tokenizer (format {FORMAT!r} expected)")
    if meta.get("version") != VERSION:
        raise LmdataError(f"{path / 'tokenizer.json'}: version {meta.get('version')!r}, this lmdata reads {VERSION}")
    if meta.get("pattern") != GPT2_PATTERN:
        raise LmdataError(f"{path / 'tokenizer.json'}: unsupported pre-tokenization pattern")
    specials = meta.get("special_tokens")
    if not isinstance(specials, list) or not all(isinstance(t, str) for t in specials):
        raise LmdataError(f"{path / 'tokenizer.json'}: special_tokens must be a list of strings")
    digest, files = content_hash(texts["vocab.json"], texts["merges.txt"], specials)
    recorded = meta.get("files") or {}
    for name, sha in files.items():
        if recorded.get(name) != sha:
            raise LmdataError(f"{path / name}: content does not match the hash in tokenizer.json; the file was changed")
    if meta.get("hash") != digest:
        raise LmdataError(f"{path / 'tokenizer.json'}: recorded hash does not match the content; the file was changed")
    return texts["vocab.json"], texts["merges.txt"], specials, digest
