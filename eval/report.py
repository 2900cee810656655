"""Evaluate a checkpoint on any mesh and write DIR/eval/<step>/report.json with its domain's artifacts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
from triskele.eval.quantize import weight_bytes
from triskele.mesh import make_mesh
from triskele.train.auto_mesh import AUTO, resolve_auto_mesh
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.data.bad_records import tolerant
from triskele.train.domains import domains
from triskele.train.run import restore_run


def evaluate_checkpoint(
    workdir: str | Path,
    mesh: str | None = None,
    data: str | None = None,
    split: str = "test",
    step: int | None = None,
    output: str | Path | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Restores the latest (or `step`) checkpoint of `workdir` onto `mesh` (default: all local
    devices on `data`; `auto`: the planner's pick), evaluates `split` of its data (or of `data`),
    writes the report to `output` (default WORKDIR/eval/<step>; a run store that cannot be written,
    mounted read-only, needs one, and is told so before the evaluation), returns it.
    The whole state is read, so that a damaged checkpoint is reported even where its parameters
    alone would still read.

    `options`: the run's domain's evaluate flags by name (e.g. deepfake's `holdout="Sharpen"`
    evaluates only that method's fakes, plus all reals); each sets the config key its flag names."""
    workdir = Path(workdir)
    overrides = {"data.path": data} if data else {}
    if mesh == AUTO:  # the planner's pick for these devices, resolved when the run is prepared
        overrides["mesh"] = AUTO
    given = {name: value for name, value in options.items() if value is not None}
    with StopRequest("evaluation", "stopping after the batch in hand, writing no report", sigterm=False) as stop:
        parts, state, step = restore_run(workdir, None if mesh == AUTO else make_mesh(mesh or ""), step,
                                         {**overrides, **_flag_overrides(given)}, choose_mesh=resolve_auto_mesh)
        stop.raise_if_requested()
        out_dir = Path(output) if output is not None else workdir / "eval" / str(step)
        if jax.process_index() == 0:
            _check_writable(out_dir, given=output is not None)
        params = state.params
        evaluator = parts.domain.evaluator(parts, True)
        source = tolerant(parts.domain.open_split(parts.config, split), parts.config.data.bad_records, split)
        totals = evaluator.accumulate(params, source, stop)
        stop.raise_if_requested()
    report = {
        "domain": parts.config.domain,
        "workdir": str(workdir.resolve()),  # the run evaluated: a report in --output names its model
        "step": step,
        "split": split,
        "records": len(source),
        "records_unreadable": int(totals.get("unreadable", 0)),
        "data": parts.config.data.path or "synthetic",
        **given,
        "mesh": {k: int(v) for k, v in parts.mesh.shape.items()},
        "format": parts.config.model.quantization or "float32",
        "weight_bytes": weight_bytes(params),
        "metrics": evaluator.metrics(totals),
        **evaluator.report(totals),
    }
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        report["files"] = evaluator.write_artifacts(params, source, totals, out_dir)
        write_atomically(out_dir / "report.json", (json.dumps(report, indent=2) + "\n").encode())
    report["report"] = str(out_dir / "report.json")
    return report


def _check_writable(folder: Path, given: bool) -> None:
    """A ValueError naming `folder` and the fix when it could not be made and written to; nothing
    is made here, so that an evaluation stopped before its report leaves no folder behind."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reason = (f"{existing} is not a folder" if not existing.is_dir()
              else f"{existing} is not writable (a read-only mount?)" if not os.access(existing, os.W_OK) else None)
    if reason:
        fix = "give another" if given else "give --output DIR (Python: output=DIR) for the report"
        raise ValueError(f"the evaluation report cannot be written to {folder}: {reason}; {fix}")


def _flag_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The config keys the given evaluate flags set (one of another domain's is refused when the
    config applies it, naming the domain)."""
    keys = {flag.dest: flag.key for domain in domains().values() for flag in domain.evaluate_flags}
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise ValueError(f"evaluate has no option {unknown[0]!r}; the domains' evaluate options are "
                         f"{', '.join(sorted(keys)) or 'none'}")
    return {keys[name]: value for name, value in given.items()}
