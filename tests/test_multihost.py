"""Real multi-process runs: 2 processes x 4 simulated CPU devices on 127.0.0.1, gloo collectives."""

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import relative_error
from trainutil import SMALL, mesh_of, small_config, step_records
from triskele.train import train
from triskele.train.tools.launch import child_argv, free_port

MESH = "data=2,fsdp=2,tensor=2"
SETS = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]


def start(workdir: Path, count: int, *extra: str, port: int | None = None) -> list[subprocess.Popen]:
    port = port or free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    command = [sys.executable, "-m", "triskele.train", "--workdir", str(workdir), "--mesh", MESH, "--no-progress",
               "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(count), "--heartbeat-timeout", "5",
               *SETS, *extra]
    return [subprocess.Popen([*command, "--process-id", str(i)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for i in range(count)]


HANG_S = 600
"""How long a multi-process run may take to start and log its first steps before the test calls it
hung: a guard against a hang, not a speed check (alone on 2 cores they log them in under 90 s; beside
the rest of the suite on a slow machine, 240 s ran out)."""


def finish(processes: list[subprocess.Popen], timeout: float = HANG_S) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in processes]


def assert_all_ok(results):
    """Every process exited 0; else the end of every process's output (a peer's shows why)."""
    assert all(code == 0 for code, _ in results), "\n".join(
        f"--- process {i}: exit {code}\n{output[-2500:]}" for i, (code, output) in enumerate(results))


@pytest.mark.parametrize("hybrid", [[], ["--dcn", "data=2"]], ids=["plain", "hybrid"])
def test_two_processes_match_one_process_with_eight_devices(hybrid, tmp_path, devices):
    assert_all_ok(finish(start(tmp_path / "two", 2, "--steps", "5", *hybrid)))
    train(small_config(**{"run.steps": 5}), tmp_path / "one", mesh=mesh_of(MESH), progress=False)
    two, one = step_records(tmp_path / "two"), step_records(tmp_path / "one")
    assert sorted(two) == sorted(one) == [1, 2, 3, 4, 5]
    for step in one:
        for key in ("loss", "grad_norm"):
            assert relative_error(two[step][key], one[step][key]) < 1e-4, (step, key, two[step][key], one[step][key])


def test_checkpoints_move_between_two_processes_and_one(tmp_path, devices):
    config = small_config(**{"run.steps": 5})
    train(config, tmp_path / "straight", mesh=mesh_of(MESH), progress=False)
    reference = step_records(tmp_path / "straight")
    # Two processes save at step 3, one process resumes.
    assert_all_ok(finish(start(tmp_path / "a", 2, "--steps", "5", "--stop-after-step", "3")))
    resumed = train(config, tmp_path / "a", mesh=mesh_of(MESH), progress=False)
    assert resumed.first_step == 4
    # One process saves at step 3, two processes resume.
    train(config, tmp_path / "b", mesh=mesh_of(MESH), progress=False, stop_after_step=3)
    assert_all_ok(finish(start(tmp_path / "b", 2, "--steps", "5")))
    for workdir in (tmp_path / "a", tmp_path / "b"):
        records = step_records(workdir)
        for step in (4, 5):
            assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5, (workdir, step)


def test_unreachable_coordinator_fails_clearly_within_the_timeout(tmp_path):
    port = free_port()
    began = time.monotonic()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "triskele.train", "--workdir", str(tmp_path), "--coordinator", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", "1", "--distributed-timeout", "3"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"cannot reach the coordinator at 127.0.0.1:{port} within 3 s" in result.stderr
    assert time.monotonic() - began < 60


def _wait_for_steps(metrics: Path, count: int, processes, deadline_s: float = HANG_S) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= count:
            return
        assert all(p.poll() is None for p in processes), [p.stdout.read()[-2000:] for p in processes]
        time.sleep(0.2)
    for p in processes:
        p.kill()
    raise AssertionError(f"the run logged fewer than {count} steps in {deadline_s:.0f} s: "
                         + " | ".join(p.stdout.read()[-1500:] for p in processes))


def test_sigterm_to_one_process_saves_the_same_step_everywhere_and_exits_zero(tmp_path, devices):
    workdir = tmp_path / "run"
    processes = start(workdir, 2, "--steps", "100000")
    _wait_for_steps(workdir / "metrics.jsonl", 3, processes)
    processes[1].send_signal(signal.SIGTERM)
    results = finish(processes, timeout=180)
    assert_all_ok(results)
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    last_logged = max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())
    assert saved and saved[-1] == last_logged
    # One process continues the trajectory of a run that was never interrupted.
    stop = saved[-1] + 2
    config = small_config(**{"run.steps": 100000})
    resumed = train(config, workdir, mesh=mesh_of(MESH), progress=False, stop_after_step=stop)
    assert resumed.first_step == saved[-1] + 1
    train(config, tmp_path / "straight", mesh=mesh_of(MESH), progress=False, stop_after_step=stop)
    records, reference = step_records(workdir), step_records(tmp_path / "straight")
    for step in (stop - 1, stop):
        assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5


def test_a_killed_process_stops_the_other_within_the_heartbeat_timeout(tmp_path):
    workdir = tmp_path / "run"
    processes = start(workdir, 2, "--steps", "100000")
    _wait_for_steps(workdir / "metrics.jsonl", 2, processes)
    processes[1].kill()
    began = time.monotonic()
    code = processes[0].wait(timeout=120)
    assert code != 0
    assert time.monotonic() - began < 60


def test_local_launcher_drops_its_own_flags():
    argv = ["--steps", "5", "--local-processes", "2", "--devices-per-process=4", "--mesh", "data=2"]
    assert child_argv(argv) == ["--steps", "5", "--mesh", "data=2"]


@pytest.mark.parametrize("dcn, message", [("data=3", "must multiply to the 1 processes")])
def test_dcn_errors(dcn, message, devices):
    from triskele.mesh import make_mesh

    with pytest.raises(ValueError, match=message):
        make_mesh("data=8", dcn=dcn)


@pytest.mark.parametrize(("coordinator", "bind", "expected"), [
    ("127.0.0.1:1234", None, "127.0.0.1:1234"),          # bound where it points: loopback stays loopback
    ("10.0.0.1:1234", "0.0.0.0", "0.0.0.0:1234"),        # an explicit host takes the coordinator's port
    ("node0:1234", "10.0.0.1:999", "10.0.0.1:999"),
    (None, None, None),                                  # auto-detected cluster: JAX's default
])
def test_coordinator_bind_address(coordinator, bind, expected):
    from triskele.mesh.distributed import DistributedOptions, bind_address

    assert bind_address(DistributedOptions(coordinator=coordinator, coordinator_bind=bind)) == expected


def test_coordinator_bind_without_a_port_needs_one():
    from triskele.mesh.distributed import DistributedOptions, bind_address

    with pytest.raises(ValueError, match="--coordinator-bind '10.0.0.1' names no port"):
        bind_address(DistributedOptions(coordinator_bind="10.0.0.1"))


def listening_addresses(port: int) -> set[str]:
    """The local addresses of this host's TCP sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # little-endian 32-bit words
                address = ipaddress.ip_address(words)
                found.add(str(getattr(address, "ipv4_mapped", None) or address))  # ::ffff:127.0.0.1 is 127.0.0.1
    return found


def test_ctrl_c_to_every_process_saves_the_same_step_and_exits_130(tmp_path, devices):
    """As a terminal's Ctrl-C: SIGINT to each process; each hands it to the preemption service, so
    they agree on the step to save."""
    workdir, port = tmp_path / "run", free_port()
    processes = start(workdir, 2, "--steps", "100000", port=port)
    _wait_for_steps(workdir / "metrics.jsonl", 3, processes)
    assert listening_addresses(port) == {"127.0.0.1"}, "the coordinator must listen where --coordinator points only"
    for process in processes:
        process.send_signal(signal.SIGINT)
    results = finish(processes, timeout=180)
    for code, output in results:
        assert code == 130 and "Traceback" not in output, output[-3000:]
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    last_logged = max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())
    assert saved and saved[-1] == last_logged
    assert f"interrupted at step {saved[-1]}" in results[0][1]
