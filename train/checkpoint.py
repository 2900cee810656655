"""Orbax checkpoints in WORKDIR/checkpoints/<step>/: state, data-iterator state and config.

Saves are asynchronous; the last `keep` checkpoints and the best one by an eval metric are kept.
Restoring into target shardings reshards, so a checkpoint restores onto any mesh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies
from triskele.train.config import CheckpointConfig
from triskele.train.state import TrainState


class Checkpoints:
    def __init__(self, directory: str | Path, cfg: CheckpointConfig, read_only: bool = False):
        self.directory = Path(directory).absolute()
        self.best_metric = cfg.best_metric
        keep = [
            policies.LatestN(n=cfg.keep),
            policies.BestN(
                get_metric_fn=lambda metrics: metrics[cfg.best_metric],
                reverse=cfg.best_mode == "min",
                n=1,
                keep_checkpoints_without_metrics=False,
            ),
        ]
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy(keep),
            enable_async_checkpointing=True,
            read_only=read_only,
            create=not read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

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
        """Starts an asynchronous save (a no-op if `step` is already saved)."""
        if step in self.manager.all_steps():
            return
        if metrics is not None and self.best_metric not in metrics:
            metrics = None
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            config=ocp.args.JsonSave(config),
        )
        self.manager.save(step, args=args, metrics=metrics, force=True)

    def restore(self, step: int, target: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Restores `step` into `target` (ShapeDtypeStructs with the shardings wanted)."""
        if step not in self.manager.all_steps():
            raise ValueError(
                f"checkpoint step {step} is not in {self.directory}; steps there: {self.all_steps() or 'none'}"
            )
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], restored["data"]

    def restore_config(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
