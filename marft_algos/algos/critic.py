"""The MARFT critic: a value model on the frozen base, shared by all agents by default.

A thin adapter over :class:`marft_algos.models.ValueModel` that gives the MARFT trainers
exactly the two views they need and one parameter list for one optimizer:

- :meth:`Critic.action_values` -- ``V(o)`` per action, read at the last token of the
  agent's rollout observation (its prompt ids, predecessors' actions included);
- :meth:`Critic.token_values` -- ``V(o, a_{<j})`` per response token j, read at the
  position just before token j is emitted (so ``token_values[:, 0]`` equals the action
  value of the same prompt): the token-level chain's values.

Feature cache: when the base under the critic is frozen (no critic LoRA) its hidden
states never change during a step, so :meth:`Critic.action_features` /
:meth:`Critic.token_features` compute them once (no grad) at advantage time and the
critic's training passes only run the small head on them (:meth:`Critic.head_values`):
one base forward per action per step instead of one per epoch.

Sharing: one head for all agents (the reference's single critic) unless
``per_agent=True``; the head (and an optional critic LoRA adapter, if the value model
supports one) is the only trainable part; the base stays frozen and is shared with the
policy (with the policy's adapters disabled while values are computed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from marft_algos.records import RolloutBatch, Transition

__all__ = ["ActionValueEstimation", "Critic"]


class Critic:
    """Action- and token-level values from a ``ValueModel`` (see module docstring).

    Args:
        policy: the ``TeamPolicy`` whose frozen base the value model reads.
        agents: the team's agents (roles).
        per_agent: one value head per agent instead of one shared head.
        lora: give the critic its own LoRA adapter on the base (needs value-model support).
        value_model: use this value model instead of building one.
    """

    def __init__(
        self,
        policy: Any,
        agents: Sequence[str],
        *,
        per_agent: bool = False,
        lora: bool = False,
        value_model: Any = None,
    ) -> None:
        self.agents = list(agents)
        self.per_agent = per_agent
        if value_model is None:
            from marft_algos.models import ValueModel

            value_model = ValueModel(policy, per_agent=per_agent, critic_lora=lora)
        self.vm = value_model

    # ---- parameters ---------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        """Unique trainable parameters over all agents' heads (one optimizer trains them all)."""
        seen: dict[int, torch.nn.Parameter] = {}
        for agent in self.agents:
            for p in self.vm.trainable_parameters(agent):
                seen.setdefault(id(p), p)
        if not seen:
            raise RuntimeError("the value model has no trainable parameters")
        return list(seen.values())

    def state_dict(self) -> dict[str, Any]:
        """Heads (and the critic adapter, if any) as CPU tensors."""
        return self.vm.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into the heads (and the critic adapter)."""
        self.vm.load_state_dict(state)

    # ---- cached features (frozen base only) ------------------------------------------
    @property
    def can_cache(self) -> bool:
        """Hidden states are reusable across a step: frozen base and the value model exposes them."""
        vm = self.vm
        return getattr(vm, "critic_adapter", None) is None and all(hasattr(vm, a) for a in ("hidden_states", "layout", "head"))

    def action_features(self, agent: str, prompts: list[list[int]]) -> torch.Tensor:
        """Hidden state at the last prompt token ``[B, H]`` (no grad)."""
        vm = self.vm
        with torch.no_grad():
            ids, att, pos, _, _, plen, _ = vm.layout(agent, prompts, [[] for _ in prompts])
            return vm.hidden_states(agent, ids, att, pos)[:, plen - 1].float()

    def token_features(self, agent: str, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        """Hidden states before each response token ``[B, T, H]`` (no grad)."""
        vm = self.vm
        with torch.no_grad():
            ids, att, pos, _, _, plen, rlen = vm.layout(agent, prompts, responses)
            return vm.hidden_states(agent, ids[:, :-1], att[:, :-1], pos[:, :-1])[:, plen - 1 : plen - 1 + rlen].float()

    def head_values(self, agent: str, features: torch.Tensor) -> torch.Tensor:
        """The agent's value head on cached features (with grad): ``[...]`` -> values."""
        return self.vm.head(agent)(features)

    # ---- values -------------------------------------------------------------------
    def action_values(self, agent: str, prompts: list[list[int]]) -> torch.Tensor:
        """``V(o)`` for each prompt -> ``[B]`` (with grad unless under ``no_grad``)."""
        return self.vm.values(agent, prompts).reshape(len(prompts)).float()

    def fill_action_values(self, batch: RolloutBatch, chunk: int = 16) -> None:
        """``t.value = V(o)`` for every transition of ``batch`` (no grad), ``chunk`` prompts per forward.

        Non-trainable transitions (over-long prompts) get a placeholder 0 that the GAE
        passes through. With a cacheable base the hidden states are kept in
        ``batch.estimates[t].critic_features`` for :meth:`minibatch_action_values`.
        """
        transitions = batch.transitions
        cache = self.can_cache
        with torch.no_grad():
            for agent in self.agents:
                trs = [t for t in transitions if t.agent == agent]
                for t in trs:
                    t.value = 0.0
                ok = [t for t in trs if t.trainable]
                for s in range(0, len(ok), chunk):
                    part = ok[s : s + chunk]
                    prompts = [t.prompt_ids for t in part]
                    if cache:
                        feats = self.action_features(agent, prompts)
                        vals = self.head_values(agent, feats).reshape(len(part)).float().cpu().tolist()
                        for t, f in zip(part, feats, strict=True):
                            batch.estimates[t].critic_features = f
                    else:
                        vals = self.action_values(agent, prompts).cpu().tolist()
                    for t, v in zip(part, vals, strict=True):
                        t.value = float(v)

    def minibatch_action_values(self, agent: str, mb: Sequence[Any]) -> torch.Tensor:
        """``V(o)`` of a training minibatch -> ``[B]`` with grad: the head on the features
        cached by :meth:`fill_action_values` (a buffer :class:`~marft_algos.buffer.Minibatch`
        holds them), else a full forward."""
        feats = getattr(mb, "critic_features", None)
        if feats is not None:
            return self.head_values(agent, feats).reshape(len(mb)).float()
        return self.action_values(agent, [t.prompt_ids for t in mb])

    def token_values(self, agent: str, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        """``V(o, a_{<j})`` for every response token -> ``[B, T]`` left-aligned, T = longest response."""
        return self.vm.token_values(agent, prompts, responses).float()


class ActionValueEstimation:
    """Mixin of the algorithms whose estimator reads one ``V(o)`` per action from ``self.critic``
    (action-level MARFT, IPPO): the values are computed once per batch, before the GAE."""

    critic: Critic
    trainer: Any  # the loop (its gathered() block)

    def compute_values(self, batch: RolloutBatch, chunk: int = 16) -> None:
        """``t.value = V(o)`` for every transition (no grad); non-trainable ones get 0
        (a placeholder: the GAE passes them through). With a frozen critic base the hidden
        states are cached in ``batch.estimates`` for the critic's training passes."""
        with self.trainer.gathered(reference=True):  # FSDP: the base's weights whole, no collective per chunk
            self.critic.fill_action_values(batch, chunk)

    def valued_transitions(self, batch: RolloutBatch) -> list[Transition]:
        """``batch.transitions`` (execution order, episodes contiguous), their values computed
        first unless every one has its value already."""
        if any(t.value is None for t in batch.transitions):
            self.compute_values(batch)
        return batch.transitions
