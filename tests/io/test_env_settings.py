"""Numbers read from the environment: a value out of range is one line naming the variable, never a traceback."""

from __future__ import annotations

import pytest

from lmdata._progress import INTERVAL_ENV, PlainProgress
from lmdata.errors import LmdataError
from lmdata.io.cache import CACHE_BYTES_ENV, ByteCache
from lmdata.tokenizer.patterns import TIMEOUT_ENV, regex_timeout


def _progress_interval() -> float:
    return PlainProgress(None).interval


def _cache_budget() -> int:
    cache = ByteCache.from_env()
    return 0 if cache is None else cache.max_bytes


@pytest.mark.parametrize("name, read, good, bad", [
    (TIMEOUT_ENV, lambda: regex_timeout(0), {"0.5": 0.5, " 7 ": 7.0, "": 5.0}, ["0", "-1", "abc", "inf", "nan"]),
    (INTERVAL_ENV, _progress_interval, {"0": 0.0, "2.5": 2.5, "": 5.0}, ["-1", "five", "inf"]),
    (CACHE_BYTES_ENV, _cache_budget, {"0": 0, "1e9": 10**9, "4096": 4096, "": 0}, ["-1", "64GiB", "1.5", "inf"]),
])
def test_each_setting_reads_numbers_and_names_itself_on_bad_ones(monkeypatch, tmp_path, name, read, good, bad):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path))
    for text, value in good.items():
        monkeypatch.setenv(name, text)
        assert read() == value, text
    for text in bad:
        monkeypatch.setenv(name, text)
        with pytest.raises(LmdataError, match=rf"^{name}='{text}': give the "):
            read()
