"""The PettingZoo AEC bookkeeping shared by marft's text envs (teams, games, workflows).

:class:`TextAECEnv` is an ``AECEnv`` base that keeps PettingZoo's semantics in one
place, exactly as PettingZoo's classic games do:

* ``rewards`` holds what each agent received from the LAST step (cleared at every
  live step); ``_cumulative_rewards`` what it has received since it last acted,
  returned by ``last()`` at its next turn (or its dead step);
* when an episode ends every agent is terminated or truncated, then each must step
  ``None`` once (its dead step) and is removed;
* one observation and one action space object per agent (``api_test`` and seeding
  rely on their identity); ``np_random`` seeded by ``reset(seed=...)``;
* a call that needs an episode before ``reset()`` raises :class:`ResetNeededError`;
* actions are sanitised (:func:`~marft_envs.text_env.sanitize_action`): bad text never raises.

A subclass sets up the episode in ``reset`` (with :meth:`TextAECEnv._start_episode`),
applies a live agent's action in :meth:`TextAECEnv._act` (``step`` does the rest),
ends an episode with :meth:`TextAECEnv._end_episode`, and writes its render text in
:meth:`TextAECEnv._render_text`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import AECEnv

from marft_envs.spaces import action_space, observation_space

__all__ = ["ResetNeededError", "TextAECEnv", "check_problem_index", "sanitize_action"]

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class ResetNeededError(RuntimeError, AssertionError):
    """A call that needs an episode came before ``reset()``. Also an AssertionError,
    the type PettingZoo's OrderEnforcingWrapper raises for the same mistake."""


def sanitize_action(action: Any, max_chars: int) -> tuple[str, list[str]]:
    """``(text, flags)``: any action made into a string of at most ``max_chars`` characters."""
    flags: list[str] = []
    if action is None:
        return "", ["none_action", "empty_action"]
    if isinstance(action, str):
        text = str(action)  # np.str_ and other subclasses -> plain str
    else:
        flags.append("not_a_string")
        try:
            if isinstance(action, (bytes, bytearray, memoryview)):
                text = bytes(action[: 4 * max_chars]).decode("utf-8", errors="replace")
            else:
                text = str(action)
        except Exception:
            text = ""
    if len(text) > max_chars:
        text = text[:max_chars]
        flags.append("action_truncated")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot reach a tokenizer or a log file
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        flags.append("invalid_unicode")
    if _CONTROL_RE.search(text):
        text = _CONTROL_RE.sub("", text)
        flags.append("binary_action")
    if not text.strip():
        flags.append("empty_action")
    return text, flags


def check_problem_index(k: Any, n: int) -> int:
    """``k`` as an int if it indexes one of ``n`` problems (``reset`` option
    ``problem_index``), else a ``ValueError`` saying the valid range."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
        raise ValueError(f"problem_index must be an int in [0, {n}), got {k!r}")
    return int(k)


class TextAECEnv(AECEnv):
    """Base class of the text AEC envs (see the module docstring)."""

    metadata: dict[str, Any] = {"render_modes": ["human", "ansi"], "is_parallelizable": False}
    render_mode: str | None = None
    max_action_chars: int = 4096

    # ----------------------------------------------------------------- setup
    def _check_render_mode(self, render_mode: str | None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")

    def _init_spaces(self, agents: Iterable[str], max_prompt: int, horizon: int) -> None:
        """``possible_agents`` and one space object of each kind per agent; no episode yet."""
        self.possible_agents = list(agents)
        self._max_prompt = int(max_prompt)
        self._observation_spaces = {a: observation_space(self._max_prompt, horizon) for a in self.possible_agents}
        self._action_spaces = {a: action_space(self.max_action_chars) for a in self.possible_agents}
        self._np_random: np.random.Generator | None = None
        self._np_random_seed: int | None = None
        self.agents: list[str] = []

    # ---------------------------------------------------------------- spaces
    def observation_space(self, agent: str) -> gymnasium.spaces.Dict:
        """``Dict(prompt=UnicodeText, turn=Discrete)``, the same object on every call."""
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> Any:
        """``UnicodeText(max_action_chars)``, the same object on every call."""
        return self._action_spaces[agent]

    @property
    def np_random(self) -> np.random.Generator:
        """The env's generator; seeded by ``reset(seed=...)``, else from OS entropy on first use."""
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        return self._np_random

    def _seed(self, seed: int | None) -> None:
        """Reseed ``np_random`` when ``reset`` gets a seed."""
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)

    # --------------------------------------------------------------- episode
    def _is_reset(self) -> bool:
        """Whether an episode has been started (subclasses say by what they keep)."""
        raise NotImplementedError

    def _require_reset(self, call: str) -> None:
        if not self._is_reset():
            raise ResetNeededError(f"call reset() before {call}")

    def _start_episode(self) -> None:
        """Every agent alive, no rewards yet, ``{"turn": 0, "flags": []}`` infos."""
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"turn": 0, "flags": []} for a in self.agents}

    def step(self, action: Any) -> None:
        """Apply the selected agent's action: a dead agent must step ``None`` (PettingZoo's
        rule; it is then removed); a live agent's action is sanitised (bad text is flagged,
        never raises) and applied by the env's rules (:meth:`_act`)."""
        self._require_reset("step()")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        text, flags = sanitize_action(action, self.max_action_chars)
        self._cumulative_rewards[agent] = 0.0  # handed over by last() before this step
        self._clear_rewards()
        self._act(agent, text, flags)
        self._end_step()

    def _act(self, agent: str, text: str, flags: list[str]) -> None:
        """Apply ``agent``'s sanitised action ``text`` (``flags``: the sanitiser's, to extend)."""
        raise NotImplementedError

    def _end_step(self) -> None:
        """The last of ``step`` (and ``reset``): rewards accumulated, a frame rendered in human mode."""
        self._accumulate_rewards()
        if self.render_mode == "human":
            self.render()

    def _end_episode(self, *, truncated: bool) -> None:
        """Every agent terminated (or truncated); their dead steps come first."""
        for a in self.agents:
            self.terminations[a] = not truncated
            self.truncations[a] = truncated
        self._deads_step_first()

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """PettingZoo's ``last()``, with a clear error before ``reset()``."""
        self._require_reset("last()")
        return super().last(observe)

    def agent_iter(self, max_iter: int = 2**63) -> Any:
        """PettingZoo's ``agent_iter()``; before ``reset()`` it would silently yield nothing."""
        self._require_reset("agent_iter()")
        return super().agent_iter(max_iter)

    # ----------------------------------------------------------------- views
    @staticmethod
    def _chat(system: str, user: str) -> list[dict[str, str]]:
        """``[system, user]`` chat messages (no system message when ``system`` is empty)."""
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

    # ---------------------------------------------------------------- render
    def _render_text(self) -> str:
        """The episode so far as text (called after ``reset()`` only)."""
        raise NotImplementedError

    def render(self) -> str | None:
        """Print (``human``) or return (``ansi``) the episode so far as text."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; use render_mode='human' or 'ansi'.")
            return None
        text = self._render_text() if self._is_reset() else "(not reset)"
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        """Nothing to release."""
