"""Nim (the subtraction game "race to the last stone"): a zero-sum game with a known optimal play.

One pile of ``n`` stones; the players take turns removing 1 to ``max_take`` stones; whoever
takes the LAST stone wins (normal play). A position is lost for the player to move iff
``n % (max_take + 1) == 0``; from any other position the optimal move takes
``n % (max_take + 1)`` stones, leaving the opponent a multiple of ``max_take + 1``
(:func:`optimal_take`). See the package docstring (:mod:`marft_envs.games`) for the docs page.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from marft_envs.games.base import TextGameEnv, last_tagged

__all__ = ["NimEnv", "OptimalNimPlayer", "optimal_take", "parse_take"]

_ON_INVALID = ("forfeit", "default")
# With ask_move: the mover's state ends with a question, which small models answer with a plain move.
_ASK_MOVE = "Your turn. How many stones do you take (1 to {n})? Reply 'MOVE: <number>'."
# "I take 2", "You'll take 1 stone", "Take 3": a first-person (or imperative) move at the reply's start.
_PLAIN_MOVE = re.compile(r"\s*(?:(?:I|You)(?:'ll| will)?\s+)?(?:take|remove)\s+(\d{1,6})\b(?!\s*(?:to|-|or)\s*\d)", re.I)


def optimal_take(pile: int, max_take: int) -> int | None:
    """The winning number of stones to take, or ``None`` when every move loses (``pile % (max_take+1) == 0``).

    Example:
        >>> optimal_take(10, 3), optimal_take(8, 3), optimal_take(2, 3)
        (2, None, 2)
    """
    r = pile % (max_take + 1)
    return r if r else None


def parse_take(text: str) -> int | None:
    """The number of stones a reply takes: the last ``MOVE: <n>``, else the last ``\\boxed{n}``,
    else the whole reply when it is one integer, else a reply that OPENS with a plain move
    ("I take 2", "You take 1 stone.", "Take 3"); ``None`` when there is none.

    Only the opening counts for plain moves: small models echo the rules ("Players take
    turns removing 1 to 3 stones"), and an echo must stay unreadable, not become a move.

    Example:
        >>> parse_take("I take 3? No. MOVE: 2"), parse_take("\\\\boxed{1}"), parse_take(" 3 "), parse_take("two")
        (2, 1, 3, None)
        >>> parse_take("You take 1 stone."), parse_take("Players take turns removing 1 to 3 stones")
        (1, None)
    """
    tagged = last_tagged(text, "MOVE", r"-?\d{1,6}")
    if tagged is not None:
        return int(tagged)
    boxed = re.findall(r"\\boxed\{\s*(-?\d{1,6})\s*\}", text)
    if boxed:
        return int(boxed[-1])
    whole = re.fullmatch(r"\s*(-?\d{1,6})\s*\.?\s*", text)
    if whole:
        return int(whole.group(1))
    plain = _PLAIN_MOVE.match(text)
    return int(plain.group(1)) if plain else None


class NimEnv(TextGameEnv):
    """Nim with one pile (see the module and package docstrings).

    Args:
        piles: ``[low, high]``: start piles are drawn uniformly from this range (per start
            position, seeded); ``reset(options={"pile": n})`` sets one explicitly.
        max_take: the most stones one move may take (``k``); at least 1.
        on_invalid: ``"forfeit"`` (default: an unparsable or illegal move loses the game,
            flagged ``invalid_move``) or ``"default"`` (take 1 stone instead, flagged).
        ask_move: after "Your turn." also ask "How many stones do you take (1 to k)? Reply
            'MOVE: <number>'." (default False). SmolLM2-135M echoes the rules when only told it
            is its turn, but mostly answers the question with a plain move ("You take 1 stone.").
        profiles, max_action_chars, render_mode, split: see :class:`~marft_envs.games.base.TextGameEnv`.
    """

    metadata = {**TextGameEnv.metadata, "name": "nim_v0"}
    default_profiles = "nim"

    def __init__(self, piles: list[int] | tuple[int, int] = (7, 20), max_take: int = 3,
                 on_invalid: str = "forfeit", ask_move: bool = False, **kwargs: Any):
        if (not isinstance(piles, (list, tuple)) or len(piles) != 2
                or not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in piles)
                or not 1 <= piles[0] <= piles[1]):
            raise ValueError(f"piles must be [low, high] with 1 <= low <= high, got {piles!r}")
        if isinstance(max_take, bool) or not isinstance(max_take, (int, np.integer)) or max_take < 1:
            raise ValueError(f"max_take must be an integer >= 1, got {max_take!r}")
        if on_invalid not in _ON_INVALID:
            raise ValueError(f"on_invalid must be one of {_ON_INVALID}, got {on_invalid!r}")
        self.piles = (int(piles[0]), int(piles[1]))
        self.max_take = int(max_take)
        self.on_invalid = on_invalid
        self.ask_move = bool(ask_move)
        self.pile = 0
        self.start_pile = 0
        super().__init__(horizon=self.piles[1], **kwargs)

    # ------------------------------------------------------------------ game
    def _start(self, rng: np.random.Generator, options: Mapping[str, Any]) -> None:
        pile = options.get("pile")
        if pile is None:
            pile = int(rng.integers(self.piles[0], self.piles[1] + 1))
        elif isinstance(pile, bool) or not isinstance(pile, (int, np.integer)) or not 1 <= pile <= self.piles[1]:
            raise ValueError(f"pile must be an int in [1, {self.piles[1]}], got {pile!r}")
        self.pile = self.start_pile = int(pile)

    def rules(self, agent: str) -> str:
        """The rules and the move syntax (short: small models have small context windows)."""
        invalid = "loses the game" if self.on_invalid == "forfeit" else "takes 1 stone"
        return (
            f"Nim. You are {agent}. Players take turns removing 1 to {self.max_take} stones from "
            "one pile. Whoever takes the LAST stone wins. Reply 'MOVE: <number>'. An unreadable "
            f"or illegal move {invalid}."
        )

    def state_text(self, agent: str) -> str:
        """The pile, the moves so far and whose turn it is."""
        lines = [f"Start: {self.start_pile} stones."]
        if self.moves:  # the pile is the whole state: the last move is shown, not the history
            a, m = self.moves[-1]
            lines.append(f"Last move: {a} took {m}.")
        lines.append(f"Stones left: {self.pile}.")
        if not self.game_over and self.agents:
            mine = _ASK_MOVE.format(n=min(self.max_take, self.pile)) if self.ask_move else "Your turn."
            lines.append(mine if self.agent_selection == agent else f"{self.agent_selection}'s turn.")
        return "\n".join(lines)

    def legal_moves(self, agent: str) -> list[str]:
        """``MOVE: n`` for every legal ``n``."""
        return [f"MOVE: {n}" for n in range(1, min(self.max_take, self.pile) + 1)]

    def _opponent(self, agent: str) -> str:
        return next(a for a in self.possible_agents if a != agent)

    def _play(self, agent: str, text: str, flags: list[str]) -> dict[str, Any]:
        take = parse_take(text)
        legal = take is not None and 1 <= take <= min(self.max_take, self.pile)
        if not legal:
            flags += ["invalid_move", "move_unparsed" if take is None else "illegal_move"]
            if self.on_invalid == "forfeit":
                self.moves.append((agent, "forfeit"))
                self.turn += 1
                self._give({agent: -1.0, self._opponent(agent): 1.0})
                self._end_game(f"{agent} forfeited with an invalid move", forfeit=agent)
                return {"move": None, "parsed": take}
            take = 1
        self.pile -= take
        self.moves.append((agent, str(take)))
        self.turn += 1
        if self.pile == 0:
            self._give({agent: 1.0, self._opponent(agent): -1.0})
            self._end_game(f"{agent} took the last stone")
        return {"move": take, "parsed": take if legal else None, "stones_left": self.pile}


class OptimalNimPlayer:
    """Scripted optimal Nim player: leaves a multiple of ``max_take + 1`` when it can, else takes 1.

    Call it as ``player(env, agent) -> "MOVE: n"`` (see :func:`~marft_envs.games.base.play_episode`).
    """

    def __call__(self, env: NimEnv, agent: str) -> str:
        """The optimal move in ``env``'s current position."""
        take = optimal_take(env.pile, env.max_take) or 1
        return f"MOVE: {take}"
