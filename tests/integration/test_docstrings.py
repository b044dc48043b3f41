"""Every public function, class and method of the two packages has a docstring.

An AST scan (nothing is imported): a def or class whose name does not start with ``_``,
at module level or in a class body (nested defs inside functions are implementation
details and are skipped), in a module whose own name does not start with ``_`` (the
benchmark scripts' ``_common.py`` is checked too: the scripts share it as an API).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("marft_envs", "marft_algos")
# The benchmark scripts are outside the packages: listed here so they stay documented too.
COMPLETE = (
    "marft_algos/cli.py",
    "marft_algos/evaluation/*.py",
    "benchmarks/*.py",
)

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _public_defs(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in body:
        if isinstance(node, _DEFS) and not node.name.startswith("_"):
            yield prefix + node.name, node
            if isinstance(node, ast.ClassDef):  # methods and nested classes; not defs inside functions
                yield from _public_defs(node.body, prefix + node.name + ".")


def missing_docstrings(paths: list[Path]) -> list[str]:
    """``path:line name`` of every public def/class without a docstring in ``paths``."""
    out = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in _public_defs(tree.body):
            if ast.get_docstring(node) is None:
                out.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    return out


def _package_modules() -> list[Path]:
    """Every module of the packages except private ones (``_runner.py``; ``__init__.py`` counts)."""
    return [
        p
        for pkg in PACKAGES
        for p in sorted((REPO / pkg).rglob("*.py"))
        if not (p.name.startswith("_") and p.name != "__init__.py")
    ]


def test_scanner_finds_what_it_should(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        '"""mod."""\n'
        "def documented():\n    '''yes'''\n"
        "def bare():\n    def inner():\n        pass\n"
        "def _private():\n    pass\n"
        "class K:\n    '''k'''\n    def method(self):\n        pass\n    def _hidden(self):\n        pass\n"
        "    @property\n    def prop(self):\n        '''p'''\n"
    )
    tree = ast.parse(src.read_text())
    names = {n for n, node in _public_defs(tree.body) if ast.get_docstring(node) is None}
    assert names == {"bare", "K.method"}


def test_docs_and_benchmark_modules_have_docstrings() -> None:
    paths = sorted({p for pattern in COMPLETE for p in REPO.glob(pattern)})
    assert len(paths) >= 8
    missing = missing_docstrings(paths)
    assert not missing, "public defs without a docstring:\n" + "\n".join(missing)


def test_every_public_def_of_the_packages_has_a_docstring() -> None:
    paths = _package_modules()
    assert len(paths) > 10
    missing = missing_docstrings(paths)
    assert not missing, f"{len(missing)} public defs without a docstring:\n" + "\n".join(missing)
