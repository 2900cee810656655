"""Mars terrain data: a deterministic synthetic navigation-camera generator, and AI4Mars on disk.

Training records are random crops of the model's input size from whole frames (scaled first by
`mars.scale` on disk; rendered at `mars.frame_size` when synthetic), so every crop is a real part
of a scene at the resolution inference will see. Evaluation records are whole frames with their
labels at native resolution, scored by sliding-window inference.

Synthetic images are grayscale views of a ground plane seen in perspective: class regions and
textures live in ground coordinates, so they shrink toward the horizon. Sky and far range are
labelled 255 (ignored). Each class has its own texture; per-image gain and brightness make
intensity alone a poor cue.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from PIL import Image
from triskele.models.mars import IGNORE_LABEL as IGNORE
from triskele.models.preprocess import to_unit_range
from triskele.train.config.schema import InputLimits
from triskele.train.data.images import IMAGE_SUFFIXES, image_size, read_frame, read_mask
from triskele.train.data.packed import PackedRecords
from triskele.train.data.pipeline import RecordCache
from triskele.train.data.splits import check_split, hold_out

_SPLIT_OFFSET = {"train": 0, "val": 1, "test": 2}


def _fourier_field(rng: np.random.Generator, x: np.ndarray, z: np.ndarray, scale: float, terms: int = 12):
    """A smooth random field on the ground plane with correlation length ~`scale` (metres)."""
    freq = rng.normal(size=(terms, 2)) / scale
    phase = rng.uniform(0, 2 * np.pi, size=terms)
    field = np.cos(x[..., None] * freq[:, 0] + z[..., None] * freq[:, 1] + phase).sum(-1)
    return field / np.sqrt(terms / 2)


def _hash_noise(ix: np.ndarray, iz: np.ndarray, salt: int) -> np.ndarray:
    """Uniform [0, 1) noise per integer ground cell, deterministic in (cell, salt)."""
    h = (ix.astype(np.int64) * 73856093) ^ (iz.astype(np.int64) * 19349663) ^ (salt * 83492791)
    h = (h ^ (h >> 13)) * 1274126177
    return ((h ^ (h >> 16)) & 0xFFFF) / 65536.0


def _quantile_threshold(field: np.ndarray, mask: np.ndarray, fraction: float) -> float:
    values = field[mask]
    return float(np.quantile(values, 1 - fraction)) if values.size else np.inf


@dataclasses.dataclass
class _View:
    """A camera over flat ground: pixel rows and columns, the horizon, and each pixel's ground
    coordinates (x across, z ahead) where it sees ground nearer than the far plane."""

    rows: np.ndarray
    cols: np.ndarray
    horizon: float
    focal: float
    height: float
    below: np.ndarray
    ground: np.ndarray
    x: np.ndarray
    z: np.ndarray


def _view(rng: np.random.Generator, size: int) -> _View:
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    horizon = rng.uniform(0.15, 0.35) * size
    focal = size * rng.uniform(0.8, 1.2)
    height = rng.uniform(1.0, 1.6)  # camera height (m)
    below = rows > horizon + 0.5
    depth = np.where(below, focal * height / np.maximum(rows - horizon, 1e-3), np.inf)
    far = rng.uniform(10.0, 20.0)
    ground = below & (depth < far)
    z = np.where(ground, depth, far) + rng.uniform(0, 100)
    x = (cols - size / 2) * np.where(ground, depth, far) / focal + rng.uniform(0, 100)
    return _View(rows, cols, horizon, focal, height, below, ground, x, z)


def _ground_classes(rng: np.random.Generator, view: _View) -> np.ndarray:
    """Class layout on the ground: bedrock ~50%, sand ~12%, soil the rest (big rocks come later)."""
    x, z, ground = view.x, view.z, view.ground
    label = np.full(ground.shape, IGNORE, np.uint8)
    bedrock_field = _fourier_field(rng, x, z, scale=rng.uniform(2.0, 4.0))
    sand_field = _fourier_field(rng, x, z, scale=rng.uniform(1.5, 3.0))
    bedrock = ground & (bedrock_field > _quantile_threshold(bedrock_field, ground, rng.uniform(0.35, 0.65)))
    rest = ground & ~bedrock
    sand = rest & (sand_field > _quantile_threshold(sand_field, rest, rng.uniform(0.1, 0.35)))
    label[ground] = 0
    label[bedrock] = 1
    label[sand] = 2
    return label


def _textures(rng: np.random.Generator, view: _View, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(image, grains): each class's texture in ground coordinates, and the soil's grain noise."""
    x, z = view.x, view.z
    theta = rng.uniform(0, np.pi)
    warp = 0.5 * _fourier_field(rng, x, z, scale=1.5, terms=6)
    along = x * np.cos(theta) + z * np.sin(theta)
    ripples = 0.5 + 0.2 * np.sin(2 * np.pi * along / rng.uniform(0.3, 0.6) + warp)  # smooth, oriented
    grains = _hash_noise(np.floor(x * 10), np.floor(z * 10), 1)
    pebble = _hash_noise(np.floor(x * 4), np.floor(z * 4), 2) > 0.9
    soil = 0.45 + 0.35 * (grains - 0.5) - 0.2 * pebble  # granular, with dark pebbles
    phi = rng.uniform(0, np.pi / 2)
    u, v = x * np.cos(phi) - z * np.sin(phi), x * np.sin(phi) + z * np.cos(phi)
    plate_u, plate_v = u / 1.1 + 0.2 * warp, v / 1.1
    plate_id = _hash_noise(np.floor(plate_u), np.floor(plate_v), 3)
    layering = 0.03 * np.sin(2 * np.pi * v / 0.7)
    fracture = (np.abs(plate_u - np.round(plate_u)) < 0.05) | (np.abs(plate_v - np.round(plate_v)) < 0.05)
    rock_plates = 0.5 + 0.25 * (plate_id - 0.5) + layering - 0.3 * fracture  # flat plates, cracks
    return np.select([label == 2, label == 0, label == 1], [ripples, soil, rock_plates], 0.0), grains


def _big_rocks(rng: np.random.Generator, view: _View, image: np.ndarray, label: np.ndarray, grains: np.ndarray,
               size: int) -> np.ndarray:
    """Discrete blobs, lit from one side, with a cast shadow on the ground beside them (label 3)."""
    rows, cols, ground = view.rows, view.cols, view.ground
    light = rng.uniform(0, 2 * np.pi)
    lx, lz = np.cos(light), np.sin(light)
    ground_rows = np.nonzero(ground.any(axis=1))[0]
    for _ in range(rng.poisson(0.5)):
        if ground_rows.size == 0:
            break
        r0 = rng.uniform(ground_rows[0] + 0.3 * ground_rows.size, size)
        c0 = rng.uniform(0, size)
        rd = view.focal * view.height / max(r0 - view.horizon, 1e-3)
        radius = rng.uniform(0.12, 0.25) * view.focal / rd  # pixels
        dr, dc = (rows - r0) / (0.7 * radius), (cols - c0) / radius
        dist = np.sqrt(dr**2 + dc**2)
        shadow = ground & (np.sqrt((dr + 1.1 * lz) ** 2 + (dc - 1.1 * lx) ** 2) < 1.0) & (dist >= 1.0)
        image = np.where(shadow, image * 0.45, image)
        blob = ground & (dist < 1.0)
        shade = 0.55 + 0.3 * (dc * lx - dr * lz) / np.maximum(dist, 1e-3) * np.sqrt(np.clip(dist, 0, 1))
        image = np.where(blob, shade + 0.04 * (grains - 0.5), image)
        label[blob] = 3
    return image


def render_terrain(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One (image float32 HxW in [0,1], label uint8 HxW) pair, a pure function of (seed, size)."""
    rng = np.random.default_rng(seed)
    view = _view(rng, size)
    label = _ground_classes(rng, view)
    image, grains = _textures(rng, view, label)
    image = _big_rocks(rng, view, image, label, grains, size)
    below = view.below
    sky = 0.75 + 0.2 * (view.rows / max(view.horizon, 1.0)) + 0.03 * rng.normal(size=(size, size))
    image = np.where(below, image, sky)
    image = np.where(below & ~view.ground, 0.5 + 0.05 * rng.normal(size=(size, size)), image)
    # Per-image exposure: intensity alone cannot give the class.
    image = image * rng.uniform(0.55, 1.45) + rng.uniform(-0.25, 0.25)
    image = image + rng.normal(0, 0.02, size=image.shape)
    return np.clip(image, 0.0, 1.0).astype(np.float32), label


def crop(image: np.ndarray, label: np.ndarray, size: int, rng: np.random.Generator | None
         ) -> tuple[np.ndarray, np.ndarray]:
    """A size x size crop at a random place (rng None: the centre); a smaller frame is padded
    (image by its edge, label by 255)."""
    height, width = label.shape
    pad = ((0, max(0, size - height)), (0, max(0, size - width)))
    if any(p[1] for p in pad):
        image = np.pad(image, pad + ((0, 0),), mode="edge")
        label = np.pad(label, pad, constant_values=IGNORE)
        height, width = label.shape
    if rng is None:
        top, left = (height - size) // 2, (width - size) // 2
    else:
        top, left = int(rng.integers(height - size + 1)), int(rng.integers(width - size + 1))
    return image[top : top + size, left : left + size], label[top : top + size, left : left + size]


class SyntheticTerrain:
    """Random-access synthetic split: record i of split s is `render_terrain` of (seed, s, i) at
    `frame_size` (default `image_size`); with `crops` a random image_size crop of it (training).

    Rendered records are cached (up to `cache_bytes`), so epochs after the first cost no rendering.
    """

    def __init__(self, split: str, num_records: int, image_size: int, seed: int = 0, cache_bytes: int = 256 << 20,
                 frame_size: int | None = None, crops: bool = False):
        if split not in _SPLIT_OFFSET:
            raise ValueError(f"mars split {split!r} is not one of {', '.join(_SPLIT_OFFSET)}")
        self.split, self.num_records, self.image_size, self.seed = split, num_records, image_size, seed
        self.frame_size, self.crops = frame_size or image_size, crops
        self._render = RecordCache(self._render_index, cache_bytes // (5 * self.frame_size**2))

    def __len__(self) -> int:
        return self.num_records

    def record_seed(self, index: int) -> list[int]:
        return [self.seed, _SPLIT_OFFSET[self.split], index]

    def _render_index(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        seed = np.random.SeedSequence(self.record_seed(index)).generate_state(1)[0]
        return render_terrain(int(seed), self.frame_size)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        if not 0 <= index < self.num_records:
            raise IndexError(f"record {index} is outside the {self.split} split of {self.num_records} records")
        image, label = self._render(index)
        image = image[..., None]
        if self.crops:
            image, label = crop(image, label, self.image_size, rng)
        return augment(image, label, rng)


def augment(image: np.ndarray, label: np.ndarray, rng: np.random.Generator | None) -> dict[str, np.ndarray]:
    """A random horizontal flip (rng None: none), as the record dict the model reads."""
    if rng is not None and rng.random() < 0.5:
        image, label = image[:, ::-1], label[:, ::-1]
    return {"image": np.ascontiguousarray(image), "label": np.ascontiguousarray(label, dtype=np.uint8)}


LABEL_VALUES = np.zeros(256, bool)
LABEL_VALUES[[0, 1, 2, 3, IGNORE]] = True
"""The values a mars label may hold: soil, bedrock, sand, big rock and 255 (ignore)."""


def check_label_values(label: np.ndarray, path: Path) -> None:
    values = np.asarray(label).ravel()
    if values.dtype != np.uint8 and (values.min() < 0 or values.max() > 255):
        bad = np.unique(values[(values < 0) | (values > 255)])
    else:  # a count per byte value: a fraction of np.unique's sort on a megapixel label
        bad = np.flatnonzero((np.bincount(values.astype(np.uint8, copy=False), minlength=256) > 0) & ~LABEL_VALUES)
    if bad.size:
        raise ValueError(
            f"label {path} has values {bad.tolist()[:8]} outside 0..3 (soil, bedrock, sand, big rock) and 255 (ignore)"
        )


class TerrainFiles:
    """Labelled navigation-camera images on disk, in the AI4Mars layout or a generic one.

    AI4Mars (`ROOT/msl/...`): images `images/edr/<stem>.JPG`; labels `labels/train/<stem>.png` (the
    train and val splits: val is the `val_fraction` held out by a hash of the stem) or, for the test
    split, `labels/test/masked-gold-min<k>-100agree/<stem>_merged.png`; the rover mask
    `images/mxy/` and the beyond-30 m mask `images/rng-30m/` share the stem with EDR replaced by MXY
    and RNG, and set the label to 255 where they are set. Images with no label file are counted and
    reported, not an error. Generic: `ROOT/[<split>/]images/*.{png,jpg}` + `masks/<stem>.png`; without
    a val/ folder, val is held out of train/ (or of ROOT) by a hash of the image's relative path.
    Every file is read within `limits` (default: `InputLimits()`'s).
    """

    def __init__(self, root: str | Path, split: str, image_size: int, channels: int = 1, agreement: int = 3,
                 scale: float = 1.0, crops: bool = False, val_fraction: float = 0.0, limits: InputLimits | None = None):
        self.root, self.split, self.image_size, self.channels = Path(root), check_split(split), image_size, channels
        self.scale, self.crops, self.val_fraction, self.limits = scale, crops, val_fraction, limits
        if not self.root.is_dir():
            raise ValueError(f"data.path {str(self.root)!r} is not a folder")
        if (self.root / "msl").is_dir():
            self.layout = "ai4mars"
            self.records, self.unlabelled = self._ai4mars(agreement)
        else:
            self.layout = "generic"
            self.records, self.unlabelled = self._generic()
        if not self.records:
            raise ValueError(f"{self.describe_layout()} has no labelled images for split {split!r}")

    def describe_layout(self) -> str:
        return f"{self.layout} data at {self.root}"

    def _ai4mars(self, agreement: int):
        msl = self.root / "msl"
        images = msl / "images" / "edr"
        if not images.is_dir():
            raise ValueError(f"AI4Mars layout at {self.root}: missing folder {images}")
        if self.split == "test":
            label_dir, suffix = msl / "labels" / "test" / f"masked-gold-min{agreement}-100agree", "_merged"
        else:
            label_dir, suffix = msl / "labels" / "train", ""
        if not label_dir.is_dir():
            raise ValueError(f"AI4Mars layout at {self.root}: split {self.split!r} needs label folder {label_dir}")
        image_by_stem = {p.stem: p for p in images.iterdir() if p.suffix in IMAGE_SUFFIXES}
        records = []
        for label in sorted(label_dir.glob("*.png")):
            stem = label.stem[: -len(suffix)] if suffix and label.stem.endswith(suffix) else label.stem
            if stem not in image_by_stem:
                raise ValueError(f"label {label} has no image {images / (stem + '.JPG')}")
            masks = [msl / "images" / "mxy" / f"{stem.replace('EDR', 'MXY')}.png",
                     msl / "images" / "rng-30m" / f"{stem.replace('EDR', 'RNG')}.png"]
            records.append((image_by_stem[stem], label, [m for m in masks if m.exists()]))
        labelled = {r[0].stem for r in records}
        unlabelled = sum(1 for stem in image_by_stem if stem not in labelled)
        if self.split != "test":
            records = hold_out(records, lambda r: r[0].stem, self.split, self.val_fraction)
        return records, unlabelled

    def _generic(self):
        folder = lambda split: (self.root / split / "images").is_dir()
        held_out = self.split != "test" and not folder("val")  # val drawn from the training records
        split = "train" if held_out else self.split
        base = self.root / split if folder(split) else self.root
        images, masks = base / "images", base / "masks"
        if not images.is_dir() or not masks.is_dir():
            raise ValueError(
                f"data.path {str(self.root)!r} matches no Mars layout: expected msl/ (AI4Mars) or "
                f"[{self.split}/]images/ with masks/ beside it"
            )
        image_by_stem = {p.stem: p for p in sorted(images.iterdir()) if p.suffix in IMAGE_SUFFIXES}
        records = []
        for mask in sorted(masks.glob("*.png")):
            if mask.stem not in image_by_stem:
                raise ValueError(f"mask {mask} has no image {images / mask.stem}.png/.jpg")
            records.append((image_by_stem[mask.stem], mask, []))
        labelled = {r[0].stem for r in records}
        if held_out:
            records = hold_out(records, lambda r: str(r[0].relative_to(self.root)), self.split, self.val_fraction)
        return records, sum(1 for stem in image_by_stem if stem not in labelled)

    def report(self) -> str:
        return (f"{self.describe_layout()}, split {self.split!r}: {len(self.records)} labelled images, "
                f"{self.unlabelled} images without a label skipped")

    def __len__(self) -> int:
        return len(self.records)

    def decoded(self, index: int) -> dict[str, np.ndarray]:
        """Record `index` before augmentation, as a pack stores it: the frame at `scale` (uint8,
        `read_frame`) and its label (uint8) with the rover and range masks merged in, at native
        resolution, or with `crops` scaled as the frame (nearest neighbour)."""
        image_path, label_path, mask_paths = self.records[index]
        size = image_size(image_path, self.limits)
        label = read_mask(label_path, image_path, self.limits, size)
        check_label_values(label, label_path)
        for mask_path in mask_paths:  # rover and beyond-range pixels are not terrain to learn
            label = np.where(read_mask(mask_path, image_path, self.limits, size) > 0, IGNORE, label)
        image = read_frame(image_path, self.scale, self.channels, self.limits)
        label = label.astype(np.uint8)
        if self.crops:
            label = np.asarray(Image.fromarray(label).resize(image.shape[1::-1], Image.NEAREST))
        return {"image": image, "label": label}

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """The frame scaled by `scale` with its label at native resolution; with `crops`, a random
        image_size crop of the scaled frame and of its label scaled alike."""
        return terrain_sample(self.decoded(index), self.image_size, self.crops, rng)

    def packed_meta(self) -> dict:
        return {}


def terrain_sample(record: dict[str, np.ndarray], image_size: int, crops: bool, rng: np.random.Generator | None
                   ) -> dict[str, np.ndarray]:
    """A decoded record (`TerrainFiles.decoded`) as training reads it: with `crops`, a random
    image_size crop (made on the 8-bit pixels, converted after), then `augment`."""
    image, label = record["image"], record["label"]
    if crops:
        image, label = crop(image, label, image_size, rng)
    return augment(to_unit_range(image), label, rng)


class PackedTerrain:
    """A packed mars split (`triskele.train.data.packed`): its decoded records through `terrain_sample`."""

    def __init__(self, records: PackedRecords, image_size: int, crops: bool):
        self.records, self.image_size, self.crops = records, image_size, crops

    def report(self) -> str:
        return f"packed mars data at {self.records.root}, split {self.records.split!r}: {len(self)} records"

    def __len__(self) -> int:
        return len(self.records)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        return terrain_sample(self.records.decoded(index), self.image_size, self.crops, rng)
