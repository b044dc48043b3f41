"""k sampled episodes per problem with fixed seeds, as :class:`SampleRecord` rows, and their summary.

Sample j of problem i uses reset seed ``seed + 1000 * i + j``; the torch RNG is forked and
seeded with ``seed``, so the same call plays the same episodes, token for token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import marft_envs
from marft_algos.evaluation.report import wilson
from marft_algos.protocols import RolloutPolicy
from marft_algos.rollout import RolloutCollector

__all__ = ["SampleRecord", "play", "sampling_overrides", "to_record", "episode_score", "episode_tool_calls", "run_samples", "summarize", "by_problem", "overlong_agents",
           "agent_tool_stats", "COST_COMPONENTS"]

#: Reward components that are costs (they enter the reward negated; see marft_envs.rewards).
COST_COMPONENTS = ("chars", "tokens", "turn")


@dataclass
class SampleRecord:
    """One episode: problem ``problem`` (index in the split), sample ``sample`` of k.

    ``reward`` is the team return, ``components`` the sum of each reward component over
    the graded turns; ``actions`` are the agents' steps in execution order (a tool-calling
    action is several steps: ``segment`` 0, 1, ...; ``tool_calls`` counts the calls a step
    made and ``tool_errors`` lists the error kinds of the failed ones). ``score`` is the
    grader's score of the last graded turn (the task's partial credit, e.g. RAG's hedge-penalised
    answer reward; None if never graded) and ``details`` that turn's grade details (e.g. RAG's
    plain answer F1 in ``details["f1"]``; empty if never graded).
    """

    problem: int
    sample: int
    correct: bool
    tokens: int
    calls: int
    timed_out: bool
    answer: str | None
    actions: list[dict[str, Any]]
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _resets(problems: Sequence[int], k: int, seed: int) -> list[dict[str, Any]]:
    return [
        {"seed": seed + 1000 * p + j, "options": {"problem_index": int(p)}, "group_id": int(p)}
        for p in problems
        for j in range(k)
    ]


def sampling_overrides(agents: Sequence[str], temperature: float | None, max_new_tokens: int | None) -> dict[str, dict[str, Any]]:
    """Per-agent sampling overrides: ``temperature`` / ``max_new_tokens`` for every agent (None: the profile's own).

    >>> sampling_overrides(["a"], 0.0, None)
    {'a': {'temperature': 0.0}}
    """
    override: dict[str, Any] = {}
    if temperature is not None:
        override["temperature"] = float(temperature)
    if max_new_tokens is not None:
        override["max_new_tokens"] = int(max_new_tokens)
    return {a: dict(override) for a in agents}


def play(
    policy: RolloutPolicy,
    env_id: str,
    *,
    split: str,
    env_kwargs: dict[str, Any] | None = None,
    problems: Sequence[int],
    k: int = 1,
    temperature: float | None = 0.7,
    max_new_tokens: int | None = None,
    num_envs: int = 16,
    max_context: int | None = 2048,
    seed: int = 1234,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """``(reset specs, episodes)``: k episodes per problem, batched across episodes.

    ``temperature`` / ``max_new_tokens`` override every agent's eval sampling (None: the
    profiles' own).
    """
    kwargs = {**(env_kwargs or {}), "split": split}
    agents = marft_envs.spec(env_id).agents_for(**kwargs)
    resets = _resets(problems, k, seed)
    if not resets:
        return [], []
    collector = RolloutCollector(
        lambda: marft_envs.make(env_id, **kwargs), policy, num_envs=max(1, min(num_envs, len(resets))), mode="eval",
        sampling_overrides=sampling_overrides(agents, temperature, max_new_tokens), max_context=max_context, seed=seed,
    )
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        batch = collector.run(resets)
    return resets, list(batch.episodes)


def episode_score(ep: Any) -> float | None:
    """The grader's score of episode ``ep``'s last graded turn (the task's partial credit); None if never graded."""
    score = None
    for t in ep.transitions:
        g = t.info.get("grade")
        if isinstance(g, dict) and isinstance(g.get("score"), (int, float)):
            score = float(g["score"])
    return score


def to_record(spec: dict[str, Any], ep: Any, seed: int) -> SampleRecord:
    """The :class:`SampleRecord` of episode ``ep`` played from reset spec ``spec`` (see :func:`play`)."""
    answer, timed_out = None, False
    components: dict[str, float] = {}
    details: dict[str, Any] = {}
    for t in ep.transitions:
        g = t.info.get("grade")
        if isinstance(g, dict):
            answer = g.get("extracted")
            details = dict(g.get("details") or {})
            timed_out = timed_out or bool(g.get("timed_out"))
        comps = t.info.get("reward_components")
        if isinstance(comps, dict) and "team_reward" in t.info:
            for name, v in comps.items():
                components[name] = components.get(name, 0.0) + float(v)
    actions = [
        {"agent": t.agent, "tokens": t.num_tokens, "text": t.text, "finish": t.finish_reason, "flags": list(t.flags), "turn": t.turn,
         "segment": t.segment, **_tool_use(t.info)}
        for t in ep.transitions
    ]
    problem = int(spec["options"]["problem_index"])
    return SampleRecord(
        problem=problem,
        sample=int(spec["seed"] - seed - 1000 * problem),
        correct=bool(ep.correct),
        tokens=ep.num_tokens,
        calls=len(ep.transitions),
        timed_out=timed_out,
        answer=None if answer is None else str(answer),
        actions=actions,
        reward=float(ep.team_return),
        components=components,
        score=episode_score(ep),
        details=details,
    )


def episode_tool_calls(ep: Any) -> int:
    """Tool calls made in episode ``ep`` (every agent, every segment; failed calls count)."""
    return sum(_tool_use(t.info)["tool_calls"] for t in ep.transitions)


def _tool_use(info: dict[str, Any]) -> dict[str, Any]:
    """``tool_calls`` (calls made in this step) and ``tool_errors`` (error kinds of the failed ones)."""
    calls = [c for c in info.get("tool_calls") or () if isinstance(c, dict)]
    return {"tool_calls": len(calls), "tool_errors": [str(c["error"]) for c in calls if c.get("error")]}


def run_samples(policy: RolloutPolicy, env_id: str, *, seed: int = 1234, **kwargs: Any) -> list[SampleRecord]:
    """Play k episodes per problem (batched across episodes; fixed seeds throughout).

    Takes the arguments of :func:`play`; returns one :class:`SampleRecord` per episode.
    """
    resets, episodes = play(policy, env_id, seed=seed, **kwargs)
    return [to_record(spec, ep, seed) for spec, ep in zip(resets, episodes, strict=True)]


def by_problem(records: Sequence[SampleRecord]) -> dict[int, list[SampleRecord]]:
    """Records grouped by problem, each group sorted by sample index."""
    out: dict[int, list[SampleRecord]] = defaultdict(list)
    for r in records:
        out[r.problem].append(r)
    for v in out.values():
        v.sort(key=lambda r: r.sample)
    return dict(out)


def summarize(records: Sequence[SampleRecord], k: int | None = None) -> dict[str, Any]:
    """avg@k accuracy (+ Wilson CI over problems), pass@k, tokens, calls, timeouts, overlong episodes."""
    groups = by_problem(records)
    if k is not None:
        groups = {p: rs[:k] for p, rs in groups.items()}
    n = len(groups)
    per_problem = [sum(r.correct for r in rs) / len(rs) for rs in groups.values() if rs]
    flat = [r for rs in groups.values() for r in rs]
    acc = sum(per_problem) / n if n else float("nan")
    lo, hi = wilson(acc, n)
    return {
        "problems": n,
        "k": max((len(rs) for rs in groups.values()), default=0),
        "samples": len(flat),
        "accuracy": acc,
        "ci_low": lo,
        "ci_high": hi,
        "pass_at_k": sum(any(r.correct for r in rs) for rs in groups.values()) / n if n else float("nan"),
        # the mean team return per episode (partial credit and shaping included, unlike accuracy)
        "team_reward": sum(r.reward for r in flat) / len(flat) if flat else float("nan"),
        "tokens_per_episode": sum(r.tokens for r in flat) / len(flat) if flat else float("nan"),
        "calls_per_episode": sum(r.calls for r in flat) / len(flat) if flat else float("nan"),
        "verifier_timeouts": sum(r.timed_out for r in flat),
        # episodes where some prompt did not fit max_context (played as an empty action)
        "overlong_episodes": sum(bool(overlong_agents(r)) for r in flat),
    }


def overlong_agents(record: SampleRecord) -> list[str]:
    """The agents of ``record`` whose prompt did not fit the context (flag ``context_overflow``)."""
    return [a["agent"] for a in record.actions if "context_overflow" in a.get("flags", ())]


def agent_tool_stats(records: Sequence[SampleRecord], agents: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per agent, means per episode over ``records``: actions, steps, tool calls, tool errors, tokens.

    One row per agent (``agents`` order, else first appearance): ``episodes``,
    ``actions`` (an action's tool segments count once), ``steps`` (generated segments),
    ``tool_calls``, ``tool_errors``, ``tokens`` (sampled tokens, all segments): means per
    episode; ``tool_error_rate`` = failed / calls over all episodes (0 without calls);
    ``errors_by_kind``: failed calls per kind, totals (the kinds of
    :data:`marft_envs.tools.TOOL_ERRORS`).

    >>> r = SampleRecord(0, 0, False, 7, 2, False, None, [
    ...     {"agent": "a", "tokens": 5, "segment": 0, "tool_calls": 2, "tool_errors": ["unknown_tool"]},
    ...     {"agent": "a", "tokens": 2, "segment": 1, "tool_calls": 0, "tool_errors": []}])
    >>> row = agent_tool_stats([r])[0]
    >>> row["actions"], row["steps"], row["tool_calls"], row["tool_error_rate"], row["errors_by_kind"]
    (1.0, 2.0, 2.0, 0.5, {'unknown_tool': 1})
    """
    order = list(agents) if agents is not None else list(dict.fromkeys(a["agent"] for r in records for a in r.actions))
    n = len(records)
    rows = []
    for agent in order:
        steps = [a for r in records for a in r.actions if a["agent"] == agent]
        calls = sum(int(a.get("tool_calls", 0)) for a in steps)
        kinds: dict[str, int] = {}
        for a in steps:
            for kind in a.get("tool_errors", ()):
                kinds[kind] = kinds.get(kind, 0) + 1
        errors = sum(kinds.values())
        per_ep = (lambda x: x / n) if n else (lambda x: float("nan"))
        rows.append({
            "agent": agent,
            "episodes": n,
            "actions": per_ep(float(sum(1 for a in steps if int(a.get("segment", 0)) == 0))),
            "steps": per_ep(float(len(steps))),
            "tool_calls": per_ep(float(calls)),
            "tool_errors": per_ep(float(errors)),
            "tool_error_rate": errors / calls if calls else 0.0,
            "errors_by_kind": dict(sorted(kinds.items())),
            "tokens": per_ep(float(sum(int(a.get("tokens", 0)) for a in steps))),
        })
    return rows
