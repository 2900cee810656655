"""Video files: frames sampled over the frames the stream holds (a container's frame count is not
trusted), only those decoded (`seek`) or the whole stream (`all`), with errors that name the file;
refused from the header (frame size, frame count) or as soon as the stream passes
`limits.video_frames`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.config.schema import InputLimits
from triskele.train.domains.deepfake.seek import KEYFRAMES, SAMPLING, UNIFORM, uniform_indices

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")


def video_suffix(head: bytes) -> str | None:
    """The suffix of the container whose signature `head` (a file's first 16 bytes) starts with:
    '.mp4' for ISO media (MP4, MOV: 'ftyp' at byte 4), '.mkv' for Matroska/WebM (EBML), '.avi' for
    RIFF AVI; None for anything else (a video sent as bytes has no name to go by)."""
    if head[4:8] == b"ftyp":
        return ".mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return ".mkv"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return ".avi"
    return None


def opencv():
    """OpenCV with its FFmpeg backend and its own logger quiet: they write raw (not always UTF-8)
    bytes to stderr for damaged videos, which breaks tools reading the output as text, while every
    failure here is an error naming the file. `OPENCV_FFMPEG_LOGLEVEL` or `OPENCV_LOG_LEVEL` set in
    the environment win (to debug a video)."""
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when FFmpeg is first opened
    os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
    import cv2

    if os.environ["OPENCV_LOG_LEVEL"] == "SILENT":
        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # also when cv2 came in before
    return cv2


def _capture(path: Path, limits: InputLimits):
    """The opened video, its header checked: (capture, frame count the header declares, 0 if none)."""
    cv2 = opencv()

    if not path.is_file() or path.stat().st_size == 0:
        raise ValueError(f"cannot read video {path}: the file is empty or missing")
    capture = cv2.VideoCapture(str(path))
    if not capture.isOpened():
        raise ValueError(f"cannot read video {path}: OpenCV cannot open it (not a video, or a codec it lacks)")
    width, height = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
    declared = max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), 0)
    try:
        limits.check("frame_pixels", width * height, f"cannot read video {path}: its frames are {width}x{height} =")
        limits.check("video_frames", declared, f"cannot read video {path}: its header declares")
    except ValueError:
        capture.release()
        raise
    return capture, declared


def _decode(path: Path, count: int, limits: InputLimits, each: Callable[[np.ndarray], Any], total: int | None = None
            ) -> tuple[list[int], list[Any], int, int]:
    """One pass over the video keeping `count` frames spread uniformly over `total` frames (default:
    the count its header declares): (their indices, `each` of those RGB frames, frames decoded,
    frames the header declares). Stops with an error past `limits.video_frames`."""
    cv2 = opencv()

    capture, declared = _capture(path, limits)
    wanted = set(uniform_indices(declared if total is None else total, count))
    indices, kept, position = [], [], 0
    try:
        while capture.grab():
            limits.check("video_frames", position + 1, f"cannot read video {path}: it decodes at least")
            if position in wanted:
                ok, frame = capture.retrieve()
                if not ok:
                    break
                height, width = frame.shape[:2]
                limits.check("frame_pixels", width * height, f"cannot read video {path}: a frame is {width}x{height} =")
                indices.append(position)
                kept.append(each(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)))  # OpenCV decodes BGR
            position += 1
    except cv2.error as err:
        raise ValueError(f"cannot read video {path}: decoding failed at frame {position}: {err}") from None
    finally:
        capture.release()
    return indices, kept, position, declared


def count_frames(path: Path, limits: InputLimits | None = None) -> int:
    """Frames that decode, counted by reading the stream to its end (no pixels converted)."""
    return _decode(Path(path), 0, limits or InputLimits(), lambda frame: frame)[2]


SEEK, ALL = "seek", "all"
DECODING = (SEEK, ALL)
"""How the kept frames are reached (`--decode`): decoded forward from the keyframe before each
(`seek`), or the whole stream decoded (`all`, the path this project took first, kept to compare)."""


@dataclasses.dataclass
class SampledFrames:
    """What sampling a video gave: the kept frames' display indices, `each` of those frames, the
    frames the stream holds and the frames decoded to reach them."""

    indices: list[int]
    frames: list[Any]
    total: int
    decoded: int


def sample_frames(path: Path, count: int, limits: InputLimits | None = None,
                  each: Callable[[np.ndarray], Any] | None = None, *, sample: str = UNIFORM,
                  decode: str = SEEK) -> SampledFrames:
    """`count` frames chosen by `sample` (`seek.SAMPLING`) over the frames the stream holds, as RGB
    uint8 arrays or what `each` makes of each one as it is decoded (so only that is kept); a video
    with none is an error naming the file. `decode` seek: one demux pass counts the stream's frames
    (a header that lies or only estimates is not trusted), then only the kept frames are decoded,
    each from the keyframe before it (`seek.decode_at`); where a kept frame does not decode (a
    truncated stream) or the packets carry no timestamps, the whole stream is decoded as `all` does.
    `all`: the whole stream decoded once, the sample planned from the header's frame count, and
    decoded again over the frames that did decode where that count proves wrong."""
    from triskele.train.domains.deepfake.seek import decode_at, keyframe_runs, stream_index

    path, limits, each = Path(path), limits or InputLimits(), each or (lambda frame: frame)
    if sample not in SAMPLING:
        raise ValueError(f"--sample {sample!r}: choose {' or '.join(SAMPLING)}")
    if decode not in DECODING:
        raise ValueError(f"--decode {decode!r}: choose {' or '.join(DECODING)}")
    if decode == SEEK and (index := stream_index(path, limits)) is not None:
        total = len(index.timestamps)
        wanted = keyframe_runs(index, count) if sample == KEYFRAMES else uniform_indices(total, count)
        indices, kept, decoded = decode_at(path, index, wanted, limits, each)
        if indices == wanted and kept:
            return SampledFrames(indices, kept, total, decoded)
    indices, kept, total, declared = _decode(path, count, limits, each)
    decoded = total
    if total != declared and total:
        indices, kept, total, _ = _decode(path, count, limits, each, total)
        decoded += total
    if not kept:
        raise ValueError(f"cannot read video {path}: no frame decodes (truncated or damaged)")
    return SampledFrames(indices, kept, total, decoded)
