"""Published GPU runs replayed through the planner: Megatron-LM's (Narayanan et al., SC21, A100)
and NeMo's H100 table (24.07, FP8).

    python bench/published.py [--efficiency E] [--json FILE]

Table 1: per row, the planner's pick for the row's GPUs and batch (over Megatron-LM's own choices,
pipeline x data x tensor, and with fsdp allowed), and the predicted teraFLOP/s per GPU of the
published mesh and of the pick, against the published figure; the A100 efficiency is fitted once
over the rows (the one value that minimises the largest error) unless `--efficiency` is given.
Table 2: GPT-3 175B, ZeRO-3 (fsdp only) against tensor 8 x pipeline 12 x data at 384, 768 and
1,536 GPUs, and the ratio of the two; the planner's overlap efficiency is fitted on its 384-GPU row
(and printed), the other two rows judge it. NeMo's H100 table: predicted against published MFU on
each row's published mesh, the planner fitted on none of it. Predictions only: nothing here runs on a GPU.
"""

from __future__ import annotations

import argparse
import sys

from common import print_table, write_json
from triskele.mesh.perf.hardware import GPUS
from triskele.mesh.perf.planner import OVERLAP_EFFICIENCY
from triskele.mesh.perf.published_h100 import NEMO_H100, SOURCE, replay
from triskele.mesh.perf.published_runs import (
    OVERLAP_CALIBRATION_GPUS,
    TABLE1,
    fit_efficiency,
    fit_overlap_efficiency,
    replay_gpt3,
    replay_row,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--efficiency", type=float, help="A100 matmul efficiency (default: fitted over Table 1)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    overlap = fit_overlap_efficiency()
    print(f"overlap efficiency fitted on Table 2 at {OVERLAP_CALIBRATION_GPUS} GPUs: {overlap} (the planner "
          f"states {OVERLAP_EFFICIENCY})")
    fitted = fit_efficiency()
    efficiency = args.efficiency or fitted
    print(f"A100 efficiency fitted over Table 1: {fitted} (the GPU table states {GPUS['a100'].efficiency}); "
          f"using {efficiency}")
    table1 = [replay_row(row, efficiency) for row in TABLE1]
    print("\nTable 1 (Megatron-LM weak scaling): published vs predicted teraFLOP/s per GPU")
    print_table(table1, ["params_b", "gpus", "batch", "published_mesh", "published_schedule", "published_tflops",
                         "predicted_tflops", "error", "published_memory_GB", "pick", "pick_tflops", "pick_with_fsdp",
                         "fsdp_pick_tflops", "vocab_share"])
    worst = max(abs(r["error"]) for r in table1)
    print(f"largest error {worst:.1%}")
    table2 = replay_gpt3(efficiency)
    print("\nTable 2 (GPT-3 175B, batch 1536): ZeRO-3 vs tensor 8 x pipeline 12 x data, teraFLOP/s per GPU")
    print_table(table2, ["gpus", "published_ptdp", "ptdp_tflops", "published_zero3", "zero3_tflops",
                         "published_ratio", "ratio"])
    nemo = [replay(row) for row in NEMO_H100]
    print(f"\n{SOURCE}: published vs predicted MFU (model FLOP/s over the FP8 peak) on the published mesh")
    print_table(nemo, ["model", "gpus", "batch", "tokens", "published_mesh", "schedule", "published_tflops",
                       "published_mfu", "predicted_mfu", "error"])
    write_json(args.json, {"efficiency": efficiency, "fitted_efficiency": fitted, "table1": table1, "table2": table2,
                           "nemo_h100": nemo})
    return 0


if __name__ == "__main__":
    sys.exit(main())
