"""Independent PPO (IPPO): every agent is its own PPO learner.

Each agent has its own value head on the frozen base model: V_i(o) is read from the
last hidden state of the agent's observation (its prompt ids). GAE runs over each
agent's own transitions of an episode, in order, with no chaining across agents
(contrast with action-level MARFT, where agent i bootstraps from agent i+1):

    delta_k = r_k + gamma * V_i(o_{k+1}) * (1 - done_k) - V_i(o_k)
    A_k     = delta_k + gamma * lam * (1 - done_k) * A_{k+1}
    R_k     = A_k + V_i(o_k)

``r_k`` is the team reward of the turn of action k (``reward_source="team"``; an action
of several tool segments is one action: the reward enters at its last segment) or the
reward credited to the agent for action k (``reward_source="agent"``: PettingZoo's
cumulative rewards, so a game's -1 to the loser, given on the winner's move, counts);
``"auto"`` (default) picks ``"agent"`` for envs without a team reward (games).
``advantage_estimator="turn"`` replaces GAE with MARS's turn-level returns. The loss per agent is the PPO clipped surrogate
(+ optional entropy bonus and KL to the reference) plus ``vf_coef`` times the value
loss of that agent's head; the head has its own optimizer (``__value__/<agent>``, metrics ``value/<agent>/...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from marft_algos import losses
from marft_algos.algorithm import Algorithm, PPOPolicy, Terms, whiten
from marft_algos.algos.critic import ActionValueEstimation, Critic
from marft_algos.buffer import action_field
from marft_algos.config import (
    ConfigError,
    CriticConfig,
    PPOLossConfig,
    TrainConfig,
    check_normalization,
    with_default,
)
from marft_algos.losses import explained_variance
from marft_algos.optim import value_key
from marft_algos.records import RolloutBatch, Transition
from marft_algos.reward_source import RewardSourceSetting
from marft_algos.trainer import Trainer

__all__ = ["IPPO", "IPPOConfig", "IPPOTrainer"]


@dataclass
class IPPOConfig(CriticConfig, PPOLossConfig, TrainConfig):
    """Independent PPO: each agent is its own PPO learner with its own value head.

    Value heads sit on the frozen base model (one per agent); GAE runs over each
    agent's own transitions only, no chaining across agents.
    """

    gamma: float = field(default=0.99, metadata={"help": "Discount between an agent's consecutive actions (turns)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda."})
    reward_source: str = field(default="auto", metadata={"help": "'team': each action gets its turn's team reward; 'agent': the rewards credited to the agent for that action (PettingZoo cumulative rewards); 'auto': 'agent' for envs without a team reward (games), else 'team'."})
    advantage_estimator: str = field(default="gae", metadata={"help": "'gae': per-agent GAE with the value heads; 'turn': MARS turn-level advantages (each action's discounted return from its agent's own later rewards, normalised as normalize_advantages says; the value heads still learn those returns)."})
    normalize_advantages: str = field(default="agent", metadata={"help": "'agent' (whiten per agent within the batch), 'batch' (over all trainable actions) or 'none'."})
    value_loss: str = with_default(CriticConfig, "value_loss", "mse")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0 <= self.gamma <= 1):
            raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}")
        if not (0 <= self.lam <= 1):
            raise ConfigError(f"lam must be in [0, 1], got {self.lam}")
        if self.reward_source not in ("auto", "team", "agent"):
            raise ConfigError(f"reward_source must be 'auto', 'team' or 'agent', got {self.reward_source!r}")
        if self.advantage_estimator not in ("gae", "turn"):
            raise ConfigError(f"advantage_estimator must be 'gae' or 'turn', got {self.advantage_estimator!r}")
        check_normalization(self.normalize_advantages, ("none", "batch", "agent"), "ippo")


class IPPO(ActionValueEstimation, PPOPolicy, RewardSourceSetting, Algorithm):
    """IPPO's parts: per-agent value heads on the frozen base, per-agent GAE, PPO policy terms."""

    config: IPPOConfig

    def __init__(self, trainer: Any, *, value_model: Any = None) -> None:
        super().__init__(trainer)
        self._value_model_arg = value_model

    def check(self) -> None:
        """Resolve ``reward_source`` now: a wrong setting fails at construction, not mid-run."""
        _ = self.reward_source

    # ---- modules ---------------------------------------------------------------------
    def setup(self) -> None:
        """Build the per-agent value heads on the frozen base (or take the given value model)."""
        from marft_algos.models import ValueModel

        vm = self._value_model_arg
        self.value_model = vm if vm is not None else ValueModel(self.trainer.policy, per_agent=True)
        # the heads sit on the frozen base: its hidden states are computed once per step
        # (at advantage time) and the value loss only runs the heads on them
        self.critic = Critic(self.trainer.policy, self.agents, per_agent=True, value_model=self.value_model)

    def value_parameters(self, agent: str) -> list[torch.nn.Parameter]:
        """The trainable parameters of ``agent``'s value head."""
        vm = self.value_model
        if hasattr(vm, "trainable_parameters"):
            return [p for p in vm.trainable_parameters(agent) if p.requires_grad]
        return [p for p in vm.heads[agent].parameters() if p.requires_grad]

    def param_groups(self) -> dict[str, tuple[list[torch.nn.Parameter], float]]:
        """One group per value head (``value`` terms: :func:`~marft_algos.optim.value_key`)."""
        return {value_key(a): (self.value_parameters(a), self.config.critic_lr) for a in self.agents}

    # ---- values and advantages --------------------------------------------------------
    def estimate(self, batch: RolloutBatch) -> None:
        """Per-agent GAE over each agent's own chain (``V_i(o)`` from agent i's head, computed if not set)."""
        from marft_algos.advantages import per_agent_gae

        c = self.config
        trs = self.valued_transitions(batch)
        if not trs:
            return
        # own rewards: those credited to the action (t.reward, read right after the agent's own
        # step, is 0 for every agent but the one that closes the turn). The team reward is
        # written on every tool segment of an action: it enters once, at the action's last one.
        if self.reward_source == "team":
            from marft_algos.advantages import once_per_action

            rewards = once_per_action([t.team_reward for t in trs], [t.action_key for t in trs])
        else:
            rewards = [t.credited_reward for t in trs]
        if c.advantage_estimator == "turn":
            from marft_algos.advantages import turn_level_advantages

            # raw returns here, normalised below over every rank's batch like the GAE path
            adv, ret = turn_level_advantages(rewards, [t.agent for t in trs], [t.episode_id for t in trs], gamma=c.gamma,
                                             normalize="none", action_ids=[t.action_key for t in trs])
        else:
            adv, ret = per_agent_gae(
                rewards,
                [t.value for t in trs],
                agent_ids=[t.agent for t in trs],
                episode_ids=[t.episode_id for t in trs],
                gamma=c.gamma,
                lam=c.lam,
                # an agent's chain ends at its last action of the episode, or earlier if it was done
                terminal=self._terminal_flags(batch),
                # an action whose prompt did not fit has no value: the agent's previous action
                # bootstraps from its next real one
                passthrough=[not t.trainable for t in trs],
            )
        for t, a, r in zip(trs, adv.tolist(), ret.tolist(), strict=True):
            t.advantage, t.returns = float(a), float(r)
        if c.normalize_advantages != "none":
            groups = [batch.agent_transitions(a) for a in self.agents]
            if c.normalize_advantages == "batch":
                groups = [[t for g in groups for t in g]]
            whiten(groups, lambda t: t.advantage, _put_advantage, self.dist)  # over every rank's batch

    @staticmethod
    def _terminal_flags(batch: RolloutBatch) -> list[float]:
        flags = []
        for chain_ep in batch.episodes:
            last = {t.agent: t.index for t in chain_ep.transitions}
            flags += [1.0 if (t.done or last[t.agent] == t.index) else 0.0 for t in chain_ep.transitions]
        return flags

    # ---- losses ------------------------------------------------------------------------
    def value_losses(self, agent: str, mb: list[Transition]) -> Terms:
        """``vf_coef`` x the value loss of ``agent``'s head on the minibatch (a mean over actions)."""
        c = self.config
        v = self.critic.minibatch_action_values(agent, mb)
        returns = action_field(mb, "returns", v.dtype, v.device)
        old_v = action_field(mb, "values", v.dtype, v.device)
        vloss = losses.value_loss(v, returns, old_values=old_v, clip=c.value_clip, kind=c.value_loss, delta=c.huber_delta)
        return {"value": (c.vf_coef * vloss, {
            f"agent/{agent}/value_loss": float(vloss.detach()),
            f"agent/{agent}/value_mean": float(v.detach().mean()),
            f"agent/{agent}/explained_variance": explained_variance(v.detach(), returns),
        })}

    # ---- checkpoint: value heads ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every value head's weights."""
        return {"heads": {agent: [p.detach().cpu().clone() for p in self.value_parameters(agent)] for agent in self.agents}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` in place."""
        with torch.no_grad():
            for agent, tensors in state["heads"].items():
                for p, t in zip(self.value_parameters(agent), tensors, strict=True):
                    p.copy_(t.to(p.device, p.dtype))


def _put_advantage(t: Transition, v: Any) -> None:
    t.advantage = float(v)


class IPPOTrainer(Trainer):
    """Independent PPO: per-agent value heads on the frozen base, per-agent GAE."""

    config_cls = IPPOConfig
    algorithm_cls = IPPO
