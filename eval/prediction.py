"""Predict with a checkpoint or an exported model through the streaming engine: into files
(`predict`) or, for notebooks, as each input's outputs come (`predict_iter`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from triskele.eval.domains import inference_of
from triskele.eval.engine import Prediction, iter_predictions, predict_files
from triskele.eval.model import load_model
from triskele.train.config.schema import InputLimits
from triskele.train.domains import domains, get_domain, spec_of


def _given(model: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The predict options given (by flag dest); one that is not the model's domain's is refused,
    naming whose it is."""
    domain = get_domain(model.meta["domain"])
    own = {flag.dest for flag in domain.predict_flags}
    given = {name: value for name, value in options.items() if value is not None and value is not False}
    for name in sorted(set(given) - own):
        owners = [d.name for d in domains().values() if name in {f.dest for f in d.predict_flags}]
        whose = f"an option of {', '.join(owners)}" if owners else "no domain's option"
        mine = ", ".join(sorted(own)) or "none"
        raise ValueError(f"predict option {name!r} is {whose}; this model is {domain.name} (its options: {mine})")
    return given


def _predict_io(model: Any, workdir: str | Path | None, given: dict[str, Any], limits: InputLimits | None) -> Any:
    """The model's domain's reader and writer with the options given, reading within `limits`. A
    domain's inference module may have `before_predict(model, workdir)`, run first (e.g. an index of
    reference embeddings built by another model rebuilt); its `predict_io` gets the model's
    `identity` and the `limits` (default `InputLimits()`) in `meta`."""
    module = inference_of(spec_of(model.meta["domain"], model.meta.get("options", {})))
    folder = Path(workdir) if workdir else None
    before = getattr(module, "before_predict", None)
    if before is not None:
        before(model, folder)
    return module.predict_io({**model.meta, "identity": model.identity, "limits": limits or InputLimits()}, given,
                             folder)


def predict(workdir: str | Path | None, input_spec: str | Path, output_dir: str | Path, mesh: str | None = None,
            step: int | None = None, exported: str | Path | None = None, batch: int | None = None,
            overwrite: bool = False, workers: int = 0, threads: int = 4, prefetch: int = 8, progress: bool = True,
            limits: InputLimits | None = None, **options: Any) -> dict[str, Any]:
    """Predicts the inputs of `input_spec` (a folder, searched recursively; a glob; or a text file
    of paths) into `output_dir` with a checkpoint of `workdir` or an `exported` model, through the
    streaming engine; returns the summary. `options`: the model's domain's predict flags by name
    (e.g. mars' `stride=43, tta="flip", overlay=True`), recorded with the model's identity in
    OUTPUT's manifest: a rerun with another model or other options is refused unless `overwrite`.
    `limits`: the input limits (default `InputLimits()`); an input over one goes to errors.csv."""
    model = load_model(workdir, exported, mesh, step, batch)
    given = _given(model, options)
    return predict_files(model, _predict_io(model, workdir, given, limits), input_spec, output_dir, overwrite=overwrite,
                         threads=threads, prefetch=prefetch, workers=workers, progress=progress, options=given)


def predict_iter(workdir: str | Path | None, input_spec: str | Path, mesh: str | None = None,
                 step: int | None = None, exported: str | Path | None = None, batch: int | None = None,
                 limits: InputLimits | None = None, **options: Any) -> Iterator[Prediction]:
    """For notebooks: each input's model outputs as they come (`Prediction(unit, outputs, context,
    error)`), through the same engine as `predict`, nothing written."""
    model = load_model(workdir, exported, mesh, step, batch)
    return iter_predictions(model, _predict_io(model, workdir, _given(model, options), limits), input_spec)
