"""Algorithm implementations, one module per algorithm (its trainer and its config).

The registry (:mod:`marft_algos.registry`) names each built-in algorithm's classes as
lazy ``"module:Class"`` strings, so nothing here is imported until an algorithm is
looked up. A new algorithm registers itself with
:func:`marft_algos.registry.register_algorithm` (or, built in, gets one line in
:data:`marft_algos.registry.BUILTIN_ALGORITHMS`).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GRPOTrainer", "IPPOTrainer", "MARFTActionTrainer", "MARFTTokenTrainer"]

_LAZY = {
    "GRPOTrainer": "marft_algos.algos.grpo",
    "IPPOTrainer": "marft_algos.algos.ippo",
    "MARFTActionTrainer": "marft_algos.algos.marft_action",
    "MARFTTokenTrainer": "marft_algos.algos.marft_token",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marft_algos.algos' has no attribute {name!r}")
