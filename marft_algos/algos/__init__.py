"""Algorithm implementations, one module per algorithm (its trainer and its config).

The registry (:mod:`marft_algos.registry`) names each built-in algorithm's classes as
lazy ``"module:Class"`` strings, so nothing here is imported until an algorithm is
looked up. A new algorithm registers itself with
:func:`marft_algos.registry.register_algorithm` (or, built in, gets one line in
:data:`marft_algos.registry.BUILTIN_ALGORITHMS`).
"""

from __future__ import annotations

from marft_algos.registry import lazy_exports

__all__ = ["GRPOTrainer", "IPPOTrainer", "MARFTActionTrainer", "MARFTTokenTrainer"]

__getattr__ = lazy_exports(
    __name__,
    {name: f"{__name__}.{module}" for name, module in (
        ("GRPOTrainer", "grpo"), ("IPPOTrainer", "ippo"), ("MARFTActionTrainer", "marft_action"), ("MARFTTokenTrainer", "marft_token"),
    )},
)
