"""Hugging Face and tiktoken: our ids equal theirs, and tokenizers travel both ways unchanged.

The peers' tokenizers are built here from ours (trained on the shipped sample), so no
network is needed: tiktoken from our ranks and pattern, Hugging Face from the
tokenizer.json every saved directory holds.
"""

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer, train_bpe
from lmdata.tokenizer.saved import is_lmdata_tokenizer_dir

from text_strategies import PIECES

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

EOT = "<|endoftext|>"
SPECIALS = [EOT, "<pad>"]
SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"
MULTILINGUAL = PIECES + [
    "Hello", " world", "Ünïcödé", " naïve", "日本語", "中文字", " Привет", "мир", "مرحبا", "שלום", "नमस्ते", "ﬁ",
    "😀", "👍🏽", "🇫🇷", "\u200d", "   ", "\n\n\n", " \n", "\t\t", "  \t\n ", "12345", "3.14", "x²", "DON'T", "'LL",
    "e\u0301", "ǅ", "ʰ", "Ⅻ", "...", "!!\n", "a/b", "http://x.y/z",
]
texts = st.lists(st.sampled_from(MULTILINGUAL), max_size=40).map("".join)


@pytest.fixture(scope="module", params=["gpt2", "cl100k"])
def ours(request, tmp_path_factory):
    """A 1,000-id tokenizer trained on the sample with the pattern, saved (so it has its HF file)."""
    tmp = tmp_path_factory.mktemp(request.param)
    text = SAMPLE.read_text(encoding="utf-8")[:300_000] + "".join(MULTILINGUAL) * 30
    (tmp / "in.txt").write_text(text, encoding="utf-8")
    vocab, merges = train_bpe(tmp / "in.txt", 1000, SPECIALS, workers=1, pattern=request.param)
    tok = Tokenizer(vocab, merges, SPECIALS, request.param)
    tok.save(tmp / "tok")
    return tok, tmp / "tok"


@pytest.fixture(scope="module")
def peers(ours):
    tok, saved = ours
    ranks = {b: i for i, b in tok.vocab.items() if i not in tok.special_ids.values()}
    tt = tiktoken.Encoding("ours", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens=tok.special_ids)
    hf = tokenizers.Tokenizer.from_file(str(saved / "tokenizer.json"))
    return tt, hf


def _check(tok, peers, text):
    tt, hf = peers
    ids = tok.encode(text)
    assert ids == tt.encode(text, allowed_special="all")
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert tok.encode_ordinary(text) == tt.encode_ordinary(text)


def test_ids_equal_tiktoken_and_hf_on_the_sample(ours, peers):
    tok, _ = ours
    text = SAMPLE.read_text(encoding="utf-8")
    _check(tok, peers, text)
    _check(tok, peers, text[:5000] + EOT + text[5000:9000] + "<pad>")


@settings(max_examples=300, deadline=None)
@given(texts)
def test_ids_equal_tiktoken_and_hf_on_multilingual_text(ours, peers, text):
    _check(ours[0], peers, text)


def test_transformers_auto_tokenizer_loads_our_directory(ours):
    transformers = pytest.importorskip("transformers")
    tok, saved = ours
    auto = transformers.AutoTokenizer.from_pretrained(str(saved))
    text = "Hello world, the end. 日本語 😀\n\n" + EOT
    assert auto.encode(text, add_special_tokens=False) == tok.encode(text)
    assert auto.decode(tok.encode(text)) == text


def test_export_then_import_gives_the_same_hash(ours, tmp_path):
    tok, saved = ours
    (tmp_path / "t.json").write_text(tok.to_hf_json(), encoding="utf-8")
    (tmp_path / "r.tiktoken").write_text(tok.to_tiktoken(), encoding="ascii")
    from_hf = Tokenizer.from_hf(tmp_path / "t.json")
    from_tt = Tokenizer.from_tiktoken(tmp_path / "r.tiktoken", tok.pattern_name, tok.special_ids)
    assert from_hf.hash == from_tt.hash == tok.hash == Tokenizer.load(saved).hash
    assert from_hf.pattern == from_tt.pattern == tok.pattern
    text = "Round trip, 日本語 😀" + EOT
    assert from_hf.encode(text) == from_tt.encode(text) == tok.encode(text)


def test_gpt2_pattern_hash_is_unchanged_and_old_directories_load(tmp_path):
    """A version-1 directory (metadata in tokenizer.json) loads with the hash it was saved with."""
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"th", 257: EOT.encode()}
    tok = Tokenizer(vocab, [(b"t", b"h")], [EOT])
    # the hash a version-1 lmdata recorded for this tokenizer
    assert tok.hash == "sha256:" + __import__("hashlib").sha256(json.dumps(
        ["lmdata-bpe", 1, tok.pattern, [EOT], _digests(tok)], sort_keys=True).encode()).hexdigest()
    old = tmp_path / "old"
    old.mkdir()
    from lmdata.tokenizer.bytes_unicode import merges_txt, vocab_json

    (old / "vocab.json").write_text(vocab_json(tok.vocab), encoding="utf-8")
    (old / "merges.txt").write_text(merges_txt(tok.merges), encoding="utf-8")
    meta = {"format": "lmdata-bpe", "version": 1, "pattern": tok.pattern, "special_tokens": [EOT],
            "vocab_size": 258, "files": _digests(tok), "hash": tok.hash}
    (old / "tokenizer.json").write_text(json.dumps(meta), encoding="utf-8")
    assert is_lmdata_tokenizer_dir(old)
    assert Tokenizer.load(old).hash == tok.hash
    tok.save(old)  # re-saving an old directory upgrades it in place
    assert is_lmdata_tokenizer_dir(old) and Tokenizer.load(old).hash == tok.hash
    assert json.loads((old / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def _digests(tok):
    import hashlib

    from lmdata.tokenizer.bytes_unicode import merges_txt, vocab_json

    return {"vocab.json": hashlib.sha256(vocab_json(tok.vocab).encode()).hexdigest(),
            "merges.txt": hashlib.sha256(merges_txt(tok.merges).encode()).hexdigest()}


def test_is_lmdata_tokenizer_dir(ours, tmp_path):
    assert is_lmdata_tokenizer_dir(ours[1])
    assert not is_lmdata_tokenizer_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text(ours[0].to_hf_json())  # a Hugging Face directory is not ours
    assert not is_lmdata_tokenizer_dir(tmp_path)
    (tmp_path / "lmdata_tokenizer.json").write_text('{"format": "lmdata-bpe", "vers')
    assert not is_lmdata_tokenizer_dir(tmp_path)
    (tmp_path / "lmdata_tokenizer.json").write_text('{"format": "lmdata-bpe", "version": 99}')
    assert not is_lmdata_tokenizer_dir(tmp_path)
    assert not is_lmdata_tokenizer_dir(tmp_path / "nope")


@pytest.mark.parametrize("pattern", ["o200k", r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"])
def test_other_patterns_match_tiktoken(tmp_path, pattern):
    text = SAMPLE.read_text(encoding="utf-8")[:60_000] + "".join(MULTILINGUAL) * 10
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    tok = Tokenizer(*train_bpe(tmp_path / "in.txt", 600, [EOT], workers=1, pattern=pattern), [EOT], pattern)
    ranks = {b: i for i, b in tok.vocab.items() if i != tok.eot_id}
    tt = tiktoken.Encoding("x", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens=tok.special_ids)
    assert tok.encode(text) == tt.encode(text, allowed_special="all")
    assert tok.encode_batch([text[:999], text, ""], 2, pool_min_chars=0) == [tok.encode(t) for t in [text[:999], text, ""]]


# ---------------------------------------------------------------------------- bad input


def test_truncated_tokenizer_json(ours, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(ours[0].to_hf_json()[:5000])
    with pytest.raises(LmdataError, match=r"tokenizer\.json.*complete") as exc:
        Tokenizer.from_hf(path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("change, message", [
    ({"model": {"type": "WordPiece", "vocab": {}}}, "WordPiece"),
    ({"model": {"type": "Unigram", "vocab": []}}, "Unigram"),
    ({"model": {"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": True}}, "byte-fallback"),
    ({"normalizer": {"type": "NFC"}}, "normalizer"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "byte-level"),
])
def test_unrepresentable_hf_tokenizers(ours, tmp_path, change, message):
    data = json.loads(ours[0].to_hf_json()) | change
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(LmdataError, match=message):
        Tokenizer.from_hf(tmp_path / "t.json")


def test_tiktoken_file_with_a_gap_in_its_ranks(ours, tmp_path):
    lines = ours[0].to_tiktoken().splitlines(keepends=True)
    (tmp_path / "r.tiktoken").write_text("".join(lines[:300] + lines[301:]))
    with pytest.raises(LmdataError, match="rank 300 is missing"):
        Tokenizer.from_tiktoken(tmp_path / "r.tiktoken", "gpt2")


def test_tiktoken_special_token_on_an_ordinary_rank(ours, tmp_path):
    (tmp_path / "r.tiktoken").write_text(ours[0].to_tiktoken())
    with pytest.raises(LmdataError, match="--special-token"):
        Tokenizer.from_tiktoken(tmp_path / "r.tiktoken", "gpt2", {EOT: 5})


@pytest.mark.parametrize("pattern", ["gpt4", "cl100", "GPT2"])
def test_unknown_pattern_name(pattern):
    with pytest.raises(LmdataError, match="unknown pattern name"):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], [], pattern)


def test_invalid_regex_pattern():
    with pytest.raises(LmdataError, match="not a valid regex"):
        Tokenizer({i: bytes([i]) for i in range(256)}, [], [], r"(\p{L}+")


# ---------------------------------------------------------------------------- ingest


def test_imported_o200k_size_vocab_ingests_to_uint32(tmp_path):
    """A synthetic 200k-rank tiktoken file (every 2-byte token, then 3-byte ones) -> uint32 shards."""
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.store import open_store

    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes([a, b]) for a in range(256) for b in range(256)]
    letters = b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,'"
    tokens += [bytes([a, b, c]) for a in letters for b in letters for c in letters][: 200_000 - len(tokens)]
    import base64

    (tmp_path / "o.tiktoken").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    tok = Tokenizer.from_tiktoken(tmp_path / "o.tiktoken", "o200k", {EOT: 200_018})
    assert tok.vocab_size == 200_019 and tok.pattern_name == "o200k"
    tok.save(tmp_path / "tok")
    (tmp_path / "in.txt").write_text("the cat sat\n" + EOT + "\nabc, cab\n", encoding="utf-8")
    ingest({"train": SourceSpec((str(tmp_path / "in.txt"),))}, tmp_path / "tok", tmp_path / "s",
           formats=["memmap"], workers=1, progress=False, log=None)
    store = open_store(tmp_path / "s")
    assert store.manifest.dtype == "uint32"
    doc = store.document("train", 1, "memmap").tolist()
    assert doc[-1] == 200_018 and tok.decode(doc[:-1]).strip() == "abc, cab"
    assert max(doc[:-1]) > 65_535


def test_a_gap_in_the_ranks_at_a_special_tokens_id_imports_and_exports(ours, tmp_path):
    """tiktoken's p50k_base has no rank 50256: <|endoftext|> sits there. The import had refused any gap, and the
    export a tokenizer whose special tokens come first (as Hugging Face's trainers place them)."""
    tok = ours[0]
    ordinary = sorted((i, b) for i, b in tok.vocab.items() if i not in tok.special_ids.values())
    ranks = {b: i + (i >= 600) for i, b in ordinary}  # rank 600 left free, the order kept
    path = tmp_path / "gap.tiktoken"
    path.write_text("".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in sorted(ranks.items(), key=lambda x: x[1])))
    with pytest.raises(LmdataError, match=r"rank 600 is missing .*a gap the id of a --special-token"):
        Tokenizer.from_tiktoken(path, tok.pattern)
    imported = Tokenizer.from_tiktoken(path, tok.pattern, {"<|gap|>": 600, EOT: len(ranks) + 1})
    tt = tiktoken.Encoding("gap", pat_str=tok.pattern, mergeable_ranks=ranks,
                           special_tokens={"<|gap|>": 600, EOT: len(ranks) + 1})
    for text in ("hello world, 12345 <|gap|> x", SAMPLE.read_text(encoding="utf-8")[:3000], *MULTILINGUAL):
        assert imported.encode(text) == tt.encode(text, allowed_special="all")
    (tmp_path / "again.tiktoken").write_text(imported.to_tiktoken())
    again = Tokenizer.from_tiktoken(tmp_path / "again.tiktoken", tok.pattern, {"<|gap|>": 600, EOT: len(ranks) + 1})
    assert again.hash == imported.hash


def test_a_compressed_ranks_file_is_called_binary(tmp_path):
    import gzip

    (tmp_path / "r.tiktoken.gz").write_bytes(gzip.compress(b"IQ== 0\n"))
    with pytest.raises(LmdataError, match=r"r.tiktoken.gz: binary, not a tiktoken ranks file .*decompressed first$"):
        Tokenizer.from_tiktoken(tmp_path / "r.tiktoken.gz", "gpt2")
