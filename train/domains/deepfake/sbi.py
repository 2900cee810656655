"""Self-blended images (Shiohara and Yamasaki, CVPR 2022): fakes made from real faces alone.

Each real face gets a fake twin: one of two copies of it (50/50 which) is transformed by the
pool's draws and shifted, then blended into the other through a deformed, blurred, eroded and
re-blurred mask of the face region, scaled by a random blend ratio. A detector trained on these
learns what every blend leaves behind (a boundary, a statistics mismatch) rather than one method's
artifact, provided that nothing else tells the twins apart. So, unlike a literal port of the
reference code, nothing here happens to one label only:

- the copy is shifted by whole pixels and not scaled (the reference's sub-pixel affine resamples
  the fake's inner face alone; at 64 px that bilinear pass is a blur the real never gets, and
  "smoother means fake" is what a detector then learns);
- the pool's transforms that resample or sharpen go to either copy with equal odds, so they make
  the inner face smoother or sharper than its real equally often;
- blending happens before any compression: a synthetic real is blended before its JPEG, and the
  twins are then compressed alike (`capture`), so the shift does not move a block grid inside the
  face; crops on disk are blended as decoded, as the reference does;
- real and fake are post-augmented alike, as the reference: colour jitter, then JPEG (quality
  40-100) with probability 0.5.

The patch head learns the blend's boundary (Face X-ray's 4M(1-M) of the normalised mask), not
the blended fraction, which would teach it that whatever the pool did to a patch is a blend.

The pool overlaps the synthetic manipulation families (`POOL_FAMILY`); `holdout=F` removes F's
transforms, so a held-out family is never seen in any form.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
from PIL import Image
from scipy import ndimage
from triskele.train.domains.deepfake.data import augment, jpeg

COLOUR_TRANSFORMS = ("rgb_shift", "hue_saturation", "brightness_contrast")
"""Applied in turn, each with probability 1 as SBI's source transforms are."""
DETAIL_TRANSFORMS = ("resample", "sharpen")
"""Then one of these (SBI's `OneOf(RandomDownScale, Sharpen)`)."""
POOL_FAMILY = {"rgb_shift": "ColorShift", "hue_saturation": "ColorShift", "brightness_contrast": "Exposure",
               "resample": "Resample", "sharpen": "Sharpen"}
"""Which synthetic manipulation family each pool transform resembles (what `holdout` removes)."""
BLEND_RATIOS = (0.25, 0.5, 0.75, 1.0, 1.0, 1.0)
FAKE_NAME = "SBI"


def pool_without(holdout: str | None) -> tuple[str, ...]:
    """The pool's transforms, less those that resemble the held-out family."""
    return tuple(t for t in COLOUR_TRANSFORMS + DETAIL_TRANSFORMS if POOL_FAMILY[t] != holdout)


def _hsv_shift(image: np.ndarray, hue: float, saturation: float) -> np.ndarray:
    """Hue rotated by `hue` (fraction of a turn), saturation scaled by 1 + `saturation`."""
    pil = Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8)).convert("HSV")
    hsv = np.asarray(pil, np.float64)
    hsv[..., 0] = (hsv[..., 0] + hue * 255) % 256
    hsv[..., 1] = np.clip(hsv[..., 1] * (1 + saturation), 0, 255)
    return np.asarray(Image.fromarray(hsv.round().astype(np.uint8), "HSV").convert("RGB"), np.float64) / 255


def _resample(image: np.ndarray, factor: float) -> np.ndarray:
    """SBI's RandomDownScale: nearest-neighbour down to `factor` of the size, bilinear back up."""
    size = image.shape[0]
    small = max(int(round(size * factor)), 4)
    pil = Image.fromarray((np.clip(image, 0, 1) * 255).round().astype(np.uint8))
    up = pil.resize((small, small), Image.NEAREST).resize((size, size), Image.BILINEAR)
    return np.asarray(up, np.float64) / 255


def _sharpen(image: np.ndarray, alpha: float, lightness: float) -> np.ndarray:
    """albumentations' Sharpen: the image blended (alpha) with its 3x3 sharpening by kernel
    [[-1, -1, -1], [-1, 8 + lightness, -1], [-1, -1, -1]]."""
    kernel = -np.ones((3, 3))
    kernel[1, 1] = 8 + lightness
    sharpened = np.stack([ndimage.convolve(image[..., c], kernel, mode="nearest") for c in range(image.shape[-1])],
                         axis=-1)
    return (1 - alpha) * image + alpha * sharpened


@dataclasses.dataclass(frozen=True)
class Draw:
    """One fake's random choices: kept for a whole video, so its frames share one blend."""

    transforms: tuple[str, ...]
    """The pool transforms applied, in order."""
    settings: dict
    transform_source: bool
    """True: the blended-in copy is the transformed one (else the background is)."""
    shift: tuple[float, float]
    """Shift of the blended-in copy: (rows, cols) as fractions of the size, rounded to whole pixels."""
    ratio: float
    mask_seed: int


def draw(pool: tuple[str, ...], rng: np.random.Generator) -> Draw:
    """The transforms and their settings, SBI's ranges (for [0, 1] images)."""
    detail = [t for t in DETAIL_TRANSFORMS if t in pool]
    chosen = tuple(t for t in COLOUR_TRANSFORMS if t in pool)
    if detail:
        chosen += (detail[int(rng.integers(len(detail)))],)
    settings = {
        "rgb_shift": tuple(float(v) for v in rng.uniform(-20, 20, size=3) / 255),
        "hue_saturation": (rng.uniform(-0.3, 0.3) * 20 / 180, rng.uniform(-0.3, 0.3)),
        "brightness_contrast": (rng.uniform(-0.1, 0.1), 1 + rng.uniform(-0.1, 0.1)),
        "resample": (rng.uniform(0.25, 0.5),),
        "sharpen": (rng.uniform(0.2, 0.5), rng.uniform(0.5, 1.0)),
    }
    return Draw(chosen, {k: v for k, v in settings.items() if k in chosen}, bool(rng.random() < 0.5),
                (rng.uniform(-0.015, 0.015), rng.uniform(-0.03, 0.03)), float(rng.choice(BLEND_RATIOS)),
                int(rng.integers(1 << 30)))


def transform(image: np.ndarray, chosen: Draw) -> np.ndarray:
    """The pool's transforms of one (H, W, 3) image in [0, 1]."""
    out = np.asarray(image, np.float64)
    for name in chosen.transforms:
        value = chosen.settings[name]
        if name == "rgb_shift":
            out = out + np.asarray(value)
        elif name == "hue_saturation":
            out = _hsv_shift(out, *value)
        elif name == "brightness_contrast":
            out = (out - out.mean()) * value[1] + out.mean() + value[0]
        elif name == "resample":
            out = _resample(out, *value)
        else:
            out = _sharpen(out, *value)
        out = np.clip(out, 0, 1)
    return out


def _shift(image: np.ndarray, shift: tuple[float, float]) -> np.ndarray:
    """`image` moved by `shift` (fractions of its size) rounded to whole pixels, edges repeated: a
    copy of pixels, never a resampling."""
    pixels = [int(round(f * image.shape[0])) for f in shift]
    return ndimage.shift(image, (*pixels, 0), order=0, mode="nearest")


def blend_mask(region: np.ndarray, chosen: Draw) -> np.ndarray:
    """SBI's mask from a face region (H, W) in [0, 1]: elastically deformed, blurred, eroded (only
    what stayed fully inside survives), blurred again, normalised, times the blend ratio. It is 0
    outside the face region: before the last blur it is cut to the region less that blur's reach."""
    size = region.shape[0]
    rng = np.random.default_rng(chosen.mask_seed)
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64)
    coarse = rng.normal(0, size * 0.04, size=(2, 4, 4))
    flow = [ndimage.zoom(c, size / 4, order=3)[:size, :size] for c in coarse]
    mask = ndimage.map_coordinates(np.asarray(region, np.float64), [rows + flow[0], cols + flow[1]], order=1,
                                   mode="constant")
    unit = size / 64
    mask = ndimage.gaussian_filter(mask, rng.uniform(0.3, 1.0) * unit)
    mask[mask < 0.99] = 0
    sigma = rng.uniform(0.5, 1.5) * unit
    reach = int(4 * sigma + 0.5)  # gaussian_filter's support: 4 sigma along each axis (a square)
    mask *= ndimage.binary_erosion(region > 0.5, structure=np.ones((3, 3)), iterations=reach)
    mask = ndimage.gaussian_filter(mask, sigma)
    peak = mask.max()
    return (mask / peak if peak > 0 else mask) * chosen.ratio


def self_blend(image: np.ndarray, region: np.ndarray, chosen: Draw) -> tuple[np.ndarray, np.ndarray]:
    """(fake, mask) from one real (H, W, 3) image and its face region: equal to `image` wherever
    the mask is 0."""
    altered = transform(image, chosen)
    source, target = (altered, image) if chosen.transform_source else (image, altered)
    source = _shift(source, chosen.shift)
    mask = blend_mask(region, chosen)[..., None]
    return np.clip(mask * source + (1 - mask) * target, 0, 1).astype(np.float32), mask[..., 0]


def post_augment(frames: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What real and fake alike go through, as the reference: colour jitter, then with probability
    0.5 JPEG at quality 40-100 (one draw for a whole clip). Images (..., H, W, 3) in [0, 1]."""
    brightness, contrast, saturation = rng.uniform(-0.08, 0.08), rng.uniform(0.9, 1.1), rng.uniform(0.85, 1.15)
    quality = int(rng.integers(40, 101)) if rng.random() < 0.5 else None
    grey = frames.mean(axis=-1, keepdims=True)
    jittered = np.clip((grey + (frames - grey) * saturation - 0.5) * contrast + 0.5 + brightness, 0, 1)
    if quality is None:
        return jittered.astype(np.float32)
    flat = jittered.reshape(-1, *frames.shape[-3:])
    return np.stack([jpeg(f, quality) for f in flat]).reshape(frames.shape)


def blend_boundary(mask: np.ndarray, ratio: float) -> np.ndarray:
    """Face X-ray's boundary 4M(1-M) of the mask normalised by its blend ratio: 1 where the blend's
    edge is half way, 0 inside and outside it."""
    normalised = np.clip(mask / ratio, 0, 1) if ratio > 0 else np.zeros_like(mask)
    return 4 * normalised * (1 - normalised)


class RealFaces(Protocol):
    """Real faces a self-blended source draws from: record k as (frame (H, W, 3) or clip (T, H, W, 3)
    in [0, 1] before any compression the source applies, its face region(s) (H, W) or (T, H, W),
    video id); `capture(k, frames)` applies that compression to frames of record k's shape."""

    num_reals: int

    def real_face(self, k: int) -> tuple[np.ndarray, np.ndarray, int]: ...

    def capture(self, k: int, frames: np.ndarray) -> np.ndarray: ...


class SelfBlendedFaces:
    """Training records from real faces only: record 2k is real face k, record 2k+1 its fake twin.

    As in SBI, the twins share everything but the blend: one draw (the real is the blend's
    background copy, transformed when the draw transforms the background), one capture, one
    post-augmentation and one flip, and a batch (`group_size`); so the fake differs from its real
    only inside the mask (and in the JPEG blocks it touches). Deterministic per (seed, epoch, index), as every
    record: the pair's draws come from the seed, the pair and the epoch of the record's generator
    (the training loader's `[seed, epoch, index]`). A clip's twin keeps one draw over its frames,
    the mask flickering a little from frame to frame.
    """

    family_names = ("real", FAKE_NAME)
    group_size = 2

    def __init__(self, reals: RealFaces, pool: tuple[str, ...], seed: int = 0):
        if not reals.num_reals:
            raise ValueError("self-blended training (deepfake.fakes=sbi) needs real faces; the split has none")
        self.reals, self.pool, self.seed = reals, pool, seed

    @property
    def packed_source(self) -> RealFaces:
        """What `pack` stores of this split: the real faces (the twins are blended as training reads them)."""
        return self.reals

    def __len__(self) -> int:
        return 2 * self.reals.num_reals

    def _pair_generator(self, index: int, rng: np.random.Generator | None, purpose: int) -> np.random.Generator:
        entropy = rng.bit_generator.seed_seq.entropy if rng is not None else None
        epoch = [int(entropy[1])] if isinstance(entropy, list) and len(entropy) == 3 else []
        return np.random.default_rng([self.seed, purpose, index // 2, *epoch])

    def pair_draw(self, index: int, rng: np.random.Generator | None) -> Draw:
        """The draw record `index` shares with its twin, in the epoch of `rng`."""
        return draw(self.pool, self._pair_generator(index, rng, 31))

    def twin(self, index: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray, int, Draw]:
        """(frames, blend mask in [0, 1], video, the pair's draw) of record `index` before its
        capture and post-augmentation."""
        frames, region, video = self.reals.real_face(index // 2)
        chosen = self.pair_draw(index, rng)
        clip = frames.ndim == 4
        frames, region = (frames, region) if clip else (frames[None], region[None])
        if index % 2 == 0:
            out = np.stack([f if chosen.transform_source else transform(f, chosen) for f in frames])
            masks = np.zeros(out.shape[:-1])
        else:
            flicker = 1 + 0.08 * np.random.default_rng(chosen.mask_seed).normal(size=len(frames)) if clip else [1]
            pairs = [self_blend(f, r, dataclasses.replace(chosen, ratio=float(np.clip(chosen.ratio * k, 0, 1))))
                     for f, r, k in zip(frames, region, flicker, strict=True)]
            out, masks = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
        out = out.astype(np.float32)
        return (out, masks, video, chosen) if clip else (out[0], masks[0], video, chosen)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} is outside the self-blended split of {len(self)} records")
        frames, mask, video, chosen = self.twin(index, rng)
        shared = self._pair_generator(index, rng, 37)
        label = index % 2
        boundary = (blend_boundary(mask, chosen.ratio) * 255).round().astype(np.uint8)
        captured = self.reals.capture(index // 2, frames)
        return augment(post_augment(captured, shared), label, video, shared, blend=boundary, family=label)
