"""lmdata's local cache (``io/cache.py``): how much of a disk copies of remote data may take."""

from __future__ import annotations

from collections import namedtuple

from lmdata.io import cache


def test_copies_never_take_the_last_tenth_of_the_disk(tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda _: usage(1000, 700, 300))
    where = tmp_path / "not" / "made" / "yet"
    assert cache.fits_on_disk(where, 200)  # 100 left of 1000: a tenth
    assert not cache.fits_on_disk(where, 201)
    where.mkdir(parents=True)
    (where / "held").write_bytes(b"x" * 50)  # copies already here count as reusable
    assert cache.fits_on_disk(where, 250) and not cache.fits_on_disk(where, 251)
