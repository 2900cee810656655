"""`model.init_from`: start a run's backbone from a pretrained ViT file (timm, Hugging Face, .npz).

The file is read one array at a time and each backbone parameter is built on the host and placed
straight into its target sharding (`jax.make_array_from_callback`), so nothing larger than one
parameter array is ever whole on one device. The conversions are `triskele.models.weights`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import zipfile
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from triskele.models.vit import VIT_SIZES, ViTConfig
from triskele.models.weights import (
    BLOCK_LEAVES,
    DROPPED,
    FORMATS_TRIED,
    RESIZE,
    FileLayout,
    LayoutError,
    expected_keys,
    global_keys,
    infer_layout,
    patch_kernel,
    position_embedding,
    probe_layout,
    stacked_block,
)
from triskele.train.backbone import DEFAULT_NORM_EPS
from triskele.train.config.schema import Config
from triskele.train.state import TrainState
from triskele.train.weights.safetensors import MAX_DIMS, NotSafetensors, SafetensorsFile

ACCEPTED = ("model.init_from takes a timm or Hugging Face .safetensors file, a Hugging Face save_pretrained folder "
            "(one .safetensors file, optionally config.json) or a ViT/big_vision .npz file; PyTorch .bin/.pth "
            "files are not read (convert them with safetensors.torch.save_file)")
"""The weight files `model.init_from` reads, for the errors about one it cannot."""


class WeightFile:
    """The arrays of a pretrained checkpoint: a .safetensors or .npz file, or a Hugging Face
    `save_pretrained` folder (model.safetensors, optional config.json)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.config: dict[str, Any] | None = None
        if path.is_dir():
            if (path / "config.json").is_file():
                self.config = read_config(path / "config.json")
            candidates = sorted(path.glob("*.safetensors"))
            if len(candidates) != 1:
                raise ValueError(f"model.init_from folder {path} must hold one .safetensors file (found "
                                 f"{len(candidates)}); sharded checkpoints are not read, pass the file itself. "
                                 + ACCEPTED)
            path = candidates[0]
        if not path.is_file():
            raise ValueError(f"model.init_from {str(path)!r} does not exist. {ACCEPTED}")
        self.path = path
        if path.suffix == ".npz":
            if not zipfile.is_zipfile(path):
                raise ValueError(f"model.init_from {path} is not a weights file: it is not a .npz archive (a zip "
                                 f"of arrays, as numpy.savez writes). {ACCEPTED}")
            arrays: NpzFile | SafetensorsFile = NpzFile(path)
        else:
            try:
                arrays = SafetensorsFile(path)
            except NotSafetensors as err:
                raise ValueError(f"model.init_from {path} is not a weights file: it is not a readable safetensors "
                                 f"file ({err.reason}). {ACCEPTED}") from None
        self.shapes, self.get = arrays.shapes, arrays.get
        if self.config is None and (path.parent / "config.json").is_file() and path.suffix == ".safetensors":
            self.config = read_config(path.parent / "config.json")
        try:
            self.layout = infer_layout(self.shapes, self.config)
        except LayoutError as err:
            raise ValueError(layout_error(self.path, self.shapes, str(err))) from None

    def norm_eps(self) -> float | None:
        """The LayerNorm epsilon the file's config states (Hugging Face: layer_norm_eps, 1e-12 by default)."""
        if self.layout.format == "hf":
            return float((self.config or {}).get("layer_norm_eps", 1e-12))
        return None


MAX_CONFIG = 1 << 20
"""The largest config.json beside a Hugging Face file that is read, in bytes (theirs are ~1 KB)."""

MAX_NPY_HEADER = 10_000
"""The longest .npy header read from an .npz member, in bytes (numpy's own default limit)."""

NPZ_MAX_EXPANSION = 32
"""An .npz's arrays may be at most this many times the archive's size (plus NPZ_SLACK): weights
barely compress, a zip bomb expands ~1000-fold. Checked from the zip directory before any member
is decompressed."""

NPZ_SLACK = 1 << 20
"""Bytes any .npz may expand by, beyond NPZ_MAX_EXPANSION (a small archive of zeros is no bomb)."""

ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError, NotImplementedError)
"""What zipfile, zlib and numpy's header reader raise on a damaged or crafted archive (zipfile:
NotImplementedError for a flag or compression it does not read)."""


class NpzFile:
    """The arrays of one .npz archive (numpy.savez): `shapes` from each member's .npy header, read
    without decompressing the data, and checked against the member's size before anything is
    loaded; `get(name)` reads one. Every way the archive is wrong is a ValueError naming it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            members = self._zip.infolist()
        except ZIP_ERRORS as err:
            raise self._invalid(f"its zip directory cannot be read ({err})") from None
        size = self.path.stat().st_size
        total = sum(info.file_size for info in members)
        if total > NPZ_MAX_EXPANSION * size + NPZ_SLACK:
            raise self._invalid(f"its members would expand the {size}-byte archive to {total} bytes, more than "
                                f"{NPZ_MAX_EXPANSION}x (a zip bomb, or a damaged zip directory)")
        self._arrays: dict[str, tuple[zipfile.ZipInfo, int, tuple[int, ...], bool, np.dtype]] = {}
        for info in members:
            name = info.filename.removesuffix(".npy")
            if not info.filename.endswith(".npy") or name in self._arrays:
                raise self._invalid(f"member {info.filename!r} is not one .npy array (numpy.savez writes only those)")
            if info.flag_bits & 1 or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise self._invalid(f"member {info.filename!r} is encrypted or compressed other than numpy does")
            self._arrays[name] = (info, *self._header(info))
        self.shapes = {name: array[2] for name, array in self._arrays.items()}

    def _invalid(self, what: str) -> ValueError:
        return ValueError(f"{self.path} is not a valid .npz file: {what}; the file is damaged or was not written "
                          "by numpy.savez")

    def _header(self, info: zipfile.ZipInfo) -> tuple[int, tuple[int, ...], bool, np.dtype]:
        """The member's data offset, shape, order and dtype, from at most its first MAX_NPY_HEADER bytes."""
        try:
            with self._zip.open(info) as member:
                start = io.BytesIO(member.read(12 + MAX_NPY_HEADER))
            version = np.lib.format.read_magic(start)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"its .npy format version {version} is not 1.0 or 2.0")
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(start, max_header_size=MAX_NPY_HEADER)
        except ZIP_ERRORS as err:
            raise self._invalid(f"member {info.filename!r} has no readable .npy header ({err})") from None
        if dtype.kind not in "biuf" or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > MAX_DIMS:
            raise self._invalid(f"member {info.filename!r} holds shape {shape} of dtype {dtype}, not an array of "
                                f"numbers with at most {MAX_DIMS} non-negative dimensions")
        offset = start.tell()
        nbytes = math.prod(shape) * dtype.itemsize
        if info.file_size != offset + nbytes:
            raise self._invalid(f"member {info.filename!r}'s header says shape {shape} of {dtype} ({nbytes} bytes), "
                                f"but the member holds {info.file_size - offset} bytes of data")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise self._invalid(f"member {info.filename!r} is stored uncompressed in {info.compress_size} bytes but "
                                f"says it has {info.file_size}")
        return offset, shape, fortran, dtype

    def get(self, name: str) -> np.ndarray:
        info, offset, shape, fortran, dtype = self._arrays[name]
        try:
            with self._zip.open(info) as member:
                member.read(offset)
                data = member.read(info.file_size - offset)  # to the end, so that zipfile checks the CRC
        except ZIP_ERRORS as err:
            raise self._invalid(f"array {name!r} cannot be read ({err})") from None
        if len(data) != info.file_size - offset:
            raise self._invalid(f"array {name!r} is cut short")
        return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")


def read_config(path: Path) -> dict[str, Any]:
    """A Hugging Face config.json, checked where it is read (a JSON object; num_attention_heads a
    positive integer, layer_norm_eps a positive number, where present)."""
    try:
        if path.stat().st_size > MAX_CONFIG:
            raise ValueError(f"it has {path.stat().st_size} bytes, more than the {MAX_CONFIG} read")
        config = json.loads(path.read_bytes())
        if not isinstance(config, dict):
            raise ValueError("it is not a JSON object")
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"model.init_from's {path} is not a readable Hugging Face config: {err}") from None
    heads, eps = config.get("num_attention_heads"), config.get("layer_norm_eps")
    if heads is not None and (type(heads) is not int or heads < 1):
        raise ValueError(f"model.init_from's {path} has num_attention_heads {heads!r}, not a positive integer")
    if eps is not None and (type(eps) not in (int, float) or not 0 < eps < math.inf):
        raise ValueError(f"model.init_from's {path} has layer_norm_eps {eps!r}, not a positive number")
    return config


def resolve_norm_eps(config: Config) -> None:
    """Fills `model.norm_eps` when unset: from the init file's config where it states one (HF),
    else 1e-6 (timm and the .npz releases), so the saved config builds the same model later."""
    if config.model.norm_eps is not None:
        return
    stated = WeightFile(config.model.init_from).norm_eps() if config.model.init_from else None
    config.model.norm_eps = DEFAULT_NORM_EPS if stated is None else stated


def _size_name(width: int, depth: int, mlp_dim: int, heads: int | None) -> str | None:
    for name, (w, d, m, h) in VIT_SIZES.items():
        if (w, d, m) == (width, depth, mlp_dim) and heads in (None, h):
            return name
    return None


def check_compatible(layout: FileLayout, cfg: ViTConfig, path: Path) -> None:
    """Errors naming what differs between the file and the model, and which setting would fit."""
    file_sizes = {"width": layout.width, "depth": layout.depth, "mlp": layout.mlp_dim}
    model_sizes = {"width": cfg.width, "depth": cfg.depth, "mlp": cfg.mlp_dim}
    if layout.heads is not None:
        file_sizes["heads"], model_sizes["heads"] = layout.heads, cfg.heads
    differ = [k for k in file_sizes if file_sizes[k] != model_sizes[k]]
    if differ:
        fits = _size_name(layout.width, layout.depth, layout.mlp_dim, layout.heads)
        hint = (f"set model.size={fits}" if fits else "no named model.size has these sizes")
        if fits and layout.depth != VIT_SIZES[fits][1]:
            hint += f" and model.depth={layout.depth}"
        raise ValueError(
            f"model.init_from {path} is a {layout.format} ViT with "
            + ", ".join(f"{k} {file_sizes[k]}" for k in file_sizes)
            + "; the model has " + ", ".join(f"{k} {model_sizes[k]}" for k in model_sizes)
            + f" ({', '.join(differ)} differ): {hint}")
    if layout.patch != cfg.patch:
        raise ValueError(f"model.init_from {path} has {layout.patch}-pixel patches but model.patch is {cfg.patch}; "
                         f"set model.patch={layout.patch}")


def _listing(keys: list[str], most: int = 8) -> str:
    return ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "") if keys else "none"


def _layout_name(layout: FileLayout) -> str:
    if layout.format == "hf":
        return "Hugging Face, " + ("transformers 5 module names" if layout.hf_modules else "hub names")
    return layout.format


def layout_error(path: Path, shapes: dict[str, tuple[int, ...]], reason: str, layout: FileLayout | None = None) -> str:
    """One message for a file that fits no layout: why, the formats tried, the first keys that did not
    fit and the keys that were expected (of the format its keys look most like)."""
    try:
        layout = layout or probe_layout(shapes)
    except LayoutError:
        layout = None
    if layout is None:
        closest, expected = "none", set()
    else:
        closest = _layout_name(layout)
        expected = expected_keys(dataclasses.replace(layout, depth=max(layout.depth, 1)))
    unfit = sorted(k for k in set(shapes) - expected if not DROPPED.search(k))
    return (f"model.init_from {path} is not a ViT file triskele can read: {reason}. Formats tried: "
            + "; ".join(FORMATS_TRIED) + f". Closest: {closest}. First keys that did not fit: {_listing(unfit)}. "
            + f"Keys expected: {_listing(sorted(expected), 12)}")


def check_keys(file: WeightFile) -> list[str]:
    """Raises naming missing and unexpected keys; returns the keys left behind (heads, poolers)."""
    present, expected = set(file.shapes), expected_keys(file.layout)
    missing = sorted(expected - present)
    dropped = sorted(k for k in present - expected if DROPPED.search(k))
    unexpected = sorted(present - expected - set(dropped))
    if missing or unexpected:
        reason = "; ".join(([f"missing keys: {_listing(missing)}"] if missing else [])
                           + ([f"unexpected keys: {_listing(unexpected)}"] if unexpected else []))
        raise ValueError(layout_error(file.path, file.shapes, f"({_layout_name(file.layout)} layout) {reason}",
                                      file.layout))
    return dropped


def _fits(host: tuple[int, ...], target: tuple[int, ...], stacked: bool) -> bool:
    """Whether a converted array has the parameter's shape (stacked blocks may be split into
    (repeats, layers / repeats) by the pipeline layout)."""
    if not stacked:
        return host == target
    return math.prod(host) == math.prod(target) and host[1:] == target[len(target) - len(host) + 1:]


def backbone_arrays(file: WeightFile, cfg: ViTConfig, fresh: dict[str, np.ndarray]) -> dict[str, Any]:
    """Our backbone leaves ('patch_embed/kernel', 'blocks/attn/query/kernel', ...) -> a function
    making that leaf's host array (blocks stacked on one layer axis), built when called."""
    layout = file.layout
    arrays: dict[str, Any] = {
        "patch_embed/kernel": lambda: patch_kernel(layout, file.get, cfg.channels),
        "patch_embed/bias": lambda: np.asarray(file.get(global_keys(layout)["patch_embed/bias"]), np.float32),
        "pos_embed": lambda: position_embedding(layout, file.get, cfg.grid, cfg.pool == "cls",
                                                fresh["pos_embed"][0, :1]),
        "norm/scale": lambda: np.asarray(file.get(global_keys(layout)["norm/scale"]), np.float32),
        "norm/bias": lambda: np.asarray(file.get(global_keys(layout)["norm/bias"]), np.float32),
    }
    if cfg.pool == "cls":
        arrays["cls_token"] = (
            (lambda: np.asarray(file.get(global_keys(layout)["cls_token"]), np.float32).reshape(1, 1, -1))
            if layout.class_token else (lambda: fresh["cls_token"]))
    for leaf in BLOCK_LEAVES:
        arrays[f"blocks/{leaf}"] = lambda leaf=leaf: stacked_block(layout, file.get, leaf, cfg.heads)
    return arrays


def load_pretrained(state: TrainState, cfg: ViTConfig, path: str | Path, verbose: bool = True) -> TrainState:
    """`state` with its `backbone` parameters replaced by the file's, in the same shardings."""
    file = WeightFile(path)
    check_compatible(file.layout, cfg, file.path)
    dropped = check_keys(file)
    params = state.params
    if "backbone" not in params:
        raise ValueError("model.init_from loads a ViT backbone, but this model has no `backbone`")
    target = flatten_dict(params["backbone"], sep="/")
    fresh = {k: np.asarray(jax.device_get(v)) for k, v in target.items() if k in ("pos_embed", "cls_token")}
    arrays = backbone_arrays(file, cfg, fresh)
    missing = sorted(set(target) - set(arrays))
    if missing:
        raise ValueError(f"model.init_from cannot fill backbone parameters {missing}")
    placed = {}
    for name, current in target.items():
        try:
            host = arrays[name]()
        except (ValueError, IndexError) as err:
            raise ValueError(layout_error(file.path, file.shapes, f"backbone {name} cannot be made from the file "
                                          f"({err})", file.layout)) from None
        if not _fits(host.shape, current.shape, stacked=name.startswith("blocks/")):
            raise ValueError(layout_error(file.path, file.shapes, f"backbone {name} would be {host.shape} from the "
                                          f"file, the model needs {current.shape}", file.layout))
        host = host.astype(current.dtype).reshape(current.shape)  # (repeats, layers) when stacked so
        placed[name] = jax.make_array_from_callback(current.shape, current.sharding,
                                                    lambda index, host=host: host[index])
    if verbose and jax.process_index() == 0:
        print(describe(file, cfg, dropped), flush=True)
    return dataclasses.replace(state, params={**params, "backbone": unflatten_dict(placed, sep="/")})


def describe(file: WeightFile, cfg: ViTConfig, dropped: list[str]) -> str:
    layout = file.layout
    notes = [f"loaded {_layout_name(layout)} weights from {file.path}: {layout.depth} blocks, width {layout.width}"]
    if layout.grid != cfg.grid:
        method, antialias = RESIZE[layout.format]
        notes.append(f"position embedding resized {layout.grid}x{layout.grid} -> {cfg.grid}x{cfg.grid} "
                     f"({method}{', antialias' if antialias else ''})")
    if layout.channels != cfg.channels:
        notes.append(f"patch embedding adapted from {layout.channels} to {cfg.channels} channel(s)")
    if cfg.pool == "cls" and not layout.class_token:
        notes.append("the file has no class token: the model's own initialisation is kept for it")
    if cfg.pool != "cls" and layout.class_token:
        notes.append("the model pools by average: the file's class token is left out")
    if dropped:
        notes.append(f"left out: {', '.join(dropped)}")
    return "; ".join(notes)

