"""How a decoded picture becomes a model input, and how the model normalises it: the one place that
training, evaluation, prediction and export agree on (the export sidecar's description is made here).

Pure functions on in-memory images; reading files (and naming them in errors) is the caller's job.
Only `normalize`, which runs inside the model, uses JAX, and imports it itself: the data readers
(and the command lines that reach them) import this module without starting JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    import jax

NORMALISATIONS = {
    "per_image": "standardized per image inside the model: (x - mean) / (std + 1e-3)",
    "fixed": "normalised inside the model: (x - 0.5) / 0.25",
}
"""What a model does to its [0, 1] input pixels, by name (a model's `normalisation` attribute)."""


def normalize(images: jax.Array, how: str) -> jax.Array:
    """[0, 1] pixels (B, ..., H, W, C) -> what the backbone sees, float32."""
    import jax.numpy as jnp

    images = images.astype(jnp.float32)
    if how == "per_image":  # rover exposure varies from frame to frame
        axes = tuple(range(images.ndim - 3, images.ndim))
        mean = images.mean(axis=axes, keepdims=True)
        std = images.std(axis=axes, keepdims=True)
        return (images - mean) / (std + 1e-3)
    if how == "fixed":
        return (images - 0.5) / 0.25
    raise ValueError(f"unknown normalisation {how!r}; known: {', '.join(NORMALISATIONS)}")


def square_crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """The centred square of a (width, height) image as (left, top, right, bottom)."""
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


HIGH_DEPTH_RANGES = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535, "I": 2**31 - 1, "F": 1.0}
"""PIL's single-channel modes deeper than 8 bits -> the sample value shown as white: the type's
range for integers, 1.0 for floats (the model's range). PIL's own `convert("L")` clips them
instead, so a 12-bit frame reads almost all white."""


def scaled_to_8_bit(pixels: np.ndarray, white: float) -> np.ndarray:
    """Samples in [0, `white`] as uint8 in [0, 255] (rounded; outside the range clipped)."""
    return np.round(np.clip(np.asarray(pixels, np.float64) / white, 0.0, 1.0) * 255).astype(np.uint8)


def eight_bit(image: Image.Image, white: float | None = None) -> Image.Image:
    """`image` as a person sees it in 8 bits: a high-depth grayscale image scaled from its range
    (`white`, else `HIGH_DEPTH_RANGES`); 8-bit, palette, LA, RGB(A) and CMYK images unchanged."""
    if image.mode not in HIGH_DEPTH_RANGES:
        return image
    return Image.fromarray(scaled_to_8_bit(np.asarray(image), white or HIGH_DEPTH_RANGES[image.mode]), "L")


def model_input_pixels(image: Image.Image, size: int, channels: int) -> np.ndarray:
    """(size, size, channels) uint8: grayscale or RGB, centre square, bilinear resize (the 8-bit
    pixels `to_model_input` scales; what a packed dataset stores)."""
    image = eight_bit(image).convert("L" if channels == 1 else "RGB")
    image = image.crop(square_crop_box(*image.size)).resize((size, size), Image.BILINEAR)
    array = np.asarray(image)
    return array[..., None] if channels == 1 else array


def to_unit_range(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1]."""
    return np.asarray(pixels, np.float32) / 255.0


def to_model_input(image: Image.Image, size: int, channels: int) -> np.ndarray:
    """(size, size, channels) float32 in [0, 1]: grayscale or RGB, centre square, bilinear resize."""
    return to_unit_range(model_input_pixels(image, size, channels))


def frame_pixels(image: Image.Image, size: tuple[int, int], channels: int) -> np.ndarray:
    """A whole frame for sliding-window segmentation: (height, width, channels) uint8 of `size`
    (width, height; `frame_size`), grayscale or RGB, resized bilinearly (not resized when it is)."""
    image = eight_bit(image).convert("L" if channels == 1 else "RGB")
    if size != image.size:
        image = image.resize(size, Image.BILINEAR)
    array = np.asarray(image)
    return array[..., None] if channels == 1 else array


def frame_size(width: int, height: int, scale: float) -> tuple[int, int]:
    """(width, height) of a frame read at `scale`."""
    if scale == 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def to_frame(image: Image.Image, scale: float, channels: int) -> np.ndarray:
    """The frame of `image` at `scale` (`frame_pixels`) as float32 in [0, 1]."""
    return to_unit_range(frame_pixels(image, frame_size(*image.size, scale), channels))


def describe_input(channels: int, normalisation: str) -> str:
    """The text that tells a serving client how to prepare pixels (the export sidecar's)."""
    kind = "grayscale" if channels == 1 else "RGB"
    return (f"{kind} pixels in [0, 1], the centre square resized (bilinear) to the input size; "
            f"{NORMALISATIONS[normalisation]}")
