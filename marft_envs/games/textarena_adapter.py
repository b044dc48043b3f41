"""An adapter for TextArena's offline two-player games (optional: ``pip install marft[textarena]``).

TextArena (MIT) is NOT a dependency of marft: this module imports it only when a
``game-<name>-v0`` id backed by it is made, and those ids are registered only when the
package is installed. Only games checked to run offline and with two players are offered
(:data:`TEXTARENA_GAMES`); TextArena's word games download NLTK data at import time.

Two things the adapter does that TextArena itself does not:

* **Private randomness.** TextArena's ``State`` calls ``random.seed(seed)`` on the
  process-wide generator and its games draw from it. Every call into TextArena runs under
  a lock with the global ``random`` state swapped for this env's own (restored after), so
  env copies stepped in parallel neither disturb each other nor the caller, and an episode
  is reproducible from ``reset(seed=...)`` (the state travels with pickles and copies).
* **Side-effect-free observations.** TextArena hands each message to a player once; the
  adapter keeps each player's whole message log, so ``observe(agent)`` can be called for
  any agent at any time (the PettingZoo contract).

Rewards are TextArena's (+1 / -1 for a win / loss, 0 each for a draw; an invalid move is
retried once, then loses), handed out with PettingZoo's bookkeeping by
:class:`~marft_envs.games.base.TextGameEnv`; outcomes are in ``infos`` at the end as for
every marft game. A game that reaches the adapter's ply limit (``horizon``) is truncated
as a draw.
"""

from __future__ import annotations

import importlib
import importlib.util
import random
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from marft_envs.games.base import TextGameEnv

__all__ = ["TEXTARENA_GAMES", "TextArenaGameEnv", "textarena_available"]

#: marft id -> (TextArena raw env id, ply limit): offline two-player games.
TEXTARENA_GAMES: dict[str, tuple[str, int]] = {
    "game-tictactoe-v0": ("TicTacToe-v0-raw", 20),
    "game-connectfour-v0": ("ConnectFour-v0-raw", 90),
    "game-kuhnpoker-v0": ("KuhnPoker-v0-raw", 60),
}

_LOCK = threading.RLock()


def textarena_available() -> bool:
    """Whether the optional ``textarena`` package is installed (nothing is imported)."""
    return importlib.util.find_spec("textarena") is not None


def _import_textarena() -> Any:
    """``import textarena``, leaving the global ``random`` state as it was (its first import draws from it)."""
    with _LOCK:
        outer = random.getstate()
        try:
            return importlib.import_module("textarena")
        finally:
            random.setstate(outer)


class TextArenaGameEnv(TextGameEnv):
    """A TextArena two-player game behind marft's AEC interface (see the module docstring).

    Args:
        game: a key of :data:`TEXTARENA_GAMES` (``"game-tictactoe-v0"``) or its TextArena id.
        profiles, max_action_chars, render_mode, split: see :class:`~marft_envs.games.base.TextGameEnv`
            (default profiles: ``nim``'s generic game prompts).
    """

    metadata = {**TextGameEnv.metadata, "name": "textarena_v0"}
    default_profiles = "nim"

    def __init__(self, game: str = "game-tictactoe-v0", **kwargs: Any):
        by_ta = {ta_id: key for key, (ta_id, _) in TEXTARENA_GAMES.items()}
        key = game if game in TEXTARENA_GAMES else by_ta.get(game)
        if key is None:
            raise ValueError(f"unknown TextArena game {game!r}; offline two-player games: {sorted(TEXTARENA_GAMES)}")
        if not textarena_available():
            raise ImportError(f"{key} needs the optional package 'textarena': pip install 'marft[textarena]'")
        self.game_id = key
        self.ta_id, horizon = TEXTARENA_GAMES[key]
        self._ta: Any = None
        self._rand_state: Any = None
        self._logs: dict[str, list[str]] = {}
        super().__init__(horizon=horizon, **kwargs)

    # ------------------------------------------------------------- TextArena calls
    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` with this env's private state in the global ``random`` module."""
        with _LOCK:
            outer = random.getstate()
            try:
                if self._rand_state is not None:
                    random.setstate(self._rand_state)
                return fn(*args, **kwargs)
            finally:
                self._rand_state = random.getstate()
                random.setstate(outer)

    def _drain(self) -> None:
        """Move TextArena's pending messages into the players' logs."""
        observations = self._ta.state.observations
        for pid, agent in enumerate(self.possible_agents):
            for from_id, message, _kind in observations.get(pid, []):
                who = "Game" if from_id < 0 else f"Player {from_id}"
                self._logs[agent].append(f"[{who}] {message}".rstrip())
            observations[pid] = []

    # ----------------------------------------------------------------- game hooks
    def _start(self, rng: np.random.Generator, options: Mapping[str, Any]) -> None:
        ta = _import_textarena()
        seed = int(rng.integers(2**31 - 1))
        self._rand_state = None
        self._ta = self._call(ta.make, self.ta_id)
        self._call(self._ta.reset, num_players=2, seed=seed)
        self._logs = {a: [] for a in self.possible_agents}
        self._drain()
        self._first = self.possible_agents[int(self._ta.state.current_player_id)]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a game (TextArena decides who moves first)."""
        super().reset(seed=seed, options=options)
        self.agent_selection = self._first

    def rules(self, agent: str) -> str:
        """TextArena's own prompt for this player (the first messages of its log)."""
        return ""

    def state_text(self, agent: str) -> str:
        """Everything TextArena told this player so far."""
        return "\n\n".join(self._logs.get(agent, []))

    def legal_moves(self, agent: str) -> list[str]:
        """Not known in general: TextArena games list their moves in the observation."""
        return ["[0]"]

    def _view(self, agent: str) -> tuple[str, str]:
        self._require_reset("observe()")
        return self.team.profiles[agent].prompt, self.state_text(agent)

    def _next_agent(self, agent: str) -> str:
        return self.possible_agents[int(self._ta.state.current_player_id)]

    def _play(self, agent: str, text: str, flags: list[str]) -> dict[str, Any]:
        state = self._ta.state
        errors_before = getattr(state, "error_count", 0)
        done, _ = self._call(self._ta.step, action=text)
        self._drain()
        self.moves.append((agent, text[:200]))
        self.turn += 1
        invalid = bool(getattr(state, "made_invalid_move", False)) or getattr(state, "error_count", 0) > errors_before
        if invalid or state.game_info.get(self.possible_agents.index(agent), {}).get("invalid_move"):
            flags.append("invalid_move")
        if done:
            rewards = state.rewards or {0: 0, 1: 0}
            self._give({a: float(rewards.get(i, 0)) for i, a in enumerate(self.possible_agents)})
            reason = str(state.game_info.get(0, {}).get("reason", "game over"))
            lost_by_invalid = [a for i, a in enumerate(self.possible_agents) if state.game_info.get(i, {}).get("invalid_move")]
            self._end_game(reason, forfeit=lost_by_invalid[0] if lost_by_invalid else None)
        elif self.turn >= self.horizon:
            self._end_game(f"ply limit {self.horizon} reached", truncated=True)
        return {}
