"""The Open Inference Protocol v2 routes, each a module-level handler over the app's `ServeState`
(`request.app.state.serve`), and the checks they share: the bearer token, the model's name and
version, liveness and readiness, the body size limit and the request's deadline."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from triskele.eval.serving.metrics import CONTENT_TYPE
from triskele.eval.serving.protocol import HEADER_LENGTH, RequestError, encode_response, parse_infer
from triskele.eval.serving.state import ServeState

Handler = Callable[[Request], Awaitable[Response]]

REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")
"""A request's own `id` that names it in the X-Request-Id header and the log (visible ASCII, short);
another one is answered in the body as it came, and the request is named by a generated id."""


def error_response(err: RequestError) -> JSONResponse:
    return JSONResponse({"error": err.reason}, err.status, headers=err.headers)


def state_of(request: Request) -> ServeState:
    return request.app.state.serve


def name_request(request: Request, request_id: str | None) -> None:
    """Names the request by its own `id` from now on (the access log, X-Request-Id), where it can."""
    if request_id is not None and REQUEST_ID.fullmatch(request_id):
        request.state.request_id = request_id


def authorise(state: ServeState, request: Request) -> None:
    """401 unless the request carries the server's bearer token (when it has one)."""
    if state.token is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.token.encode()):
        raise RequestError(401, "a bearer token is required (Authorization: Bearer TOKEN)" if not given
                           else "the bearer token is not this server's", {"WWW-Authenticate": "Bearer"})


def check_model_route(state: ServeState, request: Request) -> None:
    """An authorised request for this server's model (and its version, 1, where one is named)."""
    authorise(state, request)
    name = request.path_params["name"]
    if name != state.name:
        raise RequestError(404, f"no model {name!r}; this server serves {state.name!r}")
    version = request.path_params.get("version")
    if version not in (None, "1"):
        raise RequestError(404, f"model {name!r} has no version {version!r}; its version is '1'")


def liveness(state: ServeState) -> RequestError | None:
    if state.batcher.failure is not None:
        return RequestError(503, f"the device thread died ({state.batcher.failure}): this server answers no "
                            "more requests; restart it (its log has the traceback)")
    return None


def readiness(state: ServeState) -> RequestError | None:
    refusal = liveness(state)
    if refusal:
        return refusal
    if state.draining:
        return RequestError(503, "the server is draining (SIGTERM): it answers the requests it accepted, then "
                            "exits", {"Retry-After": "1"})
    if not state.ready:
        return RequestError(503, "the model's batch sizes are still being compiled and warmed", {"Retry-After": "1"})
    return None


def guarded(handler: Handler) -> Handler:
    """`handler` whose refusals answer `{"error": reason}` with their status, and whose bugs answer 500."""
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as err:
            return error_response(err)
        except Exception:  # noqa: BLE001 - a bug answers 500 and the server goes on
            request_id = request.state.request_id
            logging.getLogger("triskele.serve").exception("request %s failed", request_id)
            return JSONResponse({"error": f"internal error (request id {request_id})"}, 500)
    return route


async def server_metadata(request: Request) -> Response:
    return JSONResponse({"name": "triskele", "version": "1", "extensions": ["binary_tensor_data",
                                                                             "model_configuration"]})


async def live(request: Request) -> Response:
    refusal = liveness(state_of(request))
    return error_response(refusal) if refusal else JSONResponse({"live": True})


async def ready(request: Request) -> Response:
    refusal = readiness(state_of(request))
    return error_response(refusal) if refusal else JSONResponse({"ready": True})


async def model_metadata(request: Request) -> Response:
    state = state_of(request)
    check_model_route(state, request)
    return JSONResponse({"name": state.name, "versions": ["1"], "platform": "jax", **state.metadata})


async def model_ready(request: Request) -> Response:
    check_model_route(state_of(request), request)
    return await ready(request)


async def model_config(request: Request) -> Response:
    state = state_of(request)
    check_model_route(state, request)
    return JSONResponse(state.config)


async def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE)


async def not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"no route {request.method} {request.url.path}"}, getattr(exc, "status_code", 404))


async def read_body(state: ServeState, request: Request) -> bytes:
    """The request's body, refused (413) as soon as it is declared or read over `--max-body-bytes`."""
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


async def within(state: ServeState, step: Awaitable[Any], deadline: float, what: str) -> Any:
    """`step`'s result, or a 504 once the request's deadline has passed during it."""
    try:
        return await asyncio.wait_for(step, max(deadline - time.monotonic(), 0))
    except TimeoutError:
        raise RequestError(504, f"no answer within the request deadline of {state.options.timeout_seconds:g} s "
                           f"(--timeout-seconds): it passed while {what}") from None


async def run_records(state: ServeState, records: np.ndarray, deadline: float) -> dict[str, np.ndarray]:
    """The model's rows for `records` (n >= 1) through the batcher, within the deadline."""
    job = state.batcher.submit(records, deadline)
    try:
        return await within(state, asyncio.wrap_future(job.future), deadline, "the model's answer was awaited")
    except RequestError:
        job.abandoned = True  # the batcher drops it if it has not started
        raise


def streamed(body: bytes, media_type: str, headers: dict[str, str]) -> StreamingResponse:
    """`body` as a streamed response (its Content-Length given): uvicorn sends the closing empty piece
    of a stream only once its buffer has drained into the socket, so the response is done (and its
    request leaves the count in flight) when the client has taken nearly all of it, not as soon as
    the whole body is queued in memory, as a plain Response would be."""
    async def whole():
        yield body

    return StreamingResponse(whole(), media_type=media_type, headers={**headers, "Content-Length": str(len(body))})


async def answer_infer(state: ServeState, request: Request) -> Response:
    """One infer request: its deadline, from its arrival, bounds reading its body and decoding it
    as well as the model, so that a slow upload or a slow decode cannot hold its place forever."""
    deadline = time.monotonic() + state.options.timeout_seconds
    body = await within(state, read_body(state, request), deadline, "its body was read")
    loop = asyncio.get_running_loop()
    parse = functools.partial(parse_infer, body, request.headers.get(HEADER_LENGTH), state.options.max_images)
    parsed = await within(state, loop.run_in_executor(state.decode_pool, parse), deadline, "it was parsed")
    name_request(request, parsed.id)
    decoding = loop.run_in_executor(state.decode_pool, state.decoder.decode, parsed.inputs, deadline)
    decoded = await within(state, decoding, deadline, "its inputs were decoded")
    outputs = await run_records(state, decoded.records, deadline) if len(decoded.records) else {}

    def encode():
        return encode_response(state.name, parsed, state.decoder.respond(decoded, outputs))

    body, header_length = await loop.run_in_executor(state.encode_pool, encode)
    if header_length is None:
        return streamed(body, "application/json", {})
    return streamed(body, "application/octet-stream", {HEADER_LENGTH: str(header_length)})


async def infer(request: Request) -> Response:
    state = state_of(request)
    check_model_route(state, request)
    refusal = readiness(state)
    if refusal:
        raise refusal
    return await answer_infer(state, request)
