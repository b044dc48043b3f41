"""Behaviour and reference log-probs of a batch: what every PPO ratio and KL is measured against.

The *old* (behaviour) log-probs are those of the policy that SAMPLED the actions: the
sampler's own log-probs when they equal the training forward's (fp32: the KV-cached decode
and the training forward agree to ~3e-6 per token, measured on the tiny model), else a
no-grad recomputation before the update's first optimizer step (bf16/fp16 autocast differ
by up to ~2e-2 per token, which would put rounding noise into every ratio). When the
rollout engine kept its own log-probs (``logprob_source="engine"``, e.g. vLLM) they are
recomputed too and the policy term is corrected by truncated importance sampling
(:meth:`Behaviour.tis_weights`). Reference log-probs (the base with adapters off, or the
frozen initial weights) are computed when a KL penalty or the reference-KL diagnostic
needs them. Both go to ``batch.estimates`` (``old_logp``, ``ref_logp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from marft_algos import losses
from marft_algos.buffer import token_field
from marft_algos.records import RolloutBatch, Transition

__all__ = ["Behaviour", "temperature_of"]


def temperature_of(transitions: Sequence[Transition]) -> float:
    """The sampling temperature of a minibatch (one agent's actions share their settings)."""
    temps = {t.temperature for t in transitions}
    if len(temps) > 1:
        raise ValueError(f"a minibatch mixes sampling temperatures {sorted(temps)}")
    return temps.pop() if temps else 1.0


class Behaviour:
    """Old / reference log-probs of a team policy's batches (see module docstring)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def engine_kept(self) -> bool:
        """Did the rollout engine keep its own log-probs, which differ from the trainer's forward?"""
        engine = getattr(self.policy, "engine", None)
        return engine is not None and not getattr(engine, "logprobs_exact", True)

    def sampler_exact(self) -> bool:
        """Can the sampler's log-probs serve as the old log-probs? (fp32 and the built-in engine)"""
        if self.engine_kept():
            return False  # the engine's own numbers: recompute, and correct with truncated IS
        dtype = getattr(self.policy, "compute_dtype", None)
        if dtype is None or getattr(self.policy, "device", None) is None:
            return False  # an unknown policy: recompute, which is always consistent
        return dtype == torch.float32

    def fill(self, batch: RolloutBatch, agents: Sequence[str], *, reference: bool, chunk: int = 16) -> None:
        """``old_logp`` of every trainable action (an action that has one keeps it) and, with
        ``reference``, its ``ref_logp``, in ``batch.estimates``; no gradients."""
        use_sampler = self.sampler_exact()
        est = batch.estimates
        with torch.no_grad():
            for agent in agents:
                trs = batch.agent_transitions(agent)
                todo: list[Transition] = []
                for t in trs:
                    if est[t].old_logp is not None:
                        continue
                    if use_sampler and len(t.sampler_logprobs) == len(t.response_ids):
                        est[t].old_logp = [float(x) for x in t.sampler_logprobs]
                    else:
                        todo.append(t)
                if todo:
                    self.policy.set_train_role(agent)
                    self._score(agent, todo, chunk, "old_logp", reference=False, est=est)
                if reference:
                    self._score(agent, trs, chunk, "ref_logp", reference=True, est=est)

    def _score(self, agent: str, trs: list[Transition], chunk: int, field: str, *, reference: bool, est: Any) -> None:
        for s in range(0, len(trs), chunk):
            part = trs[s : s + chunk]
            stats = self.policy.sequence_logprobs(
                agent, [t.prompt_ids for t in part], [t.response_ids for t in part], temperature=temperature_of(part), reference=reference
            )
            for t, lp, m in zip(part, stats.logprobs, stats.mask, strict=True):
                setattr(est[t], field, lp[m.bool()].float().cpu().tolist())

    def kl_samples(self, batch: RolloutBatch, agents: Sequence[str], n: int) -> dict[str, tuple[list[Transition], list[list[float]]]]:
        """Each agent's KL-diagnostic sample: its first ``n`` trainable actions with tokens and
        old log-probs, with those log-probs (``n = 0``: none)."""
        out = {}
        for agent in agents if n else []:
            trs = [t for t in batch.agent_transitions(agent) if t.response_ids and batch.estimates[t].old_logp is not None][:n]
            out[agent] = (trs, [batch.estimates[t].old_logp for t in trs])
        return out

    def kl_diagnostics(self, samples: dict[str, Any], agents: Sequence[str], *, reference: bool) -> dict[str, float]:
        """``agent/<a>/rollout_ref_kl`` (KL(rollout || reference), before an update) or
        ``agent/<a>/update_kl`` (KL(rollout || current), after it) on each agent's sample."""
        name = "rollout_ref_kl" if reference else "update_kl"
        out = {}
        for agent in [a for a in agents if a in samples]:  # team order: the ranks' collectives pair up
            trs, old = samples[agent]
            out[f"agent/{agent}/{name}"] = self.kl_to(agent, trs, old, reference=reference) if trs else 0.0
        return out

    def kl_to(self, agent: str, trs: list[Transition], old: list[list[float]], *, reference: bool, chunk: int = 16) -> float:
        """Mean over tokens of KL(old || pi) (k3, >= 0) where ``pi`` is ``agent``'s current policy
        or, with ``reference``, the reference; ``old`` holds each action's old log-probs. No gradient."""
        total, count = 0.0, 0
        with torch.no_grad():
            self.policy.set_train_role(agent)
            for s in range(0, len(trs), chunk):
                part, olds = trs[s : s + chunk], old[s : s + chunk]
                stats = self.policy.sequence_logprobs(
                    agent, [t.prompt_ids for t in part], [t.response_ids for t in part], temperature=temperature_of(part), reference=reference
                )
                for lp, m, o in zip(stats.logprobs, stats.mask, olds, strict=True):
                    new = lp[m.bool()].float().cpu()
                    d = (new - torch.tensor(o[: len(new)])).clamp(-20, 20)  # log pi - log old
                    total += float((torch.expm1(d) - d).sum())
                    count += len(new)
        return total / max(count, 1)

    def old_logprobs(self, mb: Sequence[Transition], stats: Any) -> torch.Tensor:
        """Old log-probs ``[B, T]`` aligned with ``stats.logprobs``; a minibatch that bypassed
        :meth:`fill` falls back to the current log-probs, detached (ratio 1)."""
        old = token_field(mb, "old_logp", stats.logprobs.shape[1], stats.logprobs.device)
        return old if old is not None else stats.logprobs.detach()

    def engine_logprobs(self, mb: Sequence[Transition], stats: Any) -> torch.Tensor | None:
        """The engine's log-probs of the sampled tokens ``[B, T]`` when it kept its own, else None."""
        if not self.engine_kept():
            return None
        lp = token_field(mb, "sampler_logp", stats.logprobs.shape[1], stats.logprobs.device)
        if lp is None:
            raise RuntimeError("the engine kept its own log-probs, but some actions of this minibatch have none "
                               "(one per sampled token): truncated importance sampling cannot weight them")
        return lp

    def tis_weights(
        self, agent: str, mb: Sequence[Transition], stats: Any, old_logp: torch.Tensor, cap: float, metrics: dict[str, float]
    ) -> torch.Tensor | None:
        """Truncated importance-sampling weights ``min(exp(old - engine), cap)`` per token
        (detached) when the engine kept its own log-probs, else None; logs
        ``agent/<a>/engine_logp_gap`` and ``agent/<a>/tis_clipped_frac``."""
        engine = self.engine_logprobs(mb, stats)
        if engine is None:
            return None
        weights, info = losses.truncated_is_weights(old_logp, engine, stats.mask, cap)
        metrics.update({f"agent/{agent}/{k}": float(v) for k, v in info.items()})
        return weights
