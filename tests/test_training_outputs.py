"""What a run shows while it trains: domain metrics at each evaluation (and the best checkpoint by
them), plots, profiler traces."""

import json

import numpy as np
import pytest
from conftest import DOMAIN_RUN
from PIL import Image
from trainutil import run, step_records
from triskele.eval.cli import main as eval_main
from triskele.train.bookkeeping.plots import panels_figure
from triskele.train.cli import main as train_main

pytestmark = pytest.mark.xdist_group("domain_runs")  # shares a session fixture: one worker runs them


def evaluations(workdir):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if "eval_loss" in r}


@pytest.mark.parametrize("domain", list(DOMAIN_RUN))
def test_cli_training_logs_the_domain_metric_and_keeps_the_best_checkpoint(domain, domain_runs):
    metric, _ = DOMAIN_RUN[domain]
    workdir = domain_runs[domain]
    evals = evaluations(workdir)
    assert sorted(evals) == [2, 4, 6]
    values = {step: record[metric] for step, record in evals.items()}
    assert all(np.isfinite(v) for v in values.values())
    kept = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert 6 in kept, "the latest checkpoint is kept"
    assert max(values[s] for s in kept) == max(values.values()), (values, kept)
    assert len(kept) <= 2
    if domain == "mars":
        assert {"iou/sand", "recall/big_rock", "pixel_acc"} <= set(evals[2])
    tensorboard = list((workdir / "tensorboard").iterdir())
    assert tensorboard and any(f.stat().st_size > 0 for f in tensorboard)


def test_an_unknown_best_metric_is_a_config_error_at_start_up(tmp_path, capsys):
    code = train_main(["--preset", "deepfake-tiny", "--workdir", str(tmp_path), "--no-progress",
                       "--set", "checkpoint.best_metric=miou"])
    assert code == 2
    err = capsys.readouterr().err
    assert "checkpoint.best_metric='miou' is not a deepfake metric; choose one of eval_loss, auc_frame" in err
    assert not (tmp_path / "checkpoints").exists()


def test_plots_are_drawn_and_a_resumed_run_continues_them(tmp_path, devices):
    options = {"run.steps": 6, "run.log_every": 1, "run.eval_every": 3}
    run(tmp_path, "data=8", **{**options, "run.steps": 3})
    first = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "plots").iterdir()}
    assert set(first) == {"training.png", "eval.png"}
    run(tmp_path, "data=8", **options)
    for name in ("training.png", "eval.png"):
        path = tmp_path / "plots" / name
        assert path.stat().st_mtime_ns > first[name], "the resumed run redraws the plots"
        width, height = Image.open(path).size
        assert width > 400 and height > 200
        assert len(np.unique(np.asarray(Image.open(path).convert("L")))) > 10, "a plot with something drawn"
    assert sorted(step_records(tmp_path)) == [1, 2, 3, 4, 5, 6]
    assert sorted(evaluations(tmp_path)) == [3, 6]


def test_eval_plots_show_fractions_on_the_whole_unit_axis():
    records = {2: {"step": 2, "eval_loss": 0.61, "miou": 0.882, "iou/sand": 0.7, "auc_frame/Swap": 0.55,
                   "top1": 0.3, "recall_at_5": 0.9, "records": 64},
               4: {"step": 4, "eval_loss": 0.58, "miou": 0.878, "iou/sand": 0.71, "auc_frame/Swap": 0.56,
                   "top1": 0.31, "recall_at_5": 0.91, "records": 64}}
    keys = [k for k in records[2] if k != "step"]
    fig = panels_figure(records, [(k, k) for k in keys], "evaluation")
    limits = {ax.get_title(): ax.get_ylim() for ax in fig.axes if ax.get_title()}
    for key in ("miou", "iou/sand", "auc_frame/Swap", "top1", "recall_at_5"):
        assert limits[key] == (0, 1), key
    low, high = limits["eval_loss"]
    assert 0.5 < low < 0.58 and 0.61 < high < 0.7, "a loss keeps an automatic axis"
    assert limits["records"] != (0, 1)


def test_a_merch_evaluation_writes_its_plots(domain_runs, capsys):
    workdir = domain_runs["merch"]
    assert eval_main(["--workdir", str(workdir), "--mesh", "data=8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == ["recognition.png", "planogram.png"]
    for name in report["files"]:
        width, height = Image.open(workdir / "eval" / str(report["step"]) / name).size
        assert width > 300 and height > 250, name


def test_a_profiled_run_leaves_a_trace(tmp_path, devices):
    run(tmp_path, "data=8", **{"run.steps": 4, "run.profile_steps": "2:3"})
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 1000
    assert list((tmp_path / "profile").rglob("perfetto_trace.json.gz"))


@pytest.mark.parametrize("value, message", [
    ("5", "write FIRST:LAST global steps"), ("3:2", "write FIRST:LAST"), ("0:2", "write FIRST:LAST"),
    ("2:99", "ends at step 99, after run.steps=10")])
def test_invalid_profile_steps_are_config_errors(value, message, tmp_path, capsys):
    code = train_main(["--workdir", str(tmp_path), "--no-progress", "--steps", "10", "--set",
                       f"run.profile_steps={value}"])
    assert code == 2
    assert message in capsys.readouterr().err
