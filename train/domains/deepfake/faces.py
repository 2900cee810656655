"""Faces as DeepfakeBench finds them: dlib's HOG frontal face detector on RGB frames, the face
followed through a video as its main track (boxes of sampled frames linked by how far the face
moved for its size, so a face that moves between sparse samples stays one track and a passer-by
does not switch the identity; the track chosen by its size, the detector's confidence and the
frames it is in, so a face-like badge larger than the face does not win), the box enlarged 1.3x
about its centre, made square, clipped to the frame and resized; or, for aligned crops (`crops`:
the landmarks extra), the face's 68 landmarks found in its box and the crop aligned on 5 of them
(`align`), the landmarks kept in the crop's pixels. A frame without the tracked face is counted and
left out, with its reason."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
from PIL import Image
from triskele.train.config.schema import InputLimits
from triskele.train.domains.deepfake.align import aligned_crop
from triskele.train.domains.deepfake.crops import BOX, check_face_crops
from triskele.train.domains.deepfake.detectors import BLAZEFACE, DLIB, check_face_detector
from triskele.train.domains.deepfake.landmarks import INSTALL, face_landmarks
from triskele.train.domains.deepfake.seek import UNIFORM
from triskele.train.domains.deepfake.video import SEEK

ENLARGE = 1.3
TRACK_REACH = 1.0
"""Face sizes a face's centre may move per sampled frame between two boxes of one track."""
TRACK_SCALE = 1.5
"""Times a face's size may change between two boxes of one track."""
CONFIDENCE_FLOOR = 0.05
"""Added to dlib's detection score (0 at its threshold) so that a box the detector barely accepts
still counts for its size and frames."""
LANDMARK_NUDGE = 0.1
"""How far (in box sizes) `landmarks_hold` moves a box to see whether its 68 points move with it."""
LANDMARK_DRIFT = 0.35
"""A face's landmarks stay on its features when its box moves (measured: 0.04-0.05 of the shift on
the astronaut's face); on a face-like pattern they follow the box (0.6-1.4 on her mission patch,
a rocket and a cat). Below this they fit a face."""
CROP_SIZE = 256
"""Pixels per side of a saved face crop (DeepfakeBench's); the model resizes to its input."""

Box = tuple[int, int, int, int]
"""(left, top, right, bottom) in pixels."""

_LOCAL = threading.local()


def scored_faces(frame: np.ndarray) -> list[tuple[Box, float]]:
    """Every frontal face dlib's HOG detector finds in an RGB frame with its detection score (the
    SVM's margin over its threshold, 0), upsampled once when the frame's shorter side is under 480
    pixels, so faces from about 40 pixels are found."""
    if not hasattr(_LOCAL, "detector"):  # one per thread: a detector is neither shareable nor picklable
        import dlib

        _LOCAL.detector = dlib.get_frontal_face_detector()
    upsample = 1 if min(frame.shape[:2]) < 480 else 0
    rects, scores, _ = _LOCAL.detector.run(np.ascontiguousarray(frame), upsample, 0.0)
    return [((r.left(), r.top(), r.right(), r.bottom()), float(score)) for r, score in zip(rects, scores, strict=True)]


def detect_faces(frame: np.ndarray) -> list[Box]:
    """The boxes of `scored_faces`."""
    return [box for box, _ in scored_faces(frame)]


def _centre_and_size(box: Box) -> tuple[float, float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2, max(box[2] - box[0], box[3] - box[1], 1)


def link_cost(last: Box, box: Box, samples_apart: int) -> float | None:
    """How far `box` lies from a track's `last` box: the centres' distance in face sizes (the larger
    of the two) per sampled frame between them; None beyond `TRACK_REACH` or when the size changes
    more than `TRACK_SCALE` times (another face, not this one moved)."""
    (x0, y0, s0), (x1, y1, s1) = _centre_and_size(last), _centre_and_size(box)
    if max(s0, s1) > TRACK_SCALE * min(s0, s1):
        return None
    cost = float(np.hypot(x1 - x0, y1 - y0)) / max(s0, s1) / samples_apart
    return cost if cost <= TRACK_REACH else None


def track_weight(track: dict[int, Box], scores: dict[int, float]) -> float:
    """How much a track is the video's face: over the frames it is in, each box's size (its longer
    side) times the detector's confidence in it (`scores` by frame; `CONFIDENCE_FLOOR` added). A
    face present in more frames, or found more surely, outweighs a larger box found once or barely
    (a mission patch on a suit: dlib scores 0.12 where the face scores 1.16)."""
    return sum(_centre_and_size(box)[2] * (max(scores.get(frame, 1.0), 0.0) + CONFIDENCE_FLOOR)
               for frame, box in track.items())


def landmarks_hold(frame: np.ndarray, box: Box) -> bool | None:
    """Whether the 68 landmarks in `box` fit a face: dlib's predictor starts from a mean face in
    whatever box it is given, so its points stay on a real face's features when the box is nudged
    (`LANDMARK_NUDGE` of its size, four ways) and drift with the box on anything else
    (`LANDMARK_DRIFT`). None without the landmarks extra."""
    points = face_landmarks(frame, box)
    if points is None:
        return None
    side = _centre_and_size(box)[2]
    step = round(LANDMARK_NUDGE * side)
    drift = [float(np.linalg.norm(face_landmarks(frame, (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy))
                                  - points, axis=1).mean()) / max(step, 1)
             for dx, dy in ((step, 0), (-step, 0), (0, step), (0, -step))]
    return float(np.mean(drift)) < LANDMARK_DRIFT


def main_track(boxes: list[list[Box]], scores: list[list[float]] | None = None,
               holds: list[list[bool | None]] | None = None) -> list[Box | None]:
    """Per sampled frame, the box of the track with the largest `track_weight` (None where it is
    absent); `scores`, the detector's score of each box (without them every box counts as 1);
    `holds`, whether each box's landmarks fit a face (`landmarks_hold`; None: not known): a track
    whose boxes mostly fit one wins over any that does not.

    Sampled frames lie far apart (32 of a few hundred), so a box is linked to a track by how far its
    centre moved relative to the face's size and the samples between (`link_cost`), not by overlap:
    per frame, the closest (track, box) pairs are linked first, each track and box once; a box
    linked to none starts a track. A frame where the chosen track has no box but exactly one face
    was found keeps that face when its own track never shares a frame with the chosen one (no other
    face competes: the detector's box jumped, the face did not change)."""
    tracks: list[dict[int, Box]] = []
    confidence: list[dict[int, float]] = []
    face_like: list[list[bool]] = []
    owner: list[list[int]] = []
    for frame, found in enumerate(boxes):
        pairs = sorted((cost, t, b) for t, track in enumerate(tracks) for b, box in enumerate(found)
                       if (last := max(track)) < frame
                       and (cost := link_cost(track[last], box, frame - last)) is not None)
        linked: dict[int, int] = {}
        for _, t, b in pairs:
            if b not in linked and t not in linked.values():
                linked[b] = t
        owner.append([])
        for b, box in enumerate(found):
            if b not in linked:
                linked[b] = len(tracks)
                tracks.append({})
                confidence.append({})
                face_like.append([])
            tracks[linked[b]][frame] = box
            confidence[linked[b]][frame] = scores[frame][b] if scores is not None else 1.0
            face_like[linked[b]].append(holds is None or holds[frame][b] is not False)
            owner[frame].append(linked[b])
    if not tracks:
        return [None] * len(boxes)
    ranks = [(2 * sum(fits) >= len(fits), track_weight(track, confident))
             for track, confident, fits in zip(tracks, confidence, face_like, strict=True)]
    chosen = max(range(len(tracks)), key=ranks.__getitem__)
    path = [tracks[chosen].get(frame) for frame in range(len(boxes))]
    for frame, found in enumerate(boxes):
        if path[frame] is None and len(found) == 1 and not set(tracks[owner[frame][0]]) & set(tracks[chosen]):
            path[frame] = found[0]
    return path


def crop_face(frame: np.ndarray, box: Box, size: int = CROP_SIZE) -> np.ndarray:
    """The box enlarged 1.3x about its centre, made square, clipped to the frame, resized to
    size x size (RGB uint8)."""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    half = max(box[2] - box[0], box[3] - box[1]) * ENLARGE / 2
    height, width = frame.shape[:2]
    left, top = max(0, int(round(cx - half))), max(0, int(round(cy - half)))
    right, bottom = min(width, int(round(cx + half))), min(height, int(round(cy + half)))
    return np.asarray(Image.fromarray(frame[top:bottom, left:right]).resize((size, size), Image.BILINEAR))


def face_crop(frame: np.ndarray, box: Box, size: int, crops: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(crop, its 68 landmarks in the crop's pixels) of the face in `box`: `crops` box, `crop_face`
    and None; aligned, aligned on 5 landmarks (a ValueError without the landmarks extra)."""
    if check_face_crops(crops) == BOX:
        return crop_face(frame, box, size), None
    landmarks = face_landmarks(frame, box)
    if landmarks is None:
        raise ValueError(f"aligned face crops need the landmarks extra, which is not installed: {INSTALL}")
    return aligned_crop(frame, landmarks, size, ENLARGE)


@dataclasses.dataclass
class VideoFaces:
    """What a video gave: the frames decoded to reach the sampled ones, its sampled frames'
    indices, the tracked face's box, crop and landmarks (None without the extra) per frame with a
    face, and why each other frame was left out."""

    frames_decoded: int
    frames_sampled: int
    indices: list[int]
    boxes: list[Box]
    crops: list[np.ndarray]
    left_out: dict[int, str]
    landmarks: list[np.ndarray | None]
    frames_in_video: int
    """Frames the stream holds (what `frames_decoded` counted when every frame was decoded)."""

    @property
    def reason(self) -> str | None:
        return None if self.crops else f"no face in any of {self.frames_sampled} sampled frames"


Found = list[tuple[Box, float, bool | None]]
"""A frame's faces: each box, the detector's score, whether its landmarks fit a face (`landmarks_hold`)."""


def _faces_in(frame: np.ndarray, size: int, crops: str) -> tuple[Found, dict[Box, tuple] | np.ndarray]:
    """A sampled frame's faces (`Found`) and what is kept of it until the track is known: each
    box's `face_crop`, or the frame itself where its crops would outweigh it (a crowd)."""
    found = [(box, score, landmarks_hold(frame, box)) for box, score in scored_faces(frame)]
    if len(found) * size * size > frame.shape[0] * frame.shape[1]:
        return found, frame
    return found, {box: face_crop(frame, box, size, crops) for box, _, _ in found}


def _main_track(found: list[Found]) -> list[Box | None]:
    return main_track([[box for box, _, _ in faces] for faces in found],
                      [[score for _, score, _ in faces] for faces in found],
                      [[holds for _, _, holds in faces] for faces in found])


def photo_face(photo: np.ndarray, size: int, crops: str, faces: str = DLIB
               ) -> tuple[Box, np.ndarray, np.ndarray | None] | None:
    """A still photo's face as a video's is chosen (`main_track` of one frame), found by `faces`
    (`FACE_DETECTORS`): its box, its crop by the method `crops` and its landmarks; None where the
    detector finds no face."""
    from triskele.train.domains.deepfake.device_faces import device_crops, device_faces

    if faces == BLAZEFACE:
        found = [(box, score, None) for box, score in device_faces(photo[None])[0]]
    else:
        found = [(box, score, landmarks_hold(photo, box)) for box, score in scored_faces(photo)]
    if not found:
        return None
    box = _main_track([found])[0]
    if faces == BLAZEFACE and check_face_crops(crops) == BOX:
        return box, device_crops(photo[None], [box], size, ENLARGE)[0], None
    return box, *face_crop(photo, box, size, crops)


def video_faces(path: Path, frames: int, size: int = CROP_SIZE, limits: InputLimits | None = None, *,
                crops: str, faces: str = DLIB, sample: str = UNIFORM, decode: str = SEEK,
                detect_every: int = 1) -> VideoFaces:
    """`frames` frames sampled by `sample` over the stream's frames and reached by `decode`
    (`video.sample_frames`; the video read within `limits`), the main face track (`main_track`)
    cropped by the method `crops` (`crops.FACE_CROPS`). `faces` dlib: each frame's faces are found
    on the host as it is decoded, so what is held per sampled frame is its face crops or, if
    smaller, the frame. `faces` blazeface: the sampled frames are held and go to the device as one
    batch, faces found there on every `detect_every`-th of them (the track's box carried to the
    frames between, interpolated) and the crops cut there."""
    from triskele.train.domains.deepfake.video import sample_frames

    if check_face_detector(faces) == BLAZEFACE:
        return _device_video_faces(Path(path), frames, size, limits, crops, sample, decode, detect_every)
    sampled = sample_frames(Path(path), frames, limits, lambda frame: _faces_in(frame, size, crops),
                            sample=sample, decode=decode)
    track = _main_track([faces for faces, _ in sampled.frames])
    video = VideoFaces(sampled.decoded, len(sampled.frames), [], [], [], {}, [], sampled.total)
    for index, (in_frame, kept), box in zip(sampled.indices, sampled.frames, track, strict=True):
        if box is None:
            video.left_out[index] = "no face" if not in_frame else "only faces off the tracked one"
            continue
        video.indices.append(index)
        video.boxes.append(box)
        crop, landmarks = kept[box] if isinstance(kept, dict) else face_crop(kept, box, size, crops)
        video.crops.append(crop)
        video.landmarks.append(landmarks)
    return video


def carried_track(track: dict[int, Box], count: int) -> list[Box | None]:
    """Per frame of `count`, the track's box: where it was detected, that box; between two frames
    where it was, their boxes interpolated linearly; before the first or after the last, None (the
    face is not known to be there)."""
    known = sorted(track)
    path: list[Box | None] = [None] * count
    for a, b in zip(known, known[1:], strict=False):
        for frame in range(a, b):
            t = (frame - a) / (b - a)
            path[frame] = tuple(int(round((1 - t) * u + t * v)) for u, v in zip(track[a], track[b], strict=True))
    if known:
        path[known[-1]] = track[known[-1]]
    return path


def _device_video_faces(path: Path, frames: int, size: int, limits: InputLimits | None, crops: str, sample: str,
                        decode: str, detect_every: int) -> VideoFaces:
    from triskele.train.domains.deepfake.device_faces import device_crops, device_faces
    from triskele.train.domains.deepfake.video import sample_frames

    if detect_every < 1:
        raise ValueError(f"--detect-every {detect_every}: give 1 (every sampled frame) or more")
    sampled = sample_frames(path, frames, limits, sample=sample, decode=decode)
    stack = np.stack(sampled.frames)
    detected = sorted({*range(0, len(stack), detect_every), len(stack) - 1})
    found = [[(box, score, None) for box, score in in_frame] for in_frame in device_faces(stack[detected])]
    chosen = _main_track(found)
    track = carried_track({at: box for at, box in zip(detected, chosen, strict=True) if box is not None}, len(stack))
    video = VideoFaces(sampled.decoded, len(stack), [], [], [], {}, [], sampled.total)
    for position, (index, box) in enumerate(zip(sampled.indices, track, strict=True)):
        if box is None:
            seen = found[detected.index(position)] if position in detected else None
            video.left_out[index] = "no face" if not seen else "only faces off the tracked one"
            continue
        video.indices.append(index)
        video.boxes.append(box)
    positions = [sampled.indices.index(i) for i in video.indices]
    if not positions:
        return video
    if check_face_crops(crops) == BOX:
        video.crops = list(device_crops(stack[positions], video.boxes, size, ENLARGE))
        video.landmarks = [None] * len(positions)
        return video
    for position, box in zip(positions, video.boxes, strict=True):
        crop, landmarks = face_crop(stack[position], box, size, crops)
        video.crops.append(crop)
        video.landmarks.append(landmarks)
    return video


def crop_face_region(size: int) -> np.ndarray:
    """Where the face is in a face crop without landmarks (with them: `landmarks.hull_region`): the
    ellipse inscribed in the crop's inner box (the detector's box, which the crop enlarged `ENLARGE`
    times about its centre)."""
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5
    radius = size / ENLARGE / 2
    return ((((rows - size / 2) / radius) ** 2 + ((cols - size / 2) / radius) ** 2) < 1).astype(np.float64)
