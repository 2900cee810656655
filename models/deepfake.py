"""Deepfake detection: real/fake logits for face crops (per frame) and for clips (per video)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from triskele.mesh import constrain
from triskele.mesh.shape import ModelShape
from triskele.models.layers import Dense, LayerNorm, normal_param
from triskele.models.preprocess import normalize
from triskele.models.vit import ViT, ViTConfig


def _patch_fraction(blend: jax.Array, patch: int) -> jax.Array:
    """(..., H, W) uint8 blend mask -> (..., H/p * W/p) fraction of each patch that was blended."""
    *lead, h, w = blend.shape
    x = blend.astype(jnp.float32).reshape(*lead, h // patch, patch, w // patch, patch) / 255.0
    return x.mean(axis=(-3, -1)).reshape(*lead, (h // patch) * (w // patch))


class _BinaryDetector(nnx.Module):
    """Loss and statistics shared by the frame and the video detector: one logit, 1 = fake.

    Where the data knows where a fake was blended (synthetic self-blended fakes), a per-patch head
    also learns to find the blended region, as Face X-ray does: one label per image is a weak
    signal for a ViT trained from scratch, and the blend boundary is where the evidence is.
    """

    blend_weight = 1.0
    normalisation = "fixed"

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        logits, patch_logits = self.logits(batch["image"])
        bce = optax.sigmoid_binary_cross_entropy(logits, batch["label"].astype(jnp.float32))
        target = _patch_fraction(batch["blend"], self.patch)
        patch_bce = optax.sigmoid_binary_cross_entropy(patch_logits, target)
        patch_bce = patch_bce.reshape(patch_bce.shape[0], -1).mean(axis=-1)
        total = bce + self.blend_weight * batch["blend_known"] * patch_bce
        return jnp.sum(total * batch["valid"]), jnp.sum(batch["valid"])

    def __call__(self, images: jax.Array) -> jax.Array:
        return self.logits(images)[0]

    def eval_stats(self, batch: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """Per record: fake probability, label, video id (for video-level AUC) and manipulation family."""
        score = jax.nn.sigmoid(self.logits(batch["image"])[0])
        return {}, {"score": score, "label": batch["label"], "video": batch["video"], "family": batch["family"]}

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        """What inference returns: the fake probability per record (B,)."""
        return {"fake_probability": jax.nn.sigmoid(self.logits(images)[0])}


class FrameDetector(_BinaryDetector):
    """Face crops (B, H, W, 3) -> fake logits (B,)."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.backbone = ViT(cfg, rngs=rngs)
        self.head = Dense((cfg.width,), (1,), ("embed",), (None,), dtype=dt, rngs=rngs,
                          kernel_init=nnx.initializers.zeros)
        self.blend_head = Dense((cfg.width,), (1,), ("embed",), (None,), dtype=dt, rngs=rngs)
        self.patch = cfg.patch

    def cost_shape(self) -> ModelShape:
        cfg = self.backbone.cfg
        return cfg.cost_shape(head_flops=2.0 * cfg.width * (1 + cfg.grid**2))

    def logits(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(image logits (B,), per-patch blend logits (B, patches))."""
        tokens = self.backbone(normalize(images, self.normalisation))
        image_logits = self.head(self.backbone.pool(tokens))[:, 0]
        patch_logits = self.blend_head(self.backbone.patch_tokens(tokens))[..., 0]
        return image_logits.astype(jnp.float32), patch_logits.astype(jnp.float32)


class VideoDetector(_BinaryDetector):
    """Clips (B, T, H, W, 3) -> one fake logit per clip (B,).

    Every frame goes through the same backbone; a learned query attends over the T frame
    embeddings (with learned time positions), so the clip score can weigh the frames that show
    blending artefacts or flicker.
    """

    def __init__(self, cfg: ViTConfig, frames: int, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.backbone = ViT(cfg, rngs=rngs)
        self.time_embed = normal_param(rngs, (frames, cfg.width), (None, "embed"), 0.02)
        self.query = normal_param(rngs, (cfg.width,), ("embed",), 0.02)
        self.keys = Dense((cfg.width,), (cfg.width,), ("embed",), ("mlp",), dtype=dt, rngs=rngs)
        self.norm = LayerNorm(cfg.width, dtype=dt, rngs=rngs)
        self.head = Dense((cfg.width,), (1,), ("embed",), (None,), dtype=dt, rngs=rngs,
                          kernel_init=nnx.initializers.zeros)
        self.blend_head = Dense((cfg.width,), (1,), ("embed",), (None,), dtype=dt, rngs=rngs)
        self.frames = frames
        self.patch = cfg.patch

    def cost_shape(self) -> ModelShape:
        cfg, t, d = self.backbone.cfg, self.frames, self.backbone.cfg.width
        pooling = 2.0 * t * d * d + 4.0 * t * d  # keys, scores, weighted sum
        return cfg.cost_shape(images_per_record=t, head_flops=pooling + 2.0 * d + 2.0 * t * cfg.grid**2 * d)

    def logits(self, clips: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(clip logits (B,), per-frame per-patch blend logits (B, T, patches))."""
        b, t = clips.shape[:2]
        if t != self.frames:
            raise ValueError(f"video model expects clips of {self.frames} frames, got {t}")
        frames = clips.reshape(b * t, *clips.shape[2:])
        tokens = self.backbone(normalize(frames, self.normalisation))
        patch_logits = self.blend_head(self.backbone.patch_tokens(tokens))[..., 0].reshape(b, t, -1)
        embedded = self.backbone.pool(tokens).reshape(b, t, -1)
        embedded = constrain(embedded + self.time_embed[...].astype(embedded.dtype), "batch", "time", "act_embed")
        scores = jnp.einsum("btd,d->bt", self.keys(embedded), self.query[...].astype(embedded.dtype))
        weights = jax.nn.softmax(scores.astype(jnp.float32) / jnp.sqrt(embedded.shape[-1]), axis=-1)
        pooled = jnp.einsum("bt,btd->bd", weights.astype(embedded.dtype), embedded)
        return self.head(self.norm(pooled))[:, 0].astype(jnp.float32), patch_logits.astype(jnp.float32)
