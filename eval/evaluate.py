"""Evaluate a checkpoint on any mesh and write DIR/eval/<step>/report.json with plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
from triskele.eval.exported import load_exported
from triskele.eval.predict import LiveModel
from triskele.eval.quantize import weight_bytes
from triskele.mesh import make_mesh
from triskele.train.data.bad_records import tolerant
from triskele.train.domains import get_domain
from triskele.train.run import evaluate_split, restore_run


def evaluate_checkpoint(
    workdir: str | Path,
    mesh: str | None = None,
    data: str | None = None,
    split: str = "test",
    step: int | None = None,
    holdout: str | None = None,
) -> dict[str, Any]:
    """Restores the latest (or `step`) checkpoint of `workdir` onto `mesh` (default: all local devices
    on `data`), evaluates `split` of its data (or of `data`), writes the report, returns it.

    `holdout` (deepfake) evaluates only the fakes of that manipulation method, plus all reals."""
    workdir = Path(workdir)
    overrides = {}
    if data:
        overrides["data.path"] = data
    if holdout:
        overrides["deepfake.eval_methods"] = holdout
    parts, state, step = restore_run(workdir, make_mesh(mesh or ""), step, overrides)
    domain = parts.domain
    source = tolerant(parts.domain.open_split(parts.config, split), parts.config.data.bad_records, split)
    totals = evaluate_split(parts, state.params, source)
    out_dir = workdir / "eval" / str(step)
    report = {
        "domain": parts.config.domain,
        "step": step,
        "split": split,
        "records": len(source),
        "records_unreadable": int(totals.get("unreadable", 0)),
        "data": parts.config.data.path or "synthetic",
        **({"holdout": holdout} if holdout else {}),
        "mesh": {k: int(v) for k, v in parts.mesh.shape.items()},
        "format": parts.config.model.quantization or "float32",
        "weight_bytes": weight_bytes(state.params),
        "metrics": domain.metrics(totals),
    }
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        report["files"] = domain.evaluator().write_artifacts(parts, state.params, source, totals, out_dir)
        (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    report["report"] = str(out_dir / "report.json")
    return report


def predict(workdir: str | Path | None, input_dir: str | Path, output_dir: str | Path, mesh: str | None = None,
            step: int | None = None, exported: str | Path | None = None) -> dict[str, Any]:
    """Predicts a folder with a checkpoint of `workdir`, or with an `exported` model (then `workdir`,
    if given, is only where a domain looks for what it keeps beside the run, e.g. merch's gallery index)."""
    if exported is not None:
        model = load_exported(exported)
    elif workdir is None:
        raise ValueError("predict needs --workdir (a checkpoint) or --exported FILE")
    else:
        parts, state, _ = restore_run(Path(workdir), make_mesh(mesh or ""), step)
        model = LiveModel(parts, state.params)
    evaluator = get_domain(model.meta["domain"]).evaluator()
    return evaluator.predict_folder(model, Path(input_dir), Path(output_dir), Path(workdir) if workdir else None)


def build_gallery(workdir: str | Path, input_dir: str | Path, mesh: str | None = None,
                  step: int | None = None) -> dict[str, Any]:
    """merch: embeds a folder of reference images (`<sku>/*.jpg`) into WORKDIR/gallery/index.npz."""
    parts, state, _ = restore_run(Path(workdir), make_mesh(mesh or ""), step)
    if parts.config.domain != "merch":
        raise ValueError(f"a gallery index is for merch runs; {workdir} trained {parts.config.domain!r}")
    return parts.domain.evaluator().build_gallery(LiveModel(parts, state.params), Path(input_dir), Path(workdir))
