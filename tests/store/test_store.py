"""open_store / Store and the format registry: the ways in, and the errors at the boundary."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store, register_format
from lmdata.store.manifest import FORMAT_VERSION
from lmdata.store.registry import available_formats, get_format, unregister_format


def _read_each_shard(reader) -> None:
    """A window and the document starts of every shard: where a reader checks each shard's files (its
    creation stats none of them, so a store of 100,000 shards starts as fast as one of 10)."""
    for i, shard in enumerate(reader.shards):
        if shard.n_tokens:
            reader.windows(np.array([shard.first_token]), 1)
        reader.doc_starts(i)


def test_store_api(make_store):
    syn = make_store(["parquet", "memmap"])
    store = open_store(syn.path)
    assert store.splits == ["train"]
    assert store.formats("train") == ["parquet", "memmap"]
    assert store.default_format("train") == "memmap"
    assert store.n_tokens("train") == len(syn.stream)
    assert store.dtype == np.uint16 and store.eot_id == syn.eot
    np.testing.assert_array_equal(store.document("train", 1), syn.stream[syn.doc_starts[1] : syn.doc_starts[2]])


def test_dataset_windows_are_the_contract(make_store):
    pytest.importorskip("lmdata.store.dataset")
    syn = make_store(["memmap", "parquet"])
    store = open_store(syn.path)
    for fmt in ("memmap", "parquet"):
        ds = store.dataset("train", 64, format=fmt)
        assert len(ds) == (len(syn.stream) - 1) // 64
        np.testing.assert_array_equal(np.asarray(ds[3]), syn.stream[3 * 64 : 4 * 64 + 1])
    ds = store.dataset("train", 64, format="parquet", reader_options={"cache_bytes": 1})
    assert ds.reader.cache_bytes == 1


def test_unknown_split_and_format_list_the_valid_ones(make_store):
    syn = make_store(["memmap"])
    store = open_store(syn.path)
    with pytest.raises(LmdataError, match="no split 'valid'; splits: train"):
        store.reader("valid")
    with pytest.raises(LmdataError, match="formats there: memmap"):
        store.reader("train", "parquet")
    with pytest.raises(LmdataError, match="unknown format 'zarr'; valid formats: memmap, lance, parquet"):
        get_format("zarr")


def _edit_manifest(path, edit):
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_newer_manifest_version_is_refused(make_store):
    syn = make_store(["memmap"])
    _edit_manifest(syn.path, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(LmdataError, match="newer than this lmdata supports"):
        open_store(syn.path)


@pytest.mark.parametrize("bad", ["../../../etc/passwd", "/etc/passwd", "a/../../x.bin"])
def test_manifest_paths_outside_the_store_are_refused(make_store, bad):
    syn = make_store(["memmap"])

    def edit(m):
        m["splits"]["train"]["formats"]["memmap"]["shards"][0]["files"][0]["path"] = bad

    _edit_manifest(syn.path, edit)
    store = open_store(syn.path)  # the recorded paths are checked when a reader of the format is made
    with pytest.raises(LmdataError, match="escapes the store"):
        store.reader("train", "memmap")


@pytest.mark.parametrize("dtype", ["float64", "int8", "object", "uint64", "<u2"])
def test_manifest_dtype_must_be_a_token_dtype(make_store, dtype):
    syn = make_store(["memmap"])
    _edit_manifest(syn.path, lambda m: m.update(dtype=dtype))
    with pytest.raises(LmdataError, match=r"manifest.json: dtype .* is not one of uint16, uint32") as err:
        open_store(syn.path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["..", "../x", "/abs", "a/b", ".hidden", "", "tokenizer", "manifest.json"])
def test_manifest_split_names_are_checked(make_store, bad):
    syn = make_store(["memmap"])
    _edit_manifest(syn.path, lambda m: m.update(splits={bad: m["splits"]["train"]}))
    with pytest.raises(LmdataError, match=r"manifest.json: split name .* must be a letter or digit"):
        open_store(syn.path)


@pytest.mark.parametrize("name", ["tokens-00000.bin", "tokens-00001.bin.crc"])
def test_symlink_out_of_the_store_is_refused(make_store, tmp_path, name):
    """Where a shard's first touch reads the file (a reader's creation stats none): the CRC sidecar
    too, which had been followed and read."""
    syn = make_store(["memmap"])
    victim = syn.path / "train" / "memmap" / name
    outside = tmp_path / "outside"
    victim.rename(outside)
    victim.symlink_to(outside)
    with pytest.raises(LmdataError, match=f"{re.escape(name)}: resolves outside the store"):
        _read_each_shard(open_store(syn.path).reader("train", "memmap"))


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_open_names_a_missing_or_short_shard_file_and_follows_a_link_inside(make_store, fmt):
    """Each file where a reader first reads it: a missing file and a short one are named; a symlink to a
    file inside the store is followed (its target has the size)."""
    syn = make_store([fmt])
    victim = sorted((syn.path / "train" / fmt).glob("*-00001.*"))[0]
    data = victim.read_bytes()
    moved = syn.path / "train" / f"moved-{victim.name}"  # inside the store, outside the format directory
    victim.rename(moved)
    with pytest.raises(LmdataError, match=rf"{victim.name}: shard \S+ file is missing"):
        _read_each_shard(open_store(syn.path).reader("train", fmt))
    victim.symlink_to(moved)
    _read_each_shard(open_store(syn.path).reader("train", fmt))
    victim.unlink()
    victim.write_bytes(data[:-1])
    with pytest.raises(LmdataError, match=rf"{victim.name}: shard \S+ file has {len(data) - 1} bytes, the manifest "
                                          rf"says {len(data)}"):
        _read_each_shard(open_store(syn.path).reader("train", fmt))


def test_a_format_directory_linked_out_of_the_store_is_refused(make_store, tmp_path):
    """Files are checked with one realpath per format directory: a linked directory is still caught."""
    syn = make_store(["memmap"])
    fmt_dir, outside = syn.path / "train" / "memmap", tmp_path / "elsewhere"
    fmt_dir.rename(outside)
    fmt_dir.symlink_to(outside, target_is_directory=True)
    with pytest.raises(LmdataError, match="outside the store"):
        _read_each_shard(open_store(syn.path).reader("train", "memmap"))


def test_tokenizer_hash_is_checked(make_store):
    syn = make_store(["memmap"])
    open_store(syn.path, tokenizer_hash="0" * 64)
    with pytest.raises(LmdataError, match="tokenizer"):
        open_store(syn.path, tokenizer_hash="f" * 64)


def test_manifest_counts_must_add_up(make_store):
    syn = make_store(["memmap"])
    _edit_manifest(syn.path, lambda m: m["splits"]["train"].update(n_tokens=1))
    with pytest.raises(LmdataError, match="manifest is corrupt"):
        open_store(syn.path).reader("train", "memmap")


def test_a_damaged_format_does_not_stop_another_from_being_read(make_store):
    """Each shard's files are checked when it is first read: a truncated memmap shard had refused a
    Parquet reader of the same split (and open_store stat-ed every file of every format)."""
    syn = make_store(["memmap", "parquet"])
    victim = sorted((syn.path / "train" / "memmap").glob("tokens-00001.bin"))[0]
    victim.write_bytes(victim.read_bytes()[:-2])
    store = open_store(syn.path)
    assert (store.reader("train", "parquet").windows(np.array([0]), 16)[0] == syn.stream[:16]).all()
    reader = store.reader("train", "memmap")
    with pytest.raises(LmdataError, match="tokens-00001.bin: shard 00001 file has"):
        _read_each_shard(reader)


def test_a_format_registered_at_run_time_is_used(make_store):
    from lmdata.store.formats.memmap import MemmapReader, MemmapWriter

    class Upper(MemmapReader):
        pass

    register_format("memmap2", MemmapWriter, Upper)
    try:
        assert "memmap2" in available_formats()
        syn = make_store(["memmap2"])
        r = open_store(syn.path).reader("train")
        assert isinstance(r, Upper)
        np.testing.assert_array_equal(r.windows(np.array([5]), 9)[0], syn.stream[5:14])
    finally:
        unregister_format("memmap2")
    with pytest.raises(LmdataError, match="directory name"):
        register_format("../x", MemmapWriter, Upper)


def test_importing_the_store_package_stays_light():
    code = (
        "import sys, lmdata.store as s; s.register_format; s.get_format('memmap');"
        "print(','.join(m for m in ('pyarrow', 'lance', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def run_with_plugin(tmp_path, module: str, source: str, entry: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python that sees a distribution ``module`` declaring ``entry`` under ``lmdata.formats``."""
    (tmp_path / f"{module}.py").write_text(source)
    dist = tmp_path / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[lmdata.formats]\n{entry}\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_plugin_formats_load_from_entry_points(tmp_path):
    """A third-party distribution declaring an ``lmdata.formats`` entry point (installed on sys.path)."""
    out = run_with_plugin(
        tmp_path, "toyfmt",
        "from lmdata.store.formats.memmap import MemmapReader, MemmapWriter\nFORMAT = (MemmapWriter, MemmapReader)\n",
        "toy = toyfmt:FORMAT",
        "from lmdata.store.registry import available_formats, get_format;"
        "print(available_formats()[-1], get_format('toy').reader.__name__)",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["toy", "MemmapReader"]


@pytest.mark.parametrize("value", ["42", "Writer", "(1, 2, 3)"])
def test_a_plugin_entry_point_of_the_wrong_shape_is_an_error(tmp_path, value):
    code = (
        "from lmdata.errors import LmdataError\n"
        "from lmdata.store.registry import available_formats\n"
        "for _ in range(2):\n"
        "    try: available_formats()\n"
        "    except LmdataError as e: print(e)\n"
    )
    out = run_with_plugin(tmp_path, "badfmt", f"class Writer: pass\nFORMAT = {value}\n", "bad = badfmt:FORMAT", code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]  # refused every time, not only the first
    assert "format plug-in 'bad' (badfmt:FORMAT)" in lines[0]
    assert "a module that calls register_format" in lines[0] and "(Writer, Reader) pair" in lines[0]


def test_tokenizer_is_loaded_and_its_hash_checked(make_store):
    from lmdata.tokenizer import Tokenizer

    syn = make_store(["memmap"])
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"])
    digest = tok.save(syn.path / "tokenizer")
    _edit_manifest(syn.path, lambda m: m["tokenizer"].update(hash=digest))
    assert open_store(syn.path).tokenizer().decode([104, 105]) == "hi"
    _edit_manifest(syn.path, lambda m: m["tokenizer"].update(hash="sha256:" + "0" * 64))
    with pytest.raises(LmdataError, match="does not match the manifest"):
        open_store(syn.path).tokenizer()


def test_register_format_refuses_a_taken_name_unless_asked():
    from lmdata.store.formats.memmap import MemmapReader, MemmapWriter

    class Other(MemmapReader):
        pass

    with pytest.raises(LmdataError, match="'parquet' is already registered; .*replace=True"):
        register_format("parquet", MemmapWriter, Other)
    assert get_format("parquet").reader.__name__ == "ParquetReader"  # the built-in stays
    register_format("mine", MemmapWriter, MemmapReader)
    try:
        with pytest.raises(LmdataError, match="'mine' is already registered"):
            register_format("mine", MemmapWriter, Other)
        register_format("mine", MemmapWriter, Other, replace=True)
        assert get_format("mine").reader is Other
    finally:
        unregister_format("mine")


def test_a_missing_sidecar_is_named_with_its_shard(make_store):
    syn = make_store(["memmap"])
    (syn.path / "train" / "memmap" / "tokens-00001.bin.crc").unlink()
    with pytest.raises(LmdataError, match=r"tokens-00001.bin.crc: shard 00001 file is missing"):
        _read_each_shard(open_store(syn.path).reader("train", "memmap"))


@pytest.mark.parametrize("mapped", ["1", "0"])
def test_a_fifo_in_place_of_a_shard_is_refused_not_waited_on(make_store, mapped):
    """Shard files are opened without blocking: a FIFO where a shard should be had hung the first batch
    for good (Ctrl-C included) once no `lstat` of every file came first."""
    import os

    syn = make_store(["memmap"])
    victim = syn.path / "train" / "memmap" / "tokens-00001.bin"
    victim.unlink()
    os.mkfifo(victim)
    code = ("import numpy as np\nfrom lmdata.store import open_store\n"
            f"r = open_store({str(syn.path)!r}).reader('train', 'memmap')\n"
            "r.windows(np.array([0]), 8)\nr.windows(r._shard_bounds[1:2], 8)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LMDATA_MAP_SHARDS": mapped})
    assert done.returncode == 1 and "tokens-00001.bin: shard 00001 file has 0 bytes" in done.stderr, done.stderr


def test_a_table_read_by_many_threads_at_once_is_built_once(make_store):
    """``ShardTable`` builds on first read: threads making readers of one freshly opened store at once
    had met a half-built table (a bare TypeError)."""
    import threading

    from lmdata.store.manifest import ShardTable

    syn = make_store(["memmap"], shard_tokens=200)
    raw = json.loads((syn.path / "manifest.json").read_text())["splits"]["train"]["formats"]["memmap"]["shards"]
    raw = raw * (4000 // len(raw) + 1)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(10):
            table, got, errors = ShardTable(list(raw), "manifest.json", "f", "memmap"), [], []

            def read() -> None:
                try:
                    got.append((len(table), len(list(table))))
                except Exception as exc:  # noqa: BLE001 - any error is the failure
                    errors.append(exc)

            threads = [threading.Thread(target=read) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors and got == [(len(raw), len(raw))] * 6
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize("path", [None, 123, ""])
def test_open_store_of_no_path_is_one_line(path):
    with pytest.raises(LmdataError, match=r"open_store\(.*\): give a store's directory or s3:// URI"):
        open_store(path)


def test_a_reader_option_no_reader_takes_is_named(sample_store):
    """It had been a TypeError: ParquetReader.__init__() got an unexpected keyword argument 'bogus'."""
    with pytest.raises(LmdataError, match="reader option 'bogus': the parquet reader takes cache_bytes, use_cache, verify"):
        open_store(sample_store).dataset("train", 16, format="parquet", reader_options={"bogus": 1})


def test_a_manifest_that_is_a_directory_is_called_damage(tmp_path):
    """It had read "not a store (no manifest.json)", or with a plan beside it "an interrupted ingest"."""
    (tmp_path / "manifest.json").mkdir()
    (tmp_path / "ingest-plan.json").write_text("{}")
    with pytest.raises(LmdataError, match=r"manifest.json: is a directory, not the store's manifest; the store is "
                                          r"damaged \(re-ingest with --overwrite\)$"):
        open_store(tmp_path)
