"""k sampled episodes per problem with fixed seeds, as :class:`SampleRecord` rows, and their summary.

Sample j of problem i uses reset seed ``seed + 1000 * i + j``; the torch RNG is forked and
seeded with ``seed``, so the same call plays the same episodes, token for token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marft_algos.evaluation.report import wilson

__all__ = ["SampleRecord", "play", "sampling_overrides", "to_record", "run_samples", "summarize", "by_problem", "overlong_agents", "COST_COMPONENTS"]

#: Reward components that are costs (they enter the reward negated; see marft_envs.rewards).
COST_COMPONENTS = ("chars", "tokens", "turn")


@dataclass
class SampleRecord:
    """One episode: problem ``problem`` (index in the split), sample ``sample`` of k.

    ``reward`` is the team return, ``components`` the sum of each reward component over
    the graded turns; ``actions`` are the agents' actions in execution order.
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
    policy: Any,
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
    import torch

    import marft_envs
    from marft_algos.rollout import RolloutCollector

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


def to_record(spec: dict[str, Any], ep: Any, seed: int) -> SampleRecord:
    """The :class:`SampleRecord` of episode ``ep`` played from reset spec ``spec`` (see :func:`play`)."""
    answer, timed_out = None, False
    components: dict[str, float] = {}
    for t in ep.transitions:
        g = t.info.get("grade")
        if isinstance(g, dict):
            answer = g.get("extracted")
            timed_out = timed_out or bool(g.get("timed_out"))
        comps = t.info.get("reward_components")
        if isinstance(comps, dict) and "team_reward" in t.info:
            for name, v in comps.items():
                components[name] = components.get(name, 0.0) + float(v)
    actions = [
        {"agent": t.agent, "tokens": t.num_tokens, "text": t.text, "finish": t.finish_reason, "flags": list(t.flags), "turn": t.turn}
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
    )


def run_samples(policy: Any, env_id: str, *, seed: int = 1234, **kwargs: Any) -> list[SampleRecord]:
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
        "tokens_per_episode": sum(r.tokens for r in flat) / len(flat) if flat else float("nan"),
        "calls_per_episode": sum(r.calls for r in flat) / len(flat) if flat else float("nan"),
        "verifier_timeouts": sum(r.timed_out for r in flat),
        # episodes where some prompt did not fit max_context (played as an empty action)
        "overlong_episodes": sum(bool(overlong_agents(r)) for r in flat),
    }


def overlong_agents(record: SampleRecord) -> list[str]:
    """The agents of ``record`` whose prompt did not fit the context (flag ``context_overflow``)."""
    return [a["agent"] for a in record.actions if "context_overflow" in a.get("flags", ())]
