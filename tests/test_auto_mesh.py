"""`--mesh auto`: the planner's pick (here, on CPU: the simplest valid mesh) for the job's devices."""

import json

from trainutil import small_config
from triskele.eval.evaluate import evaluate_checkpoint
from triskele.mesh.perf.hardware import GPUS
from triskele.mesh.perf.planner import candidates
from triskele.train import train
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.tools.planning import plan_inputs


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
    process_index = 0


def test_auto_mesh_on_a_known_gpu_takes_the_planners_pick():
    chosen, lines = resolve_auto_mesh(small_config(preset="mars-l16"), [FakeGpu()] * 8)
    assert lines[0].startswith(f"--mesh auto on 8 x {GPUS['h200'].name}: --mesh {chosen.mesh}")
    assert any(line.strip().startswith("tensor=") for line in lines[1:])
    config = small_config(preset="mars-l16")
    best = next(c for c in candidates(plan_inputs(config, "h200", 8, nodes=1)) if c.fits)
    assert chosen.mesh == str(best.mesh) and chosen.model.remat == best.remat
