"""A run's train step analysed: the performance model's formulas (`triskele.mesh.perf.formulas`)
applied to a run's RunParts (`predict`), and the same step lowered, compiled and measured beside
them (`compile_train_step`, `measure`: HLO FLOPs, collective bytes, memory). The loop's MFU meter
(`triskele.train.bookkeeping.throughput`), the benches and the planner's tests come through here."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from triskele.mesh.perf.formulas import ParamBytes, step_collectives, step_memory, train_flops
from triskele.mesh.perf.hlo_counts import ProgramCost, program_cost
from triskele.mesh.perf.sharded_params import param_bytes
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MeshSpec
from triskele.train.precision import activation_bytes
from triskele.train.run import RunParts
from triskele.train.step import batch_shardings_of, make_train_step


def model_shape(parts: RunParts) -> ModelShape:
    return nnx.eval_shape(parts.build_model).cost_shape()


def abstract_params(parts: RunParts) -> nnx.State:
    return nnx.state(nnx.eval_shape(parts.build_model), nnx.Param)


@dataclasses.dataclass
class Prediction:
    model_flops_per_device: float
    """Model FLOPs per device per step (what MFU counts)."""
    executed_flops_per_device: float
    """FLOPs a device runs: recomputed by remat, and with a pipeline its bubble iterations too."""
    collectives: dict[str, float]
    """Bytes sent per device per step by collective kind."""
    params: ParamBytes
    memory: dict[str, float]


def predict(parts: RunParts, mesh: Mesh | jax.sharding.AbstractMesh | None = None) -> Prediction:
    """The formulas for the run's model and mesh (default the run's own)."""
    mesh = parts.mesh if mesh is None else mesh
    config = parts.config
    shape, sizes = model_shape(parts), MeshSpec.parse(dict(mesh.shape))
    flops = train_flops(shape, config.data.global_batch)
    pipeline = config.pipeline
    params = param_bytes(abstract_params(parts), mesh)
    act = activation_bytes(config.precision)
    collectives = step_collectives(shape, sizes, config.data.global_batch, params, act,
                                   pipeline.microbatches, pipeline.repeats, config.model.remat, pipeline.gather_once)
    bounded = (pipeline.microbatches, pipeline.repeats) if pipeline.schedule == "1f1b" else None
    memory = step_memory(shape, sizes, config.data.global_batch, params, act, config.model.remat,
                         gather_once=pipeline.gather_once, bounded_pipeline=bounded)
    return Prediction(
        model_flops_per_device=flops.per_device(sizes),
        executed_flops_per_device=flops.executed_per_device(sizes, pipeline.microbatches, pipeline.repeats,
                                                            config.model.remat, pipeline.schedule),
        collectives=collectives.by_kind(),
        params=params,
        memory={**dataclasses.asdict(memory), "total": memory.total},
    )


def example_batch(parts: RunParts) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and shardings of one global training batch (read off the first training record)."""
    record = parts.domain.open_split(parts.config, "train").load(0)
    batch = {key: np.asarray(value) for key, value in record.items()} | {"valid": np.ones((), np.float32)}
    size = parts.config.data.global_batch
    shardings = batch_shardings_of({k: v[None] for k, v in batch.items()}, parts.mesh, size)
    return {k: jax.ShapeDtypeStruct((size, *v.shape), v.dtype, sharding=shardings[k]) for k, v in batch.items()}


def lower_train_step(parts: RunParts, batch: dict[str, Any] | None = None) -> jax.stages.Lowered:
    """The engine's train step lowered for the run's state and a batch like `batch` (arrays or
    ShapeDtypeStructs with shardings; default `example_batch`)."""
    batch = example_batch(parts) if batch is None else batch
    shardings = {key: value.sharding for key, value in batch.items()}
    step = make_train_step(parts.graphdef, parts.tx, parts.schedule, parts.config.optim.grad_accum, parts.shardings,
                           shardings, parts.mesh, skip_nonfinite=parts.config.run.on_nonfinite == "skip")
    with jax.set_mesh(parts.mesh):
        return step.lower(parts.abstract_state(), batch)


def compile_train_step(parts: RunParts, batch: dict[str, Any] | None = None) -> tuple[jax.stages.Compiled, float]:
    """(`lower_train_step` compiled, seconds spent lowering and compiling)."""
    began = time.perf_counter()
    lowered = lower_train_step(parts, batch)
    with jax.set_mesh(parts.mesh):
        compiled = lowered.compile()
    return compiled, time.perf_counter() - began


@dataclasses.dataclass
class Measurement:
    program: ProgramCost
    memory: dict[str, float]
    """From `compiled.memory_analysis()`: argument, output, temporary and aliased bytes per device."""


def batch_bytes_per_device(batch: dict[str, Any]) -> float:
    """Bytes of one device's shard of a batch (arrays or ShapeDtypeStructs with shardings)."""
    return float(sum(math.prod(v.sharding.shard_shape(v.shape)) * np.dtype(v.dtype).itemsize for v in batch.values()))


def state_bytes(measurement: Measurement, batch: dict[str, Any]) -> float:
    """The compiled step's argument bytes less the batch: parameters, optimizer state, step counter."""
    return measurement.memory["argument"] - batch_bytes_per_device(batch)


def measure(compiled, mesh: Mesh) -> Measurement:
    analysis = compiled.memory_analysis()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "alias_size_in_bytes")
    memory = {name.removesuffix("_size_in_bytes"): float(getattr(analysis, name, 0) or 0) for name in fields}
    return Measurement(program_cost(compiled.as_text(), mesh.size), memory)

