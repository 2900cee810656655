"""The training loop: resume, step, log, evaluate, checkpoint, stop cleanly on SIGTERM."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm
from triskele.mesh import host_to_global, process_rows
from triskele.mesh.distributed import barrier
from triskele.mesh.schedule import bubble_fraction, schedule_iterations
from triskele.train.auto_mesh import resolve_auto_mesh
from triskele.train.backbone import vit_config
from triskele.train.bookkeeping.compile_cache import enable_compilation_cache
from triskele.train.bookkeeping.lock import WorkdirLock
from triskele.train.bookkeeping.logs import PendingMetrics, RunLog, Skipped, first_nonfinite
from triskele.train.bookkeeping.plots import write_plots
from triskele.train.bookkeeping.profiling import ProfileWindow
from triskele.train.bookkeeping.stop import StopRequest
from triskele.train.bookkeeping.throughput import StepThroughput
from triskele.train.checkpoints.manager import Checkpoints
from triskele.train.checkpoints.resume_check import check_resume
from triskele.train.config.schema import Config
from triskele.train.data.bad_records import count_bad_records, tolerant
from triskele.train.data.pipeline import train_batches
from triskele.train.evaluator import scalar_metrics
from triskele.train.precision import fp8_note
from triskele.train.run import RunParts, prepare
from triskele.train.state import TrainState
from triskele.train.weights.pretrained import load_pretrained, resolve_norm_eps


@dataclasses.dataclass
class TrainSummary:
    workdir: str
    first_step: int
    final_step: int
    last_loss: float | None
    stopped_by: str
    """'completed', 'interrupted' (Ctrl-C), 'sigterm', 'stop_after_step', or 'nothing to do' (already at
    run.steps)."""
    checkpoint_dir: str
    metrics_file: str
    eval_metrics: dict[str, Any]


def train(
    config: Config,
    workdir: str | Path | None = None,
    progress: bool = True,
    mesh: Mesh | None = None,
    stop_after_step: int | None = None,
) -> TrainSummary:
    """Trains `config` in `workdir` (default runs/<preset>), resuming from its latest checkpoint.

    Evaluations report the domain's metrics (its spec's evaluator: e.g. mars mIoU, deepfake AUC,
    merch top-1); `mesh` replaces the one `config.mesh` describes (e.g. a subset of devices);
    `stop_after_step` stops and checkpoints at that global step as a preemption would, so that a
    later call resumes the same trajectory.
    """
    if config.model.quantization is not None:
        raise ValueError(f"this config has model.quantization={config.model.quantization!r}: a quantized checkpoint "
                         "is for evaluation and prediction; train from the float checkpoint it was made from")
    enable_compilation_cache(config.run.compilation_cache)
    resolve_norm_eps(config)
    workdir = Path(workdir or Path("runs") / config.preset).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    single = jax.process_count() == 1
    stop = StopRequest("training", "finishing this step, then saving a checkpoint and stopping",
                       sigterm=single, forward_sigint_as_sigterm=not single)
    with stop, WorkdirLock(workdir, enabled=jax.process_index() == 0):
        parts = prepare(config, mesh, resolve_auto_mesh)
        checkpoints = Checkpoints(workdir / "checkpoints", config.checkpoint)
        log = RunLog(workdir)
        try:
            _check_saved_configs(config, checkpoints)  # before config.json is rewritten or anything restored
            if jax.process_index() == 0:
                config.save(workdir / "config.json")
            return _train(parts, workdir, checkpoints, log, progress, stop_after_step, stop)
        finally:
            try:
                checkpoints.close()
            finally:
                log.close()


def _check_saved_configs(config: Config, checkpoints: Checkpoints) -> None:
    """ConfigChanged (exit 2) if `config` changes a key that sets shapes, state dtypes or the data order
    from any checkpoint's own config; before anything is restored, moved aside or written. A checkpoint
    whose config does not read is left to the restore, which moves it aside as damaged."""
    for step in sorted(checkpoints.all_steps(), reverse=True):
        try:
            saved = checkpoints.restore_config(step)
        except ValueError:
            continue
        check_resume(saved, config, step, checkpoints.directory)


def _restore_or_init(parts: RunParts, checkpoints: Checkpoints) -> TrainState:
    """The newest checkpoint that restores (corrupt newer ones are moved aside), else a fresh state."""
    restored = checkpoints.restore_newest(parts.abstract_state())
    if restored is None:
        state = parts.init_state()
        init_from = parts.config.model.init_from
        return state if init_from is None else load_pretrained(state, vit_config(parts.config), init_from)
    state, data_state, step = restored
    if int(data_state["next_step"]) != int(state.step):
        raise ValueError(
            f"checkpoint {step} in {checkpoints.directory} is inconsistent: its data iterator is at step "
            f"{data_state['next_step']} but its model at step {int(state.step)}"
        )
    return state


def _pipeline_schedule(parts: RunParts) -> dict[str, float | int | str]:
    """Schedule, P, v, M, iterations and bubble fraction of the run's pipeline ({} without one)."""
    stages = parts.mesh.shape["pipeline"]
    if stages == 1:
        return {}
    pipeline = parts.config.pipeline
    counts = (stages, pipeline.repeats, pipeline.microbatches, pipeline.schedule)
    return {"schedule": pipeline.schedule, "stages": stages, "repeats": pipeline.repeats,
            "microbatches": pipeline.microbatches, "iterations": schedule_iterations(*counts),
            "bubble": bubble_fraction(*counts)}


class _Events:
    """What the loop does at its event steps (check, log, evaluate, save), one method each; the loop
    itself only steps and decides which events are due."""

    def __init__(self, parts: RunParts, workdir: Path, checkpoints: Checkpoints, log: RunLog,
                 summary: TrainSummary):
        config = parts.config
        self.parts, self.checkpoints, self.log, self.summary = parts, checkpoints, log, summary
        self.evaluator = parts.domain.evaluator(parts, False)
        self.config_dict = config.to_dict()
        self.bad_records = workdir / "bad_records.txt"
        self.eval_source = tolerant(parts.domain.open_split(config, config.data.eval_split), config.data.bad_records,
                                    config.data.eval_split, self.bad_records)
        self.schedule = _pipeline_schedule(parts)
        self.throughput = StepThroughput(parts)
        self.skipping = Skipped(config.run.max_skipped_steps) if config.run.on_nonfinite == "skip" else None
        self.interval_losses: list[float] = []
        self.restart_clock(int(summary.final_step))

    def restart_clock(self, step: int) -> None:
        """images/s counts the steps after `step` over the seconds from now (compilation before it not
        counted; `evaluate` takes its own seconds out); so does the input wait."""
        self.last_log_time, self.last_log_step = time.perf_counter(), step
        self.input_wait = 0.0
        """Seconds of this interval the host waited for the next batch (a starved run's share nears 1)."""

    def after_step(self, done: int, state: TrainState, records: list[tuple[int, dict[str, float]]], due: _Due,
                   bar: tqdm) -> None:
        """The events `due` after step `done`, its metrics (`records`) fetched: the only host sync, so
        that no state is saved before its loss is seen."""
        self.check_finite(records)
        self.summary.final_step, self.summary.last_loss = done, records[-1][1]["loss"]
        self.interval_losses += [m["loss"] for _, m in records if math.isfinite(m["loss"])]
        if due.log:
            self.log_step(done, records, bar)
        eval_metrics = self.evaluate(done, state, bar) if due.evaluate else None
        if due.save:
            self.save(done, state, eval_metrics)

    def check_finite(self, records: list[tuple[int, dict[str, float]]]) -> None:
        """Stops the run (FloatingPointError) on a non-finite step, or on too many skipped in a row."""
        config, skipping = self.parts.config, self.skipping
        bad = first_nonfinite(records) if skipping is None else skipping.update(records)
        if bad is None:
            return
        self.checkpoints.wait()
        if skipping is not None:
            raise FloatingPointError(
                f"{skipping.streak} steps in a row up to step {bad[0]} had a non-finite loss or gradient and were "
                f"skipped (run.max_skipped_steps={config.run.max_skipped_steps}); stopped. The checkpoints hold "
                "the state before them; lower optim.lr, or look for bad data")
        latest = self.checkpoints.latest_step()
        kept = (f"The last good checkpoint is step {latest} in {self.checkpoints.directory}" if latest is not None
                else "No checkpoint was saved before it")
        raise FloatingPointError(
            f"non-finite loss ({bad[1]['loss']}) or gradient norm ({bad[1]['grad_norm']}) at step {bad[0]}; "
            f"stopped. {kept}; lower optim.lr or raise optim.warmup_steps"
        )

    def log_step(self, done: int, records: list[tuple[int, dict[str, float]]], bar: tqdm) -> None:
        """One metrics.jsonl/TensorBoard record: the last step's metrics, the interval's mean loss, speed."""
        batch_size = self.parts.config.data.global_batch
        now = time.perf_counter()
        seconds = max(now - self.last_log_time, 1e-9)
        steps_timed = done - self.last_log_step
        waiting = min(self.input_wait / seconds, 1.0)
        self.restart_clock(done)
        losses = self.interval_losses
        self.log.write({"step": done, **records[-1][1],
                        "loss_mean": float(np.mean(losses)) if losses else float("nan"),
                        "input_wait_fraction": waiting,
                        **(self.skipping.record() if self.skipping else {}),
                        "images_per_sec": batch_size * steps_timed / seconds,
                        **self.throughput.record(seconds / steps_timed),
                        **({"pipeline_bubble": self.schedule["bubble"]} if self.schedule else {})})
        bar.set_postfix(loss=f"{self.summary.last_loss:.4f}", img_s=f"{batch_size * steps_timed / seconds:.0f}",
                        input_wait=f"{waiting:.0%}")
        self.interval_losses = []

    def evaluate(self, done: int, state: TrainState, bar: tqdm) -> dict[str, float]:
        """The evaluation split's metrics, logged and plotted; the progress bar says it is evaluating."""
        config = self.parts.config
        started = time.perf_counter()
        bar.set_description_str(f"evaluating on {config.data.eval_split} ({len(self.eval_source)} records)")
        totals = self.evaluator.accumulate(state.params, self.eval_source)
        bar.set_description_str("")
        metrics = scalar_metrics(self.evaluator, totals)
        if config.data.bad_records == "skip":
            metrics["bad_records"] = count_bad_records(self.bad_records, "train")
            metrics["eval_unreadable"] = int(totals.get("unreadable", 0))
        self.summary.eval_metrics = metrics
        self.log.write({"step": done, **metrics})
        if self.log.enabled:
            write_plots(self.log.workdir)
        self.last_log_time += time.perf_counter() - started  # the interval's steps stay counted, its evaluation not
        return metrics

    def save(self, done: int, state: TrainState, eval_metrics: dict[str, float] | None) -> None:
        self.checkpoints.save(done, state, {"next_step": done}, self.config_dict, eval_metrics)


def _resume(parts: RunParts, workdir: Path, checkpoints: Checkpoints, log: RunLog) -> tuple[TrainState, TrainSummary]:
    """The state to continue from (the latest checkpoint, or a fresh one) and the run's summary so far."""
    state = _restore_or_init(parts, checkpoints)
    first = int(state.step)
    moved = log.start(first)
    if moved:
        print(f"resuming at step {first}: {moved} log records of later steps (from a run stopped before its next "
              f"checkpoint) moved to {log.dropped.name}", flush=True)
    return state, TrainSummary(
        workdir=str(workdir), first_step=first + 1, final_step=first, last_loss=None,
        stopped_by="nothing to do", checkpoint_dir=str(checkpoints.directory),
        metrics_file=str(log.path), eval_metrics={},
    )


def _train_batches(parts: RunParts, first: int, bad_records: Path):
    """This process's rows of every global batch from step `first` on, in the run's global order."""
    config, batch_size = parts.config, parts.config.data.global_batch
    source = tolerant(parts.domain.open_split(config, "train"), config.data.bad_records, "train", bad_records)
    return train_batches(source, batch_size, config.run.seed, first, config.run.steps,
                         process_rows(parts.mesh, batch_size), threads=config.data.threads,
                         prefetch=config.data.prefetch, workers=config.data.workers)


@dataclasses.dataclass(frozen=True)
class _Due:
    """What is due after a step: a log line, an evaluation, a save, a stop (and why)."""

    log: bool
    evaluate: bool
    save: bool
    stopped_by: str | None

    @classmethod
    def after(cls, done: int, config: Any, checkpoints: Checkpoints, stop_request: StopRequest,
              stop_after_step: int | None) -> _Due:
        total, every = config.run.steps, config.run.eval_every
        preempted = jax.process_count() > 1 and checkpoints.manager.reached_preemption(done)
        signalled = stop_request.requested and jax.process_count() == 1  # else: preempted, agreed on by all
        stopped = signalled or preempted or done == stop_after_step
        stopped_by = None if not stopped else "interrupted" if stop_request.interrupted else (
            "sigterm" if signalled or preempted else "stop_after_step")
        return cls(log=done % config.run.log_every == 0 or done == total,
                   evaluate=bool(every) and (done % every == 0 or done == total),
                   save=stopped_by is not None or done % config.checkpoint.every == 0 or done == total,
                   stopped_by=stopped_by)


def _train(
    parts: RunParts,
    workdir: Path,
    checkpoints: Checkpoints,
    log: RunLog,
    progress: bool,
    stop_after_step: int | None,
    stop_request: StopRequest,
) -> TrainSummary:
    config, mesh = parts.config, parts.mesh
    total, batch_size = config.run.steps, config.data.global_batch
    state, summary = _resume(parts, workdir, checkpoints, log)
    first = summary.final_step
    if first >= total:
        return summary

    events = _Events(parts, workdir, checkpoints, log, summary)
    batches = _train_batches(parts, first, events.bad_records)
    if log.enabled:
        _announce(parts, first, workdir, events.schedule)
    train_step = None
    pending = PendingMetrics()
    profile = ProfileWindow(config.run.profile_steps, total, workdir / "profile")
    bar = tqdm(total=total, initial=first, disable=not progress or not log.enabled, unit="step", dynamic_ncols=True)
    with jax.set_mesh(mesh), profile:
        for step in range(first, total):
            asked = time.perf_counter()
            rows = next(batches)
            events.input_wait += time.perf_counter() - asked
            batch = host_to_global(rows, mesh, batch_size)
            if train_step is None:
                train_step = _compiled(events, batch, first, log)
            profile.before(step + 1)
            state, metrics = train_step(state, batch)
            done = step + 1
            profile.after(done, state)
            pending.add(done, metrics)
            bar.update(1)
            due = _Due.after(done, config, checkpoints, stop_request, stop_after_step)
            if due.log or due.evaluate or due.save:
                events.after_step(done, state, pending.fetch(), due, bar)
            if due.stopped_by:
                checkpoints.wait()
                summary.stopped_by = due.stopped_by
                break
        else:
            summary.stopped_by = "completed"
    bar.close()
    if log.enabled:
        write_plots(workdir)
    return summary


def _compiled(events: _Events, batch: Any, first: int, log: RunLog) -> Any:
    """The train step compiled for `batch`, every process past its compilation before the first collective."""
    train_step = events.throughput.compile(batch)
    barrier(f"compiled-{first}")  # before the first collective runs (`barrier`)
    if log.enabled:
        print(events.throughput.describe(), flush=True)
    events.restart_clock(first)
    return train_step


def _announce(parts: RunParts, first: int, workdir: Path, schedule: dict[str, float | int | str]) -> None:
    """What the run will do and where its outputs go, before it compiles; the FP8 emulation and
    pipeline schedule notes."""
    config, mesh = parts.config, parts.mesh
    shape = ",".join(f"{axis}={size}" for axis, size in mesh.shape.items() if size > 1) or "one device"
    kinds = sorted({device.platform for device in mesh.devices.flat})
    start = f"resuming at step {first + 1}" if first else "from step 1"
    every = config.run.eval_every
    evaluation = (f"evaluating on {config.data.eval_split} every {every} steps and at the end" if every
                  else "no evaluation")
    devices = f"{mesh.devices.size} {'/'.join(kinds)} device{'s' if mesh.devices.size > 1 else ''}"
    print(f"training {config.preset} ({config.domain}) in {workdir}: {start} to {config.run.steps}, "
          f"global batch {config.data.global_batch}, mesh {shape} ({devices}); "
          f"{evaluation}; checkpoints every {config.checkpoint.every} steps in {workdir / 'checkpoints'}, "
          f"metrics in {workdir / 'metrics.jsonl'}, plots in {workdir / 'plots'}", flush=True)
    note = fp8_note(config.precision)
    if note:
        print(note, flush=True)
    if schedule:
        print("pipeline: " + ", ".join(f"{k}={v}" for k, v in schedule.items()), flush=True)
