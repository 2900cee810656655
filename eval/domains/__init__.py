"""Each domain's predict reader/writer and its own eval commands, one module per domain; a domain's
spec (`triskele.train.domains`) names its module here (`inference`), and nothing else imports one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from triskele.train.commands import Command
from triskele.train.domains import Domain


@runtime_checkable
class DomainInference(Protocol):
    COMMANDS: Mapping[str, Command]
    """Commands of `python -m triskele.eval` that are this domain's alone (merch's `gallery`)."""

    def predict_io(self, meta: dict[str, Any], options: dict[str, Any], workdir: Path | None) -> Any:
        """The domain's `triskele.eval.engine.PredictIO` for a model (`meta`, with the model's
        `identity` and the input `limits` its reader applies: `triskele.train.config.schema.InputLimits`),
        the domain's predict flags given (`options`, by flag dest) and the run's folder (None for an
        exported model alone)."""
        ...


def inference_of(domain: Domain) -> DomainInference:
    module = domain.inference_module()
    if not isinstance(module, DomainInference):
        raise TypeError(f"domain {domain.name!r}: its inference module {module.__name__} lacks predict_io or COMMANDS")
    return module
