import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from trainutil import SMALL, final_params, mesh_of, small_config
from triskele.train.cli import main
from triskele.train.config.overrides import make_config
from triskele.train.domains import get_domain
from triskele.train.run import evaluate_split, prepare

SMALL_FLAGS = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]


def test_cli_trains_and_writes_config_metrics_checkpoints_tensorboard(tmp_path, capsys):
    code = main(["--workdir", str(tmp_path), "--steps", "3", "--mesh", "data=2,fsdp=2,tensor=2",
                 "--no-progress", *SMALL_FLAGS, "--set", "run.eval_every=3"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"checkpoints: {tmp_path / 'checkpoints'}" in out and f"metrics:     {tmp_path / 'metrics.jsonl'}" in out
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["run"]["steps"] == 3 and saved["mesh"] == "data=2,fsdp=2,tensor=2"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert {"step", "loss", "lr", "grad_norm", "images_per_sec"} <= set(steps[0])
    assert any("eval_loss" in r for r in records)
    assert (tmp_path / "checkpoints" / "3").is_dir()
    assert any((tmp_path / "tensorboard").iterdir())


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "over.yaml"
    path.write_text("optim:\n  lr: 0.002\ndata.global_batch: 64\n")
    config = make_config("mars-tiny", ["optim.lr=3e-4", "model.remat=full"], files=[path])
    assert (config.optim.lr, config.data.global_batch, config.model.remat) == (3e-4, 64, "full")
    # Configs written before model.remat named a policy spelled it as a bool.
    assert make_config("mars-tiny", ["model.remat=true"]).model.remat == "full"
    assert make_config("mars-tiny", ["model.remat=false"]).model.remat == "none"
    for key in ("data.global_batch", "optim.lr", "optim.warmup_steps", "optim.grad_accum", "checkpoint.every",
                "checkpoint.keep", "precision", "pipeline.microbatches", "pipeline.repeats"):
        make_config("mars-tiny", [f"{key}={'float32' if key == 'precision' else 2}"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "optim.learning_rate=1"], "unknown config key 'optim.learning_rate'"),
        (["--set", "optim.lr=fast"], "config key 'optim.lr' must be float"),
        (["--set", "model.remat=3"], "config key 'model.remat' is '3'; choose one of none, dots, full"),
        (["--mesh", "data=16"], "mesh spec 'data=16' uses 16 devices but 8 are available"),
        (["--mesh", "data=8", "--set", "data.global_batch=12"],
         "data.global_batch=12 is not divisible by data x fsdp = 8"),
        (["--mesh", "data=2,fsdp=4", "--set", "data.global_batch=36"], "use data.global_batch=40"),
        (["--mesh", "tensor=8"], "has 4 heads, not divisible by mesh tensor=8"),
        (["--set", "optim.grad_accum=3"], "optim.grad_accum=3"),
        (["--set", "pipeline.repeats=3"], "use pipeline.repeats in [1, 2, 4, 8]"),
    ],
)
def test_config_errors_name_the_key(args, message, tmp_path, capsys):
    assert main(["--workdir", str(tmp_path), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "checkpoints").exists()


def test_evaluation_counts_every_record_once(devices):
    config = small_config(**{"data.eval_size": 37, "data.global_batch": 16})
    parts = prepare(config, mesh_of("data=8"))
    source = get_domain("mars").open_split(config, "test")
    totals = evaluate_split(parts, parts.init_state().params, source)
    labels = np.stack([source.load(i)["label"] for i in range(37)])
    labelled = int((labels != 255).sum())
    assert totals["confusion"].sum() == labelled
    truth_counts = [(labels == c).sum() for c in range(4)]
    np.testing.assert_array_equal(totals["confusion"].sum(axis=1), truth_counts)


@pytest.mark.slow
def test_sigterm_saves_a_restorable_checkpoint_and_exits_zero(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    command = [sys.executable, "-m", "triskele.train", "--workdir", str(tmp_path), "--steps", "100000",
               "--no-progress", *SMALL_FLAGS]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = Path(tmp_path) / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()[0]
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    assert "sigterm" in output
    last_logged = max(json.loads(line)["step"] for line in metrics.read_text().splitlines())
    params, step = final_params(tmp_path)
    assert step == last_logged
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_a_run_says_what_it_will_do_before_compiling_and_when_it_evaluates(tmp_path, capsys):
    assert main(["--workdir", str(tmp_path), "--steps", "2", "--mesh", "data=8", *SMALL_FLAGS,
                 "--set", "run.eval_every=2"]) == 0
    captured = capsys.readouterr()
    announce = next(line for line in captured.out.splitlines() if line.startswith("training "))
    assert announce.startswith(f"training mars-tiny (mars) in {tmp_path}: from step 1 to 2, global batch 32, "
                               "mesh data=8 (8 cpu devices); evaluating on val every 2 steps and at the end"), announce
    assert f"checkpoints every 200 steps in {tmp_path / 'checkpoints'}" in announce
    assert captured.out.index(announce) < captured.out.index("step: compiled in")
    assert "evaluating on val (40 records)" in captured.err, "the progress bar names the evaluation"
