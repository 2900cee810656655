"""The HTTP side (Starlette): the Open Inference Protocol v2 routes, the bearer token on model and
infer routes (health and metrics stay open), the body size limit, the per-request deadline, a
structured access-log line and the status-code count of every request; every refusal is
`{"error": reason}` with a 4xx/5xx status, and the server goes on. An infer request counts as in
flight from its arrival until its response is sent (`Admission`): one over `--max-in-flight` is
refused before its body is read, and the drain on SIGTERM waits for the last byte answered."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import hmac
import json
import logging
import re
import time
import uuid
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from triskele.eval.defaults import ServeOptions
from triskele.eval.serving.batcher import Batcher
from triskele.eval.serving.inputs import Decoder
from triskele.eval.serving.metrics import CONTENT_TYPE, ServeMetrics
from triskele.eval.serving.protocol import HEADER_LENGTH, RequestError, encode_response, parse_infer

ACCESS_LOG = logging.getLogger("triskele.serve.access")
ENCODE_THREADS = 2


@dataclasses.dataclass
class ServeState:
    """What the routes share; `ready` turns on after warm-up and off again for the drain."""

    name: str
    decoder: Decoder
    batcher: Batcher
    metrics: ServeMetrics
    decode_pool: concurrent.futures.Executor
    """Parsing and decoding requests (`--threads`)."""
    config: dict[str, Any]
    """The Triton-style model configuration (`/config`)."""
    metadata: dict[str, Any]
    options: ServeOptions = dataclasses.field(default_factory=ServeOptions)
    token: str | None = None
    ready: bool = False
    draining: bool = False
    encode_pool: concurrent.futures.Executor = dataclasses.field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(ENCODE_THREADS, "triskele-encode"))
    """Encoding answers, apart from decoding: a burst of large uploads does not hold answers back."""
    in_flight: int = 0
    """Infer requests arrived whose response is not sent yet (`Admission`; the drain waits for them)."""

    def close_pools(self) -> None:
        """Ends the decoding and encoding threads once their current work is done; what is queued is dropped."""
        for pool in (self.decode_pool, self.encode_pool):
            pool.shutdown(wait=False, cancel_futures=True)


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse({"error": err.reason}, err.status, headers=err.headers)


def _is_infer(scope: dict) -> bool:
    return scope["method"] == "POST" and scope["path"].endswith("/infer")


def _route_kind(path: str) -> str:
    if path.endswith("/infer"):
        return "infer"
    return "health" if path.startswith("/v2/health") else "metrics" if path == "/metrics" else "model"


REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
"""A request's own `id` that names it in the X-Request-Id header and the log (visible ASCII, short);
another one is answered in the body as it came, and the request is named by a generated id."""


def name_request(request: Request, request_id: str | None) -> None:
    """Names the request by its own `id` from now on (the access log, X-Request-Id), where it can."""
    if request_id is not None and REQUEST_ID.fullmatch(request_id):
        request.state.request_id = request_id


class AccessLog:
    """ASGI middleware: every request named (a generated id, or its own `id` once read:
    `name_request`) in its X-Request-Id header and in one JSON line on the `triskele.serve.access`
    logger; the status-code counter, and the latency of infer requests."""

    def __init__(self, app: Any, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]
        named = scope.setdefault("state", {})
        named["request_id"] = uuid.uuid4().hex

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", named["request_id"].encode())]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            kind = _route_kind(scope["path"])
            self.metrics.requests.labels(kind, str(status[0])).inc()
            if kind == "infer":
                self.metrics.latency.observe(seconds)
            client = scope.get("client") or ("", 0)
            ACCESS_LOG.info(json.dumps({"time": round(time.time(), 3), "id": named["request_id"],
                                        "client": client[0], "method": scope["method"], "path": scope["path"],
                                        "status": status[0], "ms": round(1000 * seconds, 2)}))


class Admission:
    """ASGI middleware: counts infer requests in flight from their arrival until their response is
    sent, and answers one over `--max-in-flight` 503 (Retry-After) at once, before its body is read:
    so many concurrent uploads hold at most that many bodies in memory (uvicorn pauses reading a
    request's body until the app asks for it)."""

    def __init__(self, app: Any, state: ServeState):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _is_infer(scope):
            return await self.app(scope, receive, send)
        limit = self.state.options.max_in_flight
        if self.state.in_flight >= limit:
            refusal = RequestError(503, f"the server has {limit} infer requests in flight, its limit "
                                   "(--max-in-flight); retry shortly", {"Retry-After": "1"})
            return await _error(refusal)(scope, receive, send)
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


def streamed(body: bytes, media_type: str, headers: dict[str, str]) -> StreamingResponse:
    """`body` as a streamed response (its Content-Length given): uvicorn sends the closing empty piece
    of a stream only once its buffer has drained into the socket, so the response is done (and its
    request leaves the count in flight) when the client has taken nearly all of it, not as soon as
    the whole body is queued in memory, as a plain Response would be."""
    async def whole():
        yield body

    return StreamingResponse(whole(), media_type=media_type, headers={**headers, "Content-Length": str(len(body))})


def build_app(state: ServeState) -> Starlette:
    """The Starlette application over `state`."""

    def authorised(request: Request) -> None:
        if state.token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.token.encode()):
            raise RequestError(401, "a bearer token is required (Authorization: Bearer TOKEN)" if not given
                               else "the bearer token is not this server's", {"WWW-Authenticate": "Bearer"})

    def model_route(request: Request) -> None:
        authorised(request)
        name = request.path_params["name"]
        if name != state.name:
            raise RequestError(404, f"no model {name!r}; this server serves {state.name!r}")
        version = request.path_params.get("version")
        if version not in (None, "1"):
            raise RequestError(404, f"model {name!r} has no version {version!r}; its version is '1'")

    def guarded(handler):
        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestError as err:
                return _error(err)
            except Exception:  # noqa: BLE001 - a bug answers 500 and the server goes on
                request_id = request.state.request_id
                logging.getLogger("triskele.serve").exception("request %s failed", request_id)
                return JSONResponse({"error": f"internal error (request id {request_id})"}, 500)
        return route

    async def server_metadata(request: Request) -> Response:
        return JSONResponse({"name": "triskele", "version": "1", "extensions": ["binary_tensor_data",
                                                                                 "model_configuration"]})

    def _liveness() -> RequestError | None:
        if state.batcher.failure is not None:
            return RequestError(503, f"the device thread died ({state.batcher.failure}): this server answers no "
                                "more requests; restart it (its log has the traceback)")
        return None

    async def live(request: Request) -> Response:
        refusal = _liveness()
        return _error(refusal) if refusal else JSONResponse({"live": True})

    def _readiness() -> RequestError | None:
        refusal = _liveness()
        if refusal:
            return refusal
        if state.draining:
            return RequestError(503, "the server is draining (SIGTERM): it answers the requests it accepted, then "
                                "exits", {"Retry-After": "1"})
        if not state.ready:
            return RequestError(503, "the model's batch sizes are still being compiled and warmed",
                                {"Retry-After": "1"})
        return None

    async def ready(request: Request) -> Response:
        refusal = _readiness()
        return _error(refusal) if refusal else JSONResponse({"ready": True})

    async def model_metadata(request: Request) -> Response:
        model_route(request)
        return JSONResponse({"name": state.name, "versions": ["1"], "platform": "jax", **state.metadata})

    async def model_ready(request: Request) -> Response:
        model_route(request)
        return await ready(request)

    async def model_config(request: Request) -> Response:
        model_route(request)
        return JSONResponse(state.config)

    async def body_of(request: Request) -> bytes:
        declared, limit = request.headers.get("content-length"), state.options.max_body_bytes
        too_large = RequestError(413, f"the request body is over the server's limit of {limit:,} bytes "
                                 "(--max-body-bytes)")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    async def infer(request: Request) -> Response:
        model_route(request)
        refusal = _readiness()
        if refusal:
            raise refusal
        return await _infer(request)

    async def within(step: Any, deadline: float, what: str) -> Any:
        """`step`'s result (an awaitable), or a 504 once the request's deadline has passed during it."""
        try:
            return await asyncio.wait_for(step, max(deadline - time.monotonic(), 0))
        except TimeoutError:
            raise RequestError(504, f"no answer within the request deadline of {state.options.timeout_seconds:g} s "
                               f"(--timeout-seconds): it passed while {what}") from None

    async def _run(records: np.ndarray, deadline: float) -> dict[str, np.ndarray]:
        """The model's rows for `records` (n >= 1) through the batcher, within the deadline."""
        job = state.batcher.submit(records, deadline)
        try:
            return await within(asyncio.wrap_future(job.future), deadline, "the model's answer was awaited")
        except RequestError:
            job.abandoned = True  # the batcher drops it if it has not started
            raise

    async def _infer(request: Request) -> Response:
        """One infer request: its deadline, from its arrival, bounds reading its body and decoding it
        as well as the model, so that a slow upload or a slow decode cannot hold its place forever."""
        deadline = time.monotonic() + state.options.timeout_seconds
        body = await within(body_of(request), deadline, "its body was read")
        loop = asyncio.get_running_loop()
        parse = functools.partial(parse_infer, body, request.headers.get(HEADER_LENGTH), state.options.max_images)
        parsed = await within(loop.run_in_executor(state.decode_pool, parse), deadline, "it was parsed")
        name_request(request, parsed.id)
        decoded = await within(loop.run_in_executor(state.decode_pool, state.decoder.decode, parsed.inputs, deadline),
                               deadline, "its inputs were decoded")
        outputs = await _run(decoded.records, deadline) if len(decoded.records) else {}

        def encode():
            return encode_response(state.name, parsed, state.decoder.respond(decoded, outputs))

        body, header_length = await loop.run_in_executor(state.encode_pool, encode)
        if header_length is None:
            return streamed(body, "application/json", {})
        return streamed(body, "application/octet-stream", {HEADER_LENGTH: str(header_length)})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version}"
    routes = [Route("/v2", guarded(server_metadata)), Route("/v2/health/live", guarded(live)),
              Route("/v2/health/ready", guarded(ready)), Route("/metrics", guarded(metrics))]
    for prefix in (model, versioned):
        routes += [Route(prefix, guarded(model_metadata)), Route(prefix + "/ready", guarded(model_ready)),
                   Route(prefix + "/config", guarded(model_config)),
                   Route(prefix + "/infer", guarded(infer), methods=["POST"])]

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": f"no route {request.method} {request.url.path}"},
                            getattr(exc, "status_code", 404))

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.add_middleware(Admission, state=state)
    app.add_middleware(AccessLog, metrics=state.metrics)  # the outer one: it logs the admission's refusals too
    return app


def triton_config(name: str, sizes: list[int], decoder: Decoder, max_delay: float) -> dict[str, Any]:
    """The model's configuration as Triton gives it (`max_batch_size`, inputs and outputs without
    the batch dimension, the dynamic batcher's sizes), which tritonclient and perf_analyzer read."""
    def tensor(spec: dict[str, Any]) -> dict[str, Any]:
        dims = spec["shape"][1:] or [1]
        entry = {"name": spec["name"], "data_type": "TYPE_STRING" if spec["datatype"] == "BYTES"
                 else f"TYPE_{spec['datatype']}", "dims": dims}
        return {**entry, "reshape": {"shape": []}} if not spec["shape"][1:] else entry

    metadata = decoder.metadata({})
    return {"name": name, "platform": "jax", "backend": "triskele", "max_batch_size": sizes[-1],
            "input": [tensor(spec) for spec in metadata["inputs"]],
            "output": [tensor(spec) for spec in metadata["outputs"]],
            "dynamic_batching": {"preferred_batch_size": sizes,
                                 "max_queue_delay_microseconds": int(np.round(max_delay * 1e6))}}
