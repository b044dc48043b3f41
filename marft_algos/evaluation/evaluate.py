"""Evaluate a team on held-out problems (untrained, or from a checkpoint).

Problems are taken by index (``reset(options={"problem_index": k})``) from the given
split, so two evaluations of the same ``n`` see the same problems; agents use their
profiles' eval sampling settings (or greedy decoding). Accuracy comes with a 95% Wilson
score interval (:func:`~marft_algos.evaluation.report.wilson_interval`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import marft_envs
from marft_algos.evaluation.errors import EvaluationError
from marft_algos.evaluation.policies import check_roles, checkpoint_env, checkpoint_policy
from marft_algos.evaluation.report import wilson_interval
from marft_algos.protocols import RolloutPolicy, TextEnv
from marft_algos.rollout import RolloutCollector

if TYPE_CHECKING:
    from marft_algos.records import Episode

_log = logging.getLogger(__name__)

__all__ = ["EvalResult", "evaluate", "evaluate_checkpoint", "format_table"]


@dataclass
class EvalResult:
    """Outcome of an evaluation run."""

    env_id: str
    split: str
    n: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    mean_tokens: float
    mean_reward: float
    verifier_timeouts: int
    overlong: int
    seconds: float
    label: str = ""
    per_agent_tokens: dict[str, float] = field(default_factory=dict)
    #: episodes with at least one action whose prompt overflowed max_context, and overflows per agent
    overlong_episodes: int = 0
    overlong_by_agent: dict[str, int] = field(default_factory=dict)
    #: prompt tokens the agents read per episode (what a compact hand-off saves), and per agent per action
    mean_prompt_tokens: float = 0.0
    per_agent_prompt_tokens: dict[str, float] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-safe data (without the episodes)."""
        d = asdict(self)
        d.pop("episodes")
        return d

    def __str__(self) -> str:
        return (
            f"{self.label or self.env_id}: accuracy {self.accuracy:.3f} "
            f"[{self.ci_low:.3f}, {self.ci_high:.3f}] on {self.n} {self.split} problems, "
            f"{self.mean_tokens:.1f} tokens/episode, {self.verifier_timeouts} verifier timeouts"
        ) + self.overlong_note()

    def overlong_note(self) -> str:
        """``"; WARNING: 6 of 8 episodes overflowed max_context (writer 6)"`` or "" when none did."""
        if not self.overlong_episodes:
            return ""
        who = ", ".join(f"{a} {k}" for a, k in self.overlong_by_agent.items() if k)
        return (f"; WARNING: {self.overlong_episodes} of {self.n} episodes overflowed max_context ({who}): "
                "those agents played empty actions")


def evaluate(
    policy: RolloutPolicy,
    env_id: str | None = None,
    *,
    env_fn: Callable[[], TextEnv] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    n: int = 200,
    split: str = "test",
    start_index: int = 0,
    num_envs: int = 16,
    greedy: bool = False,
    sampling_overrides: dict[str, dict[str, Any]] | None = None,
    max_context: int | None = 2048,
    seed: int = 1234,
    label: str = "",
    strict_context: bool = False,
) -> EvalResult:
    """Play one episode on each of problems ``start_index .. start_index + n - 1``.

    Raises :class:`~marft_algos.evaluation.errors.EvaluationError` when there is no
    problem to play (``n < 1``, or ``start_index`` past the end of the split). The torch
    RNG is forked (sampling here never shifts a training run's random stream).
    ``strict_context`` stops with :class:`~marft_algos.rollout.ContextOverflowError` on
    the first prompt over ``max_context`` (default: counted in the result and its summary).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise EvaluationError(f"the number of problems to evaluate must be an integer >= 1, got {n!r}")
    if env_fn is None:
        if env_id is None:
            raise ValueError("evaluate needs env_id or env_fn")
        kwargs = dict(env_kwargs or {})
        kwargs["split"] = split
        env_fn = lambda: marft_envs.make(env_id, **kwargs)  # noqa: E731
    probe = env_fn()
    total = int(getattr(probe, "num_problems", start_index + n))
    if start_index >= total:
        raise EvaluationError(f"the {split} split has {total} problems: start index {start_index} leaves none to evaluate")
    if start_index + n > total:
        _log.warning("the %s split has %d problems: evaluating %d from index %d, not %d", split, total, total - start_index, start_index, n)
    n = min(n, total - start_index)
    overrides: dict[str, dict[str, Any]] = {a: dict(v) for a, v in (sampling_overrides or {}).items()}
    if greedy:
        for agent in probe.possible_agents:
            overrides.setdefault(agent, {})["temperature"] = 0.0
    collector = RolloutCollector(
        env_fn,
        policy,
        num_envs=max(1, min(num_envs, n)),
        mode="eval",
        sampling_overrides=overrides,
        max_context=max_context,
        seed=seed,
        strict_context=strict_context,
    )
    resets = [{"seed": seed + k, "options": {"problem_index": start_index + k}, "group_id": k} for k in range(n)]
    t0 = time.perf_counter()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        batch = collector.run(resets)
    seconds = time.perf_counter() - t0
    episodes = batch.episodes
    correct = sum(bool(ep.correct) for ep in episodes)
    lo, hi = wilson_interval(correct, len(episodes))
    per_agent: dict[str, list[int]] = {}
    per_agent_prompt: dict[str, list[int]] = {}
    for ep in episodes:
        for t in ep.transitions:
            per_agent.setdefault(t.agent, []).append(t.num_tokens)
            per_agent_prompt.setdefault(t.agent, []).append(len(t.prompt_ids))
    m = batch.metrics
    return EvalResult(
        env_id=env_id or getattr(probe, "metadata", {}).get("name", "env"),
        split=split,
        n=len(episodes),
        correct=correct,
        accuracy=correct / len(episodes),
        ci_low=lo,
        ci_high=hi,
        mean_tokens=sum(ep.num_tokens for ep in episodes) / len(episodes),
        mean_reward=sum(ep.team_return for ep in episodes) / len(episodes),
        verifier_timeouts=int(m.get("rollout/verifier_timeouts", 0)),
        overlong=int(m.get("rollout/overlong", 0)),
        seconds=seconds,
        label=label,
        per_agent_tokens={a: sum(v) / len(v) for a, v in per_agent.items()},
        overlong_episodes=sum(any("context_overflow" in t.flags for t in ep.transitions) for ep in episodes),
        overlong_by_agent={a: int(m.get(f"agent/{a}/overlong", 0)) for a in per_agent if m.get(f"agent/{a}/overlong")},
        mean_prompt_tokens=sum(len(t.prompt_ids) for ep in episodes for t in ep.transitions) / len(episodes),
        per_agent_prompt_tokens={a: sum(v) / len(v) for a, v in per_agent_prompt.items()},
        episodes=episodes,
    )


def evaluate_checkpoint(
    checkpoint: str | Path,
    env_id: str | None = None,
    *,
    engine: str | None = None,
    **kwargs: Any,
) -> EvalResult:
    """Load the policy stored in a checkpoint (or run dir) and :func:`evaluate` it.

    ``engine`` names the generation engine (default: the one the run was trained with).

    ``env_id`` defaults to the run's environment, played with the run's env kwargs; on
    another env only the run's team kwargs go with it (see
    :func:`~marft_algos.evaluation.policies.checkpoint_env`). ``env_kwargs`` in
    ``kwargs`` replaces that choice.
    """
    trained = checkpoint_policy(checkpoint, engine=engine)
    env_id, env_kwargs = checkpoint_env(trained.config, env_id)
    env_kwargs = dict(kwargs.pop("env_kwargs", env_kwargs))
    check_roles(env_id, env_kwargs, trained.roles, f"checkpoint {trained.path}")
    kwargs.setdefault("max_context", trained.config.max_context)
    kwargs.setdefault("label", f"checkpoint {trained.path.name}")
    return evaluate(trained.policy, env_id, env_kwargs=env_kwargs, **kwargs)


def format_table(results: list[EvalResult]) -> str:
    """A plain-text comparison table (one row per result)."""
    header = f"{'team':<24} {'accuracy':>9} {'95% CI':>17} {'n':>5} {'tokens/ep':>10} {'timeouts':>9}"
    lines = [header, "-" * len(header)]
    for r in results:
        ci = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]"
        lines.append(
            f"{(r.label or r.env_id)[:24]:<24} {r.accuracy:>9.3f} {ci:>17} {r.n:>5} {r.mean_tokens:>10.1f} {r.verifier_timeouts:>9}"
        )
    return "\n".join(lines)
