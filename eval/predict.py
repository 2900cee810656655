"""Batched, sharded inference of a restored model over host arrays."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from triskele.mesh import host_to_global, process_rows
from triskele.train.run import RunParts


def predict_arrays(parts: RunParts, params: dict, images: np.ndarray, method: str = "predict") -> np.ndarray:
    """Runs `model.<method>(images)` in global batches of `data.global_batch` (the last one padded)."""
    batch_size = parts.config.data.global_batch
    graphdef = parts.graphdef

    @jax.jit
    def run(params, batch):
        return getattr(nnx.merge(graphdef, params), method)(batch["image"])

    start, stop = process_rows(parts.mesh, batch_size)
    outputs = []
    with jax.set_mesh(parts.mesh):
        for offset in range(0, len(images), batch_size):
            chunk = images[offset : offset + batch_size]
            padded = np.concatenate([chunk, np.zeros((batch_size - len(chunk), *chunk.shape[1:]), chunk.dtype)])
            result = run(params, host_to_global({"image": padded[start:stop]}, parts.mesh, batch_size))
            outputs.append(np.asarray(jax.device_get(result))[: len(chunk)])
    return np.concatenate(outputs) if outputs else np.zeros((0,))
