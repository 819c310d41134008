"""A build without the C accelerator warns once per process at first use; --version says which path runs."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from lmdata.tokenizer import accelerator
from lmdata.tokenizer import encoder as encoder_module


@pytest.fixture
def not_built(monkeypatch):
    monkeypatch.setattr(encoder_module, "_fastbpe", None)
    monkeypatch.setattr(accelerator, "_warned", False)
    monkeypatch.setattr(accelerator, "built", lambda: False)
    monkeypatch.delenv(accelerator.PURE_ENV, raising=False)


def test_warns_once_naming_the_fix(not_built, tokenizer):
    with pytest.warns(RuntimeWarning, match="not built.*C compiler.*LMDATA_PURE_PYTHON=1") as record:
        a = encoder_module.Tokenizer(tokenizer.vocab, tokenizer.merges, list(tokenizer.special_tokens))
        b = encoder_module.Tokenizer(tokenizer.vocab, tokenizer.merges, list(tokenizer.special_tokens))
    assert len([w for w in record if w.category is RuntimeWarning]) == 1
    assert not a.accelerated and a.encode("hello world") == b.encode("hello world") == tokenizer.encode("hello world")
    assert "NOT BUILT" in accelerator.accelerator_status()


def test_pure_python_on_purpose_is_silent(not_built, tokenizer, monkeypatch):
    monkeypatch.setenv(accelerator.PURE_ENV, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not encoder_module.Tokenizer(tokenizer.vocab, tokenizer.merges, list(tokenizer.special_tokens)).accelerated


def test_version_names_the_accelerator():
    out = subprocess.run([sys.executable, "-m", "lmdata", "--version"], capture_output=True, text=True, check=True)
    assert "C tokenizer accelerator: " in out.stdout
    assert ("in use" in out.stdout) == (encoder_module._fastbpe is not None)
