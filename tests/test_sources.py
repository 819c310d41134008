"""Documents out of text, lines, JSON Lines and Parquet files, plain, .gz and .zst."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.io.location import location
from lmdata.sources import SourceSpec, SourceStats, expand, iter_documents

DOCS = ["first doc\nwith two lines", "second <|endoftext|> inline is text", "third\n\n"]


def _compress(path: Path, comp: str) -> Path:
    data = path.read_bytes()
    if comp == "":
        return path
    out = path.with_name(path.name + comp)
    if comp == ".gz":
        out.write_bytes(gzip.compress(data))
    else:
        import zstandard

        out.write_bytes(zstandard.ZstdCompressor().compress(data))
    path.unlink()
    return out


def _write(tmp_path: Path, kind: str, docs: list[str]) -> Path:
    if kind == "text":
        path = tmp_path / "in.txt"
        path.write_text("".join(d + "\n<|endoftext|>\n" for d in docs))
    elif kind == "lines":
        path = tmp_path / "in.lines"
        path.write_text("".join(d + "\n" for d in docs))
    elif kind == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "in.parquet"
        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path, row_group_size=2)
    return path


def _read(spec: SourceSpec, stats: SourceStats | None = None) -> list[str]:
    return [d.text for d in iter_documents(spec, stats)]


@pytest.mark.parametrize("comp", ["", ".gz", ".zst"])
@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_every_kind_and_compression_round_trips(tmp_path, kind, comp):
    path = _compress(_write(tmp_path, kind, DOCS), comp)
    assert _read(SourceSpec((str(path),))) == DOCS  # kind "auto" by extension


@pytest.mark.parametrize("comp", ["", ".gz", ".zst"])
def test_one_document_per_line(tmp_path, comp):
    docs = ["a line", "another line", "<|endoftext|> is text here"]
    path = _compress(_write(tmp_path, "lines", docs), comp)
    assert _read(SourceSpec((str(path),), kind="lines")) == docs


def test_text_documents_are_exactly_the_bytes_between_separators(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("<|endoftext|>\na\n\n<|endoftext|>\n<|endoftext|>\nb\r\n<|endoftext|>\r\nlast without separator\n")
    assert _read(SourceSpec((str(path),))) == ["a\n", "b", "last without separator"]
    path.write_text("x\n###\ny\n")
    assert _read(SourceSpec((str(path),), kind="text", separator="###")) == ["x", "y"]


# "\0" excluded: a text source holding a NUL byte is binary and refused (test_arrow_and_binary.py)
@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_characters="\r\0", blacklist_categories=["Cs"]), min_size=1), max_size=8))
def test_text_round_trip_property(tmp_path_factory, docs):
    docs = [d for d in docs if "<|endoftext|>" not in d.split("\n")]
    path = tmp_path_factory.mktemp("prop") / "p.txt"
    path.write_bytes("".join(d + "\n<|endoftext|>\n" for d in docs).encode("utf-8"))
    assert _read(SourceSpec((str(path),))) == docs


def test_globs_sorted_and_errors(tmp_path):
    for name in ["b.txt", "a.txt", "c.md"]:
        (tmp_path / name).write_text(name)
    assert [p.name for p in expand([str(tmp_path / "*.txt")])] == ["a.txt", "b.txt"]
    assert _read(SourceSpec((str(tmp_path / "*.txt"),))) == ["a.txt", "b.txt"]
    with pytest.raises(LmdataError, match=r"glob .*\*\.json.* matches no files"):
        expand([str(tmp_path / "*.json")])
    with pytest.raises(LmdataError, match="nope.txt: no such file"):
        expand([str(tmp_path / "nope.txt")])
    with pytest.raises(LmdataError, match="is a directory"):
        expand([str(tmp_path)])


def test_file_uris_are_local_paths_and_globs(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("x")
    assert expand([f"file://{tmp_path}/a.txt"]) == [location(tmp_path / "a.txt")]
    assert [p.name for p in expand([f"file://{tmp_path}/*.txt"])] == ["a.txt", "b.txt"]
    with pytest.raises(LmdataError, match="no such file"):
        expand([f"file://{tmp_path}/nope.txt"])


@pytest.mark.parametrize("comp", ["", ".gz"])
def test_invalid_utf8_names_file_and_byte_offset(tmp_path, comp):
    raw = tmp_path / "bad.txt"
    raw.write_bytes(b"good doc\n<|endoftext|>\nok \xff bad\n")
    path = _compress(raw, comp)
    with pytest.raises(LmdataError, match=rf"{path.name}: invalid UTF-8 at byte 26; .*--errors replace"):
        _read(SourceSpec((str(path),)))
    stats = SourceStats()
    assert _read(SourceSpec((str(path),), errors="replace"), stats) == ["good doc", "ok \ufffd bad"]
    assert stats.replaced == 1


def test_replace_counts_every_bad_sequence(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "a\xff\xfeb\xc3"}\n')
    stats = SourceStats()
    assert _read(SourceSpec((str(path),), errors="replace"), stats) == ["a\ufffd\ufffdb\ufffd"]
    assert stats.replaced == 3


def test_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"\n')
    with pytest.raises(LmdataError, match=r"d.jsonl:3: not valid JSON"):
        _read(SourceSpec((str(path),)))
    path.write_text('{"text": "one"}\n{"body": "two"}\n')
    with pytest.raises(LmdataError, match=r"d.jsonl:2: no field 'text'.*--text-field"):
        _read(SourceSpec((str(path),)))
    path.write_text('{"body": "one"}\n{"body": "two", "text": 1}\n')
    assert _read(SourceSpec((str(path),), text_field="body")) == ["one", "two"]
    path.write_text('{"text": 5}\n')
    with pytest.raises(LmdataError, match=r"d.jsonl:1: field 'text' is int, not a string; fix the line, or set "):
        _read(SourceSpec((str(path),)))
    path.write_text('{"text": "one"}\n"just a string"\n')  # (it had been "no field 'text'")
    with pytest.raises(LmdataError, match=r"d.jsonl:2: a JSON str, not an object; JSON Lines input holds one object"):
        _read(SourceSpec((str(path),)))


def test_parquet_missing_column_and_binary_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"body": pa.array([b"x", b"\xffy", None], pa.binary())}), path)
    with pytest.raises(LmdataError, match=r"b.parquet: no column 'text' \(columns: body\)"):
        _read(SourceSpec((str(path),)))
    with pytest.raises(LmdataError, match=r"b.parquet row 1: invalid UTF-8 at byte 0"):
        _read(SourceSpec((str(path),), text_field="body"))
    stats = SourceStats()
    assert _read(SourceSpec((str(path),), text_field="body", errors="replace"), stats) == ["x", "\ufffdy"]
    assert stats.replaced == 1


def test_bad_spec_values():
    with pytest.raises(LmdataError, match="kind 'csv'"):
        SourceSpec(("x",), kind="csv")
    with pytest.raises(LmdataError, match="--errors 'ignore'"):
        SourceSpec(("x",), errors="ignore")
    with pytest.raises(LmdataError, match="no input given"):
        SourceSpec(())


@pytest.mark.parametrize("comp", [".gz", ".zst"])
def test_corrupt_compressed_input_is_named(tmp_path, comp):
    path = _compress(_write(tmp_path, "text", DOCS * 200), comp)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(LmdataError, match=rf"input .*{path.name}: corrupt"):
        _read(SourceSpec((str(path),)))


def test_multi_frame_zstd(tmp_path):
    import zstandard

    c = zstandard.ZstdCompressor()
    path = tmp_path / "m.txt.zst"
    path.write_bytes(c.compress(b"a\n<|endoftext|>\nb") + c.compress(b"c\n<|endoftext|>\n") + c.compress(b""))
    assert _read(SourceSpec((str(path),))) == ["a", "bc"]
    (tmp_path / "empty.txt.zst").write_bytes(b"")
    assert _read(SourceSpec((str(tmp_path / "empty.txt.zst"),))) == []


def test_garbage_zstd_is_named(tmp_path):
    path = tmp_path / "g.txt.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\xff" * 64)
    with pytest.raises(LmdataError, match=r"g.txt.zst: corrupt"):
        _read(SourceSpec((str(path),)))


def test_broken_parquet_is_named(tmp_path):
    path = _write(tmp_path, "parquet", DOCS)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(LmdataError, match=r"in.parquet: not a readable Parquet file"):
        _read(SourceSpec((str(path),)))


@pytest.mark.parametrize("kind,body", [
    ("text", "first\n<|endoftext|>\nsecond\n"), ("lines", "first\nsecond\n"),
    ("jsonl", '{"text": "first"}\n{"text": "second"}\n'),
])
def test_a_utf8_bom_opening_the_file_is_not_in_document_0(tmp_path, kind, body):
    """Issue 29: a file saved by a Windows tool starts with EF BB BF; it stayed in document 0's text."""
    path = tmp_path / f"in.{kind}"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    docs = list(iter_documents(SourceSpec((str(path),), kind=kind)))
    assert [d.text for d in docs] == ["first", "second"]
    assert sum(d.raw_bytes for d in docs) == path.stat().st_size  # the mark is still counted as read
    assert docs[0].offset == 0


def test_a_missing_input_under_a_folder_with_a_readme_points_to_it(tmp_path, monkeypatch):
    """Issue 30.10: the TinyStories pipeline's 'no such file' did not point to data/README.md."""
    from lmdata.io.streams import read_error

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "README.md").write_text("how to fetch TinyStories")
    hint = "no such file; data/README.md says how to get the data"
    with pytest.raises(LmdataError, match=f"^input data/tinystories/train.txt: {hint}$"):
        expand(["data/tinystories/train.txt"])
    assert str(read_error(location("data/tinystories/train.txt"), FileNotFoundError())).endswith(hint)  # tokenizer train
    with pytest.raises(LmdataError, match="^input nope.txt: no such file$"):  # the working directory: no hint
        expand(["nope.txt"])


_PIECES = st.sampled_from(["<|endoftext|>", "<|endoftext|>", "\n", "\n", "\r", "a", "b c", "é", "\ufeff", "<|end", "oftext|>",
                           "x<|endoftext|>", "<|endoftext|>y", " <|endoftext|>"])


@settings(max_examples=300, deadline=None)
@given(text=st.lists(_PIECES, max_size=40).map("".join), block=st.integers(1, 40), comp=st.sampled_from(["", ".gz"]))
def test_the_block_text_reader_equals_the_line_reader(tmp_path_factory, text, block, comp):
    """The text reader finds separator lines in blocks; a block boundary anywhere (inside the
    separator, between ``\\r`` and ``\\n``) gives the documents, offsets and sizes of a line at a time."""
    import lmdata.sources as sources

    path = tmp_path_factory.mktemp("blocks") / f"t.txt{comp}"
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if comp else data)
    spec = SourceSpec((str(path),))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sources, "TEXT_BLOCK_BYTES", block)
        by_block = list(sources._text_documents(location(str(path)), spec, SourceStats()))
    by_line = list(sources._text_documents_by_line(location(str(path)), spec, SourceStats()))
    assert by_block == by_line


_BYTE_PIECES = st.sampled_from([b"<|endoftext|>\n", b"\r\n", b"\n", b"a", b"\xc3\xa9", b"\xff", b"\xc3", b"\x00",
                                b"\xef\xbb\xbf", b"<|endoftext|>\r\n", b"text "])


@settings(max_examples=300, deadline=None)
@given(data=st.lists(_BYTE_PIECES, max_size=30).map(b"".join), block=st.integers(1, 40),
       errors=st.sampled_from(["strict", "replace"]))
@example(data=b"a\r\n<|endoftext|>\nb\r\n<|endoftext|>\r\nc", block=40, errors="strict")  # CRLF before a separator
@example(data=b"a\n<|endoftext|>\n" + b"b" * 70000 + b"\x00c\n<|endoftext|>\n", block=40, errors="replace")  # past the sniff
@example(data=b"a\n<|endoftext|>\nb\xffc\xc3\n<|endoftext|>\n", block=40, errors="replace")  # replaced, counted
def test_the_block_text_reader_equals_the_line_reader_on_any_bytes(tmp_path_factory, data, block, errors):
    """Invalid UTF-8, NUL bytes and BOMs anywhere: the block reader (which decodes a document from its
    buffer) gives the line reader's documents, replacement counts and errors."""
    import lmdata.sources as sources

    path = tmp_path_factory.mktemp("bytes") / "t.txt"
    path.write_bytes(data)
    spec = SourceSpec((str(path),), errors=errors)

    def read(reader, **patches):
        stats = SourceStats()
        with pytest.MonkeyPatch.context() as patch:
            for name, value in patches.items():
                patch.setattr(sources, name, value)
            try:
                return list(reader(location(str(path)), spec, stats)), stats.replaced
            except LmdataError as exc:
                return str(exc), None

    assert read(sources._text_documents, TEXT_BLOCK_BYTES=block) == read(sources._text_documents_by_line)


def test_a_datasetdict_directory_names_its_splits(tmp_path):
    """`datasets.DatasetDict.save_to_disk` writes one directory per split: the error says how to pass them
    (it had suggested a '*.txt' glob)."""
    import json

    from lmdata.errors import LmdataError
    from lmdata.sources import expand

    root = tmp_path / "hfdd"
    for name in ("train", "test"):
        (root / name).mkdir(parents=True)
        (root / name / "state.json").write_text("{}")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(LmdataError, match=rf"DatasetDict \(splits test, train\); give each split its own: "
                                          rf"--split test={root}/test --split train={root}/train"):
        expand([str(root)])


def test_a_null_text_is_no_document_in_jsonl_as_in_parquet(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lmdata.sources import SourceSpec, iter_documents

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ["a", None, "", "b"]) + "\n")
    pq.write_table(pa.table({"text": ["a", None, "", "b"]}), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.parquet"):
        assert [d.text for d in iter_documents(SourceSpec((str(tmp_path / name),)))] == ["a", "b"], name


def test_a_dictionary_encoded_text_column_is_text(tmp_path):
    """pandas' category columns and Parquet's dictionary pages read back as dictionary<string>: it had been refused,
    with advice to pick another column."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    texts = ["one", "two", "one", None, "three"]
    table = pa.table({"text": pa.array(texts).dictionary_encode()})
    pq.write_table(table, tmp_path / "d.parquet")
    feather.write_feather(table, tmp_path / "d.arrow")
    for name in ("d.parquet", "d.arrow"):
        assert _read(SourceSpec((str(tmp_path / name),))) == ["one", "two", "one", "three"]
