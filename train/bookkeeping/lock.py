"""One live training run per workdir: WORKDIR/run.lock, held (flock) for the run's whole life.

The lock file records who holds it (host, pid, start time). The operating system releases the
flock when the holder exits, however it exits, so a lock left by a killed run is free: the next
run takes it over with a warning naming the run that left it. A second live run fails at once
with a ValueError naming the holder. Process 0 of a multi-host job holds it for the job.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path


class WorkdirLock:
    def __init__(self, workdir: Path, enabled: bool = True):
        self.path = Path(workdir) / "run.lock"
        self.enabled = enabled
        self.handle = None

    def __enter__(self) -> WorkdirLock:
        if not self.enabled:
            return self
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _describe(handle.read())
            handle.close()
            raise ValueError(f"workdir {self.path.parent} is in use by another training run ({holder}); wait for it "
                             f"to finish, stop it, or train in another --workdir") from None
        handle.seek(0)
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
        self.handle = handle
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.seek(0)
            self.handle.truncate()  # an empty file: nobody holds it
            self.handle.flush()
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def _describe(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"host {holder['host']}, pid {holder['pid']}, started {holder['started']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return "holder unknown"
