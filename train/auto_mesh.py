"""`--mesh auto`: the planner's pick for the job's own devices, with its reasons.

On GPUs the planner knows (`triskele.mesh.perf.hardware`, from the device kind) the run takes the
planner's best fitting configuration: its mesh, pipeline schedule or gradient accumulation, and
remat policy. Elsewhere (CPU, an unknown accelerator) it takes the simplest mesh the run's
validation accepts: as few kinds of parallelism as possible, `data` first.

The run's engine (`triskele.train.run.prepare`) does not import the planner: `train()` and
`evaluate_checkpoint` hand it `resolve_auto_mesh` for a config whose mesh is `auto`.
"""

from __future__ import annotations

import dataclasses

import jax
from triskele.mesh.perf.explanation import explain
from triskele.mesh.perf.hardware import gpu_of_device
from triskele.mesh.perf.planner import BEST_SCHEDULE, candidates, meshes, parallelism_kinds
from triskele.mesh.spec import AUTO, MeshSpec
from triskele.train.config.schema import Config
from triskele.train.config.validate import validate
from triskele.train.tools.plan_inputs import abstract_mesh, apply_pick, pick_flags, plan_inputs

__all__ = ["AUTO", "resolve_auto_mesh"]


def _simplicity(mesh: MeshSpec) -> tuple:
    return parallelism_kinds(mesh), -mesh.data, -mesh.fsdp, -mesh.tensor


def _simplest(config: Config, devices: int) -> tuple[Config, list[str]]:
    refused = []
    for mesh in sorted(meshes(devices), key=_simplicity):
        trial = dataclasses.replace(config, mesh=str(mesh))
        try:
            validate(trial, abstract_mesh(mesh))
        except ValueError as err:
            refused.append(f"{mesh}: {err}")
            continue
        skipped = f" ({len(refused)} simpler meshes refused, e.g. {refused[0]})" if refused else ""
        return trial, [f"the simplest mesh this run accepts on {devices} devices, data first{skipped}"]
    raise ValueError(f"--mesh auto: no mesh of {devices} devices passes validation; e.g. {refused[0]}")


def resolve_auto_mesh(config: Config, devices: list[jax.Device] | None = None) -> tuple[Config, list[str]]:
    """`config` with `mesh` (and, from the planner, the schedule and remat) chosen for `devices`,
    and the lines that say why."""
    devices = list(jax.devices() if devices is None else devices)
    gpu = gpu_of_device(devices[0])
    if gpu is None:
        chosen, why = _simplest(config, len(devices))
        return chosen, [f"--mesh auto on {len(devices)} x {devices[0].device_kind}: {chosen.mesh}: {why[0]}"]
    hosts = len({d.process_index for d in devices})
    inputs = plan_inputs(config, gpu, len(devices), nodes=hosts, nvlink_domain=len(devices) // hosts,
                         schedule=BEST_SCHEDULE)
    everything = candidates(inputs)
    ranked = [c for c in everything if c.fits]
    if not ranked:
        raise ValueError(f"--mesh auto: nothing fits on {len(devices)} x {gpu.name} at global batch "
                         f"{config.data.global_batch}; lower data.global_batch or add devices")
    best = ranked[0]
    chosen = apply_pick(config, best)
    lines = [f"--mesh auto on {len(devices)} x {gpu.name}: {pick_flags(best)} (predicted {1e3 * best.step_s:.1f} "
             f"ms/step, {best.memory.total / 1e9:.1f} GB per GPU)"]
    return chosen, lines + ["  " + line for line in explain(best, inputs, everything)]
