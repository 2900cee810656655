"""Inference over host arrays: a restored model (`LiveModel`) or an exported one
(`triskele.eval.exported.ExportedModel`) answer the same call: images -> the model's `serve` outputs."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from flax import nnx
from triskele.mesh import host_to_global, process_rows
from triskele.train.run import RunParts


def model_meta(parts: RunParts) -> dict[str, Any]:
    """What a caller needs to feed the model and read its outputs (also the exported sidecar): all
    from the checkpoint's config, none from the training data."""
    config = parts.config
    return {"domain": config.domain, "image_size": config.model.image_size, "channels": config.model.channels,
            "frames": config.model.frames, "options": dataclasses.asdict(config.options),
            "class_names": list(config.model.class_names)}


class LiveModel:
    """A restored model's `serve` on host images, in sharded global batches (the last one padded)."""

    def __init__(self, parts: RunParts, params: dict):
        self.parts, self.params, self.meta = parts, params, model_meta(parts)
        graphdef = parts.graphdef
        self._serve = jax.jit(lambda params, images: nnx.merge(graphdef, params).serve(images))

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        mesh, batch_size = self.parts.mesh, self.parts.config.data.global_batch
        start, stop = process_rows(mesh, batch_size)
        outputs: dict[str, list[np.ndarray]] = {}
        with jax.set_mesh(mesh):
            for offset in range(0, len(images), batch_size):
                chunk = np.asarray(images[offset : offset + batch_size], np.float32)
                padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk), *chunk.shape[1:]), np.float32)])
                batch = host_to_global({"image": padded[start:stop]}, mesh, batch_size)["image"]
                for key, value in jax.device_get(self._serve(self.params, batch)).items():
                    outputs.setdefault(key, []).append(np.asarray(value)[: len(chunk)])
        return {key: np.concatenate(parts) for key, parts in outputs.items()}
