"""Merchandising: shelf compliance reports, the gallery index, predictions; the metrics are
`triskele.train.metrics.merch`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from triskele.train.data.merch import EMPTY


def write_artifacts(parts, params, source, totals, out_dir: Path) -> list[str]:
    return []


def compliance_report(planogram: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Per-facing comparison of a planogram grid with the recognised SKUs (EMPTY = gap)."""
    facings = []
    for (row, col), expected in np.ndenumerate(planogram):
        found = predicted[row, col]
        status = "ok" if found == expected else ("gap" if found == EMPTY else "wrong_sku")
        facings.append({"row": int(row), "col": int(col), "expected": _plain(expected), "found": _plain(found),
                        "status": status})
    compliant = sum(f["status"] == "ok" for f in facings)
    return {"compliance": compliant / len(facings), "violations": [f for f in facings if f["status"] != "ok"],
            "facings": facings}


def _plain(value):
    """JSON form of a SKU id: null for a gap, else the id as given."""
    if value == EMPTY:
        return None
    return value.item() if isinstance(value, np.generic) else value


def save_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def gallery_path(workdir: Path) -> Path:
    return Path(workdir) / "gallery" / "index.npz"


def build_gallery(model, input_dir: Path, workdir: Path) -> dict[str, Any]:
    """Embeds every reference image of `input_dir/<sku>/*` and saves the index next to the checkpoints.
    A class folder named `empty` holds pictures of empty facings (gaps). `model`: a LiveModel."""
    from triskele.train.data.images import read_image
    from triskele.train.data.merch import class_folders

    classes = class_folders(Path(input_dir))
    names = [name for name, paths in classes.items() for _ in paths]
    images = np.stack([read_image(p, model.meta["image_size"], 3) for paths in classes.values() for p in paths])
    embeddings = model(images)["embedding"]
    path = gallery_path(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, embeddings=embeddings, names=np.array(names))
    return {"gallery": str(path), "images": len(names), "skus": len(classes)}


def load_gallery(workdir: Path) -> tuple[np.ndarray, np.ndarray]:
    path = gallery_path(workdir)
    if not path.is_file():
        raise ValueError(f"no gallery index at {path}; build one with "
                         f"python -m triskele.eval gallery --workdir {workdir} --input GALLERY_FOLDER")
    index = np.load(path)
    return index["embeddings"], index["names"].astype(str)


def predict_folder(model, input_dir: Path, output_dir: Path, workdir: Path | None = None) -> dict[str, Any]:
    """Shelf images with a planogram (`<stem>.json` beside `<stem>.jpg`): a compliance report
    `<stem>.json` and `<stem>.png` with the violating facings outlined. Other images are crops:
    `predictions.csv` with the top-5 classes (and the nearest gallery SKU when `workdir` holds a
    gallery index). `model`: a LiveModel or an ExportedModel."""
    import csv

    from PIL import Image, ImageDraw
    from triskele.train.data.images import IMAGE_SUFFIXES, read_image
    from triskele.train.data.merch import facing_crops, read_planogram

    input_dir, output_dir = Path(input_dir), Path(output_dir)
    images = sorted(p for p in input_dir.iterdir() if p.suffix in IMAGE_SUFFIXES)
    if not images:
        raise ValueError(f"--input {input_dir} holds no .jpg or .png images")
    output_dir.mkdir(parents=True, exist_ok=True)
    size = model.meta["image_size"]
    gallery = load_gallery(workdir) if workdir is not None and gallery_path(workdir).is_file() else None
    shelves = [p for p in images if p.with_suffix(".json").is_file()]
    crops = [p for p in images if p not in shelves]
    for shelf in shelves:
        planogram = read_planogram(shelf.with_suffix(".json"))
        if gallery is None:
            raise ValueError(f"shelf {shelf} needs a gallery index to recognise facings; build one first")
        embeddings, names = gallery
        wanted = {v for row in planogram["rows"] for v in row if v != EMPTY}
        missing = sorted(wanted - set(names))
        if missing:
            raise ValueError(f"planogram {shelf.with_suffix('.json')} names SKUs not in the gallery: {missing}")
        found_names = names[np.argmax(model(facing_crops(shelf, planogram, size))["embedding"] @ embeddings.T, axis=1)]
        found = np.array([EMPTY if n == "empty" else n for n in found_names], dtype=object)
        rows, cols = len(planogram["rows"]), len(planogram["rows"][0])
        report = compliance_report(np.array(planogram["rows"], dtype=object), found.reshape(rows, cols))
        save_json(output_dir / f"{shelf.stem}.json", report)
        picture = Image.open(shelf).convert("RGB")
        grid = planogram["grid"] or {"left": 0, "top": 0, "width": picture.width, "height": picture.height}
        w, h = grid["width"] / cols, grid["height"] / rows
        draw = ImageDraw.Draw(picture)
        for v in report["violations"]:
            x0, y0 = grid["left"] + v["col"] * w, grid["top"] + v["row"] * h
            draw.rectangle([x0 + 1, y0 + 1, x0 + w - 2, y0 + h - 2], outline=(255, 0, 0), width=3)
        picture.save(output_dir / f"{shelf.stem}.png")
    if crops:
        pixels = np.stack([read_image(p, size, 3) for p in crops])
        outputs = model(pixels)
        probs, names = outputs["probabilities"], model.meta["class_names"]
        nearest = None
        if gallery is not None:
            nearest = gallery[1][np.argmax(outputs["embedding"] @ gallery[0].T, axis=1)]
        with (output_dir / "predictions.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["image"] + [f"top{k}" for k in range(1, 6)] + ["top1_probability", "gallery_nearest"])
            for i, path in enumerate(crops):
                top = np.argsort(-probs[i])[:5]
                writer.writerow([path.name] + [names[j] for j in top] + [f"{probs[i][top[0]]:.4f}",
                                 "" if nearest is None else nearest[i]])
    return {"shelves": len(shelves), "crops": len(crops), "output": str(output_dir)}
