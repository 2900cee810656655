"""What `predict --input` names: a folder (searched recursively), a glob, or a text file of paths;
and how an input's outputs are named.

An input's key is its path relative to the inputs' common root, suffix kept (`a/img.png`). Its
outputs are named after the key with the input's suffix replaced by the output's (`china.jpg` ->
`china.png`, `shelf.jpg` -> `shelf.json`), except where two inputs of one folder share a stem:
then both keep their suffix (`frame.jpg` -> `frame.jpg.png`, `frame.png` -> `frame.png.png`). Any
clash left (`x.png` and `x.overlay.png` where overlays are written) is refused before anything runs,
and so is an output folder that holds an input or lies where the inputs are listed from.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from triskele.train.data.walk import unique_files, walk_files


def list_inputs(spec: str | Path, suffixes: tuple[str, ...]) -> tuple[Path, list[Path]]:
    """(root that output names are relative to, the input files with one of `suffixes`, sorted).
    The root is the folder given, a glob's folder before its first wildcard, or the common folder
    of the files a list names (so that files listed from two folders keep their folders' names).
    Folders and globs are walked by `triskele.train.data.walk` (links to folders followed once); a
    file reached by two names (a link, a second way into a folder) is listed once, by the first."""
    text = str(spec)
    path = Path(text)
    walked = _walked(text)
    if walked is not None:
        root, parts = walked

        def listed(file: Path) -> bool:
            return file.suffix.lower() in suffixes and _glob_matches(file.relative_to(root).parts, parts)

        depth = None if "**" in parts else len(parts) - 1  # a glob without ** goes no deeper than its parts
        files = walk_files(root, listed, depth) if root.is_dir() else []
    elif path.is_file() and path.suffix.lower() in (".txt", ".lst"):
        lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
        files = [_absolute(Path(line) if Path(line).is_absolute() else path.parent / line) for line in lines]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"--input {path} lists files that do not exist: {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        files = unique_files(files)
        root = Path(os.path.commonpath([f.parent for f in files])) if files else path.parent
    elif path.is_file():
        files, root = [path], path.parent
    else:
        raise ValueError(f"--input {text!r} does not exist; give a folder (searched recursively), a file, a glob in "
                         "quotes or a .txt file of paths")
    files = sorted(_absolute(f) for f in files)
    if not files:
        raise ValueError(f"--input {text!r} holds no inputs: no file there ends in {', '.join(suffixes)}")
    return _absolute(root), files


def _walked(spec: str) -> tuple[Path, tuple[str, ...]] | None:
    """For an input spec that lists a tree, (the folder walked, the glob's parts below it): a folder
    is `FOLDER/**` (every file under it), a glob its folder before the first wildcard and the rest.
    None for a file or a list of files."""
    path = Path(spec)
    if path.is_dir():
        return path, ("**",)
    if path.exists() or not glob.has_magic(spec):
        return None
    fixed = next(i for i, part in enumerate(path.parts) if glob.has_magic(part))
    return Path(*path.parts[:fixed]) if fixed else Path("."), path.parts[fixed:]


def _glob_matches(names: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whether a path's names below the glob's folder match its `parts`, as `glob.glob(recursive=True)`
    matches: `**` any number of folders (none too), another part one name; a name starting with '.'
    only where its part starts with '.' (`**` never)."""
    if not parts:
        return not names
    if parts[0] == "**":
        return any(_glob_matches(names[i:], parts[1:]) for i in range(len(names) + 1)
                   if not any(name.startswith(".") for name in names[:i]))
    return bool(names) and _name_matches(names[0], parts[0]) and _glob_matches(names[1:], parts[1:])


def _name_matches(name: str, part: str) -> bool:
    return (part.startswith(".") or not name.startswith(".")) and fnmatch.fnmatchcase(name, part)


def _may_list_under(parts: tuple[str, ...], folder: tuple[str, ...]) -> bool:
    """Whether the glob `parts` can match a file below `folder` (its names below the glob's folder):
    the folder's names each match their part and the glob goes deeper, or it reaches a `**` first."""
    for i, name in enumerate(folder):
        if parts[i] == "**":
            return True
        if i == len(parts) - 1 or not _name_matches(name, parts[i]):
            return False
    return True


def refuse_output_among_inputs(spec: str | Path, out_dir: str | Path, inputs: Iterable[Path]) -> None:
    """ValueError, naming OUT, the inputs' folder and the way out, when OUT (resolved) is the folder
    an input folder or glob lists from, or inside it where the glob reaches (the next run would
    predict the predictions: pred/pred/...), or holds one of `inputs` (its outputs could replace it)."""
    out = Path(out_dir).resolve()
    shown = f"--output {out_dir}" + (f" (resolved: {out})" if out != _absolute(Path(out_dir)) else "")
    walked = _walked(str(spec))
    if walked is not None:
        root, parts = walked[0].resolve(), walked[1]
        instead = f"give an --output outside {root}, e.g. {_beside(root)}"
        if out == root:
            raise ValueError(f"{shown} is the input folder {root}: the predictions would replace the inputs they "
                             f"are named after (a mask a.png over the image a.png); {instead}")
        if out.is_relative_to(root) and _may_list_under(parts, out.relative_to(root).parts):
            raise ValueError(f"{shown} is inside the input folder {root}, which --input {spec} lists from: each run "
                             f"would predict the last run's predictions again ({out.name}/{out.name}/...); {instead}")
    inside = [p for p in inputs if p.resolve().is_relative_to(out)]
    if inside:
        raise ValueError(f"--input {spec} names {len(inside)} files inside {shown} (e.g. {inside[0]}): their "
                         "outputs could replace them and a rerun would predict predictions; give an --output that "
                         "holds no input")


def _beside(folder: Path) -> Path:
    return folder.parent / f"{folder.name or 'inputs'}-predictions"


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
