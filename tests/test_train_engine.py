
import jax
import numpy as np
import pytest
from conftest import assert_trees_close, relative_error
from trainutil import final_params, mesh_of, run, small_config, step_records
from triskele.mesh import host_to_global
from triskele.train import train
from triskele.train.data.pipeline import TrainStepLoader
from triskele.train.run import prepare
from triskele.train.step import summed_gradients

STEPS = 5


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("single")
    run(workdir, "single", **{"run.steps": STEPS})
    return step_records(workdir), final_params(workdir)[0]


def assert_same_trajectory(records, reference, tol):
    assert sorted(records) == sorted(reference)
    for step in reference:
        for key in ("loss", "grad_norm"):
            err = relative_error(records[step][key], reference[step][key])
            assert err < tol, f"step {step} {key}: {records[step][key]} vs {reference[step][key]}"


@pytest.mark.parametrize("spec", ["data=8", "fsdp=8", "data=2,fsdp=2,tensor=2"])
def test_mesh_invariance(spec, single_device_run, tmp_path, devices):
    reference_records, reference_params = single_device_run
    run(tmp_path, spec, **{"run.steps": STEPS})
    assert_same_trajectory(step_records(tmp_path), reference_records, 1e-4)
    params, step = final_params(tmp_path)
    assert step == STEPS
    assert_trees_close(params, reference_params, 1e-4)
    # The run learned something, so equal trajectories are not equal by accident.
    assert reference_records[STEPS]["loss"] < reference_records[1]["loss"]


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_step(tmp_path, devices):
    mesh = mesh_of("data=2,fsdp=2,tensor=2")
    config = small_config()
    parts = prepare(config, mesh)
    params = parts.init_state().params
    source = parts.domain.open_split(config, "train")
    batch = host_to_global(TrainStepLoader(source, 32, 0, (0, 32))(0), mesh, 32)
    with jax.set_mesh(mesh):
        gradients = jax.jit(summed_gradients, static_argnums=(0, 3))
        whole_loss, whole_weight, whole = gradients(parts.graphdef, params, batch, 1)
        accum_loss, accum_weight, accum = gradients(parts.graphdef, params, batch, 4)
    assert relative_error(accum_loss, whole_loss) < 1e-5 and relative_error(accum_weight, whole_weight) < 1e-5
    assert_trees_close(jax.device_get(accum), jax.device_get(whole), 1e-5)

    # Through the optimizer: updates with grad_accum=4 equal those of the whole batch. Adam's first
    # update is g / (|g| + eps): an element with |g| near eps turns the 1e-6 round-off of the sums
    # into ~1e-4 of that array's update (seen with eps=1e-8: one bias element at |g|=3e-8), so the
    # parameter comparison runs with eps=1e-6, where no element sits on that edge.
    options = {"run.steps": 2, "optim.eps": 1e-6}
    run(tmp_path / "whole", "data=2,fsdp=2,tensor=2", **options)
    run(tmp_path / "accum", "data=2,fsdp=2,tensor=2", **options, **{"optim.grad_accum": 4})
    assert_same_trajectory(step_records(tmp_path / "accum"), step_records(tmp_path / "whole"), 1e-4)
    assert_trees_close(final_params(tmp_path / "accum")[0], final_params(tmp_path / "whole")[0], 1e-4)


@pytest.mark.slow
def test_resume_continues_the_same_trajectory(tmp_path, devices):
    n = 3
    straight = run(tmp_path / "straight", "data=8", **{"run.steps": 2 * n})
    assert (straight.first_step, straight.final_step, straight.stopped_by) == (1, 2 * n, "completed")
    config = small_config(**{"run.steps": 2 * n})
    first = train(config, tmp_path / "resumed", mesh=mesh_of("data=8"), progress=False, stop_after_step=n)
    assert (first.final_step, first.stopped_by) == (n, "stop_after_step")
    second = train(config, tmp_path / "resumed", mesh=mesh_of("data=8"), progress=False)
    assert (second.first_step, second.final_step) == (n + 1, 2 * n)
    records = step_records(tmp_path / "resumed")
    assert sorted(records) == list(range(1, 2 * n + 1)), "a resumed run must not redo steps"
    reference = step_records(tmp_path / "straight")
    for step in reference:
        assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5
    assert_trees_close(final_params(tmp_path / "resumed")[0], final_params(tmp_path / "straight")[0], 1e-5)


@pytest.mark.slow
def test_restore_on_another_mesh_reshards(tmp_path, devices):
    n = 3
    config = small_config(**{"run.steps": 2 * n})
    train(config, tmp_path / "straight", mesh=mesh_of("data=8"), progress=False)
    train(config, tmp_path / "moved", mesh=mesh_of("data=8"), progress=False, stop_after_step=n)
    moved = train(config, tmp_path / "moved", mesh=mesh_of("fsdp=4,tensor=2"), progress=False)
    assert moved.first_step == n + 1
    records, reference = step_records(tmp_path / "moved"), step_records(tmp_path / "straight")
    for step in range(n + 1, 2 * n + 1):
        assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5


def poison_step(monkeypatch, bad_step: int) -> None:
    """Makes the batch of global step `bad_step` (1-based) all NaN pixels."""
    load = TrainStepLoader.__call__

    def poisoned(self, step):
        batch = load(self, step)
        if int(step) + 1 == bad_step:
            batch["image"] = np.full_like(batch["image"], np.nan)
        return batch

    monkeypatch.setattr(TrainStepLoader, "__call__", poisoned)


@pytest.mark.slow
@pytest.mark.parametrize("log_every, checkpoint_every", [(1, 1), (10, 3)])
def test_nonfinite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(log_every, checkpoint_every, tmp_path,
                                                                              monkeypatch, devices):
    bad_step = 8
    poison_step(monkeypatch, bad_step)
    options = {"run.steps": 30, "checkpoint.every": checkpoint_every, "run.log_every": log_every}
    with pytest.raises(FloatingPointError, match=rf"non-finite loss .* at step {bad_step};") as info:
        run(tmp_path, "data=8", **options)
    last_good = (bad_step - 1) // checkpoint_every * checkpoint_every
    assert f"last good checkpoint is step {last_good}" in str(info.value)
    saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert max(saved) == last_good, "a state whose loss was not seen finite was saved"
    params, step = final_params(tmp_path)
    assert step == last_good and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    if log_every < bad_step:
        assert sorted(step_records(tmp_path)) == list(range(1, bad_step)), "the bad step is not logged"


def test_a_diverging_run_stops_naming_the_step(tmp_path, devices):
    with pytest.raises(FloatingPointError, match=r"non-finite loss .* at step \d+; stopped"):
        run(tmp_path, "data=8", **{"run.steps": 30, "optim.lr": 1e12, "run.log_every": 5})


@pytest.mark.slow
def test_metrics_fetched_at_log_steps_equal_those_fetched_every_step(tmp_path, devices):
    """The loop fetches step metrics only at log steps; the logged values are the same numbers."""
    run(tmp_path / "every", "data=8", **{"run.steps": 6, "run.log_every": 1})
    run(tmp_path / "third", "data=8", **{"run.steps": 6, "run.log_every": 3})
    every, third = step_records(tmp_path / "every"), step_records(tmp_path / "third")
    assert sorted(third) == [3, 6]
    for step in third:
        for key in ("loss", "grad_norm", "lr"):
            assert third[step][key] == every[step][key], (step, key)
        window = [every[s]["loss"] for s in range(step - 2, step + 1)]
        assert third[step]["loss_mean"] == pytest.approx(np.mean(window), rel=1e-6)
        assert third[step]["tflops_per_device"] > 0 and "mfu" not in third[step]  # CPU: no known peak


def test_skipped_steps_do_not_advance_the_logged_learning_rate(tmp_path, monkeypatch, devices):
    """The logged lr is the rate the update uses: the schedule at the optimizer's own count, which
    a skipped step does not advance; after k skips, step s logs schedule(s - 1 - k)."""
    from triskele.train.optim import learning_rate_schedule

    load, bad = TrainStepLoader.__call__, {3, 4}  # 1-based steps whose batch is all NaN
    monkeypatch.setattr(TrainStepLoader, "__call__", lambda self, step: {
        **load(self, step), **({"image": np.full_like(load(self, step)["image"], np.nan)} if step + 1 in bad else {})})
    options = {"run.steps": 8, "run.on_nonfinite": "skip", "optim.warmup_steps": 4}
    run(tmp_path, "data=8", **options)
    records = step_records(tmp_path)
    schedule = learning_rate_schedule(small_config(**options).optim, 8)
    assert [records[s]["skipped_steps"] for s in range(1, 9)] == [0, 0, 1, 1, 0, 0, 0, 0]
    for s in range(1, 9):
        skips = len([b for b in bad if b < s])
        assert records[s]["lr"] == pytest.approx(float(schedule(s - 1 - skips)), rel=1e-6), s
    # Warm-up (lr x t / 4) makes the two counts distinguishable: step 5 applies t = 2, not t = 4.
    assert records[5]["lr"] == pytest.approx(1e-3 * 2 / 4, rel=1e-6)
