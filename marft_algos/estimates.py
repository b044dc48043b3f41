"""What the trainer computes for each action, kept apart from what the env and sampler produced.

A :class:`~marft_algos.rollout.Transition` holds the collector's record of one action (ids,
rewards, the sampler's log-probs, the prompt). The numbers the trainer derives from it live
here, in typed fields: the behaviour (old) and reference log-probs that
``Trainer.prepare_update`` computes, the per-token values, advantages and returns of
token-level MARFT, and the critic's cached hidden states. Each
:class:`~marft_algos.rollout.RolloutBatch` carries one :class:`BatchEstimates` store
(``batch.estimates``); the estimators fill it, and
:meth:`marft_algos.buffer.AgentBuffer.from_transitions` pads it into the update's tensors,
like the value / advantage / return arrays of stable-baselines3's ``RolloutBuffer``.

The per-action scalars ``value``, ``advantage`` and ``returns`` stay typed fields of the
transition itself (every algorithm has exactly one of each per action).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the collector's module imports this one without torch
    import torch

    from marft_algos.rollout import Transition

__all__ = ["ActionEstimates", "BatchEstimates", "TOKEN_ESTIMATES"]

#: the per-token fields of :class:`ActionEstimates` (one float per response token; an empty
#: action of token-level MARFT keeps one virtual token value)
TOKEN_ESTIMATES = ("old_logp", "ref_logp", "token_values", "token_advantages", "token_returns")


@dataclass
class ActionEstimates:
    """The trainer's numbers for one action; a field is None until its producer ran.

    Attributes:
        old_logp: behaviour log-prob of each response token (``Trainer.prepare_update``: the
            sampler's when exact in fp32, else a no-grad recomputation).
        ref_logp: the reference policy's log-prob of each token (``prepare_update``, KL penalty on).
        token_values: ``V(o, a_{<j})`` before each token (token-level MARFT's critic).
        token_advantages: the token-level backup's advantage of each token (normalised if asked).
        token_returns: the token-level backup's return of each token (the critic's target).
        critic_features: the frozen critic base's hidden state(s): ``[H]`` at the last prompt
            token (action level) or ``[L, H]`` before each response token (token level).
    """

    old_logp: list[float] | None = None
    ref_logp: list[float] | None = None
    token_values: list[float] | None = None
    token_advantages: list[float] | None = None
    token_returns: list[float] | None = None
    critic_features: torch.Tensor | None = None


class BatchEstimates:
    """The :class:`ActionEstimates` of every action of one batch, looked up by its transition.

    ``store[t]`` gives (and on first use creates) the record of transition ``t``;
    :meth:`get` only reads. Records are keyed by the transition object itself (transitions
    are mutable dataclasses, not hashable), which the store keeps alive with its record.
    """

    def __init__(self) -> None:
        self._rows: dict[int, tuple[Transition, ActionEstimates]] = {}

    def __getitem__(self, t: Transition) -> ActionEstimates:
        row = self._rows.get(id(t))
        if row is None:
            row = self._rows[id(t)] = (t, ActionEstimates())
        return row[1]

    def get(self, t: Transition) -> ActionEstimates | None:
        """The record of ``t``, or None when nothing was estimated for it."""
        row = self._rows.get(id(t))
        return None if row is None else row[1]

    def __contains__(self, t: object) -> bool:
        return id(t) in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[Transition]:
        return (t for t, _ in self._rows.values())

    def clear(self) -> None:
        """Forget every record (a batch re-estimated from scratch)."""
        self._rows.clear()
