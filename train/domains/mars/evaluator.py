"""Mars' evaluator: every labelled pixel of every whole frame scored at the label's native
resolution (sliding windows, logits averaged where they overlap, bilinear to the label's size):
the confusion matrix and the class-weighted cross-entropy; the confusion plot and overlays.

For a report it also scores, in the same pass, the figure as it was measured before native
resolution (each frame's centre square squeezed to the model's input): one more window per frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grain
import numpy as np
from PIL import Image
from triskele.mesh.chunks import run_groups
from triskele.models.mars import DEFAULT_CLASS_WEIGHTS, IGNORE_LABEL, NUM_CLASSES
from triskele.models.preprocess import square_crop_box
from triskele.models.sliding import default_stride, extract_windows, resize_bilinear
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.data.pipeline import Source, prefetched
from triskele.train.domains.mars.frames import frame_logits, runner_of, whole_frames
from triskele.train.domains.mars.metrics import confusion_metrics
from triskele.train.domains.mars.pictures import overlay, plot_confusion, png_bytes

EXAMPLES = 4
"""Overlays (image | truth | prediction) a report draws, of the split's first frames."""


def squeezed(record: dict[str, np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(label, image) of the frame's centre square resized to the model's input (nearest, bilinear)."""
    image, label = record["image"], record["label"]
    left, top, right, bottom = square_crop_box(image.shape[1], image.shape[0])
    label = Image.fromarray(label.astype(np.uint8)).crop(square_crop_box(*label.shape[::-1]))
    return np.asarray(label.resize((size, size), Image.NEAREST)), resize_bilinear(image[top:bottom, left:right],
                                                                                 size, size)


def _add_confusion(confusion: np.ndarray, label: np.ndarray, prediction: np.ndarray) -> np.ndarray:
    """The labelled pixels' (truth, prediction) added to `confusion`; the labelled mask."""
    labelled = label != IGNORE_LABEL
    np.add.at(confusion, (label[labelled].astype(np.int64), prediction[labelled]), 1)
    return labelled


class MarsEvaluator:
    def __init__(self, parts: Any, for_report: bool = False):
        self.parts, self.compare_square = parts, for_report
        self.window = parts.config.model.image_size
        self.stride = default_stride(self.window)

    def _group(self, source: Source, index: int) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """(record, its windows) of frame `index`; None for an unreadable one (noted in `source.bad`)."""
        record = source.load(index)
        if index in getattr(source, "bad", {}):
            return None
        windows = extract_windows(record["image"], self.window, self.stride)
        if self.compare_square:
            label, image = squeezed(record, self.window)
            windows = np.concatenate([windows, image[None]])
            record = {**record, "square_label": label}
        return record, windows

    def _groups(self, source: Source):
        """Every readable frame's windows, decoded ahead in the run's loader threads (`data.threads`,
        `data.prefetch`), in order."""
        data = self.parts.config.data
        dataset = grain.MapDataset.range(len(source)).map(lambda index: self._group(source, index))
        return (group for group in prefetched(dataset, data.threads, data.prefetch, 0) if group is not None)

    def accumulate(self, params: Any, source: Source, stop: StopRequest | None = None) -> dict[str, Any]:
        confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.float64)
        square = np.zeros_like(confusion)
        loss_sum = weight_sum = 0.0
        weights = np.asarray(DEFAULT_CLASS_WEIGHTS, np.float64)
        runner = runner_of(self.parts, params)
        for record, outputs in run_groups(runner.dispatch, runner.fetch, self._groups(source), runner.batch):
            if stop is not None:
                stop.raise_if_requested()
            window_logits = outputs["logits"]
            if self.compare_square:
                square_logits, window_logits = window_logits[-1], window_logits[:-1]
                _add_confusion(square, record["square_label"], square_logits.argmax(-1))
            label = record["label"]
            logits = frame_logits(window_logits, record["image"].shape[:2], label.shape, self.stride)
            labelled = _add_confusion(confusion, label, logits.argmax(-1))
            truth = label[labelled].astype(np.int64)
            logits = logits[labelled].astype(np.float64)
            shifted = logits - logits.max(-1, keepdims=True)
            nll = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(truth)), truth]
            loss_sum += float((nll * weights[truth]).sum())
            weight_sum += float(weights[truth].sum())
        totals = {"confusion": confusion, "loss_sum": np.float64(loss_sum), "weight": np.float64(weight_sum),
                  "unreadable": len(getattr(source, "bad", {}))}
        return {**totals, "square_confusion": square} if self.compare_square else totals

    def metrics(self, totals: dict[str, Any]) -> dict[str, Any]:
        return confusion_metrics(totals["confusion"])

    def report(self, totals: dict[str, Any]) -> dict[str, Any]:
        """How the figures were made; with the square comparison, the same checkpoint's figure the
        way it was measured before (the centre square of each frame squeezed to the model's input)."""
        how = {"inference": {"mode": "slide", "window": self.window, "stride": self.stride, "resolution": "native",
                             "scale": self.parts.config.options.scale}}
        if "square_confusion" not in totals:
            return how
        square = confusion_metrics(totals["square_confusion"])
        return {**how, "square_resize": {"miou": square["miou"], "pixel_acc": square["pixel_acc"],
                                         "how": "centre square of each frame resized to the model input, scored "
                                                "there"}}

    def write_artifacts(self, params: Any, source: Source, totals: dict[str, Any], out_dir: Path) -> list[str]:
        """The confusion-matrix plot and overlays (image | truth | prediction) of the first whole frames."""
        plot_confusion(totals["confusion"], out_dir / "confusion.png")
        written = ["confusion.png"]
        records = (source.load(i) for i in range(min(EXAMPLES, len(source))))
        for i, (record, logits) in enumerate(whole_frames(self.parts, params, records)):
            name = f"overlay_{i}.png"
            image = resize_bilinear(record["image"], *record["label"].shape)  # a scaled frame at its label's size
            write_atomically(out_dir / name, png_bytes(overlay(image, record["label"], logits.argmax(-1))))
            written.append(name)
        return written
