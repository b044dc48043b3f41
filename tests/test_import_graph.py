"""No import circle inside ``marft_algos``.

The graph is read from the source with ``ast``: an edge A -> B for every ``import`` of a
``marft_algos`` module B by module A, at module level AND inside functions. A deferred
import only hides a circle from Python's import machinery (the modules still depend on
each other); blocks under ``if TYPE_CHECKING:`` are left out (annotations only). Lazy
``"module:Class"`` strings (the algorithm registry, package ``__getattr__`` re-exports)
are not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "marft_algos"


def _modules(pkg: Path) -> dict[str, Path]:
    out = {}
    for path in pkg.rglob("*.py"):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The ``marft_algos`` modules that module ``name`` imports anywhere (not under TYPE_CHECKING)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit_else(child)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative import
                    parts = package[: len(package) - (child.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:
                        found.add(sub)  # `from pkg import module`
                    elif base in known:
                        found.add(base)
            visit(child)

    def visit_else(node: ast.If) -> None:
        for child in node.orelse:
            visit(ast.Module(body=[child], type_ignores=[]))

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(name)
    return found


def import_graph(pkg: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports."""
    known = _modules(pkg)
    return {name: _imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def test_cycle_finder_sees_a_circle_and_a_deferred_import(tmp_path: Path) -> None:
    pkg = tmp_path / "marft_algos"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from marft_algos import b\n")
    (pkg / "b.py").write_text("def f():\n    from marft_algos.c import x\n")
    (pkg / "c.py").write_text("import marft_algos.a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import marft_algos.d\n")
    (pkg / "d.py").write_text("from .c import y\n")
    g = import_graph(pkg)
    assert g["marft_algos.b"] == {"marft_algos.c"}
    assert g["marft_algos.d"] == {"marft_algos.c"}
    assert cycles(g) == [["marft_algos.a", "marft_algos.b", "marft_algos.c"]]


def test_no_import_circle_in_marft_algos() -> None:
    found = cycles(import_graph())
    assert not found, "import circles in marft_algos (break them with a lazy 'module:Class' lookup or a new module): " + "; ".join(
        " <-> ".join(c) for c in found
    )
