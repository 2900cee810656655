"""Domains are registered once: a toy fourth domain trains, evaluates and predicts through the CLI;
the built-in models keep the model contract; old config keys are refused or migrated."""

import csv
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image
from triskele.eval.cli import main as eval_main
from triskele.models.contract import DomainModel
from triskele.models.preprocess import describe_input, normalize
from triskele.models.vit import ViTClassifier
from triskele.train import make_config
from triskele.train.backbone import vit_config
from triskele.train.cli import main as train_main
from triskele.train.config.migrations import config_from_dict
from triskele.train.data.images import read_image
from triskele.train.domains import Domain, domains, get_domain, register, unregister
from triskele.train.evaluator import BatchEvaluator

# --- a toy fourth domain: dark or bright? -----------------------------------------------------

class Brightness(ViTClassifier):
    normalisation = "fixed"

    def __call__(self, images: jax.Array) -> jax.Array:
        return super().__call__(normalize(images, self.normalisation))

    def eval_stats(self, batch):
        correct = (jnp.argmax(self(batch["image"]), -1) == batch["label"]) * batch["valid"]
        return {"correct": correct.sum(), "count": batch["valid"].sum()}, {}


class Patches:
    """Noisy grey squares, label 1 when brighter than 0.5; deterministic per (split, index)."""

    def __init__(self, split: str, size: int, image_size: int):
        self.split, self.size, self.image_size = split, size, image_size

    def __len__(self) -> int:
        return self.size

    def load(self, index, rng=None):
        local = np.random.default_rng([len(self.split), index])
        level = local.uniform(0.05, 0.95)
        image = np.clip(level + local.normal(0, 0.05, (self.image_size, self.image_size, 1)), 0, 1)
        return {"image": image.astype(np.float32), "label": np.int32(level > 0.5)}


class BrightnessIO:
    """Each image one record; predictions.csv with its class."""

    suffixes = (".png",)

    def __init__(self, meta):
        self.meta = meta

    def units(self, root, files):
        from triskele.eval.engine import Unit

        return [Unit(f.name, (f,)) for f in files]

    def read(self, unit):
        return read_image(unit.paths[0], self.meta["image_size"], self.meta["channels"])[None], None

    def write(self, unit, context, outputs, out_dir):
        return {"image": unit.key, "class": self.meta["class_names"][int(np.argmax(outputs["probabilities"][0]))]}

    def finish(self, rows, out_dir):
        from triskele.eval.engine import write_csv

        write_csv(Path(out_dir) / "predictions.csv", ["image", "class"], [[r["image"], r["class"]] for r in rows])
        return ["predictions.csv"]


def predict_io(meta, options, workdir):
    return BrightnessIO(meta)


COMMANDS = {}


@pytest.fixture
def brightness_domain():
    import dataclasses

    @dataclasses.dataclass
    class BrightnessOptions:
        threshold: float = 0.5

    domain = register(Domain(
        name="brightness", summary="dark or bright", options=BrightnessOptions,
        preset={"model.channels": 1, "model.depth": 2},
        build_model=lambda config, rngs, stages: Brightness(vit_config(config, stages), 2, rngs=rngs),
        open_split=lambda config, split: Patches(split, config.data.train_size if split == "train"
                                                 else config.data.eval_size, config.model.image_size),
        class_names=lambda config: ["dark", "bright"],
        evaluator=BatchEvaluator.factory(lambda totals: {"accuracy": float(totals["correct"] / totals["count"])}),
        metric_names=("accuracy",), inference=sys.modules[__name__],
    ))
    yield domain
    unregister("brightness")


def test_a_fourth_domain_is_its_modules_plus_one_registration(brightness_domain, tmp_path, capsys):
    workdir = tmp_path / "run"
    flags = {"model.image_size": 16, "data.train_size": 256, "data.eval_size": 64, "run.eval_every": 0,
             "optim.warmup_steps": 0, "checkpoint.best_metric": "accuracy", "checkpoint.best_mode": "max",
             "brightness.threshold": 0.5}
    argv = ["--preset", "brightness-tiny", "--workdir", str(workdir), "--steps", "40", "--no-progress",
            "--mesh", "data=8"] + [a for k, v in flags.items() for a in ("--set", f"{k}={v}")]
    assert train_main(argv) == 0
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["domain"] == "brightness" and saved["brightness"] == {"threshold": 0.5}
    assert saved["model"]["class_names"] == ["dark", "bright"]

    capsys.readouterr()
    assert eval_main(["--workdir", str(workdir), "--mesh", "data=2,tensor=2,fsdp=2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["domain"] == "brightness" and report["metrics"]["accuracy"] >= 0.9, report["metrics"]

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, level in (("dark.png", 40), ("bright.png", 220)):
        Image.fromarray(np.full((16, 16), level, np.uint8)).save(inputs / name)
    assert eval_main(["predict", "--workdir", str(workdir), "--input", str(inputs), "--output",
                      str(tmp_path / "out")]) == 0
    rows = {r["image"]: r["class"] for r in csv.DictReader((tmp_path / "out" / "predictions.csv").open())}
    assert rows == {"bright.png": "bright", "dark.png": "dark"}


def test_unknown_domain_options_and_presets_are_refused(brightness_domain):
    with pytest.raises(ValueError, match="'brightness.threshold' is an option of the brightness domain"):
        make_config("mars-tiny", ["brightness.threshold=0.3"])
    unregister("brightness")
    with pytest.raises(ValueError, match="unknown preset 'brightness-tiny'"):
        make_config("brightness-tiny")


# --- the built-in domains ----------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["mars-tiny", "merch-tiny", "merch-shelf-tiny", "deepfake-tiny"])
def test_built_in_models_keep_the_contract(preset):
    config = make_config(preset, {"model.image_size": 16})
    domain = get_domain(config.domain)
    model = nnx.eval_shape(lambda: domain.build_model(config, nnx.Rngs(params=0), 1))
    assert isinstance(model, DomainModel)
    assert "[0, 1]" in describe_input(config.model.channels, model.normalisation)
    assert set(domain.metric_names) and domain.name == preset.split("-")[0]
    assert list(domains())[:3] == ["mars", "merch", "deepfake"]


@pytest.mark.parametrize("old, new", [("data.holdout=Sharpen", "deepfake.holdout"),
                                      ("data.frames_per_video=4", "deepfake.frames_per_video"),
                                      ("data.num_skus=5", "merch.num_skus"),
                                      ("data.label_agreement=2", "mars.label_agreement")])
def test_moved_keys_name_their_new_place(old, new):
    with pytest.raises(ValueError, match=f"moved to '{new}'"):
        make_config("deepfake-tiny", [old])


def test_configs_saved_before_the_move_still_load():
    saved = make_config("deepfake-tiny").to_dict()
    saved.pop("deepfake")
    saved["data"].update(frames_per_video=4, holdout="Sharpen", eval_methods=None, compression="c23",
                         num_skus=100, label_agreement=3)
    config = config_from_dict(saved)
    assert (config.options.frames_per_video, config.options.holdout) == (4, "Sharpen")
    assert config_from_dict(config.to_dict()).to_dict() == config.to_dict()


# --- checkpoints carry what inference needs ----------------------------------------------------

def _product_tree(root: Path, splits: dict[str, tuple[str, ...]]) -> Path:
    for split, classes in splits.items():
        for k, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                colour = [(60 * k + 10 * i) % 255, 200 - 40 * k, 30 + 50 * k]
                Image.fromarray(np.full((24, 24, 3), colour, np.uint8)).save(folder / f"{i}.png")
    return root


def test_merch_runs_without_their_training_data(tmp_path, capsys):
    import shutil

    trained_on = _product_tree(tmp_path / "shop", {"train": ("cola", "juice", "milk"), "test": ("cola", "milk")})
    workdir = tmp_path / "run"
    small = ["--set", "model.image_size=16", "--set", "data.global_batch=8", "--set", "run.eval_every=0",
             "--set", "optim.warmup_steps=0"]
    assert train_main(["--preset", "merch-tiny", "--workdir", str(workdir), "--steps", "2", "--no-progress",
                       "--data", str(trained_on), "--mesh", "data=8"] + small) == 0
    shutil.rmtree(trained_on)

    other = _product_tree(tmp_path / "other", {"test": ("milk", "water"), "gallery": ("water",)})
    capsys.readouterr()
    assert eval_main(["--workdir", str(workdir), "--data", str(other)]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{\n"):])  # after the data's one-line report
    assert report["records"] == 4 + 4 + 4  # milk closed-set, water open-set queries, water gallery
    assert set(report["metrics"]) >= {"top1", "recall_at_1"}

    crops = tmp_path / "crops"
    crops.mkdir()
    Image.fromarray(np.full((24, 24, 3), 128, np.uint8)).save(crops / "a.png")
    assert eval_main(["predict", "--workdir", str(workdir), "--input", str(crops), "--output",
                      str(tmp_path / "out")]) == 0
    row = next(csv.DictReader((tmp_path / "out" / "predictions.csv").open()))
    assert {row["top1"], row["top2"], row["top3"]} == {"cola", "juice", "milk"}

    assert eval_main(["export", "--workdir", str(workdir), "--output", str(tmp_path / "m.jax")]) == 0
    sidecar = json.loads((tmp_path / "m.jax.json").read_text())
    assert sidecar["class_names"] == ["cola", "juice", "milk"]
    assert sidecar["normalisation"] == describe_input(3, "fixed")
    assert eval_main(["quantize", "--workdir", str(workdir), "--format", "int8",
                      "--output", str(tmp_path / "int8")]) == 0
    assert eval_main(["export-weights", "--workdir", str(workdir), "--output", str(tmp_path / "w.safetensors")]) == 0


def test_predict_on_an_evaluation_split_gives_what_evaluate_computed(tmp_path):
    from trainutil import mesh_of
    from triskele.eval.prediction import predict
    from triskele.train.domains.deepfake.data import SyntheticFaces
    from triskele.train.run import evaluate_split, restore_run

    faces = SyntheticFaces("test", 24, 40, frames_per_video=6)
    root = tmp_path / "faces"
    for video in range(4):
        kind = "fake" if video % 2 else "real"
        for frame in range(6):
            record = faces.load(video * 6 + frame)
            path = root / kind / f"v{video}" / f"{frame:02d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray((record["image"] * 255).round().astype(np.uint8)).save(path)
    workdir = tmp_path / "run"
    assert train_main(["--preset", "deepfake-tiny", "--workdir", str(workdir), "--steps", "2", "--no-progress",
                       "--data", str(root), "--set", "model.image_size=32", "--set", "data.global_batch=8",
                       "--set", "deepfake.frames_per_video=4", "--set", "run.eval_every=0"]) == 0
    parts, state, _ = restore_run(workdir, mesh_of("data=8"))
    source = parts.domain.open_split(parts.config, "test")
    scores = evaluate_split(parts, state.params, source)["score"]
    evaluated = {(str(paths[0].parent.name), paths[0].name): float(s)
                 for (paths, _, _), s in zip(source.records, scores, strict=True)}
    predicted = {}
    for kind in ("real", "fake"):
        predict(workdir, root / kind, tmp_path / kind, mesh="data=8", frames_per_video=4)  # the frames evaluate reads
        for row in csv.DictReader((tmp_path / kind / "frames.csv").open()):
            predicted[(row["video"], row["frame"])] = float(row["fake_probability"])
    assert len(evaluated) == 16 and predicted.keys() == evaluated.keys()
    np.testing.assert_allclose([predicted[k] for k in evaluated], list(evaluated.values()), atol=1e-6)
