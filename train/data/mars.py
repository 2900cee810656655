"""Mars terrain data: a deterministic synthetic navigation-camera generator (and, later, AI4Mars on disk).

Synthetic images are grayscale views of a ground plane seen in perspective: class regions and
textures live in ground coordinates, so they shrink toward the horizon. Sky and far range are
labelled 255 (ignored). Each class has its own texture; per-image gain and brightness make
intensity alone a poor cue.
"""

from __future__ import annotations

import functools

import numpy as np

CLASS_NAMES = ("soil", "bedrock", "sand", "big_rock")
IGNORE = 255
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


def render_terrain(seed: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One (image float32 HxW in [0,1], label uint8 HxW) pair, a pure function of (seed, size)."""
    rng = np.random.default_rng(seed)
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

    # Class layout on the ground: bedrock ~50%, sand ~12%, soil the rest, a few big rocks ~1%.
    label = np.full((size, size), IGNORE, np.uint8)
    bedrock_field = _fourier_field(rng, x, z, scale=rng.uniform(2.0, 4.0))
    sand_field = _fourier_field(rng, x, z, scale=rng.uniform(1.5, 3.0))
    bedrock = ground & (bedrock_field > _quantile_threshold(bedrock_field, ground, rng.uniform(0.35, 0.65)))
    rest = ground & ~bedrock
    sand = rest & (sand_field > _quantile_threshold(sand_field, rest, rng.uniform(0.1, 0.35)))
    label[ground] = 0
    label[bedrock] = 1
    label[sand] = 2

    # Textures, in ground coordinates.
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
    image = np.select([label == 2, label == 0, label == 1], [ripples, soil, rock_plates], 0.0)

    # Big rocks: discrete blobs, lit from one side, with a cast shadow on the ground beside them.
    light = rng.uniform(0, 2 * np.pi)
    lx, lz = np.cos(light), np.sin(light)
    ground_rows = np.nonzero(ground.any(axis=1))[0]
    for _ in range(rng.poisson(0.5)):
        if ground_rows.size == 0:
            break
        r0 = rng.uniform(ground_rows[0] + 0.3 * ground_rows.size, size)
        c0 = rng.uniform(0, size)
        rd = focal * height / max(r0 - horizon, 1e-3)
        radius = rng.uniform(0.12, 0.25) * focal / rd  # pixels
        dr, dc = (rows - r0) / (0.7 * radius), (cols - c0) / radius
        dist = np.sqrt(dr**2 + dc**2)
        shadow = ground & (np.sqrt((dr + 1.1 * lz) ** 2 + (dc - 1.1 * lx) ** 2) < 1.0) & (dist >= 1.0)
        image = np.where(shadow, image * 0.45, image)
        blob = ground & (dist < 1.0)
        shade = 0.55 + 0.3 * (dc * lx - dr * lz) / np.maximum(dist, 1e-3) * np.sqrt(np.clip(dist, 0, 1))
        image = np.where(blob, shade + 0.04 * (grains - 0.5), image)
        label[blob] = 3

    sky = 0.75 + 0.2 * (rows / max(horizon, 1.0)) + 0.03 * rng.normal(size=(size, size))
    image = np.where(below, image, sky)
    image = np.where(below & ~ground, 0.5 + 0.05 * rng.normal(size=(size, size)), image)
    # Per-image exposure: intensity alone cannot give the class.
    image = image * rng.uniform(0.55, 1.45) + rng.uniform(-0.25, 0.25)
    image = image + rng.normal(0, 0.02, size=image.shape)
    return np.clip(image, 0.0, 1.0).astype(np.float32), label


class SyntheticTerrain:
    """Random-access synthetic split: record i of split s is `render_terrain` of (seed, s, i).

    Rendered records are cached (up to `cache_bytes`), so epochs after the first cost no rendering.
    """

    def __init__(self, split: str, num_records: int, image_size: int, seed: int = 0, cache_bytes: int = 256 << 20):
        if split not in _SPLIT_OFFSET:
            raise ValueError(f"mars split {split!r} is not one of {', '.join(_SPLIT_OFFSET)}")
        self.split, self.num_records, self.image_size, self.seed = split, num_records, image_size, seed
        self._render = functools.lru_cache(maxsize=max(cache_bytes // (5 * image_size**2), 1))(self._render_index)

    def __len__(self) -> int:
        return self.num_records

    def record_seed(self, index: int) -> list[int]:
        return [self.seed, _SPLIT_OFFSET[self.split], index]

    def _render_index(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        seed = np.random.SeedSequence(self.record_seed(index)).generate_state(1)[0]
        return render_terrain(int(seed), self.image_size)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        if not 0 <= index < self.num_records:
            raise IndexError(f"record {index} is outside the {self.split} split of {self.num_records} records")
        image, label = self._render(index)
        if rng is not None and rng.random() < 0.5:  # augmentation: horizontal flip
            image, label = image[:, ::-1], label[:, ::-1]
        return {"image": np.ascontiguousarray(image[..., None]), "label": np.ascontiguousarray(label)}
