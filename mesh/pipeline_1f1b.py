"""The 1F1B pipeline schedule (interleaved when repeats > 1): activation memory bounded by the stages.

Autodiff through the circular schedule (`triskele.mesh.pipeline`) keeps what every stage saves for
its backward, for every microbatch, until the backward runs. Here the pipeline is a
`jax.custom_vjp`:

- its forward runs the schedule without autodiff and keeps only the pipeline's input (and the
  weights);
- its backward is one scan in which every stage, each iteration, runs the forward of one
  microbatch (recomputing the input of the next stage) and the backward of another: `jax.vjp` of
  the stage from its saved input (per-stage rematerialisation), the cotangents rotating to the
  previous stage as activations rotate to the next. A stage's inputs wait in a ring buffer of
  min(2 v P - 1, v M) slots between their forward and their backward: the memory is a few stage
  inputs and one stage's backward at a time, whatever M.

Why the output cotangent of the whole batch, not the loss at the last stage as Megatron-LM runs
1F1B: the backward receives what autodiff computed for the rest of the model, so every domain's
head and loss (some couple the records of a batch) work unchanged, and the model, the step and the
eval path are the same for both schedules. The price is one more forward of the layers: 3 forwards
and a backward per microbatch, against 2 and a backward for the circular schedule with full remat.

Order: Megatron-LM's interleaved schedule (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters", section 2.2) in lock step. Position k = t - p of stage p at
iteration t is group g = k // (v P), repeat r = (k mod v P) // P, microbatch m = g P + k mod P:
microbatches go round the ring in groups of P, so stage P - 1's output of repeat r reaches stage 0
in the very iteration it starts repeat r + 1 (no loop-back buffer; M a multiple of P when v > 1).
The backward of virtual stage s = r P + p of microbatch m = g P + j runs at iteration
g v P + j + 2 (v P - 1) - s: the last virtual stage in the iteration of its forward, each earlier
one the iteration after the next; every (stage, iteration) holds at most one backward.
Iterations: v M + P - 1 forward, v M + v P + P - 2 forward-and-backward
(`triskele.mesh.schedule.schedule_iterations`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from triskele.mesh.logical import constrain
from triskele.mesh.pipeline import joined_microbatches, rotate_stages, split_microbatches, staged_weights, weights_at
from triskele.mesh.schedule import check_schedule, ring_slots, schedule_iterations

StageFn = Callable[[Any, jax.Array], jax.Array]


def schedule_positions(t: jax.Array, stages: int, repeats: int, microbatches: int,
                       backward: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(repeat, microbatch, valid) of each stage's forward (in either loop) or backward (in the
    backward loop) at iteration t, each (stages,)."""
    stage = jnp.arange(stages)
    ring = repeats * stages
    if backward:
        q, j = jnp.divmod(t - (2 * ring - 2 - stage), stages)
        group = -(-q // repeats)
        repeat = group * repeats - q
    else:
        k = t - stage
        group, repeat, j = k // ring, k % ring // stages, k % stages
    microbatch = group * stages + j
    return repeat, microbatch, (group >= 0) & (microbatch < microbatches)


def _where(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per stage (axis 0): a where `mask` (stages,), else b; trees of arrays leading with stages."""
    pick = lambda x, y: jnp.where(mask.reshape(-1, *([1] * (x.ndim - 1))), x, y)
    return jax.tree.map(pick, a, b)


def _added_at(grads: Any, repeat: jax.Array | None, update: Any) -> Any:
    """grads (leaves (repeats, stages, L, ...)) with each stage's update added at its repeat."""
    if repeat is None:
        return jax.tree.map(lambda g, u: g.at[0].add(u), grads, update)
    add = lambda g, r, u: jax.tree.map(lambda a, b: a.at[r].add(b), g, u)
    return jax.vmap(add, in_axes=(1, 0, 0), out_axes=1, spmd_axis_name="pipeline")(grads, repeat, update)


class _Schedule:
    """The lock-step schedule over microbatched inputs (M, b, ...) entering stage 0 in repeat 0."""

    def __init__(self, stage_fn: StageFn, weights: Any, inputs: jax.Array):
        self.repeats, self.stages = jax.tree.leaves(weights)[0].shape[:2]
        self.microbatches = inputs.shape[0]
        self.weights, self.inputs = weights, inputs
        self.trailing = [None] * (inputs.ndim - 2)
        self.stage_fn = stage_fn
        self.run_stages = jax.vmap(stage_fn, spmd_axis_name="pipeline")

    def positions(self, t: jax.Array, backward: bool):
        return schedule_positions(t, self.stages, self.repeats, self.microbatches, backward)

    def per_stage(self, a: jax.Array) -> jax.Array:
        return constrain(a, "stage", "batch", *self.trailing)

    def per_stage_buffer(self, a: jax.Array) -> jax.Array:
        return constrain(a, "stage", "microbatch", "batch", *self.trailing)

    def zeros(self, slots: int | None = None) -> jax.Array:
        shape = self.inputs.shape[1:] if slots is None else (slots, *self.inputs.shape[1:])
        zeros = jnp.zeros((self.stages, *shape), self.inputs.dtype)
        return self.per_stage(zeros) if slots is None else self.per_stage_buffer(zeros)

    def broadcast(self, microbatches: jax.Array, m: jax.Array) -> jax.Array:
        """Microbatch m of (M, b, ...) on every stage (local: the source is whole on each)."""
        one = jax.lax.dynamic_index_in_dim(microbatches, jnp.clip(m, 0, self.microbatches - 1), keepdims=False)
        return self.per_stage(jnp.broadcast_to(one, (self.stages, *one.shape)))

    def repeat_or_none(self, repeat: jax.Array) -> jax.Array | None:
        return repeat if self.repeats > 1 else None

    def forward(self, t: jax.Array, arrived: jax.Array):
        """Each stage's (input, output, repeat, microbatch, valid) at iteration t; `arrived`: the
        outputs the rotation brought from the previous stages."""
        repeat, microbatch, valid = self.positions(t, backward=False)
        entering = (jnp.arange(self.stages) == 0) & (repeat == 0)
        h = self.per_stage(_where(entering, self.broadcast(self.inputs, microbatch[0]), arrived))
        out = self.per_stage(self.run_stages(weights_at(self.weights, self.repeat_or_none(repeat)), h))
        return h, out, repeat, microbatch, valid

    def collect(self, buffer: jax.Array, stage: int, value: jax.Array, microbatch: jax.Array,
                keep: jax.Array) -> jax.Array:
        """A per-stage buffer (stages, M, b, ...) with `value` stored at stage `stage`'s microbatch
        when `keep`: every stage writes its own slot locally; only that stage's row is read."""
        m = jnp.clip(microbatch[stage], 0, self.microbatches - 1)
        return self.per_stage_buffer(jnp.where(keep[stage], buffer.at[:, m].set(value), buffer))


def _forward(stage_fn: StageFn, weights: Any, inputs: jax.Array) -> jax.Array:
    """The last virtual stage's outputs (M, b, ...) of `inputs` (M, b, ...), no autodiff."""
    s = _Schedule(stage_fn, weights, inputs)
    last = s.stages - 1

    def iteration(carry, t):
        arrived, outputs = carry
        _, out, repeat, microbatch, valid = s.forward(t, arrived)
        outputs = s.collect(outputs, last, out, microbatch, valid & (repeat == s.repeats - 1))
        return (rotate_stages(out), outputs), None

    total = schedule_iterations(s.stages, s.repeats, s.microbatches)
    (_, outputs), _ = jax.lax.scan(iteration, (s.zeros(), s.zeros(s.microbatches)), jnp.arange(total))
    return outputs[last]


def _forward_and_backward(stage_fn: StageFn, weights: Any, inputs: jax.Array, cotangents: jax.Array):
    """(weight gradients, input cotangents (M, b, ...)) of the pipeline's outputs' `cotangents`."""
    s = _Schedule(stage_fn, weights, inputs)
    slots = ring_slots(s.stages, s.repeats, s.microbatches)
    stage = jnp.arange(s.stages)
    last = s.stages - 1

    def stage_vjp(w: Any, h: jax.Array, cotangent: jax.Array):
        return jax.vjp(stage_fn, w, h)[1](cotangent)

    run_vjps = jax.vmap(stage_vjp, spmd_axis_name="pipeline")
    read_slot = jax.vmap(lambda buffer, slot: buffer[slot], spmd_axis_name="pipeline")

    def iteration(carry, t):
        arrived, returned, ring, grads, input_cotangents = carry
        h, out, _, _, valid = s.forward(t, arrived)
        ring = s.per_stage_buffer(jnp.where(valid.reshape(-1, *([1] * (ring.ndim - 1))),
                                            ring.at[:, t % slots].set(h), ring))
        # Written before read: the last virtual stage reads the input it received this iteration.
        repeat, microbatch, valid = s.positions(t, backward=True)
        virtual_stage = repeat * s.stages + stage
        forward_iteration = t - 2 * (s.repeats * s.stages - 1 - virtual_stage)
        saved = s.per_stage(read_slot(ring, forward_iteration % slots))
        leaving = (stage == last) & (repeat == s.repeats - 1)
        cotangent = s.per_stage(_where(leaving, s.broadcast(cotangents, microbatch[last]), returned))
        stage_weights = weights_at(s.weights, s.repeat_or_none(repeat))
        weight_cotangent, h_cotangent = run_vjps(stage_weights, saved, cotangent)
        h_cotangent = s.per_stage(_where(valid, h_cotangent, jnp.zeros_like(h_cotangent)))
        grads = _added_at(grads, s.repeat_or_none(repeat),
                          _where(valid, weight_cotangent, jax.tree.map(jnp.zeros_like, weight_cotangent)))
        input_cotangents = s.collect(input_cotangents, 0, h_cotangent, microbatch, valid & (repeat == 0))
        return (rotate_stages(out), rotate_stages(h_cotangent, -1), ring, grads, input_cotangents), None

    carry = (s.zeros(), s.zeros(), s.zeros(slots), jax.tree.map(jnp.zeros_like, weights), s.zeros(s.microbatches))
    total = schedule_iterations(s.stages, s.repeats, s.microbatches, "1f1b") - schedule_iterations(
        s.stages, s.repeats, s.microbatches)
    (*_, grads, input_cotangents), _ = jax.lax.scan(iteration, carry, jnp.arange(total))
    return grads, input_cotangents[0]


def _bounded_pipeline(stage_fn: StageFn, microbatches: int) -> Callable[[Any, jax.Array], jax.Array]:
    """(weights, x) -> the layers applied to x, differentiated by the 1F1B backward loop."""

    def apply(weights: Any, x: jax.Array) -> jax.Array:
        return joined_microbatches(_forward(stage_fn, weights, split_microbatches(x, microbatches)))

    def forward(weights: Any, x: jax.Array):
        return apply(weights, x), (weights, x)

    def backward(residuals, cotangent: jax.Array):
        weights, x = residuals
        grads, input_cotangents = _forward_and_backward(
            stage_fn, weights, split_microbatches(x, microbatches), split_microbatches(cotangent, microbatches))
        return grads, joined_microbatches(input_cotangents)

    pipelined = jax.custom_vjp(apply)
    pipelined.defvjp(forward, backward)
    return pipelined


def one_f_one_b_pipeline(
    stage_fn: StageFn,
    layer_params: Any,
    x: jax.Array,
    stages: int,
    microbatches: int,
    gather_once: bool = False,
) -> jax.Array:
    """Applies all layers to x (batch first) through the 1F1B schedule; the arguments are
    `triskele.mesh.pipeline.circular_pipeline`'s. The fsdp gather (`gather_once`) runs outside the
    custom backward, so autodiff reduce-scatters the gradients it returns once, after the loop."""
    repeats, per_repeat = jax.tree.leaves(layer_params)[0].shape[:2]
    check_schedule(repeats * per_repeat, stages, repeats, microbatches, x.shape[0], "1f1b")
    weights = staged_weights(layer_params, stages, gather_once)
    return _bounded_pipeline(stage_fn, microbatches)(weights, x)
