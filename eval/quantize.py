"""`python -m triskele.eval quantize`: a weight-quantized copy of a checkpoint for inference.

The copy is a workdir of its own (config.json, checkpoints/<step>/, and what predict reads from
the run's folder, e.g. a gallery index, which predict rebuilds for it) whose config says
`model.quantization`, so `eval`, `predict` and `evaluate_checkpoint` load it as they load any run.
The kernels of the transformer blocks are quantized (`triskele.models.quantize`); norms, biases,
embeddings and the domain heads stay float32. Arrays are converted one at a time on the host and
placed straight into the target shardings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from triskele.eval.export import carry_run_files
from triskele.mesh import make_mesh, tree_shardings
from triskele.models.layers import Dense
from triskele.models.quantize import check_format, quantize
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.checkpoints.manager import Checkpoints
from triskele.train.config.migrations import config_from_dict
from triskele.train.config.schema import CheckpointConfig
from triskele.train.run import prepare, restore_run
from triskele.train.state import TrainState


def _quantized_denses(model: nnx.Module) -> dict[tuple, Dense]:
    return {tuple(path): node for path, node in nnx.iter_graph(model)
            if isinstance(node, Dense) and node.quantization is not None}


def _lookup(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _assign(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def weight_bytes(params: Any) -> int:
    """Bytes of every stored parameter array."""
    return int(sum(np.dtype(leaf.dtype).itemsize * leaf.size for leaf in jax.tree.leaves(params)))


def quantize_checkpoint(workdir: str | Path, fmt: str, step: int | None = None, output: str | Path | None = None,
                        mesh: str | None = None) -> dict[str, Any]:
    """Writes the quantized copy of `workdir`'s checkpoint (latest or `step`) to `output` (default
    `<workdir>-<fmt>`) and returns what it wrote, with the bytes before and after."""
    check_format(fmt)
    workdir = Path(workdir)
    parts, state, step = restore_run(workdir, make_mesh(mesh or ""), step)
    if parts.config.model.quantization is not None:
        raise ValueError(f"{workdir} already holds a {parts.config.model.quantization}-quantized checkpoint; "
                         "quantize the float checkpoint it was made from")
    output = Path(output) if output else workdir.with_name(f"{workdir.name}-{fmt}")
    if (output / "checkpoints").exists():
        raise ValueError(f"--output {output} already holds checkpoints/; choose an empty folder")
    qconfig = config_from_dict({**parts.config.to_dict(), "model": {**parts.config.to_dict()["model"],
                                                                      "quantization": fmt}})
    qparts = prepare(qconfig, parts.mesh)
    abstract = nnx.eval_shape(qparts.build_model)
    target = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    shardings = tree_shardings(nnx.state(abstract, nnx.Param), parts.mesh)
    kernels = {"float32": 0, "quantized": 0}
    quantized_paths = set()
    for path, dense in _quantized_denses(abstract).items():
        kernel = np.asarray(jax.device_get(_lookup(state.params, path)["kernel"]))
        lead = kernel.ndim - len(dense.in_shape) - len(dense.out_shape)
        for key, value in quantize(kernel, fmt, lead, len(dense.in_shape)).items():
            _assign(target, (*path, key), value)
            quantized_paths.add((*path, key))
        kernels["float32"] += kernel.nbytes
        kernels["quantized"] += _lookup(target, path)["codes"].nbytes
    for path, _ in jax.tree_util.tree_flatten_with_path(target)[0]:
        keys = tuple(getattr(k, "key", k) for k in path)
        if keys not in quantized_paths:
            _assign(target, keys, np.asarray(jax.device_get(_lookup(state.params, keys))))
    params = jax.tree.map(lambda value, sharding: jax.device_put(value, sharding), target, shardings)
    output.mkdir(parents=True, exist_ok=True)
    qconfig.save(output / "config.json")
    checkpoints = Checkpoints(output / "checkpoints", CheckpointConfig())
    try:
        checkpoints.save(step, TrainState(state.step, params, qparts.tx.init(params)), {"next_step": step},
                         qconfig.to_dict())
    finally:
        checkpoints.close()
    summary = {"source": str(workdir), "step": step, "format": fmt, "output": str(output),
               "weight_bytes_float32": weight_bytes(state.params), "weight_bytes": weight_bytes(params),
               "kernel_bytes_float32": kernels["float32"], "kernel_bytes": kernels["quantized"],
               "kernel_bytes_with_scales": weight_bytes([_lookup(params, p) for p in quantized_paths])}
    summary["files_carried"] = carry_run_files(parts, state.params, step, workdir, output)
    write_atomically(output / "quantization.json", (json.dumps(summary, indent=2) + "\n").encode())
    return summary

