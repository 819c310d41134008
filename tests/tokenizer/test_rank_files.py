"""tiktoken rank files as projects ship them: tokens that are not merges, the empty token.

Llama 3's ranks hold tokens that are not a merge of two lower ranks (``b'.:.:'``, rank
100421); tiktoken encodes with them anyway: a pre-token that is a token is that token, else
the adjacent pair whose concatenation ranks lowest merges first, one pair at a time.  Such
a file imports ``ranked`` and must give tiktoken's ids, on the C path and in pure Python.
The files are built here from a tokenizer trained on the sample, with such tokens inserted
among its ranks (no network).
"""

import base64
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.tokenizer import Tokenizer, train_bpe

from text_strategies import PIECES

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

EOT = "<|endoftext|>"
SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"
# tokens no pair of lower ranks makes: Llama 3's, runs, a space run, a UTF-8 fragment
ODD = [b".:.:", b"aaaa", b"  the", b"ing the", b"e e", b"\xe4\xb8", b"::", b"....", b"ablyab", b"\n\n\n\n"]
ADVERSARIAL = [".:.: .:.:.:.: a.:.:b", "aaaaaaaaaaa aaaa", "ing the ing thing the", "e e e e e", "中文字 中",
               "::::::::", ".......", " manablyablyab", "\n\n\n\n\n\n", "  the   the", "x" * 500, ".:" * 300]
MULTILINGUAL = PIECES + ["Ünïcödé", " naïve", "日本語", " Привет", "مرحبا", "नमस्ते", "😀", "👍🏽", "\u200d", "   ",
                         "\n\n\n", "\t\t", "12345", "DON'T", "'LL", "e\u0301"] + [t.decode("utf-8", "replace") for t in ODD]
texts = st.lists(st.sampled_from(MULTILINGUAL), max_size=40).map("".join)


def write_ranks(path: Path, tokens: list[bytes]) -> dict[bytes, int]:
    ranks = {t: i for i, t in enumerate(tokens)}
    path.write_text("".join(f"{base64.b64encode(t).decode() or '='} {i}\n" for t, i in ranks.items()))
    return ranks


# Llama 3's own regex: a custom pattern (pre-tokenized by the regex module, BPE in C)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module", params=["gpt2", "cl100k", LLAMA3], ids=["gpt2", "cl100k", "llama3"])
def odd_file(request, tmp_path_factory):
    """A ranks file of 1,500 trained tokens plus ~300 that are not merges, inserted at random ranks."""
    tmp = tmp_path_factory.mktemp("ranks")
    (tmp / "in.txt").write_text(SAMPLE.read_text(encoding="utf-8")[:200_000], encoding="utf-8")
    vocab, _ = train_bpe(tmp / "in.txt", 1500, [], workers=1, pattern=request.param)
    tokens = [vocab[i] for i in sorted(vocab)]
    rng = random.Random(0)
    extra = ODD + [rng.choice(tokens[256:]) + rng.choice(tokens[256:]) for _ in range(300)]
    for t in dict.fromkeys(extra):
        if t not in tokens:
            tokens.insert(rng.randrange(300, len(tokens)), t)
    ranks = write_ranks(tmp / "odd.tiktoken", tokens)
    specials = {EOT: len(ranks)}
    tt = tiktoken.Encoding("odd", pat_str=Tokenizer({i: bytes([i]) for i in range(256)}, [], [], request.param).pattern,
                           mergeable_ranks=ranks, special_tokens=specials)
    return tmp / "odd.tiktoken", request.param, specials, tt


@pytest.fixture(params=["c", "python"])
def odd(request, odd_file, monkeypatch):
    """The file imported on the C path, then in pure Python."""
    if request.param == "python":
        monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    path, pattern, specials, tt = odd_file
    tok = Tokenizer.from_tiktoken(path, pattern, specials)
    assert tok.accelerated == (request.param == "c")
    return tok, tt


def test_a_file_with_non_merge_tokens_imports_ranked(odd):
    tok, tt = odd
    assert tok.ranked
    assert tok.encode(".:.:") == [tt.encode_single_token(b".:.:")]  # a whole pre-token no pair reaches


def test_ids_equal_tiktoken_on_the_sample_and_adversarial_text(odd):
    tok, tt = odd
    text = SAMPLE.read_text(encoding="utf-8")[:80_000]
    for t in [text, text[:3000] + EOT + text[3000:6000], *ADVERSARIAL]:
        assert tok.encode(t) == tt.encode(t, allowed_special="all"), t[:60]
        assert tok.encode_ordinary(t) == tt.encode_ordinary(t)
    produced = set(tt.encode_ordinary(" ".join(ADVERSARIAL) + text))
    assert sum(tt.encode_single_token(t) in produced for t in ODD) >= 3  # the odd tokens are really used
    batch = [text[:5000], *ADVERSARIAL, ""]
    want = [tt.encode(t, allowed_special="all") for t in batch]
    assert tok.encode_batch(batch, 2, pool_min_chars=0) == want
    arrays = tok.encode_arrays(batch, num_workers=2, pool_min_chars=0)
    assert arrays.tokens.tolist() == [i for ids in want for i in ids]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_ids_equal_tiktoken_on_multilingual_text(odd, text):
    tok, tt = odd
    assert tok.encode(text) == tt.encode(text, allowed_special="all")


def test_ranked_tokenizer_saves_loads_and_exports(odd_file, tmp_path):
    path, pattern, specials, tt = odd_file
    tok = Tokenizer.from_tiktoken(path, pattern, specials)
    tok.save(tmp_path / "tok")
    assert json.loads((tmp_path / "tok" / "lmdata_tokenizer.json").read_text())["bpe"] == "ranks"
    back = Tokenizer.load(tmp_path / "tok")
    assert back.ranked and back.hash == tok.hash
    assert tok.to_tiktoken() == path.read_text()  # the file travels back unchanged
    # the same vocab and merges encoded by merge order would be another tokenizer: another hash
    assert Tokenizer(tok.vocab, tok.merges, tok.special_tokens, pattern).hash != tok.hash
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))  # ignore_merges, as Llama 3's
    assert json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["model"]["ignore_merges"] is True
    # that file imported back: HF's ignore_merges (merges by order, whole words first), HF's ids
    from_hf = Tokenizer.from_hf(tmp_path / "tok" / "tokenizer.json")
    assert from_hf.bpe == "words" and not from_hf.ranked
    from_hf.save(tmp_path / "tok-hf")
    assert Tokenizer.load(tmp_path / "tok-hf").hash == from_hf.hash != tok.hash
    for t in [SAMPLE.read_text(encoding="utf-8")[:20_000], *ADVERSARIAL, EOT.join(ADVERSARIAL)]:
        want = tt.encode(t, allowed_special="all")
        assert hf.encode(t, add_special_tokens=False).ids == back.encode(t) == want
        assert from_hf.encode(t) == want


@settings(max_examples=100, deadline=None)
@given(texts)
def test_an_ignore_merges_tokenizer_json_gives_hugging_faces_ids(odd_hf, text):
    """A tokenizer.json with every split of every token as merges and ignore_merges (Llama 3's form)."""
    ours, hf = odd_hf
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def odd_hf(odd_file, tmp_path_factory):
    path, pattern, specials, _ = odd_file
    out = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    out.write_text(Tokenizer.from_tiktoken(path, pattern, specials).to_hf_json())
    return Tokenizer.from_hf(out), tokenizers.Tokenizer.from_file(str(out))


def test_ranked_tokenizer_ingests_and_decodes(odd_file, tmp_path):
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.store import open_store

    path, pattern, specials, tt = odd_file
    Tokenizer.from_tiktoken(path, pattern, specials).save(tmp_path / "tok")
    doc = ".:.: aaaa ing the, e e...."
    (tmp_path / "in.txt").write_text(doc + "\n" + EOT + "\n" + SAMPLE.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    ingest({"train": SourceSpec((str(tmp_path / "in.txt"),))}, tmp_path / "tok", tmp_path / "s",
           formats=["memmap"], workers=2, progress=False, log=None)
    ids = open_store(tmp_path / "s").document("train", 0, "memmap").tolist()
    assert ids == tt.encode(doc) + [specials[EOT]]  # (a document's edge newlines are trimmed)
    assert tt.encode_single_token(b".:.:") in ids


def test_a_proper_file_keeps_one_merge_per_token(tmp_path):
    """A ranks file of merges only (what our export writes) is not ranked: the encoder's merge table."""
    (tmp_path / "in.txt").write_text(SAMPLE.read_text(encoding="utf-8")[:50_000], encoding="utf-8")
    tok = Tokenizer(*train_bpe(tmp_path / "in.txt", 400, [EOT], workers=1), [EOT])
    (tmp_path / "r.tiktoken").write_text(tok.to_tiktoken())
    back = Tokenizer.from_tiktoken(tmp_path / "r.tiktoken", "gpt2", tok.special_ids)
    assert not back.ranked and back.merges == tok.merges and back.hash == tok.hash


# ---------------------------------------------------------------------------- the empty token


def test_the_empty_token_line_is_accepted_and_its_id_stays_reserved(tmp_path, monkeypatch):
    """Whisper's multilingual.tiktoken ends with '= 50256': base64 of b"", then its rank."""
    (tmp_path / "in.txt").write_text(SAMPLE.read_text(encoding="utf-8")[:50_000], encoding="utf-8")
    vocab, _ = train_bpe(tmp_path / "in.txt", 400, [], workers=1)
    tokens = [vocab[i] for i in sorted(vocab)]
    ranks = write_ranks(tmp_path / "w.tiktoken", tokens + [b""])
    assert (tmp_path / "w.tiktoken").read_text().splitlines()[-1] == "= 400"
    specials = {EOT: 401}
    tt = tiktoken.Encoding("w", pat_str=Tokenizer(vocab, [], []).pattern, mergeable_ranks=ranks,
                           special_tokens=specials)
    text = SAMPLE.read_text(encoding="utf-8")[:20_000] + "".join(MULTILINGUAL) + EOT + "\x00"
    for pure in ("0", "1"):
        monkeypatch.setenv("LMDATA_PURE_PYTHON", pure)
        tok = Tokenizer.from_tiktoken(tmp_path / "w.tiktoken", "gpt2", specials)
        ids = tok.encode(text)
        assert ids == tt.encode(text, allowed_special="all") and 400 not in ids
        assert tok.decode_bytes([400]) == b"" == tt.decode_bytes([400])
        assert tok.decode_bytes([65, 400, 66]) == b"AB"
    assert tok.to_tiktoken() == (tmp_path / "w.tiktoken").read_text()
    tok.save(tmp_path / "tok")
    assert Tokenizer.load(tmp_path / "tok").decode_bytes([400]) == b""


def test_a_broken_first_line_is_refused_before_the_rest_is_read(tmp_path):
    """Issue 29.16: the file was read whole before any check (736 MB to reject a broken first line of a
    10 M-line file).  Here the rest of the file is not written until the reader has answered: a reader
    that waits for the whole file sees it only after the writer gives up waiting (and then answers late)."""
    import os
    import threading

    from lmdata.errors import LmdataError
    from lmdata.tokenizer import tiktoken_ranks

    fifo = tmp_path / "r.tiktoken"
    os.mkfifo(fifo)
    answered, rest_written = threading.Event(), threading.Event()

    def writer():
        try:
            with open(fifo, "wb", buffering=0) as f:
                f.write(b"not-base64! 0\n")
                answered.wait(30)
                if not answered.is_set():
                    rest_written.set()
                f.write(b"YQ== 1\n" * 1000)
        except BrokenPipeError:  # the reader had stopped, as it should
            pass

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with pytest.raises(LmdataError, match=r"r.tiktoken:1: expected 'base64-token rank', got b'not-base64! 0'$"):
            tiktoken_ranks.read(fifo)
    finally:
        answered.set()
        thread.join()
    assert not rest_written.is_set()


@pytest.mark.parametrize("line", [b"YQ== -1", b"YQ== 1_0", b"YQ== +1"])
def test_a_rank_that_is_not_plain_digits_is_refused_naming_the_line(tmp_path, line):
    from lmdata.errors import LmdataError
    from lmdata.tokenizer import tiktoken_ranks

    (tmp_path / "r.tiktoken").write_bytes(b"Yg== 0\n" + line + b"\n")
    with pytest.raises(LmdataError, match="r.tiktoken:2: expected 'base64-token rank'"):
        tiktoken_ranks.read(tmp_path / "r.tiktoken")
