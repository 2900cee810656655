"""One live training run per workdir: WORKDIR/run.lock, held (flock) for the run's whole life.

The lock file records who holds it (host, pid, start time). The operating system releases the
flock when the holder exits, however it exits, so a lock left by a killed run is free: the next
run takes it over with a warning naming the run that left it. A second live run fails at once
with a ValueError naming the holder. Process 0 of a multi-host job holds it for the job.

Nothing planted in the workdir redirects it: run.lock is opened without following a symlink and
refused unless it is a regular file with one link, and the flock is kept only if the file it is
on is still the one at the path. The workdir folder itself is flocked as well, so that a run.lock
removed (or replaced) under a live run does not let a second run in; on a file system without
flock on folders (some NFS mounts) the lock file alone guards the workdir.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import IO, Any

from triskele.train.bookkeeping.files import open_regular, same_file

_ATTEMPTS = 3  # times run.lock may be replaced between our open and our flock before we give up


class _Busy(Exception):
    """A live run holds the workdir."""


class WorkdirLock:
    def __init__(self, workdir: Path, enabled: bool = True):
        self.path = Path(workdir) / "run.lock"
        self.enabled = enabled
        self.handle: IO[Any] | None = None
        self.folder: int | None = None  # the workdir's descriptor, flocked

    def __enter__(self) -> WorkdirLock:
        if not self.enabled:
            return self
        try:
            self.folder = _flock_folder(self.path.parent)
            handle = self._flock_file()
        except _Busy:
            self.__exit__()
            raise ValueError(f"workdir {self.path.parent} is in use by another training run ({self._holder()}); "
                             "wait for it to finish, stop it, or train in another --workdir") from None
        except BaseException:
            self.__exit__()
            raise
        self.handle = handle
        previous = handle.read().strip()
        if previous:
            print(f"warning: taking over the lock left by a run that is gone ({_describe(previous)})", file=sys.stderr,
                  flush=True)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}))
        handle.flush()
        os.fsync(handle.fileno())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.seek(0)
            self.handle.truncate()  # an empty file: nobody holds it
            self.handle.flush()
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None
        if self.folder is not None:
            os.close(self.folder)  # releases its flock
            self.folder = None

    def _flock_file(self) -> IO[Any]:
        """run.lock, opened (created 0600 if missing) and flocked: raises _Busy if a live run holds it,
        ValueError if it is anything but a regular file with one link."""
        for _ in range(_ATTEMPTS):
            try:  # O_NONBLOCK: a FIFO planted there opens at once (and is refused) instead of hanging
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.EISDIR):
                    raise
                raise self._not_a_lock_file("a symbolic link" if err.errno == errno.ELOOP else "a folder") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise self._not_a_lock_file("not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _Busy from None
            if not same_file(fd, self.path):  # removed or replaced since we opened it: a lock on it guards nothing
                os.close(fd)
                continue
            if os.fstat(fd).st_nlink != 1:  # a hard link to some other file: writing it would change that one
                os.close(fd)
                raise self._not_a_lock_file("a hard link to another file")
            return os.fdopen(fd, "r+")
        raise ValueError(f"{self.path} was removed or replaced {_ATTEMPTS} times while this run was taking it: "
                         "something else is changing the workdir; stop it and start again")

    def _not_a_lock_file(self, what: str) -> ValueError:
        return ValueError(f"{self.path} is {what}, not the regular file a training run makes there; "
                          f"remove it (rm {self.path}) and start again")

    def _holder(self) -> str:
        try:
            with open_regular(self.path, "r") as f:
                return _describe(f.read())
        except (OSError, ValueError):
            return "holder unknown"


def _flock_folder(folder: Path) -> int | None:
    """The workdir's descriptor, flocked (raises _Busy if a live run holds it); None where the file
    system has no flock on folders."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _Busy from None
    except OSError:
        os.close(fd)
        return None
    return fd


def _describe(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"host {holder['host']}, pid {holder['pid']}, started {holder['started']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return "holder unknown"
