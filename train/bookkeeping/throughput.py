"""The loop's MFU meter: what the run's compiled step's speed means (model FLOPs per device from
the performance model's formulas, the compiled program's FLOPs from its HLO, the device's peak)."""

from __future__ import annotations

import jax
from triskele.mesh.perf.hardware import peak_flops
from triskele.mesh.perf.hlo_counts import program_cost
from triskele.train.precision import matmul_dtype
from triskele.train.run import RunParts
from triskele.train.tools.step_analysis import compile_train_step, predict


class StepThroughput:
    """The run's compiled step and what its speed means: model FLOPs per device per step (the
    analytic formula, which counts no rematerialisation and no pipeline bubble: the FLOPs MFU
    divides by peak), the FLOPs the compiled program runs (from its HLO, loops counted in full),
    and the device's peak for the run's compute dtype where the table knows it."""

    def __init__(self, parts: RunParts):
        self.parts = parts
        self.model_flops = predict(parts).model_flops_per_device
        self.peak = peak_flops(jax.devices()[0], matmul_dtype(parts.config.precision))
        self.hlo_flops: float | None = None
        self.compile_seconds: float | None = None

    def compile(self, batch: dict[str, jax.Array]):
        """The train step compiled ahead of time for the run's state layout and this batch."""
        compiled, self.compile_seconds = compile_train_step(self.parts, batch)
        self.hlo_flops = program_cost(compiled.as_text(), self.parts.mesh.size).flops
        return compiled

    def describe(self) -> str:
        kind = jax.devices()[0].device_kind
        peak = f"peak {self.peak / 1e12:.0f} TFLOP/s" if self.peak else f"peak unknown for {kind}: no MFU"
        return (f"step: compiled in {self.compile_seconds:.1f} s; model FLOPs per device per step "
                f"{self.model_flops:.4g} (analytic formula), compiled program {self.hlo_flops:.4g} (HLO, with "
                f"rematerialisation and pipeline bubble); {peak}")

    def record(self, step_seconds: float) -> dict[str, float]:
        """`tflops_per_device` (achieved model TFLOP/s) and `mfu` (where the peak is known)."""
        achieved = self.model_flops / step_seconds
        return {"tflops_per_device": achieved / 1e12, **({"mfu": achieved / self.peak} if self.peak else {})}
