"""Models for inference behind one interface: `dispatch(records)` / `fetch(handle)` for the
streaming engine, `model(images)` for notebooks, and `meta` (what the inputs are and the outputs
mean). A restored checkpoint (float or weight-quantized) is a `LiveModel`; an exported one is
`triskele.eval.exported.ExportedModel`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh
from triskele.mesh import make_mesh
from triskele.train.run import RunParts, restore_params
from triskele.train.serve import ServeRunner

INFERENCE_BATCH_PER_DEVICE = 8
"""predict's default batch: this many records per device on `data x fsdp` (never the training batch)."""


def default_batch(mesh: Mesh) -> int:
    return INFERENCE_BATCH_PER_DEVICE * mesh.shape["data"] * mesh.shape["fsdp"]


def model_meta(parts: RunParts) -> dict[str, Any]:
    """What a caller needs to feed the model and read its outputs (also the exported sidecar): all
    from the checkpoint's config, none from the training data."""
    config = parts.config
    return {"domain": config.domain, "image_size": config.model.image_size, "channels": config.model.channels,
            "frames": config.model.frames, "options": dataclasses.asdict(config.options),
            "class_names": list(config.model.class_names)}


class LiveModel(ServeRunner):
    """A restored model's `serve` on its mesh, in batches of `batch` (default: INFERENCE_BATCH_PER_DEVICE
    per device on data x fsdp)."""

    def __init__(self, parts: RunParts, params: dict, batch: int | None = None):
        super().__init__(parts.graphdef, params, parts.mesh, batch or default_batch(parts.mesh))
        self.parts, self.meta = parts, model_meta(parts)


def load_model(workdir: str | Path | None, exported: str | Path | None = None, mesh: str | None = None,
               step: int | None = None, batch: int | None = None) -> Any:
    """A checkpoint's parameters only (no optimizer state) on `mesh` over this process's devices, or
    an exported model."""
    if exported is not None:
        from triskele.eval.exported import load_exported

        return load_exported(exported, batch)
    if workdir is None:
        raise ValueError("predict needs --workdir (a checkpoint) or --exported FILE")
    parts, params, _ = restore_params(Path(workdir), make_mesh(mesh or "", devices=jax.local_devices()), step)
    return LiveModel(parts, params, batch)
