"""The logged speed counts exactly the steps it timed: an evaluation between two log steps takes
its own seconds out and leaves the interval's steps counted."""

import types

import pytest
import triskele.train.loop as loop
from trainutil import run, step_records
from triskele.train.bookkeeping.throughput import StepThroughput

BATCH = 8
EVALUATION_SECONDS = 100.0


@pytest.fixture
def fake_clock(monkeypatch):
    """The loop's clock moves 1 s per training step and 100 s per evaluation (its plots), nothing else."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    compile_step = StepThroughput.compile

    def compile_timed(self, batch):
        compiled = compile_step(self, batch)

        def step(state, batch):
            clock.now += 1.0
            return compiled(state, batch)

        return step

    def plots(workdir):
        clock.now += EVALUATION_SECONDS

    monkeypatch.setattr(StepThroughput, "compile", compile_timed)
    monkeypatch.setattr(loop, "write_plots", plots)
    return clock


def test_images_per_sec_after_an_evaluation_off_the_log_steps(fake_clock, tmp_path):
    run(tmp_path, **{"run.steps": 12, "run.log_every": 4, "run.eval_every": 6, "data.global_batch": BATCH,
                     "data.eval_size": 8, "model.depth": 2})
    records = step_records(tmp_path)
    logged = {step: r for step, r in records.items() if "images_per_sec" in r}
    assert sorted(logged) == [4, 8, 12]
    # each interval: 4 steps of 1 s each; the evaluations at 6 and 12 take no training time
    assert {step: r["images_per_sec"] for step, r in logged.items()} == {4: BATCH, 8: BATCH, 12: BATCH}
    first = logged[4]
    for record in logged.values():  # model FLOPs per 1-s step, the same in every interval
        assert record["tflops_per_device"] == first["tflops_per_device"]
        assert record.get("mfu") == first.get("mfu")


@pytest.mark.slow
def test_the_input_wait_is_the_share_of_each_interval_spent_waiting_for_a_batch(fake_clock, monkeypatch, tmp_path):
    """A source 3 s a batch against 1 s steps: the host waits 3 of every 4 s (the first batch, read
    before compiling, is not timed); a source that is always ahead: no wait."""
    train_batches = loop._train_batches

    def slow(parts, first, bad_records):
        for batch in train_batches(parts, first, bad_records):
            fake_clock.now += 3.0
            yield batch

    run(tmp_path / "fast", **{"run.steps": 8, "run.log_every": 4, "data.global_batch": BATCH})
    assert [r["input_wait_fraction"] for r in step_records(tmp_path / "fast").values()] == [0.0, 0.0]
    monkeypatch.setattr(loop, "_train_batches", slow)
    run(tmp_path / "slow", **{"run.steps": 8, "run.log_every": 4, "data.global_batch": BATCH})
    waits = [r["input_wait_fraction"] for r in step_records(tmp_path / "slow").values()]
    assert waits == [pytest.approx(9 / 13), pytest.approx(12 / 16)]
