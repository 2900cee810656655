"""Ctrl-C keeps the work: SIGINT to a real training or predict process stops it cleanly (the step
or the inputs in hand finished and saved, exit 130, no traceback) and the same command resumes;
a second Ctrl-C stops at once and the last complete checkpoint stays usable."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import assert_trees_close, relative_error
from PIL import Image
from subprocess_runs import STEPS, child_env, command, logged_steps, wait_for
from trainutil import final_params, step_records

LEGACY_RUN = Path(__file__).parent / "fixtures" / "legacy" / "mars-run"


def _interrupt(process: subprocess.Popen, times: int = 1) -> tuple[str, str]:
    """SIGINT `times` times, each after the process said it saw the one before (signals sent at
    once would reach Python's handler as one); (stdout, stderr)."""
    seen = []
    for sent in range(times):
        process.send_signal(signal.SIGINT)
        if sent + 1 < times:
            while "again stops at once" not in (line := process.stderr.readline()):
                assert line, "the process closed stderr before it saw the first Ctrl-C"
                seen.append(line)
            seen.append(line)
    out, err = process.communicate(timeout=180)
    return out, "".join(seen) + err


def _assert_same_run_as_reference(workdir: Path, expected) -> None:
    records, (reference_records, reference_params) = step_records(workdir), expected
    for step in reference_records:
        assert relative_error(records[step]["loss"], reference_records[step]["loss"]) < 1e-5, step
    assert_trees_close(final_params(workdir)[0], reference_params, 1e-5)


def test_ctrl_c_saves_the_step_exits_130_and_the_same_command_resumes_the_same_run(uninterrupted_run, tmp_path):
    process = subprocess.Popen(command(tmp_path), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_for(lambda: len(logged_steps(tmp_path)) >= 6, process)
    out, err = _interrupt(process)
    assert process.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "training: Ctrl-C: finishing this step, then saving a checkpoint" in err
    saved = final_params(tmp_path)[1]
    assert saved == max(logged_steps(tmp_path)) < STEPS, "the step in hand was finished and saved"
    assert f"interrupted at step {saved}" in err and "run the same command again" in err, err[-2000:]

    finish = subprocess.run(command(tmp_path), env=child_env(), capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr[-3000:]
    assert f"resuming at step {saved + 1} to {STEPS}" in finish.stdout
    assert sorted(logged_steps(tmp_path)) == list(range(1, STEPS + 1)), "every step exactly once"
    _assert_same_run_as_reference(tmp_path, uninterrupted_run)


def test_a_second_ctrl_c_stops_at_once_and_the_last_complete_checkpoint_resumes(uninterrupted_run, tmp_path):
    process = subprocess.Popen(command(tmp_path), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_for(lambda: len(logged_steps(tmp_path)) >= 10, process)
    out, err = _interrupt(process, times=2)
    assert process.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "second Ctrl-C, stopped at once" in err, err[-3000:]

    finish = subprocess.run(command(tmp_path), env=child_env(), capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr[-3000:]
    assert f"completed: step {STEPS} of {STEPS}" in finish.stdout
    _assert_same_run_as_reference(tmp_path, uninterrupted_run)


def test_ctrl_c_during_predict_keeps_what_is_written_and_the_rerun_predicts_the_rest(tmp_path):
    workdir = shutil.copytree(LEGACY_RUN, tmp_path / "run")
    inputs = tmp_path / "frames"
    inputs.mkdir()
    pixels = np.random.default_rng(0).integers(0, 255, (20, 20), np.uint8)
    count = 600
    for i in range(count):
        Image.fromarray(pixels).save(inputs / f"{i:04d}.png")
    out_dir = tmp_path / "out"
    predict = [sys.executable, "-m", "triskele.eval", "predict", "--workdir", str(workdir), "--input", str(inputs),
               "--output", str(out_dir), "--batch", "1", "--threads", "1", "--prefetch", "1", "--no-progress"]
    rows = out_dir / ".triskele-predict" / "rows"
    process = subprocess.Popen(predict, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: rows.is_dir() and len(list(rows.iterdir())) >= 3, process)
    out, err = _interrupt(process)
    assert process.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "predict: Ctrl-C" in err, err[-3000:]
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and 0 < summary["written"] < count, summary
    assert "run the same command again" in out
    written_before = summary["written"]
    assert len(list(rows.iterdir())) == written_before, "every input counted written is recorded"

    rerun = subprocess.run(predict, env=child_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((out_dir / "summary.json").read_text())
    assert (summary["skipped"], summary["written"], summary["interrupted"]) == (written_before,
                                                                                 count - written_before, False)
    assert len(list(rows.iterdir())) == count


def test_ctrl_c_during_evaluate_exits_130_without_a_traceback_or_a_report(tmp_path):
    """The signal goes once the split's reader is imported (inside the evaluation's stop request,
    after the restore: a Ctrl-C before it is Python's KeyboardInterrupt, which a library's callback
    once swallowed, and the run exited 0), and the train split's 8 batches keep it evaluating."""
    workdir = shutil.copytree(LEGACY_RUN, tmp_path / "run")
    command = [sys.executable, "-X", "importtime", "-m", "triskele.eval", "--workdir", str(workdir), "--split", "train"]
    process = subprocess.Popen(command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    while "triskele.train.domains.mars.data" not in (line := process.stderr.readline()):  # the split opens
        assert line, "".join(seen)[-3000:]
        seen.append(line)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=180)
    messages = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("import time:"))
    assert process.returncode == 130, messages[-3000:]
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err, messages[-3000:]
    assert not (workdir / "eval").exists() and out == ""
