"""SKU recognition: a classifier over the training catalogue and an L2-normalised embedding trained
with a CosFace margin, so SKUs never seen in training are recognised by nearest neighbour."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh.shape import ModelShape
from triskele.models.layers import Dense, normal_param
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
