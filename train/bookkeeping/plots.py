"""WORKDIR/plots/training.png and eval.png, drawn from metrics.jsonl so a person can look at a run."""

from __future__ import annotations

import io
import math
from pathlib import Path

from triskele.train.bookkeeping.files import write_atomically
from triskele.train.bookkeeping.records import read_records

TRAINING_PANELS = (("loss", "training loss"), ("lr", "learning rate"), ("grad_norm", "gradient norm"),
                   ("images_per_sec", "images / s"))


FRACTIONS = frozenset({"acc", "ap", "auc", "compliance", "eer", "iou", "map", "miou", "precision", "recall", "top1",
                       "top5"})
"""Words of metric names that are fractions by definition ('pixel_acc', 'auc_frame/Swap', 'iou/sand',
'recall_at_5'): their panels keep the whole [0, 1] axis, so that 0.882 -> 0.878 looks as small as it is."""


def is_fraction(name: str) -> bool:
    """Whether the metric `name` lies in [0, 1] by definition (the words of its first '/' part)."""
    return any(word in FRACTIONS for word in name.split("/")[0].split("_"))


def panels_figure(records: dict[int, dict], keys: list[tuple[str, str]], title: str):
    """One panel per (key, label) of the records against their step; a metric that is a fraction
    on a fixed [0, 1] axis, any other (a loss, a count) on an automatic one. A matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(keys))
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    steps = sorted(records)
    for ax, (key, label) in zip(axes.flat, keys, strict=False):
        points = [(s, records[s][key]) for s in steps if isinstance(records[s].get(key), int | float)]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None, markersize=3)
        if key == "loss":
            mean = [(s, records[s]["loss_mean"]) for s in steps if "loss_mean" in records[s]]
            ax.plot([p[0] for p in mean], [p[1] for p in mean], alpha=0.6, label="mean since last log")
            ax.legend(fontsize=7)
        if is_fraction(key):
            ax.set_ylim(0, 1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Writes a matplotlib Figure to `path` (atomically, in the format its suffix names: a link
    planted there is replaced, not followed) and frees it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip("."), dpi=dpi)
    plt.close(fig)
    write_atomically(Path(path), buffer.getvalue())


def _panels(records: dict[int, dict], keys: list[tuple[str, str]], title: str, path: Path) -> None:
    save_figure(panels_figure(records, keys, title), path, dpi=90)


def write_plots(workdir: str | Path) -> list[Path]:
    """Redraws the plots from WORKDIR/metrics.jsonl; returns the files written."""
    workdir = Path(workdir)
    train, evaluation = read_records(workdir / "metrics.jsonl")
    out = workdir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    if train:
        keys = [(k, label) for k, label in TRAINING_PANELS if any(k in r for r in train.values())]
        _panels(train, keys, f"training ({workdir.name})", out / "training.png")
        written.append(out / "training.png")
    if evaluation:
        names = [k for k in dict.fromkeys(k for r in evaluation.values() for k in r) if k != "step"
                 and isinstance(next(iter(evaluation.values())).get(k), int | float)]
        _panels(evaluation, [(k, k) for k in names], f"evaluation ({workdir.name})", out / "eval.png")
        written.append(out / "eval.png")
    return written
