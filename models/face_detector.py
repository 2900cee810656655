"""A single-shot face detector (MediaPipe's BlazeFace, full range) as a Flax NNX module: the
converted graph (`tools/convert_face_detector.py`) run operator by operator in JAX, then its
anchors decoded into boxes and six keypoints and the overlapping ones merged by weighted
non-maximum suppression (MediaPipe's), all with fixed shapes so that it batches and jits.

The network is fully convolutional: at an input size other than the 192 it was trained on, the
anchors are laid on the finer grid and faces are found relative to that size (a 384 input finds
faces half as large in the same frame)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ANCHOR_STRIDE = 4
"""Pixels of the input per anchor cell (the full-range model's single 48 x 48 grid at 192)."""
SCORE_THRESHOLD = 0.5
SUPPRESSION_IOU = 0.3
CANDIDATES = 64
"""Highest-scoring anchors considered per frame before suppression."""
RAW_SCORE_LIMIT = 80.0
"""Logits are clipped to +-this before the sigmoid, as MediaPipe does (100 overflows float32)."""


class FaceDetector(nnx.Module):
    """Frames in (B, S, S, 3), values in [-1, 1], S a multiple of 32; out the raw regressors
    (B, (S/4)^2, 16: box centre, size and six keypoints in input pixels, relative to each anchor)
    and logits (B, (S/4)^2)."""

    def __init__(self, graph: list[dict], constants: dict[str, np.ndarray]):
        self.meta = nnx.static(dict(graph[0]))
        self.ops = nnx.static(tuple(graph[1:]))
        self.constants = nnx.Dict({name: nnx.Param(jnp.asarray(value)) for name, value in constants.items()
                                   if value.dtype == np.float32})
        self.shapes = nnx.static({name: tuple(int(v) for v in np.asarray(value).ravel())
                                  for name, value in constants.items() if value.dtype != np.float32})

    @property
    def input_size(self) -> int:
        return int(self.meta["input_size"])

    def __call__(self, frames: jax.Array) -> tuple[jax.Array, jax.Array]:
        values = {self.meta["input"]: frames}
        for op in self.ops:
            values[op["out"]] = self._run(op, values)
        boxes, logits = values[self.meta["outputs"]["boxes"]], values[self.meta["outputs"]["scores"]]
        return boxes, logits[..., 0]

    def _run(self, op: dict, values: dict[str, jax.Array]) -> jax.Array:
        kind, inputs = op["op"], op["in"]
        x = values[inputs[0]]
        if kind in ("conv_2d", "depthwise_conv_2d"):
            kernel, bias = self.constants[inputs[1]][...], self.constants[inputs[2]][...]
            if kind == "conv_2d":  # (out, h, w, in)
                y = jax.lax.conv_general_dilated(x, kernel, op["stride"], op["padding"],
                                                 dimension_numbers=("NHWC", "OHWI", "NHWC"))
            else:  # (1, h, w, channels)
                y = jax.lax.conv_general_dilated(x, jnp.transpose(kernel, (1, 2, 0, 3)), op["stride"], op["padding"],
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                 feature_group_count=x.shape[-1])
            return _activate(y + bias, op["activation"])
        if kind == "relu":
            return jax.nn.relu(x)
        if kind == "add":
            return _activate(x + values[inputs[1]], op["activation"])
        if kind == "max_pool_2d":
            window = (1, *op["window"], 1)
            y = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, (1, *op["stride"], 1), op["padding"])
            return _activate(y, op["activation"])
        if kind == "pad":
            pads = np.asarray(self.shapes[inputs[1]]).reshape(-1, 2)
            return jnp.pad(x, [tuple(p) for p in pads])
        if kind == "resize_bilinear":  # the graph's upsampling by a whole factor, at whatever size the input is
            scale = op["scale"]
            return jax.image.resize(x, (x.shape[0], x.shape[1] * scale, x.shape[2] * scale, x.shape[3]), "linear")
        if kind == "reshape":
            return x.reshape(x.shape[0], -1, self.shapes[inputs[1]][-1] if len(inputs) > 1 else x.shape[-1])
        if kind == "concatenation":
            return jnp.concatenate([values[i] for i in inputs], axis=op["axis"])
        raise ValueError(f"face detector graph: operator {kind!r} is not one this module runs")


def _activate(x: jax.Array, activation: str | None) -> jax.Array:
    if activation is None:
        return x
    if activation == "relu":
        return jax.nn.relu(x)
    return jnp.clip(x, 0.0, 6.0)


def anchors(input_size: int) -> jax.Array:
    """The anchor centres in [0, 1] (x, y), one per `ANCHOR_STRIDE` cell, row-major (MediaPipe's
    SSD anchors for the full-range model: offset 0.5, fixed size 1)."""
    cells = input_size // ANCHOR_STRIDE
    centres = (jnp.arange(cells, dtype=jnp.float32) + 0.5) / cells
    y, x = jnp.meshgrid(centres, centres, indexing="ij")
    return jnp.stack([x.ravel(), y.ravel()], axis=-1)


def decode(raw: jax.Array, logits: jax.Array, input_size: int) -> tuple[jax.Array, jax.Array]:
    """(boxes (..., N, 4) as x0, y0, x1, y1 and keypoints (..., N, 6, 2), both in [0, 1] of the
    input; scores (..., N)) from the regressors and logits."""
    points = raw.reshape(*raw.shape[:-1], 8, 2) / input_size
    centre = points[..., 0, :] + anchors(input_size)
    half = points[..., 1, :] / 2
    boxes = jnp.concatenate([centre - half, centre + half], axis=-1)
    keypoints = points[..., 2:, :] + anchors(input_size)[:, None, :]
    scores = jax.nn.sigmoid(jnp.clip(logits, -RAW_SCORE_LIMIT, RAW_SCORE_LIMIT))
    return jnp.concatenate([boxes, keypoints.reshape(*keypoints.shape[:-2], 12)], axis=-1), scores


def _overlap(box: jax.Array, boxes: jax.Array) -> jax.Array:
    """Intersection over union of `box` (4,) with each of `boxes` (K, 4)."""
    left, top = jnp.maximum(box[0], boxes[:, 0]), jnp.maximum(box[1], boxes[:, 1])
    right, bottom = jnp.minimum(box[2], boxes[:, 2]), jnp.minimum(box[3], boxes[:, 3])
    inter = jnp.clip(right - left, 0) * jnp.clip(bottom - top, 0)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return jnp.where(union > 0, inter / union, 0.0)


def weighted_suppression(detections: jax.Array, scores: jax.Array, candidates: int = CANDIDATES
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """MediaPipe's weighted non-maximum suppression of one frame's detections (N, 16) over its
    `candidates` best: taken in score order, each unclaimed detection above `SCORE_THRESHOLD`
    claims every unclaimed one overlapping it by more than `SUPPRESSION_IOU` (itself included) and
    becomes their score-weighted mean, keeping its own score. Out: (candidates, 16) merged
    detections, their scores, and which slots hold a face (in score order)."""
    top, order = jax.lax.top_k(scores, candidates)
    found = detections[order]
    valid_box = (found[:, 2] > found[:, 0]) & (found[:, 3] > found[:, 1])
    open_ = (top > SCORE_THRESHOLD) & valid_box

    def step(i, carry):
        unclaimed, merged, kept = carry
        lead = unclaimed[i]
        claim = lead & unclaimed & (_overlap(found[i, :4], found[:, :4]) > SUPPRESSION_IOU)
        claim = claim.at[i].set(lead)
        weights = jnp.where(claim, top, 0.0)
        mean = (weights[:, None] * found).sum(0) / jnp.maximum(weights.sum(), 1e-12)
        return unclaimed & ~claim, merged.at[i].set(jnp.where(lead, mean, found[i])), kept.at[i].set(lead)

    _, merged, kept = jax.lax.fori_loop(0, candidates, step, (open_, found, jnp.zeros(candidates, bool)))
    return merged, top, kept
