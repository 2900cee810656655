"""Every bad request gets a 4xx (or 503/504) with a JSON error naming the problem, and the server
keeps serving: no or a wrong token, an unknown model, bad JSON, wrong shape or dtype, truncated or
non-image bytes, a body over the limit, an image whose header declares too many pixels for serve's
own limits, lower than predict's (refused before decoding: its pixel data are cut short, so a
decoder would have failed otherwise), a request past its deadline and a full queue."""

import json

import numpy as np
import pytest
from serveutil import noise, png, serving
from triskele.eval.serving.protocol import encode_request, parse_infer
from triskele.train.data.png import header_only_png

pytestmark = pytest.mark.xdist_group("serve")

TOKEN = "s3cret-token"
INFER = "/v2/models/deepfake/infer"


def _images(*items: bytes) -> dict:
    """An infer request of BYTES images in Triton's binary extension: (body, headers)."""
    body, headers = encode_request({"image": np.array(items, object)})
    return {"data": body, "headers": {**headers, "Authorization": f"Bearer {TOKEN}"}}


def _records(shape, datatype="FP32") -> dict:
    body = {"inputs": [{"name": "input", "shape": list(shape), "datatype": datatype,
                        "data": np.zeros(shape).ravel().tolist()}]}
    return {"data": json.dumps(body), "headers": {"Authorization": f"Bearer {TOKEN}"}}


def test_the_binary_request_encoder_gives_what_the_parser_reads():
    records = np.arange(24, dtype=np.float16).reshape(1, 2, 4, 3)
    body, headers = encode_request({"image": np.array([b"", b"\x89PNG", b"x" * 300], object), "input": records},
                                   request_id="r-7")
    parsed = parse_infer(body, headers["Inference-Header-Content-Length"], max_bytes_elements=3)
    assert parsed.id == "r-7" and parsed.inputs["image"].tolist() == [b"", b"\x89PNG", b"x" * 300]
    assert parsed.inputs["input"].dtype == np.float16 and np.array_equal(parsed.inputs["input"], records)


@pytest.fixture(scope="module")
def server(domain_runs, tmp_path_factory):
    token = tmp_path_factory.mktemp("token") / "token"
    token.write_text(TOKEN + "\n")
    with serving(domain_runs["deepfake"], max_batch=8, token_file=token, max_body_bytes=200_000) as running:
        yield running


GOOD = png(noise(0, (36, 36), 3))
CASES = {
    "no token": (lambda: {"data": _images(GOOD)["data"]}, 401, "a bearer token is required"),
    "wrong token": (lambda: {**_images(GOOD), "headers": {"Authorization": "Bearer nope"}}, 401,
                    "not this server's"),
    "bad JSON": (lambda: {"data": b"{not json", "headers": {"Authorization": f"Bearer {TOKEN}"}}, 400,
                 "not valid JSON"),
    "wrong shape": (lambda: _records((1, 16, 16, 3)), 400, "the model takes [n, 32, 32, 3]"),
    "wrong dtype": (lambda: _records((1, 32, 32, 3), "FP64"), 400, "must be FP32"),
    "values not of the dtype": (lambda: {"data": json.dumps({"inputs": [{"name": "input", "shape": [1],
                                "datatype": "FP32", "data": ["x"]}]}), "headers": {"Authorization": f"Bearer {TOKEN}"}},
                                400, "not all FP32 values"),
    "unknown input": (lambda: {"data": json.dumps({"inputs": [{"name": "pixels", "shape": [1], "datatype": "FP32",
                      "data": [0]}]}), "headers": {"Authorization": f"Bearer {TOKEN}"}}, 400, "send one input"),
    "truncated PNG": (lambda: _images(GOOD[: len(GOOD) // 2]), 400, "cannot read image image[0]"),
    "not an image": (lambda: _images(b"hello, this is text"), 400,
                     "not an image of a format read here; only PNG and JPEG images and MP4, AVI, MOV, MKV, WEBM "
                     "videos are read"),
    "a GIF": (lambda: _images(b"GIF89a" + b"\x00" * 40), 400, "a GIF file; only PNG and JPEG images and MP4"),
    "empty bytes": (lambda: _images(b""), 400, "empty file (0 bytes)"),
    "BYTES length past the data": (lambda: {**_images(GOOD), "data": _images(GOOD)["data"][:-10]}, 400,
                                   "binary_data_size"),
    "over serve's pixel limit": (lambda: _images(header_only_png(4000, 3500)), 400,  # within predict's 25 MP
                                 "4000x3500 = 14,000,000 pixels, over limits.image_pixels=12,000,000"),
    "decompression bomb": (lambda: _images(header_only_png(30000, 30000)), 400,
                           "its header declares more than 24,000,000 pixels, over limits.image_pixels"),
    "body over the limit": (lambda: _images(b"\x00" * 300_000), 413, "over the server's limit of 200,000 bytes"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_request_is_refused_with_its_reason_and_the_server_goes_on(server, case):
    request, status, reason = CASES[case]
    answer = server.post(INFER, **request())
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["error"]
    good = server.post(INFER, **_images(GOOD))
    assert good.status_code == 200, good.text


def test_the_token_guards_model_routes_not_health_or_metrics_and_unknown_models_are_404(server):
    assert server.get("/v2/health/live").status_code == 200
    assert server.get("/v2/health/ready").status_code == 200
    assert server.get("/metrics").status_code == 200
    assert server.get("/v2/models/deepfake").status_code == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert server.get("/v2/models/deepfake", headers=bearer).json()["name"] == "deepfake"
    missing = server.get("/v2/models/mars/config", headers=bearer)
    assert missing.status_code == 404 and "no model 'mars'" in missing.json()["error"]
    assert server.post("/v2/models/mars/infer", headers=bearer, data=b"{}").status_code == 404
    assert server.metric('triskele_requests_total{code="401",route="model"}') >= 1


def test_a_request_past_its_deadline_is_504_and_a_full_queue_503_with_retry_after(domain_runs):
    with serving(domain_runs["deepfake"], max_batch=8, max_delay_ms=20_000, timeout_seconds=0.5,
                 max_queue=1) as running:
        request = {"data": _records((1, 32, 32, 3))["data"]}
        late = running.post(INFER, **request)
        assert late.status_code == 504 and "deadline" in late.json()["error"]
        full = running.post(INFER, **request)  # the late one still holds the only place in the queue
        assert full.status_code == 503 and "queue is full" in full.json()["error"]
        assert full.headers["Retry-After"]


def test_serve_lists_its_own_lower_limits_and_set_raises_one_keeping_the_others(capsys):
    from triskele.eval.cli import main as eval_main
    from triskele.eval.defaults import SERVE_LIMITS
    from triskele.train.config.limits import input_limits

    helps = {}
    for command in ("serve", "predict"):
        with pytest.raises(SystemExit):
            eval_main([command, "--help"])
        helps[command] = " ".join(capsys.readouterr().out.split())
    assert "limits.image_pixels (default 12,000,000)" in helps["serve"]
    assert "limits.frame_pixels (default 2,073,600)" in helps["serve"]
    assert "limits.video_frames (default 9,000)" in helps["serve"]
    assert "limits.image_pixels (default 25,000,000)" in helps["predict"]
    raised = input_limits(["limits.image_pixels=20000000"], SERVE_LIMITS)
    assert (raised.image_pixels, raised.frame_pixels, raised.video_frames) == (20_000_000, 1920 * 1080, 9000)
