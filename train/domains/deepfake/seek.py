"""Decoding only the frames a sample keeps (PyAV): one demux pass reads the stream's packets'
timestamps and keyframe flags without decoding anything (so the frame count is the stream's, not
the header's), then each kept frame is decoded forward from the keyframe at or before it, a seek
made only where that keyframe lies past what was already decoded. Frames are matched to their
display-order index by timestamp, so B-frames, an open GOP and a header that lies give the frames
a full decode gives at the same indices, pixel for pixel (PyAV converts to RGB as OpenCV does)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.config.schema import InputLimits

UNIFORM, KEYFRAMES = "uniform", "keyframes"
SAMPLING = (UNIFORM, KEYFRAMES)
"""How the kept frames are chosen (`--sample`): spread uniformly over the stream's frames
(DeepfakeBench's protocol), or runs of frames starting at keyframes spread uniformly over the
keyframes, so that every frame decoded is a frame kept."""


@dataclasses.dataclass(frozen=True)
class StreamIndex:
    """A video stream's frames in display order: each frame's timestamp and whether it is a
    keyframe (a point decoding can start from)."""

    timestamps: list[int]
    keyframes: list[bool]
    width: int
    height: int

    def seek_point(self, index: int) -> int:
        """The display index of the last keyframe at or before frame `index` (0 if none is)."""
        return next((k for k in range(index, -1, -1) if self.keyframes[k]), 0)


def _av():
    import av

    av.logging.set_level(None)  # FFmpeg's own lines stay off stderr: every failure is an error naming the file
    return av


def _open(path: Path, limits: InputLimits):
    """(container, its first video stream), the header's frame size and frame count checked."""
    av = _av()
    if not path.is_file() or path.stat().st_size == 0:
        raise ValueError(f"cannot read video {path}: the file is empty or missing")
    try:
        container = av.open(str(path))
    except (av.FFmpegError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read video {path}: FFmpeg cannot open it ({err})") from None
    if not container.streams.video:
        container.close()
        raise ValueError(f"cannot read video {path}: it holds no video stream")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    try:
        limits.check("frame_pixels", width * height, f"cannot read video {path}: its frames are {width}x{height} =")
        limits.check("video_frames", max(stream.frames, 0), f"cannot read video {path}: its header declares")
    except ValueError:
        container.close()
        raise
    return container, stream


def stream_index(path: Path, limits: InputLimits | None = None) -> StreamIndex | None:
    """The video's frames from one demux pass (no decoding); None where its packets carry no
    timestamps to order them by (the caller decodes the whole stream instead). Refused from the
    header, or as soon as the packets pass `limits.video_frames`."""
    av, limits = _av(), limits or InputLimits()
    container, stream = _open(path, limits)
    packets: list[tuple[int, bool]] = []
    try:
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            if packet.pts is None:
                return None
            limits.check("video_frames", len(packets) + 1, f"cannot read video {path}: its stream holds at least")
            packets.append((packet.pts, packet.is_keyframe))
    except av.FFmpegError as err:
        raise ValueError(f"cannot read video {path}: demuxing failed after {len(packets)} packets: {err}") from None
    finally:
        width, height = stream.codec_context.width, stream.codec_context.height
        container.close()
    packets.sort()
    return StreamIndex([pts for pts, _ in packets], [key for _, key in packets], width, height)


def uniform_indices(total: int, count: int) -> list[int]:
    """`count` frame indices spread evenly over `total` frames (all of them if there are fewer)."""
    if total <= count:
        return list(range(total))
    return sorted(set(np.linspace(0, total - 1, count).round().astype(int).tolist()))


def keyframe_runs(index: StreamIndex, count: int) -> list[int]:
    """`count` frames (all, if the stream has fewer) as runs that start at keyframes spread
    uniformly over the stream's keyframes, each run at most as long as its group of pictures."""
    total = len(index.timestamps)
    if total <= count:
        return list(range(total))
    starts = [k for k, key in enumerate(index.keyframes) if key] or [0]
    chosen = [starts[i] for i in uniform_indices(len(starts), count)]
    run = math.ceil(count / len(chosen))
    frames = []
    for start in chosen:
        end = next((k for k in starts if k > start), total)
        frames += range(start, min(start + run, end))
    return sorted(frames)[:count]


def decode_at(path: Path, index: StreamIndex, wanted: list[int], limits: InputLimits,
              each: Callable[[np.ndarray], Any]) -> tuple[list[int], list[Any], int]:
    """(the frames of `wanted` that decoded, `each` of them as RGB uint8, frames decoded), each
    decoded forward from its `seek_point`; a seek only where that keyframe lies past the last
    frame decoded. A wanted frame the decoder never gives (a truncated or damaged stream) is left
    out; the caller decides what that means."""
    av = _av()
    container, stream = _open(path, limits)
    by_time = {index.timestamps[k]: k for k in wanted}
    got: dict[int, Any] = {}
    frames, position, floor, decoded = None, None, 0, 0
    try:
        for target in sorted(set(wanted)):
            if target in got:
                continue
            start = index.seek_point(target)
            if frames is None or position is None or index.timestamps[start] > position:
                floor = index.timestamps[start]
                container.seek(floor, stream=stream, backward=True, any_frame=False)
                frames = _frames(container, stream)
            for frame in frames:
                decoded += 1
                position = frame.pts
                found = by_time.get(frame.pts) if frame.pts is not None and frame.pts >= floor else None
                if found is not None and found not in got:
                    limits.check("frame_pixels", frame.width * frame.height,
                                 f"cannot read video {path}: a frame is {frame.width}x{frame.height} =")
                    got[found] = each(frame.to_ndarray(format="rgb24"))
                if position is not None and position >= index.timestamps[target]:
                    break
            else:
                break
    except av.FFmpegError as err:
        raise ValueError(f"cannot read video {path}: decoding failed after {decoded} frames: {err}") from None
    finally:
        container.close()
    indices = sorted(got)
    return indices, [got[k] for k in indices], decoded


def _frames(container, stream):
    """Decoded frames from the container's current position, the decoder drained at the end."""
    for packet in container.demux(stream):
        yield from packet.decode()
