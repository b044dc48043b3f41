"""Calls into transformers / peft that change name across the versions we support (>= 4.50).

transformers 5.x renamed the forward's ``past_key_values`` to ``cache`` (the old name warns a
``FutureWarning`` on every call) and ``is_gradient_checkpointing`` to
``is_activation_checkpointing``. We pass whichever name the installed model accepts, so a
user's console shows only our own messages, old and new versions alike.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["cache_kwarg", "quiet_peft_checkpointing_probe"]


def _unwrap(model: Any) -> Any:
    """The transformers model under DDP/FSDP (``.module``) and peft (``get_base_model``) wrappers."""
    seen = 0
    while seen < 8:  # wrappers nest a few levels at most
        seen += 1
        if hasattr(model, "module") and not hasattr(model, "config"):
            model = model.module
        elif hasattr(model, "get_base_model"):
            model = model.get_base_model()
        else:
            break
    return model


@functools.lru_cache(maxsize=64)
def _cache_kwarg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(model: Any) -> str:
    """The forward's key-value-cache argument name for ``model``: ``"cache"`` where the
    installed transformers has it (``past_key_values`` is deprecated there), else
    ``"past_key_values"``."""
    return _cache_kwarg_of(type(_unwrap(model)))


@contextmanager
def quiet_peft_checkpointing_probe() -> Iterator[None]:
    """Around ``get_peft_model``: peft probes ``model.is_gradient_checkpointing``, which
    transformers >= 5 deprecates with a ``FutureWarning`` the user cannot act on (peft's
    call, not ours). Only that one message is silenced; anything else still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield
