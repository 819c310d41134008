"""Encoding matches the reference, round-trips, streams, and survives files and GPT-2 vocabs."""

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.bytes_unicode import bytes_to_unicode, merges_txt, vocab_json

from . import reference
from .strategies import PIECES, SPECIALS, texts

EOT = "<|endoftext|>"
SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 600-id tokenizer trained on a slice of the shipped sample plus the test pieces."""
    path = tmp_path_factory.mktemp("tok") / "in.txt"
    text = SAMPLE.read_text(encoding="utf-8")[:200_000] + "".join(PIECES) * 20
    path.write_text(text, encoding="utf-8")
    vocab, merges = train_bpe(path, 600, SPECIALS, workers=1)
    return Tokenizer(vocab, merges, SPECIALS)


def test_hand_worked_example():
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"aa", 257: b"aab", 258: b"aaa", 259: EOT.encode()}
    tok = Tokenizer(vocab, [(b"a", b"a"), (b"aa", b"b"), (b"aa", b"a")], [EOT])
    # "aaab" -> aa a b -> aaa b ; " aab" -> " " aa b -> " " aab ; then the special token
    assert tok.encode("aaab aab" + EOT) == [258, 98, 32, 257, 259]
    assert tok.encode_ordinary(EOT) == list(EOT.encode())
    assert tok.eot_id == 259 and tok.vocab_size == 260


@pytest.mark.parametrize("text", [
    "", "a", " ", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the", "日本語 über 😀 naïve", f"{EOT}x{EOT}", f"in{EOT}side <pad>{EOT}<pad>",
    "a  b   c \n\n  d\t\te \r\n f    ", "1 22 333 4444", "don't I'll we're they've",
    "<|endoftext", "<|endoftext|><|endoftext|>",
])
def test_fixed_cases_match_reference(trained, text):
    assert trained.encode(text) == reference.encode(text, trained.vocab, trained.merges, SPECIALS)
    assert trained.decode(trained.encode(text)) == text


@settings(max_examples=500, deadline=None)
@given(texts)
def test_random_text_matches_reference_and_round_trips(trained, text):
    ids = trained.encode(text)
    assert ids == reference.encode(text, trained.vocab, trained.merges, SPECIALS)
    assert trained.decode(ids) == text
    assert trained.decode(trained.encode_ordinary(text)) == text
    assert trained.encode(text) == ids  # second time from the caches
    sliced = Tokenizer(trained.vocab, trained.merges, SPECIALS)
    sliced._slice_chars = 3  # long texts are encoded in slices cut at chunk boundaries
    assert sliced.encode(text) == ids


@settings(max_examples=150, deadline=None)
@given(texts | st.text(), st.data())
def test_round_trip_any_str_through_encode_iterable(trained, text, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert list(trained.encode_iterable(pieces)) == trained.encode(text)
    assert list(trained.encode_iterable(pieces, min_buffer=1)) == trained.encode(text)
    assert trained.decode(trained.encode(text)) == text


def test_encode_iterable_cuts_inside_special_tokens_and_words(trained):
    text = (SAMPLE.read_text(encoding="utf-8")[:150_000] + EOT) * 2
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(len(text)), 400) + [text.index(EOT) + 5])
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert list(trained.encode_iterable(pieces)) == trained.encode(text)


def test_long_run_of_one_character(trained):
    text = "e" * 200_000 + " " + "1" * 50_000
    ids = trained.encode(text)
    assert trained.decode(ids) == text
    assert ids[:50] == reference.encode("e" * 100, trained.vocab, trained.merges, SPECIALS)[:50]
    assert trained.encode("ab" * 500) == reference.encode("ab" * 500, trained.vocab, trained.merges, SPECIALS)


def test_encode_batch_equals_encode(trained):
    texts = ["hello world", "", EOT, "über " * 10]
    assert trained.encode_batch(texts) == [trained.encode(t) for t in texts]
    assert trained.encode_batch(texts * 4, num_workers=2, pool_min_chars=0) == [trained.encode(t) for t in texts * 4]


def test_decode_replaces_invalid_utf8(trained):
    assert trained.decode([0xC3]) == "\ufffd"
    assert trained.decode([ord("a"), 0xFF, ord("b")]) == "a\ufffdb"


def test_save_load_keeps_ids_and_hash(trained, tmp_path):
    digest = trained.save(tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert digest == trained.hash == loaded.hash
    assert loaded.vocab == trained.vocab and loaded.merges == trained.merges
    assert loaded.special_tokens == SPECIALS
    text = "A test <pad> of saving." + EOT
    assert loaded.encode(text) == trained.encode(text)
    assert trained.save(tmp_path / "tok") == digest  # saving again replaces it in place


def test_from_files_with_a_gpt2_style_vocab(trained, tmp_path):
    """GPT-2 numbers bytes in byte-to-unicode order, not by value; the ids follow the files."""
    order = list(bytes_to_unicode())  # printable bytes first, like GPT-2's vocab.json
    vocab = {i: bytes([b]) for i, b in enumerate(order)}
    for a, b in trained.merges:
        vocab[len(vocab)] = a + b
    (tmp_path / "vocab.json").write_text(vocab_json(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges_txt(trained.merges), encoding="utf-8")
    gpt2 = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT])
    assert gpt2.eot_id == len(vocab)  # appended: it was missing from the vocab
    text = "Hello, world! Ünïcödé 123" + EOT + " the end\n"
    assert gpt2.encode(text) == reference.encode(text, gpt2.vocab, gpt2.merges, [EOT])
    assert gpt2.decode(gpt2.encode(text)) == text


def test_overlapping_special_tokens_longest_wins():
    vocab = {i: bytes([i]) for i in range(256)}
    tok = Tokenizer(vocab, [], ["<|a|>", "<|a|><|a|>", "|>"])
    ids = tok.encode("x<|a|><|a|>y<|a|>|>")
    assert ids == [ord("x"), tok.special_ids["<|a|><|a|>"], ord("y"), tok.special_ids["<|a|>"], tok.special_ids["|>"]]
