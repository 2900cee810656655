"""ViT weight names and layouts: timm, Hugging Face, the original ViT `.npz`, big_vision `.npz` <-> ours.

Pure conversions of named arrays (no I/O). Our backbone (`triskele.models.vit.ViT`) holds:
`patch_embed/kernel` (p*p*C, D) over patches flattened as (row, column, channel), `patch_embed/bias`,
`cls_token` (1, 1, D), `pos_embed` (1, tokens, D) with the class slot first, `norm/{scale,bias}`,
and the blocks stacked on a leading layer axis: `blocks/norm1|norm2/{scale,bias}`,
`blocks/attn/{query,key,value}/kernel` (D, heads, head_dim) and `/bias` (heads, head_dim),
`blocks/attn/out/kernel` (heads, head_dim, D), `blocks/mlp/up/kernel` (D, M), `blocks/mlp/down/kernel`
(M, D). The layer math is the same in all four (pre-LayerNorm blocks, exact GELU, learned
positions); only names, shapes and the position-embedding class slot differ.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

FORMATS = ("timm", "hf", "vit_npz", "big_vision")
RESIZE = {"timm": ("cubic", True), "hf": ("cubic-pytorch", False), "vit_npz": ("linear", False),
          "big_vision": ("linear", False)}
"""Position-embedding resampling per source, as its own library does it: timm's
resample_abs_pos_embed (bicubic, antialias), Hugging Face's interpolate_pos_encoding (PyTorch bicubic,
no antialias), timm's loader of the .npz releases (bilinear, no antialias)."""
BLOCK_LEAVES = ("norm1/scale", "norm1/bias", "attn/query/kernel", "attn/query/bias", "attn/key/kernel",
                "attn/key/bias", "attn/value/kernel", "attn/value/bias", "attn/out/kernel", "attn/out/bias",
                "norm2/scale", "norm2/bias", "mlp/up/kernel", "mlp/up/bias", "mlp/down/kernel", "mlp/down/bias")
NPZ_PREFIXES = ("params/img/", "params/", "opt/target/", "")

Getter = Callable[[str], np.ndarray]


@dataclasses.dataclass(frozen=True)
class FileLayout:
    """What a weight file holds: its format, key prefix and the ViT's sizes."""

    format: str
    prefix: str
    width: int
    depth: int
    mlp_dim: int
    patch: int
    channels: int
    grid: int
    class_token: bool
    class_slot: bool
    """Whether the position embedding has a slot for the class token."""
    heads: int | None
    """Known where the file shapes its attention kernels by head (.npz) or says (Hugging Face config)."""
    stacked: bool = False
    """big_vision: the blocks stacked in one Transformer/encoderblock."""
    hf_modules: bool = False
    """Hugging Face: transformers 5's module names (`layers.N.attention.q_proj`, what `state_dict()`
    gives), not the hub's (`encoder.layer.N.attention.attention.query`, what `save_pretrained` writes)."""


class LayoutError(ValueError):
    """A weight file whose keys or shapes fit no layout triskele reads."""


FORMATS_TRIED = (
    "timm (patch_embed.proj.weight, blocks.N.attn.qkv.weight, ...)",
    "Hugging Face hub names ([vit.]embeddings.patch_embeddings.projection.weight, "
    "[vit.]encoder.layer.N.attention.attention.query.weight, ...)",
    "transformers 5 module names ([vit.]embeddings.patch_embeddings.projection.weight, "
    "[vit.]layers.N.attention.q_proj.weight, ...)",
    "the original ViT .npz (embedding/kernel, Transformer/encoderblock_N/...)",
    "big_vision .npz ([params/[img/]]embedding/kernel, Transformer/encoderblock[_N]/...)",
)


def detect_format(keys: set[str]) -> tuple[str, str]:
    """(format, key prefix) of a weight file from its keys."""
    if "patch_embed.proj.weight" in keys:
        return "timm", ""
    for prefix in ("vit.", ""):
        if f"{prefix}embeddings.patch_embeddings.projection.weight" in keys:
            return "hf", prefix
    for prefix in NPZ_PREFIXES:
        if f"{prefix}embedding/kernel" in keys:
            big = (prefix.startswith("params/") or f"{prefix}pos_embedding" in keys
                   or f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in keys)
            return ("big_vision" if big else "vit_npz"), prefix
    raise LayoutError("no patch-embedding key of any known format")


def _npz_block(layout: FileLayout, i: int) -> str:
    name = "encoderblock" if layout.stacked else f"encoderblock_{i}"
    return f"{layout.prefix}Transformer/{name}/"


def _npz_subs(fmt: str) -> tuple[int, int, int]:
    """(attention, MLP, second LayerNorm) submodule numbers: big_vision 0, 0, 1; the original 1, 3, 2."""
    return (0, 0, 1) if fmt == "big_vision" else (1, 3, 2)


def global_keys(layout: FileLayout) -> dict[str, str]:
    """Our non-block leaves -> the file's key."""
    p = layout.prefix
    if layout.format == "timm":
        keys = {"patch_embed/kernel": "patch_embed.proj.weight", "patch_embed/bias": "patch_embed.proj.bias",
                "pos_embed": "pos_embed", "norm/scale": "norm.weight", "norm/bias": "norm.bias",
                "cls_token": "cls_token"}
    elif layout.format == "hf":
        e = f"{p}embeddings."
        keys = {"patch_embed/kernel": f"{e}patch_embeddings.projection.weight",
                "patch_embed/bias": f"{e}patch_embeddings.projection.bias", "pos_embed": f"{e}position_embeddings",
                "norm/scale": f"{p}layernorm.weight", "norm/bias": f"{p}layernorm.bias", "cls_token": f"{e}cls_token"}
    else:
        pos = "pos_embedding" if layout.format == "big_vision" else "Transformer/posembed_input/pos_embedding"
        keys = {"patch_embed/kernel": f"{p}embedding/kernel", "patch_embed/bias": f"{p}embedding/bias",
                "pos_embed": f"{p}{pos}", "norm/scale": f"{p}Transformer/encoder_norm/scale",
                "norm/bias": f"{p}Transformer/encoder_norm/bias", "cls_token": f"{p}cls"}
    if not layout.class_token:
        del keys["cls_token"]
    return keys


def _pairs(modules: Mapping[str, str], weight: str, bias: str) -> dict[str, str]:
    """{our module: their module} -> {our kernel/scale and bias leaves: their keys}."""
    out = {}
    for ours, theirs in modules.items():
        out[f"{ours}/{'scale' if ours.startswith('norm') else 'kernel'}"] = f"{theirs}{weight}"
        out[f"{ours}/bias"] = f"{theirs}{bias}"
    return out


def block_keys(layout: FileLayout, i: int) -> dict[str, str]:
    """Our block leaves -> the file's key for layer i (timm fuses Q, K and V in one key)."""
    if layout.format == "timm":
        b = f"blocks.{i}."
        return _pairs({"norm1": f"{b}norm1", "attn/query": f"{b}attn.qkv", "attn/key": f"{b}attn.qkv",
                       "attn/value": f"{b}attn.qkv", "attn/out": f"{b}attn.proj", "norm2": f"{b}norm2",
                       "mlp/up": f"{b}mlp.fc1", "mlp/down": f"{b}mlp.fc2"}, ".weight", ".bias")
    if layout.format == "hf" and layout.hf_modules:
        b = f"{layout.prefix}layers.{i}."
        return _pairs({"norm1": f"{b}layernorm_before", "attn/query": f"{b}attention.q_proj",
                       "attn/key": f"{b}attention.k_proj", "attn/value": f"{b}attention.v_proj",
                       "attn/out": f"{b}attention.o_proj", "norm2": f"{b}layernorm_after",
                       "mlp/up": f"{b}mlp.fc1", "mlp/down": f"{b}mlp.fc2"}, ".weight", ".bias")
    if layout.format == "hf":
        b = f"{layout.prefix}encoder.layer.{i}."
        a = f"{b}attention.attention."
        return _pairs({"norm1": f"{b}layernorm_before", "attn/query": f"{a}query", "attn/key": f"{a}key",
                       "attn/value": f"{a}value", "attn/out": f"{b}attention.output.dense",
                       "norm2": f"{b}layernorm_after", "mlp/up": f"{b}intermediate.dense",
                       "mlp/down": f"{b}output.dense"}, ".weight", ".bias")
    b = _npz_block(layout, i)
    mha, mlp, ln2 = _npz_subs(layout.format)
    a = f"{b}MultiHeadDotProductAttention_{mha}/"
    keys = _pairs({"norm1": f"{b}LayerNorm_0", "norm2": f"{b}LayerNorm_{ln2}"}, "/scale", "/bias")
    return keys | _pairs({"attn/query": f"{a}query", "attn/key": f"{a}key", "attn/value": f"{a}value",
                          "attn/out": f"{a}out", "mlp/up": f"{b}MlpBlock_{mlp}/Dense_0",
                          "mlp/down": f"{b}MlpBlock_{mlp}/Dense_1"}, "/kernel", "/bias")


DROPPED = re.compile(r"(^|\.|/)(head|classifier|pooler|pre_logits|fc_norm_head)([./]|$)")
"""Classifier heads and poolers: left behind, the domain model has its own head."""


def expected_keys(layout: FileLayout) -> set[str]:
    keys = set(global_keys(layout).values())
    for i in range(1 if layout.stacked else layout.depth):
        keys |= set(block_keys(layout, i).values())
    return keys


def _shape(keys: Mapping[str, tuple[int, ...]], key: str, ndim: int | tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `key`, which must be there with `ndim` dimensions (LayoutError otherwise)."""
    if key not in keys:
        raise LayoutError(f"key {key} is missing")
    shape = tuple(keys[key])
    if len(shape) not in ((ndim,) if isinstance(ndim, int) else ndim) or 0 in shape:
        raise LayoutError(f"key {key} has shape {shape}, not {ndim} non-empty dimensions")
    return shape


def _depth(keys: Mapping[str, tuple[int, ...]], fmt: str, prefix: str, hf_modules: bool) -> int:
    block = {"timm": r"blocks\.(\d+)\.", "hf": r"layers\.(\d+)\." if hf_modules else r"encoder\.layer\.(\d+)\."}
    pattern = "^" + re.escape(prefix) + block.get(fmt, r"Transformer/encoderblock_(\d+)/")
    return 1 + max((int(m.group(1)) for k in keys if (m := re.match(pattern, k))), default=-1)


def probe_layout(keys: Mapping[str, tuple[int, ...]]) -> FileLayout:
    """What the keys alone say: format, prefix, naming, stacking and depth (sizes still 0)."""
    fmt, prefix = detect_format(set(keys))
    hf_modules = fmt == "hf" and any(k.startswith(f"{prefix}layers.") for k in keys)
    stacked = fmt == "big_vision" and f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in keys
    probe = FileLayout(fmt, prefix, 0, 0, 0, 0, 0, 0, True, True, None, stacked=stacked, hf_modules=hf_modules)
    if stacked:
        depth = _shape(keys, f"{prefix}Transformer/encoderblock/LayerNorm_0/scale", 2)[0]
    else:
        depth = _depth(keys, fmt, prefix, hf_modules)
    return dataclasses.replace(probe, depth=depth)


def infer_layout(keys: Mapping[str, tuple[int, ...]], config: Mapping | None = None) -> FileLayout:
    """The format and sizes of a file from its keys and shapes (and a Hugging Face config.json);
    LayoutError naming the key where they fit no layout."""
    probe = probe_layout(keys)
    fmt, prefix, depth, stacked = probe.format, probe.prefix, probe.depth, probe.stacked
    if depth < 1:
        raise LayoutError("no transformer blocks")
    embed = _shape(keys, global_keys(probe)["patch_embed/kernel"], 4)
    if fmt in ("timm", "hf"):
        width, channels, patch = embed[0], embed[1], embed[2]
    else:
        patch, channels, width = embed[0], embed[2], embed[3]
    probe = dataclasses.replace(probe, width=width)
    up = _shape(keys, block_keys(probe, 0)["mlp/up/kernel"], 3 if stacked else 2)
    mlp_dim = up[-1] if fmt in ("vit_npz", "big_vision") else up[0]
    class_token = global_keys(probe)["cls_token"] in keys
    positions = math.prod(_shape(keys, global_keys(probe)["pos_embed"], (2, 3))[:-1])
    grid = math.isqrt(positions - 1) if class_token and math.isqrt(positions - 1) ** 2 == positions - 1 \
        else math.isqrt(positions)
    if positions not in (grid * grid, grid * grid + 1):
        raise LayoutError(f"key {global_keys(probe)['pos_embed']} holds {positions} positions, not a square grid "
                          "(plus a class slot)")
    heads = None
    if fmt in ("vit_npz", "big_vision"):
        heads = _shape(keys, block_keys(probe, 0)["attn/query/kernel"], 4 if stacked else 3)[-2]
    elif config is not None and "num_attention_heads" in config:
        heads = int(config["num_attention_heads"])
    return FileLayout(fmt, prefix, width, depth, mlp_dim, patch, channels, grid, class_token,
                      class_slot=positions == grid * grid + 1, heads=heads, stacked=stacked,
                      hf_modules=probe.hf_modules)


def _heads(matrix: np.ndarray, heads: int, axis: int) -> np.ndarray:
    """Splits axis `axis` (size D) of a matrix into (heads, D / heads)."""
    shape = list(matrix.shape)
    shape[axis : axis + 1] = [heads, shape[axis] // heads]
    return matrix.reshape(shape)


def block_array(layout: FileLayout, get: Getter, i: int, leaf: str, heads: int) -> np.ndarray:
    """Layer i's array for one of our block leaves, in our shape."""
    key = block_keys(layout, i)[leaf]
    value = np.asarray(get(key), np.float32)
    if layout.stacked:
        value = value[i]
    name, kind = leaf.rsplit("/", 1)
    if layout.format in ("vit_npz", "big_vision"):
        return value  # the release already shapes kernels as (D, heads, head_dim) and (heads, head_dim, D)
    if layout.format == "timm" and name in ("attn/query", "attn/key", "attn/value"):
        value = np.split(value, 3, axis=0)[("attn/query", "attn/key", "attn/value").index(name)]
    if kind == "kernel":
        value = value.T  # torch Linear stores (out, in)
        if name in ("attn/query", "attn/key", "attn/value"):
            return _heads(value, heads, 1)
        if name == "attn/out":
            return _heads(value, heads, 0)
        return value
    if name in ("attn/query", "attn/key", "attn/value") and kind == "bias":
        return value.reshape(heads, -1)
    return value


def stacked_block(layout: FileLayout, get: Getter, leaf: str, heads: int) -> np.ndarray:
    """One of our block leaves for every layer, stacked (layers, ...)."""
    return np.stack([block_array(layout, get, i, leaf, heads) for i in range(layout.depth)])


def patch_kernel(layout: FileLayout, get: Getter, channels: int) -> np.ndarray:
    """Our (p*p*C, D) patch-embedding kernel; a 1-channel model sums the file's RGB filters and
    other counts repeat them, scaled by 3 / C (timm's adapt_input_conv)."""
    value = np.asarray(get(global_keys(layout)["patch_embed/kernel"]), np.float32)
    hwio = value.transpose(2, 3, 1, 0) if layout.format in ("timm", "hf") else value  # OIHW -> HWIO
    if channels != layout.channels:
        if channels == 1:
            hwio = hwio.sum(axis=2, keepdims=True)
        elif layout.channels == 3:
            hwio = np.tile(hwio, (1, 1, math.ceil(channels / 3), 1))[:, :, :channels] * (3 / channels)
        else:
            raise ValueError(f"cannot adapt a {layout.channels}-channel patch embedding to model.channels={channels}")
    return hwio.reshape(-1, hwio.shape[-1])


def resize_grid(grid_embed: np.ndarray, size: int, fmt: str) -> np.ndarray:
    """(g*g, D) position embeddings of a square grid -> (size*size, D), as the source library does."""
    g = math.isqrt(grid_embed.shape[0])
    if g == size:
        return grid_embed
    method, antialias = RESIZE[fmt]
    image = jnp.asarray(grid_embed.reshape(1, g, g, -1).transpose(0, 3, 1, 2), jnp.float32)
    resized = jax.image.resize(image, (1, image.shape[1], size, size), method=method, antialias=antialias)
    return np.asarray(resized).transpose(0, 2, 3, 1).reshape(size * size, -1)


def position_embedding(layout: FileLayout, get: Getter, grid: int, class_token: bool,
                       fresh_class_slot: np.ndarray | None = None) -> np.ndarray:
    """Our (1, tokens, D) position embedding: the grid part resized to `grid` x `grid`; the class
    slot from the file, or zeros where the file adds no position to its class token (big_vision),
    or `fresh_class_slot` (the model's own initialisation) where the file has no class token."""
    value = np.asarray(get(global_keys(layout)["pos_embed"]), np.float32).reshape(-1, layout.width)
    slot, cells = (value[:1], value[1:]) if layout.class_slot else (None, value)
    cells = resize_grid(cells, grid, layout.format)
    if not class_token:
        return cells[None]
    if slot is None:
        slot = np.zeros((1, layout.width), np.float32) if layout.class_token else fresh_class_slot
    return np.concatenate([slot, cells])[None]


def to_timm(backbone: Mapping[str, np.ndarray], patch: int, channels: int) -> dict[str, np.ndarray]:
    """Our backbone leaves (paths as above, blocks stacked on one layer axis) -> a timm
    VisionTransformer state dict (a 1-channel model exports in_chans=1)."""
    kernel = np.asarray(backbone["patch_embed/kernel"], np.float32)
    width = kernel.shape[-1]
    out = {"patch_embed.proj.weight": kernel.reshape(patch, patch, channels, width).transpose(3, 2, 0, 1),
           "patch_embed.proj.bias": backbone["patch_embed/bias"], "pos_embed": backbone["pos_embed"],
           "norm.weight": backbone["norm/scale"], "norm.bias": backbone["norm/bias"]}
    if "cls_token" in backbone:
        out["cls_token"] = backbone["cls_token"]
    for i in range(backbone["blocks/norm1/scale"].shape[0]):
        layer = {leaf: np.asarray(backbone[f"blocks/{leaf}"][i], np.float32) for leaf in BLOCK_LEAVES}
        b = f"blocks.{i}."
        qkv = ("query", "key", "value")
        out[f"{b}attn.qkv.weight"] = np.concatenate([layer[f"attn/{n}/kernel"].reshape(width, -1).T for n in qkv])
        out[f"{b}attn.qkv.bias"] = np.concatenate([layer[f"attn/{n}/bias"].reshape(-1) for n in qkv])
        out[f"{b}attn.proj.weight"] = layer["attn/out/kernel"].reshape(-1, width).T
        out[f"{b}attn.proj.bias"] = layer["attn/out/bias"]
        for norm in ("norm1", "norm2"):
            out[f"{b}{norm}.weight"], out[f"{b}{norm}.bias"] = layer[f"{norm}/scale"], layer[f"{norm}/bias"]
        out[f"{b}mlp.fc1.weight"], out[f"{b}mlp.fc1.bias"] = layer["mlp/up/kernel"].T, layer["mlp/up/bias"]
        out[f"{b}mlp.fc2.weight"], out[f"{b}mlp.fc2.bias"] = layer["mlp/down/kernel"].T, layer["mlp/down/bias"]
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}
