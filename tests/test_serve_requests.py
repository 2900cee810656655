"""How the server answers what a client sends, on a server of models without JAX (`fake_serving`):
every malformed request is a 400 naming the problem, whatever the parser under a reader raises; a
bug is a 500 that says only the request's id (logged with the traceback); every request is named
by its own id or a generated one in X-Request-Id and the access log."""

import contextlib
import json
import logging
import struct

import numpy as np
import pytest
from serveutil import FAKE_INFER, CountingIO, fake_serving, images_request, wait_for

pytestmark = pytest.mark.xdist_group("serve")


class Raising(CountingIO):
    """CountingIO whose images named after an exception raise it, as a parser under a reader would."""

    RAISED = {b"struct": struct.error("unpack requires a buffer of 4 bytes"), b"type": TypeError("bad operand"),
              b"overflow": OverflowError("int too large"), b"deep": RecursionError("maximum recursion depth"),
              b"value": ValueError("invalid literal"), b"bug": KeyError("secret-internal-detail")}

    def read(self, unit):
        data = unit.paths[0].data
        if data in self.RAISED:
            raise self.RAISED[data]
        return super().read(unit)


@contextlib.contextmanager
def logged(name: str):
    """The records logged on logger `name` while the block runs."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def server():
    with fake_serving(reader=Raising((2,))) as running:
        yield running


def _good(**fields):
    return {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], **fields}


MALFORMED = {
    "parameters a list": (_good(parameters=[1]), "the request: 'parameters' must be an object"),
    "an input's parameters a string": ({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                                                    "data": [1, 2], "parameters": "x"}]},
                                       "input 'input': 'parameters' must be an object"),
    "an output's parameters a number": (_good(outputs=[{"name": "y", "parameters": 3}]),
                                        "output 'y': 'parameters' must be an object"),
    "a shape overflowing int64": ({"inputs": [{"name": "input", "shape": [2 ** 62, 2 ** 62], "datatype": "FP32",
                                               "data": [0]}]}, "is more than a request of"),
    "a dimension longer than the body": ({"inputs": [{"name": "input", "shape": [0, 2 ** 70], "datatype": "FP32",
                                                      "data": []}]}, "is more than a request of"),
    "data a string": ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": "abc"}]},
                      "'data' must be a list of values, got str"),
    "data ragged": ({"inputs": [{"name": "input", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3]]}]},
                    "not all FP32 values"),
    "binary_data_size true": ({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                                           "parameters": {"binary_data_size": True}}]}, "binary_data_size True"),
    "an id that is an object": (_good(id={"a": 1}), "the request's id must be a string"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_is_a_400_naming_the_problem(server, case):
    body, reason = MALFORMED[case]
    answer = server.post(FAKE_INFER, data=json.dumps(body))
    assert answer.status_code == 400, answer.text
    assert reason in answer.json()["error"]


def test_json_nested_too_deeply_is_a_400(server):
    answer = server.post(FAKE_INFER, data=b"[" * 100_000)
    assert answer.status_code == 400 and "nested too deeply" in answer.json()["error"]


@pytest.mark.parametrize("raised", [b"struct", b"type", b"overflow", b"deep", b"value"])
def test_whatever_a_reader_raises_on_malformed_bytes_is_a_400_naming_the_input(server, raised):
    body, headers = images_request(b"1", raised)
    answer = server.post(FAKE_INFER, data=body, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.startswith("cannot read image[1]: ") and str(Raising.RAISED[raised]) in error


def test_a_bug_is_a_500_saying_only_the_request_id_which_the_log_has_with_the_traceback(server):
    body, headers = images_request(b"bug")
    with logged("triskele.serve") as records:
        answer = server.post(FAKE_INFER, data=body, headers=headers)
    request_id = answer.headers["X-Request-Id"]
    assert answer.status_code == 500
    assert answer.json() == {"error": f"internal error (request id {request_id})"}
    assert "secret" not in answer.text
    (record,) = [r for r in records if r.levelno == logging.ERROR]
    assert request_id in record.getMessage() and "secret-internal-detail" in str(record.exc_info[1])
    assert server.post(FAKE_INFER, data=json.dumps(_good())).status_code == 200


def test_every_request_is_named_by_its_own_id_or_a_generated_one_in_the_header_and_the_access_log(server):
    with logged("triskele.serve.access") as records:
        own = server.post(FAKE_INFER, data=json.dumps(_good(id="my-request-7")))
        generated = server.post(FAKE_INFER, data=json.dumps(_good()))
        unsafe = server.post(FAKE_INFER, data=json.dumps(_good(id="two\nlines")))
        refused = server.post(FAKE_INFER, data=b"{not json")
        ids = [answer.headers["X-Request-Id"] for answer in (own, generated, unsafe, refused)]

        def logged_ids():
            return [json.loads(r.getMessage())["id"] for r in records]

        wait_for(lambda: set(ids) <= set(logged_ids()), "the access log's lines (written once each response is sent)")
    assert own.status_code == generated.status_code == unsafe.status_code == 200 and refused.status_code == 400
    assert own.headers["X-Request-Id"] == own.json()["id"] == "my-request-7"
    assert unsafe.json()["id"] == "two\nlines" and "\n" not in unsafe.headers["X-Request-Id"]
    assert len(set(ids)) == 4 and all(ids)
    assert [i for i in logged_ids() if i in ids] == ids
    np.testing.assert_array_equal(generated.json()["outputs"][0]["data"], [2, 4])


def _strict_json(text: str):
    """`text` parsed as JSON is written (no NaN or Infinity, which Python's json takes by default)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_answer_null_in_json_and_stay_in_binary_data(server):
    values = [float("nan"), float("inf"), -float("inf"), 1.5]
    body = {"inputs": [{"name": "input", "shape": [2, 2], "datatype": "FP32", "data": values}]}
    as_json = server.post(FAKE_INFER, data=json.dumps(body))
    assert as_json.status_code == 200
    assert _strict_json(as_json.text)["outputs"][0]["data"] == [None, None, None, 3.0]
    as_binary = server.post(FAKE_INFER, data=json.dumps({**body, "parameters": {"binary_data_output": True}}))
    length = int(as_binary.headers["Inference-Header-Content-Length"])
    _strict_json(as_binary.content[:length])
    got = np.frombuffer(as_binary.content[length:], "<f4")
    assert np.isnan(got[0]) and got[1:].tolist() == [np.inf, -np.inf, 3.0]
