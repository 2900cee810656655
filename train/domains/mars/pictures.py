"""Mars pictures: class colours, the image | truth | prediction overlay, a mask blended over its
image, the confusion-matrix plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from triskele.models.mars import CLASS_NAMES

# Display colours: soil, bedrock, sand, big rock; ignored pixels black.
PALETTE = np.array([[170, 120, 80], [120, 120, 130], [235, 200, 110], [200, 40, 40]], np.uint8)


def colorize(label: np.ndarray) -> np.ndarray:
    """Class-index mask (H, W) -> RGB (255 and out-of-range black)."""
    out = np.zeros(label.shape + (3,), np.uint8)
    known = label < len(PALETTE)
    out[known] = PALETTE[label[known]]
    return out


OVERLAY_PANEL = 256
"""Pixels per side of each overlay panel (at least): the model's 64-pixel inputs are enlarged by
nearest neighbour so that labels stay crisp."""


def overlay(image: np.ndarray, truth: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """Image | truth | prediction side by side, each enlarged to at least OVERLAY_PANEL pixels by
    nearest neighbour, over a legend of the class colours; one RGB array."""
    from PIL import Image, ImageDraw

    gray = np.clip(image[..., 0] if image.ndim == 3 else image, 0, 1)
    rgb = np.repeat((gray * 255).astype(np.uint8)[..., None], 3, axis=-1)
    factor = max(1, -(-OVERLAY_PANEL // gray.shape[0]))
    panels = [np.kron(p, np.ones((factor, factor, 1), np.uint8)) for p in (rgb, colorize(truth), colorize(prediction))]
    strip = np.full((28, sum(p.shape[1] for p in panels) + 8 * (len(panels) - 1), 3), 255, np.uint8)
    gap = np.full((panels[0].shape[0], 8, 3), 255, np.uint8)
    picture = Image.fromarray(np.concatenate([np.concatenate([panels[0], gap, panels[1], gap, panels[2]], axis=1),
                                              strip]))
    draw = ImageDraw.Draw(picture)
    y = panels[0].shape[0] + 8
    _legend(draw, 4, y)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _legend(draw, x: int, y: int) -> None:
    """The class colours, left to right from (x, y)."""
    for name, colour in zip((*CLASS_NAMES, "ignored"), (*PALETTE, (0, 0, 0)), strict=True):
        draw.rectangle([x, y, x + 14, y + 14], fill=tuple(int(c) for c in colour), outline=(0, 0, 0))
        draw.text((x + 20, y + 1), name.replace("_", " "), fill=(0, 0, 0))
        x += 30 + 7 * len(name)


def blended(image: np.ndarray, mask: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """The classes' colours blended over a grayscale or RGB image of the mask's size, a legend below."""
    from PIL import Image, ImageDraw

    pixels = np.clip(image, 0, 1)
    rgb = (np.repeat(pixels, 3, axis=-1) if pixels.shape[-1] == 1 else pixels) * 255
    mixed = np.where((mask < len(PALETTE))[..., None], (1 - alpha) * rgb + alpha * colorize(mask), rgb)
    picture = Image.new("RGB", (max(mask.shape[1], 420), mask.shape[0] + 24), (255, 255, 255))
    picture.paste(Image.fromarray(mixed.astype(np.uint8)), (0, 0))
    _legend(ImageDraw.Draw(picture), 4, mask.shape[0] + 5)
    return np.asarray(picture)
