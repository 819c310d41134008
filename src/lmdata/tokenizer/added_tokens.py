"""Hugging Face's added-token flags, as ``tokenizers`` applies them when it splits text on added tokens.

    lstrip       the token takes the whitespace just before it (RoBERTa's ``<mask>``: "a <mask>" is a, <mask>)
    rstrip       the token takes the whitespace just after it
    single_word  the token counts only where no word character touches it ("x<w>" is x, <, w, >)
    nonspecial   Hugging Face's ``"special": false``: matched in plain text too (``encode_ordinary``, so in
                 every document a store holds), and not dropped by ``decode(skip_special_tokens=True)``
    normalized   Hugging Face's ``"normalized": true``, kept only where its two passes differ from one: the
                 tokens without it are split off first, these in the text left between them

Whitespace is Unicode's White_Space and a word character Rust's ``\\w`` (alphabetic, marks, decimal
digits, connector punctuation, joiners), as in ``tokenizers``' ``added_vocabulary.rs``.  Matches are
found leftmost-longest; a single_word match that a word character touches is skipped (the text
stays ordinary text), and an lstrip never takes whitespace a previous token took.
"""

from __future__ import annotations

import re

import regex

FLAGS = ("lstrip", "rstrip", "single_word", "nonspecial", "normalized")
_WORD = regex.compile(r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]")
_SPACE_BEFORE = regex.compile(r"(?r)\p{White_Space}*")  # matched backwards from endpos
_SPACE_AFTER = regex.compile(r"\p{White_Space}*")


def is_word(ch: str) -> bool:
    """Whether ``ch`` is a word character to ``tokenizers`` (Rust's ``\\w``)."""
    return _WORD.match(ch) is not None


def is_space(ch: str) -> bool:
    """Whether ``ch`` is whitespace to ``tokenizers`` (Unicode White_Space, Rust's ``\\s``)."""
    return _SPACE_AFTER.fullmatch(ch) is not None


def check_flags(flags: dict[str, list[str]] | None, special_tokens: list[str]) -> dict[str, tuple[str, ...]]:
    """``{token: flags}`` with each token one of ``special_tokens``, each flag one of FLAGS, in FLAGS' order
    (tokens without flags left out)."""
    from lmdata.errors import LmdataError

    out = {}
    for tok, names in (flags or {}).items():
        if tok not in special_tokens or not isinstance(names, (list, tuple)) or not set(names) <= set(FLAGS):
            raise LmdataError(f"special token flags {tok!r}: {names!r}; flags are {', '.join(FLAGS)} "
                              "of one of the special tokens")
        if names:
            out[tok] = tuple(f for f in FLAGS if f in names)
    return out


class AddedSplitter:
    """Splits text into ordinary pieces and added-token ids the way ``tokenizers`` does."""

    def __init__(self, special_ids: dict[str, int], flags: dict[str, tuple[str, ...]]) -> None:
        self.ids = special_ids
        self.flags = flags
        later = {t: i for t, i in special_ids.items() if "normalized" in flags.get(t, ())}
        self.passes = None if not later or len(later) == len(special_ids) else (  # Hugging Face's two passes
            AddedSplitter({t: i for t, i in special_ids.items() if t not in later}, flags), AddedSplitter(later, flags))
        ordered = sorted(special_ids, key=len, reverse=True)  # leftmost, then longest
        self.regex = re.compile("|".join(map(re.escape, ordered)))

    def split(self, text: str) -> list[str | int]:
        """Ordinary pieces (str) and added-token ids (int), in order; empty pieces left out."""
        if self.passes is not None:  # the second pass splits each piece the first one left, on its own
            first, second = self.passes
            return [p for part in first.split(text) for p in ([part] if isinstance(part, int) else second.split(part))]
        out: list[str | int] = []
        done = 0  # the end of the previous token, with what its rstrip took
        for m in self.regex.finditer(text):
            start, stop = m.span()
            flags = self.flags.get(m.group(), ())
            if "single_word" in flags and ((start > 0 and _WORD.match(text, start - 1))
                                           or (stop < len(text) and _WORD.match(text, stop))):
                continue
            if "lstrip" in flags:
                start = max(_SPACE_BEFORE.match(text, 0, start).start(), done)
            if "rstrip" in flags:
                stop = _SPACE_AFTER.match(text, stop).end()
            if done < start:
                out.append(text[done:start])
            out.append(self.ids[m.group()])
            done = stop
        if done < len(text):
            out.append(text[done:])
        return out

    def encode(self, text: str, encode_into) -> list[int]:
        """The ids of ``text``: added tokens split off here, ``encode_into(piece, ids)`` for the rest."""
        ids: list[int] = []
        for part in self.split(text) if any(tok in text for tok in self.ids) else [text]:
            if isinstance(part, int):
                ids.append(part)
            else:
                encode_into(part, ids)
        return ids

    def cut_ok(self, text: str, pos: int) -> bool:
        """Whether cutting ``text`` at ``pos`` leaves the split unchanged: no lstrip (single_word) token
        starts, and no rstrip (single_word) token ends, in the whitespace around the cut, ``[left, right]``."""
        left = _SPACE_BEFORE.match(text, 0, pos).start()
        right = _SPACE_AFTER.match(text, pos).end()
        for tok, flags in self.flags.items():
            if ("lstrip" in flags or "single_word" in flags) and text.find(tok, left, right + len(tok)) >= 0:
                return False
            if ("rstrip" in flags or "single_word" in flags) and text.find(tok, max(0, left - len(tok)), right) >= 0:
                return False
        return True

    def safe_cut(self, text: str, cut: int, find) -> int:
        """``cut`` (``find(text)``'s) or an earlier one that ``cut_ok`` takes, or 0 after a few tries (the
        caller then waits for more text)."""
        for _ in range(8):
            if not cut or self.cut_ok(text, cut):
                return cut
            cut = find(text[:cut])
        return 0
