"""Action-level MARFT: PPO over the chain of agents' actions with a shared critic.

Paper: Multi-Agent Reinforcement Fine-Tuning (arXiv 2504.16129), the action-level
algorithm; semantics of the paper's reference implementation, with its verified
defects fixed. One training step reads like the paper::

    batch = collect()                                   # agent i sees the prompt + actions of its predecessors
    V_n   = critic(o_n)                                 # frozen base + value head, at agent n's observation
    A, R  = GAE over the executed chain (t,0)->(t,1)->...->(t,N-1)->(t+1,0)
    for each agent i scheduled at this step:            # all agents, or one (agent-by-agent)
        rho   = exp(log pi_i(a|o) - log pi_old(a|o))    # whole-action log-probs, sum|token|word normalised
        L_pi  = max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high)) - c_ent H + beta KL(pi_i || pi_ref)
        skip the step if approx KL(pi_old || pi_i) > kl_threshold      (the reference's hard cut)
    L_V = huber_or_mse(R - V) (optionally clipped)      # the critic trains on every agent's data, always

The chain's successor of an action is the next action actually executed in the
episode (fixed order, DAG or dynamic route alike); a hop inside a turn uses
``gamma_agent/lam_agent``, a hop to the next turn ``gamma_turn/lam_turn`` (defaults
0.99/0.95 everywhere reproduce the reference). The chain reward of an action is the
reward its own step produced (``Transition.reward``): the team reward arrives once,
at the agent that closes the turn (the answering agent in the built-in teams), and
earlier agents are credited through the bootstrapped chain.

Agent-by-agent updates (``agent_by_agent=True``): at update k (counted after the critic
warm-up) only agent ``present[(k // agent_interval) % len(present)]`` steps its
optimizer, ``present`` being the agents with trainable actions in the batch. Default: simultaneous
updates (see ``docs/algorithms.md``: on a CPU the rollout dominates the step time, and
a sequential schedule uses 1/N of each batch for the policy; the trust region already
bounds the non-stationarity each agent sees from the others).

Collapse recovery (``recovery=True``, default): see :mod:`marft_algos.recovery`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from marft_algos import losses
from marft_algos.algos.critic import ActionValueEstimation
from marft_algos.algos.marft import MARFTBase, MARFTConfig, _check
from marft_algos.buffer import action_field
from marft_algos.losses import explained_variance
from marft_algos.records import RolloutBatch, Transition
from marft_algos.trainer import Trainer

__all__ = ["MARFTAction", "MARFTActionConfig", "MARFTActionTrainer"]


@dataclass
class MARFTActionConfig(MARFTConfig):
    """Action-level MARFT: chain GAE over (turn, agent) actions, whole-action PPO ratios, a critic."""

    logprob_norm: str = field(default="token", metadata={"help": "Whole-action log-prob in the ratio: 'sum', 'token' (divide by token count) or 'word' (divide by word count)."})


    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.logprob_norm in ("sum", "token", "word"), f"logprob_norm must be 'sum', 'token' or 'word', got {self.logprob_norm!r}")


class MARFTAction(ActionValueEstimation, MARFTBase):
    """Action-level MARFT's parts: chain GAE over executed actions, whole-action PPO ratios, shared critic."""

    config: MARFTActionConfig
    #: the KL hard cut reads the ratio's own quantity, the normalised whole-action log-prob
    kl_cut_metric = "action_kl"
    #: one ratio per action: the loss is a mean over actions (weights pieces and ranks)
    loss_units = "actions"

    # ---- values and advantages -----------------------------------------------------------
    def estimate(self, batch: RolloutBatch) -> None:
        """Action-level GAE over each episode's executed chain (see module docstring; ``V(o)``
        from the shared critic, computed if not set)."""
        from marft_algos.advantages import action_level_gae

        c = self.config
        trs = self.valued_transitions(batch)
        if not trs:
            return
        if c.branching > 1:
            self._tree_estimate(batch, trs)
            return
        adv, ret = action_level_gae(
            [t.reward for t in trs],
            [t.value for t in trs],
            [t.turn for t in trs],
            [t.episode_id for t in trs],
            # an action without a value (its prompt did not fit) passes the chain through
            passthrough=[not t.trainable for t in trs],
            **c.chain_discounts(),
        )
        for t, a, r in zip(trs, adv.tolist(), ret.tolist(), strict=True):
            t.advantage, t.returns = float(a), float(r)

        def put(t: Transition, v: Any) -> None:
            t.advantage = float(v)

        self.normalize(batch, lambda t: t.advantage, put)

    def _tree_estimate(self, batch: RolloutBatch, trs: list[Transition]) -> None:
        """``branching > 1``: the tree's Monte-Carlo values replace the chain GAE.

        The critic's target for an action's observation is ``V(node)``, the mean of the
        Monte-Carlo values of the siblings sampled there (an unbiased return of that very
        observation, where GAE would bootstrap from the critic's own early guesses); the
        advantage is ``Q(a) - V(node)`` (counterfactual: the predecessors are held fixed)
        where the node has siblings, and ``Q(a) - V_critic(o)`` where it has one action (a
        budgeted tree's single chains): the critic is the baseline only where the tree has none.
        """
        credit = self.tree_credit(batch)
        for t in trs:
            node = credit.parent[t.action_key]
            t.returns = credit.v[node]
            if len(credit.children[node]) > 1:
                t.advantage = credit.advantage[t.action_key]
            else:
                t.advantage = credit.q[t.action_key] - float(t.value or 0.0)

        def put(t: Transition, v: Any) -> None:
            t.advantage = float(v)

        self.normalize(batch, lambda t: t.advantage, put)

    # ---- losses ----------------------------------------------------------------------------
    def critic_loss(self, agent: str, mb: list[Transition]) -> tuple[torch.Tensor, dict[str, float]]:
        """Value loss of ``V(o)`` against the action-level returns (optionally clipped)."""
        c = self.config
        v = self.critic.minibatch_action_values(agent, mb)
        returns = action_field(mb, "returns", v.dtype, v.device)
        old_v = action_field(mb, "values", v.dtype, v.device)
        loss = losses.value_loss(v, returns, old_v, kind=c.value_loss, delta=c.huber_delta, clip=c.value_clip)
        return loss, {
            f"agent/{agent}/value_loss": float(loss.detach()),
            f"agent/{agent}/value_mean": float(v.detach().mean()),
            f"agent/{agent}/return_mean": float(returns.mean()),
            f"agent/{agent}/explained_variance": explained_variance(v.detach(), returns),
        }

    def policy_loss(self, agent: str, mb: list[Transition], stats: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate on whole-action log-probs (+ entropy bonus, KL to the reference)."""
        c = self.config
        mask = stats.mask.float()
        behaviour = self.trainer.behaviour
        old_tok = behaviour.old_logprobs(mb, stats)
        n_words = [max(1, len(t.text.split())) for t in mb] if c.logprob_norm == "word" else None
        logp = losses.action_logprob(stats.logprobs, mask, c.logprob_norm, n_words)
        old = losses.action_logprob(old_tok, mask, c.logprob_norm, n_words)
        adv = action_field(mb, "advantages", logp.dtype, logp.device)
        m: dict[str, float] = {}
        pg_adv = adv
        engine_tok = behaviour.engine_logprobs(mb, stats)
        if engine_tok is not None:  # the engine kept its own log-probs: one truncated IS weight per action
            engine = losses.action_logprob(engine_tok, mask, c.logprob_norm, n_words)
            weights, tis = losses.truncated_is_weights(old, engine, None, c.tis_cap)
            pg_adv = adv * weights
            m[f"agent/{agent}/tis_clipped_frac"] = float(tis["tis_clipped_frac"])
            m[f"agent/{agent}/engine_logp_gap"] = float(losses.masked_mean((old_tok - engine_tok).abs(), mask))  # per token
        loss, info = losses.ppo_policy_loss(logp, old, pg_adv, None, eps_low=c.eps_low, eps_high=c.eps_high)
        m.update({f"agent/{agent}/{k}": float(v) for k, v in info.items()})
        m[f"agent/{agent}/policy_loss"] = float(loss.detach())
        # per token (comparable across algorithms; watched by collapse recovery) and on the
        # ratio's own quantity, the normalised whole-action log-prob (the KL hard cut's input)
        m[f"agent/{agent}/kl"] = float(losses.approx_kl(stats.logprobs.detach(), old_tok, mask))
        m[f"agent/{agent}/action_kl"] = float(losses.approx_kl(logp.detach(), old))
        m[f"agent/{agent}/advantage_mean"] = float(adv.mean())
        loss = self.regularize(agent, mb, stats, loss, m)
        return loss, m


class MARFTActionTrainer(Trainer):
    """Action-level MARFT: chain GAE over executed actions, whole-action PPO ratios, shared critic."""

    config_cls = MARFTActionConfig
    algorithm_cls = MARFTAction
