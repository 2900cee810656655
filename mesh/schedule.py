"""The circular pipeline schedule's counts and checks, in plain arithmetic (no JAX): what
`triskele.mesh.pipeline` runs, the loop logs and the performance model prices. Re-exported by
`triskele.mesh.pipeline`, where the schedule itself lives (its notes say how it works)."""

from __future__ import annotations


def schedule_iterations(stages: int, repeats: int, microbatches: int) -> int:
    """Iterations of the circular pipeline schedule: v * M microbatch passes plus P - 1 to fill it."""
    return repeats * microbatches + stages - 1


def bubble_fraction(stages: int, repeats: int, microbatches: int) -> float:
    """Idle share of the circular pipeline schedule: (P - 1) / (v * M + P - 1)."""
    return (stages - 1) / schedule_iterations(stages, repeats, microbatches)


def check_schedule(layers: int, stages: int, repeats: int, microbatches: int, batch: int | None = None) -> None:
    """Raises a ValueError naming the option to change when the schedule cannot run."""
    if layers % (stages * repeats):
        raise ValueError(
            f"model depth {layers} is not divisible by pipeline stages x pipeline.repeats = {stages} x {repeats}; "
            f"use pipeline.repeats in {[r for r in range(1, layers + 1) if layers % (stages * r) == 0]}"
        )
    if microbatches < stages:
        raise ValueError(
            f"pipeline.microbatches={microbatches} is fewer than the {stages} pipeline stages; use at least {stages}"
        )
    if batch is not None and batch % microbatches:
        raise ValueError(f"batch {batch} is not divisible by pipeline.microbatches={microbatches}")
