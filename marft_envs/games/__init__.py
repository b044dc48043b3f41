"""Two-player text games with per-agent rewards: zero-sum Nim and general-sum matrix games.

Every game is a PettingZoo ``AECEnv`` (:class:`~marft_envs.games.base.TextGameEnv`) whose
agents ``player_0`` and ``player_1`` have their OWN rewards, unlike the team envs (one
shared team reward). Observations state the rules and the state in words; an action is
free text parsed for a move (``MOVE: <move>``).

==================  ===========================  ==================================  =============
id                  game                         rewards                             episode
==================  ===========================  ==================================  =============
game-nim-v0         Nim, one pile, take 1..k     zero-sum: last stone +1, other -1   a few to ~20 moves
game-matrix-v0      prisoner's dilemma (or any   general-sum: each player its own    ``rounds`` x 2 moves
                    2x2.. table), one-shot or    table entry, every round
                    repeated
==================  ===========================  ==================================  =============

With the optional extra ``textarena`` (``pip install 'marft[textarena]'``) three of
TextArena's offline two-player games are registered too: ``game-tictactoe-v0``,
``game-connectfour-v0``, ``game-kuhnpoker-v0`` (:mod:`marft_envs.games.textarena_adapter`).

Nim
---

| Property      | Value |
|---------------|-------|
| API           | PettingZoo ``AECEnv`` (:class:`~marft_envs.games.nim.NimEnv`) |
| Agents        | ``player_0`` (moves first), ``player_1`` |
| Action space  | ``UnicodeText(max_action_chars)``: ``MOVE: <n>`` (also ``\\boxed{n}`` or a bare integer) |
| Observation   | ``Dict(prompt=UnicodeText, turn=Discrete(horizon + 1))``; ``turn`` = moves made so far |
| Rewards       | zero-sum, at the end: the player who takes the last stone +1, the other -1 |
| Episode       | ends (termination) when the pile is empty or a player forfeits; at most ``piles[1]`` moves |
| Optimal play  | from ``n`` stones take ``n % (k+1)``; ``n % (k+1) == 0`` is lost for the mover |

A pile of ``n`` stones, ``n`` drawn per start position from ``piles`` (default ``[7, 20]``);
players alternately take 1..``max_take`` (default 3) stones. Malformed or illegal moves:
``on_invalid="forfeit"`` (default: the mover loses, -1/+1, ``info["forfeit"]`` names it,
flags ``invalid_move`` + ``move_unparsed`` / ``illegal_move``) or ``"default"`` (take 1
stone, flagged). Scripted players: :class:`~marft_envs.games.nim.OptimalNimPlayer` (never
loses from a winning position) and :class:`~marft_envs.games.matrix.RandomPlayer`.

Matrix games
------------

| Property      | Value |
|---------------|-------|
| API           | PettingZoo ``AECEnv`` (:class:`~marft_envs.games.matrix.MatrixGameEnv`) |
| Agents        | ``player_0``, ``player_1`` (simultaneous: ``player_1`` never sees ``player_0``'s move of the same round) |
| Action space  | ``UnicodeText(max_action_chars)``: ``MOVE: <letter>`` (or the letter / the move's name alone) |
| Observation   | ``Dict(prompt=UnicodeText, turn=Discrete(rounds + 1))``; ``turn`` = rounds completed |
| Rewards       | general-sum: after each round each player gets its own payoff from the table |
| Episode       | ``rounds`` rounds (default 1: one-shot), then termination |

Games (``game=``): ``prisoners_dilemma`` (default; C/D: 3/3, 0/5, 5/0, 1/1), ``stag_hunt``,
``coordination``, ``matching_pennies`` (zero-sum), or a custom JSON-safe table
``{"moves": {"A": "...", "B": "..."}, "payoffs": {"AA": [u0, u1], "AB": [...], ...}}``.
An unparsable reply plays the table's first move (flagged ``invalid_move``): moves are
simultaneous, so there is no turn to forfeit. Scripted players:
:class:`~marft_envs.games.matrix.FixedPlayer` (``"D"``: always defect) and
:class:`~marft_envs.games.matrix.RandomPlayer`.

Common to every game
--------------------

**Rewards (exact PettingZoo semantics).** ``rewards[a]`` is what ``a`` got from the last
step; ``last()`` returns ``_cumulative_rewards[a]``, everything ``a`` received since it last
acted. When the game ends every agent is terminated and must step ``None`` once (its dead
step), which is when the agent that did not make the final move reads its reward. No
``team_reward`` key: a game is not a team task (trainers must use each agent's own reward).

**Outcomes.** At the end, ``infos[a]`` has ``outcome`` (``"win"`` / ``"draw"`` / ``"loss"``, by
comparing total payoffs), ``payoff``, ``payoffs``, ``winner``, ``reason``, ``forfeit``,
``moves`` and ``problem_index``. Between moves: ``turn``, ``flags``, ``move`` (the parsed move).
:func:`~marft_envs.games.base.play_episode` plays one game with scripted or model players
(``player(env, agent) -> text``); :func:`~marft_envs.games.base.match_outcomes` counts
win/draw/loss over ``n`` start positions (rates and Wilson intervals are computed by the
caller, e.g. ``marft_algos.evaluation.wilson_interval``).

**Seeding and splits.** ``reset(seed=s)`` draws a start position; ``reset(options=
{"problem_index": k})`` picks position ``k`` of the ``split`` (``"train"`` / ``"test"``: disjoint
generator streams); Nim also takes ``options={"pile": n}``.

**Bad actions never raise.** Text is sanitised like every marft action (``None``,
non-strings, control characters, overlong text: flagged, see
:func:`~marft_envs.text_env.sanitize_action`); an unparsable move is handled by
``on_invalid``. Dead agents must step ``None``.

**Profiles.** ``profiles=`` takes a team file/list with roles ``player_0`` and ``player_1``
(their system prompts and sampling settings; built-in ``nim`` / ``matrix``); the team's
topology records who sees whose move (Nim: a chain; matrix: independent).

Arguments: ``profiles``, ``max_action_chars`` (4096), ``render_mode``, ``split`` and the
game's own (Nim: ``piles``, ``max_take``, ``on_invalid``, ``ask_move``; matrix: ``game``, ``rounds``).

Version history: v0: initial release.
"""

from __future__ import annotations

from typing import Any

from marft_envs.games.base import GAME_SPLITS, Player, TextGameEnv, match_outcomes, play_episode
from marft_envs.games.matrix import MATRIX_GAMES, FixedPlayer, MatrixGameEnv, RandomPlayer
from marft_envs.games.nim import NimEnv, OptimalNimPlayer, optimal_take
from marft_envs.games.textarena_adapter import TextArenaGameEnv

__all__ = [
    "GAME_SPLITS",
    "MATRIX_GAMES",
    "FixedPlayer",
    "MatrixGameEnv",
    "NimEnv",
    "OptimalNimPlayer",
    "Player",
    "RandomPlayer",
    "TextGameEnv",
    "match_outcomes",
    "optimal_take",
    "play_episode",
    "textarena_env",
]


def textarena_env(**kwargs: Any) -> Any:
    """Entry point of the TextArena-backed ids (optional extra): ``TextArenaGameEnv(**kwargs)``."""
    return TextArenaGameEnv(**kwargs)
