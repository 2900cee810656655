"""`python -m triskele.eval serve`'s exit status, the command run in this process over models
without JAX (`fake_state` in place of the checkpoint's): 1 when warming up fails; 1 when SIGTERM's
drain ends with a request unanswered (a device that hangs), and then within the drain time."""

import json
import os
import signal
import threading

import numpy as np
import pytest
import requests
from serveutil import FAKE_INFER, fake_state, records_request, wait_for
from triskele.eval.cli import main as eval_main
from triskele.eval.serving import server as server_module
from triskele.train.tools.launch import free_port

pytestmark = pytest.mark.xdist_group("serve")


@pytest.fixture
def fake_model(monkeypatch):
    """serve's state built by `fake_state` from the command's own options; the test gets it and its gate."""
    built = {}

    def serving_state(workdir, exported, mesh, step, options, limits):
        built["state"], models, built["gate"] = fake_state(options)
        return built["state"], models

    monkeypatch.setattr(server_module, "serving_state", serving_state)
    return built


def _serve(tmp_path, port, *flags):
    return eval_main(["serve", "--workdir", str(tmp_path), "--port", str(port), *flags])


def test_serve_exits_1_when_warming_up_fails(fake_model, monkeypatch, tmp_path, capsys):
    def failing(models, record_shape):
        raise RuntimeError("no device")

    monkeypatch.setattr(server_module, "warm", failing)
    assert _serve(tmp_path, free_port()) == 1
    assert json.loads(capsys.readouterr().out)["warm_up_error"] == "RuntimeError: no device"


def test_serve_exits_1_when_the_drain_leaves_a_request_unanswered(fake_model, tmp_path, capsys):
    """A request held on the device (the gate closed) when SIGTERM comes, --drain-seconds 1: the
    drain gives up, the request is answered 503 (or its connection closed), and serve returns 1."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    answers = []

    def client():
        def ready():
            try:
                return requests.get(url + "/v2/health/ready", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(ready, "the server to be ready")
        fake_model["gate"].clear()
        body, headers = records_request(np.ones((1, 2), np.float32))
        held = threading.Thread(target=lambda: answers.append(_post(url + FAKE_INFER, body, headers)))
        held.start()
        wait_for(lambda: fake_model["state"].batcher.busy, "the request to reach the device")
        os.kill(os.getpid(), signal.SIGTERM)
        held.join(60)

    helper = threading.Thread(target=client)
    helper.start()
    try:
        assert _serve(tmp_path, port, "--drain-seconds", "1") == 1
    finally:
        fake_model["gate"].set()
        helper.join(60)
    assert json.loads(capsys.readouterr().out)["drained"] is False
    assert answers in ([503], [None])


def _post(url, body, headers):
    """The status of a POST, None when the server closed the connection instead."""
    try:
        return requests.post(url, data=body, headers=headers, timeout=60).status_code
    except requests.ConnectionError:
        return None


def test_the_server_log_writes_to_the_stderr_of_the_moment_not_a_closed_one(monkeypatch):
    import io
    import logging

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    handler = server_module._CurrentStderr()
    record = logging.LogRecord("triskele.serve", logging.INFO, __file__, 1, "served %d", (7,), None)
    handler.emit(record)
    first.close()  # the capture of the test that started the server ends
    monkeypatch.setattr("sys.stderr", second)
    handler.emit(record)
    assert second.getvalue() == "served 7\n"


def test_serve_says_where_it_listens_once_ready_and_refuses_a_port_out_of_range(fake_model, tmp_path, capsys):
    """--port 0 (any free port): once warmed up, one line gives the address that answers, and its
    metrics path; a port past 65535 is refused at the door (exit 2), not wrapped round to another."""
    import logging
    import re

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Lines()
    server_module.LOG.addHandler(handler)
    seen = {}

    def client():
        try:  # whatever happens here, serve is stopped: a missed line fails the test instead of hanging it
            wait_for(lambda: any(line.startswith("listening on ") for line in lines), "the listening line")
            (line,) = [line for line in lines if line.startswith("listening on ")]
            seen["line"] = line
            url = re.match(r"listening on (http://127\.0\.0\.1:\d+) ", line).group(1)
            seen["ready"] = requests.get(url + "/v2/health/ready", timeout=10).status_code
            seen["metrics"] = requests.get(url + "/metrics", timeout=10).status_code
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    helper = threading.Thread(target=client)
    helper.start()
    try:
        assert _serve(tmp_path, 0) == 0
    finally:
        helper.join(60)
        server_module.LOG.removeHandler(handler)
    assert seen.get("ready") == 200 and seen.get("metrics") == 200, (seen, lines)
    assert re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+) \(model '\w+'; metrics at \1/metrics\)", seen["line"])
    assert sum(line.startswith("listening on ") for line in lines) == 1
    capsys.readouterr()
    for port in ("99999", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            _serve(tmp_path, port)
        assert exit_info.value.code == 2
        assert f"argument --port: {port} is out of range; give an integer from 0 to 65535" in capsys.readouterr().err
