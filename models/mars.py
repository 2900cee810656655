"""Mars terrain segmentation: ViT backbone + a light decoder to per-pixel logits at input resolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh import constrain
from triskele.models.layers import Conv, Dense
from triskele.models.vit import ViT, ViTConfig

NUM_CLASSES = 4
IGNORE_LABEL = 255


class TerrainSegmenter(nnx.Module):
    """Images (B, H, W, C) -> logits (B, H, W, 4) for soil, bedrock, sand, big rock.

    Each patch token is projected to a `decoder_channels`-deep feature for each of its pixels;
    two 3x3 convolutions over those features and the input image then sharpen region borders.
    """

    def __init__(self, cfg: ViTConfig, *, decoder_channels: int = 16, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.compute_dtype
        self.backbone = ViT(cfg, rngs=rngs)
        per_patch = cfg.patch * cfg.patch * decoder_channels
        self.unpatch = Dense((cfg.width,), (per_patch,), ("embed",), ("mlp",), dtype=dt, rngs=rngs)
        self.refine = Conv(decoder_channels + cfg.channels, decoder_channels, dtype=dt, rngs=rngs)
        self.classify = Conv(decoder_channels, NUM_CLASSES, dtype=dt, rngs=rngs)
        self.decoder_channels = decoder_channels

    def __call__(self, images: jax.Array) -> jax.Array:
        cfg = self.cfg
        tokens = self.backbone.patch_tokens(self.backbone(images))
        b, g, p, c = tokens.shape[0], cfg.grid, cfg.patch, self.decoder_channels
        feats = constrain(self.unpatch(tokens), "batch", "length", "act_mlp")
        feats = feats.reshape(b, g, g, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * p, g * p, c)
        feats = constrain(feats, "batch", "height", "width", "channels")
        x = jnp.concatenate([feats, images.astype(feats.dtype)], axis=-1)
        x = jax.nn.gelu(self.refine(x), approximate=False)
        return self.classify(x).astype(jnp.float32)

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(sum of per-pixel cross-entropy, number of labelled pixels); 255 and padded rows count 0."""
        logits = self(batch["image"])
        label = batch["label"].astype(jnp.int32)
        weight = (label != IGNORE_LABEL).astype(jnp.float32) * batch["valid"][:, None, None]
        safe = jnp.where(label == IGNORE_LABEL, 0, label)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), safe[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * weight), jnp.sum(weight)

    def eval_stats(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """Summable statistics of a batch: the confusion matrix (rows truth, columns prediction)."""
        logits = self(batch["image"])
        label = batch["label"].astype(jnp.int32)
        weight = (label != IGNORE_LABEL).astype(jnp.float32) * batch["valid"][:, None, None]
        truth = jax.nn.one_hot(label, NUM_CLASSES) * weight[..., None]
        pred = jax.nn.one_hot(jnp.argmax(logits, -1), NUM_CLASSES)
        return {"confusion": jnp.einsum("bhwt,bhwp->tp", truth, pred)}

    def predict(self, images: jax.Array) -> jax.Array:
        return jnp.argmax(self(images), axis=-1).astype(jnp.uint8)
