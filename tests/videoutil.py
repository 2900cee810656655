"""Test videos made from a real photograph that scikit-image ships (the astronaut Eileen Collins):
pans, a fast slide, a zoom, a second smaller face, frames with the face covered, a plain wall; written with
OpenCV's mp4v codec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

FRAME = (320, 240)  # width, height
FACE = (179, 83, 266, 170)
"""The face's box in the 512 x 512 photograph (dlib, no upsampling)."""
FACE_POINTS = {"left eye": (204, 101), "right eye": (247, 104), "nose tip": (225, 127), "mouth left": (201, 140),
               "mouth right": (245, 141), "chin": (221, 178)}
"""Features of the face in the photograph (x, y), read by eye off a 4x enlargement: the pupils' centres,
the nose's tip, the corners of the mouth, the bottom of the chin."""


def photograph() -> np.ndarray:
    from skimage import data

    return data.astronaut()


def write_video(path: Path, frames: list[np.ndarray], fps: int = 10) -> Path:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    return path


def pan_offsets(count: int = 40) -> list[tuple[int, int]]:
    """(left, top) of each frame's window over the photograph: a pan left to right."""
    return [(int(round(x)), 20) for x in np.linspace(0, 120, count)]


def face_centre(offset: tuple[int, int]) -> tuple[float, float]:
    return (FACE[0] + FACE[2]) / 2 - offset[0], (FACE[1] + FACE[3]) / 2 - offset[1]


def pan(count: int = 40, covered: range = range(0), shift: tuple[int, int, int] = (0, 0, 0),
        second_face: range = range(0)) -> list[np.ndarray]:
    """Frames panning over the photograph; `covered` frames have the face painted over, `shift`
    adds to the colour channels (a crude 'manipulation'), `second_face` frames show a smaller copy
    of the face in the bottom left corner (a passer-by)."""
    photo = photograph().astype(np.int16)
    small = np.asarray(Image.fromarray(photograph()[60:190, 160:285]).resize((75, 78)))
    frames = []
    for i, (left, top) in enumerate(pan_offsets(count)):
        frame = photo[top : top + FRAME[1], left : left + FRAME[0]].copy() + np.array(shift, np.int16)
        if i in covered:
            cx, cy = face_centre((left, top))
            frame[int(cy) - 60 : int(cy) + 60, int(cx) - 60 : int(cx) + 60] = 128
        if i in second_face:
            frame[FRAME[1] - 80 : FRAME[1] - 2, 4:79] = small
        frames.append(np.clip(frame, 0, 255).astype(np.uint8))
    return frames


def slide(count: int = 40, step: int = 9) -> list[np.ndarray]:
    """854 x 480 frames (FWVGA) with the photograph's top 480 rows sliding right `step` pixels a frame
    over a grey background: the face (`face_centre((-step * i, 0))` in frame i) moves fast."""
    photo = photograph()[:480]
    frames = []
    for i in range(count):
        frame = np.full((480, 854, 3), 90, np.uint8)
        left = step * i
        frame[:, left:left + 512] = photo[:, :854 - left]
        frames.append(frame)
    return frames


def zoom(count: int = 24) -> list[np.ndarray]:
    """Frames zooming in on the face."""
    photo = Image.fromarray(photograph())
    frames = []
    for scale in np.linspace(1.0, 1.6, count):
        size = int(512 * scale)
        big = np.asarray(photo.resize((size, size), Image.BILINEAR))
        cx, cy = int(222 * scale), int(126 * scale)
        left, top = max(0, cx - FRAME[0] // 2), max(0, cy - FRAME[1] // 2)
        frames.append(np.ascontiguousarray(big[top : top + FRAME[1], left : left + FRAME[0]]))
    return frames


def wall(count: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.clip(150 + rng.normal(0, 3, (FRAME[1], FRAME[0], 3)), 0, 255).astype(np.uint8) for _ in range(count)]


def write_h264(path: Path, frames: list[np.ndarray], fps: int = 25, gop: int = 12, bframes: int = 2,
               open_gop: bool = False) -> Path:
    """An H.264 stream (libx264 through PyAV) with a keyframe every `gop` frames, `bframes` B-frames
    between references and, with `open_gop`, non-IDR keyframes that leading B-frames reach past."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        stream.options = {"g": str(gop), "bf": str(bframes),
                          "x264-params": f"open-gop={int(open_gop)}:scenecut=0:keyint-min={gop}"}
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return path
