"""Domains own their evaluate and predict flags and their commands: the shared command lines add
them from the registry, and a flag or command used on another domain's model is refused by name."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of, small_config
from triskele.eval.cli import main as eval_main
from triskele.eval.domains import DomainInference, inference_of
from triskele.train.cli import main as train_main
from triskele.train.domains import domains
from triskele.train.evaluator import Evaluator
from triskele.train.run import prepare

LEGACY_RUN = Path(__file__).parent / "fixtures" / "legacy" / "mars-run"
"""A mars checkpoint (16 px, depth 1) kept in the repository."""


@pytest.fixture
def mars_run(tmp_path):
    return shutil.copytree(LEGACY_RUN, tmp_path / "mars-run")


@pytest.mark.parametrize("name", ["mars", "merch", "deepfake"])
def test_each_built_in_domain_gives_an_evaluator_and_an_inference_module(name):
    domain = domains()[name]
    parts = prepare(small_config(f"{name}-tiny", **{"model.image_size": 16}), mesh_of("single"))
    for for_report in (False, True):
        assert isinstance(domain.evaluator(parts, for_report), Evaluator)
    assert isinstance(inference_of(domain), DomainInference)


def test_the_shared_command_lines_list_each_domains_flags_and_commands(capsys):
    with pytest.raises(SystemExit):
        eval_main(["predict", "--help"])
    predict_help = capsys.readouterr().out
    for group, flags in (("mars only", ("--stride", "--tta", "--overlay")), ("deepfake only", ("--save-faces",))):
        assert group in predict_help and all(flag in predict_help for flag in flags), predict_help
    with pytest.raises(SystemExit):
        eval_main(["--help"])
    evaluate_help = capsys.readouterr().out
    assert "deepfake only" in evaluate_help and "--holdout" in evaluate_help and "gallery" in evaluate_help
    with pytest.raises(SystemExit):
        train_main(["prepare", "--help"])
    assert "deepfake" in capsys.readouterr().out


def test_a_predict_flag_of_another_domain_is_refused_naming_its_domain(mars_run, tmp_path, capsys):
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "a.png")
    code = eval_main(["predict", "--workdir", str(mars_run), "--input", str(tmp_path / "a.png"), "--output",
                      str(tmp_path / "out"), "--save-faces", str(tmp_path / "faces"), "--mesh", "data=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'save_faces' is an option of deepfake; this model is mars" in err, err
    assert not (tmp_path / "out").exists()


def test_an_evaluate_flag_of_another_domain_is_refused_naming_its_domain(mars_run, capsys):
    assert eval_main(["--workdir", str(mars_run), "--holdout", "Sharpen", "--mesh", "data=8"]) == 2
    err = capsys.readouterr().err
    assert "'deepfake.eval_methods' is an option of the deepfake domain, but this run's domain is mars" in err, err
    assert not (mars_run / "eval").exists()


def test_a_domain_command_on_another_domains_run_is_refused(mars_run, tmp_path, capsys):
    (tmp_path / "refs" / "cola").mkdir(parents=True)
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "refs" / "cola" / "a.png")
    assert eval_main(["gallery", "--workdir", str(mars_run), "--input", str(tmp_path / "refs"),
                      "--mesh", "data=8"]) == 2
    assert "a gallery index is for merch runs" in capsys.readouterr().err
    assert not (mars_run / "gallery").exists()


def test_clips_are_refused_by_a_domain_whose_models_take_single_images(tmp_path, capsys):
    assert train_main(["--workdir", str(tmp_path), "--set", "model.frames=4", "--steps", "1", "--no-progress"]) == 2
    assert "model.frames=4: mars models take single images, not clips; use model.frames=1" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()
