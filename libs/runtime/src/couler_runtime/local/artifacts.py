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

A directory artifact has one byte form, :func:`pack_directory`'s deterministic tar (a
``.couler-directory`` marker first, then the tree in sorted order with its times, owners and
modes normalized): its sha256 is the directory's digest (:func:`digest_path`) and it is the
blob the cache stores, so a restored directory (:func:`unpack_directory`) keeps its digest and
the cache keys of the steps that read it.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from couler.errors import UserError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = [
    "MARKER",
    "ArtifactStore",
    "PathMap",
    "copy_path",
    "digest_path",
    "is_packed_directory",
    "pack_directory",
    "unpack_directory",
]

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
        # In a container the directories holding declared paths exist too: a step may be
        # given one (``--in-report /tmp/couler/in/report`` holding one report per
        # producer). Parents three levels deep or more map like the paths they hold;
        # shallower ones ("/tmp", "/data/x") stay as they are.
        for path in list(self.mapping):
            parent = path.rsplit("/", 1)[0]
            while parent.count("/") >= 3 and parent not in self.mapping:
                if self._mount_of(parent, mounts) is None:
                    self.mapping[parent] = str(root) + parent
                parent = parent.rsplit("/", 1)[0]
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
        # Items of a map run side by side and each keeps its artifact as the step's too:
        # one replacement at a time (two at once unlinked the same file twice).
        self._lock = threading.Lock()

    def location(self, step: str, artifact: str) -> Path:
        """Where the artifact ``artifact`` of ``step`` is kept."""
        return self.root / step / artifact

    def put(self, step: str, artifact: str, src: Path) -> Path:
        """Copy ``src`` (file or directory) into the store and return its location
        (thread-safe: the last copy wins)."""
        dst = self.location(step, artifact)
        with self._lock:
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

    A file hashes its bytes. A directory hashes the bytes :func:`pack_directory` writes for
    it (streamed, never held in memory): the same tree always gets the same digest, and it is
    the digest of the blob the cache stores for the directory.
    """
    h = hashlib.sha256()
    if path.is_dir():
        _pack(path, _HashWriter(h))
        return "sha256:" + h.hexdigest()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


MARKER = ".couler-directory"
"""The first member of every tar :func:`pack_directory` writes."""

_CHUNK = 1 << 20


class _HashWriter(io.BufferedIOBase):
    """A write-only stream feeding a hash (tarfile writes to it in stream mode)."""

    def __init__(self, h: hashlib._Hash) -> None:
        super().__init__()
        self._h = h

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        view = memoryview(data)
        self._h.update(view)
        return view.nbytes


def _entries(src: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``src`` (not following symlinks) as (relative posix path, lstat)."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(src / rel if rel else src) as it:
            for entry in it:
                name = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                yield name, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(name)


def _member(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _pack(src: Path, dest: IO[bytes] | io.BufferedIOBase) -> None:
    """:func:`pack_directory` to any writable binary stream (tar stream mode only writes)."""
    with tarfile.open(fileobj=dest, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_member(MARKER, tarfile.REGTYPE, 0o644))
        for rel, st in sorted(_entries(src), key=lambda e: e[0]):
            path = src / rel
            if stat.S_ISDIR(st.st_mode):
                tar.addfile(_member(rel, tarfile.DIRTYPE, 0o755))
            elif stat.S_ISLNK(st.st_mode):
                info = _member(rel, tarfile.SYMTYPE, 0o777)
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info = _member(rel, tarfile.REGTYPE, 0o755 if st.st_mode & 0o111 else 0o644)
                info.size = st.st_size
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            # Sockets, FIFOs and devices hold no content to keep: left out.


def pack_directory(src: Path, dest: IO[bytes]) -> None:
    """Write a deterministic tar of the directory ``src`` to ``dest``.

    The first member is an empty file named ``.couler-directory`` (the marker
    :func:`is_packed_directory` looks for), then every entry under ``src`` in sorted order of
    its relative path: directories (empty ones too), regular files and symlinks (as
    symlinks; sockets, FIFOs and devices are left out). Times are 0, owners 0 with no names,
    modes 0o755 for directories and executable files and 0o644 for other files; GNU format
    (long names), no compression. The same tree always gives the same bytes.
    """
    _pack(src, dest)


def is_packed_directory(path: Path) -> bool:
    """Whether the file at ``path`` is a tar written by :func:`pack_directory`."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            first = tar.next()
    except (tarfile.TarError, OSError):
        return False
    return first is not None and first.name == MARKER and first.isreg()


def _check_member(archive: Path, member: tarfile.TarInfo) -> None:
    """Refuse names and link targets that could land outside the destination."""
    def refuse(why: str) -> UserError:
        return UserError(f"archive {archive.name!r}: member {member.name!r} {why}")

    if posixpath.isabs(member.name):
        raise refuse("has an absolute path")
    if ".." in member.name.split("/"):
        raise refuse("has a '..' component")
    if not (member.isdir() or member.isreg() or member.issym()):
        raise refuse("is not a file, a directory or a symlink")
    if member.issym():
        if posixpath.isabs(member.linkname):
            raise refuse("links to an absolute path")
        target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name),
                                                   member.linkname))
        if target == ".." or target.startswith("../"):
            raise refuse("links outside the directory")


def _umask() -> int:
    """This process's umask, read from /proc: ``os.umask`` can only read it by setting it,
    which a thread creating a file meanwhile would see."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def unpack_directory(archive: Path, dest: Path) -> None:
    """Restore a tar written by :func:`pack_directory` as the directory ``dest``.

    Whatever is at ``dest`` is replaced once the whole archive is extracted (into a
    temporary directory beside it), so ``dest`` never holds a partial tree.

    Raises:
        UserError: ``archive`` is not a packed directory, or a member has an absolute path,
            a ``..`` component or a link leading out of ``dest``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="r:") as tar:
        members = tar.getmembers()
        if not members or members[0].name != MARKER:
            raise UserError(f"archive {archive.name!r} is not a packed directory")
        for member in members[1:]:
            _check_member(archive, member)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part"))
        try:
            tar.extractall(tmp, members=members[1:], filter="data")
            # The archive's modes (0755/0644) under this process's umask, as if the tree
            # had been written here: a service's umask 077 keeps its runs private.
            mask = _umask()
            tmp.chmod(0o755 & ~mask)
            for path in tmp.rglob("*"):
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode & 0o7777 & ~mask)
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            elif dest.exists() or dest.is_symlink():
                dest.unlink()
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
