"""The two policies every evaluation plays: the untrained team and a trained checkpoint.

**Untrained team** (one meaning everywhere: ``marft eval`` without ``--checkpoint``, the
leaderboard's ``untrained ...`` systems, ``--compare untrained``): the base model(s)
serving every role, with no adapters. A LoRA run starts from adapters whose ``B`` matrix
is zero, so their output is exactly the base's; the bare base is that team without the
adapter overhead (a test checks that both give the same greedy actions).

**Checkpoint**: the policy saved in a run dir or checkpoint dir, rebuilt from the run's
own config (model, per-agent models, mode, LoRA, device, dtype) with the roles it was
saved with, so a team from a custom team file loads as it was trained.

**Which env a checkpoint plays** (:func:`checkpoint_env`): its own env id with its own env
kwargs; on another env id, only the run's team (the ``profiles`` / ``team`` kwarg) goes
with it, never its task options (``digits`` of arith mean nothing to another task).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import marft_envs
from marft_algos.checkpoint import find_checkpoint
from marft_algos.config import config_from_dict
from marft_algos.evaluation.errors import EvaluationError
from marft_algos.policy_factory import make_policy
from marft_algos.registry import get_algorithm

__all__ = [
    "TEAM_KWARGS",
    "TrainedPolicy",
    "untrained_policy",
    "checkpoint_policy",
    "read_run_config",
    "saved_roles",
    "team_kwargs",
    "checkpoint_env",
    "check_roles",
]

#: Env kwargs that choose the team (the rest are task and env options).
TEAM_KWARGS = ("profiles", "team")


def untrained_policy(
    roles: list[str] | tuple[str, ...],
    model: str = "smollm2-135m",
    *,
    model_per_agent: dict[str, str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
    engine: str = "hf",
) -> Any:
    """The untrained team: the base model(s) serving every role, no adapters (see the module docstring).

    ``model_per_agent`` gives a heterogeneous team its own bases (each loaded once);
    ``engine`` names the generation engine (:mod:`marft_algos.engines`).
    """
    # deferred: the models package loads transformers
    from marft_algos.models import TeamPolicy

    base: Any = {r: (model_per_agent or {}).get(r, model) for r in roles} if model_per_agent else model
    kwargs: dict[str, Any] = {"base": base, "mode": "full", "full_reference": False, "engine": engine}
    if device not in (None, "auto"):
        kwargs["device"] = device
    if dtype is not None:
        kwargs["dtype"] = dtype
    return TeamPolicy(list(roles), **kwargs)


@dataclass
class TrainedPolicy:
    """A policy loaded from a checkpoint, with what it was trained on.

    Attributes:
        policy: the ``TeamPolicy`` with the saved weights.
        config: the run's config (the algorithm's config dataclass).
        path: the checkpoint directory that was loaded.
        roles: the roles the policy was saved with.
    """

    policy: Any
    config: Any
    path: Path
    roles: list[str] = field(default_factory=list)


def read_run_config(checkpoint: str | os.PathLike[str]) -> tuple[Any, Path]:
    """``(config, checkpoint dir)`` of the checkpoint that ``checkpoint`` resolves to."""
    ckpt = find_checkpoint(checkpoint)
    data = json.loads((ckpt / "config.json").read_text())
    spec = get_algorithm(data.get("algo", "grpo"))
    return config_from_dict(spec.config_cls, data), ckpt


def team_kwargs(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The team-choosing part of a run's env kwargs (``profiles`` / ``team``).

    >>> team_kwargs({"digits": 1, "profiles": "pair.json"})
    {'profiles': 'pair.json'}
    """
    return {k: v for k, v in env_kwargs.items() if k in TEAM_KWARGS}


def checkpoint_env(config: Any, env_id: str | None = None) -> tuple[str, dict[str, Any]]:
    """``(env id, env kwargs)`` a checkpoint plays: its own env and kwargs, or ``env_id``
    with only the run's team kwargs (see the module docstring)."""
    if env_id is None or env_id == config.env_id:
        return config.env_id, dict(config.env_kwargs)
    return env_id, team_kwargs(dict(config.env_kwargs))


def check_roles(env_id: str, env_kwargs: dict[str, Any], roles: list[str], what: str) -> list[str]:
    """The agents of ``env_id`` (read from its team, no env built); an :class:`EvaluationError`
    naming both lists when ``roles`` (the policy's) do not cover them."""
    agents = marft_envs.spec(env_id).agents_for(**env_kwargs)
    missing = [a for a in agents if a not in roles]
    if missing:
        raise EvaluationError(
            f"{what} has roles {roles}, but {env_id} (kwargs {env_kwargs}) has agents {agents}: no role for {missing}; "
            "evaluate it on an env with its own team (its run's env, or pass the team with the env's 'profiles' kwarg)"
        )
    return agents


def saved_roles(config: Any, ckpt: Path) -> list[str]:
    """The roles the policy in checkpoint dir ``ckpt`` was saved with (its ``policy.json``;
    for a save without that list, the run's own team)."""
    meta_path = ckpt / "policy" / "policy.json"
    roles: list[str] = []
    if meta_path.is_file():
        roles = list(json.loads(meta_path.read_text()).get("roles", []))
    if not roles:
        roles = marft_envs.spec(config.env_id).agents_for(**config.env_kwargs)
    return roles


def checkpoint_policy(checkpoint: str | os.PathLike[str], *, engine: str | None = None) -> TrainedPolicy:
    """The trained policy stored in a run dir / checkpoint dir (one loader for every caller).

    The policy is rebuilt as the trainer built it (``marft_algos.policy_factory.make_policy``)
    for the roles it was saved with, then loaded. ``engine`` replaces the run's generation
    engine (``config.engine``) by another one, built with default options.
    """
    config, ckpt = read_run_config(checkpoint)
    if engine is not None and engine != getattr(config, "engine", "hf"):
        config = replace(config, engine=engine, engine_options={})
    roles = saved_roles(config, ckpt)
    policy = make_policy(config, roles, init=False)  # its own weights follow: not the run's init_from
    policy.load(ckpt / "policy")
    return TrainedPolicy(policy=policy, config=config, path=ckpt, roles=roles)
