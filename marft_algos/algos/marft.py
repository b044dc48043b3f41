"""The MARFT base shared by action- and token-level MARFT: config, critic, schedule, KL cut, recovery.

:class:`MARFTConfig` holds the settings both levels share (chain GAE discounts, PPO loss,
critic, agent-by-agent schedule, collapse recovery); :class:`MARFTBase` the parts
(critic built on the frozen base and its ``critic`` loss term, critic warm-up,
agent-by-agent schedule, collapse recovery as a loop callback, the critic's checkpoint). The two levels differ in their
advantage estimator and losses: :mod:`marft_algos.algos.marft_action` and
:mod:`marft_algos.algos.marft_token`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

import torch

from marft_algos import losses
from marft_algos.algorithm import Algorithm, Terms, whiten
from marft_algos.algos.critic import Critic
from marft_algos.branching import tree_paths
from marft_algos.buffer import token_field
from marft_algos.config import (
    BranchingConfig,
    ConfigError,
    CriticConfig,
    PPOLossConfig,
    RecoveryConfig,
    TrainConfig,
    check_at_least,
    check_normalization,
)
from marft_algos.credit import leaf_returns_to_go, tree_credit
from marft_algos.optim import CRITIC_KEY
from marft_algos.records import RolloutBatch, Transition
from marft_algos.recovery import CollapseRecovery
from marft_algos.reward_source import env_has_team_reward

__all__ = ["MARFTBase", "MARFTConfig"]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class MARFTConfig(BranchingConfig, CriticConfig, PPOLossConfig, TrainConfig):
    """Settings shared by action- and token-level MARFT (chain GAE, PPO, critic, schedule, recovery)."""

    # --- chain GAE -----------------------------------------------------------------
    gamma_agent: float = field(default=0.99, metadata={"help": "Discount of a hop to the next agent inside a turn (reference: 0.99)."})
    lam_agent: float = field(default=0.95, metadata={"help": "GAE lambda of a hop to the next agent inside a turn (reference: 0.95)."})
    gamma_turn: float = field(default=0.99, metadata={"help": "Discount of a hop from a turn's last agent to the next turn (reference: 0.99)."})
    lam_turn: float = field(default=0.95, metadata={"help": "GAE lambda of a hop to the next turn (reference: 0.95)."})
    normalize_advantages: str = field(default="none", metadata={"help": "'none' (raw GAE advantages), 'batch' (whiten over all trainable actions, as the reference) or 'agent' (whiten per agent)."})
    # --- policy loss (the rest: PPOLossConfig) ---------------------------------------
    kl_threshold: float | None = field(default=None, metadata={"help": "KL hard cut: skip an agent's policy step when approx KL(old || new) exceeds this before the step, and undo it when the updated policy exceeds it on the same minibatch after the step (the reference hard-coded 1e-3); None disables it."})
    # --- critic (the rest: CriticConfig) ---------------------------------------------
    critic_per_agent: bool = field(default=False, metadata={"help": "One value head per agent instead of one shared critic."})
    critic_lora: bool = field(default=False, metadata={"help": "Give the critic its own LoRA adapter on the base (trained with the head; disables the hidden-state cache)."})
    critic_warmup_steps: int = field(default=0, metadata={"help": "Training steps at the start where only the critic trains."})
    # --- schedule ------------------------------------------------------------------
    agent_by_agent: bool = field(default=False, metadata={"help": "Sequential updates: after the critic warm-up, update k (k counted from 0 after critic_warmup_steps) steps only the ((k // agent_interval) mod n)-th of the n agents that acted in the batch (team order); the critic trains on every agent's data."})
    agent_interval: int = field(default=1, metadata={"help": "Updates per agent turn in agent-by-agent mode."})
    # --- collapse recovery ---------------------------------------------------------
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig, metadata={"help": "Collapse recovery (nested: recovery.<setting>=...; recovery=false switches it off)."})

    def chain_discounts(self) -> dict[str, float]:
        """The chain's hop discounts as keyword arguments of the estimators in :mod:`marft_algos.advantages`."""
        return {"gamma_agent": self.gamma_agent, "lam_agent": self.lam_agent, "gamma_turn": self.gamma_turn, "lam_turn": self.lam_turn}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("gamma_agent", "lam_agent", "gamma_turn", "lam_turn"):
            v = getattr(self, name)
            _check(0 <= v <= 1, f"{name} must be in [0, 1], got {v}")
        check_normalization(self.normalize_advantages, ("none", "batch", "agent"), type(self).__name__)
        _check(self.kl_threshold is None or self.kl_threshold > 0, f"kl_threshold must be > 0 or None, got {self.kl_threshold}")
        # the critic's optimizer is stepped by vf_coef * its loss alone: 0 would freeze it
        _check(self.vf_coef > 0, f"vf_coef must be > 0, got {self.vf_coef}")
        check_at_least(self, {"critic_warmup_steps": 0, "agent_interval": 1})
        _check(self.importance_ratio == "token", f"{type(self).__name__} has its own ratios (per action or per token); "
               f"importance_ratio={self.importance_ratio!r} is for GRPO and IPPO: leave it at 'token'")
        _check(
            not (self.critic_lora and self.distributed.strategy == "fsdp"),
            "critic_lora=True is not supported with distributed.strategy='fsdp' (the critic's adapter would train through "
            "the sharded backbone outside FSDP's root forward): use the default frozen-base critic, or strategy='ddp'",
        )
        _check(
            not (self.agent_by_agent and self.mode == "shared"),
            "agent_by_agent needs one adapter per agent: with mode='shared' every agent's policy is the one shared "
            "adapter, so a step on one agent's data moves all agents and the schedule would not hold the others fixed",
        )


class MARFTBase(Algorithm):
    """The parts shared by action- and token-level MARFT: critic, schedule, KL cut, recovery.

    Subclasses implement :meth:`estimate`, :meth:`critic_loss` and :meth:`policy_loss`.
    """

    config: MARFTConfig
    #: the critic learns from every agent's actions, frozen or unscheduled ones too
    value_on_all_agents = True

    def __init__(self, trainer: Any, *, value_model: Any = None) -> None:
        super().__init__(trainer)
        self._value_model_arg = value_model
        self.recovery: Any = None

    # ---- modules -------------------------------------------------------------------
    def setup(self) -> None:
        """Build the critic (shared head by default, per agent on request) on the frozen base."""
        c = self.config
        self.critic = Critic(self.trainer.policy, self.agents, per_agent=c.critic_per_agent, lora=c.critic_lora, value_model=self._value_model_arg)
        c.branch_collector(self.collector)  # branching > 1: trees (marft_algos.branching)

    # ---- tree credit (branching > 1) ----------------------------------------------------
    def tree_credit(self, batch: RolloutBatch) -> Any:
        """The batch's tree statistics (:func:`marft_algos.credit.tree_credit`) on each leaf's
        return-to-go from every action of its path: the actions' own step rewards, discounted
        by ``gamma_agent`` (hop inside a turn) and ``gamma_turn`` (hop to the next turn) like
        the chain GAE, with no bootstrap (a Monte-Carlo return). ``q[a]`` is then an action's
        Monte-Carlo value, ``v[node]`` the value of the observation its siblings share."""
        c = self.config
        paths = tree_paths(batch.episodes)
        returns = []
        for ep, path in zip(batch.episodes, paths, strict=True):
            reward: dict[Any, float] = {}
            turn: dict[Any, int] = {}
            for t in ep.transitions:  # an action's tool segments add up (one action)
                reward[t.action_key] = reward.get(t.action_key, 0.0) + float(t.reward)
                turn.setdefault(t.action_key, t.turn)
            keys = [a for _, a in path]
            hops = [c.gamma_agent if turn[b] == turn[a] else c.gamma_turn for a, b in zip(keys, keys[1:], strict=False)] + [0.0]
            returns.append(leaf_returns_to_go([reward[k] for k in keys], hops))
        credit = tree_credit(paths, returns)
        batch.metrics["train/tree_nodes"] = float(len(credit.children))
        batch.metrics["train/tree_branch_nodes"] = float(sum(len(k) > 1 for k in credit.children.values()))
        return credit

    def param_groups(self) -> dict[str, tuple[list[torch.nn.Parameter], float]]:
        """The critic's group (``critic`` terms: :data:`~marft_algos.optim.CRITIC_KEY`)."""
        return {CRITIC_KEY: (self.critic.parameters(), self.config.critic_lr)}

    def check(self) -> None:
        """Agent-by-agent needs separate parameters per agent; one value chain needs a team reward."""
        t = self.trainer
        if self.config.agent_by_agent:
            trained = t.trainable_agents()
            shared = [a for a in trained if any(b != a and t.optimizers[b] is t.optimizers[a] for b in trained)]
            if shared:
                raise ConfigError(
                    f"agent_by_agent needs separate parameters per agent, but {shared} share theirs (mode={self.config.mode!r} or "
                    "profiles naming one adapter): a step on one agent's data would move the others too"
                )
        env = self.collector.envs[0]
        if not env_has_team_reward(env):  # one value chain = one shared return
            raise ConfigError(
                f"{type(t).__name__} credits one team return through one chain of all agents' actions, but "
                f"{type(env).__name__} gives each agent its own reward (a game): use 'grpo' or 'ippo' "
                "(they train on each agent's own rewards there)"
            )

    def callbacks(self) -> list[Any]:
        """Collapse recovery (``recovery.enabled``)."""
        if not self.config.recovery.enabled:
            return []

        self.recovery = CollapseRecovery(self.trainer, self.config.recovery)
        return [self.recovery]

    # ---- schedule ------------------------------------------------------------------
    def scheduled_agents(self, step: int | None = None, present: typing.Collection[str] | None = None) -> list[str]:
        """Agents whose policy steps at update ``step`` (default: the current one).

        Agent-by-agent, the schedule cycles over the agents ``present`` in the batch (team
        order; default all): with a routed team an absent agent has no data, and scheduling
        it would leave the update without any policy step.
        """
        c = self.config
        k = self.trainer.global_step if step is None else step
        # frozen agents never step their policy
        pool = [a for a in self.trainer.trainable_agents() if present is None or a in present]
        if k < c.critic_warmup_steps or not pool:
            return []
        if not c.agent_by_agent:
            return pool
        return [pool[((k - c.critic_warmup_steps) // c.agent_interval) % len(pool)]]

    def policy_agents(self, step: int, present: typing.Collection[str]) -> list[str]:
        """The scheduled agents (critic warm-up: none; agent-by-agent: one)."""
        return self.scheduled_agents(step, present)

    # ---- losses ----------------------------------------------------------------------
    def value_losses(self, agent: str, mb: list[Transition]) -> Terms:
        """``vf_coef`` x the critic's loss on ``agent``'s minibatch (the ``critic`` term: never vetoed by the KL cut)."""
        loss, metrics = self.critic_loss(agent, mb)
        return {"critic": (self.config.vf_coef * loss, metrics)}

    def critic_loss(self, agent: str, mb: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's loss on ``agent``'s minibatch and its metrics (implemented per level)."""
        raise NotImplementedError

    def regularize(self, agent: str, mb: list[Transition], stats: Any, loss: torch.Tensor, m: dict[str, float]) -> torch.Tensor:
        """Add the entropy bonus and the KL penalty to the reference to a policy loss."""
        c = self.config
        ref = token_field(mb, "ref_logp", stats.logprobs.shape[1], stats.logprobs.device) if c.beta > 0 else None
        return losses.regularize(loss, stats, stats.mask.float(), ref_logp=ref, beta=c.beta, ent_coef=c.ent_coef, metrics=m, prefix=f"agent/{agent}")

    def normalize(self, batch: RolloutBatch, get: Any, put: Any) -> None:
        """Normalise advantages over trainable transitions (batch-wide or per agent)."""
        mode = self.config.normalize_advantages
        if mode == "none":
            return
        groups = [batch.agent_transitions(a) for a in self.agents] if mode == "agent" else [[t for t in batch.transitions if t.trainable]]
        whiten(groups, get, put, self.dist)

    # ---- checkpoint: critic ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The critic's weights."""
        return {"critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.critic.load_state_dict(state["critic"])
