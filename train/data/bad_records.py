"""`data.bad_records=skip`: a split whose unreadable records are replaced instead of stopping the run.

The readers raise a ValueError naming the file for a truncated image, a mask of the wrong size, a
label outside the known values, a file of a format not read or one over an input limit
(`limits.*`, checked from its header before decoding). Here such a record, or one whose reading
raises anything else, is replaced by the next good one (training), or marked for evaluation to
leave out, and listed once in WORKDIR/bad_records.txt with the reason.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.bookkeeping.files import open_regular
from triskele.train.data.pipeline import Source


class SkipBadRecords:
    def __init__(self, source: Source, split: str, log: Path | None = None):
        self.source, self.split, self.log = source, split, log
        self.bad: dict[int, str] = {}
        """Index -> the reader's message (which names the file), for the records seen unreadable here."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str) -> Any:
        """What the wrapped source says of itself (its family names, record groups, ...)."""
        if name == "source":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.source, name)

    def load(self, index: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Record `index`, or the next readable one after it (wrapping around)."""
        count = len(self.source)
        for offset in range(count):
            candidate = (index + offset) % count
            try:
                return self.source.load(candidate, rng)
            except Exception as err:  # noqa: BLE001 - whatever one crafted file raises, the run goes on without it
                self._note(candidate, str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}")
        raise ValueError(f"every record of the {self.split} split is unreadable, e.g. {self.bad[index]}; "
                         "data.bad_records=skip needs some readable ones: check that data.path is the dataset's root")

    def _note(self, index: int, reason: str) -> None:
        with self._lock:
            if index in self.bad:
                return
            self.bad[index] = reason
            if self.log is not None:
                with open_regular(self.log, "a") as f:  # never through a link planted there
                    f.write(f"{self.split}\t{index}\t{' '.join(reason.split())}\n")

    def __getstate__(self) -> dict[str, Any]:  # Grain worker processes get their own lock
        return {"source": self.source, "split": self.split, "log": self.log}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["split"], state["log"])


def tolerant(source: Source, policy: str, split: str, log: Path | None = None) -> Source:
    """`source` as `data.bad_records` asks: itself (error) or wrapped (skip)."""
    return SkipBadRecords(source, split, log) if policy == "skip" else source


def count_bad_records(log: Path, split: str | None = None) -> int:
    """Distinct records listed in a bad_records.txt (several loader processes may list one twice)."""
    if not log.is_file():
        return 0
    entries = {tuple(line.split("\t")[:2]) for line in log.read_text().splitlines() if line.strip()}
    return sum(1 for entry in entries if split is None or entry[0] == split)
