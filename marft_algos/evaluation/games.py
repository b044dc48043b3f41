"""Win/draw/loss of a trained (or untrained) policy against a fixed opponent, in both seats.

A game's first mover may have the advantage (Nim), so the policy plays ``n`` games in
EACH seat against the same opponent (a scripted player such as
:class:`~marft_envs.games.OptimalNimPlayer`, :class:`~marft_envs.games.RandomPlayer`, or
any ``player(env, agent) -> text``), on the same start positions (problem indices
``start_index..start_index+n-1`` of the env's split). The games of one seat run in
lockstep: every move the policy has to make across them is ONE ``policy.generate`` call.
Rates come with 95% Wilson intervals (:func:`~marft_algos.evaluation.report.wilson_interval`).

The leaderboard (``marft leaderboard --env game-nim-v0 --opponent random --opponent
optimal``) plays game suites this way: :func:`scripted_opponent` names the fixed
opponents, :func:`game_leaderboard_rows` gives one row per opponent and seat (and
``"all"``) with :data:`GAME_LEADERBOARD_COLUMNS`.

Example::

    from marft_envs.games import NimEnv, RandomPlayer
    report = evaluate_vs_opponent(policy, lambda: NimEnv(split="test"), RandomPlayer(0), n=50)
    report["overall"]["win_rate"], report["overall"]["win_ci"]
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from marft_algos.evaluation.errors import EvaluationError
from marft_algos.evaluation.report import wilson_interval
from marft_algos.protocols import RolloutPolicy, TextEnv
from marft_algos.rollout import make_sampling
from marft_envs.games import FixedPlayer, NimEnv, OptimalNimPlayer, RandomPlayer, TextGameEnv

__all__ = [
    "GAME_COLUMNS",
    "GAME_LEADERBOARD_COLUMNS",
    "OPPONENTS",
    "evaluate_vs_opponent",
    "game_leaderboard_rows",
    "is_game_env",
    "outcome_rates",
    "play_vs_opponent",
    "scripted_opponent",
]

#: The columns of a game row (leaderboard style: rates with their 95% interval ends).
GAME_COLUMNS = ("seat", "n", "win", "draw", "loss", "win_rate", "win_lo", "win_hi", "draw_rate", "loss_rate", "invalid_moves")
#: The columns of a leaderboard game row (every rate with its 95% Wilson interval).
GAME_LEADERBOARD_COLUMNS = (
    "suite", "system", "env_id", "opponent", "seat", "games",
    "win_rate", "win_ci_low", "win_ci_high", "draw_rate", "draw_ci_low", "draw_ci_high",
    "loss_rate", "loss_ci_low", "loss_ci_high", "invalid_moves", "seconds",
)
#: The fixed opponents :func:`scripted_opponent` knows (``fixed:MOVE`` takes any move text).
OPPONENTS = ("random", "optimal", "fixed:MOVE")


def outcome_rates(counts: Mapping[str, int]) -> dict[str, Any]:
    """``{"n", "win", "draw", "loss", "win_rate", "win_ci", "draw_rate", "draw_ci", "loss_rate", "loss_ci"}``.

    Example:
        >>> r = outcome_rates({"win": 3, "draw": 0, "loss": 1})
        >>> r["n"], r["win_rate"], [round(x, 3) for x in r["win_ci"]]
        (4, 0.75, [0.301, 0.954])
    """
    n = int(sum(counts.get(k, 0) for k in ("win", "draw", "loss")))
    out: dict[str, Any] = {"n": n}
    for k in ("win", "draw", "loss"):
        c = int(counts.get(k, 0))
        out[k] = c
        out[f"{k}_rate"] = c / n if n else float("nan")
        out[f"{k}_ci"] = wilson_interval(c, n)
    return out


def _sampling(policy_sampling: Mapping[str, Any] | None) -> Any:
    settings = {"max_new_tokens": 32, "greedy": True}
    settings.update(policy_sampling or {})
    return make_sampling(settings)


def play_vs_opponent(
    env_fn: Callable[[], TextEnv],
    policy: RolloutPolicy,
    seat: str,
    opponent: Callable[[TextEnv, str], Any],
    n: int,
    *,
    start_index: int = 0,
    seed: int = 0,
    sampling: Mapping[str, Any] | None = None,
    role: str | None = None,
    max_parallel: int = 64,
) -> list[dict[str, Any]]:
    """Play ``n`` games, the policy in ``seat`` (as policy role ``role``, default the seat).

    Game k is reset with ``seed + k`` and ``options={"problem_index": start_index + k}``.
    Returns the policy seat's final info of every game (``outcome``, ``payoff``, ...,
    plus ``invalid_moves``: how many of the policy's moves the env flagged invalid).
    """
    # deferred: the models package loads transformers
    from marft_algos.models import GenRequest

    role = role or seat
    params = _sampling(sampling)
    finals: list[dict[str, Any]] = []
    for start in range(0, n, max_parallel):
        envs = [env_fn() for _ in range(min(max_parallel, n - start))]
        invalid = [0] * len(envs)
        done: list[dict[str, Any] | None] = [None] * len(envs)
        for j, env in enumerate(envs):
            if seat not in env.possible_agents:
                raise ValueError(f"seat {seat!r} is not an agent of the env {env.possible_agents}")
            k = start + j
            env.reset(seed=seed + k, options={"problem_index": start_index + k})
        while True:
            pending: list[int] = []
            for j, env in enumerate(envs):
                while env.agents:  # opponents' moves and dead steps until the policy must move
                    agent = env.agent_selection
                    if env.terminations[agent] or env.truncations[agent]:
                        if agent == seat:
                            done[j] = copy.deepcopy(env.infos[agent])
                        env.step(None)
                    elif agent != seat:
                        env.step(opponent(env, agent))
                    else:
                        pending.append(j)
                        break
            if not pending:
                break
            requests = [GenRequest(role=role, prompt_ids=list(policy.encode(role, envs[j].messages(seat))), sampling=params)
                        for j in pending]
            for j, result in zip(pending, policy.generate(requests), strict=True):
                envs[j].step(result.text)
                if "invalid_move" in (envs[j].infos.get(seat, {}) or {}).get("flags", []):
                    invalid[j] += 1
        for j, info in enumerate(done):
            if info is None:  # cannot happen in a game that ends in termination/truncation
                raise RuntimeError(f"game {start + j} ended without a final info for {seat!r}")
            finals.append({**info, "invalid_moves": invalid[j]})
    return finals


def evaluate_vs_opponent(
    policy: RolloutPolicy,
    env_fn: Callable[[], TextEnv],
    opponent: Callable[[TextEnv, str], Any],
    n: int,
    *,
    seats: Sequence[str] | None = None,
    start_index: int = 0,
    seed: int = 0,
    sampling: Mapping[str, Any] | None = None,
    roles: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The policy against ``opponent``: ``n`` games in each seat (default: every seat).

    ``roles`` maps a seat to the policy role that plays it (default: the seat's own name;
    e.g. ``{"player_1": "player_0"}`` lets a learner trained as ``player_0`` play second).
    ``sampling`` overrides the decoding settings (default: greedy, 32 new tokens).

    Returns ``{"seats": {seat: rates}, "overall": rates, "rows": [...]}`` where rates are
    :func:`outcome_rates` plus ``invalid_moves`` (the mean per game), and ``rows`` are
    flat dicts with :data:`GAME_COLUMNS` (one per seat, then ``"all"``). ``policy`` is a
    ``TeamPolicy`` (or any object with its ``encode`` / ``generate``).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seats = list(seats) if seats is not None else list(env_fn().possible_agents)
    per_seat: dict[str, Any] = {}
    total = {"win": 0, "draw": 0, "loss": 0}
    invalid_total = 0
    for seat in seats:
        finals = play_vs_opponent(env_fn, policy, seat, opponent, n, start_index=start_index, seed=seed,
                                  sampling=sampling, role=(roles or {}).get(seat, seat))
        counts = {k: sum(f["outcome"] == k for f in finals) for k in ("win", "draw", "loss")}
        inv = sum(f["invalid_moves"] for f in finals)
        per_seat[seat] = {**outcome_rates(counts), "invalid_moves": inv / len(finals)}
        invalid_total += inv
        for k in total:
            total[k] += counts[k]
    overall = {**outcome_rates(total), "invalid_moves": invalid_total / (n * len(seats))}
    rows = []
    for seat, r in [*per_seat.items(), ("all", overall)]:
        rows.append({"seat": seat, "n": r["n"], "win": r["win"], "draw": r["draw"], "loss": r["loss"],
                     "win_rate": r["win_rate"], "win_lo": r["win_ci"][0], "win_hi": r["win_ci"][1],
                     "draw_rate": r["draw_rate"], "loss_rate": r["loss_rate"], "invalid_moves": r["invalid_moves"]})
    return {"seats": per_seat, "overall": overall, "rows": rows}


def is_game_env(env: Any) -> bool:
    """Is ``env`` (or the env it wraps) a two-player text game (:class:`~marft_envs.games.TextGameEnv`)?"""
    return isinstance(getattr(env, "unwrapped", env), TextGameEnv)


def scripted_opponent(name: str, env: Any, seed: int = 0) -> Callable[[Any, str], Any]:
    """The fixed opponent called ``name`` for the game ``env``.

    ``"random"``: a uniformly random legal move (its own generator, seeded with ``seed``:
    two systems evaluated with the same seed meet the same player); ``"optimal"``: Nim's
    optimal player (the other games have none); ``"fixed:MOVE"``: always ``MOVE: MOVE``.
    An unknown name, or ``"optimal"`` for a game without one, is an :class:`EvaluationError`.

    Example:
        >>> from marft_envs.games import NimEnv
        >>> type(scripted_opponent("optimal", NimEnv())).__name__
        'OptimalNimPlayer'
    """
    game = getattr(env, "unwrapped", env)
    if name == "random":
        return RandomPlayer(seed)
    if name == "optimal":
        if not isinstance(game, NimEnv):
            raise EvaluationError(f"no optimal player for {type(game).__name__}: use --opponent random or fixed:MOVE")
        return OptimalNimPlayer()
    if name.startswith("fixed:") and name[len("fixed:"):].strip():
        return FixedPlayer(name[len("fixed:"):].strip())
    raise EvaluationError(f"unknown opponent {name!r}; known: {', '.join(OPPONENTS)}")


def game_leaderboard_rows(
    policy: RolloutPolicy,
    env_fn: Callable[[], TextEnv],
    opponents: Sequence[str],
    problems: Sequence[int],
    *,
    seed: int = 0,
    sampling: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Leaderboard rows of ``policy`` against each named opponent, in every seat.

    The start positions are ``problems`` (consecutive indices of the env's split); game
    ``k`` of a seat is reset with ``seed + k``. One row per opponent and seat, then the
    seat ``"all"`` (both seats pooled), with the :data:`GAME_LEADERBOARD_COLUMNS` from
    ``opponent`` on (``seconds`` is the time of that opponent's games, on the ``"all"`` row).
    """
    problems = list(problems)
    if not problems:
        raise EvaluationError("no start positions to play (limit 0, or a start index past the split's end)")
    if problems != list(range(problems[0], problems[0] + len(problems))):
        raise EvaluationError(f"game start positions must be consecutive indices, got {problems[:5]}...")
    probe = env_fn()
    rows: list[dict[str, Any]] = []
    for name in opponents:
        opponent = scripted_opponent(name, probe, seed)
        if sampling is not None and not sampling.get("greedy", True):
            torch.manual_seed(seed)  # sampled replies: every system meets the same draws
        t0 = time.perf_counter()
        report = evaluate_vs_opponent(policy, env_fn, opponent, len(problems), start_index=problems[0], seed=seed, sampling=sampling)
        seconds = time.perf_counter() - t0
        for seat, r in [*report["seats"].items(), ("all", report["overall"])]:
            row: dict[str, Any] = {"opponent": name, "seat": seat, "games": r["n"]}
            for k in ("win", "draw", "loss"):
                row[f"{k}_rate"] = r[f"{k}_rate"]
                row[f"{k}_ci_low"], row[f"{k}_ci_high"] = r[f"{k}_ci"]
            row["invalid_moves"] = r["invalid_moves"]
            row["seconds"] = seconds if seat == "all" else ""
            rows.append(row)
    return rows
