"""Models for inference behind one interface: `dispatch(records)` / `fetch(handle)` for the
streaming engine, `model(images)` for notebooks, and `meta` (what the inputs are and the outputs
mean). A restored checkpoint (float or weight-quantized) is a `LiveModel`; an exported one is
`triskele.eval.load_export.ExportedModel`."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from triskele.eval.defaults import INFERENCE_BATCH_PER_DEVICE
from triskele.mesh import make_mesh
from triskele.models.preprocess import describe_input
from triskele.train.forward import ForwardRunner
from triskele.train.run import RunParts, restore_params


def default_batch(mesh: Mesh) -> int:
    return INFERENCE_BATCH_PER_DEVICE * mesh.shape["data"] * mesh.shape["fsdp"]


def model_meta(parts: RunParts) -> dict[str, Any]:
    """What a caller needs to feed the model and read its outputs (also the exported sidecar): all
    from the checkpoint's config, none from the training data."""
    config = parts.config
    return {"domain": config.domain, "image_size": config.model.image_size, "channels": config.model.channels,
            "frames": config.model.frames, "options": dataclasses.asdict(config.options),
            "class_names": list(config.model.class_names)}


def input_preprocessing(meta: dict[str, Any]) -> dict[str, Any]:
    """How a model's inputs are prepared (what a gallery index or predict's manifest records beside
    the model's identity): input size, channels, frames, normalisation, the domain's options."""
    preprocessing = {"image_size": meta["image_size"], "channels": meta["channels"], "frames": meta["frames"],
                     "normalisation": meta["normalisation"], "domain_options": meta["options"]}
    return json.loads(json.dumps(preprocessing, default=str))  # as a JSON file gives it back


def describe_model(identity: dict[str, Any] | None) -> str:
    """An identity in words: 'checkpoint step 4 (float32, parameters sha256 1a2b3c4d5e6f)' or
    'export sha256 ... (of step 4)'."""
    if not identity:
        return "an unrecorded model"
    if "export_sha256" in identity:
        return f"export sha256 {identity['export_sha256'][:12]} (of step {identity.get('step')})"
    return (f"checkpoint step {identity.get('step')} ({identity.get('format')}, parameters sha256 "
            f"{str(identity.get('params_sha256'))[:12]})")


def params_digest(params: Any) -> str:
    """SHA-256 of every parameter's path, dtype, shape and values, in path order: the same
    checkpoint gives the same digest on any mesh or process count, other weights another."""
    digest = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        if getattr(leaf, "is_fully_addressable", True):
            array = np.asarray(jax.device_get(leaf))
        else:  # several processes: each gathers the whole leaf, one leaf at a time
            from jax.experimental import multihost_utils

            array = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape};".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class LiveModel(ForwardRunner):
    """A restored model's `infer` on its mesh, in batches of `batch` (default: INFERENCE_BATCH_PER_DEVICE
    per device on data x fsdp); `step`: the checkpoint's, recorded in its `identity`."""

    def __init__(self, parts: RunParts, params: dict, batch: int | None = None, step: int | None = None):
        super().__init__(parts.graphdef, params, parts.mesh, batch or default_batch(parts.mesh))
        self.parts, self.step = parts, step
        normalisation = nnx.merge(parts.graphdef, params).normalisation
        self.meta = {**model_meta(parts), "normalisation": describe_input(parts.config.model.channels, normalisation)}

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """The checkpoint's step, weight format and parameter digest (computed once, on first use)."""
        return {"step": self.step, "format": self.parts.config.model.quantization or "float32",
                "params_sha256": params_digest(self.params)}


def load_model(workdir: str | Path | None, exported: str | Path | None = None, mesh: str | None = None,
               step: int | None = None, batch: int | None = None) -> Any:
    """A checkpoint's parameters only (no optimizer state) on `mesh` over this process's devices, or
    an exported model."""
    if exported is not None:
        from triskele.eval.load_export import load_exported

        return load_exported(exported, batch)
    if workdir is None:
        raise ValueError("predict needs --workdir DIR (a training run's folder, for its checkpoint) or --exported FILE "
                         "(written by `python -m triskele.eval export`)")
    parts, params, step = restore_params(Path(workdir), make_mesh(mesh or "", devices=jax.local_devices()), step)
    return LiveModel(parts, params, batch, step)
