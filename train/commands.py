"""The shape both command lines share: a table of named commands, each adding its flags to a
parser and returning what runs it; and the flags a domain adds to a shared command.

Parsing imports no JAX (`--help` and a wrong flag answer at once): a command is loaded only when
it is chosen (`LazyCommands`), and the exception types a command line maps to exit codes are
asked for once it is parsed."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from triskele.train.bookkeeping.stop import INTERRUPTED_EXIT

Runner = Callable[[argparse.Namespace], Any]
"""Runs a parsed command line; returns the exit code (train's commands) or the result that
`python -m triskele.eval` prints as JSON, as `(result, exit code)` where that is not 0."""


@dataclasses.dataclass(frozen=True)
class Command:
    summary: str
    build: Callable[[argparse.ArgumentParser], Runner]
    """Adds the command's flags to its parser and returns what runs it."""


class LazyCommands(Mapping[str, Command]):
    """Commands by name, each made by its loader when it is looked up (the command chosen)."""

    def __init__(self, loaders: Mapping[str, Callable[[], Command]]):
        self._loaders = dict(loaders)

    def __getitem__(self, name: str) -> Command:
        return self._loaders[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)


def bounded(kind: Callable[[str], float], low: float, high: float | None = None) -> Callable[[str], Any]:
    """An argparse type: a `kind` (int or float) from `low` to `high` (no upper bound: None). A value
    outside is refused at the door (exit 2, the flag and the range that works named), never
    accepted and taken to mean something else (a batch of 0, a port past 65535)."""
    what = "an integer" if kind is int else "a number"
    allowed = f"{what} from {low:g} to {high:g}" if high is not None else f"{what} {low:g} or more"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}; give {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {allowed}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def add_dataclass_flags(parser: argparse.ArgumentParser, options: type) -> None:
    """One flag per field of the dataclass `options` (`max_batch` -> `--max-batch`), its default the
    field's, its help the field's `metadata["help"]`; an int or float field is `bounded` by the
    metadata's `low` and `high`, a Path field read as text."""
    hints = typing.get_type_hints(options)
    for field in dataclasses.fields(options):
        kind = next((t for t in (int, float) if hints[field.name] in (t, t | None)), None)
        low, high = field.metadata.get("low"), field.metadata.get("high")
        parser.add_argument("--" + field.name.replace("_", "-"), default=field.default, help=field.metadata["help"],
                            type=bounded(kind, low, high) if kind and low is not None else kind)


def folder(text: str) -> str:
    """An argparse type: a folder, existing or to be made, refused at the door (exit 2) when it or a
    folder above it is a file, which every later step would otherwise meet as FileExistsError."""
    for part in (Path(text), *Path(text).parents):
        if part.exists() and not part.is_dir():
            where = "it is a file" if part == Path(text) else f"{part} is a file"
            raise argparse.ArgumentTypeError(f"{text} cannot be a folder: {where}; give a folder that exists or can "
                                             "be made")
    return text


def file_in_folder(text: str) -> str:
    """An argparse type: a file to write, refused at the door (exit 2) when a folder above it is a file
    or it is a folder."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the file to write (e.g. {Path(text) / 'model'})")
    for part in Path(text).parents:
        if part.exists() and not part.is_dir():
            raise argparse.ArgumentTypeError(f"{text} cannot be written: {part} is a file, not a folder")
    return text


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag a domain adds to a shared command (evaluate, predict)."""

    name: str
    """As typed, e.g. `--stride`."""
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    switch: bool = False
    """A flag without a value (store_true)."""
    key: str | None = None
    """The config key the value sets (evaluation flags); None: an option handed to the domain's code."""
    dest: str = ""
    """The option's name in code (default: the flag's, `--save-faces` -> `save_faces`): a flag named by
    a Python keyword (`--as`) gives another."""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.name.lstrip("-").replace("-", "_"))

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        if self.switch:
            parser.add_argument(self.name, action="store_true", help=self.help, dest=self.dest)
            return
        parser.add_argument(self.name, help=self.help, type=self.type, choices=self.choices, metavar=self.metavar,
                            dest=self.dest)


def add_domain_flags(parser: argparse.ArgumentParser, flags_by_domain: Mapping[str, Sequence[Flag]]) -> None:
    """Each domain's flags in a group of its own; a flag two domains share is added once."""
    added: set[str] = set()
    for domain, flags in flags_by_domain.items():
        fresh = [flag for flag in flags if flag.name not in added]
        if not fresh:
            continue
        group = parser.add_argument_group(f"{domain} only")
        for flag in fresh:
            flag.add_to(group)
            added.add(flag.name)


def add_coordinator_flags(group: argparse._ArgumentGroup) -> None:
    """The multi-process flags training and predict share (`triskele.mesh.distributed.DistributedOptions`)."""
    group.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address (else auto-detected)")
    group.add_argument("--coordinator-bind", metavar="HOST[:PORT]",
                       help="where process 0's coordinator listens (default: --coordinator's host; every interface "
                            "when the cluster is auto-detected)")
    group.add_argument("--num-processes", type=bounded(int, 1), help="processes in the job")
    group.add_argument("--process-id", type=bounded(int, 0), help="this process's index, 0..N-1")


def run_command_line(prog: str, commands: Mapping[str, Command], default: Command, argv: Sequence[str] | None,
                     errors: Callable[[], Mapping[type[BaseException], int]]) -> int:
    """`prog [COMMAND] flags...`: the named command, or `default` when the first word names none;
    its runner's exit code. An exception of a type in `errors()` (asked for once the command line
    is parsed) is printed as `error: ...` and exits with its code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv[:1] and argv[0] in commands else None
    command = commands[name] if name else default
    parser = argparse.ArgumentParser(prog=f"{prog} {name}" if name else prog, description=command.summary,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    run = command.build(parser)
    args = parser.parse_args(argv[1:] if name else argv)
    codes = errors()
    try:
        return run(args)
    except tuple(codes) as err:
        print(f"error: {err}", file=sys.stderr)
        return next(code for kind, code in codes.items() if isinstance(err, kind))
    except KeyboardInterrupt:  # a command without a stop of its own (training and predict have theirs)
        print(f"\n{parser.prog}: interrupted (Ctrl-C); nothing it had not finished was written: run it again",
              file=sys.stderr)
        return INTERRUPTED_EXIT
