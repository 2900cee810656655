"""A checkpoint and an exported model written by the code before the rooms issue moved every
domain's modules (tests/fixtures/legacy/make_legacy_run.py at commit 12769bc) still restore and
load, and give the outputs they gave then."""

import shutil
from pathlib import Path

import numpy as np
from trainutil import mesh_of
from triskele.eval import load_exported
from triskele.eval.model import LiveModel
from triskele.train.run import restore_run

LEGACY = Path(__file__).parent / "fixtures" / "legacy"


def test_a_checkpoint_written_before_the_move_restores_and_predicts_as_it_did(tmp_path):
    run = shutil.copytree(LEGACY / "mars-run", tmp_path / "mars-run")
    expected = np.load(LEGACY / "expected.npz")
    parts, state, step = restore_run(run, mesh_of("single"))
    assert step == 2 and parts.config.model.depth == 1
    logits = LiveModel(parts, state.params)(expected["inputs"])["logits"]
    np.testing.assert_allclose(logits, expected["live_logits"], rtol=1e-5, atol=1e-5)


def test_an_export_written_before_the_move_loads_and_serves_as_it_did():
    expected = np.load(LEGACY / "expected.npz")
    served = load_exported(LEGACY / "mars.jax")(expected["inputs"])["logits"]
    np.testing.assert_allclose(served, expected["exported_logits"], rtol=1e-6, atol=1e-6)
