"""Leaderboard: systems x env suites with fixed seeds -> Markdown table, CSV and plot.

    marft leaderboard --suite arith --limit 200 --k 4 --out runs/leaderboard
    marft leaderboard --suite arith --suite gsm8k --limit 50 \\
        --checkpoint duo-grpo=runs/duo-grpo --model smollm2-135m
    marft leaderboard --env my_pkg:Puzzle-duo-v0 --env-kwargs 'my_pkg:Puzzle-duo-v0={"level": 2}'
    marft leaderboard --compare untrained runs/duo-grpo --limit 200   # what training changed, per agent
    python benchmarks/leaderboard.py ...     # the same, as a script from a checkout

Systems per suite: the untrained solo / duo / trio teams (``--teams``), each checkpoint
given with ``--checkpoint [LABEL=]PATH`` (evaluated on the suite's env of its own team),
and a majority-vote baseline of the single agent at the same sample budget as each
team: ``solo maj@b`` draws b solo answers per episode, b = the team's LLM calls per
episode, and votes on the extracted answers.

Metrics: accuracy = pass@1 averaged over k samples per problem (avg@k) with a 95% Wilson
interval over the problems (conservative for k > 1), pass@k, mean generated tokens per
episode, LLM calls per episode and verifier timeouts. Problems are indices
``0..limit-1`` of the suite's split; sample j of problem i uses reset seed
``seed + 1000 * i + j`` and the torch RNG is seeded with ``seed`` per system, so a
re-run reproduces the table.

Suites are data: a name -> {team: env id} + split + env kwargs + size limit. Third
parties add one without touching this file: ``--env ID`` (any registered id, repeatable,
also ``module:Id-v0``), ``--suite-file suites.json`` or :func:`register_suite`.

Regression view (``--compare A B``): both checkpoints on the same frozen problems,
greedy by default; per agent it shows what moved: response length, format errors
(no extractable answer), truncations, agreement of its extracted answer with its
predecessor's, and the fraction of problems where its action text changed.
"""

from __future__ import annotations

import argparse
import csv
import gc
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Only the standard library at import time: `marft --help` builds this parser too.

__all__ = [
    "Suite",
    "SUITES",
    "register_suite",
    "load_suite_file",
    "SampleRecord",
    "run_samples",
    "summarize",
    "majority_vote",
    "run_leaderboard",
    "run_compare",
    "write_outputs",
    "plot_leaderboard",
    "LeaderboardError",
    "build_parser",
    "add_arguments",
    "run",
    "main",
    "COLUMNS",
    "COMPARE_COLUMNS",
    "wilson",
    "versions",
    "fmt",
    "markdown_table",
    "write_csv",
    "write_json",
    "untrained_policy",
    "checkpoint_policy",
]

#: Sampling temperature of the leaderboard when ``--temperature`` is not given
#: (the regression view decodes greedily instead).
DEFAULT_TEMPERATURE = 0.7


class LeaderboardError(ValueError):
    """Bad leaderboard input (unknown suite, malformed ``--env-kwargs``): one-line error, exit 2."""


# --------------------------------------------------------------------------------------
# report helpers (shared with the benchmark scripts)
# --------------------------------------------------------------------------------------


def wilson(p: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval for a proportion ``p`` observed over ``n`` units.

    ``p`` may be a mean of per-unit averages (avg@k over n problems): the variance of
    such a mean is at most p(1-p)/n, so the interval is conservative there.

    >>> wilson(0.0, 10)[0], wilson(1.0, 10)[1]
    (0.0, 1.0)
    >>> lo, hi = wilson(0.5, 100); round(lo, 3), round(hi, 3)
    (0.404, 0.596)
    """
    if n <= 0 or not math.isfinite(p):
        return (0.0, 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if p <= 0 else max(0.0, centre - half)
    hi = 1.0 if p >= 1 else min(1.0, centre + half)
    return (lo, hi)


def _pkg(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _source_commit() -> str:
    """The git commit of the marft checkout (``+uncommitted`` if its code differs), when
    marft runs from a checkout; else the installed package version."""
    root = Path(__file__).resolve().parents[1]
    if not ((root / "pyproject.toml").is_file() and (root / "marft_algos" / "__init__.py").is_file()):
        return f"marft {_pkg('marft')} (installed, no git checkout)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "marft_algos", "marft_envs", "benchmarks"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not commit:
        return "unknown"
    return commit + ("+uncommitted" if dirty else "")


def versions() -> dict[str, str]:
    """Versions of everything a number depends on (python, torch, ..., marft git commit, device)."""
    import torch

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()} ({torch.get_num_threads()} torch threads)"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _pkg("transformers"),
        "peft": _pkg("peft"),
        "trl": _pkg("trl"),
        "marft": _source_commit(),
        "device": dev,
    }


def fmt(v: Any, digits: int = 3) -> str:
    """A table cell: floats with ``digits`` decimals, non-finite floats as ``-``.

    >>> fmt(0.12345), fmt(float("nan")), fmt(7)
    ('0.123', '-', '7')
    """
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.{digits}f}"
    return str(v)


def write_csv(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> Path:
    """Write ``rows`` as CSV with ``columns`` (default: every key seen, in order); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
    return path


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None, digits: int = 3) -> str:
    """A Markdown table of ``rows`` (one per dict) with the given columns and headers.

    >>> print(markdown_table([{"a": 1, "b": 0.5}], ["a", "b"]))
    | a | b |
    |---|---|
    | 1 | 0.500 |
    """
    heads = list(headers) if headers is not None else list(columns)
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, ""), digits) for c in columns) + " |")
    return "\n".join(lines)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON (non-JSON values as ``str``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))
    return path


def untrained_policy(roles: Sequence[str], model: str) -> Any:
    """A plain base model serving every role (no adapters: exactly the untrained team).

    Untrained LoRA adapters are zero (B = 0), so the base alone gives the same outputs
    without the adapter overhead; ``full`` mode without a reference copy does that.
    """
    from marft_algos.models import TeamPolicy

    return TeamPolicy(list(roles), base=model, mode="full", full_reference=False)


def checkpoint_policy(checkpoint: str | os.PathLike[str], env_id: str | None = None) -> tuple[Any, Any, str]:
    """The trained policy stored in a run dir / checkpoint: ``(policy, config, checkpoint dir)``."""
    import marft_envs
    from marft_algos.checkpoint import find_checkpoint
    from marft_algos.config import config_from_dict
    from marft_algos.models import LoraSettings, TeamPolicy
    from marft_algos.trainer import get_algorithm

    ckpt = find_checkpoint(checkpoint)
    data = json.loads((Path(ckpt) / "config.json").read_text())
    spec = get_algorithm(data.get("algo", "grpo"))
    config = config_from_dict(spec.config_cls, data)
    agents = list(marft_envs.make(env_id or config.env_id, **({} if env_id else config.env_kwargs)).possible_agents)
    # As marft_algos.trainer.make_policy, but with a seed != the training one, so that the
    # loaded state can never be mistaken for the fresh initialisation.
    base: Any = {a: config.model_per_agent.get(a, config.model) for a in agents} if config.model_per_agent else config.model
    kwargs: dict[str, Any] = {"base": base, "mode": config.mode, "seed": 987_654_321,
                              "lora": LoraSettings(r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout)}
    if config.device != "auto":
        kwargs["device"] = config.device
    if config.dtype is not None:
        kwargs["dtype"] = config.dtype
    policy = TeamPolicy(list(agents), **kwargs)
    policy.load(Path(ckpt) / "policy")
    return policy, config, str(ckpt)


# --------------------------------------------------------------------------------------
# suites
# --------------------------------------------------------------------------------------


@dataclass
class Suite:
    """A benchmark suite: the env id of each team on one task, its split, kwargs and size."""

    name: str
    envs: dict[str, str]
    split: str = "test"
    kwargs: dict[str, Any] = field(default_factory=dict)
    limit: int = 200

    @classmethod
    def for_task(cls, name: str, task: str, split: str = "test", limit: int = 200, **kwargs: Any) -> Suite:
        """The built-in ``{task}-{solo,duo,trio}-v0`` ids."""
        return cls(name, {t: f"{task}-{t}-v0" for t in ("solo", "duo", "trio")}, split, dict(kwargs), limit)


SUITES: dict[str, Suite] = {
    "arith": Suite.for_task("arith", "arith", "test", 200),  # of ~5,000 test problems
    "gsm8k": Suite.for_task("gsm8k", "gsm8k", "test", 1319),
    "math500": Suite.for_task("math500", "math", "test500", 500),
    "humaneval": Suite.for_task("humaneval", "code", "test", 164),
}


def register_suite(suite: Suite, *, overwrite: bool = False) -> Suite:
    """Add a suite (e.g. from a third-party package) under ``suite.name``."""
    if suite.name in SUITES and not overwrite:
        raise ValueError(f"suite {suite.name!r} exists; pass overwrite=True to replace it")
    SUITES[suite.name] = suite
    return suite


def load_suite_file(path: str | Path) -> list[Suite]:
    """``{"name": {"envs": {team: id}, "split": ..., "kwargs": {...}, "limit": N}}``."""
    data = json.loads(Path(path).read_text())
    out = []
    for name, d in data.items():
        out.append(register_suite(Suite(name, dict(d["envs"]), d.get("split", "test"), dict(d.get("kwargs", {})), int(d.get("limit", 200))), overwrite=True))
    return out


# --------------------------------------------------------------------------------------
# sampling and records
# --------------------------------------------------------------------------------------


@dataclass
class SampleRecord:
    """One episode: problem ``problem`` (index in the split), sample ``sample`` of k."""

    problem: int
    sample: int
    correct: bool
    tokens: int
    calls: int
    timed_out: bool
    answer: str | None
    actions: list[dict[str, Any]]


def _norm_answer(a: str | None) -> str | None:
    if a is None:
        return None
    s = "".join(str(a).split()).lower().rstrip(".")
    return s or None


def run_samples(
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
) -> list[SampleRecord]:
    """Play k episodes per problem (batched across episodes); fixed seeds throughout."""
    import torch

    import marft_envs
    from marft_algos.rollout import RolloutCollector

    kwargs = {**(env_kwargs or {}), "split": split}
    env_fn = lambda: marft_envs.make(env_id, **kwargs)  # noqa: E731
    probe = env_fn()
    overrides: dict[str, dict[str, Any]] = {}
    for a in probe.possible_agents:
        o: dict[str, Any] = {}
        if temperature is not None:
            o["temperature"] = float(temperature)
        if max_new_tokens is not None:
            o["max_new_tokens"] = int(max_new_tokens)
        overrides[a] = o
    resets = [
        {"seed": seed + 1000 * p + j, "options": {"problem_index": int(p)}, "group_id": int(p)}
        for p in problems
        for j in range(k)
    ]
    if not resets:
        return []
    collector = RolloutCollector(env_fn, policy, num_envs=max(1, min(num_envs, len(resets))), mode="eval", sampling_overrides=overrides, max_context=max_context, seed=seed)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        batch = collector.run(resets)
    out = []
    for spec, ep in zip(resets, batch.episodes, strict=True):
        answer, timed_out = None, False
        for t in ep.transitions:
            g = t.info.get("grade")
            if isinstance(g, dict):
                answer = g.get("extracted")
                timed_out = timed_out or bool(g.get("timed_out"))
        actions = [
            {"agent": t.agent, "tokens": t.num_tokens, "text": t.text, "finish": t.finish_reason, "flags": list(t.flags), "turn": t.turn}
            for t in ep.transitions
        ]
        out.append(
            SampleRecord(
                problem=int(spec["options"]["problem_index"]),
                sample=int(spec["seed"] - seed - 1000 * spec["options"]["problem_index"]),
                correct=bool(ep.correct),
                tokens=ep.num_tokens,
                calls=len(ep.transitions),
                timed_out=timed_out,
                answer=None if answer is None else str(answer),
                actions=actions,
            )
        )
    return out


def _by_problem(records: Sequence[SampleRecord]) -> dict[int, list[SampleRecord]]:
    out: dict[int, list[SampleRecord]] = defaultdict(list)
    for r in records:
        out[r.problem].append(r)
    for v in out.values():
        v.sort(key=lambda r: r.sample)
    return dict(out)


def summarize(records: Sequence[SampleRecord], k: int | None = None) -> dict[str, Any]:
    """avg@k accuracy (+ Wilson CI over problems), pass@k, tokens, calls, timeouts."""
    groups = _by_problem(records)
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
    }


def majority_vote(records: Sequence[SampleRecord], budget: int, k: int) -> list[SampleRecord]:
    """k voted episodes per problem, each from ``budget`` consecutive single-agent samples.

    The vote is over normalized extracted answers (ties: the first answer seen wins);
    the voted episode is correct when a sample with the winning answer was graded
    correct; its tokens and calls are the sum over the voters (the same sample budget).
    """
    out = []
    for p, rs in _by_problem(records).items():
        for j in range(k):
            voters = rs[j * budget : (j + 1) * budget]
            if len(voters) < budget:
                break
            votes = Counter(a for a in (_norm_answer(r.answer) for r in voters) if a is not None)
            if votes:
                winner = votes.most_common(1)[0][0]
                correct = any(r.correct for r in voters if _norm_answer(r.answer) == winner)
            else:
                winner, correct = None, False
            out.append(
                SampleRecord(
                    problem=p,
                    sample=j,
                    correct=correct,
                    tokens=sum(r.tokens for r in voters),
                    calls=sum(r.calls for r in voters),
                    timed_out=any(r.timed_out for r in voters),
                    answer=winner,
                    actions=[],
                )
            )
    return out


# --------------------------------------------------------------------------------------
# the leaderboard
# --------------------------------------------------------------------------------------

COLUMNS = [
    "suite", "system", "env_id", "problems", "k", "accuracy", "ci_low", "ci_high", "pass_at_k",
    "tokens_per_episode", "calls_per_episode", "verifier_timeouts", "seconds",
]
_HEADERS = [
    "suite", "system", "env", "problems", "k", "acc (avg@k)", "95% CI low", "95% CI high", "pass@k",
    "tokens/episode", "LLM calls/episode", "verifier timeouts", "seconds",
]


def _team_of(env_id: str) -> str | None:
    """The team name a registered id was built with (its ``profiles`` kwarg), if any."""
    import marft_envs

    try:
        prof = marft_envs.spec(env_id).kwargs.get("profiles")
    except Exception:  # noqa: BLE001  (third-party ids may not resolve without an import)
        return None
    return prof if isinstance(prof, str) else None


def _agents(env_id: str, split: str, kwargs: dict[str, Any]) -> list[str]:
    import marft_envs

    return list(marft_envs.make(env_id, **{**kwargs, "split": split}).possible_agents)


def _problems(env_id: str, split: str, kwargs: dict[str, Any], limit: int, start: int) -> list[int]:
    import marft_envs

    total = int(getattr(marft_envs.make(env_id, **{**kwargs, "split": split}), "num_problems", limit))
    return list(range(start, min(total, start + limit)))


def _parse_ckpt(spec: str) -> tuple[str, str]:
    if "=" in spec:
        label, path = spec.split("=", 1)
        return label, path
    return Path(spec.rstrip("/")).name, spec


def _temperature(args: argparse.Namespace, default: float) -> float | None:
    """``--temperature`` if given (< 0: None = the profiles' own settings), else ``default``."""
    if args.temperature is None:
        return default
    return None if args.temperature < 0 else args.temperature


def _eval_kwargs(args: argparse.Namespace, default_temperature: float = DEFAULT_TEMPERATURE) -> dict[str, Any]:
    temp = _temperature(args, default_temperature)
    return dict(temperature=temp, max_new_tokens=args.max_new_tokens, num_envs=args.num_envs, max_context=args.max_context)


def run_leaderboard(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Evaluate every system on every selected suite; write the outputs; return the rows.

    ``args`` are the parsed options of :func:`add_arguments`.
    """
    import marft_envs

    suites: list[Suite] = []
    for path in args.suite_file or []:
        suites += load_suite_file(path)
    for name in args.suite or ([] if (args.env or args.suite_file) else ["arith"]):
        if name not in SUITES:
            raise LeaderboardError(f"unknown suite {name!r}; known: {', '.join(SUITES)} (or --env ID / --suite-file)")
        suites.append(SUITES[name])
    env_kwargs = {}
    for item in args.env_kwargs or []:
        eid, sep, js = item.partition("=")
        try:
            env_kwargs[eid] = json.loads(js) if sep else None
        except json.JSONDecodeError as e:
            raise LeaderboardError(f"--env-kwargs {item!r}: the part after '=' is not JSON ({e})") from None
        if not isinstance(env_kwargs[eid], dict):
            raise LeaderboardError(f"--env-kwargs {item!r}: expected ID={{JSON object}}")
    for eid in args.env or []:
        if ":" not in eid:
            marft_envs.spec(eid)  # fail fast on a typo (did-you-mean)
        suites.append(Suite(eid, {"env": eid}, args.split or "test", env_kwargs.get(eid, {}), args.limit or 200))
    teams = [t.strip() for t in args.teams.split(",") if t.strip()]
    ckpts = [_parse_ckpt(c) for c in args.checkpoint or []]
    ev = _eval_kwargs(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    samples_path = out_dir / "samples.jsonl"
    samples_f = samples_path.open("w")

    def record(suite: Suite, system: str, env_id: str, recs: list[SampleRecord], seconds: float, k: int) -> None:
        row = {"suite": suite.name, "system": system, "env_id": env_id, **summarize(recs, k), "seconds": seconds}
        rows.append(row)
        print(f"[leaderboard] {suite.name:<10} {system:<22} acc {row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
              f"pass@{row['k']} {row['pass_at_k']:.3f}  tokens/ep {row['tokens_per_episode']:.1f}  ({seconds:.0f} s)", flush=True)
        for r in recs:
            samples_f.write(json.dumps({"suite": suite.name, "system": system, **r.__dict__}) + "\n")

    try:
        for suite in suites:
            split = args.split or suite.split
            limit = args.limit or suite.limit
            suite_teams = [t for t in (teams if "env" not in suite.envs else ["env"]) if t in suite.envs]
            if not suite_teams:
                continue
            any_env = suite.envs[suite_teams[0]]
            problems = _problems(any_env, split, suite.kwargs, limit, args.start_index)
            roles = sorted({a for t in suite_teams for a in _agents(suite.envs[t], split, suite.kwargs)}
                           | (set(_agents(suite.envs["solo"], split, suite.kwargs)) if "solo" in suite.envs and args.majority else set()))
            policy = untrained_policy(roles, args.model)
            budgets: dict[str, int] = {}
            for team in suite_teams:
                if team == "solo" and args.majority:
                    continue  # run with the vote samples below (one pass serves both)
                env_id = suite.envs[team]
                t0 = time.perf_counter()
                recs = run_samples(policy, env_id, split=split, env_kwargs=suite.kwargs, problems=problems, k=args.k, seed=args.seed, **ev)
                record(suite, "untrained" if team == "env" else f"untrained {team}", env_id, recs, time.perf_counter() - t0, args.k)
                calls = summarize(recs)["calls_per_episode"]
                if team != "solo" and math.isfinite(calls):
                    budgets[team] = max(1, round(calls))
            if args.majority and "solo" in suite.envs:
                b_max = max([1, *budgets.values()])
                env_id = suite.envs["solo"]
                t0 = time.perf_counter()
                recs = run_samples(policy, env_id, split=split, env_kwargs=suite.kwargs, problems=problems, k=args.k * b_max, seed=args.seed, **ev)
                seconds = time.perf_counter() - t0
                if "solo" in suite_teams:
                    record(suite, "untrained solo", env_id, recs, seconds * 1 / b_max, args.k)
                for b in sorted(set(budgets.values())):
                    if b > 1:
                        record(suite, f"solo maj@{b}", env_id, majority_vote(recs, b, args.k), seconds * b / b_max, args.k)
            del policy
            gc.collect()
            for label, path in ckpts:
                from marft_algos.checkpoint import read_checkpoint_config

                trained_env = read_checkpoint_config(path).get("env_id", "")
                team = _team_of(trained_env)
                env_id = suite.envs.get(team or "", suite.envs.get("env"))
                if env_id is None:
                    print(f"[leaderboard] {suite.name}: no env for checkpoint {label} (team {team!r}); skipped")
                    continue
                if "env" in suite.envs and _agents(env_id, split, suite.kwargs) != _agents(trained_env, "test", {}):
                    print(f"[leaderboard] {suite.name}: agents differ from checkpoint {label}'s; skipped")
                    continue
                pol, _, _ = checkpoint_policy(path, env_id)
                t0 = time.perf_counter()
                recs = run_samples(pol, env_id, split=split, env_kwargs=suite.kwargs, problems=problems, k=args.k, seed=args.seed, **ev)
                record(suite, f"trained {label}", env_id, recs, time.perf_counter() - t0, args.k)
                del pol
                gc.collect()
    finally:
        samples_f.close()
    write_outputs(rows, out_dir, args)
    return rows


def _rank(system: str) -> int:
    for i, prefix in enumerate(("untrained solo", "solo maj", "untrained duo", "untrained trio", "untrained")):
        if system.startswith(prefix):
            return i
    return 9


def write_outputs(rows: list[dict[str, Any]], out_dir: Path, args: argparse.Namespace) -> None:
    """Sort ``rows`` (baselines first) and write leaderboard.md / .csv / .json / .png."""
    suites = list(dict.fromkeys(r["suite"] for r in rows))
    rows.sort(key=lambda r: (suites.index(r["suite"]), _rank(r["system"])))
    table = markdown_table(rows, COLUMNS, _HEADERS)
    meta = versions()
    settings = {k: v for k, v in vars(args).items() if k not in ("func",)}
    header = (
        f"# Leaderboard\n\nmodel `{args.model}`, k = {args.k} samples per problem, temperature "
        f"{_temperature(args, DEFAULT_TEMPERATURE)}, seed {args.seed}; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta.items())
        + "\n\n"
    )
    (out_dir / "leaderboard.md").write_text(header + table + "\n")
    write_csv(out_dir / "leaderboard.csv", rows, COLUMNS)
    write_json(out_dir / "leaderboard.json", {"rows": rows, "versions": meta, "settings": settings})
    plot_leaderboard(rows, out_dir / "leaderboard.png")
    print(table)
    print(f"[leaderboard] wrote {out_dir / 'leaderboard.md'}, .csv, .png, samples.jsonl")


def plot_leaderboard(rows: list[dict[str, Any]], path: Path) -> None:
    """Bar chart of accuracy with 95% CI, one panel per suite."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = list(dict.fromkeys(r["suite"] for r in rows))
    fig, axes = plt.subplots(1, max(1, len(suites)), figsize=(4.5 * max(1, len(suites)), 3.6), squeeze=False)
    for ax, suite in zip(axes[0], suites, strict=False):
        rs = [r for r in rows if r["suite"] == suite]
        xs = range(len(rs))
        acc = [r["accuracy"] for r in rs]
        err = [[max(0.0, r["accuracy"] - r["ci_low"]) for r in rs], [max(0.0, r["ci_high"] - r["accuracy"]) for r in rs]]
        ax.bar(xs, acc, yerr=err, capsize=3, color=["#4c72b0" if "untrained" in r["system"] else "#dd8452" if "trained" in r["system"] else "#8c8c8c" for r in rs])
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["system"] for r in rs], rotation=35, ha="right", fontsize=8)
        ax.set_title(suite)
        ax.set_ylabel("accuracy (avg@k), 95% CI")
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# regression view
# --------------------------------------------------------------------------------------

COMPARE_COLUMNS = ["agent", "metric", "A", "B", "delta"]
_UNTRAINED = ("untrained", "base")


def _agent_stats(records: Sequence[SampleRecord], env_id: str, split: str, kwargs: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per agent: mean tokens, format errors (no extractable answer), truncations, and
    agreement of its extracted answer with the answer of the agent acting before it."""
    import marft_envs

    env = marft_envs.make(env_id, **{**kwargs, "split": split})
    problems: dict[int, Any] = {}
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.problem not in problems:
            env.reset(options={"problem_index": r.problem})
            problems[r.problem] = env.problem
        prev: str | None = None
        for i, a in enumerate(r.actions):
            g = env.task.grade(a["text"], problems[r.problem])  # extraction by the task's own rules
            ans = _norm_answer(g.extracted) if g.format_ok else None
            s = acc[a["agent"]]
            s["tokens"].append(a["tokens"])
            s["format_error"].append(0.0 if g.format_ok else 1.0)
            s["truncated"].append(1.0 if a["finish"] == "length" else 0.0)
            s["correct_alone"].append(1.0 if g.correct else 0.0)
            if i > 0 and ans is not None and prev is not None:
                s["agrees_with_predecessor"].append(1.0 if ans == prev else 0.0)
            prev = ans
    return {a: {m: (sum(v) / len(v) if v else float("nan")) for m, v in d.items()} for a, d in acc.items()}


def run_compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The regression view of ``args.compare = (A, B)``: writes compare.md / .csv, returns the rows."""
    from marft_algos.checkpoint import read_checkpoint_config

    path_a, path_b = args.compare
    real = [p for p in (path_a, path_b) if p not in _UNTRAINED]
    if not real and not args.env:
        raise LeaderboardError("--compare of two untrained systems needs --env")
    cfg = read_checkpoint_config(real[0]) if real else {}
    env_id = (args.env or [None])[0] or cfg.get("env_id")
    kwargs = dict(cfg.get("env_kwargs", {})) if not args.env else {}
    split = args.split or "test"
    problems = _problems(env_id, split, kwargs, args.limit or 200, args.start_index)
    ev = _eval_kwargs(args, default_temperature=0.0)  # greedy unless --temperature is given
    runs: dict[str, list[SampleRecord]] = {}
    for tag, path in (("A", path_a), ("B", path_b)):
        if path in _UNTRAINED:
            pol = untrained_policy(_agents(env_id, split, kwargs), args.model)
        else:
            pol, _, _ = checkpoint_policy(path, env_id)
        runs[tag] = run_samples(pol, env_id, split=split, env_kwargs=kwargs, problems=problems, k=args.k, seed=args.seed, **ev)
        del pol
        gc.collect()
    sa, sb = summarize(runs["A"]), summarize(runs["B"])
    rows: list[dict[str, Any]] = []
    for m in ("accuracy", "pass_at_k", "tokens_per_episode", "verifier_timeouts"):
        rows.append({"agent": "team", "metric": m, "A": sa[m], "B": sb[m], "delta": sb[m] - sa[m]})
    flips = sum(1 for x, y in zip(runs["A"], runs["B"], strict=True) if x.correct != y.correct)
    rows.append({"agent": "team", "metric": "outcome_flips", "A": 0.0, "B": float(flips), "delta": float(flips)})
    pa = _agent_stats(runs["A"], env_id, split, kwargs)
    pb = _agent_stats(runs["B"], env_id, split, kwargs)
    order = list(dict.fromkeys(a["agent"] for r in runs["A"] for a in r.actions))
    for agent in order:
        for m in ("tokens", "format_error", "truncated", "correct_alone", "agrees_with_predecessor"):
            a, b = pa.get(agent, {}).get(m, float("nan")), pb.get(agent, {}).get(m, float("nan"))
            rows.append({"agent": agent, "metric": m, "A": a, "B": b, "delta": b - a})
        changed = [
            x_act["text"] != y_act["text"]
            for x, y in zip(runs["A"], runs["B"], strict=True)
            for x_act, y_act in zip(x.actions, y.actions, strict=False)
            if x_act["agent"] == agent and y_act["agent"] == agent
        ]
        rows.append({"agent": agent, "metric": "action_changed", "A": 0.0, "B": sum(changed) / max(len(changed), 1), "delta": sum(changed) / max(len(changed), 1)})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    lo_a, hi_a = sa["ci_low"], sa["ci_high"]
    lo_b, hi_b = sb["ci_low"], sb["ci_high"]
    text = (
        f"# Regression view\n\nA = `{path_a}`, B = `{path_b}` on `{env_id}` ({split}, problems "
        f"{problems[0] if problems else 0}..{problems[-1] if problems else -1}, k = {args.k}, temperature {ev['temperature']}, seed {args.seed})\n\n"
        f"team accuracy A {sa['accuracy']:.3f} [{lo_a:.3f}, {hi_a:.3f}] -> B {sb['accuracy']:.3f} [{lo_b:.3f}, {hi_b:.3f}]\n\n"
        + markdown_table(rows, COMPARE_COLUMNS)
        + "\n\nformat_error: no answer extractable by the task's grader; truncated: hit max_new_tokens; "
        "correct_alone: the agent's own text graded as the answer; agrees_with_predecessor: same extracted "
        "answer as the previous agent's (when both have one); action_changed: text differs between A and B "
        "on the same problem and seed.\n"
    )
    (out_dir / "compare.md").write_text(text)
    write_csv(out_dir / "compare.csv", rows, COMPARE_COLUMNS)
    print(text)
    return rows


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the leaderboard options to ``p`` (shared by ``marft leaderboard`` and the script)."""
    p.add_argument("--suite", action="append", help=f"built-in suite (repeatable): {', '.join(SUITES)}; default arith")
    p.add_argument("--env", action="append", help="any registered env id as its own suite (repeatable; 'module:Id-v0' imports module)")
    p.add_argument("--env-kwargs", action="append", metavar="ID=JSON", help="kwargs for an --env id, e.g. 'arith-duo-v0={\"digits\": 2}'")
    p.add_argument("--suite-file", action="append", help="JSON file of suites: {name: {envs: {team: id}, split, kwargs, limit}}")
    p.add_argument("--teams", default="solo,duo,trio", help="teams of the built-in suites (comma list)")
    p.add_argument("--checkpoint", action="append", metavar="[LABEL=]PATH", help="trained run dir / checkpoint (repeatable)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="regression view of two checkpoints ('untrained' allowed)")
    p.add_argument("--model", default="smollm2-135m", help="base model of the untrained systems")
    p.add_argument("--limit", type=int, default=None, help="problems per suite (default: the suite's size)")
    p.add_argument("--start-index", type=int, default=0)
    p.add_argument("--split", default=None, help="override the suites' split")
    p.add_argument("--k", type=int, default=1, help="samples per problem (avg@k, pass@k)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature of every agent (0 = greedy; <0 = the profiles' own); default {DEFAULT_TEMPERATURE}, greedy for --compare")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--num-envs", type=int, default=32, help="episodes generated together")
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--no-majority", dest="majority", action="store_false", help="skip the majority-vote baselines")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default="runs/leaderboard")
    return p


def build_parser(prog: str = "marft leaderboard") -> argparse.ArgumentParser:
    """The standalone parser (``benchmarks/leaderboard.py`` passes its own ``prog``)."""
    return add_arguments(argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0]))


def run(args: argparse.Namespace) -> int:
    """Run the leaderboard or, with ``--compare``, the regression view; exit status 0."""
    if args.compare:
        run_compare(args)
    else:
        run_leaderboard(args)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "marft leaderboard") -> int:
    """Command-line entry point; bad input ends with a one-line error and exit status 2."""
    args = build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return run(args)
    except LeaderboardError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
