"""Shelf photos through a facing-detector run (merch.task=shelf): the photo scaled by
`merch.shelf_scale` and cut into overlapping tiles of the model's input, the tiles' detections
merged (a facing at a seam counted once), each facing's SKU its embedding's nearest gallery entry
(`unknown` below `merch.unknown_threshold`), the facings grouped into shelf rows and, with a
planogram (`<stem>.json` beside the photo, the `shelves` form), each row aligned to its planned
shelf: `NAME.json` (every facing, the rows, the counts, the score), `NAME.png` (the photo at
`merch.shelf_scale`, each facing outlined in its status's colour, each shelf gap crossed, a legend,
the score) and
`compliance.csv` (one line per photo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from triskele.eval.domains.merch.gallery import carry_files as gallery_files
from triskele.eval.domains.merch.gallery import refresh_before_predict
from triskele.eval.domains.merch.references import detector_gallery
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import exif_note
from triskele.train.domains.merch.alignment import GAP_FILL, STATUSES, near_skus, shelf_facings, shelf_report
from triskele.train.domains.merch.data import EMPTY
from triskele.train.domains.merch.tiles import merge_tiles, read_picture, tile_origins

COLOURS = {"ok": (34, 160, 60), "misplaced": (220, 30, 30), "foreign": (150, 40, 200), "missing": (255, 140, 0),
           "out_of_stock": (255, 200, 0), "extra": (30, 100, 230), None: (120, 120, 120)}
"""Each status's colour in the overlay (None: a facing without a plan to judge it by)."""


def photo_tiles(photo: np.ndarray, tile: int, overlap: int) -> np.ndarray:
    """The photo's tiles (n, tile, tile, 3) in `tile_origins` order; a photo smaller than a tile is
    padded with grey on the right and bottom (a pad holds no facing)."""
    height, width = photo.shape[:2]
    padded = np.full((max(height, tile), max(width, tile), 3), 0.5, np.float32)
    padded[:height, :width] = photo
    origins = tile_origins(max(height, tile), max(width, tile), tile, overlap)
    return np.stack([padded[y:y + tile, x:x + tile] for y, x in origins])


def facings_of(outputs: dict[str, np.ndarray], height: int, width: int, tile: int, overlap: int,
               threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(boxes (N, 4), scores (N,), embeddings (N, D) or None) of the facings found on a photo's
    tiles: merged across seams, those scoring at least `threshold` and the shelf gaps' less certain
    ones (`shelf_facings`, as evaluation counts them), best first."""
    per_tile = list(zip(outputs["boxes"], outputs["scores"], strict=True))
    boxes, scores, index = merge_tiles(per_tile, max(height, tile), max(width, tile), tile, overlap)
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    keep = (scores >= GAP_FILL * threshold) & (centres[:, 0] < width) & (centres[:, 1] < height)
    order = np.flatnonzero(keep)[np.argsort(-scores[keep], kind="stable")]
    clipped = np.clip(boxes[order], 0, [width, height, width, height])
    chosen = shelf_facings(clipped, scores[order], threshold)  # ascending: still best first
    order, clipped = order[chosen], clipped[chosen]
    embeddings = None
    if "embedding" in outputs:
        embeddings = outputs["embedding"].reshape(-1, outputs["embedding"].shape[-1])[index[order]]
    return clipped, scores[order], embeddings


def recognise(embeddings: np.ndarray | None, gallery: tuple[np.ndarray, np.ndarray] | None,
              unknown: float) -> tuple[list[str | None], list[float | None], list[frozenset[str]]]:
    """Each facing's SKU (None: unknown, below `unknown` or without a gallery), its cosine (to the
    nearest reference), and the SKUs it may also be read as (`near_skus`, each SKU by its nearest
    reference)."""
    count = 0 if embeddings is None else len(embeddings)
    if embeddings is None or gallery is None or count == 0:
        return [None] * count, [None] * count, [frozenset()] * count
    skus, group = np.unique(np.asarray(gallery[1]).astype(str), return_inverse=True)
    order = np.argsort(group, kind="stable")
    starts = np.searchsorted(group[order], np.arange(len(skus)))
    per_sku = np.maximum.reduceat(embeddings @ gallery[0][order].T, starts, axis=1)  # (facings, SKUs)
    best = np.argmax(per_sku, axis=1)
    cosine = per_sku[np.arange(count), best]
    names = [str(skus[b]) if c >= unknown else None for b, c in zip(best, cosine, strict=True)]
    return names, [float(c) for c in cosine], near_skus(np.broadcast_to(skus, per_sku.shape), per_sku, unknown)


def shelf_overlay(photo: Image.Image, report: dict[str, Any], scale: float = 1.0) -> Image.Image:
    """The photo with each facing outlined in its status's colour and a legend with the score; the
    report's boxes (the photo's own pixels) drawn at `scale` (the photo as predict scaled it)."""
    from triskele.eval.domains.merch.legend import with_legend

    image = photo.convert("RGB")
    draw = ImageDraw.Draw(image)
    line = max(1, round(min(image.size) / 300))
    for facing in report["facings"]:
        draw.rectangle([v * scale for v in facing["box"]], outline=COLOURS[facing["status"]], width=line)
    for gap in report.get("gaps", []):  # a shelf gap: a cross through its space, out-of-stock or unplanned
        x1, y1, x2, y2 = (v * scale for v in gap["box"])
        colour = COLOURS[gap["status"]]
        draw.rectangle((x1, y1, x2, y2), outline=colour, width=line)
        draw.line((x1, y1, x2, y2), fill=colour, width=line)
        draw.line((x1, y2, x2, y1), fill=colour, width=line)
    if "score" not in report:
        return with_legend(image, [(COLOURS[None], f"{report['found']} facings found (no planogram)")])
    counts = report["counts"]
    ok = counts["ok"]
    lines = [(None, f"compliance {report['score']:.0%} ({ok} of {report['planned']} planned facings in place)")]
    return with_legend(image, lines + [(COLOURS[s], f"{s.replace('_', ' ')}: {counts[s]}") for s in STATUSES])


def report_json(report: dict[str, Any]) -> bytes:
    """A photo's report as NAME.json holds it (and serve's `report` answers it)."""
    return (json.dumps(report, indent=2) + "\n").encode()


class ShelfIO:
    """Predict of a facing-detector run (see the module doc). A photo's planogram must be the
    `shelves` form; a malformed one, one over a limit, or an unreadable photo goes to errors.csv."""

    def __init__(self, meta: dict[str, Any], workdir: Path | None, limits: InputLimits | None = None,
                 given: dict[str, Any] | None = None):
        """`given`: predict's flags (`--shelf-scale`, `--score-threshold`, `--unknown-threshold`) over the
        run's options."""
        from triskele.eval.domains.merch.gallery import run_gallery
        from triskele.train.data.images import IMAGE_SUFFIXES

        options, self.meta = {**meta["options"], **(given or {})}, meta
        self.tile, self.scale, self.overlap = meta["image_size"], options["shelf_scale"], options["tile_overlap"]
        self.threshold, self.unknown = options["score_threshold"], options["unknown_threshold"]
        self.limits = limits or InputLimits()
        self.workdir, self.gallery = run_gallery(meta, workdir)
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        from triskele.eval.domains.merch.units import planogram_units
        from triskele.eval.engine import JOB_FILES
        from triskele.eval.inputs import refuse_clashes

        units = planogram_units(root, files)
        refuse_clashes({u.key: [u.named(".json"), u.named(".png")] for u in units}, (*JOB_FILES, "compliance.csv"))
        planned = next((u.paths[1] for u in units if len(u.paths) == 2), None)
        if planned is not None:
            self._check_gallery(planned)
        return units

    def _check_gallery(self, planogram) -> None:
        """ValueError naming the command that builds the gallery index a planogram's facings need."""
        if self.gallery is None:
            from triskele.eval.domains.merch.gallery import gallery_command_for

            raise ValueError(f"planogram {planogram} needs a gallery index to recognise the facings it plans; build "
                             f"one with {gallery_command_for(self.meta, self.workdir)}")

    def read(self, unit) -> tuple[np.ndarray, Any]:
        """The photo's tiles, and the context of its report: its name, its size at `shelf_scale`, its
        shelves' plan (None without a planogram), the picture at that scale (for the overlay: as
        large as a quarter of the tiles' float32 pixels, where decoding the photo again for it cost
        as much as reading it)."""
        from triskele.train.domains.merch.data import read_planogram

        shelves = None
        if len(unit.paths) == 2:
            self._check_gallery(unit.paths[1])  # predict checks every unit first (`units`); serve per photo
            planogram = read_planogram(unit.paths[1], self.limits)
            if "shelves" not in planogram:
                raise ValueError(f"planogram {unit.paths[1]} is a grid ('rows'); a facing detector's photo is "
                                 "planned by shelves: {\"shelves\": [[sku, ...], ...]} top to bottom, left to right")
            shelves = [[None if v == str(EMPTY) or v == EMPTY else v for v in shelf] for shelf in planogram["shelves"]]
        picture = read_picture(unit.paths[0], self.scale, self.limits)
        photo = np.asarray(picture, np.float32) / 255.0
        return photo_tiles(photo, self.tile, self.overlap), {"photo": unit.key, "shelves": shelves,
                                                             "size": photo.shape[:2], "picture": picture,
                                                             "exif": exif_note(unit.paths[0])}

    def report(self, context, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """The photo's report from its tiles' outputs, as NAME.json holds it: the photo's name, every
        facing (its box in the photo's own pixels, SKU, confidence, similarity, row, status), the
        rows and, with a planogram, the gaps, counts and score (`shelf_report`)."""
        height, width = context["size"]
        boxes, scores, embeddings = facings_of(outputs, height, width, self.tile, self.overlap, self.threshold)
        skus, cosines, accepts = recognise(embeddings, self.gallery, self.unknown)
        return {"photo": context["photo"], **context["exif"],
                **shelf_report(boxes / self.scale, scores, skus, cosines, context["shelves"], accepts,
                               width / self.scale)}

    serving_inputs = {"planogram": ("BYTES", [-1])}
    """What the server takes beside each photo (`image`): its planogram, the `shelves` JSON (optional;
    an empty element: that photo has none)."""
    serving_outputs = {"report": ("BYTES", []), "found": ("INT32", []), "score": ("FP32", [])}
    """What the server answers for one photo (`respond`): name -> (datatype, shape)."""

    def respond(self, context, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The photo's report, the very JSON predict writes to NAME.json; the facings found; the
        compliance score (NaN without a planogram)."""
        report = self.report(context, outputs)
        return {"report": np.asarray(report_json(report), object), "found": np.asarray(report["found"], np.int32),
                "score": np.asarray(report.get("score", np.nan), np.float32)}

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        from triskele.eval.domains.merch.legend import overlay_png
        from triskele.train.bookkeeping.files import write_atomically
        report = self.report(context, outputs)
        write_atomically(out_dir / unit.named(".json"), report_json(report))
        # The overlay on the photo as read (at `shelf_scale`), not decoded a second time.
        write_atomically(out_dir / unit.named(".png"), overlay_png(shelf_overlay(context["picture"], report,
                                                                               self.scale)))
        return {"photo": unit.key, "found": report["found"], **{k: report[k] for k in ("planned", "counts", "score")
                                                                 if k in report}}

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        """compliance.csv: per photo the facings planned and found, each status's count, the score
        (empty where the photo has no planogram)."""
        from triskele.eval.engine import write_csv

        if not rows:
            return []
        write_csv(out_dir / "compliance.csv", ["photo", "planned", "found", *STATUSES, "score"],
                  [[r["photo"], r.get("planned", ""), r["found"], *[r["counts"][s] if "counts" in r else ""
                                                                   for s in STATUSES],
                    f"{r['score']:.4f}" if "score" in r else ""] for r in rows])
        return ["compliance.csv"]


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> ShelfIO:
    """The facing detector's ShelfIO, with the predict flags given (`shelf_scale`, the thresholds)."""
    return ShelfIO(meta, workdir, meta.get("limits"), {name: value for name, value in options.items()
                                                       if value is not None})


reference_embeddings = detector_gallery
"""The detector's own embedding of each reference image (what `gallery` indexes for a shelf run)."""

carry_files = gallery_files
"""Export's hook: the run's gallery index travels with an exported detector, as with the recogniser."""

before_predict = refresh_before_predict
"""A stale gallery index rebuilt before predicting, as for the recogniser."""

COMMANDS: dict[str, Any] = {}
"""merch's commands (`gallery`) are its recognition module's, which the command line lists."""
