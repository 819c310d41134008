"""`lmdata tokenizer import|export` and `train --pattern` from the command line."""

import pytest

from samples import run_cli

from lmdata.tokenizer import Tokenizer

EOT = "<|endoftext|>"


run = run_cli


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text(("The quick brown fox, 12345 jumps.\n\n" + EOT) * 50)
    return path


def test_train_with_a_pattern_export_and_import(corpus, tmp_path, capsys):
    assert run(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--pattern", "cl100k",
                "--out", str(tmp_path / "tok"), "--no-progress"], capsys)[0] == 0
    tok = Tokenizer.load(tmp_path / "tok")
    assert tok.pattern_name == "cl100k"
    for fmt, name in (("hf", "t.json"), ("tiktoken", "r.tiktoken")):
        assert run(["tokenizer", "export", str(tmp_path / "tok"), "--to", fmt, "--out", str(tmp_path / name)],
                   capsys)[0] == 0
    assert run(["tokenizer", "import", str(tmp_path / "t.json"), "--out", str(tmp_path / "a")], capsys)[0] == 0
    code, out, _ = run(["tokenizer", "import", str(tmp_path / "r.tiktoken"), "--pattern", "cl100k",
                        "--special-token", f"{EOT}={tok.eot_id}", "--out", str(tmp_path / "b")], capsys)
    assert code == 0 and "cl100k" in out
    assert Tokenizer.load(tmp_path / "a").hash == Tokenizer.load(tmp_path / "b").hash == tok.hash


def test_bad_pattern_and_missing_tiktoken_pattern(corpus, tmp_path, capsys):
    code, _, err = run(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--pattern", "gpt5",
                        "--out", str(tmp_path / "tok"), "--no-progress"], capsys)
    assert code == 1 and "unknown pattern name" in err and err.count("\n") == 1
    (tmp_path / "r.tiktoken").write_text("YQ== 0\n")
    code, _, err = run(["tokenizer", "import", str(tmp_path / "r.tiktoken"), "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and "--pattern" in err
    (tmp_path / "notes.md").write_text("# notes\n")  # not a ranks file: said so, not sent to --pattern first
    code, _, err = run(["tokenizer", "import", str(tmp_path / "notes.md"), "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and err.strip() == f"error: {tmp_path / 'notes.md'}:1: expected 'base64-token rank', got b'# notes'"


def test_export_replaces_no_file_without_overwrite_and_never_the_tokenizers_own(corpus, tmp_path, capsys):
    """Issue 29.5: `tokenizer export --out` overwrote any file, the tokenizer's own merges.txt included."""
    assert run(["tokenizer", "train", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                "--no-progress"], capsys)[0] == 0
    own = tmp_path / "tok" / "merges.txt"
    before, digest = own.read_bytes(), Tokenizer.load(tmp_path / "tok").hash
    code, _, err = run(["tokenizer", "export", str(tmp_path / "tok"), "--to", "tiktoken", "--out", str(own),
                        "--overwrite"], capsys)
    assert code == 1 and "inside the tokenizer directory" in err and err.count("\n") == 1
    assert own.read_bytes() == before and Tokenizer.load(tmp_path / "tok").hash == digest
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    code, _, err = run(["tokenizer", "export", str(tmp_path / "tok"), "--to", "hf", "--out", str(mine)], capsys)
    assert code == 1 and "--overwrite" in err and mine.read_text() == "mine"
    assert run(["tokenizer", "export", str(tmp_path / "tok"), "--to", "hf", "--out", str(mine), "--overwrite"],
               capsys)[0] == 0
    assert Tokenizer.from_hf(mine).hash == Tokenizer.load(tmp_path / "tok").hash
    code, _, err = run(["tokenizer", "export", str(tmp_path / "tok"), "--to", "hf", "--out", str(tmp_path)], capsys)
    assert code == 1 and "is a directory" in err


def test_import_a_rank_file_with_a_non_merge_token_and_the_empty_token(tmp_path, capsys):
    """Llama 3's kind of token (not a merge of two lower ranks) and Whisper's last line ('= N') import."""
    import base64

    tokens = [bytes([b]) for b in range(256)] + [b"ba", b"ab", b"abab", b""]  # abab: BPE gives a|ba|b
    (tmp_path / "r.tiktoken").write_text("".join(f"{base64.b64encode(t).decode() or '='} {i}\n"
                                                 for i, t in enumerate(tokens)))
    code, out, _ = run(["tokenizer", "import", str(tmp_path / "r.tiktoken"), "--pattern", "gpt2",
                        "--special-token", f"{EOT}=260", "--out", str(tmp_path / "tok")], capsys)
    assert code == 0 and "BPE by ranks" in out
    tok = Tokenizer.load(tmp_path / "tok")
    assert tok.encode("abab") == [258] and tok.encode("xabab") == [ord("x"), ord("a"), 256, ord("b")]
    assert tok.decode_bytes([259]) == b"" and 259 not in tok.encode("ab ba abab" * 3)
    code, _, _ = run(["tokenizer", "export", str(tmp_path / "tok"), "--to", "tiktoken", "--out",
                      str(tmp_path / "back.tiktoken")], capsys)
    assert code == 0 and (tmp_path / "back.tiktoken").read_text() == (tmp_path / "r.tiktoken").read_text()


@pytest.mark.parametrize("specials,message", [
    (["x=\u00b2"], "give NAME=ID"),  # '²' is a digit to str.isdigit: it was a ValueError traceback
    ([f"{EOT}=256", f"{EOT}=257"], "is given two ids (256 and 257); give it once"),  # one was kept silently
    ([f"{EOT}=256", "<|pad|>=256"], "'<|endoftext|>' and '<|pad|>' both have id 256"),
])
def test_special_token_flags_that_cannot_all_hold_are_one_line(tmp_path, capsys, specials, message):
    """Issue 29.13: --special-token values of tokenizer import (tiktoken files)."""
    import base64

    (tmp_path / "r.tiktoken").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    flags = [a for s in specials for a in ("--special-token", s)]
    code, _, err = run(["tokenizer", "import", str(tmp_path / "r.tiktoken"), "--pattern", "gpt2", *flags,
                        "--out", str(tmp_path / "tok")], capsys)
    assert code == 1 and err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "tok").exists()


def test_a_ranks_file_lacking_a_byte_is_one_line_naming_the_file(tmp_path, capsys):
    """Issue 29.13: the refusal did not name the file ('vocab lacks the single byte b'\\xff'')."""
    import base64

    (tmp_path / "r.tiktoken").write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(255)))
    code, _, err = run(["tokenizer", "import", str(tmp_path / "r.tiktoken"), "--pattern", "gpt2",
                        "--out", str(tmp_path / "tok")], capsys)
    assert code == 1 and err.count("\n") == 1 and f"{tmp_path / 'r.tiktoken'}: vocab lacks the single byte" in err, err
