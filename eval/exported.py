"""Serving an exported model: `load_exported(FILE)` runs what `python -m triskele.eval export`
wrote, with numpy input, without the model's code or its checkpoint (this module imports neither).

FILE holds the serialized `jax.export` program (StableHLO, weights included); FILE.json beside it
says what it is: domain, input shape, channels, class names, how pixels are expected, the
platforms it was lowered for, and a SHA-256 of FILE.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

EXPORT_FORMAT = "triskele-export"
EXPORT_VERSION = 2
"""2: the domain's options (e.g. deepfake frames_per_video) under `options`."""


def sidecar_path(path: str | Path) -> Path:
    return Path(f"{path}.json")


class ExportedModel:
    """`model(images) -> {output name: array}` for images shaped as `meta['input_shape']` says
    (any number of them: they are run in chunks of the exported batch, the last one padded)."""

    def __init__(self, path: str | Path):
        import jax

        self.path = Path(path)
        sidecar = sidecar_path(self.path)
        if not self.path.is_file() or not sidecar.is_file():
            raise ValueError(f"exported model {self.path} needs the file and {sidecar.name} beside it; export with "
                             "python -m triskele.eval export --workdir DIR --output FILE")
        try:
            meta = json.loads(sidecar.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{sidecar} is not valid JSON ({err}); export the model again") from None
        if meta.get("format") != EXPORT_FORMAT or meta.get("version") != EXPORT_VERSION:
            raise ValueError(f"{sidecar} describes format {meta.get('format')!r} version {meta.get('version')!r}; "
                             f"this triskele reads {EXPORT_FORMAT!r} version {EXPORT_VERSION}: export the model again")
        payload = self.path.read_bytes()
        if hashlib.sha256(payload).hexdigest() != meta.get("sha256"):
            raise ValueError(f"exported model {self.path} is corrupted: its SHA-256 does not match {sidecar.name}")
        try:
            self.exported = jax.export.deserialize(bytearray(payload))
        except Exception as err:  # a version of jax that cannot read it, or damage the hash did not catch
            raise ValueError(f"exported model {self.path} cannot be deserialized by jax {jax.__version__} "
                             f"(exported with jax {meta.get('jax')}): {err}") from None
        self.meta: dict[str, Any] = meta
        self.batch: int | None = meta["input_shape"][0]

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        images = np.asarray(images, np.float32)
        expected = self.meta["input_shape"][1:]
        if list(images.shape[1:]) != expected:
            shape = ", ".join(map(str, expected))
            raise ValueError(f"exported model {self.path} takes inputs of shape (batch, {shape}), got {images.shape}")
        chunk = self.batch or 64
        outputs: dict[str, list[np.ndarray]] = {}
        for offset in range(0, len(images), chunk):
            part = images[offset : offset + chunk]
            if self.batch:
                part = np.concatenate([part, np.zeros((self.batch - len(part), *part.shape[1:]), np.float32)])
            for key, value in self.exported.call(part).items():
                outputs.setdefault(key, []).append(np.asarray(value)[: len(images[offset : offset + chunk])])
        return {key: np.concatenate(parts) for key, parts in outputs.items()}


def load_exported(path: str | Path) -> ExportedModel:
    return ExportedModel(path)
