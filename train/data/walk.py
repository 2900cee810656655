"""The one walk over an input tree: every recursive listing of input files uses it (predict's
folders and globs, `prepare deepfake`'s video tree).

Links to folders are followed, so that a tree assembled from links reads as it looks, but each
folder is walked once: a folder reached again (by a link back up the tree, `l1 -> .`, or by a
second link to it) is not entered again, so a walk over a tree with link cycles ends. Each file is
listed once (by its resolved path), under the first name the walk (top-down, names sorted)
reaches it by: a link to a file listed already, or a second way into a folder, adds nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def walk_files(root: Path, keep: Callable[[Path], bool], max_depth: int | None = None) -> list[Path]:
    """The files under the folder `root` whose name `keep` accepts, each file once (see the module),
    in walk order; folders are entered down to `max_depth` levels below `root` (None: all)."""
    return unique_files(path for path in _walk(root, max_depth) if keep(path))


def unique_files(paths: Iterable[Path]) -> list[Path]:
    """The regular files of `paths` (links to them included), each once under its first name: two
    names of one resolved path (a link, a way in through a linked folder) are one file."""
    seen: set[str] = set()
    files = []
    for path in paths:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            files.append(path)
    return files


def _walk(root: Path, max_depth: int | None) -> Iterator[Path]:
    """Every name under `root` that is not a folder, each folder entered once (by (device, inode))."""
    top = os.stat(root)
    entered = {(top.st_dev, top.st_ino)}
    for folder, folders, names in os.walk(root, followlinks=True):
        depth = len(Path(folder).relative_to(root).parts)
        kept = []
        for name in sorted(folders) if max_depth is None or depth < max_depth else ():
            try:
                info = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in entered:
                entered.add((info.st_dev, info.st_ino))
                kept.append(name)
        folders[:] = kept
        yield from (Path(folder, name) for name in sorted(names))
