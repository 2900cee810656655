"""WHERE arrays live: mesh specs, logical -> mesh axis rules, global batches."""

from triskele.mesh.batch import batch_sharding, host_to_global, process_rows
from triskele.mesh.logical import (
    LOGICAL_RULES,
    constrain,
    logical_to_mesh,
    partitioned,
    tree_shardings,
)
from triskele.mesh.spec import MESH_AXES, MeshSpec, make_mesh

__all__ = [
    "LOGICAL_RULES",
    "MESH_AXES",
    "MeshSpec",
    "batch_sharding",
    "constrain",
    "host_to_global",
    "logical_to_mesh",
    "make_mesh",
    "partitioned",
    "process_rows",
    "tree_shardings",
]
