import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_deepfake_data import write_ffpp
from trainutil import mesh_of, small_config, train_small
from triskele.eval.cli import main as eval_main
from triskele.eval.report import evaluate_checkpoint
from triskele.mesh import tree_shardings
from triskele.models import ViTConfig
from triskele.models.deepfake import VideoDetector
from triskele.train import train
from triskele.train.domains.deepfake.evaluator import families_figure, unseen_families

FACES = {"data.eval_size": 64, "deepfake.frames_per_video": 4}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_small(tmp_path_factory.mktemp("deepfake"), "deepfake-tiny", "data=8", **FACES, **{"run.steps": 3})


def test_evaluation_is_mesh_invariant_and_reports_deepfakebench_metrics(trained, devices):
    a = evaluate_checkpoint(trained, mesh="data=8")
    b = evaluate_checkpoint(trained, mesh="data=2,fsdp=2,tensor=2")
    assert set(a["metrics"]) >= {"auc_frame", "auc_video", "eer", "ap", "acc"}
    assert a["metrics"]["records"] == 64 and a["metrics"]["videos"] == 16
    families = [k for k in a["metrics"] if k.startswith("auc_frame/")]
    assert len(families) >= 3 and {f"auc_video/{k.split('/')[1]}" for k in families} <= set(a["metrics"])
    for key in ("auc_frame", "auc_video", "eer", "ap", "acc", *families):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], abs=1e-6), key
    assert (trained / "eval" / "3" / "roc.png").is_file()
    assert (trained / "eval" / "3" / "families.png").stat().st_size > 5_000


def test_holdout_evaluates_one_family(trained, capsys):
    assert eval_main(["--workdir", str(trained), "--mesh", "data=8", "--holdout", "Resample"]) == 0
    report = json.loads((trained / "eval" / "3" / "report.json").read_text())
    assert report["holdout"] == "Resample"
    metrics = report["metrics"]
    assert metrics["records"] == 64
    # Only Resample's fakes are scored (with every real): the table has that one family, and the
    # split's figures are its figures. With the flag ignored the table holds the five families of the
    # test split (Exposure, Resample, Sharpen, Swap, Warp) and auc_frame is 0.516, not 0.493.
    assert {k for k in metrics if "/" in k} == {"auc_frame/Resample", "auc_video/Resample"}
    assert metrics["auc_frame"] == pytest.approx(metrics["auc_frame/Resample"], abs=1e-12)
    assert metrics["auc_video"] == pytest.approx(metrics["auc_video/Resample"], abs=1e-12)


def test_unseen_families_follow_what_training_read():
    config = small_config("deepfake-tiny", **{"deepfake.holdout": "Resample"})
    families = ["ColorShift", "Resample", "Swap"]
    assert unseen_families(config.options, families, synthetic=True) == ["Resample", "Swap"]
    assert unseen_families(config.options, ["Deepfakes", "Resample"], synthetic=False) == ["Resample"]
    config.options.fakes = "sbi"
    assert unseen_families(config.options, families, synthetic=True) == families, "sbi reads no fake"


def test_families_chart_is_titled_its_chance_line_labelled_unseen_marked_legend_clear():
    aucs = {f"auc_{level}/{family}": value for family, value in (("ColorShift", 0.97), ("Swap", 0.52))
            for level in ("frame", "video")}
    fig = families_figure(aucs, ["Swap"], "AUC per manipulation family")
    [ax] = fig.axes
    assert ax.get_title() == "AUC per manipulation family"
    [chance] = [line for line in ax.get_lines() if line.get_label() == "chance (0.5)"]
    assert set(chance.get_ydata()) == {0.5}
    legend = ax.get_legend()
    assert {"chance (0.5)", "not seen in training"} <= {t.get_text() for t in legend.get_texts()}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ColorShift", "Swap\n(unseen)"]
    assert [bool(bar.get_hatch()) for bar in ax.patches] == [False, True, False, True]
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(bar.get_window_extent(renderer)) for bar in ax.patches), "the legend hides no bar"


def test_predict_writes_per_video_and_per_frame_csv(trained, tmp_path):
    write_ffpp(tmp_path / "ffpp")
    frames = tmp_path / "ffpp" / "original_sequences" / "youtube" / "c23" / "frames"
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(frames), "--output", str(out),
                      "--mesh", "data=8"]) == 0
    videos = list(csv.DictReader((out / "videos.csv").open()))
    frame_rows = list(csv.DictReader((out / "frames.csv").open()))
    assert [v["video"] for v in videos] == ["000", "001", "002", "003"]
    # predict samples DeepfakeBench's 32 frames per video, not the 4 the run trained on: all 6 here
    assert all(v["records"] == "6" for v in videos) and len(frame_rows) == 24
    for video in videos:
        mine = [float(r["fake_probability"]) for r in frame_rows if r["video"] == video["video"]]
        assert float(video["fake_probability"]) == pytest.approx(np.mean(mine), abs=1e-6)
        assert all(0 <= p <= 1 for p in mine)


def test_linked_frame_folders_are_read_and_two_of_one_name_keep_their_folders(trained, tmp_path):
    """A folder of links to the dataset's video folders (the usual way to point at a
    dataset without copying it) is read, and two videos both named 000 keep apart."""
    write_ffpp(tmp_path / "ffpp")
    real = tmp_path / "ffpp" / "original_sequences" / "youtube" / "c23" / "frames"
    fake = tmp_path / "ffpp" / "manipulated_sequences" / "Deepfakes" / "c23" / "frames"
    picked = tmp_path / "picked"
    for folder, target in (("real", real / "000"), ("fake", fake / "000_001")):
        (picked / folder).mkdir(parents=True)
        (picked / folder / "000").symlink_to(target, target_is_directory=True)
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(trained), "--input", str(picked), "--output", str(out),
                      "--frames-per-video", "4"]) == 0
    videos = {v["video"]: v for v in csv.DictReader((out / "videos.csv").open())}
    assert set(videos) == {"real/000", "fake/000"} and all(v["records"] == "4" for v in videos.values())
    assert videos["real/000"]["fake_probability"] != videos["fake/000"]["fake_probability"]
    frames = list(csv.DictReader((out / "frames.csv").open()))
    assert sorted(r["video"] for r in frames) == ["fake/000"] * 4 + ["real/000"] * 4


def test_video_model_output_shape_and_sharding(devices):
    cfg = ViTConfig.named("tiny", patch=8, image_size=32)
    abstract = nnx.eval_shape(lambda: VideoDetector(cfg, 4, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    clips = jax.random.uniform(jax.random.key(0), (8, 4, 32, 32, 3))

    def forward(params):
        return nnx.merge(graphdef, params)(clips)

    init = lambda: nnx.to_pure_dict(nnx.state(VideoDetector(cfg, 4, rngs=nnx.Rngs(0)), nnx.Param))
    single = jax.jit(forward)(jax.jit(init)())
    mesh = mesh_of("data=2,fsdp=2,tensor=2")
    shardings = tree_shardings(state, mesh)
    params = jax.jit(init, out_shardings=shardings)()
    assert params["keys"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    with jax.set_mesh(mesh):
        sharded = jax.jit(forward)(params)
    assert sharded.shape == (8,)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="expects clips of 4 frames, got 3"):
        nnx.merge(graphdef, jax.device_get(params))(clips[:, :3])


def test_video_detector_trains_on_clips(tmp_path, devices):
    config = small_config("deepfake-tiny", **FACES, **{"model.frames": 4, "run.steps": 2, "data.global_batch": 8,
                                           "run.eval_every": 2})
    summary = train(config, tmp_path, mesh=mesh_of("data=8"), progress=False)
    assert summary.final_step == 2 and np.isfinite(summary.last_loss)
    assert jnp.isfinite(summary.eval_metrics["eval_loss"])


def test_a_folder_of_photos_is_scored_photo_by_photo_and_numbered_frames_as_one_video(trained, tmp_path):
    """Still photos: each its own input, its face found (none in the coffee cup or the rocket: no
    score, and why), a broken file listed alone; `--as video` reads the same folder as one video;
    a folder of numbered frames stays one video; summary.json says how each input was read."""
    from PIL import Image
    from skimage import data
    from videoutil import FACE

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(data.astronaut()).save(photos / "astronaut.png")
    Image.fromarray(data.coffee()).save(photos / "coffee.png")
    Image.fromarray(data.rocket()).save(photos / "rocket.jpg")
    (photos / "empty.png").write_bytes(b"")
    out = tmp_path / "out"
    command = ["predict", "--workdir", str(trained), "--input", str(photos), "--mesh", "data=8", "--no-progress"]
    assert eval_main([*command, "--output", str(out)]) == 1  # one unreadable input
    videos = {r["video"]: r for r in csv.DictReader((out / "videos.csv").open())}
    assert set(videos) == {"astronaut.png", "coffee.png", "rocket.jpg"}
    assert all(row["read_as"] == "photo" for row in videos.values())
    face = videos["astronaut.png"]
    assert (face["faces_found"], face["records"], face["reason"]) == ("1", "1", "")
    assert 0 <= float(face["fake_probability"]) <= 1
    for name in ("coffee.png", "rocket.jpg"):
        assert (videos[name]["faces_found"], videos[name]["fake_probability"]) == ("0", "")
        assert videos[name]["reason"] == "no face found in the photo"
    (box,) = [r["box"] for r in csv.DictReader((out / "frames.csv").open()) if r["video"] == "astronaut.png"]
    left, top, right, bottom = map(int, box.split())
    assert abs((left + right) / 2 - (FACE[0] + FACE[2]) / 2) < 10
    assert abs((top + bottom) / 2 - (FACE[1] + FACE[3]) / 2) < 10
    errors = list(csv.DictReader((out / "errors.csv").open()))
    assert [e["input"] for e in errors] == ["empty.png"] and "empty file" in errors[0]["reason"]
    assert json.loads((out / "summary.json").read_text())["read_as"] == {"photo": 3}

    as_video = tmp_path / "as-video"
    assert eval_main([*command, "--output", str(as_video), "--as", "video"]) == 1
    assert list(csv.DictReader((as_video / "videos.csv").open())) == []  # the empty frame fails the whole video
    (photos / "empty.png").unlink()
    assert eval_main([*command, "--output", str(tmp_path / "as-video-2"), "--as", "video"]) == 0
    (row,) = csv.DictReader((tmp_path / "as-video-2" / "videos.csv").open())
    assert (row["video"], row["records"], row["read_as"]) == ("photos", "3", "frames")

    frames = tmp_path / "frames"
    frames.mkdir()
    for index in range(3):
        Image.fromarray(np.asarray(data.astronaut())[60:200, 150:290]).save(frames / f"{index:06d}.png")
    assert eval_main([*command[:3], "--input", str(frames), "--output", str(tmp_path / "f"), *command[5:]]) == 0
    (row,) = csv.DictReader((tmp_path / "f" / "videos.csv").open())
    assert (row["video"], row["records"], row["faces_found"], row["read_as"]) == ("frames", "3", "3", "frames")
