"""A model's `infer` compiled for one mesh and one batch size, with explicit shardings: the inputs
and the outputs split along `batch` over `data x fsdp`, the parameters in their rules' shardings.
Each device copies only its own rows of the outputs to the host: no device gathers the batch.
Evaluation, prediction and the benchmarks run models through it (`triskele.mesh.chunks` cuts
inputs into its batches)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from triskele.mesh import batch_sharding, host_to_global, process_rows
from triskele.mesh.chunks import Outputs, run_in_batches


def host_rows(value: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded array, from its own devices' shards (each row once,
    whichever devices hold replicas of it), in order."""
    shards = {}
    for shard in value.addressable_shards:
        shards.setdefault(shard.index[0].start or 0, shard)
    return np.concatenate(jax.device_get([shards[start].data for start in sorted(shards)]))  # copies started together


class ForwardRunner:
    """`dispatch(batch)` starts `infer` on a (batch, ...) host array and returns at once;
    `fetch(handle)` waits and gives numpy outputs for the whole batch. `batch` must divide over
    `data x fsdp`.

    On a mesh of this process's devices (predict's) `fetch` copies each device's rows once. On a
    mesh across processes, where every process dispatches the same batches (evaluation during
    training), each process reads its own rows and gets the others' from them (one host gather)."""

    def __init__(self, graphdef: nnx.GraphDef, params: Any, mesh: Mesh, batch: int):
        shards = mesh.shape["data"] * mesh.shape["fsdp"]
        if batch % shards:
            raise ValueError(f"inference batch {batch} is not divisible by data x fsdp = {shards} of mesh "
                             f"{dict(mesh.shape)}; use --batch {(batch // shards + 1) * shards}")
        self.mesh, self.params, self.batch = mesh, params, batch
        self.rows = process_rows(mesh, batch)
        self._spans_processes = len({d.process_index for d in mesh.devices.flat}) > 1

        def serve(params: Any, images: jax.Array) -> dict[str, jax.Array]:
            outputs = nnx.merge(graphdef, params).infer(images)
            return {key: jax.lax.with_sharding_constraint(value, batch_sharding(mesh, value.ndim, batch))
                    for key, value in outputs.items()}

        self._serve = jax.jit(serve)

    def dispatch(self, images: np.ndarray) -> dict[str, jax.Array]:
        start, stop = self.rows
        with jax.set_mesh(self.mesh):
            batch = host_to_global({"image": np.asarray(images, np.float32)[start:stop]}, self.mesh, self.batch)
            return self._serve(self.params, batch["image"])

    def fetch(self, handle: dict[str, jax.Array]) -> Outputs:
        if self._spans_processes:
            from jax.experimental import multihost_utils

            mine = {key: host_rows(value) for key, value in handle.items()}
            gathered, starts = multihost_utils.process_allgather((mine, np.asarray(self.rows[0])))
            order = np.argsort(np.asarray(starts))
            return {key: np.concatenate(np.asarray(value)[order]) for key, value in gathered.items()}
        return {key: host_rows(value) for key, value in handle.items()}

    def __call__(self, images: np.ndarray) -> Outputs:
        """Any number of inputs, in batches of `batch` (the last padded)."""
        return run_in_batches(self.dispatch, self.fetch, images, self.batch)
