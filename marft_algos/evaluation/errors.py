"""Errors of the evaluation package: bad input that the CLI reports in one line (exit 2)."""

from __future__ import annotations

__all__ = ["EvaluationError", "LeaderboardError"]


class EvaluationError(ValueError):
    """Bad evaluation input (no problems to play, a checkpoint whose roles do not fit the env):
    the CLI prints the message in one line and exits with status 2."""


class LeaderboardError(EvaluationError):
    """Bad leaderboard input (unknown suite, malformed ``--env-kwargs``): one-line error, exit 2."""
