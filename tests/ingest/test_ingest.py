"""The ingest job end to end on the shipped sample: round trip, determinism, resume, refusals."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.ingest.shards import ShardCutter
from lmdata.sources import SourceSpec, iter_documents
from lmdata.store import open_store, verify_store

from samples import FORMATS, HOLDOUT, REPO, SAMPLE, SAMPLE_SHARD_TOKENS, fingerprint


def _sample(**kw):
    return {"train": SourceSpec((str(SAMPLE),), **kw)}


def test_round_trip_every_document_of_every_format(sample_store):
    docs = [d.text for d in iter_documents(SourceSpec((str(SAMPLE),)))]
    expected = {"train": docs[:-HOLDOUT], "validation": docs[-HOLDOUT:]}
    store = open_store(sample_store)
    tok = store.tokenizer()
    assert store.splits == ["train", "validation"]
    for split, texts in expected.items():
        assert store.manifest.splits[split].n_docs == len(texts)
        assert store.formats(split) == FORMATS
        for fmt in FORMATS:
            for i, text in enumerate(texts):
                ids = store.document(split, i, fmt)
                assert ids[-1] == store.eot_id and store.eot_id not in ids[:-1].tolist()
                assert tok.decode(ids[:-1].tolist()) == text, (split, fmt, i)


def test_manifest_and_store_layout(sample_store, tokenizer):
    m = json.loads((sample_store / "manifest.json").read_text())
    assert m["tokenizer"]["hash"] == tokenizer.hash and m["dtype"] == "uint16" and m["eot_id"] == tokenizer.eot_id
    assert (sample_store / "tokenizer" / "tokenizer.json").is_file()
    train = m["splits"]["train"]
    assert train["sources"][0]["xxh128"] and train["sources"][0]["bytes"] == SAMPLE.stat().st_size
    shards = train["formats"]["memmap"]["shards"]
    assert len(shards) > 5
    assert all(s["n_tokens"] <= SAMPLE_SHARD_TOKENS or s["n_docs"] == 1 for s in shards)
    assert (sample_store / "train" / "memmap" / "tokens-00000.bin").is_file()
    assert (sample_store / "train" / "parquet" / "shard-00000.parquet").is_file()
    assert verify_store(sample_store).ok


def test_same_store_whatever_the_worker_count(sample_store, tokenizer_dir, tmp_path):
    ingest(_sample(), tokenizer_dir, tmp_path / "w2", formats=FORMATS, shard_tokens=SAMPLE_SHARD_TOKENS,
           workers=2, holdout=("train", "validation", HOLDOUT), progress=False, log=None)
    assert fingerprint(tmp_path / "w2") == fingerprint(sample_store)
    assert verify_store(tmp_path / "w2").ok


def test_literal_endoftext_in_jsonl_is_plain_text(tmp_path, tokenizer_dir, tokenizer):
    path = tmp_path / "d.jsonl"
    docs = ["before <|endoftext|> after", "<|endoftext|>", "plain"]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    res = ingest({"train": SourceSpec((str(path),))}, tokenizer_dir, tmp_path / "s", formats=["memmap"],
                 workers=1, progress=False, log=None)
    assert res.manifest.splits["train"].n_docs == 3
    store = open_store(tmp_path / "s")
    for i, text in enumerate(docs):
        ids = store.document("train", i).tolist()
        assert ids.count(tokenizer.eot_id) == 1 and ids[-1] == tokenizer.eot_id
        assert tokenizer.decode(ids[:-1]) == text


def test_uint32_when_the_vocab_does_not_fit_uint16(tmp_path):
    from lmdata.tokenizer import Tokenizer

    vocab = {i: bytes([i]) for i in range(256)} | {70_000: b"<|endoftext|>"}
    Tokenizer(vocab, [], ["<|endoftext|>"]).save(tmp_path / "tok")
    (tmp_path / "in.txt").write_text("ab\n<|endoftext|>\ncd\n")
    ingest({"train": SourceSpec((str(tmp_path / "in.txt"),))}, tmp_path / "tok", tmp_path / "s",
           formats=FORMATS, workers=1, progress=False, log=None)
    store = open_store(tmp_path / "s")
    assert store.manifest.dtype == "uint32"
    for fmt in FORMATS:
        assert store.document("train", 1, fmt).tolist() == [99, 100, 70_000]


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), shard_tokens=st.integers(1, 120))
def test_shards_cut_at_document_boundaries(tmp_path_factory, lengths, shard_tokens):
    from lmdata.store.formats.memmap import MemmapWriter

    writer = MemmapWriter(tmp_path_factory.mktemp("cut"), np.dtype("uint16"))
    cutter = ShardCutter({"memmap": writer}, {"memmap": {}}, shard_tokens, 0, 0, 0)
    tokens = np.arange(sum(lengths), dtype=np.uint16)
    cutter.add(tokens, np.array(lengths, dtype=np.int64))
    cutter.flush()
    shards = cutter.written["memmap"]
    assert sum(s.n_docs for s in shards) == len(lengths) and sum(s.n_tokens for s in shards) == len(tokens)
    for a, b in zip(shards, shards[1:]):
        assert b.first_doc == a.first_doc + a.n_docs and b.first_token == a.first_token + a.n_tokens
        assert a.n_tokens + lengths[b.first_doc] > shard_tokens  # closed only when the next doc would not fit
    assert all(s.n_tokens <= shard_tokens or s.n_docs == 1 for s in shards)


def _reference_cuts(lengths: list[int], shard_tokens: int) -> list[int]:
    """The cut rule a document at a time (the cutter's loop before it took slices): documents per shard."""
    shards, n, docs = [], 0, 0
    for length in lengths:
        if n and n + length > shard_tokens:
            shards.append(docs)
            n = docs = 0
        n, docs = n + length, docs + 1
    return shards + ([docs] if docs else [])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60), shard_tokens=st.integers(1, 120),
       cuts=st.lists(st.integers(0, 60), max_size=5))
def test_the_cutter_cuts_as_the_per_document_rule_across_batches(tmp_path_factory, lengths, shard_tokens, cuts):
    """Batches of any sizes (empty ones too; a document holds at least its EOT) give the shards and
    tokens the per-document rule gives, with each document's origin kept beside it."""
    from lmdata.store.formats.memmap import MemmapWriter

    class Origins:  # stands in for the provenance writer: what each shard was given
        def __init__(self):
            self.got = []

        def write_shard(self, index, origins, n_tokens, first_doc, first_token):
            self.got.append(origins.copy())

    writer, origins = MemmapWriter(tmp_path_factory.mktemp("cut"), np.dtype("uint16")), Origins()
    cutter = ShardCutter({"memmap": writer}, {"memmap": {}}, shard_tokens, 0, 0, 0, provenance=origins)
    tokens = np.arange(sum(lengths), dtype=np.uint16)
    bounds = sorted({0, len(lengths), *(c for c in cuts if c <= len(lengths))})
    ends = np.concatenate([[0], np.cumsum(lengths)])
    for a, b in zip(bounds, bounds[1:] or [len(lengths)]):
        docs = np.arange(a, b, dtype=np.int64)
        cutter.add(tokens[ends[a]:ends[b]], np.array(lengths[a:b], dtype=np.int64), np.stack([docs, docs], axis=1))
    cutter.flush()
    shards = cutter.written["memmap"]
    assert [s.n_docs for s in shards] == _reference_cuts(lengths, shard_tokens)
    assert np.concatenate([o[:, 0] for o in origins.got]).tolist() == list(range(len(lengths)))
    for s in shards:
        got = np.fromfile(writer.format_dir / s.files[0].path, dtype=np.uint16)
        assert got.tolist() == tokens[s.first_token:s.first_token + s.n_tokens].tolist()


# ---------------------------------------------------------------------------- kill and resume


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lmdata", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _plan_hashed(out) -> bool:
    """The ingest's plan holds its inputs' checksums (a fresh ingest writes them once hashed: resumable from then)."""
    try:
        plan = json.loads((out / "ingest-plan.json").read_text())
    except (OSError, ValueError):
        return False
    return all(src["xxh128"] for split in plan["splits"].values() for src in split["sources"])


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, tokenizer_dir):
    args = ["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--shard-tokens", "20000",
            "--no-progress"]
    out = tmp_path / "killed"
    proc = _cli(*args, "--out", str(out), "--workers", "1")
    records = out / "train" / "memmap" / "_shards"  # (Lance records a fragment only when it closes)
    deadline = time.monotonic() + 60
    while (len(list(records.glob("*.json"))) < 3 or not _plan_hashed(out)) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    # while it runs, a second ingest into the same store is refused by the lock
    with pytest.raises(LmdataError, match="another ingest is writing this store"):
        ingest(_sample(), tokenizer_dir, out, formats=["memmap"], workers=1, progress=False, log=None)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the ingest finished before it could be killed"
    assert not (out / "manifest.json").exists()

    refused = _cli(*args, "--out", str(out), "--workers", "1")
    assert refused.wait() == 1 and "--resume" in refused.stderr.read()
    resumed = _cli(*args, "--out", str(out), "--resume", "--workers", "2")  # worker count may differ
    _, err = resumed.communicate()
    assert resumed.returncode == 0, err
    whole = _cli(*args, "--out", str(tmp_path / "whole"), "--workers", "1")
    _, err = whole.communicate()
    assert whole.returncode == 0, err
    assert fingerprint(out) == fingerprint(tmp_path / "whole")
    assert verify_store(out).ok
    leftovers = [p for p in out.rglob(".*") if p.name != ".lock"]
    assert not leftovers, leftovers
    # the interrupted run's uncommitted Lance fragments are gone: only referenced data files remain
    lance_dir = out / "train" / "lance"
    referenced = {f["path"] for s in json.loads((out / "manifest.json").read_text())["splits"]["train"]["formats"]
                  ["lance"]["shards"] for f in s["files"] if f["path"].startswith("data/")}
    assert {str(p.relative_to(lance_dir)) for p in (lance_dir / "data").iterdir()} == referenced


def test_a_resume_writes_again_a_shard_whose_bytes_changed_since_its_record(tmp_path, tokenizer_dir):
    """Sizes alone would let a flipped byte through a resume into a manifest that vouches for it."""
    kw = dict(formats=FORMATS, shard_tokens=SAMPLE_SHARD_TOKENS, workers=1, progress=False, log=None)
    out = tmp_path / "s"
    ingest(_sample(), tokenizer_dir, out, **kw)
    ingest(_sample(), tokenizer_dir, tmp_path / "whole", **kw)
    train = out / "train"
    damaged = [train / "memmap" / "tokens-00001.bin", train / "parquet" / "shard-00001.parquet",
               next((train / "lance" / "data").glob("*.lance")), train / "_provenance" / "origins-00001.npy"]
    for path in damaged:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    assert not verify_store(out).ok
    ingest(_sample(), tokenizer_dir, out, resume=True, **kw)
    assert verify_store(out).ok
    assert fingerprint(out) == fingerprint(tmp_path / "whole")
    for path in damaged[:2] + damaged[3:]:  # written again under the same names (Lance's: a new data file)
        assert path.read_bytes() == (tmp_path / "whole" / path.relative_to(out)).read_bytes()


# ---------------------------------------------------------------------------- refusals


def test_existing_store_needs_a_flag(tmp_path, tokenizer_dir):
    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    ingest(_sample(), tokenizer_dir, tmp_path / "s", **kw)
    with pytest.raises(LmdataError, match="already holds a store; pass --overwrite"):
        ingest(_sample(), tokenizer_dir, tmp_path / "s", **kw)
    ingest(_sample(), tokenizer_dir, tmp_path / "s", overwrite=True, **kw)
    ingest(_sample(), tokenizer_dir, tmp_path / "s", resume=True, **kw)  # complete: resume is a no-op re-check
    ingest(_sample(), tmp_path / "s" / "tokenizer", tmp_path / "s", overwrite=True, **kw)  # its own tokenizer
    with pytest.raises(LmdataError, match="--shard-tokens was"):
        ingest(_sample(), tokenizer_dir, tmp_path / "s", resume=True, **kw | {"shard_tokens": 777})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("x")
    with pytest.raises(LmdataError, match="holds no lmdata store; refusing"):
        ingest(_sample(), tokenizer_dir, tmp_path / "other", overwrite=True, **kw)
    assert (tmp_path / "other" / "precious.txt").exists()


@pytest.mark.parametrize("step", ["install_tokenizer", "prepare"])
def test_a_ctrl_c_before_the_first_shard_leaves_a_store_resume_and_overwrite_take(tmp_path, tokenizer_dir,
                                                                                  monkeypatch, step):
    """The plan is written before the tokenizer is copied or the writers' imports run: a Ctrl-C there
    had left `.lock` and `tokenizer/` alone, a folder `--resume`, `--overwrite` and a plain run refused.
    A plan still waiting for its inputs' hashes, with no shard written, is simply replaced on resume."""
    from lmdata.ingest import output
    from lmdata.store.formats.parquet import ParquetWriter

    kw = dict(formats=["memmap", "parquet"], workers=1, progress=False, log=None)
    ingest(_sample(), tokenizer_dir, tmp_path / "whole", **kw)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for flag in ("resume", "overwrite"):
        out = tmp_path / flag
        with monkeypatch.context() as m:
            m.setattr(output, "install_tokenizer", interrupt) if step == "install_tokenizer" else \
                m.setattr(ParquetWriter, "prepare", classmethod(interrupt))
            with pytest.raises(KeyboardInterrupt):
                ingest(_sample(), tokenizer_dir, out, **kw)
        assert (out / "ingest-plan.json").exists()
        if flag == "resume":  # as if stopped before the inputs' hashes were in (a large input)
            plan = json.loads((out / "ingest-plan.json").read_text())
            plan["splits"]["train"]["sources"][0]["xxh128"] = None
            (out / "ingest-plan.json").write_text(json.dumps(plan))
        ingest(_sample(), tokenizer_dir, out, **kw, **{flag: True})
        assert fingerprint(out) == fingerprint(tmp_path / "whole") and verify_store(out).ok


def test_a_resume_of_an_ingest_an_earlier_lmdata_started_hashes_its_inputs_as_it_did(tmp_path, tokenizer_dir):
    """Its plan recorded the inputs' sha256 (store format 2): the resume hashes them with sha256 to compare
    (it had said the input changed), and still refuses an input that did change."""
    import hashlib

    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    ingest(_sample(), tokenizer_dir, tmp_path / "whole", **kw)
    for name, digest in (("s", hashlib.sha256(SAMPLE.read_bytes()).hexdigest()), ("changed", "0" * 64)):
        out = tmp_path / name
        ingest(_sample(), tokenizer_dir, out, **kw)
        (out / "manifest.json").unlink()  # interrupted before its manifest
        plan = json.loads((out / "ingest-plan.json").read_text())
        source = plan["splits"]["train"]["sources"][0]
        del source["xxh128"]
        source["sha256"] = digest
        (out / "ingest-plan.json").write_text(json.dumps(plan))
        if name == "changed":
            with pytest.raises(LmdataError, match=f"input {SAMPLE} changed since the ingest started"):
                ingest(_sample(), tokenizer_dir, out, resume=True, **kw)
        else:
            ingest(_sample(), tokenizer_dir, out, resume=True, **kw)
            assert fingerprint(out) == fingerprint(tmp_path / "whole") and verify_store(out).ok


def test_a_resume_with_other_options_names_them_as_flags(tmp_path, tokenizer_dir):
    """A resumed store's plan is compared field by field; what differs is said in the command line's terms
    (a changed holdout had read `splits.train.documents[1]: 12150 vs 12160 differs`)."""
    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    out = tmp_path / "s"
    ingest(_sample(), tokenizer_dir, out, holdout=("train", "validation", 6), **kw)
    cases = [(dict(holdout=("train", "validation", 4)), r"split 'train' took documents 0 to 55 of its input, "
                                                          r"this run 0 to 57: a different --holdout"),
             (dict(holdout=None), r"the splits were \['train', 'validation'\], now \['train'\]"),
             (dict(holdout=("train", "validation", 6), shard_tokens=777), r"--shard-tokens was \d+, now 777"),
             (dict(holdout=("train", "validation", 6), formats=["parquet"]), r"--format was \['memmap'\], now \['parquet'\]")]
    for change, said in cases:
        with pytest.raises(LmdataError, match=r"was started with different settings \(" + said):
            ingest(_sample(), tokenizer_dir, out, resume=True, **(kw | change))
    text = tmp_path / "grown.txt"  # an input that changed moves the holdout's span too: the input is named
    text.write_bytes(SAMPLE.read_bytes())
    grown = tmp_path / "g"
    ingest({"train": SourceSpec((str(text),))}, tokenizer_dir, grown, holdout=("train", "validation", 6), **kw)
    (grown / "manifest.json").unlink()
    text.write_bytes(SAMPLE.read_bytes() + b"\n<|endoftext|>\none more document\n")
    with pytest.raises(LmdataError, match=r"different settings \(input .*grown.txt changed since the ingest started"):
        ingest({"train": SourceSpec((str(text),))}, tokenizer_dir, grown, holdout=("train", "validation", 6),
               resume=True, **kw)


def test_resume_with_overwrite_is_refused_before_out_is_made(tmp_path, tokenizer_dir):
    with pytest.raises(LmdataError, match="--resume and --overwrite exclude each other"):
        ingest(_sample(), tokenizer_dir, tmp_path / "new" / "s", formats=["memmap"], resume=True, overwrite=True,
               workers=1, progress=False, log=None)
    assert not (tmp_path / "new").exists()


def test_an_input_given_twice_is_warned_about(tmp_path, tokenizer_dir, recwarn):
    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    ingest({"train": SourceSpec((str(SAMPLE),)), "validation": SourceSpec((str(SAMPLE),))}, tokenizer_dir,
           tmp_path / "a", **kw)
    ingest({"train": SourceSpec((str(SAMPLE), str(SAMPLE)))}, tokenizer_dir, tmp_path / "b", **kw)
    said = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert any(f"input {SAMPLE} is in splits 'train' and 'validation'" in m for m in said), said
    assert any(f"input {SAMPLE} is given twice in split 'train'" in m for m in said), said
    recwarn.clear()
    ingest(_sample(), tokenizer_dir, tmp_path / "c", holdout=("train", "validation", 6), **kw)
    assert not [w for w in recwarn if "given twice" in str(w.message) or "is in splits" in str(w.message)]


def test_resume_with_another_tokenizer_is_refused(tmp_path, tokenizer_dir):
    from lmdata.tokenizer import Tokenizer, train_bpe

    vocab, merges = train_bpe(str(SAMPLE), 300, ["<|endoftext|>"], workers=1)
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(tmp_path / "tok2")
    ingest(_sample(), tokenizer_dir, tmp_path / "s", formats=["memmap"], workers=1, progress=False, log=None)
    with pytest.raises(LmdataError, match=r"tok2 .* does not match the store being resumed"):
        ingest(_sample(), tmp_path / "tok2", tmp_path / "s", formats=["memmap"], resume=True, workers=1,
               progress=False, log=None)


def test_bad_inputs_fail_before_touching_the_output(tmp_path, tokenizer_dir):
    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    out = tmp_path / "s"
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "seps.txt").write_text("<|endoftext|>\n<|endoftext|>\n")
    os.mkfifo(tmp_path / "fifo.txt")  # (a pipe had been a traceback and left a half store)
    cases = [
        ({"train": SourceSpec((str(tmp_path / "fifo.txt"),))}, "fifo.txt: not a regular file"),
        ({"train": SourceSpec((str(tmp_path / "missing.txt"),))}, "missing.txt: no such file"),
        ({"train": SourceSpec((str(tmp_path / "*.nothing"),))}, "matches no files"),
        ({"train": SourceSpec((str(tmp_path / "empty.txt"),))}, "holds no documents"),
        ({"train": SourceSpec((str(tmp_path / "seps.txt"),))}, "holds no documents"),
        (_sample(), "unknown format 'zarr'; valid formats: memmap"),
    ]
    for splits, message in cases:
        with pytest.raises(LmdataError, match=message):
            ingest(splits, tokenizer_dir, out, **(kw | ({"formats": ["zarr"]} if "zarr" in message else {})))
        assert not out.exists()
    with pytest.raises(LmdataError, match="tokenizer .*nope: no such directory"):
        ingest(_sample(), tmp_path / "nope", out, **kw)


def test_invalid_utf8_mid_input(tmp_path, tokenizer_dir):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\n<|endoftext|>\nbro\xc3ken\n")
    with pytest.raises(LmdataError, match=r"bad.txt: invalid UTF-8 at byte 22"):
        ingest({"train": SourceSpec((str(path),))}, tokenizer_dir, tmp_path / "s", workers=1, progress=False,
               log=None, formats=["memmap"])
    lines: list[str] = []
    res = ingest({"train": SourceSpec((str(path),), errors="replace")}, tokenizer_dir, tmp_path / "s2",
                 workers=1, progress=False, log=lines.append, formats=["memmap"])
    assert res.splits["train"].replaced == 1 and "1 invalid UTF-8 sequences replaced" in lines[0]
    assert open_store(tmp_path / "s2").manifest.extra["splits"]["train"]["replaced"] == 1


def test_bad_input_mid_stream_removes_what_a_fresh_run_wrote(tmp_path, tokenizer_dir):
    """The error comes after the plan, tokenizer and a shard were written: a fresh store is
    removed (its parents too, if the run made them), an empty one emptied; the fixed input
    then simply reruns, no flag needed."""
    kw = dict(formats=["memmap", "parquet"], workers=1, shard_tokens=50, progress=False, log=None)
    good = "\n".join(json.dumps({"text": f"document {i} " * 20}) for i in range(20))
    data = tmp_path / "d.jsonl"
    data.write_text(good + "\n{not json\n")
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new" / "parent" / "s", tmp_path / "empty"):
        with pytest.raises(LmdataError, match=r"d.jsonl:21: not valid JSON"):
            ingest({"train": SourceSpec((str(data),))}, tokenizer_dir, out, **kw)
        assert not (tmp_path / "new").exists()
        assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").iterdir())
    data.write_text(good + "\n")
    ingest({"train": SourceSpec((str(data),))}, tokenizer_dir, tmp_path / "empty", **kw)
    assert verify_store(tmp_path / "empty").ok


def test_bad_input_in_a_resumed_store_says_overwrite(tmp_path, tokenizer_dir):
    """A crash (here: an exception from the log callback) keeps the partial store; bad input
    found while resuming it leaves it too, and the error says --overwrite, which then works."""

    class Crash(Exception):
        pass

    def crash(line: str) -> None:
        raise Crash(line)

    (tmp_path / "good.txt").write_text("one\n<|endoftext|>\ntwo\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"three\n<|endoftext|>\nfo\xffur\n")
    splits = {"train": SourceSpec((str(tmp_path / "good.txt"),)), "dev": SourceSpec((str(bad),))}
    out, kw = tmp_path / "s", dict(formats=["memmap"], workers=1, progress=False)
    with pytest.raises(Crash, match="train: 2 documents"):  # crashed after split train, before dev
        ingest(splits, tokenizer_dir, out, log=crash, **kw)
    assert (out / "ingest-plan.json").is_file() and (out / "train" / "memmap").is_dir()
    with pytest.raises(LmdataError, match=r"bad.txt: invalid UTF-8 .*; then rerun with --overwrite: .* "
                                          r"--resume cannot continue it once the input is fixed") as err:
        ingest(splits, tokenizer_dir, out, resume=True, log=None, **kw)
    assert "\n" not in str(err.value)
    assert (out / "ingest-plan.json").is_file() and (out / "train" / "memmap").is_dir()
    bad.write_bytes(b"three\n<|endoftext|>\nfour\n")
    with pytest.raises(LmdataError, match=r"different settings \(input .*bad.txt changed since the ingest started"):
        ingest(splits, tokenizer_dir, out, resume=True, log=None, **kw)
    ingest(splits, tokenizer_dir, out, overwrite=True, log=None, **kw)
    assert show_all(out, "dev") == ["three", "four"]


def test_default_formats_are_the_built_ins(tmp_path, tokenizer_dir):
    """A plug-in (here registered at run time) is written only when named, not by default."""
    from lmdata.store import register_format
    from lmdata.store.formats.memmap import MemmapReader, MemmapWriter
    from lmdata.store.registry import available_formats, unregister_format

    (tmp_path / "d.txt").write_text("one\n<|endoftext|>\ntwo\n")
    register_format("plugin", MemmapWriter, MemmapReader)
    try:
        assert "plugin" in available_formats()
        ingest({"train": SourceSpec((str(tmp_path / "d.txt"),))}, tokenizer_dir, tmp_path / "s", workers=1,
               progress=False, log=None)
    finally:
        unregister_format("plugin")
    assert sorted(open_store(tmp_path / "s").manifest.splits["train"].formats) == ["lance", "memmap", "parquet"]
    assert not (tmp_path / "s" / "train" / "plugin").exists()


def test_unwritable_output(tmp_path, tokenizer_dir):
    (tmp_path / "file").write_text("x")
    with pytest.raises(LmdataError, match="output directory .* is not writable.*--out"):
        ingest(_sample(), tokenizer_dir, tmp_path / "file" / "store", formats=["memmap"], workers=1,
               progress=False, log=None)
    if os.geteuid() != 0:  # root ignores permission bits
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(LmdataError, match="not writable"):
            ingest(_sample(), tokenizer_dir, tmp_path / "ro" / "s", formats=["memmap"], workers=1,
                   progress=False, log=None)


def test_lock_is_released_when_the_holder_dies(tmp_path, tokenizer_dir):
    out = tmp_path / "s"
    out.mkdir()
    with open(out / ".lock", "ab") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(LmdataError, match="another ingest"):
            ingest(_sample(), tokenizer_dir, out, formats=["memmap"], workers=1, progress=False, log=None)
    ingest(_sample(), tokenizer_dir, out, formats=["memmap"], workers=1, progress=False, log=None)


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # train_bpe forks; lance was imported by other tests
def test_pipeline_trains_its_tokenizer_when_missing(tmp_path):
    from click.testing import CliRunner

    from lmdata.cli import cli

    toml = tmp_path / "p.toml"
    toml.write_text(f"""
[tokenizer]
dir = "{tmp_path / 'tok'}"
train_files = ["{SAMPLE}"]
vocab_size = 300
[ingest]
out = "{tmp_path / 'store'}"
formats = ["memmap"]
workers = 1
[ingest.splits.train]
sources = ["{SAMPLE}"]
[ingest.holdout]
documents = 2
[train]
owned_by = "someone else"
""")
    result = CliRunner().invoke(cli, ["ingest", str(toml), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    store = open_store(tmp_path / "store")
    assert store.manifest.vocab_size == 300 and store.manifest.splits["validation"].n_docs == 2


def test_cli_splits_by_flag(tmp_path, tokenizer_dir):
    from click.testing import CliRunner

    from lmdata.cli import cli

    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "b.txt.gz").write_bytes(__import__("gzip").compress(b"three\n<|endoftext|>\nfour\n"))
    args = ["ingest", "--split", f"train={tmp_path / 'a.jsonl'}", "--split", f"dev={tmp_path / '*.gz'}",
            "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "s"), "--format", "memmap,parquet",
            "--workers", "1", "--no-progress"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "train: 2 documents" in result.output and "dev: 2 documents" in result.output
    assert show_all(tmp_path / "s", "dev") == ["three", "four"]
    with pytest.raises(LmdataError, match="--split 'dev': expected NAME=PATH"):
        CliRunner().invoke(cli, ["ingest", "--split", "dev", "--tokenizer", "x", "--out", "y"], catch_exceptions=False)


@pytest.mark.parametrize("name", ["../x", "ABSOLUTE", "..", "a/b", ".x", "tokenizer", "manifest.json"])
def test_split_names_cannot_leave_the_store(tmp_path, tokenizer_dir, name):
    from click.testing import CliRunner

    from lmdata.cli import cli

    name = str(tmp_path / "outside") if name == "ABSOLUTE" else name  # were it accepted: written in tmp_path
    (tmp_path / "small.txt").write_text("one\n<|endoftext|>\ntwo\n")
    work = tmp_path / "work"
    work.mkdir()
    value = f"{name}={tmp_path / 'small.txt'}"
    with pytest.raises(LmdataError, match=r"^--split '.*': split name .* must be a letter or digit") as err:
        CliRunner().invoke(cli, ["ingest", "--split", value, "--tokenizer", str(tokenizer_dir), "--out",
                                 str(work / "st"), "--format", "memmap", "--workers", "1", "--no-progress"],
                           catch_exceptions=False)
    assert "\n" not in str(err.value)
    kw = dict(formats=["memmap"], workers=1, progress=False, log=None)
    spec = SourceSpec((str(tmp_path / "small.txt"),))
    with pytest.raises(LmdataError, match="^--split: split name"):
        ingest({name: spec}, tokenizer_dir, work / "st", **kw)
    with pytest.raises(LmdataError, match="^--holdout split: split name"):
        ingest({"train": spec}, tokenizer_dir, work / "st", holdout=("train", name, 1), **kw)
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["small.txt", "work"]


@given(st.text(min_size=1, max_size=12))
@settings(max_examples=300, deadline=None)
def test_an_accepted_split_name_is_one_directory_inside_the_store(name):
    from lmdata.store.manifest import check_split_name

    store = "/data/store"
    try:
        check_split_name(name, "test")
    except LmdataError:
        return
    path = os.path.normpath(os.path.join(store, name, "memmap"))
    assert os.path.dirname(os.path.dirname(path)) == store and os.path.basename(os.path.dirname(path)) == name
    assert not name.startswith(".") and name not in ("tokenizer", "manifest.json", "ingest-plan.json")


def show_all(store, split):
    from lmdata.inspect import show

    return [show(store, split, i) for i in range(open_store(store).manifest.splits[split].n_docs)]


def test_ingest_modules_import_light():
    code = ("import sys, lmdata.ingest, lmdata.sources, lmdata.config, lmdata.inspect, lmdata.cli.ingest, "
            "lmdata.ingest.output; print(','.join(m for m in ('pyarrow', 'lance', 'duckdb', 'polars', 'torch', "
            "'tqdm', 'zstandard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_writers_prepare_on_the_main_thread_before_their_first_shard(tmp_path, tokenizer_dir, monkeypatch):
    """Parquet's and Lance's imports happen while the inputs are hashed, not in a writer thread's first shard."""
    import threading

    from lmdata.store.formats.lance import LanceWriter
    from lmdata.store.formats.parquet import ParquetWriter

    events: list[tuple[str, str, str]] = []
    for cls in (ParquetWriter, LanceWriter):
        prepare, write_shard = cls.prepare.__func__, cls.write_shard

        def recording_prepare(c, dtype, _prepare=prepare, _name=cls.__name__):
            events.append((_name, "prepare", threading.current_thread().name))
            _prepare(c, dtype)

        def recording_write(self, *args, _write=write_shard, _name=cls.__name__):
            events.append((_name, "write", threading.current_thread().name))
            return _write(self, *args)

        monkeypatch.setattr(cls, "prepare", classmethod(recording_prepare))
        monkeypatch.setattr(cls, "write_shard", recording_write)
    ingest(_sample(), tokenizer_dir, tmp_path / "s", formats=["parquet", "lance"], shard_tokens=SAMPLE_SHARD_TOKENS,
           workers=2, progress=False, log=None)
    for name in ("ParquetWriter", "LanceWriter"):
        mine = [(what, thread) for n, what, thread in events if n == name]
        assert mine[0] == ("prepare", "MainThread") and sum(w == "prepare" for w, _ in mine) == 1
        assert len(mine) > 2 and all(w == "write" for w, _ in mine[1:])


def test_a_holdout_into_a_split_that_has_inputs_says_how_to_resolve_it(tmp_path, tokenizer_dir):
    """The advice had been "name another split", which the command line cannot."""
    splits = {"train": SourceSpec((str(SAMPLE),)), "validation": SourceSpec((str(SAMPLE),))}
    with pytest.raises(LmdataError, match=r"--holdout split 'validation' already has its own inputs \(--split "
                                          r"validation=...\); drop one of the two, or hold out into another split"):
        ingest(splits, tokenizer_dir, tmp_path / "s", holdout=("train", "validation", 2), formats=["memmap"],
               workers=1, progress=False, log=None)
    assert not (tmp_path / "s").exists()
