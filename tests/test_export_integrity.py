"""An exported model's two files are checked when loaded: the sidecar's content
and the serialized program are both covered by the hashes, the sidecar's fields are validated and
must describe the program itself, and a program that cannot run here is a ValueError naming the
file (exit 2 from the command line), not a traceback at its first call.

The export is made from the legacy fixture's small mars checkpoint (16 px, depth 1): no training."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from triskele.eval import load_exported
from triskele.eval.cli import main as eval_main
from triskele.eval.export import export_model

LEGACY = Path(__file__).parent / "fixtures" / "legacy"


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("integrity")
    run = shutil.copytree(LEGACY / "mars-run", folder / "run")
    return Path(export_model(run, folder / "mars.jax")["output"])


def canonical_digest(meta: dict) -> str:
    """The documented digest, computed here without the code under test: SHA-256 of the sidecar
    less `digest`, keys sorted, no spaces, ASCII."""
    content = {key: value for key, value in meta.items() if key != "digest"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
                          ).hexdigest()


def copy_of(export: Path, folder: Path, edit=None, payload: bytes | None = None, rehash: bool = False,
            indent: int = 2) -> Path:
    """EXPORT's two files copied into FOLDER, the sidecar changed by `edit(meta)` and the program
    replaced by `payload`; `rehash`: both hashes recomputed, as a writer of both files could."""
    target = folder / "copy.jax"
    target.write_bytes(export.read_bytes() if payload is None else payload)
    meta = json.loads(Path(f"{export}.json").read_text())
    if edit:
        edit(meta)
    if rehash:
        meta["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        meta["digest"] = canonical_digest(meta)
    Path(f"{target}.json").write_text(json.dumps(meta, indent=indent))
    return target


def test_the_sidecar_is_covered_by_its_digest_and_an_edit_is_refused_naming_it(export, tmp_path):
    def scale_50(meta):
        meta["options"]["scale"] = 50.0  # before: accepted, and a 64-px mars image then took 1.5 GB in predict

    with pytest.raises(ValueError, match=r"copy\.jax\.json is corrupted: its content does not match the digest it "
                                         r"records \(the sidecar changed"):
        load_exported(copy_of(export, tmp_path, scale_50))
    meta = json.loads(Path(f"{export}.json").read_text())
    assert meta["digest"] == canonical_digest(meta)  # the scheme README states, so anyone can recompute it
    assert meta["sha256"] == hashlib.sha256(export.read_bytes()).hexdigest()
    reindented = load_exported(copy_of(export, tmp_path, indent=0))  # the same content, written otherwise
    assert reindented.meta["options"]["scale"] == 1.0


def test_edited_serialized_bytes_are_refused_naming_the_part_that_changed(export, tmp_path):
    payload = bytearray(export.read_bytes())
    payload[len(payload) // 2] ^= 0xFF  # in the weights: the program still runs, with other weights
    with pytest.raises(ValueError, match=r"copy\.jax is corrupted: its SHA-256 does not match copy\.jax\.json "
                                         r"\(the serialized model changed"):
        load_exported(copy_of(export, tmp_path, payload=bytes(payload)))

    def new_sha256(meta):  # the program's hash updated, as a careless repair would: the digest finds it
        meta["sha256"] = hashlib.sha256(payload).hexdigest()

    with pytest.raises(ValueError, match=r"copy\.jax\.json is corrupted: its content does not match the digest"):
        load_exported(copy_of(export, tmp_path, new_sha256, payload=bytes(payload)))


def _set(key, value):
    def edit(meta):
        meta[key] = value
    return edit


def _option(key, value):
    def edit(meta):
        meta["options"][key] = value
    return edit


@pytest.mark.parametrize("edit, message", [
    (_option("scale", float("inf")), r"copy\.jax\.json is not valid JSON \(Infinity is not a finite number\)"),
    (_option("scale", [50]), r"'options' is .*; it must be an object of numbers, booleans, nulls and strings"),
    (_set("image_size", 0), r"'image_size' is 0; it must be a positive integer"),
    (_set("run_files", "../../elsewhere"), r"'run_files' is \.\./\.\./elsewhere; it must be absent or a folder's name"),
    (_set("input_shape", [None, 32, 32, 1]), r"copy\.jax\.json does not describe the program in copy\.jax: "
                                             r"input_shape is \[None, 32, 32, 1\] there, \[None, 16, 16, 1\] in the "
                                             r"program \(what it was exported for\)"),
    (_set("image_size", 32), r"the record shape of its image_size, channels and frames is \[32, 32, 1\] there, "
                             r"\[16, 16, 1\] in the program"),
], ids=["infinite-scale", "nested-option", "image-size-0", "run-files-path", "input-shape", "image-size"])
def test_fields_out_of_bounds_or_unlike_the_program_are_refused_whatever_the_hashes(export, tmp_path, edit,
                                                                                      message):
    with pytest.raises(ValueError, match=message):
        load_exported(copy_of(export, tmp_path, edit, rehash=True))


def test_a_batch_the_export_does_not_take_is_refused(export):
    with pytest.raises(ValueError, match="batch 0 must be a positive integer"):
        load_exported(export, batch=0)


def test_a_program_that_cannot_run_here_is_exit_2_naming_it_not_a_traceback(export, tmp_path, capsys):
    from PIL import Image

    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(inputs / "a.png")
    payload = bytearray(export.read_bytes())
    start = payload.find(b"ML\xefR")  # the StableHLO bytecode: damaged, it deserializes but does not compile
    payload[start + 8 : start + 72] = bytes(64)
    damaged = copy_of(export, tmp_path, payload=bytes(payload), rehash=True)
    cuda = export_model(export.parent / "run", tmp_path / "cuda.jax", platforms="cuda")["output"]
    for model, message in ((damaged, "copy.jax does not run here: its program does not compile with jax "),
                           (cuda, "cuda.jax does not run here: it was exported for cuda, this process runs on cpu")):
        capsys.readouterr()
        assert eval_main(["predict", "--exported", str(model), "--input", str(inputs), "--output",
                          str(tmp_path / "out"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"error: exported model {model}" in err and message in err and "export it again" in err, err
        assert "Traceback" not in err


def test_an_export_from_before_the_digest_loads_with_a_warning_to_export_again():
    with pytest.warns(UserWarning, match=r"mars\.jax\.json was written before sidecars were hashed \(version 2\): "
                                         r"a change to it would go unnoticed; export it again"):
        load_exported(LEGACY / "mars.jax")
