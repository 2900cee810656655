"""Fault injection: kill -9 anywhere, two runs in one workdir, corrupted checkpoints, a full disk,
unreadable records, non-finite steps."""

import glob
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import assert_trees_close, relative_error
from PIL import Image
from subprocess_runs import CHAIN, STEPS, child_env, command, logged_steps, wait_for
from test_train_engine import poison_step
from trainutil import SMALL, final_params, mesh_of, run, small_config, step_records
from triskele.eval.cli import main as eval_main
from triskele.eval.report import evaluate_checkpoint
from triskele.train import train
from triskele.train.cli import main as train_main


def test_kill_9_at_six_random_moments_then_the_same_command_finishes_the_same_run(uninterrupted_run, tmp_path):
    """Six SIGKILLs drawn from a seeded generator, two of them while an asynchronous checkpoint is
    being written; each restart resumes from what the kill left, and the last one completes."""
    rng = np.random.default_rng(2026)
    during_save = {2, 4}
    outputs = []
    for trial in range(6):
        before = max(logged_steps(tmp_path), default=0)
        process = subprocess.Popen(command(tmp_path), env=child_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        wait_for(lambda before=before: max(logged_steps(tmp_path), default=0) > before, process)
        if trial in during_save:
            wait_for(lambda: glob.glob(str(tmp_path / "checkpoints" / "*.orbax-checkpoint-tmp*")), process)
        else:
            time.sleep(rng.uniform(0.0, 0.4))
        process.kill()
        outputs.append(process.communicate()[0])
        assert process.returncode == -signal.SIGKILL, outputs[-1][-2000:]
    finish = subprocess.run(command(tmp_path), env=child_env(), capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stdout[-3000:] + finish.stderr[-3000:]
    assert f"completed: step {STEPS} of {STEPS}" in finish.stdout
    assert any("taking over the lock left by a run that is gone" in out for out in outputs[1:])
    steps = logged_steps(tmp_path)
    assert sorted(steps) == list(range(1, STEPS + 1)), "every logged step exactly once"
    records, (reference_records, reference_params) = step_records(tmp_path), uninterrupted_run
    for step in reference_records:
        assert relative_error(records[step]["loss"], reference_records[step]["loss"]) < 1e-5, step
    assert_trees_close(final_params(tmp_path)[0], reference_params, 1e-5)


def test_a_second_run_in_the_same_workdir_exits_2_naming_the_first(tmp_path):
    first = subprocess.Popen(command(tmp_path, steps=100000), env=child_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: len(logged_steps(tmp_path)) >= 2, first)
    second = subprocess.run(command(tmp_path, steps=100000), env=child_env(), capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"is in use by another training run (host {os.uname().nodename}, pid {first.pid}, started" in second.stderr
    assert first.poll() is None, "the first run keeps training"
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 0
    steps = logged_steps(tmp_path)
    assert sorted(steps) == list(range(1, max(steps) + 1)), "only the first run wrote metrics"


def corrupt(checkpoint: Path, kind: str) -> None:
    if kind == "commit marker deleted":
        (checkpoint / "commit_success.txt").unlink()
    elif kind == "array file truncated":
        data = max(checkpoint.glob("state/ocdbt.process_0/d/*"), key=lambda p: p.stat().st_size)
        os.truncate(data, data.stat().st_size // 2)
    elif kind == "metadata garbled":
        (checkpoint / "state" / "_METADATA").write_text('{"tree_metadata": [garbled')


CORRUPTIONS = ["commit marker deleted", "array file truncated", "metadata garbled"]


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
    """A run stopped at step 6 with checkpoints 3 and 6, and the straight run to 9."""
    options = {"checkpoint.every": 3, "checkpoint.keep": 2, "run.steps": 9}
    base = tmp_path_factory.mktemp("six")
    train(small_config(**options), base, mesh=mesh_of("single"), progress=False, stop_after_step=6)
    straight = tmp_path_factory.mktemp("straight")
    train(small_config(**options), straight, mesh=mesh_of("single"), progress=False)
    return base, straight, options


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(kind, six_steps, tmp_path,
                                                                                             capsys):
    base, straight, options = six_steps
    workdir = tmp_path / "run"
    shutil.copytree(base, workdir)
    corrupt(workdir / "checkpoints" / "6", kind)
    with pytest.raises(ValueError, match="checkpoint step 6 in .* cannot be restored"):
        evaluate_checkpoint(workdir, mesh="data=8")  # read-only: a clear error, nothing moved
    assert (workdir / "checkpoints" / "6").is_dir()
    summary = train(small_config(**options), workdir, mesh=mesh_of("single"), progress=False)
    assert summary.first_step == 4 and summary.final_step == 9
    assert (workdir / "checkpoints" / "corrupt-6").is_dir()
    assert "cannot be restored" in capsys.readouterr().err
    records, reference = step_records(workdir), step_records(straight)
    assert sorted(records) == list(range(1, 10)), "the records of steps 4-6 of the first try were dropped"
    for step in range(4, 10):
        assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5
    assert_trees_close(final_params(workdir)[0], final_params(straight)[0], 1e-5)
    assert len((workdir / "metrics.dropped.jsonl").read_text().splitlines()) == 3


def test_when_no_checkpoint_restores_the_run_exits_2_listing_what_was_tried(six_steps, tmp_path, capsys):
    base, _, options = six_steps
    shutil.copytree(base, tmp_path / "run")
    corrupt(tmp_path / "run" / "checkpoints" / "6", "metadata garbled")
    corrupt(tmp_path / "run" / "checkpoints" / "3", "commit marker deleted")
    flags = [arg for key, value in {**SMALL, **options}.items() for arg in ("--set", f"{key}={value}")]
    assert train_main(["--workdir", str(tmp_path / "run"), "--no-progress", "--mesh", "data=8", *flags]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint in" in err and "checkpoint step 6" in err and "checkpoint step 3" in err


def test_eval_of_a_step_never_saved_exits_2_listing_the_saved_steps(six_steps, capsys):
    base, _, _ = six_steps
    assert eval_main(["--workdir", str(base), "--step", "123"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint step 123 was never saved in" in err and "steps saved there: 3, 6." in err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_eval_of_a_corrupt_latest_checkpoint_names_the_newest_step_that_restores(kind, six_steps, tmp_path, capsys):
    base, _, _ = six_steps
    shutil.copytree(base, tmp_path / "run")
    corrupt(tmp_path / "run" / "checkpoints" / "6", kind)
    assert eval_main(["--workdir", str(tmp_path / "run"), "--mesh", "data=8"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint step 6 in" in err and "cannot be restored" in err, err[-2000:]
    assert "the newest step that restores is 3: pass --step 3" in err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]


def test_a_failed_save_stops_the_run_and_keeps_the_previous_checkpoint(tmp_path):
    train(small_config(**{**CHAIN, "run.steps": 8}), tmp_path, mesh=mesh_of("single"), progress=False,
          stop_after_step=4)
    limit = 64 * 1024  # metrics and logs fit; a checkpoint's array files do not
    # The child sets its own limit before it runs the CLI (a preexec_fn would fork this
    # multithreaded JAX process).
    python, _, module, *args = command(tmp_path, steps=8, **{"run.compilation_cache": "off"})
    shim = ("import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
            f"sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__')")
    result = subprocess.run([python, "-c", shim, *args], env=child_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: saving checkpoint step 8")]
    assert ours and "File too large" in ours[0] and "Checkpoints written before it are intact: 4" in ours[0]
    params, step = final_params(tmp_path)
    assert step == 4 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def write_terrain(root: Path, count: int, broken: dict[int, str]) -> list[str]:
    """A generic mars layout of `count` 32-px images; `broken` index -> how it is broken."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    names = []
    for i in range(count):
        image = root / "images" / f"{i:03d}.png"
        mask = root / "masks" / f"{i:03d}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32), np.uint8)).save(image)
        Image.fromarray(rng.integers(0, 4, (32, 32)).astype(np.uint8)).save(mask)
        how = broken.get(i)
        if how == "truncated image":
            image.write_bytes(image.read_bytes()[:60])
        elif how == "mask of the wrong size":
            Image.fromarray(np.zeros((16, 16), np.uint8)).save(mask)
        elif how == "label outside the classes":
            Image.fromarray(np.full((32, 32), 7, np.uint8)).save(mask)
        if how:
            names.append(f"{i:03d}.png")
    return names


BROKEN = {5: "truncated image", 17: "mask of the wrong size", 30: "label outside the classes"}


def test_skip_mode_trains_around_three_broken_files_of_forty_and_reports_them(tmp_path, devices):
    broken = write_terrain(tmp_path / "data", 40, BROKEN)
    options = {"data.path": str(tmp_path / "data"), "data.bad_records": "skip", "data.global_batch": 8,
               "run.steps": 10, "run.eval_every": 10, "checkpoint.every": 10,
               "data.eval_split": "test"}  # the flat tree's test split is all 40 files, the three broken ones too
    summary = run(tmp_path / "run", "data=8", **options)
    assert summary.final_step == 10 and np.isfinite(summary.last_loss)
    listed = (tmp_path / "run" / "bad_records.txt").read_text().splitlines()
    assert len({tuple(line.split("\t")[:2]) for line in listed if line.startswith("train\t")}) == 3
    assert all(any(name in line for line in listed) for name in broken)
    evaluation = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                  if "eval_loss" in line][-1]
    assert evaluation["bad_records"] == 3 and evaluation["eval_unreadable"] == 3
    report = evaluate_checkpoint(tmp_path / "run", mesh="data=8")
    assert report["records"] == 40 and report["records_unreadable"] == 3


def test_error_mode_names_the_broken_file(tmp_path, capsys):
    broken = write_terrain(tmp_path / "data", 40, BROKEN)
    flags = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]
    code = train_main(["--workdir", str(tmp_path / "run"), "--data", str(tmp_path / "data"), "--steps", "10",
                       "--no-progress", "--mesh", "data=8", *flags, "--set", "data.global_batch=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert any(name in err for name in broken), err[-2000:]


def test_a_0_byte_image_is_called_an_empty_file_by_the_readers_and_in_predicts_errors(six_steps, tmp_path):
    from triskele.train.data.images import image_size, open_image, read_mask

    (tmp_path / "in").mkdir()
    empty = tmp_path / "in" / "empty.png"
    empty.write_bytes(b"")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(tmp_path / "in" / "good.png")
    for read in (open_image, image_size, read_mask):
        with pytest.raises(ValueError, match=rf"^cannot read image {empty}: empty file \(0 bytes\)$"):
            read(empty)
    assert eval_main(["predict", "--workdir", str(six_steps[0]), "--input", str(tmp_path / "in"), "--output",
                      str(tmp_path / "out"), "--mesh", "data=8", "--no-progress"]) == 1
    rows = (tmp_path / "out" / "errors.csv").read_text().splitlines()
    assert rows[1:] == [f"empty.png,cannot read image {empty}: empty file (0 bytes)"]


def test_skip_mode_leaves_the_state_bit_identical_on_a_non_finite_step(tmp_path, monkeypatch, devices):
    poison_step(monkeypatch, 4)
    options = {"run.steps": 6, "run.on_nonfinite": "skip", "checkpoint.every": 1, "checkpoint.keep": 10}
    run(tmp_path, "data=8", **options)
    from triskele.train.checkpoints.manager import Checkpoints
    from triskele.train.config.schema import CheckpointConfig
    from triskele.train.run import prepare

    parts = prepare(small_config(**options), mesh_of("data=8"))
    checkpoints = Checkpoints(tmp_path / "checkpoints", CheckpointConfig(keep=10), read_only=True)
    try:
        states = {step: jax.device_get(parts.restore(checkpoints, step)[0]) for step in (3, 4)}
    finally:
        checkpoints.close()
    for (path, before), after in zip(jax.tree_util.tree_flatten_with_path((states[3].params, states[3].opt_state))[0],
                                     jax.tree.leaves((states[4].params, states[4].opt_state)), strict=True):
        np.testing.assert_array_equal(before, after, err_msg=jax.tree_util.keystr(path))
    assert int(states[4].step) == 4
    records = step_records(tmp_path)
    assert records[4]["skipped_steps"] == 1 and records[6]["skipped_total"] == 1
    assert not np.isfinite(records[4]["loss"]) and np.isfinite(records[6]["loss"])


def test_skip_mode_stops_after_max_skipped_steps_in_a_row(tmp_path, monkeypatch, devices):
    from triskele.train.data.pipeline import TrainStepLoader

    load = TrainStepLoader.__call__
    monkeypatch.setattr(TrainStepLoader, "__call__", lambda self, step: {
        **load(self, step), **({"image": np.full_like(load(self, step)["image"], np.nan)} if step >= 2 else {})})
    with pytest.raises(FloatingPointError, match=r"3 steps in a row up to step 5 .* were skipped"):
        run(tmp_path, "data=8", **{"run.steps": 10, "run.on_nonfinite": "skip", "run.max_skipped_steps": 3})
