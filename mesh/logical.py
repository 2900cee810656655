"""Logical axis names -> mesh axes: the one rule table, and helpers built on it.

Models name every dimension logically (`embed`, `mlp`, `heads`, ...). This module alone knows
which mesh axis each name goes to. Lookup is first-match: for each dimension the first rule whose
mesh axes are unused by earlier dimensions (and, given a shape and a mesh, divide the size) wins;
so one mesh axis never shards two dimensions, and an unknown name is an error instead of being
passed through as a mesh axis (Flax's own lookup does that, last-match-wins).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None

LOGICAL_RULES: tuple[tuple[str, MeshAxes], ...] = (
    # Parameters. FSDP shards `embed`; tensor parallelism (Megatron) splits heads and MLP.
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("classes", "tensor"),
    ("classes", None),
    ("layers", "pipeline"),
    ("layers", None),
    ("stage", "pipeline"),
    ("repeats", None),
    ("patch", None),
    ("embedding", None),
    # Activations. Their embed stays whole: FSDP gathers weights, not activations.
    ("batch", ("data", "fsdp")),
    ("batch", "data"),
    ("batch", None),
    ("microbatch", None),
    ("length", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_classes", "tensor"),
    ("act_classes", None),
    ("time", None),
    ("height", None),
    ("width", None),
    ("channels", None),
)

UNCONSTRAINED = PartitionSpec.UNCONSTRAINED
"""A dimension `constrain` leaves to the partitioner (keeps whatever sharding it has)."""


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh(
    names: Sequence[str | None],
    shape: Sequence[int] | None = None,
    mesh: Mesh | jax.sharding.AbstractMesh | None = None,
    rules: Sequence[tuple[str, MeshAxes]] = LOGICAL_RULES,
) -> PartitionSpec:
    """The PartitionSpec for a tuple of logical names (None = replicated dimension).

    With `mesh`, mesh axes of size 1 and manual axes (inside `shard_map`, where an array is already
    that axis's shard) are left out and, with `shape` too, a rule whose mesh axes do not divide the
    dimension is passed over for the next rule of that name.
    """
    known = {name for name, _ in rules}
    manual = set(mesh.manual_axes) if mesh is not None else set()
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        if name is None or name is UNCONSTRAINED:
            spec.append(name)
            continue
        if name not in known:
            raise ValueError(
                f"unknown logical axis name {name!r} in {tuple(names)}; known names: {', '.join(sorted(known))}"
            )
        chosen: tuple[str, ...] = ()
        for rule_name, axes in rules:
            if rule_name != name:
                continue
            candidate = _as_tuple(axes)
            if mesh is not None:
                candidate = tuple(a for a in candidate if mesh.shape[a] > 1 and a not in manual)
            if used.intersection(candidate):
                continue
            if shape is not None and mesh is not None and candidate:
                if shape[dim] % math.prod(mesh.shape[a] for a in candidate):
                    continue
            chosen = candidate
            break
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else chosen)
    return PartitionSpec(*spec)


def partitioned(initializer: Callable[..., jax.Array], *names: str | None) -> Callable[..., jax.Array]:
    """Wraps a Flax initializer so the parameter carries its logical axis names.

    Eager sharding is off: parameters get their shardings from `tree_shardings` through the rule
    table, never from Flax's name lookup.
    """
    return nnx.with_partitioning(initializer, names, eager_sharding=False)


def _variable_names(variable: nnx.Variable) -> tuple[str | None, ...]:
    names = variable.get_metadata("out_sharding", None)
    if names is None:
        raise ValueError(
            f"parameter of shape {variable.shape} has no logical axis names; create it with "
            "triskele.mesh.partitioned(...)"
        )
    return tuple(names)


def tree_shardings(state: nnx.State, mesh: Mesh) -> dict[str, Any]:
    """Pure-dict tree of NamedShardings for every variable of an (abstract) NNX state."""
    flat = [(path, NamedSharding(mesh, logical_to_mesh(_variable_names(v), v.shape, mesh)))
            for path, v in nnx.to_flat_state(state)]
    return nnx.to_pure_dict(nnx.from_flat_state(flat))


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """`with_sharding_constraint` by logical names under the context mesh; identity without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_mesh(names, x.shape, mesh))


def bytes_per_device(
    state: nnx.State,
    mesh: Mesh | jax.sharding.AbstractMesh,
    unsharded: Sequence[str] = (),
    where: Callable[[tuple[str | None, ...]], bool] = lambda names: True,
) -> float:
    """Bytes of an (abstract) NNX state that one device holds under the rules on `mesh`, over the
    variables whose logical names satisfy `where`; mesh axes in `unsharded` count as if they did
    not shard (e.g. ('fsdp',): the share after an all-gather over fsdp)."""
    total = 0.0
    for _, variable in nnx.to_flat_state(state):
        names = _variable_names(variable)
        if not where(names):
            continue
        spec = logical_to_mesh(names, variable.shape, mesh)
        shards = math.prod(mesh.shape[axis] for entry in spec for axis in _as_tuple(entry) if axis not in unsharded)
        total += math.prod(variable.shape) * jnp.dtype(variable.dtype).itemsize / shards
    return total

