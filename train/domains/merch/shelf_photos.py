"""Synthetic shelf photos for the facing detector: whole bays rendered from a planogram with its
violations, every facing's box and SKU as ground truth, deterministic per (seed, split, index).

A photo holds 4-7 shelves. Each shelf is planned as runs of 2-8 identical facings whose widths
follow their package (aspect 0.4-4, each SKU its own), 0-5% apart; low boxes stand in stacks of
two (one facing column of the plan, two boxes). What is really there departs from the plan by
injected violations: `swap` (two runs exchanged), `gap` (out of stock: the shelf back shows),
`foreign` (a SKU of no catalogue and no gallery), `extra` (an unplanned facing pushed in). Then
the camera: price rails with tags (not products) along each shelf lip, which hides the products'
feet; neighbours that overlap; products cut by the photo's edges; a small roll and a horizontal
yaw (a keystone), blur, a glare spot, a lighting gradient and JPEG compression. A box is the
visible extent of its product in the photo (SKU-110K's convention), clipped to the image.
"""

from __future__ import annotations

import dataclasses
import functools
import io

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from triskele.train.domains.merch.data import _RENDER, draw_package, sku_design

FOREIGN_BASE = 1_000_000
"""SKU ids from here up are foreign: in no catalogue and no gallery."""
VIOLATIONS = ("swap", "gap", "foreign", "extra")
PACKAGE_BOX = (0.22, 0.08, 0.78, 0.95)
"""Where `draw_package` draws the package in its square render (left, top, right, bottom)."""
LIP = 0.09
"""A shelf lip's height, as a share of the shelf pitch."""


@dataclasses.dataclass(frozen=True)
class ShelfPhoto:
    image: np.ndarray
    """(H, W, 3) float32 in [0, 1]."""
    boxes: np.ndarray
    """(N, 4) float32 x1, y1, x2, y2 in pixels: each visible product."""
    skus: np.ndarray
    """(N,) int64: each box's SKU (FOREIGN_BASE and up: foreign)."""
    rows: np.ndarray
    """(N,) int64: each box's shelf, top to bottom."""
    slots: np.ndarray
    """(N,) int64: the index in its shelf's plan of the facing each box stands in (-1: an extra)."""
    planogram: list[list[int | None]]
    """Per shelf, top to bottom, the planned facings left to right (None: planned empty)."""
    violations: list[dict]
    """Each injected departure: {"shelf", "kind", "planned" (index into the shelf's plan, or the
    index it was inserted before for `extra`)}."""


@functools.lru_cache(maxsize=4096)
def package_render(seed: int, sku: int, family_size: int) -> Image.Image:
    """The SKU's package cut from its reference render (foreign SKUs: designs of their own)."""
    image = draw_package(sku_design(seed + (7919 if sku >= FOREIGN_BASE else 0), sku, family_size))
    left, top, right, bottom = (round(v * _RENDER) for v in PACKAGE_BOX)
    return image.crop((left, top, right, bottom))


def package_aspect(seed: int, sku: int) -> float:
    """Width / height of the SKU's package, 0.4-4, most of them narrow (bottles, cans, boxes)."""
    rng = np.random.default_rng([seed, 61, sku])
    return float(np.exp(rng.uniform(np.log(0.4), np.log(1.2)))) if rng.random() < 0.9 else float(rng.uniform(1.2, 4))


def _plan_shelf(rng: np.random.Generator, seed: int, skus: int, width: float, height: float) -> list[int]:
    """Runs of 2-8 facings of one SKU each, until the shelf is full (no SKU tried fits in what is left)."""
    plan, used, misses = [], 0.0, 0
    while misses < 10:
        sku = int(rng.integers(skus))
        run = int(rng.integers(2, 9))
        facing = package_aspect(seed, sku) * height * 1.03
        room = int((width - used) // facing)
        misses += room < 1
        plan += [sku] * min(run, room)
        used += facing * min(run, room)
    return plan


def _inject(rng: np.random.Generator, plan: list[int], rate: float, shelf: int,
            foreign_skus: int) -> tuple[list[int | None], list[dict]]:
    """What is really on one shelf (None: a gap) and the violations that made it so."""
    actual: list[int | None] = list(plan)
    violations: list[dict] = []
    starts = [i for i in range(len(plan)) if i == 0 or plan[i] != plan[i - 1]]
    for i in range(len(plan)):
        if rng.random() >= rate or actual[i] != plan[i]:
            continue
        kind = VIOLATIONS[int(rng.integers(len(VIOLATIONS)))]
        if kind == "swap":
            others = [s for s in starts if plan[s] != plan[i] and actual[s] == plan[s]]
            if not others:
                continue
            j = others[int(rng.integers(len(others)))]
            actual[i], actual[j] = plan[j], plan[i]
            violations += [{"shelf": shelf, "kind": "swap", "planned": i}, {"shelf": shelf, "kind": "swap",
                                                                            "planned": j}]
        elif kind == "gap":
            actual[i] = None
            violations.append({"shelf": shelf, "kind": "gap", "planned": i})
        elif kind == "foreign":
            actual[i] = FOREIGN_BASE + int(rng.integers(foreign_skus))
            violations.append({"shelf": shelf, "kind": "foreign", "planned": i})
        else:
            violations.append({"shelf": shelf, "kind": "extra", "planned": i})
    return actual, violations


def _plan_bay(seed: int, split_id: int, index: int, size: tuple[int, int], skus: int,
              min_facings: int) -> tuple[int, list[float], list[float], list[list[int]]]:
    """(shelves, each shelf's product height, where its bay starts, its plan): products shrunk
    (by 0.85 a try) until the plan holds `min_facings` facings with a margin for those the photo's
    edges cut."""
    height, width = size
    for attempt in range(20):
        rng = np.random.default_rng([seed, 52, split_id, index, attempt])
        shelves = int(rng.integers(4, 8))
        clearance = height / shelves * (1 - LIP)
        product_h = [clearance * rng.uniform(0.6, 0.85) * 0.85**attempt for _ in range(shelves)]
        start = [-rng.uniform(0, 0.3) * h for h in product_h]  # the bay runs past the photo's left edge
        plans = [_plan_shelf(rng, seed, skus, width - x + 0.3 * h, h) for h, x in zip(product_h, start, strict=True)]
        if sum(map(len, plans)) >= 1.1 * min_facings:
            break
    return shelves, product_h, start, plans


def render_shelf_photo(seed: int, split_id: int, index: int, size: tuple[int, int], skus: int,
                       family_size: int = 5, violation_rate: float = 0.08, foreign_skus: int = 50,
                       min_facings: int = 40, jpeg: bool = True) -> ShelfPhoto:
    """Shelf photo `index` of a split, `size` (height, width) pixels, SKUs drawn from `skus`, at
    least about `min_facings` facings planned."""
    rng = np.random.default_rng([seed, 51, split_id, index])
    height, width = size
    back = np.array([rng.uniform(150, 230)] * 3) * np.array([1, rng.uniform(0.9, 1), rng.uniform(0.8, 1)])
    photo = Image.new("RGB", (width, height), tuple(int(v) for v in back))
    draw = ImageDraw.Draw(photo)
    shelves, heights, starts, plans = _plan_bay(seed, split_id, index, size, skus, min_facings)
    pitch = height / shelves
    lip = max(2.0, LIP * pitch)
    boxes, box_skus, box_rows, box_slots, planogram, violations = [], [], [], [], [], []
    for shelf, (product_h, start, plan) in enumerate(zip(heights, starts, plans, strict=True)):
        floor = (shelf + 1) * pitch - lip  # the products stand on the lip's top edge
        actual, found = _inject(rng, plan, violation_rate, shelf, foreign_skus)
        planogram.append([int(s) for s in plan])
        violations += found
        extras = {v["planned"] for v in found if v["kind"] == "extra"}
        x = start
        for i, sku in enumerate(actual):
            # An extra: one more facing of a SKU the shelf plans, pushed in before facing i.
            columns = [(plan[int(rng.integers(len(plan)))], -1), (sku, i)] if i in extras else [(sku, i)]
            for column_sku, slot in columns:
                planned_sku = plan[i] if column_sku is None else column_sku
                w = package_aspect(seed, planned_sku) * product_h
                gap = w * rng.uniform(0, 0.05)
                if column_sku is not None:
                    stack = 2 if product_h / max(w, 1) < 1.2 and rng.random() < 0.15 and w > product_h * 0.9 else 1
                    h = product_h / stack
                    for level in range(stack):
                        jitter = rng.uniform(-0.04, 0.04) * w
                        x1, x2 = x + jitter, x + jitter + w
                        y2 = floor + 0.4 * lip - level * h  # the lower ones' feet behind the lip
                        y1 = y2 - h * rng.uniform(0.96, 1.0)
                        render = package_render(seed, column_sku, family_size).resize(
                            (max(1, round(x2 - x1)), max(1, round(y2 - y1))), Image.BILINEAR)
                        photo.paste(render, (round(x1), round(y1)))
                        boxes.append([x1, y1, x2, min(y2, floor)])
                        box_skus.append(column_sku)
                        box_rows.append(shelf)
                        box_slots.append(slot)
                x += w + gap
        _draw_rail(draw, rng, floor, lip, width)
    boxes_arr = np.asarray(boxes, np.float32).reshape(-1, 4)
    photo, boxes_arr = _camera(photo, boxes_arr, rng)
    boxes_arr, keep = _visible(boxes_arr, width, height)
    image = _photometric(photo, rng, jpeg)
    return ShelfPhoto(image=image, boxes=boxes_arr, skus=np.asarray(box_skus, np.int64)[keep],
                      rows=np.asarray(box_rows, np.int64)[keep], slots=np.asarray(box_slots, np.int64)[keep],
                      planogram=planogram, violations=violations)


def _draw_rail(draw: ImageDraw.ImageDraw, rng: np.random.Generator, floor: float, lip: float, width: int) -> None:
    """The shelf's lip with its price rail and tags: drawn over the products' feet."""
    shade = int(rng.uniform(60, 140))
    draw.rectangle([0, floor, width, floor + lip], fill=(shade, shade, shade + 10))
    x = rng.uniform(0, 40)
    while x < width:
        tag_w = lip * rng.uniform(1.6, 2.6)
        draw.rectangle([x, floor + 0.15 * lip, x + tag_w, floor + 0.85 * lip], fill=(245, 245, 235))
        draw.rectangle([x + 0.15 * tag_w, floor + 0.35 * lip, x + 0.6 * tag_w, floor + 0.55 * lip], fill=(20, 20, 20))
        x += tag_w + rng.uniform(1, 6) * lip


def _camera(photo: Image.Image, boxes: np.ndarray, rng: np.random.Generator) -> tuple[Image.Image, np.ndarray]:
    """A small roll (-2..2 degrees) and yaw (a horizontal keystone): the photo resampled, each box
    the bounding box of its corners' images."""
    width, height = photo.size
    roll = np.deg2rad(rng.uniform(-2, 2))
    keystone = rng.uniform(-0.04, 0.04)  # the right edge this much taller (+) or shorter than the left
    cx, cy = width / 2, height / 2

    def forward(x, y):  # photo point -> camera point
        u, v = x - cx, y - cy
        u, v = u * np.cos(roll) - v * np.sin(roll), u * np.sin(roll) + v * np.cos(roll)
        return u + cx, v * (1 + keystone * u / width) + cy

    def inverse(u, v):  # camera point -> photo point (PIL samples the source at it)
        u, v = u - cx, (v - cy) / (1 + keystone * (u - cx) / width)
        return u * np.cos(roll) + v * np.sin(roll) + cx, -u * np.sin(roll) + v * np.cos(roll) + cy

    mesh = []
    step = 32
    for x0 in range(0, width, step):
        for y0 in range(0, height, step):
            x1, y1 = min(x0 + step, width), min(y0 + step, height)
            quad = [inverse(x0, y0), inverse(x0, y1), inverse(x1, y1), inverse(x1, y0)]
            mesh.append(((x0, y0, x1, y1), tuple(float(c) for p in quad for c in p)))
    fill = photo.getpixel((0, 0))
    warped = photo.transform(photo.size, Image.MESH, mesh, Image.BILINEAR, fillcolor=fill)
    if len(boxes) == 0:
        return warped, boxes
    xs = boxes[:, [0, 2, 2, 0]]
    ys = boxes[:, [1, 1, 3, 3]]
    u, v = forward(xs, ys)
    return warped, np.stack([u.min(1), v.min(1), u.max(1), v.max(1)], axis=1).astype(np.float32)


def _visible(boxes: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes clipped to the photo; one the photo's edge leaves less than a quarter of (or under 2
    pixels across) is no facing to find."""
    clipped = np.stack([np.clip(boxes[:, 0], 0, width), np.clip(boxes[:, 1], 0, height),
                        np.clip(boxes[:, 2], 0, width), np.clip(boxes[:, 3], 0, height)], axis=1)
    area = lambda b: np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    sides = np.minimum(clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1])
    keep = (area(clipped) >= 0.25 * area(boxes)) & (sides >= 2)
    return clipped[keep].astype(np.float32), keep


def _photometric(photo: Image.Image, rng: np.random.Generator, jpeg: bool) -> np.ndarray:
    """Blur, a lighting gradient, a glare spot, sensor noise and JPEG."""
    width, height = photo.size
    photo = photo.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.2)))
    array = np.asarray(photo, np.float32) / 255.0
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    direction = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(direction) * xx / width + np.sin(direction) * yy / height)
    array = array * (1 + rng.uniform(0.1, 0.35) * (ramp - ramp.mean()))[..., None]
    gx, gy, radius = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.05, 0.2) * width
    glare = rng.uniform(0.1, 0.4) * np.exp(-((xx - gx) ** 2 + (yy - gy) ** 2) / (2 * radius**2))
    array = np.clip(array + glare[..., None] + rng.normal(0, 0.01, array.shape), 0, 1)
    if jpeg:
        buffer = io.BytesIO()
        Image.fromarray((array * 255).round().astype(np.uint8)).save(buffer, "JPEG", quality=int(rng.integers(60, 96)))
        array = np.asarray(Image.open(buffer).convert("RGB"), np.float32) / 255.0
    return array.astype(np.float32)


class ShelfPhotos:
    """Random-access synthetic shelf photos as detector records: `image` (S, S, 3), `boxes`
    (max_boxes, 4) padded with zeros, `box_valid` (max_boxes,) 1 for a facing, 0 for padding, and
    `box_sku` (max_boxes,) each facing's SKU (-1: foreign, in no catalogue).
    A photo holding more facings than `max_boxes` is an error, not a silent cut."""

    def __init__(self, split: str, num_records: int, image_size: int, seed: int = 0, skus: int = 100,
                 max_boxes: int = 1024, min_facings: int = 40):
        split_id = {"train": 0, "val": 1, "test": 2}.get(split)
        if split_id is None:
            raise ValueError(f"merch split {split!r} is not one of train, val, test")
        self.split, self.split_id, self.size, self.seed = split, split_id, image_size, seed
        self.num_records, self.skus, self.max_boxes, self.min_facings = num_records, skus, max_boxes, min_facings

    def __len__(self) -> int:
        return self.num_records

    def photo(self, index: int) -> ShelfPhoto:
        return render_shelf_photo(self.seed, self.split_id, index, (self.size, self.size), self.skus,
                                  min_facings=self.min_facings)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        photo = self.photo(index)
        image, boxes = photo.image, photo.boxes
        if rng is not None and rng.random() < 0.5:  # a mirrored bay is as good a bay
            image = image[:, ::-1]
            boxes = np.stack([self.size - boxes[:, 2], boxes[:, 1], self.size - boxes[:, 0], boxes[:, 3]], axis=1)
        skus = np.where(photo.skus >= FOREIGN_BASE, -1, photo.skus)
        return detector_record(image, boxes, self.max_boxes, f"synthetic shelf photo {self.split}/{index}", skus)


def detector_record(image: np.ndarray, boxes: np.ndarray, max_boxes: int, name: str,
                    skus: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """An image and its boxes padded to `max_boxes` (more is an error naming the image), with
    their SKUs as `box_sku` (-1: none known; padding -1 too) where `skus` is given."""
    if len(boxes) > max_boxes:
        raise ValueError(f"{name} holds {len(boxes)} facings, more than merch.max_boxes={max_boxes}; "
                         f"raise merch.max_boxes to at least {len(boxes)}")
    padded = np.zeros((max_boxes, 4), np.float32)
    padded[: len(boxes)] = boxes
    valid = np.zeros(max_boxes, np.float32)
    valid[: len(boxes)] = 1
    record = {"image": np.ascontiguousarray(image, np.float32), "boxes": padded, "box_valid": valid}
    if skus is not None:
        record["box_sku"] = np.full(max_boxes, -1, np.int32)
        record["box_sku"][: len(skus)] = skus
    return record
