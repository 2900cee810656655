"""The streaming predictor: inputs on disk -> a domain's outputs on disk, for every domain.

A domain says how to read one input into model records and how to write one input's result
(`PredictIO`); the engine does the rest, the same for all: inputs read and preprocessed ahead in
Grain threads or worker processes (memory bounded by the prefetch depth, never by the number of
inputs), records packed into fixed-size batches sharded over the local devices, the next batch
dispatched before the previous one's outputs are fetched, each finished input handed to a
background writer. An input whose result is already recorded is skipped (a rerun finishes what a
killed job left), unless the input changed since (its size or modification time); OUT's manifest
records the model, its preprocessing and the options, and a rerun with others is refused unless
it overwrites. An unreadable input is listed in errors.csv and the rest go on. With several
processes each reads and writes only its share of the inputs; process 0 writes the summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
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
from triskele.train.bookkeeping.files import remove_partials, write_atomically
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.data.images import exif_note
from triskele.train.data.pipeline import prefetched

STATE_DIR = ".triskele-predict"
"""Under the output folder: the manifest, one JSON per finished input (its result row) and per
unreadable one."""
JOB_FILES = ("summary.json", "errors.csv", STATE_DIR)
"""What predict itself writes in OUT: no input's output may take one of these names."""
_JOURNAL_KEY = "_journal"
"""In a recorded row: the input files' (name, size, mtime) and the manifest's digest it was made under."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """One input: a file, or a group of files read together (a video's frames, a shelf and its plan)."""

    key: str
    """Its path under the inputs' common root (folders and suffix kept): its rows are named by it."""
    paths: tuple[Path, ...]
    stem: str = ""
    """What its outputs' names start with (`triskele.eval.inputs`): set by `file_units`."""

    def named(self, suffix: str) -> str:
        """The name under OUT of its output ending in `suffix` (e.g. '.png', '.overlay.png')."""
        return (self.stem or posixpath.splitext(self.key)[0]) + suffix


def file_units(root: Path, files: Sequence[Path]) -> list[Unit]:
    """One unit per file, keyed by its path under `root`, with its outputs' stem."""
    from triskele.eval.inputs import output_stems, relative_name

    keys = [relative_name(f, root) for f in files]
    stems = output_stems(keys)
    return [Unit(key, (f,), stems[key]) for key, f in zip(keys, files, strict=True)]


def input_units(io: PredictIO, input_spec: str | Path) -> list[Unit]:
    """The domain's units of every input of `input_spec`; two of one key are refused, naming both."""
    from triskele.eval.inputs import list_inputs

    units = io.units(*list_inputs(input_spec, io.suffixes))
    seen: dict[str, Unit] = {}
    for unit in units:
        other = seen.setdefault(unit.key, unit)
        if other is not unit:
            first, second = sorted((_where(other), _where(unit)))
            raise ValueError(f"inputs {first} and {second} would both be named {unit.key!r}; rename one of them "
                             "or predict them separately")
    return units


def _where(unit: Unit) -> str:
    """A unit's file, or the folder of its files."""
    return str(unit.paths[0] if len(unit.paths) == 1 else unit.paths[0].parent)


class PredictIO(Protocol):
    """How a domain reads one input and writes one result."""

    suffixes: tuple[str, ...]

    def units(self, root: Path, files: list[Path]) -> list[Unit]:
        """The inputs found under `root` (e.g. frames grouped into videos); ValueError, naming them,
        for two whose outputs would take one name (`triskele.eval.inputs.refuse_clashes`)."""
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


def input_stamp(unit: Unit) -> list[list[Any]]:
    """(name, size, modification time) of each of the unit's files: a changed input is predicted again."""
    stamp = []
    for path in unit.paths:
        try:
            stat = path.stat()
            stamp.append([path.name, stat.st_size, stat.st_mtime_ns])
        except OSError:  # gone since it was listed: never done, and its read reports why
            stamp.append([path.name, None, None])
    return stamp


class Journal:
    """OUT/.triskele-predict/manifest.json and {rows,errors}/<hash of the unit's key>.json."""

    def __init__(self, out_dir: Path):
        self.out_dir, self.manifest = out_dir, out_dir / STATE_DIR / "manifest.json"
        self.rows, self.errors = out_dir / STATE_DIR / "rows", out_dir / STATE_DIR / "errors"

    @staticmethod
    def _name(unit: Unit) -> str:
        return hashlib.sha1(unit.key.encode()).hexdigest()[:20] + ".json"

    def _recorded(self, unit: Unit) -> dict[str, Any] | None:
        path = self.rows / self._name(unit)
        return json.loads(path.read_text()) if path.is_file() else None

    def done(self, unit: Unit, stamp: list[list[Any]], manifest: dict[str, Any]) -> bool:
        """Recorded from these very files under this manifest."""
        recorded = self._recorded(unit)
        return recorded is not None and recorded.get(_JOURNAL_KEY) == {"inputs": stamp, "manifest": _digest(manifest)}

    def row(self, unit: Unit) -> dict[str, Any] | None:
        recorded = self._recorded(unit)
        return None if recorded is None else {k: v for k, v in recorded.items() if k != _JOURNAL_KEY}

    def check_manifest(self, manifest: dict[str, Any], overwrite: bool) -> None:
        """Refuses (ValueError naming what differs) OUT's predictions made with another model,
        preprocessing or options, unless `overwrite`."""
        if overwrite or not self.rows.is_dir() or not any(self.rows.iterdir()):
            return
        if not self.manifest.is_file():
            differences = "it records no model (written before predict recorded one)"
        else:
            saved = json.loads(self.manifest.read_text())
            differences = "; ".join(_differences(saved, manifest))
            if not differences:
                return
        raise ValueError(f"--output {self.out_dir} holds predictions made otherwise: {differences}. Predict into "
                         "another --output, or add --overwrite to predict every input again with these")

    def remove_partials(self, units: Sequence[Unit]) -> None:
        """Removes the temporary files that killed writers left (their names are random: no rerun
        writes over them) in the folders predict writes: OUT, its state folders and the folders of
        the units' outputs; a live writer's stays (`triskele.train.bookkeeping.files.remove_partials`)."""
        outputs = {(self.out_dir / unit.named("")).parent for unit in units}
        for folder in {self.out_dir, self.out_dir / STATE_DIR, self.rows, self.errors, *outputs}:
            remove_partials(folder)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_atomically(self.manifest, (json.dumps(manifest, indent=2) + "\n").encode())

    def error(self, unit: Unit) -> str | None:
        path = self.errors / self._name(unit)
        return json.loads(path.read_text())["reason"] if path.is_file() else None

    def record(self, unit: Unit, row: dict[str, Any], stamp: list[list[Any]], manifest: dict[str, Any]) -> None:
        recorded = {**row, _JOURNAL_KEY: {"inputs": stamp, "manifest": _digest(manifest)}}
        write_atomically(self.rows / self._name(unit), json.dumps(recorded).encode())
        (self.errors / self._name(unit)).unlink(missing_ok=True)

    def record_error(self, unit: Unit, reason: str) -> None:
        (self.rows / self._name(unit)).unlink(missing_ok=True)  # an earlier result of it is stale now
        write_atomically(self.errors / self._name(unit), json.dumps({"input": unit.key, "reason": reason}).encode())


class _SafeRead:
    """Grain's map function (picklable): unit index -> (index, records, context, error)."""

    def __init__(self, io: PredictIO, units: Sequence[Unit]):
        self.io, self.units = io, list(units)

    def __call__(self, index: int) -> tuple[int, np.ndarray | None, Any, str | None]:
        try:
            records, context = self.io.read(self.units[index])
            return index, np.asarray(records, np.float32), context, None
        except Exception as err:  # noqa: BLE001 - any input that cannot be read or decoded: errors.csv, the rest go on
            return index, None, None, str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"


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
    return predictions(model, io, input_units(io, input_spec), **options)


class _Writer:
    """Hands each finished input to the domain's writer in a background thread and records it."""

    def __init__(self, io: PredictIO, out_dir: Path, bar: tqdm, stamps: dict[str, list], manifest: dict[str, Any]):
        self.io, self.out_dir, self.bar, self.journal = io, out_dir, bar, Journal(out_dir)
        self.stamps, self.manifest = stamps, manifest
        self.queue: queue.Queue = queue.Queue(maxsize=4)
        self.written = self.unreadable = self.records = 0
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                row = self.io.write(item.unit, item.context, item.outputs, self.out_dir)
                if isinstance(row, dict):
                    row = {**row, **exif_note(item.unit.paths[0])}
                self.journal.record(item.unit, row, self.stamps[item.unit.key], self.manifest)
                self.written += 1
            except Exception as err:  # an output that cannot be written: reported at the end, the rest go on
                self.failure = self.failure or err
                self.journal.record_error(item.unit, f"writing its output failed: {err}")
                self.unreadable += 1
            self.bar.update(1)

    def run(self, stream: Iterator[Prediction], stop: StopRequest) -> None:
        """Writes every prediction of `stream`, or those before a stop is requested."""
        self.thread.start()
        try:
            for prediction in stream:
                if stop.requested:
                    break
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


def predict_manifest(model: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What OUT's predictions are made with: the model's identity (`identity`: a checkpoint's step and
    parameter digest, or an export's SHA-256), its domain and preprocessing, the predict options given."""
    from triskele.eval.model import input_preprocessing

    manifest = {"domain": model.meta["domain"], "model": model.identity,
                "preprocessing": input_preprocessing(model.meta), "options": options}
    return json.loads(json.dumps(manifest, default=str))


def _digest(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two manifests, in words ('stride: None -> 16')."""
    from triskele.eval.model import describe_model

    found = []
    for part in ("domain", "model", "preprocessing", "options"):
        old, new = saved.get(part), now.get(part)
        if old == new:
            continue
        if part == "model":
            found.append(f"model: {describe_model(old)} -> {describe_model(new)}")
        elif isinstance(old, dict) and isinstance(new, dict):
            found += [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
                      if old.get(key) != new.get(key)]
        else:
            found.append(f"{part}: {old!r} -> {new!r}")
    return found


def _gather(values: list[int]) -> list[int]:
    """Sums of per-process counts (every process calls it)."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.asarray(values))).sum(axis=0)]


def predict_files(model: Any, io: PredictIO, input_spec: str | Path, out_dir: str | Path, overwrite: bool = False,
                  threads: int = 4, prefetch: int = 8, workers: int = 0, progress: bool = True,
                  options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Predicts every input of `input_spec` (see `triskele.eval.inputs`) into `out_dir`; returns the
    summary (also OUT/summary.json). `model` has `dispatch(records)`, `fetch(handle)`, `batch`, `meta`
    and `identity`; `options`: the domain's predict options given, recorded in OUT's manifest. An
    OUT made with another model, preprocessing or options is refused unless `overwrite`; one that
    holds an input or lies in the tree `input_spec` lists, always (`refuse_output_among_inputs`)."""
    from triskele.eval.inputs import refuse_output_among_inputs

    out_dir = Path(out_dir)
    units = input_units(io, input_spec)
    refuse_output_among_inputs(input_spec, out_dir, (path for unit in units for path in unit.paths))
    mine = units[jax.process_index() :: jax.process_count()]
    journal = Journal(out_dir)
    if jax.process_index() == 0:
        journal.remove_partials(units)
    manifest = predict_manifest(model, options or {})
    journal.check_manifest(manifest, overwrite)
    stamps = {u.key: input_stamp(u) for u in mine}
    todo = [u for u in mine if overwrite or not journal.done(u, stamps[u.key], manifest)]
    changed = sum(journal.row(u) is not None for u in todo) if not overwrite else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        journal.write_manifest(manifest)
    bar = tqdm(total=len(todo), disable=not progress or jax.process_index() != 0, unit="input", dynamic_ncols=True)
    started = time.perf_counter()
    run = _Writer(io, out_dir, bar, stamps, manifest)
    with StopRequest("predict", "writing the inputs already predicted, then the summary; the same command "
                     "again predicts the rest") as stop:
        run.run(predictions(model, io, todo, threads, prefetch, workers), stop)
    seconds = time.perf_counter() - started
    bar.close()
    written, skipped, changed, unreadable, records = _gather([run.written, len(mine) - len(todo), changed,
                                                              run.unreadable, run.records])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("triskele-predict-written")
    summary = {"inputs": len(units), "written": written, "skipped": skipped, "changed": changed,
               "unreadable": unreadable, "records": records, "seconds": round(seconds, 3),
               "interrupted": stop.requested,
               "images_per_sec": round(written / seconds, 3) if seconds > 0 else 0.0,
               "records_per_sec": round(records / seconds, 3) if seconds > 0 else 0.0, "output": str(out_dir)}
    if jax.process_index() == 0:
        _write_summary(io, units, journal, out_dir, summary)
        _say_done(summary, stop)
    if run.failure is not None and jax.process_index() == 0:
        print(f"warning: some outputs could not be written: {run.failure}", flush=True)
    return summary


def _write_summary(io: PredictIO, units: list[Any], journal: Journal, out_dir: Path, summary: dict[str, Any]) -> None:
    """The domain's files over every input's row, errors.csv, and summary.json (with what the rows
    say: inputs turned upright by their EXIF orientation, how each was read where a domain says)."""
    errors = [(u.key, reason) for u in units if (reason := journal.error(u)) is not None]
    rows = [row for u in units if (row := journal.row(u)) is not None]
    files_written = io.finish(rows, out_dir)
    summary["turned_by_exif_orientation"] = sum("exif_orientation" in row for row in rows)
    read_as = [row["read_as"] for row in rows if "read_as" in row]
    if read_as:
        summary["read_as"] = {kind: read_as.count(kind) for kind in sorted(set(read_as))}
    _write_errors(out_dir, errors)
    summary["files"] = files_written + (["errors.csv"] if errors else [])
    write_atomically(out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())


def _say_done(summary: dict[str, Any], stop: StopRequest) -> None:
    written, skipped, unreadable = summary["written"], summary["skipped"], summary["unreadable"]
    if stop.requested:
        left = summary["inputs"] - written - skipped - unreadable
        print(f"predict stopped by {stop.signal}: {left} inputs not predicted yet; run the same command again "
              "to predict them (what is written is kept)", flush=True)
    print(f"predicted {written} inputs ({summary['changed']} changed since), skipped {skipped} already done, "
          f"{unreadable} unreadable in {summary['seconds']:.1f} s ({summary['images_per_sec']:.1f} inputs/s, "
          f"{summary['records_per_sec']:.1f} model inputs/s) -> {summary['output']}", flush=True)


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
