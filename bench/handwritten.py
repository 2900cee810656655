"""The floor for framework overhead: a minimal hand-written Flax NNX ViT classifier and AdamW step.

Patch embedding as a strided convolution, one Python object per block (no stacking, no scan), no
sharding constraints, plain `optax.adamw`, one jitted function of (params, opt_state, batch).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Block(nnx.Module):
    def __init__(self, width: int, mlp_dim: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(width, epsilon=1e-6, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=width, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, epsilon=1e-6, rngs=rngs)
        self.fc1 = nnx.Linear(width, mlp_dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(jax.nn.gelu(self.fc1(self.norm2(x)), approximate=False))


class ViT(nnx.Module):
    def __init__(self, width: int, depth: int, mlp_dim: int, heads: int, patch: int, image_size: int,
                 channels: int, classes: int, rngs: nnx.Rngs):
        self.embed = nnx.Conv(channels, width, (patch, patch), strides=(patch, patch), padding="VALID", rngs=rngs)
        self.cls = nnx.Param(jnp.zeros((1, 1, width)))
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, (image_size // patch) ** 2 + 1, width)))
        self.blocks = nnx.List([Block(width, mlp_dim, heads, rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(width, epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.embed(images)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (x.shape[0], 1, x.shape[-1])), x], axis=1) + self.pos[...]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def make_step(shape: dict, classes: int, lr: float = 1e-3):
    """(params, opt_state, step) for a ViT of `shape` (width, depth, mlp_dim, heads, patch, image_size,
    channels); `step(params, opt_state, images, labels) -> (params, opt_state, loss)`, donating state."""
    model = ViT(**shape, classes=classes, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    tx = optax.adamw(lr, weight_decay=0.05)

    def loss_fn(params, images, labels):
        logits = nnx.merge(graphdef, params)(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return params, tx.init(params), step
