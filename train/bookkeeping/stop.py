"""Ctrl-C and SIGTERM as a request to stop: a long job (training, predict, prepare, evaluation)
finishes the piece of work in hand, keeps what it wrote and says how to resume; a second Ctrl-C
leaves at once, without a traceback, and what was completely written before stays usable (every
file the jobs write is written atomically: a checkpoint being written is left as Orbax's
temporary folder, which restores ignore)."""

from __future__ import annotations

import os
import signal
import sys
import threading

INTERRUPTED_EXIT = 130
"""The shell's status for a job stopped by Ctrl-C (128 + SIGINT)."""


class StopRequest:
    """While entered (in the main thread), the first SIGINT (and SIGTERM, with `sigterm`) sets
    `signal` to the signal's name and prints one line saying what `job` does now; a second SIGINT
    exits the process at once with status 130.

    `forward_sigint_as_sigterm`: in a multi-process run JAX's preemption service owns SIGTERM and
    makes every process agree on the step to stop at; Ctrl-C is handed to it as a SIGTERM to
    this process, so that one interrupted process stops them all at the same step."""

    def __init__(self, job: str, finishing: str, sigterm: bool = True, forward_sigint_as_sigterm: bool = False):
        self.job, self.finishing = job, finishing
        self.signal: str | None = None
        self._sigterm, self._forward = sigterm, forward_sigint_as_sigterm
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            handled = [signal.SIGINT] + ([signal.SIGTERM] if self._sigterm else [])
            self._previous = {number: signal.signal(number, self._handle) for number in handled}
        return self

    def _handle(self, number: int, frame) -> None:
        if self.signal is not None and number == signal.SIGINT:
            sys.stderr.write(f"\n{self.job}: second Ctrl-C, stopped at once; what was written before stays usable\n")
            sys.stderr.flush()
            os._exit(INTERRUPTED_EXIT)
        if self.signal is not None:
            return
        self.signal = signal.Signals(number).name
        what = "Ctrl-C" if number == signal.SIGINT else self.signal
        again = "; Ctrl-C again stops at once" if number == signal.SIGINT else ""
        sys.stderr.write(f"\n{self.job}: {what}: {self.finishing}{again}\n")
        sys.stderr.flush()
        if number == signal.SIGINT and self._forward:
            os.kill(os.getpid(), signal.SIGTERM)

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def raise_if_requested(self) -> None:
        """For a job that stops by unwinding (evaluation): KeyboardInterrupt, raised here, at a point
        the job chose, once a stop was requested. (Python's own KeyboardInterrupt is raised wherever
        the main thread happens to be, and a library's callback there may swallow it.)"""
        if self.requested:
            raise KeyboardInterrupt

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C (exit status 130), not by SIGTERM."""
        return self.signal == "SIGINT"
