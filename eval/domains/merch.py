"""Merchandising: shelf compliance reports, the gallery index (the `gallery` command), predictions;
the evaluation is the model's over the split, its metrics `triskele.train.domains.merch.metrics`."""

from __future__ import annotations

import argparse
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from triskele.train.commands import Command
from triskele.train.config import InputLimits
from triskele.train.domains.merch.data import EMPTY

STATUSES = {"ok": ((34, 160, 60), "ok"), "wrong_sku": ((220, 30, 30), "wrong SKU"),
            "gap": ((255, 140, 0), "gap (planned SKU missing)"), "unexpected": ((30, 100, 230), "unexpected (extra)")}
"""Each facing status of a compliance report: its colour in the shelf overlay and its name in the legend."""
MIN_CELL = 96
"""Pixels: a shelf photo whose facings are smaller is enlarged in its overlay, so labels stay legible."""


def _status(expected, found) -> str:
    if found == expected:
        return "ok"
    if found == EMPTY:
        return "gap"
    return "unexpected" if expected == EMPTY else "wrong_sku"


def compliance_report(planogram: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Per-facing comparison of a planogram grid with the recognised SKUs (EMPTY = gap): each
    facing's status (`STATUSES`), how many facings have each, the share that is ok."""
    facings = [{"row": int(row), "col": int(col), "expected": _plain(expected), "found": _plain(predicted[row, col]),
                "status": _status(expected, predicted[row, col])} for (row, col), expected in np.ndenumerate(planogram)]
    counts = {status: sum(f["status"] == status for f in facings) for status in STATUSES}
    return {"compliance": counts["ok"] / len(facings), "counts": counts,
            "violations": [f for f in facings if f["status"] != "ok"], "facings": facings}


def _cells(grid: dict[str, float], rows: int, cols: int, scale: int) -> dict[tuple[int, int], tuple[float, ...]]:
    """Each facing's pixel box (x0, y0, x1, y1) in a picture enlarged `scale` times."""
    w, h = grid["width"] / cols, grid["height"] / rows
    return {(r, c): tuple(scale * v for v in (grid["left"] + c * w, grid["top"] + r * h, grid["left"] + (c + 1) * w,
                                             grid["top"] + (r + 1) * h)) for r in range(rows) for c in range(cols)}


def overlay_boxes(report: dict[str, Any], grid: dict[str, float], scale: int = 1) -> list[dict[str, Any]]:
    """What the shelf overlay draws: each facing's box, its status colour and, on a violation, its
    label `expected -> found` ('empty' for none)."""
    rows = 1 + max(f["row"] for f in report["facings"])
    cells = _cells(grid, rows, 1 + max(f["col"] for f in report["facings"]), scale)
    return [{"status": f["status"], "colour": STATUSES[f["status"]][0], "box": cells[f["row"], f["col"]],
             "label": None if f["status"] == "ok" else f"{_shown(f['expected'])} -> {_shown(f['found'])}"}
            for f in report["facings"]]


def legend_lines(report: dict[str, Any]) -> list[tuple[tuple[int, int, int] | None, str]]:
    """The overlay's legend: the compliance score, then each status's colour, name and count."""
    ok, total = report["counts"]["ok"], len(report["facings"])
    return [(None, f"compliance {report['compliance']:.0%} ({ok} of {total} facings ok)")] + [
        (colour, f"{name}: {report['counts'][status]}") for status, (colour, name) in STATUSES.items()]


def shelf_overlay(image: Image.Image, report: dict[str, Any], grid: dict[str, float] | None,
                  max_pixels: int | None = None) -> Image.Image:
    """The shelf photo (enlarged where its facings are under MIN_CELL pixels, to at most `max_pixels`,
    default `limits.image_pixels`'s) with every facing outlined in its status colour, `expected ->
    found` on each violation, and a legend with the compliance score beneath."""
    grid = grid or {"left": 0, "top": 0, "width": image.width, "height": image.height}
    cell = min(grid["width"] / (1 + max(f["col"] for f in report["facings"])),
               grid["height"] / (1 + max(f["row"] for f in report["facings"])))
    largest = math.isqrt((max_pixels or InputLimits().image_pixels) // (image.width * image.height))
    scale = max(1, min(math.ceil(MIN_CELL / max(cell, 1)), largest))
    photo = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
    draw, side = ImageDraw.Draw(photo), cell * scale
    for box in overlay_boxes(report, grid, scale):
        draw.rectangle(box["box"], outline=box["colour"], width=int(max(2, side / 60) if box["label"] is None
                                                                    else max(4, side / 30)))
        if box["label"] is not None:
            _label(draw, box["box"], box["label"], box["colour"], int(side / 7))
    return _with_legend(photo, legend_lines(report))


def _font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=max(10, size))


def _label(draw: ImageDraw.ImageDraw, box: tuple[float, ...], text: str, colour: tuple[int, int, int],
           size: int) -> None:
    """`text` in white on `colour` at the top left of `box`, shrunk to the box's width where it can be."""
    width = box[2] - box[0] - 8
    size = max(10, min(size, int(size * width / max(draw.textlength(text, font=_font(size)), 1))))
    font = _font(size)
    x, y = box[0] + 4, box[1] + 4
    draw.rectangle(draw.textbbox((x, y), text, font=font), fill=colour)
    draw.text((x, y), text, fill=(255, 255, 255), font=font)


def _with_legend(photo: Image.Image, lines: list[tuple[tuple[int, int, int] | None, str]]) -> Image.Image:
    """`photo` above a white band of legend lines (a colour swatch before each that has a colour)."""
    font = _font(max(12, photo.width // 40))
    line = int(font.size * 1.5)
    measure = ImageDraw.Draw(photo)
    width = max(photo.width, max(int(measure.textlength(text, font=font)) for _, text in lines) + 2 * line)
    canvas = Image.new("RGB", (width, photo.height + line * len(lines) + line // 2), (255, 255, 255))
    canvas.paste(photo, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for i, (colour, text) in enumerate(lines):
        y = photo.height + line // 4 + i * line
        if colour is not None:
            draw.rectangle([line // 4, y + line // 8, line // 4 + font.size, y + line // 8 + font.size], fill=colour)
        draw.text((line // 4 + (font.size + line // 4 if colour is not None else 0), y), text, fill=(0, 0, 0),
                  font=font)
    return canvas


def _plain(value):
    """JSON form of a SKU id: null for a gap, else the id as given."""
    if value == EMPTY:
        return None
    return value.item() if isinstance(value, np.generic) else value


def _shown(value) -> str:
    """A report's SKU as the overlay writes it: 'empty' for none."""
    return "empty" if value is None else str(value)


def gallery_path(workdir: Path) -> Path:
    return Path(workdir) / "gallery" / "index.npz"


def build_gallery(model, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """Embeds every reference image of `input_dir/<sku>/*` and saves the index next to the checkpoints,
    with what it was built with (`built_with`): the model's identity, its preprocessing and the
    reference folder. A class folder named `empty` holds pictures of empty facings (gaps). `model`:
    a LiveModel or an ExportedModel."""
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


def _gallery_command_for(meta: dict[str, Any], workdir: Path | None) -> str:
    """How to build the index a shelf needs: in the run's folder, or (an exported model alone) in
    the folder it was exported from, then carried by exporting again."""
    if workdir is not None:
        return f"python -m triskele.eval gallery --workdir {workdir} --input REFERENCE_FOLDER"
    source = meta.get("source", "RUN")
    return (f"python -m triskele.eval gallery --workdir {source} --input REFERENCE_FOLDER, then export again (the "
            f"export carries it) or predict with --workdir {source} beside --exported")


class MerchIO:
    """Shelf images with a planogram (`<stem>.json` beside `<stem>.jpg`): a compliance report
    `NAME.json` and `NAME.png`, the shelf with each facing outlined in its status's colour (NAME:
    the input's path under the inputs' root, its suffix replaced, kept where two inputs share a
    stem); a shelf whose planogram is malformed or names SKUs the gallery lacks is listed in
    errors.csv, as is one whose image or planogram is over an input limit (`limits`). Other images
    are crops: `predictions.csv` with the 5 nearest gallery SKUs when the run has a gallery index
    (and the top training class beside them), else the top-5 classes."""

    def __init__(self, meta: dict[str, Any], workdir: Path | None, limits: InputLimits | None = None):
        from triskele.train.data.images import IMAGE_SUFFIXES

        self.size, self.names, self.meta = meta["image_size"], meta["class_names"], meta
        self.limits = limits or InputLimits()
        self.workdir = workdir if workdir is not None else _carried(meta)
        has_index = self.workdir is not None and gallery_path(self.workdir).is_file()
        self.gallery = load_gallery(self.workdir, meta) if has_index else None
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        """Each image (a shelf with its planogram, whose change redoes it); shelves without a
        gallery index are refused before anything runs, naming the command that builds one."""
        from triskele.eval.engine import JOB_FILES, Unit, file_units
        from triskele.eval.inputs import refuse_clashes

        units = [Unit(u.key, (u.paths[0], u.paths[0].with_suffix(".json")), u.stem)
                 if u.paths[0].with_suffix(".json").is_file() else u for u in file_units(root, files)]
        refuse_clashes({u.key: [u.named(".json"), u.named(".png")] for u in units if len(u.paths) == 2},
                       (*JOB_FILES, "predictions.csv"))
        shelf = next((u.paths[0] for u in units if len(u.paths) == 2), None)
        if shelf is not None and self.gallery is None:
            raise ValueError(f"shelf {shelf} needs a gallery index to recognise facings; build one with "
                             f"{_gallery_command_for(self.meta, self.workdir)}")
        return units

    def read(self, unit) -> tuple[np.ndarray, Any]:
        """A crop, or a shelf's facing crops with its planogram; ValueError (the input goes to
        errors.csv) for an unreadable image, a malformed planogram, one that does not fit its image or
        names SKUs the gallery lacks, or an input over a limit."""
        from triskele.train.data.images import read_image
        from triskele.train.domains.merch.data import facing_crops, read_planogram

        path = unit.paths[0]
        if len(unit.paths) == 2:
            planogram = read_planogram(unit.paths[1], self.limits)
            missing = sorted({v for row in planogram["rows"] for v in row if v != EMPTY} - set(self.gallery[1]))
            if missing:
                raise ValueError(f"planogram {unit.paths[1]} names SKUs not in the gallery: {missing}")
            return facing_crops(path, planogram, self.size, self.limits), planogram
        return read_image(path, self.size, 3, self.limits)[None], None

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        if context is not None:
            return self._write_shelf(unit, context, outputs["embedding"], out_dir)
        probs = outputs["probabilities"][0]
        classes = [self.names[j] for j in np.argsort(-probs)[:5]]
        row = {"image": unit.key, "classes": classes, "class_probability": float(np.max(probs))}
        if self.gallery is not None:
            row["gallery"] = nearest_skus(outputs["embedding"][0], self.gallery)
        return row

    def _write_shelf(self, unit, planogram: dict, embeddings: np.ndarray, out_dir: Path) -> dict[str, Any]:
        from triskele.train.bookkeeping.files import write_atomically
        from triskele.train.data.images import open_image

        gallery, names = self.gallery
        found_names = names[np.argmax(embeddings @ gallery.T, axis=1)]
        found = np.array([EMPTY if n == "empty" else n for n in found_names], dtype=object)
        rows, cols = len(planogram["rows"]), len(planogram["rows"][0])
        report = compliance_report(np.array(planogram["rows"], dtype=object), found.reshape(rows, cols))
        write_atomically(out_dir / unit.named(".json"), (json.dumps(report, indent=2) + "\n").encode())
        buffer = io.BytesIO()
        shelf_overlay(open_image(unit.paths[0], self.limits), report, planogram["grid"],
                      self.limits.image_pixels).save(buffer, format="PNG")
        write_atomically(out_dir / unit.named(".png"), buffer.getvalue())
        return {"shelf": unit.key, "compliance": report["compliance"]}

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        """predictions.csv: top1..top5 name the gallery's SKUs when one is loaded (top1_similarity:
        the cosine similarity; class_top1: the training class beside), else the training classes."""
        from triskele.eval.engine import write_csv

        crops = [r for r in rows if "image" in r]
        if not crops:
            return []
        top = [f"top{k}" for k in range(1, 6)]
        if self.gallery is None:
            write_csv(out_dir / "predictions.csv", ["image", *top, "top1_probability"],
                      [[r["image"], *_five(r["classes"]), f"{r['class_probability']:.4f}"] for r in crops])
        else:
            write_csv(out_dir / "predictions.csv",
                      ["image", *top, "top1_similarity", "class_top1", "class_top1_probability"],
                      [[r["image"], *_five([n for n, _ in r.get("gallery", [])]), _similarity(r), r["classes"][0],
                        f"{r['class_probability']:.4f}"] for r in crops])
        return ["predictions.csv"]


def _five(names: list[str]) -> list[str]:
    return [*names[:5], *[""] * (5 - len(names[:5]))]


def _similarity(row: dict[str, Any]) -> str:
    """The nearest gallery SKU's similarity ('' for a row recorded before the gallery was built)."""
    return f"{row['gallery'][0][1]:.4f}" if row.get("gallery") else ""


def _carried(meta: dict[str, Any]) -> Path | None:
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


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> MerchIO:
    """`workdir`: the run's folder, where the gallery index is kept (merch has no predict flags);
    an exported model alone reads the index it carries. `meta` with the model's `identity` refuses
    an index built by another model; `meta['limits']`: the input limits (default `InputLimits()`)."""
    if meta.get("options", {}).get("task") == "shelf":
        raise ValueError("this run is a facing detector (merch.task=shelf): predicting shelf photos with it "
                         "(detection, recognition against the gallery, alignment to the planogram) is not built "
                         "yet; evaluate it with python -m triskele.eval --workdir W, or predict crops and "
                         "gridded shelves with a merch-tiny run")
    return MerchIO(meta, workdir, meta.get("limits"))


def _refresh(model, workdir: Path | None) -> dict[str, Any] | None:
    """`refresh_gallery` on the run's folder, or on an exported model's carried run files."""
    return refresh_gallery(model, workdir if workdir is not None else _carried(model.meta))


before_predict = _refresh
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
