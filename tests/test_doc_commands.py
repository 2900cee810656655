"""The command blocks of the README and the docs marked `<!-- command: run by tests/test_doc_commands.py -->`
run here as written, one after another in a fresh folder (FRAMES/ is a folder of three photographs),
each on one CPU device unless the command sets XLA_FLAGS itself; `serve` runs until it says it is
listening and answers ready, then gets SIGTERM and must drain and exit 0. Every other command block
names the test that runs it or what it needs (`tests/test_docs.py` holds that)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
MARKER = re.compile(r"<!-- command: (?P<what>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
RUN_HERE = "run by tests/test_doc_commands.py"



def command_blocks(pages=PAGES) -> list[tuple[str, int, str, str]]:
    """(page, line, marker text, block) of every marked block."""
    out = []
    for page in pages:
        text = page.read_text()
        for found in MARKER.finditer(text):
            line = text[: found.start()].count("\n") + 1
            out.append((page.relative_to(ROOT).as_posix(), line, found.group("what"), found.group("body")))
    return out


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def _env(assignments: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", **assignments}


def _frames(folder: Path) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (48 + 8 * i, 64), dtype=np.uint8)).save(folder / f"frame{i}.png")


def _serve(argv: list[str], env: dict[str, str], cwd: Path) -> None:
    server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, said = time.monotonic() + 300, []
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            said.append(line)
            if "listening on http://" in line or not line:
                break
        address = re.search(r"listening on (http://\S+)", "".join(said))
        assert address, "".join(said)[-3000:]
        with urllib.request.urlopen(f"{address.group(1)}/v2/health/ready", timeout=30) as answer:
            assert answer.status == 200
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0, server.stdout.read()[-3000:]
    finally:
        if server.poll() is None:
            server.kill()


def run_block(block: str, cwd: Path) -> None:
    for command in commands(block):
        words = shlex.split(command)
        assignments = {}
        while "=" in words[0] and not words[0].startswith("-"):
            key, _, value = words.pop(0).partition("=")
            assignments[key] = value
        assert words[:2] == ["python", "-m"], f"not a python -m command: {command}"
        argv = [sys.executable, *words[1:]]
        if words[2:4] == ["triskele.eval", "serve"]:
            _serve(argv, _env(assignments), cwd)
            continue
        done = subprocess.run(argv, cwd=cwd, env=_env(assignments), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


RUN_HERE_BLOCKS = [(page, line, block) for page, line, what, block in command_blocks()
                   if what == RUN_HERE and page != "README.md"]
"""The README's quickstart is the quickstart page's (tested below), run once, there."""


@pytest.mark.parametrize(("page", "line", "block"), RUN_HERE_BLOCKS, ids=[f"{p}:{n}" for p, n, _ in RUN_HERE_BLOCKS])
def test_the_block_runs_as_written(page, line, block, tmp_path):
    if "FRAMES/" in block:
        _frames(tmp_path / "FRAMES")
    run_block(block, tmp_path)
    if "--workdir runs/mars-tiny" in block:
        assert sorted(p.name for p in (tmp_path / "OUT").glob("*.png")) == ["frame0.png", "frame1.png", "frame2.png"]
        assert (tmp_path / "serve" / "mars.jax").is_file()
        assert list((tmp_path / "runs" / "mars-tiny" / "eval").glob("*/report.json"))


def test_the_readme_s_quickstart_is_the_quickstart_page_s():
    readme = [block for page, _, _, block in command_blocks() if page == "README.md"]
    page = [block for page, _, _, block in command_blocks() if page == "docs/quickstart.md"]
    assert readme[1] == page[0] and "--workdir runs/mars-tiny" in page[0]
