"""Exported models for serving: jax.export artifacts that run without the model code."""

import hashlib
import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from trainutil import mesh_of
from triskele.eval import load_exported
from triskele.eval.cli import main as eval_main
from triskele.eval.export import export_model
from triskele.eval.load_export import EXPORT_VERSION, sidecar_digest
from triskele.eval.model import LiveModel
from triskele.train.run import restore_run

pytestmark = pytest.mark.xdist_group("domain_runs")  # shares a session fixture: one worker runs them

INPUTS = {"mars": (32, 32, 1), "deepfake": (32, 32, 3), "merch": (32, 32, 3)}


@pytest.fixture(scope="module")
def exported(domain_runs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("exported")
    out = {}
    for domain, workdir in domain_runs.items():
        out[domain] = export_model(workdir, folder / f"{domain}.jax", batch="dynamic")["output"]
    out["mars-fixed"] = export_model(domain_runs["mars"], folder / "mars-4.jax", batch=4)["output"]
    return out


def test_exports_equal_the_live_models_in_a_process_without_the_model_code(exported, domain_runs, tmp_path,
                                                                            devices):
    rng = np.random.default_rng(0)
    inputs = {domain: rng.random((5, *shape), dtype=np.float32) for domain, shape in INPUTS.items()}
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        import triskele.eval as serving
        paths = json.loads({json.dumps(json.dumps({d: exported[d] for d in INPUTS}))})
        inputs = np.load({str(tmp_path / 'inputs.npz')!r})
        outputs = {{}}
        for domain, path in paths.items():
            for name, value in serving.load_exported(path)(inputs[domain]).items():
                outputs[domain + "/" + name] = value
        np.savez({str(tmp_path / 'outputs.npz')!r}, **outputs)
        leaked = [m for m in ("triskele.models", "triskele.train", "flax") if m in sys.modules]
        assert not leaked, leaked
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    served = np.load(tmp_path / "outputs.npz")
    for domain, workdir in domain_runs.items():
        parts, state, _ = restore_run(workdir, mesh_of("single"))
        live = LiveModel(parts, state.params)(inputs[domain])
        assert live, domain
        for name, value in live.items():
            np.testing.assert_allclose(served[f"{domain}/{name}"], value, atol=1e-5, err_msg=f"{domain}/{name}")


def test_a_dynamic_batch_export_runs_at_two_batch_sizes_and_a_fixed_one_pads(exported):
    dynamic, fixed = load_exported(exported["mars"]), load_exported(exported["mars-fixed"])
    assert dynamic.meta["input_shape"] == [None, 32, 32, 1] and fixed.meta["input_shape"] == [4, 32, 32, 1]
    images = np.random.default_rng(1).random((7, 32, 32, 1), dtype=np.float32)
    one, seven = dynamic(images[:1])["probabilities"], dynamic(images)["probabilities"]
    assert one.shape == (1, 32, 32, 4) and seven.shape == (7, 32, 32, 4)
    np.testing.assert_allclose(one[0], seven[0], atol=1e-5)
    np.testing.assert_allclose(fixed(images)["probabilities"], seven, atol=1e-5)
    meta = dynamic.meta
    assert meta["domain"] == "mars" and meta["class_names"] == ["soil", "bedrock", "sand", "big_rock"]
    assert meta["channels"] == 1 and "platforms" in meta
    assert meta["outputs"]["probabilities"]["shape"] == [None, 32, 32, 4]
    with pytest.raises(ValueError, match=r"takes inputs of shape \(batch, 32, 32, 1\)"):
        dynamic(np.zeros((2, 32, 32, 3), np.float32))


def test_corrupted_or_foreign_export_files_give_clear_errors(exported, tmp_path):
    source = exported["mars"]
    payload = open(source, "rb").read()
    sidecar = json.loads(open(source + ".json").read())
    corrupt = tmp_path / "corrupt.jax"
    corrupt.write_bytes(payload[:-100] + bytes(100))
    (tmp_path / "corrupt.jax.json").write_text(json.dumps(sidecar))
    with pytest.raises(ValueError, match="is corrupted: its SHA-256 does not match"):
        load_exported(corrupt)
    future = tmp_path / "future.jax"
    future.write_bytes(payload)
    (tmp_path / "future.jax.json").write_text(json.dumps({**sidecar, "version": 99}))
    with pytest.raises(ValueError, match=f"version 99; this triskele reads 'triskele-export' version {EXPORT_VERSION}"):
        load_exported(future)
    garbage = tmp_path / "garbage.jax"
    garbage.write_bytes(b"not a flatbuffer at all")
    garbled = {**sidecar, "sha256": hashlib.sha256(b"not a flatbuffer at all").hexdigest()}
    (tmp_path / "garbage.jax.json").write_text(json.dumps({**garbled, "digest": sidecar_digest(garbled)}))
    with pytest.raises(ValueError, match="cannot be deserialized"):
        load_exported(garbage)
    with pytest.raises(ValueError, match="needs the file and lonely.jax.json beside it"):
        (tmp_path / "lonely.jax").write_bytes(payload)
        load_exported(tmp_path / "lonely.jax")


def test_predict_uses_an_exported_model(exported, tmp_path, capsys):
    from PIL import Image

    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40), np.uint8)).save(inputs / "a.png")
    assert eval_main(["predict", "--exported", exported["mars"], "--input", str(inputs),
                      "--output", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    mask = np.asarray(Image.open(tmp_path / "out" / "a.png"))
    assert mask.shape == (40, 40) and set(np.unique(mask)) <= {0, 1, 2, 3}
    assert eval_main(["export", "--workdir", str(tmp_path), "--output", str(tmp_path / "x.jax")]) == 2
    assert eval_main(["export", "--workdir", str(tmp_path), "--output", str(tmp_path / "x.jax"),
                      "--batch", "-3"]) == 2
    assert "--batch '-3' must be a positive integer or 'dynamic'" in capsys.readouterr().err
    assert jax.device_count() == 8
