"""What a run writes as it goes: metrics.jsonl and TensorBoard (process 0), and the step metrics
kept on the device between the steps that fetch them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
from tensorboardX import SummaryWriter
from triskele.train.bookkeeping.files import open_regular, remove_partials, write_atomically
from triskele.train.bookkeeping.records import read_records


class RunLog:
    """metrics.jsonl and TensorBoard, written by process 0 only.

    `start(restored_step)` makes them agree with the state the run resumes from: records of later
    steps (written by a run that was killed before its next checkpoint) move to
    metrics.dropped.jsonl, and TensorBoard purges its events after that step, so every logged step
    appears once and curves never fold back."""

    def __init__(self, workdir: Path):
        self.enabled = jax.process_index() == 0
        self.workdir = workdir
        self.path = workdir / "metrics.jsonl"
        self.dropped = workdir / "metrics.dropped.jsonl"
        self.writer = None

    def start(self, restored_step: int) -> int:
        """Returns how many records were moved aside."""
        if not self.enabled:
            return 0
        moved = 0
        remove_partials(self.workdir)  # left by a run killed while rewriting metrics.jsonl
        if os.path.lexists(self.path):  # a link there too: open_regular refuses it
            keep, drop = [], []
            with open_regular(self.path, "r") as f:
                lines = f.read().splitlines()
            for line in lines:
                try:
                    later = int(json.loads(line)["step"]) > restored_step
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    later = True  # a line cut short by a kill
                (drop if later else keep).append(line)
            if drop:
                with open_regular(self.dropped, "a") as f:
                    f.write("".join(f"{line}\n" for line in drop))
                write_atomically(self.path, "".join(f"{line}\n" for line in keep).encode())
                moved = len(drop)
        self.writer = SummaryWriter(str(self.workdir / "tensorboard"),
                                    purge_step=restored_step + 1 if restored_step > 0 else None)
        return moved

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open_regular(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float):
                self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class PendingMetrics:
    """Step metrics left on the device until a log, evaluation or checkpoint step fetches them all
    in one transfer, so the host queues the next steps instead of waiting for each one."""

    def __init__(self):
        self.steps: list[int] = []
        self.values: list[dict[str, jax.Array]] = []

    def add(self, step: int, metrics: dict[str, jax.Array]) -> None:
        self.steps.append(step)
        self.values.append(metrics)

    def fetch(self) -> list[tuple[int, dict[str, float]]]:
        fetched = jax.device_get(self.values)
        records = [(step, {k: float(v) for k, v in m.items()}) for step, m in zip(self.steps, fetched, strict=True)]
        self.steps, self.values = [], []
        return records


class Skipped:
    """`run.on_nonfinite=skip`: counts the steps the train step skipped, and the current streak."""

    def __init__(self, limit: int):
        self.limit, self.streak, self.total, self.interval = limit, 0, 0, 0

    def update(self, records: list[tuple[int, dict[str, float]]]) -> tuple[int, dict[str, float]] | None:
        """The step at which the streak of skipped steps reached the limit, if it did."""
        for step, metrics in records:
            skipped = metrics.get("skipped", 0.0) > 0
            self.streak = self.streak + 1 if skipped else 0
            self.total += skipped
            self.interval += skipped
            if self.streak >= self.limit:
                return step, metrics
        return None

    def record(self) -> dict[str, int]:
        """For a log record: steps skipped since the last one, and in all."""
        out = {"skipped_steps": self.interval, "skipped_total": self.total}
        self.interval = 0
        return out


def first_nonfinite(records: list[tuple[int, dict[str, float]]]) -> tuple[int, dict[str, float]] | None:
    for step, metrics in records:
        if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
            return step, metrics
    return None


def evaluation_at(workdir: Path, step: int, names: tuple[str, ...]) -> dict[str, float]:
    """The values of `names` that the run's evaluation at `step` logged, {} without one."""
    record = read_records(Path(workdir) / "metrics.jsonl")[1].get(step, {})
    return {name: record[name] for name in names if name in record}
