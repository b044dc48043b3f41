"""Matrix games (one-shot or repeated, general-sum): simultaneous moves in an AEC loop.

Both players choose a move each round without seeing the other's choice of that round
(``player_1`` acts second in the AEC order but its observation never shows
``player_0``'s pending move); when both have moved, each receives ITS OWN payoff from
the payoff table. With ``rounds > 1`` (an iterated game) the previous rounds are shown.
See the package docstring (:mod:`marft_envs.games`) for the docs page.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from marft_envs.games.base import TextGameEnv, last_tagged

__all__ = ["MATRIX_GAMES", "FixedPlayer", "MatrixGameEnv", "RandomPlayer", "parse_choice"]

#: Built-in payoff tables ``{"moves": {label: description}, "payoffs": {"AB": [u0, u1]}}``
#: (``"AB"``: player_0 plays A, player_1 plays B). The first move is the default move.
MATRIX_GAMES: dict[str, dict[str, Any]] = {
    "prisoners_dilemma": {
        "moves": {"C": "cooperate", "D": "defect"},
        "payoffs": {"CC": [3, 3], "CD": [0, 5], "DC": [5, 0], "DD": [1, 1]},
        "about": "Prisoner's dilemma: defecting dominates, mutual cooperation pays both more.",
    },
    "stag_hunt": {
        "moves": {"S": "hunt the stag", "H": "hunt a hare"},
        "payoffs": {"SS": [4, 4], "SH": [0, 3], "HS": [3, 0], "HH": [3, 3]},
        "about": "Stag hunt: two equilibria, the stag (payoff-dominant) and the hare (safe).",
    },
    "coordination": {
        "moves": {"A": "choose option A", "B": "choose option B"},
        "payoffs": {"AA": [2, 2], "AB": [0, 0], "BA": [0, 0], "BB": [1, 1]},
        "about": "Coordination: both gain by choosing the same option, more with A.",
    },
    "matching_pennies": {
        "moves": {"H": "heads", "T": "tails"},
        "payoffs": {"HH": [1, -1], "HT": [-1, 1], "TH": [-1, 1], "TT": [1, -1]},
        "about": "Matching pennies (zero-sum): player_0 wins on a match, player_1 on a mismatch.",
    },
}


def parse_choice(text: str, moves: Mapping[str, str]) -> str | None:
    """The move label a reply chooses: the last ``MOVE: <label or description>``, else the
    whole reply when it is one label or description (case-insensitive); else ``None``.

    Example:
        >>> moves = MATRIX_GAMES["prisoners_dilemma"]["moves"]
        >>> parse_choice("hmm. MOVE: D", moves), parse_choice("Cooperate", moves), parse_choice("both", moves)
        ('D', 'C', None)
    """
    names = {label.lower(): label for label in moves} | {d.lower(): label for label, d in moves.items()}
    tagged = last_tagged(text, "MOVE")
    candidate = tagged if tagged is not None else text
    key = re.sub(r"\s+", " ", candidate.strip().strip(".!'\"`*").strip()).lower()
    return names.get(key)


class MatrixGameEnv(TextGameEnv):
    """A two-player matrix game, one-shot or repeated (see the module and package docstrings).

    Args:
        game: a :data:`MATRIX_GAMES` name (default ``"prisoners_dilemma"``) or a custom table
            ``{"moves": {label: description}, "payoffs": {"<l0><l1>": [u0, u1]}}`` (JSON-safe).
        rounds: rounds per episode (1: one-shot); every round pays both players.
        on_invalid: ``"default"`` (the only choice: an unparsable reply plays the table's FIRST
            move, flagged ``invalid_move``; a simultaneous game has no turn to forfeit).
        profiles, max_action_chars, render_mode, split: see :class:`~marft_envs.games.base.TextGameEnv`.
    """

    metadata = {**TextGameEnv.metadata, "name": "matrix_v0"}
    default_profiles = "matrix"

    def __init__(self, game: str | Mapping[str, Any] = "prisoners_dilemma", rounds: int = 1,
                 on_invalid: str = "default", **kwargs: Any):
        table = MATRIX_GAMES.get(game) if isinstance(game, str) else game
        if table is None:
            raise ValueError(f"unknown matrix game {game!r}; built-in games: {sorted(MATRIX_GAMES)}")
        self.moves_table: dict[str, str] = dict(table.get("moves") or {})
        labels = list(self.moves_table)
        if len(labels) < 2 or any(len(m) != 1 for m in labels):
            raise ValueError(f"a matrix game needs >= 2 one-character move labels, got {labels}")
        need = {a + b for a in labels for b in labels}
        self.payoff_table = {k: [float(x) for x in v] for k, v in dict(table.get("payoffs") or {}).items()}
        if set(self.payoff_table) != need or any(len(v) != 2 or not all(map(np.isfinite, v))
                                                 for v in self.payoff_table.values()):
            raise ValueError(f"payoffs must give two finite numbers for each of {sorted(need)}")
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
        if on_invalid != "default":
            raise ValueError("on_invalid must be 'default' for a matrix game (moves are simultaneous)")
        self.game_name = game if isinstance(game, str) else "custom"
        self.about = str(table.get("about", ""))
        self.rounds = int(rounds)
        self.on_invalid = on_invalid
        self.history: list[tuple[str, str]] = []
        self._pending: str | None = None
        super().__init__(horizon=self.rounds, **kwargs)

    def _start(self, rng: np.random.Generator, options: Mapping[str, Any]) -> None:
        self.history = []
        self._pending = None

    def _table_text(self) -> str:
        rows = []
        for a in self.moves_table:
            for b in self.moves_table:
                u0, u1 = self.payoff_table[a + b]
                rows.append(f"{a}, {b}: {u0:g}, {u1:g}")
        return "\n".join(rows)

    def rules(self, agent: str) -> str:
        """The payoff table, the number of rounds and the move syntax (short: small context windows)."""
        moves = ", ".join(f"{k} = {v}" for k, v in self.moves_table.items())
        return (
            f"You are {agent}. Both players move at once, {self.rounds} round(s). Moves: {moves}. "
            "Points per round ('player_0 move, player_1 move: player_0 points, player_1 points'):\n"
            f"{self._table_text()}\nMaximise your own points. Reply 'MOVE: <letter>' "
            f"(unreadable: {next(iter(self.moves_table))})."
        )

    def state_text(self, agent: str) -> str:
        """Past rounds and totals (never the other player's pending move)."""
        lines = [f"Round {i + 1}: {a}{b}." for i, (a, b) in enumerate(self.history)]
        if self.history:
            lines.append("Totals: " + ", ".join(f"{a} {self.payoffs.get(a, 0.0):g}" for a in self.possible_agents) + ".")
        if not self.game_over:
            lines.append(f"Round {min(len(self.history) + 1, self.rounds)} of {self.rounds}: your move.")
        return "\n".join(lines)

    def legal_moves(self, agent: str) -> list[str]:
        """``MOVE: <label>`` for every move."""
        return [f"MOVE: {m}" for m in self.moves_table]

    def _play(self, agent: str, text: str, flags: list[str]) -> dict[str, Any]:
        choice = parse_choice(text, self.moves_table)
        if choice is None:
            flags += ["invalid_move", "move_unparsed"]
            choice = next(iter(self.moves_table))
        self.moves.append((agent, choice))
        if agent == self.possible_agents[0]:
            self._pending = choice
            return {"round": len(self.history)}
        joint = (self._pending or next(iter(self.moves_table))) + choice
        self._pending = None
        self.history.append((joint[0], joint[1]))
        u0, u1 = self.payoff_table[joint]
        self._give({self.possible_agents[0]: u0, self.possible_agents[1]: u1})
        self.turn += 1
        extras = {"round": len(self.history) - 1, "joint_move": joint, "round_payoffs": [u0, u1]}
        if len(self.history) >= self.rounds:
            self._end_game(f"{self.rounds} round(s) played")
        else:  # both see the round's result in their infos
            other = self.possible_agents[0]
            self.infos[other] = {"turn": self.turn, "flags": [], **extras}
        return extras


class FixedPlayer:
    """Scripted player that always plays ``move`` (e.g. ``FixedPlayer("D")``: always defect)."""

    def __init__(self, move: str):
        self.move = move

    def __call__(self, env: Any, agent: str) -> str:
        """``MOVE: <move>``."""
        return f"MOVE: {self.move}"


class RandomPlayer:
    """Scripted player that picks a legal move uniformly at random (seeded, its own generator)."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def __call__(self, env: Any, agent: str) -> str:
        """A random entry of ``env.legal_moves(agent)``."""
        moves = env.legal_moves(agent)
        return moves[int(self.rng.integers(len(moves)))]
