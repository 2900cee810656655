"""The input limits outside a run: predict's, prepare's and serve's `--set limits.KEY=N`."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping

from triskele.train.config.keys import parse_override, set_key
from triskele.train.config.schema import InputLimits


def check_positive(values: Mapping[str, int]) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"config key {key!r} is {value}; it must be at least 1")


def check_limits(limits: InputLimits) -> None:
    check_positive({f"limits.{field.name}": getattr(limits, field.name) for field in dataclasses.fields(limits)})


def add_limits_flag(parser: argparse.ArgumentParser, keys: Iterable[str] | None = None,
                    defaults: Mapping[str, int] | None = None) -> None:
    """`--set limits.KEY=N` (repeatable) for a command that reads inputs outside a run (predict,
    prepare, serve), its help listing `keys` (default: all) with the command's `defaults` where it
    has its own; `input_limits(args.set, defaults)` reads it."""
    fields = {f.name: f.default for f in dataclasses.fields(InputLimits)} | dict(defaults or {})
    listed = ", ".join(f"limits.{key} (default {fields[key]:,})" for key in (keys or fields))
    parser.add_argument("--set", action="append", default=[], metavar="limits.KEY=N",
                        help=f"an input limit, checked from each input's header before decoding: {listed}")


def input_limits(overrides: Iterable[str] = (), defaults: Mapping[str, int] | None = None) -> InputLimits:
    """The input limits (a command's own `defaults` over InputLimits') with `limits.KEY=VALUE`
    overrides (predict's, prepare's and serve's `--set`), checked as a run's config is; a key
    outside `limits.` is refused."""
    limits = InputLimits(**(defaults or {}))
    for key, value in map(parse_override, overrides):
        section, _, field = key.partition(".")
        if section != "limits" or not field:
            raise ValueError(f"--set {key}=...: only the input limits are set here (limits.<key>: "
                             f"{', '.join(f'limits.{f.name}' for f in dataclasses.fields(InputLimits))})")
        set_key(limits, field, value, "limits.")
    check_limits(limits)
    return limits
