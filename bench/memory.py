"""Per-device memory of a train step: XLA's `memory_analysis()` beside the analytic share.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/memory.py \
        [--preset mars-l16] [--set KEY=VALUE ...] [--mesh SPEC ...] [--json FILE]

Compiled: the step's arguments (parameters, Adam's two moments, the step counter, the batch),
its temporaries and its outputs (donated: aliased to the arguments). Analytic
(`triskele.mesh.cost`): parameters and moments in float32 as the rules shard them, and the
activations the backward keeps under the run's remat policy.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from collectives import DEFAULTS, MESHES
from common import machine, print_table, write_json
from triskele.train.config import make_config
from triskele.train.costs import compile_train_step, example_batch, measure, predict
from triskele.train.run import prepare


def batch_bytes_per_device(batch: dict, devices: int) -> float:
    """The batch is sharded along its rows over data x fsdp; count it as spread over all devices
    it lives on (replicated over tensor and pipeline)."""
    total = 0.0
    for value in batch.values():
        shard = value.sharding.shard_shape(value.shape)
        total += math.prod(shard) * np.dtype(value.dtype).itemsize
    return total


def measure_mesh(preset: str, overrides: list[str], spec: str) -> dict:
    parts = prepare(make_config(preset, [*DEFAULTS, *overrides, f"mesh={spec}"]))
    batch = example_batch(parts)
    compiled, _ = compile_train_step(parts, batch)
    memory = measure(compiled, parts.mesh).memory
    prediction = predict(parts)
    state = memory["argument"] - batch_bytes_per_device(batch, parts.mesh.size)
    analytic_state = prediction.memory["params"] + prediction.memory["optimizer"]
    return {"mesh": spec, "state_MB": state / 1e6, "analytic_state_MB": analytic_state / 1e6,
            "state_ratio": state / analytic_state, "temp_MB": memory["temp"] / 1e6,
            "analytic_activations_MB": prediction.memory["activations"] / 1e6,
            "analytic_gradients_MB": prediction.memory["gradients"] / 1e6,
            "temp_ratio": memory["temp"] / (prediction.memory["gradients"] + prediction.memory["activations"]),
            "aliased_MB": memory["alias"] / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mars-l16")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--mesh", action="append", help=f"mesh spec (default: {', '.join(MESHES)})")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    rows = [measure_mesh(args.preset, args.set, spec) for spec in (args.mesh or MESHES)]
    print(f"{args.preset} ({', '.join([*DEFAULTS, *args.set])}): bytes per device (state = parameters + Adam moments)")
    print_table(rows, ["mesh", "state_MB", "analytic_state_MB", "state_ratio", "temp_MB", "analytic_activations_MB",
                       "analytic_gradients_MB", "temp_ratio", "aliased_MB"])
    print("temp_ratio = XLA's temporaries / (gradients + block activations): the temporaries also hold the "
          "optimizer update's intermediates and the domain head's activations, which the formula leaves out.")
    write_json(args.json, {"preset": args.preset, "overrides": [*DEFAULTS, *args.set], "machine": machine(),
                           "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
