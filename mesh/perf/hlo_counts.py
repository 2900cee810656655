"""HLO counting: what a compiled (SPMD-partitioned, per-device) XLA program does, read from its
optimized HLO text: matmul FLOPs, collective bytes, and the memory traffic of everything else.

XLA's own `cost_analysis()` counts the body of a while loop once, whatever its trip count; our
stacked layers run in a `scan` (a while loop), so it misses (depth - 1) of every layer. This reads
the optimized HLO text instead: every computation gets a multiplier (the product of the known trip
counts of the while loops around it), and each dot, convolution and collective is counted that
many times.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
                "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")


def _dtype_bytes(dtype: str) -> float | None:
    """Bytes per element; None for what is not an array element type (e.g. `token`)."""
    if dtype.startswith("f8"):
        return 1
    if dtype in ("s4", "u4") or dtype.startswith("f4"):
        return 0.5
    return _DTYPE_BYTES.get(dtype)


def shape_bytes(text: str) -> float:
    """Bytes of every array shape in `text` (a tuple shape counts each element)."""
    total = 0.0
    for dtype, dims in _SHAPE.findall(text):
        size = _dtype_bytes(dtype)
        if size is not None:
            total += size * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _dims(shape: str) -> list[int]:
    match = _SHAPE.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


@dataclasses.dataclass
class _Instruction:
    name: str
    shape: str
    op: str
    rest: str


@dataclasses.dataclass
class _Computation:
    name: str
    shapes: dict[str, str]
    instructions: list[_Instruction]


def _parse(text: str) -> tuple[dict[str, _Computation], str]:
    computations: dict[str, _Computation] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            name = header.group(1)
            params = {}
            for param in re.finditer(r"([\w.\-]+):\s*((?:\([^)]*\))|[^,()]+)", header.group(2)):
                params[param.group(1)] = param.group(2)
            current = _Computation(name, params, [])
            computations[name] = current
            if line.startswith("ENTRY"):
                entry = name
            continue
        if current is None:
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            name, shape, op, rest = instruction.groups()
            current.shapes[name] = shape
            current.instructions.append(_Instruction(name, shape, op, rest))
    if not entry:
        raise ValueError("HLO text has no ENTRY computation; pass compiled.as_text() of a jitted function")
    return computations, entry


def _trip_count(rest: str) -> int:
    match = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
    return int(match.group(1)) if match else 1


def _multipliers(computations: dict[str, _Computation], entry: str) -> dict[str, int]:
    """How many times each computation runs per execution of the entry computation."""
    multiplier: dict[str, int] = defaultdict(int)
    multiplier[entry] = 1
    order = [entry]
    seen = {entry}
    while order:
        name = order.pop(0)
        for instruction in computations[name].instructions:
            trips = _trip_count(instruction.rest) if instruction.op == "while" else 1
            for kind, targets in _CALLED.findall(instruction.rest):
                for target in (t.strip(" {}%") for t in targets.split(",")):
                    if target not in computations:
                        continue
                    factor = trips if kind in ("body", "condition") else 1
                    multiplier[target] += multiplier[name] * factor
                    if target not in seen:
                        seen.add(target)
                        order.append(target)
    return multiplier


def _operands(rest: str) -> list[str]:
    depth, current, out = 0, "", []
    for char in rest:
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                out.append(current)
                break
            depth -= 1
        if char == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += char
    return [o.strip().lstrip("%").split(" ")[-1].lstrip("%") for o in out if o.strip()]


def _dot_flops(instruction: _Instruction, shapes: dict[str, str]) -> float:
    out = math.prod(_dims(instruction.shape))
    lhs = _dims(shapes.get(_operands(instruction.rest)[0], ""))
    match = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instruction.rest)
    contracted = [int(d) for d in match.group(1).split(",") if d] if match else []
    return 2.0 * out * math.prod(lhs[d] for d in contracted if d < len(lhs))


def _convolution_flops(instruction: _Instruction, shapes: dict[str, str]) -> float:
    operands = _operands(instruction.rest)
    kernel = _dims(shapes.get(operands[1], ""))
    labels = re.search(r"dim_labels=\w+_(\w+)->", instruction.rest)
    groups = re.search(r"feature_group_count=(\d+)", instruction.rest)
    if not kernel or not labels:
        return 0.0
    out_features = kernel[labels.group(1).index("o")]
    per_output = math.prod(kernel) / out_features / (int(groups.group(1)) if groups else 1)
    return 2.0 * math.prod(_dims(instruction.shape)) * per_output


def _group_size(rest: str, num_devices: int) -> int:
    """Devices per replica group, from any of XLA's three spellings of `replica_groups`."""
    mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if mesh_form:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh_form.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", mesh_form.group(2))) or 1
    iota = re.search(r"replica_groups=\[([0-9,]+)\]<=", rest)
    if iota:
        return int(iota.group(1).split(",")[-1])
    explicit = re.search(r"replica_groups=\{\{([0-9,]*)\}", rest)
    if explicit:
        return len([d for d in explicit.group(1).split(",") if d])
    pairs = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*)\}", rest)
    if pairs:
        return 2
    return num_devices


def _collective_bytes(instruction: _Instruction, shapes: dict[str, str], num_devices: int) -> float:
    """Bytes one device sends for one execution, by the bandwidth-optimal (ring) algorithm."""
    kind = instruction.op.removesuffix("-start")
    n = _group_size(instruction.rest, num_devices)
    if kind == "collective-permute":
        operand = shapes.get(_operands(instruction.rest)[0], instruction.shape)
        return shape_bytes(operand)
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2.0 * (n - 1) / n * shape_bytes(instruction.shape)
    if kind == "all-gather":
        return (n - 1) / n * shape_bytes(instruction.shape)
    operand = shapes.get(_operands(instruction.rest)[0], instruction.shape)
    return (n - 1) / n * shape_bytes(operand)  # reduce-scatter, all-to-all: the input is split


@dataclasses.dataclass
class ProgramCost:
    """Per device and per execution of the program."""

    flops: float
    """Multiply-adds x 2 of every dot and convolution, loops counted in full."""
    collective_bytes: dict[str, float]
    """Bytes sent per collective kind (ring algorithm)."""
    collective_counts: dict[str, int]
    elementwise_bytes: float = 0.0
    """Bytes read and written by every instruction outside the matmuls and collectives (`elementwise_bytes`)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return json.dumps(self.to_dict())


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of a compiled program."""

    kind: str
    """all-reduce, all-gather, reduce-scatter, collective-permute or all-to-all (async or not)."""
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    """(dtype, dims) of every array in its result (a combined collective has several; an async
    start's result holds its operands too)."""
    times: int
    """Executions per execution of the program (the trip counts of the loops around it)."""


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of a compiled program (`compiled.as_text()`) that runs, with its result shapes."""
    computations, entry = _parse(hlo_text)
    multiplier = _multipliers(computations, entry)
    found = []
    for name, computation in computations.items():
        for instruction in computation.instructions:
            kind = instruction.op.removesuffix("-start")
            if kind in COLLECTIVES and multiplier.get(name, 0):
                shapes = tuple((dtype, tuple(int(d) for d in dims.split(",") if d))
                               for dtype, dims in _SHAPE.findall(instruction.shape) if _dtype_bytes(dtype) is not None)
                found.append(Collective(kind, shapes, multiplier[name]))
    return found


def program_cost(hlo_text: str, num_devices: int) -> ProgramCost:
    """FLOPs and collective bytes of one device's compiled program (`compiled.as_text()`)."""
    computations, entry = _parse(hlo_text)
    multiplier = _multipliers(computations, entry)
    flops = 0.0
    sent: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for name, computation in computations.items():
        times = multiplier.get(name, 0)
        if not times:
            continue
        for instruction in computation.instructions:
            if instruction.op == "dot":
                flops += times * _dot_flops(instruction, computation.shapes)
            elif instruction.op == "convolution":
                flops += times * _convolution_flops(instruction, computation.shapes)
            kind = instruction.op.removesuffix("-start")
            if kind in COLLECTIVES:
                sent[kind] += times * _collective_bytes(instruction, computation.shapes, num_devices)
                counts[kind] += times
    return ProgramCost(flops, dict(sent), dict(counts), elementwise_bytes(hlo_text))


_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
               "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency"}
_MATMULS = {"dot", "convolution", "custom-call"}
_SLICES = {"dynamic-slice", "slice"}


def _control_flow(computations: dict[str, _Computation], entry: str) -> dict[str, int]:
    """The computations that run as a program's own steps (the entry, loop bodies and conditions,
    branches, calls; not fused computations or reducers), with how many times each runs."""
    times = {entry: 1}
    order = [entry]
    while order:
        name = order.pop(0)
        for instruction in computations[name].instructions:
            if instruction.op not in ("while", "conditional", "call"):
                continue
            trips = _trip_count(instruction.rest) if instruction.op == "while" else 1
            for kind, targets in _CALLED.findall(instruction.rest):
                for target in (t.strip(" {}%") for t in targets.split(",")):
                    if target in computations and kind != "condition":
                        times[target] = times.get(target, 0) + times[name] * trips
                        order.append(target)
    return times


def _fused_traffic(fused: _Computation, operand_shapes: list[str], result: str) -> float:
    """Bytes a fusion moves: each operand whole, except one read only through slices (the slices'
    bytes) and the buffer a root dynamic-update-slice writes in place (only the update counts)."""
    users: dict[str, list[_Instruction]] = defaultdict(list)
    for instruction in fused.instructions:
        for operand in _operands(instruction.rest):
            users[operand].append(instruction)
    root = fused.instructions[-1] if fused.instructions else None
    roots = [fused.instructions[-1]] if root is not None and root.op != "tuple" else [
        i for i in fused.instructions if root is not None and i.name in _operands(root.rest)]
    in_place = {_operands(r.rest)[0] for r in roots if r.op == "dynamic-update-slice"}
    written = sum(shape_bytes(fused.shapes.get(_operands(r.rest)[1], "")) if r.op == "dynamic-update-slice"
                  else shape_bytes(r.shape) for r in roots) if root is not None else shape_bytes(result)
    read = 0.0
    parameters = {int(i.rest.split(")")[0]): i.name for i in fused.instructions if i.op == "parameter"}
    for index, shape in enumerate(operand_shapes):
        name = parameters.get(index)
        uses = users.get(name, [])
        if name in in_place and all(u.op == "dynamic-update-slice" for u in uses):
            continue
        if uses and all(u.op in _SLICES and _operands(u.rest)[0] == name for u in uses):
            read += sum(shape_bytes(u.shape) for u in uses)
        else:
            read += shape_bytes(shape)
    return read + written


def elementwise_bytes(hlo_text: str) -> float:
    """HBM bytes one device's program reads and writes outside its matmuls and collectives: every
    instruction of the entry, its loops (times their trip counts) and branches, a fusion counted as
    one (its operands and results; what it computes inside stays on chip), a slice by the bytes it
    takes, an in-place dynamic-update-slice by its update. This is the traffic the planner prices
    as time outside the matmuls (`formulas.activation_traffic_bytes`)."""
    computations, entry = _parse(hlo_text)
    total = 0.0
    for name, times in _control_flow(computations, entry).items():
        computation = computations[name]
        for instruction in computation.instructions:
            op = instruction.op.removesuffix("-start")
            if op in _NO_TRAFFIC or op in _MATMULS or op in COLLECTIVES or instruction.op.endswith("-done"):
                continue
            operands = [computation.shapes.get(o, "") for o in _operands(instruction.rest)]
            if op == "fusion":
                called = re.search(r"calls=%?([\w.\-]+)", instruction.rest)
                fused = computations.get(called.group(1)) if called else None
                if fused is None or any(i.op in _MATMULS for i in fused.instructions):
                    continue
                total += times * _fused_traffic(fused, operands, instruction.shape)
            elif op == "dynamic-update-slice":
                total += times * 2 * shape_bytes(operands[1])
            elif op in _SLICES:
                total += times * 2 * shape_bytes(instruction.shape)
            else:
                total += times * (sum(shape_bytes(o) for o in operands) + shape_bytes(instruction.shape))
    return total
