"""The README is a guide and the rest is a docs site: the README short, its first screen installing,
running and testing, the quickstart's commands in its first 120 lines; `mkdocs build --strict`
(every page in the nav, every link and anchor found) passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_short_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the rest to docs/"
    first = "\n".join(lines[:120])
    for command in ("pip install -e '.[dev]'", "pytest", "python -m triskele.train --preset",
                    "python -m triskele.eval --workdir", "python -m triskele.eval predict",
                    "python -m triskele.eval serve"):
        assert command in first, f"{command!r} is not in the README's first 120 lines"


def test_the_docs_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "data-at-scale" / "index.html").is_file()
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    pages = {p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert {f"{page}/index.html" for page in pages if page != "index"} <= built, "a page is missing from the site"


def test_every_command_block_is_run_by_a_test_or_says_what_it_needs():
    """A ```bash block is a command a reader will type: the line before it names the test (or the CI
    script) that runs it, or what it needs that this machine lacks. Usage synopses are ```text."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unmarked, missing = [], []
    for page in pages:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() != "```bash":
                continue
            before = next((text for text in reversed(lines[:number]) if text.strip()), "")
            marker = re.fullmatch(r"<!-- command: (run by (?P<runner>\S+)|needs .+) -->", before.strip())
            where = f"{page.relative_to(ROOT)}:{number + 1}"
            if marker is None:
                unmarked.append(where)
            elif marker.group("runner") and not (ROOT / marker.group("runner")).is_file():
                missing.append(f"{where}: {marker.group('runner')}")
    assert not unmarked, f"command blocks without a runner or a need: {unmarked}"
    assert not missing, f"command blocks naming a runner that does not exist: {missing}"
