"""The planner applied to a run's config: the abstract model (built once), the planner's inputs for
a config or for a transformer known by its sizes, and a candidate turned back into flags or a config.

`--mesh auto` (`triskele.train.auto_mesh`) and the `plan` command (`triskele.train.tools.plan`)
both read it; the ranking itself is the performance model's (`triskele.mesh.perf.planner`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from flax import nnx
from jax.sharding import AbstractMesh
from triskele.mesh.perf.formulas import ParamBytes
from triskele.mesh.perf.hardware import Gpu, get_gpu
from triskele.mesh.perf.planner import Candidate, PlanInputs
from triskele.mesh.perf.sharded_params import param_bytes
from triskele.mesh.perf.transformer_shape import block_params
from triskele.mesh.perf.transformer_shape import param_bytes as shape_param_bytes
from triskele.mesh.perf.transformer_shape import validator as shape_validator
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MESH_AXES, MeshSpec
from triskele.train.config.schema import Config
from triskele.train.config.validate import validate
from triskele.train.domains import spec_for
from triskele.train.precision import activation_bytes, matmul_dtype

PLANNED_BACKEND = "gpu"
"""The backend the planner plans for: what `precision=auto` means there (bfloat16)."""


def planned_attention(setting: str, compute: str) -> str:
    """The attention a GPU compiles for `model.attention` (`formulas.ATTENTIONS`): `auto` takes the fused
    cuDNN kernel in 16-bit and FP8 (`triskele.models.vit.attention_implementation`), `cudnn` always,
    `xla` never."""
    if setting not in ("auto", "xla", "cudnn"):
        raise ValueError(f"model.attention {setting!r} is not one of auto, xla, cudnn")
    fused = setting == "cudnn" or (setting == "auto" and compute in ("bfloat16", "float16", "fp8"))
    return "fused" if fused else "xla"


def abstract_mesh(mesh: MeshSpec) -> AbstractMesh:
    return AbstractMesh(tuple(getattr(mesh, a) for a in MESH_AXES), MESH_AXES)


@dataclasses.dataclass
class AbstractModel:
    """A config's model built abstractly once (no weights allocated): its cost shape, its
    parameters' shapes and logical names, and their layout on any mesh."""

    config: Config
    module: nnx.Module
    params: nnx.State
    _layouts: dict[MeshSpec, ParamBytes] = dataclasses.field(default_factory=dict, repr=False)

    @functools.cached_property
    def shape(self) -> ModelShape:
        return self.module.cost_shape()

    @property
    def parameter_count(self) -> float:
        return float(sum(leaf.size for leaf in jax.tree.leaves(self.params)))

    def param_bytes(self, mesh: MeshSpec) -> ParamBytes:
        """A device's share of the parameters on `mesh` (computed once per mesh)."""
        if mesh not in self._layouts:
            self._layouts[mesh] = param_bytes(self.params, abstract_mesh(mesh))
        return self._layouts[mesh]


def abstract_model(config: Config) -> AbstractModel:
    module = nnx.eval_shape(lambda: spec_for(config).build_model(config, nnx.Rngs(params=0), 1))
    return AbstractModel(config, module, nnx.state(module, nnx.Param))


def _cluster(gpu: Gpu | str, devices: int, nodes: int | None) -> tuple[Gpu, int]:
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    nodes = nodes or max(1, devices // gpu.gpus_per_node)
    if devices % nodes:
        raise ValueError(f"--devices {devices} is not divisible by --nodes {nodes}; use a node count that divides it")
    return gpu, nodes


def plan_inputs(config: Config, gpu_name: Gpu | str, devices: int, nodes: int | None = None,
                nvlink_domain: int | None = None, efficiency: float | None = None,
                memory_gb: float | None = None, model: AbstractModel | None = None, **options) -> PlanInputs:
    """The planner's inputs for a config: its model's sizes and parameter layout, its validation.
    `model`: the config's abstract model, when the caller has built it already. `options`: further
    `PlanInputs` fields (axes, schedule, ...)."""
    gpu, nodes = _cluster(gpu_name, devices, nodes)
    model = abstract_model(config) if model is None else model

    def check(mesh: MeshSpec, microbatches: int, repeats: int, schedule: str = "circular") -> str | None:
        if mesh.pipeline > 1:
            trial = dataclasses.replace(config, pipeline=dataclasses.replace(
                config.pipeline, microbatches=microbatches, repeats=repeats, schedule=schedule), mesh=str(mesh))
        else:
            trial = dataclasses.replace(config, optim=dataclasses.replace(config.optim, grad_accum=microbatches),
                                        mesh=str(mesh))
        try:
            validate(trial, abstract_mesh(mesh))
        except ValueError as err:
            return str(err)
        return None

    compute = matmul_dtype(config.precision, PLANNED_BACKEND)
    return PlanInputs(shape=model.shape, global_batch=config.data.global_batch, gpu=gpu, devices=devices,
                      nodes=nodes, nvlink_domain=nvlink_domain or devices // nodes, compute=compute,
                      attention=planned_attention(config.model.attention, compute),
                      activation_bytes=activation_bytes(config.precision, PLANNED_BACKEND),
                      efficiency=gpu.efficiency if efficiency is None else efficiency, param_bytes=model.param_bytes,
                      validate=check, memory_bytes=memory_gb * 1e9 if memory_gb else None, **options)


def shape_inputs(shape: ModelShape, global_batch: int, gpu_name: Gpu | str, devices: int, nodes: int | None = None,
                 nvlink_domain: int | None = None, efficiency: float | None = None, memory_gb: float | None = None,
                 bytes_per_param: float = 4.0, attention: str = "auto", **options) -> PlanInputs:
    """The planner's inputs for a transformer known by its sizes (`--shape`), in bfloat16, its
    attention as `model.attention=attention` compiles it."""
    gpu, nodes = _cluster(gpu_name, devices, nodes)
    return PlanInputs(shape=shape, global_batch=global_batch, gpu=gpu, devices=devices, nodes=nodes,
                      attention=planned_attention(attention, PlanInputs.compute),
                      nvlink_domain=nvlink_domain or devices // nodes,
                      efficiency=gpu.efficiency if efficiency is None else efficiency,
                      param_bytes=shape_param_bytes(shape, bytes_per_param),
                      validate=shape_validator(shape, global_batch),
                      memory_bytes=memory_gb * 1e9 if memory_gb else None, **options)


def parameter_count(model: AbstractModel | None, shape: ModelShape) -> float:
    """Weights of the preset's model, or of a transformer known by its sizes."""
    if model is not None:
        return model.parameter_count
    split, whole = block_params(shape)
    return shape.depth * (split + whole) + shape.vocab * shape.width + shape.tokens * shape.width


def pick_flags(best: Candidate) -> str:
    """The training flags that apply a candidate: its mesh, schedule or accumulation, remat."""
    flags = f"--mesh {best.mesh}"
    if best.mesh.pipeline > 1:
        flags += (f" --set pipeline.schedule={best.schedule} --set pipeline.microbatches={best.microbatches}"
                  f" --set pipeline.repeats={best.repeats}")
        if not best.gather_once:
            flags += " --set pipeline.gather_once=false"
    elif best.microbatches > 1:
        flags += f" --set optim.grad_accum={best.microbatches}"
    return flags + f" --set model.remat={best.remat}"


def apply_pick(config: Config, best: Candidate) -> Config:
    """`config` with a candidate applied (what `pick_flags` sets): its mesh, schedule or
    accumulation, remat."""
    return dataclasses.replace(
        config, mesh=str(best.mesh), model=dataclasses.replace(config.model, remat=best.remat),
        optim=dataclasses.replace(config.optim, grad_accum=best.microbatches if best.mesh.pipeline == 1 else 1),
        pipeline=dataclasses.replace(config.pipeline, microbatches=best.microbatches, repeats=best.repeats,
                                     gather_once=best.gather_once, schedule=best.schedule)
        if best.mesh.pipeline > 1 else config.pipeline)
