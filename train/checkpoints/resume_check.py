"""Whether a run may resume from its checkpoints under a new config: the keys that must not change.

A relaunch whose config changes parameter shapes, state dtypes or the data order cannot continue the
saved trajectory; restoring would fail (and look like damage) or silently train another run. Those
keys are compared with each checkpoint's own config before anything is restored or written, and a
difference refuses the relaunch naming them. Every other key may change on resume: run.steps, the
log, evaluation and checkpoint cadence, the mesh and process count, loader threads, prefetch and
workers, the bad-records policy, profiling, the compilation cache; the optimizer's values
(optim.lr, ...; the optimizer state's structure does not depend on them) and `optim.grad_accum`
(it splits the same global batch into microbatches whose gradients are summed: the same records,
the same update up to float reassociation); `precision` (parameters and optimizer state stay
float32 under every precision, and fp8 keeps no scaling state); `model.remat` and `model.attention`
(how the same function is computed); `model.init_from` (read only by a fresh run).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triskele.train.config.migrations import config_from_dict
from triskele.train.config.schema import Config
from triskele.train.domains import get_domain

FIXED_KEYS = (
    "domain", "model.size", "model.patch", "model.image_size", "model.channels", "model.pool", "model.depth",
    "model.frames", "model.class_names", "model.quantization", "pipeline.repeats",
    "data.global_batch", "data.train_size", "data.path", "data.val_fraction", "run.seed",
)
"""Keys that set parameter shapes (the model's sizes, its classes, the stacked layers' repeats),
state dtypes (a quantized copy), or the data order (which records each step reads, and their
augmentation randomness). Every option of the run's domain is fixed too (`<domain>.<key>`: they
choose its data or its heads; shared code names none of them), but those its spec lists in
`resume_options` (what only evaluation reads)."""


class ConfigChanged(ValueError):
    """A relaunch changed keys the saved run depends on; nothing was restored, moved or written."""


def _value(config: Config, key: str) -> Any:
    section, _, field = key.partition(".")
    holder = config.options if section == config.domain else getattr(config, section)
    return getattr(holder, field) if field else holder


def fixed_keys(config: Config) -> list[str]:
    """FIXED_KEYS and the domain's options but those its spec lets change on resume, as `--set` spells them."""
    free = set(get_domain(config.domain).resume_options)
    return [*FIXED_KEYS, *(f"{config.domain}.{f.name}" for f in dataclasses.fields(config.options)
                           if f.name not in free)]


def _saved_config(saved: Mapping[str, Any]) -> Config:
    """The saved config with what a run fills from its data at start filled as it would have been
    (a checkpoint from before those options were saved has None there)."""
    config = config_from_dict(saved)
    domain = get_domain(config.domain)
    if domain.resolve is not None:
        domain.resolve(config)
    return config


def changed_keys(saved: Mapping[str, Any], new: Config) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) of each fixed key that differs; `new` resolved as `prepare` leaves it."""
    old = _saved_config(saved)
    if old.domain != new.domain:
        return [("domain", old.domain, new.domain)]
    out = []
    for key in fixed_keys(new):
        before, after = _value(old, key), _value(new, key)
        if key == "model.class_names" and before is None:  # saved before class names were recorded
            continue
        if before != after:
            out.append((key, before, after))
    return out


def _show(value: Any) -> str:
    if isinstance(value, list) and len(value) > 6:
        return f"{len(value)} classes [{', '.join(map(str, value[:3]))}, ..., {value[-1]}]"
    return json.dumps(value)


def _setting(key: str, value: Any) -> str:
    return f"--set {key}={'null' if value is None else value}"


def check_resume(saved: Mapping[str, Any], new: Config, step: int, checkpoint_dir: Path) -> None:
    """ConfigChanged naming each fixed key that `new` changes from checkpoint `step`'s config `saved`,
    with the saved and new values and the ways out."""
    changes = changed_keys(saved, new)
    if not changes:
        return
    workdir = checkpoint_dir.parent
    listed = "; ".join(f"{key}: saved {_show(before)}, now {_show(after)}" for key, before, after in changes)
    settable = [_setting(key, before) for key, before, _ in changes if not isinstance(before, list)]
    back = f" ({' '.join(settable)})" if settable else ""
    raise ConfigChanged(
        f"this config cannot resume the run in {workdir}: checkpoint step {step} in {checkpoint_dir} was trained "
        f"with other values of keys that set parameter shapes, state dtypes or the data order: {listed}. Nothing "
        f"was restored, moved or overwritten. Either resume with the saved values{back}; or train the new config "
        f"in a new --workdir; or start a new run from this run's backbone: python -m triskele.eval export-weights "
        f"--workdir {workdir} --output backbone.safetensors, then train with --init-from backbone.safetensors "
        "and a new --workdir")
