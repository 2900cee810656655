"""mars: rover terrain segmentation (soil, bedrock, sand, big rock) of navigation-camera images."""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx
from triskele.models.mars import CLASS_NAMES, TerrainSegmenter
from triskele.train.backbone import vit_config
from triskele.train.data.mars import SyntheticTerrain, TerrainFiles
from triskele.train.data.pipeline import Source
from triskele.train.domains import Domain, register
from triskele.train.metrics import mars as mars_metrics


@dataclasses.dataclass
class MarsOptions:
    label_agreement: int = 3
    """AI4Mars test labels to read: masked-gold-min<k>-100agree, k in 1..3."""


def open_split(config, split: str) -> Source:
    if config.data.path:
        files = TerrainFiles(config.data.path, split, config.model.image_size, config.model.channels,
                             agreement=config.mars.label_agreement)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticTerrain(split, size, config.model.image_size, seed=config.run.seed)


def build_model(config, rngs: nnx.Rngs, stages: int) -> TerrainSegmenter:
    return TerrainSegmenter(vit_config(config, stages), rngs=rngs)


MARS = register(Domain(
    name="mars", summary="rover terrain segmentation: soil, bedrock, sand, big rock",
    options=MarsOptions, preset={"model.channels": 1, "checkpoint.best_metric": "eval_loss"},
    build_model=build_model, open_split=open_split, class_names=lambda config: list(CLASS_NAMES),
    metrics=mars_metrics.metrics, metric_names=mars_metrics.NAMES, evaluation="triskele.eval.mars",
))
