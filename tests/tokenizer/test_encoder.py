"""Encoding matches the reference, round-trips, streams, and survives files and GPT-2 vocabs.

Encoder tests run on both backends: the C accelerator ("c", skipped where it was not built)
and the pure-Python path ("python"), each checked against ``reference``.
"""

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer import encoder as encoder_module
from lmdata.tokenizer.bytes_unicode import bytes_to_unicode, merges_txt, vocab_json

import bpe_reference as reference
from text_strategies import PIECES, SPECIALS, texts

EOT = "<|endoftext|>"
SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"


def with_backend(tok: Tokenizer, backend: str) -> Tokenizer:
    """``tok`` itself on "c" (skipped where the extension was not built); without it on "python"."""
    if backend == "c" and not tok.accelerated:
        pytest.skip("the C accelerator lmdata.tokenizer._fastbpe is not built here")
    if backend == "python":
        tok._fast = None
    return tok


@pytest.fixture(scope="module")
def trained_files(tmp_path_factory):
    """Vocab and merges of a 600-id tokenizer trained on a slice of the sample plus the test pieces."""
    path = tmp_path_factory.mktemp("tok") / "in.txt"
    text = SAMPLE.read_text(encoding="utf-8")[:200_000] + "".join(PIECES) * 20
    path.write_text(text, encoding="utf-8")
    return train_bpe(path, 600, SPECIALS, workers=1)


@pytest.fixture(scope="module", params=["c", "python"])
def trained(trained_files, request):
    """That tokenizer on each backend."""
    return with_backend(Tokenizer(*trained_files, SPECIALS), request.param)


@pytest.mark.parametrize("backend", ["c", "python"])
def test_hand_worked_example(backend):
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"aa", 257: b"aab", 258: b"aaa", 259: EOT.encode()}
    tok = with_backend(Tokenizer(vocab, [(b"a", b"a"), (b"aa", b"b"), (b"aa", b"a")], [EOT]), backend)
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
    sliced._fast = trained._fast and sliced._fast
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


def test_one_megabyte_pretoken_encodes_alike_on_both_backends(trained_files):
    """The pathological case: 1 MB of one letter, no spaces, is one pre-token (heap BPE)."""
    fast = with_backend(Tokenizer(*trained_files, SPECIALS), "c")
    pure = with_backend(Tokenizer(*trained_files, SPECIALS), "python")
    for text in ("e" * 1_000_000, "the" * 333_333):
        ids = fast.encode(text)
        assert ids == pure.encode(text)
        assert fast.decode(ids) == text


@pytest.fixture(scope="module")
def both(trained_files):
    """The trained tokenizer on the C and on the Python backend."""
    return (with_backend(Tokenizer(*trained_files, SPECIALS), "c"),
            with_backend(Tokenizer(*trained_files, SPECIALS), "python"))


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=60) | st.text(max_size=60))
def test_backends_agree_on_ascii_and_any_text(both, text):
    """The C path pre-tokenizes ASCII chunks itself (U+001C..U+001F are not \\s for `regex`)."""
    fast, pure = both
    assert fast.encode_ordinary(text) == pure.encode_ordinary(text)
    assert fast.encode(text) == pure.encode(text) == reference.encode(text, pure.vocab, pure.merges, SPECIALS)
    word = text.encode("utf-8")
    assert fast._fast.bpe(word) == list(pure._bpe(text))


@pytest.mark.parametrize("backend", ["c", "python"])
def test_merge_whose_result_pair_ranks_first_waits_a_step(backend):
    """(aa, a) ranks before (a, a): all "aa" pairs merge first, as the reference's one pass."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"aaa", 257: b"aa"}
    tok = with_backend(Tokenizer(vocab, [(b"aa", b"a"), (b"a", b"a")]), backend)
    for n in range(1, 9):
        text = "a" * n
        assert tok.encode(text) == reference.encode(text, tok.vocab, tok.merges, [])
    long = "a" * 301  # the heap path
    assert tok.encode(long) == reference.encode(long, tok.vocab, tok.merges, [])


def test_pure_python_env_var(trained_files, monkeypatch):
    monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    assert not Tokenizer(*trained_files, SPECIALS).accelerated
    monkeypatch.setenv("LMDATA_PURE_PYTHON", "0")
    assert Tokenizer(*trained_files, SPECIALS).accelerated == (encoder_module._fastbpe is not None)


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


@pytest.mark.parametrize("backend", ["c", "python"])
def test_from_files_with_a_gpt2_style_vocab(trained, tmp_path, backend):
    """GPT-2 numbers bytes in byte-to-unicode order, not by value; the ids follow the files."""
    order = list(bytes_to_unicode())  # printable bytes first, like GPT-2's vocab.json
    vocab = {i: bytes([b]) for i, b in enumerate(order)}
    for a, b in trained.merges:
        vocab[len(vocab)] = a + b
    (tmp_path / "vocab.json").write_text(vocab_json(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text(merges_txt(trained.merges), encoding="utf-8")
    gpt2 = with_backend(Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT]), backend)
    assert gpt2.eot_id == len(vocab)  # appended: it was missing from the vocab
    text = "Hello, world! Ünïcödé 123" + EOT + " the end\n"
    assert gpt2.encode(text) == reference.encode(text, gpt2.vocab, gpt2.merges, [EOT])
    assert gpt2.decode(gpt2.encode(text)) == text


@pytest.mark.parametrize("backend", ["c", "python"])
def test_overlapping_special_tokens_longest_wins(backend):
    vocab = {i: bytes([i]) for i in range(256)}
    tok = with_backend(Tokenizer(vocab, [], ["<|a|>", "<|a|><|a|>", "|>"]), backend)
    ids = tok.encode("x<|a|><|a|>y<|a|>|>")
    assert ids == [ord("x"), tok.special_ids["<|a|><|a|>"], ord("y"), tok.special_ids["<|a|>"], tok.special_ids["|>"]]


@pytest.fixture(scope="module", params=["cl100k", "o200k", r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+"])
def patterned(request, tmp_path_factory):
    """A 500-id tokenizer trained with another pattern, on the C and the Python backend."""
    path = tmp_path_factory.mktemp("pat") / "in.txt"
    path.write_text(SAMPLE.read_text(encoding="utf-8")[:100_000] + "".join(PIECES) * 20, encoding="utf-8")
    vocab, merges = train_bpe(path, 500, SPECIALS, workers=1, pattern=request.param)
    fast = Tokenizer(vocab, merges, SPECIALS, request.param)
    pure = Tokenizer(vocab, merges, SPECIALS, request.param)
    pure._fast = None
    return fast, pure


@settings(max_examples=200, deadline=None)
@given(texts | st.text(max_size=60))
def test_every_pattern_matches_reference_on_both_backends(patterned, text):
    fast, pure = patterned
    want = reference.encode(text, pure.vocab, pure.merges, SPECIALS, pure.pattern)
    assert pure.encode(text) == want
    assert fast.encode(text) == want
    assert list(fast.encode_iterable([text[: len(text) // 2], text[len(text) // 2 :]], min_buffer=1)) == want


def test_encode_batch_on_threads_equals_encode(trained_files):
    tok = Tokenizer(*trained_files, SPECIALS)
    text = SAMPLE.read_text(encoding="utf-8")
    docs = text.split("\n\n") + [EOT + "x", "", "<pad> ünï"]
    assert tok.encode_batch(docs, 2, pool_min_chars=0) == [tok.encode(d) for d in docs]
    assert tok.encode_batch(docs, 3) == [tok.encode(d) for d in docs]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_merge_order_matches_reference_at_every_length(data):
    """Arbitrary merge lists (as imported ones may be: a merged token's pairs ranked anywhere)
    over a 3-letter alphabet, words of 1..70 bytes: the C encoder's short-word path (up to 32
    bytes) and heap path (longer) both equal the reference."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    vocab = {i: bytes([i]) for i in range(256)}
    tokens = [b"a", b"b", b"c"]
    merges = []
    for _ in range(rng.randrange(1, 25)):
        a, b = rng.choice(tokens), rng.choice(tokens)
        if a + b in vocab.values():
            continue
        merges.append((a, b))
        vocab[len(vocab)] = a + b
        tokens.append(a + b)
    rng.shuffle(merges)
    tok = Tokenizer(vocab, merges)
    if not tok.accelerated:
        pytest.skip("the C accelerator lmdata.tokenizer._fastbpe is not built here")
    word = "".join(rng.choice("abc") for _ in range(data.draw(st.integers(1, 70))))
    assert tok.encode(word) == reference.encode(word, tok.vocab, tok.merges, [])


WIDE_SPECIALS = ["<|endoftext|>", "<pad>", "日本<|x|>", "😀!", "é"]
_BY_SPECIALS: dict = {}  # tokenizers by special tokens, made once (each holds a 32 MB cache)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES + WIDE_SPECIALS + ["<", "日", "😀", "x" * 7]), max_size=40).map("".join),
       st.sampled_from([SPECIALS, ["<|endoftext|>"], WIDE_SPECIALS]))
def test_special_tokens_split_in_c_at_every_string_width(trained_files, text, specials):
    """The C encoder splits special tokens itself (memchr, a 4-chars-at-a-time scan or a plain
    one by str width, one first character or several): the reference's ids; encode_ordinary
    and encode_many agree too."""
    key = tuple(specials)
    if key not in _BY_SPECIALS:
        _BY_SPECIALS[key] = Tokenizer(*trained_files, specials)
    if () not in _BY_SPECIALS:
        _BY_SPECIALS[()] = Tokenizer(*trained_files)
    tok = _BY_SPECIALS[key]
    want = reference.encode(text, tok.vocab, tok.merges, specials)
    assert tok.encode(text) == want
    assert tok.encode_batch([text, text + "é"], 2, pool_min_chars=0) == [want, tok.encode(text + "é")]
    assert tok.encode_ordinary(text) == _BY_SPECIALS[()].encode(text)


def test_shared_cache_across_threads_gives_the_same_ids(trained_files):
    """encode_batch's threads share one chunk cache; a small one fills and is cleared meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    tok = Tokenizer(*trained_files, SPECIALS)
    text = SAMPLE.read_text(encoding="utf-8")
    docs = [d for d in text.split("\n") if d][:2000] * 3
    fresh = Tokenizer(*trained_files, SPECIALS)
    want = [fresh.encode(d) for d in docs]
    if tok.accelerated:
        from lmdata.tokenizer import _fastbpe, encoder

        mode = tok._pattern.c_mode
        tok._fast = _fastbpe.Encoder([(ord(p[0]), ord(p[1]), ord(m)) for p, m in tok._by_rank], tok._byte_ids,
                                     tok._pattern.findall, 64, encoder._MAX_CACHED_CHUNK - 1, mode, max(tok.vocab) + 1)
        tok._fast.set_specials(list(tok.special_ids.items()))
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert [x for part in pool.map(tok._encode_list, [docs[i::4] for i in range(4)]) for x in part] == [
                x for i in range(4) for x in want[i::4]]


def test_save_writes_its_files_as_made_not_held_whole(tmp_path):
    """Issue 29 (smaller): 20 MB of spaces trains tokens of up to 16 M spaces, and save held vocab.json,
    merges.txt and tokenizer.json whole at once (1.5 GB of files: 2.5 GB peak).  Here: tokens of up to
    4 M spaces (8 MB of text per file); save's Python allocations stay within a few times the largest."""
    import tracemalloc

    vocab = {i: bytes([i]) for i in range(256)}
    merges, tok = [], b" "
    for _ in range(22):
        merges.append((tok, tok))
        tok += tok
        vocab[len(vocab)] = tok
    t = Tokenizer(vocab, merges, [EOT])
    tracemalloc.start()
    try:
        digest = t.save(tmp_path / "tok")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * len(tok), f"{peak / 1e6:.0f} MB to save a tokenizer whose largest token is 4 MB"
    back = Tokenizer.load(tmp_path / "tok")
    assert digest == back.hash == t.hash and back.encode(" " * 100_001) == t.encode(" " * 100_001)


@pytest.mark.parametrize("specials", [[EOT], [EOT, "Ġ", " "], []])  # "Ġ": a special that is an ordinary key
def test_the_files_written_in_pieces_are_the_texts_json_writes(tmp_path, specials):
    """vocab.json, merges.txt and tokenizer.json are written a token at a time; their text is what
    json.dumps of the whole made before (so every tokenizer keeps its hash)."""
    import json

    from lmdata.tokenizer.bytes_unicode import token_to_str

    (tmp_path / "in.txt").write_text("the quick brown fox, 12345 jumps.\n\n" * 40 + "日本語 ", encoding="utf-8")
    vocab, merges = train_bpe(tmp_path / "in.txt", 320, [], workers=1)
    t = Tokenizer(vocab, merges, specials)
    assert vocab_json(t.vocab) == json.dumps({token_to_str(b): i for i, b in sorted(t.vocab.items())},
                                             ensure_ascii=False, indent=0) + "\n"
    assert merges_txt(t.merges) == "\n".join(["#version: 0.2"] + [f"{token_to_str(a)} {token_to_str(b)}"
                                                                  for a, b in t.merges]) + "\n"
    data = json.loads(t.to_hf_json())
    ids = set(t.special_ids.values())
    data["model"]["vocab"] = {token_to_str(b) if i not in ids else b.decode(): i for i, b in sorted(t.vocab.items())}
    assert t.to_hf_json() == json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    t.save(tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8") == t.to_hf_json()
    assert (tmp_path / "tok" / "vocab.json").read_text(encoding="utf-8") == vocab_json(t.vocab)


def test_decode_refuses_float_and_bool_ids_and_takes_numpy_ints_in_a_list(trained):
    """The vocab is a dict, where 100.0 and True find ids 100 and 1: a float id had decoded."""
    import numpy as np

    for bad in ([100.0, 101], [True], [101, 2.5]):
        with pytest.raises(Exception, match="not a token id"):
            trained.decode(bad)
    assert trained.decode([np.int64(100), 101]) == trained.decode([100, 101]) == trained.decode(np.array([100, 101]))
