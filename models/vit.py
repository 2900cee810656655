"""The ViT backbone (pre-LN blocks, learned positions, exact GELU), layers stacked on a `layers` axis."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh import constrain
from triskele.mesh.pipeline import circular_pipeline
from triskele.mesh.pipeline_1f1b import one_f_one_b_pipeline
from triskele.mesh.schedule import SCHEDULES
from triskele.mesh.shape import ModelShape
from triskele.models.layers import Dense, LayerNorm, normal_param, patchify, project, zeros_param
from triskele.models.quantize import check_format

# (width, depth, mlp width, heads): big_vision's table (Zhai et al., "Scaling Vision Transformers",
# Table 2: Ti, S, M, B, L, H, g, G, e) and ViT-22B (Dehghani et al. 2023, Table 1).
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 8, 256, 4),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
    "22B": (6144, 48, 24576, 48),
}

ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
REMAT_POLICIES = ("none", "dots", "full")
"""What a block keeps for its backward: every intermediate, the matmul outputs (the elementwise ops
in between are recomputed), or only its input (the whole block is recomputed)."""
POOLINGS = ("cls", "gap")


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    width: int
    depth: int
    mlp_dim: int
    heads: int
    patch: int = 16
    image_size: int = 224
    channels: int = 3
    pool: str = "cls"
    remat: str = "dots"
    attention: str = "auto"
    dtype: str = "float32"
    fp8: bool = False
    """The blocks' matmuls (QKV, attention output, MLP up and down) run in FP8 (training)."""
    quantization: str | None = None
    """The blocks' kernels are stored quantized: int8, fp8 or fp4 (inference)."""
    norm_eps: float = 1e-6
    """The LayerNorms' epsilon (timm and the ViT releases use 1e-6, Hugging Face 1e-12)."""
    pipeline_stages: int = 1
    """Stages on the `pipeline` mesh axis; 1 runs the layers with a plain scan."""
    pipeline_repeats: int = 1
    pipeline_microbatches: int = 1
    pipeline_gather_once: bool = True
    """With FSDP, each stage's weights are gathered once per step, not in every pipeline iteration."""
    pipeline_schedule: str = "circular"
    """circular (triskele.mesh.pipeline) or 1f1b (triskele.mesh.pipeline_1f1b: bounded activation memory)."""

    @classmethod
    def named(cls, size: str, **overrides) -> ViTConfig:
        if size not in VIT_SIZES:
            raise ValueError(f"unknown ViT size {size!r}; sizes are {', '.join(VIT_SIZES)}")
        width, depth, mlp_dim, heads = VIT_SIZES[size]
        fields = dict(width=width, depth=depth, mlp_dim=mlp_dim, heads=heads)
        fields.update(overrides)
        return cls(**fields)

    def __post_init__(self):
        if self.width % self.heads:
            raise ValueError(f"model width {self.width} is not divisible by heads {self.heads}")
        if self.image_size % self.patch:
            raise ValueError(
                f"model.image_size {self.image_size} is not a multiple of model.patch {self.patch}; "
                f"use e.g. image_size={self.image_size // self.patch * self.patch or self.patch}"
            )
        if self.pool not in POOLINGS:
            raise ValueError(f"model.pool {self.pool!r} is not one of {POOLINGS}")
        if self.quantization is not None:
            check_format(self.quantization)
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"model.remat {self.remat!r} is not one of {REMAT_POLICIES}")
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"pipeline.schedule {self.pipeline_schedule!r} is not one of {SCHEDULES}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"model.attention {self.attention!r} is not one of {ATTENTION_IMPLEMENTATIONS}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch

    @property
    def num_tokens(self) -> int:
        return self.grid**2 + (1 if self.pool == "cls" else 0)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    def cost_shape(self, **head) -> ModelShape:
        """The backbone's sizes for the cost formulas, with the domain head's terms (see `ModelShape`)."""
        return ModelShape(
            width=self.width, depth=self.depth, mlp_dim=self.mlp_dim, heads=self.heads, patches=self.grid**2,
            patch_dim=self.patch * self.patch * self.channels, class_token=self.pool == "cls", **head,
        )


def attention_implementation(cfg: ViTConfig) -> str | None:
    """`auto` takes the fused cuDNN kernel on GPUs in 16-bit, XLA otherwise."""
    if cfg.attention != "auto":
        return cfg.attention
    fused = jax.default_backend() == "gpu" and cfg.compute_dtype in (jnp.bfloat16, jnp.float16)
    return "cudnn" if fused else "xla"


def block_dense_options(cfg: ViTConfig) -> dict:
    """What every Dense of a transformer block shares: dtype, FP8 matmuls, stored quantization."""
    return dict(dtype=cfg.compute_dtype, fp8=cfg.fp8, quantization=cfg.quantization)


class Attention(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        d, h = cfg.width, cfg.heads
        qkv = dict(in_shape=(d,), out_shape=(h, d // h), in_names=("embed",), out_names=("heads", "kv"),
                   **block_dense_options(cfg))
        self.query = Dense(**qkv, rngs=rngs)
        # Softmax cancels the key bias (it adds one constant per query), so its exact gradient is
        # zero; Adam would turn round-off into full-size steps. It stays a parameter (pretrained
        # ViTs carry one) but takes no gradient.
        self.key = Dense(**qkv, rngs=rngs, bias_gradient=False)
        self.value = Dense(**qkv, rngs=rngs)
        self.out = Dense((h, d // h), (d,), ("heads", "kv"), ("embed",), rngs=rngs, **block_dense_options(cfg))
        self.implementation = attention_implementation(cfg)

    def __call__(self, x: jax.Array) -> jax.Array:
        # Query, key and value run as one matmul on stacked kernels: its backward sums the three
        # input gradients before the tensor-parallel all-reduce (one all-reduce instead of three).
        projections = (self.query, self.key, self.value)
        kernel = jnp.stack([p.kernel_value() for p in projections], axis=1)
        bias = jnp.stack([p.bias_value() for p in projections], axis=0)
        qkv = project(x, kernel, bias, 1, self.query.dtype, self.query.fp8)
        names = ("batch", "length", "act_heads", "act_kv")
        q, k, v = (constrain(qkv[:, :, i], *names) for i in range(3))
        y = jax.nn.dot_product_attention(q, k, v, implementation=self.implementation)
        return self.out(constrain(y, *names))


class Mlp(nnx.Module):
    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        options = block_dense_options(cfg)
        self.up = Dense((cfg.width,), (cfg.mlp_dim,), ("embed",), ("mlp",), rngs=rngs, **options)
        self.down = Dense((cfg.mlp_dim,), (cfg.width,), ("mlp",), ("embed",), rngs=rngs, **options)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.gelu(self.up(x), approximate=False)
        return self.down(constrain(h, "batch", "length", "act_mlp"))


class Block(nnx.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.norm1 = LayerNorm(cfg.width, dtype=dt, rngs=rngs, eps=cfg.norm_eps)
        self.attn = Attention(cfg, rngs=rngs)
        self.norm2 = LayerNorm(cfg.width, dtype=dt, rngs=rngs, eps=cfg.norm_eps)
        self.mlp = Mlp(cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return constrain(x, "batch", "length", "act_embed")


def stacked_blocks(cfg: ViTConfig, rngs: nnx.Rngs) -> Block:
    """`cfg.depth` blocks, parameters stacked along a leading `layers` axis; with pipeline repeats v > 1,
    along (`repeats`, `layers`) = (v, depth / v), so that a pipeline stage's layers of every repeat
    sit together on its devices (the `layers` axis goes to `pipeline`)."""

    def make_layers(rngs: nnx.Rngs) -> Block:
        @nnx.split_rngs(splits=cfg.depth // cfg.pipeline_repeats)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make(rngs: nnx.Rngs) -> Block:
            return Block(cfg, rngs=rngs)

        return make(rngs)

    if cfg.pipeline_repeats == 1:
        return make_layers(rngs)

    @nnx.split_rngs(splits=cfg.pipeline_repeats)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "repeats"})
    def make_repeats(rngs: nnx.Rngs) -> Block:
        return make_layers(rngs)

    return make_repeats(rngs)


def rematerialized(fn, policy: str):
    """`fn` under the remat policy (see REMAT_POLICIES). `dots` is the default because a scan keeps
    what a layer saves in stacked buffers that XLA zero-fills and copies: on a 2-core CPU, saving
    only the matmul outputs made the step 21% faster than saving everything (bench/step.py)."""
    if policy == "none":
        return fn
    if policy == "dots":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_saveable)
    return jax.checkpoint(fn)


def run_blocks(blocks: Block, x: jax.Array, cfg: ViTConfig) -> jax.Array:
    """Applies the stacked blocks in order: a scan, or the pipeline schedule when there are stages."""
    graphdef, state = nnx.split(blocks)

    @functools.partial(rematerialized, policy=cfg.remat)
    def layer(h: jax.Array, layer_state: nnx.State) -> tuple[jax.Array, None]:
        return nnx.merge(graphdef, layer_state)(h), None

    def layers(layers_state: nnx.State, h: jax.Array) -> jax.Array:
        return jax.lax.scan(layer, h, layers_state)[0]

    if cfg.pipeline_stages > 1:
        if cfg.pipeline_repeats == 1:
            state = jax.tree.map(lambda a: a[None], state)
        pipeline = one_f_one_b_pipeline if cfg.pipeline_schedule == "1f1b" else circular_pipeline
        return pipeline(layers, state, x, cfg.pipeline_stages, cfg.pipeline_microbatches, cfg.pipeline_gather_once)
    if cfg.pipeline_repeats > 1:
        state = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), state)
    return jax.lax.scan(layer, x, state)[0]


class ViT(nnx.Module):
    """Images (B, H, W, C) -> final-LayerNormed tokens (B, T, width); `pool` gives (B, width)."""

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.compute_dtype
        patch_dim = cfg.patch * cfg.patch * cfg.channels
        self.patch_embed = Dense((patch_dim,), (cfg.width,), ("patch",), ("embed",), dtype=dt, rngs=rngs)
        self.cls_token = zeros_param(rngs, (1, 1, cfg.width), (None, None, "embed")) if cfg.pool == "cls" else None
        self.pos_embed = normal_param(rngs, (1, cfg.num_tokens, cfg.width), (None, None, "embed"), 0.02)
        self.blocks = stacked_blocks(cfg, rngs)
        self.norm = LayerNorm(cfg.width, dtype=dt, rngs=rngs, eps=cfg.norm_eps)

    def __call__(self, images: jax.Array) -> jax.Array:
        cfg = self.cfg
        x = self.patch_embed(patchify(images.astype(cfg.compute_dtype), cfg.patch))
        if self.cls_token is not None:
            cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (x.shape[0], 1, cfg.width))
            x = jnp.concatenate([cls, x], axis=1)
        x = constrain(x + self.pos_embed[...].astype(x.dtype), "batch", "length", "act_embed")
        x = run_blocks(self.blocks, x, cfg)
        return self.norm(x)

    def patch_tokens(self, tokens: jax.Array) -> jax.Array:
        """The (B, grid*grid, width) tokens of the patches, without the class token."""
        return tokens[:, 1:] if self.cls_token is not None else tokens

    def pool(self, tokens: jax.Array) -> jax.Array:
        return tokens[:, 0] if self.cls_token is not None else tokens.mean(axis=1)


class ViTClassifier(nnx.Module):
    """The classic image classifier: backbone, pooled token, zero-initialised linear head."""

    def __init__(self, cfg: ViTConfig, num_classes: int, *, rngs: nnx.Rngs):
        self.backbone = ViT(cfg, rngs=rngs)
        self.head = Dense(
            (cfg.width,), (num_classes,), ("embed",), ("classes",),
            dtype=cfg.compute_dtype, rngs=rngs, kernel_init=nnx.initializers.zeros,
        )

    def __call__(self, images: jax.Array) -> jax.Array:
        logits = self.head(self.backbone.pool(self.backbone(images)))
        return logits.astype(jnp.float32)

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        return {"probabilities": jax.nn.softmax(self(images), axis=-1)}

    def loss_terms(self, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """(sum of cross-entropies of the valid records, their count)."""
        logits = self(batch["image"])
        label = batch["label"].astype(jnp.int32)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), label[:, None], axis=-1)[:, 0]
        return jnp.sum(nll * batch["valid"]), jnp.sum(batch["valid"])

    def cost_shape(self) -> ModelShape:
        cfg = self.backbone.cfg
        classes = self.head.kernel.shape[-1]
        return cfg.cost_shape(head_split_flops=2.0 * cfg.width * classes, head_split_inputs=cfg.width,
                              head_split_outputs=classes)
