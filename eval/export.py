"""`python -m triskele.eval export`: a checkpoint's inference function as a `jax.export` artifact.

The exported program is the model's `export_outputs` where it has one, else its `infer` (mars:
per-pixel class logits and probabilities; deepfake: the
fake probability; merch: class probabilities and the retrieval embedding) with the weights baked
in as constants; the batch dimension is fixed or symbolic (`--batch dynamic`). Load it with
`triskele.eval.load_exported`, which needs neither this package's models nor the checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from triskele.eval.load_export import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    export_identity,
    program_signature,
    record_shape,
    run_files_path,
    sidecar_digest,
    sidecar_path,
)
from triskele.eval.model import LiveModel, model_meta
from triskele.mesh import make_mesh
from triskele.models.preprocess import describe_input
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.run import RunParts, restore_run


def parse_batch(text: str | int) -> int | None:
    """`dynamic` (a symbolic batch) -> None, else a positive integer."""
    if str(text) == "dynamic":
        return None
    try:
        batch = int(text)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"--batch {text!r} must be a positive integer or 'dynamic'")
    return batch


def carry_run_files(parts: RunParts, params: Any, step: int, workdir: Path, folder: Path,
                    copy: dict[str, Any] | None = None) -> list[str]:
    """Copies into `folder` what the domain's predict reads from the run's folder besides the
    checkpoint (its inference module's `carry_files`, e.g. merch's gallery index), for a copy of
    the run's model at `step`: a quantized copy, or an export (`copy`: its identity, as it computes
    what the checkpoint does). Returns the files written."""
    from triskele.eval.domains import inference_of

    carry = getattr(inference_of(parts.domain), "carry_files", None)
    if carry is None:
        return []
    source = LiveModel(parts, params, step=step).identity if copy is not None else None
    return carry(workdir, folder, source, copy)


def export_model(workdir: str | Path, output: str | Path, batch: str | int = "dynamic", step: int | None = None,
                 platforms: str | None = None) -> dict[str, Any]:
    """Writes OUTPUT (the serialized program) and OUTPUT.json (what it is, with `digest`: the SHA-256
    of its canonical content, which records OUTPUT's SHA-256; publish both hashes to let others
    check what they received)."""
    batch_size = parse_batch(batch)
    parts, state, step = restore_run(Path(workdir), make_mesh("data=1", devices=jax.devices()[:1]), step)
    params = jax.tree.map(lambda a: np.asarray(jax.device_get(a)), state.params)
    model = nnx.merge(parts.graphdef, params)
    meta = model_meta(parts)
    per_record = record_shape(meta["image_size"], meta["channels"], meta["frames"])
    leading = jax.export.symbolic_shape("batch") if batch_size is None else (batch_size,)
    spec = jax.ShapeDtypeStruct((*leading, *per_record), jnp.float32)
    targets = tuple(platforms.split(",")) if platforms else None
    # A model may export more than predict reads (mars: its probabilities beside the logits).
    exported = jax.export.export(jax.jit(getattr(model, "export_outputs", model.infer)), platforms=targets)(spec)
    payload = exported.serialize()
    output = Path(output)
    write_atomically(output, payload)
    sha256 = hashlib.sha256(payload).hexdigest()
    carried = carry_run_files(parts, state.params, step, Path(workdir), run_files_path(output),
                              export_identity({"sha256": sha256, "step": step}))
    sidecar = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, **meta, **program_signature(exported),
               "normalisation": describe_input(meta["channels"], model.normalisation), "jax": jax.__version__,
               "source": str(Path(workdir).absolute()), "step": step, "sha256": sha256,
               **({"run_files": run_files_path(output).name} if carried else {})}
    sidecar["digest"] = sidecar_digest(sidecar)
    write_atomically(sidecar_path(output), (json.dumps(sidecar, indent=2) + "\n").encode())
    return {"output": str(output), "sidecar": str(sidecar_path(output)), "bytes": len(payload),
            "input_shape": sidecar["input_shape"], "outputs": sidecar["outputs"], "files_carried": carried,
            "sha256": sha256, "digest": sidecar["digest"]}
