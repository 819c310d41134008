"""Hugging Face ``tokenizer.json``: the byte-level BPE subset, read and written.

What we write (and read back; GPT-2-style files from the Hub read too)::

    {"version": "1.0", "added_tokens": [{"id": 9999, "content": "<|endoftext|>", "special": true, ...}],
     "normalizer": null,
     "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": <pattern>}, "behavior": "Isolated", "invert": false},
         {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
         (GPT-2's pattern: the ByteLevel step alone, with "use_regex": true)
     "decoder": {"type": "ByteLevel", ...},
     "model": {"type": "BPE", "vocab": {"Ġthe": 262, ...}, "merges": ["Ġ t", ...], ...}}

A plain ``ByteLevel`` pre-tokenizer with ``use_regex: true`` is GPT-2's pattern; several isolating
Splits before ``ByteLevel(use_regex=false)`` (DeepSeek's shape) are a chain of regexes (``patterns``).  Anything
else -- WordPiece, Unigram, byte-fallback (SentencePiece-style) BPE, a normalizer, a prefix
space -- is a one-line ``LmdataError``: ids would differ from Hugging Face's.  A normalizer
that does nothing (an empty ``Sequence``, as DeepSeek's file has) is accepted.  Added tokens'
``lstrip``/``rstrip``/``single_word`` are kept (``added_tokens``); a malformed field is a one-line
error naming the file and the field.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import regex

from lmdata._eot import EOT
from lmdata.errors import LmdataError
from lmdata.tokenizer.added_tokens import FLAGS, is_space, is_word
from lmdata.tokenizer.bytes_unicode import json_array, json_object, str_to_token, token_to_str
from lmdata.tokenizer.patterns import GPT2_PATTERN, Pattern

WHOLE_PIECE = r"[\s\S]+"  # a chain step that matches each piece whole
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def to_json(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], special_ids: dict[str, int],
            pattern: Pattern, ignore_merges: bool = False, flags: dict[str, tuple[str, ...]] | None = None) -> str:
    """The text of a Hugging Face ``tokenizer.json`` that encodes like our tokenizer (``ignore_merges``:
    a pre-token that is a token is that token, as in tiktoken and Llama 3's file)."""
    return "".join(to_json_pieces(vocab, merges, special_ids, pattern, ignore_merges, flags))


def to_json_pieces(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], special_ids: dict[str, int],
                   pattern: Pattern, ignore_merges: bool = False, flags: dict | None = None) -> Iterator[str]:
    """``to_json`` a token at a time (``bytes_unicode.vocab_pieces``: tokens can be megabytes long)."""
    specials = set(special_ids.values())
    keys = ((token_to_str(tok) if i not in specials else tok.decode("utf-8"), i) for i, tok in sorted(vocab.items()))
    pairs = (f"{token_to_str(a)} {token_to_str(b)}" for a, b in merges)
    unique = _keys_unique(vocab, specials)  # (else a dict keeps the last id of a key, as json.dumps did)
    text = json.dumps(_skeleton(special_ids, pattern, ignore_merges, flags or {},
                                _VOCAB if unique else dict(keys), _MERGES), ensure_ascii=False, indent=1) + "\n"
    head, rest = text.split(json.dumps(_VOCAB), 1) if unique else ("", text)
    middle, tail = rest.split(json.dumps(_MERGES), 1)
    yield head
    if unique:
        yield from json_object(keys, "  ")
    yield middle
    yield from json_array(pairs, "  ")
    yield tail


def _keys_unique(vocab: dict[int, bytes], specials: set[int]) -> bool:
    """Whether model.vocab's keys (GPT-2 form; a special token as itself) are all different."""
    ordinary = {tok for i, tok in vocab.items() if i not in specials}
    if len(ordinary) != len(vocab) - len(specials) or len({vocab[i] for i in specials}) != len(specials):
        return False
    for i in specials:
        try:
            if str_to_token(vocab[i].decode("utf-8"), "") in ordinary:
                return False
        except LmdataError:  # not in GPT-2 form: no ordinary key is it
            pass
    return True


_VOCAB, _MERGES = "\x00lmdata: model.vocab\x00", "\x00lmdata: model.merges\x00"  # where the pieces go


def _skeleton(special_ids: dict[str, int], pattern: Pattern, ignore_merges: bool, flags: dict,
              vocab: object, merges: object) -> dict:
    """The tokenizer.json object, with ``vocab`` and ``merges`` as given."""
    added = [{"id": i, "content": tok, **{f: f in flags.get(tok, ()) for f in ("single_word", "lstrip", "rstrip")},
              "normalized": "normalized" in flags.get(tok, ()), "special": "nonspecial" not in flags.get(tok, ())}
             for tok, i in sorted(special_ids.items(), key=lambda kv: kv[1])]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(pattern),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
            # special tokens too: `tokenizers` gives an added token missing from model.vocab the next free
            # id, whatever its "id" says (right only when the specials happen to come last)
            "vocab": vocab,
            "merges": merges,
        },
    }


def _pre_tokenizer(pattern: Pattern) -> dict:
    """GPT-2's own form (ByteLevel with its built-in regex, which other tools special-case) or a Split."""
    if pattern.name == "gpt2":
        return _BYTE_LEVEL | {"use_regex": True}
    return {"type": "Sequence", "pretokenizers": [
        *({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}
          for p in (pattern.splits or [pattern.hf_text])),
        _BYTE_LEVEL,
    ]}


def config_json(special_ids: dict[str, int], eot_token: str = EOT) -> str:
    """``tokenizer_config.json``: tells ``AutoTokenizer`` to use the fast tokenizer of tokenizer.json."""
    data: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  "model_max_length": 1 << 30}
    if eot_token in special_ids:
        data |= {"bos_token": eot_token, "eos_token": eot_token, "unk_token": eot_token}
    return json.dumps(data, indent=2) + "\n"


def read(path: str | Path) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]], list[str], str, bool, dict]:
    """(vocab, merges, special tokens, pattern, ignore_merges, added-token flags) of a Hugging Face byte-level BPE
    ``tokenizer.json``; flags: ``{token: ("lstrip", ...)}`` (``added_tokens``)."""
    path = Path(path)
    data = _load(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        raise LmdataError(f"{path}: no \"model\" object; not a Hugging Face tokenizer.json")
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind != "BPE":
        raise LmdataError(f"{path}: model type {kind}; lmdata imports byte-level BPE only (not WordPiece or Unigram)")
    if model.get("byte_fallback"):
        raise LmdataError(f"{path}: byte-fallback BPE (SentencePiece-style) cannot be represented; "
                          "lmdata imports byte-level BPE only")
    if not _no_op_normalizer(data.get("normalizer")):
        kind = data["normalizer"].get("type") if isinstance(data["normalizer"], dict) else data["normalizer"]
        raise LmdataError(f"{path}: normalizer {kind} changes the text before encoding; lmdata cannot represent "
                          "it (only none, or an empty Sequence)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise LmdataError(f"{path}: model.{key} is set; lmdata imports byte-level BPE only")
    if model.get("dropout"):  # (tokenizers then skips merges at random when it encodes)
        raise LmdataError(f"{path}: model.dropout is {model['dropout']}; lmdata encodes without BPE dropout, "
                          "set it to null")
    pattern = _pattern(data.get("pre_tokenizer"), path)
    vocab = _vocab(model.get("vocab"), path, _added_contents(data.get("added_tokens")))
    merges = model.get("merges", [])
    if not isinstance(merges, list):
        raise LmdataError(f"{path}: model.merges is a {type(merges).__name__}; expected a list of merges")
    merges = [_merge(m, path) for m in merges]
    specials, flags = _added_tokens(data.get("added_tokens"), vocab, path)
    added = _post_processor_tokens(data.get("post_processor"))
    if added:  # (Llama 3's file adds <|begin_of_text|>): said, not silently dropped
        warnings.warn(f"{path}: its post_processor adds {', '.join(map(repr, added))} to each text Hugging Face encodes "
                      "with add_special_tokens=True; lmdata's ids are those of add_special_tokens=False (a store "
                      "ends each document with its eot token instead)", stacklevel=3)
    return vocab, merges, specials, pattern, bool(model.get("ignore_merges")), flags


def _post_processor_tokens(post: object) -> list[str]:
    """The tokens a ``post_processor`` adds around a single text (TemplateProcessing's ``single``, Bert's and
    RoBERTa's cls/sep; a Sequence's steps in turn); ByteLevel adds none (it trims offsets)."""
    if not isinstance(post, dict):
        return []
    kind = post.get("type")
    if kind == "Sequence":
        return [t for step in post.get("processors") or [] for t in _post_processor_tokens(step)]
    if kind == "TemplateProcessing":
        return [piece["SpecialToken"].get("id", "?") for piece in post.get("single") or []
                if isinstance(piece, dict) and isinstance(piece.get("SpecialToken"), dict)]
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [pair[0] for pair in (post.get("cls"), post.get("sep")) if isinstance(pair, list) and pair]
    return []


def _load(path: Path) -> object:
    """The parsed JSON of ``path``, or a one-line error naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LmdataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LmdataError(f"{path}: is a directory; give the tokenizer.json file") from None
    except RecursionError:
        raise LmdataError(f"{path}: JSON nested too deeply to be a tokenizer.json") from None
    except (OSError, ValueError) as exc:
        raise LmdataError(f"{path}: not a readable JSON tokenizer.json ({str(exc).splitlines()[0]}); "
                          "is the file complete?") from None


def _added_contents(raw: object) -> set[tuple[str, int]]:
    """(content, id) of each well-formed added token (the rest is checked by ``_added_tokens``)."""
    return {(t["content"], t["id"]) for t in raw if isinstance(t, dict) and isinstance(t.get("content"), str)
            and _is_id(t.get("id"))} if isinstance(raw, list) else set()


def _vocab(raw: object, path: Path, added: set[tuple[str, int]] = frozenset()) -> dict[int, bytes]:
    """id -> bytes of ``model.vocab``: a token-string -> integer-id object, each id once.  An added token's
    entry may be its text as is (not GPT-2's byte form: ``<|im start|>``, DeepSeek's ``<｜begin▁of▁sentence｜>``),
    as ``tokenizers`` writes and reads it."""
    if not isinstance(raw, dict):
        raise LmdataError(f"{path}: model.vocab is {'missing' if raw is None else 'a ' + type(raw).__name__}; "
                          "expected an object mapping token strings to integer ids")
    vocab: dict[int, bytes] = {}
    names: dict[int, str] = {}
    for s, i in raw.items():
        if not _is_id(i):
            raise LmdataError(f"{path}: model.vocab gives {s!r} the id {json.dumps(i)[:40]}; ids are integers "
                              "from 0 to 1114111")
        if i in names:
            raise LmdataError(f"{path}: model.vocab gives id {i} to both {names[i]!r} and {s!r}; each id once")
        names[i] = s
        # an added token's entry as itself first: its text may be GPT-2 byte form too ('‹|é|>' is), and wrong
        vocab[i] = s.encode("utf-8") if (s, i) in added else str_to_token(s, f"{path} (model.vocab)")
    return vocab


def _is_id(i: object) -> bool:
    return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 0x110000


def _added_tokens(raw: object, vocab: dict[int, bytes], path: Path) -> tuple[list[str], dict]:
    """The added tokens (special tokens to us; ``"special": false`` is the flag ``nonspecial``), each entered into
    ``vocab`` at its id, and their flags."""
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise LmdataError(f"{path}: added_tokens is a {type(raw).__name__}; expected a list of "
                          "{\"id\": ..., \"content\": ...} objects")
    by_id: dict[int, str] = {}
    flags: dict[str, tuple[str, ...]] = {}
    normalized: dict[str, bool] = {}
    by_bytes = {b: i for i, b in vocab.items()}
    ids_of: dict[str, int] = {}
    for n, tok in enumerate(raw):
        field = f"added_tokens[{n}]"
        if not isinstance(tok, dict) or not _is_id(tok.get("id")):
            got = json.dumps(tok.get("id") if isinstance(tok, dict) else tok)[:40]
            raise LmdataError(f"{path}: {field} has no \"id\" that is an integer 0..1114111 (got {got})")
        content, i = tok.get("content"), tok["id"]
        if not isinstance(content, str) or not content:
            raise LmdataError(f"{path}: {field} (id {i}) has no non-empty string \"content\"")
        given = {f for f in FLAGS[:3] if tok.get(f)}  # (lstrip, rstrip, single_word: Hugging Face's own keys)
        given |= {"nonspecial"} if tok.get("special") is False else set()
        if given:
            flags[content] = tuple(f for f in FLAGS if f in given)
        normalized[content] = bool(tok.get("normalized", not tok.get("special")))
        if by_id.get(i, content) != content:
            raise LmdataError(f"{path}: {field} {content!r} has id {i}, which added token {by_id[i]!r} has too")
        if ids_of.get(content, i) != i:
            raise LmdataError(f"{path}: {field} {content!r} is given two ids ({ids_of[content]} and {i})")
        raw_content = content.encode("utf-8")
        if i not in by_id and vocab.get(i, raw_content) != raw_content:
            raise LmdataError(f"{path}: {field} {content!r} has id {i}, which model.vocab gives to "
                              f"{vocab[i]!r}")
        if by_bytes.get(raw_content, i) != i:  # (merges would make the added token's id, not the vocab's)
            raise LmdataError(f"{path}: {field} {content!r} (id {i}) has the bytes of model.vocab's id "
                              f"{by_bytes[raw_content]}; lmdata cannot give one token two ids")
        by_id[i], ids_of[content] = content, i
    for i, content in by_id.items():
        vocab[i] = content.encode("utf-8")
    if _two_passes(normalized, flags):  # (DeepSeek-V3's file): the second pass's tokens flagged "normalized"
        for content in (t for t, n in normalized.items() if n):
            flags[content] = tuple(f for f in FLAGS if f in {*flags.get(content, ()), "normalized"})
    return [by_id[i] for i in sorted(by_id)], flags


def _two_passes(normalized: dict[str, bool], flags: dict[str, tuple[str, ...]]) -> bool:
    """Whether `tokenizers`' two passes (the added tokens with normalized=false first, then the others in what is
    left) can differ from one pass over all of them: a token of one kind can overlap one of the other (an lstrip
    or rstrip one counting the whitespace it takes), or a single_word token of one kind can touch a token of the
    other that ends in a word character. Only then are they kept apart (``added_tokens``: its "normalized"
    flag), so every other file imports with the hash it had."""
    plain = [t for t, n in normalized.items() if not n]
    norm = [t for t, n in normalized.items() if n]
    return any(_can_overlap(a, b) or (flags and (_word_edge(a, b, flags) or _strip_edge(a, b, flags)))
               for a in plain for b in norm)


def _can_overlap(a: str, b: str) -> bool:
    """Whether occurrences of ``a`` and ``b`` can share characters in some text."""
    if a in b or b in a:
        return True
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))


def _strip_edge(a: str, b: str, flags: dict[str, tuple[str, ...]]) -> bool:
    """Whether an lstrip (rstrip) one of ``a``, ``b`` may take whitespace that ends (starts) the other."""
    return any(("lstrip" in flags.get(x, ()) and is_space(y[-1])) or ("rstrip" in flags.get(x, ()) and is_space(y[0]))
               for x, y in ((a, b), (b, a)))


def _word_edge(a: str, b: str, flags: dict[str, tuple[str, ...]]) -> bool:
    """Whether a single_word one of ``a``, ``b`` may sit next to the other's word-character end."""
    return any("single_word" in flags.get(x, ()) and (is_word(y[0]) or is_word(y[-1])) for x, y in ((a, b), (b, a)))


def _no_op_normalizer(norm: object) -> bool:
    """None, or a Sequence of no-op normalizers (an empty ``{"type": "Sequence", "normalizers": []}``)."""
    if norm is None:
        return True
    return (isinstance(norm, dict) and norm.get("type") == "Sequence" and isinstance(norm.get("normalizers"), list)
            and all(map(_no_op_normalizer, norm["normalizers"])))


def _merge(m: object, path: Path) -> tuple[bytes, bytes]:
    parts = m.split(" ") if isinstance(m, str) else m
    if not isinstance(parts, list) or len(parts) != 2 or not all(isinstance(p, str) and p for p in parts):
        raise LmdataError(f"{path}: model.merges entry {json.dumps(m)[:60]} is not two tokens")
    return str_to_token(parts[0], f"{path} (model.merges)"), str_to_token(parts[1], f"{path} (model.merges)")


def _pattern(pre: object, path: Path) -> str:
    """The regex of a ByteLevel pre-tokenizer, alone or after isolating regex Splits (several: a chain)."""
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise LmdataError(f"{path}: pre_tokenizer {json.dumps(pre)[:60]} is not an object (or a Sequence of them)")
    if not steps or steps[-1].get("type") != "ByteLevel":
        raise LmdataError(f"{path}: pre_tokenizer is not byte-level (need ByteLevel, optionally after regex Splits)")
    last = steps[-1]
    if last.get("add_prefix_space"):
        raise LmdataError(f"{path}: ByteLevel add_prefix_space=true cannot be represented; set it false")
    if len(steps) == 1 and last.get("use_regex", True):
        return GPT2_PATTERN
    for i, step in enumerate(steps[:-1]):  # (the field named: a truncated JSON dump had named nothing)
        if step.get("type") != "Split":
            raise LmdataError(f"{path}: pre_tokenizer.pretokenizers[{i}] is {step.get('type')}; lmdata supports "
                              "regex Splits before ByteLevel")
    if len(steps) == 1:
        raise LmdataError(f"{path}: pre_tokenizer is ByteLevel with use_regex=false and no Split (the whole text one "
                          "pre-token); lmdata supports ByteLevel(use_regex=true), or regex Splits before it")
    if last.get("use_regex", True):
        raise LmdataError(f"{path}: pre_tokenizer.pretokenizers[{len(steps) - 1}] is ByteLevel with use_regex=true "
                          "after Split steps; lmdata supports ByteLevel(use_regex=false) after Splits")
    regexes = [_split_regex(step, i, path) for i, step in enumerate(steps[:-1])]
    try:
        try:
            return Pattern.get(regexes).text
        except LmdataError:
            if len(regexes) > 1:
                raise
            # one Split whose matches leave text between them: Hugging Face keeps that text as pieces, which
            # a chain does (a single regex's pieces must cover the text); the second step keeps every piece whole
            return Pattern.get([regexes[0], WHOLE_PIECE]).text
    except LmdataError as exc:  # (worded for --pattern, which this file's user did not give)
        why = str(exc).removeprefix(f"--pattern {regexes[0]!r}: ")
        raise LmdataError(f"{path}: pre_tokenizer's Split regex cannot be used: {why}") from None


def _split_regex(step: dict, i: int, path: Path) -> str:
    """The regex of an isolating Split step, or a one-line error naming the field."""
    field = f"pre_tokenizer.pretokenizers[{i}]"
    if step.get("type") != "Split":
        raise LmdataError(f"{path}: {field} is {step.get('type')}; lmdata supports regex Splits before ByteLevel")
    pat = step.get("pattern")
    regex_text = pat.get("Regex") if isinstance(pat, dict) else None
    if not isinstance(regex_text, str) or not regex_text:
        raise LmdataError(f"{path}: {field}.pattern is {json.dumps(step.get('pattern'))[:60]}; lmdata supports a "
                          "{\"Regex\": ...} pattern")
    try:
        regex.compile(regex_text)
    except regex.error as exc:
        raise LmdataError(f"{path}: {field}.pattern.Regex {regex_text!r} is not a valid regex ({exc})") from None
    if step.get("behavior") != "Isolated":
        raise LmdataError(f"{path}: {field}.behavior is {step.get('behavior')!r}; lmdata supports \"Isolated\" only")
    if step.get("invert"):
        raise LmdataError(f"{path}: {field}.invert is true; lmdata supports invert=false only")
    return regex_text
