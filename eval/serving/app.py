"""The HTTP side (Starlette): the Open Inference Protocol v2 routes (`routes`), the bearer token on
model and infer routes (health and metrics stay open), the body size limit, the per-request
deadline, a structured access-log line and the status-code count of every request; every refusal
is `{"error": reason}` with a 4xx/5xx status, and the server goes on. An infer request counts as in
flight from its arrival until its response is sent (`Admission`): one over `--max-in-flight` is
refused before its body is read, and the drain on SIGTERM waits for the last byte answered."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.routing import Route
from triskele.eval.serving import routes as handlers
from triskele.eval.serving.inputs import Decoder
from triskele.eval.serving.metrics import ServeMetrics
from triskele.eval.serving.protocol import RequestError
from triskele.eval.serving.state import ServeState

ACCESS_LOG = logging.getLogger("triskele.serve.access")


def _is_infer(scope: dict) -> bool:
    return scope["method"] == "POST" and scope["path"].endswith("/infer")


def _route_kind(path: str) -> str:
    if path.endswith("/infer"):
        return "infer"
    return "health" if path.startswith("/v2/health") else "metrics" if path == "/metrics" else "model"


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
            return await handlers.error_response(refusal)(scope, receive, send)
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


def build_app(state: ServeState) -> Starlette:
    """The Starlette application over `state` (its routes read it as `request.app.state.serve`)."""
    g = handlers.guarded
    routes = [Route("/v2", g(handlers.server_metadata)), Route("/v2/health/live", g(handlers.live)),
              Route("/v2/health/ready", g(handlers.ready)), Route("/metrics", g(handlers.metrics))]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(prefix, g(handlers.model_metadata)), Route(prefix + "/ready", g(handlers.model_ready)),
                   Route(prefix + "/config", g(handlers.model_config)),
                   Route(prefix + "/infer", g(handlers.infer), methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={404: handlers.not_found, 405: handlers.not_found})
    app.state.serve = state
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
