"""What an infer request may hold, on a server of models without JAX (`fake_serving`): a request
over `--max-in-flight` is refused before its body is read (and uvicorn refuses connections a little
beyond it); a request counts as in flight (the drain waits for it) until its response's last byte
is sent; images over `--max-images` and records over `--max-records` are refused naming the flag;
the deadline bounds the upload and the decoding too; answers are encoded apart from decoding; a
dead device thread fails its requests and health says so."""

import http.client
import json
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serveutil import FAKE_INFER, CountingIO, Doubling, Fatal, fake_serving, images_request, records_request, wait_for
from triskele.eval.engine import Unit
from triskele.eval.serving.server import HEALTH_ROOM
from triskele.train.data.images import EncodedImage

pytestmark = pytest.mark.xdist_group("serve")


def connection(url: str, receive_buffer: int | None = None) -> http.client.HTTPConnection:
    """A client connection to `url` (host:port), its socket's receive buffer `receive_buffer` bytes if given."""
    host, port = url.split(":")
    opened = http.client.HTTPConnection(host, int(port), timeout=30)
    if receive_buffer is not None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(30)
        sock.connect((host, int(port)))
        opened.sock = sock
    return opened


def test_an_infer_request_over_max_in_flight_is_refused_before_its_body_is_read():
    """One request held on the device fills `--max-in-flight 1`; the next declares a 60 MB body and
    sends none of it: it is answered 503 with Retry-After (a server that read its body first would
    wait for it), and once the first is answered the next request is served."""
    body, headers = records_request(np.ones((1, 2), np.float32))
    with fake_serving(max_in_flight=1) as server, ThreadPoolExecutor(1) as pool:
        server.gate.clear()
        held = pool.submit(server.post, FAKE_INFER, data=body, headers=headers)
        wait_for(lambda: server.state.in_flight == 1, "the first request to arrive")
        upload = connection(server.url)
        upload.putrequest("POST", FAKE_INFER)
        upload.putheader("Content-Length", str(60 << 20))
        upload.endheaders()
        refused = upload.getresponse()
        assert refused.status == 503 and refused.getheader("Retry-After")
        assert "--max-in-flight" in json.loads(refused.read())["error"]
        server.gate.set()
        assert held.result(60).status_code == 200
        assert server.post(FAKE_INFER, data=body, headers=headers).status_code == 200


def test_a_request_is_in_flight_until_its_response_is_sent_and_the_drain_waits_for_it():
    """A 16 MB binary answer to a client that reads nothing yet cannot fit in the sockets' buffers
    (4 MB at most here): once its status line has come, the request still counts as in flight, a
    SIGTERM's drain waits for it, and the client gets every byte."""
    records = np.random.default_rng(0).random((256, 16384), np.float32)
    body, headers = records_request(records, binary_output=True)
    with fake_serving(sizes=(32,), record=(16384,)) as server:
        client = connection(server.url, receive_buffer=16384)
        client.request("POST", FAKE_INFER, body, headers)
        answer = client.getresponse()
        assert answer.status == 200
        assert server.state.in_flight == 1
        server.server.handle_exit(signal.SIGTERM, None)
        header = answer.read(int(answer.getheader("Inference-Header-Content-Length")))
        assert json.loads(header)["outputs"][0]["parameters"]["binary_data_size"] == records.nbytes
        got = np.frombuffer(answer.read(), "<f4").reshape(records.shape)
        wait_for(lambda: server.server.drained is not None, "the drain to end")
        assert server.server.drained is True
    np.testing.assert_array_equal(got, records * 2)


def test_images_over_max_images_and_records_over_max_records_are_413_naming_the_flag():
    """CountingIO reads "N" as N records and refuses "x": 3 unreadable images over --max-images 2
    are refused from the shape (413, not the 400 of reading them); a BYTES tensor holding more
    elements than its shape says is a 400; images making 6 records over --max-records 5 are a 413
    once the second is read, and so are 6 FP32 records; within both limits the answer is right."""
    with fake_serving(max_images=2, max_records=5) as server:
        def post(request):
            body, headers = request
            answer = server.post(FAKE_INFER, data=body, headers=headers)
            return answer.status_code, answer.json()

        status, answer = post(images_request(b"x", b"x", b"x"))
        assert status == 413 and "3 BYTES elements" in answer["error"] and "--max-images" in answer["error"]
        status, answer = post(images_request(b"1", b"1", b"1", shape=[2]))
        assert status == 400 and "more than the 2 elements of its shape" in answer["error"]
        status, answer = post(images_request(b"3", b"3"))
        assert status == 413 and "make 6 records" in answer["error"] and "--max-records" in answer["error"]
        status, answer = post(records_request(np.ones((6, 2), np.float32)))
        assert status == 413 and "make 6 records" in answer["error"] and "--max-records" in answer["error"]
        status, answer = post(images_request(b"3", b"2"))
        assert status == 200 and answer["outputs"][0]["data"] == [12.0, 8.0]


class Held(CountingIO):
    """CountingIO that lists the images it reads and holds one of b"slow" (read as one record)
    until `release` is set."""

    def __init__(self):
        super().__init__((2,))
        self.reads, self.release = [], threading.Event()

    def read(self, unit):
        data = unit.paths[0].data
        self.reads.append(data)
        if data == b"slow":
            self.release.wait(60)
            data = b"1"
        return super().read(Unit(unit.key, (EncodedImage(data, unit.key),)))


def test_the_deadline_bounds_a_slow_upload_and_a_slow_decode():
    """--timeout-seconds 1: a client that sends 10 bytes of a declared 1,000 is answered 504 (not
    waited for); a request whose first image takes longer to read is answered 504 while it is read,
    and its second image is never read (one decoding thread: the next request's image comes next)."""
    reader = Held()
    with fake_serving(reader=reader, timeout_seconds=1, threads=1) as server:
        upload = connection(server.url)
        upload.putrequest("POST", FAKE_INFER)
        upload.putheader("Content-Length", "1000")
        upload.endheaders(b"{" * 10)
        late = upload.getresponse()
        assert late.status == 504 and "while its body was read" in json.loads(late.read())["error"]
        body, headers = images_request(b"slow", b"2")
        slow = server.post(FAKE_INFER, data=body, headers=headers)
        assert slow.status_code == 504 and "while its inputs were decoded" in slow.json()["error"]
        reader.release.set()
        body, headers = images_request(b"1")
        assert server.post(FAKE_INFER, data=body, headers=headers).status_code == 200
    assert reader.reads == [b"slow", b"1"]


def test_an_answer_is_encoded_while_every_decoding_thread_is_busy():
    """One decoding thread, held by an image that takes long to read: a request whose batch comes
    back meanwhile is still answered (answers are encoded in threads of their own)."""
    reader = Held()
    body, headers = records_request(np.ones((1, 2), np.float32))
    slow_body, slow_headers = images_request(b"slow")
    with fake_serving(reader=reader, threads=1) as server, ThreadPoolExecutor(2) as pool:
        server.gate.clear()
        answered = pool.submit(server.post, FAKE_INFER, data=body, headers=headers, timeout=20)
        wait_for(lambda: server.state.batcher.busy, "the first request's batch to reach the device")
        slow = pool.submit(server.post, FAKE_INFER, data=slow_body, headers=slow_headers)
        wait_for(lambda: reader.reads == [b"slow"], "the slow image to hold the decoding thread")
        server.gate.set()
        assert answered.result().status_code == 200
        assert not slow.done()
        reader.release.set()
        assert slow.result().status_code == 200


class DyingOnNegative(Doubling):
    """Doubling, whose device thread dies on a batch holding a negative value (warm-up's zeros pass)."""

    def dispatch(self, rows):
        if (rows < 0).any():
            raise Fatal("gone")
        return super().dispatch(rows)


def test_a_dead_device_thread_fails_its_requests_and_health_says_so():
    body, headers = records_request(-np.ones((1, 2), np.float32))
    with fake_serving(model=DyingOnNegative) as server:
        assert server.get("/v2/health/live").status_code == 200
        failed = server.post(FAKE_INFER, data=body, headers=headers)
        assert failed.status_code == 503 and "device thread died (Fatal)" in failed.json()["error"]
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/fake/ready"):
            answer = server.get(path)
            assert answer.status_code == 503 and "device thread died" in answer.json()["error"], path
        good, headers = records_request(np.ones((1, 2), np.float32))
        assert server.post(FAKE_INFER, data=good, headers=headers).status_code == 503


def test_connections_beyond_max_in_flight_and_the_health_room_are_refused_by_uvicorn():
    """--max-in-flight 1: HEALTH_ROOM + 1 idle connections fill uvicorn's own limit; a health probe
    on one more is refused 503; once they close it is answered."""
    with fake_serving(max_in_flight=1) as server:
        host, port = server.url.split(":")
        idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(HEALTH_ROOM + 1)]
        try:
            wait_for(lambda: len(server.server.server_state.connections) == len(idle), "the connections to be taken")
            assert server.get("/v2/health/live").status_code == 503
        finally:
            for sock in idle:
                sock.close()
        wait_for(lambda: not server.server.server_state.connections, "the connections to close")
        assert server.get("/v2/health/live").status_code == 200
