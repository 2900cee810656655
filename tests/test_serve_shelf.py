"""`serve` of a facing-detector run (merch.task=shelf) against `predict`: tritonclient's HTTP client
(not this project's code) sends synthetic shelf photos, with and without their planograms, and gets
the very report predict writes to NAME.json, its facings found and its compliance score; a bad
planogram is a 400 naming the problem."""

import json
import math

import numpy as np
import pytest
import tritonclient.http as triton
from serveutil import serving
from test_shelf_detector import shelf_config, write_photo
from trainutil import mesh_of
from triskele.eval.cli import main as eval_main
from triskele.eval.prediction import predict
from triskele.train import train
from triskele.train.domains.merch.shelf_photos import package_render

pytestmark = pytest.mark.xdist_group("serve")

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def shelf_run(tmp_path_factory):
    """The tiny detector after 6 steps (a low score threshold, so that it finds facings), and two
    photos: bay0 with its planogram (the `shelves` form), bay1 without one."""
    root = tmp_path_factory.mktemp("serve-shelf")
    workdir, photos = root / "run", root / "photos"
    train(shelf_config(**{"run.steps": 6, "merch.score_threshold": 0.1}), workdir, mesh=mesh_of("data=8"),
          progress=False)
    photos.mkdir()
    planned = write_photo(photos, "bay0", 0)
    (photos / "bay0.json").write_text(json.dumps({"shelves": [[str(s) for s in shelf] for shelf in planned.planogram]}))
    write_photo(photos, "bay1", 1)
    refs = root / "refs"
    for sku in sorted({s for shelf in planned.planogram for s in shelf}):
        (refs / str(sku)).mkdir(parents=True)
        package_render(0, sku, 5).save(refs / str(sku) / "front.png")
    return workdir, photos, refs


def _infer(client, photos, planograms=None):
    """tritonclient's answer for `photos` (binary BYTES) with `planograms` (JSON strings in the request)."""
    image = triton.InferInput("image", [len(photos)], "BYTES")
    image.set_data_from_numpy(np.array([p.read_bytes() for p in photos], dtype=object), binary_data=True)
    inputs = [image]
    if planograms is not None:
        plan = triton.InferInput("planogram", [len(planograms)], "BYTES")
        plan.set_data_from_numpy(np.array(planograms, dtype=object), binary_data=False)
        inputs.append(plan)
    result = client.infer("merch", inputs)
    return {name: result.as_numpy(name) for name in ("report", "found", "score")}


def _assert_same(got, expected, where="report"):
    """The same JSON, numbers within TOLERANCE."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(expected), where
        for key in expected:
            _assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) or isinstance(got, float):
        assert isinstance(got, int | float) and not isinstance(got, bool), where
        assert math.isclose(got, expected, rel_tol=0, abs_tol=TOLERANCE), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)


def _refusal(client, photo, planograms):
    """(HTTP status, reason) of a request refused."""
    with pytest.raises(triton.InferenceServerException) as refused:
        _infer(client, [photo], planograms)
    return int(refused.value.status()), refused.value.message()


def test_a_shelf_photo_served_gets_predicts_report_with_and_without_its_planogram(shelf_run, tmp_path):
    workdir, photos, refs = shelf_run
    bay0, bay1 = photos / "bay0.png", photos / "bay1.png"
    plan = (photos / "bay0.json").read_text()
    with serving(workdir, max_batch=8) as server:  # no gallery index yet: a planogram cannot be judged
        client = triton.InferenceServerClient(server.url)
        metadata = client.get_model_metadata("merch")
        assert [i["name"] for i in metadata["inputs"]] == ["image", "planogram", "input"]
        assert {"report", "found", "score"} <= {o["name"] for o in metadata["outputs"]}
        config = client.get_model_config("merch")
        assert [i["name"] for i in config["input"]] == ["image", "planogram", "input"]
        assert {o["name"]: o["data_type"] for o in config["output"]}["report"] == "TYPE_STRING"
        status, reason = _refusal(client, bay0, [plan])
        assert status == 400 and "needs a gallery index" in reason and "python -m triskele.eval gallery" in reason
    assert eval_main(["gallery", "--workdir", str(workdir), "--input", str(refs), "--mesh", "data=8"]) == 0
    predict(workdir, photos, tmp_path / "out", progress=False)
    written = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text()) for name in ("bay0", "bay1")}
    assert written["bay0"]["found"] > 0 and "score" in written["bay0"] and "score" not in written["bay1"]
    with serving(workdir, max_batch=8) as server:  # 8 tiles a photo: two photos' rows span two batches
        client = triton.InferenceServerClient(server.url)
        both = _infer(client, [bay0, bay1], [plan, ""])  # an empty planogram: none for that photo
        alone = _infer(client, [bay1])
        too_many = _refusal(client, bay0, [plan, plan])
        not_json = _refusal(client, bay0, ["{not json"])
        gridded = _refusal(client, bay0, [json.dumps({"rows": [["1", "2"]]})])
        assert client.get_server_metadata()["name"] == "triskele"  # still serving after the bad ones
        calls = server.metric("triskele_batch_rows_count")
    assert calls >= 3  # 16 rows in two batches of 8, then bay1's 8
    for i, (name, photo) in enumerate((("bay0", "bay0.png"), ("bay1", "bay1.png"))):
        report = json.loads(both["report"][i])
        assert report.pop("photo") == f"image[{i}]" and written[name].pop("photo") == photo
        _assert_same(report, written[name])
        assert both["found"][i] == written[name]["found"]
    assert abs(both["score"][0] - written["bay0"]["score"]) <= TOLERANCE and np.isnan(both["score"][1])
    assert both["found"].dtype == np.int32 and both["score"].dtype == np.float32
    bare = json.loads(alone["report"][0])
    bare.pop("photo")
    _assert_same(bare, written["bay1"])
    assert too_many[0] == 400 and "one element per image (1)" in too_many[1]
    assert not_json[0] == 400 and "planogram planogram[0] is not valid" in not_json[1]
    assert gridded[0] == 400 and "is a grid ('rows')" in gridded[1]


@pytest.mark.parametrize("text, reason", [
    ('{"shelves": [["1", null], ["2"]]}', None),
    ('{"shelves": []}', "'shelves' must be a non-empty list"),
    (json.dumps({"shelves": [["1"] * 30] * 40}), "its shelves hold 1,200 facings, over limits.planogram_facings=1,000"),
    ('{"shelves": [["1"]]}' + " " * (1 << 20), "it is 1,048,596 bytes, over limits.planogram_bytes=1,048,576"),
    ("[" * 100_000, "its JSON is nested too deeply"),
])
def test_a_planogram_sent_as_bytes_is_read_with_the_files_checks_and_limits(text, reason, tmp_path):
    from triskele.train.data.images import EncodedImage
    from triskele.train.domains.merch.data import EMPTY, read_planogram

    (tmp_path / "plan.json").write_text(text)
    sent = EncodedImage(text.encode(), "planogram[0]")
    if reason is None:
        assert read_planogram(sent) == read_planogram(tmp_path / "plan.json") == {"shelves": [["1", EMPTY], ["2"]]}
        return
    with pytest.raises(ValueError, match="planogram planogram\\[0\\] is not valid") as refused:
        read_planogram(sent)
    assert reason in str(refused.value)
