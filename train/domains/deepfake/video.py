"""Video files: frames sampled uniformly over the frames actually decoded (a container's frame
count is not trusted), with errors that name the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")


def _capture(path: Path):
    import cv2

    if not path.is_file() or path.stat().st_size == 0:
        raise ValueError(f"cannot read video {path}: the file is empty or missing")
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise ValueError(f"cannot read video {path}: OpenCV cannot open it (not a video, or a codec it lacks)")
    return capture


def count_frames(path: Path) -> int:
    """Frames that decode, counted by reading the stream to its end (no pixels converted)."""
    capture = _capture(path)
    try:
        count = 0
        while capture.grab():
            count += 1
    finally:
        capture.release()
    return count


def uniform_indices(total: int, count: int) -> list[int]:
    """`count` frame indices spread evenly over `total` frames (all of them if there are fewer)."""
    if total <= count:
        return list(range(total))
    return sorted(set(np.linspace(0, total - 1, count).round().astype(int).tolist()))


def sample_frames(path: Path, count: int) -> tuple[list[int], list[np.ndarray], int]:
    """(indices, RGB uint8 frames, frames decoded) of `count` frames sampled uniformly over the
    frames that actually decode; a video with none is an error naming the file."""
    path = Path(path)
    total = count_frames(path)
    if total == 0:
        raise ValueError(f"cannot read video {path}: no frame decodes (truncated or damaged)")
    wanted = uniform_indices(total, count)
    import cv2

    capture = _capture(path)
    frames, indices, position = [], [], 0
    try:
        for index in wanted:
            while position < index and capture.grab():
                position += 1
            ok, frame = capture.read()
            position += 1
            if not ok:
                break
            indices.append(index)
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))  # OpenCV decodes BGR
    finally:
        capture.release()
    if not frames:
        raise ValueError(f"cannot read video {path}: no frame decodes (truncated or damaged)")
    return indices, frames, total
