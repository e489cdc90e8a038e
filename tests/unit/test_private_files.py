"""couler_runtime.private_files: files only their owner may read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from couler.errors import UserError
from couler_runtime.private_files import check_private, write_private


def test_write_private_is_0600_in_a_0700_directory_and_replaces_atomically(
        tmp_path: Path) -> None:
    target = tmp_path / "new" / "seed"
    write_private(target, "first")
    write_private(target, b"second")
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert [p.name for p in target.parent.iterdir()] == ["seed"]  # no temporary left
    assert check_private(target, "seed file").st_size == len(b"second")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_file_others_may_use_is_refused_with_its_mode_and_the_fix(
        tmp_path: Path, mode: int) -> None:
    loose = tmp_path / "secrets.env"
    loose.write_text("x")
    os.chmod(loose, mode)
    with pytest.raises(UserError, match=rf"secrets file {loose} is readable by others "
                                        rf"\(mode {mode:o}\); chmod 600 {loose}"):
        check_private(loose, "secrets file")


def test_a_missing_file_or_a_directory_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"seed file .*missing: No such file"):
        check_private(tmp_path / "missing", "seed file")
    with pytest.raises(UserError, match="is not a regular file"):
        check_private(tmp_path, "seed file")
