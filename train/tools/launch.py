"""`--local-processes N`: a multi-host run on this machine, for trying it out (127.0.0.1 only)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

_DROP = {"--local-processes", "--devices-per-process"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_argv(argv: list[str]) -> list[str]:
    """The command line without the launcher's own flags (and their values)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _DROP:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def launch_local(argv: list[str], processes: int, devices_per_process: int) -> int:
    """Starts `processes` copies of this training command with a coordinator on 127.0.0.1; each
    sees `devices_per_process` simulated CPU devices. Returns the first non-zero exit code."""
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}")
    base = [sys.executable, "-m", "triskele.train", *child_argv(argv),
            "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes)]
    # Each child in a session of its own: a Ctrl-C reaches it once, forwarded from here, not twice.
    children = [subprocess.Popen([*base, "--process-id", str(i)], env=env, start_new_session=True)
                for i in range(processes)]

    def forward(number: int, frame) -> None:
        for child in children:
            child.send_signal(number)

    previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        codes = [child.wait() for child in children]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return next((code for code in codes if code), 0)
