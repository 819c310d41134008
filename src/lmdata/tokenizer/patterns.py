"""Pre-tokenizer patterns: GPT-2's (the default), GPT-4's cl100k and o200k, or any regex.

A pattern is a property of a tokenizer and part of its hash.  The three named patterns
have hand-written C pre-tokenizers (``_fastbpe``; any other regex of the family tokenizer
regexes are written in is compiled for its C matcher, ``regex_program``) and a "chunk" rule:
positions where text can be cut without changing its pre-tokens, so each distinct chunk needs
the regex only once.

    gpt2, o200k   cut before a " " followed by a non-space:        "a b" -> "a" | " b"
    cl100k        the same, but only after a non-space too: in cl100k ``\\s++$`` makes
                  "\\n\\t" one pre-token at the end of a text and two before " b"

Streaming (``safe_cut``) falls back to cutting before a "\\n" that follows a non-space
(GPT-2) or an ASCII letter or digit (cl100k, o200k: their punctuation runs swallow the
newlines after them, "end.\\n" is one pre-token).  A custom regex is never cut at spaces;
it is assumed not to match across a newline that follows an ASCII letter or digit, which
holds for every byte-level BPE pattern we know of.
``tests/tokenizer/test_pretokenize.py`` checks the cut rules over random text.

A chain of regexes (a Hugging Face ``Sequence`` of several isolating ``Split`` steps, as
DeepSeek's tokenizer.json has) is written as the JSON list of its regexes,
``'["\\p{N}{1,3}", "..."]'``: each regex cuts every piece of the step before into its matches
and the text between them (no regex of ours can start ``["`` and match every character).
"""

from __future__ import annotations

import json
import math
import re
from functools import cached_property

import regex

from lmdata.errors import LmdataError
from lmdata.io.env import env_number

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NAMED = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN, "o200k": O200K_PATTERN}
# the same patterns as other tools write them (HF's ByteLevel regex, tiktoken's r50k)
# Hugging Face's regex engine (Oniguruma, Ruby syntax) reads `{1,3}+` as "repeat" and `$` as
# end of line, so cl100k is exported in this equivalent form (possessives dropped where
# nothing follows them, `\s++$` as `\s+\z`).
HF_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+\z|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
ALIASES = {
    HF_CL100K_PATTERN: "cl100k",
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""": "gpt2",
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""": "gpt2",
}
C_MODES = {"gpt2": 0, "cl100k": 1, "o200k": 2}  # the C pre-tokenizer of each named pattern


class Pattern:
    """A pre-tokenizer regex and its chunk rules: ``Pattern.get("cl100k").findall("a b")``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.splits = chain_of(text)  # the regexes of a chain, else None
        self.name = next((n for n, p in NAMED.items() if p == text), None)
        space_cut = {"gpt2": r" (?=\S)", "o200k": r" (?=\S)", "cl100k": r"(?<=\S) (?=\S)"}.get(self.name)
        # `re`'s \S is "not str.isspace()", a subset of `regex`'s \S (isspace also counts
        # U+001C..U+001F), so every cut it makes is a true boundary.
        self._space_cut = re.compile(space_cut) if space_cut else None

    @classmethod
    def get(cls, pattern: "str | list[str] | Pattern | None") -> "Pattern":
        """A pattern from a name (gpt2, cl100k, o200k), a regex, a list of regexes applied one after
        another (a chain of isolating splits), or None (GPT-2's)."""
        if isinstance(pattern, Pattern):
            return pattern
        if pattern is None:
            pattern = "gpt2"
        if isinstance(pattern, list) and len(pattern) == 1:
            pattern = pattern[0]
        if isinstance(pattern, list) or (isinstance(pattern, str) and chain_of(pattern)):
            return _chain(pattern)
        if not isinstance(pattern, str) or not pattern:
            raise LmdataError(f"--pattern must be gpt2, cl100k, o200k or a regex, got {pattern!r}")
        if pattern in NAMED:
            return _named(pattern)
        if pattern in ALIASES:
            return _named(ALIASES[pattern])
        if re.fullmatch(r"[A-Za-z0-9_.-]+", pattern):
            raise LmdataError(f"--pattern {pattern!r}: unknown pattern name; use gpt2, cl100k, o200k or a regex")
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise LmdataError(f"--pattern {pattern!r}: not a valid regex ({exc})") from None
        made = cls(pattern)
        try:
            made.findall(PROBE)
        except LmdataError as exc:
            raise LmdataError(f"--pattern {pattern!r}: {exc}; a pre-tokenizer pattern must match every "
                              "character (end it with e.g. |\\s+|[^\\s]+)") from None
        return made

    @cached_property
    def compiled(self) -> "regex.Pattern":
        return regex.compile(self.text)

    @property
    def findall(self):
        """``findall(text) -> list[str]``: the pre-tokens of text holding no special tokens.

        A custom pattern's pieces are whole matches (a capture group counts as non-capturing,
        as in Hugging Face and tiktoken), must cover the text (else LmdataError: text would be
        dropped), and a match that backtracks past ``regex_timeout`` is refused.
        """
        if self.splits:
            return self._chain_findall
        return self.compiled.findall if self.name else self._checked_findall

    @cached_property
    def _compiled_splits(self) -> list["regex.Pattern"]:
        return [regex.compile(p) for p in self.splits]

    def _chain_findall(self, text: str) -> list[str]:
        """Each regex cuts every piece into its matches and the text between them (Hugging Face's
        ``Split`` with behavior "Isolated"); empty matches cut nothing."""
        timeout, pieces = regex_timeout(len(text)), [text]
        try:
            for step in self._compiled_splits:
                out: list[str] = []
                for piece in pieces:
                    at = 0
                    for m in step.finditer(piece, timeout=timeout):
                        start, end = m.span()
                        if start == end:
                            continue
                        if start > at:
                            out.append(piece[at:start])
                        out.append(piece[start:end])
                        at = end
                    if at < len(piece):
                        out.append(piece[at:])
                pieces = out
        except TimeoutError:
            raise LmdataError(f"pre-tokenizer chain {self.text!r} ran past {timeout:.1f}s on a text of {len(text)} "
                              f"characters (catastrophic backtracking); simplify it, or raise {TIMEOUT_ENV}") from None
        return pieces

    def _checked_findall(self, text: str) -> list[str]:
        timeout = regex_timeout(len(text))
        try:
            if self.compiled.groups:
                pieces = [m.group() for m in self.compiled.finditer(text, timeout=timeout)]
            else:
                pieces = self.compiled.findall(text, timeout=timeout)
        except TimeoutError:
            raise LmdataError(f"pre-tokenizer pattern {self.text!r} ran past {timeout:.1f}s on a text of {len(text)} "
                              f"characters (catastrophic backtracking); simplify the pattern, or raise "
                              f"{TIMEOUT_ENV}") from None
        if sum(map(len, pieces)) != len(text):
            raise LmdataError(f"pre-tokenizer pattern {self.text!r} does not match {_first_gap(text, pieces)}")
        return pieces

    @property
    def hf_text(self) -> str:
        """The pattern as Hugging Face's tokenizer.json must spell it to match the same pre-tokens."""
        return HF_CL100K_PATTERN if self.name == "cl100k" else self.text

    @property
    def c_mode(self) -> int | None:
        """The C pre-tokenizer's number for this pattern: 0..2 the named ones, 3 a custom regex compiled
        for the C matcher (``c_program``), None (the regex is called, GIL held)."""
        if self.name is not None:
            return C_MODES[self.name]
        return None if self.c_program is None else 3

    @property
    def c_program(self):
        """A custom regex (or chain) compiled for the C matcher (``regex_program``), or None: a named
        pattern, no accelerator, or a regex outside the matcher's subset."""
        if self.name is not None:
            return None
        from lmdata.tokenizer.regex_program import program

        return program(tuple(self.splits or [self.text]), PROBE)

    def split_pieces(self, text: str) -> list[str]:
        """Chunks of ``text``: the first as is, each later one standing for ``" " + piece``."""
        return self._space_cut.split(text) if self._space_cut else [text]

    def find_chunk_boundary(self, text: str, pos: int) -> int | None:
        """The first chunk boundary at or after ``pos``, or None."""
        if self._space_cut is None:
            return None
        m = self._space_cut.search(text, pos)
        return m.start() if m else None

    def newline_cut_ok(self, text: str, i: int) -> bool:
        """Whether a cut just before ``text[i] == "\\n"`` leaves the pre-tokens unchanged."""
        prev = text[i - 1]
        if self.name == "gpt2":
            return not prev.isspace()
        return prev.isascii() and prev.isalnum()

    def space_cut_ok(self, text: str, i: int) -> bool:
        """Whether a cut just before ``text[i] == " "`` (next char non-space) is a chunk boundary."""
        if self._space_cut is None:
            return False
        return self.name != "cl100k" or not text[i - 1].isspace()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Pattern({self.name or self.text!r})"


TIMEOUT_ENV = "LMDATA_REGEX_TIMEOUT"
# every ASCII character plus letters, digits, marks and spaces of other scripts: what a
# pattern that drops text is caught on when it is given (train, import, load)
PROBE = ("".join(map(chr, range(128))) + " it's I'LL x\u00a0y \u00c9t\u00e9 na\u0308ive \u4f60\u597d \u0661\u0662 "
         "\u2167 \U0001f642 \u2028\u3000z\r\n\n  \t end")


def regex_timeout(chars: int) -> float:
    """Seconds a custom regex may take on a text of ``chars`` characters: a base (``LMDATA_REGEX_TIMEOUT``,
    default 5) plus 20 us a character, so a backtracking blow-up ends (and Ctrl-C is seen) within it."""
    base = env_number(TIMEOUT_ENV, 5.0, lambda v: 0 < v < math.inf, "give the seconds a custom regex may "
                      "take on a text before its per-character allowance, a number > 0")
    return base + 2e-5 * chars


def _first_gap(text: str, pieces: list[str]) -> str:
    """Where the pieces first fail to cover ``text``: 'the character 'x' at offset 3'."""
    at = 0
    for piece in pieces:
        if not text.startswith(piece, at):
            break
        at += len(piece)
    at = min(at, len(text) - 1)
    return f"the character {text[at]!r} at offset {at}; its pieces would drop text"


_CACHE: dict[str, Pattern] = {}


def chain_of(text: str) -> list[str] | None:
    """The regexes of a chain's text (a JSON list of two or more non-empty strings), else None."""
    if not text.startswith('["'):
        return None
    try:
        steps = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(steps, list) and len(steps) >= 2 and all(isinstance(p, str) and p for p in steps)
    return steps if ok else None


def _chain(pattern: "str | list[str]") -> Pattern:
    """A chain of regexes, each checked to compile."""
    steps = chain_of(pattern) if isinstance(pattern, str) else pattern
    if not steps or not all(isinstance(p, str) and p for p in steps):
        raise LmdataError(f"--pattern {pattern!r}: a chain of regexes must be a list of non-empty strings")
    for i, p in enumerate(steps):
        try:
            regex.compile(p)
        except regex.error as exc:
            raise LmdataError(f"pre-tokenizer chain step {i} {p!r}: not a valid regex ({exc})") from None
    return Pattern(json.dumps(steps, ensure_ascii=False))


def _named(name: str) -> Pattern:
    if name not in _CACHE:
        _CACHE[name] = Pattern(NAMED[name])
    return _CACHE[name]


GPT2 = _named("gpt2")
