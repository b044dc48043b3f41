"""The engine registry: engine names to engine classes, built-ins imported lazily.

Built-in engines are listed as ``"module:Class"`` strings and imported on first use, so
naming an engine that needs an optional dependency (vLLM) costs nothing until it is
selected. Third parties call :func:`register_engine` with a class or such a string.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

__all__ = ["EngineNotFound", "available_engines", "get_engine", "register_engine"]

#: built-in engines; ``vllm`` (issue 15) will be added here
_BUILTIN: dict[str, str] = {"hf": "marft_algos.engines.hf:HFEngine"}
_REGISTRY: dict[str, Any] = dict(_BUILTIN)


class EngineNotFound(KeyError):
    """No engine is registered under the requested name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def register_engine(name: str, engine: type | str, *, override: bool = False) -> None:
    """Register ``engine`` (a :class:`~marft_algos.engines.base.GenerationEngine`
    subclass, or a lazy ``"module:Class"`` string) under ``name``."""
    if not name or not isinstance(name, str):
        raise ValueError(f"an engine name must be a non-empty string, got {name!r}")
    if isinstance(engine, str) and ":" not in engine:
        raise ValueError(f"a lazy engine must be written 'module:Class', got {engine!r}")
    if name in _REGISTRY and not override:
        raise ValueError(f"an engine named {name!r} is already registered; pass override=True to replace it")
    _REGISTRY[name] = engine


def available_engines() -> list[str]:
    """The registered engine names, sorted."""
    return sorted(_REGISTRY)


def get_engine(name: str) -> type:
    """The engine class registered under ``name`` (imported on first use).

    Build an engine with ``get_engine(name)(policy, **options)``.
    """
    try:
        entry = _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise EngineNotFound(f"no generation engine named {name!r}; available: {available_engines()}.{hint}") from None
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        _REGISTRY[name] = entry
    return entry
