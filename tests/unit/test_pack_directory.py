"""Directory artifacts as deterministic tars: pack, digest, unpack (and what unpack refuses)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from couler.errors import UserError
from couler_runtime.blobs import LocalBlobStore
from couler_runtime.local.artifacts import (
    MARKER,
    digest_path,
    is_packed_directory,
    pack_directory,
    unpack_directory,
)
from couler_submitter.artifacts import ArtifactBlobs


def packed(src: Path) -> bytes:
    buf = io.BytesIO()
    pack_directory(src, buf)
    return buf.getvalue()


def model_tree(root: Path, *, reverse: bool = False, mtime: int = 1_000_000) -> Path:
    """A small model directory, its entries created in one order or the other."""
    files = {"weights.bin": b"\x00\x01" * 100, "config.json": b'{"layers": 2}',
             "tok/vocab.txt": b"a\nb\n", "tok/merges.txt": b"a b\n"}
    root.mkdir(parents=True)
    for rel in sorted(files, reverse=reverse):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(files[rel])
        os.utime(root / rel, (mtime, mtime))
    (root / "empty").mkdir()
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o700 if reverse else 0o755)  # both executable
    (root / "latest").symlink_to("weights.bin")
    return root


def test_the_same_tree_gives_the_same_bytes_and_digest(tmp_path: Path) -> None:
    a = model_tree(tmp_path / "a")
    b = model_tree(tmp_path / "b", reverse=True, mtime=2_000_000)
    (b / "config.json").chmod(0o600)  # not executable either way: 0o644
    assert packed(a) == packed(b)
    assert digest_path(a) == digest_path(b)


def test_digest_path_of_a_directory_is_the_sha256_of_its_packed_bytes(tmp_path: Path) -> None:
    tree = model_tree(tmp_path / "m")
    data = packed(tree)
    assert digest_path(tree) == "sha256:" + hashlib.sha256(data).hexdigest()
    (tmp_path / "m.tar").write_bytes(data)
    assert digest_path(tmp_path / "m.tar") == digest_path(tree)  # a file: its bytes


def test_the_archive_is_normalized_and_sorted(tmp_path: Path) -> None:
    tree = model_tree(tmp_path / "m")
    (tree / ("long-" + "n" * 150)).write_text("a name longer than 100 bytes")
    with tarfile.open(fileobj=io.BytesIO(packed(tree)), mode="r:") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[0] == MARKER and members[0].isreg() and members[0].size == 0
    assert names[1:] == sorted(names[1:])
    assert set(names[1:]) == {"config.json", "empty", "latest", "run.sh", "tok",
                              "tok/merges.txt", "tok/vocab.txt", "weights.bin",
                              "long-" + "n" * 150}
    assert all((m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "") for m in members)
    modes = {m.name: m.mode for m in members}
    assert (modes["empty"], modes["tok"], modes["run.sh"]) == (0o755, 0o755, 0o755)
    assert (modes["config.json"], modes["tok/vocab.txt"]) == (0o644, 0o644)
    link = next(m for m in members if m.name == "latest")
    assert link.issym() and link.linkname == "weights.bin"


@pytest.mark.parametrize("change", ["content", "name", "add-empty-dir", "mode"])
def test_a_change_changes_the_digest(tmp_path: Path, change: str) -> None:
    tree = model_tree(tmp_path / "m")
    before = digest_path(tree)
    if change == "content":
        (tree / "tok/vocab.txt").write_bytes(b"a\nc\n")
    elif change == "name":
        (tree / "tok/vocab.txt").rename(tree / "tok/vocab2.txt")
    elif change == "add-empty-dir":
        (tree / "tok/more").mkdir()
    else:
        (tree / "config.json").chmod(0o755)
    assert digest_path(tree) != before


def test_pack_and_unpack_round_trip_empty_dirs_and_symlinks(tmp_path: Path) -> None:
    tree = model_tree(tmp_path / "m")
    archive = tmp_path / "m.tar"
    archive.write_bytes(packed(tree))
    assert is_packed_directory(archive)
    dest = tmp_path / "out" / "model"
    dest.parent.mkdir()
    dest.write_text("replaced")  # whatever is there is replaced
    unpack_directory(archive, dest)
    assert dest.is_dir()
    assert (dest / "empty").is_dir() and not any((dest / "empty").iterdir())
    assert (dest / "latest").is_symlink() and os.readlink(dest / "latest") == "weights.bin"
    assert (dest / "tok/merges.txt").read_bytes() == b"a b\n"
    assert os.access(dest / "run.sh", os.X_OK)
    assert not (dest / MARKER).exists()
    assert digest_path(dest) == digest_path(tree)
    assert [p.name for p in dest.parent.iterdir()] == ["model"]  # no temporary left


def test_is_packed_directory_is_false_for_other_files(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"not a tar")
    (tmp_path / "empty").write_bytes(b"")
    other = tmp_path / "other.tar"
    with tarfile.open(other, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo("readme"))
    assert not any(is_packed_directory(tmp_path / n) for n in ("plain", "empty", "other.tar"))
    with pytest.raises(UserError, match="not a packed directory"):
        unpack_directory(other, tmp_path / "dest")


def crafted(path: Path, *members: tarfile.TarInfo) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo(MARKER))
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size))
    return path


def info(name: str, *, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    if link:
        m.type, m.linkname = tarfile.SYMTYPE, link
    else:
        m.size = 1
    return m


@pytest.mark.parametrize(("member", "why"), [
    (info("../escape.txt"), "'..'"),
    (info("sub/../../escape.txt"), "'..'"),
    (info("/tmp/absolute.txt"), "absolute path"),
    (info("up", link="../../etc/passwd"), "outside"),
    (info("abs", link="/etc/passwd"), "absolute path"),
])
def test_unpack_refuses_paths_leaving_the_destination(tmp_path: Path, member: tarfile.TarInfo,
                                                      why: str) -> None:
    archive = crafted(tmp_path / "bad.tar", info("ok.txt"), member)
    assert is_packed_directory(archive)
    dest = tmp_path / "area" / "dest"
    with pytest.raises(UserError, match=why):
        unpack_directory(archive, dest)
    assert not dest.exists() and not (tmp_path / "escape.txt").exists()
    assert list((tmp_path / "area").iterdir()) == []  # nothing extracted, nothing left


def test_artifact_blobs_store_a_directory_under_its_digest_and_restore_it(
        tmp_path: Path) -> None:
    blobs = ArtifactBlobs(LocalBlobStore(tmp_path / "blobs"))
    tree = model_tree(tmp_path / "m")
    stored = blobs.upload(tree)
    assert stored.digest == digest_path(tree) and stored.size_bytes == len(packed(tree))
    assert stored.uri.startswith("file://")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blobs", "m"]  # no temporary left
    dest = tmp_path / "restored" / "model"
    dest.parent.mkdir()
    dest.write_text("an older file")
    blobs.download(stored.digest, dest)  # a directory replaces a file
    assert dest.is_dir() and digest_path(dest) == stored.digest
    (tmp_path / "plain.txt").write_text("plain")
    plain = blobs.upload(tmp_path / "plain.txt")
    blobs.download(plain.digest, dest)  # and a file replaces a directory
    assert dest.read_text() == "plain" and plain.digest == digest_path(tmp_path / "plain.txt")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model"]


def test_unpacked_modes_follow_the_umask(tmp_path: Path) -> None:
    """A service runs with umask 077: a directory restored from the cache is private too."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "file.txt").write_text("x")
    archive = tmp_path / "a.tar"
    with archive.open("wb") as out:
        pack_directory(src, out)
    old = os.umask(0o077)
    try:
        unpack_directory(archive, tmp_path / "dest")
    finally:
        os.umask(old)
    for path in [tmp_path / "dest", *(tmp_path / "dest").rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
