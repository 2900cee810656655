"""Sliding-window segmentation of frames larger than the model's input, as mmsegmentation's `slide`
mode: windows at a stride, edge windows shifted back inside the frame, window logits summed with a
count map and divided; a frame smaller than a window is padded and the padding cut off again.

Pure numpy on the host (no device, no I/O): the windows go through the model in batches elsewhere.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

DEFAULT_STRIDE_FRACTION = 2 / 3
"""The default stride, as a fraction of the window (about mmsegmentation's 341 of 512)."""


def default_stride(window: int) -> int:
    return max(1, round(window * DEFAULT_STRIDE_FRACTION))


def _starts(length: int, window: int, stride: int) -> list[int]:
    """Window starts along one axis: every `stride`, the last shifted back to end at the edge."""
    if length <= window:
        return [0]
    count = -(-(length - window) // stride) + 1
    return sorted({min(i * stride, length - window) for i in range(count)})


def window_boxes(height: int, width: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(top, left) of every window covering a (height, width) frame (after padding to the window)."""
    return [(top, left) for top in _starts(height, window, stride) for left in _starts(width, window, stride)]


def pad_to_window(image: np.ndarray, window: int) -> np.ndarray:
    """(H, W, C) padded at the bottom and right to at least window x window (edge values)."""
    height, width = image.shape[:2]
    pad = ((0, max(0, window - height)), (0, max(0, window - width))) + ((0, 0),) * (image.ndim - 2)
    return np.pad(image, pad, mode="edge") if any(p[1] for p in pad[:2]) else image


def extract_windows(image: np.ndarray, window: int, stride: int) -> np.ndarray:
    """(n, window, window, C) windows of an (H, W, C) frame, in `window_boxes` order."""
    padded = pad_to_window(image, window)
    boxes = window_boxes(*padded.shape[:2], window, stride)
    return np.stack([padded[t : t + window, left : left + window] for t, left in boxes])


def stitch(window_logits: np.ndarray, height: int, width: int, stride: int) -> np.ndarray:
    """(n, window, window, K) logits -> the (height, width, K) frame: each pixel the mean of the
    windows that cover it (sum and count map), padding dropped."""
    window = window_logits.shape[1]
    full_h, full_w = max(height, window), max(width, window)
    total = np.zeros((full_h, full_w, window_logits.shape[-1]), np.float32)
    count = np.zeros((full_h, full_w, 1), np.float32)
    for (top, left), logits in zip(window_boxes(full_h, full_w, window, stride), window_logits, strict=True):
        total[top : top + window, left : left + window] += logits
        count[top : top + window, left : left + window] += 1
    return (total / count)[:height, :width]


def resize_bilinear(logits: np.ndarray, height: int, width: int) -> np.ndarray:
    """(h, w, K) logits (or pixels) -> (height, width, K), bilinear (half-pixel centres), channel by channel."""
    if logits.shape[:2] == (height, width):
        return logits
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(logits[..., k], np.float32), mode="F")
                                .resize((width, height), Image.BILINEAR)) for k in range(logits.shape[-1])], axis=-1)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
