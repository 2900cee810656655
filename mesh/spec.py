"""Mesh specs: `data=2,fsdp=2,tensor=2` -> a `jax.sharding.Mesh` with Auto axes.

The axis names and the spec itself are plain Python: JAX is imported only to build a mesh
(`make_mesh`), so `--help` and the planner's flags read them without starting JAX."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

MESH_AXES: tuple[str, ...] = ("pipeline", "data", "fsdp", "tensor")
"""Mesh axes, outermost first: `tensor` innermost maps to neighbouring devices."""
AUTO = "auto"
"""The mesh spec a run leaves to the planner (`--mesh auto`, chosen by `triskele.train.auto_mesh` for
the job's devices before the mesh is made)."""


def divisors(n: int) -> list[int]:
    """The positive divisors of `n`, ascending: the sizes an axis, a batch split or a head split can take."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Sizes of the four mesh axes; one of them may be -1 (takes the remaining devices)."""

    pipeline: int = 1
    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @classmethod
    def parse(cls, spec: str | Mapping[str, int] | MeshSpec | None) -> MeshSpec:
        """Parses `"data=2,tensor=4"`, `{"data": 2}`, a MeshSpec, or None/"" (all devices on `data`)."""
        if isinstance(spec, MeshSpec):
            return spec
        if spec is None or (isinstance(spec, str) and not spec.strip()):
            return cls(data=-1)
        text = spec if isinstance(spec, str) else ",".join(f"{k}={v}" for k, v in spec.items())
        sizes: dict[str, int] = {}
        for item in (part.strip() for part in text.split(",") if part.strip()):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep:
                raise ValueError(f"mesh spec {text!r}: {item!r} is not AXIS=SIZE; write e.g. 'data=2,tensor=4'")
            if name not in MESH_AXES:
                raise ValueError(f"mesh spec {text!r}: unknown axis {name!r}; axes are {', '.join(MESH_AXES)}")
            if name in sizes:
                raise ValueError(f"mesh spec {text!r}: axis {name!r} is given twice; give each axis once, e.g. "
                                 "'data=2,tensor=4'")
            try:
                size = int(str(value).strip())
            except ValueError:
                raise ValueError(f"mesh spec {text!r}: size of {name!r} must be an integer, got {value!r}") from None
            if size == 0 or size < -1:
                raise ValueError(
                    f"mesh spec {text!r}: size of {name!r} is {size}; use a positive size or -1 for the rest"
                )
            sizes[name] = size
        if sum(1 for v in sizes.values() if v == -1) > 1:
            raise ValueError(f"mesh spec {text!r}: at most one axis may be -1 (it takes the remaining devices)")
        return cls(**sizes)

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_AXES}

    @property
    def devices(self) -> int:
        """Devices of a resolved spec (no -1)."""
        return math.prod(self.sizes().values())

    @property
    def batch_shards(self) -> int:
        """How many ways the batch is split: data x fsdp."""
        return self.data * self.fsdp

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.sizes().items() if v != 1) or "data=1"

    def resolve(self, num_devices: int) -> dict[str, int]:
        """Sizes with the -1 filled in, checked against `num_devices`."""
        sizes = self.sizes()
        known = math.prod(v for v in sizes.values() if v != -1)
        free = [k for k, v in sizes.items() if v == -1]
        if free:
            if num_devices % known:
                raise ValueError(
                    f"mesh spec '{self}': -1 on {free[0]!r} cannot fill {num_devices} devices, since the "
                    f"other axes multiply to {known}, which does not divide {num_devices}; use sizes whose "
                    f"product divides {num_devices}"
                )
            sizes[free[0]] = num_devices // known
        elif known != num_devices:
            raise ValueError(
                f"mesh spec '{self}' uses {known} devices but {num_devices} are available; make the sizes "
                f"multiply to {num_devices} (e.g. 'data={num_devices}') or put -1 on one axis"
            )
        return sizes


def _simulated_devices_hint(spec: MeshSpec, devices: Sequence[jax.Device]) -> str:
    """On CPU, how to get the devices a spec asks for: XLA simulates them."""
    wanted = math.prod(v for v in spec.sizes().values() if v != -1)
    if wanted <= len(devices) or any(d.platform != "cpu" for d in devices):
        return ""
    return (f". On CPU, XLA can simulate {wanted} devices: set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{wanted} in the environment before JAX starts (e.g. `XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{wanted} python -m triskele.train ...`), or use --mesh auto, which fits the devices there are")


def make_mesh(
    spec: str | Mapping[str, int] | MeshSpec | None,
    devices: Sequence[jax.Device] | None = None,
    dcn: str | Mapping[str, int] | MeshSpec | None = None,
) -> Mesh:
    """Builds the device mesh (axes `pipeline, data, fsdp, tensor`, all `AxisType.Auto`).

    `dcn` names how many hosts (processes) each axis spans, e.g. `data=2`: the mesh is then built
    with `create_hybrid_device_mesh`, so the other axes, `tensor` above all, stay inside a host.
    """
    import jax
    from jax.experimental import mesh_utils
    from jax.sharding import AxisType, Mesh

    devices = list(jax.devices() if devices is None else devices)
    parsed = MeshSpec.parse(spec)
    try:
        sizes = parsed.resolve(len(devices))
    except ValueError as err:
        raise ValueError(f"{err}{_simulated_devices_hint(parsed, devices)}") from None
    shape = tuple(sizes[name] for name in MESH_AXES)
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    if not dcn:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    dcn_sizes = MeshSpec.parse(dcn).sizes()
    hosts = len({d.process_index for d in devices})
    if -1 in dcn_sizes.values() or math.prod(dcn_sizes.values()) != hosts:
        raise ValueError(f"--dcn '{dcn}' must multiply to the {hosts} processes, with no -1 (e.g. --dcn data={hosts})")
    for name in MESH_AXES:
        if sizes[name] % dcn_sizes[name]:
            raise ValueError(f"--dcn '{dcn}': mesh {name}={sizes[name]} is not divisible by {dcn_sizes[name]} hosts; "
                             f"make the mesh's {name} a multiple of {dcn_sizes[name]} or span fewer hosts on it")
    ici = tuple(sizes[name] // dcn_sizes[name] for name in MESH_AXES)
    dcn_shape = tuple(dcn_sizes[name] for name in MESH_AXES)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn_shape, devices, process_is_granule=True)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)
