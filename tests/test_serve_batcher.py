"""The dynamic batcher on its own, with a model that records its calls (`Doubling`): the padding rule, large
requests split, every request its own rows, deadlines and a bounded queue. No JAX."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest
from serveutil import Doubling, Fatal, wait_for
from triskele.eval.serving.batcher import Batcher, compiled_sizes
from triskele.eval.serving.protocol import RequestError


def _batcher(sizes, max_delay=0.05, max_queue=100):
    calls, events = [], []
    batcher = Batcher({s: Doubling(s, calls) for s in sizes}, max_delay, max_queue,
                      lambda event, value: events.append((event, value)))
    return batcher, calls, events


def test_compiled_sizes_double_from_the_devices_a_batch_is_split_over():
    assert compiled_sizes(32, 1) == [1, 2, 4, 8, 16, 32]
    assert compiled_sizes(20, 8) == [8, 16]
    with pytest.raises(ValueError, match="--max-batch 8"):
        compiled_sizes(4, 8)


def test_queued_requests_run_together_padded_to_the_smallest_size_that_holds_them():
    batcher, calls, events = _batcher([1, 2, 4, 8], max_delay=0.5)
    jobs = [batcher.submit(np.full((1, 3), i, np.float32), time.monotonic() + 60) for i in range(3)]
    batcher.start()
    try:
        for i, job in enumerate(jobs):
            np.testing.assert_array_equal(job.future.result(30)["y"], np.full((1, 3), 2 * i))
    finally:
        batcher.stop()
    assert calls == [4]
    assert [v for e, v in events if e == "batch"] == [3]


def test_a_full_largest_batch_goes_and_a_large_request_is_split_into_its_own_rows():
    batcher, calls, events = _batcher([2, 4, 8], max_delay=0.2)
    big = np.arange(20 * 2, dtype=np.float32).reshape(20, 2)
    small = np.full((3, 2), -1, np.float32)
    jobs = [batcher.submit(big, time.monotonic() + 60), batcher.submit(small, time.monotonic() + 60)]
    batcher.start()
    try:
        np.testing.assert_array_equal(jobs[0].future.result(30)["y"], big * 2)
        np.testing.assert_array_equal(jobs[1].future.result(30)["y"], small * 2)
    finally:
        batcher.stop()
    real = [v for e, v in events if e == "batch"]
    assert real == [8, 8, 7] and calls == [8, 8, 8]
    for rows, padded in zip(real, [v for e, v in events if e == "padded"], strict=True):
        assert padded == min(s for s in (2, 4, 8) if s >= rows)


def test_many_concurrent_requests_each_get_their_own_rows_and_padding_follows_the_rule():
    sizes = [1, 2, 4, 8]
    batcher, calls, events = _batcher(sizes, max_delay=0.01)
    batcher.start()
    rng = np.random.default_rng(0)
    requests = [rng.random((int(rng.integers(1, 12)), 2), np.float32) for _ in range(40)]
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            jobs = list(pool.map(lambda r: batcher.submit(r, time.monotonic() + 60), requests))
        for rows, job in zip(requests, jobs, strict=True):
            np.testing.assert_array_equal(job.future.result(30)["y"], rows * 2)
    finally:
        batcher.stop()
    real = [v for e, v in events if e == "batch"]
    assert sum(real) == sum(len(r) for r in requests)
    for rows, padded in zip(real, [v for e, v in events if e == "padded"], strict=True):
        assert padded == min(s for s in sizes if s >= rows)


def test_a_request_past_its_deadline_is_not_run_and_a_full_queue_refuses_with_retry_after():
    batcher, calls, _ = _batcher([1, 2], max_queue=2)
    late = batcher.submit(np.zeros((1, 1), np.float32), time.monotonic() - 1)
    batcher.submit(np.zeros((1, 1), np.float32), time.monotonic() + 60)
    with pytest.raises(RequestError) as refused:
        batcher.submit(np.zeros((1, 1), np.float32), time.monotonic() + 60)
    assert refused.value.status == 503 and refused.value.headers["Retry-After"]
    batcher.start()
    try:
        with pytest.raises(RequestError, match="deadline") as expired:
            late.future.result(30)
        assert expired.value.status == 504
    finally:
        batcher.stop()
    assert calls == [1]


class Logging(Doubling):
    """As Doubling, and `log` lists ('dispatch'|'fetch', batch number) in the order they happen."""

    def __init__(self, size, calls, log):
        super().__init__(size, calls)
        self.log = log

    def dispatch(self, rows):
        number = len(self.calls)
        super().dispatch(rows)
        self.log.append(("dispatch", number))
        return number, rows

    def fetch(self, handle):
        number, rows = handle
        self.log.append(("fetch", number))
        return super().fetch(rows)


def _logging_batcher(sizes, max_delay):
    calls, log = [], []
    return Batcher({s: Logging(s, calls, log) for s in sizes}, max_delay, 100), calls, log


def test_the_next_batch_is_dispatched_before_the_one_in_flight_is_fetched():
    """20 rows queued on sizes 2, 4, 8 (no delay: the last 4 go as soon as they are gathered):
    batches 8, 8, 4, each dispatched before the previous one's outputs are fetched (as predict
    does), and the answers still each request's own rows."""
    batcher, calls, log = _logging_batcher([2, 4, 8], max_delay=0)
    rows = np.arange(20 * 2, dtype=np.float32).reshape(20, 2)
    jobs = [batcher.submit(rows[:13], time.monotonic() + 60), batcher.submit(rows[13:], time.monotonic() + 60)]
    batcher.start()
    try:
        np.testing.assert_array_equal(jobs[0].future.result(30)["y"], rows[:13] * 2)
        np.testing.assert_array_equal(jobs[1].future.result(30)["y"], rows[13:] * 2)
    finally:
        batcher.stop()
    assert calls == [8, 8, 4]
    assert log == [("dispatch", 0), ("dispatch", 1), ("fetch", 0), ("dispatch", 2), ("fetch", 1), ("fetch", 2)]


def test_a_batch_in_flight_is_answered_without_waiting_for_the_next_batch_to_fill():
    """A full batch goes; the request left over waits (60 s) for company, but the batch in flight is
    fetched and answered meanwhile, not held until the next one goes."""
    batcher, calls, log = _logging_batcher([1, 2], max_delay=60)
    records = [np.full((1, 1), i, np.float32) for i in range(3)]
    jobs = [batcher.submit(r, time.monotonic() + 120) for r in records]
    batcher.start()
    try:
        for i in range(2):
            np.testing.assert_array_equal(jobs[i].future.result(30)["y"], records[i] * 2)
        assert not jobs[2].future.done() and not batcher.idle()
        assert log == [("dispatch", 0), ("fetch", 0)]
    finally:
        batcher.stop()  # stopping sends the last request at once
    np.testing.assert_array_equal(jobs[2].future.result(30)["y"], records[2] * 2)
    assert calls == [2, 1] and batcher.idle()


def test_a_failed_dispatch_or_fetch_fails_only_its_own_requests():
    class Failing(Doubling):
        def __init__(self, size, calls, fail_on):
            super().__init__(size, calls)
            self.fail_on = fail_on

        def dispatch(self, rows):
            if self.fail_on == "dispatch" and rows[0, 0] < 0:
                raise RuntimeError("no device")
            return super().dispatch(rows)

        def fetch(self, rows):
            if self.fail_on == "fetch" and rows[0, 0] < 0:
                raise RuntimeError("device lost")
            return super().fetch(rows)

    for fail_on in ("dispatch", "fetch"):
        batcher = Batcher({2: Failing(2, [], fail_on)}, 0.01, 100)
        good, bad_rows = np.ones((2, 1), np.float32), -np.ones((2, 1), np.float32)
        jobs = [batcher.submit(r, time.monotonic() + 60) for r in (good, bad_rows, good)]
        batcher.start()
        try:
            np.testing.assert_array_equal(jobs[0].future.result(30)["y"], good * 2)
            with pytest.raises(RuntimeError, match="batch of 2"):
                jobs[1].future.result(30)
            np.testing.assert_array_equal(jobs[2].future.result(30)["y"], good * 2)
        finally:
            batcher.stop()


def test_a_batch_failing_in_padding_or_an_observer_fails_only_its_requests_and_the_thread_goes_on():
    """Records of two shapes cannot be stacked into one batch; an observer raises on the batch of
    3 rows: each fails its own requests, and the requests after them are answered."""
    def observe(event, value):
        if event == "batch" and value == 3:
            raise RuntimeError("metrics broke")

    batcher = Batcher({s: Doubling(s) for s in (1, 2, 4)}, 0.5, 100, observe)
    ragged = [batcher.submit(np.ones((1, 2), np.float32), time.monotonic() + 60),
              batcher.submit(np.ones((1, 3), np.float32), time.monotonic() + 60)]
    batcher.start()
    try:
        for job in ragged:
            with pytest.raises(RuntimeError, match="a batch of 2 failed: ValueError"):
                job.future.result(30)
        observed = batcher.submit(np.ones((3, 2), np.float32), time.monotonic() + 60)
        with pytest.raises(RuntimeError, match="a batch of 4 failed: RuntimeError: metrics broke"):
            observed.future.result(30)
        after = batcher.submit(np.ones((2, 2), np.float32), time.monotonic() + 60)
        np.testing.assert_array_equal(after.future.result(30)["y"], np.full((2, 2), 2))
        assert batcher.failure is None
    finally:
        batcher.stop()


def test_a_dead_device_thread_fails_every_request_it_holds_and_refuses_new_ones():
    class Dying(Doubling):
        def dispatch(self, rows):
            raise Fatal("gone")

    batcher = Batcher({1: Dying(1)}, 0.5, 100)
    held = [batcher.submit(np.ones((1, 1), np.float32), time.monotonic() + 60) for _ in range(3)]
    batcher.start()
    for job in held:
        with pytest.raises(RequestError, match="device thread died") as failed:
            job.future.result(30)
        assert failed.value.status == 503
    assert batcher.failure == "Fatal" and batcher.idle()
    with pytest.raises(RequestError, match="device thread died"):
        batcher.submit(np.ones((1, 1), np.float32), time.monotonic() + 60)
    batcher.stop()


def test_stop_is_bounded_when_the_device_hangs_and_answers_the_requests_it_holds():
    gate = threading.Event()
    batcher = Batcher({1: Doubling(1, gate=gate)}, 0.0, 100)
    jobs = [batcher.submit(np.ones((1, 1), np.float32), time.monotonic() + 60) for _ in range(2)]
    batcher.start()
    wait_for(lambda: batcher.busy, "the first batch to reach the device")
    stopped = []
    stopping = threading.Thread(target=lambda: stopped.append(batcher.stop(0.2)))
    stopping.start()
    stopping.join(30)
    try:
        assert not stopping.is_alive() and stopped == [False]
        for job in jobs:  # the one on the device and the one still queued
            with pytest.raises(RequestError, match="stopped before this request was answered") as failed:
                job.future.result(30)
            assert failed.value.status == 503
    finally:
        gate.set()
    assert batcher.stop(30) is True
