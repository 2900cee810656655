"""What a run writes as it goes: metrics.jsonl and TensorBoard (process 0), and the step metrics
kept on the device between the steps that fetch them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jax
from tensorboardX import SummaryWriter


class RunLog:
    """metrics.jsonl, TensorBoard and stdout, written by process 0 only."""

    def __init__(self, workdir: Path):
        self.enabled = jax.process_index() == 0
        self.path = workdir / "metrics.jsonl"
        self.writer = SummaryWriter(str(workdir / "tensorboard")) if self.enabled else None

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
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


def first_nonfinite(records: list[tuple[int, dict[str, float]]]) -> tuple[int, dict[str, float]] | None:
    for step, metrics in records:
        if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
            return step, metrics
    return None
