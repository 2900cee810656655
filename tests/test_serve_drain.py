"""`python -m triskele.eval serve` as a real process: ready only once every batch size is warmed
(infer refused before), and SIGTERM under load drains: ready and new infer requests answer 503,
every request already accepted is answered, the process exits 0 by itself, one access-log line
per request."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests
from triskele.train.tools.launch import free_port

pytestmark = pytest.mark.xdist_group("serve")

START_SECONDS = 300
ACCEPTED = 12


def _get(url, path):
    try:
        return requests.get(url + path, timeout=30)
    except requests.ConnectionError:
        return None


def _wait(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def _metric(url, name):
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def test_ready_after_warm_up_and_sigterm_answers_every_accepted_request(domain_runs, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the accepted requests wait in the queue for company (20 s at most): SIGTERM comes while they do
    command = [sys.executable, "-m", "triskele.eval", "serve", "--workdir", str(domain_runs["deepfake"]),
               "--port", str(port), "--max-batch", "16", "--max-delay-ms", "20000", "--drain-seconds", "60"]
    log = (tmp_path / "stderr").open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=os.environ.copy())
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 32, 32, 3], "datatype": "FP32",
                                   "data": np.zeros(32 * 32 * 3).tolist()}]})
    infer = url + "/v2/models/deepfake/infer"
    try:
        early = []  # (infer, then ready) while warming: an infer answered means ready says so after it

        def ready():
            answer = _get(url, "/v2/health/ready")
            assert process.poll() is None, (tmp_path / "stderr").read_text()
            if answer is None:
                return False
            if answer.status_code == 503:
                assert "warmed" in answer.json()["error"]
                early.append((requests.post(infer, data=body, timeout=60).status_code,
                              _get(url, "/v2/health/ready").status_code))
            return answer.status_code == 200

        _wait(ready, START_SECONDS, "the server to be ready")
        assert set(early) <= {(503, 503), (503, 200), (200, 200)}
        for size in (8, 16):
            assert _metric(url, f'triskele_compiled_batch_size{{size="{size}"}}') == 1

        answers = []

        def one():
            answers.append(requests.post(infer, data=body, timeout=120))

        threads = [threading.Thread(target=one) for _ in range(ACCEPTED)]
        for thread in threads:
            thread.start()
        _wait(lambda: _metric(url, "triskele_queue_depth") == ACCEPTED, 120, "every request to be queued")
        process.send_signal(signal.SIGTERM)
        _wait(lambda: _get(url, "/v2/health/ready").status_code == 503, 30, "ready to turn 503")
        assert "draining" in _get(url, "/v2/health/ready").json()["error"]
        refused = requests.post(infer, data=body, timeout=30)
        assert refused.status_code == 503 and "draining" in refused.json()["error"]
        for thread in threads:
            thread.join(120)
        assert [a.status_code for a in answers] == [200] * ACCEPTED
        assert all(len(a.json()["outputs"][0]["data"]) == 1 for a in answers)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    assert process.returncode == 0, (tmp_path / "stderr").read_text()
    assert json.loads(out)["drained"] is True
    lines = [json.loads(line) for line in (tmp_path / "stderr").read_text().splitlines() if line.startswith("{")]
    served = [line for line in lines if line["path"] == "/v2/models/deepfake/infer" and line["status"] == 200]
    assert len(served) == ACCEPTED + sum(status == 200 for status, _ in early)
