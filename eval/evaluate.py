"""Evaluate a checkpoint on any mesh and write DIR/eval/<step>/report.json with plots; predict
with the streaming engine; merch's gallery index."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
from triskele.eval.engine import Prediction, iter_predictions, predict_files
from triskele.eval.model import LiveModel, load_model
from triskele.eval.quantize import weight_bytes
from triskele.mesh import make_mesh
from triskele.train.auto_mesh import AUTO, resolve_auto_mesh
from triskele.train.data.bad_records import tolerant
from triskele.train.domains import get_domain
from triskele.train.run import evaluate_split, restore_params, restore_run


def evaluate_checkpoint(
    workdir: str | Path,
    mesh: str | None = None,
    data: str | None = None,
    split: str = "test",
    step: int | None = None,
    holdout: str | None = None,
) -> dict[str, Any]:
    """Restores the latest (or `step`) checkpoint of `workdir` onto `mesh` (default: all local
    devices on `data`; `auto`: the planner's pick), evaluates `split` of its data (or of `data`),
    writes the report, returns it.
    The whole state is read, so that a damaged checkpoint is reported even where its parameters
    alone would still read.

    `holdout` (deepfake) evaluates only the fakes of that manipulation method, plus all reals."""
    workdir = Path(workdir)
    overrides = {}
    if data:
        overrides["data.path"] = data
    if holdout:
        overrides["deepfake.eval_methods"] = holdout
    if mesh == AUTO:  # the planner's pick for these devices, resolved when the run is prepared
        overrides["mesh"] = AUTO
    parts, state, step = restore_run(workdir, None if mesh == AUTO else make_mesh(mesh or ""), step, overrides,
                                     choose_mesh=resolve_auto_mesh)
    params = state.params
    domain, evaluator = parts.domain, parts.domain.evaluator()
    source = tolerant(domain.open_split(parts.config, split), parts.config.data.bad_records, split)
    totals = evaluate_split(parts, params, source)
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
        "weight_bytes": weight_bytes(params),
        "metrics": domain.metrics(totals),
        **(evaluator.report_fields(parts, params, source) if hasattr(evaluator, "report_fields") else {}),
    }
    if jax.process_index() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        report["files"] = evaluator.write_artifacts(parts, params, source, totals, out_dir)
        (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    report["report"] = str(out_dir / "report.json")
    return report


@dataclasses.dataclass
class PredictOptions:
    """What predict may be asked besides its inputs (each domain uses what applies to it)."""

    stride: int | None = None
    """mars: the sliding windows' stride in pixels (default about 2/3 of the window)."""
    tta: str | None = None
    """mars: 'flip' averages the probabilities of the mirrored pass."""
    overlay: bool = False
    """mars: also write a colour overlay of the classes over each image."""
    save_faces: Path | None = None
    """deepfake: keep the face crops found in video files here (<video>/<frame>.png)."""
    workdir: Path | None = None
    """Where the run keeps what prediction may use beside the model (merch's gallery index)."""


def predict(workdir: str | Path | None, input_spec: str | Path, output_dir: str | Path, mesh: str | None = None,
            step: int | None = None, exported: str | Path | None = None, batch: int | None = None,
            overwrite: bool = False, workers: int = 0, threads: int = 4, prefetch: int = 8, progress: bool = True,
            **options: Any) -> dict[str, Any]:
    """Predicts the inputs of `input_spec` (a folder, searched recursively; a glob; or a text file
    of paths) into `output_dir` with a checkpoint of `workdir` or an `exported` model, through the
    streaming engine; returns the summary. `options`: fields of `PredictOptions`."""
    model = load_model(workdir, exported, mesh, step, batch)
    predict_options = PredictOptions(**options, workdir=Path(workdir) if workdir else None)
    io = get_domain(model.meta["domain"]).evaluator().predict_io(model.meta, predict_options)
    return predict_files(model, io, input_spec, output_dir, overwrite=overwrite, threads=threads,
                         prefetch=prefetch, workers=workers, progress=progress)


def predict_iter(workdir: str | Path | None, input_spec: str | Path, mesh: str | None = None,
                 step: int | None = None, exported: str | Path | None = None, batch: int | None = None,
                 **options: Any) -> Iterator[Prediction]:
    """For notebooks: each input's model outputs as they come (`Prediction(unit, outputs, context,
    error)`), through the same engine as `predict`, nothing written."""
    model = load_model(workdir, exported, mesh, step, batch)
    io = get_domain(model.meta["domain"]).evaluator().predict_io(
        model.meta, PredictOptions(**options, workdir=Path(workdir) if workdir else None))
    return iter_predictions(model, io, input_spec)


def build_gallery(workdir: str | Path, input_dir: str | Path, mesh: str | None = None,
                  step: int | None = None) -> dict[str, Any]:
    """merch: embeds a folder of reference images (`<sku>/*.jpg`) into WORKDIR/gallery/index.npz."""
    parts, params, _ = restore_params(Path(workdir), make_mesh(mesh or ""), step)
    if parts.config.domain != "merch":
        raise ValueError(f"a gallery index is for merch runs; {workdir} trained {parts.config.domain!r}")
    return parts.domain.evaluator().build_gallery(LiveModel(parts, params), Path(input_dir), Path(workdir))
