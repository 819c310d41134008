"""tokenizer.json files in today's shapes, written by the `tokenizers` library itself (``hf_shapes``):
DeepSeek's chain of three isolating Splits before ByteLevel, Llama 3's one Split, and a no-op
normalizer (an empty Sequence).  Imported, they give Hugging Face's ids, on the C path and in
pure Python; saved and exported, they travel back unchanged."""

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer

from text_strategies import PIECES

sys.path.insert(0, str(Path(__file__).parents[1]))
from hf_shapes import SHAPES, build  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")

SAMPLE = Path(__file__).parents[2] / "data" / "sample.txt"
MULTILINGUAL = PIECES + [
    "Ünïcödé", " naïve", "日本語", "中文字", "ひらがな", "カタカナ", " Привет", "مرحبا", "नमस्ते", "😀", "👍🏽", "\u200d",
    "12345", "1234567", "x²", "½", "٣", "   ", "\n\n\n", " \n", "\t\t", "DON'T", "'LL", "e\u0301", "!!abc", "…", "——",
    "¿Qué?", "a1b22c333d4444", "<|end_of_text|>", "<|begin_of_text|>",
]
ADVERSARIAL = ["日本語123中文4567ひらがな", "1" * 400, "中" * 300 + "a", "...abc!!!def\n\n\n  x", "\r\n\r\n \t",
               "'s's's 'LL", "<|end_of_text|><|end_of_text|>x<|begin_of_text|>", "x" * 500, ""]
texts = st.lists(st.sampled_from(MULTILINGUAL), max_size=40).map("".join)


@pytest.fixture(scope="module", params=SHAPES)
def shape_file(request, tmp_path_factory):
    path = build(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, path, tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(params=["c", "python"])
def imported(request, shape_file, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    shape, path, hf = shape_file
    tok = Tokenizer.from_hf(path)
    assert tok.accelerated == (request.param == "c")
    return shape, tok, hf


def _ids(hf, text):
    return hf.encode(text, add_special_tokens=False).ids


def test_imported_shapes_give_hugging_faces_ids(imported):
    shape, tok, hf = imported
    if shape == "deepseek":
        assert len(json.loads(tok.pattern)) == 3  # a chain of three regexes
    # Split(Regex) steps + ByteLevel(use_regex=False): the regexes run in the C matcher, GIL released
    assert tok.gil_free == tok.accelerated
    for text in [SAMPLE.read_text(encoding="utf-8")[:60_000], *ADVERSARIAL]:
        assert tok.encode(text) == _ids(hf, text), text[:60]
    assert tok.encode_batch(ADVERSARIAL, 2, pool_min_chars=0) == [_ids(hf, t) for t in ADVERSARIAL]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts)
def test_imported_shapes_give_hugging_faces_ids_on_multilingual_text(imported, text):
    _, tok, hf = imported
    assert tok.encode(text) == _ids(hf, text)


def test_shapes_save_load_and_export_unchanged(shape_file, tmp_path):
    shape, path, hf = shape_file
    tok = Tokenizer.from_hf(path)
    tok.save(tmp_path / "tok")
    back = Tokenizer.load(tmp_path / "tok")
    assert back.hash == tok.hash and back.pattern == tok.pattern
    again = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "t.json").write_text(tok.to_hf_json())
    assert Tokenizer.from_hf(tmp_path / "t.json").hash == tok.hash
    text = SAMPLE.read_text(encoding="utf-8")[:20_000] + "".join(MULTILINGUAL) + "".join(ADVERSARIAL)
    assert _ids(again, text) == back.encode(text) == _ids(hf, text)


def test_a_chain_pattern_trains(tmp_path):
    from lmdata.tokenizer import train_bpe
    from hf_shapes import DEEPSEEK_PATTERNS

    (tmp_path / "in.txt").write_text(SAMPLE.read_text(encoding="utf-8")[:30_000] + "中文字123456" * 50)
    vocab, merges = train_bpe(tmp_path / "in.txt", 400, [], workers=1, pattern=json.dumps(DEEPSEEK_PATTERNS))
    tok = Tokenizer(vocab, merges, [], DEEPSEEK_PATTERNS)
    assert tok.pattern == json.dumps(DEEPSEEK_PATTERNS, ensure_ascii=False)
    ids = tok.encode("中文字123456 and more")
    assert tok.decode(ids) == "中文字123456 and more"
    assert all(len(tok.decode([i])) <= 3 for i in tok.encode("123456789") if tok.decode([i]).isdigit())


# ---------------------------------------------------------------------------- refused, in one line


@pytest.mark.parametrize("change, message", [
    (lambda pre: pre["pretokenizers"][1].update(behavior="Removed"), r"pretokenizers\[1\]\.behavior is 'Removed'"),
    (lambda pre: pre["pretokenizers"][0].update(invert=True), r"pretokenizers\[0\]\.invert is true"),
    (lambda pre: pre["pretokenizers"][2].update(pattern={"String": " "}), r"pretokenizers\[2\]\.pattern"),
    (lambda pre: pre["pretokenizers"].insert(0, {"type": "Digits", "individual_digits": True}),
     r"pretokenizers\[0\] is Digits"),
    (lambda pre: pre["pretokenizers"][-1].update(use_regex=True), r"pretokenizers\[3\] is ByteLevel with use_regex=true after Split steps"),
])
def test_unrepresentable_chains_are_refused_naming_the_field(tmp_path, change, message):
    data = json.loads(build("deepseek", tmp_path).read_text(encoding="utf-8"))
    change(data["pre_tokenizer"])
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(LmdataError, match=message) as exc:
        Tokenizer.from_hf(tmp_path / "t.json")
    assert "\n" not in str(exc.value) and "t.json" in str(exc.value)


@pytest.mark.parametrize("normalizer", [
    {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
    {"type": "Lowercase"},
])
def test_a_normalizer_that_changes_text_is_refused(tmp_path, normalizer):
    data = json.loads(build("noop", tmp_path).read_text(encoding="utf-8"))
    assert data["normalizer"] == {"type": "Sequence", "normalizers": []}  # what the shape carries, accepted
    data["normalizer"] = normalizer
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(LmdataError, match="normalizer .* cannot represent"):
        Tokenizer.from_hf(tmp_path / "t.json")
