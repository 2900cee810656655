"""The mesh planner: which `pipeline, data, fsdp, tensor` sizes to use for a model on N GPUs.

For every way of splitting the devices over the four axes that the run's validation accepts, and
for every pipeline schedule and remat policy worth trying, it predicts with `triskele.mesh.cost`:
memory per device, compute time (FLOPs the device executes / (peak x efficiency)), communication
time (bytes / bandwidth of the link each axis crosses: NVLink inside a domain, the network
across domains) and the pipeline bubble. Step time = compute + tensor and pipeline communication
(on the critical path) + whatever data/fsdp communication the backward cannot hide (it overlaps
with the backward, two thirds of the compute). Configurations that do not fit in memory are
marked; the rest are ranked by predicted step time, a mesh with fewer kinds of parallelism
winning unless another is predicted more than `SIMPLICITY_MARGIN` faster.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from triskele.mesh.cost import (
    ModelShape,
    ParamBytes,
    StepMemory,
    bubble_fraction,
    step_collectives,
    step_memory,
    train_flops,
)
from triskele.mesh.hardware import Gpu
from triskele.mesh.spec import MeshSpec

REMAT_ORDER = ("none", "dots", "full")
BACKWARD_SHARE = 2 / 3
"""Share of a step's compute that data-parallel communication can hide behind (the backward)."""
USABLE_MEMORY = 0.9
"""Share of the GPU's memory a step may plan to use (the rest: XLA's workspace, fragmentation)."""
SIMPLICITY_MARGIN = 0.03
"""A mesh with fewer kinds of parallelism is preferred unless another is predicted this much faster:
pipeline stages pay imbalance and buffer memory, and tensor parallelism latency, that the
formulas leave out."""


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
    """The compute dtype (its peak and activation size): float32, bfloat16 or fp8."""
    efficiency: float = 0.5
    """Share of peak FLOP/s the matmuls reach."""
    param_bytes: Callable[[MeshSpec], ParamBytes] | None = None
    """A device's share of the parameters on a mesh (from the model's logical axis names)."""
    validate: Callable[[MeshSpec, int, int], str | None] | None = None
    """(mesh, microbatches, repeats) -> an error message, or None when the run would accept it."""
    memory_bytes: float | None = None
    """GPU memory to plan for (default: the GPU's)."""

    @property
    def activation_bytes(self) -> int:
        return 4 if self.compute == "float32" else 2


@dataclasses.dataclass
class Candidate:
    mesh: MeshSpec
    microbatches: int
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

    def row(self) -> dict:
        return {"mesh": str(self.mesh), "microbatches": self.microbatches if self.mesh.pipeline > 1 else "",
                "remat": self.remat, "memory_GB": self.memory.total / 1e9, "fits": "yes" if self.fits else "NO",
                "compute_ms": 1e3 * self.compute_s, "comm_ms": 1e3 * sum(self.comm_s.values()),
                "exposed_comm_ms": 1e3 * self.exposed_comm_s, "bubble": self.bubble, "step_ms": 1e3 * self.step_s,
                "images_per_s": self.images_per_s, "mfu": self.mfu}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def meshes(devices: int) -> list[MeshSpec]:
    """Every (pipeline, data, fsdp, tensor) whose product is `devices`."""
    out = []
    for pipeline, data, fsdp in itertools.product(divisors(devices), repeat=3):
        if devices % (pipeline * data * fsdp) == 0:
            out.append(MeshSpec(pipeline, data, fsdp, devices // (pipeline * data * fsdp)))
    return out


def axis_bandwidth(mesh: MeshSpec, axis: str, inputs: PlanInputs) -> float:
    """NVLink when the axis's groups stay inside an NVLink domain, else the network. Devices are
    numbered with `tensor` innermost, then fsdp, data, pipeline (as `make_mesh` lays them out)."""
    order = ("tensor", "fsdp", "data", "pipeline")
    stride = 1
    for name in order:
        size = getattr(mesh, name)
        if name == axis:
            inside = stride * size <= inputs.nvlink_domain
            return inputs.gpu.nvlink_bandwidth if inside else inputs.gpu.network_bandwidth
        stride *= size
    raise ValueError(f"unknown mesh axis {axis!r}")


def schedules(mesh: MeshSpec, inputs: PlanInputs) -> list[tuple[int, int]]:
    """(microbatches, repeats) to try: 1, 1 without a pipeline; else M in P, 2P, 4P, 8P and v in 1, 2."""
    if mesh.pipeline == 1:
        return [(1, 1)]
    return [(m * mesh.pipeline, v) for m in (1, 2, 4, 8) for v in (1, 2)]


def evaluate(inputs: PlanInputs, mesh: MeshSpec, microbatches: int, repeats: int, remat: str) -> Candidate:
    shape, batch = inputs.shape, inputs.global_batch
    params = inputs.param_bytes(mesh)
    act = inputs.activation_bytes
    memory = step_memory(shape, mesh, batch, params, act, remat)
    budget = (inputs.memory_bytes or inputs.gpu.memory_bytes) * USABLE_MEMORY
    flops = train_flops(shape, batch)
    peak = inputs.gpu.peak_flops[inputs.compute] * inputs.efficiency
    compute = flops.executed_per_device(mesh, microbatches, repeats, remat) / peak
    sent = step_collectives(shape, mesh, batch, params, act, microbatches, repeats, remat)
    bandwidth = {axis: axis_bandwidth(mesh, axis, inputs) for axis in ("data", "fsdp", "tensor", "pipeline")}
    comm = {
        "data": sent.data_all_reduce / bandwidth["data"],
        "fsdp": (sent.fsdp_all_gather + sent.fsdp_reduce_scatter) / bandwidth["fsdp"],
        "tensor": (sent.tensor_all_reduce + sent.tensor_all_gather) / bandwidth["tensor"],
        "pipeline": (sent.pipeline_permute + sent.pipeline_broadcast) / bandwidth["pipeline"],
    }
    hidden = BACKWARD_SHARE * compute
    exposed = comm["tensor"] + comm["pipeline"] + max(0.0, comm["data"] + comm["fsdp"] - hidden)
    step = compute + exposed
    model_flops = flops.per_device(mesh)
    return Candidate(
        mesh=mesh, microbatches=microbatches, repeats=repeats, remat=remat, memory=memory,
        fits=memory.total <= budget, compute_s=compute, comm_s=comm, exposed_comm_s=exposed, step_s=step,
        bubble=bubble_fraction(mesh.pipeline, repeats, microbatches) if mesh.pipeline > 1 else 0.0,
        mfu=model_flops / (step * inputs.gpu.peak_flops[inputs.compute]), images_per_s=batch / step,
        executed_flops=flops.executed_per_device(mesh, microbatches, repeats, remat),
        collective_bytes=sent.by_kind(),
    )


def candidates(inputs: PlanInputs) -> list[Candidate]:
    """Per valid mesh, its fastest schedule with the lightest remat policy that fits (or, if none
    fits, with `full` remat, marked as not fitting); sorted: fitting first, then by step time."""
    chosen = []
    for mesh in meshes(inputs.devices):
        options = []
        for microbatches, repeats in schedules(mesh, inputs):
            if inputs.validate is not None and inputs.validate(mesh, microbatches, repeats):
                continue
            for remat in REMAT_ORDER:
                candidate = evaluate(inputs, mesh, microbatches, repeats, remat)
                options.append(candidate)
                if candidate.fits:
                    break
        if options:
            fitting = [c for c in options if c.fits]
            chosen.append(min(fitting or options, key=lambda c: c.step_s))
    return sorted(chosen, key=_ranking)


def _ranking(candidate: Candidate) -> tuple[bool, float]:
    mesh = candidate.mesh
    kinds = 2 * (mesh.pipeline > 1) + (mesh.tensor > 1) + (mesh.fsdp > 1) + 0.5 * (mesh.data > 1)
    return not candidate.fits, candidate.step_s * (1 + SIMPLICITY_MARGIN * kinds)


def explain(best: Candidate, inputs: PlanInputs) -> list[str]:
    """One line per axis: why the top choice uses it as it does."""
    mesh, lines = best.mesh, []
    domain = "NVLink" if axis_bandwidth(mesh, "tensor", inputs) == inputs.gpu.nvlink_bandwidth else "the network"
    lines.append(f"tensor={mesh.tensor}: " + (
        f"splits each block's matmuls over {mesh.tensor} GPUs inside {domain}; its activation all-reduces "
        f"({1e3 * best.comm_s['tensor']:.1f} ms) are on the critical path" if mesh.tensor > 1 else
        "no tensor parallelism: its per-block activation all-reduces would cost more than they save"))
    lines.append(f"fsdp={mesh.fsdp}: " + (
        f"shards parameters and Adam state {mesh.fsdp} ways ({best.memory.total / 1e9:.1f} GB per GPU); gathers and "
        f"reduce-scatters ({1e3 * best.comm_s['fsdp']:.1f} ms) overlap the backward" if mesh.fsdp > 1 else
        "no fsdp: the full parameters and optimizer state fit on each GPU"))
    lines.append(f"data={mesh.data}: " + (
        f"{mesh.data} replicas, {inputs.global_batch // mesh.batch_shards} images per GPU; the gradient all-reduce "
        f"({1e3 * best.comm_s['data']:.1f} ms over "
        f"{'NVLink' if axis_bandwidth(mesh, 'data', inputs) == inputs.gpu.nvlink_bandwidth else 'the network'})"
        f" overlaps the backward" if mesh.data > 1 else "no pure data parallelism"))
    lines.append(f"pipeline={mesh.pipeline}: " + (
        f"{mesh.pipeline} stages, {best.microbatches} microbatches, {best.repeats} repeat(s): bubble "
        f"{best.bubble:.1%}" if mesh.pipeline > 1 else
        "no pipeline: the model fits without splitting its layers, so no bubble is paid"))
    lines.append(f"remat={best.remat}: " + {
        "none": "every activation fits, nothing is recomputed",
        "dots": "matmul outputs are kept, the elementwise ops recomputed (no extra matmul FLOPs)",
        "full": "only block inputs are kept: the forward is recomputed (+1/3 block FLOPs) to fit memory"}[best.remat])
    return lines


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
            picks[name] = _best_for_mesh(inputs, mesh) if mesh is not None else None
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


def _best_for_mesh(inputs: PlanInputs, mesh: MeshSpec) -> Candidate | None:
    if inputs.validate is not None and inputs.validate(mesh, 1, 1):
        return None
    options = [evaluate(inputs, mesh, 1, 1, remat) for remat in REMAT_ORDER]
    fitting = [c for c in options if c.fits]
    return min(fitting, key=lambda c: c.step_s) if fitting else None
