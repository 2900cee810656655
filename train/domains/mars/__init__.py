"""mars: rover terrain segmentation (soil, bedrock, sand, big rock) of navigation-camera images."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from triskele.train.commands import Flag, bounded
from triskele.train.data.splits import check_split
from triskele.train.domains.spec import Domain, Later

if TYPE_CHECKING:
    from flax import nnx
    from triskele.models.mars import TerrainSegmenter
    from triskele.train.data.pipeline import Source

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


PACK_KEYS = ("model.channels", "mars.scale", "mars.label_agreement", "data.val_fraction")
"""What shapes a mars record before augmentation (the crop to model.image_size comes after)."""


def resolve(config) -> None:
    from triskele.train.data.packed import is_packed, packed_value

    options = config.options
    if options.scale is None and is_packed(config.data.path):
        options.scale = packed_value(config.data.path, "mars.scale")
    if options.scale is None:
        options.scale = AI4MARS_SCALE if config.data.path and (Path(config.data.path) / "msl").is_dir() else 1.0
    if options.frame_size is None:
        options.frame_size = round(config.model.image_size * FRAME_FACTOR)
    if options.scale <= 0:
        raise ValueError(f"mars.scale={options.scale} must be positive, e.g. 0.5 or 1")
    if options.frame_size < 1:
        raise ValueError(f"mars.frame_size={options.frame_size} must be at least 1")


def open_split(config, split: str) -> Source:
    import jax
    from triskele.train.data.packed import is_packed
    from triskele.train.domains.mars.data import SyntheticTerrain, TerrainFiles

    crops = check_split(split) == "train"
    if is_packed(config.data.path):
        from triskele.train.data.packed import open_packed
        from triskele.train.domains.mars.data import PackedTerrain

        packed = PackedTerrain(open_packed(config, split, PACK_KEYS), config.model.image_size, crops)
        if jax.process_index() == 0:
            print(packed.report(), flush=True)
        return packed
    if config.data.path:
        files = TerrainFiles(config.data.path, split, config.model.image_size, config.model.channels,
                             agreement=config.options.label_agreement, scale=config.options.scale, crops=crops,
                             val_fraction=config.data.val_fraction, limits=config.limits)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticTerrain(split, size, config.model.image_size, seed=config.run.seed,
                            frame_size=config.options.frame_size, crops=crops)


def build_model(config, rngs: nnx.Rngs, stages: int) -> TerrainSegmenter:
    from triskele.models.mars import TerrainSegmenter
    from triskele.train.backbone import vit_config

    return TerrainSegmenter(vit_config(config, stages), rngs=rngs)


def class_names(config) -> list[str]:
    from triskele.models.mars import CLASS_NAMES

    return list(CLASS_NAMES)


SPEC = Domain(
    name="mars", summary="rover terrain segmentation: soil, bedrock, sand, big rock",
    options=MarsOptions, preset={"model.channels": 1, "checkpoint.best_metric": "eval_loss"},
    build_model=build_model, open_split=open_split, class_names=class_names,
    evaluator=Later("triskele.train.domains.mars.evaluator", "MarsEvaluator"),
    metric_names=Later("triskele.train.domains.mars.metrics", "NAMES"), inference="triskele.eval.domains.mars",
    resolve=resolve,
    resume_options=("label_agreement",), pack_keys=PACK_KEYS, pack_codecs={"image": "raw", "label": "zlib"},
    predict_flags=(
        Flag("--stride", "sliding-window stride in pixels (default 2/3 window)", type=bounded(int, 1)),
        Flag("--tta", "average with the mirrored pass", choices=("flip",)),
        Flag("--overlay", "also write NAME.overlay.png", switch=True),
    ),
)
