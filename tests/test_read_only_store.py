"""A run folder mounted read-only, as Kubernetes and KServe mount model volumes:
`serve`, `predict`, `export` and `quantize --output` elsewhere load it with no warning and write
nothing in it. The tests run as root, whom a read-only mode does not stop: every file and folder
of the run (names, sizes, modification times) is compared before and after as well."""

import logging
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from serveutil import noise, serving
from triskele.eval.cli import main as eval_main

pytestmark = pytest.mark.xdist_group("serve")


def _listing(folder: Path) -> list[tuple]:
    """(path, kind, size, modification time) of `folder` and everything under it."""
    entries = []
    for path in [folder, *sorted(folder.rglob("*"))]:
        info = path.lstat()
        entries.append((str(path.relative_to(folder)), stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns))
    return entries


def _read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture
def read_only_run(domain_runs, tmp_path):
    """A copy of the merch run with no write permission anywhere in it (given back after the test)."""
    run = tmp_path / "store" / "merch"
    shutil.copytree(domain_runs["merch"], run)
    _read_only(run)
    yield run
    for path in [run, *run.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_a_read_only_run_serves_predicts_exports_and_quantizes_with_no_warning_and_no_write(
        read_only_run, tmp_path, caplog, capfd):
    before = _listing(read_only_run)
    assert not any(mode & stat.S_IWUSR for mode in (p.stat().st_mode for p in read_only_run.rglob("*")))
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        Image.fromarray(noise(i, (32, 32), 3)).save(photos / f"{i}.png")
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with serving(read_only_run, max_batch=8) as server:
            client = triton.InferenceServerClient(server.url)
            image = triton.InferInput("image", [1], "BYTES")
            image.set_data_from_numpy(np.array([(photos / "0.png").read_bytes()], dtype=object))
            answer = client.infer("merch", [image], outputs=[triton.InferRequestedOutput("sku")])
            assert answer.as_numpy("sku").shape == (1, 5)
        for argv in (["predict", "--input", str(photos), "--output", str(tmp_path / "predictions"), "--no-progress"],
                     ["export", "--output", str(tmp_path / "model.jax")],
                     ["quantize", "--format", "int8", "--output", str(tmp_path / "int8")]):
            assert eval_main(argv + ["--workdir", str(read_only_run)]) == 0, argv
    assert (tmp_path / "predictions" / "predictions.csv").is_file() and (tmp_path / "model.jax").is_file()
    assert (tmp_path / "int8" / "checkpoints").is_dir()
    err = capfd.readouterr().err
    logged = [f"{r.name} {r.levelname}: {r.getMessage()}" for r in caplog.records]
    assert not [line for line in logged if "read only" in line.lower() or "read-only" in line.lower()], logged
    assert not [line for line in logged if " WARNING:" in line or " ERROR:" in line], logged
    assert "read only" not in err.lower() and "WARNING" not in err, err[-3000:]
    assert not [str(w.message) for w in warned]
    assert _listing(read_only_run) == before
