"""merch: visual merchandising: SKU recognition, open-set retrieval, planogram compliance."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from triskele.train.domains import Domain, Later, class_names, register

if TYPE_CHECKING:
    from flax import nnx
    from triskele.models.merch import SkuRecognizer
    from triskele.train.data.pipeline import Source


@dataclasses.dataclass
class MerchOptions:
    num_skus: int = 100
    """Synthetic data: SKUs in the training catalogue."""


def open_split(config, split: str) -> Source:
    import jax
    from triskele.train.domains.merch.data import ProductImages, SyntheticRetail

    if config.data.path:
        files = ProductImages(config.data.path, split, config.model.image_size, classes=class_names(config),
                              val_fraction=config.data.val_fraction, limits=config.limits)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticRetail(split, size, config.model.image_size, seed=config.run.seed,
                           train_skus=config.merch.num_skus)


def read_class_names(config) -> list[str]:
    """The training split's class folders on disk, or `sku<i>` and `empty` (synthetic)."""
    if config.data.path:
        from triskele.train.domains.merch.data import training_classes

        return training_classes(config.data.path)
    return [f"sku{i}" for i in range(config.merch.num_skus)] + ["empty"]


def build_model(config, rngs: nnx.Rngs, stages: int) -> SkuRecognizer:
    from triskele.models.merch import SkuRecognizer
    from triskele.train.backbone import vit_config

    return SkuRecognizer(vit_config(config, stages), len(class_names(config)), rngs=rngs)


MERCH = register(Domain(
    name="merch", summary="visual merchandising: SKU recognition, open-set retrieval, planogram compliance",
    options=MerchOptions,
    preset={"model.channels": 3, "data.train_size": 20000, "data.eval_size": 1200, "run.steps": 1200,
            "run.eval_every": 600},
    build_model=build_model, open_split=open_split, class_names=read_class_names,
    evaluator=Later("triskele.train.domains.merch.evaluator", "MerchEvaluator"),
    metric_names=Later("triskele.train.domains.merch.metrics", "NAMES"),
    inference="triskele.eval.domains.merch", eval_commands=("gallery",),
))
