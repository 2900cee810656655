"""Fixed-size batches for inference, one piece of code for every model behind `dispatch`/`fetch`
(a restored model, a quantized one, an exported one): inputs cut into batches of exactly the
compiled size (the last padded with zeros, its padding dropped again), and batch k+1 dispatched
before batch k's outputs are fetched, so the host waits for the device only at the end.

numpy only: serving processes import it without the models or Flax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

Item = TypeVar("Item")
Outputs = dict[str, np.ndarray]


def pad_rows(rows: np.ndarray, batch: int) -> np.ndarray:
    """`rows` (n <= batch, ...) padded with zero rows to (batch, ...)."""
    if len(rows) == batch:
        return rows
    return np.concatenate([rows, np.zeros((batch - len(rows), *rows.shape[1:]), rows.dtype)])


def overlapped(dispatch: Callable[[Item], Any], fetch: Callable[[Any], Outputs],
               items: Iterable[Item]) -> Iterator[tuple[Item, Outputs]]:
    """(item, outputs) in order; each item is dispatched before the previous one's outputs are fetched."""
    pending: tuple[Item, Any] | None = None
    for item in items:
        handle = dispatch(item)
        if pending is not None:
            yield pending[0], fetch(pending[1])
        pending = (item, handle)
    if pending is not None:
        yield pending[0], fetch(pending[1])


def run_in_batches(dispatch: Callable[[np.ndarray], Any], fetch: Callable[[Any], Outputs], inputs: np.ndarray,
                   batch: int) -> Outputs:
    """Every row of `inputs` through the model in batches of `batch`; the outputs concatenated."""
    inputs = np.asarray(inputs, np.float32)
    chunks = ((offset, min(offset + batch, len(inputs))) for offset in range(0, len(inputs), batch))
    outputs: dict[str, list[np.ndarray]] = {}
    for (start, stop), out in overlapped(lambda span: dispatch(pad_rows(inputs[span[0]:span[1]], batch)), fetch,
                                         chunks):
        for key, value in out.items():
            outputs.setdefault(key, []).append(np.asarray(value)[: stop - start])
    return {key: np.concatenate(parts) for key, parts in outputs.items()}


@dataclasses.dataclass
class _Group:
    tag: Any
    count: int
    filled: int = 0
    outputs: Outputs | None = None


def run_groups(dispatch: Callable[[np.ndarray], Any], fetch: Callable[[Any], Outputs],
               groups: Iterable[tuple[Any, np.ndarray]], batch: int) -> Iterator[tuple[Any, Outputs]]:
    """Groups of records of any size (a frame's windows, a video's frames, a shelf's facings), packed
    across groups into batches of `batch`; yields (tag, the group's outputs) as each group completes
    (in input order, but for empty groups, which complete at once). Only the groups inside the
    batches in flight are held."""
    open_groups: dict[int, _Group] = {}
    done: list[tuple[Any, Outputs]] = []

    def batches() -> Iterator[tuple[np.ndarray, list[tuple[int, int, int, int]]]]:
        rows: list[np.ndarray] = []
        spans: list[tuple[int, int, int, int]] = []  # (group, first record, end record, row in batch)
        filled = 0
        for number, (tag, records) in enumerate(groups):
            open_groups[number] = _Group(tag, len(records))
            if not len(records):
                done.append((tag, open_groups.pop(number).outputs or {}))
            start = 0
            while start < len(records):
                take = min(batch - filled, len(records) - start)
                rows.append(records[start : start + take])
                spans.append((number, start, start + take, filled))
                filled, start = filled + take, start + take
                if filled == batch:
                    yield np.concatenate(rows), spans
                    rows, spans, filled = [], [], 0
        if filled:
            yield pad_rows(np.concatenate(rows), batch), spans

    for (_, spans), outputs in overlapped(lambda b: dispatch(b[0]), fetch, batches()):
        yield from done
        done.clear()
        for number, first, end, row in spans:
            group = open_groups[number]
            if group.outputs is None:
                group.outputs = {k: np.empty((group.count, *v.shape[1:]), v.dtype) for k, v in outputs.items()}
            for key, value in outputs.items():
                group.outputs[key][first:end] = value[row : row + end - first]
            group.filled += end - first
            if group.filled == group.count:
                yield group.tag, open_groups.pop(number).outputs
    yield from done
