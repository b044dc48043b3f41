"""The shared machinery of the turn-based text games: per-agent rewards, exact AEC bookkeeping.

:class:`TextGameEnv` is a PettingZoo ``AECEnv`` whose agents have their OWN rewards
(zero-sum or general-sum), unlike :class:`~marft_envs.text_env.TextTeamEnv`, whose
reward is one team reward copied to every agent. A game subclass supplies the state,
the rules text, the move parser and the transition (:meth:`TextGameEnv._play`); this
class does the rest exactly as PettingZoo's classic games do:

* ``rewards`` holds what each agent received from the LAST step (cleared at every
  step); ``_cumulative_rewards`` what it has received since it last acted, returned by
  ``last()`` at its next turn (or its dead step);
* when a game ends every agent is terminated (a decided game) or truncated (a ply
  limit), then each agent must step ``None`` once (its dead step) and is removed;
* bad text never raises (sanitised like any marft action, flagged in ``infos``).

Outcomes: at the end, ``infos[agent]`` has ``outcome`` (``"win"`` | ``"draw"`` |
``"loss"``: by comparing the agents' game payoffs), ``payoff`` (the agent's total),
``payoffs`` (everyone's), ``winner`` (an agent or ``None``), ``reason`` and
``forfeit`` (the agent that forfeited, or ``None``), so an evaluation loop can count
win/draw/loss and compute rates with confidence intervals.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marft_envs.aec import TextAECEnv, check_problem_index
from marft_envs.profiles import Team

__all__ = [
    "GAME_SPLITS",
    "Player",
    "TextGameEnv",
    "last_tagged",
    "match_outcomes",
    "play_episode",
]

#: Splits of the problem (start position) streams; ``test`` positions use other seeds.
GAME_SPLITS = ("train", "test")

#: An evaluation player: ``player(env, agent) -> action text`` (scripted, random or a model).
Player = Callable[[Any, str], Any]

_NUM_PROBLEMS = 100_000


def last_tagged(text: str, tag: str, value: str = r"[^\n]*") -> str | None:
    """The value after the LAST ``TAG:`` in ``text`` (case-insensitive), stripped; else None.

    Example:
        >>> last_tagged("I think MOVE: 1... no, MOVE: 3 stones", "MOVE", r"\\d{1,6}")
        '3'
    """
    found = None
    for m in re.finditer(rf"(?i)\b{re.escape(tag)}\s*[:=]\s*({value})", text):
        found = m.group(1).strip()
    return found


class TextGameEnv(TextAECEnv):
    """Base class of the text games (see the module docstring); subclasses define the game."""

    metadata = {"name": "text_game_v0", "render_modes": ["human", "ansi"], "is_parallelizable": False}
    #: The seats, in the order of the first round.
    game_agents: tuple[str, ...] = ("player_0", "player_1")
    #: Built-in profile file (``marft_envs/profiles/<name>.json``) naming the seats' prompts.
    default_profiles: str = ""

    def __init__(
        self,
        *,
        horizon: int,
        profiles: Team | str | list | dict | None = None,
        max_action_chars: int = 4096,
        render_mode: str | None = None,
        split: str = "train",
    ):
        super().__init__()
        if split not in GAME_SPLITS:
            raise ValueError(f"split must be one of {GAME_SPLITS}, got {split!r}")
        if not (isinstance(max_action_chars, (int, np.integer)) and max_action_chars >= 1):
            raise ValueError(f"max_action_chars must be an integer >= 1, got {max_action_chars!r}")
        self._check_render_mode(render_mode)
        self.team: Team = Team.load(profiles if profiles is not None else self.default_profiles)
        if tuple(self.team.agents) != tuple(self.game_agents):
            raise ValueError(
                f"{type(self).__name__} needs profiles for exactly {list(self.game_agents)} (in this "
                f"order), got {self.team.agents}"
            )
        self.split = split
        self.horizon = int(horizon)
        self.max_action_chars = int(max_action_chars)
        self.render_mode = render_mode
        self._init_spaces(self.game_agents, 65_536 + (self.horizon + 1) * (self.max_action_chars + 256), self.horizon)
        self.turn = 0
        self.problem_index: int | None = None
        self.moves: list[tuple[str, str]] = []
        self.payoffs: dict[str, float] = {}
        self.game_over = False
        self.stats: dict[str, int] = {"episodes": 0, "bad_actions": 0, "invalid_moves": 0, "forfeits": 0}

    @property
    def num_problems(self) -> int:
        """Start positions addressable with ``reset(options={"problem_index": k})``."""
        return _NUM_PROBLEMS

    def problem_rng(self, index: int) -> np.random.Generator:
        """The generator of start position ``index`` of this split (disjoint streams per split)."""
        return np.random.default_rng([GAME_SPLITS.index(self.split), int(index)])

    # ----------------------------------------------------------- game hooks
    def _start(self, rng: np.random.Generator, options: Mapping[str, Any]) -> None:
        """Set up a new game from ``rng`` (the start position's generator) and reset options."""
        raise NotImplementedError

    def _play(self, agent: str, text: str, flags: list[str]) -> dict[str, Any]:
        """Apply ``agent``'s move (sanitised ``text``); append flags; return info extras.

        Call :meth:`_end_game` to finish the game, :meth:`_give` to hand out rewards.
        """
        raise NotImplementedError

    def _next_agent(self, agent: str) -> str:
        """Who moves after ``agent`` (default: the seats in turn)."""
        i = self.possible_agents.index(agent)
        return self.possible_agents[(i + 1) % len(self.possible_agents)]

    def rules(self, agent: str) -> str:
        """The rules as ``agent`` reads them (its seat, the move syntax)."""
        raise NotImplementedError

    def state_text(self, agent: str) -> str:
        """The game state as ``agent`` sees it now."""
        raise NotImplementedError

    def legal_moves(self, agent: str) -> list[str]:
        """Action texts that are legal for ``agent`` now (used by scripted players)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- reset
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a game: ``seed`` seeds the env; ``options={"problem_index": k}`` picks start position k."""
        self._seed(seed)
        options = dict(options or {})
        k = options.get("problem_index")
        if k is None:
            k = int(self.np_random.integers(_NUM_PROBLEMS))
        self.problem_index = check_problem_index(k, _NUM_PROBLEMS)
        self._start_episode()
        self.turn = 0
        self.moves = []
        self.payoffs = dict.fromkeys(self.agents, 0.0)
        self.game_over = False
        self._start(self.problem_rng(self.problem_index), options)
        self._skip_agent_selection = None
        self.agent_selection = self.possible_agents[0]
        self.stats["episodes"] += 1
        if self.render_mode == "human":
            self.render()

    # ---------------------------------------------------------------- views
    def _is_reset(self) -> bool:
        """Whether ``reset()`` set up a start position."""
        return self.problem_index is not None

    def _view(self, agent: str) -> tuple[str, str]:
        self._require_reset("observe()")
        return self.team.profiles[agent].prompt, f"{self.rules(agent)}\n\n{self.state_text(agent)}"

    def observe(self, agent: str) -> dict[str, Any]:
        """``{"prompt", "turn"}``: the rules and the state as ``agent`` sees them."""
        system, user = self._view(agent)
        prompt = f"{system}\n\n{user}" if system else user
        return {"prompt": prompt[: self._max_prompt], "turn": min(self.turn, self.horizon)}

    def messages(self, agent: str) -> list[dict[str, str]]:
        """The observation as chat messages (system = the seat's profile prompt)."""
        return self._chat(*self._view(agent))

    # ----------------------------------------------------------------- step
    def _act(self, agent: str, text: str, flags: list[str]) -> None:
        """Apply ``agent``'s move (:meth:`_play`); an invalid move is flagged and counted."""
        if flags:
            self.stats["bad_actions"] += 1
        extras = self._play(agent, text, flags)
        if "invalid_move" in flags:
            self.stats["invalid_moves"] += 1
        if not self.game_over:
            self.infos[agent] = {"turn": self.turn, "flags": list(dict.fromkeys(flags)), **extras}
            self.agent_selection = self._next_agent(agent)
        else:
            self.infos[agent]["flags"] = list(dict.fromkeys(flags + self.infos[agent]["flags"]))
            self.infos[agent].update(extras)

    def _give(self, rewards: Mapping[str, float]) -> None:
        """Hand out rewards in this step (added to each agent's game payoff)."""
        for a, r in rewards.items():
            self.rewards[a] = self.rewards.get(a, 0.0) + float(r)
            self.payoffs[a] += float(r)

    def _end_game(self, reason: str, *, forfeit: str | None = None, truncated: bool = False) -> None:
        """Finish the game on the payoffs handed out so far: outcomes in infos, dead steps next."""
        self.game_over = True
        if forfeit is not None:
            self.stats["forfeits"] += 1
        best = max(self.payoffs.values())
        leaders = [a for a in self.agents if self.payoffs[a] == best]
        winner = leaders[0] if len(leaders) == 1 else None
        for a in self.agents:
            outcome = "draw" if len(leaders) == len(self.agents) else ("win" if a in leaders else "loss")
            self.infos[a] = {
                "turn": self.turn,
                "flags": [],
                "outcome": outcome,
                "payoff": self.payoffs[a],
                "payoffs": dict(self.payoffs),
                "winner": winner,
                "reason": reason,
                "forfeit": forfeit,
                "moves": [list(m) for m in self.moves],
                "problem_index": self.problem_index,
            }
        self._end_episode(truncated=truncated)

    # --------------------------------------------------------------- render
    def _render_text(self) -> str:
        """The state as the first seat sees it, the moves so far and who moves next."""
        lines = [self.state_text(self.possible_agents[0])]
        lines += [f"[{a}]: {m}" for a, m in self.moves]
        if self.agents:
            lines.append(f"(next: {self.agent_selection})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r})"


def play_episode(env: TextGameEnv, players: Mapping[str, Player], seed: int | None = None,
                 options: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Play one game with ``players[agent](env, agent) -> text``; return each agent's final info.

    The returned infos have ``outcome``, ``payoff`` and ``return`` (the sum of the rewards
    that ``last()`` gave the agent: equal to ``payoff`` in a game that PettingZoo
    bookkeeping serves correctly).
    """
    missing = sorted(set(env.possible_agents) - set(players))
    if missing:
        raise ValueError(f"no player for {missing}; give one callable per agent of {env.possible_agents}")
    env.reset(seed=seed, options=options)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    final: dict[str, dict[str, Any]] = {}
    for agent in env.agent_iter(10 * (env.horizon + 2) * len(env.possible_agents)):
        _, reward, term, trunc, info = env.last(observe=False)
        returns[agent] += float(reward)
        if term or trunc:
            final[agent] = {**copy.deepcopy(info), "return": returns[agent]}
            env.step(None)
        else:
            env.step(players[agent](env, agent))
    return final


def match_outcomes(env: TextGameEnv, players: Mapping[str, Player], n: int, seed: int = 0,
                   start_index: int = 0) -> dict[str, dict[str, int]]:
    """Win/draw/loss counts per agent over ``n`` games on start positions ``start_index..``.

    Example (an optimal Nim player against a random one, from winning positions only):
        >>> from marft_envs.games import NimEnv, OptimalNimPlayer, RandomPlayer
        >>> env = NimEnv(piles=[5, 7], max_take=3)  # 5 % 4 and 7 % 4 != 0: player_0 wins
        >>> counts = match_outcomes(env, {"player_0": OptimalNimPlayer(),
        ...                               "player_1": RandomPlayer(seed=1)}, n=20)
        >>> counts["player_0"]
        {'win': 20, 'draw': 0, 'loss': 0}
    """
    counts = {a: {"win": 0, "draw": 0, "loss": 0} for a in env.possible_agents}
    for k in range(n):
        final = play_episode(env, players, seed=seed + k, options={"problem_index": start_index + k})
        for a, info in final.items():
            counts[a][info["outcome"]] += 1
    return counts
