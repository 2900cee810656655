"""Global-order input: step s of epoch e reads records perm(seed, e)[s*B:(s+1)*B].

Each process loads only its rows of that global batch, and each record's augmentation randomness
is keyed on (seed, epoch, global index), so the iterator state is one global step counter and the
same numbers come out on any process count. Grain's random-access `MapDataset` runs the loading in
threads (or worker processes) ahead of the step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grain
import numpy as np
from absl import flags


class Source(Protocol):
    """A random-access split: `load(i, rng)` gives record i as arrays; rng None means no augmentation."""

    def __len__(self) -> int: ...

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]: ...


class RecordCache:
    """A bounded cache of rendered records that pickles empty, so Grain worker processes each
    start their own instead of failing to pickle an lru_cache."""

    def __init__(self, render: Callable[[int], Any], max_items: int):
        self.render, self.max_items = render, max(int(max_items), 1)
        self._cached = functools.lru_cache(maxsize=self.max_items)(render)

    def __call__(self, key: int) -> Any:
        return self._cached(key)

    def __getstate__(self) -> dict[str, Any]:
        return {"render": self.render, "max_items": self.max_items}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["render"], state["max_items"])


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, num_records: int, group: int = 1) -> np.ndarray:
    """The epoch's record order. With `group` > 1 (a source whose records come in groups, such as
    a real face and its self-blended twin), groups are shuffled and stay whole and in order, so a
    batch of a multiple of `group` records holds every group it touches entire."""
    order = np.random.default_rng([seed, epoch]).permutation(num_records // group)
    return (order[:, None] * group + np.arange(group)).ravel()


def steps_per_epoch(num_records: int, global_batch: int) -> int:
    if num_records < global_batch:
        raise ValueError(
            f"the training split has {num_records} records, fewer than data.global_batch={global_batch}; "
            f"lower data.global_batch to at most {num_records} or add data"
        )
    return num_records // global_batch


def stack_records(records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.stack([r[key] for r in records]) for key in records[0]}


class TrainStepLoader:
    """Global step -> this process's rows of that step's batch (picklable for Grain workers)."""

    def __init__(self, source: Source, global_batch: int, seed: int, rows: tuple[int, int]):
        self.source, self.global_batch, self.seed, self.rows = source, global_batch, seed, rows
        self.steps_per_epoch = steps_per_epoch(len(source), global_batch)
        self.group = getattr(source, "group_size", 1)
        if global_batch % self.group:
            raise ValueError(f"data.global_batch={global_batch} must be a multiple of {self.group}: this training "
                             f"split's records come in groups of {self.group} that share a batch")

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        epoch, within = divmod(int(step), self.steps_per_epoch)
        perm = epoch_permutation(self.seed, epoch, len(self.source), self.group)
        start, stop = self.rows
        indices = perm[within * self.global_batch : (within + 1) * self.global_batch][start:stop]
        records = [
            self.source.load(int(i), np.random.default_rng([self.seed, epoch, int(i)])) for i in indices
        ]
        batch = stack_records(records)
        batch["valid"] = np.ones(len(indices), np.float32)
        return batch


def train_batches(
    source: Source,
    global_batch: int,
    seed: int,
    start_step: int,
    stop_step: int,
    rows: tuple[int, int],
    threads: int = 4,
    prefetch: int = 4,
    workers: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """This process's rows of the batches of global steps [start_step, stop_step), loaded ahead."""
    loader = TrainStepLoader(source, global_batch, seed, rows)
    return prefetched(grain.MapDataset.range(start_step, stop_step).map(loader), threads, prefetch, workers)


GRAIN_HANDOVER = 4
"""Elements per worker process in Grain's hand-over to the consumer, beyond the worker's own
read-ahead: one waiting in the worker, one in its process queue, one in the consumer's buffer
for that worker and one waiting there (`per_worker_buffer_size=1`, the least Grain takes)."""


def prefetched(dataset: grain.MapDataset, threads: int, prefetch: int, workers: int) -> Iterator[Any]:
    """The dataset's elements in order, computed ahead by `threads` threads, at most `prefetch` ahead;
    with `workers` > 0 in that many worker processes, each with its own `threads` threads and
    `prefetch` read-ahead, so at most workers x (prefetch + GRAIN_HANDOVER) elements are held."""
    prefetch = max(prefetch, 1)
    # More threads than buffered elements would idle: Grain warns and runs only `prefetch` of them.
    options = grain.ReadOptions(num_threads=min(max(threads, 1), prefetch), prefetch_buffer_size=prefetch)
    iterable = dataset.to_iter_dataset(options)
    if workers > 0:
        # Grain reads an Abseil flag in its workers; a program not started by absl.app has not
        # parsed flags, which Grain <= 0.2.18 turns into UnparsedFlagAccessError (google/grain#1355).
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        # Without `options` above each worker would read ahead with Grain's defaults (16 threads,
        # 500 elements).
        iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=1))
    return iter(iterable)


def num_eval_batches(num_records: int, global_batch: int) -> int:
    return -(-num_records // global_batch)


def eval_rows(b: int, global_batch: int, rows: tuple[int, int]) -> np.ndarray:
    """The global record indices of this process's rows of evaluation batch b (past the split's end: padding)."""
    return np.arange(b * global_batch, (b + 1) * global_batch)[rows[0] : rows[1]]


class EvalBatchLoader:
    """Evaluation batch b -> this process's rows of records [b*B, (b+1)*B) (picklable for Grain
    workers); rows past the split's end are padding (record 0 again, valid 0), as is a record the
    source found unreadable (`data.bad_records=skip` notes it in `source.bad` as it loads)."""

    def __init__(self, source: Source, global_batch: int, rows: tuple[int, int]):
        self.source, self.global_batch, self.rows = source, global_batch, rows

    def __call__(self, b: int) -> dict[str, np.ndarray]:
        indices = eval_rows(b, self.global_batch, self.rows)
        valid = indices < len(self.source)
        records = [self.source.load(int(i) if ok else 0) for i, ok in zip(indices, valid, strict=True)]
        batch = stack_records(records)
        unreadable = getattr(self.source, "bad", {})
        readable = np.array([int(i) not in unreadable for i in indices], bool)  # `in`: safe while other threads add
        batch["valid"] = (valid & readable).astype(np.float32)
        return batch


def eval_batches(source: Source, global_batch: int, rows: tuple[int, int], threads: int = 4, prefetch: int = 4,
                 workers: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Every record exactly once, in order, loaded ahead as training's batches are (`prefetched`);
    the last batch is padded and its padding has valid=0, as has an unreadable record."""
    loader = EvalBatchLoader(source, global_batch, rows)
    dataset = grain.MapDataset.range(num_eval_batches(len(source), global_batch)).map(loader)
    return prefetched(dataset, threads, prefetch, workers)
