"""A full disk: ingest and checkpoint into a small tmpfs.

One line naming the path and the bytes, exit 1, no traceback; the ingest's partial output is
kept resumable (no manifest, so never a store), and ``--resume`` finishes it once there is
space; a checkpoint leaves no file behind and the previous one intact. Skipped (saying so)
where a tmpfs cannot be mounted.
"""

from __future__ import annotations


import pytest
from samples import SAMPLE, run_cli

from lmdata.cli import main


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code, _, err = run_cli(list(argv), capsys)
    return code, err


@pytest.mark.parametrize("fmt, size", [("memmap", "600k"), ("parquet", "200k"), ("lance", "600k")])
def test_ingest_into_a_full_disk_is_one_line_and_resumable(small_fs, tokenizer_dir, capsys, fmt, size):
    fs = small_fs(size)  # less than the split needs (Parquet's zstd shards are ~3x smaller)
    out = fs / "store"
    argv = ["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(out),
            "--format", fmt, "--no-progress"]
    code, err = _cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {out}/train/{fmt}") and "no space left on device (writing about " in lines[0]
    assert "bytes free there" in lines[0] and "--resume" in lines[0]
    assert not (out / "manifest.json").exists() and not list(out.rglob(".*.tmp-*"))
    small_fs.resize(fs, "16m")
    main(argv + ["--resume"])  # returns: success
    main(["verify", str(out)])
    assert (out / "manifest.json").is_file()


def test_checkpoint_into_a_full_disk_is_one_line_and_leaves_no_file(small_fs, tmp_path):
    import torch

    from lmdata.errors import LmdataError
    from lmdata.train.checkpoint import list_checkpoints, save_checkpoint

    fs = small_fs("1m")
    model = torch.nn.Linear(256, 256)  # 256 KiB of weights, 768 KiB with AdamW's state
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 256)).sum().backward()
    opt.step()
    with pytest.raises(LmdataError) as err:
        save_checkpoint(fs / "ckpt", model, opt, step=1)
        save_checkpoint(fs / "ckpt", model, opt, step=2)
    text = str(err.value)
    assert "\n" not in text and f"{fs}/ckpt/ckpt-0000000" in text and "no space left on device" in text
    assert "bytes free there" in text
    assert [p.name for p in (fs / "ckpt").iterdir()] == [p.name for p in list_checkpoints(fs / "ckpt")]
