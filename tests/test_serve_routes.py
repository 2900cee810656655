"""Each serving route and check alone, over a `ServeState` of stand-ins (no model, no socket): what it
answers, with which status and headers, for each state the server can be in."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import types

import numpy as np
import pytest
from starlette.requests import Request
from triskele.eval.defaults import ServeOptions
from triskele.eval.serving import routes
from triskele.eval.serving.metrics import ServeMetrics
from triskele.eval.serving.protocol import RequestError
from triskele.eval.serving.state import ServeState


def make_state(**changes) -> ServeState:
    batcher = types.SimpleNamespace(failure=None)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    state = ServeState("mars", decoder=None, batcher=batcher, metrics=ServeMetrics([1, 4]), decode_pool=pool,
                       config={"name": "mars", "max_batch_size": 4},
                       metadata={"inputs": [], "outputs": []}, options=ServeOptions(max_body_bytes=10), ready=True)
    for key, value in changes.items():
        setattr(state, key, value)
    return state


def request(state: ServeState, path: str = "/v2/models/mars", method: str = "GET", headers: dict | None = None,
            body: list[bytes] = (), **path_params) -> Request:
    pieces = list(body) or [b""]

    async def receive():
        return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}

    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "state": {"request_id": "r1"},
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
             "path_params": {"name": "mars", **path_params}, "app": types.SimpleNamespace(
                 state=types.SimpleNamespace(serve=state))}
    return Request(scope, receive)


def answer(handler, req: Request) -> tuple[int, dict, dict]:
    response = asyncio.run(routes.guarded(handler)(req))
    return response.status_code, json.loads(response.body), dict(response.headers)


def test_live_says_live_until_the_device_thread_dies():
    state = make_state()
    assert answer(routes.live, request(state))[:2] == (200, {"live": True})
    state.batcher.failure = RuntimeError("boom")
    status, body, _ = answer(routes.live, request(state))
    assert status == 503 and "the device thread died (boom)" in body["error"]


@pytest.mark.parametrize(("changes", "reason"), [
    ({"ready": False}, "still being compiled and warmed"),
    ({"draining": True}, "the server is draining (SIGTERM)"),
])
def test_ready_refuses_while_warming_or_draining_and_asks_to_retry(changes, reason):
    status, body, headers = answer(routes.ready, request(make_state(**changes)))
    assert status == 503 and reason in body["error"] and headers["retry-after"] == "1"
    assert answer(routes.ready, request(make_state()))[:2] == (200, {"ready": True})


def test_the_model_routes_name_this_server_s_model_and_version_one_only():
    state = make_state()
    status, body, _ = answer(routes.model_metadata, request(state))
    assert status == 200 and body["name"] == "mars" and body["versions"] == ["1"] and body["platform"] == "jax"
    assert answer(routes.model_config, request(state))[1] == state.config
    status, body, _ = answer(routes.model_metadata, request(state, name="merch"))
    assert status == 404 and body["error"] == "no model 'merch'; this server serves 'mars'"
    status, body, _ = answer(routes.model_ready, request(state, version="2"))
    assert status == 404 and "has no version '2'" in body["error"]
    assert answer(routes.model_ready, request(state, version="1"))[:2] == (200, {"ready": True})


def test_the_bearer_token_guards_model_routes_and_is_compared_whole():
    state = make_state(token="s3cret")
    refused = (({}, "a bearer token is required"), ({"Authorization": "Bearer s3cre"}, "not this server's"),
               ({"Authorization": "Basic s3cret"}, "not this server's"))
    for headers, reason in refused:
        status, body, sent = answer(routes.model_metadata, request(state, headers=headers))
        assert status == 401 and reason in body["error"] and sent["www-authenticate"] == "Bearer", headers
    assert answer(routes.model_metadata, request(state, headers={"Authorization": "Bearer s3cret"}))[0] == 200
    assert answer(routes.live, request(state))[0] == 200, "health stays open"


def test_infer_is_refused_before_its_body_while_not_ready():
    state = make_state(ready=False)
    status, body, _ = answer(routes.infer, request(state, method="POST", body=[b"{}"]))
    assert status == 503 and "still being compiled" in body["error"]


def test_a_body_over_the_limit_is_refused_when_declared_and_when_read():
    state = make_state()
    declared = request(state, method="POST", headers={"Content-Length": "11"}, body=[b"x"])
    with pytest.raises(RequestError, match="over the server's limit of 10 bytes") as raised:
        asyncio.run(routes.read_body(state, declared))
    assert raised.value.status == 413
    streamed = request(state, method="POST", body=[b"123456", b"78901"])
    with pytest.raises(RequestError, match="--max-body-bytes"):
        asyncio.run(routes.read_body(state, streamed))
    assert asyncio.run(routes.read_body(state, request(state, method="POST", body=[b"12345", b"67890"]))) == \
        b"1234567890"


def test_a_step_past_the_deadline_is_a_504_naming_what_it_waited_for():
    state = make_state(options=ServeOptions(timeout_seconds=0.05))

    async def slow():
        await asyncio.sleep(1)

    with pytest.raises(RequestError, match="it passed while its body was read") as raised:
        asyncio.run(routes.within(state, slow(), time.monotonic() + 0.05, "its body was read"))
    assert raised.value.status == 504 and "0.05 s" in raised.value.reason


def test_records_whose_answer_comes_too_late_are_abandoned_in_the_batcher():
    future = concurrent.futures.Future()
    job = types.SimpleNamespace(future=future, abandoned=False)
    state = make_state(batcher=types.SimpleNamespace(failure=None, submit=lambda records, deadline: job))
    with pytest.raises(RequestError, match="the model's answer was awaited"):
        asyncio.run(routes.run_records(state, np.zeros((1, 2)), time.monotonic() + 0.05))
    assert job.abandoned


def test_a_bug_answers_500_with_the_request_id_and_the_server_goes_on(caplog):
    async def broken(req):
        raise KeyError("x")

    status, body, _ = answer(broken, request(make_state()))
    assert (status, body) == (500, {"error": "internal error (request id r1)"})
    assert "request r1 failed" in caplog.text


def test_a_request_s_own_id_names_it_only_when_it_is_short_visible_ascii():
    req = request(make_state())
    routes.name_request(req, "bad id with spaces")
    assert req.state.request_id == "r1"
    routes.name_request(req, "job-7")
    assert req.state.request_id == "job-7"


def test_metrics_render_the_prometheus_text():
    response = asyncio.run(routes.metrics(request(make_state(), path="/metrics")))
    assert response.status_code == 200 and response.media_type.startswith("text/plain")
    assert b"# TYPE" in response.body
