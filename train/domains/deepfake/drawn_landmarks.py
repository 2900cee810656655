"""The 68 landmarks (iBUG order) of a synthetic face, from the geometry `data.render_face` draws it
with: the jaw on the face oval from eye level round the chin, each brow along its stroke, the nose
down its middle and across its base, each eye round its white, the lips round the mouth (the outer
ring, then a narrower inner one). Points are (x, y) in pixel-index coordinates (pixel (r, c)'s
centre is x=c, y=r), as dlib gives them; the drawing's coordinates are pixel centres at +0.5."""

from __future__ import annotations

import numpy as np


def _ring(cy: float, cx: float, ry: float, rx: float, angles: np.ndarray) -> np.ndarray:
    """Points of the ellipse (centre, radii) at `angles` (0 = right, pi/2 = down), as (x, y)."""
    return np.stack([cx + rx * np.cos(angles), cy + ry * np.sin(angles)], axis=1)


def drawn_landmarks(ident: dict, size: int, shift: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """(68, 2) landmarks of identity `ident` drawn at `size` pixels, moved by `shift` (rows, cols)."""
    cy, cx = ident["center"][0] * size + shift[0], ident["center"][1] * size + shift[1]
    ry, rx = ident["radii"][0] * size, ident["radii"][1] * size
    er, ey = ident["eye_r"] * size, cy + ident["eye_y"] * size
    eyes = [cx - ident["eye_dx"] * size, cx + ident["eye_dx"] * size]  # the image's left eye first, as iBUG
    rise = np.arcsin(np.clip((cy - ey) / ry, -1, 1))  # the jaw starts at eye level on either side
    jaw = _ring(cy, cx, ry, rx, np.linspace(np.pi + rise, -rise, 17))
    brows = [np.stack([ex + np.linspace(-0.8, 0.8, 5) * 1.3 * er, np.full(5, ey - 1.6 * er)], axis=1)
             for ex in eyes]
    ny, nx, nry, nrx = cy + 0.05 * size, cx + 0.01 * size, 0.06 * size, 0.025 * size
    bridge = np.stack([np.full(4, nx), np.linspace(ey, ny + 0.6 * nry, 4)], axis=1)
    base = np.stack([nx + np.linspace(-0.5, 0.5, 5) * nrx, np.full(5, ny + 0.75 * nry)], axis=1)
    eye_angles = np.pi + np.arange(6) * np.pi / 3  # outer-left corner, upper lid, right corner, lower lid
    eye_points = [_ring(ey, ex, 0.9 * 0.6 * er, 0.9 * er, eye_angles) for ex in eyes]
    my, mr, mw = cy + ident["mouth_y"] * size, 0.025 * size, ident["mouth_w"] * size
    outer = _ring(my, cx, 0.9 * mr, 0.9 * mw, np.pi + np.arange(12) * np.pi / 6)
    inner = _ring(my, cx, 0.4 * mr, 0.6 * mw, np.pi + np.arange(8) * np.pi / 4)
    points = np.concatenate([jaw, *brows, bridge, base, *eye_points, outer, inner])
    return points - 0.5
