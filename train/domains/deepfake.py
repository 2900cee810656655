"""deepfake: real/fake detection of face crops, per frame and per video."""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx
from triskele.models.deepfake import FrameDetector, VideoDetector
from triskele.train.backbone import vit_config
from triskele.train.data.deepfake import FAMILIES, FaceFrames, SyntheticFaces
from triskele.train.data.pipeline import Source
from triskele.train.domains import Domain, register
from triskele.train.metrics import deepfake as deepfake_metrics


@dataclasses.dataclass
class DeepfakeOptions:
    frames_per_video: int = 32
    """Frames sampled uniformly from each video."""
    holdout: str | None = None
    """A manipulation family/method left out of training (cross-manipulation protocol)."""
    eval_methods: str | None = None
    """Comma-separated methods whose fakes evaluation uses (None: all)."""
    compression: str = "c23"
    """FaceForensics++ compression folder (raw, c23, c40)."""


def _methods(text: str | None) -> tuple[str, ...] | None:
    return tuple(m.strip() for m in text.split(",") if m.strip()) if text else None


def open_split(config, split: str) -> Source:
    options, frames = config.deepfake, config.model.frames
    holdout = (options.holdout,) if options.holdout and split == "train" else ()
    chosen = None if split == "train" else _methods(options.eval_methods)
    if config.data.path:
        files = FaceFrames(config.data.path, split, config.model.image_size, options.frames_per_video, frames,
                           methods=chosen, exclude=holdout, compression=options.compression)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    families = tuple(f for f in (chosen or FAMILIES) if f not in holdout)
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticFaces(split, size, config.model.image_size, options.frames_per_video, seed=config.run.seed,
                          families=families, clip_frames=frames)


def build_model(config, rngs: nnx.Rngs, stages: int) -> FrameDetector | VideoDetector:
    vit = vit_config(config, stages)
    if config.model.frames > 1:
        return VideoDetector(vit, config.model.frames, rngs=rngs)
    return FrameDetector(vit, rngs=rngs)


DEEPFAKE = register(Domain(
    name="deepfake", summary="real/fake detection of face crops, per frame and per video",
    options=DeepfakeOptions,
    preset={"model.channels": 3, "deepfake.frames_per_video": 8, "data.train_size": 6144, "data.eval_size": 1024,
            "run.steps": 1500, "run.eval_every": 750},
    build_model=build_model, open_split=open_split, class_names=lambda config: ["real", "fake"],
    metrics=deepfake_metrics.metrics, metric_names=deepfake_metrics.NAMES, evaluation="triskele.eval.deepfake",
))
