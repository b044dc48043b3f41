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

from marft_algos.advantages import grpo_advantages, once_per_action, turn_level_advantages
from marft_algos.algorithm import Algorithm, PPOPolicy
from marft_algos.branching import tree_paths
from marft_algos.config import (
    BranchingConfig,
    ConfigError,
    PPOLossConfig,
    TrainConfig,
    check_normalization,
    with_default,
)
from marft_algos.credit import observation_key, step_group_advantages, tree_credit
from marft_algos.records import Episode, RolloutBatch, Transition
from marft_algos.reward_source import RewardSourceSetting
from marft_algos.trainer import Trainer

__all__ = ["GRPO", "GRPOConfig", "GRPOTrainer"]


@dataclass
class GRPOConfig(BranchingConfig, PPOLossConfig, TrainConfig):
    """Group Relative Policy Optimisation for a team (one adapter per agent by default).

    G env copies reset with the same seed share a problem; each agent's action is
    credited with its episode's team return (or the agent's own credited rewards),
    normalised within the group (over all agents of the group, or agent-wise as in Dr. MAS).
    """

    group_size: int = field(default=4, metadata={"help": "G: samples (episodes) per problem; must divide num_envs."})
    normalize_advantages: str = field(default="group", metadata={"help": "'group' (one baseline per group), 'agent' (per group and agent, Dr. MAS), 'agent_turn' (per group, agent and turn, AT-GRPO) or 'none' (centred on the group mean, never scaled). With branching > 1 the groups are each node's siblings (one agent, one turn)."})
    scale_rewards: bool = field(default=True, metadata={"help": "Divide group-centred rewards by their std (False = Dr. GRPO)."})
    reward_source: str = field(default="auto", metadata={"help": "'team': every action gets the episode's team return; 'agent': the sum of the rewards credited to the agent (PettingZoo cumulative rewards: a team reward given to all agents counts for each); 'auto': 'agent' for envs without a team reward (games), else 'team'."})
    advantage_estimator: str = field(default="group", metadata={"help": "'group': one group-relative advantage per (episode[, agent]); 'turn': MARS turn-level advantages (each action's return from its agent's own later rewards, normalised per (group, agent) with normalize_advantages='agent', per (group, agent, turn) with 'agent_turn', per group with 'group', raw with 'none')."})
    turn_gamma: float = field(default=1.0, metadata={"help": "advantage_estimator='turn': discount between an agent's consecutive turns (also the step return's discount of step_group_weight)."})
    step_group_weight: float = field(default=0.0, metadata={"help": "GiGPO step groups (multi-turn envs): add this weight x a step-level advantage, the action's return from its step on minus the mean over the group's actions taken from the same observation (agent + prompt token hash), std-scaled like the group advantage; 0 = off."})
    eps_high: float = with_default(PPOLossConfig, "eps_high", 0.28)
    dynamic_sampling: bool = field(default=False, metadata={"help": "DAPO dynamic sampling: drop groups whose rewards are all equal and resample."})
    max_resample_tries: int = field(default=3, metadata={"help": "Extra collection rounds to fill the batch when dynamic sampling drops groups."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2 and self.branching < 2:
            raise ConfigError(f"GRPO needs group_size >= 2 (a group-relative baseline of one sample is 0), got {self.group_size} "
                              "(or branching >= 2: the siblings of a tree are the groups)")
        if self.num_envs % self.group_size:
            raise ConfigError(f"num_envs ({self.num_envs}) must be a multiple of group_size ({self.group_size})")
        check_normalization(self.normalize_advantages, ("group", "agent", "agent_turn", "none"), "grpo")
        if self.step_group_weight < 0:
            raise ConfigError(f"step_group_weight must be >= 0 (0 = off), got {self.step_group_weight}")
        if self.branching > 1 and (self.advantage_estimator != "group" or self.step_group_weight > 0):
            raise ConfigError(
                "branching > 1 credits each action from its tree (its leaves' mean return minus its siblings'): it replaces "
                "advantage_estimator='turn' and the step groups (siblings share an observation already); leave "
                "advantage_estimator='group' and step_group_weight=0"
            )
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

    def setup(self) -> None:
        """``branching > 1``: the collector plays trees (:mod:`marft_algos.branching`)."""
        self.config.branch_collector(self.collector)

    def check(self) -> None:
        """Resolve ``reward_source`` now: a wrong setting fails at construction, not mid-run."""
        _ = self.reward_source

    def no_signal(self, group: list[Episode]) -> bool:
        """DAPO: every advantage of the group is 0 (see :meth:`_all_equal`)."""
        if self.config.branching > 1:
            credit = self._tree_credit(group, scale=False)
            return not credit.advantage or max(abs(a) for a in credit.advantage.values()) < 1e-8
        return self._all_equal(group)

    def _all_equal(self, group: list[Episode]) -> bool:
        """No signal: every advantage of the group is 0 under the rewards and statistics
        the advantages use (team return, or each agent's own return with
        ``reward_source="agent"``; per group, or per group and agent)."""
        _, rewards, group_ids, agent_ids, turn_ids = self._units(group)
        if not rewards:
            return True
        adv = self._group_advantages(rewards, group_ids, agent_ids, turn_ids, scale=False)  # "all equal" is about centring
        return bool(np.max(np.abs(adv)) < 1e-8)

    def _group_advantages(self, rewards: list[float], group_ids: list[int], agent_ids: list[int], turn_ids: list[int], scale: bool) -> np.ndarray:

        mode = self.config.normalize_advantages
        return np.asarray(grpo_advantages(
            np.asarray(rewards, dtype=np.float64),
            np.asarray(group_ids),
            agent_ids=np.asarray(agent_ids) if mode in ("agent", "agent_turn") else None,
            normalize=mode,
            scale=scale,
            turn_ids=np.asarray(turn_ids) if mode == "agent_turn" else None,
        ), dtype=np.float64)

    def _units(self, episodes: list[Episode]) -> tuple[list[list[Transition]], list[float], list[int], list[int], list[int]]:
        """The samples the advantages are computed over: ``(transitions, reward, group, agent, turn)``
        per episode (team reward, global baseline), per (episode, agent), or per
        (episode, agent, turn) (``normalize_advantages="agent_turn"``, AT-GRPO)."""
        c = self.config
        per_turn = c.normalize_advantages == "agent_turn"
        per_agent_units = self.reward_source == "agent" or c.normalize_advantages in ("agent", "agent_turn")
        units: list[list[Transition]] = []  # the transitions of each sample
        rewards: list[float] = []
        group_ids: list[int] = []
        agent_ids: list[int] = []
        turn_ids: list[int] = []
        for ep in episodes:
            if per_agent_units:
                for agent in dict.fromkeys(t.agent for t in ep.transitions):
                    R = ep.team_return if self.reward_source == "team" else ep.agent_return(agent)
                    mine = ep.agent_transitions(agent)
                    for turn in dict.fromkeys(t.turn for t in mine) if per_turn else (None,):
                        units.append([t for t in mine if turn is None or t.turn == turn])
                        rewards.append(R)
                        group_ids.append(ep.group_id)
                        agent_ids.append(self.agents.index(agent))
                        turn_ids.append(-1 if turn is None else int(turn))
            else:
                units.append(ep.transitions)
                rewards.append(ep.team_return)
                group_ids.append(ep.group_id)
                agent_ids.append(0)
                turn_ids.append(-1)
        return units, rewards, group_ids, agent_ids, turn_ids

    # ---- advantages ----------------------------------------------------------------
    def estimate(self, batch: RolloutBatch) -> None:
        """A = group-relative, (optionally) std-normalised return; one sample per unit.

        The statistics run over one sample per episode (team reward, global baseline), per
        (episode, agent) (own rewards, or agent-wise normalisation) or per (episode, agent,
        turn) (AT-GRPO), never per transition: an episode with more actions must not weigh
        more in the baseline. The unit's advantage is then given to each of its trainable
        transitions. With ``branching > 1`` the tree's counterfactual credit replaces it
        (:meth:`_tree_advantages`); ``step_group_weight`` adds GiGPO's step-level term.
        """
        c = self.config
        if c.branching > 1:
            self._tree_advantages(batch)
            return
        if c.advantage_estimator == "turn":
            self._turn_advantages(batch)
        else:
            units, rewards, group_ids, agent_ids, turn_ids = self._units(batch.episodes)
            if not units:
                return
            adv = self._group_advantages(rewards, group_ids, agent_ids, turn_ids, scale=c.scale_rewards)
            for trs, a, R in zip(units, adv.tolist(), rewards, strict=True):
                for t in trs:
                    t.advantage = float(a)
                    t.returns = float(R)
        if c.step_group_weight > 0:
            self._add_step_groups(batch)

    def _leaf_return(self, ep: Episode, agent: str) -> float:
        """The return a leaf (episode) gives ``agent``'s actions on its path."""
        return ep.team_return if self.reward_source == "team" else ep.agent_return(agent)

    def _tree_credit(self, episodes: list[Episode], scale: bool) -> Any:
        """:func:`~marft_algos.credit.tree_credit` over the trees of ``episodes`` (one per group)."""
        paths = tree_paths(episodes)
        agent_of = {t.action_key: t.agent for ep in episodes for t in ep.transitions}
        returns = [[self._leaf_return(ep, agent_of[a]) for _, a in path] for ep, path in zip(episodes, paths, strict=True)]
        return tree_credit(paths, returns, scale=scale)

    def _tree_advantages(self, batch: RolloutBatch) -> None:
        """Counterfactual tree credit: ``A(a) = Q(a) - mean of Q over a's siblings`` (one group
        per (node, agent); std-scaled with ``scale_rewards`` unless ``normalize_advantages="none"``);
        ``returns`` is ``Q(a)``, its leaves' mean return (:mod:`marft_algos.credit`)."""
        c = self.config
        credit = self._tree_credit(batch.episodes, scale=c.scale_rewards and c.normalize_advantages != "none")
        for t in batch.transitions:
            t.advantage = credit.advantage[t.action_key]
            t.returns = credit.q[t.action_key]
        batch.metrics["train/tree_nodes"] = float(len(credit.children))
        batch.metrics["train/tree_branch_nodes"] = float(sum(len(k) > 1 for k in credit.children.values()))

    def _add_step_groups(self, batch: RolloutBatch) -> None:
        """GiGPO: + ``step_group_weight`` x the step-level advantage of each action: its return
        from its step on (discounted by ``turn_gamma`` per turn) against the mean over the
        group's actions taken from the same observation (:func:`~marft_algos.credit.step_group_advantages`)."""
        c = self.config
        firsts: list[Transition] = []  # each action's first segment: the observation it was taken from
        returns: list[float] = []
        for ep in batch.episodes:
            trs = [t for t in ep.transitions if not t.shadow]
            if not trs:
                continue
            if self.reward_source == "agent":  # the agent's own later rewards (MARS' turn return)
                _, G = turn_level_advantages([t.credited_reward for t in trs], [t.agent for t in trs], gamma=c.turn_gamma,
                                             normalize="none", action_ids=[t.action_key for t in trs])
                ret = dict(zip([id(t) for t in trs], G.tolist(), strict=True))
            else:  # the team rewards of this turn and the later ones
                by_turn = {t.turn: t.team_reward for t in trs}
                ret = {id(t): sum(c.turn_gamma ** (u - t.turn) * r for u, r in by_turn.items() if u >= t.turn) for t in trs}
            seen: set[Any] = set()
            for t in trs:
                if t.action_key not in seen:
                    seen.add(t.action_key)
                    firsts.append(t)
                    returns.append(ret[id(t)])
        adv = step_group_advantages(
            returns, [observation_key(t.agent, t.prompt_ids) for t in firsts], [t.group_id for t in firsts],
            scale=c.scale_rewards and c.normalize_advantages != "none",
        )
        step = {t.action_key: float(a) for t, a in zip(firsts, adv.tolist(), strict=True)}
        for t in batch.transitions:
            t.advantage = float(t.advantage or 0.0) + c.step_group_weight * step.get(t.action_key, 0.0)
        batch.metrics["train/step_group_frac"] = float(np.mean([abs(a) > 0 for a in adv])) if len(adv) else 0.0

    def _turn_advantages(self, batch: RolloutBatch) -> None:
        """MARS: each action's return from its agent's own later rewards, normalised per
        (group, agent) (see :func:`~marft_algos.advantages.turn_level_advantages`)."""
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
            normalize={"agent": "agent", "agent_turn": "agent_turn", "group": "batch", "none": "none"}[c.normalize_advantages],
            group_ids=[t.group_id for t in trs],
            action_ids=[t.action_key for t in trs],
            turn_ids=[t.turn for t in trs],
        )
        for t, a, r in zip(trs, adv.tolist(), ret.tolist(), strict=True):
            t.advantage, t.returns = float(a), float(r)


class GRPOTrainer(Trainer):
    """GRPO: group-relative advantages, clipped surrogate, optional KL to the reference."""

    config_cls = GRPOConfig
    algorithm_cls = GRPO
