"""Deepfake's evaluator: the model's per-frame scores over the split (as DeepfakeBench computes
its metrics, `triskele.train.domains.deepfake.metrics`), the ROC plot and, where the records carry
their manipulation family, the cross-manipulation bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn import metrics as skm
from triskele.train.data.pipeline import Source
from triskele.train.domains.deepfake.metrics import family_aucs, metrics
from triskele.train.evaluation import BatchEvaluator


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
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_families(aucs: dict[str, float], path: Path) -> None:
    """The cross-manipulation table as bars: frame and video AUC per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [key.split("/", 1)[1] for key in aucs if key.startswith("auc_frame/")]
    x = np.arange(len(families))
    fig, ax = plt.subplots(figsize=(1.2 * len(families) + 2, 3.5))
    for offset, level in ((-0.2, "frame"), (0.2, "video")):
        values = [aucs[f"auc_{level}/{f}"] for f in families]
        bars = ax.bar(x + offset, values, width=0.4, label=f"{level} AUC")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(0.5, color="k", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, families)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("AUC (family's fakes vs all reals)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class DeepfakeEvaluator(BatchEvaluator):
    def __init__(self, parts: Any, for_report: bool = False):
        super().__init__(parts, metrics)

    def write_artifacts(self, params: Any, source: Source, totals: dict[str, Any], out_dir: Path) -> list[str]:
        plot_roc(totals["label"], totals["score"], out_dir / "roc.png", "frame-level ROC")
        aucs = family_aucs(totals)
        if not aucs:
            return ["roc.png"]
        plot_families(aucs, out_dir / "families.png")
        return ["roc.png", "families.png"]
