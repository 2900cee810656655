"""Deepfake evaluation artifacts (the ROC plot) and per-video predictions; the metrics (as
DeepfakeBench computes them) are `triskele.train.metrics.deepfake`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn import metrics as skm


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


def write_artifacts(parts, params, source, totals, out_dir: Path) -> list[str]:
    plot_roc(totals["label"], totals["score"], out_dir / "roc.png", "frame-level ROC")
    return ["roc.png"]


class DeepfakeIO:
    """Inputs are videos: each folder of frames is one (frames directly under the input root form
    one named after the root). The frame model scores `frames_per_video` frames sampled uniformly and
    a video gets their mean; the video model scores one clip of `model.frames` of them.
    `videos.csv` (video, records, fake_probability) and, for the frame model, `frames.csv`."""

    def __init__(self, meta: dict[str, Any]):
        from triskele.train.data.images import IMAGE_SUFFIXES

        self.size, self.clip = meta["image_size"], meta["frames"]
        self.per_video = meta["options"]["frames_per_video"]
        self.suffixes = tuple(sorted({s.lower() for s in IMAGE_SUFFIXES}))

    def units(self, root: Path, files: list[Path]):
        from triskele.eval.engine import Unit
        from triskele.eval.inputs import relative_name

        videos: dict[Path, list[Path]] = {}
        for frame in files:
            videos.setdefault(frame.parent, []).append(frame)
        return [Unit(root.name if folder.resolve() == root.resolve() else relative_name(folder, root),
                     tuple(sorted(frames))) for folder, frames in sorted(videos.items())]

    def read(self, unit) -> tuple[np.ndarray, Any]:
        from triskele.train.data.deepfake import sample_uniformly
        from triskele.train.data.images import read_image

        chosen = sample_uniformly(list(unit.paths), self.per_video)
        if self.clip > 1:
            clip = sample_uniformly(chosen, self.clip)
            if len(clip) < self.clip:
                raise ValueError(f"video {unit.key} has {len(clip)} frames; the video model needs {self.clip}")
            return np.stack([read_image(p, self.size, 3) for p in clip])[None], ["clip"]
        return np.stack([read_image(p, self.size, 3) for p in chosen]), [p.name for p in chosen]

    def write(self, unit, context, outputs: dict[str, np.ndarray], out_dir: Path) -> dict[str, Any]:
        scores = [float(p) for p in outputs["fake_probability"]]
        return {"video": unit.key, "records": len(scores), "fake_probability": float(np.mean(scores)),
                "frames": [[name, score] for name, score in zip(context, scores, strict=True)]}

    def finish(self, rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
        from triskele.eval.engine import write_csv

        written = ["videos.csv"]
        write_csv(out_dir / "videos.csv", ["video", "records", "fake_probability"],
                   [[r["video"], r["records"], f"{r['fake_probability']:.6f}"] for r in rows])
        if self.clip == 1:
            write_csv(out_dir / "frames.csv", ["video", "frame", "fake_probability"],
                       [[r["video"], name, f"{p:.6f}"] for r in rows for name, p in r["frames"]])
            written.append("frames.csv")
        return written


def predict_io(meta: dict[str, Any], options) -> DeepfakeIO:
    return DeepfakeIO(meta)
