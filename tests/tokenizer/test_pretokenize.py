"""The chunk property that training and encoding rely on, and streaming cuts."""

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lmdata.tokenizer.patterns import Pattern
from lmdata.tokenizer.pretokenize import (
    ReadStats, count_pretokens, iter_text_blocks, pretokens, safe_cut, split_pieces,
)

from bpe_reference import PATTERN, split_special
from text_strategies import SPECIALS, texts


NAMED_PATTERNS = [Pattern.get(n) for n in ("gpt2", "cl100k", "o200k")]
CUSTOM = Pattern.get(r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+")


@settings(max_examples=400, deadline=None)
@given(texts, st.sampled_from(NAMED_PATTERNS + [CUSTOM]))
def test_chunks_pretokenize_like_the_whole_text(text, pattern):
    pieces = split_pieces(text, pattern)
    chunks = pieces[:1] + [" " + p for p in pieces[1:]]
    assert "".join(chunks) == text
    assert [t for c in chunks for t in pattern.findall(c)] == pattern.findall(text)


@settings(max_examples=400, deadline=None)
@given(texts | st.text(max_size=40), st.sampled_from(NAMED_PATTERNS))
def test_c_pretokenizer_equals_the_regex(text, pattern):
    fastbpe = pytest.importorskip("lmdata.tokenizer._fastbpe")
    from lmdata.tokenizer import unicode_classes

    unicode_classes.install(fastbpe)
    assert fastbpe.pretokenize(text, pattern.c_mode) == pattern.findall(text)


def _reference_counts(text, specials):
    return Counter(t for is_special, part in split_special(text, specials) if not is_special
                   for t in PATTERN.findall(part))


@settings(max_examples=300, deadline=None)
@given(texts)
def test_count_pretokens_equals_plain_regex_path(text):
    assert count_pretokens(text, SPECIALS) == _reference_counts(text, SPECIALS)
    assert count_pretokens(text, []) == Counter(pretokens(text))


@settings(max_examples=300, deadline=None)
@given(texts | texts.map(lambda t: t.replace(" ", "")), st.integers(0, 80),
       st.sampled_from(NAMED_PATTERNS + [CUSTOM]))
@example("  <|endoftext|>", 80, NAMED_PATTERNS[0])  # the space before a special token ends its segment
def test_safe_cut_does_not_change_tokens(text, end, pattern):
    """A cut found in a prefix leaves both sides' tokens unchanged, whatever follows."""
    prefix = text[:end]
    cut = safe_cut(prefix, SPECIALS, pattern)
    if cut:
        assert _split_tokens(text[:cut], pattern) + _split_tokens(text[cut:], pattern) == _split_tokens(text, pattern)


def _split_tokens(text, pattern=None):
    find = pattern.findall if pattern else PATTERN.findall
    return [(s, t) for s, part in split_special(text, SPECIALS) for t in ([part] if s else find(part))]


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 40))
def test_blocks_rejoin_to_the_file(tmp_path_factory, text, block_bytes):
    path = tmp_path_factory.mktemp("blocks") / "t.txt"
    path.write_bytes(text.encode("utf-8"))
    blocks = list(iter_text_blocks(path, SPECIALS, ReadStats(), block_bytes=block_bytes))
    assert "".join(blocks) == text
    assert sum((count_pretokens(b, SPECIALS) for b in blocks), Counter()) == _reference_counts(text, SPECIALS)


def test_safe_cut_waits_for_a_whole_special_token_after_a_space():
    """Regression: "  <|endoftext|>" is one "  " pre-token; no prefix of it may be cut at 1
    (a short prefix once made rfind count from the end, and the space rule saw a partial token)."""
    text = "  <|endoftext|>"
    assert [safe_cut(text[:i], SPECIALS) for i in range(1, len(text) + 1)] == [0] * len(text)


def test_a_long_whitespace_run_is_not_searched_a_character_at_a_time(tmp_path):
    """Issue 29 (smaller): a 20 MB run of spaces (no cut anywhere) was searched back a space at a time in
    Python for every block read -- 425 s to train on it.  Counted here as C calls made while reading
    (sys.setprofile), not timed: a few per block now, about two per space per block before."""
    import sys

    (tmp_path / "ws.txt").write_text("hello world\n" + " " * 400_000 + "\nend of it\n")
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "c_call"
        if calls > 50_000:
            raise RuntimeError("more than 50,000 C calls to read 25 blocks")

    sys.setprofile(count)
    try:
        blocks = list(iter_text_blocks(tmp_path / "ws.txt", ["<|endoftext|>"], ReadStats(), block_bytes=16_384))
    finally:
        sys.setprofile(None)
    assert "".join(blocks) == (tmp_path / "ws.txt").read_text()


def test_the_cut_finders_see_whitespace_as_str_isspace_does():
    from lmdata.tokenizer import pretokenize

    assert set(pretokenize.WHITESPACE) == {c for c in map(chr, range(0x110000)) if c.isspace()}
    for ws in pretokenize.WHITESPACE:  # a space or newline followed (preceded) by any whitespace is no cut
        assert pretokenize._last_space_cut(f"a b {ws}", 5) == 1 and pretokenize._last_space_cut("a b c", 5) == 3
        assert pretokenize._last_newline_cut(f"a\n{ws}\nc", 4) == 1 and pretokenize._last_newline_cut("a\nb\nc", 5) == 3
