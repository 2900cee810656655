"""The layout rules of docs/development.md ("Layout"), read from the source with `ast`.

Nothing here imports the package (no JAX; the whole file runs in well under a second). Every
checker takes the root of a source tree, so that each rule is also run over a small synthetic tree
written to `tmp_path` whose violations it must find (the positive controls) and whose allowed cases
it must not.

An import is every `import x` and `from x import y`, at module level or inside a function, plus
`importlib.import_module("literal")` and `__import__("literal")`; an import under
`if TYPE_CHECKING:` is not one (it never runs). A computed import (`import_module(name)`) is
allowed in two places only, and followed there: a package's `__getattr__` over its `_LAZY` table
(it imports each module the table names) and the domain registry (it imports each built-in domain,
and each `Later("module", ...)` and `inference="module"` a spec names). The import cycles include
these edges.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = ("mesh", "models", "train", "eval")
"""The four folders, each mapped to `triskele.<folder>` by pyproject.toml."""

ALLOWED_LAYERS = {
    "mesh": {"mesh"},
    "models": {"models", "mesh"},
    "train": {"train", "models", "mesh"},
    "eval": {"eval", "models", "mesh", "train"},
}
"""Imports run one way: train -> models, mesh; eval -> models, mesh, train; models -> mesh; mesh -> none."""

RUNTIME = (
    "mesh/__init__.py", "mesh/spec.py", "mesh/logical.py", "mesh/pipeline.py", "mesh/schedule.py", "mesh/batch.py",
    "mesh/chunks.py", "mesh/distributed.py",
    "models/",
    "train/config/", "train/state.py", "train/step.py", "train/optim.py", "train/checkpoints/manager.py",
    "train/run.py",
    "train/forward.py", "train/backbone.py",
)
"""The runtime modules: none of them imports the performance model, directly or through others
(a folder, `models/`, stands for every module in it)."""

PERF_PACKAGE = "triskele.mesh.perf"
"""The performance model: formulas, HLO counts, hardware, planner, roofline, run cost, published runs."""

PERF_LEGACY = ("cost", "hlo", "hardware", "planner", "roofline", "run_cost", "megatron", "transformer")
"""`triskele.mesh.<name>`: the modules the performance model was made of before it moved into
`mesh/perf/`; an import of one still counts as importing the performance model."""

DOMAIN_WORDS = ("mars", "merch", "deepfake")
"""The built-in domains' names as they appear in words (the list itself is read from the registry)."""

NAMING_EXCEPTIONS = (
    ("train/domains/__init__.py", "BUILTIN = ("),
    ("train/config/presets.py", 'DEFAULT_PRESET = "mars-tiny"'),
    ("train/config/schema.py", 'domain: str = "mars"'),
    ("train/config/schema.py", 'preset: str = "mars-tiny"'),
)
"""(file, text of the statement's first line): the only shared code that may name a domain, the list
of built-in domains and the default preset (the `Config` defaults that spell it)."""


# ----------------------------------------------------------------------------- reading the source


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str
    target: str
    path: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclasses.dataclass
class Tree:
    root: Path
    modules: dict[str, str]
    """module name -> path relative to the root."""
    imports: list[Import]
    computed: list[Import] = dataclasses.field(default_factory=list)
    """The computed imports, resolved (a lazy table's modules, the registry's domains and spec modules)."""
    unresolved: list[Import] = dataclasses.field(default_factory=list)
    """Computed imports outside a lazy package and the registry (`target` is the call's text)."""

    def edges(self, computed: bool = False) -> dict[str, list[Import]]:
        out: dict[str, list[Import]] = {name: [] for name in self.modules}
        for imp in [*self.imports, *(self.computed if computed else ())]:
            out.setdefault(imp.importer, []).append(imp)
        return out


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["triskele", *parts])


def source_files(root: Path) -> list[Path]:
    return sorted(p for layer in LAYERS if (root / layer).is_dir() for p in (root / layer).rglob("*.py")
                  if "__pycache__" not in p.parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_import_call(call: ast.Call) -> bool:
    func = call.func
    return bool(call.args) and ((isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")))


def _literal_import(call: ast.Call) -> str | None:
    if _is_import_call(call) and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


REGISTRY = "train/domains/__init__.py"
"""Registers the built-in domains by computed name (`BUILTIN`): followed, as edges to each."""

SPEC_VALUES = "train/domains/spec.py"
"""Loads a spec's `Later("module", ...)` values and its `inference="module"` when first read, by
computed name: not followed (a domain's code calls the shared engine, and the engine reaches the
domain's code only through its spec); `spec_value_violations` keeps each such module inside the
domain that names it."""


def spec_values(path: Path) -> list[tuple[str, int]]:
    """The modules a spec names for loading on first read: `Later("module", ...)` and `inference="module"`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "Later" and node.args and isinstance(
                node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append((node.args[0].value, node.lineno))
        out += [(kw.value.value, node.lineno) for kw in node.keywords if kw.arg == "inference"
                and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)]
    for node in ast.walk(ast.parse(path.read_text())):  # a task's fields: {"inference": "module", ...}
        if isinstance(node, ast.Dict):
            out += [(value.value, value.lineno) for key, value in zip(node.keys, node.values, strict=True)
                    if isinstance(key, ast.Constant) and key.value == "inference"
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)]
    return out


def computed_imports(root: Path, modules: dict[str, str], lazy: dict[str, dict[str, str]],
                     ) -> tuple[list[Import], list[Import]]:
    """(resolved, unresolved): every `import_module(<not a literal>)`, resolved where it is allowed."""
    resolved: list[Import] = []
    unresolved: list[Import] = []
    registry = module_name(Path(REGISTRY))
    for name, rel in modules.items():
        source = (root / rel).read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and _is_import_call(node)) or _literal_import(node) is not None:
                continue
            text = lines[node.lineno - 1].strip()
            if name in lazy:
                resolved += [Import(name, target, rel, node.lineno, text) for target in lazy[name].values()]
            elif rel == REGISTRY:
                resolved += [Import(name, f"{registry}.{domain}", rel, node.lineno, text)
                             for domain in builtin_domains(root)]
            elif rel != SPEC_VALUES:
                unresolved.append(Import(name, ast.unparse(node), rel, node.lineno, text))
    return resolved, unresolved


def spec_value_violations(tree: Tree) -> list[str]:
    """A module a spec loads on first read lies in the places of the domain whose spec names it."""
    domains = builtin_domains(tree.root)
    out = []
    for name, rel in tree.modules.items():
        owner = domain_of(name, domains)
        for target, line in spec_values(tree.root / rel):
            if owner is None or domain_of(target, domains) != owner or target not in tree.modules:
                out.append(f"{rel}:{line}: {target}  (a spec value outside {owner or 'any domain'}'s places)")
    return out


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if not level:
        return module or ""
    base = importer.split(".")
    base = base[: len(base) - (level - 1 if is_package else level)]
    return ".".join([*base, module] if module else base)




def lazy_table(path: Path) -> dict[str, str]:
    """A package's `_LAZY = {"name": "module", ...}`: `from package import name` imports that module."""
    if path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, str)}
    return {}


def read_imports(path: Path, rel: str, importer: str, known: set[str],
                 lazy: dict[str, dict[str, str]] | None = None) -> list[Import]:
    """Every import the module at `path` can run, TYPE_CHECKING blocks left out. `lazy`: each
    package's lazy table, so that `from triskele.mesh import constrain` leads to the module that
    defines it."""
    lazy = lazy or {}
    source = path.read_text()
    lines = source.splitlines()
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def add(target: str, node: ast.AST) -> None:
        found.append(Import(importer, target, rel, node.lineno, lines[node.lineno - 1].strip()))

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, importer, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base, node)
                if alias.name in lazy.get(base, {}):
                    add(lazy[base][alias.name], node)
        elif isinstance(node, ast.Call) and (target := _literal_import(node)) is not None:
            add(target, node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, filename=str(path)))
    return found


def read_tree(root: Path) -> Tree:
    files = source_files(root)
    modules = {module_name(p.relative_to(root)): p.relative_to(root).as_posix() for p in files}
    known = set(modules)
    lazy = {name: table for name, rel in modules.items() if (table := lazy_table(root / rel))}
    imports = [imp for name, rel in modules.items() for imp in read_imports(root / rel, rel, name, known, lazy)]
    computed, unresolved = computed_imports(root, modules, lazy)
    return Tree(root, modules, imports, computed, unresolved)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "triskele" and parts[1] in LAYERS else None


def builtin_domains(root: Path) -> tuple[str, ...]:
    """`BUILTIN` of train/domains/__init__.py, read as a literal."""
    tree = ast.parse((root / "train/domains/__init__.py").read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "BUILTIN" for t in targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("train/domains/__init__.py defines no BUILTIN tuple")


def domain_of(module: str, domains: tuple[str, ...]) -> str | None:
    """The domain whose three places (models/<d>.py, train/domains/<d>/, eval/domains/<d>) hold `module`."""
    for d in domains:
        if module == f"triskele.models.{d}":
            return d
        for place in (f"triskele.train.domains.{d}", f"triskele.eval.domains.{d}"):
            if module == place or module.startswith(place + "."):
                return d
    return None


# ----------------------------------------------------------------------------- the rules


def import_direction_violations(tree: Tree) -> list[str]:
    """Rule 1: each layer imports only the layers below it, and only as `triskele.<layer>`."""
    out = []
    for imp in tree.imports:
        source, top = layer_of(imp.importer), imp.target.split(".")[0]
        if top in LAYERS:
            out.append(f"{imp.where()}  (imports the folder as `{top}`, not `triskele.{top}`)")
            continue
        if top in ("bench", "tests"):
            out.append(f"{imp.where()}  (the package imports {top}/)")
            continue
        target = layer_of(imp.target)
        if source and target and target not in ALLOWED_LAYERS[source]:
            out.append(f"{imp.where()}  ({source} imports {target})")
    return out


def domain_folder_violations(tree: Tree) -> list[str]:
    """Rule 2: a domain's three places are imported only by the domain itself (the registry imports
    them by computed name, and a spec names its eval module as a string: neither is an import)."""
    domains = builtin_domains(tree.root)
    out = []
    for imp in tree.imports:
        target = domain_of(imp.target, domains)
        source = domain_of(imp.importer, domains)
        if target is not None and source != target:
            who = f"domain {source}" if source else "shared code"
            out.append(f"{imp.where()}  ({who} imports domain {target})")
    return out


def is_perf(module: str, tree: Tree) -> bool:
    if module == PERF_PACKAGE or module.startswith(PERF_PACKAGE + "."):
        return True
    return module in {f"triskele.mesh.{name}" for name in PERF_LEGACY}


def runtime_modules(tree: Tree, runtime: tuple[str, ...]) -> list[str]:
    by_path = {rel: name for name, rel in tree.modules.items()}
    out = []
    for entry in runtime:
        if entry.endswith("/"):
            out += [name for rel, name in sorted(by_path.items()) if rel.startswith(entry)]
        else:
            assert entry in by_path, f"{entry} is in RUNTIME but not in the tree: update the list"
            out.append(by_path[entry])
    return out


def perf_violations(tree: Tree, runtime: tuple[str, ...] = RUNTIME) -> list[str]:
    """Rule 3: no runtime module reaches the performance model, directly or through other modules.
    Importing `a.b.c` also runs the packages `a.b` and `a`: they are followed too."""
    edges = tree.edges()
    out = []
    for start in runtime_modules(tree, runtime):
        came: dict[str, tuple[str, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if is_perf(node, tree):
                chain, how, at = [node], [], node
                while (step := came[at]) is not None:
                    at, text = step
                    chain.append(at)
                    how.append(text)
                out.append(f"{tree.modules[start]}: {' -> '.join(reversed(chain))}  [{'; '.join(reversed(how))}]")
                break
            parts = node.split(".")
            nexts = [(imp.target, imp.where()) for imp in edges.get(node, [])]
            nexts += [(".".join(parts[:i]), f"(importing {node} runs its package)")
                      for i in range(len(parts) - 1, 1, -1)]
            for target, how in nexts:
                if target not in came:
                    came[target] = (node, how)
                    queue.append(target)
    return out


def cycles(tree: Tree) -> list[list[Import]]:
    """Rule 4: every strongly connected group of modules, given as cycles that together use each of
    its import edges (each cycle: the imports, in order, that lead from a module back to itself)."""
    edges = {name: [imp for imp in imps if imp.target in tree.modules and imp.target != name]
             for name, imps in tree.edges(computed=True).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan, iterative (no recursion limit on a deep chain)
        work = [(v, iter(edges[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            for imp in it:
                w = imp.target
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        group.append(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for name in sorted(edges):
        if name not in index:
            connect(name)

    found: list[list[Import]] = []
    seen: set[tuple[str, ...]] = set()
    for group in sorted(groups):
        members = set(group)
        inner = {n: [imp for imp in edges[n] if imp.target in members] for n in group}
        for n in group:
            for first in inner[n]:
                # shortest way back from first.target to n, inside the group
                came: dict[str, Import | None] = {first.target: None}
                queue = deque([first.target])
                while queue and n not in came:
                    node = queue.popleft()
                    for imp in inner[node]:
                        if imp.target not in came:
                            came[imp.target] = imp
                            queue.append(imp.target)
                back, at = [], n
                while (step := came[at]) is not None:
                    back.append(step)
                    at = step.importer
                cycle = [first, *reversed(back)]
                names = [imp.importer for imp in cycle]
                k = names.index(min(names))
                key = tuple(names[k:] + names[:k])
                if key not in seen:
                    seen.add(key)
                    found.append(cycle[k:] + cycle[:k])
    return found


def describe_cycle(cycle: list[Import], tree: Tree | None = None) -> str:
    """The chain of modules, then under each hop every import line that makes it (with `tree`) or the one found."""
    chain = " -> ".join([imp.importer for imp in cycle] + [cycle[0].importer])
    hops = []
    for first in cycle:
        hop = (first.importer, first.target)
        every = [*tree.imports, *tree.computed] if tree else [first]
        same = [imp for imp in every if (imp.importer, imp.target) == hop]
        hops += [f"    {imp.where()}" for imp in same]
    return "\n".join([chain, *hops])


_WORD_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_DOMAIN_PART = re.compile(r"^(?:" + "|".join(DOMAIN_WORDS) + r")s?$", re.IGNORECASE)


def names_a_domain(text: str) -> bool:
    """Whether one of the words in `text` (split at non-letters and at camelCase) is a domain's name:
    `mars_metrics`, `MarsIO`, `deepfake.eval_methods`, `"merch"` do; `marshal`, `--save-faces` do not."""
    return any(_DOMAIN_PART.match(part) for part in _WORD_PARTS.findall(text))


def _documentation(tree: ast.Module) -> set[int]:
    """ids of the string statements: docstrings (and attribute docstrings), which are not code."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def domain_naming_violations(root: Path, exceptions: tuple[tuple[str, str], ...] = NAMING_EXCEPTIONS,
                             ) -> tuple[list[str], set[tuple[str, str]]]:
    """Rule 5: no string, identifier or attribute in shared code names a domain, except `exceptions`.
    Returns the violations and the exceptions that were used."""
    domains = builtin_domains(root)
    out: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in source_files(root):
        if not domain_of(module_name(path.relative_to(root)), domains):
            out += _names_in_file(path, path.relative_to(root).as_posix(), exceptions, used)
    return sorted(set(out), key=_by_place), used


def _words(node: ast.AST, docs: set[int]) -> list[str]:
    """The strings (documentation aside), identifiers and attribute names `node` itself spells."""
    words: list[str] = []
    if isinstance(node, ast.Constant) and id(node) not in docs and isinstance(node.value, str | bytes):
        words.append(node.value if isinstance(node.value, str) else node.value.decode("latin-1"))
    for field in ("id", "attr", "name", "asname", "arg", "module", "rest"):
        if isinstance(value := getattr(node, field, None), str):
            words.append(value)
    if isinstance(node, ast.Global | ast.Nonlocal):
        words += node.names
    return words


def _names_in_file(path: Path, rel: str, exceptions: tuple[tuple[str, str], ...],
                   used: set[tuple[str, str]]) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    docs = _documentation(tree)
    out = []
    # (node, innermost statement around it): an exception matches the node's line or its statement's first
    todo: list[tuple[ast.AST, ast.stmt | None]] = [(tree, None)]
    while todo:
        node, stmt = todo.pop()
        stmt = node if isinstance(node, ast.stmt) else stmt
        for word in filter(names_a_domain, _words(node, docs)):
            line = getattr(node, "lineno", None) or stmt.lineno
            texts = (lines[line - 1], lines[stmt.lineno - 1] if stmt else "")
            allowed = {(f, p) for f, p in exceptions if f == rel and any(p in t for t in texts)}
            if allowed:
                used |= allowed
            else:
                out.append(f"{rel}:{line}: {lines[line - 1].strip()}  (names {word!r})")
        todo += [(child, stmt) for child in ast.iter_child_nodes(node)]
    return out


def _by_place(entry: str) -> tuple[str, int]:
    path, line, _ = entry.split(":", 2)
    return path, int(line)


def _report(title: str, entries: list[str]) -> str:
    return f"{title} ({len(entries)}):\n" + "\n".join(f"  {e}" for e in entries)


MAX_FUNCTION_LINES = 60
"""A function (its decorators left out, its docstring in) longer than this is split."""

MAX_TOP_LEVEL_MODULES = {"train": 15}
"""Modules at a folder's top level (`__init__.py` and `__main__.py` count); more go into subfolders."""


def long_functions(root: Path, folders: tuple[str, ...] = (*LAYERS, "bench", "tools"),
                   limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Rule 6: every function or method over `limit` lines, with its length."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else ():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    if length > limit:
                        out.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {node.name} ({length} lines)")
    return out


ISSUE_CITATION = re.compile(r"\b" + "iss" + r"ues?\s+#?\d+", re.IGNORECASE)
"""A tracker's issue number in the text (spelled apart here, so that this file does not cite one)."""


def issue_citations(root: Path, folders: tuple[str, ...] = (*LAYERS, "bench", "tools", "tests", "examples"),
                    ) -> list[str]:
    """Rule 8: code speaks of the code: no line of a source file cites an issue number."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else ():
            out += [f"{path.relative_to(root).as_posix()}:{n}: {line.strip()}"
                    for n, line in enumerate(path.read_text().splitlines(), 1) if ISSUE_CITATION.search(line)]
    return out


def _names_task(node: ast.AST) -> bool:
    """`x.task`, `x["task"]` or `x.get("task", ...)`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "task"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "task"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "task")


def task_branches(root: Path) -> list[str]:
    """Rule 9: no code compares a run's task: the registry gives each task its own spec (`Domain.tasks`)."""
    out = []
    for path in source_files(root):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and any(_names_task(n) for n in (node.left, *node.comparators)):
                out.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def crowded_folders(root: Path, limits: dict[str, int] = MAX_TOP_LEVEL_MODULES) -> list[str]:
    """Rule 7: a folder whose top level holds more modules than its limit."""
    out = []
    for folder, limit in limits.items():
        modules = sorted(p.name for p in (root / folder).glob("*.py"))
        if len(modules) > limit:
            listed = ", ".join(modules)
            out.append(f"{folder}/ holds {len(modules)} modules at its top level (at most {limit}): {listed}")
    return out


# ----------------------------------------------------------------------------- the rules on the code


def test_no_function_is_over_60_lines():
    found = long_functions(ROOT)
    assert not found, _report(f"functions over {MAX_FUNCTION_LINES} lines", found)


def test_no_source_line_cites_an_issue_number():
    found = issue_citations(ROOT)
    assert not found, _report("lines citing an issue number (say what the code does instead)", found)


def test_no_code_branches_on_a_task():
    found = task_branches(ROOT)
    assert not found, _report("comparisons of a run's task (give the task its own spec instead)", found)


def test_train_s_top_level_holds_at_most_15_modules():
    found = crowded_folders(ROOT)
    assert not found, "\n".join(found)


def test_imports_run_one_way():
    violations = import_direction_violations(read_tree(ROOT))
    assert not violations, _report("imports against the direction mesh <- models <- train <- eval", violations)


def test_a_domain_is_imported_only_by_itself():
    violations = domain_folder_violations(read_tree(ROOT))
    assert not violations, _report("imports of a domain's places from outside the domain", violations)


def test_the_performance_model_lives_in_mesh_perf():
    assert (ROOT / "mesh/perf/__init__.py").is_file(), "the performance model belongs in the package mesh/perf/"
    left = [f"mesh/{name}.py" for name in PERF_LEGACY if (ROOT / f"mesh/{name}.py").exists()]
    assert not left, f"performance-model modules still outside mesh/perf/: {left}"


def test_runtime_modules_do_not_import_the_performance_model():
    violations = perf_violations(read_tree(ROOT))
    assert not violations, _report("runtime modules that reach the performance model", violations)


def test_no_import_cycles():
    tree = read_tree(ROOT)
    found = cycles(tree)
    assert not found, f"import cycles ({len(found)}):\n" + "\n".join(describe_cycle(c, tree) for c in found)


def test_only_the_registry_and_lazy_packages_import_by_computed_name():
    found = read_tree(ROOT).unresolved
    assert not found, _report("computed imports outside the registry and the lazy packages", [i.where() for i in found])


def test_a_spec_loads_only_its_own_domain_s_modules():
    violations = spec_value_violations(read_tree(ROOT))
    assert not violations, _report("spec values loaded from outside their domain", violations)


def test_shared_code_names_no_domain():
    violations, used = domain_naming_violations(ROOT)
    assert not violations, _report("shared code that names a domain", violations)
    stale = sorted(set(NAMING_EXCEPTIONS) - used)
    assert not stale, f"NAMING_EXCEPTIONS that match nothing any more (remove them): {stale}"


# ----------------------------------------------------------------------------- positive controls


SYNTHETIC = {
    "mesh/__init__.py": "",
    "mesh/spec.py": """
        from typing import TYPE_CHECKING
        import jax
        if TYPE_CHECKING:
            from triskele.train.config import Config
            from triskele.mesh.perf import cost
        """,
    "mesh/logical.py": """
        import triskele.mesh.helper
        def f():
            from triskele.train import config
        """,
    "mesh/helper.py": "from triskele.mesh.perf.cost import flops\n",
    "mesh/distributed.py": """
        import importlib
        def start():
            importlib.import_module("triskele.eval.cli")
        """,
    "mesh/batch.py": "import models.vit\nfrom bench.common import timer\n",
    "mesh/perf/__init__.py": "",
    "mesh/perf/cost.py": "import jax\n",
    "models/__init__.py": "",
    "models/vit.py": "from triskele.mesh.spec import make_mesh\n",
    "models/mars.py": "from triskele.models.vit import ViT\n",
    "models/merch.py": "from triskele.models import vit\n",
    "models/bad.py": "def f():\n    from triskele.train.step import train_step\n",
    "train/__init__.py": "",
    "train/config/__init__.py": "",
    "train/config/presets.py": 'DEFAULT_PRESET = "mars-tiny"\n',
    "train/config/schema.py": """
        import dataclasses
        from triskele.models import vit
        @dataclasses.dataclass
        class Config:
            domain: str = "mars"
            preset: str = "mars-tiny"
            '''config.mars.stride is config.options.stride on a mars run (an attribute docstring).'''
        def get():
            from triskele.train.domains import get_domain  # mars: a comment, not code
            return get_domain
        """,
    "train/step.py": "import triskele.eval.report\n",
    "train/a.py": "import triskele.train.b\n",
    "train/b.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import triskele.train.c
        def f():
            from triskele.train import a
        """,
    "train/c.py": "import triskele.train.b\n",
    "train/domains/__init__.py": """
        '''The registry: mars, merch (a docstring may name them).'''
        import importlib
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from triskele.train.config import Config
        BUILTIN = ("mars", "merch")
        def domains():
            for module in BUILTIN:
                importlib.import_module(f"{__name__}.{module}")
        """,
    "train/domains/spec.py": """
        import importlib
        class Later:
            def load(self):
                return importlib.import_module(self.module)
        """,
    "train/domains/mars/__init__.py": """
        from triskele.models.mars import Segmenter
        from triskele.train.domains import Domain
        from triskele.train.domains.mars import data
        from triskele.train.domains.merch.data import read_sku
        from triskele.train.domains.mars.prepare import prepare
        SPEC = Domain(name="mars", inference="triskele.eval.domains.mars",
                      evaluator=Later("triskele.train.domains.merch.data", "Evaluator"))
        """,
    "train/domains/mars/prepare.py": "from triskele.train.config.schema import Config\n",
    "train/plugins.py": """
        import importlib
        def load(name):
            return importlib.import_module(name)
        """,
    "train/domains/mars/data.py": "MARS_CLASSES = ('soil', 'sand')\n",
    "train/domains/merch/__init__.py": "",
    "train/domains/merch/data.py": "import marshal\n",
    "eval/__init__.py": "",
    "eval/report.py": "from triskele.train.config import Config\n",
    "eval/domains/__init__.py": "",
    "eval/domains/mars.py": "from triskele.train.domains.mars.data import MARS_CLASSES\n",
    "eval/cli.py": '''
        """Evaluates a checkpoint (mars' stride lives in its spec)."""
        import marshal
        from triskele.eval.domains import mars
        FLAGS = ("--save-faces", "--stride")
        def main(args):
            if args.domain != "merch":  # a comment naming deepfake is fine
                pass
            MarsIO = args.io
            return args.deepfake.eval_methods, f"{args.x}_merch", MarsIO
        ''',
}


def write_tree(root: Path, files: dict[str, str] = SYNTHETIC) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def _lines(entries: list[str]) -> set[tuple[str, int]]:
    return {_by_place(e) for e in entries}


def test_import_direction_control(tmp_path):
    found = _lines(import_direction_violations(read_tree(write_tree(tmp_path))))
    assert found == {
        ("mesh/logical.py", 3),  # mesh -> train, inside a function
        ("mesh/distributed.py", 3),  # mesh -> eval, through importlib with a literal
        ("mesh/batch.py", 1),  # `import models.vit`: the folder, not triskele.models
        ("mesh/batch.py", 2),  # the package imports bench/
        ("models/bad.py", 2),  # models -> train
        ("train/step.py", 1),  # train -> eval
    }, found  # not: mesh/spec.py's TYPE_CHECKING imports, models -> mesh, train -> models, eval -> train


def test_domain_folders_control(tmp_path):
    found = _lines(domain_folder_violations(read_tree(write_tree(tmp_path))))
    assert found == {
        ("train/domains/mars/__init__.py", 4),  # one domain imports another
        ("eval/cli.py", 3),  # shared code imports a domain's eval module
    }, found
    # not: the registry's computed import, the spec's evaluation string, mars' train folder importing
    # models/mars.py and itself, eval/domains/mars.py importing its own train folder


def test_performance_model_control(tmp_path):
    runtime = ("mesh/spec.py", "mesh/logical.py", "mesh/batch.py", "models/", "train/step.py")
    found = perf_violations(read_tree(write_tree(tmp_path)), runtime)
    assert [e.split(":")[0] for e in found] == ["mesh/logical.py"], found
    assert "triskele.mesh.logical -> triskele.mesh.helper -> triskele.mesh.perf.cost" in found[0], found
    # an import of the model inside a function counts
    files = {**SYNTHETIC, "train/state.py": "def f():\n    import triskele.mesh.perf\n"}
    found = perf_violations(read_tree(write_tree(tmp_path / "fn", files)), ("train/state.py",))
    assert [e.split(":")[0] for e in found] == ["train/state.py"], found
    # importing a module runs its parent packages: one that imports the model is reached
    files = {**SYNTHETIC, "train/tools/__init__.py": "from triskele.mesh.perf import cost\n",
             "train/tools/plan.py": "", "train/state.py": "from triskele.train.tools.plan import pick\n"}
    found = perf_violations(read_tree(write_tree(tmp_path / "parent", files)), ("train/state.py",))
    assert [e.split(":")[0] for e in found] == ["train/state.py"], found
    assert "triskele.train.tools" in found[0], found
    # `from triskele.mesh import flops` through the package's lazy table reaches the module it names
    files = {**SYNTHETIC, "mesh/__init__.py": '_LAZY = {"flops": "triskele.mesh.perf.cost"}\n',
             "train/state.py": "from triskele.mesh import flops\n"}
    found = perf_violations(read_tree(write_tree(tmp_path / "lazy", files)), ("train/state.py",))
    assert [e.split(":")[0] for e in found] == ["train/state.py"], found
    # mesh/spec.py's TYPE_CHECKING import of the model does not count
    assert not perf_violations(read_tree(write_tree(tmp_path / "tc")), ("mesh/spec.py",))


def test_cycles_control(tmp_path):
    found = cycles(read_tree(write_tree(tmp_path)))
    chains = sorted(describe_cycle(c).splitlines()[0] for c in found)
    # a -> b -> a through b's function-level import; c -> b only under TYPE_CHECKING back: no cycle
    # with c. The circle a bare Config() once ran: the config looks a domain up in the registry, the
    # registry imports each built-in domain by computed name, and a domain's preparation imports the
    # config; and a domain whose spec imports the registry that registers it.
    assert chains == [
        "triskele.train.a -> triskele.train.b -> triskele.train.a",
        "triskele.train.config.schema -> triskele.train.domains -> triskele.train.domains.mars -> "
        "triskele.train.domains.mars.prepare -> triskele.train.config.schema",
        "triskele.train.domains -> triskele.train.domains.mars -> triskele.train.domains",
    ], chains
    text = describe_cycle(found[0], read_tree(tmp_path))
    assert "train/b.py:5: from triskele.train import a" in text, text
    assert "train/a.py:1: import triskele.train.b" in text, text


def test_long_functions_and_crowded_folders_control(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    files = {**SYNTHETIC, "bench/long.py": f"def fits():\n{body}\n\n\ndef too_long():\n{body}\n    return x0\n",
             **{f"train/m{i}.py": "" for i in range(12)}}
    root = write_tree(tmp_path, files)
    assert long_functions(root) == ["bench/long.py:63: too_long (61 lines)"]
    found = crowded_folders(root)
    assert len(found) == 1 and found[0].startswith("train/ holds 18 modules at its top level (at most 15)"), found


def test_task_branches_control(tmp_path):
    files = {**SYNTHETIC, "eval/tasks.py": """
        def pick(config, meta):
            if config.options.task == "shelf":
                return 1
            if meta["options"].get("task") != "recognition" or meta["task"] in ("a", "b"):
                return 2
            return {"task": config.options.task}
        """}
    found = task_branches(write_tree(tmp_path, files))
    assert [entry.split(": ")[0] for entry in found] == ["eval/tasks.py:2", "eval/tasks.py:4", "eval/tasks.py:4"], found


def test_issue_citations_control(tmp_path):
    cited = "Iss" + "ue 30"
    text = f'"""Shelves ({cited.lower()} item 2)."""\n# as {cited} asked\nissued = 3\n'
    files = {**SYNTHETIC, "tests/test_x.py": text}
    found = issue_citations(write_tree(tmp_path, files))
    assert [entry.split(": ")[0] for entry in found] == ["tests/test_x.py:1", "tests/test_x.py:2"], found


def test_computed_imports_control(tmp_path):
    tree = read_tree(write_tree(tmp_path))
    assert [imp.where() for imp in tree.unresolved] == ["train/plugins.py:3: return importlib.import_module(name)"]
    registered = sorted(imp.target for imp in tree.computed if imp.importer == "triskele.train.domains")
    assert registered == ["triskele.train.domains.mars", "triskele.train.domains.merch"], registered
    found = spec_value_violations(tree)
    assert found == ["train/domains/mars/__init__.py:7: triskele.train.domains.merch.data  "
                     "(a spec value outside mars's places)"], found


def test_domain_naming_control(tmp_path):
    root = write_tree(tmp_path)
    found, used = domain_naming_violations(root)
    assert _lines(found) == {
        ("eval/cli.py", 3),  # `from triskele.eval.domains import mars`
        ("eval/cli.py", 6),  # "merch"
        ("eval/cli.py", 8),  # MarsIO
        ("eval/cli.py", 9),  # MarsIO, deepfake.eval_methods, f"..._merch"
    }, found  # not: docstrings, comments, marshal, --save-faces, the domains' own places, the exceptions
    assert any("'deepfake'" in e for e in found) and any("'_merch'" in e for e in found), found
    assert used == set(NAMING_EXCEPTIONS), used
    # an exception covers its own statement only: the default preset spelled elsewhere is named
    files = {**SYNTHETIC, "train/run.py": 'PRESET = "mars-tiny"\n'}
    found, _ = domain_naming_violations(write_tree(tmp_path / "more", files))
    assert ("train/run.py", 1) in _lines(found), found
    assert names_a_domain("mars_metrics") and names_a_domain("DeepfakeIO") and names_a_domain("deepfakes")
    assert not names_a_domain("marshal") and not names_a_domain("--save-faces") and not names_a_domain("Marsaglia")
