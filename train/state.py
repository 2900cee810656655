"""Training state created directly with its shardings: nothing is ever whole on one device."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from triskele.mesh import tree_shardings


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    step: jax.Array
    params: dict[str, Any]
    opt_state: Any


def abstract_model(build: Callable[[], nnx.Module]) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and its abstract parameter state, without allocating anything."""
    graphdef, params, rest = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise ValueError("models must hold only nnx.Param state (no batch statistics or RNG state)")
    return graphdef, params


def state_shardings(params: nnx.State, tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
    """Shardings of the state: parameters by the rules, optimizer moments like their parameters."""
    param_shardings = tree_shardings(params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_params = nnx.to_pure_dict(params)
    opt_state = jax.eval_shape(tx.init, abstract_params)
    opt_shardings = optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        opt_state,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    return TrainState(step=replicated, params=param_shardings, opt_state=opt_shardings)


def fresh_state(build: Callable[[], nnx.Module], tx: optax.GradientTransformation) -> TrainState:
    params = nnx.to_pure_dict(nnx.state(build(), nnx.Param))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def init_state(
    build: Callable[[], nnx.Module], tx: optax.GradientTransformation, shardings: TrainState
) -> TrainState:
    """Initializes parameters and optimizer state inside one jit whose outputs are already sharded."""
    return jax.jit(lambda: fresh_state(build, tx), out_shardings=shardings)()


def abstract_state(
    build: Callable[[], nnx.Module], tx: optax.GradientTransformation, shardings: TrainState
) -> TrainState:
    """ShapeDtypeStructs carrying the target shardings (what a checkpoint restores into)."""
    shapes = jax.eval_shape(lambda: fresh_state(build, tx))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
