"""Deepfake's evaluator: the model's per-frame scores over the split (as DeepfakeBench computes
its metrics, `triskele.train.domains.deepfake.metrics`), the ROC plot and, where the records carry
their manipulation family, the cross-manipulation bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn import metrics as skm
from triskele.train.bookkeeping.plots import save_figure
from triskele.train.data.pipeline import Source
from triskele.train.domains.deepfake.data import FAMILIES
from triskele.train.domains.deepfake.metrics import family_aucs, metrics
from triskele.train.evaluator import BatchEvaluator


def plot_roc(labels: np.ndarray, scores: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fpr, tpr, _ = skm.roc_curve(np.asarray(labels).astype(int), scores, pos_label=1)
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.plot(fpr, tpr, label=f"AUC {skm.auc(fpr, tpr):.3f}")
    ax.plot([0, 1], [0, 1], "k--", linewidth=0.8)
    ax.set_xlabel("false positive rate (real called fake)")
    ax.set_ylabel("true positive rate (fake caught)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)


def family_names(aucs: dict[str, float]) -> list[str]:
    """The families of the cross-manipulation table, in its order."""
    return [key.split("/", 1)[1] for key in aucs if key.startswith("auc_frame/")]


def unseen_families(options: Any, families: list[str], synthetic: bool) -> list[str]:
    """The families of `families` whose fakes the run's training never read: every one where it
    self-blended reals (`fakes=sbi`), else the held-out family and, on synthetic data, those no
    training recipe makes (a run on disk trains on every method there but the held-out one)."""
    if options.fakes == "sbi":
        return list(families)
    trained = set(FAMILIES) if synthetic else set(families)
    return [f for f in families if f not in trained or f == options.holdout]


def families_figure(aucs: dict[str, float], unseen: list[str], title: str):
    """The cross-manipulation table as bars: frame and video AUC per family, the families not seen
    in training hatched and named so, the 0.5 of a coin toss drawn; the legend right of the axes,
    clear of the bars. A matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    families = family_names(aucs)
    x = np.arange(len(families))
    hatches = ["//" if f in unseen else "" for f in families]
    fig, ax = plt.subplots(figsize=(1.2 * len(families) + 4, 3.8))
    for offset, level in ((-0.2, "frame"), (0.2, "video")):
        values = [aucs[f"auc_{level}/{f}"] for f in families]
        bars = ax.bar(x + offset, values, width=0.4, label=f"{level} AUC", hatch=hatches, edgecolor="white")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(0.5, color="k", linestyle="--", linewidth=0.8, label="chance (0.5)")
    ax.set_xticks(x, [f"{f}\n(unseen)" if f in unseen else f for f in families])
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("AUC (family's fakes vs all reals)")
    ax.set_title(title, fontsize=10)
    handles = ax.get_legend_handles_labels()[0]
    if unseen:
        handles.append(Patch(facecolor="white", hatch="//", edgecolor="gray", label="not seen in training"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


class DeepfakeEvaluator(BatchEvaluator):
    def __init__(self, parts: Any, for_report: bool = False):
        super().__init__(parts, metrics)

    def write_artifacts(self, params: Any, source: Source, totals: dict[str, Any], out_dir: Path) -> list[str]:
        plot_roc(totals["label"], totals["score"], out_dir / "roc.png", "frame-level ROC")
        aucs = family_aucs(totals)
        if not aucs:
            return ["roc.png"]
        config = self.parts.config
        unseen = unseen_families(config.options, family_names(aucs), synthetic=not config.data.path)
        title = f"AUC per manipulation family (trained on {_trained_on(config)})"
        save_figure(families_figure(aucs, unseen, title), out_dir / "families.png")
        return ["roc.png", "families.png"]


def _trained_on(config: Any) -> str:
    """What the run's training read as fakes, in words."""
    options = config.options
    if options.fakes == "sbi":
        return "self-blended reals only"
    return f"its data's fakes, {options.holdout} held out" if options.holdout else "its data's fakes"
