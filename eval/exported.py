"""Serving an exported model: `load_exported(FILE)` runs what `python -m triskele.eval export`
wrote, with numpy input, without the model's code or its checkpoint (this module imports neither).

FILE holds the serialized `jax.export` program (StableHLO, weights included); FILE.json beside it
says what it is: domain, input shape, channels, class names, how pixels are expected, the
platforms it was lowered for, and a SHA-256 of FILE. FILE.files/ beside them, where FILE.json
names it (`run_files`), holds what predict reads from a run's folder besides the model (a gallery
index), laid out as in the run's folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from triskele.mesh.chunks import run_in_batches

EXPORT_FORMAT = "triskele-export"
DYNAMIC_BATCH = 64
"""The batch a `--batch dynamic` export runs in when none is asked for."""
EXPORT_VERSION = 2
"""2: the domain's options (e.g. deepfake frames_per_video) under `options`."""


def sidecar_path(path: str | Path) -> Path:
    return Path(f"{path}.json")


def run_files_path(path: str | Path) -> Path:
    return Path(f"{path}.files")


def export_identity(meta: dict[str, Any]) -> dict[str, Any]:
    """An export's SHA-256 (checked against the file when loaded) and the step it was exported from."""
    return {"export_sha256": meta["sha256"], "step": meta.get("step")}


class ExportedModel:
    """`model(images) -> {output name: array}` for images shaped as `meta['input_shape']` says (any
    number of them, in batches of the exported size); `dispatch`/`fetch` for the streaming engine."""

    def __init__(self, path: str | Path, batch: int | None = None):
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
        if meta.get("run_files"):  # found beside FILE wherever FILE is now
            meta["run_files"] = str(self.path.parent / meta["run_files"])
        self.meta: dict[str, Any] = meta
        fixed = meta["input_shape"][0]
        if fixed is not None and batch not in (None, fixed):
            raise ValueError(f"exported model {self.path} was exported for batches of {fixed}; use --batch {fixed} "
                             "or export with --batch dynamic")
        self.batch: int = fixed or batch or DYNAMIC_BATCH

    @property
    def identity(self) -> dict[str, Any]:
        return export_identity(self.meta)

    def dispatch(self, images: np.ndarray) -> dict[str, Any]:
        images = np.asarray(images, np.float32)
        expected = self.meta["input_shape"][1:]
        if list(images.shape[1:]) != expected:
            shape = ", ".join(map(str, expected))
            raise ValueError(f"exported model {self.path} takes inputs of shape (batch, {shape}), got {images.shape}")
        return self.exported.call(images)

    def fetch(self, handle: dict[str, Any]) -> dict[str, np.ndarray]:
        return {key: np.asarray(value) for key, value in handle.items()}

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        return run_in_batches(self.dispatch, self.fetch, images, self.batch)


def load_exported(path: str | Path, batch: int | None = None) -> ExportedModel:
    return ExportedModel(path, batch)
