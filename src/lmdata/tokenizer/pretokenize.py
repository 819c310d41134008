"""Pre-tokenization: special-token splitting, the pattern's regex, and "chunks".

Chunks are what make training and encoding fast.  With the GPT-2 pattern a pre-token
boundary always falls just before a space that is followed by a non-whitespace
character, and the pre-tokens after that point do not depend on the text before it (the
pattern has no lookbehind and ``(?!\\S)`` sees a space or the end of text alike).  So text
can be cut there into chunks -- in prose nearly one per word, e.g. ``" the"``,
``" end.\\n"`` -- and each *distinct* chunk needs the regex only once.  cl100k and o200k
have such cuts too (``patterns``); a custom regex is one chunk per text here (the C encoder
caches its pre-tokens instead: ``regex_program``).
``tests/tokenizer/test_pretokenize.py`` checks this property over random text.

Streaming falls back to a cut before a newline where the pattern allows one.
"""

from __future__ import annotations

import codecs
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import regex

from lmdata.errors import LmdataError
from lmdata.io.location import location
from lmdata.text_sniff import SNIFF_BYTES, check_text
from lmdata.tokenizer.inputs import DocumentsInput, Input, is_compressed, open_input, read_block
from lmdata.tokenizer.patterns import GPT2, GPT2_PATTERN, Pattern

PRETOKEN_RE = GPT2.compiled
__all__ = ["GPT2_PATTERN", "PRETOKEN_RE", "Pattern"]


def split_pieces(text: str, pattern: Pattern = GPT2) -> list[str]:
    """Chunks of text: ``"a b c" -> ["a", "b", "c"]``, each piece after the first standing for " " + piece."""
    return pattern.split_pieces(text)


def pretokens(text: str, pattern: Pattern = GPT2) -> list[str]:
    """Pre-tokens of text holding no special tokens: ``"a b" -> ["a", " b"]``."""
    return pattern.findall(text)


def special_splitter(special_tokens: list[str]) -> re.Pattern | None:
    """A pattern whose ``split`` keeps specials as separate items; longest wins on overlap."""
    if not special_tokens:
        return None
    ordered = sorted(special_tokens, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(tok) for tok in ordered) + ")")


def safe_cut(text: str, special_tokens: list[str], pattern: Pattern = GPT2) -> int:
    """The last position where ``text`` can be cut without changing its tokens, or 0.

    Unknown text may follow, so the cut stays clear of the end by the longest special
    token's length plus one (a space cut must see whether a whole special token starts just
    after the space) and never falls inside any special-token occurrence.
    """
    max_len = max((len(t) for t in special_tokens), default=1)
    limit = len(text) - max_len - 1
    if limit <= 0:  # (a negative bound would count from the end in rfind)
        return 0
    floor = max(0, limit - _CUT_WINDOW)
    for find, ok in ((_last_space_cut, pattern.space_cut_ok), (_last_newline_cut, pattern.newline_cut_ok)):
        if find is _last_space_cut and pattern.name is None:
            continue  # a custom regex has no space cuts
        pos = find(text, limit + 1, floor)
        while pos > 0:
            # a space cut needs its next character in the same segment: "  <|endoftext|>"
            # pre-tokenizes as one "  ", so no cut before the special token's "<"
            bad_space = find is _last_space_cut and any(text.startswith(t, pos + 1) for t in special_tokens)
            if ok(text, pos) and not bad_space and not _inside_special(text, pos, special_tokens):
                return pos
            pos = find(text, pos, floor)
    return 0


# Any safe cut will do, so the search looks back at most this far: a 20 MB run of spaces (no cut)
# was searched whole for every 256 KB block read, a space at a time in Python (425 s to train on it).
_CUT_WINDOW = 1 << 20
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")  # str.isspace's characters
_WS = re.escape(WHITESPACE)
_SPACE_CUTS = regex.compile(f"(?r) (?=[^{_WS}])")  # (?r): searched from the end, in C
_NEWLINE_CUTS = regex.compile(f"(?r)(?<=[^{_WS}])\n")


def _last_space_cut(text: str, before: int, floor: int = 0) -> int:
    """Largest i in [floor, ``before``) with text[i] == " " and text[i+1] non-whitespace, or -1."""
    m = _SPACE_CUTS.search(text, floor, before + 1)
    return m.start() if m else -1


def _last_newline_cut(text: str, before: int, floor: int = 0) -> int:
    """Largest i in [floor, ``before``) with text[i] == "\\n" and text[i-1] non-whitespace, or -1."""
    m = _NEWLINE_CUTS.search(text, floor, before)
    return m.start() if m else -1


def _inside_special(text: str, pos: int, special_tokens: list[str]) -> bool:
    """Whether any occurrence of a special token starts before ``pos`` and ends after it."""
    return any(text.find(t, max(0, pos - len(t) + 1), pos + len(t) - 1) != -1 for t in special_tokens)


def count_pretokens(text: str, special_tokens: list[str], pattern: Pattern = GPT2) -> Counter:
    """Pre-token frequencies of ``text``, skipping special tokens; the regex runs once per distinct chunk."""
    splitter = special_splitter(special_tokens)
    segments = splitter.split(text)[::2] if splitter else [text]
    spaced: Counter = Counter()  # piece -> count, standing for the chunk " " + piece
    heads: Counter = Counter()  # first chunk of each segment, as is
    for segment in segments:
        pieces = pattern.split_pieces(segment)
        spaced.update(pieces)  # C speed; the head is moved out below
        spaced[pieces[0]] -= 1
        heads[pieces[0]] += 1
    counts: Counter = Counter()
    findall = pattern.findall
    for chunk, n in heads.items():
        for tok in findall(chunk):
            counts[tok] += n
    for piece, n in spaced.items():
        if n <= 0:
            continue
        for tok in findall(" " + piece):
            counts[tok] += n
    return counts


@dataclass
class ReadStats:
    """What reading the input found: bytes read and invalid bytes replaced."""

    bytes: int = 0
    replacements: int = 0


def iter_text_blocks(
    path: Input, special_tokens: list[str], stats: ReadStats, errors: str = "strict", block_bytes: int = 4 << 20,
    pattern: Pattern = GPT2,
) -> Iterator[str]:
    """Yield the decoded text of ``path`` (a file or an s3:// object, decompressed) in blocks cut only where
    tokenization is unaffected; ``stats.bytes`` counts the text's bytes, not the stored ones."""
    if errors not in ("strict", "replace"):
        raise LmdataError(f"--errors must be 'strict' or 'replace', not {errors!r}")
    path = location(path)
    handler = "strict" if errors == "strict" else _counting_handler(stats)
    decoder = codecs.getincrementaldecoder("utf-8")(errors=handler)
    carry, offset = "", 0
    with open_input(path, stats) as f:  # (a document input counts what its reading replaced)
        while True:
            if offset == 0 and not isinstance(path, DocumentsInput) and hasattr(f, "peek"):
                check_text(path, f.peek(SNIFF_BYTES)[:SNIFF_BYTES], nul_is_binary=False)  # as ingest refuses one
            raw = read_block(f, path, block_bytes)
            pending = len(decoder.getstate()[0])
            try:
                text = carry + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                raise _invalid_utf8(path, offset - pending + exc.start) from None
            offset += len(raw)
            stats.bytes += len(raw)
            if not raw:
                if text:
                    yield text
                return
            cut = safe_cut(text, special_tokens, pattern)
            if cut:
                yield text[:cut]
            carry = text[cut:]


def _invalid_utf8(path: Input, at: int) -> LmdataError:
    """The error naming the file and the offset (of the decompressed text for a .gz/.zst input)."""
    where = f"byte offset {at}" + (" of the decompressed stream" if is_compressed(path) else "")
    return LmdataError(f"{path}: invalid UTF-8 at {where}; fix the file or pass --errors replace")


def _counting_handler(stats: ReadStats) -> str:
    """Register (once per stats object) a decode error handler that replaces and counts."""

    def handler(exc: UnicodeDecodeError) -> tuple[str, int]:
        stats.replacements += 1
        return "\ufffd", exc.end

    name = f"lmdata-count-{id(stats)}"
    codecs.register_error(name, handler)
    return name
