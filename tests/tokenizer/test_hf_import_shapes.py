"""tokenizer.json shapes that real files have and imports had got wrong: non-special added tokens (Qwen2.5's
tool tokens), a post_processor (Llama 3's <|begin_of_text|>), added tokens written raw into model.vocab (our
own export of '<|im start|>', DeepSeek's '<｜begin▁of▁sentence｜>'), one Split whose matches leave gaps, and an
end-of-text token other than <|endoftext|> (``eot_token``).  Every file here is written by `tokenizers`."""

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer, train_bpe

sys.path.insert(0, str(Path(__file__).parents[1]))
from hf_shapes import SAMPLE, build  # noqa: E402
from samples import run_cli  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["I said hello world to the Union.", "Unionhello worldUnion <|endoftext|> x", "", "a\r\n\r\n  b  ",
         "ünïcødé 数字 123456 emoji 🎉 <|end_of_text|>", SAMPLE.read_text(encoding="utf-8")[:4000]]


def _hf_ids(hf, text):
    return hf.encode(text, add_special_tokens=False).ids


@pytest.fixture(params=["c", "python"])
def mode(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    return request.param


def test_non_special_added_tokens_are_matched_in_plain_text_as_hugging_face_does(tmp_path, mode):
    """They had become special: ingest (encode_ordinary) never produced them, and an exported file marked them
    special, so Hugging Face's decode(skip_special_tokens) deleted the words."""
    hf = tokenizers.Tokenizer.from_file(str(build("llama3", tmp_path, specials=["<|endoftext|>"])))
    hf.add_tokens(["hello world", "Union"])
    hf.save(str(tmp_path / "added.json"))
    tok = Tokenizer.from_hf(tmp_path / "added.json")
    assert tok.special_flags == {"hello world": ("nonspecial",), "Union": ("nonspecial",)}
    assert tok.gil_free == (mode == "c")  # a second C encoder splits them off in plain text: ingest stays on threads
    for text in TEXTS:
        want = _hf_ids(hf, text)
        assert tok.encode(text) == want
        if "<|endoftext|>" not in text:  # (a special token stays text in plain encoding: it cannot be forged)
            assert tok.encode_ordinary(text) == want
    plain = tok.encode_arrays(TEXTS[:2], eot=tok.eot_id, ordinary=True).tokens.tolist()
    assert plain[:len(_hf_ids(hf, TEXTS[0]))] == _hf_ids(hf, TEXTS[0])
    assert tok.special_ids["Union"] in plain
    tok.save(tmp_path / "saved")
    again = Tokenizer.load(tmp_path / "saved")
    assert again.hash == tok.hash and again.encode_ordinary(TEXTS[0]) == tok.encode_ordinary(TEXTS[0])
    exported = tokenizers.Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json"))
    ids = hf.encode(TEXTS[0]).ids
    assert exported.decode(ids) == hf.decode(ids) == TEXTS[0]
    entry = {t["content"]: t for t in json.loads((tmp_path / "saved" / "tokenizer.json").read_text())["added_tokens"]}
    assert entry["Union"]["special"] is False and entry["<|endoftext|>"]["special"] is True


def test_a_post_processor_that_adds_tokens_is_said_not_dropped_silently(tmp_path):
    hf = tokenizers.Tokenizer.from_file(str(build("llama3", tmp_path)))
    hf.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", hf.token_to_id("<|begin_of_text|>"))])
    hf.save(str(tmp_path / "post.json"))
    with pytest.warns(UserWarning, match=r"post_processor adds '<\|begin_of_text\|>'.*add_special_tokens=False"):
        tok = Tokenizer.from_hf(tmp_path / "post.json")
    assert tok.encode("hello") == hf.encode("hello", add_special_tokens=False).ids
    assert hf.encode("hello").ids == [hf.token_to_id("<|begin_of_text|>")] + tok.encode("hello")
    hf.post_processor = tokenizers.processors.ByteLevel(trim_offsets=True)
    hf.save(str(tmp_path / "bytelevel.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer.from_hf(tmp_path / "bytelevel.json")


def test_our_own_export_with_a_special_token_that_is_not_in_byte_form_imports_again(tmp_path):
    """'<|im start|>' (a space) is written as itself in model.vocab, as `tokenizers` does; import refused it."""
    specials = ["<|endoftext|>", "<|im start|>", "<｜begin▁of▁sentence｜>", "‹|é|>"]  # (the last is byte form too)
    tok = Tokenizer(*train_bpe(SAMPLE, 400, specials), specials)
    tok.save(tmp_path / "ours")
    back = Tokenizer.from_hf(tmp_path / "ours" / "tokenizer.json")
    assert back.hash == tok.hash
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "ours" / "tokenizer.json"))
    text = "a <|im start|> b<｜begin▁of▁sentence｜>c‹|é|>"
    assert back.encode(text) == tok.encode(text) == _hf_ids(hf, text)


def test_a_single_split_whose_matches_leave_gaps_keeps_the_gaps_as_pieces(tmp_path, mode):
    """Hugging Face's Isolated Split keeps the text between matches; the import had refused the file."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{L}+"), "isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.train([str(SAMPLE)], trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"], show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(tmp_path / "gaps.json"))
    tok = Tokenizer.from_hf(tmp_path / "gaps.json")
    assert tok.gil_free == (mode == "c")
    for text in TEXTS:
        assert tok.encode(text) == _hf_ids(hf, text)
    again = tokenizers.Tokenizer.from_file(str(_saved(tok, tmp_path) / "tokenizer.json"))
    assert all(_hf_ids(again, t) == _hf_ids(hf, t) for t in TEXTS)


def _saved(tok, tmp_path):
    tok.save(tmp_path / "saved")
    return tmp_path / "saved"


def test_an_eot_token_other_than_endoftext_is_saved_hashed_and_ends_documents(tmp_path):
    path = build("llama3", tmp_path, specials=["<|begin_of_text|>", "<|end_of_text|>"])
    plain = Tokenizer.from_hf(path)
    assert plain.eot_id is None and plain.eot_token == "<|endoftext|>"
    tok = Tokenizer.from_hf(path, eot_token="<|end_of_text|>")
    assert tok.eot_id == tok.special_ids["<|end_of_text|>"] and tok.hash != plain.hash
    again = Tokenizer.load(_saved(tok, tmp_path))
    assert (again.eot_token, again.hash) == ("<|end_of_text|>", tok.hash)
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|end_of_text|>"
    batch = tok.encode_arrays(["a b", "c"], eot=tok.eot_id, dtype=np.uint16, ordinary=True)
    assert batch.tokens[batch.lengths.cumsum() - 1].tolist() == [tok.eot_id] * 2
    with pytest.raises(LmdataError, match=r"eot token '</s>' is not a special token .*<\|begin_of_text\|>"):
        Tokenizer.from_hf(path, eot_token="</s>")
    default = Tokenizer(*train_bpe(SAMPLE, 300, ["<|endoftext|>"]), ["<|endoftext|>"])
    chosen = Tokenizer(default.vocab, default.merges, default.special_tokens, eot_token="<|endoftext|>")
    assert chosen.hash == default.hash  # naming the default changes nothing


def test_cli_import_takes_eot_token_or_a_directorys_eos_token_and_ingest_names_the_flag(tmp_path, capsys):
    path = build("llama3", tmp_path, specials=["<|begin_of_text|>", "<|end_of_text|>"])
    (tmp_path / "text.txt").write_text("one document\n<|endoftext|>\nanother\n")
    code, out, _ = run_cli(["tokenizer", "import", str(path), "--out", str(tmp_path / "none")], capsys)
    assert code == 0 and "ingest refuses it: import again with --eot-token NAME" in out
    code, _, err = run_cli(["ingest", "--input", str(tmp_path / "text.txt"), "--tokenizer", str(tmp_path / "none"),
                            "--out", str(tmp_path / "store-none"), "--format", "memmap"], capsys)
    assert code == 1 and "import it again with --eot-token NAME, one of <|begin_of_text|>, <|end_of_text|>" in err
    assert not (tmp_path / "store-none").exists()
    folder = tmp_path / "hf-folder"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(path.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|end_of_text|>"}}))
    code, out, _ = run_cli(["tokenizer", "import", str(folder), "--out", str(tmp_path / "tok")], capsys)
    assert code == 0 and "documents end with <|end_of_text|>" in out
    code, _, err = run_cli(["ingest", "--input", str(tmp_path / "text.txt"), "--tokenizer", str(tmp_path / "tok"),
                            "--out", str(tmp_path / "store"), "--format", "memmap", "--no-progress"], capsys)
    assert code == 0, err
    from lmdata.store import open_store

    store = open_store(tmp_path / "store")
    tok = Tokenizer.load(tmp_path / "tok")
    assert store.eot_id == tok.special_ids["<|end_of_text|>"]
    assert store.document("train", 1).tolist() == tok.encode_ordinary("another") + [store.eot_id]


def test_a_non_special_added_token_cannot_end_documents(tmp_path):
    """It is matched in plain text, so ingest would have ended documents inside them (verify then failed)."""
    hf = tokenizers.Tokenizer.from_file(str(build("llama3", tmp_path, specials=["<|begin_of_text|>"])))
    hf.add_tokens(["<eos>", "<|endoftext|>"])  # both "special": false
    hf.save(str(tmp_path / "plain-eos.json"))
    with pytest.raises(LmdataError, match=r"eot token '<eos>' is not a special token of this tokenizer "
                                          r"\(<\|begin_of_text\|>\)"):
        Tokenizer.from_hf(tmp_path / "plain-eos.json", eot_token="<eos>")
    assert Tokenizer.from_hf(tmp_path / "plain-eos.json").eot_id is None  # the default one too: ingest refuses it


def test_a_folder_import_reads_its_file_once_and_warns_once(tmp_path, capsys):
    """The folder's eos_token fallback imported the file a second time: two warning lines, two JSON parses."""
    hf = tokenizers.Tokenizer.from_file(str(build("llama3", tmp_path, specials=["<|begin_of_text|>", "<|end_of_text|>"])))
    hf.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", hf.token_to_id("<|begin_of_text|>"))])
    folder = tmp_path / "folder"
    folder.mkdir()
    hf.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    code, out, err = run_cli(["tokenizer", "import", str(folder), "--out", str(tmp_path / "tok")], capsys)
    assert code == 0 and "documents end with <|end_of_text|>" in out
    assert err.count("warning: ") == 1 and "post_processor adds '<|begin_of_text|>'" in err, err
