"""The ViT backbone's config for a run: the model keys, the precision and the pipeline layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triskele.models.vit import ViTConfig
from triskele.train.precision import compute_dtype

if TYPE_CHECKING:
    from triskele.train.config.schema import Config

DEFAULT_NORM_EPS = 1e-6


def vit_config(config: Config, pipeline_stages: int = 1) -> ViTConfig:
    """The backbone's config; `pipeline_stages` is the mesh's `pipeline` size."""
    m = config.model
    overrides = dict(
        patch=m.patch, image_size=m.image_size, channels=m.channels, pool=m.pool,
        remat=m.remat, attention=m.attention, dtype=compute_dtype(config.precision),
        fp8=config.precision == "fp8", quantization=m.quantization,
        norm_eps=m.norm_eps if m.norm_eps is not None else DEFAULT_NORM_EPS,
        pipeline_stages=pipeline_stages, pipeline_repeats=config.pipeline.repeats,
        pipeline_microbatches=config.pipeline.microbatches, pipeline_gather_once=config.pipeline.gather_once,
        pipeline_schedule=config.pipeline.schedule,
    )
    if m.depth is not None:
        overrides["depth"] = m.depth
    return ViTConfig.named(m.size, **overrides)
