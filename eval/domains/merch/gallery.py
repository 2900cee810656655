"""The gallery index of a merch run: reference images embedded by the run's model (the recogniser,
or the facing detector's own embedding), kept beside the checkpoints with what built them, rebuilt
when another model would read it, carried by exports and quantized copies."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np


def gallery_path(workdir: Path) -> Path:
    return Path(workdir) / "gallery" / "index.npz"


def build_gallery(model, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """Embeds every reference image of `input_dir/<sku>/*` and saves the index next to the checkpoints,
    with what it was built with (`built_with`): the model's identity, its preprocessing and the
    reference folder. A class folder named `empty` holds pictures of empty facings (gaps). `model`:
    a LiveModel or an ExportedModel."""
    from triskele.eval.model import input_preprocessing
    from triskele.train.bookkeeping.files import write_atomically
    from triskele.train.domains.merch.data import class_folders

    classes = class_folders(Path(input_dir))
    names = [name for name, paths in classes.items() for _ in paths]
    files = [p for paths in classes.values() for p in paths]
    from triskele.train.domains import spec_of

    task = spec_of(model.meta["domain"], model.meta.get("options", {}))
    embeddings = task.inference_module().reference_embeddings(model, files)  # the recogniser's or the detector's
    built_with = {"model": model.identity, "preprocessing": input_preprocessing(model.meta),
                  "references": str(Path(input_dir).resolve())}
    buffer = io.BytesIO()
    np.savez(buffer, embeddings=embeddings, names=np.array(names), built_with=np.array(json.dumps(built_with)))
    write_atomically(gallery_path(workdir), buffer.getvalue())
    return {"gallery": str(gallery_path(workdir)), "images": len(names), "skus": len(classes)}


def _built_with(workdir: Path) -> dict[str, Any]:
    """What the index was built with ({} for an index written before it was recorded)."""
    with np.load(gallery_path(workdir)) as index:
        return json.loads(str(index["built_with"])) if "built_with" in index else {}


def _stale(built: dict[str, Any], meta: dict[str, Any]) -> str | None:
    """Why an index built with `built` does not serve the model of `meta` (with its identity), or None."""
    from triskele.eval.model import describe_model, input_preprocessing

    if built.get("model") != meta["identity"]:
        return f"it was built by {describe_model(built.get('model'))}, this is {describe_model(meta['identity'])}"
    if built.get("preprocessing") != input_preprocessing(meta):
        return (f"it was built with preprocessing {built.get('preprocessing')}, this model's is "
                f"{input_preprocessing(meta)}")
    return None


def refresh_gallery(model, workdir: Path | None) -> dict[str, Any] | None:
    """Before predicting: an index built by another model or with other preprocessing is rebuilt
    with `model` from the reference folder it records, when that folder is still there; returns the
    rebuild's summary, or None when nothing was rebuilt (`load_gallery` refuses a stale index)."""
    if workdir is None or not gallery_path(workdir).is_file():
        return None
    built = _built_with(workdir)
    meta = {**model.meta, "identity": model.identity}
    references = Path(built.get("references", ""))
    if _stale(built, meta) is None or not built.get("references") or not references.is_dir():
        return None
    rebuilt = build_gallery(model, references, workdir)
    print(f"gallery index {gallery_path(workdir)} rebuilt from {references}: {_stale(built, meta)}", flush=True)
    return rebuilt


def load_gallery(workdir: Path, meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The index's (embeddings, names); one built by another model than `meta['identity']` or with
    other preprocessing is refused, naming both models and the command that rebuilds it."""
    path = gallery_path(workdir)
    rebuild = f"python -m triskele.eval gallery --workdir {workdir} --input REFERENCE_FOLDER"
    if not path.is_file():
        raise ValueError(f"no gallery index at {path}; build one with {rebuild}")
    built = _built_with(workdir)
    if "identity" in meta and (why := _stale(built, meta)) is not None:
        folder = built.get("references")
        gone = f"its reference folder {folder} is gone" if folder else "it records no reference folder"
        raise ValueError(f"gallery index {path} does not belong to this model: {why}, and {gone}; rebuild it for "
                         f"this model with {rebuild} (and the same --step or --exported)")
    with np.load(path) as index:
        return index["embeddings"], index["names"].astype(str)


def nearest_skus(embedding: np.ndarray, gallery: tuple[np.ndarray, np.ndarray], k: int = 5) -> list[tuple[str, float]]:
    """The `k` gallery SKUs nearest to `embedding`, each once with its best cosine similarity, nearest first."""
    embeddings, names = gallery
    similarity = embeddings @ embedding
    best: dict[str, float] = {}
    for i in np.argsort(-similarity, kind="stable"):
        best.setdefault(str(names[i]), float(similarity[i]))
        if len(best) == k:
            break
    return list(best.items())


def gallery_command_for(meta: dict[str, Any], workdir: Path | None) -> str:
    """How to build the index a shelf needs: in the run's folder, or (an exported model alone) in
    the folder it was exported from, then carried by exporting again."""
    if workdir is not None:
        return f"python -m triskele.eval gallery --workdir {workdir} --input REFERENCE_FOLDER"
    source = meta.get("source", "RUN")
    return (f"python -m triskele.eval gallery --workdir {source} --input REFERENCE_FOLDER, then export again (the "
            f"export carries it) or predict with --workdir {source} beside --exported")


def refresh_before_predict(model: Any, workdir: Path | None) -> dict[str, Any] | None:
    """`refresh_gallery` on the run's folder, or on an exported model's carried run files."""
    return refresh_gallery(model, workdir if workdir is not None else carried(model.meta))


def carried(meta: dict[str, Any]) -> Path | None:
    """The run files an exported model carries beside it (its gallery index), if any."""
    return Path(meta["run_files"]) if meta.get("run_files") else None


def carry_files(workdir: Path, folder: Path, source: dict[str, Any] | None = None,
                copy: dict[str, Any] | None = None) -> list[str]:
    """Copies the run's gallery index into `folder` (a quantized copy's run folder, an exported
    model's run files) so that predict with the copy finds it; returns what it wrote. `copy`: the
    copy's identity where it computes what the checkpoint `source` (its identity) computes (an export
    of the same weights): an index built by `source` is recorded as built by the copy. Otherwise predict
    rebuilds it from its reference folder, as any index built by another model."""
    from triskele.train.bookkeeping.files import write_atomically

    if not gallery_path(workdir).is_file():
        return []
    with np.load(gallery_path(workdir)) as index:
        arrays = dict(index)
    built = _built_with(workdir)
    if copy is not None and built.get("model") == source:
        arrays["built_with"] = np.array(json.dumps({**built, "model": copy}))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomically(gallery_path(folder), buffer.getvalue())
    return [str(gallery_path(folder))]


def run_gallery(meta: dict[str, Any], workdir: Path | None) -> tuple[Path | None, tuple[np.ndarray, np.ndarray] | None]:
    """(the folder the run's files are in: `workdir`, or what an exported model carries; its gallery
    index, or None without one): what predict reads SKUs from."""
    folder = workdir if workdir is not None else carried(meta)
    has_index = folder is not None and gallery_path(folder).is_file()
    return folder, load_gallery(folder, meta) if has_index else None
