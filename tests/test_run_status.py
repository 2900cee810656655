"""`python -m triskele.train status`: a run's folder alone says whether it reached its last step."""

from __future__ import annotations

import json

from triskele.train.cli import main as train_main
from triskele.train.tools.status import UNFINISHED_EXIT, run_status


def test_only_a_complete_checkpoint_of_the_last_step_finishes_a_run(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"run": {"steps": 10}}))
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    (tmp_path / "checkpoints" / "10.orbax-checkpoint-tmp-1").mkdir()  # a save in progress
    assert run_status(tmp_path) == {"steps": 10, "checkpoint": 5, "finished": False}
    assert train_main(["status", "--workdir", str(tmp_path)]) == UNFINISHED_EXIT == 75
    (tmp_path / "checkpoints" / "10").mkdir()
    assert run_status(tmp_path) == {"steps": 10, "checkpoint": 10, "finished": True}
    assert train_main(["status", "--workdir", str(tmp_path)]) == 0
    assert "finished: checkpoint 10 of step 10" in capsys.readouterr().out


def test_a_folder_without_a_run_is_named(tmp_path, capsys):
    assert train_main(["status", "--workdir", str(tmp_path)]) == 2
    assert f"{tmp_path} holds no run (no config.json)" in capsys.readouterr().err
