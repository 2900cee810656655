"""A model's `serve` compiled for one mesh and one batch size, with explicit shardings: the inputs
split along `batch` over `data x fsdp`, the parameters in their rules' shardings, the outputs
replicated so that every process reads them whole. Evaluation, prediction and the benchmarks run
models through it (`triskele.mesh.chunks` cuts inputs into its batches)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from triskele.mesh import host_to_global, process_rows
from triskele.mesh.chunks import Outputs, run_in_batches


class ServeRunner:
    """`dispatch(batch)` starts `serve` on a (batch, ...) host array and returns at once;
    `fetch(handle)` waits and gives numpy outputs. `batch` must divide over `data x fsdp`."""

    def __init__(self, graphdef: nnx.GraphDef, params: Any, mesh: Mesh, batch: int):
        shards = mesh.shape["data"] * mesh.shape["fsdp"]
        if batch % shards:
            raise ValueError(f"inference batch {batch} is not divisible by data x fsdp = {shards} of mesh "
                             f"{dict(mesh.shape)}; use --batch {(batch // shards + 1) * shards}")
        self.mesh, self.params, self.batch = mesh, params, batch
        self.rows = process_rows(mesh, batch)
        replicated = NamedSharding(mesh, PartitionSpec())
        self._serve = jax.jit(lambda params, images: nnx.merge(graphdef, params).serve(images),
                              out_shardings=replicated)

    def dispatch(self, images: np.ndarray) -> dict[str, jax.Array]:
        start, stop = self.rows
        with jax.set_mesh(self.mesh):
            batch = host_to_global({"image": np.asarray(images, np.float32)[start:stop]}, self.mesh, self.batch)
            return self._serve(self.params, batch["image"])

    def fetch(self, handle: dict[str, jax.Array]) -> Outputs:
        return {key: np.asarray(value) for key, value in jax.device_get(handle).items()}

    def __call__(self, images: np.ndarray) -> Outputs:
        """Any number of inputs, in batches of `batch` (the last padded)."""
        return run_in_batches(self.dispatch, self.fetch, images, self.batch)
