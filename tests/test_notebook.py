"""examples/quickstart.ipynb runs top to bottom (it trains, evaluates, resumes and exports)."""

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
