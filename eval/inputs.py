"""What `predict --input` names: a folder (searched recursively), a glob, or a text file of paths."""

from __future__ import annotations

import glob
from pathlib import Path


def list_inputs(spec: str | Path, suffixes: tuple[str, ...]) -> tuple[Path, list[Path]]:
    """(root that output names are relative to, the input files with one of `suffixes`, sorted)."""
    text = str(spec)
    path = Path(text)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes]
        root = path
    elif path.is_file() and path.suffix.lower() in (".txt", ".lst"):
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        files = [Path(line) if Path(line).is_absolute() else path.parent / line for line in lines]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"--input {path} lists files that do not exist: {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        root = path.parent
    elif path.is_file():
        files, root = [path], path.parent
    elif glob.has_magic(text):
        files = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file() and Path(p).suffix.lower()
                 in suffixes]
        fixed = path.parts[: next(i for i, part in enumerate(path.parts) if glob.has_magic(part))]
        root = Path(*fixed) if fixed else Path(".")
    else:
        raise ValueError(f"--input {text!r} is not a folder, a file, a glob or a text file of paths")
    files = sorted(set(files))
    if not files:
        raise ValueError(f"--input {text!r} holds no inputs ({', '.join(suffixes)})")
    return root, files


def relative_name(path: Path, root: Path) -> str:
    """The input's name under its root (folders kept), used for its outputs."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name
