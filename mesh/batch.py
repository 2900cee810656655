"""Host-local batches <-> global arrays sharded along `batch`."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from triskele.mesh.logical import logical_to_mesh


def batch_sharding(mesh: Mesh, ndim: int, global_batch: int) -> NamedSharding:
    """Sharding of an array whose leading dimension is the global batch."""
    shape = (global_batch,) + (1,) * (ndim - 1)
    return NamedSharding(mesh, logical_to_mesh(("batch",) + (None,) * (ndim - 1), shape, mesh))


def process_rows(mesh: Mesh, global_batch: int) -> tuple[int, int]:
    """The contiguous rows [start, stop) of a global batch that this process loads."""
    sharding = batch_sharding(mesh, 1, global_batch)
    index_map = sharding.addressable_devices_indices_map((global_batch,))
    starts = [idx[0].start or 0 for idx in index_map.values()]
    stops = [global_batch if idx[0].stop is None else idx[0].stop for idx in index_map.values()]
    start, stop = min(starts), max(stops)
    if sum(b - a for a, b in {(a, b) for a, b in zip(starts, stops, strict=True)}) != stop - start:
        raise ValueError(
            f"this process's devices hold non-contiguous rows of the batch on mesh {dict(mesh.shape)}; "
            "put the `data`/`fsdp` axes across processes outermost"
        )
    return start, stop


def host_to_global(local: Mapping[str, np.ndarray], mesh: Mesh, global_batch: int) -> dict[str, jax.Array]:
    """Turns this process's rows of a batch into global arrays sharded along `batch`."""
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        global_shape = (global_batch,) + value.shape[1:]
        out[key] = jax.make_array_from_process_local_data(
            batch_sharding(mesh, value.ndim, global_batch), value, global_shape
        )
    return out
