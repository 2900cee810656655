"""The planner against Megatron-LM's published runs, the cost of a run, the inference roofline."""

import json

import pytest
from triskele.mesh.perf.hardware import A100_EFFICIENCY, GPUS
from triskele.mesh.perf.planner import OVERLAP_EFFICIENCY
from triskele.mesh.perf.published_h100 import NEMO_H100, TOLERANCE, replay
from triskele.mesh.perf.published_runs import (
    OVERLAP_CALIBRATION_GPUS,
    TABLE1,
    fit_efficiency,
    fit_overlap_efficiency,
    replay_gpt3,
    replay_row,
    vocab_share,
)
from triskele.mesh.perf.roofline import roofline
from triskele.mesh.perf.run_cost import HOURS_PER_YEAR, ownership, run_cost
from triskele.mesh.perf.transformer_shape import parse_shape
from triskele.models import VIT_SIZES
from triskele.train.tools.plan import main as plan_main

KNOWN_TENSOR_MISSES = {18.4: 4, 39.1: 4}
"""The rows with published tensor=8 where the planner picks tensor=4 with a pipeline (2 and 4
stages): it predicts the interleaved pipeline's bubble cheaper than tensor=8's extra all-reduces;
at 18.4B since the overlap efficiency makes the data-parallel all-reduce (halved per GPU by 2
stages) cost 35% of its time even where it hides (README, "The planner against published runs")."""


@pytest.fixture(scope="module")
def table1():
    return {row.params_b: replay_row(row) for row in TABLE1}


def test_the_stated_a100_efficiency_is_the_fit_over_table1():
    assert GPUS["a100"].efficiency == A100_EFFICIENCY == fit_efficiency()


def test_published_tflops_predicted_within_15_percent_on_every_row(table1):
    for params, row in table1.items():
        assert row["published_fits"], params
        assert abs(row["error"]) <= 0.15, (params, row["predicted_tflops"], row["published_tflops"])


def test_picks_match_the_published_parallelism(table1):
    for published in TABLE1:
        row = table1[published.params_b]
        assert published.pipeline / 2 <= row["pick_pipeline"] <= published.pipeline * 2, row
        assert published.tensor / 2 <= row["pick_tensor"] <= published.tensor * 2, row
        if published.tensor == 8:
            expected = KNOWN_TENSOR_MISSES.get(published.params_b, 8)
            assert row["pick_tensor"] == expected, row
    assert sum(r["pick_tensor"] == 8 for r in table1.values()) == 4


NEMO_KNOWN_MISSES = {"GPT3-20B": (-0.40, -0.30)}
"""Rows predicted outside TOLERANCE, with the band their error sits in today. GPT-3 20B (data=32 x
tensor=2 across 8 nodes, 4 accumulation steps): the planner prices its 20 GB gradient all-reduce as
if every ring step left the node over the GPU's own NIC, 1.03 s against 1.22 s of compute, hidden
only behind the last microbatch's backward; NCCL's rings cross each node once (a network share of
(nodes - 1) / (GPUs - 1) brings the row to -16%, but also moves Table 2's ZeRO-3 rows, which the
overlap efficiency is fitted on, out of line)."""


def test_nemos_h100_mfu_is_predicted_within_25_percent_on_the_published_meshes():
    """A table the planner is fitted on nowhere: H100, FP8, fused attention, 2,048 and 4,096 tokens."""
    rows = {row.model + f"@{row.gpus}": replay(row) for row in NEMO_H100}
    assert len(rows) == 6 and TOLERANCE == 0.25
    for name, row in rows.items():
        low, high = NEMO_KNOWN_MISSES.get(row["model"], (-TOLERANCE, TOLERANCE))
        assert low <= row["error"] <= high, (name, row["predicted_mfu"], row["published_mfu"])
    assert sum(abs(r["error"]) <= TOLERANCE for r in rows.values()) == 5


def test_the_stated_overlap_efficiency_is_the_fit_on_table2s_384_gpu_row():
    assert OVERLAP_EFFICIENCY == fit_overlap_efficiency() and OVERLAP_CALIBRATION_GPUS == 384


def test_zero3_against_tensor_and_pipeline_parallelism():
    """Ratios 0.94, 0.59, 0.31 published; predicted 0.938 (the row the overlap efficiency is fitted
    on), 0.587 and 0.317 (with overlap free, 1.16, 0.67, 0.34)."""
    rows = {r["gpus"]: r for r in replay_gpt3()}
    for gpus in (384, 768, 1536):
        assert abs(rows[gpus]["ratio"] - rows[gpus]["published_ratio"]) <= 0.10, rows[gpus]
    for row in rows.values():
        assert abs(row["ptdp_tflops"] / row["published_ptdp"] - 1) <= 0.15, row
    assert rows[384]["ratio"] > rows[768]["ratio"] > rows[1536]["ratio"]


def test_vocabulary_share_follows_the_papers_formula():
    first = TABLE1[0]
    v = 51200 / (16 * first.layers * first.hidden)
    assert vocab_share(first) == pytest.approx(v / (1 + 2048 / (6 * first.hidden) + v))


def test_vit_sizes_of_big_vision_and_vit_22b():
    assert VIT_SIZES["M"] == (512, 12, 2048, 8) and VIT_SIZES["G"] == (1664, 48, 8192, 16)
    assert VIT_SIZES["e"] == (1792, 56, 15360, 16) and VIT_SIZES["22B"] == (6144, 48, 24576, 48)
    shape = parse_shape("width=6144,depth=48,heads=48,mlp=24576,tokens=257")
    assert shape.tokens == 257 and shape.mlp_dim == 24576
    with pytest.raises(ValueError, match="lacks mlp"):
        parse_shape("width=64,depth=2,heads=4,tokens=16")


def test_cost_arithmetic_by_hand():
    owning = ownership(GPUS["h200"], price_per_gpu_hour=6.0, server_price=320_000, years=4, pue=1.5,
                       kwh_price=0.10, host_watts=500)
    cost = run_cost(step_s=0.5, devices=64, global_batch=1024, train_images=1024 * 7200, owning=owning)
    assert cost["steps"] == 7200 and cost["hours"] == pytest.approx(1.0) and cost["gpu_hours"] == pytest.approx(64)
    assert cost["cost_rent_usd"] == pytest.approx(64 * 6.0)
    energy = (700 + 500) / 1000 * 1.5 * 0.10  # 0.18 USD per GPU-hour
    capital = 320_000 / 8 / 4 / HOURS_PER_YEAR
    assert cost["cost_own_usd"] == pytest.approx(64 * (capital + energy))
    assert cost["break_even_hours_per_year"] == pytest.approx(320_000 / 8 / 4 / (6.0 - energy))
    with pytest.raises(ValueError, match="--price-per-gpu-hour"):
        ownership(GPUS["b300"])


VIT_L16 = parse_shape("width=1024,depth=24,heads=16,mlp=4096,tokens=197")
VIT_L16_WEIGHTS = 304e6


def test_roofline_memory_bound_at_batch_one_where_bandwidth_matters():
    rows = {name: roofline(VIT_L16, VIT_L16_WEIGHTS, gpu, "bfloat16", 1) for name, gpu in GPUS.items()}
    for name in ("h100", "b200", "b300"):
        assert rows[name].bound == "memory", rows[name]
        big = roofline(VIT_L16, VIT_L16_WEIGHTS, GPUS[name], "bfloat16", rows[name].compute_bound_from)
        assert big.bound == "compute" and rows[name].compute_bound_from > 1
    # A100 at its fitted efficiency 0.61 (312 TFLOP/s x 0.61 against 2.04 TB/s) and H200 (4.8 TB/s
    # reads the bfloat16 weights in 0.13 ms, its tensor cores need 0.23 ms for ViT-L/16's 123 GFLOPs)
    # are compute-bound from batch 1, with the fused attention keeping the probabilities on chip.
    assert all(rows[n].bound == "compute" and rows[n].compute_bound_from == 1 for n in ("a100", "h200"))
    fp8 = [roofline(VIT_L16, VIT_L16_WEIGHTS, GPUS[n], "fp8", 1) for n in ("h100", "h200")]
    assert all(r.bound == "memory" for r in fp8) and fp8[0].compute_bound_from > fp8[1].compute_bound_from > 1
    assert fp8[1].images_per_sec / fp8[0].images_per_sec == pytest.approx(4.8 / 3.35)
    large = [roofline(VIT_L16, VIT_L16_WEIGHTS, GPUS[n], "bfloat16", 256).images_per_sec for n in ("h100", "h200")]
    assert large[1] / large[0] == pytest.approx(1.0)  # compute-bound: the same tensor cores
    # XLA's attention reads and writes float32 probabilities per image: H200 turns memory-bound at batch 1.
    xla = [roofline(VIT_L16, VIT_L16_WEIGHTS, GPUS[n], "bfloat16", 1, attention="xla") for n in ("h100", "h200")]
    assert all(r.bound == "memory" for r in xla) and xla[1].images_per_sec / xla[0].images_per_sec == \
        pytest.approx(4.8 / 3.35)


def test_plan_command_shape_cost_and_inference(tmp_path, capsys):
    out = tmp_path / "shape"
    assert plan_main(["--shape", "width=4096,depth=36,heads=32,mlp=16384,tokens=2048,vocab=51200", "--devices", "128",
                      "--gpu", "a100", "--network-gbps", "25", "--global-batch", "512", "--axes",
                      "pipeline,data,tensor", "--schedule", "1f1b", "--cost", "--train-images", "1e6",
                      "--output", str(out)]) == 0
    rows = json.loads((out / "plan.json").read_text())
    assert all(r["mesh"] and "fsdp" not in r["mesh"] for r in rows)
    assert {"gpu_hours", "cost_rent_usd", "cost_own_usd"} <= set(rows[0])
    assert rows[0]["cost_rent_usd"] == pytest.approx(rows[0]["gpu_hours"] * GPUS["a100"].price_per_gpu_hour)
    assert "owning is cheaper above" in capsys.readouterr().out
    out = tmp_path / "infer"
    assert plan_main(["--preset", "mars-l16", "--inference", "--batch", "1", "--format", "fp8", "--output",
                      str(out)]) == 0
    rows = json.loads((out / "plan.json").read_text())
    assert len(rows) == len(GPUS) and all(r["bound"] in ("memory", "compute") and r["images_per_sec"] > 0
                                          for r in rows)


@pytest.mark.parametrize("args, message", [
    (["--shape", "width=64", "--devices", "8", "--gpu", "h100", "--global-batch", "8"], "lacks depth"),
    (["--preset", "mars-l16", "--devices", "8", "--gpu", "h100", "--axes", "data,bogus"], "unknown ['bogus']"),
    (["--preset", "mars-l16", "--devices", "8", "--gpu", "h100", "--cost"], "--train-images"),
    (["--preset", "mars-l16", "--devices", "8", "--gpu", "h100", "--network-gbps", "0"], "--network-gbps"),
    (["--preset", "mars-l16", "--inference", "--format", "int4"], "--format 'int4'"),
])
def test_bad_plan_arguments_name_the_flag(args, message, capsys):
    try:
        code = plan_main(args)
    except SystemExit as refused:  # refused by argparse, before the command runs
        code = refused.code
    assert code == 2
    assert message in capsys.readouterr().err
