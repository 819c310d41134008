"""lmdata's local cache (``io/cache.py``): how much of a disk copies of remote data may take."""

from __future__ import annotations

from collections import namedtuple

import pytest

from lmdata.errors import LmdataError
from lmdata.io import cache

usage = namedtuple("usage", "total used free")


def test_copies_never_take_the_last_tenth_of_the_disk(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.KEEP_FREE_ENV, raising=False)  # (the suite sets it: see conftest)
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda _: usage(1000, 700, 300))
    where = tmp_path / "not" / "made" / "yet"
    assert cache.fits_on_disk(where, 200)  # 100 left of 1000: a tenth
    assert not cache.fits_on_disk(where, 201)
    where.mkdir(parents=True)
    (where / "held").write_bytes(b"x" * 50)  # copies already here count as reusable
    assert cache.fits_on_disk(where, 250) and not cache.fits_on_disk(where, 251)


def test_the_tenth_is_of_what_this_user_can_reach_not_of_root_reserved_blocks(tmp_path, monkeypatch):
    """252 GB of which 78 used and 24 available (the rest reserved): 24 GB free is room, not a full disk."""
    monkeypatch.delenv(cache.KEEP_FREE_ENV, raising=False)
    gb = 1 << 30
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda _: usage(252 * gb, 78 * gb, 24 * gb))
    assert cache.fits_on_disk(tmp_path, 13 * gb)  # 11 GB left of 102 reachable
    assert not cache.fits_on_disk(tmp_path, 14 * gb)


def test_the_fraction_kept_free_is_a_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda _: usage(1000, 700, 300))
    monkeypatch.setenv(cache.KEEP_FREE_ENV, "0.25")
    assert cache.fits_on_disk(tmp_path, 50) and not cache.fits_on_disk(tmp_path, 51)
    monkeypatch.setenv(cache.KEEP_FREE_ENV, "0")
    assert cache.fits_on_disk(tmp_path, 300) and not cache.fits_on_disk(tmp_path, 301)
    for bad in ("1", "-0.1", "a tenth"):
        monkeypatch.setenv(cache.KEEP_FREE_ENV, bad)
        with pytest.raises(LmdataError, match=f"LMDATA_CACHE_KEEP_FREE='{bad}': give the fraction"):
            cache.fits_on_disk(tmp_path, 1)


def test_a_lock_held_past_the_wait_is_no_lock(tmp_path, monkeypatch):
    """A copy's maker stuck while alive (its flock never released) must not hang every process that needs
    the copy: past ``LOCK_WAIT_S`` the copy is made without the lock."""
    import threading

    from filelock import FileLock

    monkeypatch.setattr(cache, "LOCK_WAIT_S", 0.2)
    path = tmp_path / "copy.bin.lock"
    stuck = FileLock(str(path))  # another holder (another process's would be the same flock)
    taken, release, ran = threading.Event(), threading.Event(), []

    def hold():
        with stuck:
            taken.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    taken.wait(60)
    with cache.held_lock(path):
        ran.append(True)
    release.set()
    holder.join(60)
    assert ran == [True]
    with cache.held_lock(path):  # free again: taken as usual
        ran.append(True)
    assert ran == [True, True]
