"""`serve` against `predict`: tritonclient's HTTP client (not this project's code) sends each
domain's images as BYTES and gets what predict writes for the same files; FP32 records get the
model's raw outputs; many concurrent requests share model calls and each gets its own rows."""

import csv
import json
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from serveutil import noise, serving
from triskele.eval.prediction import predict, predict_iter

pytestmark = pytest.mark.xdist_group("serve")

SIZES = {"mars": [(40, 48), (40, 48)], "merch": [(40, 36), (32, 32), (50, 44)], "deepfake": [(36, 36), (40, 44)]}
"""Per domain, the images sent (height, width): mars' of one size (one mask tensor per request)."""
CHANNELS = {"mars": 1, "merch": 3, "deepfake": 3}


def _images(folder, domain):
    folder.mkdir()
    paths = []
    for i, size in enumerate(SIZES[domain]):
        paths.append(folder / f"{i}.png")
        Image.fromarray(noise(i, size, CHANNELS[domain])).save(paths[-1])
    return paths


def _infer(client, name, paths, outputs):
    data = np.array([p.read_bytes() for p in paths], dtype=object)
    image = triton.InferInput("image", [len(paths)], "BYTES")
    image.set_data_from_numpy(data, binary_data=True)
    result = client.infer(name, [image], outputs=[triton.InferRequestedOutput(o) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


@pytest.mark.parametrize("domain", ["mars", "merch", "deepfake"])
def test_tritonclient_gets_what_predict_writes(domain, domain_runs, tmp_path):
    workdir = domain_runs[domain]
    paths = _images(tmp_path / "in", domain)
    predict(workdir, tmp_path / "in", tmp_path / "out", progress=False)
    with serving(workdir, max_batch=16) as server:
        client = triton.InferenceServerClient(server.url)
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(domain)
        config = client.get_model_config(domain)
        assert config["max_batch_size"] == 16
        assert {i["name"] for i in client.get_model_metadata(domain)["inputs"]} == {"image", "input"}
        if domain == "mars":
            got = _infer(client, domain, paths, ["mask"])
            for path, mask in zip(paths, got["mask"], strict=True):
                np.testing.assert_array_equal(mask, np.asarray(Image.open(tmp_path / "out" / path.name)))
        elif domain == "merch":
            got = _infer(client, domain, paths, ["sku", "score", "embedding"])
            rows = {r["image"]: r for r in csv.DictReader((tmp_path / "out" / "predictions.csv").open())}
            iterated = {p.unit.key: p.outputs for p in predict_iter(workdir, tmp_path / "in")}
            for i, path in enumerate(paths):
                assert [s.decode() for s in got["sku"][i]] == [rows[path.name][f"top{k}"] for k in range(1, 6)]
                assert abs(got["score"][i][0] - float(rows[path.name]["top1_probability"])) <= 5e-5
                np.testing.assert_allclose(got["score"][i], np.sort(iterated[path.name]["probabilities"][0])[::-1][:5],
                                           atol=1e-5)
                np.testing.assert_allclose(got["embedding"][i], iterated[path.name]["embedding"][0], atol=1e-5)
        else:
            got = _infer(client, domain, paths, ["fake_probability"])
            frames = {r["frame"]: float(r["fake_probability"]) for r in
                      csv.DictReader((tmp_path / "out" / "frames.csv").open())}
            assert got["fake_probability"].shape == (len(paths),)
            for path, probability in zip(paths, got["fake_probability"], strict=True):
                assert abs(probability - frames[path.name]) <= 1e-5


def test_concurrent_requests_share_model_calls_and_each_gets_its_own_rows(domain_runs):
    """16 batch-1 requests of FP32 records at once: fewer model calls than requests, and every
    answer equals the model's own output for that request's record (the batcher's padding rule is
    test_serve_batcher's)."""
    from triskele.eval.model import load_model

    workdir = domain_runs["deepfake"]
    model = load_model(workdir, batch=16)
    records = np.random.default_rng(0).random((16, 32, 32, 3), np.float32)
    expected = model(records)["fake_probability"]
    with serving(workdir, max_batch=16, max_delay_ms=500) as server:
        def one(i):
            body = {"inputs": [{"name": "input", "shape": [1, 32, 32, 3], "datatype": "FP32",
                                "data": records[i].ravel().tolist()}]}
            answer = server.post("/v2/models/deepfake/infer", data=json.dumps(body))
            assert answer.status_code == 200, answer.text
            (output,) = answer.json()["outputs"]
            return output["data"][0]

        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(one, range(16)))
        calls = server.metric("triskele_batch_rows_count")
        assert server.metric("triskele_batch_rows_sum") == 16
        assert calls < 16
        assert server.metric('triskele_requests_total{code="200",route="infer"}') == 16
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_an_exported_model_is_served_in_every_size_and_answers_as_predict_with_it(domain_runs, tmp_path):
    from triskele.eval.export import export_model

    workdir = domain_runs["deepfake"]
    exported = tmp_path / "deepfake.jax"
    export_model(workdir, exported)
    paths = _images(tmp_path / "in", "deepfake")
    predict(None, tmp_path / "in", tmp_path / "out", exported=exported, progress=False)
    written = csv.DictReader((tmp_path / "out" / "frames.csv").open())
    frames = {r["frame"]: float(r["fake_probability"]) for r in written}
    with serving(None, exported=exported, max_batch=4) as server:
        client = triton.InferenceServerClient(server.url)
        assert client.get_model_config("deepfake")["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4]
        got = _infer(client, "deepfake", paths, ["fake_probability"])
    for path, probability in zip(paths, got["fake_probability"], strict=True):
        assert abs(probability - frames[path.name]) <= 1e-5


def test_a_video_sent_as_bytes_gets_predicts_score_faces_and_reason(domain_runs, tmp_path):
    """Deepfake videos as BYTES (no name: the container is told by its signature): the fake
    probability of predict's videos.csv for the same file (the mean over its sampled faces), the
    faces found, and for a video without a face NaN with predict's reason; bytes that are no video
    are a 400 naming the input."""
    from videoutil import pan, wall, write_video

    workdir = domain_runs["deepfake"]
    videos = [write_video(tmp_path / "in" / "face.mp4", pan(12)), write_video(tmp_path / "in" / "wall.mp4", wall(12))]
    predict(workdir, tmp_path / "in", tmp_path / "out", progress=False)
    rows = {r["video"]: r for r in csv.DictReader((tmp_path / "out" / "videos.csv").open())}
    with serving(workdir, max_batch=16) as server:
        client = triton.InferenceServerClient(server.url)
        got = _infer(client, "deepfake", videos, ["fake_probability", "faces_found", "reason"])
        cut = server.post("/v2/models/deepfake/infer", data=json.dumps({"inputs": [
            {"name": "image", "shape": [1], "datatype": "BYTES", "data": ["\0\0\0\x18ftypmp42 not a video"]}]}))
    face, no_face = rows["face.mp4"], rows["wall.mp4"]
    assert int(face["faces_found"]) > 0 and got["faces_found"].tolist() == [int(face["faces_found"]), 0]
    assert abs(got["fake_probability"][0] - float(face["fake_probability"])) <= 1e-5
    assert np.isnan(got["fake_probability"][1]) and no_face["fake_probability"] == ""
    assert got["reason"][0].decode() == "" and got["reason"][1].decode() == no_face["reason"] != ""
    assert cut.status_code == 400 and "cannot read video image[0]" in cut.json()["error"]


def test_a_tensor_parallel_mesh_serves_the_data_parallel_answer(domain_runs):
    """`serve --mesh data=2,tensor=4` (a model split over devices: the Megatron layout, heads over
    tensor) answers FP32 records as the model on data=8 does, up to float reassociation; its batch
    sizes are multiples of data x fsdp = 2."""
    from triskele.eval.model import load_model

    workdir = domain_runs["deepfake"]
    records = np.random.default_rng(1).random((5, 32, 32, 3), np.float32)
    expected = load_model(workdir, mesh="data=8", batch=8)(records)["fake_probability"]
    with serving(workdir, mesh="data=2,tensor=4", max_batch=8) as server:
        model = server.state.batcher.models[2]
        assert dict(model.mesh.shape) == {"pipeline": 1, "data": 2, "fsdp": 1, "tensor": 4}
        assert any("tensor" in str(leaf.sharding.spec) for leaf in jax.tree.leaves(model.params))
        client = triton.InferenceServerClient(server.url)
        assert client.get_model_config("deepfake")["dynamic_batching"]["preferred_batch_size"] == [2, 4, 8]
        tensor = triton.InferInput("input", list(records.shape), "FP32")
        tensor.set_data_from_numpy(records, binary_data=True)
        got = client.infer("deepfake", [tensor]).as_numpy("fake_probability")
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_the_serving_pages_curl_example_gets_the_answer_tritonclient_gets(domain_runs, tmp_path):
    import re
    import subprocess
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    block = re.search(r"With curl.*?```bash\n(.*?)```", page, re.S).group(1)
    Image.fromarray(noise(7, (36, 36), 3)).save(tmp_path / "face.png")
    with serving(domain_runs["deepfake"], max_batch=8) as server:
        script = block.replace("127.0.0.1:8000", server.url)
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        expected = _infer(triton.InferenceServerClient(server.url), "deepfake", [tmp_path / "face.png"],
                          ["fake_probability"])["fake_probability"]
    assert done.returncode == 0, done.stderr
    config, answer = json.JSONDecoder().raw_decode(done.stdout)[0], json.loads(done.stdout[done.stdout.index(
        '{"model_name"'):])
    assert config["name"] == "deepfake" and config["max_batch_size"] == 8
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    np.testing.assert_allclose(outputs["fake_probability"], expected, atol=1e-6)
    assert outputs["faces_found"] == [1]
