"""Regression view (``marft leaderboard --compare A B``): what moved between two systems, per agent.

A and B (run dirs, checkpoint dirs, or ``untrained``) play the same frozen problems with
the same seeds, greedily unless ``--temperature`` is given. The env is ``--env`` (with
``--env-kwargs``), else the first checkpoint's own env and env kwargs, team included, so
a team from a custom team file is compared as it was trained. ``untrained`` is the base
model serving every role with no adapters: the checkpoint's own base model(s) unless
``--model`` is given.

Team rows: accuracy, pass@k, tokens, verifier timeouts, outcome flips, the team reward, each
reward component (``reward/outcome``, ``reward/format``, ...) and the cost: minus the sum of
the components that are costs (:mod:`marft_algos.costs`: the built-in ``chars``, ``tokens``,
``turn``, and any component, a user program's own included, that only ever lowers the
reward or has ``cost`` in its name), as a positive number.

Agent rows: response length, format errors (no extractable answer; only for the roles whose
text is graded as the answer, ``with_answer``: a planner that never answers has none), truncations, the
agent's own text graded as the answer, agreement with its predecessor's answer, and three
kinds of change:

- ``action_changed``: its text differs between A's and B's episode of a problem;
- ``input_changed``: its prompt differs (its predecessors acted differently);
- ``own_change``: on frozen inputs (the exact prompts A's agent saw), A's and B's policy for
  this agent write different texts. Both re-runs decode the same prompts in the same batch
  with the same seed, so an agent whose weights did not change has own change 0 under
  greedy decoding (batched decoding could in principle flip a near-tie through float
  rounding; a test checks the untrained-successor case is exactly 0), and an
  ``action_changed`` without ``own_change`` came from its inputs. With sampling (``--temperature`` > 0) the seeds are shared too, but a changed
  predecessor shifts the random stream of later rows; read it as an upper bound there.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import marft_envs
from marft_algos.costs import cost_components
from marft_algos.evaluation.errors import LeaderboardError
from marft_algos.evaluation.majority import norm_answer
from marft_algos.evaluation.options import (
    DEFAULT_MODEL,
    eval_kwargs,
    parse_env_kwargs,
    problem_indices,
)
from marft_algos.evaluation.policies import (
    check_roles,
    checkpoint_env,
    checkpoint_policy,
    read_run_config,
    untrained_policy,
)
from marft_algos.evaluation.report import markdown_table, write_csv
from marft_algos.evaluation.samples import (
    COST_COMPONENTS,
    SampleRecord,
    play,
    sampling_overrides,
    summarize,
    to_record,
)
from marft_algos.protocols import RolloutPolicy
from marft_algos.rollout import RolloutCollector, make_sampling

__all__ = ["COMPARE_COLUMNS", "UNTRAINED", "run_compare", "replay_frozen", "agent_stats", "answering_roles"]

COMPARE_COLUMNS = ["agent", "metric", "A", "B", "delta"]
#: Names of the untrained system in ``--compare``.
UNTRAINED = ("untrained", "base")


def agent_stats(records: Sequence[SampleRecord], env_id: str, split: str, kwargs: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per agent: mean tokens, format errors (no extractable answer; only for the roles that
    answer, see :func:`answering_roles`), truncations, its own text graded as the answer, and
    agreement of its extracted answer with its predecessor's."""
    env = marft_envs.make(env_id, **{**kwargs, "split": split})
    answering = answering_roles(env)
    problems: dict[int, Any] = {}
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.problem not in problems:
            env.reset(options={"problem_index": r.problem})
            problems[r.problem] = env.problem
        prev: str | None = None
        for i, a in enumerate(r.actions):
            g = env.task.grade(a["text"], problems[r.problem])  # extraction by the task's own rules
            ans = norm_answer(g.extracted) if g.format_ok else None
            s = acc[a["agent"]]
            s["tokens"].append(a["tokens"])
            if answering is None or a["agent"] in answering:
                s["format_error"].append(0.0 if g.format_ok else 1.0)
            s["truncated"].append(1.0 if a["finish"] == "length" else 0.0)
            s["correct_alone"].append(1.0 if g.correct else 0.0)
            if i > 0 and ans is not None and prev is not None:
                s["agrees_with_predecessor"].append(1.0 if ans == prev else 0.0)
            prev = ans
    return {a: {m: (sum(v) / len(v) if v else float("nan")) for m, v in d.items()} for a, d in acc.items()}


def answering_roles(env: Any) -> set[str] | None:
    """The roles whose text is graded as the team's answer (``with_answer`` in the team), or
    None when the env does not say (every role then counts as answering)."""
    team = getattr(getattr(env, "unwrapped", env), "team", None)
    roles = getattr(team, "answer_agents", None)
    return set(roles) if isinstance(roles, (list, tuple, set)) and roles else None


def replay_frozen(
    policy: RolloutPolicy,
    episodes: Sequence[Any],
    sampling: dict[str, Any],
    *,
    max_context: int | None,
    seed: int,
) -> list[list[str | None]]:
    """Each action of ``episodes`` re-generated by ``policy`` on the exact prompt it was sampled
    from (its predecessors' actions frozen); ``None`` where the prompt left no room (overlong).

    ``sampling`` maps each agent to its ``SamplingParams``. All prompts go into one
    ``generate`` call after seeding torch with ``seed``, so two policies replayed on the
    same episodes decode identical batches.
    """
    # deferred: the models package loads transformers
    from marft_algos.models import GenRequest

    requests, where = [], []
    for e, ep in enumerate(episodes):
        for i, t in enumerate(ep.transitions):
            if t.finish_reason == "overlong" or not t.prompt_ids:
                continue
            s = sampling[t.agent]
            if max_context is not None and len(t.prompt_ids) + s.max_new_tokens > max_context:
                s = dataclasses.replace(s, max_new_tokens=max(1, max_context - len(t.prompt_ids)))
            requests.append(GenRequest(role=t.agent, prompt_ids=list(t.prompt_ids), sampling=s))
            where.append((e, i))
    out: list[list[str | None]] = [[None] * len(ep.transitions) for ep in episodes]
    if not requests:
        return out
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        results = list(policy.generate(requests))
    for (e, i), r in zip(where, results, strict=True):
        out[e][i] = r.text
    return out


def _agent_sampling(env_id: str, kwargs: dict[str, Any], agents: list[str], ev: dict[str, Any]) -> dict[str, Any]:
    """Each agent's eval ``SamplingParams`` as the collector of :func:`play` builds them."""
    env = marft_envs.make(env_id, **kwargs)
    collector = RolloutCollector(lambda: env, None, num_envs=1, mode="eval",
                                 sampling_overrides=sampling_overrides(agents, ev["temperature"], ev["max_new_tokens"]))
    return {a: make_sampling(collector.sampling_settings(env, a)) for a in agents}


def _fraction(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else float("nan")


def run_compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The regression view of ``args.compare = (A, B)``: writes compare.md / .csv, returns the rows."""
    path_a, path_b = args.compare
    real = [p for p in (path_a, path_b) if p not in UNTRAINED]
    if not real and not args.env:
        raise LeaderboardError("--compare of two untrained systems needs --env")
    ref = read_run_config(real[0])[0] if real else None
    if args.env:
        env_id = args.env[0]
        kwargs = checkpoint_env(ref, env_id)[1] if ref is not None else {}
        kwargs.update(parse_env_kwargs(args.env_kwargs).get(env_id, {}))
    else:
        env_id, kwargs = checkpoint_env(ref)
    split = args.split or "test"
    env_kwargs = {**kwargs, "split": split}
    agents = marft_envs.spec(env_id).agents_for(**env_kwargs)
    problems = problem_indices(env_id, split, kwargs, args.limit or 200, args.start_index)
    ev = eval_kwargs(args, default_temperature=0.0)  # greedy unless --temperature is given
    sampling = _agent_sampling(env_id, env_kwargs, agents, ev)

    engine = getattr(args, "engine", None)

    def load(path: str) -> Any:
        if path not in UNTRAINED:
            trained = checkpoint_policy(path, engine=engine)
            check_roles(env_id, env_kwargs, trained.roles, f"checkpoint {path}")
            return trained.policy
        if args.model or ref is None:
            return untrained_policy(agents, args.model or DEFAULT_MODEL, engine=engine or "hf")
        return untrained_policy(agents, ref.model, model_per_agent=ref.model_per_agent, device=ref.device, dtype=ref.dtype, engine=engine or "hf")

    runs: dict[str, list[SampleRecord]] = {}
    episodes: dict[str, list[Any]] = {}
    frozen: dict[str, list[list[str | None]]] = {}
    for tag, path in (("A", path_a), ("B", path_b)):
        pol = load(path)
        resets, eps = play(pol, env_id, split=split, env_kwargs=kwargs, problems=problems, k=args.k, seed=args.seed, **ev)
        runs[tag] = [to_record(s, e, args.seed) for s, e in zip(resets, eps, strict=True)]
        episodes[tag] = eps
        frozen[tag] = replay_frozen(pol, episodes["A"], sampling, max_context=ev["max_context"], seed=args.seed)
        del pol
        gc.collect()
    rows = _team_rows(runs["A"], runs["B"])
    pa = agent_stats(runs["A"], env_id, split, kwargs)
    pb = agent_stats(runs["B"], env_id, split, kwargs)
    order = list(dict.fromkeys(a["agent"] for r in runs["A"] for a in r.actions))
    for agent in order:
        for m in ("tokens", "format_error", "truncated", "correct_alone", "agrees_with_predecessor"):
            if m not in pa.get(agent, {}) and m not in pb.get(agent, {}):
                continue  # not measured for this agent (format_error of a role that never answers)
            a, b = pa.get(agent, {}).get(m, float("nan")), pb.get(agent, {}).get(m, float("nan"))
            rows.append({"agent": agent, "metric": m, "A": a, "B": b, "delta": b - a})
        pairs = [(x, y) for ea, eb in zip(episodes["A"], episodes["B"], strict=True)
                 for x, y in zip(ea.transitions, eb.transitions, strict=False) if x.agent == agent and y.agent == agent]
        own = [frozen["A"][e][i] != frozen["B"][e][i]
               for e, ep in enumerate(episodes["A"]) for i, t in enumerate(ep.transitions)
               if t.agent == agent and frozen["A"][e][i] is not None]
        for m, value in (("action_changed", _fraction([x.text != y.text for x, y in pairs])),
                         ("input_changed", _fraction([list(x.prompt_ids) != list(y.prompt_ids) for x, y in pairs])),
                         ("own_change", _fraction(own))):
            rows.append({"agent": agent, "metric": m, "A": 0.0, "B": value, "delta": value})
    _write(args, rows, runs, env_id, split, problems, ev)
    return rows


def _component(name: str, r: SampleRecord) -> float:
    return r.components.get(name, 0.0)


def _team_rows(ra: list[SampleRecord], rb: list[SampleRecord]) -> list[dict[str, Any]]:
    sa, sb = summarize(ra), summarize(rb)
    rows: list[dict[str, Any]] = []
    for m in ("accuracy", "pass_at_k", "tokens_per_episode", "verifier_timeouts"):
        rows.append({"agent": "team", "metric": m, "A": sa[m], "B": sb[m], "delta": sb[m] - sa[m]})
    flips = sum(1 for x, y in zip(ra, rb, strict=True) if x.correct != y.correct)
    rows.append({"agent": "team", "metric": "outcome_flips", "A": 0.0, "B": float(flips), "delta": float(flips)})

    def mean(recs: list[SampleRecord], f: Any) -> float:
        return sum(f(r) for r in recs) / len(recs) if recs else float("nan")

    components = list(dict.fromkeys(c for r in [*ra, *rb] for c in r.components))
    # the same cost components for A and B: found over both systems' episodes
    costs = cost_components({c: [r.components[c] for r in [*ra, *rb] if c in r.components] for c in components},
                            marked=COST_COMPONENTS)

    def cost(r: SampleRecord) -> float:
        return -sum(r.components.get(c, 0.0) for c in costs) + 0.0
    values: list[tuple[str, Any]] = [("reward", lambda r: r.reward)]
    values += [(f"reward/{c}", functools.partial(_component, c)) for c in components]
    values.append(("cost", cost))
    for m, f in values:
        a, b = mean(ra, f), mean(rb, f)
        rows.append({"agent": "team", "metric": m, "A": a, "B": b, "delta": b - a})
    return rows


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], runs: dict[str, list[SampleRecord]], env_id: str,
           split: str, problems: list[int], ev: dict[str, Any]) -> None:
    path_a, path_b = args.compare
    sa, sb = summarize(runs["A"]), summarize(runs["B"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = (
        f"# Regression view\n\nA = `{path_a}`, B = `{path_b}` on `{env_id}` ({split}, problems "
        f"{problems[0] if problems else 0}..{problems[-1] if problems else -1}, k = {args.k}, temperature {ev['temperature']}, seed {args.seed})\n\n"
        f"team accuracy A {sa['accuracy']:.3f} [{sa['ci_low']:.3f}, {sa['ci_high']:.3f}] -> B {sb['accuracy']:.3f} [{sb['ci_low']:.3f}, {sb['ci_high']:.3f}]\n\n"
        + markdown_table(rows, COMPARE_COLUMNS)
        + "\n\nreward: team return per episode; reward/<name>: that reward component; cost: the cost components "
        "(chars, tokens, turn, and every component that only lowers the reward or is named *cost*) as a positive "
        "number. format_error: no answer extractable by the task's grader (only for roles that answer); "
        "truncated: hit max_new_tokens; correct_alone: the agent's own text graded as the answer; "
        "agrees_with_predecessor: same extracted answer as the previous agent's (when both have one); "
        "action_changed: text differs between A and B on the same problem and seed; input_changed: the agent's "
        "prompt differs (its predecessors acted differently); own_change: on A's exact prompts (frozen inputs), "
        "A's and B's policy for the agent write different texts.\n"
    )
    (out_dir / "compare.md").write_text(text)
    write_csv(out_dir / "compare.csv", rows, COMPARE_COLUMNS)
    print(text)
