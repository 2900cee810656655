"""Mars terrain evaluation artifacts (confusion plot, overlays) and predicted masks; the metrics
are `triskele.train.domains.mars.metrics`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from triskele.models.mars import CLASS_NAMES
from triskele.models.sliding import resize_bilinear

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


def write_artifacts(parts, params, source, totals, out_dir: Path, examples: int = 4) -> list[str]:
    """The confusion-matrix plot and `examples` overlays (image | truth | prediction) of whole frames."""
    from PIL import Image
    from triskele.train.domains.mars import whole_frames

    plot_confusion(totals["confusion"], out_dir / "confusion.png")
    written = ["confusion.png"]
    records = (source.load(i) for i in range(min(examples, len(source))))
    for i, (record, logits) in enumerate(whole_frames(parts, params, records)):
        name = f"overlay_{i}.png"
        image = resize_bilinear(record["image"], *record["label"].shape)  # a scaled frame at its label's size
        Image.fromarray(overlay(image, record["label"], logits.argmax(-1))).save(out_dir / name)
        written.append(name)
    return written


def report_fields(parts, params, source) -> dict[str, Any]:
    """How the figures were made, and the same checkpoint's figure the way it was measured before
    (the centre square of each frame squeezed to the model's input and scored there)."""
    from PIL import Image
    from triskele.mesh.chunks import run_groups
    from triskele.models.preprocess import square_crop_box
    from triskele.models.sliding import default_stride
    from triskele.train.domains.mars.metrics import confusion_metrics
    from triskele.train.serve import ServeRunner

    size = parts.config.model.image_size
    runner = ServeRunner(parts.graphdef, params, parts.mesh, parts.config.data.global_batch)

    def squeezed():
        for index in range(len(source)):
            record = source.load(index)
            image, label = record["image"], record["label"]
            left, top, right, bottom = square_crop_box(image.shape[1], image.shape[0])
            label = Image.fromarray(label.astype(np.uint8)).crop(square_crop_box(*label.shape[::-1]))
            yield (np.asarray(label.resize((size, size), Image.NEAREST)),
                   resize_bilinear(image[top:bottom, left:right], size, size)[None])

    confusion = np.zeros((len(CLASS_NAMES), len(CLASS_NAMES)))
    for label, outputs in run_groups(runner.dispatch, runner.fetch, squeezed(), runner.batch):
        known = label != 255
        np.add.at(confusion, (label[known].astype(int), outputs["logits"][0].argmax(-1)[known]), 1)
    square = confusion_metrics(confusion)
    return {"inference": {"mode": "slide", "window": size, "stride": default_stride(size), "resolution": "native",
                          "scale": parts.config.mars.scale},
            "square_resize": {"miou": square["miou"], "pixel_acc": square["pixel_acc"],
                              "how": "centre square of each frame resized to the model input, scored there"}}


class MarsIO:
    """One class-index PNG per image at its exact size, every pixel predicted: the frame scaled by
    the run's `mars.scale`, windows of the model's input at `stride`, their logits averaged where
    they overlap and resized back to the image (bilinear), then argmax; `tta` 'flip' averages the
    probabilities of the mirrored pass; `overlay` also writes NAME.overlay.png."""

    def __init__(self, meta: dict[str, Any], stride: int | None = None, tta: str | None = None,
                 overlay: bool = False):
        from triskele.models.sliding import default_stride
        from triskele.train.data.images import IMAGE_SUFFIXES

        if tta not in (None, "flip"):
            raise ValueError(f"--tta {tta!r}: the test-time augmentation mars knows is 'flip'")
        self.window, self.channels = meta["image_size"], meta["channels"]
        self.scale = meta["options"]["scale"] or 1.0
        self.stride = stride or default_stride(self.window)
        if not 0 < self.stride <= self.window:
            raise ValueError(f"--stride {self.stride} must be between 1 and the window ({self.window})")
        self.flip, self.overlay = tta == "flip", overlay
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        from triskele.eval.engine import Unit
        from triskele.eval.inputs import relative_name

        return [Unit(relative_name(f, root), (f,)) for f in files]

    def _frame(self, path: Path) -> np.ndarray:
        from triskele.models.preprocess import to_frame
        from triskele.train.data.images import open_image

        return to_frame(open_image(path), self.scale, self.channels)

    def read(self, unit) -> tuple[np.ndarray, Any]:
        from triskele.models.sliding import extract_windows
        from triskele.train.data.images import image_size

        width, height = image_size(unit.paths[0])
        frame = self._frame(unit.paths[0])
        windows = extract_windows(frame, self.window, self.stride)
        if self.flip:
            windows = np.concatenate([windows, windows[:, :, ::-1]])
        return windows, (frame.shape[:2], (height, width))

    def probabilities(self, logits: np.ndarray, frame_shape, native_shape) -> np.ndarray:
        from triskele.models.sliding import softmax
        from triskele.train.domains.mars import frame_logits

        if not self.flip:
            return frame_logits(logits, frame_shape, native_shape, self.stride)
        plain, mirrored = np.split(logits, 2)
        return (softmax(frame_logits(plain, frame_shape, native_shape, self.stride))
                + softmax(frame_logits(mirrored[:, :, ::-1], frame_shape, native_shape, self.stride))) / 2

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        import io

        from PIL import Image
        from triskele.train.bookkeeping.files import write_atomically

        frame_shape, native_shape = context
        mask = self.probabilities(outputs["logits"], frame_shape, native_shape).argmax(-1).astype(np.uint8)
        name = str(Path(unit.key).with_suffix(".png"))
        buffer = io.BytesIO()
        Image.fromarray(mask).save(buffer, format="PNG")
        write_atomically(out_dir / name, buffer.getvalue())
        row = {"input": unit.key, "mask": name, "height": native_shape[0], "width": native_shape[1],
               "class_pixels": np.bincount(mask.ravel(), minlength=len(CLASS_NAMES)).tolist()}
        if self.overlay:
            buffer = io.BytesIO()
            image = resize_bilinear(self._frame(unit.paths[0]), *native_shape)
            Image.fromarray(blended(image, mask)).save(buffer, format="PNG")
            row["overlay"] = str(Path(unit.key).with_suffix(".overlay.png"))
            write_atomically(out_dir / row["overlay"], buffer.getvalue())
        return row

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        return []


def predict_io(meta: dict[str, Any], options) -> MarsIO:
    return MarsIO(meta, stride=options.stride, tta=options.tta, overlay=options.overlay)
