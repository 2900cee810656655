"""`run.profile_steps=A:B`: a jax.profiler trace of global steps A to B in WORKDIR/profile/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax


def parse_profile_steps(text: str, total_steps: int) -> tuple[int, int]:
    """'20:25' -> (20, 25); a ValueError naming the key otherwise."""
    first, sep, last = str(text).partition(":")
    try:
        start, stop = int(first), int(last)
    except ValueError:
        start = stop = 0
    if not sep or not 1 <= start <= stop:
        raise ValueError(f"config key 'run.profile_steps' is {text!r}; write FIRST:LAST global steps, e.g. 20:25")
    if stop > total_steps:
        raise ValueError(f"config key 'run.profile_steps' ends at step {stop}, after run.steps={total_steps}")
    return start, stop


class ProfileWindow:
    """Starts the trace before step `start` runs and stops it once step `stop` has finished."""

    def __init__(self, spec: str | None, total_steps: int, directory: Path):
        self.window = parse_profile_steps(spec, total_steps) if spec else None
        self.directory = directory
        self.active = False

    def before(self, step: int) -> None:
        """`step`: the global step about to run (1-based)."""
        if self.window and step == self.window[0]:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self.active = True

    def after(self, step: int, state: Any) -> None:
        if self.active and step == self.window[1]:
            self.stop(state)

    def __enter__(self) -> ProfileWindow:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # a run that stops inside the window still closes its trace

    def stop(self, state: Any = None) -> None:
        if self.active:
            if state is not None:
                jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.active = False
