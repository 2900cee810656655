"""`python -m triskele.eval serve`: a checkpoint's (or an exported model's) predictor behind the
Open Inference Protocol over HTTP. The model is loaded once and compiled for every batch size
(`compiled_sizes`), the HTTP server starts, every size is warmed (one batch each) and only then
does `/v2/health/ready` say ready. SIGTERM drains: ready and new infer requests answer 503, the
requests already accepted are answered, and the process exits within `drain_seconds`."""

from __future__ import annotations

import concurrent.futures
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from triskele.eval.defaults import SERVE_LIMITS, ServeOptions
from triskele.eval.serving.app import build_app, triton_config
from triskele.eval.serving.batcher import Batcher, compiled_sizes
from triskele.eval.serving.inputs import Decoder
from triskele.eval.serving.metrics import ServeMetrics
from triskele.eval.serving.state import ServeState
from triskele.train.config.limits import input_limits
from triskele.train.config.schema import InputLimits

LOG = logging.getLogger("triskele.serve")


def compiled_models(workdir: str | Path | None, exported: str | Path | None, mesh: str | None, step: int | None,
                    max_batch: int) -> dict[int, Any]:
    """The model once per batch size (the parameters shared): sizes are multiples of the mesh's
    data x fsdp devices (`compiled_sizes`); an export of a fixed batch has that size alone."""
    from triskele.eval.model import LiveModel, load_model

    if exported is not None:
        from triskele.eval.load_export import ExportedModel

        first = ExportedModel(exported, None)
        if first.meta["input_shape"][0] is not None:
            return {first.batch: first}
        return {size: ExportedModel(exported, size) for size in compiled_sizes(max_batch, 1)}
    first = load_model(workdir, None, mesh, step)
    shards = first.mesh.shape["data"] * first.mesh.shape["fsdp"]
    return {size: LiveModel(first.parts, first.params, size, first.step) for size in compiled_sizes(max_batch, shards)}


def warm(models: dict[int, Any], record_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Runs one batch of zeros through every size (its compilation included); returns one row's
    shape of each raw output."""
    shapes: dict[str, tuple[int, ...]] = {}
    for size, model in sorted(models.items()):
        outputs = model.fetch(model.dispatch(np.zeros((size, *record_shape), np.float32)))
        shapes = {key: tuple(np.shape(value)[1:]) for key, value in outputs.items()}
    return shapes


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM drains first (`drain`) instead of closing the socket at once;
    SIGINT stays uvicorn's (a second one forces the exit)."""

    def __init__(self, config: uvicorn.Config, state: ServeState, drain_seconds: float):
        super().__init__(config)
        self.state, self.drain_seconds = state, drain_seconds
        self.drained: bool | None = None
        """After a SIGTERM: whether every accepted request was answered within the drain time."""
        self.exit_by: float | None = None
        """After a SIGTERM: the time.monotonic() by which the process is to be gone."""
        self.addresses: list[str] = []
        """Where it listens (`http://HOST:PORT`), once its sockets are bound."""
        self._announce = threading.Lock()
        self._announced = False

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                self.addresses.append(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        self.announce()

    def announce(self) -> None:
        """Once bound and warmed up (whichever comes last): where it listens and its metrics path."""
        with self._announce:
            if self._announced or not self.addresses or not self.state.ready:
                return
            self._announced = True
        for address in self.addresses:
            LOG.info("listening on %s (model %r; metrics at %s/metrics)", address, self.state.name, address)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM and not self.state.draining:
            self.exit_by = time.monotonic() + self.drain_seconds
            self.state.draining = True
            self.state.metrics.ready.set(0)
            threading.Thread(target=self.drain, name="triskele-drain", daemon=True).start()
            return
        super().handle_exit(sig, frame)

    def seconds_left(self) -> float:
        """What is left of the drain time for the rest of the exit (all of it without a SIGTERM)."""
        return self.drain_seconds if self.exit_by is None else max(self.exit_by - time.monotonic(), 0.1)

    def drain(self) -> None:
        """Waits until every request in flight is answered, its response sent (or the drain time is
        over: the requests the device still holds are then answered 503 before uvicorn closes their
        connections), then exits, leaving uvicorn what remains of the drain time."""
        LOG.info("SIGTERM: draining %d requests in flight (at most %g s)", self.state.in_flight, self.drain_seconds)
        while (self.state.in_flight or not self.state.batcher.idle()) and time.monotonic() < self.exit_by:
            time.sleep(0.02)
        self.drained = not self.state.in_flight
        if not self.drained:
            LOG.error("the drain time is over with %d requests in flight", self.state.in_flight)
            self.state.batcher.stop(self.seconds_left())
        self.config.timeout_graceful_shutdown = self.seconds_left()
        self.should_exit = True


def serving_state(workdir: str | Path | None, exported: str | Path | None, mesh: str | None, step: int | None,
                  options: ServeOptions, limits: InputLimits | None) -> tuple[ServeState, dict[int, Any]]:
    """The models (compiled, not warmed yet) and the routes' shared state; `limits` default to
    serve's own (`SERVE_LIMITS`)."""
    from triskele.eval.load_export import record_shape
    from triskele.eval.prediction import _predict_io

    if limits is None:
        limits = input_limits((), SERVE_LIMITS)

    models = compiled_models(workdir, exported, mesh, step, options.max_batch)
    model = models[min(models)]
    record = tuple(record_shape(model.meta["image_size"], model.meta["channels"], model.meta["frames"]))
    decoder = Decoder(_predict_io(model, workdir, {}, limits), record, options.max_records)
    return state_of(models, decoder, options.name or model.meta["domain"], options), models


def state_of(models: dict[int, Any], decoder: Decoder, name: str, options: ServeOptions) -> ServeState:
    """The routes' shared state over the compiled `models` (size -> model) and `decoder`."""
    sizes = sorted(models)
    metrics = ServeMetrics(sizes)
    token = None
    if options.token_file is not None:
        token = Path(options.token_file).read_text().strip()
        if not token:
            raise ValueError(f"--token-file {options.token_file} is empty")
    batcher = Batcher(models, options.max_delay_ms / 1000, options.max_queue, metrics.observe)
    return ServeState(name, decoder, batcher, metrics,
                      concurrent.futures.ThreadPoolExecutor(options.threads, "triskele-decode"),
                      triton_config(name, sizes, decoder, options.max_delay_ms / 1000), decoder.metadata({}),
                      options, token)


HEALTH_ROOM = 16
"""Connections uvicorn takes beyond `--max-in-flight` (health probes, /metrics, refusals that say why)."""


def uvicorn_config(state: ServeState) -> uvicorn.Config:
    """uvicorn serving `state`'s routes where its options say; its own connection limit a little above
    `--max-in-flight`, so that infer requests over it get the app's 503 with a reason (`Admission`)
    and a flood of connections still meets a bound."""
    options = state.options
    return uvicorn.Config(build_app(state), host=options.host, port=options.port, log_config=None, access_log=False,
                          timeout_graceful_shutdown=options.drain_seconds,
                          limit_concurrency=options.max_in_flight + HEALTH_ROOM)


def warm_up(state: ServeState, models: dict[int, Any]) -> None:
    """Every size warmed, then ready (the raw outputs' shapes added to the model's metadata)."""
    state.metadata = state.decoder.metadata(warm(models, state.decoder.record_shape))
    for size in models:
        state.metrics.compiled.labels(str(size)).set(1)
    state.batcher.start()
    state.ready = True
    state.metrics.ready.set(1)
    LOG.info("ready: model %r, batch sizes %s", state.name, sorted(models))


class _CurrentStderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when it writes, not the stream it was made with: a
    server started under a captured stderr (pytest, a notebook) keeps logging after that stream closes."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _log_to_stderr() -> None:
    """The server's own lines (start, ready, drain, the access log) on stderr, other libraries' as they are."""
    LOG.setLevel(logging.INFO)  # whoever else listens (a handler added first) gets the lines too
    if not any(isinstance(handler, _CurrentStderr) for handler in LOG.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOG.addHandler(handler)
        LOG.propagate = False


def serve(workdir: str | Path | None, exported: str | Path | None = None, mesh: str | None = None,
          step: int | None = None, options: ServeOptions | None = None,
          limits: InputLimits | None = None) -> dict[str, Any]:
    """Serves until SIGTERM (drained) or SIGINT; returns what it served: `warm_up_error` (why
    warming up failed, else None) and `drained` (after a SIGTERM: whether every request in flight
    was answered within the drain time), which `serve_exit_code` reads."""
    options = options or ServeOptions()
    _log_to_stderr()
    state, models = serving_state(workdir, exported, mesh, step, options, limits)
    server = DrainingServer(uvicorn_config(state), state, options.drain_seconds)
    warm_up_error: list[str] = []

    def warming() -> None:
        try:
            warm_up(state, models)
            server.announce()
        except Exception as err:
            LOG.exception("warming up the model failed; stopping")
            warm_up_error.append(f"{type(err).__name__}: {err}")
            server.should_exit = True

    threading.Thread(target=warming, name="triskele-warm-up", daemon=True).start()
    try:
        server.run()
    finally:
        state.ready = False
        state.batcher.stop(server.seconds_left())
        state.close_pools()
    return {"model": state.name, "batch_sizes": sorted(models), "warm_up_error": next(iter(warm_up_error), None),
            "drained": server.drained}


def serve_exit_code(summary: dict[str, Any]) -> int:
    """1 when warming up failed or the drain ended with requests unanswered, else 0."""
    return 1 if summary["warm_up_error"] is not None or summary["drained"] is False else 0
