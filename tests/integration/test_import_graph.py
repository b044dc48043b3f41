"""No import circle in ``marft_envs`` or ``marft_algos``, nor through both.

The graph is read from the source with ``ast``: an edge A -> B for every ``import`` of a
module B of either package by module A, wherever it is written: at module level, inside
functions (a deferred import only hides a circle from Python's import machinery: the
modules still depend on each other) and under ``if TYPE_CHECKING:`` (annotations are a
dependency too, and a circle through them is the same knot for a reader and a type
checker). ``from pkg import name`` is an edge to the submodule ``pkg.name`` when there is
one, else to ``pkg`` (its ``__init__``). Importing ``pkg.sub`` is not counted as an import
of ``pkg``'s ``__init__`` (every module would then sit in a circle with its package).
Lazy ``"module:Class"`` strings (the algorithm and tool registries, package
``__getattr__`` re-exports) are not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (REPO / "marft_envs", REPO / "marft_algos")

def _modules(*pkgs: Path) -> dict[str, Path]:
    out = {}
    for pkg in pkgs:
        for path in pkg.rglob("*.py"):
            parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules that module ``name`` imports anywhere in its source (TYPE_CHECKING included)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package[: len(package) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    found.add(sub)  # `from pkg import module`
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def import_graph(*pkgs: Path) -> dict[str, set[str]]:
    """module -> the modules of ``pkgs`` it imports (both packages by default)."""
    known = _modules(*(pkgs or PACKAGES))
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


def _shown(found: list[list[str]]) -> str:
    return "; ".join(" <-> ".join(c) for c in found)


def test_cycle_finder_sees_deferred_type_checking_and_cross_package_edges(tmp_path: Path) -> None:
    envs, algos = tmp_path / "marft_envs", tmp_path / "marft_algos"
    for pkg in (envs, algos):
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
    (algos / "a.py").write_text("from marft_algos import b\n")
    (algos / "b.py").write_text("def f():\n    from marft_algos.c import x\n")  # deferred
    (algos / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import marft_algos.a\n")
    (algos / "d.py").write_text("from .c import y\nimport marft_envs.e\n")  # relative, cross-package
    (envs / "e.py").write_text("def g():\n    from marft_algos import d\n")
    (envs / "f.py").write_text("x = 'marft_algos.a:A'\n")  # a lazy string is no import
    g = import_graph(envs, algos)
    assert g["marft_algos.b"] == {"marft_algos.c"}
    assert g["marft_algos.c"] == {"marft_algos.a"}
    assert g["marft_algos.d"] == {"marft_algos.c", "marft_envs.e"}
    assert g["marft_envs.f"] == set()
    assert cycles(g) == [["marft_algos.a", "marft_algos.b", "marft_algos.c"], ["marft_algos.d", "marft_envs.e"]]


def test_both_packages_are_in_the_graph() -> None:
    g = import_graph()
    assert {"marft_envs.tools.base", "marft_envs.envs", "marft_algos.records", "marft_algos.rollout"} <= set(g)
    assert "marft_envs.testing" in g["marft_algos.rollout"]  # an edge across the packages


def test_no_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, (
        "import circles (break them with a lazy 'module:attr' lookup, a Protocol, or a new module): " + _shown(found)
    )
