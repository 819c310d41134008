"""Batch encoding: ``encode_arrays`` and ``encode_batch`` equal one-at-a-time encoding, on
any thread count, on both backends, for every string width; ``char_runs`` keeps order."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.batch import char_runs

from text_strategies import PIECES, SPECIALS, texts

EOT = "<|endoftext|>"
SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "in.txt"
    path.write_text(SAMPLE.read_text(encoding="utf-8")[:200_000] + "".join(PIECES) * 20, encoding="utf-8")
    return Tokenizer(*train_bpe(path, 600, SPECIALS, workers=1), SPECIALS)


@pytest.fixture(scope="module")
def pure(tok):
    twin = Tokenizer(tok.vocab, tok.merges, SPECIALS)
    twin._fast = None
    return twin


def _one_at_a_time(tok, docs, eot, ordinary):
    encode = tok.encode_ordinary if ordinary else tok.encode
    ids = [encode(d) + ([] if eot is None else [eot]) for d in docs]
    return [i for part in ids for i in part], [len(part) for part in ids]


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("ordinary", [False, True])
def test_arrays_equal_one_at_a_time_on_the_sample(tok, workers, ordinary):
    docs = [d for d in SAMPLE.read_text(encoding="utf-8").split("\n\n") if d] + [EOT + " x", "", "<pad> ünï 😀"]
    eot = tok.special_ids[EOT]
    batch = tok.encode_arrays(docs, eot=eot, dtype="uint16", ordinary=ordinary, num_workers=workers,
                              pool_min_chars=0)
    want, lengths = _one_at_a_time(tok, docs, eot, ordinary)
    assert batch.tokens.dtype == np.uint16 and batch.tokens.tolist() == want
    assert batch.lengths.dtype == np.int64 and batch.lengths.tolist() == lengths
    assert batch.text_bytes == sum(len(d.encode("utf-8")) for d in docs)


@settings(max_examples=150, deadline=None)
@given(st.lists(texts, max_size=8), st.sampled_from([None, 0]), st.booleans(), st.sampled_from([1, 2]))
def test_arrays_equal_one_at_a_time_on_any_text(tok, pure, docs, eot_choice, ordinary, workers):
    """Multilingual, emoji, whitespace and special-token text; C and Python agree with encode()."""
    eot = None if eot_choice is None else tok.special_ids[EOT]
    want, lengths = _one_at_a_time(tok, docs, eot, ordinary)
    for t in (tok, pure):
        batch = t.encode_arrays(docs, eot=eot, ordinary=ordinary, num_workers=workers, pool_min_chars=0)
        assert batch.tokens.dtype == np.uint32 and batch.tokens.tolist() == want
        assert batch.lengths.tolist() == lengths
        assert batch.text_bytes == sum(len(d.encode("utf-8")) for d in docs)


@pytest.mark.parametrize("pattern, gil_free", [
    (r"(?<=\S)\s+|\s+|\w+|[^\s\w]+", False),  # a look-behind: outside the C matcher, regex in Python
    (r"\s+|\w+|[^\s\w]+", True),  # compiled for the C matcher
])
def test_a_custom_regex_gives_the_same_ids(tok, pattern, gil_free):
    custom = Tokenizer(tok.vocab, tok.merges, SPECIALS, pattern=pattern)
    assert custom.gil_free is (gil_free and custom.accelerated)
    docs = ["a custom regex, then", "ünï 😀  two", EOT]
    batch = custom.encode_arrays(docs, eot=0, num_workers=2, pool_min_chars=0)
    assert batch.tokens.tolist() == _one_at_a_time(custom, docs, 0, False)[0]


def test_uint16_is_refused_for_a_vocab_past_65535(tok):
    big = Tokenizer({**tok.vocab, 70_000: b"<|big|>"}, tok.merges, SPECIALS)
    with pytest.raises(ValueError, match="uint16"):
        big.encode_arrays(["x"], dtype="uint16")
    assert big.encode_arrays(["x"], dtype="uint32").tokens.tolist() == big.encode("x")
    with pytest.raises(ValueError, match="int64"):
        tok.encode_arrays(["x"], dtype="int64")


def test_encode_batch_on_threads_keeps_the_order(tok):
    docs = [f"document {i}: " + "word " * (i % 50) for i in range(500)]
    assert tok.encode_batch(docs, 2, pool_min_chars=0) == [tok.encode(d) for d in docs]


@given(st.lists(st.text(max_size=30), max_size=40), st.integers(1, 50))
def test_char_runs_cut_in_order_and_about_evenly(docs, n):
    runs = char_runs(docs, n)
    assert [d for run in runs for d in run] == docs
    assert all(runs)
    assert len(runs) <= max(n, 1) + 1 or sum(map(len, docs)) < n


@pytest.mark.parametrize("workers", [1, 2])
def test_arrays_in_many_runs_equal_one_run(tok, monkeypatch, workers):
    """Big inputs are encoded a run at a time (bounded scratch), placed in order."""
    from lmdata.tokenizer import batch

    docs = [d for d in SAMPLE.read_text(encoding="utf-8").split("\n\n") if d]
    whole = tok.encode_arrays(docs, eot=0, num_workers=1)
    monkeypatch.setattr(batch, "RUN_CHARS", 5_000)
    runs = tok.encode_arrays(docs, eot=0, num_workers=workers, pool_min_chars=0)
    assert runs.tokens.tolist() == whole.tokens.tolist() and runs.lengths.tolist() == whole.lengths.tolist()
    assert runs.text_bytes == whole.text_bytes and runs.tokens.flags.owndata
    assert tok.encode_arrays([], eot=0).tokens.tolist() == []


@pytest.mark.parametrize("eot", [-1, 5.0, True, "3", 1 << 20])
def test_an_eot_that_is_not_an_id_is_refused(tok, eot):
    """-1 had meant "no separator" silently (the C path's own marker), 1 << 20 an itemsize error."""
    with pytest.raises(ValueError, match=f"eot {eot!r} is not an id of this tokenizer"):
        tok.encode_arrays(["ab", "cd"], eot=eot)
    assert tok.encode_arrays(["ab"], eot=np.int32(0)).tokens.tolist() == tok.encode("ab") + [0]
