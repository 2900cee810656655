"""Shared by the benchmark scripts: interleaved timing, tables, JSON, and the engine's step built
for a preset (the scripts are run from the repository root: `python bench/<name>.py`)."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

MESHES = ("data=8", "fsdp=8", "tensor=8", "data=2,fsdp=2,tensor=2", "pipeline=4,data=2")
"""The meshes the compiled-program benches compare (8 simulated CPU devices)."""
MESH_DEFAULTS = ("data.global_batch=32",)


def mesh_bench_main(doc: str, argv: list[str] | None, measure, columns: list[str], title: str,
                    notes: str = "") -> int:
    """The command line of a bench that measures a preset on each of several meshes:
    `measure(preset, overrides, spec) -> rows` (a list of dicts), printed as a table and saved."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mars-l16")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mesh", action="append", help=f"mesh spec (default: {', '.join(MESHES)})")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    overrides = [*MESH_DEFAULTS, *args.set]
    rows = [row for spec in (args.mesh or MESHES) for row in measure(args.preset, overrides, spec)]
    print(f"{args.preset} ({', '.join(overrides)}): {title}")
    print_table(rows, columns)
    if notes:
        print(notes)
    write_json(args.json, {"preset": args.preset, "overrides": overrides, "machine": machine(), "rows": rows})
    return 0


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
        from triskele.train.bookkeeping.files import write_atomically

        write_atomically(Path(path), (json.dumps(payload, indent=2, default=float) + "\n").encode())
        print(f"wrote {path}")


def block(tree: Any) -> None:
    jax.block_until_ready(tree)


def random_images(batch: int, size: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, size, size, channels), dtype=np.float32)
