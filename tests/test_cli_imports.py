"""`--help` and a wrong flag answer without importing JAX or the other heavy libraries (issue 36
item 7). Each check runs in a fresh interpreter: this suite's conftest has imported JAX already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "tensorstore", "torch", "transformers", "cv2",
         "matplotlib")
PROBE = """
import json, sys
from triskele.{package}.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)), file=sys.stderr)
"""


def heavy_imports(package: str, argv: list[str]) -> list[str]:
    """The heavy packages `python -m triskele.<package> ARGV` imported (it exits in parsing)."""
    probe = PROBE.format(package=package, argv=argv, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


def _case(package: str, argv: list[str]):
    return pytest.param(package, argv, id=f"{package}:{' '.join(argv)}")


@pytest.mark.parametrize("package, argv", [
    _case("train", ["--help"]),
    _case("train", ["--steps", "abc"]),
    _case("train", ["--no-such-flag"]),
    _case("train", ["prepare", "--help"]),
    _case("train", ["prepare", "deepfake", "--help"]),
    _case("train", ["prepare", "deepfake", "--no-such-flag"]),
    _case("train", ["plan", "--help"]),
    _case("eval", ["--help"]),
    _case("eval", ["--workdir"]),
    _case("eval", ["predict", "--batch", "abc"]),
    _case("eval", ["predict", "--help"]),
    _case("eval", ["quantize", "--help"]),
    _case("eval", ["export", "--help"]),
    _case("eval", ["export-weights", "--help"]),
    _case("eval", ["gallery", "--help"]),
])
def test_parsing_imports_no_heavy_library(package, argv):
    assert heavy_imports(package, argv) == []


LIGHT_MODULES = ("triskele.mesh.spec", "triskele.mesh.schedule", "triskele.mesh.perf.hardware",
                 "triskele.mesh.perf.planner", "triskele.models", "triskele.models.preprocess",
                 "triskele.eval.defaults", "triskele.train.data.images", "triskele.eval.domains.merch")
"""What those help texts read (mesh axes, schedules, GPUs, predict's default batch, merch's gallery):
plain Python, so importing one starts no JAX."""


def test_light_modules_import_no_heavy_library():
    probe = (f"import importlib, json, sys\nfor name in {LIGHT_MODULES!r}:\n    importlib.import_module(name)\n"
             f"print(json.dumps(sorted(n for n in {HEAVY!r} if n in sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
