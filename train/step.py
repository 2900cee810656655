"""The jitted, sharded train and eval steps. XLA inserts every collective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from triskele.mesh import batch_sharding, constrain
from triskele.train.state import TrainState

Batch = dict[str, jax.Array]


def _loss_terms(graphdef: nnx.GraphDef, params: dict, batch: Batch) -> tuple[jax.Array, jax.Array]:
    return nnx.merge(graphdef, params).loss_terms(batch)


_value_and_grad = jax.value_and_grad(_loss_terms, argnums=1, has_aux=True)


def _microbatches(batch: Batch, count: int) -> Batch:
    """(B, ...) -> (count, B/count, ...); microbatch j takes rows j, j+count, ... so that every
    device's rows spread evenly over microbatches and no data moves between devices."""

    def split(x: jax.Array) -> jax.Array:
        x = x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1)
        return constrain(x, "microbatch", "batch", *([None] * (x.ndim - 2)))

    return jax.tree.map(split, batch)


def _accumulated(graphdef: nnx.GraphDef, params: dict, batch: Batch, grad_accum: int):
    """(sum of losses, sum of weights, gradient of the sum) of `batch`, one microbatch at a time."""

    def body(carry, micro):
        total, weight, grads = carry
        (t, w), g = _value_and_grad(graphdef, params, micro)
        return (total + t, weight + w, jax.tree.map(jnp.add, grads, g)), None

    zeros = (jnp.zeros(()), jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
    (total, weight, grads), _ = jax.lax.scan(body, zeros, _microbatches(batch, grad_accum))
    return total, weight, grads


def summed_gradients(graphdef: nnx.GraphDef, params: dict, batch: Batch, grad_accum: int):
    """(sum of losses, sum of weights, gradient of the sum), over `grad_accum` sequential microbatches.

    Sums, not means, so that k microbatches give exactly the update of one batch of the same rows.
    With accumulation on a mesh whose `data` axis is > 1, each `data` shard accumulates its own
    rows' gradients (a `shard_map` manual over `data` only; fsdp, tensor and pipeline stay with
    XLA, so fsdp's gradient reduction still runs per microbatch) and one psum over `data` follows
    the loop: one data-parallel all-reduce per step, not one per microbatch (big_vision's
    accumulate_gradient). A shard's rows j, j+k, ... are the rows of global microbatch j, since
    every shard holds a multiple of k rows: the microbatches are the same as without the shard_map.
    """
    if grad_accum == 1:
        (total, weight), grads = _value_and_grad(graphdef, params, batch)
        return total, weight, grads
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get("data", 1) == 1:
        return _accumulated(graphdef, params, batch, grad_accum)

    def per_shard(params: dict, batch: Batch):
        return jax.lax.psum(_accumulated(graphdef, params, batch, grad_accum), "data")

    # check_vma=False: the gradient of the replicated parameters stays this shard's own (with the
    # check, their implicit broadcast over `data` transposes to a psum inside the loop).
    return jax.shard_map(per_shard, in_specs=(PartitionSpec(), PartitionSpec("data")), out_specs=PartitionSpec(),
                         axis_names={"data"}, check_vma=False)(params, batch)


def _schedule_count(opt_state: Any) -> jax.Array:
    """The count the optimizer's learning-rate schedule is at: the updates applied so far, which a
    skipped step (`run.on_nonfinite=skip`) does not advance, unlike the state's step counter."""
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByScheduleState))
              if isinstance(s, optax.ScaleByScheduleState)]
    if len(states) != 1:
        raise ValueError(f"the optimizer holds {len(states)} learning-rate schedule states (optax.scale_by_schedule); "
                         "the train step logs the lr of exactly one: build it with triskele.train.optim.make_optimizer")
    return states[0].count


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum: int,
    shardings: TrainState,
    batch_shardings: dict[str, NamedSharding],
    mesh: Mesh,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """`train_step(state, batch) -> (state, metrics)`, state donated; metrics: loss, grad_norm, lr
    (the rate this step's update uses: the schedule at the optimizer's own count).

    `skip_nonfinite`: a step whose loss or gradient is not finite keeps the parameters and the
    optimizer state as they were (decided on the device, no host round trip) and reports
    `skipped` = 1; the step counter still advances, so the data order is unchanged."""

    def train_step(state: TrainState, batch: Batch):
        total, weight, grads = summed_gradients(graphdef, state.params, batch, grad_accum)
        weight = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g / weight, grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": total / weight,
            "grad_norm": optax.tree.norm(grads),
            "lr": jnp.asarray(schedule(_schedule_count(state.opt_state)), jnp.float32),
        }
        if skip_nonfinite:
            finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
            params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), (params, opt_state),
                                             (state.params, state.opt_state))
            metrics["skipped"] = 1.0 - finite.astype(jnp.float32)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(
        train_step,
        in_shardings=(shardings, batch_shardings),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )


def make_eval_step(graphdef: nnx.GraphDef, mesh: Mesh) -> Callable[[dict, Batch], tuple[dict, dict]]:
    """`eval_step(params, batch) -> (sums, per_record)`: loss_sum, weight and the model's summable
    statistics; the model's per-record values (scores, labels, ids) with the batch's `valid` mask."""

    def eval_step(params: dict, batch: Batch) -> tuple[dict, dict]:
        model = nnx.merge(graphdef, params)
        total, weight = model.loss_terms(batch)
        sums, per_record = model.eval_stats(batch)
        return {"loss_sum": total, "weight": weight, **sums}, {**per_record, "valid": batch["valid"]}

    return jax.jit(eval_step, out_shardings=NamedSharding(mesh, PartitionSpec()))


def batch_shardings_of(batch: dict[str, Any], mesh: Mesh, global_batch: int) -> dict[str, NamedSharding]:
    return {key: batch_sharding(mesh, value.ndim, global_batch) for key, value in batch.items()}
