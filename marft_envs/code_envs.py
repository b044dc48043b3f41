"""Former home of the code envs; they live in :mod:`marft_envs.envs` now.

Kept so that ``import marft_envs.code_envs`` and the names below keep working.
"""

from __future__ import annotations

from marft_envs.envs import CODE_DATASETS, CODE_ENV_IDS, make_code_env
from marft_envs.envs import register_builtin_envs as register_code_envs

__all__ = ["CODE_DATASETS", "CODE_ENV_IDS", "make_code_env", "register_code_envs"]
