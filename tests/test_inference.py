"""The streaming predictor and mars at native resolution: sliding windows against single forward
passes, whole images predicted at their own size, bounded memory, resume after SIGKILL, bad
inputs, several processes, exported models."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from PIL import Image
from trainutil import mesh_of, run
from triskele.eval.cli import main as eval_main
from triskele.eval.engine import predict_files
from triskele.eval.model import LiveModel, load_model
from triskele.models.sliding import default_stride, extract_windows, stitch, window_boxes
from triskele.train.run import restore_params
from triskele.train.tools.launch import free_port

pytestmark = pytest.mark.xdist_group("inference")  # one trained checkpoint shared by the module


@pytest.fixture(scope="module")
def mars_run(tmp_path_factory):
    """mars-tiny at 32 px (synthetic frames of 48 px), 4 steps on 8 devices."""
    workdir = tmp_path_factory.mktemp("mars")
    run(workdir, "data=8", **{"run.steps": 4, "optim.lr": 3e-3})
    return workdir


@pytest.fixture(scope="module")
def model(mars_run):
    return load_model(mars_run, mesh="data=8")


def _forward(model, windows):
    return model(windows)["logits"]


# --- sliding windows ------------------------------------------------------------------------------

def test_one_window_frame_is_one_forward_pass(model):
    frame = np.random.default_rng(0).random((32, 32, 1)).astype(np.float32)
    windows = extract_windows(frame, 32, default_stride(32))
    assert windows.shape == (1, 32, 32, 1)
    np.testing.assert_array_equal(stitch(_forward(model, windows), 32, 32, 21), _forward(model, frame[None])[0])


def test_tiled_windows_give_their_own_logits_and_overlaps_their_mean(model):
    rng = np.random.default_rng(1)
    frame = rng.random((64, 96, 1)).astype(np.float32)
    tiles = extract_windows(frame, 32, 32)  # stride = window: no overlap, 2 x 3 tiles
    assert window_boxes(64, 96, 32, 32) == [(0, 0), (0, 32), (0, 64), (32, 0), (32, 32), (32, 64)]
    stitched = stitch(_forward(model, tiles), 64, 96, 32)
    for (top, left), tile in zip(window_boxes(64, 96, 32, 32), tiles, strict=True):
        own = _forward(model, tile[None])[0]
        np.testing.assert_allclose(stitched[top : top + 32, left : left + 32], own, atol=1e-5)
    tall = rng.random((48, 32, 1)).astype(np.float32)  # windows at rows 0 and 16: rows 16..31 covered twice
    logits = _forward(model, extract_windows(tall, 32, 16))
    stitched = stitch(logits, 48, 32, 16)
    np.testing.assert_allclose(stitched[:16], logits[0][:16], atol=1e-6)
    np.testing.assert_allclose(stitched[16:32], (logits[0][16:] + logits[1][:16]) / 2, atol=1e-6)
    np.testing.assert_allclose(stitched[32:], logits[1][16:], atol=1e-6)


def test_small_images_are_padded_and_the_padding_dropped(model):
    frame = np.random.default_rng(2).random((20, 25, 1)).astype(np.float32)
    windows = extract_windows(frame, 32, 21)
    assert windows.shape == (1, 32, 32, 1)
    assert stitch(_forward(model, windows), 20, 25, 21).shape == (20, 25, 4)


# --- whole images -----------------------------------------------------------------------------------

def test_a_photo_and_a_strip_come_back_at_their_size_with_every_pixel_predicted(mars_run, tmp_path, capsys):
    from sklearn.datasets import load_sample_image

    inputs = tmp_path / "in"
    (inputs / "strips").mkdir(parents=True)
    Image.fromarray(load_sample_image("china.jpg")).save(inputs / "china.jpg")  # 640 x 427, a real photograph
    strip = np.asarray(Image.fromarray(load_sample_image("flower.jpg")).convert("L").resize((600, 200)))
    Image.fromarray(strip).save(inputs / "strips" / "flower.png")
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(mars_run), "--input", str(inputs), "--output", str(out),
                      "--overlay", "--tta", "flip", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["inputs"] == summary["written"] == 2 and summary["unreadable"] == 0
    assert set(summary) >= {"inputs", "written", "skipped", "unreadable", "seconds", "images_per_sec"}
    photo = np.asarray(Image.open(out / "china.png"))
    wide = np.asarray(Image.open(out / "strips" / "flower.png"))
    assert photo.shape == (427, 640) and wide.shape == (200, 600)
    for mask in (photo, wide):
        assert set(np.unique(mask)) <= {0, 1, 2, 3}  # no 255: every pixel predicted
    overlay = Image.open(out / "china.overlay.png")
    assert overlay.size == (640, 427 + 24)


def test_inputs_from_a_glob_and_a_list_of_paths(mars_run, tmp_path):
    for name in ("a", "b", "c"):
        Image.fromarray(np.full((40, 40), 90, np.uint8)).save(tmp_path / f"{name}.png")
    (tmp_path / "list.txt").write_text("a.png\n# a comment\nc.png\n")
    model = load_model(mars_run, mesh="data=8")
    io = _io(model)
    assert predict_files(model, io, tmp_path / "list.txt", tmp_path / "l", progress=False)["written"] == 2
    assert sorted(p.name for p in (tmp_path / "l").glob("*.png")) == ["a.png", "c.png"]
    assert predict_files(model, io, str(tmp_path / "[ab].png"), tmp_path / "g", progress=False)["written"] == 2
    with pytest.raises(ValueError, match="holds no inputs"):
        predict_files(model, io, str(tmp_path / "*.jpg"), tmp_path / "g", progress=False)


def _io(model):
    from triskele.eval.domains.mars import predict_io

    return predict_io(model.meta, {})


# --- streaming, resume, bad inputs ------------------------------------------------------------------

class _CountingIO:
    """A domain's IO that records how many inputs are read but not yet written at any time."""

    def __init__(self, inner):
        self.inner, self.suffixes, self.open, self.most = inner, inner.suffixes, 0, 0

    def units(self, root, files):
        return self.inner.units(root, files)

    def read(self, unit):
        self.open += 1
        self.most = max(self.most, self.open)
        return self.inner.read(unit)

    def write(self, unit, context, outputs, out_dir):
        self.open -= 1
        return self.inner.write(unit, context, outputs, out_dir)

    def finish(self, rows, out_dir):
        return self.inner.finish(rows, out_dir)


def test_inputs_in_flight_are_bounded_by_the_prefetch_depth(mars_run, tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(300):
        Image.fromarray(np.full((32, 32), i % 256, np.uint8)).save(folder / f"{i:04d}.png")
    model = load_model(mars_run, mesh="data=8", batch=16)
    io = _CountingIO(_io(model))
    summary = predict_files(model, io, folder, tmp_path / "out", threads=2, prefetch=4, progress=False)
    assert summary["written"] == 300
    # Read ahead (prefetch + the threads' own), one batch of 16 records in flight and one being
    # fetched, and the writer's queue of 4: never the whole folder.
    assert io.most <= 4 + 2 + 2 * 16 + 4 + 1, io.most


def _predict_subprocess(workdir, inputs, out, *extra, devices=8):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return subprocess.Popen([sys.executable, "-m", "triskele.eval", "predict", "--workdir", str(workdir),
                             "--input", str(inputs), "--output", str(out), "--no-progress", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


PEAK_RSS = """
import resource, sys
from triskele.eval.cli import main
code = main(sys.argv[1:])
print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def test_peak_memory_does_not_grow_with_the_number_of_inputs(mars_run, tmp_path):
    peaks = {}
    for count in (400, 4000):
        folder = tmp_path / f"in{count}"
        folder.mkdir()
        rng = np.random.default_rng(count)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (48, 48), np.uint8)).save(folder / f"{i:05d}.png")
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
        result = subprocess.run([sys.executable, "-c", PEAK_RSS, "predict", "--workdir", str(mars_run), "--input",
                                 str(folder), "--output", str(tmp_path / f"out{count}"), "--no-progress"],
                                env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        peaks[count] = int(result.stdout.split("PEAK_RSS_KB")[1].split()[0]) / 1024
    assert peaks[4000] - peaks[400] < 300, peaks  # MB


def test_a_killed_job_rerun_finishes_the_rest_and_rewrites_nothing(mars_run, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(120):
        Image.fromarray(rng.integers(0, 255, (64, 80), np.uint8)).save(folder / f"{i:03d}.png")
    reference = tmp_path / "reference"
    assert _predict_subprocess(mars_run, folder, reference, "--batch", "8").wait(timeout=600) == 0
    out = tmp_path / "out"
    job = _predict_subprocess(mars_run, folder, out, "--batch", "8", "--prefetch", "2", "--threads", "1")
    deadline = time.monotonic() + 300
    while len(list(out.glob("*.png"))) < 20 and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait()
    rows = list((out / ".triskele-predict" / "rows").glob("*.json"))
    earlier = {p.name: p.stat().st_mtime_ns for p in out.glob("*.png")}
    assert 0 < len(rows) < 120, "the job must be killed part-way"
    rerun = _predict_subprocess(mars_run, folder, out, "--batch", "8")
    assert rerun.wait(timeout=600) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] >= len(rows) and summary["skipped"] + summary["written"] == 120
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("*.png")}
    done_before = {json.loads(r.read_text())["mask"] for r in rows}
    assert all(finished[name] == earlier[name] for name in done_before), "an output done before was rewritten"
    assert sorted(finished) == sorted(p.name for p in reference.glob("*.png"))
    for name in finished:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert not list(out.glob(".*.partial"))


def test_bad_inputs_are_listed_and_the_rest_written(mars_run, tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    good = Image.fromarray(np.full((40, 50), 120, np.uint8))
    good.save(folder / "good.png")
    good.save(folder / "whole.png")
    (folder / "truncated.png").write_bytes((folder / "whole.png").read_bytes()[:60])
    (folder / "text.png").write_text("this is not a picture\n")
    (folder / "empty.png").write_bytes(b"")
    out = tmp_path / "out"
    assert eval_main(["predict", "--workdir", str(mars_run), "--input", str(folder), "--output", str(out),
                      "--no-progress"]) == 1
    errors = {r["input"]: r["reason"] for r in csv.DictReader((out / "errors.csv").open())}
    assert set(errors) == {"truncated.png", "text.png", "empty.png"}
    assert all("cannot read image" in reason for reason in errors.values()), errors
    assert sorted(p.name for p in out.glob("*.png")) == ["good.png", "whole.png"]


def test_two_processes_write_what_one_process_writes(mars_run, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(4)
    for i in range(13):
        Image.fromarray(rng.integers(0, 255, (40 + i, 56), np.uint8)).save(folder / f"{i:02d}.png")
    one = _predict_subprocess(mars_run, folder, tmp_path / "one")
    assert one.wait(timeout=600) == 0, one.stdout.read()[-3000:]
    port = free_port()
    two = [_predict_subprocess(mars_run, folder, tmp_path / "two", "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", "2", "--process-id", str(i), devices=4) for i in range(2)]
    for process in two:
        assert process.wait(timeout=600) == 0, process.stdout.read()[-3000:]
    masks = sorted(p.name for p in (tmp_path / "one").glob("*.png"))
    assert masks == sorted(p.name for p in (tmp_path / "two").glob("*.png")) and len(masks) == 13
    for name in masks:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["written"] == 13 and summary["inputs"] == 13


def test_exported_and_live_models_give_the_same_outputs(mars_run, tmp_path):
    assert eval_main(["export", "--workdir", str(mars_run), "--output", str(tmp_path / "m.jax")]) == 0
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (45, 70), np.uint8)).save(folder / f"{i}.png")
    for flags, out in ((["--workdir", str(mars_run)], "live"), (["--exported", str(tmp_path / "m.jax")], "exported")):
        assert eval_main(["predict", *flags, "--input", str(folder), "--output", str(tmp_path / out),
                          "--no-progress"]) == 0
    for i in range(5):
        assert (tmp_path / "live" / f"{i}.png").read_bytes() == (tmp_path / "exported" / f"{i}.png").read_bytes()


def test_the_params_only_predictor_keeps_no_optimizer_state(mars_run):
    parts, params, step = restore_params(mars_run, mesh_of("data=2,tensor=4"))
    live = LiveModel(parts, params)
    assert step == 4 and live.batch == 8 * 2 and set(params) >= {"backbone"}
    assert jax.tree.leaves(params)[0].sharding.mesh.shape["tensor"] == 4
    with pytest.raises(ValueError, match="not divisible by data x fsdp = 2"):
        LiveModel(parts, params, batch=7)


def test_notebooks_get_an_iterator_of_predictions(mars_run, tmp_path):
    from triskele.eval import predict, predict_iter

    for name, size in (("a.png", (40, 40)), ("b.png", (30, 70))):
        Image.fromarray(np.full(size, 100, np.uint8)).save(tmp_path / name)
    (tmp_path / "c.png").write_bytes(b"")
    got = {p.unit.key: p for p in predict_iter(mars_run, tmp_path, mesh="data=8")}
    assert set(got) == {"a.png", "b.png", "c.png"} and "cannot read image" in got["c.png"].error
    windows = got["b.png"].outputs["logits"]
    assert windows.shape == (len(window_boxes(30, 70, 32, 21)), 32, 32, 4)
    assert callable(predict)


# --- every input its own output, tied to its model ------------------------

def _noise(path, seed, size=(36, 44)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, size, np.uint8)).save(path)
    return path


def test_every_input_gets_its_own_output_named_by_its_path_and_suffix(mars_run, tmp_path):
    inputs = [_noise(tmp_path / "x" / "a" / "img.png", 1), _noise(tmp_path / "y" / "b" / "img.png", 2),
              _noise(tmp_path / "x" / "a" / "frame.jpg", 3), _noise(tmp_path / "x" / "a" / "frame.png", 4)]
    (tmp_path / "list.txt").write_text("".join(f"{p}\n" for p in inputs))
    model = load_model(mars_run, mesh="data=8")
    from triskele.eval.domains.mars import predict_io

    io = predict_io(model.meta, {"overlay": True})
    out = tmp_path / "out"
    summary = predict_files(model, io, tmp_path / "list.txt", out, progress=False)
    assert summary["inputs"] == summary["written"] == 4
    masks = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png") if not p.name.endswith(".overlay.png"))
    assert masks == ["x/a/frame.jpg.png", "x/a/frame.png.png", "x/a/img.png", "y/b/img.png"]
    assert len(list(out.rglob("*.overlay.png"))) == 4
    for path, mask in zip(inputs, ["x/a/img.png", "y/b/img.png", "x/a/frame.jpg.png", "x/a/frame.png.png"],
                          strict=True):
        alone = tmp_path / f"alone-{mask.replace('/', '-')}"
        predict_files(model, io, path, alone, progress=False)  # one file: its mask is its stem + .png
        assert (out / mask).read_bytes() == (alone / f"{path.stem}.png").read_bytes(), mask


def test_a_resume_with_another_model_or_options_is_refused_and_a_changed_input_redone(mars_run, tmp_path,
                                                                                        capsys):
    folder = tmp_path / "in"
    for i in range(3):
        _noise(folder / f"{i}.png", 10 + i)
    out = tmp_path / "out"
    command = ["predict", "--workdir", str(mars_run), "--input", str(folder), "--output", str(out), "--no-progress",
               "--mesh", "data=8"]
    assert eval_main(command) == 0
    manifest = json.loads((out / ".triskele-predict" / "manifest.json").read_text())
    assert manifest["domain"] == "mars" and manifest["options"] == {}
    assert manifest["model"]["step"] == 4 and len(manifest["model"]["params_sha256"]) == 64
    assert manifest["preprocessing"]["image_size"] == 32 and manifest["preprocessing"]["channels"] == 1
    capsys.readouterr()
    assert eval_main(command + ["--stride", "16"]) == 2
    err = capsys.readouterr().err
    assert "stride: None -> 16" in err and "--overwrite" in err, err

    parts, params, step = restore_params(mars_run, mesh_of("data=8"))
    other = LiveModel(parts, jax.tree.map(lambda a: a * np.float32(1.01), params), step=step)
    with pytest.raises(ValueError, match=r"model: checkpoint step 4 \(float32, parameters sha256 \w{12}\) -> "
                                         r"checkpoint step 4 \(float32, parameters sha256 \w{12}\)"):
        predict_files(other, _io(other), folder, out, progress=False)
    masks = {p.name: p.read_bytes() for p in out.glob("*.png")}
    assert predict_files(other, _io(other), folder, out, overwrite=True, progress=False)["written"] == 3
    assert {p.name: p.read_bytes() for p in out.glob("*.png")} != masks  # the other model's masks
    assert eval_main(command) == 2  # the run's own model, now that OUT holds the other's
    assert eval_main(command + ["--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in out.glob("*.png")} == masks

    earlier = {p.name: p.stat().st_mtime_ns for p in out.glob("*.png")}
    _noise(folder / "1.png", 99)  # the same name, other pixels
    assert eval_main(command) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["written"], summary["skipped"], summary["changed"]) == (1, 2, 1)
    assert {name for name, t in earlier.items() if (out / name).stat().st_mtime_ns != t} == {"1.png"}
    model = load_model(mars_run, mesh="data=8")
    predict_files(model, _io(model), folder / "1.png", tmp_path / "alone", progress=False)
    assert (out / "1.png").read_bytes() == (tmp_path / "alone" / "1.png").read_bytes()


# --- transfers ----------------------------------------------------------------------------------------

def test_outputs_stay_sharded_on_their_devices_and_mars_returns_only_its_logits(model):
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec
    from triskele.mesh import host_to_global
    from triskele.mesh.perf.hlo_counts import program_cost

    images = np.random.default_rng(5).random((model.batch, 32, 32, 1), dtype=np.float32)  # 8 rows per device
    handle = model.dispatch(images)
    assert set(handle) == {"logits"}  # the writers read the logits only
    assert [shard.data.shape for shard in handle["logits"].addressable_shards] == [(8, 32, 32, 4)] * 8
    alone = jax.jit(lambda params, x: nnx.merge(model.parts.graphdef, params)(x))  # the model on one device
    np.testing.assert_allclose(model.fetch(handle)["logits"], alone(jax.device_get(model.params), images),
                               atol=1e-5)
    with jax.set_mesh(model.mesh):
        batch = host_to_global({"image": images}, model.mesh, model.batch)["image"]
        compiled = model._serve.lower(model.params, batch).compile().as_text()
        replicated = jax.jit(lambda params, x: nnx.merge(model.parts.graphdef, params).infer(x),
                             out_shardings=NamedSharding(model.mesh, PartitionSpec()))
        control = replicated.lower(model.params, batch).compile().as_text()
    assert program_cost(compiled, 8).collective_counts.get("all-gather", 0) == 0
    assert program_cost(control, 8).collective_counts.get("all-gather", 0) >= 1  # the check trips on a gather


def test_a_16_bit_frame_and_a_sideways_photo_get_the_masks_of_their_8_bit_upright_twins(mars_run, tmp_path):
    """The same picture stored in 8 bits, in 16 bits (each value times 257) and turned a quarter
    (stored sideways, EXIF orientation 6): the same mask, and the summary counts the turned one."""
    upright = np.random.default_rng(7).integers(0, 255, (36, 44), np.uint8)
    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(upright).save(folder / "eight.png")
    Image.fromarray(upright.astype(np.uint16) * 257).save(folder / "sixteen.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.ascontiguousarray(np.rot90(upright, 1))).save(folder / "phone.png", exif=exif.tobytes())
    model = load_model(mars_run, mesh="data=8")
    from triskele.eval.domains.mars import predict_io

    summary = predict_files(model, predict_io(model.meta, {}), folder, tmp_path / "out", progress=False)
    assert summary["written"] == 3 and summary["turned_by_exif_orientation"] == 1
    masks = {name: np.asarray(Image.open(tmp_path / "out" / f"{name}.png")) for name in ("eight", "sixteen", "phone")}
    assert masks["eight"].shape == (36, 44) and len(np.unique(masks["eight"])) > 1
    np.testing.assert_array_equal(masks["sixteen"], masks["eight"])
    np.testing.assert_array_equal(masks["phone"], masks["eight"])
