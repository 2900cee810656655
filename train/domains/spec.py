"""What a domain is: the `Domain` spec, everything the engine, the config, evaluation and
prediction need to know about it, and `Later`, a spec value loaded when first read.

Imports no domain and no registry, so that a domain's own modules can build their spec.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from triskele.train.commands import Command, Flag

if TYPE_CHECKING:
    from flax import nnx
    from triskele.models.contract import DomainModel
    from triskele.train.config.schema import Config
    from triskele.train.data.pipeline import Source
    from triskele.train.evaluator import EvaluatorFactory


METRICS_OF_EVERY_DOMAIN = ("eval_loss",)
"""Metrics every evaluation reports besides a domain's own `metric_names`."""


@dataclasses.dataclass(frozen=True)
class Later:
    """A spec value read from `module`'s attribute `name` when the spec's field is first read."""

    module: str
    name: str

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)


@dataclasses.dataclass(frozen=True)
class Domain:
    name: str
    """The domain's one name: presets `<name>-<size>`, config keys `<name>.<option>`, reports."""
    summary: str
    options: type
    """A dataclass of the domain's own config keys (set as `<name>.<field>=...`)."""
    preset: Mapping[str, Any]
    """Config values of the domain's presets, applied before each size's (e.g. `model.channels`)."""
    build_model: Callable[[Config, nnx.Rngs, int], DomainModel]
    """(config, rngs, pipeline stages) -> the model."""
    open_split: Callable[[Config, str], Source]
    """(config, split) -> the split's records (synthetic, or `data.path` on disk)."""
    class_names: Callable[[Config], list[str]]
    """The model's output classes, read from the training data once when a run starts and then saved
    in its config as `model.class_names`: evaluation and prediction never read the training data."""
    evaluator: EvaluatorFactory | Later
    """(run parts, for_report) -> the domain's evaluator (`triskele.train.evaluator.Evaluator`), used
    by evaluation during training and (for_report True) by `evaluate_checkpoint` for its report."""
    metric_names: tuple[str, ...] | Later
    """The flattened names its evaluator's metrics return (what `checkpoint.best_metric` may name)."""
    inference: str | ModuleType
    """The module (or its import name) of the domain's predict reader and writer and its own eval
    commands: `triskele.eval.domains.DomainInference` (`predict_io(meta, options, workdir)`, `COMMANDS`)."""
    resolve: Callable[[Config], None] | None = None
    """Fills the options that depend on the data (e.g. mars' frame scale) once, when a run starts;
    they are saved with the run, so inference never looks at the training data."""
    evaluate_flags: tuple[Flag, ...] = ()
    """Flags `python -m triskele.eval` adds for this domain; each sets a config key of the evaluation."""
    predict_flags: tuple[Flag, ...] = ()
    """Flags `python -m triskele.eval predict` adds for this domain, handed to its `predict_io` as options."""
    resume_options: tuple[str, ...] = ()
    """Its options that only evaluation reads, which a relaunch may change (the others choose the
    training data or the model and are refused on resume)."""
    chosen_by_evaluation: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Its options that evaluation chooses, each with the value a checkpoint saved unevaluated gets:
    left unset (None), one takes the value of the metric of its name that the run's evaluation of
    the checkpoint's step (on `data.eval_split`, val) logged, when the checkpoint is read for
    evaluation, prediction, export or quantization; never one chosen on the split being scored."""
    legacy_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Its options that a run resolves when it starts (`resolve`, from None) with the value a config
    saved before the option existed reads as: the behaviour of the runs that saved it."""
    clips: bool = False
    """Its models take clips of `model.frames` images per record (a video model) when frames > 1."""
    prepare: Command | None = None
    """`python -m triskele.train prepare <domain>`: raw data into the layout the domain reads."""
    eval_commands: tuple[str, ...] = ()
    """The names of its inference module's `COMMANDS`: the command line lists them without importing it."""
    pack_keys: tuple[str, ...] = ()
    """The config keys whose values shape its records before augmentation (what `pack` stores): a
    pack made with other values is refused, naming the keys; empty: the domain is not packed."""
    pack_codecs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """How `pack` stores each array of its records (`triskele.train.data.packed.CODECS`; default raw)."""
    variants: Mapping[str, Callable[[str], Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    """Further presets `<name>-<variant>-<size>`: variant -> (size name -> config values applied
    after the size's), for a second job of the domain (merch's `shelf`: the facing detector)."""

    tasks: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Jobs of one domain that need other code (merch's `recognition` and `shelf`): task name -> the
    spec's fields that differ for it (its model, its records, its evaluator, its inference module).
    The options' field `task_option` names a run's task; `task_spec` gives the spec it runs with."""
    task_option: str = "task"

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        return value.load() if isinstance(value, Later) else value

    def inference_module(self) -> ModuleType | Any:
        return importlib.import_module(self.inference) if isinstance(self.inference, str) else self.inference


def task_spec(domain: Domain, options: Any) -> Domain:
    """The spec a run of `domain` runs with: the domain's own, with the fields of the task its
    `options` (an options dataclass, or a saved config's mapping of them) name."""
    if not domain.tasks:
        return domain
    if isinstance(options, Mapping):
        defaults = {field.name: field.default for field in dataclasses.fields(domain.options)}
        task = options.get(domain.task_option, defaults.get(domain.task_option))
    else:
        task = getattr(options, domain.task_option)
    if task not in domain.tasks:
        raise ValueError(f"{domain.name}.{domain.task_option}={task!r} is not one of {', '.join(domain.tasks)}")
    fields = {f.name: object.__getattribute__(domain, f.name) for f in dataclasses.fields(domain)}
    return Domain(**{**fields, **domain.tasks[task], "tasks": {}})
