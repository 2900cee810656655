"""Starting JAX's multi-controller runtime: flags, cluster auto-detection, or a single process.

Call `initialize` before any JAX computation. Order of precedence: explicit coordinator flags,
then the environment that `jax.distributed.initialize()` detects (SLURM, Open MPI,
Kubernetes/JobSet), then nothing (one process). On CPU the collectives go through gloo, so
several processes on one machine form a real multi-host run.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import jax


@dataclasses.dataclass
class DistributedOptions:
    coordinator: str | None = None
    """HOST:PORT of process 0's coordination service."""
    coordinator_bind: str | None = None
    """Where process 0's coordination service listens: HOST:PORT, or HOST with --coordinator's port.
    Default: --coordinator's own host; in an auto-detected cluster, JAX's default (every interface)."""
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: list[int] | None = None
    """GPUs this process drives, when the launcher gives each process its own (e.g. one per task)."""
    timeout_s: int = 60
    """How long to wait for the coordinator before a clear error."""
    heartbeat_timeout_s: int = 30
    """How long the others wait for a dead process before stopping with a non-zero exit."""


def detected_cluster() -> str | None:
    """The launcher whose environment describes a multi-process job, if any."""
    env = os.environ
    if "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "SLURM"
    if int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "Open MPI"
    if "JOBSET_NAME" in env or ("JOB_COMPLETION_INDEX" in env and "KUBERNETES_SERVICE_HOST" in env):
        return "Kubernetes JobSet"
    return None


def bind_address(options: DistributedOptions) -> str | None:
    """The HOST:PORT process 0 listens on (None: JAX's default, every interface). Explicit
    --coordinator flags bind where they point, so `127.0.0.1:PORT` is reachable from this host only."""
    if options.coordinator_bind is None:
        return options.coordinator
    host, _, port = options.coordinator_bind.rpartition(":")
    if port.isdigit() and host:
        return options.coordinator_bind
    if options.coordinator is None:
        raise ValueError(f"--coordinator-bind {options.coordinator_bind!r} names no port and there is no --coordinator "
                         "to take it from: give HOST:PORT (e.g. 10.0.0.1:1234)")
    return f"{options.coordinator_bind}:{options.coordinator.rpartition(':')[2]}"


def wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Polls HOST:PORT until it accepts a connection; a clear error naming it after `timeout_s`."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.1:1234)")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(2.0, timeout_s)):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"cannot reach the coordinator at {address} within {timeout_s:g} s ({err}); start process 0 "
                    "first, check the address and port, or raise --distributed-timeout"
                ) from None
            time.sleep(0.25)


def initialize(options: DistributedOptions | None = None) -> bool:
    """Starts the runtime; returns True for a multi-process run, False for a single process."""
    options = options or DistributedOptions()
    explicit = options.coordinator is not None
    if explicit and (options.num_processes is None or options.process_id is None):
        raise ValueError("--coordinator needs --num-processes and --process-id too")
    cluster = None if explicit else detected_cluster()
    if not explicit and cluster is None:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the CPU client's collectives
    jax.config.update("jax_enable_preemption_service", True)
    kwargs = dict(
        initialization_timeout=options.timeout_s,
        heartbeat_timeout_seconds=options.heartbeat_timeout_s,
        local_device_ids=options.local_device_ids,
        coordinator_bind_address=bind_address(options),
    )
    if explicit:
        if options.process_id != 0:  # process 0 hosts the coordinator; the others must reach it
            wait_for_coordinator(options.coordinator, options.timeout_s)
        jax.distributed.initialize(options.coordinator, options.num_processes, options.process_id, **kwargs)
    else:
        jax.distributed.initialize(**kwargs)
    return True


BARRIER_TIMEOUT_S = 3600
"""How long a process waits at `barrier` for the others (a dead one is found sooner, by the heartbeat)."""


def barrier(name: str, timeout_s: int = BARRIER_TIMEOUT_S) -> None:
    """Every process of a multi-process run waits here for the others (nothing with one process).

    The coordination service's barrier, not a collective: the CPU collectives (gloo) give a peer
    30 s to connect when a program first runs a collective, and one process may finish compiling
    a program minutes after another on a loaded machine. `multihost_utils.sync_global_devices`
    would itself be such a collective, so this reaches the runtime's client (as Orbax does)."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed

    distributed.global_state.client.wait_at_barrier(f"triskele-{name}", timeout_s * 1000)
