"""Helpers shared by the frozen config dataclasses of the envs (rewards, tools).

:func:`config_from_any` accepts what a user may pass for a config (the config, a dict
of its fields, or ``None`` for the defaults); :func:`check_weights` validates and
normalises a config whose fields are reward weights (finite numbers; the ``cost_*``
ones non-negative, since costs enter the reward negated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["check_weights", "config_from_any"]

C = TypeVar("C")


def config_from_any(cls: type[C], value: C | Mapping[str, Any] | None, *, name: str, expected: str) -> C:
    """``value`` as a ``cls``: itself, ``cls(**value)`` (unknown keys rejected with the
    valid ones) or ``cls()`` for ``None``. ``name`` names the argument in errors,
    ``expected`` what it must be."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(valid))
    if unknown:
        raise ValueError(f"unknown {name} keys {unknown}; valid keys: {valid}")
    return cls(**value)


def check_weights(config: Any, name: str) -> None:
    """Make every field of the frozen dataclass ``config`` a float; a ``ValueError`` for a
    field that is not a finite number, or a negative ``cost*`` field (``name`` names
    the weights in errors)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} weight {f.name!r} must be a finite number, got {value!r}")
        if f.name.startswith("cost") and value < 0:
            raise ValueError(f"{f.name} is a cost: give it as a non-negative number (it is subtracted), got {value}")
        object.__setattr__(config, f.name, float(value))
