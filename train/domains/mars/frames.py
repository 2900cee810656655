"""Whole frames through the model by sliding windows (mmsegmentation's `slide`): what mars'
evaluation, its report's pictures and its predictions share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from triskele.mesh.chunks import run_groups
from triskele.models.sliding import default_stride, extract_windows, resize_bilinear, stitch
from triskele.train.forward import ForwardRunner


def frame_logits(window_logits: np.ndarray, frame_shape: tuple[int, int], label_shape: tuple[int, int],
                 stride: int) -> np.ndarray:
    """A frame's windows' logits stitched (mean over overlaps), resized to the label's resolution."""
    return resize_bilinear(stitch(window_logits, *frame_shape, stride), *label_shape)


def runner_of(parts: Any, params: Any) -> ForwardRunner:
    """The run's model serving in batches of the run's global batch."""
    return ForwardRunner(parts.graphdef, params, parts.mesh, parts.config.data.global_batch)


def whole_frames(parts: Any, params: Any, records: Iterable[dict[str, np.ndarray]]
                 ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """(record, logits at its label's resolution) for whole frames, by sliding windows (stride 2/3
    of the window)."""
    window = parts.config.model.image_size
    stride = default_stride(window)
    runner = runner_of(parts, params)
    groups = ((record, extract_windows(record["image"], window, stride)) for record in records)
    for record, outputs in run_groups(runner.dispatch, runner.fetch, groups, runner.batch):
        yield record, frame_logits(outputs["logits"], record["image"].shape[:2], record["label"].shape, stride)
