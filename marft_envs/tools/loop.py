"""The env side of tool calling: parse a segment, run its calls, let the same agent continue.

:class:`ToolLoop` is owned by :class:`~marft_envs.text_env.TextTeamEnv`. For
each action of an agent that has tools, :meth:`ToolLoop.step` parses the text
with the configured parser. A segment with calls (and budget left) is a
*tool continuation*: the env runs the calls, records the segment and one
``tool`` message per call, and keeps ``agent_selection`` on the same agent (a
legal AEC step; PettingZoo does not require agents to alternate). A segment
without calls, or once the agent's budget is spent, is the agent's action of
the turn and the topology picks who acts next.

Budget: every call the agent writes (readable or not) counts, so an agent acts
at most ``budget + 1`` times per turn; calls past the budget are not run and
are answered with a ``tool_budget_exhausted`` message (and if the agent's
budget was already spent, its segment ends its turn, flagged).

At the first step of each episode the loop calls the task's optional
``start_tool_episode()`` (a task that records what its tools showed, like
:class:`~marft_envs.tasks.rag.RAGTask`, forgets the previous episode's).

Per graded turn the loop adds reward components (:class:`ToolRewardConfig`)
and ``info`` keys ``agent_metrics`` (per agent: ``steps``, ``tool_calls``,
``tool_errors``, ``tool_error_rate``, ``tokens``), ``tool_selection_accuracy``
(share of calls naming an expected tool; ``None`` when the task names none or
no call was made) and ``handoff_loops`` (control passed back and forth between
the same two agents more than twice, counted over the episode's hand-offs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from marft_envs.configs import check_weights, config_from_any
from marft_envs.rewards import approx_tokens
from marft_envs.tools.base import Tool, ToolContext, ToolOutcome, resolve_tools, run_tool
from marft_envs.tools.parsers import get_parser

__all__ = ["TOOL_ERRORS", "ToolConfig", "ToolLoop", "ToolRewardConfig"]

_NAME_RE = re.compile(r"[^A-Za-z0-9_.-]")

#: Error kinds of a call; each is a flag in ``info`` and a counter in ``env.stats``.
TOOL_ERRORS = (
    "malformed_tool_call",
    "unknown_tool",
    "bad_tool_arguments",
    "tool_raised",
    "tool_timeout",
    "tool_budget_exhausted",
)


@dataclass(frozen=True)
class ToolRewardConfig:
    """Weights of the tool reward components (costs are non-negative and subtracted).

    ==================  ===================================================
    component           value
    ==================  ===================================================
    ``tool_calls``      ``-cost_per_tool_call * calls in the turn``
    ``tool_errors``     ``-cost_per_tool_error * failed calls``
    ``tool_error_rate`` ``-cost_tool_error_rate * failed / calls`` (0 without calls)
    ``steps``           ``-cost_per_step * actions (segments) of all agents``
    ``tool_tokens``     ``-cost_per_tool_token * approx. tokens of tool-calling segments``
    ``handoff_loops``   ``-cost_per_handoff_loop * hand-off loops this turn``
    ``tool_selection``  ``tool_selection * share of calls naming an expected tool``
    ==================  ===================================================

    The final segment of each agent is its action and is priced by
    :class:`~marft_envs.rewards.RewardConfig` (``cost_per_token``); ``tool_tokens``
    prices the segments that called tools, so together they cover every token.
    """

    cost_per_tool_call: float = field(default=0.0, metadata={"help": "cost of each call written"})
    cost_per_tool_error: float = field(default=0.0, metadata={"help": "cost of each failed call"})
    cost_tool_error_rate: float = field(default=0.0, metadata={"help": "cost times the turn's error rate"})
    cost_per_step: float = field(default=0.0, metadata={"help": "cost of each action (segment)"})
    cost_per_tool_token: float = field(default=0.0, metadata={"help": "cost per token of tool-calling segments"})
    cost_per_handoff_loop: float = field(default=0.0, metadata={"help": "cost of each hand-off loop"})
    tool_selection: float = field(default=0.0, metadata={"help": "weight of tool selection accuracy"})

    def __post_init__(self) -> None:
        check_weights(self, "tool reward")

    @classmethod
    def from_any(cls, value: ToolRewardConfig | Mapping[str, Any] | None) -> ToolRewardConfig:
        """A config, a dict of weights (unknown keys rejected) or ``None`` (all zero)."""
        return config_from_any(cls, value, name="tool reward", expected="a dict of weights")

    def components(self, stats: Mapping[str, float]) -> dict[str, float]:
        """The components for one turn's ``stats`` (calls, errors, steps, tool_tokens, loops, accuracy)."""
        calls, errors = stats["tool_calls"], stats["tool_errors"]
        accuracy = stats.get("tool_selection_accuracy")
        return {
            "tool_calls": -(self.cost_per_tool_call * calls) + 0.0,
            "tool_errors": -(self.cost_per_tool_error * errors) + 0.0,
            "tool_error_rate": -(self.cost_tool_error_rate * (errors / calls if calls else 0.0)) + 0.0,
            "steps": -(self.cost_per_step * stats["steps"]) + 0.0,
            "tool_tokens": -(self.cost_per_tool_token * stats["tool_tokens"]) + 0.0,
            "handoff_loops": -(self.cost_per_handoff_loop * stats["handoff_loops"]) + 0.0,
            "tool_selection": self.tool_selection * (accuracy if accuracy is not None else 0.0),
        }


@dataclass(frozen=True)
class ToolConfig:
    """Env-level tool settings (``TextTeamEnv(tool_config=...)``; a dict works too).

    Which tools each agent has comes from the team's profiles (``"tools"``), or from
    ``agents`` here, which replaces them.
    """

    parser: str = field(default="hermes", metadata={"help": "tool-call syntax: a name in marft_envs.tools.PARSERS"})
    budget: int = field(default=4, metadata={"help": "tool calls per agent per turn"})
    budgets: Mapping[str, int] = field(default_factory=dict, metadata={"help": "per-agent budget overrides"})
    timeout: float = field(default=10.0, metadata={"help": "seconds a call may take (a tool may set its own)"})
    max_output_chars: int = field(default=2000, metadata={"help": "a tool result longer than this is cut"})
    inline_schemas: bool = field(
        default=True,
        metadata={"help": "describe the tools in the system message of env.messages() (for chat templates "
                  "that ignore tools=); a collector that passes tools=env.tools(agent) sets False"},
    )
    expected_tools: tuple[str, ...] = field(
        default=(), metadata={"help": "tools a correct call names, when the problem's meta has no 'expected_tools'"}
    )
    agents: Mapping[str, Sequence[str]] | None = field(
        default=None, metadata={"help": "per-agent tool names, replacing the profiles' 'tools'"}
    )
    reward: Mapping[str, float] | ToolRewardConfig | None = field(
        default=None, metadata={"help": "ToolRewardConfig weights"}
    )

    def __post_init__(self) -> None:
        get_parser(self.parser)  # fail early on an unknown name
        for name, value in [("budget", self.budget), *[(f"budgets[{k!r}]", v) for k, v in dict(self.budgets).items()]]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"tool {name} must be an integer >= 0, got {value!r}")
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"tool timeout must be a positive number of seconds, got {self.timeout!r}")
        if isinstance(self.max_output_chars, bool) or not isinstance(self.max_output_chars, int) or self.max_output_chars < 1:
            raise ValueError(f"max_output_chars must be an integer >= 1, got {self.max_output_chars!r}")
        object.__setattr__(self, "budgets", dict(self.budgets))
        object.__setattr__(self, "expected_tools", tuple(self.expected_tools))
        object.__setattr__(self, "reward", ToolRewardConfig.from_any(self.reward))

    @classmethod
    def from_any(cls, value: ToolConfig | Mapping[str, Any] | None) -> ToolConfig:
        """A config, a dict (unknown keys rejected) or ``None`` (defaults)."""
        return config_from_any(cls, value, name="tool_config", expected="a dict or a ToolConfig")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        d = asdict(self)
        d["reward"] = asdict(self.reward)  # type: ignore[arg-type]
        d["expected_tools"] = list(self.expected_tools)
        return d


@dataclass
class _Segment:
    text: str
    outcomes: list[ToolOutcome]


class ToolLoop:
    """Per-env tool state: each agent's tools, this turn's segments, the episode's hand-offs."""

    def __init__(self, team: Any, config: ToolConfig | Mapping[str, Any] | None = None):
        self.config = ToolConfig.from_any(config)
        self.parser = get_parser(self.config.parser)
        names = dict(self.config.agents) if self.config.agents is not None else None
        unknown = sorted(set(names or {}) - set(team.agents))
        if unknown:
            raise ValueError(f"tool_config agents {unknown} are not roles of team {team.name!r} ({team.agents})")
        self.tools: dict[str, tuple[Tool, ...]] = {}
        for agent, profile in team.profiles.items():
            specs = names.get(agent, ()) if names is not None else getattr(profile, "tools", ())
            self.tools[agent] = resolve_tools(list(specs or ()))
        #: Whether any agent has a tool (otherwise the env behaves exactly as without tools).
        self.enabled = any(self.tools.values())
        self.reset()

    # ---------------------------------------------------------------- state
    def reset(self) -> None:
        """Start an episode."""
        self._segments: dict[str, list[_Segment]] = {}
        self._actors: list[str] = []
        self._run = 0  # consecutive hand-offs alternating between one pair
        self._turn_loops = 0
        self._turn_steps: dict[str, int] = {}
        self._fresh = True  # no step yet in this episode

    def budget(self, agent: str) -> int:
        """Calls ``agent`` may write per turn."""
        return int(self.config.budgets.get(agent, self.config.budget))

    def extra_prompt_chars(self, max_action_chars: int) -> int:
        """Upper bound on the characters a turn's tool transcript adds to one agent's view."""
        if not self.enabled:
            return 0
        most = max(self.budget(a) for a in self.tools if self.tools[a])
        per_call = self.config.max_output_chars + 200
        instructions = max(len(self.system_suffix_for(tools)) for tools in self.tools.values())
        return most * (max_action_chars + per_call) + instructions

    # ---------------------------------------------------------------- views
    def schemas(self, agent: str) -> list[dict[str, Any]]:
        """The agent's tool schemas (transformers function-calling form; fresh dicts)."""
        return [t.schema() for t in self.tools.get(agent, ())]

    def system_suffix_for(self, tools: Sequence[Tool]) -> str:
        """Plain-text tool instructions for ``tools`` (empty without tools)."""
        return self.parser.instructions([t.schema() for t in tools]) if tools else ""

    def system_suffix(self, agent: str, inline: bool | None = None) -> str:
        """What to append to ``agent``'s system message (``inline=None``: the config's choice)."""
        inline = self.config.inline_schemas if inline is None else inline
        return self.system_suffix_for(self.tools.get(agent, ())) if inline else ""

    def transcript(self, agent: str) -> list[dict[str, str]]:
        """This turn's tool exchange of ``agent``: ``assistant`` and ``tool`` messages, in order."""
        msgs: list[dict[str, str]] = []
        for seg in self._segments.get(agent, []):
            if not seg.outcomes:
                continue
            msgs.append({"role": "assistant", "content": seg.text})
            msgs += [self.tool_message(o) for o in seg.outcomes]
        return msgs

    @staticmethod
    def tool_message(outcome: ToolOutcome) -> dict[str, str]:
        """The ``tool`` chat message carrying one call's result.

        Its ``name`` is the tool's name for a known tool; a name the model made up keeps only
        tool-name characters (``[A-Za-z0-9_.-]``, others become ``_``), so a template that
        renders names cannot be handed ``<|im_start|>``; the error text quotes it literally."""
        name = _NAME_RE.sub("_", outcome.name or "")[:64] or "unknown"
        return {"role": "tool", "name": name, "content": outcome.content}

    def transcript_text(self, agent: str) -> str:
        """The same exchange as plain text (for ``observe()["prompt"]``)."""
        lines = []
        for m in self.transcript(agent):
            who = "You" if m["role"] == "assistant" else f"Tool result ({m.get('name', 'tool')})"
            lines.append(f"[{who}]: {m['content']}")
        return "\n\n".join(lines)

    # ----------------------------------------------------------------- step
    def _calls_made(self, agent: str) -> int:
        return sum(len(s.outcomes) for s in self._segments.get(agent, []))

    def _run_call(self, env: Any, agent: str, call: Any) -> ToolOutcome:
        limit = self.config.max_output_chars
        if call.error:
            msg = f"Error: could not read your tool call: {call.error}. Write one JSON object per call, e.g. " \
                  + self.parser.example(self.tools[agent][0].name, {})
            return ToolOutcome(call.name, {}, msg[:limit], "malformed_tool_call")
        by_name = {t.name: t for t in self.tools[agent]}
        if call.name not in by_name:
            msg = f"Error: unknown tool {call.name[:60]!r}; your tools: {', '.join(sorted(by_name))}"
            return ToolOutcome(call.name[:64], call.arguments, msg[:limit], "unknown_tool")
        context = ToolContext(getattr(env, "task", None), getattr(env, "problem", None), agent)
        return run_tool(by_name[call.name], call.arguments, context=context, timeout=self.config.timeout,
                        max_output_chars=limit)

    def step(self, env: Any, agent: str, text: str, flags: list[str]) -> dict[str, Any] | None:
        """Handle ``agent``'s segment ``text``. Returns the info of a tool continuation (the
        same agent acts again), or ``None`` when ``text`` is the agent's action of the turn."""
        if self._fresh:  # first step of an episode: a task that keeps what tools showed forgets it
            self._fresh = False
            start = getattr(getattr(env, "task", None), "start_tool_episode", None)
            if callable(start):
                start()
        if not self.enabled:
            return None
        self._turn_steps[agent] = self._turn_steps.get(agent, 0) + 1
        segments = self._segments.setdefault(agent, [])
        parsed = self.parser.parse(text) if self.tools.get(agent) else None
        if parsed is None or not parsed.has_calls:
            segments.append(_Segment(text, []))
            self._record_actor(agent)
            return None
        left = self.budget(agent) - self._calls_made(agent)
        if left <= 0:  # budget spent: this segment is the agent's action, its calls are not run
            segments.append(_Segment(text, []))
            flags.append("tool_budget_exhausted")
            self._count(env, "tool_budget_exhausted")
            self._record_actor(agent)
            return None
        outcomes: list[ToolOutcome] = []
        for call in parsed.calls:
            if len(outcomes) >= left:
                outcomes.append(ToolOutcome(call.name[:64], {}, "Error: tool budget exhausted: this call was not run",
                                            "tool_budget_exhausted"))
            else:
                outcomes.append(self._run_call(env, agent, call))
        segments.append(_Segment(text, outcomes))
        seg_flags = list(flags) + ["tool_call"]
        for o in outcomes:
            self._count(env, "tool_calls")
            if o.error:
                self._count(env, "tool_errors")
                self._count(env, o.error)
                seg_flags.append(o.error)
            if o.truncated:
                self._count(env, "tool_output_truncated")
                seg_flags.append("tool_output_truncated")
        return {
            "turn": getattr(env, "turn", 0),
            "flags": list(dict.fromkeys(seg_flags)),
            "tool_turn": True,
            "segment": len(segments) - 1,
            "tool_calls": [o.to_info() for o in outcomes],
            "tool_messages": [self.tool_message(o) for o in outcomes],
        }

    @staticmethod
    def _count(env: Any, key: str) -> None:
        stats = getattr(env, "stats", None)
        if isinstance(stats, dict):
            stats[key] = stats.get(key, 0) + 1

    def _record_actor(self, agent: str) -> None:
        """Track hand-offs: a loop is a third (or later) consecutive pass within one pair."""
        if self._actors and self._actors[-1] != agent:
            prev_pair = frozenset(self._actors[-2:]) if len(self._actors) >= 2 and self._actors[-2] != self._actors[-1] else None
            pair = frozenset((self._actors[-1], agent))
            self._run = self._run + 1 if pair == prev_pair else 1
            if self._run > 2:
                self._turn_loops += 1
        self._actors.append(agent)

    # ---------------------------------------------------------------- turn end
    def end_turn(self, env: Any, problem: Any) -> tuple[dict[str, float], dict[str, Any]]:
        """``(reward components, info extras)`` of the turn just graded; clears the turn state."""
        expected = None
        meta = getattr(problem, "meta", None)
        if isinstance(meta, Mapping) and meta.get("expected_tools"):
            expected = set(meta["expected_tools"])
        elif self.config.expected_tools:
            expected = set(self.config.expected_tools)
        per_agent: dict[str, dict[str, float]] = {}
        calls = errors = right = tool_tokens = 0
        for agent in getattr(env, "possible_agents", list(self.tools)):
            segs = self._segments.get(agent, [])
            outcomes = [o for s in segs for o in s.outcomes]
            n_err = sum(1 for o in outcomes if o.error)
            per_agent[agent] = {
                "steps": len(segs),
                "tool_calls": len(outcomes),
                "tool_errors": n_err,
                "tool_error_rate": n_err / len(outcomes) if outcomes else 0.0,
                "tokens": sum(approx_tokens(s.text) for s in segs),
            }
            calls += len(outcomes)
            errors += n_err
            tool_tokens += sum(approx_tokens(s.text) for s in segs if s.outcomes)
            if expected is not None:
                right += sum(1 for o in outcomes if o.name in expected)
        accuracy = (right / calls) if (expected is not None and calls) else None
        stats = {
            "tool_calls": calls,
            "tool_errors": errors,
            "steps": sum(v["steps"] for v in per_agent.values()),
            "tool_tokens": tool_tokens,
            "handoff_loops": self._turn_loops,
            "tool_selection_accuracy": accuracy,
        }
        components = self.config.reward.components(stats)  # type: ignore[union-attr]
        extras = {
            "agent_metrics": per_agent,
            "tool_selection_accuracy": accuracy,
            "handoff_loops": self._turn_loops,
        }
        env_stats = getattr(env, "stats", None)
        if self._turn_loops and isinstance(env_stats, dict):
            env_stats["handoff_loops"] = env_stats.get("handoff_loops", 0) + self._turn_loops
        self._segments = {}
        self._turn_steps = {}
        self._turn_loops = 0
        return components, extras
