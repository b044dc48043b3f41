"""What an algorithm supplies to the training loop: an estimator and loss terms.

The loop (:class:`marft_algos.trainer.Trainer`) owns the phases, collect -> estimate ->
update -> log; an :class:`Algorithm` supplies the parts and declares what it needs:

- :meth:`Algorithm.estimate` fills advantages / returns / values of a batch;
- :meth:`Algorithm.policy_loss` is the policy term of one (micro-)batch of an agent's
  actions, given the policy's token statistics on it;
- :meth:`Algorithm.value_losses` are the value-model terms (``"critic"``, ``"value"``) of
  one minibatch (they do not need the policy's forward);
- :meth:`Algorithm.losses` is both, ``{term: (loss, metrics)}``; each term trains its own
  optimizer group (:func:`marft_algos.optim.group_key`);
- declared capabilities: :attr:`Algorithm.group_size` (episodes per problem),
  :attr:`Algorithm.value_on_all_agents` (the value model learns from agents whose policy
  does not step), :attr:`Algorithm.kl_cut_metric` (the policy step a KL hard cut may veto),
  :meth:`Algorithm.policy_agents` (which agents' policies step at an update), and
  :meth:`Algorithm.no_signal` (DAPO dynamic sampling's test of a group).

The PPO policy term of GRPO and IPPO (:class:`PPOPolicy`) is the loop's shared helper;
MARFT's action- and token-level terms are in :mod:`marft_algos.algos.marft_action` /
:mod:`marft_algos.algos.marft_token`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from marft_algos import losses
from marft_algos.buffer import Minibatch, action_field, token_field
from marft_algos.config import ConfigError, PPOLossConfig, TrainConfig
from marft_algos.records import RolloutBatch, Transition

__all__ = ["Algorithm", "PPOPolicy", "Terms", "whiten"]

#: loss terms of one minibatch: ``{term: (loss, metrics)}``
Terms = dict[str, tuple[torch.Tensor, dict[str, float]]]


class Algorithm:
    """Base of the algorithms: the parts and capabilities the loop reads (see module docstring).

    Args:
        trainer: the loop this algorithm runs in (its policy, agents, collector, ranks).
    """

    #: episodes per problem (GRPO's group); the collector plays groups of this size
    group_size: int = 1
    #: the value model learns from every agent's actions, also when its policy does not step
    value_on_all_agents: ClassVar[bool] = False
    #: ``agent/<a>/<name>`` metric a KL hard cut compares with ``config.kl_threshold`` (None: no cut)
    kl_cut_metric: ClassVar[str | None] = None
    #: the units the policy loss averages over: "tokens" or "actions" (None: from ``loss_agg``)
    loss_units: ClassVar[str | None] = None

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.config: TrainConfig = trainer.config

    @property
    def agents(self) -> list[str]:
        """The team's agents (the trainer's)."""
        return self.trainer.agents

    @property
    def collector(self) -> Any:
        """The trainer's rollout collector (its envs tell what rewards they give)."""
        return self.trainer.collector

    @property
    def dist(self) -> Any:
        """The trainer's ranks (statistics over every rank's batch)."""
        return self.trainer.dist

    # ---- set-up -----------------------------------------------------------------------
    def setup(self) -> None:
        """Build value models (after the policy exists, before the optimizers)."""

    def param_groups(self) -> dict[str, tuple[list[torch.nn.Parameter], float]]:
        """Extra optimizer groups beyond the policies': ``{group: (parameters, lr)}``."""
        return {}

    def callbacks(self) -> list[Any]:
        """Loop callbacks this algorithm brings (e.g. MARFT's collapse recovery)."""
        return []

    def check(self) -> None:
        """Reject a team this algorithm cannot train (raise :class:`ConfigError`), after the optimizers exist."""

    # ---- phases' parts -------------------------------------------------------------------
    def no_signal(self, group: Sequence[Any]) -> bool:
        """Does this group of episodes carry no learning signal (DAPO's dynamic sampling drops it)?"""
        return False

    def estimate(self, batch: RolloutBatch) -> None:
        """Fill ``advantage`` (and ``returns`` / ``value`` where used) of every trainable
        transition; anything else per action goes to the typed ``batch.estimates``."""
        raise NotImplementedError

    def policy_agents(self, step: int, present: Collection[str]) -> list[str]:
        """Agents whose policy steps at update ``step`` (default: the trained agents ``present``)."""
        return [a for a in self.trainer.trainable_agents() if a in present]

    def units(self, term: str, mb: Sequence[Transition]) -> float:
        """The units term ``term`` of ``mb`` averages over: tokens or actions (weights pieces and ranks)."""
        units = self.loss_units or ("tokens" if getattr(self.config, "loss_agg", "sequence") == "token" else "actions")
        if term == "policy" and units == "tokens":
            return float(sum(len(t.response_ids) for t in mb))
        return float(len(mb))

    def policy_loss(self, agent: str, mb: Sequence[Transition], stats: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy term of ``agent`` on ``mb`` (``stats``: the policy's token statistics on it)."""
        raise NotImplementedError

    def policy_term_vanishes(self, mb: Sequence[Transition]) -> bool:
        """Is the policy term of ``mb`` exactly 0, with a gradient exactly 0, whatever the
        policy's log-probs? Then the trainer skips its backward (False: not known)."""
        return False

    def value_losses(self, agent: str, mb: Sequence[Transition]) -> Terms:
        """The value-model terms of ``agent``'s minibatch (none by default)."""
        return {}

    def losses(self, agent: str, mb: Sequence[Transition], stats: Any) -> Terms:
        """Every term of ``agent``'s minibatch: value terms, then the policy term (when ``stats`` is given)."""
        terms = self.value_losses(agent, mb)
        if stats is not None:
            terms["policy"] = self.policy_loss(agent, mb, stats)
        return terms

    # ---- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The value model's weights (empty without one)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class PPOPolicy:
    """The PPO policy term on token log-probs (GRPO, IPPO): clipped surrogate with a per-token,
    per-transition (GSPO) or per-action (ReMA's turn) ratio, truncated IS against the engine's
    log-probs, and :func:`marft_algos.losses.regularize` (entropy bonus, KL to the reference)."""

    trainer: Any
    config: Any

    def ppo_config(self) -> PPOLossConfig:
        """The config as a :class:`~marft_algos.config.PPOLossConfig` (the loss needs its settings)."""
        c = self.config
        if not isinstance(c, PPOLossConfig):
            raise ConfigError(
                f"{type(self).__name__} uses the PPO policy loss, whose settings {type(c).__name__} lacks: "
                "add marft_algos.config.PPOLossConfig to the config's bases, or override policy_loss"
            )
        return c

    def advantages(self, mb: Sequence[Transition], stats: Any) -> torch.Tensor:
        """Each action's advantage broadcast over its tokens -> ``[B, T]``."""
        adv = action_field(mb, "advantages", torch.float32, stats.logprobs.device)
        return adv[:, None].expand_as(stats.logprobs)

    def policy_term_vanishes(self, mb: Sequence[Transition]) -> bool:
        """Every action's advantage is 0 and no term without one is on (``beta`` and
        ``ent_coef`` 0): each token's clipped surrogate is ``A * rho = 0`` whatever the ratio,
        and so is its gradient (GRPO groups whose episodes all scored alike)."""
        c = self.ppo_config()
        if c.beta != 0 or c.ent_coef != 0 or not len(mb):
            return False
        if isinstance(mb, Minibatch):
            return bool((mb.advantages == 0).all())
        return all(not (t.advantage or 0.0) for t in mb)  # None counts as 0, as in the padded buffer

    def policy_loss(self, agent: str, mb: Sequence[Transition], stats: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate (+ beta * KL to the reference, - ent_coef * entropy)."""
        c = self.ppo_config()
        mask = stats.mask.float()
        logp = stats.logprobs
        old_logp = self.trainer.behaviour.old_logprobs(mb, stats)
        adv = self.advantages(mb, stats)
        m: dict[str, float] = {}
        weights = self.trainer.behaviour.tis_weights(agent, mb, stats, old_logp, c.tis_cap, m)
        if weights is not None:  # w >= 0: w * max(-A rho, -A clip(rho)) is the surrogate with advantages w * A
            adv = adv * weights
        if c.importance_ratio == "token":
            loss, info = losses.ppo_policy_loss(logp, old_logp, adv, mask, eps_low=c.eps_low, eps_high=c.eps_high, agg=c.loss_agg)
        else:  # one ratio per transition, or per action (its tool segments together: ReMA's turn)
            keys: dict[Any, int] = {}
            groups = [keys.setdefault(k, len(keys)) for k in (range(len(mb)) if c.importance_ratio == "sequence" else (t.action_key for t in mb))]
            loss, info = losses.grouped_ratio_policy_loss(logp, old_logp, adv, mask, groups, eps_low=c.eps_low, eps_high=c.eps_high, agg=c.loss_agg)
        m.update({f"agent/{agent}/{k}": float(v) for k, v in info.items()})
        m[f"agent/{agent}/policy_loss"] = float(loss.detach())
        m[f"agent/{agent}/kl"] = float(losses.approx_kl(logp.detach(), old_logp, mask))
        ref = token_field(mb, "ref_logp", logp.shape[1], logp.device) if c.beta > 0 else None
        loss = losses.regularize(loss, stats, mask, ref_logp=ref, beta=c.beta, ent_coef=c.ent_coef, metrics=m, prefix=f"agent/{agent}")
        return loss, m


def whiten(groups: Sequence[Sequence[Transition]], get: Any, put: Any, dist: Any) -> None:
    """Whiten the advantages of each group of transitions over every rank's batch (mean 0, std 1)."""
    for trs in groups:
        flat = np.concatenate([np.atleast_1d(get(t)) for t in trs]) if trs else np.zeros(0)
        mu, sd, n = dist.moments(flat)
        if n < 2 or not trs:
            continue
        for t in trs:
            put(t, (np.asarray(get(t)) - mu) / (sd + 1e-8))
