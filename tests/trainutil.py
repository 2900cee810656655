"""Small training runs shared by the engine tests."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from triskele.mesh import make_mesh
from triskele.train import make_config, train
from triskele.train.run import restore_run

# mars-tiny's model (depth 8, width 64, 4 heads) on 32-pixel images: seconds per run on CPU.
# Adam's first steps move each weight by about lr whatever the size of its gradient, so round-off
# in near-zero gradients shows up in the weights in proportion to lr: these runs use lr 1e-3.
SMALL = {
    "optim.lr": 1e-3,
    "model.image_size": 32,
    "data.train_size": 256,
    "data.eval_size": 40,
    "optim.warmup_steps": 0,
    "run.log_every": 1,
    "run.eval_every": 0,
    "data.threads": 2,
}


def small_config(preset: str = "mars-tiny", **overrides):
    return make_config(preset, {**SMALL, **overrides})


def train_small(workdir: Path, preset: str, spec: str, **overrides) -> Path:
    """A short run of `preset` at the small settings on mesh `spec`; returns the workdir."""
    train(small_config(preset, **overrides), workdir=workdir, mesh=mesh_of(spec), progress=False)
    return workdir


def mesh_of(spec: str):
    """'single' is one device; anything else a spec over all 8."""
    return make_mesh("data=1", devices=jax.devices()[:1]) if spec == "single" else make_mesh(spec)


def run(workdir: Path, spec: str = "single", **overrides):
    config = small_config(**overrides)
    return train(config, workdir=workdir, mesh=mesh_of(spec), progress=False)


def step_records(workdir: Path) -> dict[int, dict]:
    """Per-step training records of metrics.jsonl (a resumed run appends to the same file)."""
    records = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in records if "loss" in r}


def final_params(workdir: Path):
    """The latest checkpoint's parameters, restored onto one device."""
    _, state, step = restore_run(workdir, mesh_of("single"))
    return jax.device_get(state.params), step
