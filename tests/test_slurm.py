"""examples/slurm.sbatch under a real SLURM (slurmctld and slurmd on this host, started by
`.ci/slurm.sh start`): mars-tiny on 2 tasks x 2 CPU devices trains as one process does, a job in
the higher partition preempts it and it comes back by itself, a task killed with SIGKILL and a
SIGTERM to the batch shell and every step (`--full`) each cost the run its steps since the last
periodic checkpoint, a job near its time limit saves and comes back for the rest, a bad config fails
once without requeueing, and a cancelled job is not requeued.
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
ARGS = "--log-every 1 --set run.eval_every=0 --set checkpoint.every=10 --set data.global_batch=8"

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


def requeued(job_id: str, restarts: int = 1) -> None:
    """Waits until the job has been requeued `restarts` times and its last allocation has let go of
    the node, then lets it start (SLURM delays a requeued job about two minutes; one started while its
    old allocation is still completing is killed: "Job credential revoked")."""
    def pending_again():
        """the job to be requeued"""
        state = job(job_id)
        return int(state.get("Restarts", 0)) >= restarts and state.get("JobState") == "PENDING"
    wait_for(pending_again)

    def node_idle():
        """the node to be idle"""
        return subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.split() == ["idle"]
    wait_for(node_idle)
    time.sleep(5)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)


def allocations(job_id: str) -> list[str]:
    """The job's allocations as SLURM's job completion log (`sacct -c`) records them: state, start, end
    (an allocation that was requeued is recorded PENDING)."""
    text = subprocess.run(["sacct", "-c", "-n", "-P", "-j", job_id, "-o", "JobID,State,Start,End"],
                          capture_output=True, text=True, check=True).stdout
    return [line.split("|", 1)[1] for line in text.splitlines() if line.split("|")[0] == job_id]


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
    states = [allocation.split("|")[0] for allocation in allocations(job_id)]
    assert states == ["PENDING", "COMPLETED"], allocations(job_id)  # requeued once, then completed


def test_a_killed_task_and_a_sigterm_to_the_batch_shell_each_cost_only_the_steps_since_the_last_checkpoint(
        slurm, uninterrupted, tmp_path):
    """One job, three allocations. A task killed with SIGKILL: the other stops within
    `--heartbeat-timeout` (exit 137), the job requeues and resumes from the last complete checkpoint.
    Then `scancel --signal=TERM --full`: srun, signalled with the tasks, ends them at once ("forcing
    job termination") before they can save; the shell survives it, the job requeues and resumes from
    its last periodic checkpoint again (docs/operations.md says which site settings preempt safely)."""
    workdir = tmp_path / "run"
    job_id = submit(workdir, args=ARGS + " --heartbeat-timeout 10")
    wait_for(lambda: (workdir / "checkpoints" / "10").is_dir())
    pids = subprocess.run(["pgrep", "-f", f"triskele.train --preset mars-tiny --workdir {workdir}"],
                          capture_output=True, text=True).stdout.split()
    assert len(pids) == 2, pids
    os.kill(int(pids[-1]), signal.SIGKILL)
    requeued(job_id)
    wait_for(lambda: (workdir / "checkpoints" / "20").is_dir())
    subprocess.run(["scancel", "--signal=TERM", "--full", job_id], check=True)
    requeued(job_id, 2)
    state = ended(job_id)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "2"), state
    log = Path(f"{workdir}.log").read_text()
    assert "exit 137): requeue 1" in log and "exit 137): requeue 2" in log, log[-3000:]
    resumed = [int(step) for step in re.findall(r"resuming at step (\d+) to", log)]
    assert len(resumed) == 2 and resumed[0] - 1 in (10, 20, 30) and resumed[1] - 1 in (20, 30), resumed
    assert_same_losses(losses(workdir), uninterrupted)


def test_a_time_limit_saves_before_it_and_the_run_completes_over_several_allocations(slurm, tmp_path):
    """`--time=2 --signal=TERM@60`: SLURM signals the steps a minute before the limit (up to 30 s sooner:
    slurmctld checks limits every 30 s), every task saves the same step and exits 0, the job requeues
    itself, and the next allocation resumes there. 100 steps are more than one allocation's 30-60 s
    reach (startup included), so the run completes over two or more."""
    steps = 100
    workdir = tmp_path / "run"
    job_id, released = submit(workdir, "--time=2", "--signal=TERM@60", steps=steps), 0
    while True:
        state = job(job_id)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        restarts = int(state.get("Restarts", 0))
        assert restarts <= 6, state  # a few allocations, not a requeue loop
        if state.get("JobState") == "PENDING" and restarts > released:
            requeued(job_id, restarts)
            released = restarts
        time.sleep(2)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), state
    assert int(state["Restarts"]) >= 1, state
    log = Path(f"{workdir}.log").read_text()
    saved = [int(step) for step in re.findall(r"sigterm: step (\d+) of", log)]
    resumed = [int(step) for step in re.findall(r"resuming at step (\d+) to", log)]
    assert saved and [step + 1 for step in saved[:len(resumed)]] == resumed, log[-3000:]
    assert "DUE TO TIME LIMIT" not in log, log[-3000:]  # saved and requeued before the limit
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows if "loss" in row] == list(range(1, steps + 1))
    states = [allocation.split("|")[0] for allocation in allocations(job_id)]
    assert states == ["PENDING"] * int(state["Restarts"]) + ["COMPLETED"], allocations(job_id)


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
    logged_step(workdir, 1)
    subprocess.run(["scancel", job_id], check=True)
    state = ended(job_id)
    assert (state["JobState"], state["Restarts"]) == ("CANCELLED", "0"), state
    time.sleep(5)
    assert job(job_id)["JobState"] == "CANCELLED"
    assert "the job was cancelled (scancel): not requeued" in Path(f"{workdir}.log").read_text()
