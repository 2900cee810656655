"""Serving load: `python -m triskele.eval serve` on 127.0.0.1 driven by tritonclient's HTTP client
(one client per thread), beside the forward-only rate of the same compiled batch sizes.

    python bench/serving_load.py [--preset deepfake-s16] [--requests 2000] [--concurrency 1 --concurrency 8 ...]
                          [--max-batch 32] [--max-delay-ms 5] [--bad 500] [--sigterm] [--workdir runs/bench-serve]
                          [--json FILE]

Each request is one PNG of the model's input size sent as BYTES (decoded on the server with predict's
preprocessing). Per concurrency: requests/s from the first request sent to the last answer, p50/p90/p99
latency, the mean real rows per model call over that level (`triskele_batch_rows` in /metrics), and
errors. Forward only: the compiled `infer` of each batch size on a batch already on the device
(bench/predict.py's measure), in this process before the server starts.
The server takes a bearer token (a file written beside its log) that every request sends but
the two token kinds below, and a body limit (`--max-body-bytes`: 1 MiB, or more where 8 good
images or 2 records as FP32 would not fit); every request carries its own id (the JSON `id`;
tritonclient's `request_id`), and an answer must carry it back.
`--bad N`: N bad requests (at least one of each kind, the kinds in turn) mixed with N good ones at
concurrency 8, the bytes and tensors sent as tritonclient sends them (the binary-tensor
extension): bad JSON, wrong shape, wrong dtype (FP16 records), a truncated PNG (a valid one's first
half), non-image bytes, a GIF, a decompression bomb (a small PNG declaring 30000x30000 pixels: 400
naming limits.image_pixels, from its header: its pixel data are cut short, so a decoder would have
failed otherwise), a body over the limit (413), no token and a wrong token (401), an unknown model
(404). Per kind: right (its status with a JSON `{"error": reason}` holding its reason), another
4xx with a reason, anything else, and the first that was not right; each good one must be the
answer it got alone; the server's resident memory before and after. `--sigterm`: SIGTERM while 32
clients send; per request id, answered, refused (503, or no connection once it exited) or failed,
and lost (accepted, never answered: the ids the access log answered that no client received where
it logs ids, else the clients' failed ids; its 200s against the answers cross-check by count), the
exit status and the seconds from SIGTERM to exit beside --drain-seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as triton
from common import machine, print_table, write_json
from PIL import Image
from predict import checkpoint, forward_only
from triskele.eval.model import load_model
from triskele.eval.serving.batcher import compiled_sizes
from triskele.eval.serving.protocol import encode_request
from triskele.train.data.png import header_only_png
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
    """A `serve` process on a free port of 127.0.0.1, ready once this returns: its model and infer
    routes take `token` (written to a file beside `log`), bodies over `max_body` bytes are 413."""

    def __init__(self, workdir: Path, max_batch: int, max_delay_ms: float, log: Path, token: str, max_body: int):
        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.token, self.max_body = token, max_body
        token_file = log.with_name("serve-token")
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        command = [sys.executable, "-m", "triskele.eval", "serve", "--workdir", str(workdir), "--port",
                   str(self.port), "--max-batch", str(max_batch), "--max-delay-ms", str(max_delay_ms),
                   "--drain-seconds", str(DRAIN_SECONDS), "--max-queue", "1024", "--max-in-flight", "1024",
                   "--token-file", str(token_file), "--max-body-bytes", str(max_body)]
        self.log_path, self.log = log, log.open("w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 1800
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve did not become ready; see {log}")
            time.sleep(0.5)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

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


def infer_once(client: triton.InferenceServerClient, model: tuple[str, str], image: bytes, headers: dict[str, str],
               request_id: str) -> np.ndarray:
    """One image's answer: `model` is (the model's name, the output compared: its first); an answer
    that does not carry `request_id` back is a RuntimeError."""
    tensor = triton.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
    result = client.infer(model[0], [tensor], outputs=[triton.InferRequestedOutput(model[1])], headers=headers,
                          request_id=request_id)
    if result.get_response().get("id") != request_id:
        raise RuntimeError(f"request {request_id!r} answered as {result.get_response().get('id')!r}")
    return result.as_numpy(model[1])[0]


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
                infer_once(client, name, images[i % len(images)], server.auth, f"load{concurrency}-{i}")
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


@dataclasses.dataclass(frozen=True)
class Bad:
    """A kind of bad request: the status and a part of the reason the server must answer it with,
    and `build(request_id) -> (path, body, headers)`."""

    kind: str
    status: int
    reason: str
    build: Callable[[str], tuple[str, bytes, dict[str, str]]]


def bad_requests(size: int, channels: int, name: str, server: Server) -> list[Bad]:
    """Every kind of bad request, each carrying the server's token but for the two token kinds:
    tensors and bytes in the binary-tensor extension, as tritonclient sends them."""
    good = png_bytes(size, channels, 0)
    gif = io.BytesIO()
    Image.new("RGB", (8, 8)).save(gif, format="GIF")
    infer = f"/v2/models/{name}/infer"

    def sent(inputs: dict[str, np.ndarray], headers: dict[str, str] = server.auth, path: str = infer):
        def build(request_id: str) -> tuple[str, bytes, dict[str, str]]:
            body, length = encode_request(inputs, request_id)
            return path, body, {**length, **headers}
        return build

    def images(*items: bytes, **where) -> Callable[[str], tuple[str, bytes, dict[str, str]]]:
        return sent({"image": np.array(items, object)}, **where)

    return [Bad("bad JSON", 400, "not valid JSON", lambda _: (infer, b"{not json", server.auth)),
            Bad("wrong shape", 400, "the model takes",
                sent({"input": np.zeros((1, size // 2, size // 2, channels), np.float32)})),
            Bad("wrong dtype", 400, "must be FP32", sent({"input": np.zeros((1, size, size, channels), np.float16)})),
            Bad("truncated PNG", 400, "cannot read image", images(good[:len(good) // 2])),
            Bad("not an image", 400, "not an image", images(b"plain text, not an image")),
            Bad("a GIF", 400, "GIF", images(gif.getvalue())),
            Bad("decompression bomb", 400, "limits.image_pixels", images(header_only_png(30000, 30000))),
            Bad("body too large", 413, "over the server's limit", images(b"\x00" * server.max_body)),
            Bad("no token", 401, "a bearer token is required", images(good, headers={})),
            Bad("wrong token", 401, "not this server's",
                images(good, headers={"Authorization": f"Bearer not-{server.token}"})),
            Bad("unknown model", 404, "no model 'nobody'", images(good, path="/v2/models/nobody/infer"))]


def refused(server: Server, bad: Bad, session: requests.Session, request_id: str) -> tuple[str, str]:
    """(how a bad request was answered: right, other_4xx or other; the answer in words)."""
    path, body, headers = bad.build(request_id)
    try:
        answer = session.post(f"http://{server.url}{path}", data=body, headers=headers, timeout=120)
    except requests.RequestException as err:
        return "other", f"{type(err).__name__}: {err}"
    try:
        reason = answer.json().get("error")
    except ValueError:
        reason = None
    if 400 <= answer.status_code < 500 and isinstance(reason, str) and reason:
        key = "right" if answer.status_code == bad.status and bad.reason in reason else "other_4xx"
    else:
        key = "other"
    return key, f"{answer.status_code}: {reason if reason else answer.text[:200]}"


def bad_mixed(server: Server, name: tuple[str, str], images: list[bytes], expected: list[np.ndarray], count: int,
              size: int, channels: int) -> dict:
    """`count` bad requests (at least one of each kind, the kinds in turn) mixed with as many good
    ones at concurrency 8. Per kind: `right` (its status with a JSON error holding its reason),
    `other_4xx` (another 4xx with a JSON error), `other` (anything else), the first answer and the
    first that was not right; good ones are right when their answer is the one they got alone,
    under their own id."""
    kinds = bad_requests(size, channels, name[0], server)
    count = max(count, len(kinds))
    per_kind = {bad.kind: {"kind": bad.kind, "expected": f"{bad.status} {bad.reason}", "sent": 0, "right": 0,
                           "other_4xx": 0, "other": 0, "first_wrong": "", "first_answer": ""} for bad in kinds}
    rss_before = server.rss_mb()
    good = {"good_right": 0, "good_wrong": 0, "first_good_wrong": ""}
    lock, counter = threading.Lock(), itertools.count()

    def worker() -> None:
        client = triton.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        session = requests.Session()
        while (i := next(counter)) < 2 * count:
            if i % 2:
                bad = kinds[(i // 2) % len(kinds)]
                key, answer = refused(server, bad, session, f"bad-{i}")
                with lock:
                    row = per_kind[bad.kind]
                    row["sent"] += 1
                    row[key] += 1
                    row["first_answer"] = row["first_answer"] or answer
                    if key != "right" and not row["first_wrong"]:
                        row["first_wrong"] = answer
            else:
                index = (i // 2) % len(images)
                try:
                    answer = infer_once(client, name, images[index], server.auth, f"mixed-{i}")
                    wrong = "" if np.allclose(answer, expected[index], atol=1e-5) else f"{answer} != {expected[index]}"
                except Exception as err:  # noqa: BLE001 - a good request that fails is counted wrong
                    wrong = f"{type(err).__name__}: {err}"
                with lock:
                    good["good_wrong" if wrong else "good_right"] += 1
                    good["first_good_wrong"] = good["first_good_wrong"] or wrong
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rss_after = server.rss_mb()
    rows = list(per_kind.values())
    return {"bad": sum(r["sent"] for r in rows), "bad_as_expected": sum(r["right"] for r in rows),
            "bad_4xx_with_reason": sum(r["right"] + r["other_4xx"] for r in rows),
            "bad_other": sum(r["other"] for r in rows), **good, "rss_before_mb": rss_before,
            "rss_after_mb": rss_after, "rss_growth_mb": rss_after - rss_before, "kinds": rows}


def access_log(path: Path) -> list[dict]:
    """The server's access-log lines (one JSON object per request) in its log file."""
    entries = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "path" in entry and "status" in entry:
                entries.append(entry)
    return entries


def lost_requests(logged: list[dict], got: dict[str, str], received: set[str]) -> tuple[list[str], str]:
    """(the ids of requests accepted and never answered, how they were counted): where the access
    log names ids, those of `got` (id -> the client's outcome) it logged that no client `received`
    an answer to; else the clients' failed ones."""
    logged_ids = {entry["id"] for entry in logged if isinstance(entry.get("id"), str) and entry["id"] in got}
    if logged_ids:
        return sorted(logged_ids - received), "ids: answers the access log gave that no client received"
    return (sorted(request_id for request_id, key in got.items() if key == "failed"),
            "ids: the clients' failed requests (the access log names no ids)")


def sigterm_at_32(server: Server, name: tuple[str, str], images: list[bytes], warm_seconds: float = 3.0) -> dict:
    """SIGTERM while 32 clients send, every request under its own id. What the clients got per id:
    answered (under that id), refused (503, no connection, or a kept-alive connection the exiting
    server closed before reading the request) or failed (no answer otherwise). `lost`, the requests
    accepted and never answered: where the access log names ids, those it logged an answer to that
    no client received (`lost_by` says so); without ids in the log, the failed ones, the clients'
    side alone. `server_answered` (its 200s) beside `answered` cross-checks by count either way;
    the exit status and seconds from SIGTERM to exit."""
    outcomes = {"answered": 0, "refused_503": 0, "refused_no_connection": 0, "refused_connection_closed": 0,
                "failed": 0}
    got: dict[str, str] = {}  # request id -> its outcome
    received: set[str] = set()  # ids a client got an HTTP answer to, of any status
    lock, stop = threading.Lock(), threading.Event()
    failures: list[str] = []
    answered_before = server.metric('triskele_requests_total{code="200",route="infer"}')

    def worker(seed: int) -> None:
        client = triton.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        i, n = seed, 0
        while not stop.is_set():
            request_id, answered = f"term{seed}-{n}", False
            try:
                infer_once(client, name, images[i % len(images)], server.auth, request_id)
                key, answered = "answered", True
            except triton.InferenceServerException as err:
                key, answered = ("refused_503" if str(err.status()) == "503" else "failed"), err.status() is not None
                failures.append(str(err))
            except ConnectionRefusedError:
                key = "refused_no_connection"
                stop.wait(0.05)
            except Exception as err:  # noqa: BLE001 - geventhttpclient's closed connection, or a failure
                key = "refused_connection_closed" if type(err).__name__ == "HTTPConnectionClosed" else "failed"
                failures.append(f"{type(err).__name__}: {err}")
            with lock:
                outcomes[key] += 1
                got[request_id] = key
                if answered:
                    received.add(request_id)
            i, n = i + 32, n + 1

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
    logged = access_log(server.log_path)
    given = sum(entry["path"].endswith("/infer") and entry["status"] == 200 for entry in logged) - answered_before
    lost, lost_by = lost_requests(logged, got, received)
    return {"sent": len(got), **outcomes, "server_answered": given, "lost": len(lost), "lost_by": lost_by,
            "lost_by_count": given - outcomes["answered"], "lost_ids": lost[:20], "exit_code": code,
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
    # good requests (an image, or its records as FP32) fit in the body limit, "body too large" does not
    max_body = max(1 << 20, 8 * max(map(len, images)), 2 * 4 * size * size * channels)
    server = Server(workdir, args.max_batch, args.max_delay_ms, root / "serve.log", secrets.token_urlsafe(16),
                    max_body)
    results: dict = {"machine": machine(), "preset": args.preset, "max_batch": args.max_batch,
                     "max_delay_ms": args.max_delay_ms, "max_body_bytes": max_body, "forward_only": forward}
    try:
        client = triton.InferenceServerClient(server.url)
        model = (meta["domain"], client.get_model_metadata(meta["domain"], headers=server.auth)["outputs"][0]["name"])
        expected = [infer_once(client, model, image, server.auth, f"alone-{k}")  # each alone: the reference answers
                    for k, image in enumerate(images)]
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
            results["bad_mixed"] = mixed = bad_mixed(server, model, images, expected, args.bad, size, channels)
            print_table([mixed], [k for k in mixed if k not in ("kinds", "first_good_wrong")])
            print_table(mixed["kinds"], ["kind", "expected", "sent", "right", "other_4xx", "other", "first_wrong"])
        if args.sigterm:
            results["sigterm"] = sigterm_at_32(server, model, images)
            print_table([results["sigterm"]], [k for k in results["sigterm"]
                                               if k not in ("first_failure", "lost_by", "lost_ids")])
            print(f"lost counted by {results['sigterm']['lost_by']}")
    finally:
        server.stop()
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
