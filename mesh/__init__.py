"""WHERE arrays live: mesh specs, logical -> mesh axis rules, global batches, the pipeline schedule.

Names load on first use, so a module that needs only the jax-free parts (`triskele.mesh.chunks`,
used by serving processes; `spec` and `schedule`, which `--help` reads; `shape`) does not import
JAX or Flax. The performance model is `triskele.mesh.perf` (formulas, HLO counts, hardware,
planner, ...): nothing here imports it.
"""

import importlib

_LAZY = {
    "batch_sharding": "triskele.mesh.batch", "host_to_global": "triskele.mesh.batch",
    "process_rows": "triskele.mesh.batch", "LOGICAL_RULES": "triskele.mesh.logical",
    "constrain": "triskele.mesh.logical", "logical_to_mesh": "triskele.mesh.logical",
    "partitioned": "triskele.mesh.logical", "tree_shardings": "triskele.mesh.logical",
    "MESH_AXES": "triskele.mesh.spec", "MeshSpec": "triskele.mesh.spec", "make_mesh": "triskele.mesh.spec",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'triskele.mesh' has no attribute {name!r}")
