"""Mars predictions: one class-index palette PNG per image at its exact size (and an overlay on
request); the evaluation (metrics, confusion plot, overlays) is
`triskele.train.domains.mars.evaluator`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from triskele.models.mars import CLASS_NAMES
from triskele.models.sliding import resize_bilinear
from triskele.train.config.schema import InputLimits
from triskele.train.domains.mars.pictures import blended, mask_png, png_bytes

COMMANDS: dict = {}
"""Mars has no eval commands of its own."""


class MarsIO:
    """One class-index PNG per image at its exact size (a palette PNG: the class indices, shown in
    the classes' colours), every pixel predicted: the frame scaled by the run's `mars.scale`,
    windows of the model's input at `stride`, their logits averaged where they overlap and resized
    back to the image (bilinear), then argmax; `tta` 'flip' averages the probabilities of the
    mirrored pass; `overlay` also writes NAME.overlay.png (enlarged, as evaluation's). NAME: the input's
    path under the inputs' root, its suffix replaced (kept where two inputs share a stem:
    `triskele.eval.inputs`). An image over `limits.image_pixels` is refused from its header."""

    def __init__(self, meta: dict[str, Any], stride: int | None = None, tta: str | None = None,
                 overlay: bool = False, limits: InputLimits | None = None):
        from triskele.models.sliding import default_stride
        from triskele.train.data.images import IMAGE_SUFFIXES

        if tta not in (None, "flip"):
            raise ValueError(f"--tta {tta!r}: the test-time augmentation mars knows is 'flip'")
        self.window, self.channels = meta["image_size"], meta["channels"]
        self.scale = meta["options"]["scale"] or 1.0
        self.stride = stride or default_stride(self.window)
        if not 0 < self.stride <= self.window:
            raise ValueError(f"--stride {self.stride} must be between 1 and the window ({self.window})")
        self.flip, self.overlay, self.limits = tta == "flip", overlay, limits
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        from triskele.eval.engine import JOB_FILES, file_units
        from triskele.eval.inputs import refuse_clashes

        units = file_units(root, files)
        refuse_clashes({u.key: self._names(u) for u in units}, JOB_FILES)
        return units

    def _names(self, unit) -> list[str]:
        """The mask's name, and the overlay's when asked for."""
        return [unit.named(".png")] + ([unit.named(".overlay.png")] if self.overlay else [])

    def _frame(self, path: Path) -> np.ndarray:
        from triskele.models.preprocess import to_frame
        from triskele.train.data.images import open_image

        return to_frame(open_image(path, self.limits), self.scale, self.channels)

    def read(self, unit) -> tuple[np.ndarray, Any]:
        from triskele.models.sliding import extract_windows
        from triskele.train.data.images import image_size

        width, height = image_size(unit.paths[0], self.limits)
        frame = self._frame(unit.paths[0])
        windows = extract_windows(frame, self.window, self.stride)
        if self.flip:
            windows = np.concatenate([windows, windows[:, :, ::-1]])
        return windows, (frame.shape[:2], (height, width))

    def probabilities(self, logits: np.ndarray, frame_shape, native_shape) -> np.ndarray:
        from triskele.models.sliding import softmax
        from triskele.train.domains.mars.frames import frame_logits

        if not self.flip:
            return frame_logits(logits, frame_shape, native_shape, self.stride)
        plain, mirrored = np.split(logits, 2)
        return (softmax(frame_logits(plain, frame_shape, native_shape, self.stride))
                + softmax(frame_logits(mirrored[:, :, ::-1], frame_shape, native_shape, self.stride))) / 2

    def mask(self, context, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """The class index of every pixel of the image at its own size (uint8, height x width)."""
        frame_shape, native_shape = context
        return self.probabilities(outputs["logits"], frame_shape, native_shape).argmax(-1).astype(np.uint8)

    serving_outputs = {"mask": ("UINT8", [-1, -1])}
    """What the server answers for one image (`respond`): name -> (datatype, shape; -1 varies)."""

    def respond(self, context, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"mask": self.mask(context, outputs)}

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        from triskele.train.bookkeeping.files import write_atomically

        native_shape = context[1]
        mask = self.mask(context, outputs)
        name = unit.named(".png")
        write_atomically(out_dir / name, mask_png(mask))
        row = {"input": unit.key, "mask": name, "height": native_shape[0], "width": native_shape[1],
               "class_pixels": np.bincount(mask.ravel(), minlength=len(CLASS_NAMES)).tolist()}
        if self.overlay:
            image = resize_bilinear(self._frame(unit.paths[0]), *native_shape)
            row["overlay"] = unit.named(".overlay.png")
            write_atomically(out_dir / row["overlay"], png_bytes(blended(image, mask)))
        return row

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        return []


def predict_io(meta: dict[str, Any], options: dict[str, Any], workdir: Path | None = None) -> MarsIO:
    """`options`: the mars predict flags given (`stride`, `tta`, `overlay`); `meta['limits']`: the input
    limits (default `InputLimits()`)."""
    return MarsIO(meta, **options, limits=meta.get("limits"))
