"""tools/mutation/harness.py, the mutation harness: on a toy package of its own (one mutant killed, one
surviving, two errors) and on the maintained list, which must still apply to the source as it is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tools.mutation import harness as mutants
from tools.mutation.mutant_list import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[1]

ARITH = '''def add(a, b):
    return a + b


def double(x):
    return 2 * x


class Box:
    def size(self):
        return 3
'''

TESTS = '''from toymut.core.arith import Box, add, double


def test_add():
    assert add(2, 3) == 5


def test_double_is_an_int():
    assert isinstance(double(2), int)


def test_box():
    assert Box().size() == 3
'''


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A tree laid out as the project is: pyproject's package-dir maps `toymut.core` to core/."""
    root = tmp_path / "toy"
    (root / "core").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = { "toymut.core" = "core" }\n\n'
                                         '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (root / "core" / "__init__.py").write_text("")
    (root / "core" / "arith.py").write_text(ARITH)
    (root / "core" / "other.py").write_text("def one():\n    return 1\n")
    (root / "tests" / "test_arith.py").write_text(TESTS)
    return root


def toy_mutant(name: str, original: str = "return a + b", replacement: str = "return a - b",
               function: str = "add", tests: tuple[str, ...] = ("tests/test_arith.py::test_add",),
               k: str | None = None, file: str = "core/arith.py") -> Mutant:
    return Mutant(name, file, function, original, replacement, tests, "a toy", k)


TOY = (
    toy_mutant("add-subtracts"),
    toy_mutant("double-as-sum", "return 2 * x", "return x + x", "double",
               ("tests/test_arith.py::test_double_is_an_int",)),
    toy_mutant("text-missing", "return a * b"),
    toy_mutant("no-tests-selected", k="nothing_matches"),
)


def test_the_harness_reports_killed_survived_and_errors_and_exits_1(toy, capsys):
    before = (toy / "core" / "arith.py").read_text()
    assert mutants.main(["--jobs", "2"], TOY, toy) == 1
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert rows["add-subtracts"][0] == "killed" and rows["add-subtracts"][2] == "tests/test_arith.py::test_add"
    assert rows["double-as-sum"][0] == "survived"
    assert rows["text-missing"][0] == "error" and "occurs 0 times" in " ".join(rows["text-missing"])
    assert rows["no-tests-selected"][0] == "error" and "found no tests" in " ".join(rows["no-tests-selected"])
    assert (toy / "core" / "arith.py").read_text() == before, "the tree itself is never changed"
    assert mutants.main(["--only", "add-subtracts"], TOY, toy) == 0
    assert "1 mutants: 1 killed, 0 survived, 0 errors" in capsys.readouterr().out


def test_the_child_imports_the_mutated_copy_through_pkg(toy, tmp_path):
    work = tmp_path / "work"
    method = toy_mutant("box-size", "return 3", "return 4", "Box.size", ("tests/test_arith.py::test_box",))
    assert mutants.run_mutant(method, toy, work).status == "killed"
    checked = json.loads((work / "check.json").read_text())
    assert checked["ok"] and checked["imported"] == str(work / "tree" / "_pkg" / "toymut" / "core" / "arith.py")
    assert mutants.run_mutant(method, toy, tmp_path / "unmutated", unmutated=True).status == "survived"


def test_a_mutant_must_name_text_found_once_inside_its_function_and_still_compile(toy):
    for mutant, message in ((toy_mutant("x", "return", "yield"), "occurs 3 times"),
                            (toy_mutant("x", function="double"), "not inside double"),
                            (toy_mutant("x", function="Box.add"), "has no function Box.add"),
                            (toy_mutant("x", replacement="return a +"), "does not compile"),
                            (toy_mutant("x", replacement="return a + b"), "the replacement is the original")):
        with pytest.raises(mutants.MutantError, match=message):
            mutants.mutated_source(mutant, toy)
    assert "return 4" in mutants.mutated_source(toy_mutant("x", "return 3", "return 4", "size"), toy)


def test_changed_selects_the_mutants_of_changed_files_and_their_tests(toy, capsys):
    git = ["git", "-C", str(toy), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "toy"]):
        subprocess.run([*git, *args], check=True)
    listed = (*TOY[:2], toy_mutant("other", "return 1", "return 2", "one", ("tests/test_other.py",),
                                   file="core/other.py"))
    assert mutants.main(["--changed", "--list"], listed, toy) == 0  # no commit before HEAD: against HEAD
    assert capsys.readouterr().out == ""
    (toy / "core" / "other.py").write_text("def one():\n    return 1  # edited\n")
    assert mutants.main(["--changed", "HEAD", "--list"], listed, toy) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")] == ["other"]
    (toy / "tests" / "test_arith.py").write_text(TESTS + "\n")
    assert mutants.main(["--changed", "HEAD", "--list"], listed, toy) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert names == ["add-subtracts", "double-as-sum", "other"]


def test_list_shows_every_maintained_mutant_and_only_refuses_unknown_names(capsys):
    assert mutants.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{m.name}  {m.file}::{m.function}" in out for m in MUTANTS)
    with pytest.raises(SystemExit) as refused:
        mutants.main(["--only", "no-such-mutant"])
    assert refused.value.code == 2


def test_every_maintained_mutant_applies_to_the_source_and_names_existing_tests():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    dirs = mutants.package_dirs(ROOT)
    for mutant in MUTANTS:
        mutants.mutated_source(mutant, ROOT)
        assert mutants.module_of(mutant.file, dirs), f"{mutant.name}: {mutant.file} is not in the package"
        for test in mutant.tests:
            assert (ROOT / test.split("::")[0]).is_file(), f"{mutant.name}: {test}"
