"""Token-level MARFT: per-token values, the token Bellman backup across agents, per-token PPO.

Paper: arXiv 2504.16129, token-level MARFT. The chain of :mod:`marft_action` is refined
to one link per token: there is no reward inside an action, and the last token of an
agent's action bootstraps from the first-token value of its successor (the next agent
executed, or the first agent of the next turn)::

    V_{k,j} = critic(o_k, a_k[:j])                         # value before token j of action k
    inside an action:  delta = gamma_token V_{k,j+1} - V_{k,j}
    last token:        delta = r_k + gamma(k) V_{k',0} (1 - d_k) - V_{k,T_k-1}
    A_{k,j} = delta + (gamma lam of that hop) A_{next link}           R = A + V
    rho_{k,j} = exp(log pi(a_{k,j} | ...) - log pi_old(a_{k,j} | ...))
    L_pi = masked mean over real tokens of max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high))
    L_V  = masked mean over real tokens of huber_or_mse(R - V)

``gamma_token`` and ``lam_token`` default to 1: a token is not a unit of time, so the
outcome's credit reaches an action's first token undiscounted. The reference used its
one gamma (0.99) and lambda (0.95) per token (credit to token 0 of a 512-token answer
decays like 0.99^512); set ``gamma_token=0.99, lam_token=0.95`` to reproduce it.

Everything else (critic, warm-up, agent-by-agent schedule, clip-higher, entropy bonus,
KL penalty and hard cut, collapse recovery) is shared with action-level MARFT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marft_algos import losses
from marft_algos.algos.marft import MARFTBase, MARFTConfig, _check
from marft_algos.buffer import Minibatch, fit_width, token_field
from marft_algos.losses import explained_variance
from marft_algos.records import RolloutBatch, Transition
from marft_algos.trainer import Trainer

__all__ = ["MARFTToken", "MARFTTokenConfig", "MARFTTokenTrainer"]


@dataclass
class MARFTTokenConfig(MARFTConfig):
    """Token-level MARFT: per-token values and Bellman backup across agents, per-token PPO ratios."""

    gamma_token: float = field(default=1.0, metadata={"help": "Discount between tokens of one action (reference: 0.99, i.e. the step gamma)."})
    lam_token: float = field(default=1.0, metadata={"help": "GAE lambda between tokens of one action (reference: 0.95)."})


    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 <= self.gamma_token <= 1, f"gamma_token must be in [0, 1], got {self.gamma_token}")
        _check(0 <= self.lam_token <= 1, f"lam_token must be in [0, 1], got {self.lam_token}")


class MARFTToken(MARFTBase):
    """Token-level MARFT's parts: token values, cross-agent token backup, per-token clipped ratios."""

    config: MARFTTokenConfig
    kl_cut_metric = "kl"

    def units(self, term: str, mb: Any) -> float:
        """Both terms are means over tokens: the critic's over the real tokens of its rows."""
        if term == "critic":
            return float(sum(len(t.response_ids) for t in mb))
        return super().units(term, mb)

    # ---- values and advantages -------------------------------------------------------------
    def compute_values(self, batch: RolloutBatch, chunk: int = 16) -> None:
        """``batch.estimates[t].token_values``: one value per response token (no grad).

        An empty action keeps one virtual link valued ``V(o)`` (= the value before its first
        token) so the chain stays connected and its reward counts; a non-trainable one
        (its prompt did not fit) gets a placeholder 0 that the backup passes through.
        """
        cache = self.critic.can_cache
        est = batch.estimates
        with torch.no_grad(), self.trainer.gathered(reference=True):  # FSDP: the base's weights whole, no collective per chunk
            for agent in self.agents:
                trs = [t for t in batch.transitions if t.agent == agent]
                full = [t for t in trs if t.trainable and t.response_ids]
                empty = [t for t in trs if not (t.trainable and t.response_ids)]
                for s in range(0, len(full), chunk):
                    part = full[s : s + chunk]
                    prompts, responses = [t.prompt_ids for t in part], [t.response_ids for t in part]
                    if cache:  # frozen base: keep the hidden states for the critic's training passes
                        feats = self.critic.token_features(agent, prompts, responses)
                        v = self.critic.head_values(agent, feats).cpu()
                        for t, f in zip(part, feats, strict=True):
                            est[t].critic_features = f[: len(t.response_ids)]
                    else:
                        v = self.critic.token_values(agent, prompts, responses).cpu()
                    for row, t in zip(v, part, strict=True):
                        est[t].token_values = row[: len(t.response_ids)].double().tolist()
                        t.value = float(row[0])
                for s in range(0, len(empty), chunk):
                    part = empty[s : s + chunk]
                    ok = [t for t in part if t.trainable]
                    vals = self.critic.action_values(agent, [t.prompt_ids for t in ok]).cpu().tolist() if ok else []
                    by_id = {id(t): v for t, v in zip(ok, vals, strict=True)}
                    for t in part:
                        t.value = float(by_id.get(id(t), 0.0))
                        est[t].token_values = [t.value]

    def estimate(self, batch: RolloutBatch) -> None:
        """Token-level backup over each episode's executed chain (see module docstring)."""
        from marft_algos.advantages import token_level_backup

        c = self.config
        trs = batch.transitions
        if not trs:
            return
        est = batch.estimates
        if any(est[t].token_values is None for t in trs):
            self.compute_values(batch)
        rewards, turns, chains = [t.reward for t in trs], [t.turn for t in trs], [t.episode_id for t in trs]
        if c.branching > 1:  # each action is its own chain, ending in its tree value Q(a) (docs/credit.md)
            q = self.tree_credit(batch).q
            rewards, turns, chains = [q[t.action_key] for t in trs], [0] * len(trs), list(range(len(trs)))
        adv, ret = token_level_backup(
            rewards,
            [est[t].token_values for t in trs],
            turns,
            chains,
            gamma_token=c.gamma_token,
            lam_token=c.lam_token,
            # a non-trainable action (prompt over the context) has no value: pass it through
            passthrough=[not t.trainable for t in trs],
            **c.chain_discounts(),
        )
        for t, a, r in zip(trs, adv, ret, strict=True):
            est[t].token_advantages = a.tolist()
            est[t].token_returns = r.tolist()
            t.advantage, t.returns = float(np.mean(a)), float(r[0])

        def put(t: Transition, v: Any) -> None:
            est[t].token_advantages = np.asarray(v, dtype=np.float64).tolist()
            t.advantage = float(np.mean(v))

        self.normalize(batch, lambda t: np.asarray(est[t].token_advantages), put)

    # ---- losses ----------------------------------------------------------------------------
    def advantages(self, mb: list[Transition], stats: Any) -> torch.Tensor:
        """Per-token advantages ``[B, T]`` from the token-level backup."""
        adv = token_field(mb, "token_advantages", stats.logprobs.shape[1], stats.logprobs.device)
        assert adv is not None, "token-level advantages are missing: estimate first"
        return adv

    def policy_loss(self, agent: str, mb: list[Transition], stats: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token clipped surrogate, masked mean (+ entropy bonus, KL to the reference)."""
        c = self.config
        mask = stats.mask.float()
        old = self.trainer.behaviour.old_logprobs(mb, stats)
        adv = self.advantages(mb, stats)
        m: dict[str, float] = {}
        weights = self.trainer.behaviour.tis_weights(agent, mb, stats, old, c.tis_cap, m)  # the engine kept its own log-probs
        pg_adv = adv * weights if weights is not None else adv
        loss, info = losses.ppo_policy_loss(stats.logprobs, old, pg_adv, mask, eps_low=c.eps_low, eps_high=c.eps_high, agg=c.loss_agg)
        m.update({f"agent/{agent}/{k}": float(v) for k, v in info.items()})
        m[f"agent/{agent}/policy_loss"] = float(loss.detach())
        m[f"agent/{agent}/kl"] = float(losses.approx_kl(stats.logprobs.detach(), old, mask))
        m[f"agent/{agent}/advantage_mean"] = float(losses.masked_mean(adv, mask))
        loss = self.regularize(agent, mb, stats, loss, m)
        return loss, m

    def critic_loss(self, agent: str, mb: Minibatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Masked value loss of the per-token values against the token returns (of the buffer's minibatch)."""
        c = self.config
        rows = [i for i, t in enumerate(mb) if t.response_ids]
        if not rows:
            zero = torch.zeros((), requires_grad=True)
            return zero, {}
        with_tokens = mb.subset(rows)
        if with_tokens.critic_features is not None:
            # the buffer's features, cut to the longest response of these rows
            width = max(len(t.response_ids) for t in with_tokens)
            v = self.critic.head_values(agent, fit_width(with_tokens.critic_features, width))
        else:
            v = self.critic.token_values(agent, [t.prompt_ids for t in with_tokens], [t.response_ids for t in with_tokens])
        T = v.shape[1]
        returns = token_field(with_tokens, "token_returns", T, v.device)
        old_v = token_field(with_tokens, "token_values", T, v.device)
        lengths = torch.tensor([min(len(t.response_ids), T) for t in with_tokens], device=v.device)
        mask = (torch.arange(T, device=v.device)[None, :] < lengths[:, None]).float()
        loss = losses.value_loss(v, returns, old_v, kind=c.value_loss, delta=c.huber_delta, clip=c.value_clip, mask=mask)
        return loss, {
            f"agent/{agent}/value_loss": float(loss.detach()),
            f"agent/{agent}/value_mean": float(losses.masked_mean(v.detach(), mask)),
            f"agent/{agent}/return_mean": float(losses.masked_mean(returns, mask)),
            f"agent/{agent}/explained_variance": explained_variance(v.detach(), returns, mask),
        }


class MARFTTokenTrainer(Trainer):
    """Token-level MARFT: token values, cross-agent token backup, per-token clipped ratios."""

    config_cls = MARFTTokenConfig
    algorithm_cls = MARFTToken
