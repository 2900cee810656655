"""A built model's parameters as the rule table shards them on a mesh: the `ParamBytes` the
formulas and the planner take, read off an (abstract) NNX state's logical axis names."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh
from triskele.mesh.logical import bytes_per_device
from triskele.mesh.perf.formulas import ParamBytes


def param_bytes(state: nnx.State, mesh: Mesh | jax.sharding.AbstractMesh) -> ParamBytes:
    """A device's share of a model's parameters: the stacked blocks (named `layers`) and the rest."""
    stacked = lambda names: "layers" in names
    other = lambda names: "layers" not in names
    return ParamBytes(
        blocks=bytes_per_device(state, mesh, where=stacked),
        other=bytes_per_device(state, mesh, where=other),
        blocks_fsdp_gathered=bytes_per_device(state, mesh, ("fsdp",), where=stacked),
        other_fsdp_gathered=bytes_per_device(state, mesh, ("fsdp",), where=other),
    )
