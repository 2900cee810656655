"""The pipeline schedules' counts and checks, in plain arithmetic (no JAX): what
`triskele.mesh.pipeline` (circular) and `triskele.mesh.pipeline_1f1b` (1f1b) run, the loop logs and
the performance model prices. Re-exported by `triskele.mesh.pipeline`; the schedules' notes say how
each works."""

from __future__ import annotations

SCHEDULES = ("circular", "1f1b")
"""`pipeline.schedule`: circular (every microbatch's activations kept until the backward) or 1f1b
(one forward and one backward per stage and iteration; only stage inputs in flight are kept)."""
BACKWARD_FORWARDS = 2
"""A stage's backward costs about two of its forwards (two matmuls per forward matmul): the weight
the 1f1b bubble gives the backward loop's iterations (a forward, plus a backward that recomputes
the forward: 1 + 1 + 2)."""


def schedule_iterations(stages: int, repeats: int, microbatches: int, schedule: str = "circular") -> int:
    """Iterations of one pipelined step. circular: v * M microbatch passes plus P - 1 to fill it
    (the backward is autodiff's reverse of the same loop). 1f1b: a forward loop of the same
    v * M + P - 1 and a backward loop of v * M + v * P + P - 2 (a microbatch's backward reaches the
    first stage 2 (v P - 1) iterations after its forward left it)."""
    forward = repeats * microbatches + stages - 1
    if schedule == "circular":
        return forward
    return forward + repeats * microbatches + repeats * stages + stages - 2


def ring_slots(stages: int, repeats: int, microbatches: int) -> int:
    """Stage inputs a 1f1b stage holds at once: its first virtual stage's wait of 2 (v P - 1)
    iterations plus the one arriving, or every microbatch pass if there are fewer."""
    return min(2 * repeats * stages - 1, repeats * microbatches)


def bubble_fraction(stages: int, repeats: int, microbatches: int, schedule: str = "circular") -> float:
    """Idle share of a stage's schedule. circular: (P - 1) / (v * M + P - 1). 1f1b: the idle
    iterations of both loops over all, a backward-loop iteration weighted as 1 + 1 + BACKWARD_FORWARDS
    forwards: ((P - 1) + 4 (v P + P - 2)) / ((v M + P - 1) + 4 (v M + v P + P - 2))."""
    forward = schedule_iterations(stages, repeats, microbatches)
    if schedule == "circular":
        return (stages - 1) / forward
    weight = 2 + BACKWARD_FORWARDS
    backward = schedule_iterations(stages, repeats, microbatches, schedule) - forward
    idle = (stages - 1) + weight * (backward - repeats * microbatches)
    return idle / (forward + weight * backward)


def check_schedule(layers: int, stages: int, repeats: int, microbatches: int, batch: int | None = None,
                   schedule: str = "circular") -> None:
    """Raises a ValueError naming the option to change when the schedule cannot run."""
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline.schedule={schedule!r} is not a pipeline schedule; use one of "
                         f"{', '.join(SCHEDULES)}")
    if layers % (stages * repeats):
        raise ValueError(
            f"model depth {layers} is not divisible by pipeline stages x pipeline.repeats = {stages} x {repeats}; "
            f"use pipeline.repeats in {[r for r in range(1, layers + 1) if layers % (stages * r) == 0]}"
        )
    if microbatches < stages:
        raise ValueError(
            f"pipeline.microbatches={microbatches} is fewer than the {stages} pipeline stages; use at least {stages}"
        )
    if schedule == "1f1b" and repeats > 1 and microbatches % stages:
        raise ValueError(
            f"pipeline.schedule=1f1b with pipeline.repeats={repeats} sends microbatches round the {stages} stages "
            f"in groups of {stages}: pipeline.microbatches={microbatches} must be a multiple of {stages}; use "
            f"pipeline.microbatches={(microbatches // stages + 1) * stages}, pipeline.repeats=1 or "
            "pipeline.schedule=circular"
        )
    if batch is not None and batch % microbatches:
        raise ValueError(f"batch {batch} is not divisible by pipeline.microbatches={microbatches}")
