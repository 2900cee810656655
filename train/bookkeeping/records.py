"""Reading a run's metrics.jsonl back (light: the plots and the help of the command lines read it too)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from triskele.train.bookkeeping.files import open_regular


def read_records(path: Path) -> tuple[dict[int, dict], dict[int, dict]]:
    """(training records, evaluation records) of a metrics.jsonl by step; a later line for a step
    replaces an earlier one, a line cut short by a kill is passed over, a link is refused."""
    train, evaluation = {}, {}
    if not os.path.lexists(path):
        return train, evaluation
    with open_regular(path, "r") as f:
        lines = f.read().splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        target = evaluation if "eval_loss" in record else train if "loss" in record else None
        if target is not None:
            target[int(record["step"])] = record
    return train, evaluation
