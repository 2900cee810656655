"""Mars pictures: class colours, a class-index mask as a palette PNG, a picture as PNG bytes, the
image | truth | prediction overlay, a mask blended over its image, the confusion-matrix plot."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from triskele.models.mars import CLASS_NAMES, IGNORE_LABEL
from triskele.train.bookkeeping.plots import save_figure

# Display colours: soil, bedrock, sand, big rock; ignored pixels (and out-of-range values) white.
PALETTE = np.array([[170, 120, 80], [120, 120, 130], [235, 200, 110], [200, 40, 40]], np.uint8)
IGNORE_COLOUR = (255, 255, 255)


def colorize(label: np.ndarray) -> np.ndarray:
    """Class-index mask (H, W) -> RGB (255 and out-of-range IGNORE_COLOUR)."""
    out = np.full(label.shape + (3,), IGNORE_COLOUR, np.uint8)
    known = label < len(PALETTE)
    out[known] = PALETTE[label[known]]
    return out


def mask_png(mask: np.ndarray) -> bytes:
    """A class-index mask (H, W) as a palette PNG (as PASCAL VOC's): its pixels stay the class
    indices for whatever reads them back, and an image viewer shows the classes' colours."""
    from PIL import Image

    palette = np.zeros((256, 3), np.uint8)
    palette[: len(PALETTE)] = PALETTE
    palette[IGNORE_LABEL] = IGNORE_COLOUR
    picture = Image.fromarray(np.asarray(mask, np.uint8))
    picture.putpalette(palette.ravel().tolist())  # an 'L' image given a palette becomes 'P', its values kept
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def png_bytes(pixels: np.ndarray) -> bytes:
    """A uint8 picture (H, W) or (H, W, 3) as PNG bytes, for `write_atomically`."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


OVERLAY_PANEL = 256
"""Pixels on the longer side of each picture of a mask (at least): the model's 64-pixel inputs are
enlarged by nearest neighbour so that labels stay crisp."""


def enlarged(picture: np.ndarray) -> np.ndarray:
    """An (H, W, C) picture enlarged by a whole factor, nearest neighbour, until its longer side is
    at least OVERLAY_PANEL pixels."""
    factor = max(1, -(-OVERLAY_PANEL // max(picture.shape[:2])))
    return np.kron(picture, np.ones((factor, factor, 1), picture.dtype))


def overlay(image: np.ndarray, truth: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """Image | truth | prediction side by side, each enlarged, over a legend of the class colours
    (ignored pixels too: a truth label has them); one RGB array."""
    from PIL import Image, ImageDraw

    gray = np.clip(image[..., 0] if image.ndim == 3 else image, 0, 1)
    rgb = np.repeat((gray * 255).astype(np.uint8)[..., None], 3, axis=-1)
    panels = [enlarged(p) for p in (rgb, colorize(truth), colorize(prediction))]
    strip = np.full((28, sum(p.shape[1] for p in panels) + 8 * (len(panels) - 1), 3), 255, np.uint8)
    gap = np.full((panels[0].shape[0], 8, 3), 255, np.uint8)
    picture = Image.fromarray(np.concatenate([np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=1),
                                              strip]))
    draw = ImageDraw.Draw(picture)
    y = panels[0].shape[0] + 8
    _legend(draw, 4, y, legend_entries(ignored=True))
    draw.text((picture.width - 190, y + 1), "image | truth | prediction", fill=(0, 0, 0))
    return np.asarray(picture)


def plot_confusion(confusion: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confusion = np.asarray(confusion, np.float64)
    rows = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(CLASS_NAMES)), CLASS_NAMES, rotation=30)
    ax.set_yticks(range(len(CLASS_NAMES)), CLASS_NAMES)
    ax.set_xlabel("predicted")
    ax.set_ylabel("truth")
    for i in range(len(CLASS_NAMES)):
        for j in range(len(CLASS_NAMES)):
            ax.text(j, i, f"{rows[i, j]:.2f}", ha="center", va="center", color="white" if rows[i, j] > 0.5 else "black")
    ax.set_title("confusion (row-normalised)")
    fig.tight_layout()
    save_figure(fig, path)


def legend_entries(ignored: bool) -> list[tuple[str, tuple[int, int, int]]]:
    """(name, colour) of each class a legend lists: the ignored pixels only where the picture's
    mask can hold them (a truth label, not a prediction)."""
    entries = [(name, tuple(int(c) for c in colour)) for name, colour in zip(CLASS_NAMES, PALETTE, strict=True)]
    return entries + [("ignored", IGNORE_COLOUR)] if ignored else entries


def _legend(draw, x: int, y: int, entries: list[tuple[str, tuple[int, int, int]]]) -> None:
    """The entries' colours, left to right from (x, y)."""
    for name, colour in entries:
        draw.rectangle([x, y, x + 14, y + 14], fill=colour, outline=(0, 0, 0))
        draw.text((x + 20, y + 1), name.replace("_", " "), fill=(0, 0, 0))
        x += 30 + 7 * len(name)


def blended(image: np.ndarray, prediction: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The predicted classes' colours blended over a grayscale or RGB image of the mask's size,
    enlarged, a legend of the classes below."""
    from PIL import Image, ImageDraw

    pixels = np.clip(image, 0, 1)
    rgb = (np.repeat(pixels, 3, axis=-1) if pixels.shape[-1] == 1 else pixels) * 255
    mixed = enlarged(((1 - alpha) * rgb + alpha * colorize(prediction)).astype(np.uint8))
    picture = Image.new("RGB", (max(mixed.shape[1], 420), mixed.shape[0] + 24), (255, 255, 255))
    picture.paste(Image.fromarray(mixed), (0, 0))
    _legend(ImageDraw.Draw(picture), 4, mixed.shape[0] + 5, legend_entries(ignored=False))
    return np.asarray(picture)
