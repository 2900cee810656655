"""Retail data: procedural product packages, shelf crops, planogram shelves; class-folder layouts on disk.

SKUs come in families that share a package layout (shape, base colour, band placement) and
differ in small details (band colour, glyph, label-text pattern), so recognition is fine-grained.
An "iconic" image is the clean reference render; a shelf crop adds lighting, perspective, blur
and partial occlusion (the domain gap). The open-set SKUs are disjoint from the training SKUs.
Shelves are grids of facings rendered from a planogram with injected violations (swapped
facings, gaps, wrong SKUs of the same family).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from triskele.models.preprocess import model_input_pixels, to_unit_range
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import (
    IMAGE_SUFFIXES,
    EncodedImage,
    ImageSource,
    image_size,
    open_image,
)
from triskele.train.data.packed import PackedRecords
from triskele.train.data.splits import check_split, hold_out

EMPTY = -1
"""SKU id of an empty facing (a gap)."""
GLYPHS = ("circle", "triangle", "square", "cross", "diamond")
SHAPES = ("box", "bottle", "can")
# Record kinds of the evaluation split.
CLOSED, QUERY, GALLERY, FACING, SHELF_GALLERY = 0, 1, 2, 3, 4
_RENDER = 128  # packages are drawn at this size, then resized


@functools.lru_cache(maxsize=4096)
def sku_design(seed: int, sku: int, family_size: int) -> dict:
    """The design of SKU `sku`: its family's layout plus its own details."""
    family = sku // family_size
    frng = np.random.default_rng([seed, 21, family])
    srng = np.random.default_rng([seed, 22, sku])
    return {
        "shape": SHAPES[frng.integers(len(SHAPES))],
        "base": tuple(int(v) for v in frng.integers(30, 226, 3)),
        "band_y": float(frng.uniform(0.25, 0.6)), "band_h": float(frng.uniform(0.12, 0.22)),
        "glyph_xy": (float(frng.uniform(0.3, 0.7)), float(frng.uniform(0.68, 0.8))),
        "band": tuple(int(v) for v in srng.integers(0, 256, 3)),
        "glyph": GLYPHS[srng.integers(len(GLYPHS))],
        "glyph_color": tuple(int(v) for v in srng.integers(0, 256, 3)),
        "text": tuple(int(b) for b in srng.integers(0, 2, 6)),
    }


def draw_package(design: dict, background=(255, 255, 255)) -> Image.Image:
    s = _RENDER
    image = Image.new("RGB", (s, s), background)
    d = ImageDraw.Draw(image)
    left, right, top, bottom = 0.22 * s, 0.78 * s, 0.08 * s, 0.95 * s
    if design["shape"] == "box":
        d.rectangle([left, top, right, bottom], fill=design["base"], outline=(20, 20, 20))
    elif design["shape"] == "bottle":
        d.rectangle([0.42 * s, top, 0.58 * s, 0.25 * s], fill=design["base"], outline=(20, 20, 20))
        d.rounded_rectangle([left, 0.22 * s, right, bottom], radius=0.12 * s, fill=design["base"],
                            outline=(20, 20, 20))
    else:
        d.rounded_rectangle([left, top, right, bottom], radius=0.06 * s, fill=design["base"], outline=(20, 20, 20))
        d.ellipse([left, top - 0.04 * s, right, top + 0.06 * s], fill=(190, 190, 195))
    by, bh = design["band_y"] * s, design["band_h"] * s
    d.rectangle([left + 2, by, right - 2, by + bh], fill=design["band"])
    for i, bit in enumerate(design["text"]):  # label text: a row of short and long bars
        x0 = left + (0.08 + 0.14 * i) * (right - left)
        d.rectangle([x0, by + bh + 0.05 * s, x0 + 0.05 * s, by + bh + (0.1 if bit else 0.06) * s + 0.05 * s],
                    fill=(15, 15, 15))
    gx, gy, r = design["glyph_xy"][0] * s, design["glyph_xy"][1] * s, 0.08 * s
    color = design["glyph_color"]
    if design["glyph"] == "circle":
        d.ellipse([gx - r, gy - r, gx + r, gy + r], fill=color)
    elif design["glyph"] == "square":
        d.rectangle([gx - r, gy - r, gx + r, gy + r], fill=color)
    elif design["glyph"] == "triangle":
        d.polygon([(gx, gy - r), (gx - r, gy + r), (gx + r, gy + r)], fill=color)
    elif design["glyph"] == "diamond":
        d.polygon([(gx, gy - r), (gx - r, gy), (gx, gy + r), (gx + r, gy)], fill=color)
    else:
        d.rectangle([gx - r, gy - r / 3, gx + r, gy + r / 3], fill=color)
        d.rectangle([gx - r / 3, gy - r, gx + r / 3, gy + r], fill=color)
    return image


def iconic(design: dict, size: int) -> np.ndarray:
    return np.asarray(draw_package(design).resize((size, size), Image.BILINEAR), np.float32) / 255.0


def shelf_crop(design: dict | None, size: int, rng: np.random.Generator) -> np.ndarray:
    """A facing as a shelf camera sees it; `design` None is an empty facing (shelf back, price tag)."""
    tint = np.array([1.0, rng.uniform(0.75, 1.0), rng.uniform(0.5, 0.9)])
    shelf = tuple(int(v) for v in rng.integers(60, 200) * tint)
    if design is None:
        image = Image.new("RGB", (_RENDER, _RENDER), shelf)
        d = ImageDraw.Draw(image)
        d.rectangle([0, 0.88 * _RENDER, _RENDER, _RENDER], fill=tuple(int(c * 0.6) for c in shelf))
    else:
        image = draw_package(design, background=shelf)
    s = _RENDER
    scale = rng.uniform(0.85, 1.05)
    shear, angle = rng.uniform(-0.12, 0.12), rng.uniform(-6, 6)
    image = image.rotate(angle, resample=Image.BILINEAR, fillcolor=shelf)
    cx, cy = s / 2 + rng.uniform(-6, 6), s / 2 + rng.uniform(-6, 6)
    matrix = (1 / scale, shear, s / 2 - (cx / scale + shear * cy), 0, 1 / scale, s / 2 - cy / scale)
    image = image.transform((s, s), Image.AFFINE, matrix, resample=Image.BILINEAR, fillcolor=shelf)
    if rng.random() < 0.6:  # partial occlusion: a price tag or the next product's edge
        d = ImageDraw.Draw(image)
        w, h = rng.uniform(0.1, 0.35) * s, rng.uniform(0.1, 0.3) * s
        x, y = rng.uniform(0, s - w), rng.choice([rng.uniform(0, 0.2 * s), rng.uniform(0.7 * s, s - h)])
        d.rectangle([x, y, x + w, y + h], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.5) * s / size))
    array = np.asarray(image.resize((size, size), Image.BILINEAR), np.float32) / 255.0
    gain = rng.uniform(0.65, 1.2) * rng.uniform(0.9, 1.1, 3)
    return np.clip(array * gain + rng.normal(0, 0.02, array.shape), 0, 1).astype(np.float32)


def _record(image, label, kind=-1, shelf=-1, slot=-1, expected=-2) -> dict[str, np.ndarray]:
    return {"image": np.ascontiguousarray(image, np.float32), "label": np.int32(label), "kind": np.int32(kind),
            "shelf": np.int32(shelf), "slot": np.int32(slot), "expected": np.int32(expected)}


def make_planogram(rng: np.random.Generator, skus: int, rows: int, cols: int) -> np.ndarray:
    """A planogram: runs of 1-3 facings of a SKU along each shelf row."""
    plan = np.zeros((rows, cols), int)
    for r in range(rows):
        c = 0
        while c < cols:
            run = int(rng.integers(1, 4))
            plan[r, c : c + run] = rng.integers(skus)
            c += run
    return plan


def inject_violations(plan: np.ndarray, rng: np.random.Generator, family_size: int, skus: int,
                      rate: float = 0.2) -> np.ndarray:
    """What is really on the shelf: the planogram with swapped facings, gaps and wrong SKUs."""
    actual = plan.copy().ravel()
    for slot in np.nonzero(rng.random(actual.size) < rate)[0]:
        kind = rng.integers(3)
        if kind == 0:
            actual[slot] = EMPTY
        elif kind == 1:  # a sibling of the same family: the fine-grained mistake
            family = actual[slot] // family_size if actual[slot] >= 0 else rng.integers(skus // family_size)
            sibling = family * family_size + rng.integers(family_size)
            actual[slot] = sibling if sibling != plan.ravel()[slot] else (sibling + 1) % skus
        else:
            other = int(rng.integers(actual.size))
            actual[slot], actual[other] = actual[other], actual[slot]
    return actual.reshape(plan.shape)


class SyntheticRetail:
    """Random-access synthetic merch split.

    train: shelf crops (70%), iconic images (20%) and empty facings (10%) of the training SKUs,
      labelled with the class (training SKU index; empty = `num_classes - 1`).
    test/val: closed-set shelf crops of training SKUs (kind 0); open-set queries of unseen SKUs
      (kind 1) with their iconic gallery (kind 2, two views each); planogram shelves as facing
      crops (kind 3) matched against a shelf gallery (kind 4: iconic training SKUs and empties).
    """

    def __init__(self, split: str, num_records: int, image_size: int, seed: int = 0, train_skus: int = 100,
                 unseen_skus: int = 40, family_size: int = 5, shelves: int = 20, rows: int = 3, cols: int = 4):
        self.split, self.size, self.seed, self.family_size = split, image_size, seed, family_size
        self.train_skus, self.unseen_skus = train_skus, unseen_skus
        self.num_classes = train_skus + 1
        split_id = {"train": 0, "val": 1, "test": 2}.get(split)
        if split_id is None:
            raise ValueError(f"merch split {split!r} is not one of train, val, test")
        self.split_id = split_id
        if split == "train":
            self.layout = [("train", i) for i in range(num_records)]
            return
        self.rows, self.cols = rows, cols
        closed = max(num_records - unseen_skus * 7 - shelves * rows * cols - train_skus - 4, train_skus)
        self.layout = ([("closed", i) for i in range(closed)]
                       + [("query", i) for i in range(unseen_skus * 5)]
                       + [("gallery", i) for i in range(unseen_skus * 2)]
                       + [("facing", i) for i in range(shelves * rows * cols)]
                       + [("shelf_gallery", i) for i in range(train_skus + 4)])
        self.shelves = [self.shelf(s) for s in range(shelves)]

    def shelf(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(planogram, actual) SKU grids of shelf `index` (EMPTY for gaps)."""
        rng = np.random.default_rng([self.seed, 31, self.split_id, index])
        plan = make_planogram(rng, self.train_skus, self.rows, self.cols)
        return plan, inject_violations(plan, rng, self.family_size, self.train_skus)

    def design(self, sku: int) -> dict:
        return sku_design(self.seed, sku, self.family_size)

    def __len__(self) -> int:
        return len(self.layout)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        part, i = self.layout[index]
        local = np.random.default_rng([self.seed, 41, self.split_id, index])
        if part == "train":
            choice = local.random()
            if choice < 0.1:
                return _record(shelf_crop(None, self.size, local), self.num_classes - 1)
            sku = int(local.integers(self.train_skus))
            design = self.design(sku)
            image = iconic(design, self.size) if choice < 0.3 else shelf_crop(design, self.size, local)
            if rng is not None and rng.random() < 0.5:
                image = image * rng.uniform(0.85, 1.15)
            return _record(np.clip(image, 0, 1), sku)
        if part == "closed":
            sku = int(local.integers(self.train_skus))
            return _record(shelf_crop(self.design(sku), self.size, local), sku, CLOSED)
        if part == "query":
            sku = self.train_skus + i // 5
            return _record(shelf_crop(self.design(sku), self.size, local), sku, QUERY)
        if part == "gallery":
            sku = self.train_skus + i // 2
            image = iconic(self.design(sku), self.size)
            return _record(image if i % 2 == 0 else image[:, ::-1], sku, GALLERY)
        if part == "facing":
            shelf, slot = divmod(i, self.rows * self.cols)
            plan, actual = self.shelves[shelf]
            sku = int(actual.ravel()[slot])
            design = None if sku == EMPTY else self.design(sku)
            return _record(shelf_crop(design, self.size, local), sku, FACING, shelf, slot, int(plan.ravel()[slot]))
        if i < self.train_skus:
            return _record(iconic(self.design(i), self.size), i, SHELF_GALLERY)
        return _record(shelf_crop(None, self.size, local), EMPTY, SHELF_GALLERY)


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in IMAGE_SUFFIXES)


def class_folders(split_dir: Path) -> dict[str, list[Path]]:
    """`<sku>/*.jpg` (RP2K style) or `<coarse>/<fine>/*.jpg` (Grocery Store style, class `coarse/fine`)."""
    classes: dict[str, list[Path]] = {}
    for folder in sorted(p for p in split_dir.iterdir() if p.is_dir()):
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
        groups = [(f"{folder.name}/{sub.name}", sub) for sub in subfolders] if subfolders else [(folder.name, folder)]
        for name, path in groups:
            images = _images_in(path)
            if not images:
                raise ValueError(f"class folder {path} holds no images (.jpg/.png); remove it or add images")
            classes[name] = images
    if not classes:
        raise ValueError(f"{split_dir} holds no class folders (<sku>/*.jpg or <coarse>/<fine>/*.jpg)")
    return classes


def training_classes(root: str | Path) -> list[str]:
    """The class names of a product tree: its train/ split's class folders, sorted."""
    train_dir = Path(root) / "train"
    if not train_dir.is_dir():
        raise ValueError(f"data.path {str(root)!r} has no train/ folder of class folders")
    return sorted(class_folders(train_dir))


class ProductImages:
    """Product crops on disk: `ROOT/{train,val,test}/<sku>/*.jpg` or `.../<coarse>/<fine>/*.jpg`, and
    an optional gallery `ROOT/gallery/<sku>/*.jpg` of reference images. Without a val/ folder, val is
    the `val_fraction` of train/'s images held out by a hash of their relative path.

    Classes are the model's (`classes`; default: the training split's folders). In an evaluation
    split, crops of training classes are closed-set records; crops of other classes are open-set
    queries, matched against the gallery. Images are read within `limits`.
    """

    def __init__(self, root: str | Path, split: str, image_size: int, classes: list[str] | None = None,
                 val_fraction: float = 0.0, limits: InputLimits | None = None):
        self.root, self.split, self.size, self.limits = Path(root), check_split(split), image_size, limits
        self.classes = list(classes) if classes is not None else training_classes(self.root)
        self.num_classes = len(self.classes)
        index = {name: i for i, name in enumerate(self.classes)}
        held_out = split != "test" and not (self.root / "val").is_dir()  # val drawn from train/
        split_dir = self.root / ("train" if held_out else split)
        if not split_dir.is_dir():
            raise ValueError(f"data.path {str(self.root)!r} has no {split_dir.name}/ folder")
        self.records: list[tuple[Path, int, int, str]] = []
        for name, images in class_folders(split_dir).items():
            known = name in index
            kind = -1 if split == "train" else (CLOSED if known else QUERY)
            self.records += [(p, index.get(name, -1), kind, name) for p in images]
        if held_out:
            self.records = hold_out(self.records, lambda r: str(r[0].relative_to(self.root)), split, val_fraction)
        gallery_dir = self.root / "gallery"
        self.gallery_names: list[str] = []
        if split != "train" and gallery_dir.is_dir():
            gallery = class_folders(gallery_dir)
            self.gallery_names = sorted(gallery)
            # Gallery and query labels share one id space: the class's position among all names.
            names = sorted(set(self.classes) | set(gallery) | {r[3] for r in self.records})
            ids = {name: i for i, name in enumerate(names)}
            self.records = [(p, label if kind == CLOSED else ids[name] + self.num_classes, kind, name)
                            for p, label, kind, name in self.records]
            self.records += [(p, ids[name] + self.num_classes, GALLERY, name)
                             for name in gallery for p in gallery[name]]

    def report(self) -> str:
        kinds = [r[2] for r in self.records]
        return (f"product images at {self.root}, split {self.split!r}: {len(self.records)} images, "
                f"{self.num_classes} training classes, {kinds.count(QUERY)} open-set queries, "
                f"{kinds.count(GALLERY)} gallery images")

    def __len__(self) -> int:
        return len(self.records)

    def decoded(self, index: int) -> dict[str, np.ndarray]:
        """Record `index` before augmentation, as a pack stores it: the crop at the model's input
        size as uint8, its label and kind."""
        path, label, kind, _ = self.records[index]
        pixels = model_input_pixels(open_image(path, self.limits), self.size, 3)
        return {"image": pixels, "label": np.int32(label), "kind": np.int32(kind)}

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        return product_sample(self.decoded(index), rng)

    def packed_meta(self) -> dict:
        return {"num_classes": self.num_classes, "gallery_names": self.gallery_names}


def product_sample(record: dict[str, np.ndarray], rng: np.random.Generator | None) -> dict[str, np.ndarray]:
    """A decoded product crop (`ProductImages.decoded`) as training reads it: its brightness jittered
    by up to 15% half the time."""
    image = to_unit_range(record["image"])
    if rng is not None and rng.random() < 0.5:
        image = image * rng.uniform(0.85, 1.15)
    return _record(np.clip(image, 0, 1), int(record["label"]), int(record["kind"]))


class PackedProducts:
    """A packed split of product crops (`triskele.train.data.packed`) through `product_sample`."""

    def __init__(self, records: PackedRecords):
        self.records = records
        self.num_classes = int(records.meta["num_classes"])
        self.gallery_names = list(records.meta["gallery_names"])

    def report(self) -> str:
        return f"packed product images at {self.records.root}, split {self.records.split!r}: {len(self)} images"

    def __len__(self) -> int:
        return len(self.records)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        return product_sample(self.records.decoded(index), rng)


def read_planogram(path: ImageSource, limits: InputLimits | None = None) -> dict:
    """Planogram JSON, from a file or from bytes sent to the server (`EncodedImage`), one of two
    forms (a SKU: a string or an integer; null: a gap):
    - gridded: {"rows": [[sku or null, ...], ...], "grid": {"left", "top", "width", "height"}}, the
      pixel box the facings tile in rows x columns of equal cells (default the whole image);
    - shelves: {"shelves": [[sku or null, ...], ...]}, each shelf top to bottom, its facings left to
      right, any number each (a real bay, for the facing detector to find).
    ValueError naming the file for one that is not, or is over `limits.planogram_bytes` (checked
    before it is read) or `limits.planogram_facings`."""
    limits = limits or InputLimits()
    try:
        sent = isinstance(path, EncodedImage)
        limits.check("planogram_bytes", len(path.data) if sent else Path(path).stat().st_size,
                     "it is" if sent else "the file is")
        data = json.loads(path.data if sent else Path(path).read_bytes())
        if isinstance(data, dict) and "shelves" in data and "rows" not in data:
            return {"shelves": _shelves(data["shelves"], limits)}
        if not isinstance(data, dict) or "rows" not in data:
            raise ValueError("it must be a JSON object with 'rows' (and optionally 'grid'), or with 'shelves'")
        rows, grid = data["rows"], data.get("grid")
        if not isinstance(rows, list) or not all(isinstance(r, list) and r for r in rows) or \
                len({len(r) for r in rows}) != 1:
            raise ValueError("'rows' must be a non-empty list of equally long, non-empty lists")
        limits.check("planogram_facings", len(rows) * len(rows[0]), f"{len(rows)} x {len(rows[0])} =")
        _check_skus([v for row in rows for v in row])
        if grid is not None and not (isinstance(grid, dict) and _is_box(grid)):
            raise ValueError("'grid' must be {\"left\", \"top\", \"width\", \"height\"} in pixels (finite "
                             "numbers), width and height positive")
    except (OSError, json.JSONDecodeError, RecursionError, ValueError) as err:
        why = "its JSON is nested too deeply" if isinstance(err, RecursionError) else err
        raise ValueError(f"planogram {path} is not valid: {why}") from None
    return {"rows": [[EMPTY if v is None else str(v) for v in row] for row in rows], "grid": grid}


def _shelves(shelves: Any, limits: InputLimits) -> list[list[str | int]]:
    if not isinstance(shelves, list) or not shelves or not all(isinstance(s, list) and s for s in shelves):
        raise ValueError("'shelves' must be a non-empty list of non-empty lists of SKUs (null: planned empty)")
    limits.check("planogram_facings", sum(map(len, shelves)), "its shelves hold")
    _check_skus([v for shelf in shelves for v in shelf])
    return [[EMPTY if v is None else str(v) for v in shelf] for shelf in shelves]


def _check_skus(values: list) -> None:
    odd = [v for v in values if not (v is None or isinstance(v, str) or _is_integer(v))]
    if odd:
        raise ValueError(f"a SKU must be a string, an integer or null (a gap), not {json.dumps(odd[0])[:80]}")


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_box(grid: dict) -> bool:
    values = [grid.get(k) for k in ("left", "top", "width", "height")]
    return all((_is_integer(v) or isinstance(v, float)) and math.isfinite(v) for v in values) and min(values[2:]) > 0


def facing_boxes(planogram: dict, width: int, height: int) -> list[tuple[int, int, int, int]]:
    """Each facing's pixel box (left, top, right, bottom) in a width x height shelf image, row-major;
    ValueError when the planogram's grid reaches outside the image or makes a facing under a pixel,
    or when it has no grid (its facings are for a detector to find)."""
    if "shelves" in planogram:
        raise ValueError("its planogram lists 'shelves' without a grid: finding their facings needs the facing "
                         "detector (a merch-shelf run), which predict does not run yet; give the planogram "
                         "as 'rows' with a 'grid' for a merch-tiny run")
    grid = planogram["grid"] or {"left": 0, "top": 0, "width": width, "height": height}
    rows, cols = len(planogram["rows"]), len(planogram["rows"][0])
    if min(grid["left"], grid["top"]) < 0 or grid["left"] + grid["width"] > width or \
            grid["top"] + grid["height"] > height:
        raise ValueError(f"the planogram's grid {grid} reaches outside the image ({width}x{height} pixels)")
    w, h = grid["width"] / cols, grid["height"] / rows
    boxes = [tuple(int(round(v)) for v in (grid["left"] + c * w, grid["top"] + r * h, grid["left"] + (c + 1) * w,
                                           grid["top"] + (r + 1) * h)) for r in range(rows) for c in range(cols)]
    if any(right <= left or bottom <= top for left, top, right, bottom in boxes):
        raise ValueError(f"the planogram's grid {grid} makes facings under a pixel ({rows} x {cols} facings)")
    return boxes


def facing_crops(image_path: Path, planogram: dict, size: int, limits: InputLimits | None = None) -> np.ndarray:
    """The facing cells of a shelf image as (rows*cols, size, size, 3) crops, in row-major order;
    ValueError naming the file if it is not an image read within `limits` or the planogram does not
    fit it (both checked from its header, before decoding)."""
    width, height = image_size(image_path, limits)
    try:
        boxes = facing_boxes(planogram, width, height)
    except ValueError as err:
        raise ValueError(f"shelf {image_path}: {err}") from None
    image = open_image(image_path, limits).convert("RGB")
    return np.stack([np.asarray(image.crop(box).resize((size, size), Image.BILINEAR), np.float32) / 255.0
                     for box in boxes])
