"""Per-device memory of a train step: XLA's `memory_analysis()` beside the analytic share.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/memory.py \
        [--preset mars-l16] [--set KEY=VALUE ...] [--mesh SPEC ...] [--json FILE]

Compiled: the step's arguments (parameters, Adam's two moments, the step counter, the batch),
its temporaries and its outputs (donated: aliased to the arguments). Analytic
(`triskele.mesh.perf.formulas`): parameters and moments in float32 as the rules shard them, and the
activations the backward keeps under the run's remat policy.
"""

from __future__ import annotations

import sys

from common import mesh_bench_main
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.config.overrides import make_config
from triskele.train.run import prepare
from triskele.train.tools.step_analysis import compile_train_step, example_batch, measure, predict, state_bytes


def measure_mesh(preset: str, overrides: list[str], spec: str) -> dict:
    parts = prepare(make_config(preset, [*overrides, f"mesh={spec}"]), choose_mesh=resolve_auto_mesh)
    batch = example_batch(parts)
    compiled, _ = compile_train_step(parts, batch)
    measured = measure(compiled, parts.mesh)
    memory = measured.memory
    prediction = predict(parts)
    state = state_bytes(measured, batch)
    analytic_state = prediction.memory["params"] + prediction.memory["optimizer"]
    return {"mesh": spec, "state_MB": state / 1e6, "analytic_state_MB": analytic_state / 1e6,
            "state_ratio": state / analytic_state, "temp_MB": memory["temp"] / 1e6,
            "analytic_activations_MB": prediction.memory["activations"] / 1e6,
            "analytic_gradients_MB": prediction.memory["gradients"] / 1e6,
            "analytic_weight_temporaries_MB": prediction.memory["weight_temporaries"] / 1e6,
            "temp_ratio": memory["temp"] / (prediction.memory["gradients"] + prediction.memory["activations"]
                                            + prediction.memory["weight_temporaries"]),
            "aliased_MB": memory["alias"] / 1e6}


def main(argv: list[str] | None = None) -> int:
    columns = ["mesh", "state_MB", "analytic_state_MB", "state_ratio", "temp_MB", "analytic_activations_MB",
               "analytic_gradients_MB", "analytic_weight_temporaries_MB", "temp_ratio", "aliased_MB"]
    notes = ("temp_ratio = XLA's temporaries / (gradients + block activations + the step's other weight-sized "
             "buffers, formulas.weight_temporaries_on): the domain head's activations are left out.")
    return mesh_bench_main(__doc__, argv, lambda *a: [measure_mesh(*a)], columns,
                           "bytes per device (state = parameters + Adam moments)", notes)


if __name__ == "__main__":
    sys.exit(main())
