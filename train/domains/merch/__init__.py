"""merch: visual merchandising: SKU recognition, open-set retrieval, planogram compliance."""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx
from triskele.models.merch import SkuRecognizer
from triskele.train.backbone import vit_config
from triskele.train.data.pipeline import Source
from triskele.train.domains import Domain, class_names, register
from triskele.train.domains.merch.data import ProductImages, SyntheticRetail, training_classes
from triskele.train.domains.merch.metrics import NAMES, metrics
from triskele.train.evaluation import BatchEvaluator


@dataclasses.dataclass
class MerchOptions:
    num_skus: int = 100
    """Synthetic data: SKUs in the training catalogue."""


def open_split(config, split: str) -> Source:
    if config.data.path:
        files = ProductImages(config.data.path, split, config.model.image_size, classes=class_names(config),
                              val_fraction=config.data.val_fraction)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticRetail(split, size, config.model.image_size, seed=config.run.seed,
                           train_skus=config.merch.num_skus)


def read_class_names(config) -> list[str]:
    """The training split's class folders on disk, or `sku<i>` and `empty` (synthetic)."""
    if config.data.path:
        return training_classes(config.data.path)
    return [f"sku{i}" for i in range(config.merch.num_skus)] + ["empty"]


def build_model(config, rngs: nnx.Rngs, stages: int) -> SkuRecognizer:
    return SkuRecognizer(vit_config(config, stages), len(class_names(config)), rngs=rngs)


MERCH = register(Domain(
    name="merch", summary="visual merchandising: SKU recognition, open-set retrieval, planogram compliance",
    options=MerchOptions,
    preset={"model.channels": 3, "data.train_size": 20000, "data.eval_size": 1200, "run.steps": 1200,
            "run.eval_every": 600},
    build_model=build_model, open_split=open_split, class_names=read_class_names,
    evaluator=BatchEvaluator.factory(metrics), metric_names=NAMES, inference="triskele.eval.domains.merch",
))
