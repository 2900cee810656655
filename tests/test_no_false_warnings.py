"""Commands on a normal workdir log no WARNING (every read of a checkpoint logged
Orbax's 'Given directory is read only')."""

import logging
import shutil

import numpy as np
import pytest
from PIL import Image
from triskele.eval.cli import main as eval_main

pytestmark = pytest.mark.xdist_group("domain_runs")  # shares a session fixture: one worker runs them


@pytest.fixture
def merch_run(domain_runs, tmp_path):
    """A copy of the merch CLI run (what the commands write stays out of the shared run), with a
    folder of product photos and a gallery of reference images."""
    workdir = tmp_path / "run"
    shutil.copytree(domain_runs["merch"], workdir)
    rng = np.random.default_rng(0)
    for path in [tmp_path / "photos" / f"{i}.png" for i in range(3)] + [
            tmp_path / "refs" / f"sku{i}" / "ref.png" for i in range(2)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(path)
    return tmp_path


COMMANDS = {
    "eval": [],
    "gallery": ["gallery", "--input", "{tmp}/refs"],
    "predict": ["predict", "--input", "{tmp}/photos", "--output", "{tmp}/predictions", "--no-progress"],
    "export": ["export", "--output", "{tmp}/model.jax"],
    "quantize": ["quantize", "--format", "int8", "--output", "{tmp}/int8"],
}


def test_eval_gallery_predict_export_and_quantize_log_no_warning(merch_run, caplog, capfd):
    caplog.set_level(logging.WARNING)
    for name, argv in COMMANDS.items():
        args = [arg.format(tmp=merch_run) for arg in argv] + ["--workdir", str(merch_run / "run")]
        assert eval_main(args) == 0, name
        warned = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
        err = capfd.readouterr().err
        assert not warned and "WARNING" not in err, (name, warned, err[-2000:])
        caplog.clear()
