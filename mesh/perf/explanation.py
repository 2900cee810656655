"""Why the planner's pick is what it is: one line per mesh axis, the sequence length's square-law
terms, the remat policy, and the pipeline against the best choice of the other kind. Read by
`plan` and `--mesh auto`; the ranking itself is `triskele.mesh.perf.planner`'s."""

from __future__ import annotations

import dataclasses

from triskele.mesh.perf.formulas import train_flops
from triskele.mesh.perf.planner import (
    Candidate,
    PlanInputs,
    attention_dtype,
    axis_bandwidth,
    candidates,
    elementwise_bytes,
    ranking_key,
)


def explain(best: Candidate, inputs: PlanInputs, ranked: list[Candidate] | None = None, records: str = "images"
            ) -> list[str]:
    """One line per axis: why the top choice uses it as it does. `ranked`: the ranking it tops
    (`candidates(inputs)`), against whose best other choice the pipeline line compares it; `records`:
    what the batch holds (images, or a token workload's sequences)."""
    mesh, lines = best.mesh, []
    ranked = candidates(inputs) if ranked is None else ranked
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
        f"{mesh.data} replicas, {inputs.global_batch // mesh.batch_shards} {records} per GPU; the gradient all-reduce "
        f"({1e3 * best.comm_s['data']:.1f} ms over "
        f"{'NVLink' if axis_bandwidth(mesh, 'data', inputs) == inputs.gpu.nvlink_bandwidth else 'the network'})"
        f" overlaps the backward" if mesh.data > 1 else "no pure data parallelism"))
    lines.append(f"pipeline={mesh.pipeline}: " + pipeline_reason(best, ranked))
    lines.append(sequence_line(best, inputs))
    lines.append(f"remat={best.remat}: " + {
        "none": "every activation fits, nothing is recomputed",
        "dots": "matmul outputs are kept, the elementwise ops recomputed (no extra matmul FLOPs)",
        "full": "only block inputs are kept: the forward is recomputed (+1/3 block FLOPs) to fit memory"}[best.remat])
    return lines


def sequence_terms(best: Candidate, inputs: PlanInputs) -> dict[str, float]:
    """The pick's costs that grow with the square of the sequence length, per device and step: the
    attention matmuls' seconds (`attention_s`, at the attention's own peak) and the probabilities'
    HBM bytes and seconds (`probability_bytes`, `probability_s`: 0 where a fused kernel keeps them on chip)."""
    mesh, remat, repeats = best.mesh, best.remat, best.repeats
    microbatches = best.microbatches if mesh.pipeline > 1 else 1
    runs = "circular" if inputs.megatron_1f1b else best.schedule
    attention = train_flops(inputs.shape, inputs.global_batch).attention_executed_per_device(
        mesh, microbatches, repeats, remat, runs, inputs.attention)
    attention_s = attention / (inputs.gpu.peak_flops[attention_dtype(inputs.compute)] * inputs.efficiency)
    on_chip = dataclasses.replace(inputs, attention="fused")
    probabilities = (elementwise_bytes(inputs, mesh, microbatches, repeats, remat, runs)
                     - elementwise_bytes(on_chip, mesh, microbatches, repeats, remat, runs))
    return {"attention_s": attention_s, "probability_bytes": probabilities,
            "probability_s": probabilities / inputs.gpu.memory_bandwidth}


def sequence_line(best: Candidate, inputs: PlanInputs) -> str:
    """The explanation's line on the sequence length: what its square-law terms cost at this shape."""
    terms = sequence_terms(best, inputs)
    tokens = inputs.shape.tokens
    line = (f"sequence {tokens} tokens: the attention matmuls (growing with tokens^2) take "
            f"{1e3 * terms['attention_s']:.1f} ms ({terms['attention_s'] / best.step_s:.1%} of the step); ")
    if inputs.attention == "fused":
        return line + "the fused attention kernel keeps the probabilities on chip (no HBM traffic for them)"
    return line + (f"the probabilities pass through HBM ({terms['probability_bytes'] / 1e9:.2f} GB per GPU, "
                   f"{1e3 * terms['probability_s']:.1f} ms, {terms['probability_s'] / best.step_s:.1%} of the step)")


def pipeline_reason(best: Candidate, ranked: list[Candidate]) -> str:
    """Why the top choice has a pipeline or none: its schedule and bubble against the best choice
    of the other kind (faster, or the only kind that fits)."""
    others = [c for c in ranked if (c.mesh.pipeline > 1) != (best.mesh.pipeline > 1)]
    other = min(others, key=ranking_key) if others else None
    if best.mesh.pipeline == 1:
        reason = "no pipeline: the model fits without splitting its layers, so no bubble is paid"
        if other is not None and other.fits:
            reason += (f" (the best pipeline, {other.mesh} {other.schedule}, is predicted "
                       f"{1e3 * other.step_s:.1f} ms/step against {1e3 * best.step_s:.1f})")
        return reason
    reason = (f"{best.mesh.pipeline} stages, {best.microbatches} microbatches, {best.repeats} repeat(s), "
              f"schedule {best.schedule}: bubble {best.bubble:.1%}; ")
    if other is None:
        return reason + "no mesh without a pipeline is valid"
    if not other.fits:
        return reason + (f"without a pipeline nothing fits (the best, {other.mesh}, needs "
                         f"{other.memory.total / 1e9:.1f} GB per GPU)")
    return reason + (f"it wins over the best mesh without one, {other.mesh} ({1e3 * other.step_s:.1f} ms/step "
                     f"against {1e3 * best.step_s:.1f}: {1e3 * other.exposed_comm_s:.1f} ms of its "
                     f"communication exposed against {1e3 * best.exposed_comm_s:.1f})")
