"""Submissions are inert files: inspected without following anything, then copied, never linked.

A submitted folder is the student's: a symlink in it (the notebook, a folder, any file) could
make the grader read, hash or overwrite something of the instructor's; a hard link is another
name for a file elsewhere; a FIFO blocks whoever opens it; a device is no file at all; and
sheer size or count stalls the class. :func:`inspect` walks a folder through directory file
descriptors (``os.scandir`` and ``lstat``, ``O_NOFOLLOW`` at every step), refuses all of those
with a :class:`Rejected` that names the path and what is wrong with it (a ``timestamp.txt``
nbgrader could not read as a date too), and hashes the regular files. :func:`copy_inert`
copies only regular files the same way, so grading only ever sees a copy that cannot point
anywhere.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OUTPUT",
    "SUBMISSION",
    "Caps",
    "Rejected",
    "copy_inert",
    "inspect",
    "open_folder",
    "read_inert",
    "write_inert",
]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO swapped in must not block


TIMESTAMP = "timestamp.txt"  # when it was submitted, as nbgrader's exchange writes it


class Rejected(ValueError):  # noqa: N818 - a verdict on the submission, not the caller's error
    """A submission that is not plain files and folders within the caps; says which path and why."""


@dataclass(frozen=True)
class Caps:
    """The most a folder may hold: one file, all files together, files and folders counted."""

    file_bytes: int
    total_bytes: int
    entries: int


SUBMISSION = Caps(file_bytes=20 * 2**20, total_bytes=100 * 2**20, entries=300)
# What grading wrote back (the executed notebook and files the code made in its folder).
OUTPUT = Caps(file_bytes=512 * 2**20, total_bytes=2**30, entries=2000)

_KINDS = {
    stat.S_IFREG: "a file",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def open_folder(base: Path, *names: str) -> int:
    """A directory fd for ``base/names...``, each name opened without following a symlink.

    ``base`` is the instructor's (``submitted/`` may well be a link to a shared drive).
    """
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, name in enumerate(names):
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                what = "missing" if err.errno == errno.ENOENT else _what(fd, name)
                raise Rejected(f"{'/'.join(names[: i + 1])} is {what}, not a folder") from None
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _what(fd: int, name: str) -> str:
    """What ``name`` in dir ``fd`` is, in words (a symlink says where it points)."""
    mode = os.lstat(name, dir_fd=fd).st_mode
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(name, dir_fd=fd)[:200]})"
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file or folder")


def _walk(
    fd: int, rel: str, caps: Caps, tally: list[int], skipped: list[str] | None = None
) -> Iterator[tuple[str, int, str, bool]]:
    """Every entry under dir ``fd`` as (path, dir fd, name, is_dir), depth first, by name.

    Raises :class:`Rejected` at the first entry that is not a plain folder or a regular file
    with one name (or, given ``skipped``, lists it there and goes on), and when the folder
    goes over ``caps``; nothing is followed or opened except through a directory fd with
    ``O_NOFOLLOW``.
    """
    with os.scandir(fd) as entries:
        ordered = sorted(entries, key=lambda e: e.name)
    for entry in ordered:
        path, st = rel + entry.name, entry.stat(follow_symlinks=False)
        tally[0] += 1
        if tally[0] > caps.entries:
            raise Rejected(f"more than {caps.entries} files and folders (at {path})")
        if stat.S_ISDIR(st.st_mode):
            yield path, fd, entry.name, True
            sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            try:
                yield from _walk(sub, path + "/", caps, tally, skipped)
            finally:
                os.close(sub)
            continue
        try:
            _check_file(path, st, caps, fd, entry.name)
        except Rejected as why:
            if skipped is None:
                raise
            skipped.append(str(why))
            continue
        tally[1] += st.st_size
        if tally[1] > caps.total_bytes:
            raise Rejected(f"more than {caps.total_bytes // 2**20} MiB in all (at {path})")
        yield path, fd, entry.name, False


def _check_file(path: str, st: os.stat_result, caps: Caps, fd: int, name: str) -> None:
    """Refuse anything but a regular file with one name (no hard link) within the size cap."""
    if not stat.S_ISREG(st.st_mode):
        raise Rejected(f"{path} is {_what(fd, name)}, not a regular file")
    if st.st_nlink > 1:
        raise Rejected(f"{path} is a hard link ({st.st_nlink} names for one file)")
    if st.st_size > caps.file_bytes:
        cap = caps.file_bytes // 2**20
        said = f"{path} is {st.st_size / 2**20:.1f} MiB, over the {cap} MiB cap"
        if name.endswith(".ipynb"):  # outputs or saved widget state: the answers are small
            said += ": clear its outputs (Edit > Clear Outputs of All Cells), save, submit again"
        raise Rejected(said)


def _read(fd: int, name: str, path: str, caps: Caps) -> bytes:
    """A regular file's bytes, opened without following and checked again once open."""
    try:
        file = os.open(name, FILE_FLAGS, dir_fd=fd)
    except OSError as err:
        raise Rejected(f"{path} could not be opened as a plain file ({err.strerror})") from None
    with os.fdopen(file, "rb") as f:
        _check_file(path, os.fstat(f.fileno()), caps, fd, name)  # it may have changed since
        data = f.read(caps.file_bytes + 1)
    if len(data) > caps.file_bytes:
        raise Rejected(f"{path} grew over {caps.file_bytes // 2**20} MiB while being read")
    return data


def inspect(base: Path, *names: str, caps: Caps = SUBMISSION) -> str:
    """Check ``base/names...`` holds only plain folders and files within ``caps``; its hash.

    The hash covers every file's path and contents, so a rerun can tell an unchanged
    submission (:mod:`course.grading.classrun`'s manifest).
    """
    h = hashlib.sha256()
    fd = open_folder(base, *names)
    try:
        for path, dir_fd, name, is_dir in _walk(fd, "", caps, [0, 0]):
            if not is_dir:
                data = _read(dir_fd, name, path, caps)
                if path == TIMESTAMP:
                    _check_timestamp(data)
                h.update(path.encode() + b"\0" + data + b"\0")
    finally:
        os.close(fd)
    return h.hexdigest()


def _check_timestamp(data: bytes) -> None:
    """Refuse a ``timestamp.txt`` that nbgrader could not read as a date (it would fail)."""
    from nbgrader.utils import parse_utc

    try:
        parse_utc(data.decode().strip())
    except Exception as err:  # noqa: BLE001 - dateutil raises several kinds; each is a refusal
        shown = data[:80].decode(errors="replace").strip()
        raise Rejected(f"{TIMESTAMP} holds {shown!r}, which is not a date ({err})") from None


def read_inert(
    base: Path, names: tuple[str, ...], caps: Caps = SUBMISSION, strict: bool = True
) -> tuple[dict[str, bytes], list[str]]:
    """The regular files of ``base/names...`` as {relative path: bytes}, and what was left out.

    With ``strict`` anything else refuses the whole folder (:class:`Rejected`); without it
    (results read back from grading) symlinks and special files are left out and listed.
    """
    skipped: list[str] = []
    files: dict[str, bytes] = {}
    fd = open_folder(base, *names)
    try:
        for path, dir_fd, name, is_dir in _walk(fd, "", caps, [0, 0], None if strict else skipped):
            if is_dir:
                continue
            try:
                files[path] = _read(dir_fd, name, path, caps)
            except Rejected as why:
                if strict:
                    raise
                skipped.append(str(why))
    finally:
        os.close(fd)
    return files, skipped


def write_inert(files: dict[str, bytes], dest: Path) -> None:
    """Write {relative path: bytes} under a new ``dest``; a path that could leave it is refused."""
    dest.mkdir(parents=True)
    for path, data in files.items():
        parts = path.split("/")
        if not isinstance(data, bytes) or path.startswith("/") or {"", ".", ".."} & set(parts):
            raise Rejected(f"{path[:200]!r} is not a plain relative path with bytes")
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        with open(dest / path, "xb") as out:  # "x": never through a name made meanwhile
            out.write(data)


def copy_inert(
    base: Path, names: tuple[str, ...], dest: Path, caps: Caps = SUBMISSION, strict: bool = True
) -> list[str]:
    """Copy the plain folders and regular files of ``base/names...`` into a new ``dest``.

    With ``strict`` anything else refuses the whole folder (:class:`Rejected`); without it
    (results copied back from grading) symlinks and special files are left out and listed.
    """
    files, skipped = read_inert(base, names, caps, strict)
    write_inert(files, dest)
    return skipped
