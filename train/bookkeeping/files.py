"""Writing files so that a killed job never leaves a half-written one behind, and so that a link
planted in a workdir or output folder never redirects a write (or a read) to the file it names.

The last path component is never trusted: a symlink there is refused when reading or appending,
and replaced, not followed, when a file is written whole. The folders above it are taken as they
are (a folder link inside a workdir or output folder is followed): such a folder is safe only if
no one else can write to it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

PARTIAL = ".partial"  # the suffix of every temporary file write_atomically makes (".NAME.<random>.partial")


def write_atomically(path: Path, data: bytes) -> None:
    """The file appears whole or not at all, and a link planted at PATH is replaced, never followed
    (`atomic_file`)."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write PATH through, for one too large to hold whole in memory: it appears
    whole or not at all. Written to a fresh temporary file in the same folder (mkstemp: a random
    name, O_EXCL, so nothing planted can be written through), flushed to disk, then renamed over
    PATH (os.replace replaces a symlink at PATH, never follows it) when the block ends; an
    exception in the block removes it and leaves PATH as it was. The file gets the mode a plain
    open() would give it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = _locked_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:  # closing it releases the flock, after the rename
            os.fchmod(f.fileno(), _new_file_mode())
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """A temporary file's path to write PATH through, for a writer that takes a path rather than a
    file (ArrayRecord's): the file at PATH appears whole or not at all, as `atomic_file`'s does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = _locked_temp(path)
    try:
        os.fchmod(fd, _new_file_mode())
        yield temp
        os.fsync(fd)  # the writer wrote and closed its own handle on the same file
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    finally:
        os.close(fd)


def remove_partials(folder: Path) -> int:
    """Removes the temporary files that killed writers left in FOLDER (not below it): every
    `.*.partial` whose writer is gone (its flock is free); a live writer's is left alone. Returns how
    many were removed."""
    removed = 0
    for entry in Path(folder).glob(f".*{PARTIAL}"):
        try:
            fd = os.open(entry, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone meanwhile, or a link (nothing write_atomically made): left alone
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode) and _flock_now(fd) and same_file(fd, entry):
                entry.unlink()
                removed += 1
        finally:
            os.close(fd)
    return removed


def open_regular(path: Path, mode: str) -> IO[Any]:
    """`open(path, mode)` for "r", "rb", "a" or "ab" (appending creates it), refused with a
    ValueError naming PATH unless it is a regular file: a symlink there is not followed. For the files
    a run reads back or appends to in its workdir."""
    flags = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND | os.O_CREAT}[mode.rstrip("b")]
    try:  # O_NONBLOCK: a FIFO planted there opens at once (and is refused) instead of hanging
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise ValueError(f"{path} is a symbolic link; a run reads and appends only to regular files there: "
                         "remove the link (rm) and start again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file: remove it and start again")
    return os.fdopen(fd, mode)


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temporary file beside PATH, flocked so that remove_partials sees its writer alive."""
    for _ in range(3):
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL, dir=path.parent)
        try:
            held = _flock_now(fd)
        except OSError:  # no flock on this file system: remove_partials cannot take it either
            return fd, temp
        if held and same_file(fd, temp):
            return fd, temp
        os.close(fd)  # remove_partials took it between its creation and our flock: it is removing it
    raise OSError(f"cannot create a temporary file beside {path}: each one was removed as it was made")


def _flock_now(fd: int) -> bool:
    """An exclusive flock on FD if free now; False if someone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def same_file(fd: int, path: str | Path) -> bool:
    """Whether the open FD is still the file at PATH (not removed or replaced since it was opened)."""
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)


@functools.cache
def _new_file_mode() -> int:
    """0o666 less the umask: what open() gives a new file (mkstemp gives 0o600)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    mask = os.umask(0o077)  # no /proc: read it by setting it (a restrictive one meanwhile)
    os.umask(mask)
    return 0o666 & ~mask
