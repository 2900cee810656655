"""Whether a config's values are ones a run can use: choices, counts, the best metric, the limits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from triskele.train.config.limits import check_limits, check_positive
from triskele.train.config.schema import PRECISIONS, Config
from triskele.train.domains import domains, get_domain, spec_for
from triskele.train.domains.spec import METRICS_OF_EVERY_DOMAIN


def check_choice(key: str, value: Any, choices: Iterable[str]) -> None:
    if value not in choices:
        raise ValueError(f"config key {key!r} is {value!r}; choose one of {', '.join(choices)}")


def check_best_metric(domain: str, name: str) -> None:
    known = (*METRICS_OF_EVERY_DOMAIN, *get_domain(domain).metric_names)
    if name not in known:
        raise ValueError(f"checkpoint.best_metric={name!r} is not a {domain} metric; choose one of {', '.join(known)}")


def check_config(config: Config) -> None:
    from triskele.mesh.schedule import SCHEDULES
    from triskele.models.quantize import FORMATS as QUANTIZATION_FORMATS
    from triskele.models.vit import REMAT_POLICIES
    from triskele.train.bookkeeping.profiling import parse_profile_steps

    check_choice("domain", config.domain, list(domains()))
    spec_for(config)  # the task its options name is one of its domain's
    check_choice("precision", config.precision, PRECISIONS)
    check_choice("model.remat", config.model.remat, REMAT_POLICIES)
    check_choice("pipeline.schedule", config.pipeline.schedule, SCHEDULES)
    check_choice("data.bad_records", config.data.bad_records, ("error", "skip"))
    check_choice("run.on_nonfinite", config.run.on_nonfinite, ("stop", "skip"))
    if config.run.profile_steps is not None:
        parse_profile_steps(config.run.profile_steps, config.run.steps)
    check_best_metric(config.domain, config.checkpoint.best_metric)
    if config.model.quantization is not None:
        check_choice("model.quantization", config.model.quantization, QUANTIZATION_FORMATS)
    if config.checkpoint.best_mode not in ("min", "max"):
        raise ValueError(f"config key 'checkpoint.best_mode' is {config.checkpoint.best_mode!r}; use min or max")
    positive = {
        "data.global_batch": config.data.global_batch, "optim.grad_accum": config.optim.grad_accum,
        "checkpoint.every": config.checkpoint.every, "checkpoint.keep": config.checkpoint.keep,
        "run.steps": config.run.steps, "run.log_every": config.run.log_every,
        "pipeline.microbatches": config.pipeline.microbatches, "pipeline.repeats": config.pipeline.repeats,
        "data.train_size": config.data.train_size, "data.eval_size": config.data.eval_size,
        "run.max_skipped_steps": config.run.max_skipped_steps,
    }
    if config.run.eval_every < 0:
        raise ValueError(f"config key 'run.eval_every' is {config.run.eval_every}; use 0 (never) or more")
    check_positive(positive)
    check_limits(config.limits)
