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
from triskele.models.layers import Conv, Dense, normal_param
from triskele.models.preprocess import normalize
from triskele.models.vit import ViT, ViTConfig


def l2_normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    return x / jnp.sqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + 1e-12)


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

    def serve(self, images: jax.Array) -> dict[str, jax.Array]:
        """What inference returns: class probabilities (B, classes) and unit embeddings (B, embed_dim)."""
        logits, embedding = self.features(images)
        return {"probabilities": jax.nn.softmax(logits, axis=-1), "embedding": embedding}

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Cross-entropy of the classifier plus the CosFace loss of the embedding, per record."""
        logits, embedding = self.features(batch["image"])
        label = batch["label"].astype(jnp.int32)
        known = (label >= 0).astype(jnp.float32) * batch["valid"]
        safe = jnp.maximum(label, 0)
        onehot = jax.nn.one_hot(safe, logits.shape[-1])
        cosine = embedding @ l2_normalize(self.centers[...].astype(jnp.float32), axis=0)
        margin_logits = self.scale * (cosine - self.margin * onehot)
        ce = -jnp.sum(onehot * jax.nn.log_softmax(logits), -1)
        cosface = -jnp.sum(onehot * jax.nn.log_softmax(margin_logits), -1)
        return jnp.sum((ce + cosface) * known), jnp.sum(known)

    def eval_stats(self, batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Per record: embedding, top-5 classes, and the record's label, kind, shelf, slot, expected SKU."""
        logits, embedding = self.features(batch["image"])
        _, top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))
        keys = ("label", "kind", "shelf", "slot", "expected")
        return {}, {"embedding": embedding, "top5": top5, **{k: batch[k] for k in keys}}


class FacingDetector(nnx.Module):
    """Shelf images (B, H, W, 3) -> class-agnostic CenterNet maps at stride `stride` (B, H/s, W/s):
    `heatmap` logits, `offset` (2) and `log_size` (2) of every facing (`triskele.models.centernet`).

    A simple feature pyramid on the plain ViT (ViTDet, Li et al. 2022): the stride-`patch` tokens
    are upsampled to stride `stride` by a learned patch-sized transposed convolution (one Dense per
    token to its (patch/stride)^2 cells) and, projected, added back at their own stride (nearest
    upsampled), so each cell sees its patch's context and its own detail; a 3x3 convolution of the
    image pooled to the same stride adds the product edges. A 3x3 convolution then three 1x1 heads.
    """

    normalisation = "fixed"

    def __init__(self, cfg: ViTConfig, *, stride: int = 4, channels: int = 32, max_boxes: int = 1024,
                 max_detections: int = 1000, rngs: nnx.Rngs):
        if cfg.patch % stride:
            raise ValueError(f"the detector's stride {stride} must divide the patch size {cfg.patch}")
        dt = cfg.compute_dtype
        self.cfg, self.stride, self.channels = cfg, stride, channels
        self.max_boxes, self.max_detections = max_boxes, max_detections
        self.backbone = ViT(cfg, rngs=rngs)
        up = (cfg.patch // stride) ** 2 * channels
        self.upsample = Dense((cfg.width,), (up,), ("embed",), ("mlp",), dtype=dt, rngs=rngs)
        self.lateral = Dense((cfg.width,), (channels,), ("embed",), (None,), dtype=dt, rngs=rngs)
        self.edges = Conv(cfg.channels, channels, dtype=dt, rngs=rngs)
        self.fuse = Conv(2 * channels, channels, dtype=dt, rngs=rngs)
        prior = nnx.initializers.constant(math.log(centernet.PRIOR / (1 - centernet.PRIOR)))
        # Zero weights and the prior's logit as bias: every cell starts at the prior (CenterNet's -2.19).
        self.heatmap = Conv(channels, 1, 1, dtype=dt, rngs=rngs, kernel_init=nnx.initializers.zeros, bias_init=prior)
        self.offset = Conv(channels, 2, 1, dtype=dt, rngs=rngs)
        self.log_size = Conv(channels, 2, 1, dtype=dt, rngs=rngs)

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
        pooled = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, s, s, 1), (1, s, s, 1), "VALID") / (s * s)
        features = jnp.concatenate([jax.nn.gelu(fine + coarse, approximate=False),
                                    jax.nn.gelu(self.edges(pooled), approximate=False).astype(fine.dtype)], -1)
        features = constrain(features, "batch", "height", "width", "channels")
        h = jax.nn.gelu(self.fuse(features), approximate=False)
        return {"heatmap": self.heatmap(h)[..., 0].astype(jnp.float32),
                "offset": self.offset(h).astype(jnp.float32), "log_size": self.log_size(h).astype(jnp.float32)}

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(summed CenterNet loss of the valid images, their boxes): boxes (B, max_boxes, 4) in
        pixels and box_valid (B, max_boxes); the targets are computed here, on the device."""
        target = centernet.targets(batch["boxes"], batch["box_valid"], self.stride, self.grid)
        per_image = centernet.detection_loss(self(batch["image"]), target)
        valid = batch["valid"].astype(jnp.float32)
        return jnp.sum(per_image * valid), jnp.sum(jnp.sum(batch["box_valid"], axis=1) * valid)

    def eval_stats(self, batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Per image: its decoded detections (boxes, scores) beside its true boxes (padded)."""
        served = self.serve(batch["image"])
        return {}, {**served, "true_boxes": batch["boxes"], "box_valid": batch["box_valid"]}

    def serve(self, images: jax.Array) -> dict[str, jax.Array]:
        """The `max_detections` highest peaks of each image: boxes (B, k, 4) in pixels, scores (B, k)."""
        boxes, scores = centernet.decode(self(images), self.stride, self.max_detections)
        return {"boxes": boxes, "scores": scores}

    def cost_shape(self) -> ModelShape:
        cfg, c, s = self.cfg, self.channels, self.stride
        cells = (cfg.image_size // s) ** 2
        upsample = 2.0 * cfg.grid**2 * cfg.width * (cfg.patch // s) ** 2 * c
        convs = 2.0 * cells * 9 * (cfg.channels * c + 2 * c * c) + 2.0 * cells * c * 5
        return cfg.cost_shape(head_split_flops=upsample, head_flops=convs + 2.0 * cfg.grid**2 * cfg.width * c,
                              head_flops_without_input_grad=2.0 * cells * 9 * cfg.channels * c,
                              head_split_inputs=cfg.grid**2 * cfg.width, head_split_outputs=cells * c)
