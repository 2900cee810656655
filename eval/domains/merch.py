"""Merchandising: shelf compliance reports, the gallery index (the `gallery` command), predictions;
the evaluation is the model's over the split, its metrics `triskele.train.domains.merch.metrics`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.commands import Command
from triskele.train.domains.merch.data import EMPTY


def compliance_report(planogram: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Per-facing comparison of a planogram grid with the recognised SKUs (EMPTY = gap)."""
    facings = []
    for (row, col), expected in np.ndenumerate(planogram):
        found = predicted[row, col]
        status = "ok" if found == expected else ("gap" if found == EMPTY else "wrong_sku")
        facings.append({"row": int(row), "col": int(col), "expected": _plain(expected), "found": _plain(found),
                        "status": status})
    compliant = sum(f["status"] == "ok" for f in facings)
    return {"compliance": compliant / len(facings), "violations": [f for f in facings if f["status"] != "ok"],
            "facings": facings}


def _plain(value):
    """JSON form of a SKU id: null for a gap, else the id as given."""
    if value == EMPTY:
        return None
    return value.item() if isinstance(value, np.generic) else value


def gallery_path(workdir: Path) -> Path:
    return Path(workdir) / "gallery" / "index.npz"


def build_gallery(model, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """Embeds every reference image of `input_dir/<sku>/*` and saves the index next to the checkpoints,
    with what it was built with (`built_with`): the model's identity, its preprocessing and the
    reference folder. A class folder named `empty` holds pictures of empty facings (gaps). `model`:
    a LiveModel or an ExportedModel."""
    import io

    from triskele.eval.model import input_preprocessing
    from triskele.train.bookkeeping.files import write_atomically
    from triskele.train.data.images import read_image
    from triskele.train.domains.merch.data import class_folders

    classes = class_folders(Path(input_dir))
    names = [name for name, paths in classes.items() for _ in paths]
    images = np.stack([read_image(p, model.meta["image_size"], 3) for paths in classes.values() for p in paths])
    embeddings = model(images)["embedding"]
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


class MerchIO:
    """Shelf images with a planogram (`<stem>.json` beside `<stem>.jpg`): a compliance report
    `NAME.json` and `NAME.png` with the violating facings outlined (NAME: the input's path under the
    inputs' root, its suffix replaced, kept where two inputs share a stem). Other images are crops:
    `predictions.csv` with the top-5 classes (and the nearest gallery SKU when the run has a gallery
    index)."""

    def __init__(self, meta: dict[str, Any], workdir: Path | None):
        from triskele.train.data.images import IMAGE_SUFFIXES

        self.size, self.names = meta["image_size"], meta["class_names"]
        has_index = workdir is not None and gallery_path(workdir).is_file()
        self.gallery = load_gallery(workdir, meta) if has_index else None
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        """Each image (a shelf with its planogram, whose change redoes it); a shelf's planogram is
        checked against the gallery before anything runs."""
        from triskele.eval.engine import JOB_FILES, Unit, file_units
        from triskele.eval.inputs import refuse_clashes
        from triskele.train.domains.merch.data import read_planogram

        units = [Unit(u.key, (u.paths[0], u.paths[0].with_suffix(".json")), u.stem)
                 if u.paths[0].with_suffix(".json").is_file() else u for u in file_units(root, files)]
        refuse_clashes({u.key: [u.named(".json"), u.named(".png")] for u in units if len(u.paths) == 2},
                       (*JOB_FILES, "predictions.csv"))
        for shelf in (u.paths[0] for u in units if len(u.paths) == 2):
            if self.gallery is None:
                raise ValueError(f"shelf {shelf} needs a gallery index to recognise facings; build one first")
            planogram = read_planogram(shelf.with_suffix(".json"))
            missing = sorted({v for row in planogram["rows"] for v in row if v != EMPTY} - set(self.gallery[1]))
            if missing:
                raise ValueError(f"planogram {shelf.with_suffix('.json')} names SKUs not in the gallery: {missing}")
        return units

    def read(self, unit) -> tuple[np.ndarray, Any]:
        from triskele.train.data.images import read_image
        from triskele.train.domains.merch.data import facing_crops, read_planogram

        path = unit.paths[0]
        if len(unit.paths) == 2:
            planogram = read_planogram(unit.paths[1])
            return facing_crops(path, planogram, self.size), planogram
        return read_image(path, self.size, 3)[None], None

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        if context is not None:
            return self._write_shelf(unit, context, outputs["embedding"], out_dir)
        probs = outputs["probabilities"][0]
        top = np.argsort(-probs)[:5]
        nearest = ""
        if self.gallery is not None:
            nearest = str(self.gallery[1][int(np.argmax(outputs["embedding"][0] @ self.gallery[0].T))])
        return {"image": unit.key, "top": [self.names[j] for j in top], "top1_probability": float(probs[top[0]]),
                "gallery_nearest": nearest}

    def _write_shelf(self, unit, planogram: dict, embeddings: np.ndarray, out_dir: Path) -> dict[str, Any]:
        import io

        from PIL import Image, ImageDraw
        from triskele.train.bookkeeping.files import write_atomically

        gallery, names = self.gallery
        found_names = names[np.argmax(embeddings @ gallery.T, axis=1)]
        found = np.array([EMPTY if n == "empty" else n for n in found_names], dtype=object)
        rows, cols = len(planogram["rows"]), len(planogram["rows"][0])
        report = compliance_report(np.array(planogram["rows"], dtype=object), found.reshape(rows, cols))
        write_atomically(out_dir / unit.named(".json"), (json.dumps(report, indent=2) + "\n").encode())
        picture = Image.open(unit.paths[0]).convert("RGB")
        grid = planogram["grid"] or {"left": 0, "top": 0, "width": picture.width, "height": picture.height}
        w, h = grid["width"] / cols, grid["height"] / rows
        draw = ImageDraw.Draw(picture)
        for v in report["violations"]:
            x0, y0 = grid["left"] + v["col"] * w, grid["top"] + v["row"] * h
            draw.rectangle([x0 + 1, y0 + 1, x0 + w - 2, y0 + h - 2], outline=(255, 0, 0), width=3)
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        write_atomically(out_dir / unit.named(".png"), buffer.getvalue())
        return {"shelf": unit.key, "compliance": report["compliance"]}

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        from triskele.eval.engine import write_csv

        crops = [r for r in rows if "image" in r]
        if not crops:
            return []
        write_csv(out_dir / "predictions.csv",
                  ["image"] + [f"top{k}" for k in range(1, 6)] + ["top1_probability", "gallery_nearest"],
                  [[r["image"], *r["top"], *[""] * (5 - len(r["top"])), f"{r['top1_probability']:.4f}",
                    r["gallery_nearest"]] for r in crops])
        return ["predictions.csv"]


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> MerchIO:
    """`workdir`: the run's folder, where the gallery index is kept (merch has no predict flags);
    `meta` with the model's `identity` refuses an index built by another model."""
    return MerchIO(meta, workdir)


before_predict = refresh_gallery
"""What `triskele.eval.evaluate.predict` runs first with the model: a stale gallery index rebuilt."""


def _gallery_command(parser: argparse.ArgumentParser):
    parser.add_argument("--input", required=True, help="folder of <sku>/ folders of reference images")

    def run(args: argparse.Namespace) -> Any:
        from triskele.eval.model import LiveModel
        from triskele.mesh import make_mesh
        from triskele.train.run import restore_params

        parts, params, step = restore_params(Path(args.workdir), make_mesh(args.mesh or ""), args.step)
        if parts.config.domain != "merch":
            raise ValueError(f"a gallery index is for merch runs; {args.workdir} trained {parts.config.domain!r}")
        return build_gallery(LiveModel(parts, params, step=step), Path(args.input), Path(args.workdir))

    return run


COMMANDS = {"gallery": Command("merch: embed reference images into WORKDIR/gallery/index.npz.", _gallery_command)}
