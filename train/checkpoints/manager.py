"""Orbax checkpoints in WORKDIR/checkpoints/<step>/: state, data-iterator state and config.

Saves are asynchronous; the last `keep` checkpoints and the best one by an eval metric are kept.
Restoring into target shardings reshards, so a checkpoint restores onto any mesh.

A relaunch whose config changes what a checkpoint's state is (shapes, dtypes, the data order) is
refused before restoring, nothing moved (`triskele.train.checkpoints.resume_check`). A checkpoint that does not
restore (no commit marker, truncated or garbled files) is moved aside to
`checkpoints/corrupt-<step>/` when training starts, and the newest one that restores is used; a
read-only user (evaluation) gets a clear error naming the newest step that does restore instead,
and nothing is moved. A save that fails (disk full, permissions) stops the run with
`CheckpointSaveError`; Orbax writes into a temporary folder and renames it when complete, so the
checkpoints before it stay intact.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies
from triskele.train.config.schema import CheckpointConfig
from triskele.train.state import TrainState

COMMIT_MARKER = "commit_success.txt"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the run stops, the earlier checkpoints are intact."""


def _reason(err: BaseException) -> str:
    """A one-line reason; the operating system's own words first where TensorStore names an errno."""
    text = " ".join(str(err).split()).split(" See full TensorStore details")[0]
    named = re.search(r"os_error_code='(\d+)'", text)
    errno = int(named.group(1)) if named else getattr(err, "errno", None)
    if errno:
        text = f"{os.strerror(errno)}: {text}"
    if len(text) > 320:  # keep both ends: what failed, and the system's reason (e.g. 'File too large')
        text = f"{text[:160]} ... {text[-160:]}"
    return f"{type(err).__name__}: {text}"


def _writing(cfg: CheckpointConfig) -> ocp.CheckpointManagerOptions:
    """Asynchronous saves; the last `cfg.keep` and the best by `cfg.best_metric` kept."""
    keep = [
        policies.LatestN(n=cfg.keep),
        policies.BestN(
            get_metric_fn=lambda metrics: metrics[cfg.best_metric],
            reverse=cfg.best_mode == "min",
            n=1,
            keep_checkpoints_without_metrics=False,
        ),
    ]
    return ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(keep),
        enable_async_checkpointing=True,
        save_interval_steps=1,
    )


def _reading() -> ocp.CheckpointManagerOptions:
    """A manager that only restores: it creates no folder, and as it never saves it never deletes a
    checkpoint (`Checkpoints.save` refuses a reader). Not Orbax's `read_only`, which only skips saves
    and deletes, and logs a warning ('Given directory is read only') on every open."""
    return ocp.CheckpointManagerOptions(create=False, enable_async_checkpointing=False)


class Checkpoints:
    """The run's checkpoints; `read_only`: for evaluation and inference, which never save or move one."""

    def __init__(self, directory: str | Path, cfg: CheckpointConfig, read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.best_metric = cfg.best_metric
        self.read_only = read_only
        self.manager = ocp.CheckpointManager(self.directory, options=_reading() if read_only else _writing(cfg))
        self.saving: int | None = None
        self.failed = False

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(
        self,
        step: int,
        state: TrainState,
        data_state: dict[str, Any],
        config: dict[str, Any],
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Starts an asynchronous save (a no-op if `step` is already saved). A failure of this save
        or of the previous one raises CheckpointSaveError."""
        if self.read_only:
            raise ValueError(f"checkpoints in {self.directory} were opened read-only (for evaluation); "
                             "saving needs Checkpoints(..., read_only=False)")
        if step in self.manager.all_steps():
            return
        if metrics is not None and self.best_metric not in metrics:
            metrics = None
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        try:
            self.manager.save(step, args=args, metrics=metrics, force=True)
        except Exception as err:  # Orbax reports I/O failures as whatever its backend raised
            raise self._save_error(self.saving if self.saving is not None else step, err) from None
        self.saving = step

    def _save_error(self, step: int | None, err: BaseException) -> CheckpointSaveError:
        self.failed = True
        kept = sorted(p.name for p in self.directory.iterdir() if p.name.isdigit()) if self.directory.is_dir() else []
        return CheckpointSaveError(
            f"saving checkpoint step {step} in {self.directory} failed ({_reason(err)}); the run stopped. "
            f"Checkpoints written before it are intact: {', '.join(kept) or 'none'}. Free disk space or fix the "
            "folder's permissions, then run the same command again to resume")

    def problem(self, step: int) -> str | None:
        """Why checkpoint `step` is incomplete, found without reading it (None: looks whole)."""
        if not (self.directory / str(step) / COMMIT_MARKER).is_file():
            return f"no {COMMIT_MARKER}: the save of step {step} never completed"
        return None

    def restore(self, step: int, target: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Restores `step` into `target` (ShapeDtypeStructs with the shardings wanted); a ValueError
        naming the step and the reason when it does not restore."""

        def read(step: int) -> tuple[TrainState, dict[str, Any]]:
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
            return restored["state"], restored["data"]

        return self._read(step, read)

    def restore_params(self, step: int, target: Any) -> Any:
        """Only the parameters of checkpoint `step` (no optimizer moments: a third of the memory),
        restored into `target` (ShapeDtypeStructs with the shardings wanted)."""
        item = {"params": target}
        restore_args = jax.tree.map(lambda leaf: ocp.ArrayRestoreArgs(sharding=leaf.sharding), item)

        def read(step: int) -> Any:
            restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=item, restore_args=restore_args, partial_restore=True)))
            return restored["state"]["params"]

        return self._read(step, read)

    def restore_config(self, step: int) -> dict[str, Any]:
        """The config saved with checkpoint `step`."""
        return self._read(step, lambda step: self.manager.restore(
            step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"])

    def _check_saved(self, step: int) -> None:
        """A ValueError listing the steps saved when `step` is not one of them."""
        steps = sorted(self.all_steps())
        if step not in steps:
            listed = ", ".join(map(str, steps)) if steps else "none"
            raise ValueError(f"checkpoint step {step} was never saved in {self.directory}; steps saved there: "
                             f"{listed}. Pass one of them as --step, or leave --step out for the latest")

    def _read(self, step: int, read: Callable[[int], Any]) -> Any:
        """`read(step)`; a ValueError naming the step and why it does not restore, and (read-only: nothing
        is moved aside) the newest step before it that does."""
        self._check_saved(step)
        try:
            return self._attempt(step, read)
        except ValueError as err:
            if not self.read_only:
                raise
            readable = self._newest_readable(step, read)
            hint = (f"the newest step that restores is {readable}: pass --step {readable}" if readable is not None
                    else "no step before it restores either")
            raise ValueError(f"{str(err).rstrip('.')}; {hint}") from None

    def _attempt(self, step: int, read: Callable[[int], Any]) -> Any:
        reason = self.problem(step)
        if reason is None:
            try:
                return read(step)
            except Exception as err:  # TensorStore, JSON and Orbax errors alike mean: does not restore
                reason = _reason(err)
        raise ValueError(f"checkpoint step {step} in {self.directory} cannot be restored: {reason}")

    def _newest_readable(self, before: int, read: Callable[[int], Any]) -> int | None:
        for step in sorted((s for s in self.all_steps() if s < before), reverse=True):
            try:
                self._attempt(step, read)
                return step
            except ValueError:
                continue
        return None

    def restore_newest(self, target: TrainState) -> tuple[TrainState, dict[str, Any], int] | None:
        """The newest checkpoint that restores (None if there is none at all). Each newer one that
        does not is moved aside to corrupt-<step>/ with a warning; if none restores, a ValueError
        lists what was tried."""
        if self.read_only:
            raise ValueError("restore_newest moves corrupt checkpoints aside; "
                             "it needs Checkpoints(..., read_only=False)")
        tried = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                state, data = self.restore(step, target)
                return state, data, step
            except ValueError as err:
                tried.append(str(err))
                self._move_aside(step, str(err))
        if tried:
            raise ValueError(f"no checkpoint in {self.directory} restores (each was moved to corrupt-<step>/): "
                             + "; ".join(tried) + ". Delete the folder to start over")
        return None

    def _move_aside(self, step: int, reason: str) -> None:
        target = self.directory / f"corrupt-{step}"
        suffix = 1
        while target.exists():
            target, suffix = self.directory / f"corrupt-{step}.{suffix}", suffix + 1
        if jax.process_index() == 0:
            (self.directory / str(step)).rename(target)
            print(f"warning: {reason}; moved it to {target} and trying the one before", file=sys.stderr, flush=True)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"triskele-corrupt-{step}")
        self.manager.reload()

    def wait(self) -> None:
        """Waits for the save in flight; CheckpointSaveError if it failed."""
        try:
            self.manager.wait_until_finished()
        except Exception as err:
            raise self._save_error(self.saving, err) from None
        self.saving = None

    def close(self) -> None:
        try:
            if not self.failed:  # a failed save was reported already; closing must not report it twice
                self.wait()
        finally:
            try:
                self.manager.close()
            except Exception:
                if not self.failed:
                    raise
