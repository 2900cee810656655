"""Shelf photos on disk as the detector's training source: a COCO tree and a
SKU-110K tree written here, read as the tiles predict cuts, each tile's boxes the ones it holds,
COCO's categories the recognition head's SKUs; a short run trains on them."""

import json

import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of, small_config, step_records
from triskele.train import train
from triskele.train.domains.merch.shelf_files import ShelfPhotoFiles
from triskele.train.domains.merch.shelf_photos import render_shelf_photo

SIZE = (96, 160)  # photos of 96 x 160 pixels: 2 x 3 tiles of 64 at an overlap of 16


def write_coco(root, splits=("train", "val")):
    (root / "images").mkdir(parents=True)
    for s, split in enumerate(splits):
        images, annotations = [], []
        for i in range(2):
            photo = render_shelf_photo(0, s, i, SIZE, 8, min_facings=12)
            name = f"{split}{i}.jpg"
            Image.fromarray((photo.image * 255).round().astype(np.uint8)).save(root / "images" / name)
            images.append({"id": i + 1, "file_name": name, "width": SIZE[1], "height": SIZE[0]})
            annotations += [{"image_id": i + 1, "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]),
                                                          float(b[3] - b[1])], "category_id": int(k) % 1000 + 1}
                            for b, k in zip(photo.boxes, photo.skus, strict=True)]
        categories = [{"id": c + 1, "name": f"sku{c:02d}"} for c in range(50)]
        (root / f"instances_{split}.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                                  "categories": categories}))
    return root


def test_coco_photos_read_as_tiles_with_their_boxes_and_skus(tmp_path):
    root = write_coco(tmp_path / "coco")
    photos = ShelfPhotoFiles(root, "train", 64, overlap=16, max_boxes=128, num_skus=50)
    assert len(photos) == 2 * 2 * 3
    truth = json.loads((root / "instances_train.json").read_text())
    record = photos.load(0)  # the first photo's top-left tile
    assert record["image"].shape == (64, 64, 3)
    boxes = record["boxes"][record["box_valid"] > 0]
    assert len(boxes) > 0 and boxes.min() >= 0 and boxes.max() <= 64
    whole = [a for a in truth["annotations"] if a["image_id"] == 1 and a["bbox"][0] + a["bbox"][2] <= 60
             and a["bbox"][1] + a["bbox"][3] <= 60]
    assert len(boxes) >= len(whole)  # every facing wholly inside the tile is there
    # Categories sorted by name are the classes: category id c is sku{c-1:02d}, the index c - 1.
    names = {c["id"]: c["name"] for c in truth["categories"]}
    used = sorted({names[a["category_id"]] for a in truth["annotations"]})
    assert photos.catalogue == used
    skus = record["box_sku"][record["box_valid"] > 0]
    assert skus.min() >= 0 and skus.max() < len(used)
    with pytest.raises(ValueError, match=r"merch.num_skus=2 is fewer than the \d+ SKUs .* set merch.num_skus=\d+"):
        ShelfPhotoFiles(root, "train", 64, num_skus=2)
    with pytest.raises(ValueError, match="holds no shelf annotations for split 'test'"):
        ShelfPhotoFiles(root, "test", 64, num_skus=50)


def test_sku110k_photos_scaled_into_tiles(tmp_path):
    root = tmp_path / "sku110k"
    (root / "images").mkdir(parents=True)
    Image.new("RGB", (200, 100), (90, 90, 90)).save(root / "images" / "a.jpg")
    (root / "annotations_train.csv").write_text("a.jpg,10,10,50,90,object,200,100\na.jpg,150,0,200,60,object,200,100\n")
    photos = ShelfPhotoFiles(root, "train", 64, scale=0.5, overlap=16)  # 100 x 50 -> 64 x 100: 2 tiles
    assert len(photos) == 2
    first, second = photos.load(0), photos.load(1)
    np.testing.assert_allclose(first["boxes"][first["box_valid"] > 0], [[5, 5, 25, 45]])
    # The second tile starts at x = 36: box 0 (5..25) is not in it, box 1 (75..100) is, at 39..64.
    np.testing.assert_allclose(second["boxes"][second["box_valid"] > 0], [[39, 0, 64, 30]])
    assert (first["box_sku"] == -1).all()  # SKU-110K names no SKUs


def test_a_run_trains_on_a_coco_tree(tmp_path, devices):
    root = write_coco(tmp_path / "coco")
    config = small_config("merch-shelf-tiny", **{"data.path": str(root), "model.image_size": 64, "model.patch": 8,
                                                 "merch.max_boxes": 128, "merch.max_detections": 100,
                                                 "merch.num_skus": 50, "merch.tile_overlap": 16,
                                                 "data.global_batch": 4, "run.steps": 3})
    train(config, tmp_path / "run", mesh=mesh_of("single"), progress=False)
    records = step_records(tmp_path / "run")
    assert sorted(records) == [1, 2, 3] and all(np.isfinite(r["loss"]) for r in records.values())
