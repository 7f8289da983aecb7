"""No import circles in reference_engine or rsp_bench (DEVELOPERS.md, Style): every import of a
project module, at module level or inside a function, is an edge; imports under
``if TYPE_CHECKING:`` are annotations only and are not. A package importing its own submodules
(its re-exports) is an edge like any other, so a submodule that imports its package back, at
any depth, closes a circle and fails here.

Must not import the modules it checks (it reads their source).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("reference_engine", "rsp_bench")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, name: str, path: Path, known: set[str]) -> None:
        self.package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        self.name, self.known, self.found = name, known, set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _add(self, target: str) -> None:
        if target in self.known and target != self.name:
            self.found.add(target)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = ".".join(self.package[:len(self.package) - node.level + 1])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in self.known]
        if len(submodules) < len(node.names):  # names taken from the module itself
            self._add(module)
        for sub in submodules:
            self._add(sub)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(name, path, set(modules))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        graph[name] = visitor.found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_project_has_no_import_circles() -> None:
    graph = import_graph()
    assert "rsp_bench.quality" in graph and "reference_engine.engine" in graph  # the scan found the code
    found = circles(graph)
    edges = {tuple(c): sorted((a, b) for a in c for b in graph[a] if b in c) for c in found}
    assert not found, f"import circles: {edges}"


def test_the_checker_finds_a_circle_and_ignores_annotation_only_imports() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n"
              "def f():\n    from pkg import c\n")
    visitor = _Imports("pkg.a", Path("pkg/a.py"), {"pkg", "pkg.a", "pkg.b", "pkg.c"})
    visitor.visit(ast.parse(source))
    assert visitor.found == {"pkg.c"}  # the lazy import counts, the annotation-only one does not
