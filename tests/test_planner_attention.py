"""The attention the planner prices is the one the runtime compiles: a fused kernel on GPUs in 16-bit
and FP8 (probabilities on chip, scores recomputed in the backward), XLA's matmuls and softmax
otherwise; and the HBM traffic it prices outside the matmuls against XLA's compiled step."""

import dataclasses

import pytest
from conftest import relative_error
from triskele.mesh.perf.explanation import sequence_terms
from triskele.mesh.perf.formulas import attention_forward_flops, train_flops, training_traffic_bytes
from triskele.mesh.perf.planner import elementwise_bytes, evaluate
from triskele.mesh.perf.transformer_shape import parse_shape
from triskele.mesh.spec import MeshSpec
from triskele.train.config.overrides import make_config
from triskele.train.run import prepare
from triskele.train.tools.plan import main as plan_main
from triskele.train.tools.plan_inputs import plan_inputs, planned_attention, shape_inputs
from triskele.train.tools.step_analysis import compile_train_step, example_batch, measure

LONG = parse_shape("width=2048,depth=24,heads=16,mlp=8192,tokens=4096")


@pytest.mark.parametrize("setting, compute, attention", [
    ("auto", "bfloat16", "fused"), ("auto", "fp8", "fused"), ("auto", "float32", "xla"),
    ("xla", "bfloat16", "xla"), ("cudnn", "float32", "fused")])
def test_the_planned_attention_is_what_the_gpu_compiles(setting, compute, attention):
    assert planned_attention(setting, compute) == attention


def test_a_preset_plans_its_configured_attention():
    fused = plan_inputs(make_config("mars-l16", []), "h100", 8, nodes=1)
    xla = plan_inputs(make_config("mars-l16", ["model.attention=xla"]), "h100", 8, nodes=1)
    full = plan_inputs(make_config("mars-l16", ["precision=float32"]), "h100", 8, nodes=1)
    assert (fused.attention, xla.attention, full.attention) == ("fused", "xla", "xla")


def test_a_fused_kernel_keeps_the_probabilities_off_hbm_and_recomputes_the_scores():
    t, d, a, images = LONG.tokens, LONG.width, LONG.heads, 4
    xla = training_traffic_bytes(LONG, images, attention="xla", probability_bytes=4)
    fused = training_traffic_bytes(LONG, images, attention="fused", probability_bytes=4)
    assert xla - fused == pytest.approx(images * LONG.depth * 18 * a * t * t * 4)  # XLA_PASSES["dots"]
    flops = train_flops(LONG, images)
    mesh = MeshSpec()
    recomputed = flops.executed_per_device(mesh, attention="fused") - flops.executed_per_device(mesh, attention="xla")
    assert recomputed == pytest.approx(images * LONG.depth * 2 * t * t * d)  # Q K^T once more in the backward
    assert flops.attention == pytest.approx(3 * images * LONG.depth * attention_forward_flops(LONG))


def test_the_fused_attention_prices_a_long_sequence_faster_and_its_terms_are_named():
    inputs = shape_inputs(LONG, 192, "h100", 48, nodes=6)
    xla = dataclasses.replace(inputs, attention="xla")
    mesh = MeshSpec(data=24, fsdp=2)
    fused_step, xla_step = evaluate(inputs, mesh, 2, 1, "dots"), evaluate(xla, mesh, 2, 1, "dots")
    assert fused_step.step_s < xla_step.step_s
    assert fused_step.mfu > 0.3 > xla_step.mfu
    fused_terms, xla_terms = sequence_terms(fused_step, inputs), sequence_terms(xla_step, xla)
    assert fused_terms["probability_bytes"] == 0 and xla_terms["probability_bytes"] > 0
    assert xla_step.compute_s - fused_step.compute_s == pytest.approx(
        xla_terms["probability_s"] - (fused_terms["attention_s"] - xla_terms["attention_s"]), rel=1e-6)


def test_plan_prints_the_attention_it_assumed_and_set_changes_it(capsys):
    args = ["--shape", "width=2048,depth=24,heads=16,mlp=8192,tokens=4096", "--devices", "48", "--gpu", "h100",
            "--global-batch", "192", "--nodes", "6", "--top", "1"]
    assert plan_main(args) == 0
    fused = capsys.readouterr().out
    assert "attention: fused kernel" in fused and "keeps the probabilities on chip" in fused
    assert plan_main([*args, "--set", "model.attention=xla"]) == 0
    xla = capsys.readouterr().out
    assert "attention: XLA's matmuls and softmax" in xla and "the probabilities pass through HBM (" in xla
    assert plan_main([*args, "--set", "optim.lr=1"]) == 2
    assert "with --shape, --set takes only model.attention" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["model.image_size=64"], ["model.image_size=128"], ["model.image_size=256"],
    ["model.image_size=128", "model.size=Ti", "model.depth=4"]], ids=["65", "257", "1025", "Ti-257"])
def test_the_traffic_outside_the_matmuls_is_what_xla_compiles(overrides, devices):
    """XLA's path on CPU (float32): the planner's bytes outside the matmuls within 25% of the compiled
    step's (`hlo_counts.elementwise_bytes`, loops by their trip counts) at 65, 257 and 1,025 tokens,
    and for a model whose widths the passes were not read off (ViT-Ti's)."""
    config = make_config("deepfake-tiny", [*overrides, "data.global_batch=128", "precision=float32",
                                           "model.remat=dots"])
    config.mesh = "data=8"
    parts = prepare(config)
    compiled, _ = compile_train_step(parts, example_batch(parts))
    measured = measure(compiled, parts.mesh).program.elementwise_bytes
    inputs = plan_inputs(config, "h100", 8, nodes=1)
    assert inputs.attention == "xla" and inputs.activation_bytes == 4
    planned = elementwise_bytes(inputs, MeshSpec(data=8), 1, 1, "dots")
    assert relative_error(planned, measured) < 0.25, (planned, measured)


def test_the_inference_roofline_reads_no_probabilities_under_a_fused_kernel(capsys):
    from triskele.mesh.perf.hardware import GPUS
    from triskele.mesh.perf.roofline import roofline

    fused = roofline(LONG, 1e9, GPUS["h100"], "bfloat16", 8)
    xla = roofline(LONG, 1e9, GPUS["h100"], "bfloat16", 8, attention="xla")
    probabilities = 8 * LONG.depth * 4 * LONG.heads * LONG.tokens ** 2 * 4  # 4 a t^2 float32 per block and image
    assert (xla.memory_s - fused.memory_s) * GPUS["h100"].memory_bandwidth == pytest.approx(probabilities)
    assert plan_main(["--shape", "width=2048,depth=24,heads=16,mlp=8192,tokens=4096", "--inference", "--gpu", "h100",
                      "--set", "model.attention=xla"]) == 0
    assert "attention: XLA's matmuls and softmax" in capsys.readouterr().out
