"""Algorithm implementations; each module registers itself with ``register_algorithm``.

Every module in this package is imported here, so an algorithm added as
``marft_algos/algos/<name>.py`` (calling ``register_algorithm`` at import time) is
available to ``marft train --algo <name>`` without further wiring.
"""

from __future__ import annotations

import importlib
import pkgutil

from marft_algos.algos.grpo import GRPOTrainer
from marft_algos.algos.ippo import IPPOTrainer

__all__ = ["GRPOTrainer", "IPPOTrainer"]

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")
from marft_algos.algos.marft_action import MARFTActionTrainer  # noqa: E402,F401  (registers "marft-action")
from marft_algos.algos.marft_token import MARFTTokenTrainer  # noqa: E402,F401  (registers "marft-token")
