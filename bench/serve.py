"""Serving load: `python -m triskele.eval serve` on 127.0.0.1 driven by tritonclient's HTTP client
(one client per thread), beside the forward-only rate of the same compiled batch sizes.

    python bench/serve.py [--preset deepfake-s16] [--requests 2000] [--concurrency 1 --concurrency 8 ...]
                          [--max-batch 32] [--max-delay-ms 5] [--bad 500] [--sigterm] [--workdir runs/bench-serve]
                          [--json FILE]

Each request is one PNG of the model's input size sent as BYTES (decoded on the server with predict's
preprocessing). Per concurrency: requests/s from the first request sent to the last answer, p50/p90/p99
latency, the mean real rows per model call over that level (`triskele_batch_rows` in /metrics), and
errors. Forward only: the compiled `serve` of each batch size on a batch already on the device
(bench/predict.py's measure), in this process before the server starts.
`--bad N`: N bad requests of every kind the server refuses (bad JSON, wrong shape, wrong dtype,
truncated and non-image bytes, a GIF, an unknown model) mixed with N good ones at concurrency 8:
each bad one must be a 4xx naming its reason, each good one the answer it got alone; the server's
resident memory before and after. `--sigterm`: SIGTERM while 32 clients send; requests answered,
refused (503, or no connection once it exited) and lost (accepted, never answered), the exit status
and the seconds from SIGTERM to exit beside --drain-seconds.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as triton
from common import machine, print_table, write_json
from PIL import Image
from predict import checkpoint, forward_only
from triskele.eval.model import load_model
from triskele.eval.serving.batcher import compiled_sizes
from triskele.train.tools.launch import free_port

CONCURRENCY = (1, 8, 32, 128)
DRAIN_SECONDS = 30.0


def png_bytes(size: int, channels: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size) if channels == 1 else (size, size, channels),
                                                  np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class Server:
    """A `serve` process on a free port of 127.0.0.1, ready once this returns."""

    def __init__(self, workdir: Path, max_batch: int, max_delay_ms: float, log: Path):
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "triskele.eval", "serve", "--workdir", str(workdir), "--port",
                   str(self.port), "--max-batch", str(max_batch), "--max-delay-ms", str(max_delay_ms),
                   "--drain-seconds", str(DRAIN_SECONDS), "--max-queue", "1024"]
        self.log_path, self.log = log, log.open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 1800
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not become ready; see {log}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            return requests.get(f"http://{self.url}/v2/health/ready", timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    def metric(self, name: str) -> float:
        for line in requests.get(f"http://{self.url}/metrics", timeout=30).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(DRAIN_SECONDS + 30)
        self.log.close()


def infer_once(client: triton.InferenceServerClient, model: tuple[str, str], image: bytes) -> np.ndarray:
    """One image's answer: `model` is (the model's name, the output compared: its first)."""
    tensor = triton.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
    return client.infer(model[0], [tensor], outputs=[triton.InferRequestedOutput(model[1])]).as_numpy(model[1])[0]


def load_level(server: Server, name: tuple[str, str], images: list[bytes], concurrency: int, count: int) -> dict:
    """`count` requests from `concurrency` threads: throughput, latency percentiles, errors, mean batch."""
    rows_before, calls_before = server.metric("triskele_batch_rows_sum"), server.metric("triskele_batch_rows_count")
    counter, lock = itertools.count(), threading.Lock()
    latencies: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        client = triton.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        while (i := next(counter)) < count:
            began = time.perf_counter()
            try:
                infer_once(client, name, images[i % len(images)])
                with lock:
                    latencies.append(time.perf_counter() - began)
            except Exception as err:  # noqa: BLE001 - every failure counted, the load goes on
                with lock:
                    errors.append(f"{type(err).__name__}: {err}")
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    calls = server.metric("triskele_batch_rows_count") - calls_before
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99]) * 1000 if latencies else (np.nan,) * 3
    return {"concurrency": concurrency, "requests": count, "requests_per_sec": len(latencies) / seconds,
            "p50_ms": p50, "p90_ms": p90, "p99_ms": p99,
            "mean_batch": (server.metric("triskele_batch_rows_sum") - rows_before) / calls if calls else 0.0,
            "errors": len(errors), "first_error": errors[0] if errors else ""}


def bad_requests(size: int, channels: int, name: str) -> list[tuple[str, str, bytes]]:
    """(kind, path, body) of each kind of bad request, JSON bodies."""
    def body(inputs: list[dict]) -> bytes:
        return json.dumps({"inputs": inputs}).encode()

    good = png_bytes(size, channels, 0)
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    infer = f"/v2/models/{name}/infer"
    image = {"name": "image", "shape": [1], "datatype": "BYTES"}
    return [("bad JSON", infer, b"{not json"),
            ("wrong shape", infer, body([{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}])),
            ("wrong dtype", infer, body([{"name": "input", "shape": [1], "datatype": "INT8", "data": [0]}])),
            ("truncated image", infer, body([{**image, "data": [good[:len(good) // 2].decode("latin-1")]}])),
            ("not an image", infer, body([{**image, "data": ["plain text"]}])),
            ("a GIF", infer, body([{**image, "data": [gif.getvalue().decode("latin-1")]}])),
            ("unknown model", "/v2/models/nobody/infer", body([{**image, "data": ["x"]}]))]


def bad_mixed(server: Server, name: tuple[str, str], images: list[bytes], expected: list[np.ndarray], count: int,
              size: int, channels: int) -> dict:
    """`count` bad requests of every kind mixed with `count` good ones at concurrency 8."""
    kinds = bad_requests(size, channels, name[0])
    rss_before = server.rss_mb()
    outcomes: dict[str, int] = {"bad_4xx_with_reason": 0, "bad_other": 0, "good_right": 0, "good_wrong": 0}
    lock, counter = threading.Lock(), itertools.count()

    def worker() -> None:
        client = triton.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        session = requests.Session()
        while (i := next(counter)) < 2 * count:
            if i % 2:
                _, path, body = kinds[(i // 2) % len(kinds)]
                answer = session.post(f"http://{server.url}{path}", data=body, timeout=120)
                ok = 400 <= answer.status_code < 500 and bool(answer.json().get("error"))
                key = "bad_4xx_with_reason" if ok else "bad_other"
            else:
                index = (i // 2) % len(images)
                try:
                    right = np.allclose(infer_once(client, name, images[index]), expected[index], atol=1e-5)
                except Exception:  # noqa: BLE001 - a good request that fails is counted wrong
                    right = False
                key = "good_right" if right else "good_wrong"
            with lock:
                outcomes[key] += 1
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rss_after = server.rss_mb()
    return {**outcomes, "rss_before_mb": rss_before, "rss_after_mb": rss_after, "rss_growth_mb": rss_after - rss_before}


def sigterm_at_32(server: Server, name: tuple[str, str], images: list[bytes], warm_seconds: float = 3.0) -> dict:
    """SIGTERM while 32 clients send: what the clients got (answered; refused: 503, no connection, or
    a kept-alive connection the exiting server closed before reading the request), the answers the
    server gave (its access log) and `lost`, those given that no client received; the exit status
    and seconds from SIGTERM to exit."""
    outcomes = {"answered": 0, "refused_503": 0, "refused_no_connection": 0, "refused_connection_closed": 0}
    lock, stop = threading.Lock(), threading.Event()
    failures: list[str] = []
    answered_before = server.metric('triskele_requests_total{code="200",route="infer"}')

    def worker(seed: int) -> None:
        client = triton.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        i = seed
        while not stop.is_set():
            try:
                infer_once(client, name, images[i % len(images)])
                key = "answered"
            except triton.InferenceServerException as err:
                key = "refused_503" if str(err.status()) == "503" else "failed"
                failures.append(str(err))
            except ConnectionRefusedError:
                key = "refused_no_connection"
                stop.wait(0.05)
            except Exception as err:  # noqa: BLE001 - geventhttpclient's closed connection, or a failure
                key = "refused_connection_closed" if type(err).__name__ == "HTTPConnectionClosed" else "failed"
                failures.append(f"{type(err).__name__}: {err}")
            with lock:
                outcomes[key] = outcomes.get(key, 0) + 1
            i += 32

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(32)]
    for thread in threads:
        thread.start()
    time.sleep(warm_seconds)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(DRAIN_SECONDS + 30)
    exit_seconds = time.monotonic() - signalled
    time.sleep(1)  # the clients see the closed port
    stop.set()
    for thread in threads:
        thread.join()
    server.log.flush()
    logged = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith('{"time"')]
    given = sum(entry["path"].endswith("/infer") and entry["status"] == 200 for entry in logged) - answered_before
    return {**outcomes, "server_answered": given, "lost": given - outcomes["answered"], "exit_code": code,
            "exit_seconds": exit_seconds, "drain_seconds": DRAIN_SECONDS,
            "first_failure": next((f for f in failures if "503" not in f), "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="deepfake-s16", help="a 224-px ViT-S/16 frame model by default")
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency (default 2000)")
    parser.add_argument("--concurrency", action="append", type=int,
                        help=f"default: {', '.join(map(str, CONCURRENCY))}")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-delay-ms", type=float, default=5.0)
    parser.add_argument("--bad", type=int, default=0, help="bad requests mixed with as many good ones (goal: 500)")
    parser.add_argument("--sigterm", action="store_true", help="SIGTERM at concurrency 32 at the end")
    parser.add_argument("--workdir", default="runs/bench-serve")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    root = Path(args.workdir)
    workdir = checkpoint(root, args.preset, "float32")
    first = load_model(workdir, batch=1)
    meta = first.meta
    size, channels = meta["image_size"], meta["channels"]
    shape = (size, size, channels)
    forward = [{"batch": b, "forward_records_per_sec": forward_only(load_model(workdir, batch=b),
                                                                    np.random.default_rng(1).random((b, *shape),
                                                                                                    np.float32))}
               for b in compiled_sizes(args.max_batch, 1)]
    del first
    images = [png_bytes(size, channels, seed) for seed in range(64)]
    server = Server(workdir, args.max_batch, args.max_delay_ms, root / "serve.log")
    results: dict = {"machine": machine(), "preset": args.preset, "max_batch": args.max_batch,
                     "max_delay_ms": args.max_delay_ms, "forward_only": forward}
    try:
        client = triton.InferenceServerClient(server.url)
        model = (meta["domain"], client.get_model_metadata(meta["domain"])["outputs"][0]["name"])
        expected = [infer_once(client, model, image) for image in images]  # each alone: the reference answers
        client.close()
        levels = [load_level(server, model, images, c, args.requests) for c in args.concurrency or CONCURRENCY]
        largest = forward[-1]["forward_records_per_sec"]
        for level in levels:
            level["vs_forward_largest"] = level["requests_per_sec"] / largest
        results["load"] = levels
        print(f"serve {args.preset} on {machine()['device_kind']} x 1, sizes {[f['batch'] for f in forward]}")
        print_table(forward, ["batch", "forward_records_per_sec"])
        print_table(levels, ["concurrency", "requests", "requests_per_sec", "vs_forward_largest", "p50_ms", "p90_ms",
                             "p99_ms", "mean_batch", "errors"])
        if args.bad:
            results["bad_mixed"] = bad_mixed(server, model, images, expected, args.bad, size, channels)
            print_table([results["bad_mixed"]], list(results["bad_mixed"]))
        if args.sigterm:
            results["sigterm"] = sigterm_at_32(server, model, images)
            print_table([results["sigterm"]], [k for k in results["sigterm"] if k != "first_failure"])
    finally:
        server.stop()
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
