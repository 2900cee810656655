"""examples/quickstart.ipynb runs top to bottom (it trains, evaluates, resumes and exports), and the
notebook API (`predict`, `predict_iter`) gives on an image what the model computes."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).parent.parent / "examples" / "quickstart.ipynb"


def test_the_quickstart_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRISKELE_NOTEBOOK_WORKDIR", str(tmp_path / "run"))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), \
        "outputs are not committed"
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert (tmp_path / "run" / "export" / "mars.jax").is_file()
    assert (tmp_path / "run" / "checkpoints" / "50").is_dir()


LEGACY_RUN = Path(__file__).parent / "fixtures" / "legacy" / "mars-run"


def test_predict_and_predict_iter_give_what_the_model_computes_on_an_image(tmp_path):
    """The notebook API run, not only imported: a 16-pixel frame (one window of
    the committed mars run) predicted by `predict` and `predict_iter`, with their options, against the
    model's own forward pass on the same pixels."""
    import shutil

    import numpy as np
    from PIL import Image
    from triskele.eval import predict, predict_iter
    from triskele.eval.model import load_model

    workdir = shutil.copytree(LEGACY_RUN, tmp_path / "run")
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16), np.uint8)
    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.fromarray(pixels).save(inputs / "frame.png")
    frames = np.stack([pixels, pixels[:, ::-1]])[..., None].astype(np.float32) / 255
    logits = load_model(workdir, mesh="data=8")(frames)["logits"]  # (2, 16, 16, 4): the frame, mirrored

    (got,) = predict_iter(workdir, inputs, mesh="data=8")
    assert got.error is None and got.unit.key == "frame.png"
    np.testing.assert_allclose(got.outputs["logits"], logits[:1], atol=1e-5)
    (flipped,) = predict_iter(workdir, inputs, mesh="data=8", tta="flip")  # its options reach the reader
    np.testing.assert_allclose(flipped.outputs["logits"], logits, atol=1e-5)

    summary = predict(workdir, inputs, tmp_path / "out", mesh="data=8", overlay=True, progress=False)
    assert (summary["written"], summary["unreadable"]) == (1, 0)
    mask = np.asarray(Image.open(tmp_path / "out" / "frame.png"))
    np.testing.assert_array_equal(mask, logits[0].argmax(-1))
    assert len(np.unique(mask)) > 1  # the classes differ across the frame: the mask is not a constant
    assert Image.open(tmp_path / "out" / "frame.overlay.png").size[0] >= 16  # `overlay=True` reached the writer
