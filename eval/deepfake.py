"""Deepfake evaluation artifacts (the ROC plot) and per-video predictions; the metrics (as
DeepfakeBench computes them) are `triskele.train.metrics.deepfake`."""

from __future__ import annotations

import csv
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


def _videos_in(folder: Path) -> list[tuple[str, list[Path]]]:
    from triskele.train.data.images import IMAGE_SUFFIXES

    subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
    groups = [(p.name, sorted(f for f in p.iterdir() if f.suffix in IMAGE_SUFFIXES)) for p in subfolders]
    flat = sorted(f for f in folder.iterdir() if f.suffix in IMAGE_SUFFIXES)
    if flat:
        groups.append((folder.name, flat))
    for name, frames in groups:
        if not frames:
            raise ValueError(f"video folder {folder / name} holds no frames (.png/.jpg)")
    if not groups:
        raise ValueError(f"--input {folder} holds no frames: give a folder of frames or of video folders")
    return groups


def predict_folder(model, input_dir: Path, output_dir: Path, workdir: Path | None = None) -> dict[str, Any]:
    """Writes videos.csv (video, records, fake_probability) and, for the frame model, frames.csv.
    `model`: a LiveModel or an ExportedModel."""
    from triskele.train.data.deepfake import sample_uniformly
    from triskele.train.data.images import read_image

    meta = model.meta
    clip = meta["frames"]
    rows, inputs = [], []
    for name, frames in _videos_in(Path(input_dir)):
        chosen = sample_uniformly(frames, meta["options"]["frames_per_video"])
        if clip > 1:
            clip_paths = sample_uniformly(chosen, clip)
            if len(clip_paths) < clip:
                raise ValueError(f"video {name} has {len(clip_paths)} frames; the video model needs {clip}")
            inputs.append(np.stack([read_image(p, meta["image_size"], 3) for p in clip_paths]))
            rows.append((name, "clip"))
        else:
            for path in chosen:
                inputs.append(read_image(path, meta["image_size"], 3))
                rows.append((name, path.name))
    probabilities = model(np.stack(inputs))["fake_probability"]
    output_dir.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in rows]
    per_video: dict[str, list[float]] = {}
    for name, p in zip(names, probabilities, strict=True):
        per_video.setdefault(name, []).append(float(p))
    with (output_dir / "videos.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["video", "records", "fake_probability"])
        for name, values in per_video.items():
            writer.writerow([name, len(values), f"{np.mean(values):.6f}"])
    written = ["videos.csv"]
    if clip == 1:
        with (output_dir / "frames.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["video", "frame", "fake_probability"])
            for (name, frame), p in zip(rows, probabilities, strict=True):
                writer.writerow([name, frame, f"{float(p):.6f}"])
        written.append("frames.csv")
    return {"videos": len(per_video), "records": len(rows), "files": [str(output_dir / w) for w in written]}
