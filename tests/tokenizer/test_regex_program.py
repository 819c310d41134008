"""The C matcher of custom pre-tokenizer regexes (regex_program + _fastbpe_regex.c) against ``regex`` itself."""

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer
from lmdata.tokenizer.patterns import ALIASES, HF_CL100K_PATTERN, NAMED, PROBE, Pattern
from lmdata.tokenizer.regex_program import Unsupported, compile_pattern, reference

from text_strategies import PIECES, texts

fastbpe = pytest.importorskip("lmdata.tokenizer._fastbpe")

# written from their public definitions (Meta's Llama 3 tokenizer, Qwen2's tokenizer.json, Mistral's
# Tekken: o200k's letter classes without the contraction suffixes, single digits; DeepSeek V3's last Split)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
            r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_CHAIN = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK]  # DeepSeek V3's three isolating Splits
REAL = {"llama3": LLAMA3, "qwen2": QWEN2, "tekken": TEKKEN, "deepseek": DEEPSEEK,
        **NAMED, "hf-cl100k": HF_CL100K_PATTERN, **{f"alias{i}": p for i, p in enumerate(ALIASES)}}
# every construct of the subset, each beside a catch-all so the pieces cover any text
FEATURES = [
    r"\p{Lu}\p{Ll}*?x|\p{L}+?|\s|.|\n",  # lazy
    r"(?>\p{L}+|\p{L}+\d)\d|\p{L}\d|[\s\S]",  # atomic group: the second branch is never tried inside
    r"\d{2,}+\d|\d{,2}?\d|\d{2}|[\s\S]",  # possessive, {,n} lazy, {m}
    r"(?i)the|[a-z]+(?=\s)|\S|\s",  # global (?i), look-ahead
    r"(?i:ab(?-i:c)|k)|\w+$|\w+\Z|\w+\z|^\s+|\A\W|[\s\S]",  # scoped flags, anchors
    r"\x41+|\u00e9+|[\U0001F600-\U0001F64F]+|\N{DIGIT ONE}|[^\p{L}\s]|\p{L}+|\s+",  # escapes, ranges
    # a group under ?+, a group of one class repeated
    r"'(?:[sdmt]|ll|ve|re)?+| ?(?:\p{L})+| ?\p{N}++| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"[[:alpha:]]+|[\d\-.]+|[\]\\^a]|\.|(a|b)?c|[\s\S]",  # POSIX class, escapes in a set, capture group
]
HARD_TEXT = PIECES + ["ABc", "aBC", "x1", "ab1", "12345", "abc", "ABC", "THE", "The", "ſ", "K", "é", "ÉÉ",
                      "😀😁", "1", "-.-", "]", "^", "\\", "a", "c", "bc", "ac", " \n", "\n\n\n", "  \t"]
hard = st.lists(st.sampled_from(HARD_TEXT), max_size=40).map("".join)


def _program(pattern: str):
    return fastbpe.Program(*compile_pattern(pattern))


def _check(prog, pattern: str, text: str) -> None:
    """The C pieces equal regex's matches; where those leave a gap the C matcher raises."""
    want = [m.group() for m in regex.finditer(pattern, text)]
    if "".join(want) == text:
        assert prog.findall(text) == want
    else:
        with pytest.raises(LmdataError, match="does not match"):
            prog.findall(text)


@pytest.fixture(scope="module")
def programs():
    return {p: _program(p) for p in [*REAL.values(), *FEATURES]}


@settings(max_examples=300, deadline=None)
@given(texts | hard, st.sampled_from(sorted(REAL)))
def test_real_patterns_equal_the_regex(programs, text, name):
    _check(programs[REAL[name]], REAL[name], text)


@settings(max_examples=400, deadline=None)
@given(hard | texts | st.text(max_size=30), st.sampled_from(FEATURES))
def test_every_construct_equals_the_regex(programs, text, pattern):
    _check(programs[pattern], pattern, text)


def test_real_patterns_on_the_probe_and_long_runs(programs):
    for pattern in REAL.values():
        for text in (PROBE, "a" * 5000 + " " * 5000 + "1" * 999 + "\n" * 300 + "ÉÉé" * 200, "\u4f60" * 3000):
            _check(programs[pattern], pattern, text)


@pytest.mark.parametrize("pattern, why", [
    (r"(?<=\S)\s+|\s+|\S+", "look-behind"),
    (r"(a)\1|[\s\S]", "escape"),
    (r"(?:ab)+|[\s\S]", "repeated"),
    (r"\s*", "empty string"),
    (r"\b\w+|[\s\S]", "escape"),
    (r"(?m)^\w+|[\s\S]", "flag"),
    (r"(?x) a |[\s\S]", "flag"),
])
def test_outside_the_subset_keeps_the_python_path_and_says_so(pattern, why, capsys):
    with pytest.raises(Unsupported, match=why):
        compile_pattern(pattern)
    if regex.fullmatch(pattern, "") is None:  # (Pattern.get refuses an empty-matching pattern's gaps itself)
        p = Pattern.get(pattern)
        assert p.c_mode is None and p.c_program is None
        assert Pattern.get(pattern).c_mode is None
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "outside the C pre-tokenizer's subset" in err


def test_the_shipped_and_real_patterns_compile_to_c():
    for pattern in (LLAMA3, QWEN2, TEKKEN):  # (DeepSeek's is one step of a chain: it covers no digit)
        assert Pattern.get(pattern).c_mode == 3


def test_a_malformed_program_is_refused():
    code, n, entries, table = compile_pattern(LLAMA3)
    with pytest.raises(ValueError, match="malformed"):
        fastbpe.Program(code, n, [n], table)  # entry past the instructions
    with pytest.raises(ValueError, match="malformed"):
        fastbpe.Program(code, n, entries * 9, table)  # more steps than a chain may have
    with pytest.raises(ValueError, match="malformed"):
        fastbpe.Program(code, n, entries, None)  # classes without their table
    forward = bytearray(code)
    forward[4 * 8 + 4:4 * 8 + 8] = (n - 1).to_bytes(4, "little")  # instruction 1 pointing forward
    with pytest.raises(ValueError, match="malformed"):
        fastbpe.Program(bytes(forward), n, entries, table)


CHAINS = [DEEPSEEK_CHAIN, [r"\p{N}{1,3}", LLAMA3], [r"\s+(?!\S)", r"\p{L}+", r"(?i:the)"], [r"$", r"\d+"][1:] * 2]


@settings(max_examples=300, deadline=None)
@given(texts | hard | st.text(max_size=30), st.sampled_from(range(len(CHAINS))))
def test_chains_equal_the_regex_pieces(text, which):
    steps = CHAINS[which]
    prog = fastbpe.Program(*compile_pattern(steps))
    assert prog.findall(text) == reference(tuple(steps), text) == Pattern.get(steps).findall(text)


def test_a_chain_compiles_to_c():
    assert Pattern.get(DEEPSEEK_CHAIN).c_mode == 3


def test_catastrophic_backtracking_is_an_error_not_a_hang():
    prog = _program(r"(?:\s*\s*\s*\s*\s*x)|[\s\S]")
    with pytest.raises(LmdataError, match="backtrack"):
        prog.findall(" " * 3000)


def test_a_custom_pattern_tokenizer_is_gil_free_with_python_ids(tiny_vocab):
    vocab, merges = tiny_vocab
    fast = Tokenizer(vocab, merges, ["<|endoftext|>"], pattern=LLAMA3)
    assert fast.gil_free
    docs = ["It's THE end.\n\n  Über 123456 😀", "a<|endoftext|>b  \t", "", "x" * 300]
    want = [[i for piece in Pattern.get(LLAMA3).findall(part) for i in fast._fast.bpe(piece.encode())]
            for part in ("It's THE end.\n\n  Über 123456 😀",)]
    assert fast.encode(docs[0]) == want[0]
    one = fast.encode_arrays(docs, num_workers=1)
    two = fast.encode_arrays(docs * 50, num_workers=2, pool_min_chars=0)
    assert two.tokens.tolist() == one.tokens.tolist() * 50
    assert fast.encode(docs[1]) == fast.encode("a") + [fast.special_ids["<|endoftext|>"]] + fast.encode("b  \t")


@pytest.fixture(scope="module")
def tiny_vocab():
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    for a, b in [(b"e", b"n"), (b"t", b"h"), (b"th", b"e"), (b" ", b"a"), (b"1", b"2"), (b"'", b"s")]:
        merges.append((a, b))
        vocab[len(vocab)] = a + b
    return vocab, merges


@pytest.mark.parametrize("pattern", [LLAMA3, TEKKEN, DEEPSEEK_CHAIN], ids=["llama3", "tekken", "deepseek-chain"])
def test_training_counts_custom_patterns_in_c_as_python_does(tmp_path, monkeypatch, pattern):
    from lmdata.tokenizer import patterns, train_bpe

    path = tmp_path / "in.txt"
    text = "It's THE end, isn't it?\n\n  Über 123456 日本語 😀 don'T\t\n" * 40 + "x" * 300
    path.write_text(text, encoding="utf-8")
    assert Pattern.get(pattern).c_mode == 3
    c = train_bpe(path, 400, ["<|endoftext|>"], workers=2, block_bytes=256, pattern=pattern)
    monkeypatch.setattr(patterns.Pattern, "c_program", property(lambda self: None))  # counted in Python
    assert Pattern.get(pattern).c_mode is None
    assert train_bpe(path, 400, ["<|endoftext|>"], workers=2, block_bytes=256, pattern=pattern) == c
