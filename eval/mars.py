"""Mars terrain metrics, plots and predicted masks.

Metrics come from the confusion matrix accumulated over the whole split (label 255 ignored):
pixel accuracy, per-class IoU, mIoU and per-class recall (sand recall is the safety number).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.data.mars import CLASS_NAMES

# Display colours: soil, bedrock, sand, big rock; ignored pixels black.
PALETTE = np.array([[170, 120, 80], [120, 120, 130], [235, 200, 110], [200, 40, 40]], np.uint8)


def confusion_metrics(confusion: np.ndarray) -> dict[str, Any]:
    """Rows are the truth, columns the prediction. A class absent from both has no IoU (NaN is left
    out of the mean), as in the usual mIoU."""
    confusion = np.asarray(confusion, np.float64)
    true_positive = np.diag(confusion)
    truth = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    union = truth + predicted - true_positive
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, true_positive / union, np.nan)
        recall = np.where(truth > 0, true_positive / truth, np.nan)
    total = confusion.sum()
    return {
        "pixel_acc": float(true_positive.sum() / total) if total else float("nan"),
        "miou": float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan"),
        "iou": {name: float(v) for name, v in zip(CLASS_NAMES, iou, strict=True)},
        "recall": {name: float(v) for name, v in zip(CLASS_NAMES, recall, strict=True)},
    }


def metrics(totals: dict[str, np.ndarray]) -> dict[str, Any]:
    return confusion_metrics(totals["confusion"])


def colorize(label: np.ndarray) -> np.ndarray:
    """Class-index mask (H, W) -> RGB (255 and out-of-range black)."""
    out = np.zeros(label.shape + (3,), np.uint8)
    known = label < len(PALETTE)
    out[known] = PALETTE[label[known]]
    return out


def overlay(image: np.ndarray, truth: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """Image, truth and prediction side by side, as one RGB array."""
    gray = np.clip(image[..., 0] if image.ndim == 3 else image, 0, 1)
    rgb = np.repeat((gray * 255).astype(np.uint8)[..., None], 3, axis=-1)
    return np.concatenate([rgb, colorize(truth), colorize(prediction)], axis=1)


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
    from triskele.eval.predict import predict_arrays

    plot_confusion(totals["confusion"], out_dir / "confusion.png")
    written = ["confusion.png"]
    records = [source.load(i) for i in range(min(examples, len(source)))]
    if records:
        predictions = predict_arrays(parts, params, np.stack([r["image"] for r in records]))
        for i, (record, prediction) in enumerate(zip(records, predictions, strict=True)):
            name = f"overlay_{i}.png"
            Image.fromarray(overlay(record["image"], record["label"], prediction)).save(out_dir / name)
            written.append(name)
    return written


def predict_folder(parts, params, input_dir: Path, output_dir: Path) -> dict[str, Any]:
    """One class-index PNG mask (0 soil, 1 bedrock, 2 sand, 3 big rock) per input image, at the
    input's own resolution (centre-square predictions resized back by nearest neighbour)."""
    from PIL import Image
    from triskele.eval.predict import predict_arrays
    from triskele.train.data.images import IMAGE_SUFFIXES, image_size, read_image, square_crop_box

    paths = sorted(p for p in Path(input_dir).iterdir() if p.suffix in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f"--input {input_dir} holds no .png or .jpg images")
    cfg = parts.config.model
    images = np.stack([read_image(p, cfg.image_size, cfg.channels) for p in paths])
    masks = predict_arrays(parts, params, images)
    output_dir.mkdir(parents=True, exist_ok=True)
    for path, mask in zip(paths, masks, strict=True):
        width, height = image_size(path)
        left, top, right, bottom = square_crop_box(width, height)
        full = np.full((height, width), 255, np.uint8)  # outside the centre square: not predicted
        square = Image.fromarray(mask.astype(np.uint8)).resize((right - left, bottom - top), Image.NEAREST)
        full[top:bottom, left:right] = np.asarray(square)
        Image.fromarray(full).save(output_dir / f"{path.stem}.png")
    return {"images": len(paths), "output": str(output_dir)}
