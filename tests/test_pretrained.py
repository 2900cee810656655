"""Pretrained ViT weights: timm, Hugging Face and .npz import (parity with the reference code),
export to timm, errors, and fine-tuning every domain from an imported file."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.traverse_util import flatten_dict
from PIL import Image
from trainutil import mesh_of
from triskele.eval.cli import main as eval_main
from triskele.models import ViT, ViTConfig
from triskele.models import vit as vit_module
from triskele.models import weights as weights_module
from triskele.train import make_config, train
from triskele.train.backbone import vit_config
from triskele.train.cli import main as train_main
from triskele.train.state import TrainState
from triskele.train.weights.pretrained import WeightFile, load_pretrained, resolve_norm_eps
from triskele.train.weights.safetensors import SafetensorsFile, write_safetensors

FIXTURES = Path(__file__).parent / "fixtures" / "pretrained"
REFERENCE = np.load(FIXTURES / "reference.npz")
SMALL = dict(width=32, depth=2, mlp_dim=64, heads=2, patch=8)  # the fixtures' model (made by timm)
TOLERANCE = 1e-4


def max_relative_difference(a, b) -> float:
    """max |a - b| / max |b|."""
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def imported(path, image_size: int, channels: int = 3, norm_eps: float = 1e-6, **sizes):
    """Our ViT with the file's weights: a function of NCHW images giving the final-normed tokens."""
    cfg = ViTConfig(**{**SMALL, **sizes}, image_size=image_size, channels=channels, norm_eps=norm_eps)
    return imported_into(cfg, path)


def imported_into(cfg: ViTConfig, path):
    graphdef, params = nnx.split(ViT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    state = load_pretrained(TrainState(jnp.zeros(()), {"backbone": nnx.to_pure_dict(params)}, {}), cfg, path,
                            verbose=False)
    model = nnx.merge(graphdef, state.params["backbone"])
    return lambda images: np.asarray(model(jnp.asarray(np.asarray(images).transpose(0, 2, 3, 1))))


@pytest.mark.parametrize("size", [32, 48, 24])
def test_timm_file_matches_timm_at_native_larger_and_smaller_sizes(size):
    tokens = imported(FIXTURES / "timm_vit.safetensors", size)(REFERENCE[f"images_{size}"])
    assert max_relative_difference(tokens, REFERENCE[f"timm_{size}"]) < TOLERANCE


def test_grayscale_model_sums_the_rgb_patch_filters_as_timm_does():
    tokens = imported(FIXTURES / "timm_vit.safetensors", 32, channels=1)(REFERENCE["images_gray"])
    assert max_relative_difference(tokens, REFERENCE["timm_gray"]) < TOLERANCE


def test_the_stacked_layout_of_pipeline_repeats_takes_the_same_weights():
    """With pipeline.repeats=2 the blocks are stacked (repeats, layers / repeats); the import fills them."""
    cfg = ViTConfig(**SMALL, image_size=32, pipeline_repeats=2)
    tokens = imported_into(cfg, FIXTURES / "timm_vit.safetensors")(REFERENCE["images_32"])
    assert max_relative_difference(tokens, REFERENCE["timm_32"]) < TOLERANCE


def test_an_average_pooling_model_leaves_the_class_token_out():
    cfg = ViTConfig(**SMALL, image_size=32, pool="gap")
    graphdef, params = nnx.split(ViT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    state = load_pretrained(TrainState(jnp.zeros(()), {"backbone": nnx.to_pure_dict(params)}, {}), cfg,
                            FIXTURES / "timm_vit.safetensors", verbose=False)
    backbone = state.params["backbone"]
    assert "cls_token" not in backbone
    stored = SafetensorsFile(FIXTURES / "timm_vit.safetensors").get("pos_embed")
    np.testing.assert_array_equal(np.asarray(backbone["pos_embed"]), stored[:, 1:])


@pytest.mark.parametrize("name, size, reference", [
    ("vit.npz", 32, "timm_32"), ("vit.npz", 48, "vit_npz_48"),
    ("big_vision.npz", 32, "big_vision_32"), ("big_vision_blocks.npz", 32, "big_vision_32")])
def test_npz_layouts_match_timm_loading_them(name, size, reference):
    tokens = imported(FIXTURES / name, size)(REFERENCE[f"images_{size}"])
    assert max_relative_difference(tokens, REFERENCE[reference]) < TOLERANCE


@pytest.mark.parametrize("size", [6, 3, 5])
def test_position_embedding_resampling_equals_timms(size):
    stored = SafetensorsFile(FIXTURES / "timm_vit.safetensors").get("pos_embed")[0]
    resized = weights_module.resize_grid(stored[1:], size, "timm")
    np.testing.assert_allclose(resized, REFERENCE[f"resample_{size}"][0, 1:], atol=1e-6)


def test_import_export_import_round_trip_is_bit_exact(tmp_path):
    source = SafetensorsFile(FIXTURES / "timm_vit.safetensors")
    cfg = ViTConfig(**SMALL, image_size=32)
    graphdef, params = nnx.split(ViT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    state = load_pretrained(TrainState(jnp.zeros(()), {"backbone": nnx.to_pure_dict(params)}, {}), cfg,
                            FIXTURES / "timm_vit.safetensors", verbose=False)
    leaves = {k: np.asarray(v) for k, v in flatten_dict(state.params["backbone"], sep="/").items()}
    exported = weights_module.to_timm(leaves, cfg.patch, cfg.channels)
    assert set(exported) == set(source.shapes) - {"head.weight", "head.bias"}
    for key, value in exported.items():
        np.testing.assert_array_equal(value, source.get(key), err_msg=key)
    write_safetensors(tmp_path / "again.safetensors", exported)
    again = load_pretrained(TrainState(jnp.zeros(()), {"backbone": nnx.to_pure_dict(params)}, {}), cfg,
                            tmp_path / "again.safetensors", verbose=False)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(state.params)[0], jax.tree.leaves(again.params),
                            strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


# Hugging Face: random models built here (no download), compared with transformers itself.
def random_hf_vit(classifier: bool, seed: int = 0, embedding_scale: float = 1.0, **config_keys):
    """A random transformers ViT (norm scales near 1; the embeddings' weights times
    `embedding_scale`) and the function giving its last hidden state for NCHW images."""
    torch = pytest.importorskip("torch", reason="the Hugging Face parity tests need torch (pip install torch==2.13.0)")
    transformers = pytest.importorskip("transformers", reason="the Hugging Face parity tests need transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=5, **config_keys)
    cls = transformers.ViTForImageClassification if classifier else transformers.ViTModel
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            scale = 1.0 if "layernorm" in name and "weight" in name else 0.0  # norm scales near 1
            parameter.copy_(0.1 * torch.randn_like(parameter) + scale)
            if "embeddings" in name:
                parameter.mul_(embedding_scale)
    backbone = model.vit if classifier else model

    def reference(images):
        with torch.no_grad():
            out = backbone(pixel_values=torch.from_numpy(images), interpolate_pos_encoding=True)
        return out.last_hidden_state.numpy()

    return model, reference


def hf_model(tmp_path, as_folder: bool, classifier: bool):
    model, reference = random_hf_vit(classifier)
    folder = tmp_path / ("folder" if as_folder else "file")
    model.save_pretrained(folder)
    path = folder if as_folder else folder / "model.safetensors"
    if not as_folder:
        (folder / "config.json").unlink()  # a bare file: the epsilon falls back to Hugging Face's default
    return path, reference


@pytest.mark.parametrize("as_folder, classifier", [(True, False), (False, True)], ids=["ViTModel-folder",
                                                                                        "ViTForImageClassification-file"])
@pytest.mark.parametrize("size", [32, 48, 16])
def test_hugging_face_vit_matches_transformers(as_folder, classifier, size, tmp_path):
    path, reference = hf_model(tmp_path, as_folder, classifier)
    assert WeightFile(path).norm_eps() == 1e-12
    images = np.random.default_rng(size).normal(size=(2, 3, size, size)).astype(np.float32)
    expected = reference(images)
    tokens = imported(path, size, norm_eps=1e-12)(images)
    assert max_relative_difference(tokens, expected) < TOLERANCE
    assert max_relative_difference(tokens[:, 0], expected[:, 0]) < TOLERANCE  # the class-token output


@pytest.mark.parametrize("stated_eps, embedding_scale", [(0.25, 1.0), (None, 1e-4)],
                         ids=["config.json-states-0.25", "bare-file-1e-12-tiny-embeddings"])
def test_a_run_from_a_hugging_face_file_builds_the_files_epsilon(stated_eps, embedding_scale, tmp_path):
    """A run that sets no model.norm_eps builds its LayerNorms with the file's epsilon: the one its
    config.json states, else Hugging Face's 1e-12. Both models here make the epsilon matter (a large
    one; embeddings of variance ~1e-8 for 1e-12), so the tokens match transformers only with it: the
    same weights built with timm's 1e-6 are off by more than 100x the tolerance (the control)."""
    model, reference = random_hf_vit(False, embedding_scale=embedding_scale,
                                     **({} if stated_eps is None else {"layer_norm_eps": stated_eps}))
    model.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" if stated_eps is not None else tmp_path / "hf" / "model.safetensors"
    if stated_eps is None:
        (tmp_path / "hf" / "config.json").unlink()
    config = make_config(overrides={"model.init_from": str(path)})
    resolve_norm_eps(config)
    eps = vit_config(config).norm_eps
    assert eps == (1e-12 if stated_eps is None else stated_eps)
    images = np.random.default_rng(3).normal(size=(2, 3, 32, 32)).astype(np.float32)
    expected = reference(images)
    assert max_relative_difference(imported(path, 32, norm_eps=eps)(images), expected) < TOLERANCE
    assert max_relative_difference(imported(path, 32, norm_eps=1e-6)(images), expected) > 100 * TOLERANCE


MUTATIONS = {
    "tanh GELU": lambda mp: mp.setattr(vit_module.jax.nn, "gelu", _tanh_gelu),
    "plain cubic instead of PyTorch's": lambda mp: mp.setitem(weights_module.RESIZE, "hf", ("cubic", False)),
    "query and key swapped": lambda mp: mp.setattr(weights_module, "block_keys", _swapped(weights_module.block_keys)),
}
_exact_gelu = jax.nn.gelu


def _tanh_gelu(x, approximate=True):
    return _exact_gelu(x, approximate=True)


def _swapped(block_keys):
    def swapped(layout, i):
        keys = block_keys(layout, i)
        for kind in ("kernel", "bias"):
            keys[f"attn/query/{kind}"], keys[f"attn/key/{kind}"] = keys[f"attn/key/{kind}"], keys[f"attn/query/{kind}"]
        return keys
    return swapped


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_parity_tests_bite(mutation, tmp_path, monkeypatch):
    """Each deliberate mistake makes the Hugging Face comparison fail its tolerance."""
    path, reference = hf_model(tmp_path, as_folder=True, classifier=False)
    images = np.random.default_rng(0).normal(size=(2, 3, 48, 48)).astype(np.float32)
    expected = reference(images)
    MUTATIONS[mutation](monkeypatch)
    assert max_relative_difference(imported(path, 48, norm_eps=1e-12)(images), expected) > TOLERANCE


@pytest.mark.parametrize("sizes, message", [
    (dict(width=64, heads=4), "width 32, depth 2, mlp 64; the model has width 64, depth 2, mlp 64 (width differ)"),
    (dict(patch=4), "has 8-pixel patches but model.patch is 4; set model.patch=8"),
])
def test_size_mismatches_name_what_differs(sizes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        imported(FIXTURES / "timm_vit.safetensors", 32, **sizes)


def test_a_vit_s_file_into_a_vit_b_model_names_the_size_that_fits(tmp_path, capsys):
    small = {**_ti_file_leaves("S", 16, 224)}
    write_safetensors(tmp_path / "vit_s.safetensors", weights_module.to_timm(small, 16, 3))
    code = train_main(["--workdir", str(tmp_path / "run"), "--preset", "merch-b16", "--init-from",
                       str(tmp_path / "vit_s.safetensors"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "width 384, depth 12, mlp 1536; the model has width 768, depth 12, mlp 3072" in err
    assert "set model.size=S" in err


def test_missing_and_unexpected_keys_are_named(tmp_path):
    source = SafetensorsFile(FIXTURES / "timm_vit.safetensors")
    tensors = {k: source.get(k) for k in source.shapes if k != "blocks.1.mlp.fc2.bias"}
    tensors["blocks.0.ls1.gamma"] = np.ones(32, np.float32)  # layer scale: not a plain ViT
    write_safetensors(tmp_path / "odd.safetensors", tensors)
    expected = r"missing keys: blocks\.1\.mlp\.fc2\.bias; unexpected keys: blocks\.0\.ls1\.gamma"
    with pytest.raises(ValueError, match=expected):
        imported(tmp_path / "odd.safetensors", 32)
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        imported(tmp_path / "junk.safetensors", 32)
    with pytest.raises(ValueError, match="does not exist"):
        imported(tmp_path / "nothing.npz", 32)


def _ti_file_leaves(size: str, patch: int, image: int) -> dict[str, np.ndarray]:
    """A random ViT of a named size as our backbone leaves (to write as a timm file)."""
    cfg = ViTConfig.named(size, patch=patch, image_size=image)
    abstract = nnx.eval_shape(lambda: ViT(cfg, rngs=nnx.Rngs(0)))
    leaves = flatten_dict(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)), sep="/")
    rng = np.random.default_rng(0)
    return {k: (0.05 * rng.normal(size=v.shape)).astype(np.float32) for k, v in leaves.items()}


@pytest.fixture(scope="module")
def vit_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    for size in ("Ti", "S"):
        write_safetensors(folder / f"vit_{size}.safetensors",
                          weights_module.to_timm(_ti_file_leaves(size, 8, 128), 8, 3))
    return folder


@pytest.mark.parametrize("preset, size, spec", [
    ("mars-tiny", "Ti", "data=2,fsdp=4"), ("merch-tiny", "Ti", "data=2,fsdp=4"),
    ("deepfake-tiny", "Ti", "data=2,fsdp=4"), ("mars-tiny", "S", "data=2,fsdp=2,tensor=2")])
def test_fine_tuning_from_an_imported_file_on_eight_devices(preset, size, spec, vit_files, tmp_path, devices):
    """ViT-Ti has 3 heads, which tensor=2 cannot split (validation refuses it), so ViT-Ti runs on
    data=2,fsdp=4 and ViT-S (6 heads) covers data=2,fsdp=2,tensor=2. The file's 16x16 position grid
    is resampled to the run's 8x8 (64 px, patch 8); mars sums the RGB filters to its 1 channel."""
    path = vit_files / f"vit_{size}.safetensors"
    config = make_config(preset, {"model.size": size, "model.init_from": str(path), "run.steps": 2,
                                  "data.global_batch": 8, "run.eval_every": 0, "run.log_every": 1,
                                  "data.train_size": 16, "data.eval_size": 8, "optim.warmup_steps": 0})
    summary = train(config, tmp_path, mesh=mesh_of(spec), progress=False)
    assert summary.final_step == 2 and np.isfinite(summary.last_loss)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"]["init_from"] == str(path) and saved["model"]["norm_eps"] == 1e-6
    # The run started from the file: its first-step weights are the file's, moved by one update.
    from triskele.train.run import restore_run
    _, state, _ = restore_run(tmp_path, mesh_of("single"))
    trained = np.asarray(state.params["backbone"]["blocks"]["mlp"]["up"]["kernel"])
    start = SafetensorsFile(path).get("blocks.0.mlp.fc1.weight").T
    assert np.abs(trained[0] - start).max() < 0.01 < np.abs(start).max()


def test_export_weights_cli_writes_timm_names(vit_files, tmp_path, capsys, devices):
    config = make_config("deepfake-tiny", {"model.size": "Ti", "model.init_from": str(vit_files / "vit_Ti.safetensors"),
                                           "run.steps": 1, "data.global_batch": 8, "run.eval_every": 0,
                                           "data.train_size": 16, "data.eval_size": 8})
    train(config, tmp_path / "run", mesh=mesh_of("data=8"), progress=False)
    out = tmp_path / "exported.safetensors"
    capsys.readouterr()
    assert eval_main(["export-weights", "--workdir", str(tmp_path / "run"), "--format", "timm", "--output", str(out),
                      "--mesh", "data=8"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "VisionTransformer(img_size=64, patch_size=8, in_chans=3, embed_dim=192, depth=12" in printed["timm_model"]
    written = SafetensorsFile(out)
    source = SafetensorsFile(vit_files / "vit_Ti.safetensors")
    assert {k: s for k, s in written.shapes.items() if k != "pos_embed"} == \
        {k: s for k, s in source.shapes.items() if k != "pos_embed"}
    assert written.shapes["pos_embed"] == (1, 65, 192)
    assert eval_main(["export-weights", "--workdir", str(tmp_path / "run"), "--format", "onnx",
                      "--output", str(out)]) == 2
    assert "unknown export format 'onnx'; choose one of timm" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "run")


@pytest.mark.parametrize("kind", ["image", "text", "npy named .npz"])
def test_init_from_a_file_that_holds_no_weights_says_so_and_lists_what_is_read(kind, tmp_path, capsys):
    if kind == "image":
        path = tmp_path / "cat.png"
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)
    elif kind == "text":
        path = tmp_path / "notes.txt"
        path.write_text("the run's notes, not weights\n" * 20)
    else:
        path = tmp_path / "weights.npz"
        np.save(tmp_path / "weights.npy", np.zeros(3))
        (tmp_path / "weights.npy").rename(path)
    code = train_main(["--workdir", str(tmp_path / "run"), "--preset", "mars-tiny", "--init-from", str(path),
                       "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: model.init_from {path} is not a weights file: it is not a ")
    assert "a timm or Hugging Face .safetensors file, a Hugging Face save_pretrained folder" in err
    assert "ViT/big_vision .npz" in err and "Traceback" not in err
