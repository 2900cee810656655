"""Class-agnostic dense detection as CenterNet (Zhou et al. 2019, "Objects as Points"), with static
shapes throughout: boxes padded to a fixed maximum, targets computed on the device from the padded
boxes, decoding by peak max-pool, top-k and Fast NMS.

A box (x1, y1, x2, y2) in input pixels is found at the output cell p = floor(centre / stride): the
heatmap there is 1, around it an elliptical Gaussian whose spread follows the box's width and
height (TTFNet, Liu et al. 2020: sigma = alpha * size / 6, so that the narrow facings of a dense
shelf keep apart), the maximum over boxes where they overlap; the offset (centre / stride - p) and
the log size (log of width and height in cells) are regressed at p only. Where two boxes share a
centre cell the later one (the larger index) is the target, so targets are the same on any mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

GAUSSIAN_ALPHA = 0.54
"""TTFNet's spread: sigma = alpha * (box size in cells) / 6."""
BOX_CHUNK = 256
"""Boxes drawn into the heatmap per scan step: memory O(chunk x cells), not O(boxes x cells)."""
PRIOR = 0.1
"""The heatmap's initial probability everywhere (the head's bias is its logit, as CenterNet's -2.19)."""
SIZE_WEIGHT, OFFSET_WEIGHT = 1.0, 1.0
"""The L1 weights of the log size and the offset. CenterNet weighs its size loss 0.1, but it
regresses pixels; a log size's errors are tenths, and at 0.1 the boxes were loose (AP75 0.064
after 500 steps of merch-shelf-tiny, 0.171 at 1.0)."""


def centre_cells(boxes: jax.Array, stride: int, grid: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """(integer centre cell (N, 2) as (x, y), clipped into the grid; sub-cell offset (N, 2))."""
    centre = jnp.stack([boxes[:, 0] + boxes[:, 2], boxes[:, 1] + boxes[:, 3]], axis=-1) / (2.0 * stride)
    limit = jnp.asarray([grid[1] - 1, grid[0] - 1], jnp.int32)
    cell = jnp.clip(jnp.floor(centre).astype(jnp.int32), 0, limit)
    return cell, centre - cell


def heatmap_target(boxes: jax.Array, valid: jax.Array, stride: int, grid: tuple[int, int]) -> jax.Array:
    """(H, W) float32: each valid box's Gaussian around its centre cell, 1 there, the max over boxes."""
    cell, _ = centre_cells(boxes, stride, grid)
    size = jnp.maximum(jnp.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], -1) / stride, 1e-3)
    sigma = GAUSSIAN_ALPHA * size / 6.0
    n = boxes.shape[0]
    pad = (-n) % BOX_CHUNK
    parts = [jnp.pad(a, ((0, pad), (0, 0))) for a in (cell.astype(jnp.float32), sigma)]
    parts.append(jnp.pad(valid.astype(jnp.float32), (0, pad)))
    chunks = [a.reshape(-1, BOX_CHUNK, *a.shape[1:]) for a in parts]
    ys = jnp.arange(grid[0], dtype=jnp.float32)
    xs = jnp.arange(grid[1], dtype=jnp.float32)

    def draw(heat, chunk):
        c, s, v = chunk
        gx = jnp.exp(-jnp.square(xs[None, :] - c[:, :1]) / (2 * jnp.square(s[:, :1])))  # (chunk, W)
        gy = jnp.exp(-jnp.square(ys[None, :] - c[:, 1:]) / (2 * jnp.square(s[:, 1:])))  # (chunk, H)
        g = gy[:, :, None] * gx[:, None, :] * v[:, None, None]
        return jnp.maximum(heat, g.max(axis=0)), None

    heat, _ = jax.lax.scan(draw, jnp.zeros(grid, jnp.float32), tuple(chunks))
    return heat


def regression_targets(boxes: jax.Array, valid: jax.Array, stride: int, grid: tuple[int, int],
                       labels: jax.Array | None = None) -> dict[str, jax.Array]:
    """`centre` mask (H, W), `offset` (H, W, 2), `log_size` (H, W, 2) and, given each box's label
    (N,) (-1: none), its `label` (H, W) int32 (-1 where no box is centred): set at each valid box's
    centre cell, where two share one the box of the larger index; zero elsewhere."""
    cell, offset = centre_cells(boxes, stride, grid)
    cells = grid[0] * grid[1]
    index = jnp.where(valid > 0, cell[:, 1] * grid[1] + cell[:, 0], cells)  # padded boxes: past the end
    order = jnp.arange(boxes.shape[0])
    winner = jax.ops.segment_max(jnp.where(valid > 0, order, -1), index, num_segments=cells + 1)
    index = jnp.where((valid > 0) & (winner[index] == order), index, cells)
    log_size = jnp.log(jnp.maximum(jnp.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], -1)
                                   / stride, 1e-3))

    def place(values):
        flat = jnp.zeros((cells, *values.shape[1:]), jnp.float32).at[index].set(values, mode="drop")
        return flat.reshape(*grid, *values.shape[1:])

    placed = {"centre": place(jnp.ones(boxes.shape[0])), "offset": place(offset), "log_size": place(log_size)}
    if labels is not None:
        placed["label"] = place(labels.astype(jnp.float32) + 1).astype(jnp.int32) - 1
    return placed


def targets(boxes: jax.Array, valid: jax.Array, stride: int, grid: tuple[int, int],
            labels: jax.Array | None = None) -> dict[str, jax.Array]:
    """A batch's targets: boxes (B, N, 4) in input pixels, valid (B, N) 1 for a box and 0 for
    padding, optionally each box's label (B, N) (-1: none) placed at its centre cell."""
    def one(b, v, lab):
        return {"heatmap": heatmap_target(b, v, stride, grid), **regression_targets(b, v, stride, grid, lab)}

    if labels is None:
        return jax.vmap(lambda b, v: one(b, v, None))(boxes.astype(jnp.float32), valid.astype(jnp.float32))
    return jax.vmap(one)(boxes.astype(jnp.float32), valid.astype(jnp.float32), labels)


def focal_loss(logits: jax.Array, heatmap: jax.Array, centre: jax.Array) -> jax.Array:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), summed over cells: (B,) per image."""
    p = jax.nn.sigmoid(logits)
    log_p, log_not_p = jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)
    positive = centre * jnp.square(1 - p) * log_p
    negative = (1 - centre) * jnp.power(1 - heatmap, 4) * jnp.square(p) * log_not_p
    return -jnp.sum(positive + negative, axis=(1, 2))


def detection_loss(outputs: dict[str, jax.Array], target: dict[str, jax.Array]) -> jax.Array:
    """Per image (B,): focal heatmap loss + weighted L1 of offset and log size at the centres."""
    centre = target["centre"][..., None]
    l1 = lambda key: jnp.sum(jnp.abs(outputs[key] - target[key]) * centre, axis=(1, 2, 3))
    return (focal_loss(outputs["heatmap"], target["heatmap"], target["centre"])
            + SIZE_WEIGHT * l1("log_size") + OFFSET_WEIGHT * l1("offset"))


NMS_IOU = 0.5
"""A peak overlapping a higher one's box by more than this is the same facing found twice: a wide
facing's elongated Gaussian can peak twice (134 such pairs among merch-shelf-tiny's detections on
its 64 test photos, where no two true facings overlap by IoU 0.3)."""


def decode(outputs: dict[str, jax.Array], stride: int, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(boxes (B, k, 4) in input pixels, scores (B, k), best first, and their cells (B, k) as flat
    indices into the (H, W) map): the k highest heatmap peaks (a cell no lower than its 3x3
    neighbours), each with its offset and size, those that `fast_nms` suppresses scored 0."""
    heat = jax.nn.sigmoid(outputs["heatmap"].astype(jnp.float32))
    b, h, w = heat.shape
    pooled = jax.lax.reduce_window(heat, -jnp.inf, jax.lax.max, (1, 3, 3), (1, 1, 1), "SAME")
    peaks = jnp.where(heat >= pooled, heat, 0.0).reshape(b, h * w)
    scores, index = jax.lax.top_k(peaks, min(k, h * w))
    offset = at_cells(outputs["offset"].astype(jnp.float32), index)
    size = jnp.exp(at_cells(outputs["log_size"].astype(jnp.float32), index))
    cell = jnp.stack([index % w, index // w], axis=-1).astype(jnp.float32)
    centre = (cell + offset) * stride
    half = size * stride / 2
    boxes = jnp.concatenate([centre - half, centre + half], axis=-1)
    scores = fast_nms(boxes, scores, NMS_IOU)
    scores, order = jax.lax.top_k(scores, scores.shape[-1])  # best first again
    return jnp.take_along_axis(boxes, order[..., None], axis=1), scores, jnp.take_along_axis(index, order, axis=1)


def fast_nms(boxes: jax.Array, scores: jax.Array, threshold: float) -> jax.Array:
    """Scores (B, k) of boxes (B, k, 4) sorted best first, 0 for each box that a higher-scoring one
    overlaps by IoU above `threshold`: YOLACT's Fast NMS (Bolya et al. 2019), one (k, k) IoU matrix
    instead of greedy NMS's sequential loop, with static shapes (a suppressed box still suppresses)."""
    low, high = jnp.maximum(boxes[:, :, None, :2], boxes[:, None, :, :2]), jnp.minimum(boxes[:, :, None, 2:],
                                                                                       boxes[:, None, :, 2:])
    inter = jnp.prod(jnp.clip(high - low, 0, None), axis=-1)
    area = jnp.prod(jnp.clip(boxes[..., 2:] - boxes[..., :2], 0, None), axis=-1)
    iou = inter / jnp.maximum(area[:, :, None] + area[:, None, :] - inter, 1e-12)
    above = jnp.triu(jnp.ones(iou.shape[1:], bool), k=1)  # [i, j]: i scores above j
    overlapped = jnp.max(jnp.where(above, iou, 0.0), axis=1)
    return jnp.where(overlapped > threshold, 0.0, scores)


def at_cells(values: jax.Array, index: jax.Array) -> jax.Array:
    """A map's values (B, H, W, C) at cells given as flat indices (B, k): (B, k, C)."""
    b, h, w, c = values.shape
    return jnp.take_along_axis(values.reshape(b, h * w, c), index[..., None], axis=1)
