"""The splits every domain reads: train, val (held out of the training data) and test.

`val` is what training's periodic evaluation and `checkpoint.best_metric` read; `test` is read only
by `python -m triskele.eval --split test` and its report. On disk, a dataset without a validation
split of its own gives one from its training records: a record is held out when a hash of its key
(a file's relative path, a video's id, so that a video's frames stay together) falls below
`data.val_fraction`. The choice depends on the key alone, not on the order, the count or the seed:
the same records are held out on every machine and after records are added. The on-disk loaders
hold nothing out by default (`val_fraction` 0: a loader built by hand reads its folders as they
are); the domains' `open_split` passes `data.val_fraction`.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

SPLITS = ("train", "val", "test")

T = TypeVar("T")


def check_split(split: str) -> str:
    """`split`, or a ValueError naming the valid splits."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)} "
                         "(val is held out of the training data, test is for the final report)")
    return split


def dataset_name(name: str, source: Path, entry: str) -> str:
    """`name`, read from a dataset's own file (a split file's video id), or a ValueError naming
    `source` and the `entry` when it is an absolute path or climbs out with `..`: the names in a
    dataset's files name folders inside the dataset, never elsewhere on the machine."""
    path = Path(name)
    if path.is_absolute() or ".." in path.parts:
        why = "is an absolute path" if path.is_absolute() else "climbs out with '..'"
        raise ValueError(f"{source}, {entry}: {name!r} {why}; a name there is a folder's name inside the dataset "
                         "(e.g. '000')")
    return name


def _unit_hash(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def hold_out(items: Sequence[T], key: Callable[[T], str], split: str, fraction: float) -> list[T]:
    """The training records (`split` train) or the validation records (`split` val) of `items`, a
    training split: val holds the items whose key hashes below `fraction` (at least one key), train
    the others. `fraction` 0, or fewer keys than 1 / fraction (too few to spare one), holds none out:
    train is every item, and val too (with a warning: selection then reads records trained on)."""
    if split not in ("train", "val"):
        raise ValueError(f"only train and val are drawn from the training records, not {split!r}")
    if not 0 <= fraction < 1:
        raise ValueError(f"data.val_fraction={fraction} must be at least 0 and below 1, e.g. 0.1")
    keys = {key(item) for item in items}
    if fraction == 0 and split == "val":
        raise ValueError("the data has no val split of its own and data.val_fraction=0 holds none of the "
                         "training records out: set data.val_fraction (e.g. 0.1) or add a val split to the data")
    if len(keys) * fraction < 1:
        if split == "val":
            warnings.warn(f"{len(keys)} training records (or videos) are too few to hold data.val_fraction="
                          f"{fraction} of them out: val reads the training records; add a val split or more data",
                          stacklevel=2)
        return list(items)
    held = {k for k in keys if _unit_hash(k) < fraction} or {min(keys, key=_unit_hash)}
    return [item for item in items if (key(item) in held) == (split == "val")]
