"""Links planted in a workdir or output folder never redirect a write (issue 37, items 1 and 8):
the workdir lock, atomic writes, the metrics log, and bench/gpu.sh's package folder."""

import fcntl
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from triskele.train.bookkeeping.files import remove_partials, write_atomically
from triskele.train.bookkeeping.lock import WorkdirLock
from triskele.train.bookkeeping.logs import RunLog

ROOT = Path(__file__).resolve().parents[1]
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
