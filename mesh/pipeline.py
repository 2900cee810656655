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

Communication is one collective-permute per iteration (the rotation, a `ppermute` over the
`pipeline` axis) and one broadcast of the finished outputs at the end: the loop-back and output
buffers have a slot per stage, so the values the rotation brings to stage 0 are stored where
they arrived instead of being broadcast to every stage each iteration.

With FSDP, a stage's weights are sharded over `fsdp` too. By default (`gather_once`) they are
all-gathered over `fsdp` once per step, before the loop, and stay whole (still split over
`pipeline` and `tensor`) for all its iterations; otherwise XLA gathers each layer's weights inside
the loop, forward and backward, in every one of the v*M + P - 1 iterations. Gathering once costs
memory: the stage's weights and their gradients whole over `fsdp` for the step (MaxText's
`pipeline_fsdp_ag_once`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec
from triskele.mesh.logical import LOGICAL_RULES, UNCONSTRAINED, MeshAxes, constrain, logical_to_mesh

# The schedule's counts and checks live in triskele.mesh.schedule (no JAX); they are re-exported here.
from triskele.mesh.schedule import bubble_fraction as bubble_fraction
from triskele.mesh.schedule import check_schedule, schedule_iterations


def rotate_stages(x: jax.Array, shift: int = 1) -> jax.Array:
    """Moves stage p's slot (axis 0) to stage p + shift (mod the stages): one collective-permute
    over `pipeline` when axis 0 is sharded over it (under the context mesh), else a roll. The
    forward sends to the next stage (1), a backward to the previous one (-1)."""
    stages = x.shape[0]
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("pipeline", 1) != stages:
        return jnp.roll(x, shift, axis=0)
    spec = PartitionSpec("pipeline")
    permutation = [(p, (p + shift) % stages) for p in range(stages)]
    move = lambda a: jax.lax.ppermute(a, "pipeline", permutation)
    return jax.shard_map(move, in_specs=spec, out_specs=spec, axis_names={"pipeline"})(x)


def _without_fsdp(axes: MeshAxes) -> MeshAxes:
    kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a != "fsdp")
    return kept[0] if len(kept) == 1 else kept or None


RULES_WITHOUT_FSDP = tuple((name, _without_fsdp(axes)) for name, axes in LOGICAL_RULES)
"""The rule table with `fsdp` taken out: a parameter's sharding after an all-gather over fsdp."""


def weight_names(layer_params: Any) -> list[tuple[str | None, ...]]:
    """The logical axis names of each leaf of a tree of NNX variables, in `jax.tree.leaves` order."""
    variables = jax.tree.leaves(layer_params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    names = [v.get_metadata("out_sharding", None) if isinstance(v, nnx.Variable) else None for v in variables]
    if any(n is None for n in names):
        raise ValueError("pipeline.gather_once needs the stage weights as NNX variables with logical axis names "
                         "(created with triskele.mesh.partitioned); pass the blocks' nnx.State")
    return [tuple(n) for n in names]


def gathered_over_fsdp(weights: Any, names: list[tuple[str | None, ...]]) -> Any:
    """`weights` (leaves (repeats, stages, L, ...)) constrained to their sharding without `fsdp`:
    under a mesh with fsdp > 1, one all-gather per leaf where this runs. `names`: each leaf's
    logical names as a parameter (the trailing ones name the dimensions after the layer axes)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("fsdp", 1) == 1:
        return weights
    leaves, treedef = jax.tree.flatten(weights)

    def gather(w: jax.Array, leaf_names: tuple[str | None, ...]) -> jax.Array:
        trailing = leaf_names[len(leaf_names) - (w.ndim - 3):] if w.ndim > 3 else ()
        spec = logical_to_mesh(("repeats", "stage", None, *trailing), w.shape, mesh, RULES_WITHOUT_FSDP)
        return jax.lax.with_sharding_constraint(w, spec)

    return jax.tree.unflatten(treedef, [gather(w, n) for w, n in zip(leaves, names, strict=True)])


def staged_weights(layer_params: Any, stages: int, gather_once: bool) -> Any:
    """`layer_params` (leaves (repeats, stages * L, ...)) viewed as (repeats, stages, L, ...), the
    stage axis on `pipeline`; with `gather_once`, gathered over `fsdp` (see the module doc)."""
    repeats, per_repeat = jax.tree.leaves(layer_params)[0].shape[:2]
    per_stage = per_repeat // stages
    weights = jax.tree.map(
        lambda w: constrain(w.reshape(repeats, stages, per_stage, *w.shape[2:]),
                            "repeats", "stage", *([UNCONSTRAINED] * (w.ndim - 1))), layer_params)
    return gathered_over_fsdp(weights, weight_names(layer_params)) if gather_once else weights


def weights_at(weights: Any, repeat: jax.Array | None) -> Any:
    """Each stage's layers (leaves (stages, L, ...)) of the repeat it works on: `repeat` (stages,),
    or None with a single repeat (no per-iteration gather: weight gradients accumulate locally)."""
    if repeat is None:
        return jax.tree.map(lambda a: a[0], weights)
    return jax.vmap(lambda w, r: jax.tree.map(lambda a: a[r], w), in_axes=(1, 0),
                    spmd_axis_name="pipeline")(weights, repeat)


def split_microbatches(x: jax.Array, microbatches: int) -> jax.Array:
    """(B, ...) -> (M, B / M, ...): microbatch j takes rows j, j + M, ..., so that every device's
    rows spread over the microbatches and no data moves between devices."""
    return x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)


def joined_microbatches(x: jax.Array) -> jax.Array:
    """The inverse of `split_microbatches`."""
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def circular_pipeline(
    stage_fn: Callable[[Any, jax.Array], jax.Array],
    layer_params: Any,
    x: jax.Array,
    stages: int,
    microbatches: int,
    gather_once: bool = False,
) -> jax.Array:
    """Applies all layers to x (batch first) through the circular schedule.

    `layer_params`: a tree whose leaves lead with (repeats, stages * L), layers in order, the
    second axis sharded over `pipeline` (so that the split into stages moves no weights);
    `stage_fn(params, h)`: applies one stage's L layers (leaves leading with L) to h.
    `gather_once`: gather the weights over `fsdp` once, before the loop (see the module doc); the
    leaves of `layer_params` must then be NNX variables carrying their logical axis names.
    """
    repeats, per_repeat = jax.tree.leaves(layer_params)[0].shape[:2]
    check_schedule(repeats * per_repeat, stages, repeats, microbatches, x.shape[0])
    weights = staged_weights(layer_params, stages, gather_once)
    rest = x.shape[1:]
    trailing = [None] * len(rest)
    inputs = split_microbatches(x, microbatches)
    # spmd_axis_name: sharding constraints inside a stage keep the stage axis on `pipeline`.
    run_stages = jax.vmap(stage_fn, in_axes=(0, 0), spmd_axis_name="pipeline")
    stage_ids = jnp.arange(stages)
    first_stage = (stage_ids == 0).reshape(stages, 1, *([1] * len(rest)))
    per_stage_buffer = lambda a: constrain(a, "stage", "microbatch", "batch", *trailing)
    # A copy of the inputs per stage: selecting stage 0's input each iteration is then local, and
    # the backward sums the stages' input gradients once, after the loop.
    inputs = per_stage_buffer(jnp.broadcast_to(inputs, (stages, *inputs.shape)))

    def iteration(carry, t):
        state, loop, outputs = carry
        slot = t % microbatches
        fresh = jnp.where(t < microbatches, inputs[:, slot], loop[:, slot])
        state = constrain(jnp.where(first_stage, fresh, state), "stage", "batch", *trailing)
        repeat = jnp.clip((t - stage_ids) // microbatches, 0, repeats - 1) if repeats > 1 else None
        stage_weights = weights_at(weights, repeat)
        out = constrain(run_stages(stage_weights, state), "stage", "batch", *trailing)
        state = rotate_stages(out)  # stage p's output feeds stage p + 1; the last stage's reaches stage 0
        k = t - (stages - 1)
        m, r = k % microbatches, k // microbatches
        valid = (k >= 0) & (k < repeats * microbatches)
        loop = per_stage_buffer(jnp.where(valid & (r < repeats - 1), loop.at[:, m].set(state), loop))
        outputs = per_stage_buffer(jnp.where(valid & (r == repeats - 1), outputs.at[:, m].set(state), outputs))
        return (state, loop, outputs), None

    mb_shape = (x.shape[0] // microbatches, *rest)
    state = constrain(jnp.zeros((stages, *mb_shape), x.dtype), "stage", "batch", *trailing)
    buffers = per_stage_buffer(jnp.zeros((stages, microbatches, *mb_shape), x.dtype))
    total = schedule_iterations(stages, repeats, microbatches)
    (_, _, outputs), _ = jax.lax.scan(iteration, (state, buffers, buffers), jnp.arange(total))
    return joined_microbatches(outputs[0])  # stage 0's buffer holds the finished microbatches
