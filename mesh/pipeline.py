"""A circular (looped) pipeline schedule over the `pipeline` mesh axis.

Layers are arranged as (repeats v, stages P, layers per stage L); each of M microbatches goes
around the ring of P stages v times. All stages run at once under `vmap` over a stage axis that
is sharded over `pipeline`; moving activations to the next stage is a roll of that axis, which
XLA lowers to a collective-permute. Gradients come from autodiff through the schedule. A stage
reads its own layers only, so no device ever gathers the whole stack of weights.

Iteration t: stage p works on microbatch (t - p) mod M in repeat (t - p) // M, when
0 <= t - p < v*M; the other slots are the bubble, (P - 1) / (v*M + P - 1) of the work.
The last stage's output of microbatch m loops back to stage 0 for the next repeat through a
buffer of M slots, which needs M >= P.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from triskele.mesh.logical import UNCONSTRAINED, constrain


def bubble_fraction(stages: int, repeats: int, microbatches: int) -> float:
    return (stages - 1) / (repeats * microbatches + stages - 1)


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


def circular_pipeline(
    stage_fn: Callable[[Any, jax.Array], jax.Array],
    layer_params: Any,
    x: jax.Array,
    stages: int,
    microbatches: int,
    remat: bool = False,
) -> jax.Array:
    """Applies all layers to x (batch first) through the circular schedule.

    `layer_params`: a tree whose leaves lead with (repeats, stages * L), layers in order, the
    second axis sharded over `pipeline` (so that the split into stages moves no weights);
    `stage_fn(params, h)`: applies one stage's L layers (leaves leading with L) to h.
    """
    repeats, per_repeat = jax.tree.leaves(layer_params)[0].shape[:2]
    check_schedule(repeats * per_repeat, stages, repeats, microbatches, x.shape[0])
    per_stage = per_repeat // stages
    weights = jax.tree.map(
        lambda w: constrain(w.reshape(repeats, stages, per_stage, *w.shape[2:]),
                            "repeats", "stage", *([UNCONSTRAINED] * (w.ndim - 1))), layer_params)
    rest = x.shape[1:]
    trailing = [None] * len(rest)
    # Microbatch j takes rows j, j+M, ...: every device's rows spread over the microbatches.
    inputs = x.reshape(x.shape[0] // microbatches, microbatches, *rest).swapaxes(0, 1)
    inputs = constrain(inputs, "microbatch", "batch", *trailing)
    if remat:
        stage_fn = jax.checkpoint(stage_fn)
    # spmd_axis_name: sharding constraints inside a stage keep the stage axis on `pipeline`.
    run_stages = jax.vmap(stage_fn, in_axes=(0, 0), spmd_axis_name="pipeline")
    stage_ids = jnp.arange(stages)

    def iteration(carry, t):
        state, loop, outputs = carry
        first = jnp.where(t < microbatches, inputs[t % microbatches], loop[t % microbatches])
        state = constrain(state.at[0].set(first), "stage", "batch", *trailing)
        repeat = jnp.clip((t - stage_ids) // microbatches, 0, repeats - 1)
        stage_weights = jax.vmap(lambda w, r: jax.tree.map(lambda a: a[r], w), in_axes=(1, 0),
                                 spmd_axis_name="pipeline")(weights, repeat)
        out = constrain(run_stages(stage_weights, state), "stage", "batch", *trailing)
        k = t - (stages - 1)
        m, r = k % microbatches, k // microbatches
        done = out[stages - 1]
        valid = (k >= 0) & (k < repeats * microbatches)
        loop = jnp.where(valid & (r < repeats - 1), loop.at[m].set(done), loop)
        outputs = jnp.where(valid & (r == repeats - 1), outputs.at[m].set(done), outputs)
        state = jnp.roll(out, 1, axis=0)  # stage p's output feeds stage p + 1: a collective-permute
        return (state, loop, outputs), None

    mb_shape = (inputs.shape[1], *rest)
    state = constrain(jnp.zeros((stages, *mb_shape), x.dtype), "stage", "batch", *trailing)
    buffers = jnp.zeros((microbatches, *mb_shape), x.dtype)
    total = repeats * microbatches + stages - 1
    (_, _, outputs), _ = jax.lax.scan(iteration, (state, buffers, buffers), jnp.arange(total))
    return outputs.swapaxes(0, 1).reshape(x.shape)
