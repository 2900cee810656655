"""The training page's first examples (docs/training.md) run as written where a new reader is: one CPU device."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

TRAINING = Path(__file__).parents[1] / "docs" / "training.md"


def _one_cpu_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu"}


def _section(title: str) -> str:
    text = TRAINING.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _first_block(section: str, language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_the_python_snippet_trains_on_one_cpu_device(tmp_path):
    snippet = _first_block(_section("Python API"), "python")
    assert 'config.mesh = "data=-1"' in snippet
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=_one_cpu_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    final_step, last_loss, _ = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert final_step == "20" and float(last_loss) > 0
    assert (tmp_path / "runs" / "notebook" / "checkpoints" / "20").is_dir()


def test_the_first_cli_example_trains_on_one_cpu_device(tmp_path):
    block = _first_block(_section("Training from the command line"), "bash")
    command = shlex.split(block.split("\ntriskele-train")[0].replace("\\\n", " "))
    assert command[:3] == ["python", "-m", "triskele.train"]
    done = subprocess.run([sys.executable, *command[1:], "--no-progress"], cwd=tmp_path, env=_one_cpu_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "completed: step 20 of 20" in done.stdout
    assert (tmp_path / "runs" / "a" / "checkpoints" / "20").is_dir()


def test_a_mesh_larger_than_a_cpu_has_names_the_flag_that_simulates_devices(tmp_path):
    done = subprocess.run([sys.executable, "-m", "triskele.train", "--mesh", "data=2,fsdp=2,tensor=2", "--workdir",
                           str(tmp_path), "--no-progress"], env=_one_cpu_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert "uses 8 devices but 1 are available" in done.stderr
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=8" in done.stderr, done.stderr
