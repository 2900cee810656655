"""SKU-110K CSV and COCO JSON shelf annotations on tiny trees written here: boxes
read as given, and every malformed row an error naming its file and line, or left out and counted."""

import json

import numpy as np
import pytest
from PIL import Image
from triskele.train.domains.merch.shelf_annotations import read_coco, read_sku110k


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "images").mkdir()
    for name, size in (("a.jpg", (64, 48)), ("b.jpg", (32, 32))):
        Image.new("RGB", size, (120, 90, 60)).save(tmp_path / "images" / name)
    return tmp_path


GOOD = ["a.jpg,1,2,20,30,object,64,48", "a.jpg,30,2,60,40,object,64,48", "b.jpg,0,0,32,32,object,32,32"]


def write_csv(tree, rows, split="train"):
    (tree / f"annotations_{split}.csv").write_text("\n".join(rows) + "\n")


def test_sku110k_rows_are_read_per_image(tree):
    write_csv(tree, GOOD)
    got = read_sku110k(tree, "train")
    np.testing.assert_array_equal(got.boxes["a.jpg"], [[1, 2, 20, 30], [30, 2, 60, 40]])
    np.testing.assert_array_equal(got.boxes["b.jpg"], [[0, 0, 32, 32]])
    assert got.skus["a.jpg"] == [None, None] and got.problems == []


@pytest.mark.parametrize("row, message", [
    ("a.jpg,20,2,10,30,object,64,48", r"the box \(20, 2, 10, 30\) has x2 <= x1"),
    ("a.jpg,1,2,70,30,object,64,48", r"the box \(1, 2, 70, 30\) reaches outside its 64x48 image"),
    ("c.jpg,1,2,20,30,object,64,48", r"its image .*images/c.jpg is not there"),
    ("a.jpg,1,2,20,30,object,640,480", r"it gives a.jpg as 640x480 pixels but the file is 64x48"),
    ("a.jpg,1,2,20,30,object", r"it has 6 fields, not 8"),
    ("a.jpg,1,two,20,30,object,64,48", r"could not convert string to float"),
])
def test_a_malformed_sku110k_row_names_its_file_and_line_or_is_counted(tree, row, message):
    write_csv(tree, [GOOD[0], row, GOOD[2]])
    with pytest.raises(ValueError, match=rf"annotations_train.csv:2: {message}"):
        read_sku110k(tree, "train")
    got = read_sku110k(tree, "train", skip=True)
    assert len(got.problems) == 1 and got.problems[0].startswith(f"{tree / 'annotations_train.csv'}:2: ")
    assert len(got.boxes["a.jpg"]) == 1 and len(got.boxes["b.jpg"]) == 1  # the good rows kept


def test_a_missing_split_names_the_file_expected(tree):
    with pytest.raises(ValueError, match=r"SKU-110K split 'val': .*annotations_val.csv is not there"):
        read_sku110k(tree, "val")


def coco(tree, annotations, split="train"):
    data = {"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48},
                       {"id": 2, "file_name": "b.jpg", "width": 32, "height": 32}],
            "annotations": annotations, "categories": [{"id": 7, "name": "cola"}, {"id": 8, "name": "milk"}]}
    (tree / f"instances_{split}.json").write_text(json.dumps(data))


def test_coco_boxes_and_categories_as_skus(tree):
    coco(tree, [{"image_id": 1, "bbox": [1, 2, 19, 28], "category_id": 7},
                {"image_id": 2, "bbox": [0, 0, 10, 10], "category_id": 8},
                {"image_id": 1, "bbox": [30, 2, 30, 38], "category_id": 99}])
    got = read_coco(tree, "train")
    np.testing.assert_array_equal(got.boxes["a.jpg"], [[1, 2, 20, 30], [30, 2, 60, 40]])
    assert got.skus == {"a.jpg": ["cola", None], "b.jpg": ["milk"]}


def test_a_malformed_coco_annotation_is_named_or_counted(tree):
    coco(tree, [{"image_id": 1, "bbox": [1, 2, 19, 28], "category_id": 7},
                {"image_id": 1, "bbox": [50, 2, 30, 10], "category_id": 7},
                {"image_id": 3, "bbox": [0, 0, 1, 1], "category_id": 7}])
    with pytest.raises(ValueError, match=r"instances_train.json: annotation 1: .*reaches outside its 64x48 image"):
        read_coco(tree, "train")
    got = read_coco(tree, "train", skip=True)
    assert len(got.problems) == 2 and len(got.boxes["a.jpg"]) == 1
    (tree / "instances_train.json").write_text("{not json")
    with pytest.raises(ValueError, match="COCO annotations .*instances_train.json are not readable"):
        read_coco(tree, "train")
