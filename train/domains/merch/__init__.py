"""merch: visual merchandising: SKU recognition, open-set retrieval, planogram compliance."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from triskele.train.commands import Flag, bounded
from triskele.train.domains.spec import Domain, Later

if TYPE_CHECKING:
    from flax import nnx
    from triskele.models.merch import FacingDetector, SkuRecognizer
    from triskele.train.data.pipeline import Source


@dataclasses.dataclass
class MerchOptions:
    num_skus: int = 100
    """Synthetic data: SKUs in the training catalogue."""
    task: str = "recognition"
    """What the run's model does: `recognition` (the SKU recogniser of product crops) or `shelf`
    (the dense facing detector of shelf photos; the merch-shelf-* presets)."""
    max_boxes: int = 1024
    """shelf: the facings a detector record holds, padded (a photo with more is an error)."""
    max_detections: int = 1000
    """shelf: the heatmap peaks the detector decodes per image."""
    score_threshold: float | None = None
    """shelf: the peak score from which a detection counts as a facing (count error, compliance,
    predict). Unset, it is the one training's evaluation on val chose for the checkpoint (the
    threshold of the best detection F1 at IoU 0.5, saved with it as the `score_threshold` metric;
    0.3 for a step saved unevaluated)."""
    min_facings: int = 40
    """shelf, synthetic data: the facings a photo holds at least (products shrink to fit them)."""
    shelf_scale: float = 1.0
    """shelf, predict: a photo is resized by this factor before it is cut into tiles of the
    model's input size, so that its products are as large in pixels as the training photos' are."""
    tile_overlap: int = 32
    """shelf, predict: pixels (after `shelf_scale`) two neighbouring tiles share; larger than any
    facing, so that a facing cut by a tile's edge is counted once (`tiles`)."""
    unknown_threshold: float | None = None
    """shelf, predict: a facing whose embedding's cosine to its nearest gallery entry is below this
    is `unknown`. Unset, it is the one training's evaluation on val chose for the checkpoint (the
    cosine that best separates the facings recognised right from the rest, saved with it as the
    `unknown_threshold` metric; 0.5 for a step saved unevaluated)."""


def shelf_preset(size: str) -> dict:
    """merch-shelf-<size>: the facing detector on synthetic shelf photos, selected on AP."""
    if size == "tiny":
        # 256 px with patch 16: the ViT's 256 tokens of 128 px at patch 8, the facings twice the
        # pixels (AP50 at step 500 of 500: 0.59 against 0.41 at 128 px, patch 8).
        return {"merch.task": "shelf", "model.image_size": 256, "model.patch": 16, "checkpoint.best_metric": "ap",
                "checkpoint.best_mode": "max", "data.train_size": 4000, "data.eval_size": 64,
                "data.global_batch": 16, "run.steps": 1500}
    return {"merch.task": "shelf", "model.image_size": 512, "checkpoint.best_metric": "ap",
            "checkpoint.best_mode": "max", "data.eval_size": 1000}


PACK_KEYS = ("merch.task", "model.image_size", "data.val_fraction")
"""What shapes a product crop before augmentation (its classes are the run's, from the pack's manifest)."""


def open_products(config, split: str) -> Source:
    """The recogniser's records: product crops (a packed tree, a folder tree, or synthetic)."""
    import jax
    from triskele.train.data.packed import is_packed
    from triskele.train.domains.merch.data import ProductImages, SyntheticRetail

    if is_packed(config.data.path):
        from triskele.train.data.packed import open_packed
        from triskele.train.domains.merch.data import PackedProducts

        packed = PackedProducts(open_packed(config, split, PACK_KEYS))
        if jax.process_index() == 0:
            print(packed.report(), flush=True)
        return packed
    if config.data.path:
        files = ProductImages(config.data.path, split, config.model.image_size, classes=_classes(config),
                              val_fraction=config.data.val_fraction, limits=config.limits)
        if jax.process_index() == 0:
            print(files.report(), flush=True)
        return files
    size = config.data.train_size if split == "train" else config.data.eval_size
    return SyntheticRetail(split, size, config.model.image_size, seed=config.run.seed,
                           train_skus=config.options.num_skus)


def open_shelf_photos(config, split: str) -> Source:
    """The facing detector's records: shelf photos with their boxes (an annotated tree, or synthetic)."""
    import jax
    from triskele.train.data.packed import is_packed
    from triskele.train.domains.merch.shelf_photos import ShelfPhotos

    if is_packed(config.data.path):
        raise ValueError(f"data.path {config.data.path} is packed, and shelf photos (merch.task=shelf) are read "
                         "from their tree only; give the tree")
    m = config.options
    if config.data.path:
        from triskele.train.domains.merch.shelf_files import ShelfPhotoFiles

        photos = ShelfPhotoFiles(config.data.path, split, config.model.image_size, scale=m.shelf_scale,
                                 overlap=m.tile_overlap, max_boxes=m.max_boxes, num_skus=m.num_skus,
                                 skip=config.data.bad_records == "skip", limits=config.limits)
        left_out = photos.annotations.problems
        if left_out and jax.process_index() == 0:
            print(f"{split}: {len(left_out)} annotation rows left out (data.bad_records=skip), the first: "
                  f"{left_out[0]}", flush=True)
        return photos
    size = config.data.train_size if split == "train" else config.data.eval_size
    return ShelfPhotos(split, size, config.model.image_size, seed=config.run.seed, skus=m.num_skus,
                       max_boxes=m.max_boxes, min_facings=m.min_facings)


def read_class_names(config) -> list[str]:
    """The training split's class folders on disk, or `sku<i>` and `empty` (synthetic)."""
    if config.data.path:
        from triskele.train.data.packed import is_packed, read_manifest
        from triskele.train.domains.merch.data import training_classes

        if is_packed(config.data.path):
            return list(read_manifest(config.data.path)["class_names"])
        return training_classes(config.data.path)
    return [f"sku{i}" for i in range(config.options.num_skus)] + ["empty"]


def _classes(config) -> list[str]:
    """The run's classes: saved in its config, else read as at training time."""
    saved = config.model.class_names
    return list(saved) if saved is not None else read_class_names(config)


def build_recognizer(config, rngs: nnx.Rngs, stages: int) -> SkuRecognizer:
    from triskele.models.merch import SkuRecognizer
    from triskele.train.backbone import vit_config

    return SkuRecognizer(vit_config(config, stages), len(_classes(config)), rngs=rngs)


def build_detector(config, rngs: nnx.Rngs, stages: int) -> FacingDetector:
    from triskele.models.merch import FacingDetector
    from triskele.train.backbone import vit_config

    m = config.options
    return FacingDetector(vit_config(config, stages), max_boxes=m.max_boxes, max_detections=m.max_detections,
                          num_classes=m.num_skus, rngs=rngs)


SHELF_TASK = {"build_model": build_detector, "open_split": open_shelf_photos, "class_names": lambda config: ["facing"],
              "evaluator": Later("triskele.train.domains.merch.evaluator", "ShelfEvaluator"),
              "inference": "triskele.eval.domains.merch.shelf"}
"""merch.task=shelf: the dense facing detector of shelf photos (its one class, `facing`)."""


SPEC = Domain(
    name="merch", summary="visual merchandising: SKU recognition, open-set retrieval, planogram compliance",
    options=MerchOptions,
    preset={"model.channels": 3, "data.train_size": 20000, "data.eval_size": 1200, "run.steps": 1200,
            "run.eval_every": 600},
    build_model=build_recognizer, open_split=open_products, class_names=read_class_names,
    evaluator=Later("triskele.train.domains.merch.evaluator", "MerchEvaluator"),
    metric_names=Later("triskele.train.domains.merch.evaluator", "METRIC_NAMES"),
    inference="triskele.eval.domains.merch", eval_commands=("gallery",),
    predict_flags=(Flag("--shelf-scale", "facing-detector runs: resize each photo by this before tiling (default: "
                        "the run's merch.shelf_scale)", type=bounded(float, 0.01, 16), metavar="FACTOR"),
                   Flag("--score-threshold", "facing-detector runs: the peak score from which a detection is a facing "
                        "(default: the one chosen on val for the checkpoint)", type=bounded(float, 0, 1),
                        metavar="SCORE"),
                   Flag("--unknown-threshold", "facing-detector runs: the cosine below which a facing is unknown "
                        "(default: the one chosen on val for the checkpoint)", type=bounded(float, -1, 1),
                        metavar="COSINE")),
    resume_options=("score_threshold", "shelf_scale", "tile_overlap", "unknown_threshold"), pack_keys=PACK_KEYS,
    chosen_by_evaluation={"score_threshold": 0.3, "unknown_threshold": 0.5},
    variants={"shelf": shelf_preset},
    tasks={"recognition": {}, "shelf": SHELF_TASK},
)
