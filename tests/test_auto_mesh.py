"""`--mesh auto`: the planner's pick (here, on CPU: the simplest valid mesh) for the job's devices."""

import json

import pytest
from trainutil import small_config
from triskele.eval.report import evaluate_checkpoint
from triskele.mesh.perf.hardware import GPUS
from triskele.mesh.perf.planner import BEST_SCHEDULE, candidates
from triskele.train import train
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.config.overrides import make_config
from triskele.train.tools.plan_inputs import plan_inputs


@pytest.mark.slow
def test_auto_mesh_trains_resumes_and_evaluates(tmp_path, devices, capsys):
    config = small_config(mesh="auto", **{"run.steps": 4, "run.eval_every": 0})
    train(config, workdir=tmp_path, progress=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["mesh"] == "data=8"
    assert "--mesh auto on 8 x cpu: data=8" in capsys.readouterr().out
    resumed = train(small_config(mesh="auto", **{"run.steps": 6, "run.eval_every": 0}), workdir=tmp_path,
                    progress=False)
    assert (resumed.first_step, resumed.final_step) == (5, 6)
    report = evaluate_checkpoint(tmp_path, mesh="auto")
    assert report["mesh"]["data"] == 8 and report["step"] == 6


def test_auto_mesh_skips_meshes_the_run_refuses(devices):
    chosen, why = resolve_auto_mesh(small_config(**{"data.global_batch": 4}))
    assert chosen.mesh == "data=4,tensor=2" and "refused" in why[0]  # data x fsdp must divide the batch


class FakeGpu:
    device_kind = "NVIDIA H200"

    def __init__(self, process_index: int = 0):
        self.process_index = process_index


def test_auto_mesh_on_a_known_gpu_takes_the_planners_pick():
    chosen, lines = resolve_auto_mesh(small_config(preset="mars-l16"), [FakeGpu() for _ in range(8)])
    assert lines[0].startswith(f"--mesh auto on 8 x {GPUS['h200'].name}: --mesh {chosen.mesh}")
    assert any(line.strip().startswith("tensor=") for line in lines[1:])
    config = small_config(preset="mars-l16")
    best = next(c for c in candidates(plan_inputs(config, "h200", 8, nodes=1, schedule=BEST_SCHEDULE)) if c.fits)
    assert chosen.mesh == str(best.mesh) and chosen.model.remat == best.remat


def test_auto_mesh_picks_a_pipeline_where_it_wins_and_says_why():
    """ViT-22B on 8 nodes of 8 H200 at batch 256: the planner's pick has a pipeline (its schedule
    recorded in the config), and the pipeline line compares it with the best mesh without one."""
    config = make_config("mars-l16", {"model.size": "22B", "data.global_batch": 256})
    chosen, lines = resolve_auto_mesh(config, [FakeGpu(i // 8) for i in range(64)])
    best = next(c for c in candidates(plan_inputs(config, "h200", 64, nodes=8, schedule=BEST_SCHEDULE)) if c.fits)
    assert best.mesh.pipeline > 1 and chosen.mesh == str(best.mesh), lines
    assert chosen.pipeline.schedule == best.schedule and chosen.pipeline.microbatches == best.microbatches
    reason = next(line.strip() for line in lines if line.strip().startswith(f"pipeline={best.mesh.pipeline}:"))
    assert f"schedule {best.schedule}" in reason and "it wins over the best mesh without one" in reason, reason
