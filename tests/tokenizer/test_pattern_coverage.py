"""Custom pre-tokenizer patterns never drop text (issue 29.1) and never hang (29.9), on the
C accelerator's callback path and on pure Python alike."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmdata.errors import LmdataError
from lmdata.tokenizer import Tokenizer
from lmdata.tokenizer.patterns import Pattern

BYTES = {i: bytes([i]) for i in range(256)}
CATASTROPHIC = r"(?:a|aa)+\p{N}|\p{L}|[\s\S]"


@pytest.fixture(params=["c", "python"])
def make(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
    return lambda pattern: Tokenizer(BYTES, [], pattern=pattern)


def test_pattern_that_drops_punctuation_is_refused():
    with pytest.raises(LmdataError, match="does not match the character"):
        Pattern.get(r"( ?\p{L}+)|\s+")


def test_encoding_refuses_text_the_pieces_do_not_cover(make):
    tok = make(r"[^\u2603]+")  # covers the probe text, not the snowman
    assert tok.decode(tok.encode("a b, 1!")) == "a b, 1!"
    with pytest.raises(LmdataError, match="'\u2603' at offset 1"):
        tok.encode("a\u2603b")
    with pytest.raises(LmdataError, match="does not match"):
        tok.encode_batch(["ok", "a\u2603b"])


def test_capture_group_counts_as_non_capturing(make):
    plain = make(r" ?(?:\p{L}+)|\s+|[^\s\p{L}]+")
    grouped = make(r"( ?\p{L}+)|\s+|[^\s\p{L}]+")
    text = "Hello, world 123!\n"
    assert grouped.encode(text) == plain.encode(text)
    assert grouped.decode(grouped.encode(text)) == text


def test_catastrophic_pattern_times_out(make, monkeypatch):
    monkeypatch.setenv("LMDATA_REGEX_TIMEOUT", "0.2")
    tok = make(CATASTROPHIC)
    with pytest.raises(LmdataError, match="catastrophic backtracking"):
        tok.encode("a" * 42 + "!")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to see stdin consumed")
@pytest.mark.parametrize("pure", ["", "1"])
def test_ctrl_c_stops_a_backtracking_encode(tmp_path, pure):
    """29.9: Ctrl-C was ignored while a catastrophic pattern ran; the regex timeout is set far away here,
    so only the interrupt can end the encode: exit 130 and one line."""
    Tokenizer(BYTES, [], ["<|endoftext|>"], CATASTROPHIC).save(tmp_path / "tok")
    text = tmp_path / "in.txt"
    text.write_text("a" * 42 + "!\n")
    env = {**os.environ, "LMDATA_REGEX_TIMEOUT": "600", "LMDATA_PURE_PYTHON": pure}
    with open(text, "rb") as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "lmdata", "tokenizer", "encode", str(tmp_path / "tok")],
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        fdinfo = Path(f"/proc/{proc.pid}/fdinfo/0")
        while proc.poll() is None and int(fdinfo.read_text().split()[1]) < text.stat().st_size:
            time.sleep(0.1)  # until the text is read: the match is running
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    # (before it, one line says the pattern is outside the C matcher's subset)
    assert proc.returncode == 130 and err.decode().strip().splitlines()[-1] == "interrupted", err
