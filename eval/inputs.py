"""What `predict --input` names: a folder (searched recursively), a glob, or a text file of paths;
and how an input's outputs are named.

An input's key is its path relative to the inputs' common root, suffix kept (`a/img.png`). Its
outputs are named after the key with the input's suffix replaced by the output's (`china.jpg` ->
`china.png`, `shelf.jpg` -> `shelf.json`), except where two inputs of one folder share a stem:
then both keep their suffix (`frame.jpg` -> `frame.jpg.png`, `frame.png` -> `frame.png.png`). Any
clash left (`x.png` and `x.overlay.png` where overlays are written) is refused before anything runs.
"""

from __future__ import annotations

import glob
import os
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path


def list_inputs(spec: str | Path, suffixes: tuple[str, ...]) -> tuple[Path, list[Path]]:
    """(root that output names are relative to, the input files with one of `suffixes`, sorted).
    The root is the folder given, a glob's folder before its first wildcard, or the common folder
    of the files a list names (so that files listed from two folders keep their folders' names)."""
    text = str(spec)
    path = Path(text)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes]
        root = path
    elif path.is_file() and path.suffix.lower() in (".txt", ".lst"):
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        files = [_absolute(Path(line) if Path(line).is_absolute() else path.parent / line) for line in lines]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"--input {path} lists files that do not exist: {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        root = Path(os.path.commonpath([f.parent for f in files])) if files else path.parent
    elif path.is_file():
        files, root = [path], path.parent
    elif glob.has_magic(text):
        files = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file() and Path(p).suffix.lower()
                 in suffixes]
        fixed = path.parts[: next(i for i, part in enumerate(path.parts) if glob.has_magic(part))]
        root = Path(*fixed) if fixed else Path(".")
    else:
        raise ValueError(f"--input {text!r} does not exist; give a folder (searched recursively), a file, a glob in "
                         "quotes or a .txt file of paths")
    files = sorted({_absolute(f) for f in files})
    if not files:
        raise ValueError(f"--input {text!r} holds no inputs: no file there ends in {', '.join(suffixes)}")
    return _absolute(root), files


def _absolute(path: Path) -> Path:
    """The absolute path with `..` folded, links not followed (a linked file keeps its name)."""
    return Path(os.path.abspath(path))


def relative_name(path: Path, root: Path) -> str:
    """The input's key: its path under `root` (folders and suffix kept)."""
    try:
        return _absolute(path).relative_to(_absolute(root)).as_posix()
    except ValueError:
        raise ValueError(f"input {path} is not under the inputs' root {root}") from None


def output_stems(keys: Sequence[str]) -> dict[str, str]:
    """key -> what its outputs' names start with: the key without its suffix, or the whole key where
    another key of its folder has the same stem."""
    stems = {key: posixpath.splitext(key)[0] for key in keys}
    shared = Counter(stems.values())
    return {key: stem if shared[stem] == 1 else key for key, stem in stems.items()}


def refuse_clashes(outputs: Mapping[str, Iterable[str]], reserved: Iterable[str]) -> None:
    """`outputs`: input key -> the names its outputs take in OUT; ValueError naming the two inputs
    (or the input and predict's own file) that would write one name."""
    own = tuple(reserved)
    writer: dict[str, str] = {}
    for key, names in outputs.items():
        for name in names:
            if any(name == r or name.startswith(f"{r}/") for r in own):
                raise ValueError(f"input {key} would write {name}, which predict writes itself; rename the input "
                                 "or give it from a folder of its own")
            other = writer.setdefault(name, key)
            if other != key:
                first, second = sorted((other, key))
                raise ValueError(f"inputs {first} and {second} would both write {name}; rename one of them or "
                                 "predict them into separate --output folders")
