"""Merchandising: shelf compliance reports, the gallery index (the `gallery` command), predictions;
the evaluation is the model's over the split, its metrics `triskele.train.domains.merch.metrics`."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from triskele.eval.domains.merch.gallery import (
    build_gallery,
    carry_files,  # noqa: F401 - the inference module's hook for exports and quantized copies (eval.export)
    gallery_command_for,
    nearest_skus,
    refresh_before_predict,
    run_gallery,
)
from triskele.eval.domains.merch.legend import font, with_legend
from triskele.eval.domains.merch.units import planogram_units
from triskele.train.commands import Command
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import read_image
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
    return with_legend(photo, legend_lines(report))


def _label(draw: ImageDraw.ImageDraw, box: tuple[float, ...], text: str, colour: tuple[int, int, int],
           size: int) -> None:
    """`text` in white on `colour` at the top left of `box`, shrunk to the box's width where it can be."""
    width = box[2] - box[0] - 8
    size = max(10, min(size, int(size * width / max(draw.textlength(text, font=font(size)), 1))))
    face = font(size)
    x, y = box[0] + 4, box[1] + 4
    draw.rectangle(draw.textbbox((x, y), text, font=face), fill=colour)
    draw.text((x, y), text, fill=(255, 255, 255), font=face)


def _plain(value):
    """JSON form of a SKU id: null for a gap, else the id as given."""
    if value == EMPTY:
        return None
    return value.item() if isinstance(value, np.generic) else value


def _shown(value) -> str:
    """A report's SKU as the overlay writes it: 'empty' for none."""
    return "empty" if value is None else str(value)


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
        self.workdir, self.gallery = run_gallery(meta, workdir)
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        """Each image (a shelf with its planogram, whose change redoes it); shelves without a
        gallery index are refused before anything runs, naming the command that builds one."""
        from triskele.eval.engine import JOB_FILES
        from triskele.eval.inputs import refuse_clashes

        units = planogram_units(root, files)
        refuse_clashes({u.key: [u.named(".json"), u.named(".png")] for u in units if len(u.paths) == 2},
                       (*JOB_FILES, "predictions.csv"))
        shelf = next((u.paths[0] for u in units if len(u.paths) == 2), None)
        if shelf is not None and self.gallery is None:
            raise ValueError(f"shelf {shelf} needs a gallery index to recognise facings; build one with "
                             f"{gallery_command_for(self.meta, self.workdir)}")
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

    def _top_classes(self, probs: np.ndarray) -> list[tuple[str, float]]:
        """The 5 most probable training classes with their probabilities, most probable first."""
        return [(self.names[j], float(probs[j])) for j in np.argsort(-probs)[:5]]

    @property
    def serving_outputs(self) -> dict[str, tuple[str, list[int]]]:
        """What the server answers for one crop (`respond`): name -> (datatype, shape; -1 varies)."""
        return {"sku": ("BYTES", [-1]), "score": ("FP32", [-1]), "embedding": ("FP32", [-1])}

    def respond(self, context, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A crop's 5 SKUs and scores as predictions.csv ranks them (the gallery's nearest by cosine
        similarity when the run has an index, else the top training classes by probability), and
        its embedding; shelf photos are not served yet."""
        if context is not None:
            raise ValueError("shelf photos with a planogram are not served yet; send product crops")
        embedding = outputs["embedding"][0]
        ranked = (nearest_skus(embedding, self.gallery) if self.gallery is not None
                  else self._top_classes(outputs["probabilities"][0]))
        return {"sku": np.array([name for name, _ in ranked], dtype=object),
                "score": np.array([score for _, score in ranked], np.float32), "embedding": embedding}

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        if context is not None:
            return self._write_shelf(unit, context, outputs["embedding"], out_dir)
        probs = outputs["probabilities"][0]
        row = {"image": unit.key, "classes": [name for name, _ in self._top_classes(probs)],
               "class_probability": float(np.max(probs))}
        if self.gallery is not None:
            row["gallery"] = nearest_skus(outputs["embedding"][0], self.gallery)
        return row

    def _write_shelf(self, unit, planogram: dict, embeddings: np.ndarray, out_dir: Path) -> dict[str, Any]:
        from triskele.eval.domains.merch.legend import overlay_png
        from triskele.train.bookkeeping.files import write_atomically
        from triskele.train.data.images import open_image

        gallery, names = self.gallery
        found_names = names[np.argmax(embeddings @ gallery.T, axis=1)]
        found = np.array([EMPTY if n == "empty" else n for n in found_names], dtype=object)
        rows, cols = len(planogram["rows"]), len(planogram["rows"][0])
        report = compliance_report(np.array(planogram["rows"], dtype=object), found.reshape(rows, cols))
        write_atomically(out_dir / unit.named(".json"), (json.dumps(report, indent=2) + "\n").encode())
        picture = shelf_overlay(open_image(unit.paths[0], self.limits), report, planogram["grid"],
                                self.limits.image_pixels)
        write_atomically(out_dir / unit.named(".png"), overlay_png(picture))
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


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> Any:
    """The recogniser's MerchIO (a facing detector's is `triskele.eval.domains.merch.shelf`'s).
    `workdir`: the run's folder, where the gallery index is kept; an exported model alone reads the
    index it carries. `meta` with the model's `identity` refuses an index built by another model;
    `meta['limits']`: the input limits (default `InputLimits()`). The predict flags are the
    detector's: one given is refused."""
    given = {name: value for name, value in options.items() if value is not None}
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in sorted(given))
        raise ValueError(f"{flags}: for a facing-detector run's shelf photos (merch.task=shelf); this run recognises "
                         "product crops")
    return MerchIO(meta, workdir, meta.get("limits"))


def reference_embeddings(model: Any, files: list[Path]) -> np.ndarray:
    """The recogniser's embedding of each reference image (what `gallery` indexes)."""
    return model(np.stack([read_image(p, model.meta["image_size"], 3) for p in files]))["embedding"]


before_predict = refresh_before_predict
"""What `triskele.eval.prediction.predict` runs first with the model: a stale gallery index rebuilt."""


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
