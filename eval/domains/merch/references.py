"""Reference pictures embedded by a facing detector for the gallery: each picture pasted as rows
of facings on a shelf-like canvas (the detector embeds facings among neighbours, as it was trained),
its embedding the mean of the detector's peaks on the copies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from triskele.train.config.schema import InputLimits

REFERENCE_ROWS = 6
"""A reference image is embedded as a bay of this many rows of copies of it (`reference_canvas`),
so that its copies are about as tall as the products of the synthetic photos the detector trained
on (4-7 shelves; median facing 24 px at 256 px, the copies 27 px). At 4 rows they were 40 px, and
37 of the 133 facings of a 256 x 384 test bay fell below the val-chosen unknown threshold (11 at 6)."""


def reference_canvas(image: Image.Image, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(canvas (size, size, 3) in [0, 1], the boxes pasted (N, 4)): copies of a reference picture
    side by side in REFERENCE_ROWS rows on a grey shelf, each as tall as a training photo's
    products, so that the detector sees it as a facing among its neighbours."""
    pitch = size / REFERENCE_ROWS
    height = max(2, round(pitch * 0.62))
    width = max(2, round(height * image.width / max(image.height, 1)))
    if width > size - 4:  # a picture wider than the shelf: one copy, as wide as fits
        width, height = size - 4, max(2, round((size - 4) * image.height / max(image.width, 1)))
    canvas = Image.new("RGB", (size, size), (190, 190, 185))
    draw = ImageDraw.Draw(canvas)
    copy = image.convert("RGB").resize((width, height), Image.BILINEAR)
    boxes = []
    for row in range(REFERENCE_ROWS):
        floor = round((row + 1) * pitch - 0.09 * pitch)
        x = 2
        while x + width <= size - 2:
            canvas.paste(copy, (x, floor - height))
            boxes.append([x, floor - height, x + width, floor])
            x += width + max(1, width // 40)
        draw.rectangle([0, floor, size, floor + 0.09 * pitch], fill=(100, 100, 110))
    return np.asarray(canvas, np.float32) / 255.0, np.asarray(boxes, np.float32)


def reference_embedding(outputs: dict[str, np.ndarray], boxes: np.ndarray) -> np.ndarray:
    """One reference's unit embedding: the mean of the embeddings of the detector's peaks (from one
    canvas's outputs) whose centres fall in the pasted copies, each copy's best peak; ValueError
    when the detector finds none of them."""
    centres = (outputs["boxes"][:, :2] + outputs["boxes"][:, 2:]) / 2
    picked = []
    for x1, y1, x2, y2 in boxes:
        inside = np.flatnonzero((centres[:, 0] >= x1) & (centres[:, 0] < x2) & (centres[:, 1] >= y1)
                                & (centres[:, 1] < y2))
        if len(inside):
            picked.append(inside[np.argmax(outputs["scores"][inside])])
    if not picked:
        raise ValueError("the detector finds none of its copies")
    mean = outputs["embedding"][picked].mean(0)
    return mean / max(float(np.linalg.norm(mean)), 1e-12)


def detector_gallery(model, paths: list[Path], limits: InputLimits | None = None) -> np.ndarray:
    """The unit embeddings (n, embed_dim) of reference images by a facing detector, one canvas each."""
    from triskele.train.data.images import open_image

    embeddings = []
    for path in paths:
        canvas, boxes = reference_canvas(open_image(path, limits), model.meta["image_size"])
        outputs = {k: np.asarray(v)[0] for k, v in model(canvas[None]).items()}
        try:
            embeddings.append(reference_embedding(outputs, boxes))
        except ValueError as err:
            raise ValueError(f"reference {path}: {err}; give a picture of the product alone, cropped to it") from None
    return np.stack(embeddings)
