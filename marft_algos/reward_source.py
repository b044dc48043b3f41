"""Which reward a trainer credits: the team's shared reward or each agent's own.

Team envs (:class:`~marft_envs.text_env.TextTeamEnv` and the dialogue env) grade a turn
and give every agent the same team reward (``infos[a]["team_reward"]``). Games
(:class:`~marft_envs.games.base.TextGameEnv`: Nim, matrix games, TextArena) give each
agent its OWN reward and have no team reward: a trainer that read ``team_reward`` there
would train on zeros. ``reward_source="auto"`` (the GRPO / IPPO default) picks ``"agent"``
for such envs and ``"team"`` otherwise, and says so in the log; ``"team"`` on an env
without a team reward is a configuration error (it could only ever train on zeros).

An env declares its kind with a ``has_team_reward`` attribute (``True`` / ``False``);
without one, the games (subclasses of ``TextGameEnv``) have none and every other env has one.
"""

from __future__ import annotations

import logging
from typing import Any

from marft_algos.config import ConfigError
from marft_envs.games.base import TextGameEnv

__all__ = ["REWARD_SOURCES", "RewardSourceSetting", "env_has_team_reward", "resolve_reward_source", "trainer_reward_source"]

#: Accepted values of the trainers' ``reward_source`` setting.
REWARD_SOURCES = ("auto", "team", "agent")

_log = logging.getLogger("marft")


def env_has_team_reward(env: Any) -> bool:
    """Does ``env`` (or the env it wraps) give its agents one shared team reward?

    Example:
        >>> import marft_envs
        >>> env_has_team_reward(marft_envs.make("game-nim-v0")), env_has_team_reward(marft_envs.make("echo-duo-v0"))
        (False, True)
    """
    for obj in (env, getattr(env, "unwrapped", env)):
        declared = getattr(obj, "has_team_reward", None)
        if isinstance(declared, bool):
            return declared

    return not isinstance(getattr(env, "unwrapped", env), TextGameEnv)


def resolve_reward_source(requested: str, env: Any, algo: str = "trainer") -> str:
    """The effective reward source for ``env``: ``"auto"`` resolved, ``"team"`` checked.

    Raises:
        ConfigError: an unknown value, or ``"team"`` for an env without a team reward.
    """
    if requested not in REWARD_SOURCES:
        raise ConfigError(f"reward_source must be one of {REWARD_SOURCES}, got {requested!r}")
    team = env_has_team_reward(env)
    name = type(getattr(env, "unwrapped", env)).__name__
    if requested == "team" and not team:
        raise ConfigError(
            f"{algo}: reward_source='team' but {name} has no team reward (each agent has its own, "
            "as in a game): set reward_source='agent' (or 'auto')"
        )
    if requested != "auto":
        return requested
    source = "team" if team else "agent"
    if not team:
        _log.info("%s: %s has per-agent rewards and no team reward: training on each agent's own "
                  "rewards (reward_source='agent')", algo, name)
    return source


def trainer_reward_source(trainer: Any, algo: str) -> str:
    """``trainer.config.reward_source`` resolved against the trainer's env (cached per
    value, so the log line appears once and a changed config is followed)."""
    cache = trainer.__dict__.setdefault("_reward_sources", {})
    requested = trainer.config.reward_source
    if requested not in cache:
        cache[requested] = resolve_reward_source(requested, trainer.collector.envs[0], algo)
    return cache[requested]


class RewardSourceSetting:
    """Mixin of the trainers with a ``reward_source`` setting (GRPO, IPPO): its effective value.

    A trainer reads ``self.reward_source`` once in its ``__init__`` so that a wrong setting
    fails at construction, not mid-run.
    """

    config: Any
    collector: Any

    @property
    def reward_source(self) -> str:
        """The effective reward source: ``config.reward_source`` with ``"auto"`` resolved
        (``"agent"`` for envs without a team reward, e.g. games; see :mod:`marft_algos.reward_source`)."""
        return trainer_reward_source(self, self.config.algo or type(self).__name__)
