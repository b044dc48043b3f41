"""Rollout records: what the collector produces and the trainer reads, and nothing that runs.

A :class:`Transition` is one agent action with everything training needs, kept as token
ids end to end: ``prompt_ids`` are exactly the ids the policy was conditioned on (the
chat-templated messages) and ``response_ids`` exactly the sampled ids, so log-probs and
values are later computed on the same tokens in the same context (no re-tokenisation).
An :class:`Episode` is the transitions of one env copy in execution order: the chain
that action-level GAE walks (the successor of a transition is the next one executed).
A :class:`RolloutBatch` is the episodes of one training step plus rollout metrics.

What the trainer derives from a transition is kept apart from what the env and sampler
produced: the behaviour (old) and reference log-probs that ``Trainer.prepare_update``
computes, the per-token values, advantages and returns of token-level MARFT, and the
critic's cached hidden states are the typed fields of an :class:`ActionEstimates`; each
:class:`RolloutBatch` carries one :class:`BatchEstimates` store of them
(``batch.estimates``); the estimators fill it, and
:meth:`marft_algos.buffer.AgentBuffer.from_transitions` pads it into the update's tensors,
like the value / advantage / return arrays of stable-baselines3's ``RolloutBuffer``. The
per-action scalars ``value``, ``advantage`` and ``returns`` stay typed fields of the
transition itself (every algorithm has exactly one of each per action).

The collector that fills these records is :class:`marft_algos.rollout.RolloutCollector`;
this module imports neither it nor torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the records load without torch
    import torch

__all__ = [
    "TOKEN_ESTIMATES",
    "ActionEstimates",
    "BatchEstimates",
    "Episode",
    "RolloutBatch",
    "Transition",
]


@dataclass
class Transition:
    """One action of one agent.

    Attributes:
        episode_id: unique id of the episode (unique across the run).
        group_id: GRPO group (episodes sharing a problem share it); = episode_id if no groups.
        index: position of this transition in its episode (execution order).
        turn: the env's turn counter when the agent acted.
        agent: the acting agent (= the policy role).
        prompt_ids: token ids the action was sampled from (chat template applied).
        response_ids: the sampled token ids (incl. EOS when the model stopped on it).
        sampler_logprobs: per-token log-probs reported by the sampler (the engine's numbers
            for the sampled ids; the trainer's behaviour log-probs, ``old_logp`` in
            :class:`ActionEstimates`, are these when they are exact in fp32, else recomputed).
        temperature: the sampling temperature (training log-probs use the same
            temperature-scaled distribution; greedy actions record 1.0).
        text: decoded response passed to ``env.step``.
        finish_reason: "eos", "stop" or "length" (from the policy), "overlong" when the
            prompt did not fit in ``max_context`` (then the action was "" and the
            transition is not trainable).
        reward: ``env.rewards[agent]`` read right after this step.
        credited_reward: every reward the agent received from this step until its next
            action (PettingZoo's cumulative-reward semantics: a team reward given to all
            agents when the answering agent acts is credited to each one's last action).
        team_reward: the team reward of this transition's turn (filled in when the turn
            is graded; 0.0 for turns never graded).
        segment: 0 for an action's first generated segment; 1, 2, ... for the segments that
            continue it after tool calls (the env's ``tool_turn``, see docs/tools.md). Each
            segment is its own transition: its prompt holds every earlier segment and tool
            result (observation, never in a loss mask), its response only its own ids.
        action_index: ``index`` of the first segment of this transition's action (= ``index``
            for single-segment actions); :attr:`action_key` groups the segments of one action.
        action_reward: every reward credited to this transition's action (all its
            segments), the same on each segment. ``credited_reward`` keeps the per-step
            credit (a multi-segment action's credit lands on the segment whose step
            received it, so sums over transitions count it once).
        done: the acting agent was terminated or truncated by this step.
        flags: env info flags of this step (e.g. "empty_action", "action_truncated").
        info: the env's info dict for the agent after the step (JSON-safe parts).
        trainable: False for actions that must not be trained on (overlong prompts).
        shadow: True for this episode's copy of an action another episode owns (a branching
            rollout, :mod:`marft_algos.branching`: sibling episodes share the actions above
            their branch point). It completes this episode's path (returns, transcripts)
            but the action is counted, estimated and trained once, on its owner:
            :attr:`RolloutBatch.transitions` leaves shadows out.
        value / advantage / returns: filled by the trainer's advantage estimator.
        extras: what the collector attaches per action beyond the fields above (the chat
            ``prompt`` messages, for transcripts). The trainer's own per-action numbers
            (old / reference log-probs, token values / advantages / returns, cached critic
            features) are never written here: they live in the batch's typed store,
            :attr:`RolloutBatch.estimates` (:class:`BatchEstimates`).
    """

    episode_id: int
    group_id: int
    index: int
    turn: int
    agent: str
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logprobs: list[float]
    temperature: float = 1.0
    text: str = ""
    finish_reason: str = "eos"
    reward: float = 0.0
    credited_reward: float = 0.0
    team_reward: float = 0.0
    segment: int = 0
    action_index: int = -1
    action_reward: float = 0.0
    done: bool = False
    flags: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    trainable: bool = True
    shadow: bool = False
    value: float | None = None
    advantage: float | None = None
    returns: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Number of sampled tokens."""
        return len(self.response_ids)

    @property
    def action_key(self) -> tuple[int, int]:
        """``(episode_id, index of the action's first segment)``: equal for the segments of
        one multi-segment (tool-calling) action, distinct for different actions."""
        return (self.episode_id, self.action_index if self.action_index >= 0 else self.index)


@dataclass
class Episode:
    """The transitions of one env copy, in execution order."""

    episode_id: int
    group_id: int
    seed: int | None
    problem_id: str | None = None
    transitions: list[Transition] = field(default_factory=list)
    team_return: float = 0.0
    correct: bool | None = None
    dead_steps: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def agent_transitions(self, agent: str) -> list[Transition]:
        """``agent``'s transitions, in execution order."""
        return [t for t in self.transitions if t.agent == agent]

    def agent_return(self, agent: str) -> float:
        """The sum of the rewards credited to ``agent``'s actions in this episode
        (``credited_reward``: also what other agents' steps gave it, e.g. a game's -1 to the
        loser, which arrives on the winner's move)."""
        return float(sum(t.credited_reward for t in self.transitions if t.agent == agent))

    @property
    def num_tokens(self) -> int:
        """Sampled tokens over all actions of the episode."""
        return sum(t.num_tokens for t in self.transitions)

    def transcript(self) -> dict[str, Any]:
        """JSON-safe view for transcript logs."""
        return {
            "episode_id": self.episode_id,
            "group_id": self.group_id,
            "seed": self.seed,
            "problem_id": self.problem_id,
            "team_return": self.team_return,
            "correct": self.correct,
            "actions": [
                {
                    "turn": t.turn,
                    "agent": t.agent,
                    "text": t.text,
                    "reward": t.reward,
                    "credited_reward": t.credited_reward,
                    "team_reward": t.team_reward,
                    "tokens": t.num_tokens,
                    "finish_reason": t.finish_reason,
                    "flags": t.flags,
                    "prompt": t.extras.get("prompt", []),
                    # a user program's exception (workflow / program envs), kept with its episode
                    **({"error": t.info.get("program_traceback") or t.info.get("error")} if "program_error" in t.flags else {}),
                }
                for t in self.transitions
            ],
        }


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


@dataclass
class RolloutBatch:
    """The episodes of one training step plus rollout metrics (namespaced keys).

    ``estimates`` is the trainer's typed store of what it computes per action (old /
    reference log-probs, token-level values / advantages / returns, cached critic
    features; see :class:`ActionEstimates`): empty when the collector returns the batch.
    """

    episodes: list[Episode]
    metrics: dict[str, float] = field(default_factory=dict)
    estimates: BatchEstimates = field(default_factory=BatchEstimates, repr=False, compare=False)

    @property
    def transitions(self) -> list[Transition]:
        """Every action once, episode by episode, in execution order (a branching rollout's
        shadow copies, :attr:`Transition.shadow`, are left out: each is its owner's)."""
        return [t for ep in self.episodes for t in ep.transitions if not t.shadow]

    def agent_transitions(self, agent: str, trainable_only: bool = True) -> list[Transition]:
        """``agent``'s transitions (trainable ones only by default)."""
        return [t for t in self.transitions if t.agent == agent and (t.trainable or not trainable_only)]

    @property
    def agents(self) -> list[str]:
        """The agents that acted, in order of first appearance."""
        seen: dict[str, None] = {}
        for t in self.transitions:
            seen.setdefault(t.agent, None)
        return list(seen)

    def groups(self) -> dict[int, list[Episode]]:
        """Episodes by GRPO group id."""
        out: dict[int, list[Episode]] = defaultdict(list)
        for ep in self.episodes:
            out[ep.group_id].append(ep)
        return dict(out)

    def __len__(self) -> int:
        return len(self.episodes)
