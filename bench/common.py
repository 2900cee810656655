"""Shared by the benchmark scripts: interleaved timing, tables, JSON, and the engine's step built
for a preset (the scripts are run from the repository root: `python bench/<name>.py`)."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np


def interleaved_seconds(runners: dict[str, Callable[[int], None]], steps: int, repeats: int,
                        warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per step of each runner, `repeats` rounds of `steps` steps, the runners taking turns
    within each round so that machine load drifts hit all of them alike. `runner(k)` runs k steps
    and returns once their results exist (block_until_ready)."""
    for run in runners.values():
        run(warmup)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            began = time.perf_counter()
            run(steps)
            times[name].append((time.perf_counter() - began) / steps)
    return times


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def machine() -> dict[str, Any]:
    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device_kind": device.device_kind, "devices": jax.device_count(),
            "processor": platform.processor() or platform.machine(), "jax": jax.__version__}


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)

    widths = [max(len(c), *(len(cell(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(cell(row.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2, default=float) + "\n")
        print(f"wrote {path}")


def block(tree: Any) -> None:
    jax.block_until_ready(tree)


def random_images(batch: int, size: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, size, size, channels), dtype=np.float32)
