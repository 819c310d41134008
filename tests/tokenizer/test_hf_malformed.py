"""`lmdata tokenizer import` of malformed tokenizer.json files (issue 29.13): each is one line naming the
file and the field, exit 1, nothing written -- not a KeyError, TypeError or RecursionError traceback, and
not a message about a flag that was never given."""

import json
import sys
from pathlib import Path

import pytest

from samples import run_cli

sys.path.insert(0, str(Path(__file__).parents[1]))
from hf_shapes import build  # noqa: E402

pytest.importorskip("tokenizers")


def _vocab_id(data, n, value):
    data["model"]["vocab"][list(data["model"]["vocab"])[n]] = value


def _pre_step(data, **change):
    data["pre_tokenizer"]["pretokenizers"][0].update(change)


CASES = {  # name: (change to the deepseek-shaped file written by `tokenizers`, what the message must say)
    "added token without id": (lambda d: d["added_tokens"][0].pop("id"), r'added_tokens\[0\] has no "id"'),
    "added token without content": (lambda d: d["added_tokens"][1].pop("content"),
                                    r'added_tokens\[1\] \(id 1\) has no non-empty string "content"'),
    "added_tokens a dict": (lambda d: d.update(added_tokens={"<x>": 5}), "added_tokens is a dict"),
    "added_tokens a string": (lambda d: d.update(added_tokens="<x>"), "added_tokens is a str"),
    "a string id": (lambda d: d["added_tokens"][0].update(id="5"), r'added_tokens\[0\] has no "id".*got "5"'),
    "a string normalizer": (lambda d: d.update(normalizer="NFC"), "normalizer NFC changes the text"),
    "a bad Split regex": (lambda d: _pre_step(d, pattern={"Regex": "(abc"}),
                          r"pretokenizers\[0\]\.pattern\.Regex '\(abc' is not a valid regex"),
    "duplicate vocab ids": (lambda d: _vocab_id(d, 300, 5), r"model.vocab gives id 5 to both '#' and"),
    "a float vocab id": (lambda d: _vocab_id(d, 300, 1.5), "model.vocab gives .* the id 1.5"),
    "vocab a list": (lambda d: d["model"].update(vocab=[1, 2]), "model.vocab is a list"),
    "merges a string": (lambda d: d["model"].update(merges="a b"), "model.merges is a str"),
    "a merge of three": (lambda d: d["model"]["merges"].__setitem__(0, ["a", "b", "c"]), r"model.merges entry"),
    "a non-object step": (lambda d: d["pre_tokenizer"]["pretokenizers"].insert(0, "x"), "is not an object"),
    "two added tokens on one id": (lambda d: d["added_tokens"].append({"id": 0, "content": "<zz>"}),
                                   r"added_tokens\[3\] '<zz>' has id 0, which added token '<\|begin_of_text\|>'"),
    "one added token, two ids": (lambda d: d["added_tokens"][2].update(content="<|begin_of_text|>"),
                                 "'<|begin_of_text|>' is given two ids"),
    "an added token with the bytes of a vocab token": (  # (merges made the added id: silently wrong ids)
        lambda d: d["added_tokens"].append({"id": 5000, "content": " "}), r"' ' \(id 5000\) has the bytes of model.vocab's"),
    "BPE dropout": (lambda d: d["model"].update(dropout=0.1), "model.dropout is 0.1"),  # (was dropped silently)
    "a merge of tokens not in the vocab": (lambda d: d["model"]["merges"].__setitem__(0, "Ġzzz q"),
                                           r"merge 0 .* not all in the vocab"),
}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    return build("deepseek", tmp_path_factory.mktemp("shape")).read_text(encoding="utf-8")


def _import(path, tmp_path, capsys):
    code, _, err = run_cli(["tokenizer", "import", str(path), "--out", str(tmp_path / "tok")], capsys)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(path) in err and "--pattern" not in err and "--special-token" not in err, err
    assert not (tmp_path / "tok").exists()
    return err


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_tokenizer_json_is_one_line_naming_the_file_and_field(case, shipped, tmp_path, capsys):
    import re

    change, message = CASES[case]
    data = json.loads(shipped)
    change(data)
    (tmp_path / "t.json").write_text(json.dumps(data), encoding="utf-8")
    err = _import(tmp_path / "t.json", tmp_path, capsys)
    assert re.search(message, err), err


def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, capsys):
    (tmp_path / "t.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in _import(tmp_path / "t.json", tmp_path, capsys)


def test_the_shipped_file_itself_imports(shipped, tmp_path, capsys):
    """(The cases above each break one field of this file.)"""
    (tmp_path / "t.json").write_text(shipped, encoding="utf-8")
    assert run_cli(["tokenizer", "import", str(tmp_path / "t.json"), "--out", str(tmp_path / "tok")], capsys)[0] == 0
