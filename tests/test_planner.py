"""The mesh planner's formulas against XLA's compiled step, its choices, and its command line."""

import json

import pytest
from conftest import relative_error
from triskele.mesh.perf.planner import candidates, evaluate
from triskele.mesh.spec import MeshSpec
from triskele.train.config.overrides import make_config
from triskele.train.config.validate import validate
from triskele.train.run import prepare
from triskele.train.tools.plan import main as plan_main
from triskele.train.tools.plan_inputs import abstract_mesh, plan_inputs
from triskele.train.tools.step_analysis import compile_train_step, example_batch, measure, state_bytes

# ViT-L's width and 16 heads (so tensor=8 is valid), 4 blocks at 64 px: compiles in seconds on CPU.
# float32, as the CPU compiles it, so activation bytes agree.
SMALL_L = ["model.depth=4", "model.image_size=64", "data.global_batch=32", "precision=float32"]


def compiled_costs(config, spec):
    config.mesh = spec
    parts = prepare(config)
    batch = example_batch(parts)
    compiled, _ = compile_train_step(parts, batch)
    measured = measure(compiled, parts.mesh)
    return measured, state_bytes(measured, batch)


@pytest.mark.parametrize("spec", ["data=8", "tensor=8", "data=2,fsdp=2,tensor=2", "pipeline=2,data=4"])
@pytest.mark.parametrize("remat", ["dots", "full"])
def test_predictions_agree_with_the_compiled_step(spec, remat, devices):
    config = make_config("mars-l16", [*SMALL_L, f"model.remat={remat}"])
    inputs = plan_inputs(config, "h200", 8, nodes=1)
    mesh = MeshSpec.parse(_sizes(spec))
    predicted = evaluate(inputs, mesh, config.pipeline.microbatches if mesh.pipeline > 1 else 1, 1, remat)
    measured, state_bytes = compiled_costs(config, spec)
    assert relative_error(predicted.executed_flops, measured.program.flops) < 0.1
    assert relative_error(predicted.memory.params + predicted.memory.optimizer, state_bytes) < 0.1
    if spec in ("data=8", "tensor=8"):
        total = sum(measured.program.collective_bytes.values())
        assert total > 0 and relative_error(sum(predicted.collective_bytes.values()), total) < 0.1


def _sizes(spec: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=") for item in spec.split(","))}


def test_every_proposed_mesh_passes_validation():
    config = make_config("deepfake-b16", ["data.global_batch=96"])
    ranked = candidates(plan_inputs(config, "h100", 24, nodes=3))
    assert ranked
    for candidate in ranked:
        trial = make_config("deepfake-b16", ["data.global_batch=96", f"pipeline.microbatches={candidate.microbatches}",
                                             f"pipeline.repeats={candidate.repeats}"])
        validate(trial, abstract_mesh(candidate.mesh))  # raises if the run would refuse it
    # 12 heads: tensor=8 would fail validation, so it is never among the candidates.
    assert all(12 % c.mesh.tensor == 0 for c in ranked)


def test_one_node_and_a_model_that_fits_takes_no_pipeline():
    best = candidates(plan_inputs(make_config("mars-l16", ["data.global_batch=256"]), "h200", 8, nodes=1))[0]
    assert best.fits and best.mesh.pipeline == 1


def test_a_model_too_big_for_data_parallelism_alone_gets_fsdp_or_tensor():
    config = make_config("mars-l16", ["data.global_batch=64"])
    inputs = plan_inputs(config, "h100", 8, nodes=1, memory_gb=4.0)
    data_only = evaluate(inputs, MeshSpec(data=8), 1, 1, "full")
    assert not data_only.fits, "the test needs a model whose replicated state exceeds 4 GB"
    best = candidates(inputs)[0]
    assert best.fits and (best.mesh.fsdp > 1 or best.mesh.tensor > 1)


def test_plan_command_prints_a_pick_and_writes_json(tmp_path, capsys):
    code = plan_main(["--preset", "mars-l16", "--devices", "64", "--gpu", "h200", "--global-batch", "1024",
                      "--nodes", "8", "--output", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pick: --mesh " in out and "pipeline=" in out
    rows = json.loads((tmp_path / "plan.json").read_text())
    assert rows and rows[0]["fits"] == "yes"


def test_scaling_mode_writes_the_plot(tmp_path, capsys):
    assert plan_main(["--preset", "mars-b16", "--gpu", "b200", "--global-batch", "512", "--scaling",
                      "--output", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "scaling.json").read_text())
    data = [r for r in rows if r["choice"] == "data" and "step_ms" in r]
    assert [r["devices"] for r in data][:3] == [8, 16, 32]
    assert not data[0]["comm_bound"] and data[-1]["comm_bound"], "data parallelism turns communication-bound"
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["--gpu", "v100", "--devices", "8"], "unknown GPU 'v100'; known GPUs: a100, h100, h200, b200, b300"),
    (["--gpu", "h100", "--devices", "12", "--nodes", "5"], "--devices 12 is not divisible by --nodes 5"),
    (["--gpu", "h100"], "--devices is required"),
])
def test_bad_arguments_exit_2(args, message, capsys):
    assert plan_main(["--preset", "mars-tiny", *args]) == 2
    assert message in capsys.readouterr().err


def test_gradient_accumulation_is_priced_as_it_runs(devices):
    """The planner counts the data-parallel all-reduce once per step at any grad_accum; so does the
    compiled step (an all-reduce per microbatch would send 4x the bytes at grad_accum 4)."""
    config = make_config("mars-l16", [*SMALL_L, "optim.grad_accum=4"])
    predicted = evaluate(plan_inputs(config, "h200", 8, nodes=1), MeshSpec(data=8), 4, 1, "dots")
    measured, _ = compiled_costs(config, "data=8")
    compiled = measured.program.collective_bytes["all-reduce"]
    assert relative_error(predicted.collective_bytes["all-reduce"], compiled) < 0.1


def printed_table(out: str) -> list[dict[str, str]]:
    """The ranking `plan` printed: one dict per row, cells cut at the header's column starts."""
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("mesh "))
    header = lines[first]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    names = [header[a:b].strip() for a, b in bounds]
    rows = []
    for line in lines[first + 1:]:
        if not line.strip():
            break
        rows.append({name: line[a:b].strip() for name, (a, b) in zip(names, bounds, strict=True)})
    return rows


@pytest.mark.parametrize("args, throughput", [
    (["--preset", "mars-l16", "--devices", "64", "--gpu", "h200", "--global-batch", "1024", "--nodes", "8"],
     "images_per_s"),
    (["--shape", "width=4096,depth=36,heads=32,mlp=16384,tokens=2048", "--devices", "128", "--gpu", "a100",
      "--global-batch", "512"], "tokens_per_s"),
])
def test_the_ranking_is_printed_in_its_order_and_its_workload_units(args, throughput, capsys):
    assert plan_main([*args, "--top", "1000"]) == 0
    out = capsys.readouterr().out
    assert "in the planner's order: meshes that fit first, then by rank_ms" in out
    rows = printed_table(out)
    other = ({"images_per_s", "tokens_per_s"} - {throughput}).pop()
    assert len(rows) > 5 and throughput in rows[0] and other not in rows[0]
    order = [(row["fits"] != "yes", float(row["rank_ms"])) for row in rows]
    assert order == sorted(order)
    assert [float(row["step_ms"]) for row in rows] != sorted(float(row["step_ms"]) for row in rows), \
        "the example should show a ranking that differs from step time alone"


def test_a_token_workloads_explanation_counts_sequences_not_images(capsys):
    from triskele.train.cli import main as train_main

    assert train_main(["plan", "--shape", "width=512,depth=4,heads=8,mlp=2048,tokens=1024", "--devices", "8",
                       "--gpu", "h100", "--global-batch", "64"]) == 0
    out = capsys.readouterr().out
    assert "8 sequences per GPU" in out and "images per GPU" not in out
