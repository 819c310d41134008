"""``space_for``: a full disk becomes one NoSpaceError; Ctrl-C stays Ctrl-C. ``write_file``: errors name the file."""

import errno

import pytest

from lmdata.io.atomic import NoSpaceError, space_for, write_text


def test_enospc_and_the_libraries_messages_are_no_space(tmp_path):
    with pytest.raises(NoSpaceError, match="no space left on device"):
        with space_for(tmp_path / "f", 10):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(NoSpaceError):
        with space_for(tmp_path / "f", 10):
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed")


def test_other_errors_pass_through(tmp_path):
    with pytest.raises(PermissionError):
        with space_for(tmp_path / "f", 10):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_a_write_error_raised_while_handling_ctrl_c_is_ctrl_c(tmp_path):
    """torch.save interrupted by SIGINT closes its zip writer, which fails with "file write
    failed": that is the user's Ctrl-C (exit 130), not a full disk."""
    with pytest.raises(KeyboardInterrupt):
        with space_for(tmp_path / "f", 10):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")


def test_a_write_that_fails_names_the_file_not_its_temporary(tmp_path):
    """``tokenizer export --out nodir/x.json`` had said ``nodir/.x.json.tmp-9759: No such file or directory``."""
    target = tmp_path / "nodir" / "x.json"
    with pytest.raises(FileNotFoundError) as e:
        write_text(target, "{}")
    assert e.value.filename == str(target) and e.value.errno == errno.ENOENT
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_a_directory_built_aside_gets_the_mode_mkdir_would(tmp_path):
    """Tokenizer folders had been 0700 whatever the umask (``mkdtemp``'s mode, kept by the rename)."""
    import os

    from lmdata.io.atomic import temp_dir

    old = os.umask(0o027)
    try:
        made = temp_dir(tmp_path / "tok")
    finally:
        os.umask(old)
    assert made.parent == tmp_path and made.name.startswith(".tok.tmp-")
    assert made.stat().st_mode & 0o777 == 0o750
