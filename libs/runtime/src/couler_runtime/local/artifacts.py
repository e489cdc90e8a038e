"""Host paths for container paths, and the local artifact store.

Steps run on the host, not in containers, so the absolute paths a step
declares (output parameter files, output and input artifact paths) are
rewritten into a private directory per execution:
``<run_dir>/steps/<step>/<execution>/root<path>`` -- an output declared at
``/tmp/out.txt`` is read from ``.../root/tmp/out.txt``; an inner step of a
sub-workflow uses ``<run_dir>/steps/<outer>/<execution>/<inner>/<execution>``.
Volume mounts map their mount path (and everything below it) to
``<run_dir>/volumes/<volume>`` (plus the mount's ``sub_path``), a directory
shared by every step of the run.
The same rewrite is applied to the command, the arguments, the env values,
the working directory and the script source, so a step that writes
``/tmp/out.txt`` writes the mapped file.

Artifacts are copied into ``<run_dir>/artifacts/<step>/<artifact>`` (``<step>``
is the record name, ``outer/inner`` for an inner step of a sub-workflow) when
a step succeeds (the last successful execution of a map or loop wins) and
copied out to the reading step's mapped path before it starts.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["ArtifactStore", "PathMap", "copy_path", "digest_path"]

_PATH_END = r"(?![A-Za-z0-9_.\-])"


class PathMap:
    """Maps container paths to host paths for one execution.

    Args:
        root: The execution's private root directory.
        files: Absolute paths the step declares (mapped to ``root + path``).
        mounts: Mount path -> host directory (prefix mappings).
    """

    def __init__(self, root: Path, files: Iterable[str], mounts: Mapping[str, Path]) -> None:
        self.root = root
        self.mapping: dict[str, str] = {}
        for path in files:
            if path.startswith("/") and self._mount_of(path, mounts) is None:
                self.mapping[path.rstrip("/") or "/"] = str(root) + path.rstrip("/")
        self.mounts = {m.rstrip("/"): str(host) for m, host in mounts.items()}
        keys = sorted([*self.mapping, *self.mounts], key=len, reverse=True)
        self._pattern = (re.compile("|".join(re.escape(k) + _PATH_END for k in keys))
                         if keys else None)

    @staticmethod
    def _mount_of(path: str, mounts: Mapping[str, Path]) -> str | None:
        for mount in mounts:
            m = mount.rstrip("/")
            if path == m or path.startswith(m + "/"):
                return m
        return None

    def host(self, path: str) -> Path:
        """The host path of a container path (relative paths are under the root)."""
        if not path.startswith("/"):
            return self.root / path
        return Path(self.rewrite(path)) if self._pattern else Path(path)

    def rewrite(self, text: str) -> str:
        """Replace every mapped path (and mount prefix) occurring in ``text``."""
        if self._pattern is None:
            return text
        table = {**self.mapping, **self.mounts}

        def repl(match: re.Match[str]) -> str:
            return table[match.group(0)]

        # Mount prefixes are followed by "/..." which _PATH_END allows ("/" is not excluded).
        return self._pattern.sub(repl, text)


def copy_path(src: Path, dst: Path) -> None:
    """Copy a file or a directory tree to ``dst``, replacing what is there."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)


class ArtifactStore:
    """A directory holding every artifact of a run, by step and artifact name.

    Args:
        root: The store directory (``<run_dir>/artifacts``).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def location(self, step: str, artifact: str) -> Path:
        """Where the artifact ``artifact`` of ``step`` is kept."""
        return self.root / step / artifact

    def put(self, step: str, artifact: str, src: Path) -> Path:
        """Copy ``src`` (file or directory) into the store and return its location."""
        dst = self.location(step, artifact)
        copy_path(src, dst)
        return dst

    def get(self, step: str, artifact: str, dst: Path) -> None:
        """Copy a stored artifact to ``dst``.

        Raises:
            FileNotFoundError: The artifact was never stored.
        """
        src = self.location(step, artifact)
        if not src.exists():
            raise FileNotFoundError(f"artifact {artifact!r} of step {step!r} is not in the store")
        copy_path(src, dst)


def digest_path(path: Path) -> str:
    """The content digest of a file or directory: ``sha256:`` + hex.

    A directory hashes its files' relative paths and contents in sorted order, so the
    same tree always gets the same digest.
    """
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f.relative_to(path).as_posix().encode() + b"\0")
            h.update(bytes.fromhex(digest_path(f)[len("sha256:"):]))
        return "sha256:" + h.hexdigest()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
