"""Pretrained files in transformers 5's in-memory names, and files that fit no layout: every file
either imports with parity or fails with one message (formats tried, keys that did not fit, keys
expected), never a traceback."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.traverse_util import flatten_dict
from test_pretrained import FIXTURES, SMALL, TOLERANCE, imported, max_relative_difference, random_hf_vit
from triskele.models import ViT, ViTConfig
from triskele.train.cli import main as train_main
from triskele.train.state import TrainState
from triskele.train.weights.pretrained import load_pretrained
from triskele.train.weights.safetensors import SafetensorsFile, write_safetensors


def hf_state_dict(classifier: bool):
    """A random transformers 5 ViT's `state_dict()` as numpy (the in-memory module names), and the
    function giving its last hidden state."""
    model, reference = random_hf_vit(classifier, seed=1)
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}, reference


@pytest.mark.parametrize("classifier, strip_prefix", [(False, False), (True, False), (True, True)],
                         ids=["ViTModel", "ViTForImageClassification-vit.", "ViTForImageClassification-stripped"])
@pytest.mark.parametrize("size", [32, 48])
def test_transformers_5_module_names_match_transformers(classifier, strip_prefix, size, tmp_path):
    tensors, reference = hf_state_dict(classifier)
    assert any(".attention.q_proj." in k for k in tensors) and not any("encoder.layer" in k for k in tensors)
    if strip_prefix:
        tensors = {k.removeprefix("vit."): v for k, v in tensors.items()}
    write_safetensors(tmp_path / "state_dict.safetensors", tensors)
    images = np.random.default_rng(size).normal(size=(2, 3, size, size)).astype(np.float32)
    tokens = imported(tmp_path / "state_dict.safetensors", size, norm_eps=1e-12)(images)
    assert max_relative_difference(tokens, reference(images)) < TOLERANCE


def test_an_unreadable_layout_is_exit_2_with_one_message(tmp_path, capsys):
    tensors, _ = hf_state_dict(classifier=False)
    del tensors["layers.0.mlp.fc1.weight"]
    write_safetensors(tmp_path / "odd.safetensors", tensors)
    code = train_main(["--workdir", str(tmp_path / "run"), "--preset", "merch-tiny", "--init-from",
                       str(tmp_path / "odd.safetensors"), "--set", "model.size=tiny", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "key layers.0.mlp.fc1.weight is missing" in err and "Formats tried: timm" in err
    assert "Closest: Hugging Face, transformers 5 module names" in err
    assert "Keys expected: embeddings.cls_token" in err


def _layouts(tmp_path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every layout the import reads, as {key: array}, for the small fixture model."""
    def npz(name):
        with np.load(FIXTURES / name) as data:
            return {k: data[k] for k in data.files}

    timm = SafetensorsFile(FIXTURES / "timm_vit.safetensors")
    hub, _ = hf_state_dict(classifier=True)
    model, _ = random_hf_vit(classifier=True, seed=2)
    model.save_pretrained(tmp_path / "hub")
    saved = SafetensorsFile(tmp_path / "hub" / "model.safetensors")
    return {"timm": {k: timm.get(k) for k in timm.shapes}, "transformers5": hub,
            "hub": {k: saved.get(k) for k in saved.shapes}, "vit_npz": npz("vit.npz"),
            "big_vision": npz("big_vision.npz"), "big_vision_blocks": npz("big_vision_blocks.npz")}


def _mutate(tensors: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[dict[str, np.ndarray], str]:
    keys = sorted(tensors)
    key = keys[rng.integers(len(keys))]
    out = dict(tensors)
    kind = ("drop", "rename", "reshape")[rng.integers(3)]
    if kind == "drop":
        del out[key]
    elif kind == "rename":
        parts = key.replace("/", ".").split(".")
        parts[rng.integers(len(parts))] += "_x"
        out[".".join(parts) if "." in key else "/".join(parts)] = out.pop(key)
    else:
        value = out[key]
        shapes = [value.shape[::-1], (value.size,), (1, *value.shape), value.shape[:-1] + (1, value.shape[-1])]
        out[key] = value.reshape(shapes[rng.integers(len(shapes))])
    return out, f"{kind} {key}"


def _write(path: Path, tensors: dict[str, np.ndarray]) -> None:
    if path.suffix == ".npz":
        np.savez(path, **tensors)
    else:
        write_safetensors(path, tensors)


CFG = ViTConfig(**SMALL, image_size=32, norm_eps=1e-6)


def _fresh() -> dict:
    return nnx.to_pure_dict(nnx.state(ViT(CFG, rngs=nnx.Rngs(0)), nnx.Param))


def _import(path: Path) -> dict[str, np.ndarray]:
    cfg, params = CFG, _fresh()
    state = load_pretrained(TrainState(jnp.zeros(()), {"backbone": params}, {}), cfg, path, verbose=False)
    return {k: np.asarray(v) for k, v in flatten_dict(state.params["backbone"], sep="/").items()}


def test_fuzzed_files_import_with_parity_or_fail_with_the_message(tmp_path):
    rng = np.random.default_rng(0)
    outcomes = {"imported": 0, "refused": 0}
    for name, tensors in _layouts(tmp_path).items():
        suffix = ".npz" if "npz" in name or "big_vision" in name else ".safetensors"
        clean = tmp_path / f"{name}{suffix}"
        _write(clean, tensors)
        reference = _import(clean)
        for case in range(12):
            mutated, what = _mutate(tensors, rng)
            path = tmp_path / f"{name}-{case}{suffix}"
            _write(path, mutated)
            try:
                got = _import(path)
            except ValueError as err:
                message = str(err)
                assert message.startswith(f"model.init_from {path}"), (what, message)
                sized = "differ)" in message or "-pixel patches" in message  # the sizes' own message
                assert sized or ("Formats tried:" in message and "Keys expected:" in message), (what, message)
                outcomes["refused"] += 1
                continue
            expected = dict(reference)
            if what.startswith("drop") and what.replace("/", ".").rsplit(".", 1)[-1] in ("cls", "cls_token"):
                # A file without a class token: the model keeps its own, and its position slot where
                # the file has none (big_vision); the rest is the file's.
                fresh = _fresh()
                expected["cls_token"] = np.asarray(fresh["cls_token"])
                if not np.array_equal(got["pos_embed"][:, :1], expected["pos_embed"][:, :1]):
                    expected["pos_embed"] = np.concatenate([np.asarray(fresh["pos_embed"])[:, :1],
                                                            expected["pos_embed"][:, 1:]], axis=1)
            for leaf, value in expected.items():  # whatever imports, imports the same weights
                np.testing.assert_array_equal(got[leaf], value, err_msg=f"{name}: {what}: {leaf}")
            outcomes["imported"] += 1
    assert outcomes["refused"] > 40 and outcomes["imported"] > 0, outcomes
