"""Evaluation: held-out accuracy, the leaderboard and the regression view.

Modules (at import time they load what ``import marft_algos`` loads anyway: torch,
marft_envs, the collector; transformers and matplotlib load on first use):

==============  =====================================================================
``report``      the Wilson interval, table cells, Markdown / CSV / JSON, versions
``policies``    the untrained team and the checkpoint loader (one of each), env matching
``evaluate``    :func:`evaluate` a policy on problems 0..n-1, :func:`evaluate_checkpoint`
``samples``     k seeded episodes per problem as :class:`SampleRecord` rows, summaries
``majority``    the majority-vote baseline at a team's sample budget
``suites``      benchmark suites as data (built-in, ``--suite-file``, :func:`register_suite`)
``leaderboard`` the leaderboard run and its CLI (``marft leaderboard``)
``compare``     the regression view (``marft leaderboard --compare A B``)
``plots``       the leaderboard plot
``games``       win/draw/loss against a fixed opponent in every seat (:func:`evaluate_vs_opponent`), game rows of the leaderboard
==============  =====================================================================
"""

from __future__ import annotations

from marft_algos.evaluation.compare import (
    COMPARE_COLUMNS,
    UNTRAINED,
    agent_stats,
    replay_frozen,
    run_compare,
)
from marft_algos.evaluation.errors import EvaluationError, LeaderboardError
from marft_algos.evaluation.evaluate import EvalResult, evaluate, evaluate_checkpoint, format_table
from marft_algos.evaluation.games import (
    GAME_COLUMNS,
    GAME_LEADERBOARD_COLUMNS,
    OPPONENTS,
    evaluate_vs_opponent,
    game_leaderboard_rows,
    is_game_env,
    outcome_rates,
    play_vs_opponent,
    scripted_opponent,
)
from marft_algos.evaluation.leaderboard import (
    COLUMNS,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    add_arguments,
    build_parser,
    eval_kwargs,
    main,
    match_checkpoint,
    parse_env_kwargs,
    problem_indices,
    run,
    run_leaderboard,
    select_suites,
    write_outputs,
)
from marft_algos.evaluation.majority import majority_vote, norm_answer
from marft_algos.evaluation.plots import plot_leaderboard
from marft_algos.evaluation.policies import (
    TEAM_KWARGS,
    TrainedPolicy,
    check_roles,
    checkpoint_env,
    checkpoint_policy,
    read_run_config,
    saved_roles,
    team_kwargs,
    untrained_policy,
)
from marft_algos.evaluation.report import (
    bootstrap_mean,
    fmt,
    markdown_table,
    versions,
    wilson,
    wilson_interval,
    write_csv,
    write_json,
)
from marft_algos.evaluation.samples import (
    SampleRecord,
    agent_tool_stats,
    episode_score,
    episode_tool_calls,
    play,
    run_samples,
    sampling_overrides,
    summarize,
    to_record,
)
from marft_algos.evaluation.suites import (
    BUILTIN_TEAMS,
    SUITES,
    Suite,
    load_suite_file,
    register_suite,
)

__all__ = [
    "BUILTIN_TEAMS",
    "COLUMNS",
    "COMPARE_COLUMNS",
    "DEFAULT_MODEL",
    "DEFAULT_TEMPERATURE",
    "EvalResult",
    "EvaluationError",
    "GAME_COLUMNS",
    "GAME_LEADERBOARD_COLUMNS",
    "LeaderboardError",
    "OPPONENTS",
    "SUITES",
    "SampleRecord",
    "Suite",
    "TEAM_KWARGS",
    "TrainedPolicy",
    "UNTRAINED",
    "add_arguments",
    "agent_stats",
    "agent_tool_stats",
    "bootstrap_mean",
    "build_parser",
    "check_roles",
    "checkpoint_env",
    "checkpoint_policy",
    "evaluate",
    "eval_kwargs",
    "evaluate_checkpoint",
    "evaluate_vs_opponent",
    "fmt",
    "format_table",
    "game_leaderboard_rows",
    "is_game_env",
    "load_suite_file",
    "main",
    "majority_vote",
    "markdown_table",
    "match_checkpoint",
    "norm_answer",
    "outcome_rates",
    "parse_env_kwargs",
    "play",
    "play_vs_opponent",
    "plot_leaderboard",
    "problem_indices",
    "read_run_config",
    "scripted_opponent",
    "register_suite",
    "replay_frozen",
    "run",
    "run_compare",
    "run_leaderboard",
    "run_samples",
    "episode_score",
    "episode_tool_calls",
    "saved_roles",
    "sampling_overrides",
    "select_suites",
    "summarize",
    "team_kwargs",
    "to_record",
    "untrained_policy",
    "versions",
    "wilson",
    "wilson_interval",
    "write_csv",
    "write_json",
    "write_outputs",
]
