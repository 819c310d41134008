"""Fixtures of the tokenizer tests."""

import pytest

from lmdata.tokenizer.train import fast_module


@pytest.fixture(params=["c", "python"])
def trainer(request, monkeypatch):
    """A test that compares results runs on the C trainer, then on the pure-Python one
    (LMDATA_PURE_PYTHON=1); skipped on "c" where the extension was not built."""
    if request.param == "c":
        if fast_module() is None:
            pytest.skip("the C accelerator is not built")
        monkeypatch.delenv("LMDATA_PURE_PYTHON", raising=False)
    else:
        monkeypatch.setenv("LMDATA_PURE_PYTHON", "1")
        assert fast_module() is None
    return request.param
