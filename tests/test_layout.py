"""The package's architecture, pinned by reading its sources (``ast`` and text; nothing of fuse_attn is imported).

* No import cycle among fuse_attn's modules. Every ``import`` and ``from ... import`` counts, at module level and
  inside functions. ``from P import n`` is an import of module ``P.n`` where that is a module, else of ``P``; where
  ``P`` is a package whose ``__init__`` only re-exports ``n`` (``from P.sub import n``), of the module defining
  ``n`` (``P.sub``), so a package's ``__init__`` importing its own submodules makes no cycle with them, while
  ``P.sub -> P -> P.sub`` for a name ``P/__init__.py`` defines itself is one. ``import a.b.c`` imports ``a.b.c``
  (its parent packages are then initialized, or already being initialized: no edge to them).
* No private name crosses modules: no ``from fuse_attn.a import _x`` and no ``a._x`` on an imported fuse_attn
  module (``_x`` one leading underscore; dunders are public).
* Layers: ``fuse_attn/kernels/`` imports only ``fuse_attn.spec``, ``fuse_attn.score_program``,
  ``fuse_attn.settings`` and ``fuse_attn.kernels.*`` (not the graph side, the backend, reports, export or
  dump_graph); ``spec.py``, ``score_program.py`` and ``settings.py`` import nothing of ``fuse_attn.graph`` or
  ``fuse_attn.kernels``.
* The package's text (comments and docstrings too) cites no benchmark folder (``benchmarks/20...``), log file
  (``name.log``) or date (``YYYY-MM-DD``): today's measurements live in docs/performance.md and
  benchmarks/results.csv, their history in git, and the code says what holds now.

Each checker takes ``{path relative to the repository root: text}`` and returns one line per problem (file:line and
the names); ``test_checker_*`` feed them small synthetic packages, so a checker that finds nothing cannot pass
for the wrong reason.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fuse_attn"

KERNELS = "fuse_attn.kernels"
# what fuse_attn/kernels/ may import besides fuse_attn.kernels.*
KERNELS_MAY_IMPORT = ("fuse_attn.spec", "fuse_attn.score_program", "fuse_attn.settings")
# the modules below the graph side and the kernels, and what they may not import
LOW_LAYER = ("fuse_attn.spec", "fuse_attn.score_program", "fuse_attn.settings")
LOW_LAYER_MAY_NOT_IMPORT = ("fuse_attn.graph", "fuse_attn.kernels")


def read_package(root: Path = ROOT, package: str = PACKAGE) -> dict[str, str]:
    """``{path relative to root: text}`` of every text file under the package (``__pycache__`` skipped)."""
    sources = {}
    for path in sorted((root / package).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            sources[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # not text
            continue
    return sources


def module_name(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@dataclasses.dataclass(frozen=True)
class Imported:
    """One name an import statement binds: ``import module`` (name None) or ``from module import name``."""

    path: str
    line: int
    module: str  # absolute
    name: str | None
    bound: str  # the local name it binds
    binds: str  # the dotted name that local name refers to

    def statement(self) -> str:
        return f"import {self.module}" if self.name is None else f"from {self.module} import {self.name}"


class Package:
    """The Python modules of ``sources`` (``{path: text}``), parsed, and what each imports."""

    def __init__(self, sources: dict[str, str], package: str = PACKAGE):
        self.package = package
        self.paths = {module_name(p): p for p in sources if p.endswith(".py")}
        self.packages = {m for m, p in self.paths.items() if p.endswith("__init__.py")}
        self.trees = {m: ast.parse(sources[p], filename=p) for m, p in self.paths.items()}
        self.imports = {m: list(self._imports(m)) for m in self.paths}

    def _imports(self, module: str):
        path = self.paths[module]
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    # import a.b.c binds a (to a); import a.b.c as x binds x (to a.b.c)
                    binds = alias.name if alias.asname else alias.name.split(".")[0]
                    yield Imported(path, node.lineno, alias.name, None, alias.asname or binds, binds)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, node.module, node.level)
                for alias in node.names:
                    yield Imported(path, node.lineno, base, alias.name, alias.asname or alias.name, f"{base}.{alias.name}")

    def _absolute(self, module: str, name: str | None, level: int) -> str:
        if level == 0:
            return name or ""
        parts = module.split(".") if module in self.packages else module.split(".")[:-1]
        parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([name] if name else []))

    def ours(self, name: str) -> bool:
        return within(name, self.package)

    def target(self, imp: Imported) -> str | None:
        """The module of ours the statement imports (``P.n`` where that is a module, else ``P``), or None."""
        if imp.name is not None and imp.name != "*" and f"{imp.module}.{imp.name}" in self.paths:
            return f"{imp.module}.{imp.name}"
        return imp.module if imp.module in self.paths else None

    def defining_module(self, module: str, name: str, seen=()) -> str:
        """Where ``from module import name`` really gets ``name``: through re-exports of a package's ``__init__``
        (``from P.sub import name`` at its top level) to the module that defines it."""
        if module not in self.packages or module in seen:
            return module
        for node in top_level(self.trees[module]):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self._absolute(module, node.module, node.level)
                        imp = Imported(self.paths[module], node.lineno, source, alias.name, name, f"{source}.{alias.name}")
                        target = self.target(imp)
                        if target is None:
                            return module
                        if target != source:  # a submodule
                            return target
                        return self.defining_module(target, alias.name, seen + (module,))
        return module

    def edges(self):
        """(importer, imported module, the statement) for every import of one of our modules by another."""
        for module, imports in self.imports.items():
            for imp in imports:
                target = self.target(imp)
                if target is None:
                    continue
                if target == imp.module and imp.name not in (None, "*"):
                    target = self.defining_module(target, imp.name)
                if target != module:
                    yield module, target, imp


def top_level(tree: ast.Module):
    """The statements run when the module is imported (inside ``if`` / ``try`` too, not in functions or classes)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending[:0] = [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]


def import_cycles(sources: dict[str, str], package: str = PACKAGE) -> list[str]:
    """One entry per strongly connected set of modules: a cycle through them and every import inside the set."""
    pkg = Package(sources, package)
    graph: dict[str, dict[str, list[Imported]]] = {m: {} for m in pkg.paths}
    for importer, imported, imp in pkg.edges():
        graph[importer].setdefault(imported, []).append(imp)
    problems = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        start = min(component)
        cycle = shortest_cycle(graph, start, members)
        lines = [f"import cycle among {', '.join(sorted(component))}: {' -> '.join(cycle)}"]
        for importer in sorted(members):
            for imported in sorted(set(graph[importer]) & members):
                statements: dict[tuple, list[str]] = {}  # (line, module) -> the names one statement imports
                for imp in graph[importer][imported]:
                    statements.setdefault((imp.line, imp.module), []).append(imp.name or "")
                for (line, source), names in sorted(statements.items()):
                    statement = f"from {source} import {', '.join(names)}" if names[0] else f"import {source}"
                    lines.append(f"    {pkg.paths[importer]}:{line}: {statement}  ({importer} -> {imported})")
        problems.append("\n".join(lines))
    return problems


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def shortest_cycle(graph: dict[str, dict], start: str, members: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself through ``members`` (breadth first)."""
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(set(graph[node]) & members):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [start]


def private_imports(sources: dict[str, str], package: str = PACKAGE) -> list[str]:
    """``from <ours> import _x`` and ``<module of ours>._x``, one line each (file:line, the name)."""
    pkg = Package(sources, package)
    problems = []
    for module, imports in pkg.imports.items():
        bindings = {}  # local name -> our module it is bound to
        for imp in imports:
            if not pkg.ours(imp.module):
                continue
            if imp.name is not None and is_private(imp.name):
                problems.append(f"{imp.path}:{imp.line}: {imp.statement()} (a private name of {imp.module})")
            if imp.binds in pkg.paths:  # a module of ours
                bindings[imp.bound] = imp.binds
        for node in ast.walk(pkg.trees[module]):
            if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
                continue
            owner = attribute_module(node.value, bindings, pkg)
            if owner is not None and owner != module:
                problems.append(f"{pkg.paths[module]}:{node.lineno}: {owner}.{node.attr} (a private name of {owner})")
    return sorted(set(problems))


def attribute_module(node: ast.expr, bindings: dict[str, str], pkg: Package) -> str | None:
    """The module of ours that ``node`` (``name`` or ``name.attr...``) names through ``bindings``, or None."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bindings:
        return None
    module = bindings[node.id]
    for attr in reversed(attrs):
        module = f"{module}.{attr}"
        if module not in pkg.paths:
            return None
    return module if module in pkg.paths else None


def layer_breaks(sources: dict[str, str], package: str = PACKAGE) -> list[str]:
    """Imports across the layers: fuse_attn/kernels/ of anything but spec, score_program, settings and
    fuse_attn.kernels.*; spec, score_program and settings of fuse_attn.graph or fuse_attn.kernels."""
    pkg = Package(sources, package)
    problems = []
    for module, imports in pkg.imports.items():
        for imp in imports:
            if not pkg.ours(imp.module):
                continue
            target = pkg.target(imp) or (f"{imp.module}.{imp.name}" if imp.name not in (None, "*") else imp.module)
            if within(module, KERNELS):
                if not (within(target, KERNELS) or target in KERNELS_MAY_IMPORT):
                    problems.append(f"{imp.path}:{imp.line}: {imp.statement()} (fuse_attn/kernels/ may import only "
                                    f"{', '.join(KERNELS_MAY_IMPORT)} and {KERNELS}.*)")
            elif module in LOW_LAYER:
                if any(within(target, upper) for upper in LOW_LAYER_MAY_NOT_IMPORT):
                    problems.append(f"{imp.path}:{imp.line}: {imp.statement()} ({module} may import nothing of "
                                    f"{' or '.join(LOW_LAYER_MAY_NOT_IMPORT)})")
    return sorted(problems)


# A file name ending in .log: not an attribute or a call (torch.log(x), aten.log.default, logger.log(...)), nor a
# module's log function named in prose (tl.log, math.log).
LOG_FILE = re.compile(r"(?<![\w./\-])[\w\-/.]*[\w\-]\.log\b(?![\w(]|\.\w)")
LOG_FUNCTION_OWNERS = {"torch", "tl", "math", "np", "numpy", "aten", "log", "logger", "logging", "libdevice", "triton"}


def log_file(line: str) -> str | None:
    for found in LOG_FILE.finditer(line):
        stem = found.group(0)[: -len(".log")]
        if re.split(r"[./]", stem)[-1] not in LOG_FUNCTION_OWNERS:
            return found.group(0)
    return None


def searcher(pattern: str):
    compiled = re.compile(pattern)
    return lambda line: (found := compiled.search(line)) and found.group(0).rstrip(".")


HISTORY = {
    "a benchmark folder": searcher(r"benchmarks/20[\w\-./]*"),
    "a log file": log_file,
    "a date": searcher(r"20\d\d-\d\d-\d\d"),
}


def history_citations(sources: dict[str, str]) -> list[str]:
    """Every line of the package's text that cites a benchmark folder, a log file or a date."""
    problems = []
    for path, text in sorted(sources.items()):
        for number, line in enumerate(text.splitlines(), 1):
            found = [f"{what} ({text!r})" for what, find in HISTORY.items() if (text := find(line))]
            if found:
                problems.append(f"{path}:{number}: {', '.join(found)}: {line.strip()}")
    return problems


# ---- the checkers on small synthetic packages ---------------------------------------------------------------------
def package(modules: dict[str, str]) -> dict[str, str]:
    """``{path: text}`` of a synthetic fuse_attn: ``{"kernels/ops": text}`` is fuse_attn/kernels/ops.py's text
    (fuse_attn/__init__.py is empty unless given as ``"__init__"``)."""
    return {"fuse_attn/__init__.py": "", **{f"fuse_attn/{name}.py": text for name, text in modules.items()}}


CYCLES = {
    "two modules": (package({"a": "from fuse_attn.b import f\n", "b": "from fuse_attn import a\n"}),
                    ["fuse_attn.a -> fuse_attn.b -> fuse_attn.a", "fuse_attn/a.py:1: from fuse_attn.b import f",
                     "fuse_attn/b.py:1: from fuse_attn import a"]),
    "inside a function": (package({"a": "import fuse_attn.b\n", "b": "def f():\n    import fuse_attn.c\n",
                                   "c": "from fuse_attn.a import x\n"}),
                          ["fuse_attn.a -> fuse_attn.b -> fuse_attn.c -> fuse_attn.a",
                           "fuse_attn/b.py:2: import fuse_attn.c"]),
    "relative": (package({"k/__init__": "", "k/a": "from .b import g\n", "k/b": "from . import a\n"}),
                 ["fuse_attn.k.a -> fuse_attn.k.b -> fuse_attn.k.a", "fuse_attn/k/b.py:1: from fuse_attn.k import a"]),
    # k.b takes f from the package, whose __init__ re-exports it from k.a: the cycle is k.a's and k.b's
    "through a re-export": (package({"k/__init__": "from fuse_attn.k.a import f\n", "k/a": "from fuse_attn.k.b import g\n",
                                     "k/b": "def h():\n    from fuse_attn.k import f\n"}),
                            ["fuse_attn.k.a -> fuse_attn.k.b -> fuse_attn.k.a",
                             "fuse_attn/k/b.py:2: from fuse_attn.k import f"]),
    "through a name the __init__ defines": (package({"k/__init__": "from fuse_attn.k.a import f\nLIMIT = 1\n",
                                                     "k/a": "from fuse_attn.k import LIMIT\n"}),
                                            ["fuse_attn.k -> fuse_attn.k.a -> fuse_attn.k",
                                             "fuse_attn/k/a.py:1: from fuse_attn.k import LIMIT"]),
}
NO_CYCLES = {
    "an __init__ importing its submodules": package({
        "k/__init__": "from fuse_attn.k.a import f\ntry:\n    from fuse_attn.k import b\nexcept ImportError:\n    pass\n",
        "k/a": "from fuse_attn.k.b import g\n", "k/b": "import torch\n"}),
    "submodules importing names the __init__ re-exports": package({
        "k/__init__": "from fuse_attn.k.a import f\nfrom fuse_attn.k.c import h as g\n", "k/b": "from fuse_attn.k import f, g\n",
        "k/a": "import math\n", "k/c": "def h(): pass\n"}),
    "a layered chain": package({"a": "import fuse_attn.b\n", "b": "from fuse_attn import c\n", "c": "import os\n"}),
}


@pytest.mark.parametrize("name", sorted(CYCLES))
def test_checker_reports_import_cycles(name):
    sources, expected = CYCLES[name]
    problems = import_cycles(sources)
    assert len(problems) == 1, problems
    for part in expected:
        assert part in problems[0], problems[0]


@pytest.mark.parametrize("name", sorted(NO_CYCLES))
def test_checker_reports_no_cycle_where_there_is_none(name):
    assert import_cycles(NO_CYCLES[name]) == []


PRIVATE = {
    "from-import": (package({"a": "_LIMIT = 1\n", "b": "from fuse_attn.a import _LIMIT\n"}),
                    ["fuse_attn/b.py:1: from fuse_attn.a import _LIMIT"]),
    "relative from-import in a function": (package({"k/__init__": "", "k/a": "def _f(): pass\n",
                                                    "k/b": "def g():\n    from .a import _f\n    return _f()\n"}),
                                           ["fuse_attn/k/b.py:2: from fuse_attn.k.a import _f"]),
    "module attribute": (package({"a": "_chosen = {}\n", "b": "from fuse_attn import a\n\n\ndef f():\n    return a._chosen\n"}),
                         ["fuse_attn/b.py:5: fuse_attn.a._chosen"]),
    "aliased module attribute": (package({"k/__init__": "", "k/a": "", "b": "import fuse_attn.k.a as t\nt._x = 2\n"}),
                                 ["fuse_attn/b.py:2: fuse_attn.k.a._x"]),
    "dotted module attribute": (package({"k/__init__": "", "k/a": "", "b": "import fuse_attn.k.a\nprint(fuse_attn.k.a._x)\n"}),
                                ["fuse_attn/b.py:2: fuse_attn.k.a._x"]),
}
NOT_PRIVATE = {
    "dunders and public names": package({"a": "X = 1\n", "b": "from fuse_attn.a import X, __doc__\nfrom fuse_attn import a\n"
                                                               "print(a.__name__, a.X)\n"}),
    "own private names and other packages'": package({"a": "import torch\n_x = 1\nprint(torch._C, _x)\n",
                                                      "b": "from torch._dynamo import config\nfrom torch import _inductor\n"}),
    "a private attribute of a class or an object": package({"a": "class C:\n    _n = 1\n",
                                                            "b": "from fuse_attn.a import C\nprint(C._n, C()._n)\n"}),
}


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_checker_reports_private_names_across_modules(name):
    sources, expected = PRIVATE[name]
    problems = private_imports(sources)
    assert [p.split(" (")[0] for p in problems] == expected, problems


@pytest.mark.parametrize("name", sorted(NOT_PRIVATE))
def test_checker_reports_no_private_name_where_there_is_none(name):
    assert private_imports(NOT_PRIVATE[name]) == []


LAYER_BREAKS = {
    "kernels import the graph side": (package({"kernels/__init__": "", "graph/__init__": "", "graph/rewrite": "",
                                               "kernels/ops": "def f():\n    from fuse_attn.graph import rewrite\n"}),
                                      ["fuse_attn/kernels/ops.py:2: from fuse_attn.graph import rewrite"]),
    "kernels import the backend": (package({"kernels/__init__": "", "kernels/generated/__init__": "", "backend": "",
                                            "kernels/generated/launch": "import fuse_attn.backend\n"}),
                                   ["fuse_attn/kernels/generated/launch.py:1: import fuse_attn.backend"]),
    "kernels import the top package's names": (package({"kernels/__init__": "from fuse_attn import collect_reports\n",
                                                        "report": ""}),
                                               ["fuse_attn/kernels/__init__.py:1: from fuse_attn import collect_reports"]),
    "kernels import reports": (package({"kernels/__init__": "", "kernels/a": "from fuse_attn import report\n", "report": ""}),
                               ["fuse_attn/kernels/a.py:1: from fuse_attn import report"]),
    "spec imports the kernels": (package({"spec": "from fuse_attn.kernels import plan\n", "kernels/__init__": "",
                                          "kernels/plan": ""}),
                                 ["fuse_attn/spec.py:1: from fuse_attn.kernels import plan"]),
    "settings imports the graph side": (package({"settings": "def f():\n    import fuse_attn.graph.nodes\n",
                                                 "graph/__init__": "", "graph/nodes": ""}),
                                        ["fuse_attn/settings.py:2: import fuse_attn.graph.nodes"]),
}
NO_LAYER_BREAKS = {
    "kernels import the low layer and each other": package({
        "kernels/__init__": "from fuse_attn.kernels.ops import f\n", "spec": "from fuse_attn import settings\n",
        "settings": "", "score_program": "import fuse_attn.spec\n", "kernels/plan": "",
        "kernels/ops": "from fuse_attn import settings\nfrom fuse_attn.spec import AttentionSpec\n"
                       "import fuse_attn.score_program\nfrom fuse_attn.kernels import plan\n"}),
    "the graph side imports the kernels": package({"graph/__init__": "", "kernels/__init__": "", "kernels/plan": "",
                                                   "graph/rewrite": "from fuse_attn.kernels import plan\n"}),
}


@pytest.mark.parametrize("name", sorted(LAYER_BREAKS))
def test_checker_reports_layer_breaks(name):
    sources, expected = LAYER_BREAKS[name]
    problems = layer_breaks(sources)
    assert [p.split(" (")[0] for p in problems] == expected, problems


@pytest.mark.parametrize("name", sorted(NO_LAYER_BREAKS))
def test_checker_reports_no_layer_break_where_there_is_none(name):
    assert layer_breaks(NO_LAYER_BREAKS[name]) == []


HISTORY_LINES = {  # name: (a line, what the checker says of it)
    "a benchmark folder": ("# 1.05x on an H100 (benchmarks/2031-01-02-forward)",
                           "a benchmark folder ('benchmarks/2031-01-02-forward'), a date ('2031-01-02')"),
    "a log file": ("    (H200, plain_vs_cudnn_1k.log).", "a log file ('plain_vs_cudnn_1k.log')"),
    "a log file in a path": ("see the sweep's results/run.3.log", "a log file ('results/run.3.log')"),
    "a date": ('"""Measured 2031-01-02 (sixth session)."""', "a date ('2031-01-02')"),
    "a template's comment": ("    # ran 8% longer, with GQA 26%; BENCHMARKS.md, 2031-01-02", "a date ('2031-01-02')"),
}
NO_HISTORY = ["return torch.log(total) + top", "aten.log.default: 'log',", "log.log(level, 'ignoring %s', path)",
              "# the kernel takes tl.log and math.log of the sums", "p = math.log(f1 / f0) / math.log(d1 / d0)",
              "# BENCHMARKS.md has the measurements", "logger = logging.getLogger(__name__)", "x = 2020 - 10 - 11"]


@pytest.mark.parametrize("name", sorted(HISTORY_LINES))
def test_checker_reports_history_citations(name):
    line, what = HISTORY_LINES[name]
    path = "fuse_attn/kernels/generated/templates/t.py.tmpl" if "template" in name else "fuse_attn/a.py"
    problems = history_citations({path: f"import os\n{line}\n"})
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: {what}: "), problems


def test_checker_reports_no_history_where_there_is_none():
    assert history_citations({"fuse_attn/a.py": "\n".join(NO_HISTORY)}) == []


# ---- the real tree ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return read_package()


def test_the_real_tree_is_read(sources):
    """The checks below read the package: its modules, subpackages, imports and the kernel templates."""
    modules = Package(sources)
    assert {"fuse_attn", "fuse_attn.kernels", "fuse_attn.graph", "fuse_attn.spec"} <= set(modules.paths)
    assert len(modules.paths) > 20 and sum(1 for _ in modules.edges()) > 50
    assert any(path.endswith(".tmpl") for path in sources)


def test_no_import_cycles(sources):
    problems = import_cycles(sources)
    assert not problems, "\n".join(problems)


def test_no_private_names_across_modules(sources):
    problems = private_imports(sources)
    assert not problems, f"{len(problems)} private names used across modules:\n" + "\n".join(problems)


def test_layers(sources):
    problems = layer_breaks(sources)
    assert not problems, "\n".join(problems)


def test_no_benchmark_folders_log_files_or_dates(sources):
    problems = history_citations(sources)
    assert not problems, f"{len(problems)} lines cite history:\n" + "\n".join(problems)
