"""The engine registry: engine names to engine classes, built-ins imported lazily.

Built-in engines are listed as ``"module:Class"`` strings and imported on first use, so
naming an engine that needs an optional dependency (vLLM) costs nothing until it is
selected. Third parties call :func:`register_engine` with a class or such a string.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["EngineNotFound", "available_engines", "check_engine_options", "get_engine", "register_engine"]

#: built-in engines (``vllm`` needs the optional vLLM package, imported when selected)
_BUILTIN: dict[str, str] = {"hf": "marft_algos.engines.hf:HFEngine", "vllm": "marft_algos.engines.vllm:VLLMEngine"}
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


def check_engine_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise a clear error when ``name`` is not a registered engine or ``options`` are
    not keyword arguments its constructor takes (``get_engine(name)(policy, **options)``).

    Importing an engine's module does not import its backend (vLLM is imported when the
    engine is built), so this check is cheap.
    """
    cls = get_engine(name)
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise TypeError(f"engine options must be a mapping of option names to values, got {options!r}")
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if n not in ("self", "policy") and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"engine {name!r} takes no options {unknown}; it accepts {accepted or 'none'}")
