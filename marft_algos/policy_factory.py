"""The team policy a config asks for: base model(s), fine-tuning mode, LoRA shape, device, engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marft_algos.config import TrainConfig

__all__ = ["make_policy"]


def make_policy(config: TrainConfig, agents: Sequence[str]) -> Any:
    """Build a ``TeamPolicy`` for ``agents`` from a config (model, mode, LoRA, device, dtype, engine)."""
    from marft_algos.engines import (
        get_engine,  # the models and engines load torch models: import when a policy is built
    )
    from marft_algos.models import LoraSettings, TeamPolicy

    base: Any = config.model
    if config.model_per_agent:
        base = {a: config.model_per_agent.get(a, config.model) for a in agents}
    lora = LoraSettings(r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout)
    kwargs: dict[str, Any] = {"base": base, "mode": config.mode, "lora": lora}
    if config.device != "auto":
        kwargs["device"] = config.device
    if config.dtype is not None:
        kwargs["dtype"] = config.dtype
    if config.activation_checkpointing:
        kwargs["activation_checkpointing"] = True
    policy = TeamPolicy(list(agents), **kwargs)
    if config.engine != "hf" or config.engine_options:  # the policy starts on the built-in engine
        policy.engine = get_engine(config.engine)(policy, **config.engine_options)
    return policy
