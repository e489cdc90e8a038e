"""Files only their owner may read: seeds, secrets, the stack's state.

* :func:`write_atomic` -- write a file atomically (a temporary file, then a rename).
* :func:`write_private` -- the same with mode 0600 (its directory 0700).
* :func:`check_private` -- refuse a file that others may read, naming what it is for.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from couler.errors import UserError

__all__ = ["check_private", "write_atomic", "write_private"]


def write_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, then a rename):
    a reader sees the old file or the new one, never part of it. ``mode``: the new file's
    permissions (default: the temporary file's, 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_private(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically, readable by its owner only (0600); a missing
    directory is made 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, data.encode() if isinstance(data, str) else data, mode=0o600)


def check_private(path: str | os.PathLike[str], what: str) -> os.stat_result:
    """``path``'s status, when it is a regular file that only its owner may read or write.

    Args:
        path: The file.
        what: What the file is, for the messages (``"secrets file"``, say).

    Raises:
        UserError: It cannot be read, is not a regular file, or others may use it.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise UserError(f"{what} {p}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} {p} is not a regular file")
    if st.st_mode & 0o077:
        raise UserError(f"{what} {p} is readable by others (mode "
                        f"{stat.S_IMODE(st.st_mode):o}); chmod 600 {p}")
    return st
