"""The subprocess training runs of the fault and interrupt tests: mars-tiny at 32 px on one CPU
device, checkpoints every 4 steps, and how to watch them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainutil import SMALL

STEPS = 80
CHAIN = {**SMALL, "checkpoint.every": 4, "checkpoint.keep": 2, "data.train_size": 256}


def command(workdir: Path, steps: int = STEPS, **extra) -> list[str]:
    flags = {**CHAIN, **extra}
    return [sys.executable, "-m", "triskele.train", "--workdir", str(workdir), "--steps", str(steps), "--no-progress",
            *[arg for key, value in flags.items() for arg in ("--set", f"{key}={value}")]]


def child_env() -> dict[str, str]:
    """One CPU device, like the in-process reference on mesh_of('single')."""
    return {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu"}


def logged_steps(workdir: Path) -> list[int]:
    path = workdir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return steps


def wait_for(predicate, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the run exited with {process.returncode}: {process.communicate()[0][-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the run made no progress in time")
        time.sleep(0.002)
