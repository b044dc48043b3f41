"""Load a ``benchmarks/<name>.py`` script as a module (the scripts are not a package's public API)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["REPO", "load_benchmark"]

REPO = Path(__file__).resolve().parents[2]


def load_benchmark(name: str, module_name: str | None = None) -> ModuleType:
    """Execute ``benchmarks/<name>.py`` as module ``module_name`` (default ``_bench_<name>``), registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(module_name or f"_bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
