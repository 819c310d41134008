"""The local engine's encoders: threads where the tokenizer encodes without the GIL,
processes for a custom regex outside the C matcher's subset; the store is the same bytes either
way and for any count."""

from __future__ import annotations

from multiprocessing.pool import ThreadPool

import pytest

from lmdata.ingest import ingest
from lmdata.ingest.local import LocalEngine
from lmdata.sources import SourceSpec
from lmdata.tokenizer import Tokenizer

from samples import SAMPLE, SAMPLE_SHARD_TOKENS, fingerprint


def _ingest(tokenizer_dir, out, workers):
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=["memmap"],
           shard_tokens=SAMPLE_SHARD_TOKENS, workers=workers, progress=False, log=None)
    return fingerprint(out)


@pytest.fixture(scope="module")
def regex_tokenizer_dir(tokenizer_dir, tmp_path_factory):
    """The session tokenizer's merges under a custom regex with a look-behind (outside the C matcher's
    subset: pre-tokenized in Python)."""
    tok = Tokenizer.load(tokenizer_dir)
    out = tmp_path_factory.mktemp("regex") / "tokenizer"
    Tokenizer(tok.vocab, tok.merges, tok.special_tokens, pattern=r"(?<=\d)\w+| ?\w+| ?[^\s\w]+|\s+").save(out)
    return out


def test_a_custom_regex_on_the_c_matcher_encodes_on_threads(tokenizer_dir, tmp_path):
    tok = Tokenizer.load(tokenizer_dir)
    Tokenizer(tok.vocab, tok.merges, tok.special_tokens, pattern=r" ?\w+| ?[^\s\w]+|\s+").save(tmp_path / "tok")
    assert Tokenizer.load(tmp_path / "tok").gil_free
    engine = LocalEngine(tmp_path / "tok", 2)
    engine.start(tmp_path / "tok")
    try:
        assert isinstance(engine.pool, ThreadPool)
    finally:
        engine.stop()


def test_a_c_tokenizer_encodes_on_threads(tokenizer_dir):
    engine = LocalEngine(tokenizer_dir, 2)
    engine.start(tokenizer_dir)
    try:
        assert isinstance(engine.pool, ThreadPool)
    finally:
        engine.stop()


def test_a_custom_regex_encodes_in_processes(regex_tokenizer_dir):
    assert not Tokenizer.load(regex_tokenizer_dir).gil_free
    engine = LocalEngine(regex_tokenizer_dir, 2)
    engine.start(regex_tokenizer_dir)
    try:
        assert engine.pool is not None and not isinstance(engine.pool, ThreadPool)
    finally:
        engine.stop()


@pytest.mark.parametrize("which", ["c", "regex"])
def test_threads_or_processes_give_the_store_one_worker_gives(tokenizer_dir, regex_tokenizer_dir, tmp_path, which):
    tok_dir = tokenizer_dir if which == "c" else regex_tokenizer_dir
    assert _ingest(tok_dir, tmp_path / "w2", 2) == _ingest(tok_dir, tmp_path / "w1", 1)


def test_each_format_writes_on_a_thread_named_for_its_writer():
    """``py-spy``/``top -H`` then tell which format's writer a profile's time went to."""
    import threading

    from lmdata.ingest.local import BackgroundWriter

    class ParquetWriter:  # the name is what the thread is named after
        def write_shard(self) -> str:
            return threading.current_thread().name

    background = BackgroundWriter(ParquetWriter())
    try:
        assert background.write_shard().result().startswith("lmdata-writer-ParquetWriter")
    finally:
        background.close()
