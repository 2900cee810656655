"""The cross-dataset table: one deepfake run scored on several test sets it never trained on, beside
the published rows of DeepfakeBench and of the papers that followed it.

    python bench/cross_dataset.py --workdir RUN --test CDF-v2=cdf2-frames/ --test DFDC=dfdc-frames/ \
        [--test UADFV=UADFV.json] [--frames-per-video 32] [--mesh SPEC] [--output DIR]

Each `--test NAME=PATH` is a tree `python -m triskele.train prepare deepfake` made (any layout it
reads: Celeb-DF, DFDC, DFDCP, UADFV, ...) or a DeepfakeBench dataset JSON, its layout detected
(`--layout` names one for every set). Its test split is evaluated exactly as
`python -m triskele.eval --workdir RUN --data PATH --frames-per-video N` evaluates it (the report
goes to DIR/<NAME>/): frame AUC, and video AUC over the mean of each video's frame probabilities
(DeepfakeBench's `training/metrics/utils.py`), with N frames sampled per video (default 32,
DeepfakeBench's test protocol). DIR/cross_dataset.md and DIR/cross_dataset.json hold the table:
the run's frame-level and video-level rows, then the published ones, each row saying its level and
where its figures come from. A NAME that is a published column (CDF-v1, CDF-v2, DFDC, DFDCP, UADFV,
in any case, with or without the dash; Celeb-DF-v2 and the like too) is set beside those figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

COLUMNS = ("CDF-v1", "CDF-v2", "DFDC", "DFDCP", "UADFV")
"""The published columns that a layout here reads (DeepfakeBench's DF-1.0, DFD and FaceShifter
are not among them)."""

DEEPFAKEBENCH = ("DeepfakeBench's README, cross-domain table (frame-level AUC; trained on FF++ c23), "
                 "github.com/SCLBD/DeepfakeBench at 8a4a7bf; Yan et al., NeurIPS 2023 Datasets and Benchmarks, "
                 "arXiv:2307.01426")
LSDA = ("Yan et al., Transcending Forgery Specificity with Latent Space Augmentation (LSDA), CVPR 2024, "
        "arXiv:2311.11278, cross-dataset table (frame-level AUC, FF++ c23, DeepfakeBench's protocol; SBI re-run "
        "there); the figures as quoted when this table was written, not re-read from the paper here")
SBI = ("Shiohara and Yamasaki, Detecting Deepfakes with Self-Blended Images, CVPR 2022, cross-dataset table "
       "(video-level AUC; EfficientNet-B4 trained on FF++ raw reals); as quoted when this table was written")


@dataclass(frozen=True)
class Published:
    detector: str
    level: str
    """frame or video."""
    trained_on: str
    auc: dict[str, float]
    source: str


PUBLISHED = (
    Published("Xception", "frame", "FF++ c23", {"CDF-v1": 0.7794, "CDF-v2": 0.7365, "DFDC": 0.7077, "DFDCP": 0.7374,
                                                "UADFV": 0.9379}, DEEPFAKEBENCH),
    Published("EfficientNet-B4", "frame", "FF++ c23", {"CDF-v1": 0.7909, "CDF-v2": 0.7487, "DFDC": 0.6955,
                                                       "DFDCP": 0.7283, "UADFV": 0.9472}, DEEPFAKEBENCH),
    Published("UCF", "frame", "FF++ c23", {"CDF-v1": 0.7793, "CDF-v2": 0.7527, "DFDC": 0.7191, "DFDCP": 0.7594,
                                           "UADFV": 0.9528}, DEEPFAKEBENCH),
    Published("SPSL", "frame", "FF++ c23", {"CDF-v1": 0.8150, "CDF-v2": 0.7650, "DFDC": 0.7040, "DFDCP": 0.7408,
                                            "UADFV": 0.9424}, DEEPFAKEBENCH),
    Published("SBI", "frame", "FF++ c23 reals", {"CDF-v2": 0.813}, LSDA),
    Published("LSDA", "frame", "FF++ c23", {"CDF-v2": 0.830}, LSDA),
    Published("SBI", "video", "FF++ raw reals", {"CDF-v2": 0.932}, SBI),
)


def published_column(name: str) -> str | None:
    """The published column a test set's name stands for (`cdf_v2`, `Celeb-DF-v2` -> CDF-v2), or None."""
    key = re.sub(r"[^a-z0-9]", "", name.lower()).replace("celebdf", "cdf")
    return next((column for column in COLUMNS if re.sub(r"[^a-z0-9]", "", column.lower()) == key), None)


def _test_set(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--test {text!r}: give NAME=PATH (e.g. CDF-v2=cdf2-frames/)")
    return name, Path(path)


def _trained_on(workdir: Path) -> str:
    """What the run trained on, in words, from its saved config."""
    try:
        config = json.loads((workdir / "config.json").read_text())
    except (OSError, ValueError):
        return "?"
    data = config.get("data", {}).get("path") or "synthetic faces"
    fakes = config.get("deepfake", {}).get("fakes", "supervised")
    return f"{data}, {'self-blended reals' if fakes == 'sbi' else 'its fakes'}"


def table(run: str, trained_on: str, sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows: the run's frame and video AUC per test set, then each published row's figures for
    the sets whose name is its column (None where it publishes none)."""
    rows = [{"detector": run, "level": level, "trained_on": trained_on, "source": "this run",
             "auc": {s["name"]: s[f"auc_{level}"] for s in sets}} for level in ("frame", "video")]
    for row in PUBLISHED:
        rows.append({**asdict(row), "auc": {s["name"]: row.auc.get(s["column"]) for s in sets}})
    return rows


def markdown(rows: list[dict[str, Any]], sets: list[dict[str, Any]]) -> str:
    sources = list(dict.fromkeys(r["source"] for r in rows if r["source"] != "this run"))
    head = ["detector", "level", "trained on", *(s["name"] for s in sets), "source"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [f"{row['auc'][s['name']]:.3f}" if row["auc"][s["name"]] is not None else "–" for s in sets]
        source = row["source"] if row["source"] == "this run" else f"[{sources.index(row['source']) + 1}]"
        lines.append("| " + " | ".join([row["detector"], row["level"], row["trained_on"], *cells, source]) + " |")
    lines += ["", "| test set | data | layout | videos | frames | frames per video |", "|---|---|---|---|---|---|"]
    lines += [f"| {s['name']} | {s['path']} | {s['layout']} | {s['videos']} | {s['records']} | "
              f"{s['frames_per_video']} |" for s in sets]
    lines += ["", "frame: AUC over every frame; video: AUC over each video's mean frame probability.", ""]
    lines += [f"[{i}] {source}" for i, source in enumerate(sources, 1)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="the run to score")
    parser.add_argument("--test", action="append", type=_test_set, required=True, metavar="NAME=PATH",
                        help="a prepared test set (or DeepfakeBench JSON); repeat for each")
    parser.add_argument("--frames-per-video", type=int, default=32, help="frames sampled per video (default 32)")
    parser.add_argument("--layout", help="the test sets' layout (default: each one's, detected)")
    parser.add_argument("--mesh", help="mesh spec (default: all local devices on data)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--output", default="cross_dataset", help="folder for the table and the reports")
    args = parser.parse_args(argv)
    from triskele.eval.report import evaluate_checkpoint
    from triskele.train.domains.deepfake.layouts import AUTO, find_layout

    workdir, out = Path(args.workdir), Path(args.output)
    sets, step = [], None
    for name, path in args.test:
        layout = find_layout(path, args.layout or AUTO).name
        report = evaluate_checkpoint(workdir, args.mesh, str(path), "test", args.step, out / name, layout=layout,
                                     frames_per_video=args.frames_per_video)
        metrics, step = report["metrics"], report["step"]
        sets.append({"name": name, "path": str(path), "layout": layout, "column": published_column(name),
                     "auc_frame": metrics["auc_frame"], "auc_video": metrics["auc_video"], "videos": metrics["videos"],
                     "records": metrics["records"], "frames_per_video": args.frames_per_video,
                     "report": report["report"]})
        print(f"{name}: frame AUC {metrics['auc_frame']:.4f}, video AUC {metrics['auc_video']:.4f} "
              f"({metrics['videos']} videos, {metrics['records']} frames)", flush=True)
    rows = table(f"triskele ({workdir.name}, step {step})", _trained_on(workdir), sets)
    from triskele.train.bookkeeping.files import write_atomically

    text = markdown(rows, sets)
    write_atomically(out / "cross_dataset.md", text.encode())
    payload = {"workdir": str(workdir.resolve()), "step": step, "test_sets": sets, "rows": rows}
    write_atomically(out / "cross_dataset.json", (json.dumps(payload, indent=2) + "\n").encode())
    print(text + f"wrote {out / 'cross_dataset.md'} and {out / 'cross_dataset.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
