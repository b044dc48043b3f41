"""Leaderboard: systems x env suites with fixed seeds -> Markdown table, CSV and plot.

    marft leaderboard --suite arith --limit 200 --k 4 --out runs/leaderboard
    marft leaderboard --suite arith --suite gsm8k --limit 50 \\
        --checkpoint duo-grpo=runs/duo-grpo --model smollm2-135m
    marft leaderboard --env my_pkg:Puzzle-duo-v0 --env-kwargs 'my_pkg:Puzzle-duo-v0={"level": 2}'
    marft leaderboard --compare untrained runs/duo-grpo --limit 200   # what training changed, per agent
    python benchmarks/leaderboard.py ...     # the same, as a script from a checkout

Systems per suite: the untrained teams of the suite (``--teams`` selects among them; without
it a built-in suite runs solo, duo and trio and a ``--suite-file`` suite runs every team it
lists), each checkpoint given with ``--checkpoint [LABEL=]PATH``, and a majority-vote
baseline of the single agent at the same sample budget as each team: ``solo maj@b`` draws
b solo answers per episode, b = the team's LLM calls per episode, and votes on the
extracted answers. Untrained means the base model serving every role with no adapters
(:func:`~marft_algos.evaluation.policies.untrained_policy`).

Which env of a suite a checkpoint plays (:func:`match_checkpoint`): the first of (1) the
suite's env of the team the run's ``profiles``/``team`` kwarg names, (2) the suite's env
with the run's own env id, (3) the suite's env of the team the run's env id was registered
with (``arith-duo-v0`` -> ``duo``), (4) the env of an ``--env`` suite; played with the
suite's kwargs plus the run's team kwargs, so a team from a custom team file plays the
suite's task as the team it was trained as. A checkpoint whose roles do not cover that
env's agents is skipped with a printed reason, never silently.

Metrics: accuracy = pass@1 averaged over k samples per problem (avg@k) with a 95% Wilson
interval over the problems (conservative for k > 1), pass@k, mean generated tokens per
episode, LLM calls per episode and verifier timeouts. Problems are indices
``0..limit-1`` of the suite's split; sample j of problem i uses reset seed
``seed + 1000 * i + j`` and the torch RNG is seeded with ``seed`` per system, so a
re-run reproduces the table.

Games (a suite whose env is a two-player text game, e.g. ``--env game-nim-v0``): every
system plays each start position ``0..limit-1`` once in EACH seat against every fixed
opponent of ``--opponent`` (default ``random``; ``optimal`` for Nim; ``fixed:MOVE``) and
gets win/draw/loss rates with 95% Wilson intervals, per seat and pooled (seat ``all``),
plus the mean invalid moves per game (:func:`~marft_algos.evaluation.games.game_leaderboard_rows`).
``--temperature`` applies (0 or a negative value: greedy); ``--k`` and the majority-vote
baseline do not. These rows form their own table (``leaderboard.md``'s "Games" section,
``leaderboard_games.csv``, and ``games`` in ``leaderboard.json``).

Regression view (``--compare A B``): see :mod:`marft_algos.evaluation.compare`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import marft_envs
from marft_algos.checkpoint import CheckpointError
from marft_algos.evaluation.compare import run_compare
from marft_algos.evaluation.errors import EvaluationError, LeaderboardError
from marft_algos.evaluation.games import (
    GAME_LEADERBOARD_COLUMNS,
    game_leaderboard_rows,
    is_game_env,
    scripted_opponent,
)
from marft_algos.evaluation.majority import majority_vote
from marft_algos.evaluation.options import (
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    GAME_MAX_NEW_TOKENS,
    eval_kwargs,
    parse_env_kwargs,
    problem_indices,
    sampling_temperature,
)
from marft_algos.evaluation.plots import plot_leaderboard
from marft_algos.evaluation.policies import (
    TrainedPolicy,
    checkpoint_policy,
    read_run_config,
    saved_roles,
    team_kwargs,
    untrained_policy,
)
from marft_algos.evaluation.report import markdown_table, versions, write_csv, write_json
from marft_algos.evaluation.samples import SampleRecord, overlong_agents, run_samples, summarize
from marft_algos.evaluation.suites import BUILTIN_TEAMS, SUITES, Suite, load_suite_file

# Only the standard library at import time: `marft --help` builds this parser too.

__all__ = [
    "COLUMNS",
    "DEFAULT_MODEL",
    "DEFAULT_TEMPERATURE",
    "add_arguments",
    "build_parser",
    "eval_kwargs",
    "match_checkpoint",
    "parse_env_kwargs",
    "problem_indices",
    "main",
    "run",
    "run_leaderboard",
    "select_suites",
    "write_outputs",
]

COLUMNS = [
    "suite", "system", "env_id", "problems", "k", "accuracy", "ci_low", "ci_high", "pass_at_k", "team_reward",
    "tokens_per_episode", "calls_per_episode", "verifier_timeouts", "overlong_episodes", "seconds",
]
_HEADERS = [
    "suite", "system", "env", "problems", "k", "acc (avg@k)", "95% CI low", "95% CI high", "pass@k", "team reward",
    "tokens/episode", "LLM calls/episode", "verifier timeouts", "overlong episodes", "seconds",
]


def _team_of(env_id: str) -> str | None:
    """The team name a registered id was built with (its ``profiles`` kwarg), if any."""
    try:
        prof = marft_envs.spec(env_id).kwargs.get("profiles")
    except Exception:  # noqa: BLE001  (third-party ids may not resolve without an import)
        return None
    return prof if isinstance(prof, str) else None


def _parse_ckpt(spec: str) -> tuple[str, str]:
    if "=" in spec:
        label, path = spec.split("=", 1)
        return label, path
    return Path(spec.rstrip("/")).name, spec


def select_suites(args: argparse.Namespace) -> list[tuple[Suite, list[str]]]:
    """The suites of ``args`` with the teams to run on each (see the module docstring).

    ``--teams`` selects among a suite's teams; the teams it leaves out are printed.
    """
    suites: list[Suite] = []
    from_file: set[str] = set()
    for path in args.suite_file or []:
        for s in load_suite_file(path):
            suites.append(s)
            from_file.add(s.name)
    for name in args.suite or ([] if (args.env or args.suite_file) else ["arith"]):
        if name not in SUITES:
            raise LeaderboardError(f"unknown suite {name!r}; known: {', '.join(SUITES)} (or --env ID / --suite-file)")
        suites.append(SUITES[name])
    env_kwargs = parse_env_kwargs(args.env_kwargs)
    for eid in args.env or []:
        if ":" not in eid:
            marft_envs.spec(eid)  # fail fast on a typo (did-you-mean)
        suites.append(Suite(eid, {"env": eid}, args.split or "test", env_kwargs.get(eid, {}), args.limit or 200))
    chosen = [t.strip() for t in args.teams.split(",") if t.strip()] if args.teams else None
    out = []
    for suite in suites:
        if "env" in suite.envs:
            teams = ["env"]
        elif chosen is not None:
            teams = [t for t in chosen if t in suite.envs]
            left = [t for t in suite.envs if t not in teams]
            if left:
                print(f"[leaderboard] {suite.name}: teams {left} not selected by --teams {args.teams}")
        elif suite.name in from_file:
            teams = list(suite.envs)
        else:
            teams = [t for t in BUILTIN_TEAMS if t in suite.envs] or list(suite.envs)
        out.append((suite, teams))
    return out


def match_checkpoint(suite: Suite, config: Any, roles: Sequence[str], split: str) -> tuple[str, dict[str, Any]] | str:
    """``(env id, env kwargs)`` the checkpoint of run config ``config`` plays in ``suite``,
    or the reason it plays none there (see the module docstring for the rule)."""
    own_team = team_kwargs(dict(config.env_kwargs))
    named = next(iter(own_team.values()), None)
    candidates = [
        suite.envs.get(named) if isinstance(named, str) else None,
        config.env_id if config.env_id in suite.envs.values() else None,
        suite.envs.get(_team_of(config.env_id) or ""),
        suite.envs.get("env"),
    ]
    env_id = next((c for c in candidates if c is not None), None)
    if env_id is None:
        return f"none of its teams {sorted(suite.envs)} is the run's team ({config.env_id} {own_team or ''})"
    kwargs = {**suite.kwargs, **own_team}
    agents = marft_envs.spec(env_id).agents_for(**{**kwargs, "split": split})
    missing = [a for a in agents if a not in roles]
    if missing:
        return f"{env_id} has agents {agents}, the checkpoint has roles {list(roles)} (none for {missing})"
    return env_id, kwargs


def run_leaderboard(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Evaluate every system on every selected suite; write the outputs; return the rows.

    ``args`` are the parsed options of :func:`add_arguments`.
    """
    selected = select_suites(args)
    ckpts = [_parse_ckpt(c) for c in args.checkpoint or []]
    runs = {label: read_run_config(path) for label, path in ckpts}  # fail fast on a bad path
    roles_of = {label: saved_roles(config, ckpt) for label, (config, ckpt) in runs.items()}
    ev = eval_kwargs(args)
    model = args.model or DEFAULT_MODEL
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    samples_f = (out_dir / "samples.jsonl").open("w")

    def record_game(suite: Suite, system: str, env_id: str, policy: Any, kwargs: dict[str, Any], split: str, problems: list[int]) -> None:
        def env_fn() -> Any:
            return marft_envs.make(env_id, **{**kwargs, "split": split})

        for r in game_leaderboard_rows(policy, env_fn, opponents, problems, seed=args.seed, sampling=game_sampling):
            rows.append({"suite": suite.name, "system": system, "env_id": env_id, **r})
            if r["seat"] == "all":
                print(f"[leaderboard] {suite.name:<10} {system:<22} vs {r['opponent']:<8} win {r['win_rate']:.3f} "
                      f"[{r['win_ci_low']:.3f}, {r['win_ci_high']:.3f}] draw {r['draw_rate']:.3f} loss {r['loss_rate']:.3f} "
                      f"({r['games']} games, {r['seconds']:.0f} s)", flush=True)

    opponents = list(dict.fromkeys(args.opponent or ["random"]))
    temperature = ev["temperature"]
    game_sampling: dict[str, Any] = {"max_new_tokens": args.max_new_tokens or GAME_MAX_NEW_TOKENS}
    if temperature is not None and temperature > 0:
        game_sampling.update(greedy=False, temperature=temperature)

    def record(suite: Suite, system: str, env_id: str, recs: list[SampleRecord], seconds: float, k: int) -> None:
        row = {"suite": suite.name, "system": system, "env_id": env_id, **summarize(recs, k), "seconds": seconds}
        rows.append(row)
        print(f"[leaderboard] {suite.name:<10} {system:<22} acc {row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
              f"pass@{row['k']} {row['pass_at_k']:.3f}  tokens/ep {row['tokens_per_episode']:.1f}  ({seconds:.0f} s)", flush=True)
        if row["overlong_episodes"]:  # never silent: these episodes played an empty action
            who = Counter(a for r in recs for a in overlong_agents(r))
            print(f"[leaderboard] WARNING: {suite.name} {system}: {row['overlong_episodes']} of {row['samples']} episodes "
                  f"overflowed max_context ({', '.join(f'{a} {n}' for a, n in who.items())}); raise --max-context "
                  "or shorten the prompts", flush=True)
        for r in recs:
            samples_f.write(json.dumps({"suite": suite.name, "system": system, **r.__dict__}) + "\n")

    try:
        for suite, suite_teams in selected:
            split = args.split or suite.split
            limit = args.limit or suite.limit
            if not suite_teams and not ckpts:
                print(f"[leaderboard] {suite.name}: nothing to run (no team selected, no checkpoint)")
                continue
            any_env = suite.envs[suite_teams[0]] if suite_teams else next(iter(suite.envs.values()))
            probe = marft_envs.make(any_env, **{**suite.kwargs, "split": split})
            problems = problem_indices(any_env, split, suite.kwargs, limit, args.start_index, env=probe)
            game = is_game_env(probe)
            for name in opponents if game else []:
                scripted_opponent(name, probe)  # a bad name fails before any model loads
            vote = args.majority and "solo" in suite.envs and "env" not in suite.envs and not game
            teams_played = [*suite_teams, *(["solo"] if vote and "solo" not in suite_teams else [])]
            roles = sorted({a for t in teams_played for a in marft_envs.spec(suite.envs[t]).agents_for(**{**suite.kwargs, "split": split})})
            policy = untrained_policy(roles, model, engine=getattr(args, "engine", None) or "hf") if roles else None
            budgets: dict[str, int] = {}
            for team in suite_teams:
                if team == "solo" and vote:
                    continue  # run with the vote samples below (one pass serves both)
                env_id = suite.envs[team]
                if game:
                    record_game(suite, "untrained" if team == "env" else f"untrained {team}", env_id, policy, suite.kwargs, split, problems)
                    continue
                t0 = time.perf_counter()
                recs = run_samples(policy, env_id, split=split, env_kwargs=suite.kwargs, problems=problems, k=args.k, seed=args.seed, **ev)
                record(suite, "untrained" if team == "env" else f"untrained {team}", env_id, recs, time.perf_counter() - t0, args.k)
                calls = summarize(recs)["calls_per_episode"]
                if team != "solo" and math.isfinite(calls):
                    budgets[team] = max(1, round(calls))
            if vote:
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
                match = match_checkpoint(suite, runs[label][0], roles_of[label], split)
                if isinstance(match, str):
                    print(f"[leaderboard] {suite.name}: checkpoint {label} skipped: {match}")
                    continue
                env_id, kwargs = match
                trained: TrainedPolicy = checkpoint_policy(path, engine=getattr(args, "engine", None))
                if game:
                    record_game(suite, f"trained {label}", env_id, trained.policy, kwargs, split, problems)
                    del trained
                    gc.collect()
                    continue
                t0 = time.perf_counter()
                # the run's own context limit unless --max-context says otherwise (as marft eval)
                ev_run = {**ev, "max_context": args.max_context or runs[label][0].max_context}
                recs = run_samples(trained.policy, env_id, split=split, env_kwargs=kwargs, problems=problems, k=args.k, seed=args.seed, **ev_run)
                record(suite, f"trained {label}", env_id, recs, time.perf_counter() - t0, args.k)
                del trained
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
    """Sort ``rows`` (baselines first) and write leaderboard.md / .csv / .json / .png.

    Game rows (those with an ``opponent``) form their own table: the "Games" section of
    leaderboard.md, ``leaderboard_games.csv`` and ``games`` in leaderboard.json.
    """
    suites = list(dict.fromkeys(r["suite"] for r in rows))
    rows.sort(key=lambda r: (suites.index(r["suite"]), _rank(r["system"])))  # stable: a game's seats keep their order
    games = [r for r in rows if "opponent" in r]
    rows = [r for r in rows if "opponent" not in r]
    table = markdown_table(rows, COLUMNS, _HEADERS) if rows or not games else ""
    if games:
        game_table = markdown_table(games, GAME_LEADERBOARD_COLUMNS)
        table = (table + "\n\n" if table else "") + "## Games (win/draw/loss against fixed opponents, 95% Wilson CIs)\n\n" + game_table
        write_csv(out_dir / "leaderboard_games.csv", games, GAME_LEADERBOARD_COLUMNS)
    meta = versions()
    settings = {k: v for k, v in vars(args).items() if k not in ("func",)}
    header = (
        f"# Leaderboard\n\nmodel `{args.model or DEFAULT_MODEL}`, k = {args.k} samples per problem, temperature "
        f"{sampling_temperature(args, DEFAULT_TEMPERATURE)}, seed {args.seed}; versions: "
        + ", ".join(f"{k} {v}" for k, v in meta.items())
        + "\n\n"
    )
    (out_dir / "leaderboard.md").write_text(header + table + "\n")
    write_csv(out_dir / "leaderboard.csv", rows, COLUMNS)
    write_json(out_dir / "leaderboard.json", {"rows": rows, "games": games, "versions": meta, "settings": settings})
    if rows or not games:
        plot_leaderboard(rows, out_dir / "leaderboard.png")
    print(table)
    print(f"[leaderboard] wrote {out_dir / 'leaderboard.md'}, .csv, .png, samples.jsonl" + (", leaderboard_games.csv" if games else ""))


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the leaderboard options to ``p`` (shared by ``marft leaderboard`` and the script)."""
    p.add_argument("--suite", action="append", help=f"built-in suite (repeatable): {', '.join(SUITES)}; default arith")
    p.add_argument("--env", action="append", help="any registered env id as its own suite (repeatable; 'module:Id-v0' imports module)")
    p.add_argument("--env-kwargs", action="append", metavar="ID=JSON", help="kwargs for an --env id, e.g. 'arith-duo-v0={\"digits\": 2}'")
    p.add_argument("--suite-file", action="append", help="JSON file of suites: {name: {envs: {team: id}, split, kwargs, limit}}")
    p.add_argument("--teams", default=None,
                   help="teams to run (comma list); default: solo,duo,trio of the built-in suites and every team of a --suite-file suite")
    p.add_argument("--checkpoint", action="append", metavar="[LABEL=]PATH", help="trained run dir / checkpoint (repeatable)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="regression view of two checkpoints ('untrained' allowed)")
    p.add_argument("--model", default=None,
                   help=f"base model of the untrained systems (default {DEFAULT_MODEL}; for --compare untrained: the checkpoint's own)")
    p.add_argument("--limit", type=int, default=None, help="problems per suite (default: the suite's size)")
    p.add_argument("--start-index", type=int, default=0, help="first problem index (default 0)")
    p.add_argument("--split", default=None, help="override the suites' split")
    p.add_argument("--k", type=int, default=1, help="samples per problem (avg@k, pass@k; default 1)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature of every agent (0 = greedy; <0 = the profiles' own); default {DEFAULT_TEMPERATURE}, greedy for --compare")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="new tokens per action for every agent (default: each profile's own eval limit, as marft eval uses; "
                        f"game suites: {GAME_MAX_NEW_TOKENS})")
    p.add_argument("--num-envs", type=int, default=32, help="episodes generated together (default 32)")
    p.add_argument("--max-context", type=int, default=None,
                   help=f"context limit in tokens (default: a checkpoint's own run setting, as marft eval uses; {DEFAULT_MAX_CONTEXT} for untrained systems)")
    p.add_argument("--no-majority", dest="majority", action="store_false", help="skip the majority-vote baselines")
    p.add_argument("--opponent", action="append", metavar="NAME",
                   help="game suites: a fixed opponent every system plays in each seat (repeatable): random (default), "
                        "optimal (Nim) or fixed:MOVE")
    p.add_argument("--seed", type=int, default=1234, help="seed of the samples (default 1234)")
    p.add_argument("--engine", default=None, help="generation engine: hf or vllm (docs/engines.md); default: hf, or a checkpoint's own")
    p.add_argument("--out", default="runs/leaderboard", help="output directory (default runs/leaderboard)")
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
    except Exception as e:
        if not isinstance(e, (EvaluationError, CheckpointError, marft_envs.Error, FileNotFoundError)):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
