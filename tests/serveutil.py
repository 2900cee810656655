"""Servers for the serving tests: in this process on a thread (the session's runs and 8 devices),
bound to 127.0.0.1 on a free port, stopped when the test's block ends; `fake_serving` serves
`Doubling` models through a `CountingIO` reader instead (no JAX, no checkpoint)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import requests
from PIL import Image
from triskele.eval.defaults import ServeOptions
from triskele.eval.serving.inputs import Decoder
from triskele.eval.serving.server import DrainingServer, serving_state, state_of, uvicorn_config, warm_up
from triskele.train.tools.launch import free_port

START_SECONDS = 300


@dataclasses.dataclass
class Running:
    url: str
    """host:port, as tritonclient takes it."""
    state: object
    server: DrainingServer
    gate: threading.Event | None = None

    def get(self, path: str, timeout: float = 60, **kwargs) -> requests.Response:
        return requests.get(f"http://{self.url}{path}", timeout=timeout, **kwargs)

    def post(self, path: str, timeout: float = 60, **kwargs) -> requests.Response:
        return requests.post(f"http://{self.url}{path}", timeout=timeout, **kwargs)

    def metric(self, name: str) -> float:
        """A sample's value from /metrics (name with its labels, as the text format writes it)."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)


@contextlib.contextmanager
def serving(workdir, exported=None, **options) -> Iterator[Running]:
    """A warmed server of `workdir`'s run or an `exported` model (ServeOptions `options`) until the block ends."""
    state, models = serving_state(workdir, exported, options.pop("mesh", None), None,
                                  ServeOptions(port=free_port(), **options), None)
    with _running(state, models) as running:
        yield running


@contextlib.contextmanager
def _running(state, models) -> Iterator[Running]:
    """`state`'s server, warmed, on a thread until the block ends; `running.server` is its DrainingServer."""
    warm_up(state, models)
    server = DrainingServer(uvicorn_config(state), state, 5)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    try:
        yield Running(f"127.0.0.1:{state.options.port}", state, server)
    finally:
        server.should_exit = True
        thread.join(60)
        state.batcher.stop()
        state.close_pools()


class Doubling:
    """A model of one batch size for tests without JAX: its output `y` is its input times 2; `calls`
    lists every batch's size; while `gate` (a threading.Event) is clear, a batch waits on the device."""

    def __init__(self, size: int, calls: list | None = None, gate: threading.Event | None = None):
        self.size, self.calls, self.gate = size, [] if calls is None else calls, gate

    def dispatch(self, rows):
        assert len(rows) == self.size
        if self.gate is not None:
            self.gate.wait()
        self.calls.append(self.size)
        return rows

    def fetch(self, rows):
        return {"y": rows * 2}


class Fatal(BaseException):
    """What no `except Exception` catches: it ends the device thread."""


class CountingIO:
    """A predict reader for tests: an image's bytes are a number in text, N, read as N records of
    ones (`record` shaped); its answer `total` is the sum of their outputs (2 x N x record size)."""

    serving_outputs = {"total": ("FP32", [])}

    def __init__(self, record: tuple[int, ...]):
        self.record = record

    def read(self, unit):
        return np.ones((int(unit.paths[0].data), *self.record), np.float32), None

    def respond(self, context, outputs):
        return {"total": np.float32(outputs["y"].sum())}


def fake_state(options: ServeOptions, sizes=(1, 2, 4), record=(2,), reader=None,
               model=None) -> tuple[object, dict, threading.Event]:
    """(state, models, gate) of a server of `model` models (default Doubling; model "fake",
    `record`-shaped records) reading images with `reader` (default CountingIO); the gate (set)
    holds batches on the device while clear."""
    gate = threading.Event()
    gate.set()
    models = {size: (model or Doubling)(size, gate=gate) for size in sizes}
    state = state_of(models, Decoder(reader or CountingIO(record), record, options.max_records), "fake", options)
    return state, models, gate


@contextlib.contextmanager
def fake_serving(sizes=(1, 2, 4), record=(2,), reader=None, model=None, **options) -> Iterator[Running]:
    """A warmed server of `fake_state` until the block ends; `running.gate` is its gate."""
    state, models, gate = fake_state(ServeOptions(port=free_port(), **options), sizes, record, reader, model)
    with _running(state, models) as running:
        running.gate = gate
        try:
            yield running
        finally:
            gate.set()  # the device thread's last batches go before it stops


FAKE_INFER = "/v2/models/fake/infer"


def records_request(records: np.ndarray, binary_output: bool = False) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer request sending `records` as binary FP32 data."""
    raw = np.ascontiguousarray(records, "<f4").tobytes()
    header = json.dumps({"inputs": [{"name": "input", "shape": list(records.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": {"binary_data_output": binary_output}}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def wait_for(condition, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def images_request(*items: bytes, shape: list[int] | None = None) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer request sending `items` as a binary BYTES `image` input of `shape`."""
    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    header = json.dumps({"inputs": [{"name": "image", "shape": shape or [len(items)], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def noise(seed: int, size: tuple[int, int], channels: int) -> np.ndarray:
    shape = (*size, channels) if channels == 3 else size
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
