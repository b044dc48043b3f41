"""GRPO for a team of LLM agents (group-relative advantages, no critic).

For each problem, G env copies reset with the same seed play G episodes. Every
action of agent i in episode j is credited with the episode's team return R_j
(or the rewards credited to agent i), and its advantage is group-relative:

    A_j = (R_j - mean_{group}(R)) / (std_{group}(R) + eps)      (normalize_advantages="group")

With ``normalize_advantages="agent"`` (Dr. MAS) the mean/std are taken per (group, agent), so an
agent whose rewards have a different scale does not destabilise the others. The policy
loss is the PPO clipped surrogate with DAPO clip-higher (``eps_low`` < ``eps_high``),
aggregated per token or per sequence, plus an optional ``beta``-weighted KL to the
reference policy (the base model with adapters disabled). DAPO dynamic sampling drops
groups whose rewards are all equal (their advantages are all 0: no signal; "rewards"
are those the advantages use: team returns, or each agent's own with
``reward_source="agent"``) and resamples until the batch is full or
``max_resample_tries`` is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marft_algos.algorithm import Algorithm, PPOPolicy
from marft_algos.config import (
    ConfigError,
    PPOLossConfig,
    TrainConfig,
    check_normalization,
    with_default,
)
from marft_algos.records import Episode, RolloutBatch, Transition
from marft_algos.reward_source import RewardSourceSetting
from marft_algos.trainer import Trainer

__all__ = ["GRPO", "GRPOConfig", "GRPOTrainer"]


@dataclass
class GRPOConfig(PPOLossConfig, TrainConfig):
    """Group Relative Policy Optimisation for a team (one adapter per agent by default).

    G env copies reset with the same seed share a problem; each agent's action is
    credited with its episode's team return (or the agent's own credited rewards),
    normalised within the group (over all agents of the group, or agent-wise as in Dr. MAS).
    """

    group_size: int = field(default=4, metadata={"help": "G: samples (episodes) per problem; must divide num_envs."})
    normalize_advantages: str = field(default="group", metadata={"help": "'group' (one baseline per group), 'agent' (per group and agent, Dr. MAS) or 'none' (centred on the group mean, never scaled)."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide group-centred rewards by their std (False = Dr. GRPO)."})
    reward_source: str = field(default="auto", metadata={"help": "'team': every action gets the episode's team return; 'agent': the sum of the rewards credited to the agent (PettingZoo cumulative rewards: a team reward given to all agents counts for each); 'auto': 'agent' for envs without a team reward (games), else 'team'."})
    advantage_estimator: str = field(default="group", metadata={"help": "'group': one group-relative advantage per (episode[, agent]); 'turn': MARS turn-level advantages (each action's return from its agent's own later rewards, normalised per (group, agent) with normalize_advantages='agent', per group with 'group', raw with 'none')."})
    turn_gamma: float = field(default=1.0, metadata={"help": "advantage_estimator='turn': discount between an agent's consecutive turns."})
    eps_high: float = with_default(PPOLossConfig, "eps_high", 0.28)
    dynamic_sampling: bool = field(default=False, metadata={"help": "DAPO dynamic sampling: drop groups whose rewards are all equal and resample."})
    max_resample_tries: int = field(default=3, metadata={"help": "Extra collection rounds to fill the batch when dynamic sampling drops groups."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ConfigError(f"GRPO needs group_size >= 2 (a group-relative baseline of one sample is 0), got {self.group_size}")
        if self.num_envs % self.group_size:
            raise ConfigError(f"num_envs ({self.num_envs}) must be a multiple of group_size ({self.group_size})")
        check_normalization(self.normalize_advantages, ("group", "agent", "none"), "grpo")
        if self.reward_source not in ("auto", "team", "agent"):
            raise ConfigError(f"reward_source must be 'auto', 'team' or 'agent', got {self.reward_source!r}")
        if self.advantage_estimator not in ("group", "turn"):
            raise ConfigError(f"advantage_estimator must be 'group' or 'turn', got {self.advantage_estimator!r}")
        if not 0.0 <= self.turn_gamma <= 1.0:
            raise ConfigError(f"turn_gamma must be in [0, 1], got {self.turn_gamma}")
        if self.max_resample_tries < 0:
            raise ConfigError(f"max_resample_tries must be >= 0, got {self.max_resample_tries}")


class GRPO(PPOPolicy, RewardSourceSetting, Algorithm):
    """GRPO's parts: group-relative advantages, the PPO policy term, dynamic sampling's test."""

    config: GRPOConfig

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer)
        self.group_size = self.config.group_size

    def check(self) -> None:
        """Resolve ``reward_source`` now: a wrong setting fails at construction, not mid-run."""
        _ = self.reward_source

    def no_signal(self, group: list[Episode]) -> bool:
        """DAPO: every advantage of the group is 0 (see :meth:`_all_equal`)."""
        return self._all_equal(group)

    def _all_equal(self, group: list[Episode]) -> bool:
        """No signal: every advantage of the group is 0 under the rewards and statistics
        the advantages use (team return, or each agent's own return with
        ``reward_source="agent"``; per group, or per group and agent)."""
        from marft_algos.advantages import grpo_advantages

        c = self.config
        _, rewards, group_ids, agent_ids = self._units(group)
        if not rewards:
            return True
        adv = grpo_advantages(
            np.asarray(rewards, dtype=np.float64),
            np.asarray(group_ids),
            agent_ids=np.asarray(agent_ids) if c.normalize_advantages == "agent" else None,
            normalize=c.normalize_advantages,
            scale=False,  # "all equal" is about centring; the std scale only rescales
        )
        return bool(np.max(np.abs(adv)) < 1e-8)

    def _units(self, episodes: list[Episode]) -> tuple[list[list[Transition]], list[float], list[int], list[int]]:
        """The samples the advantages are computed over: ``(transitions, reward, group, agent)``
        per episode (team reward, global baseline) or per (episode, agent)."""
        c = self.config
        per_agent_units = self.reward_source == "agent" or c.normalize_advantages == "agent"
        units: list[list[Transition]] = []  # the transitions of each sample
        rewards: list[float] = []
        group_ids: list[int] = []
        agent_ids: list[int] = []
        for ep in episodes:
            if per_agent_units:
                for agent in dict.fromkeys(t.agent for t in ep.transitions):
                    R = ep.team_return if self.reward_source == "team" else ep.agent_return(agent)
                    units.append(ep.agent_transitions(agent))
                    rewards.append(R)
                    group_ids.append(ep.group_id)
                    agent_ids.append(self.agents.index(agent))
            else:
                units.append(ep.transitions)
                rewards.append(ep.team_return)
                group_ids.append(ep.group_id)
                agent_ids.append(0)
        return units, rewards, group_ids, agent_ids

    # ---- advantages ----------------------------------------------------------------
    def estimate(self, batch: RolloutBatch) -> None:
        """A = group-relative, (optionally) std-normalised return; one sample per unit.

        The statistics run over one sample per episode (team reward, global baseline) or
        per (episode, agent) (own rewards, or agent-wise normalisation), never per
        transition: an episode with more actions must not weigh more in the baseline.
        The unit's advantage is then given to each of its trainable transitions.
        """
        from marft_algos.advantages import grpo_advantages

        c = self.config
        if c.advantage_estimator == "turn":
            self._turn_advantages(batch)
            return
        units, rewards, group_ids, agent_ids = self._units(batch.episodes)
        if not units:
            return
        adv = grpo_advantages(
            np.asarray(rewards, dtype=np.float64),
            np.asarray(group_ids),
            agent_ids=np.asarray(agent_ids) if c.normalize_advantages == "agent" else None,
            normalize=c.normalize_advantages,
            scale=c.scale_rewards,
        )
        for trs, a, R in zip(units, np.asarray(adv, dtype=np.float64).tolist(), rewards, strict=True):
            for t in trs:
                t.advantage = float(a)
                t.returns = float(R)

    def _turn_advantages(self, batch: RolloutBatch) -> None:
        """MARS: each action's return from its agent's own later rewards, normalised per
        (group, agent) (see :func:`~marft_algos.advantages.turn_level_advantages`)."""
        from marft_algos.advantages import once_per_action, turn_level_advantages

        c = self.config
        trs = batch.transitions
        if not trs:
            return
        # the team reward is on every tool segment of an action: it enters once, at the last
        rewards = ([t.credited_reward for t in trs] if self.reward_source == "agent"
                   else once_per_action([t.team_reward for t in trs], [t.action_key for t in trs]))
        adv, ret = turn_level_advantages(
            rewards,
            [t.agent for t in trs],
            [t.episode_id for t in trs],
            gamma=c.turn_gamma,
            normalize={"agent": "agent", "group": "batch", "none": "none"}[c.normalize_advantages],
            group_ids=[t.group_id for t in trs],
            action_ids=[t.action_key for t in trs],
        )
        for t, a, r in zip(trs, adv.tolist(), ret.tolist(), strict=True):
            t.advantage, t.returns = float(a), float(r)


class GRPOTrainer(Trainer):
    """GRPO: group-relative advantages, clipped surrogate, optional KL to the reference."""

    config_cls = GRPOConfig
    algorithm_cls = GRPO
