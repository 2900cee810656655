"""Servers for the serving tests: in this process on a thread (the session's runs and 8 devices),
bound to 127.0.0.1 on a free port, stopped when the test's block ends."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import threading
import time
from collections.abc import Iterator

import numpy as np
import requests
from PIL import Image
from triskele.eval.defaults import ServeOptions
from triskele.eval.serving.app import build_app
from triskele.eval.serving.server import DrainingServer, serving_state, warm_up
from triskele.train.tools.launch import free_port

START_SECONDS = 300


@dataclasses.dataclass
class Running:
    url: str
    """host:port, as tritonclient takes it."""
    state: object

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(f"http://{self.url}{path}", timeout=60, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(f"http://{self.url}{path}", timeout=60, **kwargs)

    def metric(self, name: str) -> float:
        """A sample's value from /metrics (name with its labels, as the text format writes it)."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)


@contextlib.contextmanager
def serving(workdir, exported=None, **options) -> Iterator[Running]:
    """A warmed server of `workdir`'s run or an `exported` model (ServeOptions `options`) until the block ends."""
    import uvicorn

    port = free_port()
    state, models = serving_state(workdir, exported, options.pop("mesh", None), None,
                                  ServeOptions(port=port, **options), None)
    warm_up(state, models)
    config = uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_config=None, access_log=False)
    server = DrainingServer(config, state, 5)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    try:
        yield Running(f"127.0.0.1:{port}", state)
    finally:
        server.should_exit = True
        thread.join(60)
        state.batcher.stop()
        state.pool.shutdown()


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def noise(seed: int, size: tuple[int, int], channels: int) -> np.ndarray:
    shape = (*size, channels) if channels == 3 else size
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
