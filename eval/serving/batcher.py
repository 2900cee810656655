"""The dynamic batcher: requests' records queue; one device thread gathers them into the batch
sizes compiled at start-up (Triton's dynamic batcher on TF Serving's allowed batch sizes). A full
largest batch goes at once; otherwise the oldest request waits at most `max_delay` for company,
and the batch is padded to the smallest compiled size that holds it. A request larger than the
largest size is split over several batches; each request gets back exactly its own rows.

One batch stays in flight while the next is gathered, as predict does (`triskele.mesh.chunks.overlapped`):
a batch that is ready to go when the previous one is on the device is dispatched before the
previous one's outputs are fetched; one that would still wait for company is not waited for
with a batch in flight (that batch's requests are answered first).

Whatever fails while a batch is made, run or split (the model, the padding, an observer) fails that
batch's requests only, and the thread goes on; should the thread die all the same, every request
it holds fails at once (503), `failure` says why and the server's health says so.
numpy only: the models come in through `dispatch`/`fetch`."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from triskele.eval.serving.protocol import RequestError
from triskele.mesh.chunks import Outputs, pad_rows

LOG = logging.getLogger("triskele.serve")


def compiled_sizes(max_batch: int, shards: int) -> list[int]:
    """`shards`, twice that, four times, ... up to `max_batch`: each size a multiple of the devices
    a batch is split over, each at most twice the one below (so a batch is never padded to more
    than twice its rows, but below the smallest size)."""
    if max_batch < shards:
        raise ValueError(f"--max-batch {max_batch} is below the {shards} devices a batch is split over (data x fsdp "
                         f"of the mesh); use --max-batch {shards} or more")
    sizes = [shards]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    return sizes


def padded_size(rows: int, sizes: list[int]) -> int:
    """The smallest compiled size that holds `rows` (rows <= the largest)."""
    return next(size for size in sizes if size >= rows)


@dataclasses.dataclass(eq=False)
class Job:
    """One request's records on their way through the batcher (equal only to itself)."""

    records: np.ndarray
    deadline: float
    """time.monotonic() after which it is not started (the handler has answered 504)."""
    enqueued: float = dataclasses.field(default_factory=time.monotonic)
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    taken: int = 0
    """Rows handed to batches so far."""
    filled: int = 0
    parts: list[Outputs] = dataclasses.field(default_factory=list)
    abandoned: bool = False

    def add(self, outputs: Outputs) -> None:
        """Outputs of its next rows, in order; the job's result once all its rows are back."""
        self.parts.append(outputs)
        self.filled += len(next(iter(outputs.values())))
        if self.filled == len(self.records) and not self.future.done():
            self.future.set_result({key: np.concatenate([p[key] for p in self.parts]) for key in outputs})


class Batcher:
    """`submit(records, deadline)` queues a request and returns its Future; `start()` runs the
    device thread, `stop(timeout)` ends it once the queue is empty. `models[size]` runs batches of `size`
    rows; `observe(event, value)` hears 'queue_wait' (seconds), 'batch' (real rows) with 'padded'
    (compiled size) and 'queue_depth' (requests waiting)."""

    def __init__(self, models: dict[int, Any], max_delay: float, max_queue: int,
                 observe: Callable[[str, float], None] = lambda event, value: None):
        self.models, self.sizes = models, sorted(models)
        self.max_delay, self.max_queue, self.observe = max_delay, max_queue, observe
        self.queue: collections.deque[Job] = collections.deque()
        self.busy = False
        self.failure: str | None = None
        """Why the device thread died (None while it lives or after it stopped as asked)."""
        self._open: set[Job] = set()
        """Requests submitted and not answered yet (queued, or in a batch)."""
        self._condition = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="triskele-device", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Ends the device thread once the queue is empty, waiting `timeout` seconds at most (None:
        as long as it takes); whether it ended. A thread still busy then (a device that hangs) is
        left behind, and every request it holds is answered 503."""
        if self._thread.ident is None:  # never started
            return True
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return True
        LOG.error("the device thread did not end within %g s; answering the %d requests it holds", timeout,
                  len(self._open))
        self._fail_open(RequestError(503, "the server stopped before this request was answered"))
        return False

    def idle(self) -> bool:
        """Nothing queued and no batch on the device."""
        with self._condition:
            return not self.queue and not self.busy

    def submit(self, records: np.ndarray, deadline: float) -> Job:
        """Queues one request's records (n >= 1); a full queue is a 503 with Retry-After."""
        job = Job(np.asarray(records, np.float32), deadline)
        with self._condition:
            if self.failure is not None:
                raise self._died()
            if len(self.queue) >= self.max_queue:
                raise RequestError(503, f"the server's queue is full ({self.max_queue} requests waiting); retry "
                                   "shortly", {"Retry-After": "1"})
            self.queue.append(job)
            self._open.add(job)
            job.future.add_done_callback(lambda _: self._open.discard(job))
            self.observe("queue_depth", len(self.queue))
            self._condition.notify_all()
        return job

    def _died(self) -> RequestError:
        return RequestError(503, f"the server's device thread died ({self.failure}); it answers no more requests "
                            "until it is restarted (its log has the traceback)")

    def _run(self) -> None:
        """The device thread: `_loop`, and should anything escape it, every request it holds failed."""
        try:
            self._loop()
        except BaseException as err:  # noqa: BLE001 - a dead thread must not leave requests waiting
            LOG.critical("the device thread died; failing every request it holds", exc_info=True)
            with self._condition:
                self.failure = type(err).__name__
                self.queue.clear()
                self.busy = False
            self._fail_open(self._died())

    def _fail_open(self, err: RequestError) -> None:
        """Every request submitted and not answered yet gets `err`."""
        for job in list(self._open):
            if not job.future.done():
                job.future.set_exception(err)

    def _pending_rows(self) -> int:
        return sum(len(job.records) - job.taken for job in self.queue)

    def _gather(self, wait: bool) -> list[tuple[Job, int, int]] | None:
        """The next batch's (job, first row, end row) spans once it should go; None when stopping
        with nothing left, or (not `wait`) when none should go yet. Called with the condition held."""
        largest = self.sizes[-1]
        while True:
            now = time.monotonic()
            for job in [j for j in self.queue if j.taken == 0 and (j.abandoned or j.deadline <= now)]:
                self.queue.remove(job)  # not started: its handler has answered (or will answer) 504
                if not job.future.done():
                    job.future.set_exception(RequestError(504, "the request's deadline passed while it was queued"))
            if not self.queue:
                if self._stopping or not wait:
                    return None
                self._condition.wait()
                continue
            delay = self.queue[0].enqueued + self.max_delay - now
            if self._pending_rows() >= largest or delay <= 0 or self._stopping:
                break
            if not wait:
                return None
            self._condition.wait(delay)
        spans, room = [], largest
        while self.queue and room:
            job = self.queue[0]
            take = min(room, len(job.records) - job.taken)
            spans.append((job, job.taken, job.taken + take))
            job.taken += take
            room -= take
            if job.taken == len(job.records):
                self.queue.popleft()
        return spans

    def _loop(self) -> None:
        in_flight: Flight | None = None
        while True:
            with self._condition:
                spans = self._gather(wait=in_flight is None)
                if spans is None and in_flight is None:
                    return
                self.busy = True
            try:
                if spans is not None:
                    dispatched = self._dispatch(spans)
                    if in_flight is not None:
                        self._answer(in_flight)
                    in_flight = dispatched
                else:  # nothing to go yet: answer the batch on the device before waiting for more
                    self._answer(in_flight)
                    in_flight = None
            finally:
                with self._condition:
                    self.busy = in_flight is not None
                    self._condition.notify_all()

    def _dispatch(self, spans: list[tuple[Job, int, int]]) -> Flight | None:
        """Starts the batch of `spans` on the device (None: it failed, and so did its requests)."""
        size = padded_size(sum(stop - start for _, start, stop in spans), self.sizes)
        try:
            now = time.monotonic()
            for job, start, _ in spans:
                if start == 0:
                    self.observe("queue_wait", now - job.enqueued)
            self.observe("queue_depth", len(self.queue))
            rows = np.concatenate([job.records[start:stop] for job, start, stop in spans])
            self.observe("batch", len(rows))
            self.observe("padded", size)
            model = self.models[size]
            return Flight(spans, size, model, model.dispatch(pad_rows(rows, size)))
        except Exception as err:  # noqa: BLE001 - one failed batch fails its requests, the server goes on
            _fail(spans, size, err)
            return None

    def _answer(self, flight: Flight | None) -> None:
        """Fetches a batch in flight and gives each of its requests its own rows."""
        if flight is None:
            return
        try:
            outputs = flight.model.fetch(flight.handle)
            offset = 0
            for job, start, stop in flight.spans:
                job.add({key: np.asarray(value)[offset:offset + stop - start] for key, value in outputs.items()})
                offset += stop - start
        except Exception as err:  # noqa: BLE001 - as in _dispatch
            _fail(flight.spans, flight.size, err)


@dataclasses.dataclass
class Flight:
    """A batch dispatched and not fetched yet."""

    spans: list[tuple[Job, int, int]]
    size: int
    model: Any
    handle: Any


def _fail(spans: list[tuple[Job, int, int]], size: int, err: Exception) -> None:
    for job, _, _ in spans:
        if not job.future.done():
            job.future.set_exception(RuntimeError(f"a batch of {size} failed: {type(err).__name__}: {err}"))
