"""SKU recognition: a classifier over the training catalogue and an L2-normalised embedding trained
with a CosFace margin, so SKUs never seen in training are recognised by nearest neighbour; and the
dense facing detector that finds the products on a shelf photo for it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh import constrain
from triskele.mesh.shape import ModelShape
from triskele.models import centernet
from triskele.models.layers import Conv, Dense, normal_param, patchify
from triskele.models.preprocess import normalize
from triskele.models.vit import ViT, ViTConfig


def l2_normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    return x / jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + 1e-12)


def cosface_loss(embedding: jax.Array, centers: jax.Array, label: jax.Array, margin: float,
                 scale: float) -> jax.Array:
    """CosFace (Wang et al. 2018): cross-entropy of s * (cos(e, w_c) - m [c = label]) over the
    L2-normalised class centres `centers` (D, classes); unit embeddings (..., D), labels (...) >= 0."""
    onehot = jax.nn.one_hot(label, centers.shape[-1])
    cosine = embedding @ l2_normalize(centers.astype(jnp.float32), axis=0)
    return -jnp.sum(onehot * jax.nn.log_softmax(scale * (cosine - margin * onehot)), -1)


class SkuRecognizer(nnx.Module):
    """Crops (B, H, W, 3) -> class logits (B, classes) and unit embeddings (B, embed_dim).

    The class axis of both heads is named `classes` (sharded over `tensor` for large catalogues).
    CosFace: logits s * (cos(e, w_c) - m [c = label]) over L2-normalised class centres.
    """

    normalisation = "fixed"

    def __init__(self, cfg: ViTConfig, num_classes: int, *, embed_dim: int = 128, margin: float = 0.3,
                 scale: float = 24.0, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.backbone = ViT(cfg, rngs=rngs)
        self.classifier = Dense((cfg.width,), (num_classes,), ("embed",), ("classes",), dtype=dt, rngs=rngs,
                                kernel_init=nnx.initializers.zeros)
        self.embedding = Dense((cfg.width,), (embed_dim,), ("embed",), ("embedding",), dtype=dt, rngs=rngs)
        self.centers = normal_param(rngs, (embed_dim, num_classes), ("embedding", "classes"), 1.0)
        self.margin, self.scale = margin, scale

    def cost_shape(self) -> ModelShape:
        cfg = self.backbone.cfg
        embed_dim, classes = self.centers.shape
        by_class = 2.0 * cfg.width * classes + 2.0 * embed_dim * classes  # classifier, CosFace cosines
        return cfg.cost_shape(head_split_flops=by_class, head_flops=2.0 * cfg.width * embed_dim,
                              head_split_inputs=cfg.width + embed_dim, head_split_outputs=2 * classes)

    def features(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(class logits, unit embeddings), both float32."""
        pooled = self.backbone.pool(self.backbone(normalize(images, self.normalisation)))
        logits = self.classifier(pooled).astype(jnp.float32)
        return logits, l2_normalize(self.embedding(pooled).astype(jnp.float32))

    def __call__(self, images: jax.Array) -> jax.Array:
        return self.features(images)[0]

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        """What inference returns: class probabilities (B, classes) and unit embeddings (B, embed_dim)."""
        logits, embedding = self.features(images)
        return {"probabilities": jax.nn.softmax(logits, axis=-1), "embedding": embedding}

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Cross-entropy of the classifier plus the CosFace loss of the embedding, per record."""
        logits, embedding = self.features(batch["image"])
        label = batch["label"].astype(jnp.int32)
        known = (label >= 0).astype(jnp.float32) * batch["valid"]
        safe = jnp.maximum(label, 0)
        ce = -jnp.sum(jax.nn.one_hot(safe, logits.shape[-1]) * jax.nn.log_softmax(logits), -1)
        cosface = cosface_loss(embedding, self.centers[...], safe, self.margin, self.scale)
        return jnp.sum((ce + cosface) * known), jnp.sum(known)

    def eval_stats(self, batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Per record: embedding, top-5 classes, and the record's label, kind, shelf, slot, expected SKU."""
        logits, embedding = self.features(batch["image"])
        _, top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))
        keys = ("label", "kind", "shelf", "slot", "expected")
        return {}, {"embedding": embedding, "top5": top5, **{k: batch[k] for k in keys}}


SKU_CANDIDATES = 3
"""The nearest SKUs evaluation keeps per detection (with their cosines): the alignment to the plan
may read a facing as a planned SKU nearly as near as its nearest."""
RECOGNITION_WEIGHT = 0.3
"""The CosFace loss's weight beside the detection loss (both summed per facing): detection first
(at 0.1 the embedding trained too slowly: SKU top-1 0.42 after 500 steps of merch-shelf-tiny, 0.80
at 0.3, both with the embedding read off the detection head's features)."""


class FacingDetector(nnx.Module):
    """Shelf images (B, H, W, 3) -> class-agnostic CenterNet maps at stride `stride` (B, H/s, W/s):
    `heatmap` logits, `offset` (2) and `log_size` (2) of every facing (`triskele.models.centernet`).

    A simple feature pyramid on the plain ViT (ViTDet, Li et al. 2022): the stride-`patch` tokens
    are upsampled to stride `stride` by a learned patch-sized transposed convolution (one Dense per
    token to its (patch/stride)^2 cells) and, projected, added back at their own stride (nearest
    upsampled), so each cell sees its patch's context and its own detail; a 3x3 convolution of each
    cell's stride x stride pixels (space to depth: an average would blur the edges between narrow
    facings) adds the product edges. Two 3x3 convolutions of `channels` then three 1x1 heads (after
    500 steps of merch-shelf-tiny, val AP: one convolution of 32, 0.31; two of 32, 0.39; two of
    48, 0.47).

    With `num_classes` (the training catalogue's SKUs) a branch of its own (a 3x3 convolution of
    the same features, so recognition does not pull on the detection head) gives every cell a unit
    `embedding` (`embed_dim`), trained with CosFace at each facing's centre cell against one
    centre per SKU (a foreign facing, label -1, trains none): a detection's SKU is its peak's
    embedding's nearest gallery entry, SKUs never trained on included (open-set).
    """

    normalisation = "fixed"

    def __init__(self, cfg: ViTConfig, *, stride: int = 4, channels: int = 48, max_boxes: int = 1024,
                 max_detections: int = 1000, num_classes: int = 0, embed_dim: int = 64, margin: float = 0.3,
                 scale: float = 24.0, rngs: nnx.Rngs):
        if cfg.patch % stride:
            raise ValueError(f"the detector's stride {stride} must divide the patch size {cfg.patch}")
        dt = cfg.compute_dtype
        self.cfg, self.stride, self.channels = cfg, stride, channels
        self.max_boxes, self.max_detections = max_boxes, max_detections
        self.backbone = ViT(cfg, rngs=rngs)
        up = (cfg.patch // stride) ** 2 * channels
        self.upsample = Dense((cfg.width,), (up,), ("embed",), ("mlp",), dtype=dt, rngs=rngs)
        self.lateral = Dense((cfg.width,), (channels,), ("embed",), (None,), dtype=dt, rngs=rngs)
        self.edges = Conv(cfg.channels * stride * stride, channels, dtype=dt, rngs=rngs)
        self.fuse = Conv(2 * channels, channels, dtype=dt, rngs=rngs)
        self.refine = Conv(channels, channels, dtype=dt, rngs=rngs)
        prior = nnx.initializers.constant(math.log(centernet.PRIOR / (1 - centernet.PRIOR)))
        # Zero weights and the prior's logit as bias: every cell starts at the prior (CenterNet's -2.19).
        self.heatmap = Conv(channels, 1, 1, dtype=dt, rngs=rngs, kernel_init=nnx.initializers.zeros, bias_init=prior)
        self.offset = Conv(channels, 2, 1, dtype=dt, rngs=rngs)
        self.log_size = Conv(channels, 2, 1, dtype=dt, rngs=rngs)
        self.recognises = num_classes > 0
        if self.recognises:
            self.embedding_features = Conv(2 * channels, channels, dtype=dt, rngs=rngs)
            self.embedding = Conv(channels, embed_dim, 1, dtype=dt, rngs=rngs)
            self.centers = normal_param(rngs, (embed_dim, num_classes), ("embedding", "classes"), 1.0)
            self.margin, self.scale = margin, scale

    @property
    def grid(self) -> tuple[int, int]:
        side = self.cfg.image_size // self.stride
        return side, side

    def __call__(self, images: jax.Array) -> dict[str, jax.Array]:
        cfg, s, c = self.cfg, self.stride, self.channels
        x = normalize(images, self.normalisation)
        tokens = self.backbone.patch_tokens(self.backbone(x))
        b, g, r = tokens.shape[0], cfg.grid, cfg.patch // s
        fine = constrain(self.upsample(tokens), "batch", "length", "act_mlp")
        fine = fine.reshape(b, g, g, r, r, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * r, g * r, c)
        coarse = jnp.repeat(jnp.repeat(self.lateral(tokens).reshape(b, g, g, c), r, axis=1), r, axis=2)
        pixels = patchify(x, s).reshape(b, x.shape[1] // s, x.shape[2] // s, -1)  # no pixel averaged away
        features = jnp.concatenate([jax.nn.gelu(fine + coarse, approximate=False),
                                    jax.nn.gelu(self.edges(pixels), approximate=False).astype(fine.dtype)], -1)
        features = constrain(features, "batch", "height", "width", "channels")
        h = jax.nn.gelu(self.fuse(features), approximate=False)
        h = jax.nn.gelu(self.refine(h), approximate=False)
        maps = {"heatmap": self.heatmap(h)[..., 0].astype(jnp.float32),
                "offset": self.offset(h).astype(jnp.float32), "log_size": self.log_size(h).astype(jnp.float32)}
        if self.recognises:
            own = jax.nn.gelu(self.embedding_features(features), approximate=False)
            maps["embedding"] = l2_normalize(self.embedding(own).astype(jnp.float32))
        return maps

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(summed CenterNet loss of the valid images, their boxes): boxes (B, max_boxes, 4) in
        pixels and box_valid (B, max_boxes), with a recognition head box_sku (B, max_boxes) (-1:
        foreign), whose CosFace loss at the centres is added; the targets are computed here, on the device."""
        labels = batch["box_sku"] if self.recognises else None
        target = centernet.targets(batch["boxes"], batch["box_valid"], self.stride, self.grid, labels)
        outputs = self(batch["image"])
        per_image = centernet.detection_loss(outputs, target)
        if self.recognises:
            known = target["centre"] * (target["label"] >= 0)
            cosface = cosface_loss(outputs["embedding"], self.centers[...], jnp.maximum(target["label"], 0),
                                   self.margin, self.scale)
            per_image = per_image + RECOGNITION_WEIGHT * jnp.sum(cosface * known, axis=(1, 2))
        valid = batch["valid"].astype(jnp.float32)
        return jnp.sum(per_image * valid), jnp.sum(jnp.sum(batch["box_valid"], axis=1) * valid)

    def eval_stats(self, batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Per image: its decoded detections (boxes, scores; with recognition each one's nearest
        training SKU and its cosine) beside its true boxes (padded) and their SKUs."""
        served = self.infer(batch["image"])
        truth = {"true_boxes": batch["boxes"], "box_valid": batch["box_valid"]}
        if self.recognises:
            cosine = served.pop("embedding") @ l2_normalize(self.centers[...].astype(jnp.float32), axis=0)
            top_cosine, top = jax.lax.top_k(cosine, min(SKU_CANDIDATES, cosine.shape[-1]))
            served.update(sku=top[..., 0], sku_cosine=top_cosine[..., 0], sku_candidates=top,
                          sku_candidate_cosines=top_cosine)
            truth["true_skus"] = batch["box_sku"]
        return {}, {**served, **truth}

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        """The `max_detections` highest peaks of each image: boxes (B, k, 4) in pixels, scores (B, k)
        and, with recognition, each peak's unit embedding (B, k, embed_dim)."""
        outputs = self(images)
        boxes, scores, cells = centernet.decode(outputs, self.stride, self.max_detections)
        served = {"boxes": boxes, "scores": scores}
        if self.recognises:
            served["embedding"] = centernet.at_cells(outputs["embedding"], cells)
        return served

    def cost_shape(self) -> ModelShape:
        cfg, c, s = self.cfg, self.channels, self.stride
        cells = (cfg.image_size // s) ** 2
        upsample = 2.0 * cfg.grid**2 * cfg.width * (cfg.patch // s) ** 2 * c
        convs = 2.0 * cells * 9 * (cfg.channels * s * s * c + 3 * c * c) + 2.0 * cells * c * 5
        if self.recognises:  # the embedding head and each cell's cosines to the SKU centres
            embed_dim, classes = self.centers.shape
            convs += 2.0 * cells * (9 * 2 * c * c + embed_dim * (c + classes))
        return cfg.cost_shape(head_split_flops=upsample, head_flops=convs + 2.0 * cfg.grid**2 * cfg.width * c,
                              head_flops_without_input_grad=2.0 * cells * 9 * cfg.channels * s * s * c,
                              head_split_inputs=cfg.grid**2 * cfg.width, head_split_outputs=cells * c)
