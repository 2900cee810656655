"""`--help` and a wrong flag answer without importing JAX or the other heavy libraries. The checks run
in a fresh interpreter: this suite's conftest has imported JAX already."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "tensorstore", "torch", "transformers", "cv2",
         "matplotlib")
PROBE = """
import importlib, json, sys
found = {{}}
for package, argv in {cases!r}:
    main = importlib.import_module(f"triskele.{{package}}.cli").main
    try:
        main(argv)
    except SystemExit:
        pass
    found[f"{{package}}: {{' '.join(argv)}}"] = sorted(name for name in {heavy!r} if name in sys.modules)
print(json.dumps(found), file=sys.stderr)
"""
CASES = [
    ("train", ["--help"]),
    ("train", ["--steps", "abc"]),
    ("train", ["--no-such-flag"]),
    ("train", ["prepare", "--help"]),
    ("train", ["prepare", "deepfake", "--help"]),
    ("train", ["prepare", "deepfake", "--no-such-flag"]),
    ("train", ["plan", "--help"]),
    ("eval", ["--help"]),
    ("eval", ["--workdir"]),
    ("eval", ["predict", "--batch", "abc"]),
    ("eval", ["predict", "--help"]),
    ("eval", ["serve", "--help"]),
    ("eval", ["quantize", "--help"]),
    ("eval", ["export", "--help"]),
    ("eval", ["export-weights", "--help"]),
    ("eval", ["gallery", "--help"]),
]


def test_parsing_imports_no_heavy_library():
    """Every command's help and argument errors, one after another in one fresh interpreter: after
    each, no heavy package is in sys.modules (a module imported by one stays, so the first command
    that imports a heavy package is the one named)."""
    probe = PROBE.format(cases=CASES, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    found = json.loads(done.stderr.strip().splitlines()[-1])
    assert len(found) == len(CASES)
    assert {case: heavy for case, heavy in found.items() if heavy} == {}


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
