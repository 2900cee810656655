"""Links planted in a workdir or output folder never redirect a write:
the workdir lock, atomic writes, the metrics log, config.json, the bad-records log, plots, weight
files and the planner's outputs, predict's sweep of a killed job's temporary files, and
bench/gpu.sh's package folder."""

import fcntl
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from triskele.eval.domains.mars import predict_io
from triskele.eval.engine import STATE_DIR, predict_files
from triskele.eval.model import load_model
from triskele.train.bookkeeping.files import remove_partials, write_atomically
from triskele.train.bookkeeping.lock import WorkdirLock
from triskele.train.bookkeeping.logs import RunLog
from triskele.train.bookkeeping.plots import write_plots
from triskele.train.config.overrides import make_config
from triskele.train.data.bad_records import SkipBadRecords
from triskele.train.domains.deepfake.evaluator import plot_roc
from triskele.train.domains.mars.pictures import plot_confusion
from triskele.train.tools.plan import main as plan_main
from triskele.train.tools.plan import plot_scaling
from triskele.train.weights.safetensors import SafetensorsFile, write_safetensors

ROOT = Path(__file__).resolve().parents[1]
LEGACY_RUN = ROOT / "tests" / "fixtures" / "legacy" / "mars-run"
"""A mars checkpoint (16 px, depth 1) kept in the repository."""
GPU_SH = ROOT / "bench" / "gpu.sh"
PRECIOUS = b"precious, not the run's\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_bytes(PRECIOUS)
    return path


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_untouched(tmp_path, victim):
    workdir = tmp_path / "W"
    workdir.mkdir()
    (workdir / "run.lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"run\.lock is a symbolic link.*remove it"):
        WorkdirLock(workdir).__enter__()
    assert victim.read_bytes() == PRECIOUS
    os.link(victim, tmp_path / "second-name")  # a hard link to it is refused as well
    (workdir / "run.lock").unlink()
    os.link(victim, workdir / "run.lock")
    with pytest.raises(ValueError, match="a hard link to another file"):
        WorkdirLock(workdir).__enter__()
    assert victim.read_bytes() == PRECIOUS
    (workdir / "run.lock").unlink()
    with WorkdirLock(workdir):  # once it is removed, as the message says, a run starts
        assert stat.S_IMODE((workdir / "run.lock").stat().st_mode) == 0o600


def test_a_lock_file_removed_under_a_live_run_does_not_let_a_second_run_in(tmp_path, capsys):
    workdir = tmp_path / "W"
    workdir.mkdir()
    lock = workdir / "run.lock"
    lock.write_text('{"host": "gone", "pid": 12345, "started": "then"}')
    with WorkdirLock(workdir):
        assert "taking over the lock left by a run that is gone (host gone, pid 12345" in capsys.readouterr().err
        with pytest.raises(ValueError, match=rf"in use by another training run \(host .*, pid {os.getpid()},"):
            WorkdirLock(workdir).__enter__()
        lock.unlink()
        with pytest.raises(ValueError, match="in use by another training run"):
            WorkdirLock(workdir).__enter__()
        lock.write_text("")  # replaced by another file
        with pytest.raises(ValueError, match="in use by another training run"):
            WorkdirLock(workdir).__enter__()
        lock.unlink()
    with WorkdirLock(workdir):  # the first gone, the next takes it without a warning
        pass
    assert lock.read_text() == "" and "taking over" not in capsys.readouterr().err


def test_a_lock_file_replaced_between_its_open_and_its_flock_is_opened_again(tmp_path, monkeypatch):
    workdir = tmp_path / "W"
    workdir.mkdir()
    lock, flock, replaced = workdir / "run.lock", fcntl.flock, []

    def replace_then_flock(fd, operation):
        if not replaced and stat.S_ISREG(os.fstat(fd if isinstance(fd, int) else fd.fileno()).st_mode):
            lock.unlink()
            lock.write_text("")
            replaced.append(True)
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", replace_then_flock)
    with WorkdirLock(workdir) as held:
        assert replaced and os.fstat(held.handle.fileno()).st_ino == lock.stat().st_ino
        assert f'"pid": {os.getpid()}' in lock.read_text()


def test_a_planted_partial_file_is_never_written_through(tmp_path, victim):
    out = tmp_path / "OUT"
    out.mkdir()
    (out / ".a.png.partial").symlink_to(victim)  # the name the old write_atomically used
    (out / ".a.png.tmp").symlink_to(victim)
    write_atomically(out / "a.png", b"PNG bytes")
    assert victim.read_bytes() == PRECIOUS
    target = out / "a.png"
    assert not target.is_symlink() and target.read_bytes() == b"PNG bytes"
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask  # what open() gives, not mkstemp's 0600
    assert sorted(p.name for p in out.iterdir()) == [".a.png.partial", ".a.png.tmp", "a.png"]


def test_a_symlink_at_the_target_is_replaced_not_followed_and_a_failed_write_leaves_nothing(tmp_path, victim):
    out = tmp_path / "OUT"
    out.mkdir()
    (out / "a.png").symlink_to(victim)
    write_atomically(out / "a.png", b"PNG bytes")  # os.replace did this before too
    assert victim.read_bytes() == PRECIOUS and not (out / "a.png").is_symlink()
    (out / "b.png").mkdir()  # a folder in the way: the rename fails
    (out / "b.png" / "x").touch()
    with pytest.raises(OSError):
        write_atomically(out / "b.png", b"PNG bytes")
    assert sorted(p.name for p in out.iterdir()) == ["a.png", "b.png"]


def test_remove_partials_removes_a_killed_writers_temp_but_not_a_live_ones(tmp_path):
    stale, live = tmp_path / ".a.png.k1x9.partial", tmp_path / ".b.png.q2z7.partial"
    stale.write_bytes(b"half")
    live.write_bytes(b"half")
    (tmp_path / "c.png").write_bytes(b"done")
    with live.open("rb+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # as write_atomically holds its temp while writing
        assert remove_partials(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "c.png"]


def test_the_metrics_log_is_never_read_or_appended_through_a_link(tmp_path, victim):
    workdir = tmp_path / "W"
    workdir.mkdir()
    (workdir / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(ValueError, match=r"metrics\.jsonl is a symbolic link"):
        RunLog(workdir).start(restored_step=3)
    assert not (workdir / "metrics.dropped.jsonl").exists(), "the victim's lines were copied into the workdir"
    (workdir / "metrics.jsonl").unlink()
    (workdir / "metrics.jsonl").write_text('{"step": 3}\n{"step": 4}\n')
    log = RunLog(workdir)
    try:
        assert log.start(restored_step=3) == 1
        (workdir / "metrics.jsonl").unlink()
        (workdir / "metrics.jsonl").symlink_to(victim)  # planted while the run goes on
        with pytest.raises(ValueError, match="symbolic link"):
            log.write({"step": 5, "loss": 1.0})
    finally:
        log.close()
    assert victim.read_bytes() == PRECIOUS


def test_gpu_sh_installs_into_a_private_folder_it_removes_not_a_shared_tmp_path(tmp_path):
    """The script's site logic, run on a copy with a stand-in python that records what it is asked."""
    checkout = tmp_path / "checkout"
    (checkout / "bench").mkdir(parents=True)
    shutil.copy(GPU_SH, checkout / "bench" / "gpu.sh")
    (checkout / ".whl").mkdir()
    (checkout / ".whl" / "grain-0-py3-none-any.whl").touch()
    record = tmp_path / "record.txt"
    python = tmp_path / "python"
    python.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == -c ]]; then exit 1; fi  # "import triskele.train" fails: triskele is installed too
if [[ "$1" == -m ]]; then
  for a in "$@"; do [[ "$prev" == --target ]] && site=$a; prev=$a; done
  echo "target $site $(stat -c '%a %u' "$site")" >> {record}
  exit 0
fi
echo "run PYTHONPATH=$PYTHONPATH $*" >> {record}
""")
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "TMPDIR": str(tmp_path)}
    env.pop("TRISKELE_SITE", None)
    done = subprocess.run(["bash", str(checkout / "bench" / "gpu.sh"), "--cpu"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = record.read_text().splitlines()
    targets = {line.split()[1] for line in lines if line.startswith("target")}
    assert len(targets) == 1 and len(lines) == 3, lines  # the wheels, triskele, then bench/gpu.py --cpu
    site = targets.pop()
    assert site != "/tmp/site" and Path(site).parent == tmp_path
    assert all(line.endswith(f" 700 {os.getuid()}") for line in lines if line.startswith("target")), lines
    assert lines[-1].startswith(f"run PYTHONPATH={site}") and lines[-1].endswith("bench/gpu.py --cpu")
    assert not Path(site).exists(), "the private folder is removed on exit"
    given = tmp_path / "given"  # TRISKELE_SITE, when given, is used and kept
    given.mkdir()
    subprocess.run(["bash", str(checkout / "bench" / "gpu.sh")], env={**env, "TRISKELE_SITE": str(given)},
                   check=True, timeout=60)
    assert f"target {given} " in record.read_text() and given.is_dir()


def _assert_written_in_place_of_the_link(path: Path, victim: Path) -> None:
    assert victim.read_bytes() == PRECIOUS, f"{path.name} was written through the link planted there"
    assert not path.is_symlink() and path.is_file() and path.stat().st_size > 0


def test_config_json_is_written_in_place_of_a_link_planted_there(tmp_path, victim):
    workdir = tmp_path / "W"
    workdir.mkdir()
    (workdir / "config.json").symlink_to(victim)
    config = make_config("mars-tiny")
    config.save(workdir / "config.json")  # as every training run does, and quantize for its copy
    _assert_written_in_place_of_the_link(workdir / "config.json", victim)
    assert (workdir / "config.json").read_text() == json.dumps(config.to_dict(), indent=2) + "\n"


def _training_curves(workdir: Path) -> None:
    (workdir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    write_plots(workdir)


FIGURES = {  # what draws a figure into a folder: the file it writes there
    "plots/training.png": _training_curves,
    "confusion.png": lambda folder: plot_confusion(np.eye(5), folder / "confusion.png"),
    "roc.png": lambda folder: plot_roc(np.array([0, 1, 0, 1]), np.array([0.1, 0.8, 0.3, 0.6]), folder / "roc.png",
                                       "frame-level ROC"),
    "scaling.png": lambda folder: plot_scaling([{"choice": "data", "devices": d, "step_ms": 10.0 / d,
                                                 "efficiency": 1.0, "comm_bound": False} for d in (8, 16)],
                                               folder / "scaling.png"),
}


@pytest.mark.parametrize("name", FIGURES)
def test_a_figure_is_written_in_place_of_a_link_planted_there(tmp_path, victim, name):
    """The run's curves, the mars confusion matrix, the deepfake ROC and the planner's scaling plot."""
    folder = tmp_path / "W"
    (folder / name).parent.mkdir(parents=True)
    (folder / name).symlink_to(victim)
    FIGURES[name](folder)
    _assert_written_in_place_of_the_link(folder / name, victim)
    assert (folder / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


class _Unreadable:
    """A split whose record 0 is a crafted file its reader refuses."""

    def __len__(self) -> int:
        return 2

    def load(self, index, rng=None):
        if index == 0:
            raise ValueError("frames/0.png: cannot read image")
        return {"image": np.zeros((2, 2), np.float32)}


def test_the_bad_records_log_is_never_appended_through_a_link(tmp_path, victim):
    log = tmp_path / "bad_records.txt"
    log.symlink_to(victim)
    with pytest.raises(ValueError, match=r"bad_records\.txt is a symbolic link"):
        SkipBadRecords(_Unreadable(), "train", log).load(0)
    assert victim.read_bytes() == PRECIOUS
    log.unlink()
    assert SkipBadRecords(_Unreadable(), "train", log).load(0)["image"].shape == (2, 2)  # once removed, it goes on
    assert log.read_text() == "train\t0\tframes/0.png: cannot read image\n" and not log.is_symlink()


def test_a_weights_file_is_written_in_place_of_a_link_planted_there(tmp_path, victim):
    path = tmp_path / "backbone.safetensors"
    path.symlink_to(victim)
    weights = {"blocks.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert write_safetensors(path, weights, {"format": "pt"}) == 24
    _assert_written_in_place_of_the_link(path, victim)
    np.testing.assert_array_equal(SafetensorsFile(path).get("blocks.0.weight"), weights["blocks.0.weight"])
    assert not list(tmp_path.glob(".*.partial"))


@pytest.mark.parametrize("mode, written", [
    (["--devices", "8"], ["plan.json"]),
    (["--scaling"], ["scaling.json", "scaling.png"]),
    (["--inference"], ["plan.json"]),
])
def test_the_planners_outputs_are_written_in_place_of_links_planted_there(tmp_path, victim, mode, written, capsys):
    out = tmp_path / "plan"
    out.mkdir()
    for name in written:
        (out / name).symlink_to(victim)
    assert plan_main(["--preset", "mars-b16", "--gpu", "h200", "--output", str(out), *mode]) == 0
    for name in written:
        _assert_written_in_place_of_the_link(out / name, victim)
    assert json.loads((out / written[0]).read_text())


def test_predict_removes_the_temporary_files_a_killed_job_left_in_the_folders_it_writes(tmp_path, victim):
    """Their names are random, so a rerun never writes over them: it sweeps them (a live writer's
    flocked one stays), in OUT, its state folders and its outputs' folders, and nowhere else."""
    photos, out = tmp_path / "photos", tmp_path / "OUT"
    for name in ("a.png", "sub/b.png", "sub/c.png"):
        (photos / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16), 90, np.uint8)).save(photos / name)
    model = load_model(LEGACY_RUN, mesh="data=8")
    mars = predict_io(model.meta, {})
    assert predict_files(model, mars, photos, out, progress=False)["written"] == 3
    shutil.copy(photos / "a.png", photos / "sub" / "d.png")  # the killed job's input not written yet
    killed = [out / ".a.png.k1x9.partial", out / ".summary.json.z0q3.partial", out / "sub" / ".b.png.w8e2.partial",
              out / STATE_DIR / ".manifest.json.p4m1.partial", out / STATE_DIR / "rows" / ".0f3a.json.c7v5.partial",
              out / STATE_DIR / "errors" / ".9b1e.json.u2r6.partial"]
    kept = [tmp_path / ".elsewhere.y5t5.partial", photos / ".a.png.h6j2.partial",
            out / "notes" / ".todo.txt.n3b8.partial"]  # not a folder predict writes
    for path in killed + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    live = out / "sub" / ".e.png.l1v3.partial"
    (out / ".c.png.partial").symlink_to(victim)  # a link planted there: not removed, never written through
    with live.open("wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # as write_atomically holds its temporary file while writing
        summary = predict_files(model, mars, photos, out, progress=False)
    assert (summary["skipped"], summary["written"]) == (3, 1) and (out / "sub" / "d.png").is_file()
    assert [p for p in killed if p.exists()] == [], "a killed writer's temporary file is left"
    assert all(p.exists() for p in kept + [live]) and victim.read_bytes() == PRECIOUS
    assert [p.name for p in out.glob(".*.partial")] == [".c.png.partial"]
