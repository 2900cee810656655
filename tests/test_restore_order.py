"""Which checkpoint a run restores when it holds several (the resume tests held
one checkpoint each, so restoring the oldest first went unnoticed), and the consistency check
between a checkpoint's model and its data iterator (item 14: no test reached it).

One run of 6 steps stopped after step 3 keeps checkpoints 1, 2 and 3; every test works on a copy of
it and relaunches the same config. The config is the engine tests' (`small_config` with 6 steps on
data=8, as test_train_engine's resume tests): its compiled step is shared with theirs."""

import json
import shutil

import pytest
from trainutil import mesh_of, small_config, step_records
from triskele.eval.model import load_model
from triskele.train import train
from triskele.train.run import restore_params, restore_run

MESH = "data=8"


def config():
    return small_config(**{"run.steps": 6, "checkpoint.every": 1, "checkpoint.keep": 3})


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("three") / "run"
    train(config(), workdir, mesh=mesh_of(MESH), progress=False, stop_after_step=3)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1", "2", "3"]
    return workdir


@pytest.fixture
def run_copy(three_checkpoints, tmp_path):
    return shutil.copytree(three_checkpoints, tmp_path / "run")


def steps_kept(workdir):
    return sorted(p.name for p in (workdir / "checkpoints").iterdir())


def test_evaluation_and_inference_read_the_newest_of_three_checkpoints(three_checkpoints):
    _, state, step = restore_run(three_checkpoints, mesh_of("single"))
    assert (step, int(state.step)) == (3, 3)
    assert restore_params(three_checkpoints, mesh_of("single"))[2] == 3
    assert load_model(three_checkpoints, mesh="data=8").identity["step"] == 3
    _, state, step = restore_run(three_checkpoints, mesh_of("single"), step=1)  # one asked for: that one
    assert (step, int(state.step)) == (1, 1)


def test_a_relaunch_resumes_from_the_newest_of_three_checkpoints(run_copy):
    summary = train(config(), run_copy, mesh=mesh_of(MESH), progress=False)
    assert (summary.first_step, summary.final_step) == (4, 6)  # from the oldest: 2, with steps 2-3 redone
    assert sorted(step_records(run_copy)) == list(range(1, 7)) and not (run_copy / "metrics.dropped.jsonl").exists()
    assert steps_kept(run_copy) == ["4", "5", "6"]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_next_newest_not_the_oldest(run_copy, capsys):
    (run_copy / "checkpoints" / "3" / "commit_success.txt").unlink()
    with pytest.raises(ValueError, match="checkpoint step 3 .* cannot be restored.*the newest step that restores is "
                                         "2: pass --step 2"):
        restore_run(run_copy, mesh_of("single"))  # read-only: names the step to pass (not 1), moves nothing
    assert steps_kept(run_copy) == ["1", "2", "3"]
    summary = train(config(), run_copy, mesh=mesh_of(MESH), progress=False)
    assert (summary.first_step, summary.final_step) == (3, 6)
    assert steps_kept(run_copy) == ["4", "5", "6", "corrupt-3"]
    assert "checkpoint step 3" in capsys.readouterr().err
    assert len((run_copy / "metrics.dropped.jsonl").read_text().splitlines()) == 1  # step 3, redone


def test_a_checkpoint_whose_data_iterator_and_model_disagree_is_refused(run_copy):
    data = run_copy / "checkpoints" / "3" / "data" / "metadata"
    assert json.loads(data.read_text()) == {"next_step": 3}
    data.write_text(json.dumps({"next_step": 2}))  # the model at step 3, the data order at step 2
    with pytest.raises(ValueError, match=r"checkpoint 3 in .*checkpoints is inconsistent: its data iterator is at "
                                         r"step 2 but its model at step 3"):
        train(config(), run_copy, mesh=mesh_of(MESH), progress=False)
    assert steps_kept(run_copy) == ["1", "2", "3"]  # nothing trained, nothing moved aside
