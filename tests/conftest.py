"""Fixtures every test directory may use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a fresh tmpfs of ``size`` (e.g. "600k") mounted under ``tmp_path``, unmounted after.

    Mounting needs root (or CAP_SYS_ADMIN) and a kernel/container that permits it: where it
    is refused the test is skipped, saying so (issue 19: full-disk tests run where they can).
    """
    mounts: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"fs-{len(mounts)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here ({done.stderr.strip() or done.returncode}); "
                        "the full-disk test needs root and a kernel that permits tmpfs mounts")
        mounts.append(point)
        return point

    def resize(point: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(point)], check=True)

    make.resize = resize
    yield make
    for point in reversed(mounts):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
