"""`python -m triskele.train prepare deepfake --input RAW --output DIR`: face-crop frames from videos.

A video tree in one of the layouts `triskele.train.domains.deepfake.layouts` reads (detected, or
`--layout NAME`): FaceForensics++ (`original_sequences/youtube/<c>/videos/*.mp4`,
`manipulated_sequences/<Method>/<c>/videos/*.mp4`, `splits/*.json`), Celeb-DF v1/v2, DFDC, DFDCP,
UADFV or a generic `[<split>/]{real,fake}/<video>.mp4` tree, becomes the frame layout the deepfake
loader reads: each video's folder `videos/` becomes `frames/`, and the video `<name>.mp4` a folder
`<name>/` of face crops `<frame index>.png`; the layout's label and split files are copied beside
them, so the prepared tree reads as the raw one did. `--crops aligned` (the default with the
landmarks extra, `pip install -e '.[landmarks]'`) aligns the crops on 5 landmarks and stores each
crop's 68 landmarks as DeepfakeBench does: `<name>/<frame index>.npy` in a `landmarks/` folder
beside `frames/` (or under `DIR/landmarks/` for a layout without `frames/` folders), in the crop's
pixels; `--crops box` (the default without it) crops the face box enlarged 1.3x and stores none. The
layout's files are checked first: a label that is not the layout's, or a listed video that is
missing, stops it with the file (and line) named. `DIR/manifest.json` records the layout and the
crops' method (`"crops"`, and `"landmarks"`: whether landmarks were stored) and lists per video the
frames decoded and sampled, the crops (their method) and landmarks written, and the frames left out
and why (no face, only other faces); a video that cannot be read, or is over an input limit (`--set
limits.<key>=N`: frame size and frame count, checked from its header), is listed with the reason and
the rest go on. Each finished video is recorded (`DIR/.prepare/`), so a rerun skips it (a rerun
whose method is not theirs is refused: one tree holds one kind of crop); videos run in parallel.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm
from triskele.train.bookkeeping.files import write_atomically
from triskele.train.bookkeeping.stop import INTERRUPTED_EXIT, StopRequest
from triskele.train.commands import Command, bounded, folder
from triskele.train.config.limits import add_limits_flag, input_limits
from triskele.train.config.schema import InputLimits
from triskele.train.data.walk import walk_files
from triskele.train.domains.deepfake.crops import ALIGNED, BOX, FACE_CROPS, check_aligner, crops_of_entries
from triskele.train.domains.deepfake.faces import CROP_SIZE, video_faces
from triskele.train.domains.deepfake.landmarks import INSTALL, landmark_predictor, landmarks_file
from triskele.train.domains.deepfake.layouts import AUTO, LAYOUTS, Layout, Tree, find_layout, frames_key, listed_present
from triskele.train.domains.deepfake.video import VIDEO_SUFFIXES


def frames_folder(video: Path, raw: Path, out: Path) -> Path:
    """Where a video's crops go: its path under `raw`, `videos` -> `frames`, the suffix dropped."""
    return out / frames_key(video.relative_to(raw).with_suffix("").as_posix())


def raw_layout(raw: Path, layout: str = AUTO) -> tuple[Layout, list[Path]]:
    """The layout of the raw tree `raw` and the label and split files to copy, its files checked: a
    ValueError naming the file when one contradicts the layout or lists a video that is missing."""
    if (raw.is_file() and raw.suffix.lower() == ".json") or (layout in LAYOUTS and LAYOUTS[layout].frames_only):
        raise ValueError(f"--input {raw}: a DeepfakeBench dataset JSON lists face crops its preprocessing made "
                         "already; nothing to prepare: give it to --data as it is")
    if not raw.is_dir():
        raise ValueError(f"--input {raw} {'is not a folder' if raw.exists() else 'does not exist'}: give the folder "
                         "of the raw video tree")
    found = find_layout(raw, layout, what="--input", option="--layout")
    tree = Tree(raw, prepared=False)
    listing = found.read(tree, None)
    listed_present(listing.videos, tree)
    return found, listing.files


def _record_path(out: Path, key: str) -> Path:
    return out / ".prepare" / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".json")


def prepare_video(task: tuple[Path, Path, Path, int, int, InputLimits, str]) -> dict[str, Any]:
    """One video -> its crops and its manifest entry (also written to DIR/.prepare/)."""
    video, raw, out, frames, size, limits, crops = task
    key = video.relative_to(raw).as_posix()
    entry: dict[str, Any] = {"video": key}
    try:
        faces = video_faces(video, frames, size, limits, crops=crops)
    except Exception as err:  # noqa: BLE001 - whatever one crafted video raises, the others are prepared
        entry["error"] = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        return entry
    folder = frames_folder(video, raw, out)
    for index, crop, landmarks in zip(faces.indices, faces.crops, faces.landmarks, strict=True):
        buffer = io.BytesIO()
        Image.fromarray(crop).save(buffer, format="PNG")
        write_atomically(folder / f"{index:06d}.png", buffer.getvalue())
        if landmarks is not None:
            buffer = io.BytesIO()
            np.save(buffer, landmarks)
            write_atomically(landmarks_file(folder / f"{index:06d}.png", out), buffer.getvalue())
    entry.update(frames=str(folder.relative_to(out)) if faces.crops else None, frames_decoded=faces.frames_decoded,
                 frames_in_video=faces.frames_in_video,
                 frames_sampled=faces.frames_sampled, frames_written=len(faces.crops), crops=crops,
                 landmarks_written=sum(points is not None for points in faces.landmarks),
                 left_out={str(i): why for i, why in faces.left_out.items()},
                 **({"reason": faces.reason} if faces.reason else {}))
    write_atomically(_record_path(out, key), json.dumps(entry).encode())
    return entry


def prepare_deepfake(raw: str | Path, out: str | Path, frames: int = 32, workers: int = 0, size: int = CROP_SIZE,
                     progress: bool = True, limits: InputLimits | None = None, layout: str = AUTO,
                     crops: str | None = None) -> dict[str, Any]:
    """Every video of `raw` into the frame layout in `out` (module docstring) with `crops` (None:
    aligned with the landmarks extra, else box); returns the summary."""
    raw, out, limits = Path(raw), Path(out), limits or InputLimits()
    if frames < 1:
        raise ValueError(f"--frames {frames} must be at least 1")
    if crops not in (None, *FACE_CROPS):
        raise ValueError(f"--crops {crops!r}: choose one of {', '.join(FACE_CROPS)}")
    if crops is None:  # a damaged model file stops here, not once per video
        crops = ALIGNED if landmark_predictor() is not None else BOX
    elif crops == ALIGNED:
        check_aligner("prepare --crops aligned asks for face crops aligned on 5 landmarks")
    found, files = raw_layout(raw, layout)
    videos = sorted(walk_files(raw, lambda p: p.suffix.lower() in VIDEO_SUFFIXES))
    if not videos:
        raise ValueError(f"--input {raw} holds no videos ({', '.join(VIDEO_SUFFIXES)}) for its {found.title} layout "
                         f"({found.expects})")
    for file in files:
        write_atomically(out / file.relative_to(raw), file.read_bytes())
    done = {v for v in videos if _record_path(out, v.relative_to(raw).as_posix()).is_file()}
    _check_same_crops(out, [_record_path(out, v.relative_to(raw).as_posix()) for v in sorted(done)], crops)
    todo = [(v, raw, out, frames, size, limits, crops) for v in videos if v not in done]
    started, entries = time.perf_counter(), []
    bar = tqdm(total=len(todo), disable=not progress, unit="video", dynamic_ncols=True)
    pool = multiprocessing.get_context("spawn").Pool(workers, _ignore_ctrl_c) if workers > 0 else None
    stop = StopRequest("prepare", "finishing the video in hand, then writing the manifest; the same command "
                       "again prepares the rest")
    try:
        with stop:
            for entry in (pool.imap_unordered(prepare_video, todo) if pool else map(prepare_video, todo)):
                entries.append(entry)
                bar.update(1)
                sampled = sum(e.get("frames_sampled", 0) for e in entries)
                bar.set_postfix(frames_s=f"{sampled / max(time.perf_counter() - started, 1e-9):.1f}")
                if stop.requested:
                    break
    finally:
        bar.close()
        if pool:
            pool.terminate() if stop.requested else pool.close()  # a video cut short has no record: redone
            pool.join()
    seconds = time.perf_counter() - started
    recorded = [json.loads(_record_path(out, v.relative_to(raw).as_posix()).read_text())
                for v in videos if _record_path(out, v.relative_to(raw).as_posix()).is_file()]
    errors = [e for e in entries if "error" in e]
    manifest = {"input": str(raw), "layout": found.name, "frames": frames, "size": size, "crops": crops,
                "landmarks": crops == ALIGNED, "videos": recorded + errors}
    write_atomically(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    sampled = sum(e.get("frames_sampled", 0) for e in entries)
    return {"videos": len(videos), "prepared": len(entries) - len(errors), "skipped": len(done),
            "unreadable": len(errors), "no_face": sum(1 for e in recorded if e.get("reason")),
            "frames_written": sum(e.get("frames_written", 0) for e in recorded), "seconds": round(seconds, 3),
            "frames_per_sec": round(sampled / seconds, 2) if seconds > 0 else 0.0, "output": str(out),
            "layout": found.name, "crops": "aligned on 5 landmarks, landmarks stored" if crops == ALIGNED else
            f"the face box enlarged 1.3x, no landmarks (--crops aligned for them: {INSTALL})",
            "interrupted": stop.requested}


def _check_same_crops(out: Path, records: list[Path], crops: str) -> None:
    """A ValueError naming OUT, its videos' method and the ways out when the videos done there were
    cropped otherwise than `crops`: one tree holds one kind of crop."""
    entries = [json.loads(record.read_text()) for record in records]
    done = crops_of_entries(entries, f"--output {out}")
    if done not in (None, crops):
        raise ValueError(f"--output {out} holds videos prepared with {done} face crops; this run would add {crops} "
                         f"ones, and a tree holds one kind: give --crops {done} to finish it, or a new --output")


def _ignore_ctrl_c() -> None:
    """In a worker: Ctrl-C is for the parent, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare_command(parser: argparse.ArgumentParser):
    parser.add_argument("--input", required=True, help="the raw video tree")
    parser.add_argument("--output", required=True, type=folder, help="where the frame layout goes")
    parser.add_argument("--frames", type=bounded(int, 1), default=32, help="frames sampled per video (default 32)")
    parser.add_argument("--size", type=bounded(int, 8), default=CROP_SIZE,
                        help=f"crop side in pixels (default {CROP_SIZE})")
    parser.add_argument("--workers", type=bounded(int, 0), default=0, help="worker processes (default 0: this one)")
    parser.add_argument("--layout", default=AUTO, choices=(AUTO, *LAYOUTS),
                        help="the raw tree's layout (default: auto, detected)")
    parser.add_argument("--crops", choices=FACE_CROPS, default=None,
                        help="how faces are cropped: aligned on 5 landmarks (needs the landmarks extra) or the "
                             "detector's box enlarged 1.3x (default: aligned with the extra installed, else box)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_limits_flag(parser, ("frame_pixels", "video_frames"))

    def run(args: argparse.Namespace) -> int:
        summary = prepare_deepfake(args.input, args.output, args.frames, args.workers, args.size,
                                   not args.no_progress, input_limits(args.set), args.layout, args.crops)
        print(json.dumps(summary, indent=2))
        if summary["unreadable"]:
            print(_failures(Path(args.output), summary["videos"]), file=sys.stderr)
        if summary["interrupted"]:
            left = summary["videos"] - summary["skipped"] - summary["prepared"] - summary["unreadable"]
            print(f"prepare stopped: {left} videos not prepared yet; run the same command again to prepare them "
                  "(what is written is kept)", file=sys.stderr)
            return INTERRUPTED_EXIT
        return 1 if summary["unreadable"] else 0

    return run


def _failures(out: Path, videos: int) -> str:
    """The videos that failed, each with its reason, from OUT's manifest: what a user must fix."""
    failed = [e for e in json.loads((out / "manifest.json").read_text())["videos"] if "error" in e]
    others = " (the others are prepared)" if len(failed) < videos else ""
    lines = [f"{len(failed)} of {videos} videos failed{others}; a rerun retries only these:"]
    return "\n".join(lines + [f"  {e['video']}: {e['error']}" for e in failed])


PREPARE = Command(__doc__, _prepare_command)
