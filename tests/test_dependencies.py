"""Every third-party module that the package, the tests and the benches import is declared in
pyproject.toml, so that the README's two commands pass in a fresh virtual environment.

Imports are read from the syntax tree (inside functions and `try` blocks too), and each import
name is mapped to the distributions that provide it from the installed distributions' own
`top_level.txt` and `RECORD` data: `PIL` is pillow, `cv2` opencv-python-headless, `yaml` pyyaml,
`dlib` dlib-bin (whose `top_level.txt` names only its extension module, so both are read, where
`importlib.metadata.packages_distributions` reads the first alone). A declared distribution that
is not installed here (an extra this environment lacks) provides the import of its own name.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("mesh", "models", "train", "eval", "tests", "bench", "tools")
"""The folders whose imports a user's environment must satisfy."""


def normalized(distribution: str) -> str:
    """A distribution name as PEP 503 compares them (`PyYAML` and `pyyaml`, `absl_py` and `absl-py`)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def declared_distributions(pyproject: str, extras: tuple[str, ...] | None = None) -> set[str]:
    """Every distribution the base dependencies and the `extras` (default: all) declare (self-references
    such as `triskele[landmarks]` are followed through the extras they name)."""
    project = tomllib.loads(pyproject)["project"]
    requirements = list(project.get("dependencies", []))
    for name, extra in project.get("optional-dependencies", {}).items():
        if extras is None or name in extras:
            requirements += extra
    names = {normalized(re.match(r"[A-Za-z0-9_.-]+", requirement).group()) for requirement in requirements}
    return names - {normalized(project["name"])}


def local_modules() -> set[str]:
    """Names that resolve inside the checkout: the package, and the modules that tests, benches and
    fixture scripts import from their own folders (put on `sys.path` by pytest or by the script)."""
    names = {"triskele", "tools"}
    for folder in ("tests", "tests/fixtures", "bench"):
        names.update(path.stem for path in (ROOT / folder).glob("*.py"))
    return names


def third_party_imports(folders: tuple[str, ...] = SCANNED) -> dict[str, set[str]]:
    """Top-level import name -> the files (relative to the checkout) that import it."""
    stdlib, local = set(sys.stdlib_module_names), local_modules()
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in stdlib and top not in local and top != "__future__":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def import_providers() -> dict[str, set[str]]:
    """Top-level import name -> the installed distributions whose files provide it."""
    providers: dict[str, set[str]] = {}
    for distribution in importlib.metadata.distributions():
        names = set((distribution.read_text("top_level.txt") or "").split())
        for file in distribution.files or []:
            top = file.parts[0]
            if len(file.parts) > 1 and not top.endswith((".dist-info", ".data")) and top != "..":
                names.add(top)
            elif file.suffix in (".py", ".so", ".pyd"):
                names.add(file.name.split(".")[0])
        for name in names:
            providers.setdefault(name, set()).add(normalized(distribution.metadata["Name"]))
    return providers


def undeclared_imports(pyproject: str, imports: dict[str, set[str]], extras: tuple[str, ...] | None = None,
                       ) -> dict[str, str]:
    """Import name -> why no distribution the base and `extras` (default: all) declare provides it."""
    declared = declared_distributions(pyproject, extras)
    providers = import_providers()
    missing = {}
    for name, files in sorted(imports.items()):
        provided_by = providers.get(name, set())
        if provided_by & declared or (not provided_by and normalized(name) in declared):
            continue
        where = ", ".join(sorted(files)[:3]) + (" ..." if len(files) > 3 else "")
        what = " or ".join(sorted(provided_by)) if provided_by else "the distribution that provides it"
        missing[name] = f"`import {name}` ({where}) needs {what} in pyproject.toml's dependencies or an extra"
    return missing


def test_every_import_is_declared():
    imports = third_party_imports()
    assert {"jax", "PIL", "cv2", "yaml", "pytest"} <= set(imports), "the scan missed imports it must see"
    missing = undeclared_imports((ROOT / "pyproject.toml").read_text(), imports)
    assert not missing, "undeclared imports:\n" + "\n".join(missing.values())


def test_a_removed_declaration_is_reported():
    """The check fails when a dependency goes: drop one that only the tests use (requests) and one
    whose import name differs from its distribution's (pyyaml provides `yaml`)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    imports = third_party_imports()
    for distribution, import_name in (("requests", "requests"), ("pyyaml", "yaml")):
        without = re.sub(rf'\s*"{distribution}[^"]*",?', "", pyproject, flags=re.IGNORECASE)
        assert without != pyproject, f"pyproject.toml does not declare {distribution}"
        missing = undeclared_imports(without, imports)
        assert set(missing) == {import_name}, missing
        assert distribution in missing[import_name].lower()


def test_the_package_needs_only_its_base_dependencies():
    """`pip install -e .` trains, evaluates, predicts, exports and serves: the package's own imports
    (mesh, models, train, eval) are the base dependencies', and the landmarks extra's where deepfake
    preparation aligns faces with it (an optional import); torch and transformers are the tests'."""
    imports = third_party_imports(("mesh", "models", "train", "eval"))
    missing = undeclared_imports((ROOT / "pyproject.toml").read_text(), imports, extras=("landmarks",))
    assert not missing, "the package imports what only an extra declares:\n" + "\n".join(missing.values())
    assert not {"torch", "transformers", "tritonclient", "requests"} & set(imports), sorted(imports)
