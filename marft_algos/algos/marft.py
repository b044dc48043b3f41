"""The MARFT base shared by action- and token-level MARFT: config, critic, schedule, KL cut, recovery.

:class:`MARFTConfig` holds the settings both levels share (chain GAE discounts, PPO loss,
critic, agent-by-agent schedule, collapse recovery); :class:`MARFTTrainerBase` the
machinery (critic built on the frozen base, critic warm-up, agent-by-agent schedule,
KL hard cut, collapse recovery, critic checkpointing). The two levels differ in their
advantage estimator and losses: :mod:`marft_algos.algos.marft_action` and
:mod:`marft_algos.algos.marft_token`.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marft_algos.buffer import token_field
from marft_algos.config import (
    ConfigError,
    CriticConfig,
    PPOLossConfig,
    RecoveryConfig,
    TrainConfig,
    check_at_least,
    check_normalization,
)
from marft_algos.rollout import RolloutBatch, Transition
from marft_algos.trainer import CRITIC_KEY, Trainer

__all__ = ["MARFTConfig", "MARFTTrainerBase"]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass
class MARFTConfig(CriticConfig, PPOLossConfig, TrainConfig):
    """Settings shared by action- and token-level MARFT (chain GAE, PPO, critic, schedule, recovery)."""

    # --- chain GAE -----------------------------------------------------------------
    gamma_agent: float = field(default=0.99, metadata={"help": "Discount of a hop to the next agent inside a turn (reference: 0.99)."})
    lam_agent: float = field(default=0.95, metadata={"help": "GAE lambda of a hop to the next agent inside a turn (reference: 0.95)."})
    gamma_turn: float = field(default=0.99, metadata={"help": "Discount of a hop from a turn's last agent to the next turn (reference: 0.99)."})
    lam_turn: float = field(default=0.95, metadata={"help": "GAE lambda of a hop to the next turn (reference: 0.95)."})
    normalize_advantages: str = field(default="none", metadata={"help": "'none' (raw GAE advantages), 'batch' (whiten over all trainable actions, as the reference) or 'agent' (whiten per agent)."})
    # --- policy loss (the rest: PPOLossConfig) ---------------------------------------
    kl_threshold: float | None = field(default=None, metadata={"help": "KL hard cut: skip an agent's policy step when approx KL(old || new) exceeds this (the reference hard-coded 1e-3); None disables it."})
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


class MARFTTrainerBase(Trainer):
    """Machinery shared by action- and token-level MARFT: critic, schedule, KL cut, recovery.

    Subclasses implement :meth:`compute_advantages`, :meth:`critic_loss` and
    :meth:`policy_loss`.
    """

    config: MARFTConfig

    def __init__(self, config: MARFTConfig, *, value_model: Any = None, **kwargs: Any) -> None:
        self._value_model_arg = value_model
        self._step_keys: list[str] | None = None
        self._active: set[str] = set()
        self.lr_scale = 1.0
        super().__init__(config, **kwargs)
        if config.agent_by_agent:
            trained = self.trainable_agents()
            shared = [a for a in trained if any(b != a and self.optimizers[b] is self.optimizers[a] for b in trained)]
            if shared:
                raise ConfigError(
                    f"agent_by_agent needs separate parameters per agent, but {shared} share theirs (mode={config.mode!r} or "
                    "profiles naming one adapter): a step on one agent's data would move the others too"
                )
        from marft_algos.reward_source import env_has_team_reward

        if not env_has_team_reward(self.collector.envs[0]):  # one value chain = one shared return
            raise ConfigError(
                f"{type(self).__name__} credits one team return through one chain of all agents' actions, but "
                f"{type(self.collector.envs[0]).__name__} gives each agent its own reward (a game): use 'grpo' or 'ippo' "
                "(they train on each agent's own rewards there)"
            )
        self.recovery = None
        if config.recovery.enabled:
            from marft_algos.recovery import CollapseRecovery

            self.recovery = CollapseRecovery(self, config.recovery)

    # ---- modules -------------------------------------------------------------------
    def setup(self) -> None:
        """Build the critic (shared head by default, per agent on request) on the frozen base."""
        from marft_algos.algos.critic import Critic

        c = self.config
        self.critic = Critic(self.policy, self.agents, per_agent=c.critic_per_agent, lora=c.critic_lora, value_model=self._value_model_arg)

    def build_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The policy optimizers plus the critic's (:data:`~marft_algos.trainer.CRITIC_KEY`), at the current rollback lr scale."""
        opts = super().build_optimizers()
        opts[CRITIC_KEY] = torch.optim.AdamW(self.critic.parameters(), lr=self.config.critic_lr * self.lr_scale, eps=self.config.adam_eps)
        return opts

    def optimizer_keys(self, agent: str) -> list[str]:
        # train_minibatch steps the critic and the agent's policy separately, so that a KL hard
        # cut (or a non-finite policy loss) never stops the critic from training
        """The agent's policy optimizer, or the critic's while :meth:`critic_step` runs."""
        return list(self._step_keys) if self._step_keys is not None else [agent]

    # ---- schedule ------------------------------------------------------------------
    def scheduled_agents(self, step: int | None = None, present: typing.Collection[str] | None = None) -> list[str]:
        """Agents whose policy steps at update ``step`` (default: the current one).

        Agent-by-agent, the schedule cycles over the agents ``present`` in the batch (team
        order; default all): with a routed team an absent agent has no data, and scheduling
        it would leave the update without any policy step.
        """
        c = self.config
        k = self.global_step if step is None else step
        # frozen agents never step their policy
        pool = [a for a in self.trainable_agents() if present is None or a in present]
        if k < c.critic_warmup_steps or not pool:
            return []
        if not c.agent_by_agent:
            return pool
        return [pool[((k - c.critic_warmup_steps) // c.agent_interval) % len(pool)]]

    def update_agents(self, batch: RolloutBatch) -> list[str]:
        """Every agent with data, frozen ones included: the critic learns from all actions."""
        present = set(batch.agents)
        return [a for a in self.agents if a in present]

    def prepare_update(self, batch: RolloutBatch, chunk: int = 16) -> None:
        # no policy update at this step (critic warm-up): no old/reference log-probs needed
        """Old / reference log-probs, skipped when no policy steps (critic warm-up)."""
        if self.scheduled_agents():
            super().prepare_update(batch, chunk)

    #: the metric the KL hard cut compares with ``kl_threshold`` (``agent/<a>/<name>``)
    cut_kl_name: str = "kl"

    def before_optimizer_step(self, agent: str, metrics: dict[str, float]) -> bool:
        """KL hard cut: skip this agent's policy step when approx KL(old || new) > kl_threshold."""
        th = self.config.kl_threshold
        if self._step_keys is not None or th is None:  # never cut the critic
            return True
        kl = metrics.get(f"agent/{agent}/{self.cut_kl_name}")
        if kl is not None and kl > th:
            self.counters["train/kl_cuts"] += 1
            self.counters[f"agent/{agent}/kl_cuts"] += 1
            metrics[f"agent/{agent}/kl_cut"] = 1.0
            return False
        metrics[f"agent/{agent}/kl_cut"] = 0.0
        return True

    # ---- update ----------------------------------------------------------------------
    def train_minibatch(self, agent: str, mb: list[Transition], *, epoch: int = 0) -> dict[str, float]:
        """Critic step on ``agent``'s minibatch (always), then its policy step if scheduled."""
        metrics = self.critic_step(agent, mb)
        if agent in self._active:
            metrics.update(super().train_minibatch(agent, mb, epoch=epoch))
        return metrics

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """Critic on every agent's data; policy steps for the scheduled agents only."""
        self._active = set(self.scheduled_agents(present=[a for a in self.agents if batch.agent_transitions(a)]))
        out = super().update(batch)
        for agent in self.agents:
            out[f"agent/{agent}/policy_updated"] = float(agent in self._active)
        return out

    def critic_step(self, agent: str, mb: list[Transition]) -> dict[str, float]:
        """One guarded critic optimizer step on ``agent``'s minibatch (never vetoed by the KL cut)."""
        loss, metrics = self.critic_loss(agent, mb)
        self._step_keys = [CRITIC_KEY]
        try:
            ok, norms = self.optimizer_step(agent, self.config.vf_coef * loss, metrics)
        finally:
            self._step_keys = None
        if CRITIC_KEY in norms:
            metrics["critic/grad_norm"] = norms[CRITIC_KEY]
        return {k: v for k, v in metrics.items() if math.isfinite(v)}

    def critic_loss(self, agent: str, mb: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's loss on ``agent``'s minibatch and its metrics (implemented per level)."""
        raise NotImplementedError

    def entropy_and_penalties(self, agent: str, mb: list[Transition], stats: Any, loss: torch.Tensor, m: dict[str, float]) -> torch.Tensor:
        """Add the entropy bonus and the KL penalty to the reference to a policy loss."""
        from marft_algos import losses

        c = self.config
        mask = stats.mask.float()
        m[f"agent/{agent}/entropy"] = float(losses.masked_mean(stats.entropy.detach(), mask))
        if c.ent_coef > 0:
            loss = loss - losses.entropy_bonus(stats.entropy, mask, c.ent_coef)
        ref = token_field(mb, "ref_logp", stats.logprobs.shape[1], stats.logprobs.device) if c.beta > 0 else None
        if ref is not None:
            kl = losses.kl_to_reference(stats.logprobs, ref, mask)
            loss = loss + c.beta * kl
            m[f"agent/{agent}/ref_kl"] = float(kl.detach())
        return loss

    # ---- advantages helpers ------------------------------------------------------------
    def normalize(self, batch: RolloutBatch, get: Any, put: Any) -> None:
        """Normalise advantages over trainable transitions (batch-wide or per agent)."""
        mode = self.config.normalize_advantages
        if mode == "none":
            return
        groups = [batch.agent_transitions(a) for a in self.agents] if mode == "agent" else [[t for t in batch.transitions if t.trainable]]
        for trs in groups:
            flat = np.concatenate([np.atleast_1d(get(t)) for t in trs]) if trs else np.zeros(0)
            mu, sd, n = self.dist.moments(flat)  # over every rank's batch
            if n < 2 or not trs:
                continue
            for t in trs:
                put(t, (np.asarray(get(t)) - mu) / (sd + 1e-8))

    # ---- loop: recovery --------------------------------------------------------------------
    def train_step(self, num_groups: int | None = None) -> dict[str, float]:
        """One step, then the collapse check (which may roll back)."""
        if self.recovery is not None and self.recovery.good is None:
            self.recovery.start()  # the starting weights are the first good checkpoint
        m = super().train_step(num_groups)
        if self.recovery is not None:
            self.recovery.after_step(m)
        return m

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Train as the runtime does; the recovery checkpoints are forgotten at the end."""
        try:
            return super().train(steps)
        finally:
            if self.recovery is not None:
                self.recovery.close()

    # ---- checkpoint: critic ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The runtime's state plus the critic, the rollback lr scale and the collapse
        detector's baselines (a resumed run does not re-arm its warm-up)."""
        state = super().state_dict()
        state["critic"] = self.critic.state_dict()
        state["lr_scale"] = self.lr_scale
        recovery = getattr(self, "recovery", None)
        if recovery is not None:
            state["recovery"] = recovery.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], parts: typing.Collection[str] | None = None) -> None:
        """Restore :meth:`state_dict`, or its ``parts``: the critic with the ``weights``, the
        rollback lr scale with the ``schedulers`` (it is in their states), the collapse
        detector with the ``progress``."""
        from marft_algos.checkpoint import check_parts

        chosen = check_parts(parts)
        if "weights" in chosen:
            self.critic.load_state_dict(state["critic"])
        if "schedulers" in chosen:
            self.lr_scale = float(state.get("lr_scale", 1.0))
        recovery = getattr(self, "recovery", None)
        if "progress" in chosen and recovery is not None and "recovery" in state:
            recovery.load_state_dict(state["recovery"])
        super().load_state_dict(state, chosen)
