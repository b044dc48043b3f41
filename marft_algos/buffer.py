"""The rollout buffer: one agent's trainable actions as padded tensors, built once per update.

After the advantages are computed (and the old / reference log-probs are known), the
trainer turns each agent's transitions into one :class:`AgentBuffer` of right-padded
tensors, in the style of stable-baselines3's ``RolloutBuffer``: response ids and mask and
the action values, advantages and returns (typed fields of each transition), and the old
and reference log-probs, token-level fields (token values, advantages, returns) and cached
critic features where the algorithm has them (the batch's typed store,
:class:`marft_algos.records.BatchEstimates`). A minibatch is then an index slice of those tensors (:meth:`AgentBuffer.minibatch`)
instead of Python lists re-padded in every minibatch of every epoch.

A :class:`Minibatch` is also the list of its transitions, so loss code that reads a field
the buffer does not hold (the action text for word-normalised log-probs, the prompt ids
the policy re-encodes) reads it from the transitions as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marft_algos.records import TOKEN_ESTIMATES, BatchEstimates, Transition

__all__ = [
    "AgentBuffer",
    "Minibatch",
    "action_field",
    "fit_width",
    "grouped_minibatch_indices",
    "minibatch_indices",
    "token_field",
]

#: buffer field -> the ``Transition`` attribute it is read from (one number per action)
ACTION_FIELDS = {"values": "value", "advantages": "advantage", "returns": "returns"}

#: the per-token fields: the trainer's estimates, and the sampler's own log-probs
#: (``Transition.sampler_logprobs``: the engine's numbers, which truncated importance sampling
#: compares with the trainer's; see :meth:`marft_algos.trainer.Trainer.tis_weights`)
TOKEN_FIELDS = (*TOKEN_ESTIMATES, "sampler_logp")


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Crop or right-pad (with 0) the second dimension of ``x`` to ``width``."""
    have = x.shape[1]
    if have == width:
        return x
    if have > width:
        return x[:, :width]
    pad = x.new_zeros((x.shape[0], width - have, *x.shape[2:]))
    return torch.cat([x, pad], dim=1)


def _padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    """Right-pad float rows with 0 -> ``[N, longest]`` float32 (values exactly as
    :func:`marft_algos.trainer.pad_sequences` writes them)."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.float32)
    return out


@dataclass
class _Fields:
    """Tensors with one row per action (token-level ones right-padded with 0)."""

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    token_values: torch.Tensor | None = None
    token_advantages: torch.Tensor | None = None
    token_returns: torch.Tensor | None = None
    critic_features: torch.Tensor | None = None
    #: true length of each row of the token fields that can differ from the response
    #: length (an empty action keeps one virtual token value)
    extra: dict[str, Any] = field(default_factory=dict)

    def fit(self, name: str, width: int, device: Any = None) -> torch.Tensor | None:
        """Field ``name`` cropped / zero-padded to ``width`` columns, on ``device`` (None if absent)."""
        x = getattr(self, name)
        if x is None:
            return None
        x = fit_width(x, width)
        return x.to(device) if device is not None else x


class Minibatch(list, _Fields):
    """A minibatch of one agent's actions: the list of its transitions plus their tensors."""

    def __init__(self, transitions: Sequence[Transition], fields: _Fields) -> None:
        list.__init__(self, transitions)
        for f in _Fields.__dataclass_fields__:
            setattr(self, f, getattr(fields, f))

    def subset(self, rows: Sequence[int]) -> Minibatch:
        """The minibatch restricted to ``rows`` (positions in this minibatch)."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        return Minibatch([self[i] for i in rows], _index(self, idx))


def _index(src: _Fields, idx: torch.Tensor) -> _Fields:
    def take(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x[idx]

    return _Fields(
        response_ids=src.response_ids[idx],
        response_mask=src.response_mask[idx],
        values=src.values[idx],
        advantages=src.advantages[idx],
        returns=src.returns[idx],
        old_logp=take(src.old_logp),
        ref_logp=take(src.ref_logp),
        sampler_logp=take(src.sampler_logp),
        token_values=take(src.token_values),
        token_advantages=take(src.token_advantages),
        token_returns=take(src.token_returns),
        critic_features=take(src.critic_features),
    )


class AgentBuffer(_Fields):
    """One agent's trainable actions of a batch as padded tensors (see the module docstring).

    Build it with :meth:`from_transitions` after the advantages (and old / reference
    log-probs) are set; a field is present when every transition has it.
    """

    def __init__(self, agent: str, transitions: Sequence[Transition], fields: _Fields) -> None:
        self.agent = agent
        self.transitions = list(transitions)
        for f in _Fields.__dataclass_fields__:
            setattr(self, f, getattr(fields, f))

    def __len__(self) -> int:
        return len(self.transitions)

    @classmethod
    def from_transitions(
        cls, agent: str, transitions: Sequence[Transition], estimates: BatchEstimates | None = None
    ) -> AgentBuffer:
        """Pad ``transitions``' ids, values, advantages and returns, and their ``estimates``
        (old / reference log-probs, token-level fields, critic features), into tensors."""
        trs = list(transitions)
        ids = [t.response_ids for t in trs]
        width = max((len(r) for r in ids), default=0)
        response_ids = torch.zeros((len(trs), width), dtype=torch.long)
        for i, r in enumerate(ids):
            if r:
                response_ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in ids], dtype=torch.long)
        mask = torch.arange(width)[None, :] < lengths[:, None]

        def scalar(name: str) -> torch.Tensor:
            # float64: exactly the Python floats, rounded only when a loss asks for its dtype
            return torch.tensor([float(getattr(t, name) or 0.0) for t in trs], dtype=torch.float64)

        fields = _Fields(
            response_ids=response_ids,
            response_mask=mask,
            values=scalar("value"),
            advantages=scalar("advantage"),
            returns=scalar("returns"),
        )
        if trs and all(len(t.sampler_logprobs) == len(t.response_ids) for t in trs):
            fields.sampler_logp = _padded([t.sampler_logprobs for t in trs])
        records = [estimates.get(t) for t in trs] if estimates is not None else [None] * len(trs)

        def present(name: str) -> list[Any] | None:
            """Field ``name`` of every action's record, or None when one lacks it."""
            got = [getattr(r, name) if r is not None else None for r in records]
            return got if got and all(g is not None for g in got) else None

        for name in TOKEN_ESTIMATES:
            rows = present(name)
            if rows is not None:
                setattr(fields, name, _padded(rows))
        feats = present("critic_features")
        if feats is not None:
            feats = [torch.as_tensor(f) for f in feats]
            # action level: one [H] vector per action; token level: one [L_i, H] per action
            fields.critic_features = torch.stack(feats) if feats[0].dim() == 1 else torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        return cls(agent, trs, fields)

    def minibatch(self, idx: Sequence[int] | np.ndarray) -> Minibatch:
        """The actions at positions ``idx`` (in that order): an index slice of every tensor."""
        rows = [int(i) for i in idx]
        return Minibatch([self.transitions[i] for i in rows], _index(self, torch.as_tensor(rows, dtype=torch.long)))

    def minibatches(self, num_minibatches: int, rng: np.random.Generator) -> Iterator[Minibatch]:
        """Shuffled minibatches covering the buffer once (the order ``rng`` draws)."""
        for idx in minibatch_indices(len(self), num_minibatches, rng):
            yield self.minibatch(idx)


def token_field(mb: Sequence[Transition], name: str, width: int, device: Any = None) -> torch.Tensor | None:
    """Per-token field ``name`` of a minibatch as ``[B, width]`` float32 (None when absent).

    A :class:`Minibatch` gives its buffer slice; a plain list of transitions carries no
    estimates (they live in the batch's store, not on the transitions): None.
    """
    if name not in TOKEN_FIELDS:
        raise KeyError(f"{name!r} is no per-token field; they are {', '.join(TOKEN_FIELDS)}")
    return mb.fit(name, width, device) if isinstance(mb, Minibatch) else None


def action_field(mb: Sequence[Transition], name: str, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    """Per-action field ``name`` (``values``, ``advantages``, ``returns``) of a minibatch -> ``[B]``."""
    if isinstance(mb, Minibatch):
        return getattr(mb, name).to(device=device, dtype=dtype)
    attr = ACTION_FIELDS[name]
    return torch.tensor([float(getattr(t, attr)) for t in mb], dtype=dtype, device=device)


def minibatch_indices(n: int, num_minibatches: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Shuffle ``range(n)`` with ``rng`` and yield ``num_minibatches`` near-equal index chunks."""
    order = rng.permutation(n)
    for chunk in np.array_split(order, min(num_minibatches, max(n, 1))):
        if len(chunk):
            yield chunk


def grouped_minibatch_indices(keys: Sequence[Any], num_minibatches: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Like :func:`minibatch_indices` over ``range(len(keys))``, but indices with equal keys
    (e.g. the segments of one action, ``Transition.action_key``) stay together, in order:
    the units are shuffled and split."""
    units: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        units.setdefault(k, []).append(i)
    groups = list(units.values())
    for chunk in minibatch_indices(len(groups), num_minibatches, rng):
        yield np.asarray([i for j in chunk for i in groups[int(j)]], dtype=np.int64)
