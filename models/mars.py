"""Mars terrain segmentation: ViT backbone + a light decoder to per-pixel logits at input resolution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh import constrain
from triskele.mesh.shape import ModelShape
from triskele.models.layers import Conv, Dense
from triskele.models.preprocess import normalize
from triskele.models.vit import ViT, ViTConfig

CLASS_NAMES = ("soil", "bedrock", "sand", "big_rock")
NUM_CLASSES = len(CLASS_NAMES)
IGNORE_LABEL = 255
CLASS_FREQUENCIES = (0.37, 0.50, 0.12, 0.01)
"""Soil, bedrock, sand, big rock: their shares of labelled pixels in AI4Mars."""
DEFAULT_CLASS_WEIGHTS = tuple(round(f ** -0.5 / sum(g ** -0.5 for g in CLASS_FREQUENCIES) * 4, 3)
                              for f in CLASS_FREQUENCIES)
"""Inverse square-root frequency, mean 1: rare sand and big rocks weigh more, since mIoU weighs
every class equally."""


class TerrainSegmenter(nnx.Module):
    """Images (B, H, W, C) -> logits (B, H, W, 4) for soil, bedrock, sand, big rock.

    Images are standardized per image first (rover exposure varies). Each patch token is
    projected to a `decoder_channels`-deep feature for each of its pixels; a two-convolution
    branch on the image adds full-resolution texture (grain, ripples, cracks), and a 3x3
    convolution over both gives the logits, with borders sharper than the patch grid.
    """

    normalisation = "per_image"

    def __init__(
        self,
        cfg: ViTConfig,
        *,
        decoder_channels: int = 16,
        class_weights: tuple[float, ...] = DEFAULT_CLASS_WEIGHTS,
        rngs: nnx.Rngs,
    ):
        self.cfg = cfg
        dt = cfg.compute_dtype
        self.backbone = ViT(cfg, rngs=rngs)
        per_patch = cfg.patch * cfg.patch * decoder_channels
        self.unpatch = Dense((cfg.width,), (per_patch,), ("embed",), ("mlp",), dtype=dt, rngs=rngs)
        self.texture1 = Conv(cfg.channels, decoder_channels, dtype=dt, rngs=rngs)
        self.texture2 = Conv(decoder_channels, decoder_channels, dtype=dt, rngs=rngs)
        self.classify = Conv(2 * decoder_channels, NUM_CLASSES, dtype=dt, rngs=rngs)
        self.decoder_channels = decoder_channels
        self.class_weights = tuple(float(w) for w in class_weights)

    def __call__(self, images: jax.Array) -> jax.Array:
        cfg = self.cfg
        images = normalize(images, self.normalisation)
        tokens = self.backbone.patch_tokens(self.backbone(images))
        b, g, p, c = tokens.shape[0], cfg.grid, cfg.patch, self.decoder_channels
        feats = constrain(self.unpatch(tokens), "batch", "length", "act_mlp")
        feats = feats.reshape(b, g, g, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * p, g * p, c)
        feats = constrain(feats, "batch", "height", "width", "channels")
        texture = jax.nn.gelu(self.texture1(images), approximate=False)
        texture = jax.nn.gelu(self.texture2(texture), approximate=False)
        x = jnp.concatenate([jax.nn.gelu(feats, approximate=False), texture.astype(feats.dtype)], axis=-1)
        return self.classify(x).astype(jnp.float32)

    def cost_shape(self) -> ModelShape:
        cfg, c = self.cfg, self.decoder_channels
        pixels = cfg.image_size**2
        unpatch = 2.0 * cfg.grid**2 * cfg.width * cfg.patch**2 * c
        texture1 = 2.0 * pixels * 9 * cfg.channels * c  # on raw pixels: no input gradient
        texture2 = 2.0 * pixels * 9 * c * c
        classify = 2.0 * pixels * 9 * 2 * c * NUM_CLASSES
        return cfg.cost_shape(head_split_flops=unpatch, head_flops=texture1 + texture2 + classify,
                              head_flops_without_input_grad=texture1, head_split_inputs=cfg.grid**2 * cfg.width,
                              head_split_outputs=pixels * c)

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(class-weighted sum of per-pixel cross-entropy, sum of weights); 255 and padded rows weigh 0."""
        logits = self(batch["image"])
        label = batch["label"].astype(jnp.int32)
        safe = jnp.where(label == IGNORE_LABEL, 0, label)
        labelled = (label != IGNORE_LABEL).astype(jnp.float32) * batch["valid"][:, None, None]
        weight = labelled * jnp.asarray(self.class_weights, jnp.float32)[safe]
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), safe[..., None], axis=-1)[..., 0]
        return jnp.sum(nll * weight), jnp.sum(weight)

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        """What predict and evaluation read: per-pixel class logits (B, H, W, 4); sliding-window
        inference averages the logits of overlapping windows and the writers take their argmax (or,
        for --tta, their softmax) on the host, so nothing else crosses to the host."""
        return {"logits": self(images)}

    def export_outputs(self, images: jax.Array) -> dict[str, jax.Array]:
        """What an exported artifact returns: the logits and the per-pixel class probabilities
        (B, H, W, 4), for serving clients that read probabilities without post-processing."""
        logits = self(images)
        return {"logits": logits, "probabilities": jax.nn.softmax(logits, axis=-1)}
