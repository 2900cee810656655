"""The mutation harness: each behavioural mutant of `tools/mutation/mutant_list.py` applied alone to a
private copy of the package, and only the tests that must kill it run against that copy.

    python -m tools.mutation.harness                    # every mutant
    python -m tools.mutation.harness --changed [REV]    # those whose file (or killing tests) changed since REV
    python -m tools.mutation.harness --only NAME ...    # the mutants named
    python -m tools.mutation.harness --list             # the list, nothing run
    python -m tools.mutation.harness --jobs 2           # two mutants at a time
    python -m tools.mutation.harness --baseline --only NAME   # a new entry: its tests pass unmutated, then kill it

For each mutant: the working tree (tracked files and untracked ones git does not ignore, as they are
now) is copied to a temporary folder, never touching the checkout; its package folders are linked
into `_pkg/triskele/{mesh,models,train,eval}` (the package-dir map of pyproject.toml), which leads
PYTHONPATH, so that `import triskele` resolves to the copy; the one change is made (its original text
must occur exactly once in the file, inside the named function) and the file must still compile;
then `python -m pytest -x -q -n 0 -p no:cacheprovider <the mutant's tests>` runs in the copy. A
plugin loaded into that pytest checks, once the tests are collected, that the mutated module is
imported from the copy's `_pkg` and holds the mutated text. Results: killed (a test failed),
survived (the tests passed), error (the text not found, no test selected, a collection error, the
import check failed, a timeout). The JAX compilation cache is the one the tests use
(tests/conftest.py, TRISKELE_CACHE_DIR or ~/.cache/triskele/jax), through the inherited environment.

Exit status: 0 when every mutant run was killed, 1 on any survivor or error.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools.mutation.mutant_list import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ("-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE")
PLUGIN = "_triskele_mutant_check"
TIMEOUT = 1800
"""Seconds one mutant's tests may take before the run counts as an error."""

PLUGIN_SOURCE = '''"""Written by the mutation harness: after collection, the mutated module must come from the copy."""
import hashlib
import importlib
import json
import os
from pathlib import Path

import pytest


def pytest_collection_finish(session):
    spec = json.loads(os.environ["TRISKELE_MUTANT"])
    result = {"collected": len(session.items), "ok": True, "reason": ""}
    try:
        if spec["module"]:
            module = importlib.import_module(spec["module"])
            path = Path(module.__file__)
            result["imported"] = str(path)
            if not path.is_relative_to(spec["pkg"]):
                result.update(ok=False, reason=f"{spec['module']} was imported from {path}, not from {spec['pkg']}")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != spec["sha256"]:
                result.update(ok=False, reason=f"{path} does not hold the mutated source")
    except Exception as err:  # the check's own failure is the harness's error, not a kill
        result.update(ok=False, reason=f"importing {spec['module']}: {type(err).__name__}: {err}")
    Path(spec["report"]).write_text(json.dumps(result))
    if not result["ok"]:
        pytest.exit("mutant check: " + result["reason"], returncode=3)
'''


class MutantError(ValueError):
    """A mutant that cannot be applied as listed (an error, never a kill)."""


@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    status: str
    """'killed', 'survived' or 'error'."""
    seconds: float
    detail: str


def package_dirs(root: Path) -> dict[str, str]:
    """pyproject.toml's package-dir map: package (`triskele.train`) -> folder (`train`)."""
    with open(root / "pyproject.toml", "rb") as f:
        dirs = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not dirs:
        raise MutantError(f"{root / 'pyproject.toml'} has no [tool.setuptools] package-dir map")
    return dict(dirs)


def module_of(file: str, dirs: dict[str, str]) -> str | None:
    """The dotted module a file of the tree is imported as (None outside the package folders)."""
    path = Path(file)
    for package, folder in dirs.items():
        if path.parts[: len(Path(folder).parts)] == Path(folder).parts:
            rest = path.relative_to(folder).with_suffix("").parts
            return ".".join((package, *rest[: -1 if rest[-1] == "__init__" else None]))
    return None


def _function_spans(source: str) -> dict[str, list[tuple[int, int]]]:
    """Qualified name (`Class.method`, `outer.inner`) -> line spans of each def or class of that name."""
    spans: dict[str, list[tuple[int, int]]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                spans.setdefault(name, []).append((child.lineno, child.end_lineno or child.lineno))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return spans


def mutated_source(mutant: Mutant, root: Path) -> str:
    """The mutant's file with its one change made; MutantError unless the original text occurs exactly
    once, inside `mutant.function` (its qualified name or a dotted tail of it), and the result compiles."""
    path = root / mutant.file
    if not path.is_file():
        raise MutantError(f"{mutant.file} does not exist")
    source = path.read_text()
    count = source.count(mutant.original)
    if count != 1:
        raise MutantError(f"the original text occurs {count} times in {mutant.file}, not once")
    if mutant.replacement == mutant.original:
        raise MutantError("the replacement is the original text")
    start = source.count("\n", 0, source.index(mutant.original)) + 1
    end = start + mutant.original.count("\n")
    spans = [span for name, found in _function_spans(source).items()
             if name == mutant.function or name.endswith("." + mutant.function) for span in found]
    if not spans:
        raise MutantError(f"{mutant.file} has no function {mutant.function}")
    if not any(first <= start and end <= last for first, last in spans):
        raise MutantError(f"the original text (line {start}) is not inside {mutant.function}")
    mutated = source.replace(mutant.original, mutant.replacement, 1)
    try:
        compile(mutated, str(path), "exec")
    except SyntaxError as err:
        raise MutantError(f"the mutated {mutant.file} does not compile: {err}") from None
    return mutated


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def tree_files(root: Path) -> list[str]:
    """The working tree's files: tracked and untracked-but-not-ignored (git), else every file but
    caches and build outputs."""
    listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed.returncode == 0 and (root / ".git").exists():
        return sorted({f for f in listed.stdout.split("\0") if f and (root / f).is_file()})
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "build"}
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(root).parts)
                  and not any(part.endswith(".egg-info") for part in p.parts))


def make_copy(root: Path, dest: Path, dirs: dict[str, str]) -> Path:
    """The working tree copied to `dest`, with `_pkg/<package path>` linked to each package folder;
    returns `_pkg`."""
    for name in tree_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target, follow_symlinks=False)
    pkg = dest / "_pkg"
    for package, folder in dirs.items():
        link = pkg.joinpath(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(dest / folder, link.parent), target_is_directory=True)
    return pkg


def _first_failure(log: str) -> str:
    for line in log.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split(" ", 1)[1]
    return "a test failed"


def _error_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.startswith(("ERROR", "E ", "Interrupted"))]
    return lines[0][:200] if lines else "see the log"


def run_mutant(mutant: Mutant, root: Path, work: Path, timeout: float = TIMEOUT, unmutated: bool = False) -> Result:
    """Applies `mutant` to a fresh copy of `root` in `work` and runs its tests there; `unmutated`: the
    same copy and tests without the change (they must pass: 'survived')."""
    began = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)

    def result(status: str, detail: str) -> Result:
        return Result(mutant.name, status, time.perf_counter() - began, detail)

    try:
        dirs = package_dirs(root)
        mutated = mutated_source(mutant, root)
    except MutantError as err:
        return result("error", str(err))
    if unmutated:
        mutated = (root / mutant.file).read_text()
    tree = work / "tree"
    pkg = make_copy(root, tree, dirs)
    (tree / mutant.file).write_text(mutated)
    plugin_dir = work / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    report = work / "check.json"
    check = {"module": module_of(mutant.file, dirs), "pkg": str(pkg), "report": str(report),
             "sha256": hashlib.sha256(mutated.encode()).hexdigest()}
    env = {**os.environ, "TRISKELE_MUTANT": json.dumps(check), "PYTHONPATH": os.pathsep.join(
        [str(pkg), str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])])}
    command = [sys.executable, *PYTEST, "-p", PLUGIN, *mutant.tests, *(["-k", mutant.k] if mutant.k else [])]
    log_path = work / "pytest.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return result("error", f"timed out after {timeout:.0f} s")
    log = log_path.read_text(errors="replace")
    checked = json.loads(report.read_text()) if report.is_file() else None
    if checked is not None and not checked["ok"]:
        return result("error", checked["reason"])
    if code == 5 or (checked is not None and checked["collected"] == 0):
        return result("error", "the selection found no tests")
    if checked is None:
        return result("error", f"pytest exited {code} before the import check: {_error_line(log)}")
    if code == 1:
        return result("killed", _first_failure(log))
    if code == 0:
        return result("survived", "every selected test passed")
    return result("error", f"pytest exited {code}: {_error_line(log)}")


def default_base(root: Path) -> str:
    """origin/main where the checkout has it, else HEAD~1, else HEAD."""
    for rev in ("origin/main", "HEAD~1"):
        if _git(root, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}").returncode == 0:
            return rev
    return "HEAD"


def changed_files(root: Path, rev: str) -> set[str]:
    """Files that differ between the working tree and the merge base of `rev` and HEAD, and untracked ones."""
    base = _git(root, "merge-base", rev, "HEAD")
    if base.returncode != 0:
        raise MutantError(f"git cannot compare with {rev!r}: {base.stderr.strip()}")
    diff = _git(root, "diff", "--name-only", base.stdout.strip())
    untracked = _git(root, "ls-files", "--others", "--exclude-standard")
    return {line for line in (diff.stdout + untracked.stdout).splitlines() if line}


def covers(mutant: Mutant, changed: set[str]) -> bool:
    """Whether a change to `changed` can change the mutant's outcome: its file or a test file it runs."""
    test_files = {t.split("::")[0] for t in mutant.tests}
    return mutant.file in changed or bool(test_files & changed)


def list_text(mutants: Sequence[Mutant]) -> str:
    lines = []
    for m in mutants:
        selection = " ".join([*m.tests, *([f"-k '{m.k}'"] if m.k else [])])
        lines += [f"{m.name}  {m.file}::{m.function}", f"    {selection}", f"    {m.why}"]
    return "\n".join(lines)


def table(results: Sequence[Result], wall: float, jobs: int) -> str:
    width = max([len("mutant"), *(len(r.name) for r in results)])
    lines = [f"{'mutant':<{width}}  {'result':<8}  {'seconds':>7}  detail"]
    lines += [f"{r.name:<{width}}  {r.status:<8}  {r.seconds:7.1f}  {r.detail}" for r in results]
    counts = {s: sum(r.status == s for r in results) for s in ("killed", "survived", "error")}
    lines.append(f"{len(results)} mutants: {counts['killed']} killed, {counts['survived']} survived, "
                 f"{counts['error']} errors; {sum(r.seconds for r in results):.0f} s of runs, "
                 f"{wall:.0f} s wall with --jobs {jobs}")
    return "\n".join(lines)


def run_all(mutants: Sequence[Mutant], root: Path, jobs: int = 1, timeout: float = TIMEOUT,
            keep: bool = False, baseline: bool = False) -> list[Result]:
    """Every mutant, `jobs` at a time, each in its own copy under one temporary folder (kept with `keep`);
    `baseline`: first its tests without the change, a failure there making the mutant an error."""
    scratch = Path(tempfile.mkdtemp(prefix="triskele-mutants-"))
    done: list[Result] = []

    def outcome(work: Path, mutant: Mutant) -> Result:
        if baseline:
            before = run_mutant(mutant, root, work / "unmutated", timeout, unmutated=True)
            if before.status != "survived":
                why = before.detail if before.status == "error" else f"fails without the change: {before.detail}"
                return Result(mutant.name, "error", before.seconds, why)
        return run_mutant(mutant, root, work, timeout)

    def one(index: int, mutant: Mutant) -> Result:
        got = outcome(scratch / f"{index:03d}-{mutant.name}", mutant)
        done.append(got)
        print(f"[{len(done)}/{len(mutants)}] {got.name}: {got.status} ({got.seconds:.1f} s)", file=sys.stderr,
              flush=True)
        return got

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(one, range(len(mutants)), mutants))
    finally:
        if keep:
            print(f"copies and logs kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv: Sequence[str] | None = None, mutants: Sequence[Mutant] = MUTANTS, root: Path = ROOT) -> int:
    """The command line; `mutants` and `root` are for tests of the harness itself."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--changed", nargs="?", const="", metavar="REV",
                        help="only mutants whose file or tests changed since REV (default origin/main, else HEAD~1)")
    parser.add_argument("--list", action="store_true", help="list the mutants selected, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per mutant (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep each mutant's copy and pytest log")
    parser.add_argument("--baseline", action="store_true",
                        help="first run each mutant's tests without the change: they must pass (for a new entry)")
    args = parser.parse_args(argv)
    names = [m.name for m in mutants]
    if len(set(names)) != len(names):
        parser.error(f"the list names a mutant twice: {sorted({n for n in names if names.count(n) > 1})}")
    selected = list(mutants)
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"no mutant named {', '.join(unknown)} (see --list)")
        selected = [m for m in selected if m.name in args.only]
    if args.changed is not None:
        rev = args.changed or default_base(root)
        try:
            changed = changed_files(root, rev)
        except MutantError as err:
            parser.error(str(err))
        selected = [m for m in selected if covers(m, changed)]
        print(f"{len(selected)} of {len(mutants)} mutants cover the files changed since {rev}", file=sys.stderr)
    if args.list:
        if selected:
            print(list_text(selected))
        return 0
    if not selected:
        return 0
    began = time.perf_counter()
    results = run_all(selected, root, args.jobs, args.timeout, args.keep, args.baseline)
    print(table(results, time.perf_counter() - began, args.jobs))
    return 0 if all(r.status == "killed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
