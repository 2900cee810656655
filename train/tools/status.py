"""`python -m triskele.train status --workdir W`: whether a run has reached its last step, read from
its folder alone (its config.json and its complete checkpoints; no JAX, no Orbax), so that a batch
script can tell an unfinished run (requeue it) from a finished one.

Exit status: 0 finished, 75 unfinished (EX_TEMPFAIL: run the same command again), 2 no run there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from triskele.train.commands import Command

UNFINISHED_EXIT = 75


def run_status(workdir: Path) -> dict[str, Any]:
    """{"steps": the run's last step, "checkpoint": its newest complete checkpoint's step (None: none),
    "finished": whether that is the last step}. An Orbax save in progress is a folder whose name is
    not a plain step number; it does not count."""
    config_file = workdir / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{workdir} holds no run (no config.json); give the --workdir a training run wrote")
    steps = int(json.loads(config_file.read_text())["run"]["steps"])
    folder = workdir / "checkpoints"
    saved = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit()) if folder.is_dir() else []
    latest = saved[-1] if saved else None
    return {"steps": steps, "checkpoint": latest, "finished": latest is not None and latest >= steps}


def _status_command(parser: argparse.ArgumentParser):
    parser.add_argument("--workdir", required=True, help="the training run's folder")

    def run(args: argparse.Namespace) -> int:
        status = run_status(Path(args.workdir))
        word = "finished" if status["finished"] else "unfinished"
        print(f"{word}: checkpoint {status['checkpoint']} of step {status['steps']} in {args.workdir}", flush=True)
        return 0 if status["finished"] else UNFINISHED_EXIT

    return run


STATUS = Command("Say whether a run has reached its last step (exit 0) or not (exit 75), from its folder alone.",
                 _status_command)
