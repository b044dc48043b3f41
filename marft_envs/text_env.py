"""Text team environments: any :class:`~marft_envs.tasks.base.Task` played by any :class:`~marft_envs.profiles.Team`.

| Property        | Value                                                             |
|-----------------|-------------------------------------------------------------------|
| API             | PettingZoo ``AECEnv``                                             |
| Agents          | the team's roles, e.g. ``["reasoner", "actor"]``                  |
| Acting order    | the team topology (the Flex-POMDP dependency function D), recomputed after every action |
| Action space    | ``UnicodeText(max_action_chars)``: any string                     |
| Observation     | ``{"prompt": str, "turn": int}``: ``Dict(prompt=UnicodeText, turn=Discrete(horizon + 1))`` |
| Reward          | shared team reward, set for every agent when a turn is graded      |
| Episode         | ``horizon`` turns; ends early (termination) on a correct answer    |

**Turns.** In each turn every agent that the topology schedules acts once;
``next_agent(executed)`` picks who acts next given the ``(agent, action)``
pairs executed so far, and ``None`` ends the turn. The answering agent (the
last executed agent whose profile has ``with_answer``) is then graded.

**Observations.** An agent sees its profile prompt (the system message), the
problem, the actions of the agents it depends on in this turn (its
``parents``), in multi-turn episodes its own and its parents' actions of earlier
turns plus the feedback line, and, if it answers, the task's instructions.
``observe(agent)["prompt"]`` is the plain-text form; ``messages(agent)`` the chat
form (``system`` = profile prompt, ``user`` = the rest).

**Rewards.** When a turn is graded, ``rewards[agent]`` is the team reward for
every agent (PettingZoo semantics: ``last()`` returns it, accumulated, at the
agent's next turn; dead steps follow). The components and a per-agent
``attribution`` (equal shares among the agents that acted in the turn; trainers
pick their own credit scheme) are in ``infos``. See :mod:`marft_envs.rewards`.

**Episode end.** A correct answer *terminates* the episode (a goal state). At
the horizon without a correct answer the episode is *truncated*: the problem
is unsolved, the time budget is spent. No observation follows either way, so
a trainer should not bootstrap past the last turn in a fixed-horizon episode;
the distinction only tells success from running out of turns.

**Bad actions never raise.** ``None`` for a live agent, non-strings, empty,
enormous (truncated to ``max_action_chars``), binary-looking (control
characters removed) or invalid Unicode (lone surrogates replaced) actions are
sanitized and flagged in ``infos[agent]["flags"]``; an ungradable answer is
wrong (reward from the outcome term 0). Dead agents must step ``None``
(PettingZoo's rule; anything else raises ``ValueError``). A reply holding chat
markers such as ``<|im_start|>`` is kept as text (policies encode teammates' text
literally) and flagged ``special_tokens_in_action``: it may be a forged turn.

**Optional task hooks.** A task may define ``grade_turn(executed, answer_agent,
problem) -> GradeResult`` to grade the whole turn instead of the answering
agent's text alone (used by :class:`~marft_envs.tasks.echo.EchoTask`), and
``view_context(agent, executed, problem, parents) -> str | None`` to add a
section to an agent's view (the retrieved documents of :mod:`marft_envs.tasks.rag`),
and ``demo_action(env, agent) -> str | None``, a scripted demonstration of a good action
(:meth:`TextTeamEnv.demo_action`; used by ``marft sft --demos scripted``).

**Tools.** Agents whose profile lists ``tools`` may call them (see
:mod:`marft_envs.tools` and the tool-calling page): a reply with a call runs it,
appends the result as a ``tool`` message and the same agent acts again
(``info["tool_turn"]``); ``tools(agent)`` gives the schemas for the chat
template. Without tools nothing of this applies.

**Task contract, checked loudly.** A grader that raises gives a wrong answer
(flagged ``grade_error``: one response may break a grader). A grader that
returns something other than a :class:`~marft_envs.tasks.base.GradeResult`, or
one whose ``correct``/``format_ok``/``timed_out`` are not bools (``"yes"``
would count as correct), whose ``score`` is not a finite number in [0, 1], or
whose ``details`` is not a dict, raises ``TypeError``/``ValueError`` naming the
task class and the field (:func:`check_grade_result`): that is a bug in the
task, the same for every response, and training on it would be silent nonsense.

**Info keys after a graded turn:** ``turn``, ``team_reward``,
``reward_components``, ``attribution``, ``grade`` (GradeResult fields),
``flags`` (this agent's action flags plus the turn's flags), ``action_flags``
(per agent), ``answer_agent``, ``executed`` (agents in execution order),
``problem_id``, plus the topology's ``turn_info`` (a multi-hop router's ``routes``,
``hops``, ``route_counts``, ``handoff_loops``). Between graded turns an agent's info is ``{"turn", "flags"}``.
Wall-clock fields of a grade (``details["seconds"]``) are kept out of infos,
which must be reproducible; they are in ``env.last_grade_timing`` and the
longest grading time in ``env.max_grade_seconds``.

Flags: ``none_action``, ``not_a_string``, ``empty_action``, ``action_truncated``,
``binary_action``, ``invalid_unicode``, ``route_unparsed``, ``route_by_mention``,
``no_answer_agent``, ``hop_budget_exhausted``, ``grade_error`` (the grader failed), ``grade_timeout`` (the
grader ran out of time), plus the grader's own flags from
``GradeResult.details["flags"]`` (code tasks: ``no_code``, ``load_error``,
``program_timeout``: the program was killed, a wrong answer, not a grader
timeout; ``sandbox_error``). Counters of these over the env's lifetime:
``env.stats`` (``bad_actions``, ``route_unparsed``, ``grade_errors``,
``grade_timeouts``, ``no_code``, ``load_errors``, ``program_timeouts``, ...).

Arguments: ``task`` (a Task, a short name such as ``"arith"`` or
``"module:Class"``), ``team`` / ``profiles`` (a Team, a built-in team name, a
JSON path or a profile list), ``horizon`` (1), ``feedback`` (False),
``reward`` (dict of weights, see :class:`~marft_envs.rewards.RewardConfig`),
``max_action_chars`` (4096), ``render_mode`` (``"human"`` | ``"ansi"`` | None),
``tool_config`` (dict, see :class:`~marft_envs.tools.ToolConfig`),
``handoff`` (what an agent sees of a teammate's action, per edge: ``"full"``, the default,
``"answer"``, ``"record"``, ``"module:function"``, a callable or a dict per edge; see
:mod:`marft_envs.handoff`), ``task_kwargs`` and any other keyword (``split``, ``data_dir``, ``digits``, ...)
go to the task's constructor.

Version history: v0: initial release.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from marft_envs.aec import ResetNeededError, TextAECEnv, check_problem_index, sanitize_action
from marft_envs.handoff import Handoff, resolve_handoff
from marft_envs.profiles import Team
from marft_envs.registration import EnvArgumentError, accepted_arguments, check_arguments
from marft_envs.rewards import RewardConfig
from marft_envs.tasks import resolve_task_class
from marft_envs.tasks.base import GradeResult, Problem, Task
from marft_envs.tools.loop import ToolLoop
from marft_envs.topology import MultiHopRouted

__all__ = ["ResetNeededError", "TextTeamEnv", "check_grade_result", "env", "raw_env", "sanitize_action"]

logger = logging.getLogger("marft_envs")

# Wall-clock measurements vary run to run; infos must not (PettingZoo's seed_test compares them).
_TIMING_KEYS = frozenset({"seconds", "elapsed", "elapsed_s", "time", "wall_time", "duration"})
_STAT_KEYS = (
    "turns",
    "episodes",
    "bad_actions",
    "route_unparsed",
    "grade_errors",
    "grade_timeouts",
    "no_answer_agent",
    "no_code",
    "load_errors",
    "program_timeouts",
    "sandbox_errors",
)
# Grader flags (GradeResult.details["flags"]) -> their env.stats counter; others count
# under their own name.
_GRADE_FLAG_STATS = {
    "load_error": "load_errors",
    "program_timeout": "program_timeouts",
    "sandbox_error": "sandbox_errors",
}


_SPECIAL_TOKEN_RE = re.compile(r"<\|[^|<>\s]{1,64}\|>")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_BOOL_FIELDS = ("correct", "format_ok", "timed_out")


def check_grade_result(result: Any, where: str) -> GradeResult:
    """``result`` if it keeps the :class:`~marft_envs.tasks.base.GradeResult` contract, else a
    ``TypeError``/``ValueError`` naming ``where`` (the task method) and the broken field.

    ``correct``, ``format_ok``, ``timed_out``: bools; ``score``: a finite number in [0, 1];
    ``extracted``, ``error``: a string or None; ``details``: a dict.
    """
    if not isinstance(result, GradeResult):
        raise TypeError(f"{where} returned {type(result).__name__}, not a GradeResult; "
                        "return marft_envs.GradeResult(correct=..., score=...)")
    for name in _BOOL_FIELDS:
        value = getattr(result, name)
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{where} returned GradeResult.{name}={value!r} "
                            f"({type(value).__name__}); it must be True or False")
    score = result.score
    if isinstance(score, (bool, np.bool_)) or not isinstance(score, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where} returned GradeResult.score={score!r} ({type(score).__name__}); "
                        "it must be a number in [0, 1]")
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"{where} returned GradeResult.score={score!r}; it must be a finite number "
                         "in [0, 1] (partial credit; float(correct) for binary tasks)")
    for name in ("extracted", "error"):
        value = getattr(result, name)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{where} returned GradeResult.{name}={value!r} "
                            f"({type(value).__name__}); it must be a string or None")
    if not isinstance(result.details, dict):
        raise TypeError(f"{where} returned GradeResult.details of type "
                        f"{type(result.details).__name__}; it must be a dict")
    return result


def _build_task(task: Task | str, task_kwargs: Mapping[str, Any] | None, options: dict[str, Any]) -> Task:
    if isinstance(task, Task):
        if task_kwargs or options:
            raise EnvArgumentError(
                f"unexpected arguments {sorted({**(task_kwargs or {}), **options})} for a Task instance "
                f"({type(task).__name__}): task options apply only when the task is given by name; pass them to "
                f"the task's constructor instead ({type(task).__name__}(...)), or give the task as 'module:Class' "
                "so that the options reach it"
            )
        return task
    if not isinstance(task, str):
        raise TypeError(f"task must be a Task, a task name or 'module:Class', got {type(task).__name__}")
    cls = resolve_task_class(task)
    kwargs = {**(task_kwargs or {}), **options}
    env_options = [a for a in accepted_arguments(TextTeamEnv, named_only=True) or [] if a != "task_options"]
    check_arguments(f"task {task!r} ({cls.__name__})", cls, kwargs,
                    "options of the env itself: " + ", ".join(env_options), also=env_options)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise TypeError(f"task {task!r} ({cls.__name__}) rejected arguments {sorted(kwargs)}: {e}") from e


class TextTeamEnv(TextAECEnv):
    """A team of LLM agents solving a text task (see the module docstring)."""

    metadata = {"name": "text_team_v0", "render_modes": ["human", "ansi"], "is_parallelizable": False}

    def __init__(
        self,
        task: Task | str = "arith",
        team: Team | str | list | dict | None = None,
        *,
        profiles: Team | str | list | dict | None = None,
        horizon: int = 1,
        feedback: bool = False,
        reward: RewardConfig | Mapping[str, Any] | None = None,
        max_action_chars: int = 4096,
        render_mode: str | None = None,
        task_kwargs: Mapping[str, Any] | None = None,
        tool_config: Mapping[str, Any] | Any = None,
        handoff: Any = "full",
        **task_options: Any,
    ):
        super().__init__()
        if team is not None and profiles is not None:
            raise ValueError("give either team= or profiles= (the same thing), not both")
        if not (isinstance(horizon, (int, np.integer)) and not isinstance(horizon, bool) and horizon >= 1):
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
        if not (isinstance(max_action_chars, (int, np.integer)) and max_action_chars >= 1):
            raise ValueError(f"max_action_chars must be an integer >= 1, got {max_action_chars!r}")
        self._check_render_mode(render_mode)
        self.task: Task = _build_task(task, task_kwargs, task_options)
        self.team: Team = Team.load(team if team is not None else (profiles if profiles is not None else "duo"))
        self.horizon = int(horizon)
        self.feedback = bool(feedback)
        self.reward_config = RewardConfig.from_any(reward)
        self.max_action_chars = int(max_action_chars)
        self.render_mode = render_mode
        self.metadata = {**type(self).metadata, "name": f"{self.task.name}_{self.team.name}_v0"}

        # Tool calling (marft_envs.tools): the profiles' tools, budgets, parser; inert without tools.
        self.tool_loop = ToolLoop(self.team, tool_config)
        # What an agent sees of its teammates' actions, per edge (marft_envs.handoff; "full" = as written).
        self.handoff: Handoff = resolve_handoff(handoff, self.team.agents)

        n = len(self.team.agents)
        # A multi-hop topology may schedule more actions per turn than there are agents.
        per_turn = max(n, int(getattr(self.team.topology, "max_actions_per_turn", n)))
        max_prompt = 65_536 + self.horizon * per_turn * (self.max_action_chars + 256)
        max_prompt += self.horizon * self.tool_loop.extra_prompt_chars(self.max_action_chars)
        self._init_spaces(self.team.agents, max_prompt, self.horizon)

        self.stats: dict[str, int] = dict.fromkeys(_STAT_KEYS, 0)
        #: Timing fields of the last grade (kept out of infos, which must be deterministic).
        self.last_grade_timing: dict[str, Any] = {}
        self.max_grade_seconds = 0.0
        self.problem: Problem | None = None
        self.turn = 0
        self._executed: list[tuple[str, str]] = []
        self._history: list[list[tuple[str, str]]] = []
        self._feedback_lines: list[str] = []
        self._action_flags: dict[str, list[str]] = {}
        self._turn_flags: list[str] = []

    # -------------------------------------------------------------- properties
    @property
    def num_problems(self) -> int:
        """Number of problems the task offers (``reset`` options may pick one)."""
        return len(self.task)

    @property
    def executed(self) -> list[tuple[str, str]]:
        """``(agent, action)`` pairs of the current turn, in execution order."""
        return list(self._executed)

    @property
    def history(self) -> list[list[tuple[str, str]]]:
        """Executed pairs of the earlier turns of this episode."""
        return [list(t) for t in self._history]

    # ------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start an episode: ``seed`` fixes the problem drawn; ``options={"problem_index": k}`` picks one."""
        self._seed(seed)
        options = options or {}
        if "problem_index" in options:
            self.problem = self.task.get(check_problem_index(options["problem_index"], len(self.task)))
        else:
            self.problem = self.task.sample(self.np_random)

        self._start_episode()
        self.turn = 0
        self._executed = []
        self._history = []
        self._feedback_lines = []
        self._action_flags = {}
        self._turn_flags = []
        self.tool_loop.reset()
        self._skip_agent_selection = None
        self.agent_selection = self._next_agent()
        self.stats["episodes"] += 1
        if self.render_mode == "human":
            self.render()

    # ------------------------------------------------------------------- views
    def _visible(self, agent: str, executed: list[tuple[str, str]]) -> list[tuple[str, str]]:
        history_fn = getattr(self.team.topology, "visible_history", None)  # e.g. a shared dialogue history
        if callable(history_fn):
            return history_fn(agent, executed)
        parents = set(self.team.topology.parents(agent, executed))
        return [(a, x) for a, x in executed if a == agent or a in parents]

    def _shown(self, source: str, target: str, text: str) -> str:
        """What ``target`` sees of ``source``'s action ``text``: the edge's hand-off (default: as written)."""
        if self.handoff.is_full:
            return text
        return self.handoff(text, source=source, target=target, problem=self.problem)

    def _is_reset(self) -> bool:
        """Whether ``reset()`` drew a problem."""
        return self.problem is not None

    def _view(self, agent: str, inline: bool | None = True) -> tuple[str, str]:
        """``(system, user)`` text of ``agent``'s observation."""
        self._require_reset("observe()")
        profile = self.team.profiles[agent]
        parts = [f"Problem:\n{self.problem.question}"]
        for t, past in enumerate(self._history):
            lines = [f"[{a}]: {self._shown(a, agent, x)}" for a, x in self._visible(agent, past)]
            if t < len(self._feedback_lines) and self._feedback_lines[t]:
                lines.append(self._feedback_lines[t])
            if lines:
                parts.append(f"Turn {t + 1}:\n" + "\n\n".join(lines))
        topology = self.team.topology
        parents = topology.parents(agent, self._executed)
        visible_fn = getattr(topology, "visible_actions", None)  # duck-typed topologies: latest per parent
        if callable(visible_fn):
            visible = visible_fn(agent, list(self._executed))
        else:
            acted = dict(self._executed)
            visible = [(p, acted[p]) for p in parents if p in acted]
        if visible:
            shown = "\n\n".join(f"[{a}]: {self._shown(a, agent, x)}" for a, x in visible)
            own = any(a == agent for a, _ in visible)
            header = ("The team's exchange so far" if own else "Your teammates' responses") + (
                " in this turn" if self._history else "")
            parts.append(f"{header}:\n{shown}")
        context_hook = getattr(self.task, "view_context", None)  # optional: e.g. retrieved documents
        if callable(context_hook):
            try:
                extra = context_hook(agent, list(self._executed), self.problem, list(parents))
            except Exception as e:  # a view must never fail; the hook's bug is logged
                logger.warning("%s: task.view_context raised %s: %s", self, type(e).__name__, e)
                extra = None
            if extra:
                parts.append(str(extra))
        note_fn = getattr(topology, "view_note", None)  # e.g. the hops left to a multi-hop router
        note = note_fn(agent, list(self._executed)) if callable(note_fn) else None
        if note:
            parts.append(str(note))
        if profile.with_answer and self.task.instructions:
            parts.append(self.task.instructions)
        system = profile.prompt
        tool_text = self.tool_loop.system_suffix(agent, inline)
        if tool_text:
            system = f"{system}\n\n{tool_text}" if system else tool_text
        return system, "\n\n".join(parts)

    def observe(self, agent: str) -> dict[str, Any]:
        """``{"prompt", "turn"}`` of ``agent``'s view (see the module docstring)."""
        system, user = self._view(agent)
        prompt = f"{system}\n\n{user}" if system else user
        tool_text = self.tool_loop.transcript_text(agent)
        if tool_text:
            prompt = f"{prompt}\n\n{tool_text}"
        if len(prompt) > self._max_prompt:  # keep the observation inside its space
            prompt = prompt[: self._max_prompt]
        return {"prompt": prompt, "turn": min(self.turn, self.horizon)}

    def messages(self, agent: str, inline_tools: bool | None = None) -> list[dict[str, str]]:
        """The observation as chat messages: system = profile prompt, user = everything else,
        then this turn's tool exchange (``assistant`` and ``tool`` messages), if any.

        With tools, the system message also describes them unless ``inline_tools`` (default:
        ``tool_config.inline_schemas``) is False; pass ``tools=env.tools(agent)`` to the chat
        template then. See ``docs/tools.md``."""
        system, user = self._view(agent, inline_tools)
        msgs = self._chat(system, user)
        msgs += self.tool_loop.transcript(agent)
        return msgs

    def tools(self, agent: str) -> list[dict[str, Any]]:
        """``agent``'s tool schemas in the transformers function-calling form (for
        ``apply_chat_template(tools=...)``); ``[]`` for an agent without tools."""
        return self.tool_loop.schemas(agent)

    def demo_action(self, agent: str | None = None) -> str | None:
        """A demonstration of a good action for ``agent`` (default: the agent to act), from
        the task's scripted policy (``task.demo_action(env, agent)``), or None when the task
        has none. What SFT warm starts train on (``marft sft --demos scripted``, docs/sft.md):
        e.g. a correct calculator call, then the boxed result. On a routed team the
        orchestrator's route is the topology's (``topology.demo_route``), so every role is
        reached: ``ROUTE: <specialist>``, or the task's answer ending ``ROUTE: done`` (the
        topology's ``route_line``: its ``route_format``, checked against its ``route_pattern``)."""
        self._require_reset("demo_action()")
        agent = agent if agent is not None else self.agent_selection
        hook = getattr(self.task, "demo_action", None)
        if not callable(hook):
            return None
        demo_route = getattr(self.team.topology, "demo_route", None)
        target = demo_route(agent, self._executed) if callable(demo_route) else None
        line = self.team.topology.route_line(target) if target is not None else None
        if target is not None and target != MultiHopRouted.DONE:
            return line
        text = hook(self, agent)
        if not isinstance(text, str):
            return None
        return text if line is None else f"{text}\n{line}"

    # -------------------------------------------------------------------- step
    def _next_agent(self) -> str:
        nxt = self.team.topology.next_agent(self._executed)
        if nxt is not None:
            # Agents act once per turn unless the topology says they may repeat (multi-hop).
            repeats = bool(getattr(self.team.topology, "repeats", False))
            acted = set() if repeats else {a for a, _ in self._executed}
            limit = getattr(self.team.topology, "max_actions_per_turn", len(self.agents))
            if repeats and len(self._executed) >= limit:  # a repeating topology must bound its turns
                raise RuntimeError(f"topology {self.team.topology!r} scheduled action {len(self._executed) + 1} of "
                                   f"a turn, over its max_actions_per_turn={limit}")
            if nxt not in self.agents or nxt in acted:
                raise RuntimeError(
                    f"topology {self.team.topology!r} scheduled {nxt!r}, which already acted this turn "
                    "or is not an agent of this team"
                )
        return nxt  # type: ignore[return-value]

    def _act(self, agent: str, text: str, flags: list[str]) -> None:
        """Apply ``agent``'s sanitised action; grade the turn when the topology says it is complete."""
        if flags:
            self.stats["bad_actions"] += 1
        if _SPECIAL_TOKEN_RE.search(text):
            # Chat-template markers in a reply: kept as text (policies encode contents
            # literally, marft_algos.models.chat) but flagged: a forged turn is an attack.
            flags.append("special_tokens_in_action")
        tool_info = self.tool_loop.step(self, agent, text, flags)
        if tool_info is not None:  # a tool continuation: the same agent acts again (legal in AEC)
            self.infos[agent] = tool_info
            return
        self._executed.append((agent, text))
        self._action_flags[agent] = flags
        for flag in self.team.topology.step_flags(self._executed):
            self._turn_flags.append(flag)
            self.stats[flag] = self.stats.get(flag, 0) + 1
            logger.info("%s: %s by %r in problem %s", self, flag, agent, self.problem.id if self.problem else None)
        self.infos[agent] = {"turn": self.turn, "flags": list(flags)}

        nxt = self._next_agent()
        if nxt is None:
            self._end_turn()
        else:
            self.agent_selection = nxt

    def _grade(self, answer_agent: str | None) -> GradeResult:
        assert self.problem is not None
        if answer_agent is None:
            self._turn_flags.append("no_answer_agent")
            self.stats["no_answer_agent"] += 1
            return GradeResult(correct=False, error="no answering agent acted in this turn")
        response = dict(self._executed)[answer_agent]
        hook = getattr(self.task, "grade_turn", None)
        try:
            if callable(hook):
                result = hook(list(self._executed), answer_agent, self.problem)
            else:
                result = self.task.grade(response, self.problem)
        except Exception as e:  # Task.grade must not raise; if it does, it is a wrong answer, counted
            logger.warning("%s: grading raised %s: %s", self, type(e).__name__, e)
            result = GradeResult(correct=False, error=f"{type(e).__name__}: {e}")
        else:
            # A result of the wrong shape is a bug in the task, the same for every response:
            # raised, never trained on (bool("yes") is True, a NaN score becomes reward 0).
            check_grade_result(result, f"{_qualname(type(self.task))}.{'grade_turn' if callable(hook) else 'grade'}")
        if result.timed_out:
            self._turn_flags.append("grade_timeout")
            self.stats["grade_timeouts"] += 1
        elif result.error:
            self._turn_flags.append("grade_error")
            self.stats["grade_errors"] += 1
        details = result.details if isinstance(result.details, dict) else {}
        grade_flags = details.get("flags")
        for flag in grade_flags if isinstance(grade_flags, list) else []:
            if isinstance(flag, str) and flag not in self._turn_flags:
                self._turn_flags.append(flag)  # e.g. no_code, visible in info["flags"]
                key = _GRADE_FLAG_STATS.get(flag, flag)
                self.stats[key] = self.stats.get(key, 0) + 1
        return result

    def _end_turn(self) -> None:
        executed = self._executed
        answerers = [a for a, _ in executed if self.team.profiles[a].with_answer]
        answer_agent = answerers[-1] if answerers else None
        grade = self._grade(answer_agent)
        components = self.reward_config.components(grade, [x for _, x in executed])
        tool_extras: dict[str, Any] = {}
        if self.tool_loop.enabled:
            tool_components, tool_extras = self.tool_loop.end_turn(self, self.problem)
            components.update(tool_components)
        team_reward = RewardConfig.total(components)
        if not math.isfinite(team_reward):
            team_reward = 0.0
        acted = [a for a, _ in executed]
        distinct = set(acted)  # an agent that acted twice (multi-hop) still gets one share
        attribution = {a: (1.0 / len(distinct) if a in distinct else 0.0) for a in self.agents}
        turn_info_fn = getattr(self.team.topology, "turn_info", None)
        topology_extras = turn_info_fn(list(executed)) if callable(turn_info_fn) else {}
        grade_info = dataclasses.asdict(grade)
        details = grade_info.get("details") or {}
        timing = {k: v for k, v in details.items() if k in _TIMING_KEYS or str(k).endswith("_seconds")}
        grade_info["details"] = {k: v for k, v in details.items() if k not in timing}
        self.last_grade_timing = timing
        seconds = timing.get("seconds")
        if isinstance(seconds, (int, float)) and seconds > self.max_grade_seconds:
            self.max_grade_seconds = float(seconds)
        turn_flags = list(dict.fromkeys(self._turn_flags))
        self.stats["turns"] += 1
        for a in self.agents:
            self.rewards[a] = team_reward
            self.infos[a] = {
                "turn": self.turn,
                "team_reward": team_reward,
                "reward_components": dict(components),
                "attribution": dict(attribution),
                "grade": dict(grade_info),
                "flags": list(dict.fromkeys(self._action_flags.get(a, []) + turn_flags)),
                "action_flags": {b: list(f) for b, f in self._action_flags.items()},
                "answer_agent": answer_agent,
                "executed": list(acted),
                "problem_id": self.problem.id if self.problem else None,
                **copy.deepcopy(topology_extras or {}),
                **copy.deepcopy(tool_extras),
            }

        solved = bool(grade.correct)
        if solved or self.turn + 1 >= self.horizon:
            self._end_episode(truncated=not solved)
            return
        # Next turn: the executed pairs become history, with the verifier's line if enabled.
        self._history.append(list(executed))
        if self.feedback:
            shown = grade.extracted if grade.extracted else "no answer found"
            self._feedback_lines.append(f"Feedback: the team's answer ({shown}) is incorrect. Try again.")
        else:
            self._feedback_lines.append("")
        self.turn += 1
        self._executed = []
        self._action_flags = {}
        self._turn_flags = []
        self.agent_selection = self._next_agent()

    # ------------------------------------------------------------------ render
    def _render_text(self) -> str:
        """The problem and the turns so far, with the agent to act next."""
        lines = [f"== {self.problem.id} ==", self.problem.question]  # type: ignore[union-attr]
        for t, past in enumerate([*self._history, self._executed]):
            lines.append(f"-- turn {t + 1} --")
            lines += [f"[{a}]: {x}" for a, x in past]
            if t < len(self._feedback_lines) and self._feedback_lines[t]:
                lines.append(self._feedback_lines[t])
        if self.agents:
            lines.append(f"(next: {self.agent_selection})")
        return "\n".join(lines)

    def close(self) -> None:
        """Nothing to release: graders and sandboxes clean up per call."""

    def __repr__(self) -> str:
        return f"TextTeamEnv(task={self.task!r}, team={self.team!r}, horizon={self.horizon})"


raw_env = TextTeamEnv


def env(**kwargs: Any) -> TextTeamEnv:
    """PettingZoo-style factory (the registry's entry point)."""
    return TextTeamEnv(**kwargs)
