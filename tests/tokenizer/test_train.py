"""The fast trainers (C, and the pure-Python fallback) make exactly the reference's merges."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.tokenizer import train_bpe
from lmdata.tokenizer.patterns import Pattern
from lmdata.tokenizer.train import fast_module

import bpe_reference as reference
from text_strategies import SPECIALS, texts

EOT = "<|endoftext|>"


PATTERNS = ["gpt2", "cl100k", "o200k", r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+"]


@pytest.fixture(autouse=True)
def path(trainer):
    """Every test runs on the C trainer and on the pure-Python one (conftest's ``trainer``)."""
    return trainer


def _train_both(tmp_path, text, vocab_size, specials, pattern=None, workers=1, **opts):
    path = tmp_path / "in.txt"
    path.write_bytes(text.encode("utf-8"))
    fast = train_bpe(path, vocab_size, specials, workers=workers, pattern=pattern, **opts)
    return fast, reference.train(text, vocab_size, specials, Pattern.get(pattern).text)


def test_hand_worked_example(tmp_path):
    # pre-tokens "aaab", " aab": (a,a)=3 wins -> 256; then (aa,a) (a,b) ( ,aa) (aa,b) all 1:
    # the greatest is (b"aa", b"b") -> 257; then (aa,a) ( ,aab) -> (b"aa", b"a") -> 258; EOT 259.
    (tmp_path / "in.txt").write_text("aaab aab" + EOT)
    vocab, merges = train_bpe(tmp_path / "in.txt", 260, [EOT], workers=1)
    assert merges == [(b"a", b"a"), (b"aa", b"b"), (b"aa", b"a")]
    assert vocab[256] == b"aa" and vocab[257] == b"aab" and vocab[258] == b"aaa" and vocab[259] == EOT.encode()
    assert len(vocab) == 260


@pytest.mark.parametrize("text", [
    "ab ab ab ba ba ba",  # a tie between (a,b) and (b,a): the greater pair wins
    "aaaa aaa aa a aaaaaaaaa",  # overlapping repeats
    "日本語 日本 über Übermut 😀😀 naïve",  # multi-byte UTF-8
    f"{EOT}edge{EOT} in{EOT}side {EOT}{EOT}",  # special tokens at the edges and inside
    "a  b   c \n\n  d\t\te \r\n f    ",  # whitespace runs
    "line one\nline two\n\nline three\n",  # newlines
    "1 22 333 4444 2024-01-01 3.14159",  # digits
    "don't I'll we're they've she'd I'm it's DON'T",  # contractions
])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_fixed_cases_match_reference(tmp_path, text, pattern):
    fast, ref = _train_both(tmp_path, text * 3, 300, [EOT], pattern)
    assert fast == ref


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(256 + 2, 330), st.sampled_from([16, 64, 1 << 20]), st.sampled_from(PATTERNS))
def test_random_text_matches_reference(tmp_path_factory, text, vocab_size, block_bytes, pattern):
    """Identical merges and vocab, whatever the block size used to stream the input, for every pattern."""
    if not text.strip():
        text += "x"
    tmp = tmp_path_factory.mktemp("train")
    fast, ref = _train_both(tmp, text, vocab_size, SPECIALS, pattern, block_bytes=block_bytes)
    assert fast == ref


@pytest.mark.parametrize("pattern", PATTERNS)
def test_worker_count_does_not_change_the_result(tmp_path, pattern):
    path = tmp_path / "in.txt"
    text = ("The cat sat on the mat. " * 50 + EOT + "\nA dog's life, isn't it? 日本語  \t\n  x\r\n") * 200
    path.write_text(text)
    one = train_bpe(path, 400, [EOT], workers=1, block_bytes=4096, pattern=pattern)
    for workers in (2, 3):
        assert train_bpe(path, 400, [EOT], workers=workers, block_bytes=4096, pattern=pattern) == one


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts, st.sampled_from([1, 2, 3]), st.sampled_from(PATTERNS))
def test_thread_count_matches_reference(tmp_path_factory, path, text, workers, pattern):
    """Small blocks spread over 1, 2 or 3 threads: the reference's merges every time."""
    if path == "python" and workers > 1:
        workers = 1  # processes there: covered by the test above, too slow per example
    if not text.strip():
        text += "x"
    tmp = tmp_path_factory.mktemp("threads")
    fast, ref = _train_both(tmp, text * 4, 300, SPECIALS, pattern, block_bytes=64, workers=workers)
    assert fast == ref


def test_c_and_python_paths_agree_on_the_sample(tmp_path, monkeypatch, path):
    from pathlib import Path

    if path == "python":
        pytest.skip("compares the C path with the Python one")

    sample = Path(__file__).parents[2] / "data" / "sample.txt"
    got = train_bpe(sample, 1000, [EOT], workers=2, block_bytes=1 << 16)
    monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    assert got == train_bpe(sample, 1000, [EOT], workers=1)


def test_multiple_special_tokens_and_none(tmp_path):
    text = "a<|x|>b <|xy|> c<|x|><|xy|>dd dd " * 5
    for specials in (["<|x|>", "<|xy|>"], []):
        fast, ref = _train_both(tmp_path, text, 290, specials)
        assert fast == ref


def test_several_inputs_count_as_separate_streams(tmp_path):
    (tmp_path / "a.txt").write_text("hello wor")
    (tmp_path / "b.txt").write_text("ld hello")
    vocab, merges = train_bpe([tmp_path / "a.txt", tmp_path / "b.txt"], 270, [EOT], workers=1)
    ref = reference.train("hello wor" + EOT + "ld hello", 270, [EOT])
    assert (vocab, merges) == ref


def test_sample_matches_reference_on_a_slice(tmp_path):
    from pathlib import Path

    text = (Path(__file__).parents[2] / "data" / "sample.txt").read_text(encoding="utf-8")[:20000]
    fast, ref = _train_both(tmp_path, text, 320, [EOT])
    assert fast == ref


def test_chunk_counter_counts_the_encoders_chunks(path):
    """ChunkCounter cuts text as Pattern.split_pieces does, and absorb adds two counters."""
    from collections import Counter

    from lmdata.tokenizer import unicode_classes

    if path == "python":
        pytest.skip("the C counter")
    fast = fast_module()
    unicode_classes.install(fast)
    texts = ["a b  c\n d", " x  日本 😀 a b", "", "   "]
    for name in ("gpt2", "cl100k", "o200k"):
        pattern = Pattern.get(name)
        want: Counter = Counter()
        for t in texts:
            pieces = pattern.split_pieces(t)
            want.update([pieces[0]] + [" " + p for p in pieces[1:]])
        del want[""]
        one, two = fast.ChunkCounter(pattern.c_mode), fast.ChunkCounter(pattern.c_mode)
        one.add(texts[:2])
        two.add(texts[2:])
        one.absorb(two)
        assert one.items() == dict(want)
        assert two.stats()["distinct"] == 0 and one.stats()["distinct"] == len(want)
