"""The team policy a config asks for: base model(s), fine-tuning mode, LoRA shape, device, engine."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from marft_algos.checkpoint import CheckpointError, find_checkpoint
from marft_algos.config import ConfigError, TrainConfig
from marft_algos.fsdp import PolicySharding
from marft_algos.rundir import ENV_RECORD_KEY, env_changes, env_record

__all__ = ["check_frozen_apart", "check_policy", "load_init", "make_policy", "policy_device", "shard_policy"]


def make_policy(config: TrainConfig, agents: Sequence[str], *, init: bool = True) -> Any:
    """Build a ``TeamPolicy`` for ``agents`` from a config (model, mode, LoRA, device, dtype, engine).

    With ``config.init_from`` (and ``init``) its weights start from that run's
    (:func:`load_init`): RL after an SFT warm start; ``config.reference == "init"`` then
    freezes those weights as the KL reference (:meth:`TeamPolicy.freeze_reference`). A loader about to load a checkpoint of
    its own passes ``init=False``."""
    # deferred: the models and engines load the model stack (transformers) when a policy is built
    from marft_algos.engines import get_engine
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
    if init and config.init_from:
        load_init(policy, config.init_from, config)
        if config.reference == "init":
            policy.freeze_reference()
    if config.engine != "hf" or config.engine_options:  # the policy starts on the built-in engine
        policy.engine = get_engine(config.engine)(policy, **config.engine_options)
    return policy


def policy_device(policy: Any, agents: Sequence[str]) -> torch.device:
    """Where ``policy`` runs: its ``device`` attribute, else the device of the first
    trainable parameter of ``agents``, else the CPU."""
    dev = getattr(policy, "device", None)
    if dev is not None:
        return torch.device(dev)
    for role in agents:
        for p in policy.trainable_parameters(role):
            return p.device
    return torch.device("cpu")


def load_init(policy: Any, source: str, config: TrainConfig | None = None) -> Path:
    """Load the weights of ``source`` (a run dir, a checkpoint dir or a ``TeamPolicy.save``
    dir) into ``policy``; returns the policy dir read. A :class:`ConfigError` says what does
    not match (no weights there, another base model, mode, LoRA rank or team)."""
    path = Path(source)
    if (path / "policy.json").is_file():
        pdir = path
    else:
        try:
            pdir = find_checkpoint(path) / "policy"
        except CheckpointError as e:
            raise ConfigError(f"init_from={source!r}: no weights to start from ({e}); give a `marft sft` run dir, "
                              "a run dir with a checkpoint or a checkpoint dir") from None
    meta = json.loads((pdir / "policy.json").read_text())
    problems = []
    if meta.get("mode") != policy.mode:
        problems.append(f"mode {meta.get('mode')!r} there, {policy.mode!r} here")
    missing = [r for r in policy.roles if r not in meta.get("roles", [])]
    if missing:
        problems.append(f"no weights for the roles {missing} (it has {meta.get('roles')})")
    bases = meta.get("bases") or {}
    other = sorted({f"{bases[r]!r} there, {policy.loaded_base(r).name!r} here" for r in policy.roles
                    if r in bases and bases[r] != policy.loaded_base(r).name})
    if other:
        problems.append("another base model: " + "; ".join(other))
    lora = meta.get("lora") or {}
    if policy.mode != "full" and (lora.get("r"), lora.get("alpha")) != (policy.lora.r, policy.lora.alpha):
        problems.append(f"LoRA r={lora.get('r')}, alpha={lora.get('alpha')} there, r={policy.lora.r}, "
                        f"alpha={policy.lora.alpha} here (set lora_r / lora_alpha to match)")
    if problems:
        raise ConfigError(f"init_from={source!r} does not fit this run: " + "; ".join(problems))
    if config is not None:
        _warn_other_env(source, [path / "config.json", pdir.parent / "config.json"], config)
        in_run = len(pdir.parents) > 2 and pdir.parents[1].name == "checkpoints"  # <run>/checkpoints/<step>/policy
        _warn_cut_demos(source, [path / "sft.json", *([pdir.parents[2] / "sft.json"] if in_run else [])], config)
    policy.load(pdir)
    return pdir


def _warn_cut_demos(source: str, candidates: Sequence[Path], config: TrainConfig) -> None:
    """Warn when a role's ``max_new_tokens`` in this run is below the 90th percentile of the
    lengths of the SFT demonstrations it learned (``sft.json``): RL would cut most of what SFT taught."""
    found = next((c for c in candidates if c.is_file()), None)
    if found is None or not getattr(config, "env_id", None):
        return
    try:
        lengths = json.loads(found.read_text())["result"].get("response_tokens") or {}
    except (OSError, ValueError, KeyError, AttributeError):
        return
    if not lengths:
        return
    # deferred: the env (and its data) is built only for a run that starts from SFT weights
    import marft_envs
    from marft_algos.rollout import role_sampling

    env = marft_envs.make(config.env_id, **dict(config.env_kwargs))
    cut = []
    for role, q in lengths.items():
        limit = role_sampling(env, role, config.sampling_overrides).get("max_new_tokens")
        if limit is not None and int(limit) < int(q["p90"]):
            cut.append(f"{role}: max_new_tokens={limit}, demos p90 {q['p90']} / max {q['max']} tokens")
    if cut:
        warnings.warn(f"init_from={source!r}: SFT taught responses longer than this run lets a role write ("
                      + "; ".join(cut) + "): RL samples will be cut where the demos were not; raise "
                      "sampling_overrides.<role>.max_new_tokens to at least the p90", UserWarning, stacklevel=3)


def _warn_other_env(source: str, candidates: Sequence[Path], config: TrainConfig) -> None:
    """Warn when the weights were trained on another env or env settings than this run's: the
    SFT prompts then are not the rollout's (allowed, as a warm start across envs may be meant)."""
    found = next((c for c in candidates if c.is_file()), None)
    if found is None or not getattr(config, "env_id", None):
        return
    try:
        saved = json.loads(found.read_text())
    except (OSError, ValueError):
        return
    lines = []
    if saved.get("env_id") and saved["env_id"] != config.env_id:
        lines.append(f"env {saved['env_id']!r} there, {config.env_id!r} here")
    else:
        lines += env_changes(saved.get(ENV_RECORD_KEY), env_record(config.env_id, config.env_kwargs))
    if lines:
        warnings.warn(f"init_from={source!r} was trained on another environment than this run's ("
                      + "; ".join(lines) + "): its prompts differ from this run's; give --env / --env-kwargs "
                      "as `marft sft` had them if that is not meant", UserWarning, stacklevel=3)


def check_policy(config: TrainConfig, policy: Any, agents: Sequence[str], *, reference: bool) -> None:
    """A KL penalty with full fine-tuning needs the frozen reference copy of the base."""
    if reference and getattr(policy, "mode", None) == "full":
        bases = getattr(policy, "_base", None)
        if bases is not None and any(bases(a).reference is None for a in agents):
            raise ConfigError(
                "beta > 0 with mode='full' needs the frozen reference copy of the base (TeamPolicy(full_reference=True), "
                "the default of make_policy)"
            )


def check_frozen_apart(config: TrainConfig, policy: Any, agents: Sequence[str], trained: Sequence[str]) -> None:
    """A frozen agent must not share parameters with a trained one: the trained agent's steps would move it."""
    frozen = [a for a in agents if a in set(config.frozen_agents)]
    ids = {id(p) for a in trained for p in policy.trainable_parameters(a)} if frozen else set()
    shared = [a for a in frozen if any(id(p) in ids for p in policy.trainable_parameters(a))]
    if shared:
        raise ConfigError(
            f"frozen_agents {shared} share their parameters with trained agents (mode={config.mode!r} or "
            "profiles naming one adapter): give each agent its own adapter (mode='lora') to freeze some of them"
        )


def shard_policy(policy: Any, dist: Any, trained: Sequence[Any]) -> Any:
    """FSDP2 over a policy with one base (``distributed.strategy="fsdp"``): every rank starts from
    rank 0's ``trained`` weights, broadcast while they are still whole."""
    bases = getattr(policy, "loaded_bases", None)
    if bases is None or len(bases) != 1:
        raise ConfigError(
            "distributed.strategy='fsdp' shards a TeamPolicy with one base model; this policy has "
            f"{'no loaded bases' if bases is None else f'{len(bases)} bases'}: use distributed.strategy='ddp'"
        )
    dist.broadcast_parameters({id(p): p for p in trained}.values())
    return PolicySharding(policy, dist)
