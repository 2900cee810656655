"""Faces as DeepfakeBench finds them: dlib's HOG frontal face detector on RGB frames, the face
followed through a video as the largest track (boxes linked frame to frame by IoU, so a passer-by
does not switch the identity), the box enlarged 1.3x about its centre, made square, clipped to the
frame and resized. A frame without the tracked face is counted and left out, with its reason."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
from PIL import Image
from triskele.train.config import InputLimits

ENLARGE = 1.3
TRACK_IOU = 0.3
CROP_SIZE = 256
"""Pixels per side of a saved face crop (DeepfakeBench's); the model resizes to its input."""

Box = tuple[int, int, int, int]
"""(left, top, right, bottom) in pixels."""

_LOCAL = threading.local()


def detect_faces(frame: np.ndarray) -> list[Box]:
    """Every frontal face dlib's HOG detector finds in an RGB frame (upsampled once when the
    frame's shorter side is under 480 pixels, so faces from about 40 pixels are found)."""
    if not hasattr(_LOCAL, "detector"):  # one per thread: a detector is neither shareable nor picklable
        import dlib

        _LOCAL.detector = dlib.get_frontal_face_detector()
    upsample = 1 if min(frame.shape[:2]) < 480 else 0
    return [(r.left(), r.top(), r.right(), r.bottom()) for r in _LOCAL.detector(np.ascontiguousarray(frame), upsample)]


def iou(a: Box, b: Box) -> float:
    inter = max(0, min(a[2], b[2]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def largest_track(boxes: list[list[Box]]) -> list[Box | None]:
    """Per frame, the box of the track with the largest total area (None where it is absent).
    A box joins the track whose latest box overlaps it most (IoU >= 0.3), else starts one."""
    tracks: list[dict] = []
    for frame, found in enumerate(boxes):
        for box in sorted(found, key=lambda b: -(b[2] - b[0]) * (b[3] - b[1])):
            best = max((t for t in tracks if t["last"] < frame), key=lambda t: iou(t["boxes"][t["last"]], box),
                       default=None)
            if best is not None and iou(best["boxes"][best["last"]], box) >= TRACK_IOU:
                best["boxes"][frame], best["last"] = box, frame
            else:
                tracks.append({"boxes": {frame: box}, "last": frame})
    if not tracks:
        return [None] * len(boxes)
    chosen = max(tracks, key=lambda t: sum((b[2] - b[0]) * (b[3] - b[1]) for b in t["boxes"].values()))
    return [chosen["boxes"].get(frame) for frame in range(len(boxes))]


def crop_face(frame: np.ndarray, box: Box, size: int = CROP_SIZE) -> np.ndarray:
    """The box enlarged 1.3x about its centre, made square, clipped to the frame, resized to
    size x size (RGB uint8)."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    half = max(box[2] - box[0], box[3] - box[1]) * ENLARGE / 2
    height, width = frame.shape[:2]
    left, top = max(0, int(round(cx - half))), max(0, int(round(cy - half)))
    right, bottom = min(width, int(round(cx + half))), min(height, int(round(cy + half)))
    return np.asarray(Image.fromarray(frame[top:bottom, left:right]).resize((size, size), Image.BILINEAR))


@dataclasses.dataclass
class VideoFaces:
    """What a video gave: its sampled frames' indices, the tracked face's box and crop per frame
    with a face, and why each other frame was left out."""

    frames_decoded: int
    frames_sampled: int
    indices: list[int]
    boxes: list[Box]
    crops: list[np.ndarray]
    left_out: dict[int, str]

    @property
    def reason(self) -> str | None:
        return None if self.crops else f"no face in any of {self.frames_sampled} sampled frames"


def _faces_in(frame: np.ndarray, size: int) -> tuple[list[Box], dict[Box, np.ndarray] | np.ndarray]:
    """A sampled frame's face boxes and what is kept of it until the track is known: each box's
    crop, or the frame itself where its crops would outweigh it (a crowd)."""
    boxes = detect_faces(frame)
    if len(boxes) * size * size > frame.shape[0] * frame.shape[1]:
        return boxes, frame
    return boxes, {box: crop_face(frame, box, size) for box in boxes}


def video_faces(path: Path, frames: int, size: int = CROP_SIZE, limits: InputLimits | None = None) -> VideoFaces:
    """`frames` frames sampled uniformly over the decoded ones (the video read within `limits`),
    the largest face track cropped. Each frame's faces are found as it is decoded, so what is held
    per sampled frame is its face crops or, if smaller, the frame."""
    from triskele.train.domains.deepfake.video import sample_frames

    indices, found, total = sample_frames(Path(path), frames, limits, lambda frame: _faces_in(frame, size))
    track = largest_track([boxes for boxes, _ in found])
    faces = VideoFaces(total, len(found), [], [], [], {})
    for index, (boxes, kept), box in zip(indices, found, track, strict=True):
        if box is None:
            faces.left_out[index] = "no face" if not boxes else "only faces off the tracked one"
            continue
        faces.indices.append(index)
        faces.boxes.append(box)
        faces.crops.append(kept[box] if isinstance(kept, dict) else crop_face(kept, box, size))
    return faces


def crop_face_region(size: int) -> np.ndarray:
    """Where the face is in a face crop with no landmarks: the ellipse inscribed in the crop's inner
    box (the detector's box, which the crop enlarged `ENLARGE` times about its centre)."""
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    radius = size / ENLARGE / 2
    return ((((rows - size / 2) / radius) ** 2 + ((cols - size / 2) / radius) ** 2) < 1).astype(np.float64)
