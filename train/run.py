"""What a run needs before its first step: mesh, domain, model graph, optimizer, state shardings.

Shared by training and evaluation so that both build exactly the same state layout.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from triskele.mesh import make_mesh
from triskele.mesh.spec import AUTO
from triskele.train.bookkeeping.logs import evaluation_at
from triskele.train.checkpoints.manager import Checkpoints
from triskele.train.config.migrations import config_from_dict
from triskele.train.config.schema import CheckpointConfig, Config
from triskele.train.config.validate import validate
from triskele.train.data.pipeline import Source
from triskele.train.domains import Domain, get_domain, resolve_from_data
from triskele.train.optim import make_optimizer
from triskele.train.state import TrainState, abstract_model, abstract_state, init_state, state_shardings
from triskele.train.step import make_eval_step


@dataclasses.dataclass
class RunParts:
    config: Config
    mesh: Mesh
    domain: Domain
    build_model: Callable[[], nnx.Module]
    graphdef: nnx.GraphDef
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    shardings: TrainState

    def init_state(self) -> TrainState:
        return init_state(self.build_model, self.tx, self.shardings)

    @functools.cached_property
    def eval_step(self):
        """The jitted eval step, built once per run (periodic evaluations reuse its compilation)."""
        return make_eval_step(self.graphdef, self.mesh)

    def abstract_state(self) -> TrainState:
        """ShapeDtypeStructs of the state with this run's shardings (what a checkpoint restores into)."""
        return abstract_state(self.build_model, self.tx, self.shardings)

    def restore(self, checkpoints: Checkpoints, step: int) -> tuple[TrainState, dict]:
        """Restores checkpoint `step` onto this run's mesh (resharding as needed)."""
        return checkpoints.restore(step, self.abstract_state())


MeshChooser = Callable[[Config], tuple[Config, list[str]]]
"""Chooses the mesh (and schedule, remat) for a config whose mesh is `auto`: the config chosen and
the lines that say why (`triskele.train.auto_mesh.resolve_auto_mesh`)."""


def prepare(config: Config, mesh: Mesh | None = None, choose_mesh: MeshChooser | None = None) -> RunParts:
    """Validates `config` against the mesh and lays out (abstractly) everything the step needs.
    `config.mesh` "auto" is resolved here by `choose_mesh`, for the local devices (and written back
    into `config`): `train()` and `evaluate_checkpoint` pass the planner's, which the engine does not import."""
    if mesh is None and config.mesh == AUTO:
        if choose_mesh is None:
            raise ValueError("mesh 'auto' is chosen by the planner: pass choose_mesh=triskele.train.auto_mesh."
                             "resolve_auto_mesh, or name a mesh (e.g. mesh=data=8)")
        chosen, lines = choose_mesh(config)
        config.mesh, config.model = chosen.mesh, chosen.model
        config.optim, config.pipeline = chosen.optim, chosen.pipeline
        if jax.process_index() == 0:
            print("\n".join(lines), flush=True)
    mesh = make_mesh(config.mesh, dcn=config.dcn) if mesh is None else mesh
    validate(config, mesh)
    domain = resolve_from_data(config)
    seed = config.run.seed

    def build_model() -> nnx.Module:
        return domain.build_model(config, nnx.Rngs(params=seed), mesh.shape["pipeline"])

    graphdef, params = abstract_model(build_model)
    tx, schedule = make_optimizer(config.optim, config.run.steps)
    if config.model.quantization is not None:  # an inference-only copy: no optimizer state
        tx = optax.set_to_zero()
    shardings = state_shardings(params, tx, mesh)
    return RunParts(config, mesh, domain, build_model, graphdef, tx, schedule, shardings)


def evaluate_split(parts: RunParts, params: dict, source: Source) -> dict[str, np.ndarray]:
    """The totals of every record of `source` exactly once, by the domain's evaluator."""
    return parts.domain.evaluator(parts, False).accumulate(params, source)


def _open_run(workdir: str | Path, mesh: Mesh | None, step: int | None, overrides: dict[str, Any] | None,
              choose_mesh: MeshChooser | None = None) -> tuple[RunParts, Checkpoints, int]:
    checkpoint_dir = Path(workdir) / "checkpoints"
    if not checkpoint_dir.is_dir():
        missing = "does not exist" if not Path(workdir).is_dir() else "has no checkpoints/ folder"
        raise ValueError(f"workdir {str(workdir)!r} {missing}: give --workdir the folder a training run wrote "
                         "(python -m triskele.train --workdir DIR)")
    checkpoints = Checkpoints(checkpoint_dir, CheckpointConfig(), read_only=True)
    try:
        step = checkpoints.latest_step() if step is None else step
        if step is None:
            raise ValueError(f"{checkpoint_dir} holds no checkpoint yet (a run saves one every checkpoint.every "
                             "steps and when it stops); train there first")
        config = config_from_dict({**checkpoints.restore_config(step), **(overrides or {})})
        _fill_chosen_options(config, Path(workdir), step)
        return prepare(config, mesh, choose_mesh), checkpoints, step
    except BaseException:
        checkpoints.close()
        raise


def _fill_chosen_options(config: Config, workdir: Path, step: int) -> None:
    """The domain's options chosen by evaluation (`Domain.chosen_by_evaluation`) that the config
    leaves unset, from the run's evaluation of checkpoint `step` (its metrics.jsonl record), or the
    domain's value for a step saved unevaluated."""
    unset = {name: fallback for name, fallback in get_domain(config.domain).chosen_by_evaluation.items()
             if getattr(config.options, name) is None}
    chosen = evaluation_at(workdir, step, tuple(unset)) if unset else {}
    for name, fallback in unset.items():
        setattr(config.options, name, float(chosen.get(name, fallback)))


def restore_run(
    workdir: str | Path,
    mesh: Mesh | None = None,
    step: int | None = None,
    overrides: dict[str, Any] | None = None,
    choose_mesh: MeshChooser | None = None,
) -> tuple[RunParts, TrainState, int]:
    """Loads a run's checkpoint (latest, or `step`) onto `mesh` (default: its config's mesh spec).

    `overrides` change the saved config (e.g. `data.path` to evaluate on other data); `choose_mesh`
    resolves a mesh `auto` (see `prepare`)."""
    parts, checkpoints, step = _open_run(workdir, mesh, step, overrides, choose_mesh)
    try:
        state, _ = parts.restore(checkpoints, step)
    finally:
        checkpoints.close()
    return parts, state, step


def restore_params(
    workdir: str | Path,
    mesh: Mesh | None = None,
    step: int | None = None,
    overrides: dict[str, Any] | None = None,
    choose_mesh: MeshChooser | None = None,
) -> tuple[RunParts, dict, int]:
    """As `restore_run`, but only the parameters: what evaluation and inference need."""
    parts, checkpoints, step = _open_run(workdir, mesh, step, overrides, choose_mesh)
    try:
        params = checkpoints.restore_params(step, parts.abstract_state().params)
    finally:
        checkpoints.close()
    return parts, params, step
