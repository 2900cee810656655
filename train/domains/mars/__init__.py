"""mars: rover terrain segmentation (soil, bedrock, sand, big rock) of navigation-camera images."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from triskele.mesh.chunks import run_groups
from triskele.models.mars import CLASS_NAMES, DEFAULT_CLASS_WEIGHTS, IGNORE_LABEL, NUM_CLASSES, TerrainSegmenter
from triskele.models.sliding import default_stride, extract_windows, resize_bilinear, stitch
from triskele.train.backbone import vit_config
from triskele.train.data.pipeline import Source
from triskele.train.domains import Domain, register
from triskele.train.domains.mars import metrics as mars_metrics
from triskele.train.domains.mars.data import SyntheticTerrain, TerrainFiles
from triskele.train.serve import ServeRunner

AI4MARS_SCALE = 0.5
"""AI4Mars' 1024 x 1024 navcam frames are halved first: its labels are hand-drawn polygons far
coarser than a pixel, a halved frame keeps sand ripples and rock edges several pixels wide, and
it costs a quarter of the windows (9 per frame for a 224-pixel model instead of 36)."""
FRAME_FACTOR = 1.5
"""Synthetic frames are rendered this much larger than the model's input, so that training crops
are real parts of a scene and evaluation slides windows over whole frames."""


@dataclasses.dataclass
class MarsOptions:
    label_agreement: int = 3
    """AI4Mars test labels to read: masked-gold-min<k>-100agree, k in 1..3."""
    scale: float | None = None
    """The resize applied to every frame first (training, evaluation, prediction); None when a run
    starts: 0.5 for AI4Mars' 1024 x 1024 frames (AI4MARS_SCALE), 1 for other data."""
    frame_size: int | None = None
    """Synthetic frames' size; None when a run starts: 1.5 x model.image_size."""


def resolve(config) -> None:
    options = config.mars
    if options.scale is None:
        options.scale = AI4MARS_SCALE if config.data.path and (Path(config.data.path) / "msl").is_dir() else 1.0
    if options.frame_size is None:
        options.frame_size = round(config.model.image_size * FRAME_FACTOR)
    if options.scale <= 0:
        raise ValueError(f"mars.scale={options.scale} must be positive, e.g. 0.5 or 1")
    if options.frame_size < 1:
        raise ValueError(f"mars.frame_size={options.frame_size} must be at least 1")


def open_split(config, split: str) -> Source:
    crops = split == "train"
    if config.data.path:
        files = TerrainFiles(config.data.path, split, config.model.image_size, config.model.channels,
                             agreement=config.mars.label_agreement, scale=config.mars.scale, crops=crops)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticTerrain(split, size, config.model.image_size, seed=config.run.seed,
                            frame_size=config.mars.frame_size, crops=crops)


def build_model(config, rngs: nnx.Rngs, stages: int) -> TerrainSegmenter:
    return TerrainSegmenter(vit_config(config, stages), rngs=rngs)


def frame_logits(window_logits: np.ndarray, frame_shape: tuple[int, int], label_shape: tuple[int, int],
                 stride: int) -> np.ndarray:
    """A frame's windows' logits stitched (mean over overlaps), resized to the label's resolution."""
    return resize_bilinear(stitch(window_logits, *frame_shape, stride), *label_shape)


def whole_frames(parts: Any, params: Any, records: Iterable[dict[str, np.ndarray]]
                 ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """(record, logits at its label's resolution) for whole frames, by sliding windows (stride 2/3
    of the window) through the model in batches of the run's global batch."""
    window = parts.config.model.image_size
    stride = default_stride(window)
    runner = ServeRunner(parts.graphdef, params, parts.mesh, parts.config.data.global_batch)
    groups = ((record, extract_windows(record["image"], window, stride)) for record in records)
    for record, outputs in run_groups(runner.dispatch, runner.fetch, groups, runner.batch):
        yield record, frame_logits(outputs["logits"], record["image"].shape[:2], record["label"].shape, stride)


def evaluate_frames(parts: Any, params: Any, source: Source) -> dict[str, Any]:
    """Every labelled pixel of every whole frame scored at the label's native resolution: the
    confusion matrix and the class-weighted cross-entropy."""
    skip = getattr(source, "bad", {})

    def records():
        for index in range(len(source)):
            record = source.load(index)  # a bad record is noted in `skip` as it loads
            if index not in skip:
                yield record

    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.float64)
    loss_sum = weight_sum = 0.0
    weights = np.asarray(DEFAULT_CLASS_WEIGHTS, np.float64)
    for record, logits in whole_frames(parts, params, records()):
        label = record["label"]
        labelled = label != IGNORE_LABEL
        truth = label[labelled].astype(np.int64)
        logits = logits[labelled].astype(np.float64)
        np.add.at(confusion, (truth, logits.argmax(-1)), 1)
        shifted = logits - logits.max(-1, keepdims=True)
        nll = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(truth)), truth]
        loss_sum += float((nll * weights[truth]).sum())
        weight_sum += float(weights[truth].sum())
    return {"confusion": confusion, "loss_sum": np.float64(loss_sum), "weight": np.float64(weight_sum),
            "unreadable": len(skip)}


MARS = register(Domain(
    name="mars", summary="rover terrain segmentation: soil, bedrock, sand, big rock",
    options=MarsOptions, preset={"model.channels": 1, "checkpoint.best_metric": "eval_loss"},
    build_model=build_model, open_split=open_split, class_names=lambda config: list(CLASS_NAMES),
    metrics=mars_metrics.metrics, metric_names=mars_metrics.NAMES, evaluation="triskele.eval.domains.mars",
    resolve=resolve, evaluate=evaluate_frames,
))
