"""examples/slurm.sbatch under a real SLURM (slurmctld and slurmd on this host, started by
`.ci/slurm.sh start`): mars-tiny on 2 tasks x 2 CPU devices trains as one process does, a job in
the higher partition preempts it and it comes back by itself, a task killed with SIGKILL requeues it
from the last complete checkpoint, a SIGTERM to the batch shell and every step (`--full`) costs the
run its steps since the last periodic checkpoint, a job near its time limit saves and comes back for
the rest, and a bad config fails once without requeueing.
Without a scheduler these tests skip, saying why."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "examples" / "slurm.sbatch"
STEPS = 40
ARGS = "--log-every 1 --set run.eval_every=0 --set checkpoint.every=10"

pytestmark = pytest.mark.xdist_group("slurm")  # one scheduler, one node: its jobs run one after another


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    conf = os.environ.get("SLURM_CONF", "")
    if not conf or subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        reason = os.environ.get("TRISKELE_SLURM_SKIP") or "no SLURM_CONF: start one with `. .ci/slurm.sh start`"
        pytest.skip(f"no SLURM scheduler here: {reason}")
    return {"SLURM_CONF": conf}


def submit(workdir: Path, *sbatch: str, args: str = ARGS, steps: int = STEPS) -> str:
    env = {**os.environ, "TRISKELE_PRESET": "mars-tiny", "TRISKELE_MESH": "data=4", "TRISKELE_DCN": "data=2",
           "TRISKELE_CPU_DEVICES": "2", "TRISKELE_STEPS": str(steps), "TRISKELE_ARGS": args,
           "WORKDIR": str(workdir), "TRISKELE_PYTHON": sys.executable}
    done = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
                           f"--output={workdir}.log", *sbatch, str(TEMPLATE)], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().split(";")[0]


def job(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def wait_for(what, timeout: float = 600, every: float = 2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what.__doc__ or what}")


def ended(job_id: str, timeout: float = 900) -> dict[str, str]:
    def done():
        """the job to end"""
        state = job(job_id)
        return state if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None
    return wait_for(done, timeout)


def requeued(job_id: str) -> None:
    """Waits until the job has been requeued and its last allocation has let go of the node, then lets
    it start (SLURM delays a requeued job about two minutes; one started while its old allocation is
    still completing is killed: "Job credential revoked")."""
    def pending_again():
        """the job to be requeued"""
        state = job(job_id)
        return int(state.get("Restarts", 0)) >= 1 and state.get("JobState") == "PENDING"
    wait_for(pending_again)

    def node_idle():
        """the node to be idle"""
        return subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.split() == ["idle"]
    wait_for(node_idle)
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)


def losses(workdir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def logged_step(workdir: Path, step: int) -> None:
    def reached():
        """a logged step"""
        metrics = workdir / "metrics.jsonl"
        return metrics.is_file() and max(losses(workdir), default=0) >= step
    wait_for(reached)


def assert_same_losses(run: dict[int, float], reference: dict[int, float]) -> None:
    assert sorted(run) == list(range(1, STEPS + 1)), sorted(run)
    steps = sorted(run)
    got, want = np.array([run[s] for s in steps]), np.array([reference[s] for s in steps])
    assert np.max(np.abs(got - want) / np.abs(want)) <= 1e-6, (got, want)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, float]:
    workdir = tmp_path_factory.mktemp("one") / "run"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "triskele.train", "--preset", "mars-tiny", "--workdir", str(workdir),
                           "--mesh", "data=4", "--steps", str(STEPS), "--no-progress", *ARGS.split()], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return losses(workdir)


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory) -> dict[int, float]:
    workdir = tmp_path_factory.mktemp("slurm") / "run"
    state = ended(submit(workdir))
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "0"), state
    return losses(workdir)


def test_the_template_trains_two_tasks_as_one_process(uninterrupted, one_process):
    assert_same_losses(uninterrupted, one_process)


def test_a_preempted_job_saves_the_step_comes_back_by_itself_and_resumes_the_same_run(
        slurm, uninterrupted, tmp_path):
    workdir = tmp_path / "run"
    job_id = submit(workdir)
    logged_step(workdir, 5)
    subprocess.run(["sbatch", "--parsable", "--partition=urgent", f"--ntasks={os.cpu_count()}",
                    f"--output={tmp_path}/urgent.log", "--wrap", "sleep 5"], check=True, capture_output=True)
    requeued(job_id)
    state = ended(job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), state
    log = Path(f"{workdir}.log").read_text()
    saved = int(log.split("sigterm: step ")[1].split()[0])
    assert f"resuming at step {saved + 1} to {STEPS}" in log, log[-3000:]
    assert "requeue 1" in log and f"completed: step {STEPS} of {STEPS}" in log
    assert_same_losses(losses(workdir), uninterrupted)


def test_a_task_killed_with_sigkill_requeues_the_job_from_the_last_complete_checkpoint(slurm, uninterrupted,
                                                                                       tmp_path):
    workdir = tmp_path / "run"
    job_id = submit(workdir, args=ARGS + " --heartbeat-timeout 10")
    wait_for(lambda: (workdir / "checkpoints" / "10").is_dir())
    pids = subprocess.run(["pgrep", "-f", f"triskele.train --preset mars-tiny --workdir {workdir}"],
                          capture_output=True, text=True).stdout.split()
    assert len(pids) == 2, pids
    os.kill(int(pids[-1]), signal.SIGKILL)
    requeued(job_id)
    state = ended(job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), state
    log = Path(f"{workdir}.log").read_text()
    resumed = int(re.search(r"resuming at step (\d+) to", log).group(1))
    assert resumed - 1 in (10, 20, 30), log[-3000:]  # a complete periodic checkpoint
    assert_same_losses(losses(workdir), uninterrupted)


def test_a_sigterm_to_the_batch_shell_and_every_step_loses_the_steps_since_the_last_checkpoint(
        slurm, uninterrupted, tmp_path):
    """`scancel --signal=TERM --full`: srun, signalled with the tasks, ends them at once ("forcing job
    termination") before they can save; the shell survives it, the job requeues and the run resumes
    from its last periodic checkpoint (docs/operations.md says which site settings preempt safely)."""
    workdir = tmp_path / "run"
    job_id = submit(workdir)
    wait_for(lambda: (workdir / "checkpoints" / "10").is_dir())
    subprocess.run(["scancel", "--signal=TERM", "--full", job_id], check=True)
    requeued(job_id)
    state = ended(job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), state
    log = Path(f"{workdir}.log").read_text()
    resumed = int(re.search(r"resuming at step (\d+) to", log).group(1))
    assert resumed - 1 in (10, 20, 30), log[-3000:]
    assert_same_losses(losses(workdir), uninterrupted)


def test_a_time_limit_saves_before_it_and_the_run_completes_over_several_allocations(slurm, tmp_path):
    """`--time=2 --signal=TERM@60`: SLURM signals the steps a minute before the limit (or up to a minute
    sooner), every task saves the same step and exits 0, the job requeues itself, and the next allocation
    resumes there; the run is longer than one allocation's minute, so it needs at least two."""
    steps = 240
    workdir = tmp_path / "run"
    job_id = submit(workdir, "--time=2", "--signal=TERM@60", steps=steps)
    requeued(job_id)
    state = ended(job_id)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), state
    assert int(state["Restarts"]) >= 1, state
    log = Path(f"{workdir}.log").read_text()
    saved = [int(step) for step in re.findall(r"sigterm: step (\d+) of", log)]
    resumed = [int(step) for step in re.findall(r"resuming at step (\d+) to", log)]
    assert saved and [step + 1 for step in saved[:len(resumed)]] == resumed, log[-3000:]
    assert "DUE TO TIME LIMIT" not in log, log[-3000:]  # saved and requeued before the limit
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, steps + 1))


def test_a_bad_config_fails_once_and_is_not_requeued(slurm, tmp_path):
    workdir = tmp_path / "run"
    state = ended(submit(workdir, args="--set optim.lr=fast"))
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("FAILED", "2:0", "0"), state
    log = Path(f"{workdir}.log").read_text()
    assert "optim.lr" in log and "the run failed (exit 2): not requeued" in log


def test_a_cancelled_job_saves_and_is_not_requeued(slurm, tmp_path):
    """`scancel JOB` ends the job: the batch shell, which survives a SIGTERM so that a preempted run
    can requeue, reads the job's state and does not requeue a cancelled one."""
    workdir = tmp_path / "run"
    job_id = submit(workdir)
    logged_step(workdir, 3)
    subprocess.run(["scancel", job_id], check=True)
    state = ended(job_id)
    assert (state["JobState"], state["Restarts"]) == ("CANCELLED", "0"), state
    time.sleep(5)
    assert job(job_id)["JobState"] == "CANCELLED"
    assert "the job was cancelled (scancel): not requeued" in Path(f"{workdir}.log").read_text()
