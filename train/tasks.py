"""The domains the engine trains: for each, how to build its model and open its data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
from flax import nnx
from triskele.models.deepfake import FrameDetector, VideoDetector
from triskele.models.mars import TerrainSegmenter
from triskele.models.merch import SkuRecognizer
from triskele.models.vit import ViTConfig
from triskele.train.config import Config
from triskele.train.data.deepfake import FAMILIES, FaceFrames, SyntheticFaces
from triskele.train.data.mars import SyntheticTerrain, TerrainFiles
from triskele.train.data.merch import ProductImages, SyntheticRetail
from triskele.train.data.pipeline import Source

DEFAULT_NORM_EPS = 1e-6


def compute_dtype(precision: str) -> str:
    """The activations' dtype: `auto` is bfloat16 on accelerators and float32 on CPU; `fp8` computes
    in bfloat16 around its FP8 matmuls."""
    if precision == "auto":
        return "float32" if jax.default_backend() == "cpu" else "bfloat16"
    return "bfloat16" if precision == "fp8" else precision


def matmul_dtype(precision: str) -> str:
    """What the blocks' matmuls run in (the peak FLOP/s that MFU divides by): fp8 or the compute dtype."""
    return "fp8" if precision == "fp8" else compute_dtype(precision)


def fp8_note(precision: str) -> str | None:
    """A one-line note when FP8 matmuls run on a device without FP8 tensor cores (emulated, slow)."""
    if precision != "fp8":
        return None
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if device.platform == "gpu" and capability is not None and float(capability) >= 8.9:
        return None
    return (f"note: precision=fp8 on {device.device_kind} ({device.platform}), which has no FP8 tensor cores: "
            "the FP8 matmuls are emulated (slow); they are fast on Hopper/Blackwell GPUs")


def vit_config(config: Config, pipeline_stages: int = 1) -> ViTConfig:
    """The backbone's config; `pipeline_stages` is the mesh's `pipeline` size."""
    m = config.model
    overrides = dict(
        patch=m.patch, image_size=m.image_size, channels=m.channels, pool=m.pool,
        remat=m.remat, attention=m.attention, dtype=compute_dtype(config.precision),
        fp8=config.precision == "fp8", quantization=m.quantization,
        norm_eps=m.norm_eps if m.norm_eps is not None else DEFAULT_NORM_EPS,
        pipeline_stages=pipeline_stages, pipeline_repeats=config.pipeline.repeats,
        pipeline_microbatches=config.pipeline.microbatches,
    )
    if m.depth is not None:
        overrides["depth"] = m.depth
    return ViTConfig.named(m.size, **overrides)


@dataclasses.dataclass(frozen=True)
class Task:
    build_model: Callable[[Config, nnx.Rngs, int], nnx.Module]
    """(config, rngs, pipeline stages) -> model."""
    open_split: Callable[[Config, str], Source]


def _mars_split(config: Config, split: str) -> Source:
    if config.data.path:
        files = TerrainFiles(config.data.path, split, config.model.image_size, config.model.channels,
                             agreement=config.data.label_agreement)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticTerrain(split, size, config.model.image_size, seed=config.run.seed)


def _methods(text: str | None) -> tuple[str, ...] | None:
    return tuple(m.strip() for m in text.split(",") if m.strip()) if text else None


def _deepfake_split(config: Config, split: str) -> Source:
    data, frames = config.data, config.model.frames
    holdout = (data.holdout,) if data.holdout else ()
    chosen = None if split == "train" else _methods(data.eval_methods)
    if data.path:
        files = FaceFrames(data.path, split, config.model.image_size, data.frames_per_video, frames,
                           methods=chosen, exclude=holdout if split == "train" else (),
                           compression=data.compression)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    families = tuple(f for f in (chosen or FAMILIES) if f not in (holdout if split == "train" else ()))
    size = data.train_size if split == "train" else data.eval_size
    return SyntheticFaces(split, size, config.model.image_size, data.frames_per_video, seed=config.run.seed,
                          families=families, clip_frames=frames)


def _deepfake_model(config: Config, rngs: nnx.Rngs, stages: int) -> nnx.Module:
    vit = vit_config(config, stages)
    if config.model.frames > 1:
        return VideoDetector(vit, config.model.frames, rngs=rngs)
    return FrameDetector(vit, rngs=rngs)


def _merch_split(config: Config, split: str) -> Source:
    data = config.data
    if data.path:
        files = ProductImages(data.path, split, config.model.image_size)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = data.train_size if split == "train" else data.eval_size
    return SyntheticRetail(split, size, config.model.image_size, seed=config.run.seed, train_skus=data.num_skus)


def _merch_model(config: Config, rngs: nnx.Rngs, stages: int) -> nnx.Module:
    classes = (ProductImages(config.data.path, "train", config.model.image_size).num_classes
               if config.data.path else config.data.num_skus + 1)
    return SkuRecognizer(vit_config(config, stages), classes, rngs=rngs)


TASKS: dict[str, Task] = {
    "merch": Task(build_model=_merch_model, open_split=_merch_split),
    "deepfake": Task(build_model=_deepfake_model, open_split=_deepfake_split),
    "mars": Task(
        build_model=lambda config, rngs, stages: TerrainSegmenter(vit_config(config, stages), rngs=rngs),
        open_split=_mars_split,
    ),
}


def get_task(domain: str) -> Task:
    if domain not in TASKS:
        raise ValueError(
            f"domain {domain!r} cannot be trained yet; domains with a model and data: {', '.join(TASKS)}"
        )
    return TASKS[domain]
