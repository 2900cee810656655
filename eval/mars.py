"""Mars terrain evaluation artifacts (confusion plot, overlays) and predicted masks; the metrics
are `triskele.train.metrics.mars`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    y, x = panels[0].shape[0] + 8, 4
    for name, colour in zip((*CLASS_NAMES, "ignored"), (*PALETTE, (0, 0, 0)), strict=True):
        draw.rectangle([x, y, x + 14, y + 14], fill=tuple(int(c) for c in colour), outline=(0, 0, 0))
        draw.text((x + 20, y + 1), name.replace("_", " "), fill=(0, 0, 0))
        x += 30 + 7 * len(name)
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


def write_artifacts(parts, params, source, totals, out_dir: Path, examples: int = 4) -> list[str]:
    """The confusion-matrix plot and `examples` overlays (image | truth | prediction)."""
    from PIL import Image
    from triskele.eval.predict import LiveModel

    plot_confusion(totals["confusion"], out_dir / "confusion.png")
    written = ["confusion.png"]
    records = [source.load(i) for i in range(min(examples, len(source)))]
    if records:
        probabilities = LiveModel(parts, params)(np.stack([r["image"] for r in records]))["probabilities"]
        for i, (record, prediction) in enumerate(zip(records, probabilities.argmax(-1), strict=True)):
            name = f"overlay_{i}.png"
            Image.fromarray(overlay(record["image"], record["label"], prediction)).save(out_dir / name)
            written.append(name)
    return written


def predict_folder(model, input_dir: Path, output_dir: Path, workdir: Path | None = None) -> dict[str, Any]:
    """One class-index PNG mask (0 soil, 1 bedrock, 2 sand, 3 big rock) per input image, at the
    input's own resolution (centre-square predictions resized back by nearest neighbour).
    `model`: a LiveModel or an ExportedModel."""
    from PIL import Image
    from triskele.models.preprocess import square_crop_box
    from triskele.train.data.images import IMAGE_SUFFIXES, image_size, read_image

    paths = sorted(p for p in Path(input_dir).iterdir() if p.suffix in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"--input {input_dir} holds no .png or .jpg images")
    meta = model.meta
    images = np.stack([read_image(p, meta["image_size"], meta["channels"]) for p in paths])
    masks = model(images)["probabilities"].argmax(-1)
    output_dir.mkdir(parents=True, exist_ok=True)
    for path, mask in zip(paths, masks, strict=True):
        width, height = image_size(path)
        left, top, right, bottom = square_crop_box(width, height)
        full = np.full((height, width), 255, np.uint8)  # outside the centre square: not predicted
        square = Image.fromarray(mask.astype(np.uint8)).resize((right - left, bottom - top), Image.NEAREST)
        full[top:bottom, left:right] = np.asarray(square)
        Image.fromarray(full).save(output_dir / f"{path.stem}.png")
    return {"images": len(paths), "output": str(output_dir)}
