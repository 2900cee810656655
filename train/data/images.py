"""Reading images and masks from disk, with errors that name the file; what the pixels then become
is `triskele.models.preprocess`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError
from triskele.models.preprocess import to_model_input

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".JPG", ".JPEG", ".PNG")


def _unreadable(path: Path, err: Exception) -> ValueError:
    """The reader's error naming the file; a 0-byte file (an interrupted copy, say) is called empty,
    which PIL's 'cannot identify image file' does not say."""
    empty = Path(path).is_file() and Path(path).stat().st_size == 0
    return ValueError(f"cannot read image {path}: {'empty file (0 bytes)' if empty else err}")


def open_image(path: Path) -> Image.Image:
    try:
        image = Image.open(path)
        image.load()
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise _unreadable(path, err) from None
    return image


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) from the file header, without decoding the pixels."""
    try:
        with Image.open(path) as image:
            return image.size
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise _unreadable(path, err) from None


def read_image(path: Path, size: int, channels: int) -> np.ndarray:
    """The model input of an image file: (size, size, channels) float32 in [0, 1]."""
    return to_model_input(open_image(path), size, channels)


def read_mask(path: Path, like: Path | None = None) -> np.ndarray:
    """A single-channel uint8 mask at its own resolution; `like` is an image it must match in size."""
    mask = open_image(path)
    if mask.mode not in ("L", "P", "1", "I", "I;16"):
        mask = mask.convert("L")
    if like is not None:
        expected = image_size(like)
        if mask.size != expected:
            raise ValueError(f"mask {path} is {mask.size[0]}x{mask.size[1]} but its image {like} is "
                             f"{expected[0]}x{expected[1]}; masks must match their image's size")
    return np.asarray(mask).astype(np.int64)
