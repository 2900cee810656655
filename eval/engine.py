"""The streaming predictor: inputs on disk -> a domain's outputs on disk, for every domain.

A domain says how to read one input into model records and how to write one input's result
(`PredictIO`); the engine does the rest, the same for all: inputs read and preprocessed ahead in
Grain threads or worker processes (memory bounded by the prefetch depth, never by the number of
inputs), records packed into fixed-size batches sharded over the local devices, the next batch
dispatched before the previous one's outputs are fetched, each finished input handed to a
background writer. An input whose result is already recorded is skipped (a rerun finishes what a
killed job left); an unreadable input is listed in errors.csv and the rest go on. With several
processes each reads and writes only its share of the inputs; process 0 writes the summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import grain
import jax
import numpy as np
from tqdm import tqdm
from triskele.mesh.chunks import run_groups
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.data.pipeline import prefetched

STATE_DIR = ".triskele-predict"
"""Under the output folder: one JSON per finished input (its result row) and per unreadable one."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """One input: a file, or a group of files read together (a video's frames)."""

    key: str
    """Its name under the input root (folders kept); outputs are named after it."""
    paths: tuple[Path, ...]


class PredictIO(Protocol):
    """How a domain reads one input and writes one result."""

    suffixes: tuple[str, ...]

    def units(self, root: Path, files: list[Path]) -> list[Unit]:
        """The inputs found under `root` (e.g. frames grouped into videos)."""
        ...

    def read(self, unit: Unit) -> tuple[np.ndarray, Any]:
        """(model records (n, ...), context for the writer); ValueError naming the file if unreadable."""
        ...

    def write(self, unit: Unit, context: Any, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        """Writes the unit's own files (atomically) and returns its result row (JSON-able)."""
        ...

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        """Files made from every input's row (e.g. a CSV), written once at the end by process 0."""
        ...


class Journal:
    """OUT/.triskele-predict/{rows,errors}/<hash of the unit's key>.json."""

    def __init__(self, out_dir: Path):
        self.rows, self.errors = out_dir / STATE_DIR / "rows", out_dir / STATE_DIR / "errors"

    @staticmethod
    def _name(unit: Unit) -> str:
        return hashlib.sha1(unit.key.encode()).hexdigest()[:20] + ".json"

    def done(self, unit: Unit) -> bool:
        return (self.rows / self._name(unit)).is_file()

    def row(self, unit: Unit) -> dict[str, Any] | None:
        path = self.rows / self._name(unit)
        return json.loads(path.read_text()) if path.is_file() else None

    def error(self, unit: Unit) -> str | None:
        path = self.errors / self._name(unit)
        return json.loads(path.read_text())["reason"] if path.is_file() else None

    def record(self, unit: Unit, row: dict[str, Any]) -> None:
        write_atomically(self.rows / self._name(unit), json.dumps(row).encode())
        (self.errors / self._name(unit)).unlink(missing_ok=True)

    def record_error(self, unit: Unit, reason: str) -> None:
        write_atomically(self.errors / self._name(unit), json.dumps({"input": unit.key, "reason": reason}).encode())


class _SafeRead:
    """Grain's map function (picklable): unit index -> (index, records, context, error)."""

    def __init__(self, io: PredictIO, units: Sequence[Unit]):
        self.io, self.units = io, list(units)

    def __call__(self, index: int) -> tuple[int, np.ndarray | None, Any, str | None]:
        try:
            records, context = self.io.read(self.units[index])
            return index, np.asarray(records, np.float32), context, None
        except ValueError as err:
            return index, None, None, str(err)


@dataclasses.dataclass
class Prediction:
    """One input's model outputs (its records' outputs, stacked) and the reader's context, or the
    reason it could not be read."""

    unit: Unit
    outputs: dict[str, np.ndarray] | None
    context: Any = None
    error: str | None = None


def predictions(model: Any, io: PredictIO, units: Sequence[Unit], threads: int = 4, prefetch: int = 8,
                workers: int = 0) -> Iterator[Prediction]:
    """Every input through the model, streamed: read ahead in Grain threads or workers, records
    packed into the model's batches; each input's `Prediction` as soon as its last record is out."""
    units = list(units)
    dataset = grain.MapDataset.source(range(len(units))).map(_SafeRead(io, units))
    reads = prefetched(dataset, threads, prefetch, workers) if units else iter(())
    unreadable: list[Prediction] = []

    def groups() -> Iterator[tuple[tuple[int, Any], np.ndarray]]:
        for index, records, context, error in reads:
            if error is None:
                yield (index, context), records
            else:
                unreadable.append(Prediction(units[index], None, error=error))

    for (index, context), outputs in run_groups(model.dispatch, model.fetch, groups(), model.batch):
        yield from unreadable
        unreadable.clear()
        yield Prediction(units[index], outputs, context)
    yield from unreadable


def iter_predictions(model: Any, io: PredictIO, input_spec: str | Path, **options: int) -> Iterator[Prediction]:
    """For notebooks: the predictions of every input of `input_spec`, nothing written."""
    from triskele.eval.inputs import list_inputs

    return predictions(model, io, io.units(*list_inputs(input_spec, io.suffixes)), **options)


class _Writer:
    """Hands each finished input to the domain's writer in a background thread and records it."""

    def __init__(self, io: PredictIO, out_dir: Path, bar: tqdm):
        self.io, self.out_dir, self.bar, self.journal = io, out_dir, bar, Journal(out_dir)
        self.queue: queue.Queue = queue.Queue(maxsize=4)
        self.written = self.unreadable = self.records = 0
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                self.journal.record(item.unit, self.io.write(item.unit, item.context, item.outputs, self.out_dir))
                self.written += 1
            except Exception as err:  # an output that cannot be written: reported at the end, the rest go on
                self.failure = self.failure or err
                self.journal.record_error(item.unit, f"writing its output failed: {err}")
                self.unreadable += 1
            self.bar.update(1)

    def run(self, stream: Iterator[Prediction]) -> None:
        self.thread.start()
        try:
            for prediction in stream:
                if prediction.error is not None:
                    self.journal.record_error(prediction.unit, prediction.error)
                    self.unreadable += 1
                    self.bar.update(1)
                    continue
                self.records += len(next(iter(prediction.outputs.values()), ()))
                self.queue.put(prediction)
        finally:
            self.queue.put(None)
            self.thread.join()


def _gather(values: list[int]) -> list[int]:
    """Sums of per-process counts (every process calls it)."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.asarray(values))).sum(axis=0)]


def predict_files(model: Any, io: PredictIO, input_spec: str | Path, out_dir: str | Path, overwrite: bool = False,
                  threads: int = 4, prefetch: int = 8, workers: int = 0, progress: bool = True) -> dict[str, Any]:
    """Predicts every input of `input_spec` (see `triskele.eval.inputs`) into `out_dir`; returns the
    summary (also OUT/summary.json). `model` has `dispatch(records)`, `fetch(handle)` and `batch`."""
    from triskele.eval.inputs import list_inputs

    out_dir = Path(out_dir)
    root, files = list_inputs(input_spec, io.suffixes)
    units = io.units(root, files)
    mine = units[jax.process_index() :: jax.process_count()]
    journal = Journal(out_dir)
    todo = [u for u in mine if overwrite or not journal.done(u)]
    out_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), disable=not progress or jax.process_index() != 0, unit="input", dynamic_ncols=True)
    started = time.perf_counter()
    run = _Writer(io, out_dir, bar)
    run.run(predictions(model, io, todo, threads, prefetch, workers))
    seconds = time.perf_counter() - started
    bar.close()
    written, skipped, unreadable, records = _gather([run.written, len(mine) - len(todo), run.unreadable, run.records])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("triskele-predict-written")
    summary = {"inputs": len(units), "written": written, "skipped": skipped, "unreadable": unreadable,
               "records": records, "seconds": round(seconds, 3),
        "images_per_sec": round(written / seconds, 3) if seconds > 0 else 0.0,
        "records_per_sec": round(records / seconds, 3) if seconds > 0 else 0.0, "output": str(out_dir)}
    if jax.process_index() == 0:
        errors = [(u.key, reason) for u in units if (reason := journal.error(u)) is not None]
        rows = [row for u in units if (row := journal.row(u)) is not None]
        files_written = io.finish(rows, out_dir)
        _write_errors(out_dir, errors)
        summary["files"] = files_written + (["errors.csv"] if errors else [])
        write_atomically(out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        print(f"predicted {written} inputs, skipped {summary['skipped']} already done, {unreadable} unreadable "
              f"in {seconds:.1f} s ({summary['images_per_sec']:.1f} inputs/s, {summary['records_per_sec']:.1f} "
              f"model inputs/s) -> {out_dir}", flush=True)
    if run.failure is not None and jax.process_index() == 0:
        print(f"warning: some outputs could not be written: {run.failure}", flush=True)
    return summary


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    write_atomically(path, buffer.getvalue().encode())


def _write_errors(out_dir: Path, errors: list[tuple[str, str]]) -> None:
    if errors:
        write_csv(out_dir / "errors.csv", ["input", "reason"], [list(e) for e in errors])
    else:
        (out_dir / "errors.csv").unlink(missing_ok=True)
