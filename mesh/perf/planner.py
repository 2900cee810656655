"""The mesh planner: which `pipeline, data, fsdp, tensor` sizes to use for a model on N GPUs.

For every way of splitting the devices over the allowed axes that the run's validation accepts,
and for every pipeline schedule (or gradient accumulation) and remat policy worth trying, it
predicts with `triskele.mesh.perf.formulas`: memory per device, compute time (FLOPs the device executes /
(peak x efficiency)), communication time (bytes / bandwidth of the link each axis crosses: NVLink
inside a domain, the network across domains, plus NCCL's per-hop latency for every collective)
and the pipeline bubble. Step time = compute + tensor and pipeline communication (on the critical
path) + whatever fsdp communication the backward cannot hide + whatever data-parallel all-reduce
the last microbatch's backward cannot hide (the backward is two thirds of the compute).
Configurations that do not fit in memory are marked; the rest are ranked by predicted step time,
a mesh with fewer kinds of parallelism winning unless another is predicted more than
`SIMPLICITY_MARGIN` faster.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

from triskele.mesh.perf.formulas import (
    ParamBytes,
    StepCollectives,
    StepMemory,
    block_passes,
    pipeline_block_gathers,
    step_collectives,
    step_memory,
    train_flops,
    training_traffic_bytes,
)
from triskele.mesh.perf.hardware import Gpu
from triskele.mesh.schedule import bubble_fraction
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MESH_AXES, MeshSpec, divisors

REMAT_ORDER = ("none", "dots", "full")
BACKWARD_SHARE = 2 / 3
"""Share of a step's compute that data-parallel communication can hide behind (the backward)."""
USABLE_MEMORY = 0.9
"""Share of the GPU's memory a step may plan to use (the rest: XLA's workspace, fragmentation)."""
SIMPLICITY_MARGIN = 0.03
"""A mesh with fewer kinds of parallelism is preferred unless another is predicted this much faster:
pipeline stages pay imbalance and buffer memory, and tensor parallelism latency, that the
formulas leave out."""
NCCL_LATENCY_S = {"base": 8.4e-6, "nvlink": 3.4e-6, "network": 9.6e-6}
"""NCCL's ring model for the Simple protocol (NVIDIA/nccl, src/graph/tuning.cc: baseLat and
hwLat): a collective costs a base latency plus one hop latency per ring step, NVLink hops and
network hops priced apart (all-reduce: 2(n-1) steps, all-gather / reduce-scatter: n-1)."""
SCHEDULES = ("circular", "1f1b")
BEST_SCHEDULE = "best"
"""`PlanInputs.schedule` that prices every schedule of `SCHEDULES` and keeps each mesh's fastest."""
OVERLAP_EFFICIENCY = 0.65
"""Share of its time an fsdp or data-parallel collective hidden under the backward costs nothing:
the rest (NCCL's kernels take SMs and HBM bandwidth from the matmuls they overlap) adds to the
step. Calibrated on one published comparison, Megatron-LM's Table 2 at 384 GPUs (ZeRO-3 / PTD-P =
0.94); the planner is judged on its 768- and 1,536-GPU rows (tests/test_published.py)."""
GRADIENT_BUCKET_BYTES = 25e6
"""Gradients are all-reduced in buckets of about this size (PyTorch DDP's default; XLA's all-reduce
combiner merges small ones likewise): one ring latency per bucket."""


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    shape: ModelShape
    global_batch: int
    gpu: Gpu
    devices: int
    nodes: int
    nvlink_domain: int
    """GPUs joined by NVLink (8 in an HGX node, 72 in an NVL72 rack)."""
    compute: str = "bfloat16"
    """What the matmuls run in (the peak they reach): float32, bfloat16 or fp8."""
    activation_bytes: int = 2
    """Bytes of one activation element (`triskele.train.precision.activation_bytes` of the run's precision)."""
    efficiency: float = 0.5
    """Share of peak FLOP/s the matmuls reach."""
    param_bytes: Callable[[MeshSpec], ParamBytes] | None = None
    """A device's share of the parameters on a mesh (from the model's logical axis names)."""
    validate: Callable[[MeshSpec, int, int, str], str | None] | None = None
    """(mesh, microbatches, repeats, schedule) -> an error message, or None when the run would accept it."""
    memory_bytes: float | None = None
    """GPU memory to plan for (default: the GPU's)."""
    axes: tuple[str, ...] = MESH_AXES
    """Axes the planner may use (the others stay 1), e.g. without `fsdp` for a framework that has none."""
    schedule: str = "circular"
    """Pipeline schedule (`pipeline.schedule`): `circular` (every microbatch's activations kept until
    its backward) or `1f1b` (interleaved when repeats > 1: as triskele runs it, stage inputs in flight
    kept and each stage recomputed, `formulas.bounded_activations`, 3 forwards and a backward per
    microbatch, `formulas.block_passes`; with `megatron_1f1b`, as Megatron-LM runs it: at most
    `pipeline` microbatches' activations in flight under the remat policy, no broadcast of finished
    outputs), or `best` (BEST_SCHEDULE: both priced, each mesh's faster kept)."""
    megatron_1f1b: bool = False
    """`schedule=1f1b` priced as Megatron-LM runs it (the published runs), not as triskele does."""
    remat_options: tuple[str, ...] = REMAT_ORDER
    optimizer_state: float = 2.0
    """Optimizer state per parameter byte (Adam's two moments in the parameters' dtype: 2)."""
    fsdp_gathers: int = 1
    """Weight all-gathers per microbatch: 1 keeps the gathered weights for the backward (as XLA
    does), 2 frees them after the forward and gathers again (ZeRO-3)."""
    accumulation: bool = True
    """Without a pipeline, also try gradient accumulation (`optim.grad_accum`) to fit memory."""
    probability_bytes: int = 4
    """Bytes of an attention probability in HBM (XLA's softmax: float32; Megatron-LM's fused fp16: 2)."""
    attention: str = "fused"
    """How attention runs (`formulas.ATTENTIONS`): `fused`, a kernel that keeps the probabilities on
    chip and recomputes the scores in the backward (what `model.attention=auto` compiles on a GPU in
    16-bit or FP8); `xla`, matmuls and a softmax whose probabilities pass through HBM."""
    runtime: str = "xla"
    """What runs the elementwise ops (`formulas.RUNTIMES`): `xla` (triskele) or `fused-kernels`
    (Megatron-LM, NeMo: one pass per op)."""
    weight_temporaries: float | None = None
    """Parameter-sized buffers the step holds besides the gradients: None, triskele's compiled
    step's (`formulas.weight_temporaries_on`); 0 for a framework that updates in place, as the
    published Megatron-LM runs are priced."""
    overlap_efficiency: float = OVERLAP_EFFICIENCY
    fsdp_collectives_per_layer: int = 1
    """Collectives per layer for each fsdp gather or reduce-scatter: 1 where a layer's weights move
    together (XLA, stacked layers); ZeRO-3 moves each module's own (QKV, out, MLP up and down, two
    LayerNorms: 6), paying the ring's latency each time."""


@dataclasses.dataclass
class Candidate:
    mesh: MeshSpec
    microbatches: int
    """Pipeline microbatches; without a pipeline, gradient accumulation steps."""
    repeats: int
    remat: str
    memory: StepMemory
    fits: bool
    compute_s: float
    comm_s: dict[str, float]
    """Seconds of each axis's communication."""
    exposed_comm_s: float
    step_s: float
    bubble: float
    mfu: float
    images_per_s: float
    executed_flops: float
    """FLOPs per device per step the program runs (remat recomputation and pipeline bubble included)."""
    collective_bytes: dict[str, float]
    """Bytes each device sends per step, by collective kind."""
    gather_once: bool = True
    """`pipeline.gather_once`: a pipeline stage's weights gathered over fsdp once per step, or in
    every iteration of the schedule."""
    schedule: str = "circular"
    """`pipeline.schedule` (with a pipeline)."""

    def row(self) -> dict:
        return {"mesh": str(self.mesh), "microbatches": self.microbatches if self.mesh.pipeline > 1 else "",
                "repeats": self.repeats if self.mesh.pipeline > 1 else "",
                "schedule": self.schedule if self.mesh.pipeline > 1 else "",
                "gather_once": self.gather_once if self.mesh.pipeline > 1 and self.mesh.fsdp > 1 else "",
                "grad_accum": self.microbatches if self.mesh.pipeline == 1 else 1,
                "remat": self.remat, "memory_GB": self.memory.total / 1e9, "fits": "yes" if self.fits else "NO",
                "compute_ms": 1e3 * self.compute_s, "comm_ms": 1e3 * sum(self.comm_s.values()),
                "exposed_comm_ms": 1e3 * self.exposed_comm_s, "bubble": self.bubble, "step_ms": 1e3 * self.step_s,
                "rank_ms": 1e3 * ranked_step_s(self), "images_per_s": self.images_per_s, "mfu": self.mfu}


def meshes(devices: int, axes: tuple[str, ...] = MESH_AXES) -> list[MeshSpec]:
    """Every (pipeline, data, fsdp, tensor) whose product is `devices`, using only `axes`."""
    out = []
    for pipeline, data, fsdp in itertools.product(divisors(devices), repeat=3):
        if devices % (pipeline * data * fsdp) == 0:
            mesh = MeshSpec(pipeline, data, fsdp, devices // (pipeline * data * fsdp))
            if all(getattr(mesh, a) == 1 for a in MESH_AXES if a not in axes):
                out.append(mesh)
    return out


def axis_link(mesh: MeshSpec, axis: str, inputs: PlanInputs) -> tuple[float, int]:
    """(bandwidth, NVLink domains one group of the axis spans): NVLink when every group of the axis
    stays inside a domain (its aligned block of stride x size devices divides the domain), else the
    network. Devices are numbered with `tensor` innermost, then fsdp, data, pipeline (as `make_mesh`
    lays them out)."""
    stride = 1
    for name in ("tensor", "fsdp", "data", "pipeline"):
        size = getattr(mesh, name)
        if name == axis:
            if inputs.nvlink_domain % (stride * size) == 0:
                return inputs.gpu.nvlink_bandwidth, 1
            return inputs.gpu.network_bandwidth, min(size, -(-stride * size // inputs.nvlink_domain))
        stride *= size
    raise ValueError(f"unknown mesh axis {axis!r}")


def axis_bandwidth(mesh: MeshSpec, axis: str, inputs: PlanInputs) -> float:
    return axis_link(mesh, axis, inputs)[0]


def collective_latency(kind: str, group: int, domains: int) -> float:
    """Seconds of latency of one ring collective over `group` devices spanning `domains` NVLink
    domains (NCCL's model, `NCCL_LATENCY_S`)."""
    if group <= 1:
        return 0.0
    twice = 2 if kind == "all-reduce" else 1
    steps, network_steps = twice * (group - 1), twice * (domains - 1)
    lat = NCCL_LATENCY_S
    return lat["base"] + (steps - network_steps) * lat["nvlink"] + network_steps * lat["network"]


def schedules(mesh: MeshSpec, inputs: PlanInputs) -> list[tuple[int, int]]:
    """(microbatches, repeats) to try. Without a pipeline: gradient accumulation steps (1, and with
    `accumulation` every power of two that divides the device's batch). With one: M in P, 2P, 4P, 8P
    and M = the pipeline's batch / b for microbatch sizes b in 1, 2, 4, 8; repeats v in 1 to 4 that
    divide the layers per stage."""
    local = inputs.global_batch // mesh.batch_shards
    if mesh.pipeline == 1:
        steps = [1] + ([2**k for k in range(1, 12) if 2**k <= local and local % 2**k == 0]
                       if inputs.accumulation else [])
        return [(a, 1) for a in steps]
    counts = {m * mesh.pipeline for m in (1, 2, 4, 8)} | {local // b for b in (1, 2, 4, 8) if local % b == 0}
    return [(m, v) for m in sorted(counts) if m >= mesh.pipeline for v in (1, 2, 3, 4)
            if inputs.shape.depth % (mesh.pipeline * v) == 0]


def schedule_options(inputs: PlanInputs, mesh: MeshSpec) -> tuple[str, ...]:
    """The pipeline schedules to price on `mesh`: both under BEST_SCHEDULE (a mesh without a
    pipeline has one), else the inputs' own."""
    if inputs.schedule != BEST_SCHEDULE:
        return (inputs.schedule,)
    return SCHEDULES if mesh.pipeline > 1 else SCHEDULES[:1]


def records_alive(inputs: PlanInputs, mesh: MeshSpec, microbatches: int, schedule: str) -> float:
    """Records whose activations a device keeps at once: one accumulation microbatch; all of a
    circular pipeline's microbatches; Megatron-LM's 1F1B pipeline's microbatches in flight (at most
    `pipeline`); triskele's 1f1b, the whole batch (its activations are `formulas.bounded_activations`)."""
    local = inputs.global_batch / mesh.batch_shards
    if mesh.pipeline == 1:
        return local / microbatches
    if schedule == "1f1b" and inputs.megatron_1f1b:
        return local / microbatches * min(microbatches, mesh.pipeline)
    return local


def elementwise_seconds(inputs: PlanInputs, mesh: MeshSpec, microbatches: int, repeats: int, remat: str,
                        schedule: str = "circular") -> float:
    """Time the blocks spend moving activations through HBM outside the matmuls (LayerNorm, softmax,
    GELU, residual adds: memory-bound, not overlapped with the matmuls): a step's traffic over its
    layers (`training_traffic_bytes`), times the passes a pipeline schedule adds (its bubble
    iterations, `block_passes` relative to no pipeline), per device."""
    return elementwise_bytes(inputs, mesh, microbatches, repeats, remat, schedule) / inputs.gpu.memory_bandwidth


def elementwise_bytes(inputs: PlanInputs, mesh: MeshSpec, microbatches: int, repeats: int, remat: str,
                      schedule: str = "circular") -> float:
    """The HBM bytes `elementwise_seconds` prices, per device and step."""
    shape = inputs.shape
    images = inputs.global_batch / mesh.batch_shards * shape.images_per_record / mesh.pipeline
    traffic = training_traffic_bytes(shape, images, mesh.tensor, inputs.activation_bytes, inputs.probability_bytes,
                                     remat, inputs.runtime, inputs.attention)
    return traffic * block_passes(mesh.pipeline, repeats, microbatches, remat, schedule) / block_passes(1, 1, 1, remat)


def attention_dtype(compute: str) -> str:
    """What the attention's own matmuls run in: FP8 steps keep them in bfloat16 (as cuDNN's and
    Transformer Engine's FP8 recipes do, and triskele's fp8, which quantises only the Dense layers)."""
    return "bfloat16" if compute == "fp8" else compute


def evaluate(inputs: PlanInputs, mesh: MeshSpec, microbatches: int, repeats: int, remat: str,
             gather_once: bool = True, schedule: str | None = None) -> Candidate:
    """One configuration's prediction. Without a pipeline, `microbatches` is gradient accumulation;
    `gather_once`: with a pipeline, `pipeline.gather_once` (weights gathered over fsdp once per step,
    held whole; or per iteration, forward and backward); `schedule`: default the inputs' own (the
    first of `schedule_options`)."""
    shape, batch = inputs.shape, inputs.global_batch
    schedule = schedule or schedule_options(inputs, mesh)[0]
    params = inputs.param_bytes(mesh)
    act = inputs.activation_bytes
    bounded = (microbatches, repeats) if schedule == "1f1b" and not inputs.megatron_1f1b else None
    memory = step_memory(shape, mesh, batch, params, act, remat, inputs.optimizer_state,
                         records_alive(inputs, mesh, microbatches, schedule), gather_once, bounded,
                         inputs.weight_temporaries)
    budget = (inputs.memory_bytes or inputs.gpu.memory_bytes) * USABLE_MEMORY
    flops = train_flops(shape, batch)
    peak = inputs.gpu.peak_flops[inputs.compute] * inputs.efficiency
    pipeline_microbatches = microbatches if mesh.pipeline > 1 else 1
    accumulation = 1 if mesh.pipeline > 1 else microbatches
    runs = "circular" if inputs.megatron_1f1b else schedule  # Megatron-LM's 1F1B runs circular's passes
    executed = flops.executed_per_device(mesh, pipeline_microbatches, repeats, remat, runs, inputs.attention)
    attention = flops.attention_executed_per_device(mesh, pipeline_microbatches, repeats, remat, runs,
                                                    inputs.attention)
    attention_peak = inputs.gpu.peak_flops[attention_dtype(inputs.compute)] * inputs.efficiency
    compute = ((executed - attention) / peak + attention / attention_peak
               + elementwise_seconds(inputs, mesh, pipeline_microbatches, repeats, remat, runs))
    sent = step_collectives(shape, mesh, batch, params, act, pipeline_microbatches, repeats, remat, gather_once)
    if schedule == "1f1b":  # Megatron-LM's scatter/gather: each tensor rank sends 1/tensor of it
        sent = dataclasses.replace(sent, pipeline_broadcast=0.0, pipeline_permute=sent.pipeline_permute / mesh.tensor)
    fsdp_passes = accumulation  # weights gathered (and gradients reduce-scattered) per microbatch
    per_iteration = mesh.pipeline > 1 and not gather_once  # the formula counts the backward's gathers then
    sent = dataclasses.replace(
        sent, fsdp_all_gather=sent.fsdp_all_gather * (1 if per_iteration else inputs.fsdp_gathers) * fsdp_passes,
        fsdp_reduce_scatter=sent.fsdp_reduce_scatter * fsdp_passes)
    block_gathers = (pipeline_block_gathers(mesh.pipeline, repeats, pipeline_microbatches) if per_iteration
                     else inputs.fsdp_gathers)
    comm = communication_seconds(inputs, mesh, sent, params.local, microbatches, repeats, remat,
                                 fsdp_passes * (block_gathers + 1))
    hidden = BACKWARD_SHARE * compute
    exposed = (comm["tensor"] + comm["pipeline"] + overlapped_seconds(comm["fsdp"], hidden, inputs.overlap_efficiency)
               + overlapped_seconds(comm["data"], hidden / microbatches, inputs.overlap_efficiency))
    step = compute + exposed
    model_flops = flops.per_device(mesh)
    return Candidate(
        mesh=mesh, microbatches=microbatches, repeats=repeats, remat=remat, memory=memory,
        fits=memory.total <= budget, compute_s=compute, comm_s=comm, exposed_comm_s=exposed, step_s=step,
        bubble=bubble_fraction(mesh.pipeline, repeats, microbatches, runs) if mesh.pipeline > 1 else 0.0,
        mfu=model_flops / (step * inputs.gpu.peak_flops[inputs.compute]), images_per_s=batch / step,
        executed_flops=executed, collective_bytes=sent.by_kind(), gather_once=gather_once, schedule=schedule,
    )


def communication_seconds(inputs: PlanInputs, mesh: MeshSpec, sent: StepCollectives, local_param_bytes: float,
                          microbatches: int, repeats: int, remat: str, fsdp_collectives: float) -> dict[str, float]:
    """Seconds each mesh axis spends in its collectives per step: the bytes `sent` over the link the
    axis crosses, plus NCCL's per-hop latency for every collective it issues (`fsdp_collectives`: the
    gathers and reduce-scatters per layer's weights, all passes)."""
    shape = inputs.shape
    pipeline_microbatches = microbatches if mesh.pipeline > 1 else 1
    links = {axis: axis_link(mesh, axis, inputs) for axis in ("data", "fsdp", "tensor", "pipeline")}
    layers = shape.depth / mesh.pipeline
    per_block = 4 + (1 if remat == "full" else 0)
    iterations = repeats * pipeline_microbatches + mesh.pipeline - 1
    latency = {
        "data": math.ceil(local_param_bytes / GRADIENT_BUCKET_BYTES)
        * collective_latency("all-reduce", mesh.data, links["data"][1]),
        "fsdp": layers * fsdp_collectives * inputs.fsdp_collectives_per_layer
        * collective_latency("all-gather", mesh.fsdp, links["fsdp"][1]),
        "tensor": per_block * layers * microbatches * collective_latency("all-reduce", mesh.tensor, links["tensor"][1]),
        "pipeline": 2 * iterations * collective_latency("all-gather", 2, links["pipeline"][1])
        if mesh.pipeline > 1 else 0.0,
    }
    comm = {
        "data": sent.data_all_reduce / links["data"][0] + latency["data"],
        "fsdp": (sent.fsdp_all_gather + sent.fsdp_reduce_scatter) / links["fsdp"][0] + latency["fsdp"],
        "tensor": (sent.tensor_all_reduce + sent.tensor_all_gather) / links["tensor"][0] + latency["tensor"],
        "pipeline": (sent.pipeline_permute + sent.pipeline_broadcast) / links["pipeline"][0] + latency["pipeline"],
    }
    return comm


def overlapped_seconds(comm: float, hidden: float, efficiency: float) -> float:
    """What a collective overlapped with `hidden` seconds of compute adds to the step: the part that
    does not fit under it, and (1 - efficiency) of the part that does (`OVERLAP_EFFICIENCY`)."""
    return max(0.0, comm - hidden) + (1 - efficiency) * min(comm, hidden)


def candidates(inputs: PlanInputs) -> list[Candidate]:
    """Per valid mesh, its fastest schedule with the lightest remat policy that fits (or, if none
    fits, with `full` remat, marked as not fitting); sorted: fitting first, then by step time."""
    chosen = []
    for mesh in meshes(inputs.devices, inputs.axes):
        best = best_for_mesh(inputs, mesh, any_fit=True)
        if best is not None:
            chosen.append(best)
    return sorted(chosen, key=ranking_key)


def best_for_mesh(inputs: PlanInputs, mesh: MeshSpec, any_fit: bool = False) -> Candidate | None:
    """A mesh's fastest valid schedule with the lightest remat policy that fits; with `any_fit`, the
    fastest that does not fit when none does (None: no valid schedule, or nothing fits). A pipeline
    with fsdp is priced both gathering its weights once per step and in every iteration."""
    options = []
    gather_options = (True, False) if mesh.pipeline > 1 and mesh.fsdp > 1 else (True,)
    for (microbatches, repeats), gather_once, schedule in itertools.product(
            schedules(mesh, inputs), gather_options, schedule_options(inputs, mesh)):
        if inputs.validate is not None and inputs.validate(mesh, microbatches, repeats, schedule):
            continue
        for remat in inputs.remat_options:
            candidate = evaluate(inputs, mesh, microbatches, repeats, remat, gather_once, schedule)
            options.append(candidate)
            if candidate.fits:
                break
    fitting = [c for c in options if c.fits]
    if not options or not (fitting or any_fit):
        return None
    return min(fitting or options, key=lambda c: c.step_s)


def parallelism_kinds(mesh: MeshSpec) -> float:
    """How much parallelism a mesh asks for: a pipeline counts 2, tensor and fsdp 1, data 0.5."""
    return 2 * (mesh.pipeline > 1) + (mesh.tensor > 1) + (mesh.fsdp > 1) + 0.5 * (mesh.data > 1)


def ranked_step_s(candidate: Candidate) -> float:
    """The step time the ranking compares: the predicted one, plus SIMPLICITY_MARGIN per kind of parallelism."""
    return candidate.step_s * (1 + SIMPLICITY_MARGIN * parallelism_kinds(candidate.mesh))


def ranking_key(candidate: Candidate) -> tuple[bool, float]:
    """What the ranking sorts by: fitting first, then `ranked_step_s`."""
    return not candidate.fits, ranked_step_s(candidate)


SCALING_FAMILIES: dict[str, Callable[[int, int], MeshSpec | None]] = {
    "data": lambda n, t: MeshSpec(data=n),
    "fsdp": lambda n, t: MeshSpec(fsdp=n),
    "tensor in node + data": lambda n, t: MeshSpec(data=n // t, tensor=t) if n % t == 0 else None,
    "fsdp in node + data": lambda n, t: MeshSpec(data=n // t, fsdp=t) if n % t == 0 else None,
}
"""Parallelism choices for the scaling table: (devices, GPUs per node) -> mesh."""


def scaling(make_inputs: Callable[[int], PlanInputs], device_counts: list[int]) -> list[dict]:
    """Predicted step time and efficiency for each parallelism family and the planner's best, at a
    fixed global batch and model. Efficiency: images/s per GPU relative to the best choice at the
    smallest device count (1.0 = perfect scaling from there)."""
    rows, base = [], None
    for n in device_counts:
        inputs = make_inputs(n)
        per_node = max(1, n // inputs.nodes)
        picks: dict[str, Candidate | None] = {}
        for name, family in SCALING_FAMILIES.items():
            mesh = family(n, min(per_node, 8))
            picks[name] = best_for_mesh(inputs, mesh) if mesh is not None else None
        ranked = candidates(inputs)
        picks["planner"] = ranked[0] if ranked and ranked[0].fits else None
        for name, pick in picks.items():
            if pick is None:
                rows.append({"devices": n, "choice": name, "mesh": "invalid"})
                continue
            throughput = pick.images_per_s / n
            if base is None:
                base = max(p.images_per_s for p in picks.values() if p is not None) / n
            comm = pick.comm_s["data"] + pick.comm_s["fsdp"]
            rows.append({"devices": n, "choice": name, "mesh": str(pick.mesh), "step_ms": 1e3 * pick.step_s,
                         "efficiency": throughput / base, "fits": pick.fits,
                         "comm_bound": comm > BACKWARD_SHARE * pick.compute_s, "mfu": pick.mfu})
    return rows
