"""Code-with-tests environments: ``code-solo-v0``, ``code-duo-v0``, ``code-trio-v0``.

(Being built: registration lands once ``marft_envs.registration`` exists.)
"""

from __future__ import annotations

__all__ = ["CODE_ENV_IDS", "register_code_envs"]

CODE_ENV_IDS: tuple[str, ...] = ("code-solo-v0", "code-duo-v0", "code-trio-v0")


def register_code_envs() -> None:
    """Register the code envs (no data is loaded). A no-op until the registry exists."""
    try:
        from marft_envs import registration  # noqa: F401
    except ImportError:
        return


register_code_envs()
